"""Figures of the gradient analysis: interference and lookahead over training, per-block bars."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _sns():
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return sns


def _switch_lines(ax, rows: pd.DataFrame) -> None:
    """Dashed: where a schedule switches attention on."""
    for _, s in rows.groupby("schedule"):
        on = s[s.gate > 0].step
        if len(on) and (s.gate == 0).any():
            ax.axvline(on.min(), color="0.5", ls="--", lw=0.8)


def plot_over_training(table: pd.DataFrame, block: str | int = "all") -> Figure:
    """Interference over training: ``|g_att|/|g|``, ``cos(g_att, g_rec^state)`` and ``cos(g_att^recall,
    g_rec^state)`` against the step, one line per schedule (the band is the spread over seeds when there are
    several), one column per length; dashed: where a schedule switches attention on."""
    import matplotlib.pyplot as plt

    sns = _sns()
    df = table[table.block.astype(str) == str(block)].reset_index(drop=True)
    lengths = sorted(df.length.unique())
    metrics = [("att_ratio", "|g_att| / |g|"), ("cos_att_rec_state", "cos(g_att, g_rec^state)"),
               ("cos_att_recall_rec_state", "cos(g_att^recall, g_rec^state)")]
    fig, axes = plt.subplots(len(metrics), len(lengths), figsize=(max(7.0, 5.5 * len(lengths)), 9), squeeze=False,
                             sharex=True)
    order = sorted(df.schedule.unique())
    for j, length in enumerate(lengths):
        sub = df[df.length == length]
        for i, (col, label) in enumerate(metrics):
            ax = axes[i, j]
            sns.lineplot(data=sub, x="step", y=col, hue="schedule", hue_order=order, marker="o", errorbar="sd",
                         ax=ax, legend=(i == 0 and j == 0))
            if col.startswith("cos"):
                ax.axhline(0.0, color="0.3", lw=0.8)
                ax.set_ylim(-1.05, 1.05)
            _switch_lines(ax, sub)
            ax.set_xlabel("training step")
            ax.set_ylabel(label)
            if i == 0:
                ax.set_title(f"length {length}")
    seeds = df.groupby("schedule")["seed"].nunique().to_dict()
    fig.suptitle(f"Recurrent-weight gradient through attention (block {block}; seeds per schedule: "
                 + ", ".join(f"{k} {v}" for k, v in seeds.items()) + ")")
    fig.tight_layout()
    return fig


def plot_lookahead(table: pd.DataFrame) -> Figure:
    """The lookahead over training as z = first-order change of the loss / its standard error, after a small step
    along -g_att, -g_rec and -g (lines), against the training step; one row per run, one column per target
    (training loss, state loss at each evaluation length). The band is |z| < 2 (no detectable change). z above 2 in
    the 3x column with z below -2 for the training loss is what the interference hypothesis predicts for g_att. z,
    not the change itself, because the step size follows |g| and so differs between checkpoints."""
    import matplotlib.pyplot as plt

    if "positions" in table.columns:
        return _plot_beyond(table)
    _sns()
    df = table.reset_index(drop=True)
    df = df.assign(target=[("training loss (lengths 1..L_train)" if loss == "train" else f"state loss, L {int(n)}")
                           for loss, n in zip(df["loss"], df["length"], strict=True)],
                   z=df.z.where(df.dL_first != 0, 0.0))  # a part that is exactly 0 (gate 0) changes nothing
    targets = list(dict.fromkeys(df.sort_values(["loss", "length"], ascending=[False, True]).target))
    runs = list(dict.fromkeys(df.run))
    fig, axes = plt.subplots(len(runs), len(targets), figsize=(5.0 * len(targets), 3.4 * len(runs)), squeeze=False,
                             sharey=True)
    colors = {"att": "C3", "rec": "C0", "full": "0.3"}
    for i, run in enumerate(runs):
        for j, target in enumerate(targets):
            ax = axes[i, j]
            sub = df[(df.run == run) & (df.target == target)]
            ax.axhspan(-2, 2, color="0.85", lw=0)
            for part, color in colors.items():
                p = sub[sub.part == part].sort_values("step")
                ax.plot(p.step, p.z, color=color, marker="o", ms=3, lw=1.2,
                        label=f"step along -g_{part}" if part != "full" else "step along -g")
            ax.axhline(0.0, color="0.3", lw=0.8)
            ax.set_yscale("symlog", linthresh=2.0)  # z spans -70..+10 over training; |z| < 2 stays linear
            _switch_lines(ax, sub)
            pre = "AdamW-preconditioned" if sub.preconditioned.any() else "raw gradient"
            ax.set_title(f"{'/'.join(str(run).split('/')[-2:])}: {target}\n({pre})", fontsize=9)
            ax.set_xlabel("training step")
            ax.set_ylabel("z = first-order change / SE")
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    fig.suptitle("Lookahead: the sign of each loss's change after a small step along each gradient part "
                 "(grey band: |z| < 2)")
    fig.tight_layout()
    return fig


def _plot_beyond(table: pd.DataFrame, scale: float = 1.0) -> Figure:
    """The beyond-range lookahead over training: z of each direction's effect per unit of step length at
    ``step_scale`` ``scale`` (1: a real update), one row per run, one column per target (training loss, state loss
    beyond L, beyond 2L); dotted: the random directions."""
    import matplotlib.pyplot as plt

    _sns()
    df = table[table.step_scale == scale].reset_index(drop=True)
    df = df.assign(z=df.z.where(df.direction_norm != 0, 0.0))  # a part that is exactly 0 (gate 0) changes nothing
    targets = [p for p in ("<=L", ">L", ">2L") if p in set(df.positions)]
    runs = list(dict.fromkeys(df.run))
    fig, axes = plt.subplots(len(runs), len(targets), figsize=(5.0 * len(targets), 3.4 * len(runs)), squeeze=False,
                             sharey=True)
    styles = {"att": ("C3", "-"), "rec": ("C0", "-"), "full": ("0.3", "-"), "random": ("0.5", ":")}
    for i, run in enumerate(runs):
        for j, positions in enumerate(targets):
            ax = axes[i, j]
            sub = df[(df.run == run) & (df.positions == positions)]
            ax.axhspan(-2, 2, color="0.85", lw=0)
            for part, (color, ls) in styles.items():
                p = sub[sub.part == part].sort_values("step")
                ax.plot(p.step, p.z, color=color, ls=ls, marker="o", ms=3, lw=1.2,
                        label="random directions" if part == "random" else
                        f"step along -g_{part}" if part != "full" else "step along -g")
            ax.axhline(0.0, color="0.3", lw=0.8)
            ax.set_yscale("symlog", linthresh=2.0)
            _switch_lines(ax, sub)
            name = "training loss" if positions == "<=L" else f"state loss, t {positions}"
            ax.set_title(f"{'/'.join(str(run).split('/')[-2:])}: {name}", fontsize=9)
            ax.set_xlabel("training step")
            ax.set_ylabel("z = effect per unit step / SE")
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    fig.suptitle(f"Lookahead: each loss's change after a step of {scale:g} x the optimizer's update along each "
                 "direction (grey band: |z| < 2)")
    fig.tight_layout()
    return fig


def plot_blocks(table: pd.DataFrame) -> Figure:
    """Per-block bars: ``|g_att|/|g|`` and the two cosines, hue = length; one row per run (its last checkpoint)."""
    import matplotlib.pyplot as plt

    sns = _sns()
    last = table.loc[table.groupby("run").step.transform("max") == table.step]
    ckpts = list(dict.fromkeys(last.checkpoint))
    metrics = [("att_ratio", "|g_att| / |g|"), ("cos_att_rec", "cos(g_att, g_rec)"),
               ("cos_att_rec_state", "cos(g_att, g_rec^state)")]
    fig, axes = plt.subplots(len(ckpts), len(metrics), figsize=(15, 3.8 * len(ckpts)), squeeze=False)
    for i, ck in enumerate(ckpts):
        df = last[last.checkpoint == ck].reset_index(drop=True)
        df = df.assign(block=df.block.astype(str), length=df.length.astype(str))
        for ax, (col, label) in zip(axes[i], metrics, strict=True):
            sns.barplot(data=df, x="block", y=col, hue="length", ax=ax, errorbar=None)
            ax.set_ylabel(label)
            ax.set_xlabel("block")
            if col.startswith("cos"):
                ax.axhline(0.0, color="0.3", lw=0.8)
                ax.set_ylim(-1, 1)
            else:
                ax.set_ylim(0, 1)
        run = "/".join(str(df.run.iloc[0]).split("/")[-2:])
        axes[i, 0].set_title(f"{run} ({Path(ck).name}, step {int(df.step.iloc[0])}, gate {df.gate.iloc[0]:g})",
                             loc="left")
    fig.tight_layout()
    return fig
