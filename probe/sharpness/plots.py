"""Mass on the queried key vs length beside its dilution reference, and recall accuracy vs length."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from probe.sharpness.measure import recall_head

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_mass(mass: pd.DataFrame, accuracy: pd.DataFrame) -> Figure:
    """Left: each checkpoint's recall head (largest mass at L_train), its mass vs length with the interval, per scale
    (solid), and the reference e^Δ / (e^Δ + n − 1) (dashed); every other head thin. Right: recall accuracy."""
    import matplotlib.pyplot as plt

    fig, (ax_m, ax_a) = plt.subplots(1, 2, figsize=(10, 3.8))
    if mass.empty:
        for ax in (ax_m, ax_a):
            ax.text(0.5, 0.5, "not applicable (no attention or no recall queries)", ha="center", va="center",
                    transform=ax.transAxes)
        return fig
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = {"none": "-", "log-length": "-."}
    for i, (name, part) in enumerate(mass.groupby("checkpoint", sort=False)):
        color = colors[i % len(colors)]
        label = str(part.label.iloc[0])
        head = recall_head(part, int(part.train_length.iloc[0]))
        for key, g in part.groupby(["layer", "head", "target", "scale"]):
            g = g.sort_values("length")
            if head is not None and key[:3] == head:
                ax_m.plot(g.length, g.mass, styles.get(key[3], "-"), color=color, marker="o",
                          label=f"{label} L{key[0]}H{key[1]} {key[2]} ({key[3]})")
                ax_m.fill_between(g.length, g.ci_low, g.ci_high, color=color, alpha=0.2, lw=0)
                if key[3] == "none":
                    ax_m.plot(g.length, g.reference, ":", color=color, label=f"{label}: e^Δ/(e^Δ+n−1)")
            elif key[3] == "none":
                ax_m.plot(g.length, g.mass, color=color, alpha=0.15, lw=0.8)
        acc = accuracy[(accuracy.checkpoint == name) & (accuracy.subtask == "recall")]
        for scale, g in acc.groupby("scale"):
            g = g.sort_values("length")
            ax_a.plot(g.length, g.token_acc, styles.get(scale, "-"), color=color, marker="o",
                      label=f"{label} ({scale})")
    uni = mass.groupby("length").uniform_mass.mean()
    ax_m.plot(uni.index, uni.values, "k--", lw=1, label="uniform (mean 1/n)")
    ax_m.set(ylabel="attention mass on the target", title="recall head's mass (band: 95% CI over sequences)")
    ax_a.set(ylabel="recall token accuracy", title="recall accuracy")
    lengths = sorted(int(x) for x in mass.length.unique())
    for ax in (ax_m, ax_a):
        # log-spaced lengths (1x..16x) read best on a log axis labelled with the lengths themselves
        ax.set(xscale="log", xlabel="stream length L", ylim=(-0.02, 1.02))
        ax.set_xticks(lengths, [str(x) for x in lengths])
        ax.minorticks_off()
    ax_m.legend(fontsize=6)
    ax_a.legend(fontsize=6)
    fig.tight_layout()
    return fig
