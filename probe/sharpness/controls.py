"""The diagnostic's instrument check (a known attention recovered exactly) and its controls (re-initialised attention,
another pair of the dictionary as placebo target)."""

from __future__ import annotations

import copy
import math
import warnings
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import Tensor

from probe.core.rows import CONTROL, INSTRUMENT, check_row
from probe.sharpness.measure import TARGETS, attention_hooks, mass_rows, measure_length, reference_mass
from probe.wrapped import WrappedModel

if TYPE_CHECKING:
    from probe.models import HookedSequenceModel
    from probe.tasks import Batch, TaskConfig

TOLERANCE = 1e-5
"""Largest error the instrument check allows: float32 softmax rounding, nothing more."""
MARGIN = 2.0
"""The recall head must put at least this many times the mass of the best re-initialised head on its target."""


def oracle_targets(task: TaskConfig, batch: Batch) -> dict[tuple[int, int], int]:
    """(sequence, position) of every recall query -> the prefix position of its key, found by scanning the tokens one
    query at a time: a second route to the targets, independent of the vectorised one under test."""
    out = {}
    p = batch.prefix_len
    tokens, sums, recall = batch.tokens.tolist(), batch.sums.tolist(), batch.masks["recall"].tolist()
    for b, row in enumerate(tokens):
        for t in range(p, len(row)):
            if not recall[b][t]:
                continue
            wanted = sums[b][t] if task.name == "coupled" else row[t]
            for j in range(0, p - 1, 2):
                if row[j] == wanted:
                    out[(b, t)] = j
                    break
    return out


def known_gaps(n_layers: int, n_heads: int) -> Tensor:
    """The gap Δ that the hand-built attention gives each (block, head): all different, so a mix-up shows."""
    return 1.0 + torch.arange(n_layers * n_heads, dtype=torch.float32).view(n_layers, n_heads) * 0.75


def known_attention_check(model: HookedSequenceModel, task: TaskConfig, length: int | None = None,
                          n_samples: int = 8, seed: int = 0) -> dict[str, Any]:
    """Instrument check: every attention layer's scores are overwritten with Δ_(layer, head) on each query's value
    position (found by ``oracle_targets``) and 0 on its other keys, and its pattern with their causal softmax, so
    the mass on the value is exactly e^Δ / (e^Δ + n − 1), on the key 1 / (e^Δ + n − 1), and the gaps are Δ and
    −Δ / (n − 1). Fails when the measurement reads the wrong position (an off-by-one, key for value, another pair),
    the wrong row or head, or the gap from the wrong scores. The pattern is written too, not left to the model,
    because a bridged Jamba's or OLMo-hybrid's attention hooks are read-only (TransformerLens keeps transformers' own
    attention there and its hooks report it): the check is of the reading, on any model."""
    length = length or task.train_length
    hooks = attention_hooks(model)
    layers = {s: k for s, (_, k) in hooks.items()} | {p: k for p, k in hooks.values()}
    gaps = known_gaps(max(layers.values()) + 1, model.cfg.n_heads)
    captured: list[dict[tuple[int, int], int]] = []

    def known(like: Tensor, layer: int) -> Tensor:
        t = like.shape[-1]
        new = torch.zeros_like(like)
        for (b, q), j in captured[-1].items():
            new[b, :, q, j + 1] = gaps[layer].to(like)
        return new.masked_fill(torch.ones(t, t, dtype=torch.bool, device=like.device).triu(1), -1e5)

    def write(scores: Tensor, hook: Any) -> Tensor:
        return known(scores, layers[hook.name])

    def write_pattern(pattern: Tensor, hook: Any) -> Tensor:
        return known(pattern.float(), layers[hook.name]).softmax(-1).to(pattern.dtype)

    def oracle(module: Any, args: tuple[Tensor, ...]) -> None:
        # the oracle's targets for the batch the model is about to run, before any layer writes scores
        captured.append(oracle_targets(task, task.relabel(args[0])))

    # run_with_hooks calls forward itself, so the model's own pre-hooks do not fire: the first module it calls with
    # the tokens is the wrapped model's module, or probe's embedding
    handle = (model.module if isinstance(model, WrappedModel) else model.embed).register_forward_pre_hook(oracle)
    try:
        writes = [*((s, write) for s in hooks), *((p, write_pattern) for p, _ in hooks.values())]
        with warnings.catch_warnings():  # the bridge warns that a read-only hook's edit is discarded: known here
            warnings.filterwarnings("ignore", message="A hook on .* returned a modified tensor")
            stats = measure_length(model, task, length, n_samples, seed, fwd_hooks=writes)
    finally:
        handle.remove()
    worst = 0.0
    for s in stats:
        n = s.keys.double()[:, None]
        for layer, per in s.mass.items():
            delta = gaps[layer].double()[None, :]
            expected_mass = {"value": reference_mass(delta, n), "key": 1 / (delta.exp() + n - 1)}
            expected_gap = {"value": delta.expand_as(per["value"]), "key": -delta / (n - 1)}
            for target in TARGETS:
                worst = max(worst, float((per[target].double() - expected_mass[target]).abs().max()),
                            float((s.gap[layer][target] - expected_gap[target]).abs().max()))
    n_queries = sum(len(s.keys) for s in stats)
    return check_row("known_attention", INSTRUMENT, n_queries > 0 and worst <= TOLERANCE, value=worst,
                     threshold=TOLERANCE, n_queries=n_queries,
                     what="mass and gap of a hand-built attention (Δ on each query's value) recovered exactly")


def reinitialised(model: HookedSequenceModel, seed: int = 0) -> HookedSequenceModel:
    """A copy of ``model`` whose attention sublayers (and their LayerNorms) are freshly initialised from ``seed``;
    the recurrent layers, MLPs and embeddings, hence what attention reads, stay as trained. A wrapped or bridged
    model's named attention modules are re-initialised by their submodules' own ``reset_parameters`` (the q, k, v
    and o projections); a norm before them belongs to its block, not to the module, and stays as trained."""
    other = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        if isinstance(other, WrappedModel):
            for module in (m for attention in other.attention_modules for m in attention.modules()):
                if hasattr(type(module), "reset_parameters"):  # the class's own: a bridge delegates the rest
                    module.reset_parameters()
            return other
        for block in other.blocks:
            if hasattr(block, "attn"):
                for module in (block.ln_attn, block.attn.W_Q, block.attn.W_K, block.attn.W_V, block.attn.W_O):
                    module.reset_parameters()
    return other


def reinit_control(model: HookedSequenceModel, task: TaskConfig, mass: pd.DataFrame, n_samples: int = 32,
                   seed: int = 0) -> dict[str, Any]:
    """Control: the best head of the same model with its attention re-initialised (same inputs to attention, no
    learned query-key circuit) must put well under the recall head's mass on its target at L_train. A measurement
    that found concentration in anything but the learned attention (the layout, the query token, a head's taste for
    the prefix) would find it here too; a checkpoint without a content-addressed recall head fails."""
    at = mass[(mass.length == task.train_length) & (mass.scale == "none")]
    if at.empty or at.mass.isna().all():
        return check_row("reinit_attention", CONTROL, False, what="no mass measured at L_train")
    trained = at.loc[at.mass.idxmax()]
    rows = pd.DataFrame(mass_rows(measure_length(reinit_model(model, seed), task, task.train_length, n_samples,
                                                 seed)))
    if rows.empty or rows.mass.isna().all():
        return check_row("reinit_attention", CONTROL, False,
                         what="no recall query in the re-initialised model's sample")
    best = rows.loc[rows.mass.idxmax()]
    passed = bool(trained.ci_low > best.ci_high and trained.mass >= MARGIN * best.mass)
    return check_row("reinit_attention", CONTROL, passed, value=float(trained.mass), ci_low=float(trained.ci_low),
                     reinit_mass=float(best.mass), reinit_ci_high=float(best.ci_high), margin=MARGIN,
                     head=f"L{int(trained['layer'])}H{int(trained['head'])} {trained['target']}",
                     what="recall head's mass at L_train vs the best head with re-initialised attention")


def placebo_control(mass: pd.DataFrame, train_length: int) -> dict[str, Any]:
    """Control: the recall head's mass on its target vs on the same role in the next pair of the dictionary. A head
    that attends to the dictionary by position (a fixed slot, the whole prefix) puts as much on the wrong pair."""
    at = mass[(mass.length == train_length) & (mass.scale == "none")]
    if at.empty or at.mass.isna().all():
        return check_row("wrong_pair", CONTROL, False, what="no mass measured at L_train")
    best = at.loc[at.mass.idxmax()]
    passed = bool(best.ci_low > MARGIN * best.wrong_mass)
    return check_row("wrong_pair", CONTROL, passed, value=float(best.mass), ci_low=float(best.ci_low),
                     wrong_mass=float(best.wrong_mass), margin=MARGIN,
                     head=f"L{int(best['layer'])}H{int(best['head'])} {best['target']}",
                     what="recall head's mass on the queried pair vs on the next pair of the dictionary")


def reinit_model(model: HookedSequenceModel, seed: int) -> HookedSequenceModel:
    """The model the re-initialisation control measures (a seam: a test swaps it for the trained model to break
    the control)."""
    return reinitialised(model, seed)


def sharpness_controls(model: HookedSequenceModel, task: TaskConfig, mass: pd.DataFrame, n_samples: int = 32,
                       seed: int = 0) -> list[dict[str, Any]]:
    """The instrument check and both controls on one checkpoint's model and its measured ``mass``."""
    rows = [known_attention_check(model, task, seed=seed),
            reinit_control(model, task, mass, n_samples, seed), placebo_control(mass, task.train_length)]
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]
