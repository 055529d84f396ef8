"""Seed-level statistics: t-intervals, Welch differences, exact permutation tests and multiplicity adjustment."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
EXACT_LIMIT = 2_000_000
"""Relabelings (or sign patterns) enumerated exactly; beyond this a seeded Monte Carlo sample stands in."""
MONTE_CARLO = 200_000
# Relative tolerance for "as extreme as observed": means of one multiset summed in another order differ by ulps,
# and accuracies are often tied (1.0 in every seed), so exact float equality would drop tied relabelings.
_TIE = 1e-9


@dataclass(frozen=True)
class Interval:
    """An estimate with its two-sided confidence interval; ``low``/``high`` are NaN where ``n`` allows none."""

    estimate: float
    low: float
    high: float
    n: int
    confidence: float = CONFIDENCE

    @property
    def finite(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def _clean(values: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """Mean over seeds with its Student t interval (n - 1 degrees of freedom). Non-finite values are dropped; one
    value has no interval (NaN bounds); identical values give a zero-width interval.

    Chosen over a percentile bootstrap because with 3-5 seeds the bootstrap's interval is at most [min, max] and
    covers the mean only about 75 % (n = 3) to 83 % (n = 5) of the time; the t interval holds its level when the
    seeds' values are roughly normal, and is honest about how wide 3 seeds leave it."""
    from scipy.stats import t

    x = _clean(values)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, confidence)
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n, confidence)
    half = float(t.ppf(0.5 + confidence / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return Interval(mean, mean - half, mean + half, n, confidence)


def welch_interval(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                   confidence: float = CONFIDENCE) -> Interval:
    """Difference of means ``mean(a) - mean(b)`` with Welch's t interval (unequal variances, Welch-Satterthwaite
    degrees of freedom); ``n`` is the smaller group's size. NaN bounds if a group has fewer than two values."""
    from scipy.stats import t

    x, y = _clean(a), _clean(b)
    if len(x) == 0 or len(y) == 0:
        return Interval(math.nan, math.nan, math.nan, min(len(x), len(y)), confidence)
    diff = float(x.mean() - y.mean())
    if len(x) < 2 or len(y) < 2:
        return Interval(diff, math.nan, math.nan, min(len(x), len(y)), confidence)
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(diff, diff, diff, min(len(x), len(y)), confidence)
    df = (va + vb) ** 2 / (va ** 2 / (len(x) - 1) + vb ** 2 / (len(y) - 1))
    half = float(t.ppf(0.5 + confidence / 2, df) * se)
    return Interval(diff, diff - half, diff + half, min(len(x), len(y)), confidence)


def paired_interval(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                    confidence: float = CONFIDENCE) -> Interval:
    """Mean paired difference ``mean(a_i - b_i)`` with its t interval; pairs with a non-finite member are dropped."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired samples need equal lengths, got {len(x)} and {len(y)}")
    return t_interval(x - y, confidence)


def _two_sided(null: np.ndarray, observed: float) -> float:
    """Twice the smaller tail, capped at 1: both directions weigh the same whatever the group sizes, which is
    ``scipy.stats.permutation_test``'s two-sided convention."""
    tol = _TIE * max(1.0, abs(observed))
    upper = np.count_nonzero(null >= observed - tol) / len(null)
    lower = np.count_nonzero(null <= observed + tol) / len(null)
    return float(min(1.0, 2 * min(upper, lower)))


def permutation_p(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, rng_seed: int = 0) -> float:
    """Exact two-sided permutation p of the difference of means over every relabeling of the pooled seeds
    (C(n_a + n_b, n_a) of them), twice the smaller tail. Beyond ``EXACT_LIMIT`` relabelings a seeded Monte Carlo
    sample of ``MONTE_CARLO`` of them is used (p then counts the observed labelling, so it is never 0)."""
    x, y = _clean(a), _clean(b)
    if len(x) == 0 or len(y) == 0:
        return math.nan
    pooled = np.concatenate([x, y])
    n, k = len(pooled), len(x)
    observed = x.mean() - y.mean()
    total = pooled.sum()
    if math.comb(n, k) <= EXACT_LIMIT:
        idx = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), k)), dtype=np.int64)
        sums = pooled[idx.reshape(-1, k)].sum(axis=1)
        return _two_sided(sums / k - (total - sums) / (n - k), observed)
    rng = np.random.default_rng(rng_seed)
    keys = rng.random((MONTE_CARLO, n)).argsort(axis=1)[:, :k]
    sums = pooled[keys].sum(axis=1)
    null = np.concatenate([[observed], sums / k - (total - sums) / (n - k)])
    return _two_sided(null, observed)


def permutation_p_min(n_a: int, n_b: int) -> float:
    """The smallest p ``permutation_p`` can return for groups of these sizes: 2 / C(n_a + n_b, n_a) (one extreme
    relabeling in the smaller tail, doubled), e.g. 2/252 for 5 vs 5 and 2/56 for 3 vs 5."""
    if n_a < 1 or n_b < 1:
        return math.nan
    return min(1.0, 2 / math.comb(n_a + n_b, n_a))


def sign_flip_p(differences: Sequence[float] | np.ndarray, rng_seed: int = 0) -> float:
    """Exact two-sided sign-flip test of a paired design: the mean of the per-pair differences against all 2^n
    sign patterns (under the null each difference is as likely to have either sign), twice the smaller tail."""
    d = _clean(differences)
    if len(d) == 0:
        return math.nan
    observed = d.mean()
    if 2 ** len(d) <= EXACT_LIMIT:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
        return _two_sided(signs @ d / len(d), observed)
    rng = np.random.default_rng(rng_seed)
    signs = rng.choice((1.0, -1.0), size=(MONTE_CARLO, len(d)))
    return _two_sided(np.concatenate([[observed], signs @ d / len(d)]), observed)


def sign_flip_p_min(n_pairs: int) -> float:
    """The smallest p ``sign_flip_p`` can return with ``n_pairs`` non-zero differences: 2 / 2^n (0.0625 at n = 5)."""
    return math.nan if n_pairs < 1 else min(1.0, 2 / 2 ** n_pairs)


def _finite_sorted(pvalues: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, out, order): the p-values, an all-NaN result of their shape, and the indices of the finite ones in
    ascending order (NaN entries stay NaN and do not count as tests)."""
    p = np.asarray(pvalues, dtype=float)
    ok = np.flatnonzero(np.isfinite(p))
    return p, np.full(p.shape, np.nan), ok[np.argsort(p[ok], kind="stable")]


def holm(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment (family-wise error); NaN entries stay NaN and do not count as tests."""
    p, out, order = _finite_sorted(pvalues)
    m = len(order)
    if m:
        scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
        out[order] = np.maximum.accumulate(scaled)  # an adjusted p never falls below a smaller raw p's
    return out


def benjamini_hochberg(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg step-up adjustment (false discovery rate); NaN entries stay NaN."""
    p, out, order = _finite_sorted(pvalues)
    m = len(order)
    if m:
        scaled = np.minimum(1.0, p[order] * m / np.arange(1, m + 1))
        out[order] = np.minimum.accumulate(scaled[::-1])[::-1]
    return out


def fraction_above(values: Sequence[float] | np.ndarray, threshold: float = 0.9) -> tuple[int, int]:
    """How many seeds exceed ``threshold`` (strictly), out of how many with a finite value."""
    x = _clean(values)
    return int(np.count_nonzero(x > threshold)), len(x)


def describe_difference(diff: Interval, p: float, alpha: float = 0.05, scale: float = 100.0,
                        digits: int = 1) -> str:
    """A difference in words that never claims equality: ``"+23.2 [19.0, 27.4]"`` when ``p < alpha``, else
    ``"no difference detected, difference CI [-4.0, +1.7]"``. ``scale`` turns fractions into points."""
    def f(v: float) -> str:
        return "–" if not math.isfinite(v) else f"{scale * v:+.{digits}f}"

    ci = f"[{f(diff.low)}, {f(diff.high)}]"
    if math.isfinite(p) and p < alpha:
        return f"{f(diff.estimate)} {ci}"
    return f"no difference detected, difference CI {ci}"


# --- sequence-level intervals (within one checkpoint: sequences are the independent unit) ---------------------------
N_BOOT = 2000
"""Bootstrap resamples per interval."""


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
    from scipy.stats import norm

    if n == 0:
        return math.nan, math.nan
    z = float(norm.ppf(0.5 + level / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


__all__ = [
    "N_BOOT", "bootstrap_ci", "wilson",
    "CONFIDENCE", "Interval", "benjamini_hochberg", "describe_difference", "fraction_above", "holm",
    "paired_interval", "permutation_p", "permutation_p_min", "sign_flip_p", "sign_flip_p_min", "t_interval",
    "welch_interval",
]
