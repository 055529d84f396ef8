"""What a diagonal linear recurrence does with each input: the SSM's transition per number token, and which channels
count modulo what, for how long.

Usage: ``python -m probe.transitions ckpt.pt [more.pt ...] [--lengths 25,75] [--samples 64] [--json] [--out DIR]``.

A selective SSM's state evolves as s_t = a_t s_{t-1} + b_t v_t, channel by channel, with a_t a function of the
sublayer's input x_t. Tracking a running sum mod m with such a channel needs a_t to act on s as an element of Z_m:
a_t = exp(2 pi i k d / m) for number d (with modulus exactly 1, and the identity on every other token). A channel
whose transitions have this form with k of order o = m / gcd(k, m) tracks the sum modulo o (k = 5 of m = 10: the
parity; k = 2: Z_5; k = 1, 3, 7, 9: Z_10). ``positive`` transitions have phase 0 (they can only fade), ``negative``
ones phase 0 or pi (order 2 at best: the theory's Z_2), ``complex`` ones any phase (Merrill et al. 2024; Grazzi et
al. 2025); each ``-closed`` range has its open range's phases, with modulus 1 (and a = -1) reachable exactly.

Per block, channel and stream token, from ``hook_a`` (and ``hook_theta``) on real sequences, this measures the mean
modulus and the (circular) mean phase of the transition, then per channel the k that fits the number tokens' phases
best and two horizons: how many steps the accumulated phase error (its bias and its random walk, over the stream's
tokens; queries against 0) takes to move the state by half a sector (``drift_steps``), and how many the modulus takes
to halve it (``fade_steps``); ``channel_table`` has the formulas. Beside them, ``fade_400`` is measured directly:
how much of each channel's state survives a 400-token stream (``measure_fade``). A channel *counts mod o beyond the
training range* when its order o > 1 and its drift horizon reaches 4 x L_train. In block 0 the input is the token's
embedding alone, so a transition is a function of the token (spread 0); in later blocks it depends on context, and
the spread says how much (it adds to the random walk).

Cells other than the SSM have no per-token transition (their step depends on the state): ``analyze`` says so in a
note and returns no rows; the command refuses such a checkpoint in one line (exit code 2), before any work.
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from probe.cli import resolve_device
from probe.core.inputs import check_inputs
from probe.core.rows import CONTROL, INSTRUMENT, check_row, control_line
from probe.errors import ProbeError
from probe.runner import CheckpointOptions, Command, Report, lengths_option, option, samples_option, threads_option
from probe.windows import windows_for

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from probe.models import HookedSequenceModel
    from probe.tasks import TaskConfig

__all__ = ["Stream", "TransitionResult", "analyze", "channel_table", "known_rotation_check", "main", "measure_fade",
           "measure_phase_windows", "measure_transitions", "not_applicable", "plot_channels", "reinit_control",
           "reinitialised", "sample_stream", "shuffled_digits_control", "summarize"]

HORIZON = 4
"""A channel counts "beyond the training range" when its drift horizon reaches HORIZON x L_train (its fade is
reported beside it, not in the criterion: a LayerNorm downstream can undo a uniform fade, nothing undoes a drift)."""
CAP = 1e6
"""Horizons are capped here (steps): an exact transition has an infinite one, and a comparison of two capped values
is a comparison (inf >= 2 inf would pass any control)."""
Z = 2.0
"""The drift horizon is where the accumulated phase error's mean plus Z standard deviations reaches half a sector."""
FADE_STEPS = 400
"""The stream length over which ``fade_400`` multiplies a channel's moduli: 16 x the default L_train of 25, the
longest length the grids evaluate."""


def not_applicable(model: HookedSequenceModel) -> str | None:
    """Why the analysis does not apply to ``model`` (one line), or None when it does."""
    layers = model.lstm_layers if model.cfg.has_lstm else []
    if not layers:
        return f"{model.cfg.family}: no recurrent sublayer, so no transitions to read"
    cell = getattr(model.cfg, "rnn", "lstm")
    if cell != "ssm":
        return (f"{cell}: a non-linear cell's step depends on its state, so it has no per-token transition; "
                "this analysis reads the diagonal transitions of an SSM (model.rnn=ssm)")
    return None


def _circ_mean(phase: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Circular mean (wrapped to (-pi, pi]) and circular spread sqrt(-2 ln R) over the first dimension."""
    c, s = torch.cos(phase).mean(0), torch.sin(phase).mean(0)
    r = torch.sqrt(c * c + s * s).clamp(max=1.0)
    return torch.atan2(s, c), torch.sqrt((-2 * torch.log(r.clamp(min=1e-12))).clamp(min=0))


@torch.no_grad()
def measure_transitions(model: HookedSequenceModel, task: TaskConfig, length: int, n_samples: int = 64,
                        seed: int = 0) -> pd.DataFrame:
    """One row per (block, channel, token) over the stream positions of ``n_samples`` sequences of ``length``:
    ``block, channel, token`` (the stream token's id; numbers are 0..m-1), ``kind`` (number | other),
    ``modulus`` (mean |a_t|), ``phase`` (circular mean of arg a_t, in (-pi, pi]), ``phase_spread`` (circular
    standard deviation), ``modulus_sd``, ``b`` (mean input gate), ``n`` (positions)."""
    check_inputs("probe.transitions.measure_transitions", model=model, task=task)
    reason = not_applicable(model)
    if reason:
        raise ProbeError(reason)
    batch = task.sample(length, n_samples, seed)
    device = next(model.parameters()).device
    tokens = batch.tokens.to(device)
    layers = model.lstm_layers
    names = [f"blocks.{i}.lstm.hook_{g}" for i, layer in enumerate(layers) for g in layer.GATES]
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    stream = tokens[:, task.prefix_len:].reshape(-1).cpu()
    rows: list[dict[str, Any]] = []
    for i, layer in enumerate(layers):
        gates = [cache[f"blocks.{i}.lstm.hook_{g}"][:, task.prefix_len:].float() for g in layer.GATES]
        # the transition the scan applies (HookedSSM.transition), read as a modulus and a phase for every range: a
        # real transition's phase (0, or pi where negative) is measured from it, never assumed from the range's name
        a = layer.transition(gates).reshape(-1, layer.k).cpu()
        b = gates[-1].reshape(-1, layer.k).cpu()
        modulus, phase = a.abs(), torch.angle(a)
        for tok in stream.unique().tolist():
            at = stream == tok
            mean_phase, spread = _circ_mean(phase[at])
            mod = modulus[at]
            for c in range(layer.k):
                rows.append({"block": i, "channel": c, "token": int(tok), "kind": "number" if tok < task.m else "other",
                             "modulus": float(mod[:, c].mean()), "modulus_sd": float(mod[:, c].std(unbiased=False)),
                             "phase": float(mean_phase[c]), "phase_spread": float(spread[c]),
                             "b": float(b[at][:, c].mean()), "n": int(at.sum())})
    return pd.DataFrame(rows)


@dataclass
class Stream:
    """One forward pass over ``n_samples`` sampled sequences of ``steps`` stream tokens: the tokens and every gate
    hook of every SSM (``hook_a`` among them), which ``measure_fade`` and ``measure_phase_windows`` both read, so that
    ``analyze`` runs the long sequences once. ``cache`` is None where the model's learned position table is too short
    for the dictionary prefix and ``steps`` tokens."""

    tokens: torch.Tensor
    cache: Any
    n_samples: int
    seed: int
    steps: int


@torch.no_grad()
def sample_stream(model: HookedSequenceModel, task: TaskConfig, n_samples: int = 64, seed: int = 0,
                  steps: int = FADE_STEPS) -> Stream:
    """``Stream``: ``task.sample(steps, n_samples, seed)`` run once through ``model`` with every SSM gate cached."""
    reason = not_applicable(model)
    if reason:
        raise ProbeError(reason)
    tokens = task.sample(steps, n_samples, seed).tokens.to(next(model.parameters()).device)
    if model.cfg.pos_encoding == "learned" and task.prefix_len + steps > model.cfg.max_len:
        return Stream(tokens, None, n_samples, seed, steps)
    names = {f"blocks.{i}.lstm.hook_{g}" for i, layer in enumerate(model.lstm_layers) for g in layer.GATES}
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return Stream(tokens, cache, n_samples, seed, steps)


def _stream(model: HookedSequenceModel, task: TaskConfig, n_samples: int, seed: int, steps: int,
            stream: Stream | None) -> Stream:
    if stream is None:
        return sample_stream(model, task, n_samples, seed, steps)
    if (stream.n_samples, stream.seed, stream.steps) != (n_samples, seed, steps):
        raise ProbeError(f"the stream given was sampled with n_samples {stream.n_samples}, seed {stream.seed}, steps "
                         f"{stream.steps}, not {n_samples}, {seed}, {steps}")
    if stream.tokens.shape[1] != task.prefix_len + steps:
        raise ProbeError(f"the stream given holds sequences of {stream.tokens.shape[1]} tokens, not this task's "
                         f"{task.prefix_len} + {steps}: it was sampled from another task")
    return stream


@torch.no_grad()
def measure_fade(model: HookedSequenceModel, task: TaskConfig, n_samples: int = 64, seed: int = 0,
                 steps: int = FADE_STEPS, stream: Stream | None = None) -> pd.DataFrame:
    """One row per (block, channel): ``fade_400``, how much of the channel's state survives a stream of ``steps``
    tokens -- the product of |a_t| over the stream positions of a sampled sequence of that length (the factor that
    multiplies whatever the state held before the stream, whatever is written meanwhile), the median over
    ``n_samples`` sequences; and ``fade_win_{lo}x_{hi}x`` for every complete window of those positions
    (``probe.windows``: in range, (1x, 2x], ... (8x, 16x] at 400 = 16 x 25), the same product over the window's
    positions only: how much of what the channel held entering the window survives to its end. A channel can keep
    its state in range and lose it beyond, where its transition depends on context (block 1 onwards) and the context
    leaves what training saw; fade_400 alone cannot say where. Unlike ``fade_steps`` (from each token's mean
    modulus) these are measured on whole sequences, so context and the order of tokens count. |a_t| is ``hook_a`` as
    the module computes it (a_t for the real ranges, the modulus r_t for the complex ones, so not |r e^{iθ}| rounded
    again), multiplied in float64: exactly 1.0 for a channel whose every modulus is 1, 0.0 where the product
    underflows (a channel that forgets). NaN where the model's learned position table is too short for the
    dictionary prefix and ``steps`` tokens. ``stream`` (``sample_stream`` with the same n_samples, seed and steps)
    reuses a forward pass already run."""
    check_inputs("probe.transitions.measure_fade", model=model, task=task)
    stream = _stream(model, task, n_samples, seed, steps, stream)
    layers = model.lstm_layers
    windows = windows_for(task.train_length, steps)
    columns = ["fade_400"] + [f"fade_win_{w.key}" for w in windows]
    if stream.cache is None:
        return pd.DataFrame([{"block": i, "channel": c, **dict.fromkeys(columns, math.nan)}
                             for i, layer in enumerate(layers) for c in range(layer.k)])
    rows = []
    for i in range(len(layers)):
        # (sequences, stream positions, channels)
        modulus = stream.cache[f"blocks.{i}.lstm.hook_a"][:, task.prefix_len:].double().abs()
        spans = [slice(None)] + [slice(w.lo, w.hi) for w in windows]
        medians = [torch.quantile(modulus[:, span].prod(dim=1), 0.5, dim=0).cpu().tolist() for span in spans]
        rows += [{"block": i, "channel": c, **{col: float(m[c]) for col, m in zip(columns, medians, strict=True)}}
                 for c in range(layers[i].k)]
    return pd.DataFrame(rows)


@torch.no_grad()
def measure_phase_windows(model: HookedSequenceModel, task: TaskConfig, channels: pd.DataFrame, n_samples: int = 64,
                          seed: int = 0, steps: int = FADE_STEPS, stream: Stream | None = None) -> pd.DataFrame:
    """One row per (block, channel) of ``channels`` (``channel_table``'s: its fitted k and order): for every complete
    window of a ``steps``-token stream, ``phase_win_{lo}x_{hi}x``, the phase error the channel accumulates through the
    window's positions, in half-sectors: |sum over the window of wrap(arg a_t - target_t)| / (pi / order), target_t
    = 2 pi k d / m on number d and 0 on any other token, the median over ``n_samples`` sequences. Below 1, a state
    entering the window is still on the right one of the order's states at its end, as far as the phase goes (its
    fade is ``measure_fade``'s); NaN for a channel of order 1 (no counting) and where the model's learned position
    table is too short. ``channel_table``'s drift horizon predicts this from the transitions at one length; this
    measures it where the context leaves what training saw. ``stream`` as for ``measure_fade``."""
    check_inputs("probe.transitions.measure_phase_windows", model=model, task=task)
    stream = _stream(model, task, n_samples, seed, steps, stream)
    layers = model.lstm_layers
    windows = windows_for(task.train_length, steps)
    columns = [f"phase_win_{w.key}" for w in windows]
    fitted = channels.set_index(["block", "channel"])
    keys = [(i, c) for i, layer in enumerate(layers) for c in range(layer.k)]
    if stream.cache is None:
        return pd.DataFrame([{"block": i, "channel": c, **dict.fromkeys(columns, math.nan)} for i, c in keys])
    numbers = stream.tokens[:, task.prefix_len:].cpu().double()  # (sequences, positions)
    digit = torch.where(numbers < task.m, numbers, torch.zeros_like(numbers))
    rows = []
    for i, layer in enumerate(layers):
        gates = [stream.cache[f"blocks.{i}.lstm.hook_{g}"][:, task.prefix_len:].double() for g in layer.GATES]
        phase = torch.angle(layer.transition(gates)).cpu()  # (sequences, positions, channels); real: 0 or pi
        for c in range(layer.k):
            k, order = (int(x) for x in fitted.loc[(i, c), ["k", "order"]])
            if order < 2:
                rows.append({"block": i, "channel": c, **dict.fromkeys(columns, math.nan)})
                continue
            err = torch.remainder(phase[:, :, c] - 2 * math.pi * k * digit / task.m + math.pi, 2 * math.pi) - math.pi
            half = math.pi / order
            rows.append({"block": i, "channel": c, **{
                col: float(err[:, w.lo:w.hi].sum(dim=1).abs().median()) / half
                for col, w in zip(columns, windows, strict=True)}})
    return pd.DataFrame(rows)


def _wrap(x: np.ndarray) -> np.ndarray:
    return (x + np.pi) % (2 * np.pi) - np.pi


def _drift(bias: float, var: float, half: float) -> float:
    """The n at which n |bias| + Z sqrt(n var) = half (solved as a quadratic in sqrt(n)), capped at CAP."""
    b, sd = abs(bias), math.sqrt(max(var, 0.0))
    if b == 0 and sd == 0:
        return CAP
    if b == 0:
        return min(CAP, (half / (Z * sd)) ** 2)
    x = (-Z * sd + math.sqrt(Z * Z * var + 4 * b * half)) / (2 * b)
    return min(CAP, x * x)


def channel_table(transitions: pd.DataFrame, m: int, train_length: int) -> pd.DataFrame:
    """Per (block, channel): the k in 0..m-1 whose rotation fits best, what it tracks, and for how long.

    A token's signed phase error is its mean phase minus its target (2 pi k d / m for number d, 0 for any other
    token). Over a stream, tokens come with the frequencies the measurement saw (weights w), so the accumulated
    error after n steps has mean n * bias (bias = sum of w * error) and variance n * var (var: the errors' weighted
    variance plus each token's own context spread, ``phase_spread``, squared). k minimises the weighted rms error;
    ``order`` = m / gcd(k, m) (1: no counting). A channel of order o keeps o states 2 pi / o apart, so it misreads
    once the error passes half of that, pi / o: ``drift_steps`` is the n at which n |bias| + Z sqrt(n var) = pi / o.
    ``fade_steps`` = ln 2 / -(sum of w * ln modulus), the steps in which the state halves. Both capped at CAP.
    ``counts_beyond``: order > 1 and drift_steps >= HORIZON x L_train; ``horizon`` = drift_steps;
    ``phase_error``: the largest |error| over tokens; ``b``: mean input gate."""
    rows = []
    ks = np.arange(m)[:, None]
    for (block, channel), g in transitions.groupby(["block", "channel"], sort=True):
        tok = g.token.to_numpy()
        number = (g.kind == "number").to_numpy()
        w = g.n.to_numpy() / g.n.sum()
        target = np.where(number[None, :], 2 * np.pi * ks * tok[None, :] / m, 0.0)  # (k, tokens)
        err = _wrap(g.phase.to_numpy()[None, :] - target)
        within = float((w * g.phase_spread.to_numpy() ** 2).sum())
        k = int(np.argmin((w * err**2).sum(axis=1)))
        e = err[k]
        bias = float((w * e).sum())
        var = float((w * (e - bias) ** 2).sum()) + within
        order = m // math.gcd(k, m)
        drift = _drift(bias, var, math.pi / order)
        log_mod = float((w * np.log(np.clip(g.modulus.to_numpy(), 1e-300, None))).sum())
        fade = min(CAP, math.log(2) / -log_mod) if log_mod < 0 else CAP
        rows.append({"block": int(block), "channel": int(channel), "k": k, "order": order,
                     "phase_error": float(np.abs(e).max()), "bias": bias, "rms": math.sqrt(var + bias**2),
                     "min_modulus": float(g.modulus.min()), "drift_steps": drift, "fade_steps": fade,
                     "horizon": drift, "counts_beyond": bool(order > 1 and drift >= HORIZON * train_length),
                     "b": float(g.b.mean())})
    return pd.DataFrame(rows)


def summarize(channels: pd.DataFrame, m: int, train_length: int) -> pd.DataFrame:
    """Per block and order o > 1 dividing m: channels that count mod o beyond HORIZON x L_train, the longest drift
    horizon of any channel of that order and that channel's fade."""
    rows = []
    for block, g in channels.groupby("block"):
        for o in sorted({m // math.gcd(k, m) for k in range(1, m)}):
            part = g[g.order == o]
            best = part.loc[part.horizon.idxmax()] if len(part) else None
            rows.append({"block": int(block), "order": o, "channels": int(part.counts_beyond.sum()),
                         "of": int(len(g)), "best_horizon": float(best.horizon) if best is not None else 0.0,
                         "best_fade": float(best.fade_steps) if best is not None else 0.0,
                         "beyond": HORIZON * train_length})
    return pd.DataFrame(rows)


# --- controls -------------------------------------------------------------------------------------------------------
def known_rotation_check(model: HookedSequenceModel, task: TaskConfig, length: int, seed: int = 0) -> dict[str, Any]:
    """Instrument check: a copy of ``model`` whose block-0 SSM channel 0 is set by hand to a known transition, the
    best its range allows (a ``-closed`` range as its open one, where the best is exact): ``complex``, the rotation
    exp(2 pi i d / m) on number d (expect k = 1, order m); ``negative``, a flip on odd numbers (expect k = m / 2,
    order 2); ``positive``, the identity (expect order 1); and on every other token the identity. The method must
    find that k and a horizon beyond 16 x L_train.
    Catches: gates read from the wrong hook or position (an off-by-one against the tokens), a mis-wrapped phase,
    a wrong k search, a modulus read wrongly."""
    model = copy.deepcopy(model)
    layer = model.lstm_layers[0]
    kind = layer.base  # a closed range has its open range's phases
    expect = {"complex": 1, "negative": task.m // 2 if task.m % 2 == 0 else 0, "positive": 0}[kind]
    _set_known(model, task, channel=0)
    tr = measure_transitions(model, task, length, n_samples=8, seed=seed)
    ch = channel_table(tr[tr.block == 0], task.m, task.train_length)
    row = ch[ch.channel == 0].iloc[0]
    horizon = row.fade_steps if kind == "positive" else row.horizon
    ok = row.k == expect and horizon >= 16 * task.train_length and (kind == "positive" or row.fade_steps >= horizon
                                                                     or row.fade_steps >= 16 * task.train_length)
    return check_row("known_rotation", INSTRUMENT, bool(ok), range=layer.kind, k=int(row.k), expected_k=expect,
                     order=int(row.order), phase_error=float(row.phase_error), horizon=float(horizon),
                     value=float(horizon), threshold=16 * task.train_length, passes_if=">=",
                     what=f"a hand-set channel's horizon in steps, and its k {int(row.k)} must be the {expect} set; a "
                          "fail means the method misreads transitions (wrong hook or position, a mis-wrapped phase, "
                          "a wrong k search), whatever the model")


@torch.no_grad()
def _set_known(model: HookedSequenceModel, task: TaskConfig, channel: int, k: int = 1) -> None:
    """Set block 0's SSM channel ``channel`` as ``known_rotation_check`` describes (``complex``: the rotation
    exp(2 pi i k d / m) on number d, of order m / gcd(k, m)). Block 0's SSM sees each token as LayerNorm(embedding),
    so a row of in_proj that should take given values on given tokens is solved for by least squares on those inputs
    (exact: more dimensions than tokens)."""
    layer = model.lstm_layers[0]
    x = model.blocks[0].ln_lstm(model.embed.weight.detach()[None].float())[0]  # (vocab, d)
    design = torch.cat([x, torch.ones(x.shape[0], 1, device=x.device)], dim=1)
    digits = torch.arange(x.shape[0], device=x.device)
    numbers = digits < task.m

    def solve(row: int, target: torch.Tensor) -> None:
        sol = torch.linalg.lstsq(design.double(), target.double()[:, None]).solution[:, 0].float()
        layer.in_proj.weight[row] = sol[:-1]
        layer.in_proj.bias[row] = sol[-1]

    # the step-size row: softplus(-30) ~ 1e-13, modulus 1 to float precision; +30: the largest step (|a| = e^-8)
    keep = torch.full((x.shape[0],), -30.0, device=x.device)
    if layer.base == "negative" and task.m % 2 == 0:
        keep = torch.where(numbers & (digits % 2 == 1), 30.0, -30.0)  # a = 2 e^-8 - 1 on odd numbers: a flip
    solve(channel, keep)
    if layer.complex:
        phase = torch.where(numbers, 2 * math.pi * k * digits / task.m, 0.0)
        solve(layer.k + channel, phase)


def reinitialised(model: HookedSequenceModel, seed: int = 0) -> HookedSequenceModel:
    """A copy of ``model`` with every SSM re-initialised as a new one would be (seeded by ``seed``)."""
    fresh = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(10_000 + seed)
        for layer in fresh.lstm_layers:
            new = type(layer)(layer.in_proj.in_features, layer.n_state, layer.kind)
            layer.load_state_dict(new.to(next(model.parameters()).device).state_dict())
    return fresh


def reinit_control(model: HookedSequenceModel, task: TaskConfig, length: int, channels: pd.DataFrame,
                   seed: int = 0, n_samples: int = 64) -> dict[str, Any]:
    """Control: the same architecture with its SSMs re-initialised (seeded). A claim that the trained model has a
    channel counting beyond the training range is only worth something if an untrained one has none: passed when
    the trained model has at least one ``counts_beyond`` channel and the re-initialised model none. Fails on a
    method that finds counters whatever the weights (a k search that fits noise, a horizon without a cap)."""
    tr = measure_transitions(reinitialised(model, seed), task, length, n_samples=n_samples, seed=seed)
    base = channel_table(tr, task.m, task.train_length)
    trained = int(channels.counts_beyond.sum())
    fresh = int(base.counts_beyond.sum())
    return check_row("reinit", CONTROL, trained > 0 and fresh == 0, trained_counting=trained, reinit_counting=fresh,
                     value=fresh, threshold=0, passes_if="<=",
                     what=f"counting channels of the re-initialised SSM, beside the trained model's {trained} (needs "
                          "at least 1); a fail means no counter was found, or the method finds counters in untrained "
                          "weights (a k search that fits noise)",
                     trained_best_horizon=float(channels[channels.order > 1].horizon.max())
                     if (channels.order > 1).any() else 0.0,
                     reinit_best_horizon=float(base[base.order > 1].horizon.max()) if (base.order > 1).any() else 0.0)


def shuffled_digits_control(transitions: pd.DataFrame, channels: pd.DataFrame, m: int, train_length: int,
                            seed: int = 0) -> dict[str, Any]:
    """Control: the same transitions with the number tokens' identities permuted (a seeded derangement of 0..m-1).
    The k search has m candidates per channel and could fit a phase pattern by chance; a real counter's fit must
    be far better than a scrambled pattern's: passed when the best counting horizon reaches HORIZON x L_train (a
    counter is claimed) and is at least twice the scrambled one's. Fails on a method that fits each token's phase
    freely, or finds counting in any pattern."""
    g = torch.Generator().manual_seed(20_000 + seed)
    while True:
        perm = torch.randperm(m, generator=g).tolist()
        if all(p != i for i, p in enumerate(perm)):
            break
    scrambled = transitions.copy()
    numbers = scrambled.kind == "number"
    scrambled.loc[numbers, "token"] = scrambled.loc[numbers, "token"].map(dict(enumerate(perm)))
    base = channel_table(scrambled, m, train_length)
    # capped here too: a method that returns infinite horizons must not pass by inf >= 2 inf
    trained_best = min(CAP, float(channels[channels.order > 1].horizon.max())) if (channels.order > 1).any() else 0.0
    shuffled_best = min(CAP, float(base[base.order > 1].horizon.max())) if (base.order > 1).any() else 0.0
    claimed = trained_best >= HORIZON * train_length
    bar = max(HORIZON * train_length, 2 * shuffled_best)  # a counter is claimed, and twice the scrambled fit
    return check_row("shuffled_digits", CONTROL, bool(claimed and trained_best >= 2 * shuffled_best),
                     trained_best_horizon=trained_best, shuffled_best_horizon=shuffled_best, permutation=perm,
                     value=trained_best, threshold=bar, passes_if=">=",
                     what=f"the best counting horizon in steps, against {HORIZON} x L_train and twice that with the "
                          "numbers' identities permuted; a fail means no counter beyond the training range, or a "
                          "method that finds counting in any phase pattern")


# --- one checkpoint -------------------------------------------------------------------------------------------------
@dataclass
class TransitionResult:
    """``transitions`` (per block, channel, token), ``channels`` (per block and channel), ``summary`` (per block
    and order), ``controls`` (rows), ``note`` (why it does not apply, else None), all measured on sequences of
    ``length``."""

    checkpoint: str
    label: str
    seed: int | None
    length: int | None = None
    transitions: pd.DataFrame = field(default_factory=pd.DataFrame)
    channels: pd.DataFrame = field(default_factory=pd.DataFrame)
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    controls: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None
    can_count: pd.DataFrame = field(default_factory=pd.DataFrame)

    def rows(self, tokens: bool = False) -> list[dict[str, Any]]:
        """The flat rows of ``--json`` (``metric`` channel and summary, and with ``tokens`` every transition; a
        bridged checkpoint's ``can_count`` rows)."""
        meta = {"checkpoint": self.checkpoint, "label": self.label, "seed": self.seed, "length": self.length}
        parts = [("channel", self.channels), ("summary", self.summary), ("can_count", self.can_count)] + (
            [("transition", self.transitions)] if tokens else [])
        return [{**meta, "metric": metric, **row} for metric, frame in parts if not self.note
                for row in frame.to_dict("records")]

    def control_rows(self) -> list[dict[str, Any]]:
        meta = {"checkpoint": self.checkpoint, "label": self.label, "seed": self.seed, "length": self.length}
        return [{**meta, **c} for c in self.controls]


def analyze(path: str | Path, length: int | None = None, n_samples: int = 64, seed: int = 0,
            device: str = "cpu", controls: bool = True) -> TransitionResult:
    """The transitions of one checkpoint's SSMs at ``length`` (default L_train), with the known-rotation instrument
    check and the re-initialisation control."""
    from probe.checkpoint import load_checkpoint
    from probe.core.meta import variant_name

    ckpt = load_checkpoint(path)
    model, task = ckpt.build_model(device).eval(), ckpt.task_config
    length = length or task.train_length
    out = TransitionResult(str(path), variant_name(ckpt), ckpt.seed, length)
    if _bridged(model):
        out.note = bridged_not_applicable(model)
        if not out.note:
            out.can_count = can_count(model, task, length, n_samples, seed)
            out.controls = bridged_controls(model, task, out.can_count, length, n_samples, seed) if controls else []
        return out
    out.note = not_applicable(model)
    if out.note:
        return out
    out.transitions = measure_transitions(model, task, length, n_samples, seed)
    channels = channel_table(out.transitions, task.m, task.train_length)
    stream = sample_stream(model, task, n_samples, seed)  # one pass over the long sequences serves both
    fade = measure_fade(model, task, n_samples, seed, stream=stream)
    phase = measure_phase_windows(model, task, channels, n_samples, seed, stream=stream)
    out.channels = channels.merge(fade, on=["block", "channel"], how="left").merge(phase, on=["block", "channel"],
                                                                                   how="left")
    out.summary = summarize(out.channels, task.m, task.train_length)
    if controls:
        out.controls = [known_rotation_check(model, task, length, seed),
                        reinit_control(model, task, length, out.channels, seed, n_samples),
                        shuffled_digits_control(out.transitions, out.channels, task.m, task.train_length, seed)]
    return out


def plot_channels(results: list[TransitionResult]) -> Figure:
    """Per checkpoint and block: each channel's horizon (log scale) against its order, the HORIZON x L_train line."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    shown = [r for r in results if not r.note and not r.channels.empty]
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(3.6 * max(1, len(shown)), 3.2), squeeze=False,
                             sharey=True)
    for ax, r in zip(axes[0], shown, strict=False):
        ch = r.channels
        sns.stripplot(ch, x="order", y="horizon", hue="block", dodge=True, size=3, ax=ax, palette="colorblind")
        ax.set_yscale("log")
        ax.axhline(float(r.summary.beyond.iloc[0]), color="0.3", ls="--", lw=0.8)
        ax.set(title=f"{r.label} (seed {r.seed}, length {r.length})", xlabel="order of the fitted rotation",
               ylabel="horizon (steps)")
    fig.suptitle("SSM channels: the cyclic group each channel's transitions fit, and for how many steps "
                 "(dashed: 4 x L_train)", fontsize=8)
    fig.tight_layout()
    return fig


# --- CLI ------------------------------------------------------------------------------------------------------------
_HELP_JSON = """JSON (--json): results rows with checkpoint, label, seed, length (of the sequences measured) and metric:
  channel: block, channel, k, order (m / gcd(k, m); 1 = no counting), phase_error (rad), min_modulus, drift_steps,
    fade_steps, horizon (= drift_steps; both capped at 1e6), counts_beyond (order > 1 and drift_steps >= 4 L_train;
    the fade is reported apart), b (mean input gate), fade_400 (the product of |a_t| over a 400-token stream, median
    over the sequences: the share of the state that survives 16 x L_train at L_train 25; 1.0 exactly at |a| = 1),
    fade_win_0x_1x, fade_win_1x_2x, ... fade_win_8x_16x (the same product over each window's stream positions only:
    the share of what the channel holds entering the window that survives to its end), phase_win_0x_1x, ...
    phase_win_8x_16x (the phase error accumulated through each window, median |sum of wrap(arg a_t - target_t)| in
    half-sectors pi / order: below 1 a state entering the window is still on the right state at its end; NaN at
    order 1);
  summary: block, order, channels (counting beyond 4 L_train), of, best_horizon, best_fade (that channel's), beyond;
  transition (--tokens): block, channel, token, kind (number|other), modulus, modulus_sd, phase, phase_spread, b, n.
controls rows (value, threshold, passes_if and what, as the plain output's control lines show them):
known_rotation (instrument: a hand-set transition, the best the range allows, must come back as its k and order);
reinit (control: the trained model must have a channel counting beyond 4 L_train and a re-initialised SSM none);
shuffled_digits (control: its best counting horizon at least twice that of its own transitions with the numbers'
identities permuted).
A bridged checkpoint (a bridge-* preset) gets the bridged diagnostic instead: can_count rows, one per recurrent layer
and one for all (layer "all"): range (positive real in (0, 1], negative real (reaching -1), complex, ...), min_real,
max_modulus, max_phase (rad), the fractions positive / negative / complex, can_count (some transition turns the state
by >= 2 pi / m) and verdict; its controls: state_reproduction (instrument, Mamba / Mamba-2: the transitions times the
scan's state one step before, plus its write, give its next state within 1e-4 of the state's size), negated
(instrument: the same transitions negated must read "can") and longer_sequences (control: the verdict at 4 L_train
must be the one at L_train).
A checkpoint whose cell is not an SSM, or a bridged one whose recurrence has no transition to read (an LSTM, a short
convolution), is refused in one line (exit code 2) before any work."""


@dataclass
class TransitionOptions(CheckpointOptions):
    lengths: list[int] | None = lengths_option("L_train; each length is measured on its own")
    samples: int = samples_option(64)
    tokens: bool = option(False, "also every (block, channel, token) transition row")
    no_controls: bool = option(False, "skip the instrument check and the control")
    threads: int = threads_option(1)


def run(opts: TransitionOptions) -> Report:
    """``analyze`` of every checkpoint at every length, its rows and a summary table per checkpoint and length."""
    from probe.checkpoint import load_checkpoint, resolve_checkpoints
    from probe.core.progress import progress_iter
    from probe.memory import check_lengths

    paths = resolve_checkpoints(opts.checkpoints)
    device = str(resolve_device(opts.device))
    for p in paths:  # every file readable, applicable and every length fitting before any work
        ckpt = load_checkpoint(p)
        model = ckpt.build_model("cpu")
        why = bridged_not_applicable(model) if _bridged(model) else not_applicable(model)
        if why:
            raise ProbeError(f"{p}: this analysis does not apply to this checkpoint ({why})")
        check_lengths(ckpt.model_config, ckpt.task_config, opts.lengths or [ckpt.task_config.train_length], device,
                      name=str(p))
    jobs = [(p, length) for p in paths for length in (opts.lengths or [None])]
    results, text = [], []
    for path, length in progress_iter(jobs, "checkpoints x lengths", opts.progress and len(jobs) > 1):
        r = analyze(path, length, opts.samples, opts.seed, device, controls=not opts.no_controls)
        results.append(r)
        if not r.can_count.empty:
            verdict = r.can_count.set_index("layer").loc["all", "verdict"]
            text += [f"{path}: {r.label}, seed {r.seed}, length {r.length}: where the eigenvalues of each recurrent "
                     f"layer's per-token transition lie ({verdict})",
                     r.can_count[list(CAN_COUNT_COLUMNS)].to_string(index=False, float_format=lambda v: f"{v:.3g}")]
        else:
            text += [f"{path}: {r.label}, seed {r.seed}, length {r.length}: channels that count mod o beyond "
                     f"{HORIZON} x L_train, per block", r.summary.to_string(index=False)]
        text += ["controls (every row is in the JSON):", *map(control_line, r.control_rows())] if r.controls else []
    return Report([str(p) for p in paths], [row for r in results for row in r.rows(opts.tokens)],
                  [c for r in results for c in r.control_rows()], "\n".join(text),
                  figures=lambda: {"transitions.png": plot_channels(results)})


COMMAND = Command("transitions", TransitionOptions, run, __doc__.split("\n\n")[0], _HELP_JSON)
main, build_parser = COMMAND.main, COMMAND.build_parser



# --- can this recurrence count? (any diagonal or delta-rule recurrence, probe's own or a bridged one) ---------------
NEGATIVE_ONE = 0.95
"""A transition "reaches -1" on the data where some eigenvalue's real part is at most -NEGATIVE_ONE."""


def eigen_range(eigs: torch.Tensor, m: int = 2) -> dict[str, Any]:
    """Where the eigenvalues ``eigs`` (any shape; real or complex) of a recurrence's per-token transitions lie, and
    what theory says follows for counting mod ``m`` (Grazzi et al. 2025: a linear recurrence whose transitions'
    eigenvalues are all positive real cannot track parity, nor Z_m, beyond the lengths it was trained on; it needs
    negative eigenvalues (parity: reaching -1) or complex ones (a rotation by 2 pi k / m)).

    ``range``: ``positive real in (0, 1]``, ``negative real (reaching -1)``, ``negative real``, ``complex`` or
    ``zero``; ``max_phase``: the largest |arg| of any eigenvalue (pi for a negative real one); ``min_real``,
    ``max_modulus``; the fractions ``positive``, ``negative``, ``complex``; ``can_count``: whether some eigenvalue
    on the data turns the state by at least the smallest rotation of Z_m, 2 pi / m (pi for parity): the verdict
    is read from the transitions the model computed, never from its architecture's name."""
    z = eigs.detach().reshape(-1)
    z = z.to(torch.complex128) if z.is_complex() else z.double().to(torch.complex128)
    real, phase, modulus = z.real, torch.angle(z).abs(), z.abs()
    tol = 1e-9
    is_complex = z.imag.abs() > tol * modulus.clamp(min=1.0)
    positive, negative = (~is_complex) & (real > 0), (~is_complex) & (real < 0)
    smallest = 2 * math.pi / max(2, int(m))
    max_phase = float(phase[modulus > 0].max()) if bool((modulus > 0).any()) else 0.0
    if bool(is_complex.any()):
        where = "complex"
    elif bool(negative.any()):
        where = "negative real (reaching -1)" if float(real.min()) <= -NEGATIVE_ONE else "negative real"
    elif bool(positive.any()):
        where = "positive real in (0, 1]" if float(modulus.max()) <= 1 + 1e-6 else "positive real"
    else:
        where = "zero"
    can = max_phase >= smallest - 1e-9
    theory = (f"can: some transition turns the state by {max_phase:.2f} rad >= 2 pi / {m}, so it can represent "
              f"Z_{m}'s generator (needed to count mod {m} beyond the trained length)" if can else
              f"cannot: every transition turns the state by less than 2 pi / {m} (positive-only real transitions "
              f"cannot count mod {m} beyond the trained length, Grazzi et al. 2025)")
    n = max(1, z.numel())
    return {"range": where, "min_real": float(real.min()), "max_modulus": float(modulus.max()),
            "max_phase": max_phase, "positive": float(positive.sum()) / n, "negative": float(negative.sum()) / n,
            "complex": float(is_complex.sum()) / n, "can_count": bool(can), "verdict": theory, "n": int(z.numel())}


@torch.no_grad()
def own_eigenvalues(model: HookedSequenceModel, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-token transitions of each SSM layer of one of probe's own models on ``tokens`` (diagonal: the
    transitions are the eigenvalues), ``{blocks.{i}.lstm: [batch, pos, channel]}``."""
    reason = not_applicable(model)
    if reason:
        raise ProbeError(reason)
    layers = model.lstm_layers
    names = {f"blocks.{i}.lstm.hook_{g}" for i, layer in enumerate(layers) for g in layer.GATES}
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return {f"blocks.{i}.lstm": layer.transition([cache[f"blocks.{i}.lstm.hook_{g}"].float() for g in layer.GATES])
            for i, layer in enumerate(layers)}


def can_count(model: Any, task: TaskConfig, length: int | None = None, n_samples: int = 16, seed: int = 0,
              eigenvalues: Any = None) -> pd.DataFrame:
    """"Can this recurrence count?": one row per recurrent layer (and ``all``) of ``model`` -- probe's own SSM or a
    bridged model (``probe.bridge.wrap``: Mamba, Mamba-2, gated DeltaNet) -- with ``eigen_range`` of the transitions
    it computes on ``n_samples`` sequences of ``task`` at ``length`` (default L_train), for counting mod ``task.m``.
    ``eigenvalues`` (a function of (model, tokens) to ``{layer: eigenvalues}``) replaces the reader, so that a
    control can feed hand-set transitions through the same summary. A recurrence whose transitions cannot be read
    is refused in one line naming why."""
    from probe.bridge import BridgedModel, transition_eigenvalues

    check_inputs("probe.transitions.can_count", model=model, task=task)
    read = eigenvalues or (transition_eigenvalues if isinstance(model, BridgedModel) else own_eigenvalues)
    tokens = task.sample(length or task.train_length, n_samples, seed).tokens.to(next(model.parameters()).device)
    eigs = read(model, tokens)
    m = int(getattr(task, "m", 2) or 2)
    rows = [{"layer": name, **eigen_range(e, m)} for name, e in eigs.items()]
    joined = torch.cat([(e if e.is_complex() else e.to(torch.complex128)).reshape(-1).to(torch.complex128)
                        for e in eigs.values()])
    return pd.DataFrame([*rows, {"layer": "all", **eigen_range(joined, m)}])


# --- a bridged checkpoint: the diagnostic above on the recurrence the bridge runs -----------------------------------
CAN_COUNT_COLUMNS = ("layer", "range", "min_real", "max_modulus", "max_phase", "can_count")
"""The columns of the plain output's table for a bridged checkpoint (the JSON has every one)."""
STATE_RESIDUAL = 1e-4
"""The largest relative residual ``probe.bridge.state_residual`` allows: float32 rounding of the scan, nothing more
(a wrong dt or A leaves one of the state's own order)."""


def _bridged(model: Any) -> bool:
    return getattr(model.cfg, "family", None) == "bridge"


def bridged_not_applicable(model: Any) -> str | None:
    """Why ``can_count`` cannot read any recurrent layer of a bridged ``model`` (one line), or None when it can."""
    from probe.bridge import transition_reason

    recurrent = [c for c in model.components if c.kind != "attention"]
    reasons = [r for r in map(transition_reason, recurrent) if r]
    if not recurrent:
        return "this bridged model has no recurrent component"
    return "; ".join(reasons) if len(reasons) == len(recurrent) else None


def bridged_controls(model: Any, task: TaskConfig, measured: pd.DataFrame, length: int | None = None,
                     n_samples: int = 16, seed: int = 0, eigenvalues: Any = None) -> list[dict[str, Any]]:
    """The instrument checks and the control of ``can_count`` (``measured``) on a bridged model:
    ``state_reproduction`` (instrument, where a Mamba / Mamba-2 exposes its scan state: ``probe.bridge.
    state_residual`` at most ``STATE_RESIDUAL``; catches transitions read from the wrong hook, dt or A),
    ``negated`` (instrument: the same transitions negated, through the same summary, must read "can"; catches a
    summary that cannot say "can", whose "cannot" would be no finding) and ``longer_sequences`` (control: the
    verdict on sequences of 4 x L_train, where length generalisation is judged, must be the one at ``length``; a
    fail means the transitions change in kind beyond the training range, so the verdict at L_train does not
    describe the model there). ``eigenvalues`` replaces the reader everywhere (a test feeds a broken one)."""
    from probe.bridge import state_residual, transition_eigenvalues

    read = eigenvalues or transition_eigenvalues
    length = length or task.train_length
    m = int(getattr(task, "m", 2) or 2)
    smallest = 2 * math.pi / max(2, m)
    device = next(model.parameters()).device
    tokens = task.sample(length, n_samples, seed).tokens.to(device)
    rows = []
    residual = state_residual(model, tokens, read)
    if residual:
        worst = max(residual, key=residual.get)
        rows.append(check_row("state_reproduction", INSTRUMENT, residual[worst] <= STATE_RESIDUAL,
                              value=residual[worst], threshold=STATE_RESIDUAL, passes_if="<=", hook=worst,
                              what="|a_t state_(t-1) + write_t - state_t| / max |state| on TransformerLens's eager "
                                   "scan; a fail means the transitions were read from the wrong hook, dt or A, so "
                                   "the verdict is about numbers the model never applied"))
    negated = can_count(model, task, length, n_samples, seed,
                        eigenvalues=lambda mod, tok: {k: -v for k, v in read(mod, tok).items()})
    flipped = negated.set_index("layer").loc["all"]
    rows.append(check_row("negated", INSTRUMENT, bool(flipped["can_count"]), value=float(flipped["max_phase"]),
                          threshold=smallest, passes_if=">=",
                          what="the largest phase of the same transitions negated (rad); a fail means the summary "
                               "cannot say 'can', so its 'cannot' is no finding"))
    before = measured.set_index("layer").loc["all"]
    longer = can_count(model, task, HORIZON * task.train_length, n_samples, seed, eigenvalues=eigenvalues)
    after = longer.set_index("layer").loc["all"]
    rows.append(check_row("longer_sequences", CONTROL, bool(after["can_count"]) == bool(before["can_count"]),
                          value=float(after["max_phase"]), threshold=smallest,
                          passes_if=">=" if before["can_count"] else "<", length=HORIZON * task.train_length,
                          what=f"the largest phase at {HORIZON} x L_train (rad), on the side of 2 pi / m that the "
                               f"verdict at length {length} is; a fail means the transitions change in kind beyond "
                               "the training range, where length generalisation is judged"))
    return rows


if __name__ == "__main__":
    sys.exit(main())
