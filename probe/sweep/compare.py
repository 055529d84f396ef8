"""Variant against variant over seeds: differences of means with Welch intervals, exact permutation p, Holm/BH;
and seeds meeting a target, pair by pair: rates with exact intervals, Newcombe's interval, Fisher's exact p."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from probe.core.stats import (
    Interval,
    benjamini_hochberg,
    can_reject,
    clopper_pearson,
    describe_difference,
    fisher_p,
    holm,
    permutation_p,
    permutation_p_min,
    t_interval,
    welch_interval,
    wilson,
)
from probe.core.tables import pipe_table
from probe.errors import ProbeError

ALPHA = 0.05


def parse_compare(items: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """``--compare``'s words: ``VARIANT`` is a baseline (every other variant against it), ``VARIANT:BASELINE`` one
    pair (e.g. ``joint-fp32:joint-bf16``, precision's effect on one preset). Baselines and pairs do not mix."""
    baselines = [w for w in items if ":" not in w]
    pairs = []
    for w in items:
        if ":" in w:
            a, _, b = w.partition(":")
            if not a or not b or ":" in b or a == b:
                raise ProbeError(f"--compare {w}: a pair is VARIANT:BASELINE, two different variants")
            pairs.append((a, b))
    if baselines and pairs:
        raise ProbeError(f"--compare: give baselines ({', '.join(baselines)}) or VARIANT:BASELINE pairs, not both")
    return baselines, pairs


def expand_pairs(variants: Sequence[str], baselines: Sequence[str],
                 pairs: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """The (variant, baseline) pairs a ``--compare`` names: ``pairs`` as given, else every variant against each of
    ``baselines``, in the order the variants come."""
    return list(pairs) or [(v, b) for b in baselines for v in dict.fromkeys(variants) if v != b]


def compare(curves: pd.DataFrame, baselines: Sequence[str], subtask: str = "state", factor: int = 3,
            windows: pd.DataFrame | None = None, window: str | None = None,
            pairs: Sequence[tuple[str, str]] = (), family: int | None = None) -> pd.DataFrame:
    """One row per (variant, baseline): means over seeds of token accuracy at ``factor`` x L_train (or, given
    ``windows`` and a ``window`` name such as ``"(2x, 4x]"``, in that window of positions: the metric of record),
    their difference with its Welch 95 % interval, the exact two-sided permutation p, the smallest p the seed
    counts allow, and Holm- and BH-adjusted p. The rows are every variant against each of ``baselines``, or
    exactly the (variant, baseline) ``pairs`` given. A pair met twice (``dat`` vs ``joint`` and ``joint`` vs
    ``dat``) is one test of the family, so the adjustment counts it once. A pair whose seed counts cannot reach an
    adjusted p below 0.05 in a family of this size (``can_reject``) is not run as a test: its p columns are NaN and
    its verdict says it is descriptive, and the adjustment runs over the tests run. ``family``, the size of a family
    fixed before the runs, is used instead when given: every pair of it not run as a test (not given here, its
    variant has no runs yet, or given with too few seeds so far) stands in with p = 1, so a grid read part-way is
    adjusted over the whole family it was registered with, never over the tests it happens to have
    (``adjusted_over`` says how many p values the adjustment saw)."""
    if window is not None:
        if windows is None or windows.empty:
            raise ProbeError(f"comparison in window {window}: this grid has no windows (evaluated before them?)")
        at = windows[(windows.subtask == subtask) & (windows.window == window)]
        if at.empty:
            raise ProbeError(f"no window {window!r} for {subtask}; have {', '.join(dict.fromkeys(windows.window))}")
        at = at.assign(length=at.hi, train_length=at.hi)  # the window's end stands where a length would
    else:
        at = curves[(curves.subtask == subtask) & (curves.length == factor * curves.train_length)]
    per_seed = {v: g.set_index("seed").token_acc.dropna() for v, g in at.groupby("variant", sort=False)}
    _known(per_seed, [*baselines, *(v for pair in pairs for v in pair)])
    pairs = expand_pairs(list(per_seed), baselines, pairs)
    rows: list[dict[str, Any]] = []
    for variant, base in pairs:
        ref, values = per_seed[base], per_seed[variant]
        diff = welch_interval(values.to_numpy(), ref.to_numpy())
        mean = t_interval(values.to_numpy())
        n_a, n_b = len(values), len(ref)
        rows.append({"row": "comparison", "checkpoint": None, "variant": variant, "baseline": base,
                     "subtask": subtask, "factor": None if window else factor, "window": window,
                     "length": int(at.length.iloc[0]) if window else int(factor * at.train_length.iloc[0]),
                     "n_seeds": n_a, "n_seeds_baseline": n_b, "mean": mean.estimate,
                     # accuracies live in [0, 1]: cutting the interval there keeps its coverage
                     "mean_ci_low": float(np.clip(mean.low, 0, 1)), "mean_ci_high": float(np.clip(mean.high, 0, 1)),
                     "mean_baseline": float(ref.mean()), "difference": diff.estimate,
                     "difference_ci_low": diff.low, "difference_ci_high": diff.high,
                     "p_min_attainable": permutation_p_min(n_a, n_b), "pair": "|".join(sorted((variant, base))),
                     "_a": values.to_numpy(), "_b": ref.to_numpy()})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    present = frame.pair.nunique()
    if family is not None and family < present:
        raise ProbeError(f"a family of {family} cannot hold the {present} pairs compared")
    registered = family is not None
    family = present if family is None else family
    frame["testable"] = [bool(len(a) and len(b)) and can_reject(len(a), len(b), family=family, alpha=ALPHA)
                         for a, b in zip(frame._a, frame._b, strict=True)]
    frame["p_permutation"] = [permutation_p(a, b) if ok else math.nan
                              for a, b, ok in zip(frame._a, frame._b, frame.testable, strict=True)]
    frame = frame.drop(columns=["_a", "_b"])
    unique = frame[frame.testable].drop_duplicates("pair")
    # a registered family: every pair of it not run as a test (no runs yet, or too few seeds so far) stands in with
    # p = 1, so a grid read part-way is never adjusted over fewer tests than the complete grid will be. Without one,
    # a pair whose seeds cannot reject is left out (Tarone): its testability is fixed by the seed counts alone.
    over = family if registered else None
    p_run = unique.p_permutation.to_numpy()
    adjusted = pd.DataFrame({"pair": unique.pair, "p_holm": holm(p_run, family=over),
                             "p_bh": benjamini_hochberg(p_run, family=over)})
    frame = frame.merge(adjusted, on="pair", how="left").drop(columns="pair")
    frame["n_tests"] = len(unique)
    frame["family"] = family
    frame["adjusted_over"] = family if registered else len(unique)
    frame["verdict"] = [_verdict(r) for r in frame.itertuples()]
    return frame


def _known(have: dict[str, Any] | Sequence[str], named: Sequence[str]) -> None:
    unknown = list(dict.fromkeys(v for v in named if v not in have))
    if unknown:
        raise ProbeError(f"--compare {', '.join(unknown)}: no such variant with finished runs; "
                         f"have {', '.join(have)}")


Bounds = list[tuple[str, str, float]]
"""A target: (metric, ``>=`` or ``<``, value) bounds, every one of which a run must meet; a metric may have two
(a range: ``x>=0.2,x<0.3``)."""


def parse_target(spec: str) -> Bounds:
    """``--target``: ``METRIC>=X`` and ``METRIC<X`` bounds joined by commas, each a column of the runs' summaries
    (``state_win_2x_4x>=0.99,recall_win_8x_16x>=0.95``); ``both-16x`` is ``BOTH_16X`` (both subtasks >= 99 % in
    (2x, 4x] and >= 95 % in (8x, 16x])."""
    if spec.strip() == "both-16x":
        spec = BOTH_16X
    bounds: Bounds = []
    for part in filter(None, (x.strip() for x in spec.split(","))):
        op = ">=" if ">=" in part else "<" if "<" in part else None
        metric, _, value = part.partition(op) if op else (part, "", "")
        try:
            bounds.append((metric.strip(), op or "", float(value)))
        except ValueError:
            op = None
        if op is None or not metric.strip():
            raise ProbeError(f"--target {part!r}: write METRIC>=X or METRIC<X (e.g. state_win_8x_16x>=0.95)")
    if not bounds:
        raise ProbeError("--target is empty: give METRIC>=X bounds, or both-16x")
    return bounds


BOTH_16X = "state_win_2x_4x>=0.99,recall_win_2x_4x>=0.99,state_win_8x_16x>=0.95,recall_win_8x_16x>=0.95"


def meets_target(runs: pd.DataFrame, bounds: Bounds) -> pd.Series:
    """Per run (index aligned with ``runs``): whether it meets every bound. A run missing a metric (evaluated
    too short for that window) is NaN, not a failure."""
    missing = list(dict.fromkeys(m for m, _, _ in bounds if m not in runs.columns))
    if missing:
        raise ProbeError(f"--target: {', '.join(missing)} not in the runs' summaries; known windows: "
                         f"{', '.join(c for c in runs.columns if '_win_' in c) or 'none'}")
    ok, unknown = np.ones(len(runs), dtype=bool), np.zeros(len(runs), dtype=bool)
    for metric, op, x in bounds:
        values = runs[metric].astype(float).to_numpy()
        unknown |= np.isnan(values)
        ok &= values >= x if op == ">=" else values < x
    return pd.Series(np.where(unknown, None, ok), index=runs.index, dtype=object).where(~unknown, np.nan)


def compare_target(runs: pd.DataFrame, pairs: Sequence[tuple[str, str]], bounds: Bounds,
                   alpha: float = ALPHA) -> pd.DataFrame:
    """Per (variant, baseline) pair: how many seeds of each meet the target (``meets_target``), each rate's exact
    (Clopper-Pearson) interval, the difference of the rates with Newcombe's hybrid-score interval, and Fisher's
    exact two-sided p, Holm-adjusted over the pairs. A pair whose seed counts cannot reach an adjusted p below
    ``alpha`` even with every seed of one side meeting the target and none of the other (Fisher's smallest p for
    those sizes, times the family) is not tested: descriptive, its p NaN."""
    _known(set(runs.variant), [v for pair in pairs for v in pair])
    met = runs.assign(_met=meets_target(runs, bounds))
    family = len({tuple(sorted(p)) for p in pairs})
    rows: list[dict[str, Any]] = []
    for variant, base in pairs:
        a, b = (met[(met.variant == v) & met._met.notna()]._met.astype(bool) for v in (variant, base))
        k_a, n_a, k_b, n_b = int(a.sum()), len(a), int(b.sum()), len(b)
        p_min = fisher_p(n_a, n_a, 0, n_b) if n_a and n_b else math.nan
        testable = math.isfinite(p_min) and family * p_min < alpha
        lo_a, hi_a = clopper_pearson(k_a, n_a)
        lo_b, hi_b = clopper_pearson(k_b, n_b)
        d_lo, d_hi = newcombe_interval(k_a, n_a, k_b, n_b)
        rows.append({"row": "target_comparison", "checkpoint": None, "variant": variant, "baseline": base,
                     "target": ",".join(f"{m}{op}{x:g}" for m, op, x in bounds),
                     "k": k_a, "n_seeds": n_a, "k_baseline": k_b, "n_seeds_baseline": n_b,
                     "rate": k_a / n_a if n_a else math.nan, "rate_ci_low": lo_a, "rate_ci_high": hi_a,
                     "rate_baseline": k_b / n_b if n_b else math.nan, "rate_baseline_ci_low": lo_b,
                     "rate_baseline_ci_high": hi_b,
                     "difference": (k_a / n_a - k_b / n_b) if n_a and n_b else math.nan,
                     "difference_ci_low": d_lo, "difference_ci_high": d_hi,
                     "p_fisher": fisher_p(k_a, n_a, k_b, n_b) if testable else math.nan,
                     "p_min_attainable": p_min, "testable": testable, "family": family})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    pair = ["|".join(sorted(x)) for x in zip(frame.variant, frame.baseline, strict=True)]
    tested = frame.assign(_pair=pair)[frame.testable].drop_duplicates("_pair")  # a pair met twice is one test
    holm_p = dict(zip(tested._pair, holm(tested.p_fisher.to_numpy()), strict=True)) if len(tested) else {}
    frame["p_holm"] = [holm_p.get(k, math.nan) for k in pair]
    frame["n_tests"] = len(tested)
    frame["verdict"] = [_target_verdict(r, alpha) for r in frame.itertuples()]
    return frame


def newcombe_interval(k_a: int, n_a: int, k_b: int, n_b: int, level: float = 0.95) -> tuple[float, float]:
    """Newcombe's hybrid-score interval (his method 10) for the difference of two rates k_a/n_a - k_b/n_b, built
    from each rate's Wilson interval. Written out because scipy has none for a difference of proportions and
    statsmodels (which has) is not a dependency; tests check it against Newcombe's (1998) published examples."""
    if not (n_a and n_b):
        return math.nan, math.nan
    p1, p2 = k_a / n_a, k_b / n_b
    l1, u1 = wilson(k_a, n_a, level)
    l2, u2 = wilson(k_b, n_b, level)
    d = p1 - p2
    return (float(d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)),
            float(d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)))


def _target_verdict(r: Any, alpha: float) -> str:
    counts = f"{r.k} of {r.n_seeds} against {r.k_baseline} of {r.n_seeds_baseline}"
    interval = f"difference {100 * r.difference:+.0f} points [{100 * r.difference_ci_low:+.0f}, " \
               f"{100 * r.difference_ci_high:+.0f}]"
    if not r.testable:
        return (f"{counts}, {interval}; descriptive: Fisher's smallest p for these seeds "
                f"({_p(r.p_min_attainable)}) x {r.family} tests is not below {alpha}, so no test was run")
    if r.p_holm < alpha:
        return f"{counts}: the rates differ, {interval}, Fisher p {_p(r.p_fisher)}, Holm {_p(r.p_holm)}"
    return f"{counts}: no difference detected, {interval}, Fisher p {_p(r.p_fisher)}, Holm {_p(r.p_holm)}"


def target_table(rows: pd.DataFrame) -> str:
    """Markdown: each pair's seeds meeting the target, the rates' difference with its interval, Fisher and Holm."""
    if rows.empty:
        return ""
    head = ["variant", "baseline", "meets target", "rate [95 % CI]", "baseline rate [95 % CI]",
            "difference [95 % CI]", "Fisher p", "min. p", "Holm p", "verdict"]
    cells = [[r.variant, r.baseline, f"{r.k}/{r.n_seeds} vs {r.k_baseline}/{r.n_seeds_baseline}",
              f"{100 * r.rate:.0f} [{100 * r.rate_ci_low:.0f}, {100 * r.rate_ci_high:.0f}]",
              f"{100 * r.rate_baseline:.0f} [{100 * r.rate_baseline_ci_low:.0f}, {100 * r.rate_baseline_ci_high:.0f}]",
              f"{100 * r.difference:+.0f} [{100 * r.difference_ci_low:+.0f}, {100 * r.difference_ci_high:+.0f}]",
              _p(r.p_fisher), _p(r.p_min_attainable), _p(r.p_holm), r.verdict] for r in rows.itertuples()]
    r0 = rows.iloc[0]
    return "\n".join([f"Seeds meeting the target `{r0.target}` (a run meets it when every bound holds), per pair: "
                      "each rate with its exact (Clopper-Pearson) 95 % interval, the difference of rates with "
                      "Newcombe's hybrid-score 95 % interval, Fisher's exact two-sided p, and Holm over the "
                      f"{int(r0.n_tests)} tests run of a family of {int(r0.family)} pairs (a pair whose seeds cannot "
                      f"reach adjusted p < {ALPHA} in that family is descriptive, not run; min. p: Fisher's smallest "
                      "p for those seed counts).", "",
                      pipe_table(head, cells)]) + "\n"


def _verdict(r: Any) -> str:
    """Holm-significant: the difference and its interval; significant only before adjustment: said so; else
    "no difference detected" with the interval (never "equal")."""
    diff = Interval(r.difference, r.difference_ci_low, r.difference_ci_high, min(r.n_seeds, r.n_seeds_baseline))
    if not r.testable:
        return ("difference " + describe_difference(diff, 0.0, ALPHA)
                + f"; descriptive: {r.n_seeds} vs {r.n_seeds_baseline} seeds cannot reach adjusted p < {ALPHA} "
                f"in a family of {r.family} (smallest attainable {_p(r.p_min_attainable)} x {r.family}), so no "
                "test was run")
    if np.isfinite(r.p_holm) and r.p_holm >= ALPHA and r.p_permutation < ALPHA:
        return describe_difference(diff, r.p_permutation, ALPHA) + f", not significant after Holm (p {_p(r.p_holm)})"
    return describe_difference(diff, r.p_holm, ALPHA)


def _p(x: float) -> str:
    return "–" if not np.isfinite(x) else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")


def comparison_table(rows: pd.DataFrame) -> str:
    """Markdown: each variant against each baseline, in accuracy points."""
    if rows.empty:
        return ""
    r0 = rows.iloc[0]
    head = ["variant", "baseline", "seeds", "mean [95 % CI]", "baseline mean", "difference [95 % CI]", "p", "min. p",
            "Holm p", "BH p", "verdict"]
    cells = []
    for r in rows.itertuples():
        ci = f" [{100 * r.mean_ci_low:.1f}, {100 * r.mean_ci_high:.1f}]" if np.isfinite(r.mean_ci_low) else ""
        dci = (f" [{100 * r.difference_ci_low:+.1f}, {100 * r.difference_ci_high:+.1f}]"
               if np.isfinite(r.difference_ci_low) else "")
        cells.append([r.variant, r.baseline, f"{r.n_seeds} vs {r.n_seeds_baseline}", f"{100 * r.mean:.1f}{ci}",
                      f"{100 * r.mean_baseline:.1f}", f"{100 * r.difference:+.1f}{dci}", _p(r.p_permutation),
                      _p(r.p_min_attainable), _p(r.p_holm), _p(r.p_bh), r.verdict])
    where = f"in the window {r0.window} of positions" if r0.get("window") else f"at {r0.factor}x L_train"
    lines = [f"Against baselines: {r0.subtask} token accuracy (%) {where}. Difference of means with "
             "its Welch 95 % interval; p: exact two-sided permutation test over seeds (twice the smaller tail; "
             f"min. p: the smallest those seed counts allow); Holm and BH: adjusted over {_over(r0)} (a pair "
             f"whose seeds cannot reach adjusted p < {ALPHA} in the family of {int(r0.family)} is reported "
             f"descriptively); verdict at Holm p < {ALPHA}.", "",
             pipe_table(head, cells)]
    return "\n".join(lines) + "\n"


def _over(r0: Any) -> str:
    """What a comparison table's adjustment ran over: the tests run, and any registered pairs standing in."""
    tests = f"the {int(r0.n_tests)} distinct tests of this table that were run"
    over = int(getattr(r0, "adjusted_over", r0.n_tests))
    if over == int(r0.n_tests):
        return tests
    return f"{tests} and {over - int(r0.n_tests)} registered pairs not run as tests (p = 1 each)"


def plot_seed_dots(curves: pd.DataFrame, summary: pd.DataFrame, subtask: str = "state", factor: int = 3):
    """Per variant: every seed's token accuracy at ``factor`` x L_train (dots) and the mean with its 95 %
    t-interval over seeds (bar), from the sweep's ``curves`` and ``summary``."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    at = curves[(curves.subtask == subtask) & (curves.length == factor * curves.train_length)]
    order = list(dict.fromkeys(at.variant))
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(order), 3.4))
    sns.stripplot(data=at, x="variant", y="token_acc", order=order, ax=ax, size=6, jitter=0.08, color="0.2")
    s = summary[(summary.subtask == subtask) & (summary.metric == "token_acc") & (summary.factor == factor)]
    s = s.set_index("variant").reindex(order)
    ax.errorbar(range(len(order)), s["mean"], yerr=[s["mean"] - s.ci_low, s.ci_high - s["mean"]], fmt="_",
                color="C3", markersize=18, capsize=4, lw=1.5, label="mean, 95 % t-interval")
    ax.set(ylim=(-0.02, 1.02), xlabel="", ylabel=f"{subtask} token accuracy at {factor}x L_train",
           title=f"{subtask} at {factor}x: every seed (dots), mean and CI (red)")
    ax.tick_params(axis="x", rotation=20)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig
