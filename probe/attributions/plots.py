"""Figures of the attributions: occlusion by distance and path, attention reads by distance, sublayer effects."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PREFIX_X = -3
"""Where the dictionary prefix is drawn, left of distance 0 and apart from it (it has no distance)."""


def _sns():
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return sns


def _label(rows: pd.DataFrame, checkpoint: str) -> str:
    """``folder/file`` of the checkpoint (never the absolute path; a factory's ``module:factory`` as given) and its
    step."""
    path = Path(str(checkpoint))
    step = f" step {int(rows.step.iloc[0])}" if len(rows) and "step" in rows.columns else ""
    return f"{path.parent.name}/{path.name}{step}" if path.parent.name else f"{path.name}{step}"


def _grid(df: pd.DataFrame, width: float = 5.2, height: float = 3.4):
    import matplotlib.pyplot as plt

    ckpts = list(dict.fromkeys(df.checkpoint))
    lengths = sorted(df.length.unique())
    fig, axes = plt.subplots(len(ckpts), len(lengths), figsize=(width * len(lengths), height * len(ckpts)),
                             squeeze=False)
    return fig, axes, ckpts, lengths


def plot_occlusion(profile: pd.DataFrame) -> Figure:
    """State answers: fraction that follow a resampled number to its recomputed label, by distance back, for the
    input as it is (total) and with attention (recurrent only) or the recurrent modules (attention only) held at
    their clean outputs; band: 95 % interval over sequences. Left of 0: a resampled dictionary token (flip rate)."""
    _sns()
    df = profile.reset_index(drop=True)
    fig, axes, ckpts, lengths = _grid(df)
    colors = {"total": "0.2", "recurrent_only": "C0", "attention_only": "C3"}
    for i, ck in enumerate(ckpts):
        for j, length in enumerate(lengths):
            ax = axes[i, j]
            sub = df[(df.checkpoint == ck) & (df.length == length)]
            for cond, color in colors.items():
                num = sub[(sub.kind == "number") & (sub.condition == cond)].sort_values("distance")
                ax.plot(num.distance, num.follow, color=color, label=cond.replace("_", " "))
                ax.fill_between(num.distance, num.follow_ci_low, num.follow_ci_high, color=color, alpha=0.2, lw=0)
                pre = sub[(sub.kind == "prefix") & (sub.condition == cond)]
                if len(pre):
                    ax.plot([PREFIX_X], pre.flip, marker="s", color=color, ls="none")
            ax.axvline(-1.5, color="0.6", lw=0.8)
            ax.set_xlim(PREFIX_X - 1.5, None)
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("distance t - s of the resampled number (square: prefix, flip rate)")
            ax.set_ylabel("answers following the change")
            ax.set_title(f"{_label(sub, ck)}, length {length}", fontsize=10)
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    fig.suptitle("Occlusion: does the state answer follow a resampled number, and along which path?")
    fig.tight_layout()
    return fig


def plot_reads(profile: pd.DataFrame) -> Figure:
    """Value-weighted attention of the state answers by distance back to the key, one line per block; square
    left of 0: the mass on the dictionary prefix."""
    _sns()
    df = profile.reset_index(drop=True)
    fig, axes, ckpts, lengths = _grid(df)
    for i, ck in enumerate(ckpts):
        for j, length in enumerate(lengths):
            ax = axes[i, j]
            sub = df[(df.checkpoint == ck) & (df.length == length)]
            for block, b in sub.groupby("block"):
                stream = b[~b.in_prefix].sort_values("distance")
                line = ax.plot(stream.distance, stream.mass, label=f"block {block} attention")[0]
                ax.plot([PREFIX_X], b[b.in_prefix].mass, marker="s", color=line.get_color(), ls="none")
            ax.axvline(-1.5, color="0.6", lw=0.8)
            ax.set_xlim(PREFIX_X - 1.5, None)
            ax.set_xlabel("distance t - s of the key (square: prefix)")
            ax.set_ylabel("share of value-weighted attention")
            ax.set_title(f"{_label(sub, ck)}, length {length}", fontsize=10)
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    fig.suptitle("Where attention reads from (state answers)")
    fig.tight_layout()
    return fig


def plot_components(table: pd.DataFrame) -> Figure:
    """Drop of the correct answer's logit when one sublayer's output is zeroed, per subtask; rows = checkpoints,
    columns = lengths. A sublayer is named by its module (``blocks.0.lstm``, or the name given to ``probe.wrap``),
    and by its kind where the name does not say it (``mha (attn)``, ``blocks.0.lstm (gru)``)."""
    sns = _sns()
    df = table.reset_index(drop=True)
    df["sublayer"] = [m if m.rsplit(".", 1)[-1] == c else f"{m} ({c})"
                      for m, c in zip(df.module, df.component, strict=True)]
    fig, axes, ckpts, lengths = _grid(df, 5.5, 3.8)
    for i, ck in enumerate(ckpts):
        for j, length in enumerate(lengths):
            ax = axes[i, j]
            sub = df[(df.checkpoint == ck) & (df.length == length)]
            sns.barplot(data=sub, x="sublayer", y="effect", hue="subtask", ax=ax, errorbar=None)
            ax.axhline(0.0, color="0.3", lw=0.8)
            ax.set_ylabel("logit drop when zeroed")
            ax.set_xlabel("")
            ax.set_title(f"{_label(sub, ck)}, length {length}", fontsize=10)
            ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig
