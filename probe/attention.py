"""Attention diagnostics from cached patterns: position vs content share per head, recall mass, entropy vs length."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from probe.core.seeds import ATTENTION
from probe.errors import ProbeError
from probe.models import HookedSequenceModel
from probe.tasks import Batch, TaskConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ATTENTION_SEED_BASE = ATTENTION
"""Batches for attention diagnostics come from seeds away from training and evaluation seeds."""


def _is_pattern(name: str) -> bool:
    return name.endswith("attn.hook_pattern")


@torch.no_grad()
def attention_patterns(model: HookedSequenceModel, tokens: Int[Tensor, "batch pos"]
                       ) -> dict[int, Float[Tensor, "batch head query key"]]:
    """The attention pattern of every attention block, keyed by block index (one cached forward)."""
    _, cache = model.run_with_cache(tokens, names_filter=_is_pattern)
    return {int(name.split(".")[1]): cache[name] for name in cache.keys()}


# --- where a recall query should look -------------------------------------------------------------------------
def recall_targets(task: TaskConfig, batch: Batch) -> tuple[Bool[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """For every recall query, the prefix position of its key (its value sits at key + 1).

    Returns ``(mask, key_pos)``: mask is True at recall queries whose key occurs in the dictionary prefix. The key
    of a query is its own token (``recall``, ``interleaved``) or, for ``coupled``, the running sum ``s_t`` (the
    dictionary binds residues to values). Tasks without a dictionary give an all-False mask.
    """
    p = batch.prefix_len
    if p < 3:
        return torch.zeros_like(batch.masks["recall"]), torch.zeros_like(batch.tokens)
    key_token = batch.sums if task.name == "coupled" else batch.tokens
    prefix_keys = batch.tokens[:, 0 : p - 1 : 2]  # pairs (key, value) then SEP
    match = prefix_keys[:, None, :] == key_token[:, :, None]  # batch pos pair
    mask = batch.masks["recall"] & match.any(-1)
    key_pos = 2 * match.to(torch.int8).argmax(-1)
    return mask, key_pos


def _mass_at(pattern: Float[Tensor, "batch head query key"], pos: Int[Tensor, "batch pos"]) -> Tensor:
    idx = pos.clamp(max=pattern.shape[-1] - 1)[:, None, :, None].expand(-1, pattern.shape[1], -1, 1)
    return pattern.gather(-1, idx)[..., 0]  # batch head query


# --- per-head statistics ------------------------------------------------------------------------------------
def position_content_shares(pattern: Float[Tensor, "batch head query key"], first_query: int = 0
                            ) -> dict[str, Tensor]:
    """Per head, the share of the pattern's variance explained by position alone vs by content.

    Over the causal entries ``(b, q, k)`` with ``q >= first_query``: ``pos_share`` is the R^2 of the batch-mean
    pattern ``P̄[q, k]`` (every effect of absolute and relative position; ``1 - pos_share`` is what only the tokens
    explain, since the model is deterministic), ``rel_share`` the R^2 of the relative-position profile ``r[q - k]``
    (mean pattern as a function of the offset alone). ``rel_share <= pos_share`` because ``P̄`` is the best fit of
    any function of ``(q, k)``. NaN where the pattern does not vary (a single key).
    """
    b, h, t, _ = pattern.shape
    q = torch.arange(t, device=pattern.device)[:, None]
    k = torch.arange(t, device=pattern.device)[None, :]
    valid = (k <= q) & (q >= first_query)
    entries = pattern[:, :, valid].double()  # batch head n
    offset = (q - k).expand(t, t)[valid]
    total = ((entries - entries.mean(dim=(0, 2), keepdim=True)) ** 2).sum(dim=(0, 2))
    resid_pos = ((entries - entries.mean(dim=0, keepdim=True)) ** 2).sum(dim=(0, 2))
    sums = torch.zeros(h, t, dtype=entries.dtype, device=pattern.device).index_add_(1, offset, entries.sum(0))
    counts = torch.bincount(offset, minlength=t).to(entries.dtype) * b
    profile = sums / counts.clamp(min=1)
    resid_rel = ((entries - profile[:, offset][None]) ** 2).sum(dim=(0, 2))
    ok = total > 1e-12
    nan = torch.full_like(total, math.nan)
    pos_share = torch.where(ok, 1 - resid_pos / total, nan)
    return {"pos_share": pos_share, "rel_share": torch.where(ok, 1 - resid_rel / total, nan),
            "content_share": 1 - pos_share}


def _entropy_stats(pattern: Tensor, first_query: int) -> dict[str, Tensor]:
    """Per head, over stream query rows: mean entropy (nats), the uniform maximum log(q+1), their ratio, and the
    mean distance ``sum_k p(k) (q - k)`` in tokens beside the uniform pattern's ``q / 2``."""
    t = pattern.shape[-1]
    rows = pattern[:, :, first_query:]  # batch head query key
    ent = -(rows * rows.clamp(min=1e-30).log()).sum(-1)
    q = torch.arange(first_query, t, device=pattern.device, dtype=pattern.dtype)
    uniform = (q + 1).log()
    ratio = (ent / uniform.clamp(min=1e-12))[:, :, uniform > 0]
    distance = (rows * (q[:, None] - torch.arange(t, device=pattern.device)).clamp(min=0)).sum(-1)
    h = pattern.shape[1]
    return {"entropy": ent.mean(dim=(0, 2)), "uniform_entropy": uniform.mean().expand(h),
            "norm_entropy": ratio.mean(dim=(0, 2)) if ratio.numel() else torch.full_like(ent[0, :, 0], math.nan),
            "mean_distance": distance.mean(dim=(0, 2)), "uniform_distance": (q / 2).mean().expand(h)}


def _recall_stats(pattern: Tensor, mask: Tensor, key_pos: Tensor) -> dict[str, Tensor]:
    """Mean attention mass of recall queries on their key's value position and on the key, and the mass a
    uniform pattern would put on one position (the chance level)."""
    h, t = pattern.shape[1], pattern.shape[-1]
    n = int(mask.sum())
    if n == 0:
        nan = torch.full((h,), math.nan, device=pattern.device)
        return {"recall_value_mass": nan, "recall_key_mass": nan, "recall_uniform_mass": nan, "n_recall": 0}
    m = mask[:, None, :].expand(-1, h, -1)
    value = (_mass_at(pattern, key_pos + 1) * m).sum((0, 2))
    key = (_mass_at(pattern, key_pos) * m).sum((0, 2))
    q = torch.arange(t, device=pattern.device).expand_as(mask)
    uniform = (1.0 / (q[mask] + 1).to(pattern.dtype)).mean()
    return {"recall_value_mass": value / n, "recall_key_mass": key / n,
            "recall_uniform_mass": uniform.expand(h), "n_recall": n}


def _sample(task: TaskConfig, length: int, batch_size: int, seed: int, device: torch.device) -> Batch:
    return task.sample(length, batch_size, ATTENTION_SEED_BASE + seed * 10_000 + length).to(device)


@torch.no_grad()
def head_diagnostics(model: HookedSequenceModel, task: TaskConfig, length: int | None = None,
                     batch_size: int = 256, seed: int = 0) -> pd.DataFrame:
    """One row per attention head at one length (default L_train): ``layer, head, gate, pos_share, rel_share,
    content_share, recall_value_mass, recall_key_mass, recall_uniform_mass, n_recall, entropy, uniform_entropy,
    norm_entropy, mean_distance, uniform_distance``. Statistics are over stream queries (the dictionary prefix
    only stores)."""
    if not model.cfg.has_attention:
        raise ProbeError(f"a {model.cfg.family} model has no attention heads to diagnose")
    device = next(model.parameters()).device
    batch = _sample(task, length or task.train_length, batch_size, seed, device)
    mask, key_pos = recall_targets(task, batch)
    gates = dict(zip([i for i, blk in enumerate(model.blocks) if hasattr(blk, "attn")], model.attention_gates(),
                     strict=True))
    rows: list[dict[str, Any]] = []
    for layer, pattern in attention_patterns(model, batch.tokens).items():
        stats = {**position_content_shares(pattern, batch.prefix_len), **_recall_stats(pattern, mask, key_pos),
                 **_entropy_stats(pattern, batch.prefix_len)}
        for head in range(pattern.shape[1]):
            rows.append({"layer": layer, "head": head, "gate": gates[layer],
                         **{k: (float(v[head]) if isinstance(v, Tensor) else v) for k, v in stats.items()}})
    return pd.DataFrame(rows)


@torch.no_grad()
def entropy_vs_length(model: HookedSequenceModel, task: TaskConfig, lengths: Sequence[int], batch_size: int = 64,
                      seed: int = 0) -> pd.DataFrame:
    """One row per (length, layer, head): ``length, layer, head, entropy, uniform_entropy, norm_entropy,
    mean_distance, uniform_distance, recall_value_mass, recall_uniform_mass``. Entropy rising towards the uniform
    maximum with length, and the value mass falling, is the softmax-dilution limit of attention at long lengths."""
    if not model.cfg.has_attention:
        raise ProbeError(f"a {model.cfg.family} model has no attention heads to diagnose")
    device = next(model.parameters()).device
    rows: list[dict[str, Any]] = []
    for length in lengths:
        batch = _sample(task, int(length), batch_size, seed, device)
        mask, key_pos = recall_targets(task, batch)
        for layer, pattern in attention_patterns(model, batch.tokens).items():
            stats = {**_entropy_stats(pattern, batch.prefix_len), **_recall_stats(pattern, mask, key_pos)}
            stats.pop("recall_key_mass")
            stats.pop("n_recall")
            for head in range(pattern.shape[1]):
                rows.append({"length": int(length), "layer": layer, "head": head,
                             **{k: float(v[head]) for k, v in stats.items()}})
    return pd.DataFrame(rows)


# --- controls -----------------------------------------------------------------------------------------------
def attention_controls(t: int = 24, batch_size: int = 64, seed: int = 0) -> list[dict[str, Any]]:
    """The position/content split on patterns whose answer is known.

    Positive: a previous-token head (``q -> q-1``) is pure relative position: ``pos_share = rel_share = 1``.
    Negative: a head that attends to the last "marker" token at or before the query (markers at random positions)
    is content: its ``pos_share`` is small (about 0.13 at marker rate 0.2).
    """
    g = torch.Generator().manual_seed(seed)
    prev = torch.zeros(batch_size, 1, t, t)
    prev[:, 0, 0, 0] = 1.0
    prev[:, 0, torch.arange(1, t), torch.arange(t - 1)] = 1.0
    marker = torch.rand(batch_size, t, generator=g) < 0.2
    marker[:, 0] = True
    last = torch.where(marker, torch.arange(t), 0).cummax(dim=1).values
    content = torch.zeros(batch_size, 1, t, t)
    content[torch.arange(batch_size)[:, None], 0, torch.arange(t)[None], last] = 1.0
    pos = position_content_shares(prev, first_query=1)
    con = position_content_shares(content, first_query=1)
    pos_share, rel_share, con_share = (float(pos["pos_share"][0]), float(pos["rel_share"][0]),
                                       float(con["pos_share"][0]))
    return [
        {"control": "attention_previous_token_pos_share", "value": min(pos_share, rel_share),
         "expected": "== 1 (pos and rel share)", "passed": abs(pos_share - 1) < 1e-9 and abs(rel_share - 1) < 1e-9},
        {"control": "attention_last_marker_pos_share", "value": con_share, "expected": "< 0.3",
         "passed": con_share < 0.3},
    ]


# --- plots --------------------------------------------------------------------------------------------------
def plot_entropy(entropy: pd.DataFrame) -> Figure:
    """Attention entropy vs length per layer (mean over heads; dashed: uniform maximum) and recall value mass vs
    length, one line per checkpoint. Takes the concatenated ``entropy_vs_length`` frames with a ``checkpoint``
    column."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    fig, (ax_e, ax_m) = plt.subplots(1, 2, figsize=(10, 3.6))
    if entropy.empty:
        for ax in (ax_e, ax_m):
            ax.text(0.5, 0.5, "no attention heads (N/A)", ha="center", va="center", transform=ax.transAxes)
        return fig
    data = entropy.assign(series=entropy.checkpoint.astype(str) + " L" + entropy.layer.astype(str))
    order = list(dict.fromkeys(data.series))
    palette = dict(zip(order, sns.color_palette(n_colors=len(order)), strict=True))
    sns.lineplot(data, x="length", y="entropy", hue="series", hue_order=order, palette=palette, errorbar=None,
                 marker="o", ax=ax_e)
    uni = entropy.groupby("length").uniform_entropy.mean()
    ax_e.plot(uni.index, uni.values, "k--", lw=1, label="uniform (log #keys)")
    ax_e.set(xlabel="stream length L", ylabel="attention entropy (nats, mean over heads)",
             title="attention entropy vs length")
    ax_e.legend(fontsize=6)
    mass = data.groupby(["series", "length"], as_index=False).recall_value_mass.max()
    if mass.recall_value_mass.notna().any():
        sns.lineplot(mass, x="length", y="recall_value_mass", hue="series", hue_order=order, palette=palette,
                     marker="o", ax=ax_m)
        chance = entropy.groupby("length").recall_uniform_mass.mean()
        ax_m.plot(chance.index, chance.values, "k--", lw=1, label="uniform attention")
        ax_m.legend(fontsize=6)
    else:
        ax_m.text(0.5, 0.5, "task has no recall queries", ha="center", va="center", transform=ax_m.transAxes)
    ax_m.set(xlabel="stream length L", ylabel="mass on the key's value (best head)",
             title="recall attention mass vs length", ylim=(-0.02, 1.02))
    fig.tight_layout()
    return fig


def plot_head_map(heads: pd.DataFrame) -> Figure:
    """Per head, position share vs content share and the recall value mass, one row of heatmaps per checkpoint
    (rows: layers, columns: heads). Takes the concatenated ``head_diagnostics`` frames with a ``checkpoint``
    column."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="white", context="paper")
    names = list(dict.fromkeys(heads.checkpoint)) if not heads.empty else []
    metrics = [("pos_share", "position share of variance"), ("rel_share", "relative-position share"),
               ("recall_value_mass", "recall mass on the key's value")]
    fig, axes = plt.subplots(max(1, len(names)), 3, figsize=(11, 1.2 + 1.6 * max(1, len(names))), squeeze=False)
    if not names:
        axes[0, 0].text(0.5, 0.5, "no attention heads (N/A)", ha="center", va="center")
    for row, name in zip(axes, names, strict=False):
        part = heads[heads.checkpoint == name]
        for ax, (col, title) in zip(row, metrics, strict=True):
            grid = part.pivot(index="layer", columns="head", values=col)
            sns.heatmap(grid, vmin=0, vmax=1, annot=True, fmt=".2f", cmap="viridis", cbar=False, ax=ax)
            if grid.isna().all().all():
                ax.text(0.5, 0.5, "N/A (task has no recall queries)", ha="center", va="center",
                        transform=ax.transAxes)
            ax.set(title=f"{name}\n{title}", xlabel="head", ylabel="layer")
    fig.tight_layout()
    return fig
