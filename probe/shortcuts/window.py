"""Window test: resample every number more than k positions before an answer and see whether the prediction follows
the new label (a state tracker) or keeps the old one (a model that sees only the last k positions)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from probe.core.chance import chance
from probe.core.seeds import SHORTCUT_WINDOW
from probe.shortcuts.oracles import tracker, windowed
from probe.shortcuts.sampling import Forward, last_state_answer, predict
from probe.tasks import TaskConfig

WINDOW_SEED_BASE = SHORTCUT_WINDOW
MIN_SKILL = 0.1


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
                n_samples: int = 256, batch_size: int = 256, seed: int = 0) -> WindowResult:
    """For the last state answer t of each sequence, resample every number more than k positions back (queries
    and dictionary fixed), recompute the label with the task's own code, and compare the new prediction with the
    new label and with the old prediction."""
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
        pos = torch.arange(tokens.shape[1])[None]
        numbers = (pos >= batch.prefix_len) & (tokens < task.m)
        for k in ks:
            resample = numbers & (pos < (target - k)[:, None])
            new_tokens = torch.where(resample, torch.randint(task.m, tokens.shape, generator=g), tokens)
            new_label = task.relabel(new_tokens).labels[rows, target]
            new_pred = predict(forward, new_tokens)[rows, target]
            tallies[k] += [int((new_pred == new_label).sum()), int((new_pred == old_pred).sum()),
                           int((new_label == labels[rows, target]).sum()), len(tokens), int(resample.sum())]
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
                    seed: int = 0) -> list[dict[str, Any]]:
    """The window test on two oracles: an exact state tracker keeps accuracy 1 on the new labels at every k; a
    model that sees only the last 2 positions (w = 1) keeps all its old predictions and drops to chance for every
    k >= 1."""
    if task.name == "recall":
        return []
    length = length or task.train_length
    ks = list(default_window_ks(length) if ks is None else ks)
    c = chance(task, "state")
    exact = window_test(tracker(task), task, ks, length, 256, 256, seed).table
    local = window_test(windowed(task, 1), task, ks, length, 256, 256, seed).table
    local = local[local.k >= 1]
    rows = [{"control": "window_tracker_oracle_acc_new", "value": float(exact.acc_new.min()),
             "expected": "== 1 at every k", "passed": bool(exact.acc_new.min() == 1.0)},
            {"control": "window_resampling_changes_labels", "value": float(exact.p_label_same.max()),
             "expected": f"P(new label == old) within 0.1 of chance {c:.2f}",
             "passed": bool((exact.p_label_same - c).abs().max() < 0.1)}]
    if len(local):
        rows += [{"control": "window_windowed_oracle_agree_old", "value": float(local.agree_old.min()),
                  "expected": "== 1 for k >= 1", "passed": bool(local.agree_old.min() == 1.0)},
                 {"control": "window_windowed_oracle_acc_new", "value": float(local.acc_new.max()),
                  "expected": f"within 0.1 of chance {c:.2f}",
                  "passed": bool(abs(local.acc_new - c).max() < 0.1)}]
    return rows
