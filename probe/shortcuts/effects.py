"""Effect rows of the shortcut tests: an accuracy drop on the same sequences with its interval, or why none applies."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from probe.core.stats import bootstrap_ci

FLAG_EFFECT = 0.02
"""A perturbation test flags a model when the lower 95% bound of its effect exceeds this fraction of answers: more
than noise, and more than an exact tracker (0) could ever give."""


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
