"""Identity run: r zeros (the identity of addition mod m) in the middle of a stream; accuracy inside the run and on
the answers after it, against the same sequences without the run. An exact tracker loses nothing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from probe.core.inputs import check_inputs
from probe.core.progress import progress_iter
from probe.errors import ProbeError
from probe.shortcuts.effects import FLAG_EFFECT, drop_row, na_row
from probe.shortcuts.oracles import forgetful, tracker
from probe.shortcuts.sampling import Forward, Sampled, baselines, counts, predict
from probe.tasks import SUBTASKS, Batch, TaskConfig

TEST = "identity_run"
DEFAULT_RUNS = (25, 50, 75)
"""Run lengths: 1x-3x the presets' L_train (25)."""
DEFAULT_HEADS = (0, 5)
"""Stream positions before the run: 0 (the run opens the stream, so the sum it must hold is 0) and 5 (it holds a
sum that is not 0 nine times in ten). Each sequence has L_train stream positions besides the run, so that its
length, L_train + r, is one of the lengths the other tests use, and the same sequences serve as the baseline."""


def heads_for(task: TaskConfig, heads: Sequence[int] = DEFAULT_HEADS) -> list[int]:
    """The heads that leave at least one answer after the run (head < L_train)."""
    return sorted({min(int(h), task.train_length // 2) for h in heads})


def zero_run(task: TaskConfig, batch: Batch, head: int, r: int) -> Tensor:
    """The tokens with stream positions ``head .. head + r - 1`` replaced by the number 0 (queries there too): a
    run of the identity, which leaves every later running sum as it was without the run."""
    tokens = batch.tokens.clone()
    s0 = batch.prefix_len + head
    tokens[:, s0: s0 + r] = 0
    return tokens


MakeRun = Callable[[TaskConfig, Batch, int, int], Tensor]


def check_zero_run(task: TaskConfig, batch: Batch, tokens: Tensor, head: int, r: int) -> tuple[int, str]:
    """Sequences where the run is not an identity, and the first reason. With the task's own labels
    (``TaskConfig.relabel``): every label after the run equals the label of the same answer in the sequence with
    the run cut out; every answer inside it is a state answer whose label is the sum reached before the run;
    tokens outside the run are untouched."""
    p = batch.prefix_len
    s0, s1 = p + head, p + head + r
    try:
        new = task.relabel(tokens)
        cut = task.relabel(torch.cat([batch.tokens[:, :s0], batch.tokens[:, s1:]], dim=1))
        reached = task.relabel(torch.cat([batch.tokens[:, :s0], torch.zeros_like(batch.tokens[:, :1])], dim=1))
    except ProbeError as e:
        return len(tokens), f"run tokens are not a task sequence: {e}"
    outside = (tokens[:, :s0] != batch.tokens[:, :s0]).any(1) | (tokens[:, s1:] != batch.tokens[:, s1:]).any(1)
    after = (new.labels[:, s1:] != cut.labels[:, s0:]).any(1)
    inside = (~new.masks["state"][:, s0:s1]).any(1) | (new.labels[:, s0:s1] != reached.labels[:, -1:]).any(1)
    bad = outside | after | inside
    reasons = [name for name, m in (("tokens outside the run changed", outside),
                                    ("a label after the run differs from the run-free sequence's", after),
                                    ("an answer inside the run is not the sum reached before it", inside))
               if bool(m.any())]
    return int(bad.sum()), "; ".join(reasons) or "ok"


@dataclass
class IdentityRunResult:
    """``table``: one row per (run, where, subtask); ``violations``: sequences failing ``check_zero_run`` (0 for a
    correct method), with the first ``violation`` reason."""

    table: pd.DataFrame
    violations: int
    violation: str


def identity_run(forward: Forward, task: TaskConfig, runs: Sequence[int] = DEFAULT_RUNS,
                 heads: Sequence[int] = DEFAULT_HEADS, n_sequences: int = 256, seed: int = 0,
                 baseline: dict[int, Sampled] | None = None, make_run: MakeRun = zero_run,
                 progress: bool = False) -> IdentityRunResult:
    """One row per (run r, head, where, subtask): ``test, run, head`` (stream positions before the run), ``length``
    (= L_train + r: the run and L_train other positions), ``where`` (``inside``: the state answers in the run;
    ``after``: the answers after it), ``subtask, acc`` (with the run), ``baseline_acc`` (the same sequences without
    it, same positions), ``effect`` (= baseline_acc - acc), ``ci_low, ci_high`` (paired bootstrap over sequences),
    ``flagged`` (ci_low > FLAG_EFFECT), ``n_sequences, n_answers, applicable, reason``."""
    check_inputs("probe.shortcuts.identity_run", forward=forward, task=task)
    lt = task.train_length
    if task.name == "recall":
        return IdentityRunResult(pd.DataFrame([{"test": TEST, "run": r, "head": h, "length": lt + r, "where": w,
                                                "subtask": "state", **na_row("not applicable: the recall task has "
                                                                             "no numbers")}
                                               for r in runs for h in heads_for(task, heads)
                                               for w in ("inside", "after")]), 0, "ok")
    base = baseline or {}
    rows: list[dict[str, Any]] = []
    violations, first = 0, "ok"
    for r in progress_iter([int(x) for x in runs], "identity run", progress):
        length = lt + r
        ref = base.get(length) or baselines(forward, task, [length], n_sequences, seed)[length]
        batch = ref.batch
        base_right = ref.pred == batch.labels
        for head in heads_for(task, heads):
            tokens = make_run(task, batch, head, r)
            bad, why = check_zero_run(task, batch, tokens, head, r)
            if bad and not violations:
                first = why
            violations += bad
            try:
                new = task.relabel(tokens)
            except ProbeError as e:
                rows.append({"test": TEST, "run": r, "head": head, "length": length, "where": "after",
                             "subtask": "state", **na_row(f"the run is not a task sequence: {e}")})
                continue
            new_right = predict(forward, tokens) == new.labels
            pos = torch.arange(tokens.shape[1])[None]
            s0, s1 = batch.prefix_len + head, batch.prefix_len + head + r
            windows = {"inside": (pos >= s0) & (pos < s1), "after": pos >= s1}
            for where, window in windows.items():
                for s in SUBTASKS if where == "after" else ("state",):
                    n, right = counts(new_right, new.masks[s] & window)
                    n_ref, b = counts(base_right, batch.masks[s] & window)
                    if n.sum() == 0:
                        continue
                    row = drop_row(n, b, right, n_ref=n_ref, seed=seed)
                    rows.append({"test": TEST, "run": r, "head": head, "length": length, "where": where,
                                 "subtask": s, "applicable": True,
                                 "reason": f"{r} zeros after {head} stream positions", **row,
                                 "flagged": bool(row["ci_low"] > FLAG_EFFECT)})
    return IdentityRunResult(pd.DataFrame(rows), violations, first)


def identity_run_controls(task: TaskConfig, runs: Sequence[int] = DEFAULT_RUNS, n_sequences: int = 64, seed: int = 0,
                          make_run: MakeRun = zero_run, result: IdentityRunResult | None = None,
                          c: int = 8) -> list[dict[str, Any]]:
    """Controls that the run (``make_run``) can fail: the task's own labels confirm that it is an identity (on the
    checkpoint's run ``result`` when given, else on the tracker's); an exact tracker loses nothing; a tracker that
    counts the zeros it reads and forgets its sum at the ``c``-th (exact on i.i.d. streams) is flagged after every
    run of at least c zeros that starts from a sum (head > 0)."""
    if task.name == "recall":
        return []
    exact = identity_run(tracker(task), task, runs, n_sequences=n_sequences, seed=seed, make_run=make_run)
    counting = identity_run(forgetful(task, c), task, [r for r in runs if r >= c] or [2 * c],
                            n_sequences=n_sequences, seed=seed, make_run=make_run).table
    # from a sum of 0, forgetting the sum loses nothing: only runs that start later can catch it
    after = counting[(counting["where"] == "after") & (counting.subtask == "state") & (counting["head"] > 0)]
    checked = result or exact
    return [
        {"control": "identity_run_is_identity", "value": checked.violations,
         "expected": f"0 sequences violate ({checked.violation})", "passed": checked.violations == 0},
        {"control": "identity_run_tracker_oracle", "value": float(exact.table.effect.abs().max()),
         "expected": "== 0 accuracy lost",
         "passed": bool(exact.table.effect.notna().any() and (exact.table.effect.dropna() == 0).all())},
        {"control": "identity_run_forgetful_oracle", "value": float(after.ci_low.min()),
         "expected": f"exact without the run, flagged (ci_low > {FLAG_EFFECT}) after every run >= {c} from head > 0",
         "passed": bool(len(after) and (after.baseline_acc == 1).all() and after.flagged.all())},
    ]
