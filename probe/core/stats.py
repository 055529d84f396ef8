"""Statistics as thin, NaN-aware wrappers over ``scipy.stats``: t and Welch intervals over seeds, exact permutation
and sign-flip tests with their smallest attainable p, exact and Wilson intervals for counts, Fisher's exact test,
bootstrap intervals over sequences, and multiplicity adjustment (Holm by hand: five lines)."""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

CONFIDENCE = 0.95
SOLVED = 0.9
"""A seed 'solves' a length when its token accuracy there exceeds this (reports count such seeds)."""
EXACT_LIMIT = 2_000_000
"""Relabelings (or sign patterns) enumerated exactly; beyond this a seeded Monte Carlo sample stands in."""
MONTE_CARLO = 200_000


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
    """Mean over seeds with its Student t interval (n - 1 degrees of freedom), ``scipy.stats.ttest_1samp``'s
    ``confidence_interval``. Non-finite values are dropped; one value has no interval (NaN bounds); identical
    values give a zero-width interval.

    Chosen over a percentile bootstrap because with 3-5 seeds the bootstrap's interval is at most [min, max] and
    covers the mean only about 75 % (n = 3) to 83 % (n = 5) of the time; the t interval holds its level when the
    seeds' values are roughly normal, and is honest about how wide 3 seeds leave it."""
    from scipy import stats

    x = _clean(values)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, confidence)
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n, confidence)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # identical values: scipy warns, the width is 0
        ci = stats.ttest_1samp(x, 0.0).confidence_interval(confidence)
    return Interval(mean, float(ci.low), float(ci.high), n, confidence)


def welch_interval(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                   confidence: float = CONFIDENCE) -> Interval:
    """Difference of means ``mean(a) - mean(b)`` with Welch's t interval (``scipy.stats.ttest_ind`` with
    ``equal_var=False``); ``n`` is the smaller group's size. NaN bounds if a group has fewer than two values."""
    from scipy import stats

    x, y = _clean(a), _clean(b)
    n = min(len(x), len(y))
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, n, confidence)
    diff = float(x.mean() - y.mean())
    if n < 2:
        return Interval(diff, math.nan, math.nan, n, confidence)
    if x.var() == 0 and y.var() == 0:  # scipy's interval is NaN without spread; the difference is then exact
        return Interval(diff, diff, diff, n, confidence)
    ci = stats.ttest_ind(x, y, equal_var=False).confidence_interval(confidence)
    return Interval(diff, float(ci.low), float(ci.high), n, confidence)


def paired_interval(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                    confidence: float = CONFIDENCE) -> Interval:
    """Mean paired difference ``mean(a_i - b_i)`` with its t interval (``ttest_rel``'s, which is the one-sample
    interval of the differences); pairs with a non-finite member are dropped."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired samples need equal lengths, got {len(x)} and {len(y)}")
    return t_interval(x - y, confidence)


# --- exact permutation tests -------------------------------------------------------------------------------------
_TIE = 1e-9
"""Null values within this (relative beyond 1) of the observed statistic count as "as extreme". scipy's own p uses
100 ulps, which splits relabelings that differ by 1e-13 in a difference of mean accuracies (recipe against DAT at
3x: p 0.2147 where these ties give 0.2173), so scipy enumerates the null and the tails are counted here."""


def _p_from_null(res: Any, alternative: str, exact: bool) -> float:
    """The p of a ``scipy.stats.permutation_test`` result, ties within ``_TIE``; a Monte Carlo null counts the
    observed statistic too (as scipy's does), so that p is never 0."""
    observed = float(res.statistic)
    null = np.asarray(res.null_distribution, dtype=float)
    if not exact:
        null = np.concatenate([[observed], null])
    tol = _TIE * max(1.0, abs(observed))
    greater = np.count_nonzero(null >= observed - tol) / len(null)
    less = np.count_nonzero(null <= observed + tol) / len(null)
    tails = {"two-sided": 2 * min(greater, less), "greater": greater, "less": less}
    if alternative not in tails:
        raise ValueError(f"alternative {alternative!r}: use two-sided, less or greater")
    return float(min(1.0, tails[alternative]))


def _mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def permutation_p(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, rng_seed: int = 0,
                  alternative: str = "two-sided") -> float:
    """Exact permutation p of the difference of means over every relabeling of the pooled seeds (C(n_a + n_b,
    n_a) of them, enumerated here as one index array, ``_every_relabeling``, and held to
    ``scipy.stats.permutation_test``'s exact p by the tests); two-sided is twice the smaller tail. Beyond
    ``EXACT_LIMIT`` relabelings ``scipy.stats.permutation_test`` draws a seeded Monte Carlo sample of ``MONTE_CARLO``
    of them (p then counts the observed labelling, so it is never 0). Non-finite values are dropped."""
    from scipy import stats

    x, y = _clean(a), _clean(b)
    if len(x) == 0 or len(y) == 0:
        return math.nan
    if min(len(x), len(y)) == 1:  # scipy needs two values a group; a relabeling is then which value stands alone
        pooled = np.concatenate([x, y])
        alone = np.array([pooled[i] - np.delete(pooled, i).mean() for i in range(len(pooled))])
        null = alone if len(x) == 1 else -alone
        return _p_from_null(SimpleNamespace(statistic=x.mean() - y.mean(), null_distribution=null), alternative, True)
    if math.comb(len(x) + len(y), len(x)) <= EXACT_LIMIT:
        return _p_from_null(_every_relabeling(x, y), alternative, True)
    res = stats.permutation_test((x, y), _mean_difference, permutation_type="independent", vectorized=True,
                                 n_resamples=MONTE_CARLO, rng=np.random.default_rng(rng_seed))
    return _p_from_null(res, alternative, False)


def _every_relabeling(x: np.ndarray, y: np.ndarray) -> SimpleNamespace:
    """The difference of means under every relabeling of the pooled values, the observed one first: the null that
    ``scipy.stats.permutation_test(..., n_resamples=np.inf)`` enumerates, as one index array. Written here because
    scipy builds each relabeling in Python (about 1 s for 10 against 10 seeds, and one render of the study's
    documents runs some 80 such tests); a relabeling is which values are x, so its statistic is a sum."""
    pooled, k = np.concatenate([x, y]), len(x)
    rows = math.comb(len(pooled), k)
    picks = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(len(pooled)), k)),
                        dtype=np.int32, count=rows * k).reshape(rows, k)
    sums = pooled[picks].sum(axis=1)
    null = sums / k - (pooled.sum() - sums) / (len(pooled) - k)
    return SimpleNamespace(statistic=null[0], null_distribution=null)


def sign_flip_p(differences: Sequence[float] | np.ndarray, rng_seed: int = 0, alternative: str = "two-sided") -> float:
    """Exact sign-flip test of a paired design: the mean of the per-pair differences against all 2^n sign patterns
    (``scipy.stats.permutation_test`` of one sample, ``permutation_type="samples"``); two-sided is twice the
    smaller tail. Beyond ``EXACT_LIMIT`` patterns a seeded Monte Carlo sample stands in."""
    from scipy import stats

    d = _clean(differences)
    if len(d) == 0:
        return math.nan
    if len(d) == 1:  # scipy needs two values; one difference has two sign patterns
        return _p_from_null(SimpleNamespace(statistic=d[0], null_distribution=np.array([d[0], -d[0]])), alternative,
                            True)
    exact = 2 ** len(d) <= EXACT_LIMIT
    res = stats.permutation_test((d,), np.mean, permutation_type="samples", vectorized=True,
                                 n_resamples=np.inf if exact else MONTE_CARLO, rng=np.random.default_rng(rng_seed))
    return _p_from_null(res, alternative, exact)


def min_attainable_p(n1: int, n2: int | None = None, *, paired: bool = False,
                     alternative: str = "two-sided") -> float:
    """The smallest p an exact permutation test can return: one extreme relabeling of C(n1 + n2, n1) (two groups)
    or one sign pattern of 2^n1 (``paired``: n1 pairs, n2 unused), doubled for two-sided tests (twice the smaller
    tail), e.g. 2/252 for 5 vs 5 seeds, 2/56 for 3 vs 5, 1/16 for 5 pairs. Ties in the data can only raise it.
    NaN without an observation."""
    if alternative not in ("two-sided", "less", "greater"):
        raise ValueError(f"alternative {alternative!r}: use two-sided, less or greater")
    if paired:
        count = 2 ** n1 if n1 >= 1 else 0
    else:
        if n2 is None:
            raise ValueError("two groups need n2 (or paired=True)")
        count = math.comb(n1 + n2, n1) if n1 >= 1 and n2 >= 1 else 0
    if count == 0:
        return math.nan
    return min(1.0, (2 if alternative == "two-sided" else 1) / count)


def can_reject(n1: int, n2: int | None = None, *, family: int = 1, alpha: float = 0.05, paired: bool = False,
               alternative: str = "two-sided") -> bool:
    """Whether an exact permutation test of these group sizes can reach an adjusted p below ``alpha`` in a family
    of ``family`` tests: its smallest p times ``family`` (the Holm or Bonferroni adjustment of the smallest p of
    the family) must fall below ``alpha``. A test that cannot is not worth running."""
    if family < 1:
        raise ValueError(f"family={family}: a family holds at least one test")
    p = min_attainable_p(n1, n2, paired=paired, alternative=alternative)
    return math.isfinite(p) and min(1.0, family * p) < alpha


def permutation_p_min(n_a: int, n_b: int) -> float:
    """The smallest p ``permutation_p`` can return for groups of these sizes (``min_attainable_p``)."""
    return min_attainable_p(n_a, n_b)


def sign_flip_p_min(n_pairs: int) -> float:
    """The smallest p ``sign_flip_p`` can return with ``n_pairs`` non-zero differences: 2 / 2^n (0.0625 at n = 5)."""
    return min_attainable_p(n_pairs, paired=True)


# --- counts ---------------------------------------------------------------------------------------------------
def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE,
                    alternative: str = "two-sided") -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval for a rate after k successes in n independent trials:
    ``scipy.stats.binomtest(k, n).proportion_ci(method="exact")``. ``alternative="less"`` gives the one-sided
    upper bound (low 0), e.g. on a per-run failure rate after k failures in n runs. NaN bounds when n = 0."""
    from scipy import stats

    if n == 0:
        return math.nan, math.nan
    ci = stats.binomtest(k, n, alternative=alternative).proportion_ci(confidence, method="exact")
    return float(ci.low), float(ci.high)


def fisher_p(k_a: int, n_a: int, k_b: int, n_b: int, alternative: str = "two-sided") -> float:
    """Fisher's exact test of two rates, k_a of n_a against k_b of n_b (``scipy.stats.fisher_exact`` of the 2x2
    table), e.g. runs meeting a target under two recipes."""
    from scipy import stats

    table = [[k_a, n_a - k_a], [k_b, n_b - k_b]]
    if min(min(row) for row in table) < 0:
        raise ValueError(f"counts {k_a}/{n_a}, {k_b}/{n_b}: each k must lie in [0, n]")
    return float(stats.fisher_exact(table, alternative=alternative).pvalue)


# --- multiplicity ---------------------------------------------------------------------------------------------
def _finite_sorted(pvalues: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, out, order): the p-values, an all-NaN result of their shape, and the indices of the finite ones in
    ascending order (NaN entries stay NaN and do not count as tests)."""
    p = np.asarray(pvalues, dtype=float)
    ok = np.flatnonzero(np.isfinite(p))
    return p, np.full(p.shape, np.nan), ok[np.argsort(p[ok], kind="stable")]


def _registered(pvalues: Sequence[float] | np.ndarray, family: int | None) -> tuple[np.ndarray, int]:
    """The p values with, for a registered ``family``, every test of it not given here (no runs yet, too few
    seeds so far) standing in at p = 1 after them, so that a family read part-way is never adjusted over fewer
    tests than the complete family will be; and how many of the values are the given ones."""
    p = np.asarray(pvalues, dtype=float).ravel()
    if family is None:
        return p, len(p)
    if isinstance(family, bool) or not isinstance(family, int | np.integer) or family < 0:
        raise ValueError(f"family={family!r}: a registered family is a whole number of tests")
    tests = int(np.count_nonzero(np.isfinite(p)))
    if family < tests:
        raise ValueError(f"family={family}: a family cannot hold the {tests} tests given")
    return np.concatenate([p, np.ones(family - tests)]), len(p)


def holm(pvalues: Sequence[float] | np.ndarray, *, family: int | None = None) -> np.ndarray:
    """Holm's step-down adjustment (family-wise error); NaN entries stay NaN and do not count as tests.
    ``family``: the size of a registered family, of which these are the tests run; the others stand in at p = 1."""
    padded, n = _registered(pvalues, family)
    return _holm(padded)[:n].reshape(np.shape(pvalues))


def _holm(pvalues: np.ndarray) -> np.ndarray:
    p, out, order = _finite_sorted(pvalues)
    m = len(order)
    if m:
        scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
        out[order] = np.maximum.accumulate(scaled)  # an adjusted p never falls below a smaller raw p's
    return out


def benjamini_hochberg(pvalues: Sequence[float] | np.ndarray, *, family: int | None = None) -> np.ndarray:
    """Benjamini-Hochberg step-up adjustment (false discovery rate), ``scipy.stats.false_discovery_control``; NaN
    entries stay NaN and do not count as tests. ``family`` as for ``holm``."""
    from scipy import stats

    p, n = _registered(pvalues, family)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = stats.false_discovery_control(p[ok])
    return out[:n].reshape(np.shape(pvalues))


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
    """Percentile bootstrap over sequences (``scipy.stats.bootstrap`` of the sequence indices): ``stat`` maps
    resampled sequence indices ``(n_boot, n)`` to one value per resample; resamples where it is not finite are left
    out of the percentiles. Sequences are the independent unit: answers within one are correlated (a wrong running
    sum makes every later answer wrong), so an interval over answers would be too narrow. An interval of [0, 0]
    means that no sequence changed in this sample, not that the rate is 0: 3/n bounds it (rule of three)."""
    from scipy import stats

    if n < 2:
        return math.nan, math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns of a NaN interval, replaced below by the finite resamples'
        res = stats.bootstrap((np.arange(n),), lambda idx, axis=-1: stat(idx), n_resamples=n_boot,
                              confidence_level=level, method="percentile", vectorized=True,
                              rng=np.random.default_rng(seed))
    values = np.asarray(res.bootstrap_distribution, dtype=float)
    if np.isfinite(values).all():
        return float(res.confidence_interval.low), float(res.confidence_interval.high)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return math.nan, math.nan
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def wilson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k of n independent answers (one per sequence),
    ``binomtest(k, n).proportion_ci(method="wilson")``; unlike the bootstrap, it stays informative at k = 0 (upper
    bound about 3.8 / n)."""
    from scipy import stats

    if n == 0:
        return math.nan, math.nan
    ci = stats.binomtest(k, n).proportion_ci(level, method="wilson")
    return float(ci.low), float(ci.high)


__all__ = [
    "CONFIDENCE", "EXACT_LIMIT", "MONTE_CARLO", "N_BOOT", "Interval", "benjamini_hochberg", "bootstrap_ci",
    "can_reject", "clopper_pearson", "describe_difference", "fisher_p", "fraction_above", "holm",
    "min_attainable_p", "paired_interval", "permutation_p", "permutation_p_min", "sign_flip_p", "sign_flip_p_min",
    "t_interval", "welch_interval", "wilson",
]
