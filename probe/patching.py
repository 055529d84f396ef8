"""Interchange interventions on the LSTM state: does the running sum a probe decodes actually drive the answers?"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from probe.errors import ProbeError
from probe.models import HookedSequenceModel
from probe.tasks import Batch, TaskConfig

PATCH_SEED_BASE = 9_000_000_000
"""Patching batches come from seeds far from training (``seed * 1_000_003 + step``) and evaluation (7e9) seeds."""

PATCH_FRACTIONS = (0.25, 0.5, 0.75)
"""Patch positions, as fractions of the stream length: early, middle and late states."""

IDENTITY_TOL = 1e-3
"""Largest logit change allowed when a sequence's own state is patched back in (unrolled vs fused float error)."""


@dataclass
class InterchangePair:
    """A base batch, a source batch that differs only in the numbers at stream positions ``<= t`` (so that
    ``s_t`` differs, never equal), and the counterfactual state labels: base numbers after t added to source's s_t.

    ``position`` is the absolute index (prefix included) of stream position t; ``later`` marks the state answers
    after it, the ones an intervention at t can move.
    """

    base: Batch
    source: Batch
    position: int
    later: Tensor
    counterfactual: Tensor


def _check_task(task: TaskConfig, batch: Batch) -> None:
    state = batch.masks["state"]
    if not state.any():
        raise ProbeError(f"task {task.name} asks no state questions; patching needs the running-sum subtask")
    if not (batch.labels[state] == batch.sums[state]).all():
        raise ProbeError(f"task {task.name}: its state answers are not the running sums; "
                         "patching supports modsum and interleaved")


def interchange_pair(task: TaskConfig, length: int, t: int, n: int, seed: int) -> InterchangePair:
    """Sequences of ``length`` whose stream position ``t`` (1-based) is a number, paired with their sources.

    The source keeps the base's dictionary, query positions and every token after t, and redraws the numbers at
    positions ``<= t``; where the redrawn sum equals the base's, x_t is shifted so that the two sums differ.
    """
    if not 1 <= t < length:
        raise ProbeError(f"patch position {t} must lie in [1, {length - 1}] for length {length}")
    g = torch.Generator().manual_seed(seed)
    base = task.sample(length, 4 * n, g)  # 4x oversampling: position t is a number with probability 1 - q
    _check_task(task, base)
    p = base.prefix_len
    pos = p + t - 1
    keep = base.masks["state"][:, pos].nonzero().squeeze(1)[:n]
    if len(keep) == 0:
        raise ProbeError(f"no sampled sequence has a number at stream position {t}")
    base = Batch(base.tokens[keep], base.labels[keep], {k: v[keep] for k, v in base.masks.items()},
                 base.sums[keep], p, length)
    state, m = base.masks["state"], task.m
    before = state.clone()
    before[:, pos + 1:] = False
    tokens = base.tokens.clone()
    fresh = torch.randint(m, tokens.shape, generator=g)
    tokens = torch.where(before, fresh, tokens)
    src_sum = torch.where(before, tokens, 0).sum(dim=1) % m
    base_sum = base.sums[:, pos]
    shift = torch.randint(1, m, (len(keep),), generator=g)
    # Shifting x_t by k shifts s_t by k: choose k so that the source's s_t is never the base's.
    fix = torch.where(src_sum == base_sum, shift, 0)
    tokens[:, pos] = (tokens[:, pos] + fix) % m
    src_sum = (src_sum + fix) % m
    numbers = torch.where(state, tokens, 0)
    sums = torch.where(base.sums >= 0, numbers.cumsum(dim=1) % m, base.sums)
    labels = torch.where(state, sums, base.labels)
    source = Batch(tokens, labels, {k: v.clone() for k, v in base.masks.items()}, sums, p, length)
    later = state.clone()
    later[:, : pos + 1] = False
    counterfactual = (src_sum[:, None] + base.sums - base_sum[:, None]) % m
    return InterchangePair(base, source, pos, later, counterfactual)


@torch.no_grad()
def lstm_states_at(model: HookedSequenceModel, tokens: Tensor, position: int) -> dict[int, tuple[Tensor, Tensor]]:
    """(h_t, c_t) of every LSTM block after absolute ``position``, each ``(batch, d_model)``.

    The LSTM input of block i is ``ln_lstm(resid_pre)``; running the fused kernel on its prefix up to ``position``
    gives the final (h, c) without the slow unrolled path.
    """
    blocks = lstm_block_indices(model)
    names = [f"blocks.{i}.hook_resid_pre" for i in blocks]
    _, cache = model.run_with_cache(tokens, names_filter=names)
    out = {}
    for i, name in zip(blocks, names, strict=True):
        block = model.blocks[i]
        _, (h, c) = block.lstm.rnn(block.ln_lstm(cache[name])[:, : position + 1])
        out[i] = (h[0], c[0])
    return out


def lstm_block_indices(model: HookedSequenceModel) -> list[int]:
    return [i for i, b in enumerate(model.blocks) if hasattr(b, "lstm")]


@torch.no_grad()
def patched_logits(model: HookedSequenceModel, tokens: Tensor, position: int,
                   states: dict[int, tuple[Tensor, Tensor]]) -> Tensor:
    """Logits of ``tokens`` with block i's LSTM state after ``position`` set to ``states[i]`` (each (batch, d))."""
    with contextlib.ExitStack() as stack:
        for i, (h, c) in states.items():
            stack.enter_context(model.blocks[i].lstm.override_state(position, h, c))
        return model(tokens)


@torch.no_grad()
def interchange_intervention(
    model: HookedSequenceModel, task: TaskConfig, lengths: Iterable[int], n: int = 64, seed: int = 0,
    fractions: Iterable[float] = PATCH_FRACTIONS,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Interchange-intervention accuracy per LSTM block (and every block at once, ``block = -1``) and length.

    Returns ``(results, controls)``. A results row: ``length, block, n`` (later state answers scored), ``iia``
    (patched answers equal to the counterfactual label), ``base_follow`` (patched answers equal to the base label),
    ``unpatched_cf`` (the chance floor: unpatched answers equal to the counterfactual), ``model_acc`` (unpatched
    state accuracy on those answers) and ``iia_correct`` (``iia`` among the answers the unpatched model gets right:
    beyond the training range a model that fails anyway cannot follow a counterfactual either). A controls row is
    the identity patch, the base's own state patched back in: ``changed_frac`` (answers that change; must be 0) and
    ``max_abs_logit_diff``.
    """
    blocks = lstm_block_indices(model)
    if not blocks:
        return pd.DataFrame(), pd.DataFrame()
    device = next(model.parameters()).device
    targets: list[tuple[int, list[int]]] = [(i, [i]) for i in blocks]
    if len(blocks) > 1:
        targets.append((-1, blocks))
    tallies: dict[tuple[int, int], dict[str, float]] = {}
    identity: dict[tuple[int, int], dict[str, float]] = {}
    for length in lengths:
        ts = sorted({min(length - 1, max(1, round(f * length))) for f in fractions}) if length > 1 else []
        for k, t in enumerate(ts):
            pair = interchange_pair(task, length, t, n, PATCH_SEED_BASE + seed * 1_000_000 + length * 100 + k)
            base_tok, src_tok = pair.base.tokens.to(device), pair.source.tokens.to(device)
            later, cf = pair.later.to(device), pair.counterfactual.to(device)
            base_labels = pair.base.labels.to(device)
            clean = model(base_tok)
            pred0 = clean.argmax(-1)
            src_states = lstm_states_at(model, src_tok, pair.position)
            if k == len(ts) // 2:  # identity control, once per length (at the middle patch position)
                own_states = lstm_states_at(model, base_tok, pair.position)
                for i in blocks:
                    logits = patched_logits(model, base_tok, pair.position, {i: own_states[i]})
                    identity[(length, i)] = {"changed": float(((logits.argmax(-1) != pred0) & later).sum()),
                                             "n": float(later.sum()),
                                             "max_diff": float((logits - clean).abs().max())}
            for block, patched in targets:
                states = {i: src_states[i] for i in patched}
                pred = patched_logits(model, base_tok, pair.position, states).argmax(-1)
                row = tallies.setdefault((length, block), {"n": 0.0, "iia": 0.0, "base_follow": 0.0,
                                                           "unpatched_cf": 0.0, "model_acc": 0.0, "cf_right": 0.0})
                row["n"] += float(later.sum())
                row["iia"] += float(((pred == cf) & later).sum())
                row["cf_right"] += float(((pred == cf) & (pred0 == base_labels) & later).sum())
                row["base_follow"] += float(((pred == base_labels) & later).sum())
                row["unpatched_cf"] += float(((pred0 == cf) & later).sum())
                row["model_acc"] += float(((pred0 == base_labels) & later).sum())
    results: list[dict[str, Any]] = []
    for (length, block), r in tallies.items():
        n_ans = max(r["n"], 1.0)
        results.append({"length": length, "block": block, "n": int(r["n"]),
                        **{k: r[k] / n_ans for k in ("iia", "base_follow", "unpatched_cf", "model_acc")},
                        "iia_correct": r["cf_right"] / r["model_acc"] if r["model_acc"] else float("nan")})
    controls = [{"control": "identity_patch", "length": length, "block": block, "n": int(r["n"]),
                 "changed_frac": r["changed"] / max(r["n"], 1.0), "max_abs_logit_diff": r["max_diff"],
                 "passed": r["changed"] == 0 and r["max_diff"] < IDENTITY_TOL}
                for (length, block), r in identity.items()]
    return pd.DataFrame(results), pd.DataFrame(controls)
