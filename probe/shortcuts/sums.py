"""Sum-preserving perturbation: two numbers near an answer move by -d and +d, so the running sum at and after the
second is unchanged; the fraction of answers that change measures a local shortcut (an exact tracker changes none)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from probe.core.inputs import check_inputs
from probe.core.lengths import multiples
from probe.core.progress import progress_iter
from probe.core.seeds import SHORTCUT_SUMS
from probe.core.stats import wilson
from probe.errors import ProbeError
from probe.shortcuts.effects import FLAG_EFFECT, na_row
from probe.shortcuts.oracles import tracker, windowed
from probe.shortcuts.sampling import DEFAULT_FACTORS, Forward, Sampled, baselines, last_state_answer, predict
from probe.tasks import Batch, TaskConfig

TEST = "sum_preserving"
DEFAULT_KS = (3, 10)
"""Spans (positions before and at the answer) that hold both moved numbers: a short-range and a longer local
shortcut."""
_PERTURB_SEED = SHORTCUT_SUMS


@dataclass
class Perturbed:
    """Perturbed tokens and, per sequence, the answer position ``target`` and the two moved positions ``i < j``
    (-1 where the span holds fewer than two numbers: the sequence is skipped)."""

    tokens: Int[Tensor, "batch pos"]
    target: Int[Tensor, " batch"]
    i: Int[Tensor, " batch"]
    j: Int[Tensor, " batch"]

    @property
    def valid(self) -> Tensor:
        return (self.i >= 0) & (self.target >= 0)


def sum_preserving_perturbation(task: TaskConfig, batch: Batch, k: int, g: torch.Generator) -> Perturbed:
    """For each sequence's last state answer t: two distinct *number* positions i < j among the last k stream
    positions (t - k < i < j <= t; never a query key, never the dictionary), ``x_i -> x_i - d`` and
    ``x_j -> x_j + d`` (mod m) with d uniform in 1..m-1. The running sum changes by -d on [i, j) and not at all from
    j on, so every state label at and after j is the same."""
    tokens = batch.tokens.clone()
    b, t_len = tokens.shape
    target = last_state_answer(batch)
    pos = torch.arange(t_len)[None]
    numbers = (pos >= batch.prefix_len) & (tokens < task.m)
    span = numbers & (pos <= target[:, None]) & (pos > (target - k)[:, None])
    score = torch.where(span, torch.rand(b, t_len, generator=g), -1.0)
    top, where = score.topk(2, dim=1)
    ok = (top[:, 1] >= 0) & (target >= 0)
    i, j = where.min(1).values, where.max(1).values
    d = torch.randint(1, task.m, (b,), generator=g)
    rows = torch.arange(b)[ok]
    tokens[rows, i[ok]] = (tokens[rows, i[ok]] - d[ok]) % task.m
    tokens[rows, j[ok]] = (tokens[rows, j[ok]] + d[ok]) % task.m
    return Perturbed(tokens, target, torch.where(ok, i, -1), torch.where(ok, j, -1))


Perturb = Callable[[TaskConfig, Batch, int, torch.Generator], Perturbed]


def check_perturbation(task: TaskConfig, batch: Batch, pert: Perturbed, k: int) -> tuple[int, str]:
    """Sequences whose perturbation is not what the test claims, and the first reason: the task's own labels of
    the perturbed tokens (``TaskConfig.relabel``) must equal the original state labels at and after j; exactly the
    two positions i and j changed, both numbers of the stream before and after, within the last k positions."""
    valid = pert.valid
    if not bool(valid.any()):
        return 0, "no sequence perturbed"
    old, new = batch.tokens[valid], pert.tokens[valid]
    i, j, t = pert.i[valid], pert.j[valid], pert.target[valid]
    try:
        relabelled = task.relabel(new)
    except ProbeError as e:
        return int(valid.sum()), f"perturbed tokens are not a task sequence: {e}"
    pos = torch.arange(old.shape[1])[None]
    after = batch.masks["state"][valid] & (pos >= j[:, None])
    label_changed = ((relabelled.labels != batch.labels[valid]) & after).any(1)
    moved = old != new
    expected = (pos == i[:, None]) | (pos == j[:, None])
    wrong_place = (moved != expected).any(1)
    numbers = (old < task.m) & (new < task.m) & (pos >= batch.prefix_len)
    not_number = (expected & ~numbers).any(1)
    out_of_span = (i <= t - k) | (j > t) | (i >= j)
    bad = label_changed | wrong_place | not_number | out_of_span
    reasons = [name for name, m in (("a state label at or after j changed", label_changed),
                                    ("tokens changed outside {i, j}", wrong_place),
                                    ("a moved token is not a stream number", not_number),
                                    ("i, j outside the last k positions", out_of_span)) if bool(m.any())]
    return int(bad.sum()), "; ".join(reasons) or "ok"


@dataclass
class SumPreservingResult:
    """``table``: one row per (length, k); ``violations``: sequences whose perturbation failed
    ``check_perturbation`` (0 for a correct method), with the first ``violation`` reason."""

    table: pd.DataFrame
    violations: int
    violation: str


def sum_preserving(forward: Forward, task: TaskConfig, lengths: Sequence[int] | None = None,
                   ks: Sequence[int] = DEFAULT_KS, n_sequences: int = 256, seed: int = 0,
                   baseline: dict[int, Sampled] | None = None, perturb: Perturb = sum_preserving_perturbation,
                   progress: bool = False) -> SumPreservingResult:
    """One row per (length, k): ``test, length, k, subtask (state), effect`` = fraction of the last state answers
    whose prediction changes, ``ci_low, ci_high`` (Wilson: one answer per sequence, so answers are independent),
    ``flagged`` (ci_low > FLAG_EFFECT), ``baseline_acc, acc`` (on the unchanged label), ``changed_if_right`` (the
    fraction among the ``n_right`` answers that were right before), ``n_sequences`` (perturbed), ``n_skipped``
    (fewer than two numbers in the span), ``applicable, reason``."""
    check_inputs("probe.shortcuts.sum_preserving", forward=forward, task=task)
    lengths = [int(x) for x in (lengths or multiples(task.train_length, DEFAULT_FACTORS))]
    if task.name == "recall":
        return SumPreservingResult(pd.DataFrame([{"test": TEST, "length": L, "k": k, "subtask": "state", **na_row(
            "not applicable: the recall task asks no state questions")} for L in lengths for k in ks]), 0, "ok")
    base = baseline or {}
    rows: list[dict[str, Any]] = []
    violations, first = 0, "ok"
    for length in progress_iter(lengths, "sum-preserving", progress):
        ref = base.get(length) or baselines(forward, task, [length], n_sequences, seed)[length]
        batch = ref.batch
        for k in ks:
            g = torch.Generator().manual_seed(_PERTURB_SEED + seed * 10_000 + length * 100 + int(k))
            pert = perturb(task, batch, int(k), g)
            bad, why = check_perturbation(task, batch, pert, int(k))
            if bad and not violations:
                first = why
            violations += bad
            valid = pert.valid
            n = int(valid.sum())
            if n == 0:
                rows.append({"test": TEST, "length": length, "k": int(k), "subtask": "state", "n_skipped": len(valid),
                             **na_row(f"not applicable: no sequence has two numbers in its last {k} positions")})
                continue
            rows_idx = torch.arange(len(valid))[valid]
            t = pert.target[valid]
            old = ref.pred[rows_idx, t]
            new = predict(forward, pert.tokens[valid])[torch.arange(n), t]
            label = batch.labels[rows_idx, t]
            changed = int((new != old).sum())
            lo, hi = wilson(changed, n)
            # a wrong answer may move under any edit; a right one that moves was not reading the sum alone
            right = old == label
            broken = int(((new != old) & right).sum())
            rows.append({"test": TEST, "length": length, "k": int(k), "subtask": "state", "applicable": True,
                         "reason": f"two numbers in the last {k} positions moved by -d, +d",
                         "baseline_acc": float(right.float().mean()),
                         "acc": float((new == label).float().mean()), "effect": changed / n, "ci_low": lo,
                         "ci_high": hi, "ci_method": "wilson", "n_sequences": n, "n_answers": n,
                         "n_skipped": int(len(valid) - n), "flagged": bool(lo > FLAG_EFFECT),
                         "changed_if_right": broken / max(1, int(right.sum())), "n_right": int(right.sum())})
    return SumPreservingResult(pd.DataFrame(rows), violations, first)


def sum_preserving_controls(task: TaskConfig, lengths: Sequence[int] | None = None, ks: Sequence[int] = DEFAULT_KS,
                            n_sequences: int = 128, seed: int = 0, perturb: Perturb = sum_preserving_perturbation,
                            result: SumPreservingResult | None = None) -> list[dict[str, Any]]:
    """Controls that the perturbation (``perturb``) can fail: the task's own labels confirm that it preserves the
    sum where the answers are read (on the checkpoint's run ``result`` when given, else on the tracker's run); an
    exact tracker changes no answer; a model that sees only the last 2 positions is flagged at every k and
    length."""
    if task.name == "recall":
        return []
    lengths = [int(x) for x in (lengths or [task.train_length, 3 * task.train_length])]
    exact = sum_preserving(tracker(task), task, lengths, ks, n_sequences, seed, perturb=perturb)
    local = sum_preserving(windowed(task, 1), task, lengths, ks, n_sequences, seed, perturb=perturb).table
    checked = result or exact
    return [
        {"control": "sum_preserving_labels_unchanged", "value": checked.violations,
         "expected": f"0 sequences violate ({checked.violation})", "passed": checked.violations == 0},
        {"control": "sum_preserving_tracker_oracle", "value": float(exact.table.effect.max()),
         "expected": "== 0 answers change",
         "passed": bool(exact.table.effect.notna().any() and (exact.table.effect.dropna() == 0).all())},
        {"control": "sum_preserving_windowed_oracle", "value": float(local.ci_low.min()),
         "expected": f"flagged (ci_low > {FLAG_EFFECT}) at every k and length",
         "passed": bool(local.flagged.all())},
    ]
