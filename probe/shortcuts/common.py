"""What every shortcut test shares: sampling, predictions, chance levels, effect rows and confidence intervals."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from jaxtyping import Bool, Int
from scipy import stats
from torch import Tensor

from probe.tasks import Batch, TaskConfig

SEED_BASE = 8_400_000_000
"""Sequences of the shortcut tests come from seeds away from training and evaluation seeds; the same (seed, length)
gives the same sequences to every test, so their effects are measured on one sample."""
N_BOOT = 2000
"""Bootstrap resamples per interval."""
FLAG_EFFECT = 0.02
"""A perturbation test flags a model when the lower 95% bound of its effect exceeds this fraction of answers: more
than noise, and more than an exact tracker (0) could ever give."""
Forward = Callable[..., Tensor]
"""A model or any ``tokens (batch, pos) [, positions=] -> logits (batch, pos, vocab)`` function."""
T = TypeVar("T")


def chance(task: TaskConfig, subtask: str) -> float:
    """Accuracy of a uniform guess among the possible answers: a residue (state) or a dictionary value (recall)."""
    if subtask == "recall" and hasattr(task, "n_pairs"):
        return 1.0 / task.n_pairs
    return 1.0 / task.m


def default_lengths(task: TaskConfig) -> list[int]:
    """1x-4x the training length."""
    return [k * task.train_length for k in (1, 2, 3, 4)]


def device_of(forward: Forward) -> torch.device:
    params = getattr(forward, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return torch.device("cpu")


def sample(task: TaskConfig, length: int, n: int, seed: int) -> Batch:
    """The shared test sequences at one length (on the CPU)."""
    return task.sample(int(length), n, SEED_BASE + seed * 10_000 + int(length))


@torch.no_grad()
def predict(forward: Forward, tokens: Int[Tensor, "batch pos"], positions: Tensor | None = None,
            chunk: int = 256) -> Int[Tensor, "batch pos"]:
    """Argmax answer at every position (CPU), in chunks of sequences to bound memory."""
    device = device_of(forward)
    out = []
    for s in range(0, len(tokens), chunk):
        kw = {} if positions is None else {"positions": positions[s: s + chunk].to(device)}
        out.append(forward(tokens[s: s + chunk].to(device), **kw).argmax(-1).cpu())
    return torch.cat(out)


@dataclass
class Sampled:
    """Test sequences and the model's unperturbed answers to them."""

    batch: Batch
    pred: Int[Tensor, "batch pos"]


def baselines(forward: Forward, task: TaskConfig, lengths: Iterable[int], n: int, seed: int
              ) -> dict[int, Sampled]:
    """The unperturbed answers at every length, computed once and shared by the tests of one checkpoint."""
    out = {}
    for length in lengths:
        batch = sample(task, int(length), n, seed)
        out[int(length)] = Sampled(batch, predict(forward, batch.tokens))
    return out


def last_state_answer(batch: Batch) -> Int[Tensor, " batch"]:
    """Position of the last state question of each sequence (-1 where none is asked)."""
    state = batch.masks["state"]
    t = state.shape[1] - 1 - state.flip(1).to(torch.int8).argmax(dim=1)
    return torch.where(state.any(1), t, -1)


def counts(right: Bool[Tensor, "batch pos"], mask: Bool[Tensor, "batch pos"]) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence: answers asked and answers right."""
    return mask.sum(1).numpy().astype(float), (right & mask).sum(1).numpy().astype(float)


# --- confidence intervals ----------------------------------------------------------------------------------------
def bootstrap_ci(stat: Callable[[np.ndarray], np.ndarray], n: int, level: float = 0.95, n_boot: int = N_BOOT,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap over sequences: ``stat`` maps resampled sequence indices ``(n_boot, n)`` to one value
    per resample. Sequences are the independent unit: answers within one are correlated (a wrong running sum makes
    every later answer wrong), so an interval over answers would be too narrow. An interval of [0, 0] means that no
    sequence changed in this sample, not that the rate is 0: 3/n bounds it (rule of three)."""
    if n < 2:
        return math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    values = stat(idx)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return math.nan, math.nan
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def wilson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k of n independent answers (one per sequence); unlike the bootstrap, it stays
    informative at k = 0 (upper bound about 3.8 / n)."""
    if n == 0:
        return math.nan, math.nan
    z = float(stats.norm.ppf(0.5 + level / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t interval (over seeds); NaN bounds with fewer than two finite values."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def drop_row(n_asked: np.ndarray, base_right: np.ndarray, right: np.ndarray, n_ref: np.ndarray | None = None,
             seed: int = 0) -> dict[str, Any]:
    """Accuracy drop ``baseline_acc - acc`` on the same sequences, with a paired bootstrap interval. ``n_ref`` is
    the number of baseline answers when they are not the same answers as the perturbed ones (a zero run asks other
    questions than the stream it replaced)."""
    n_ref = n_asked if n_ref is None else n_ref
    keep = (n_asked > 0) & (n_ref > 0)
    a, b, r, nr = n_asked[keep], base_right[keep], right[keep], n_ref[keep]
    if len(a) == 0:
        return {"baseline_acc": math.nan, "acc": math.nan, "effect": math.nan, "ci_low": math.nan,
                "ci_high": math.nan, "ci_method": "bootstrap", "n_sequences": 0, "n_answers": 0}
    base, acc = b.sum() / nr.sum(), r.sum() / a.sum()
    lo, hi = bootstrap_ci(lambda i: b[i].sum(1) / nr[i].sum(1) - r[i].sum(1) / a[i].sum(1), len(a), seed=seed)
    return {"baseline_acc": float(base), "acc": float(acc), "effect": float(base - acc), "ci_low": lo, "ci_high": hi,
            "ci_method": "bootstrap", "n_sequences": int(len(a)), "n_answers": int(a.sum())}


def na_row(reason: str) -> dict[str, Any]:
    """The effect columns of a test that does not apply, with the reason."""
    nan = math.nan
    return {"applicable": False, "reason": reason, "baseline_acc": nan, "acc": nan, "effect": nan, "ci_low": nan,
            "ci_high": nan, "ci_method": None, "n_sequences": 0, "n_answers": 0}


def progress_iter(items: Iterable[T], desc: str, enabled: bool) -> Iterable[T]:
    """tqdm on stderr when asked (never under --json)."""
    if not enabled:
        return items
    import sys

    from tqdm import tqdm

    return tqdm(items, desc=desc, leave=False, file=sys.stderr)
