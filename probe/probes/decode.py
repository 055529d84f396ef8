"""A linear probe of any per-position target, for any task, with the controls of the s_t probes.

``probe_model`` decodes probe's s_t mod m; ``probe_target`` decodes whatever the user names: a tensor, a function of
the tokens, or a target the batch carries (``probe.core.task``). Beside every number: a probe of a control target of
the same structure that a shortcut-taking model could compute instead (the target over the last k tokens only, or a
random label per bigram), the same probe on a random-init copy of the model, and the majority class. Then, where the
model has a per-step recurrent state, an interchange: the state after position t is set to that of a source with the
*same* target at t (the control: a model whose state is the target alone changes no later answer) and of one with
another target (beside it: what the state moves at all), and to its own (the machinery's check).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from probe.core.inputs import check_inputs
from probe.core.lengths import multiples
from probe.core.rows import CONTROL, INSTRUMENT, check_row
from probe.core.seeds import PATCHING, PROBES
from probe.core.task import IGNORE_INDEX, as_batch, as_sampler, batch_targets, is_batch, need_train_length, take_rows
from probe.errors import ProbeError
from probe.probes.controls import MARGIN, shuffled_labels_row
from probe.probes.fit import (
    Activations,
    band_mask,
    converged,
    fit_probe,
    lstm_blocks,
    random_init_like,
    recurrent_cell,
    resolve_hooks,
    state_names,
)
from probe.probes.interventions import IDENTITY_TOL, SAME_SUM_MAX
from probe.probes.targets import _splitmix64

Target = Tensor | Callable[[Tensor], Tensor] | str
"""A per-position target: a ``(batch, pos)`` tensor (with a fixed batch), a function of the tokens, or the name of a
target the batch carries (probe's tasks: ``sums``). ``-1`` (any negative value) where a position has none."""

PATCH_FRACTIONS = (0.25, 0.5, 0.75)


@dataclass
class TargetProbe:
    """``by_length``: one row per (hook, length, test_positions) with ``probe_acc, control_acc, selectivity,
    random_init_acc, majority_acc, n, probe_train_acc, converged``; ``interventions``: one row per (kind, length)
    with ``n, changed_frac`` (kinds ``same_target``, ``other_target``); ``controls``: rows with ``kind`` and
    ``passed``."""

    target: str
    control: str
    train_length: int
    hooks: list[str]
    by_length: pd.DataFrame
    interventions: pd.DataFrame
    controls: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)


def windowed(f: Callable[[Tensor], Tensor], k: int) -> Callable[[Tensor], Tensor]:
    """The target ``f`` computed at each position t from the last ``k`` tokens only (all of them while fewer than k
    have come): what attention over a few recent positions can compute without tracking anything."""
    def g(tokens: Tensor) -> Tensor:
        out = torch.full(tokens.shape, -1, dtype=torch.long)
        for t in range(tokens.shape[1]):
            out[:, t] = torch.as_tensor(f(tokens[:, max(0, t - k + 1):t + 1]))[:, -1].long()
        return out
    return g


def bigram_labels(tokens: Tensor, n_classes: int, seed: int = 0) -> Tensor:
    """A fixed random label in ``0..n_classes-1`` per (previous token, current token): a target a model computes from
    two neighbouring tokens, with as many classes as the probed target."""
    x = tokens.cpu().numpy().astype(np.uint64)
    prev = np.concatenate([np.full((x.shape[0], 1), np.uint64(2**32 - 1)), x[:, :-1]], axis=1)
    salt = _splitmix64(np.array([seed], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        labels = _splitmix64((prev * np.uint64(2**32) + x) ^ salt) % np.uint64(n_classes)
    return torch.from_numpy(labels.astype(np.int64))


def _values(target: Any, batch: Any, what: str) -> Tensor:
    if isinstance(target, str):
        targets = batch_targets(batch)
        if target not in targets:
            raise ProbeError(f"probe.probes.probe_target: the batch carries no {what} {target!r}; it has targets "
                             f"{sorted(targets)}")
        values = targets[target]
    elif isinstance(target, Tensor):
        values = target
    elif callable(target):
        values = torch.as_tensor(target(batch.tokens.cpu()))
    else:
        raise ProbeError(f"probe.probes.probe_target: the {what} must be a tensor, a function of the tokens or the "
                         f"name of a target the batch carries, got a {type(target).__name__}")
    if values.shape != batch.tokens.shape:
        raise ProbeError(f"probe.probes.probe_target: the {what} has shape {tuple(values.shape)}, the tokens "
                         f"{tuple(batch.tokens.shape)}")
    return values.long().cpu()


def _control(control: Any, target: Any, seed: int) -> tuple[str, Any]:
    """(name, the control as a target) from what the user gave; the default: the target over the last 3 tokens when
    the target is a function of the tokens, else a random label per bigram."""
    if control is None:
        control = "window3" if callable(target) and not isinstance(target, Tensor) else "bigram"
    if isinstance(control, str) and control.startswith("window") and control[6:].isdigit():
        if not callable(target) or isinstance(target, Tensor):
            raise ProbeError(f"probe.probes.probe_target: control {control!r} recomputes the target on a window, so "
                             "the target must be a function of the tokens; pass control='bigram' or your own")
        return control, windowed(target, int(control[6:]))
    if control == "bigram":
        return control, "bigram"
    if isinstance(control, str) or isinstance(control, Tensor) or callable(control):
        return (control if isinstance(control, str) else getattr(control, "__name__", "control")), control
    raise ProbeError(f"probe.probes.probe_target: control must be 'windowK', 'bigram', a tensor, a function of the "
                     f"tokens or a target's name, got a {type(control).__name__}")


@torch.no_grad()
def _collect(model: Any, batch: Any, hooks: Sequence[str], target: Any, control: Any, n_classes: int | None,
             seed: int, positions: str | None) -> tuple[Activations, Tensor]:
    """Features at the positions that have a target (within mask ``positions`` when given), and the target."""
    y = _values(target, batch, "target")
    asked = y >= 0
    if positions is not None:
        asked &= as_batch(batch, "probe.probes.probe_target", [positions]).masks[positions].cpu()
    c = bigram_labels(batch.tokens, n_classes or int(y.max()) + 1, seed) if control == "bigram" else \
        _values(control, batch, "control target")
    device = next(model.parameters()).device
    single = list(dict.fromkeys(p for h in hooks for p in h.split("+")))
    _, cache = model.run_with_cache(batch.tokens.to(device), names_filter=single)
    feats = {h: cache[h][asked.to(device)].flatten(1).float().cpu().numpy() for h in single}
    pos = (torch.arange(1, batch.tokens.shape[1] + 1) - batch.prefix_len).expand_as(asked)
    length = np.full(int(asked.sum()), batch.tokens.shape[1] - batch.prefix_len)
    return Activations(feats, y[asked].numpy(), c[asked].numpy(), pos[asked].numpy(), length), y


def _summary(hit: dict[str, np.ndarray], acts: Activations, train_length: int) -> list[dict[str, Any]]:
    rows = []
    for band in ("in", "beyond", "all"):
        sel = band_mask(acts.position, train_length, band)
        if sel.any():
            rows.append({"test_positions": band, "n": int(sel.sum()),
                         **{f"{k}_acc": float(v[sel].mean()) for k, v in hit.items()}})
    return rows


def probe_target(model: Any, task: Any, target: Target, control: Any = None, *, train_length: int | None = None,
                 lengths: Sequence[int] | None = None, hooks: Sequence[str] | None = None,
                 positions: str | None = None, n_train: int = 200, n_test: int = 48, seed: int = 0,
                 patching: bool = True, n_patch: int = 48, name: str = "<model>") -> TargetProbe:
    """Probe every hook (``resolve_hooks``; default each state and named module's output) for ``target``, trained on
    the positions ``<= train_length`` of ``n_train`` sequences of L_train and tested on ``n_test`` fresh sequences of
    each of ``lengths`` (default 1x..4x L_train) by band (``in``, ``beyond``, ``all``), its controls beside every
    number; then the interchanges of the recurrent state (module docstring).

    ``task``: probe's task or a sampler ``f(length, batch_size, seed)``, or one batch (its first half trains, its
    second half tests; a ``target`` tensor then has the batch's shape). ``control``: ``"window{k}"`` (the target
    over the last k tokens; needs a function target), ``"bigram"``, a tensor, a function of the tokens or a target's
    name; default ``window3`` for a function target, else ``bigram``. ``positions``: a mask name that restricts the
    probed positions."""
    where = "probe.probes.probe_target"
    check_inputs(where, model=model)
    model.eval()
    fixed = as_batch(task, where) if is_batch(task) else None
    sampler = None if fixed is not None else as_sampler(task, where, train_length)
    L = int(train_length or (fixed.length if fixed is not None else need_train_length(sampler, where)))
    cname, ctrl = _control(control, target, seed)
    tname = target if isinstance(target, str) else getattr(target, "__name__", "target")
    hooks = resolve_hooks(model, hooks)
    rand = random_init_like(model, seed)
    train_seed, test_seed = PROBES + seed * 1_000_000, PROBES + seed * 1_000_000 + 500_000
    if fixed is not None:
        half = max(1, fixed.tokens.shape[0] // 2)
        train_b, tests = take_rows(fixed, slice(0, half)), [take_rows(fixed, slice(half, None))]
        if isinstance(target, Tensor):
            t_train, t_tests = target[:half], [target[half:]]
        else:
            t_train, t_tests = target, [target]
        c_train, c_tests = (ctrl[:half], [ctrl[half:]]) if isinstance(ctrl, Tensor) else (ctrl, [ctrl])
    else:
        lengths = list(lengths or multiples(L))
        train_b = sampler.sample(L, n_train, train_seed)
        tests = [sampler.sample(n, n_test, test_seed + n) for n in lengths]
        t_train, t_tests, c_train, c_tests = target, [target] * len(tests), ctrl, [ctrl] * len(tests)
    y_all = _values(t_train, train_b, "target")
    n_classes = int(y_all.max()) + 1 if bool((y_all >= 0).any()) else None
    if n_classes is None:
        raise ProbeError(f"{where}: the target has no value (>= 0) at any training position: nothing to probe")
    train, _ = _collect(model, train_b, hooks, t_train, c_train, n_classes, seed, positions)
    rtrain, _ = _collect(rand, train_b, hooks, t_train, c_train, n_classes, seed, positions)
    inside = band_mask(train.position, L, "in")
    train, rtrain = train.select(inside), rtrain.select(inside)
    collected = [(_collect(model, b, hooks, t, c, n_classes, seed, positions)[0],
                  _collect(rand, b, hooks, t, c, n_classes, seed, positions)[0], b.length)
                 for b, t, c in zip(tests, t_tests, c_tests, strict=True)]
    values, counts = np.unique(train.labels, return_counts=True)
    majority = values[counts.argmax()]
    rows = []
    for hook in hooks:
        probe = fit_probe(train.x(hook), train.labels, seed)
        cprobe = fit_probe(train.x(hook), train.control, seed)
        rprobe = fit_probe(rtrain.x(hook), rtrain.labels, seed)
        info = {"hook": hook, "probe_train_acc": float(probe.score(train.x(hook), train.labels)),
                "converged": all(converged(p) for p in (probe, cprobe, rprobe))}
        for test, rtest, length in collected:
            hit = {"probe": probe.predict(test.x(hook)) == test.labels,
                   "control": cprobe.predict(test.x(hook)) == test.control,
                   "random_init": rprobe.predict(rtest.x(hook)) == rtest.labels,
                   "majority": test.labels == majority}
            rows += [{**info, "length": length, **r} for r in _summary(hit, test, L)]
    by_length = pd.DataFrame(rows)
    by_length["selectivity"] = by_length.probe_acc - by_length.control_acc
    controls = _probe_controls(by_length, cname, tname)
    best_in = str(by_length[by_length.test_positions == "in"].groupby("hook").probe_acc.mean().idxmax())
    test_all = Activations.concat([t for t, _, _ in collected])
    controls.append({**shuffled_labels_row(train, test_all, best_in, L, seed), "kind": INSTRUMENT})
    interventions = pd.DataFrame()
    blocks = lstm_blocks(model)
    if patching and blocks:
        pool = [fixed] if fixed is not None else [sampler.sample(n, 4 * n_patch, PATCHING + seed * 1_000_000 + n)
                                                  for n in (lengths or [L])]
        interventions, patch_controls = _interchange(model, blocks, pool, [target] * len(pool), n_patch, seed)
        controls += patch_controls
    meta = {"target": tname, "control_target": cname, "n_classes": n_classes, "blocks": blocks,
            "interchange": "done" if patching and blocks else
            ("off" if not patching else "no per-step recurrent state to set (module-level hooks only)")}
    return TargetProbe(tname, cname, L, hooks, by_length, interventions, pd.DataFrame(controls), meta)


def _probe_controls(by_length: pd.DataFrame, control: str, target: str) -> list[dict[str, Any]]:
    """On the hook that decodes the target best (beyond L_train where tested there, else in range), pooled over the
    test lengths: the target's probe beats the control target's and the random-init copy's by ``MARGIN``."""
    band = "beyond" if (by_length.test_positions == "beyond").any() else "in"
    rows = by_length[by_length.test_positions == band]
    w = rows.n.to_numpy(dtype=float)
    pooled = rows.assign(**{c: rows[c] * w for c in ("probe_acc", "control_acc", "random_init_acc",
                                                     "majority_acc")}).groupby("hook").sum(numeric_only=True)
    for c in ("probe_acc", "control_acc", "random_init_acc", "majority_acc"):
        pooled[c] = pooled[c] / pooled.n
    hook = str(pooled.probe_acc.idxmax())
    s = pooled.loc[hook]
    where = {"hook": hook, "test_positions": band, "n": int(s.n), "probe_acc": float(s.probe_acc),
             "majority_acc": float(s.majority_acc)}
    return [
        check_row(f"{control}_target", CONTROL, s.probe_acc - s.control_acc >= MARGIN, **where,
                  control_acc=float(s.control_acc), value=float(s.probe_acc - s.control_acc), threshold=MARGIN,
                  passes_if=">=", what=f"selectivity ({target} probe minus {control} probe); a fail means the hook "
                                       f"gives the control target as readily as {target} (no {target}-specific "
                                       "decoding), or the probe reads anything"),
        check_row("random_init", CONTROL, s.probe_acc - s.random_init_acc >= MARGIN, **where,
                  random_init_acc=float(s.random_init_acc), value=float(s.probe_acc - s.random_init_acc),
                  threshold=MARGIN, passes_if=">=",
                  what=f"{target} probe on the trained model minus on a random-init copy; a fail means the target "
                       "is decodable from an untrained model's features (the tokens give it away), not learned"),
    ]


@torch.no_grad()
def _interchange(model: Any, blocks: list[int], pool: list[Any], targets: list[Any], n: int, seed: int,
                 ) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Every block's state after position t set to a source's (every block at once): a source with the same target
    at t and another history (``same_target``), one with another target (``other_target``) and the base's own
    (``identity_patch``); counted over the base's labelled answers after t."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(PATCHING + seed)
    names = {i: state_names(model, i) for i in blocks}
    tally: dict[tuple[str, int], list[float]] = {}
    identity = 0.0
    for batch, target in zip(pool, targets, strict=True):
        y = _values(target, batch, "target")
        tokens = batch.tokens.to(device)
        _, cache = model.run_with_cache(tokens, names_filter=[h for hs in names.values() for h in hs])
        clean = model(tokens)
        pred0 = clean.argmax(-1)
        length = batch.tokens.shape[1] - batch.prefix_len
        for frac in PATCH_FRACTIONS:
            pos = batch.prefix_len + min(length - 1, max(1, round(frac * length))) - 1
            if pos + 1 >= batch.tokens.shape[1]:
                continue
            same, other, bases = [], [], []
            for i in torch.randperm(len(y), generator=gen).tolist():
                if len(bases) >= n or y[i, pos] < 0:
                    continue
                differs = (batch.tokens[:, :pos + 1] != batch.tokens[i, :pos + 1]).any(1)
                eq = ((y[:, pos] == y[i, pos]) & differs).nonzero().flatten()
                ne = ((y[:, pos] != y[i, pos]) & (y[:, pos] >= 0)).nonzero().flatten()
                if len(eq) and len(ne):
                    bases.append(i)
                    same.append(int(eq[torch.randint(len(eq), (1,), generator=gen)]))
                    other.append(int(ne[torch.randint(len(ne), (1,), generator=gen)]))
            if not bases:
                continue
            later = batch.labels[bases].to(device) != IGNORE_INDEX
            later[:, :pos + 1] = False
            for kind, src in (("same_target", same), ("other_target", other), ("identity", bases)):
                states = {b: tuple(cache[h][src, pos] for h in names[b]) for b in blocks}
                with contextlib.ExitStack() as stack:
                    for b, state in states.items():
                        stack.enter_context(recurrent_cell(model, b).override_state(pos, *state))
                    logits = model(tokens[bases])
                changed = float(((logits.argmax(-1) != pred0[bases]) & later).sum())
                row = tally.setdefault((kind, length), [0.0, 0.0])
                row[0] += changed
                row[1] += float(later.sum())
                if kind == "identity":
                    identity = max(identity, float((logits - clean[bases]).abs().max()))
    results = [{"kind": k, "block": -1 if len(blocks) > 1 else blocks[0], "length": length, "n": int(r[1]),
                "changed_frac": r[0] / r[1] if r[1] else float("nan")}
               for (k, length), r in tally.items() if k != "identity"]
    controls = []
    for (k, length), r in tally.items():
        if k == "same_target" and r[1]:
            moved = tally[("other_target", length)]
            controls.append(check_row(
                "same_target", CONTROL, r[0] / r[1] <= SAME_SUM_MAX, length=length, n=int(r[1]),
                value=r[0] / r[1], threshold=SAME_SUM_MAX, passes_if="<=",
                other_target_changed=moved[0] / moved[1] if moved[1] else float("nan"),
                what="share of later answers changed by the state of a source with the same target at t; a fail "
                     "means the state carries more than the target (the model keeps more), not a broken tool"))
        if k == "identity" and r[1]:
            controls.append(check_row(
                "identity_patch", INSTRUMENT, r[0] == 0 and identity < IDENTITY_TOL, length=length, n=int(r[1]),
                value=identity, threshold=IDENTITY_TOL, passes_if="<",
                what="largest logit change when a run is patched with its own state; a fail means the intervention "
                     "itself changes the model: a broken tool"))
    return pd.DataFrame(results), controls
