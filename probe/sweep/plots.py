"""The sweep's figure: token accuracy vs length, one band per variant, every seed as a thin line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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
            color = colors[variant]
            part = curves[(curves.variant == variant) & (curves.subtask == subtask)]
            for _, seed_curve in part.groupby("seed"):
                ax.plot(seed_curve.length, seed_curve.token_acc, color=color, lw=0.6, alpha=0.45)
            band = bands[(bands.variant == variant) & (bands.subtask == subtask)]
            ax.fill_between(band.length, band.ci_low, band.ci_high, color=color, alpha=0.2, lw=0)
            ax.plot(band.length, band["mean"], color=color, lw=1.8,
                    label=f"{variant} ({part.seed.nunique()} seeds)")
        lt = int(curves.train_length.max())
        ax.axvspan(1, lt, color="0.85", alpha=0.5, lw=0, label=f"training lengths (1–{lt})")
        ax.set(title=f"{subtask} subtask", xlabel="stream length L (tokens)", ylabel="token accuracy",
               ylim=(-0.02, 1.02))
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("Token accuracy vs length — thick: mean over seeds; band: 95 % t-interval of the mean; "
                 "thin: each seed", fontsize=8)
    fig.tight_layout()
    return fig
