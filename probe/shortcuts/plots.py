"""Figures of the shortcut tests: each takes ``ShortcutReport``s and returns a matplotlib Figure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from probe.attention import plot_entropy, plot_head_map
from probe.tasks import SUBTASKS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from probe.shortcuts.report import ShortcutReport


def _labels(reports: Sequence[ShortcutReport]) -> list[str]:
    """A legend name per report: its label (preset), or its path where several share a label (seeds)."""
    labels = [r.label or r.checkpoint for r in reports]
    return [lab if labels.count(lab) == 1 else r.checkpoint for lab, r in zip(labels, reports, strict=True)]


def _errorbar(ax: Axes, part: pd.DataFrame, x: str, **kw: object) -> None:
    """Effect with its 95% interval as error bars (none where the interval is undefined)."""
    part = part.sort_values(x)
    err = np.vstack([part.effect - part.ci_low, part.ci_high - part.effect]).clip(min=0)
    ax.errorbar(part[x], part.effect, yerr=np.nan_to_num(err), capsize=2, marker="o", ms=3, **kw)


def plot_tests(reports: Sequence[ShortcutReport]) -> Figure:
    """The four shortcut tests that apply to every family, one colour per checkpoint, 95% intervals as bars:
    state-accuracy drop with attention knocked out (per block), fraction of answers changed by a sum-preserving
    perturbation (per span k), state-accuracy drop after a run of zeros (opening the stream or after a few numbers),
    and the drop when every answer moves k positions later (index shift where there is a positional code, k
    leading zeros for every model)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    names = _labels(reports)
    colors = sns.color_palette(n_colors=max(1, len(reports)))
    styles = ["-", "--", ":", "-."]
    (ko_ax, sp_ax), (ir_ax, off_ax) = axes
    no_attention = []
    for r, name, c in zip(reports, names, colors, strict=False):
        t = r.tests
        ko = t[(t.test == "attention_knockout") & (t.subtask == "state") & t.applicable]
        if ko.empty:
            no_attention.append(name)
        for i, (blocks, part) in enumerate(ko.groupby("blocks", sort=True)):
            label = f"{name}, {'all blocks' if blocks == 'all' else f'block {blocks}'} off"
            _errorbar(ko_ax, part, "length", color=c, ls=styles[i % 4], label=label)
        sp = t[(t.test == "sum_preserving") & t.applicable]
        for i, (k, part) in enumerate(sp.groupby("k", sort=True)):
            _errorbar(sp_ax, part, "length", color=c, ls=styles[i % 4], label=f"{name}, k={int(k)}")
        ir = t[(t.test == "identity_run") & (t.subtask == "state") & t.applicable]
        ir = ir[ir["where"] == "after"] if "where" in ir.columns else ir.iloc[:0]
        for i, (head, part) in enumerate(ir.groupby("head", sort=True)):
            start = "opening the stream" if head == 0 else f"after {int(head)} positions"
            _errorbar(ir_ax, part, "run", color=c, ls=styles[i % 4], label=f"{name}, run {start}")
        off = t[(t.test == "positional_offset") & (t.subtask == "state") & t.applicable]
        for i, method in enumerate(("pad", "index")):
            part = off[off.method == method] if "method" in off.columns else off.iloc[:0]
            if len(part):
                _errorbar(off_ax, part, "offset", color=c, ls=styles[i],
                          label=f"{name}, {'leading zeros' if method == 'pad' else 'index shift'}")
    ko_ax.set(title="attention knock-out (gate 0)", xlabel="stream length L", ylabel="state accuracy drop")
    if no_attention:
        ko_ax.text(0.01, 0.97, "N/A (no attention): " + ", ".join(no_attention), transform=ko_ax.transAxes,
                   fontsize=6, va="top")
    sp_ax.set(title="sum-preserving move of two numbers in the last k positions (tracker: 0)",
              xlabel="stream length L", ylabel="fraction of answers changed", ylim=(-0.02, None))
    ir_ax.set(title="answers after a run of r zeros", xlabel="run length r",
              ylabel="state accuracy drop vs the same sequences without the run")
    off_ax.set(title="answers moved k positions later (within L_train)", xlabel="offset k",
               ylabel="state accuracy drop")
    for ax in axes.flat:
        ax.axhline(0, color="k", lw=0.8)
        handles, _ = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_drops(reports: Sequence[ShortcutReport]) -> Figure:
    """Position tests at L_train: accuracy drop per perturbation (random, permute, index shift +k, k leading zeros),
    95% bootstrap CI; one panel per subtask, one colour per checkpoint."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(1, len(SUBTASKS), figsize=(5.5 * len(SUBTASKS), 3.8), squeeze=False)
    frames = []
    labels = _labels(reports)
    for r, label in zip(reports, labels, strict=True):
        parts = [p for p in (r.positional.dependence, r.positional.offset) if not p.empty]
        if parts:
            d = pd.concat(parts, ignore_index=True)
            d["name"] = [p if t == "position_dependence" else f"{m}+{int(k)}" for t, p, m, k in
                         zip(d.test, d.get("perturbation", [None] * len(d)), d.get("method", [None] * len(d)),
                             d.get("offset", [0] * len(d)), strict=True)]
            frames.append(d.assign(checkpoint=label))
    data = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    names = list(dict.fromkeys(data.name)) if len(data) else []
    colors = sns.color_palette(n_colors=max(1, len(reports)))
    width = 0.8 / max(1, len(reports))
    for ax, s in zip(axes[0], SUBTASKS, strict=True):
        for j, label in enumerate(labels):
            d = data[(data.subtask == s) & (data.checkpoint == label)].set_index("name").reindex(names) \
                if len(data) else pd.DataFrame()
            if d.empty:
                continue
            x = np.arange(len(names)) + (j - (len(reports) - 1) / 2) * width
            err = np.vstack([d.effect - d.ci_low, d.ci_high - d.effect]).clip(min=0)
            ax.bar(x, d.effect.fillna(0), width, yerr=np.nan_to_num(err), color=colors[j], capsize=2,
                   label=label)
            for xi, ok in zip(x, d.applicable.fillna(False), strict=True):
                if not ok:
                    ax.text(xi, 0, "N/A", rotation=90, fontsize=5, ha="center", va="bottom")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(names)), names, rotation=30, fontsize=7)
        ax.set(title=f"{s} subtask", xlabel="perturbation (index: positional code; pad: leading zeros)",
               ylabel="accuracy drop (95% CI)")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_window(reports: Sequence[ShortcutReport]) -> Figure:
    """Window test: accuracy on the new labels and agreement with the old predictions vs k, one line per
    checkpoint; chance dashed."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    fig, (ax_a, ax_g) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    c, ks = math.nan, set()
    for r, name in zip(reports, _labels(reports), strict=True):
        if not r.window.applicable:
            continue
        tbl = r.window.table
        c = float(tbl.chance.iloc[0])
        ks |= set(tbl.k)
        (line,) = ax_a.plot(tbl.k, tbl.acc_new, marker="o", label=name)
        ax_a.axhline(float(tbl.acc_old.iloc[0]), color=line.get_color(), ls=":", lw=1)
        ax_g.plot(tbl.k, tbl.agree_old, marker="o", label=name)
    for ax in (ax_a, ax_g):
        if math.isfinite(c):
            ax.axhline(c, color="k", ls="--", lw=1, label="chance 1/m")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xticks(sorted(ks), [str(k) for k in sorted(ks)])
        ax.legend(fontsize=6)
    ax_a.text(0.01, 0.02, "dotted: accuracy on the original labels", transform=ax_a.transAxes, fontsize=6)
    ax_a.set(title="accuracy on the new labels (tracker: stays high)", xlabel="k (numbers > k back resampled)",
             ylabel="fraction of state answers", ylim=(-0.02, 1.02))
    ax_g.set(title="agreement with the old predictions (windowed: stays 1)", xlabel="k (numbers > k back resampled)")
    fig.tight_layout()
    return fig


def report_figures(reports: Sequence[ShortcutReport]) -> dict[str, Figure]:
    """Every figure of the shortcut tests, by name: ``tests``, ``drops``, ``window``, ``entropy``, ``heads``."""
    named = list(zip(reports, _labels(reports), strict=True))
    heads = pd.concat([r.heads.assign(checkpoint=n) for r, n in named if not r.heads.empty] or [pd.DataFrame()])
    entropy = pd.concat([r.entropy.assign(checkpoint=n) for r, n in named if not r.entropy.empty]
                        or [pd.DataFrame()])
    return {"tests": plot_tests(reports), "drops": plot_drops(reports), "window": plot_window(reports),
            "entropy": plot_entropy(entropy), "heads": plot_head_map(heads)}
