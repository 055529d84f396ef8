"""Figures of probe results: accuracy beyond the training range, by position, and the interventions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from probe.probes.analysis import ProbeResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def short_name(name: str) -> str:
    """``runs/hybrid-dat/seed0/final.pt`` -> ``hybrid-dat/seed0``; ``checkpoints/lstm.pt`` -> ``lstm``."""
    p = Path(name)
    if p.name in ("final.pt", "last.pt"):
        return (f"{p.parent.parent.name}/{p.parent.name}" if p.parent.name.startswith("seed") else p.parent.name) \
            or p.stem
    return p.stem


def _label(hook: str) -> str:
    """Joined hooks are long: ``blocks.0.lstm.hook_h+blocks.1.lstm.hook_h`` -> ``[0,1].lstm.hook_h``."""
    ps = hook.split("+")
    if len(ps) == 1:
        return hook
    blocks = sorted({p.split(".")[1] for p in ps})
    kinds = sorted({p.split(".")[-1] for p in ps})
    return f"[{','.join(blocks)}].lstm.{'+'.join(kinds)}"


def plot_heatmap(results: Sequence[ProbeResult]) -> Figure:
    """Probe accuracy at beyond-range positions (t > L_train), hook x test length, one panel per checkpoint; cells:
    in-range-trained accuracy, with the beyond-trained accuracy and the control target's below."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="white")
    height = 0.5 * max(len(r.hooks) for r in results) + 2
    fig, axes = plt.subplots(1, len(results), figsize=(max(7.0, 4.8 * len(results) + 1), height), squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        df = res.by_length[res.by_length.test_positions == "beyond"]

        def grid(band: str, col: str, df=df, res=res):
            d = df[df.train_positions == band]
            return d.pivot(index="hook", columns="length", values=col).reindex(res.hooks)

        acc, far, ctrl = grid("in", "probe_acc"), grid("beyond", "probe_acc"), grid("beyond", "control_acc")
        annot = acc.map("{:.2f}".format) + "\n" + far.map("{:.2f}".format) + " c" + ctrl.map("{:.2f}".format)
        acc.index = [_label(h) for h in acc.index]
        sns.heatmap(acc, vmin=0, vmax=1, cmap="viridis", annot=annot, fmt="", ax=ax, cbar=ax is axes[0][-1],
                    annot_kws={"fontsize": 6})
        ax.set_title(short_name(res.checkpoint))
        ax.set_xlabel(f"test length (positions t > {res.train_length} only)")
        ax.set_ylabel("hook")
    fig.suptitle("probe accuracy for $s_t$ beyond the training range: trained in range (colour, top); "
                 "below: trained beyond, c = control target")
    fig.tight_layout()
    return fig


def plot_position(results: Sequence[ProbeResult], hooks: Sequence[str] | None = None) -> Figure:
    """Accuracy vs stream position on the longest test length, training range shaded; per checkpoint the best hook
    (over all positions) and the best recurrent-state hook (beyond L_train), trained in range (solid) and beyond it
    (dashed), with the control target (dotted)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False, sharey=True)
    for ax, res in zip(axes[0], results, strict=True):
        df = res.by_position[res.by_position.length == res.by_position.length.max()]
        df = df.assign(position=(df.position_lo + df.position_hi) / 2)
        # the hook that decodes s_t best over all positions (the Transformer's exists in range only), and the best
        # recurrent-state hook beyond the training range
        shown = list(hooks) if hooks else list(dict.fromkeys(
            h for h in (res.best_hook(test_positions="all"), res.best_hook(".lstm.hook_")) if h))
        for k, hook in enumerate(shown):
            for band, style in (("in", "-"), ("beyond", "--")):
                d = df[(df.hook == hook) & (df.train_positions == band)]
                ax.plot(d.position, d.probe_acc, style, marker="o", ms=3, color=f"C{k}",
                        label=f"{_label(hook)} (trained {band})")
            d = df[(df.hook == hook) & (df.train_positions == "beyond")]
            ax.plot(d.position, d.control_acc, ":", color=f"C{k}", lw=1, label=f"control target, {_label(hook)}")
        d = df[(df.hook == shown[0]) & (df.train_positions == "in")] if shown else df.iloc[:0]
        ax.plot(d.position, d.majority_acc, color="grey", lw=1, label="majority class")
        ax.axvspan(0.5, res.train_length + 0.5, color="tab:green", alpha=0.1, label="training range")
        ax.set_title(short_name(res.checkpoint))
        ax.set_xlabel("stream position t")
        ax.set_ylabel("probe accuracy for $s_t$")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    return fig


def plot_compare(results: Sequence[ProbeResult]) -> Figure:
    """Checkpoints on one figure, beyond-range positions only: the best recurrent-state probe (trained in range /
    beyond, control target) vs length, and the interventions on every recurrent block at once (whole state, probe
    subspace: answers that follow the source; same-sum source: answers that change)."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.lines import Line2D

    sns.set_theme(style="whitegrid")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k, res in enumerate(results):
        color, label = f"C{k}", short_name(res.checkpoint)
        hook = res.best_hook(".lstm.hook_") or res.best_hook(test_positions="all")
        df = res.by_length[(res.by_length.hook == hook) & (res.by_length.test_positions == "beyond")]
        d_in, d_far = df[df.train_positions == "in"], df[df.train_positions == "beyond"]
        ax.plot(d_in.length, d_in.probe_acc, "o-", color=color, label=f"{label}: {_label(hook)}")
        ax.plot(d_far.length, d_far.probe_acc, "s--", color=color, lw=1)
        ax.plot(d_far.length, d_far.control_acc, ":", color=color, lw=1)
        iv = res.interventions
        if iv.empty:
            continue
        iv = iv[(iv.block == iv.block.min()) & (iv.test_positions == "beyond")]
        for kind, col, style in (("full", "iia", "o-"), ("subspace", "iia", "s--"), ("same_sum", "changed_frac", "x:")):
            d = iv[iv.kind == kind]
            bx.plot(d.length, d[col], style, color=color, label=f"{label}: {kind}" if kind == "full" else None)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="grey", marker="o", label="probe trained t <= L_train"),
                Line2D([], [], color="grey", ls="--", marker="s", lw=1, label="probe trained t > L_train"),
                Line2D([], [], color="grey", ls=":", lw=1, label="control target (trained beyond)")]
    ax.legend(handles=handles, fontsize=7, loc="lower left")
    ax.set(xlabel="test length (positions t > L_train only)", ylabel="probe accuracy for $s_t$", ylim=(0, 1.02),
           title="best recurrent-state probe beyond the training range")
    handles, _ = bx.get_legend_handles_labels()
    handles += [Line2D([], [], color="grey", marker="o", label="whole state: follows source"),
                Line2D([], [], color="grey", ls="--", marker="s", label="probe subspace: follows source"),
                Line2D([], [], color="grey", ls=":", marker="x", label="same-sum source: answers changed")]
    bx.set(xlabel="test length (answers at t > L_train only)", ylabel="fraction of later answers", ylim=(-0.02, 1.02),
           title="interventions on every recurrent block's state")
    if bx.lines:
        bx.legend(handles=handles, fontsize=7, loc="center right")
    else:
        bx.text(0.5, 0.5, "no recurrent state to patch", ha="center", transform=bx.transAxes)
    fig.tight_layout()
    return fig
