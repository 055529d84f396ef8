"""Accuracy-vs-length curves per subtask, sequence accuracy, and the length-generalization score (SPEC section 7).

Usage: ``python -m probe.evaluate ckpt.pt [more.pt ...] [--lengths 1:100] [--json] [--out DIR]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import torch

from probe.models import HookedSequenceModel
from probe.tasks import SUBTASKS, TaskConfig

EVAL_SEED_BASE = 7_000_000_000
"""Evaluation batches come from seeds far from the training seeds (which are ``seed * 1_000_003 + step``)."""


def eval_seed(seed: int, length: int, chunk: int) -> int:
    return EVAL_SEED_BASE + seed * 1_000_000 + length * 1_000 + chunk


@torch.no_grad()
def accuracy_at_length(
    model: HookedSequenceModel, task: TaskConfig, length: int, n_samples: int = 256, batch_size: int = 256,
    seed: int = 0, device: torch.device | str | None = None,
) -> dict[str, dict[str, float]]:
    """Token and sequence accuracy per subtask (and ``all``) on ``n_samples`` fresh sequences of one length.

    Sequence accuracy of a subtask counts only sequences that ask that subtask at least once (NaN if none does).
    """
    device = device or next(model.parameters()).device
    right = {s: 0 for s in (*SUBTASKS, "all")}
    asked = dict(right)
    seq_right = dict(right)
    seq_asked = dict(right)
    done, chunk = 0, 0
    while done < n_samples:
        b = min(batch_size, n_samples - done)
        batch = task.sample(length, b, eval_seed(seed, length, chunk)).to(device)
        correct = model(batch.tokens).argmax(-1) == batch.labels
        masks = {**batch.masks, "all": batch.answer_mask}
        for s, mask in masks.items():
            right[s] += int((correct & mask).sum())
            asked[s] += int(mask.sum())
            has = mask.any(dim=1)
            seq_right[s] += int(((correct | ~mask).all(dim=1) & has).sum())
            seq_asked[s] += int(has.sum())
        done += b
        chunk += 1
    return {
        s: {
            "token_acc": right[s] / asked[s] if asked[s] else math.nan,
            "seq_acc": seq_right[s] / seq_asked[s] if seq_asked[s] else math.nan,
            "n_tokens": asked[s],
        }
        for s in right
    }


def length_curve(
    model: HookedSequenceModel, task: TaskConfig, lengths: Iterable[int], n_samples: int = 256,
    batch_size: int = 256, seed: int = 0, progress: bool = False,
) -> pd.DataFrame:
    """One row per (length, subtask): ``length, subtask, token_acc, seq_acc, n_tokens``."""
    lengths = list(lengths)
    rows: list[dict[str, Any]] = []
    it: Iterable[int] = lengths
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(lengths, desc="lengths", leave=False)
    for length in it:
        for subtask, acc in accuracy_at_length(model, task, length, n_samples, batch_size, seed).items():
            rows.append({"length": length, "subtask": subtask, **acc})
    return pd.DataFrame(rows)


def lengthgen_score(curve: pd.DataFrame, train_length: int, factor: int = 3) -> dict[str, float]:
    """Mean token accuracy over lengths in (L_train, factor * L_train] per subtask (Delétang et al.'s protocol)."""
    beyond = curve[(curve.length > train_length) & (curve.length <= factor * train_length)]
    return {s: float(g.token_acc.mean()) for s, g in beyond.groupby("subtask")}


def parse_lengths(spec: str) -> list[int]:
    """``"1:100"`` (inclusive), ``"1:100:5"`` or ``"25,50,75"``."""
    from probe.errors import ProbeError

    try:
        if ":" in spec:
            parts = [int(p) for p in spec.split(":")]
            start, stop = parts[0], parts[1]
            step = parts[2] if len(parts) > 2 else 1
            out = list(range(start, stop + 1, step))
        else:
            out = [int(p) for p in spec.split(",") if p.strip()]
    except ValueError:
        raise ProbeError(f"bad --lengths {spec!r}: use START:STOP[:STEP] or a comma list such as 25,50,75") from None
    if not out or min(out) < 1:
        raise ProbeError(f"bad --lengths {spec!r}: lengths must be positive integers")
    return out


def multiples(train_length: int, factors: Sequence[int] = (1, 2, 3, 4)) -> list[int]:
    return [f * train_length for f in factors]
