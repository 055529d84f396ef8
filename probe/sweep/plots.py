"""The sweep's figures: token accuracy vs length, one band per variant, every seed as a thin line; and the metric of
record, token accuracy per window of positions, every seed a dot beside its chance floor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from probe.errors import ProbeError

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _draw_variant(ax: Any, curves: pd.DataFrame, bands: pd.DataFrame, variant: str, subtask: str, color: Any,
                  label: Callable[[int], str]) -> None:
    """One variant on one panel: each seed thin, the mean over seeds thick with its 95 % band; ``label`` gets the
    number of seeds."""
    part = curves[(curves.variant == variant) & (curves.subtask == subtask)]
    for _, seed_curve in part.groupby("seed"):
        ax.plot(seed_curve.length, seed_curve.token_acc, color=color, lw=0.5, alpha=0.45)
    band = bands[(bands.variant == variant) & (bands.subtask == subtask)]
    ax.fill_between(band.length, band.ci_low, band.ci_high, color=color, alpha=0.2, lw=0)
    ax.plot(band.length, band["mean"], color=color, lw=1.7, label=label(part.seed.nunique()))


def plot_sweep(curves: pd.DataFrame, bands: pd.DataFrame, subtasks: Sequence[str] = ("state", "recall")) -> Figure:
    """One panel per subtask: per variant the mean over seeds (thick), its 95 % t-interval (band) and each seed
    (thin); the training lengths shaded. ``curves`` and ``bands`` as in ``SweepReport``."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    present = [s for s in subtasks if curves[curves.subtask == s].token_acc.notna().any()] or ["all"]
    variants = list(dict.fromkeys(curves.variant))
    colors = dict(zip(variants, sns.color_palette("tab10", len(variants)), strict=True))
    fig, axes = plt.subplots(1, len(present), figsize=(5 * len(present), 3.6), sharey=True, squeeze=False)
    for ax, subtask in zip(axes[0], present, strict=True):
        for variant in variants:
            _draw_variant(ax, curves, bands, variant, subtask, colors[variant], lambda n, v=variant: f"{v} ({n} seeds)")
        lt = int(curves.train_length.max())
        ax.axvspan(1, lt, color="0.85", alpha=0.5, lw=0, label=f"training lengths (1–{lt})")
        ax.set(title=f"{subtask} subtask", xlabel="stream length L (tokens)", ylabel="token accuracy",
               ylim=(-0.02, 1.02))
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("Token accuracy vs length — thick: mean over seeds; band: 95 % t-interval of the mean; "
                 "thin: each seed", fontsize=8)
    fig.tight_layout()
    return fig


def window_panels(windows: pd.DataFrame) -> list[str]:
    """The window figure's panels, in reading order: the state, each factor of its modulus (``state_mod2``,
    ``state_mod5``, ... as the grid scored them), recall; then any other subtask."""
    have = list(dict.fromkeys(windows.subtask))
    factors = sorted((x for x in have if x.startswith("state_mod")), key=lambda x: int(x.removeprefix("state_mod")))
    first = [x for x in ("state", *factors, "recall") if x in have]
    return first + [x for x in have if x not in first]


def plot_windows(windows: pd.DataFrame, summary: pd.DataFrame, subtasks: Sequence[str] | None = None) -> Figure:
    """One panel per subtask (the state, each factor of the modulus, recall: ``window_panels``): per variant and
    window of stream positions, every seed's token accuracy (a dot) and the mean over seeds with its 95 %
    t-interval (a bar), and the window's chance floor (dashed). Windows stand in order of position. ``windows`` is
    a grid's per-run window table (``Grid.windows``), ``summary`` its ``window_summary``."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    present = [x for x in (subtasks or window_panels(windows)) if (windows.subtask == x).any()]
    if not present:
        raise ProbeError("no window to plot: the runs were not scored per window of positions")
    order = list(windows.sort_values(["lo", "hi"]).window.drop_duplicates())
    variants = list(dict.fromkeys(windows.variant))
    colors = dict(zip(variants, sns.color_palette("tab10", len(variants)), strict=True))
    ncols = min(2, len(present))
    nrows = -(-len(present) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * (1.5 + 1.1 * len(order)), 3.4 * nrows), sharey=True,
                             squeeze=False)
    for ax in axes.flat[len(present):]:
        ax.set_visible(False)
    spread = 0.8 / max(len(variants), 1)
    for ax, subtask in zip(axes.flat, present, strict=False):
        for i, variant in enumerate(variants):
            offset = (i - (len(variants) - 1) / 2) * spread
            part = windows[(windows.variant == variant) & (windows.subtask == subtask)]
            x = part.window.map({w: j for j, w in enumerate(order)}) + offset
            ax.scatter(x, part.token_acc, s=9, color=colors[variant], alpha=0.6, lw=0)
            s = summary[(summary.variant == variant) & (summary.subtask == subtask)].set_index("window")
            s = s.reindex([w for w in order if w in s.index])
            xs = [order.index(w) + offset for w in s.index]
            ax.errorbar(xs, s["mean"], yerr=[s["mean"] - s.ci_low.fillna(s["mean"]),
                                             s.ci_high.fillna(s["mean"]) - s["mean"]],
                        fmt="_", color=colors[variant], markersize=9, capsize=2, lw=1.2,
                        label=f"{variant} ({part.seed.nunique()} seeds)")
        floors = windows[windows.subtask == subtask].groupby("window", sort=False).chance.first().reindex(order)
        ax.hlines(floors, [j - 0.45 for j in range(len(order))], [j + 0.45 for j in range(len(order))],
                  colors="0.3", linestyles="dashed", lw=0.9, label="chance")
        ax.set_xticks(range(len(order)), order, fontsize=7)
        ax.set(title=subtask, xlabel="window of stream positions", ylabel="token accuracy", ylim=(-0.02, 1.02))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle("Token accuracy per window of positions — dots: each seed; bars: mean over seeds with its 95 % "
                 "t-interval; dashed: chance", fontsize=8)
    fig.tight_layout(rect=(0, 0.06 + 0.02 * (len(labels) // 5), 1, 1))
    fig.legend(handles, labels, loc="lower center", ncols=min(5, len(labels)), fontsize=7, frameon=False)
    return fig


SCHEDULES = ("joint", "dat", "stopgrad-rnn")
"""Schedule suffixes of the recurrent grid's hybrid variants (``hybrid-CELL-SCHEDULE``); a variant without the
``hybrid-`` prefix is the cell alone."""


def cell_and_schedule(variant: str) -> tuple[str, str]:
    """``hybrid-ssm-complex-dat`` -> (``ssm-complex``, ``dat``); ``gru`` -> (``gru``, ``alone``)."""
    if not variant.startswith("hybrid-"):
        return variant, "alone"
    rest = variant.removeprefix("hybrid-")
    for s in sorted(SCHEDULES, key=len, reverse=True):
        if rest.endswith(f"-{s}"):
            return rest.removesuffix(f"-{s}"), s
    return rest, "other"


def plot_by_cell(curves: pd.DataFrame, bands: pd.DataFrame,
                 subtasks: Sequence[tuple[str, str]] = (("state", "state (mod 10)"),
                                                        ("state_mod2", "parity of the state (mod 2)"))) -> Figure:
    """The recurrent grid's figure: one column per cell, one row per subtask of ``subtasks`` that the curves
    have; in each panel one colour per schedule (the cell alone, the hybrid joint, with DAT, ...): the mean over
    seeds (thick), its 95 % t-interval (band) and each seed (thin). Lengths on a log axis (the grid reaches 16x);
    the training lengths shaded; the accuracy of guessing (1/q for mod q) dotted."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    rows = [(s, title) for s, title in subtasks if curves[curves.subtask == s].token_acc.notna().any()]
    if not rows:
        raise ValueError("no curves of the requested subtasks")
    cells = list(dict.fromkeys(cell_and_schedule(v)[0] for v in curves.variant))
    schedules = [s for s in ("alone", *SCHEDULES, "other")
                 if any(cell_and_schedule(v)[1] == s for v in curves.variant)]
    colors = dict(zip(schedules, sns.color_palette("colorblind", len(schedules)), strict=True))
    fig, axes = plt.subplots(len(rows), len(cells), figsize=(3.2 * len(cells), 2.8 * len(rows)), sharex=True,
                             sharey=True, squeeze=False)
    lt = int(curves.train_length.max())
    for i, (subtask, title) in enumerate(rows):
        q = 10 if subtask == "state" else int(subtask.removeprefix("state_mod"))
        for j, cell in enumerate(cells):
            ax = axes[i][j]
            for variant in dict.fromkeys(curves.variant):
                c, schedule = cell_and_schedule(variant)
                if c != cell:
                    continue
                _draw_variant(ax, curves, bands, variant, subtask, colors[schedule],
                              lambda n, s=schedule: f"{s} ({n})")
            ax.axvspan(1, lt, color="0.85", alpha=0.5, lw=0)
            ax.axhline(1 / q, color="0.4", lw=0.8, ls=":")
            ax.set_xscale("log")
            ax.set_xlim(max(1.0, lt / 5), float(curves.length.max()) * 1.05)
            ax.set(ylim=(-0.02, 1.02), xlabel="stream length L" if i == len(rows) - 1 else None,
                   ylabel=title if j == 0 else None, title=cell if i == 0 else None)
            if i == 0:
                ax.legend(fontsize=6, loc="lower left", title="schedule (seeds)", title_fontsize=6)
    fig.suptitle(f"State accuracy vs length by recurrent cell — thick: mean over seeds; band: 95 % t-interval; "
                 f"thin: each seed; shaded: training lengths 1–{lt}; dotted: chance", fontsize=8)
    fig.tight_layout()
    return fig
