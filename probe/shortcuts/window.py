"""Window test: resample every number more than k positions before an answer and see whether the prediction follows
the new label (a state tracker) or keeps the old one (a model that sees only the last k positions)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Int
from torch import Tensor

from probe.core.chance import chance
from probe.core.inputs import check_inputs
from probe.core.rows import INSTRUMENT, check_row
from probe.core.seeds import SHORTCUT_WINDOW
from probe.shortcuts.oracles import tracker, windowed
from probe.shortcuts.sampling import Forward, last_state_answer, predict
from probe.tasks import TaskConfig

WINDOW_SEED_BASE = SHORTCUT_WINDOW
MIN_SKILL = 0.1
Resample = Callable[[TaskConfig, Tensor, Tensor, int, torch.Generator], tuple[Tensor, Tensor]]
"""``(task, tokens, target, k, generator) -> (new tokens, positions drawn again)``: the window test's
perturbation."""


def resample_before(task: TaskConfig, tokens: Int[Tensor, "batch pos"], target: Int[Tensor, " batch"], k: int,
                    g: torch.Generator) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"]]:
    """Every stream number more than ``k`` positions before ``target`` drawn again uniformly in Z_m; queries, the
    dictionary and the last ``k + 1`` positions up to ``target`` are kept. Also returns the positions drawn (a
    draw may repeat the old number)."""
    pos = torch.arange(tokens.shape[1])[None]
    numbers = (pos >= task.prefix_len) & (tokens < task.m)
    resample = numbers & (pos < (target - k)[:, None])
    return torch.where(resample, torch.randint(task.m, tokens.shape, generator=g), tokens), resample


def default_window_ks(length: int) -> list[int]:
    """0, 2, 8, 16, 32, ... up to length - 2 (so that something is always resampled)."""
    return [0] + [k for k in (2, 8, 16, 32, 64, 128) if k <= length - 2]


@dataclass
class WindowResult:
    """``table``: one row per k: ``k, acc_old, acc_new, agree_old, p_label_same, chance, retained, n,
    mean_resampled``. ``retained = (acc_new - chance) / (acc_old - chance)``: 1 for a state tracker, 0 for a model
    that only sees the last k tokens. ``score = 1 - mean retained`` over k; ``windowed`` when above 0.5."""

    applicable: bool
    reason: str
    table: pd.DataFrame
    score: float = math.nan

    @property
    def windowed(self) -> bool:
        return bool(self.applicable and math.isfinite(self.score) and self.score > 0.5)


@torch.no_grad()
def window_test(forward: Forward, task: TaskConfig, ks: Sequence[int] | None = None, length: int | None = None,
                n_samples: int = 256, batch_size: int = 256, seed: int = 0,
                resample: Resample = resample_before) -> WindowResult:
    """For the last state answer t of each sequence, resample every number more than k positions back (queries
    and dictionary fixed; ``resample``), recompute the label with the task's own code, and compare the new
    prediction with the new label and with the old prediction."""
    check_inputs("probe.shortcuts.window_test", forward=forward, task=task)
    if task.name == "recall":
        return WindowResult(False, "not applicable: the recall task asks no state questions", pd.DataFrame())
    length = length or task.train_length
    ks = list(default_window_ks(length) if ks is None else ks)
    g = torch.Generator().manual_seed(WINDOW_SEED_BASE - 1000 - seed)  # apart from the batch seeds
    tallies = {k: np.zeros(5) for k in ks}  # new right, agree, label same, n, resampled
    old_right = 0
    done, chunk = 0, 0
    while done < n_samples:
        b = min(batch_size, n_samples - done)
        batch = task.sample(length, b, WINDOW_SEED_BASE + seed * 10_000 + chunk)
        target = last_state_answer(batch)
        keep = target >= 0
        tokens, labels, target = batch.tokens[keep], batch.labels[keep], target[keep]
        rows = torch.arange(len(tokens))
        old_pred = predict(forward, tokens)[rows, target]
        old_right += int((old_pred == labels[rows, target]).sum())
        for k in ks:
            new_tokens, drawn = resample(task, tokens, target, k, g)
            new_label = task.relabel(new_tokens).labels[rows, target]
            new_pred = predict(forward, new_tokens)[rows, target]
            tallies[k] += [int((new_pred == new_label).sum()), int((new_pred == old_pred).sum()),
                           int((new_label == labels[rows, target]).sum()), len(tokens), int(drawn.sum())]
        done += b
        chunk += 1
    n = tallies[ks[0]][3] if ks else 0
    acc_old = old_right / n if n else math.nan
    c = chance(task, "state")
    out = []
    for k in ks:
        right, agree, same, n_k, resampled = tallies[k]
        acc_new = right / n_k
        retained = (acc_new - c) / (acc_old - c) if acc_old - c >= MIN_SKILL else math.nan
        out.append({"k": k, "acc_old": acc_old, "acc_new": acc_new, "agree_old": agree / n_k,
                    "p_label_same": same / n_k, "chance": c, "retained": retained, "n": int(n_k),
                    "mean_resampled": resampled / n_k})
    table = pd.DataFrame(out)
    used = table[table.mean_resampled > 0].retained if len(table) else pd.Series(dtype=float)
    score = 1 - float(used.mean()) if used.notna().any() else math.nan
    reason = "ok" if math.isfinite(score) else "state subtask not above chance at this length: no score"
    return WindowResult(True, reason, table, score)


def window_controls(task: TaskConfig, ks: Sequence[int] | None = None, length: int | None = None,
                    seed: int = 0, resample: Resample = resample_before) -> list[dict[str, Any]]:
    """Instrument checks of the window test (``resample`` its perturbation), on oracles: they say whether the test
    measures what it says, not anything about a checkpoint, so none is a control. Each can fail:

    - ``window_tracker_oracle_acc_new``: an exact tracker is right on every new label (== 1 at every k). Fails when
      new predictions and new labels do not come from the same resampled sequence and position (answers read one
      position late; old predictions reused, which leaves it right only as often as the label stays the same).
    - ``window_resampling_changes_labels``: the new label equals the old one about as often as chance (1/m). Fails
      when the resampling leaves the numbers as they were.
    - ``window_windowed_oracle_agree_old``: for each k, a model that sees exactly the ``k + 1`` positions the test
      keeps (w = k) repeats every old prediction. Fails when the resampling reaches into the kept positions (an
      off-by-one at the border, or k ignored); a fixed w = 1 model would miss the off-by-one for every k >= 2.
    - ``window_windowed_oracle_acc_new``: a model that sees the last 2 positions (w = 1) is at chance on the new
      labels for every k >= 1 (k = 1 added to ``ks``). Fails when the redrawn numbers are not uniform, so that the
      new label is predictable from the kept positions (at k = 1 the w = 1 model then is always right).

    Leaving every number as it was fails only ``window_resampling_changes_labels``: the labels do not move, and the
    w = 1 model stays at its old, chance, accuracy."""
    if task.name == "recall":
        return []
    length = length or task.train_length
    ks = list(default_window_ks(length) if ks is None else ks)
    c = chance(task, "state")
    exact = window_test(tracker(task), task, ks, length, 256, 256, seed, resample).table
    matched = pd.concat([window_test(windowed(task, k), task, [k], length, 256, 256, seed, resample).table
                         for k in ks]) if ks else pd.DataFrame()
    # k = 1 always: there the w = 1 model sees every kept number, so a non-uniform redraw makes it exact
    far = sorted({k for k in ks if k >= 1} | {1})
    local = window_test(windowed(task, 1), task, far, length, 256, 256, seed, resample).table
    rows = [check_row("window_tracker_oracle_acc_new", INSTRUMENT, bool(exact.acc_new.min() == 1.0),
                      value=float(exact.acc_new.min()), expected="== 1 at every k"),
            check_row("window_resampling_changes_labels", INSTRUMENT,
                      bool((exact.p_label_same - c).abs().max() < 0.1), value=float(exact.p_label_same.max()),
                      expected=f"P(new label == old) within 0.1 of chance {c:.2f}")]
    if len(matched):
        rows.append(check_row("window_windowed_oracle_agree_old", INSTRUMENT, bool(matched.agree_old.min() == 1.0),
                              value=float(matched.agree_old.min()),
                              expected="== 1 at every k for a model that sees the k + 1 kept positions"))
    if len(local):
        rows.append(check_row("window_windowed_oracle_acc_new", INSTRUMENT, bool(abs(local.acc_new - c).max() < 0.1),
                              value=float(local.acc_new.max()),
                              expected=f"within 0.1 of chance {c:.2f} at k = 1 and every k >= 1 tested"))
    return rows
