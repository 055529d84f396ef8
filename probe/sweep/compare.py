"""Variant against variant over seeds: differences of means with Welch intervals, exact permutation p, Holm/BH."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from probe.core.stats import (
    benjamini_hochberg,
    can_reject,
    describe_difference,
    holm,
    permutation_p,
    permutation_p_min,
    t_interval,
    welch_interval,
)
from probe.core.tables import pipe_table
from probe.errors import ProbeError

ALPHA = 0.05


def compare(curves: pd.DataFrame, baselines: Sequence[str], subtask: str = "state", factor: int = 3,
            windows: pd.DataFrame | None = None, window: str | None = None) -> pd.DataFrame:
    """One row per (variant, baseline): means over seeds of token accuracy at ``factor`` x L_train (or, given
    ``windows`` and a ``window`` name such as ``"(2x, 4x]"``, in that window of positions: the metric of record),
    their difference with its Welch 95 % interval, the exact two-sided permutation p, the smallest p the seed
    counts allow, and Holm- and BH-adjusted p over the table. A pair met twice (``dat`` vs ``joint`` and ``joint``
    vs ``dat``) is one test of the family, so the adjustment counts it once. A pair whose seed counts cannot reach
    an adjusted p below 0.05 in a family of this size (``can_reject``) is not run as a test: its p columns are NaN
    and its verdict says it is descriptive."""
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
    unknown = [b for b in baselines if b not in per_seed]
    if unknown:
        raise ProbeError(f"--compare {', '.join(unknown)}: no such variant with finished runs; "
                         f"have {', '.join(per_seed)}")
    rows: list[dict[str, Any]] = []
    for base in baselines:
        ref = per_seed[base]
        for variant, values in per_seed.items():
            if variant == base:
                continue
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
    family = frame.pair.nunique()
    frame["testable"] = [bool(len(a) and len(b)) and can_reject(len(a), len(b), family=family, alpha=ALPHA)
                         for a, b in zip(frame._a, frame._b, strict=True)]
    frame["p_permutation"] = [permutation_p(a, b) if ok else math.nan
                              for a, b, ok in zip(frame._a, frame._b, frame.testable, strict=True)]
    frame = frame.drop(columns=["_a", "_b"])
    unique = frame[frame.testable].drop_duplicates("pair")
    adjusted = pd.DataFrame({"pair": unique.pair, "p_holm": holm(unique.p_permutation.to_numpy()),
                             "p_bh": benjamini_hochberg(unique.p_permutation.to_numpy())})
    frame = frame.merge(adjusted, on="pair", how="left").drop(columns="pair")
    frame["n_tests"] = len(unique)
    frame["family"] = family
    frame["verdict"] = [_verdict(r) for r in frame.itertuples()]
    return frame


def _verdict(r: Any) -> str:
    """Holm-significant: the difference and its interval; significant only before adjustment: said so; else
    "no difference detected" with the interval (never "equal")."""
    from probe.core.stats import Interval

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
             f"min. p: the smallest those seed counts allow); Holm and BH: adjusted over the {int(r0.n_tests)} "
             f"distinct tests of this table that were run (a pair whose seeds cannot reach adjusted p < {ALPHA} "
             f"in the family of {int(r0.family)} is reported descriptively); verdict at Holm p < {ALPHA}.", "",
             pipe_table(head, cells)]
    return "\n".join(lines) + "\n"


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
