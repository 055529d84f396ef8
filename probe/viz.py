"""Small plots of single activations for notebooks: readable token labels, an attention pattern, an LSTM state trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from probe.tasks import TaskConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def token_labels(task: TaskConfig, tokens: Tensor) -> list[str]:
    """Human-readable names of one sequence's tokens: ``3`` (number), ``k5`` (key), ``v2`` (value), ``|`` (SEP)."""
    out = []
    for tok in tokens.tolist():
        if tok < task.key_offset:
            out.append(str(tok))
        elif tok < task.value_offset:
            out.append(f"k{tok - task.key_offset}")
        elif tok < task.sep:
            out.append(f"v{tok - task.value_offset}")
        else:
            out.append("|")
    return out


def plot_attention_pattern(pattern: Tensor, labels: list[str], title: str = "") -> Figure:
    """Heatmap of one head's pattern ``(query_pos, key_pos)`` with token names on both axes."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    size = max(4.0, 0.18 * len(labels))
    fig, ax = plt.subplots(figsize=(size + 1, size))
    sns.heatmap(pattern.detach().cpu().numpy(), cmap="viridis", vmin=0, vmax=1, square=True, ax=ax,
                xticklabels=labels, yticklabels=labels, cbar_kws={"label": "attention weight"})
    ax.set(xlabel="key position (token)", ylabel="query position (token)", title=title)
    ax.tick_params(labelsize=6)
    fig.tight_layout()
    return fig


def plot_state_trace(state: Tensor, sums: Tensor, labels: list[str], n_units: int = 6, title: str = "") -> Figure:
    """A few units of an LSTM state ``(pos, d)`` over positions, above the running sum they should track."""
    import matplotlib.pyplot as plt

    stream = sums >= 0
    units = state[stream].var(dim=0).argsort(descending=True)[:n_units]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    positions = torch.arange(len(labels))
    for u in units.tolist():
        top.plot(positions, state[:, u].detach().cpu(), lw=1, label=f"unit {u}")
    top.set(ylabel="activation", title=title)
    top.legend(fontsize=7, ncol=3)
    bottom.step(positions[stream], sums[stream], where="mid", color="k")
    bottom.set(ylabel="s_t mod m", xlabel="position (token)")
    bottom.set_xticks(positions, labels, fontsize=6)
    fig.tight_layout()
    return fig
