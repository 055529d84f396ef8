"""Variant against variant over seeds: the difference of mean accuracy at one length, with a permutation test."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from probe.errors import ProbeError


def permutation_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the difference of means under exchangeable seeds: exact over every split of the pooled
    values (a grid has a handful of seeds, so there are at most a few hundred splits).

    Why not ``scipy.stats.permutation_test``: it is the same statistic, but with 2-5 seeds per variant exact
    enumeration is cheap and its smallest attainable p (2 / C(n_a + n_b, n_a)) must be reported beside the p-value
    so that a reader sees what n allows; this function's caller does."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    pooled = np.concatenate([a, b])
    observed = abs(a.mean() - b.mean())
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    hits = 0
    for idx in splits:
        mask = np.zeros(len(pooled), bool)
        mask[list(idx)] = True
        hits += abs(pooled[mask].mean() - pooled[~mask].mean()) >= observed - 1e-12
    return hits / len(splits)


def compare(curves: pd.DataFrame, baselines: Sequence[str], subtask: str = "state", factor: int = 3) -> pd.DataFrame:
    """One row per (variant, baseline): means over seeds of token accuracy at ``factor`` x L_train, their
    difference, the exact permutation p-value and the smallest p the seed counts allow."""
    at = curves[(curves.subtask == subtask) & (curves.length == factor * curves.train_length)]
    per_seed = {v: g.set_index("seed").token_acc.dropna() for v, g in at.groupby("variant", sort=False)}
    unknown = [b for b in baselines if b not in per_seed]
    if unknown:
        raise ProbeError(f"--compare {', '.join(unknown)}: no such variant with finished runs; "
                         f"have {', '.join(per_seed)}")
    rows: list[dict[str, Any]] = []
    for base in baselines:
        for variant, values in per_seed.items():
            if variant == base:
                continue
            ref = per_seed[base]
            n_a, n_b = len(values), len(ref)
            rows.append({"row": "comparison", "checkpoint": None, "variant": variant, "baseline": base,
                         "subtask": subtask, "factor": factor, "length": int(factor * at.train_length.iloc[0]),
                         "n_seeds": n_a, "n_seeds_baseline": n_b, "mean": float(values.mean()),
                         "mean_baseline": float(ref.mean()), "difference": float(values.mean() - ref.mean()),
                         "p_permutation": permutation_p(values, ref) if n_a and n_b else math.nan,
                         "p_min_attainable": 2 / math.comb(n_a + n_b, n_a) if n_a and n_b else math.nan})
    return pd.DataFrame(rows)


def comparison_table(rows: pd.DataFrame) -> str:
    """Markdown: each variant against each baseline, in accuracy points."""
    if rows.empty:
        return ""
    lines = ["Against baselines: state token accuracy (%) at 3x L_train, difference of means, exact two-sided "
             "permutation p over seeds (and the smallest p those seed counts allow).", "",
             "| variant | baseline | seeds | mean | baseline mean | difference | p | min. p |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows.itertuples():
        lines.append(f"| {r.variant} | {r.baseline} | {r.n_seeds} vs {r.n_seeds_baseline} | {100 * r.mean:.1f} | "
                     f"{100 * r.mean_baseline:.1f} | {100 * r.difference:+.1f} | {r.p_permutation:.3f} | "
                     f"{r.p_min_attainable:.3f} |")
    return "\n".join(lines) + "\n"


def plot_seed_dots(curves: pd.DataFrame, summary: pd.DataFrame, subtask: str = "state", factor: int = 3):
    """Per variant: every seed's token accuracy at ``factor`` x L_train (dots) and the mean with its bootstrap
    95 % CI over seeds (bar), from the sweep's ``curves`` and ``summary``."""
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
                color="C3", markersize=18, capsize=4, lw=1.5, label="mean, bootstrap 95 % CI")
    ax.set(ylim=(-0.02, 1.02), xlabel="", ylabel=f"{subtask} token accuracy at {factor}x L_train",
           title=f"{subtask} at {factor}x: every seed (dots), mean and CI (red)")
    ax.tick_params(axis="x", rotation=20)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig
