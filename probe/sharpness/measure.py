"""Attention mass on the queried key and its value vs length, the logit gap, the dilution reference, recall accuracy."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Int
from torch import Tensor

from probe.attention import recall_targets
from probe.core.inputs import check_inputs
from probe.core.progress import progress_iter
from probe.core.stats import bootstrap_ci
from probe.errors import ProbeError
from probe.memory import check_lengths, fit_batch_size
from probe.models.components import default_train_positions
from probe.tasks import Batch, TaskConfig
from probe.windows import accuracy_at_length, eval_seed
from probe.wrapped import WrappedModel

if TYPE_CHECKING:
    from probe.models import HookedSequenceModel

SCALES = ("none", "log-length")
"""What ``--scale`` may apply at evaluation time: no retraining is needed for either."""
TARGETS = ("key", "value")
"""Where a recall query may look: its key's position in the dictionary, or the value right after it (where a
recurrent layer below has already seen the key next to the value)."""
BATCH = 256
"""Sequences drawn at a time: ``probe.evaluate``'s default, so that the sequences are the ones it scores."""

HookList = Sequence[tuple[str | Callable[[str], bool], Callable[..., Any]]]


def not_applicable(cfg: Any, task: TaskConfig) -> str | None:
    """Why the diagnostic does not apply (one line), or None when it does."""
    if not cfg.has_attention:
        return f"not applicable: a {cfg.family} model has no attention, so no head can put mass on a key"
    if task.prefix_len < 3:
        return f"not applicable: task {task.name} has no dictionary, so no query has a key to look at"
    return None


def reference_mass(delta: float | Tensor | np.ndarray, n: float | Tensor | np.ndarray) -> Any:
    """Softmax dilution with a fixed gap: e^Δ / (e^Δ + n − 1), the mass on one key whose logit exceeds each of the
    other n − 1 by Δ (in a numerically safe form)."""
    if isinstance(delta, Tensor) or isinstance(n, Tensor):
        return torch.sigmoid(torch.as_tensor(delta) - torch.log(torch.as_tensor(n, dtype=torch.float64) - 1))
    with np.errstate(divide="ignore"):
        return 1.0 / (1.0 + np.exp(np.log(np.asarray(n, dtype=float) - 1) - np.asarray(delta, dtype=float)))


def attention_hooks(model: Any) -> dict[str, tuple[str, int]]:
    """Each attention layer's ``hook_attn_scores`` -> (its ``hook_pattern``, the layer number the rows give it): the
    hooks the diagnostic reads. probe's own: ``blocks.{i}.attn.*``, layer i. A wrapped or bridged model's:
    ``<name>.hook_attn_scores`` / ``hook_pattern`` of each named attention module (TransformerLens's bridge has them
    on ``blocks.{i}.attn``), layer i for a ``blocks.{i}.`` name, else its place among the attention names. An
    attention that exposes neither is one line naming it (Nemotron-H's, which the bridge maps by its input and
    output only; a user's ``nn.MultiheadAttention``)."""
    if not getattr(model, "attention_names", True) or not isinstance(model, WrappedModel) and not any(
            hasattr(b, "attn") for b in model.blocks):
        raise ProbeError("not applicable: this model has no attention, so no head can put mass on a key")
    if not isinstance(model, WrappedModel):
        return {f"blocks.{i}.attn.hook_attn_scores": (f"blocks.{i}.attn.hook_pattern", i)
                for i, b in enumerate(model.blocks) if hasattr(b, "attn")}
    missing = [n for n in model.attention_names
               if not {f"{n}.hook_attn_scores", f"{n}.hook_pattern"} <= set(model.hook_dict)]
    if missing:
        raise ProbeError(f"{', '.join(missing)}: this analysis reads each attention's scores and pattern "
                         "(hook_attn_scores, hook_pattern), which this model exposes only by the module's input and "
                         "output")

    def number(name: str, k: int) -> int:
        parts = name.split(".")
        return int(parts[1]) if parts[0] == "blocks" and len(parts) > 1 and parts[1].isdigit() else k

    return {f"{n}.hook_attn_scores": (f"{n}.hook_pattern", number(n, k)) for k, n in enumerate(model.attention_names)}


# --- one batch: per recall query, per block and head ------------------------------------------------------------
@dataclass
class QueryStats:
    """Per recall query (N of them) and per attention block: ``mass[target]`` and ``gap[target]`` (N, heads), the
    same-role mass on another pair of the dictionary (``wrong[target]``), the query's sequence and key count."""

    sequence: Int[Tensor, "n"]
    keys: Int[Tensor, "n"]  # n_t = t + 1: the keys the query can attend to (prefix included)
    mass: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    wrong: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    gap: dict[int, dict[str, Tensor]] = field(default_factory=dict)


def query_targets(task: TaskConfig, batch: Batch) -> tuple[Bool[Tensor, "batch pos"], dict[str, Tensor],
                                                           dict[str, Tensor]]:
    """The recall queries, and for each its ``key`` / ``value`` prefix positions and the same-role positions of the
    next pair of the dictionary (the placebo target), each (batch pos)."""
    mask, key_pos = recall_targets(task, batch)
    pairs = (batch.prefix_len - 1) // 2
    other = 2 * ((key_pos // 2 + 1) % pairs)
    return mask, {"key": key_pos, "value": key_pos + 1}, {"key": other, "value": other + 1}


def _row_gather(rows: Tensor, pos: Tensor) -> Tensor:
    return rows.gather(-1, pos[:, None, None].expand(-1, rows.shape[1], 1))[..., 0]


@torch.no_grad()
def measure_queries(model: HookedSequenceModel, task: TaskConfig, batch: Batch,
                    fwd_hooks: HookList = ()) -> QueryStats:
    """One forward pass of ``batch``; hooks on every attention's ``hook_pattern`` and ``hook_attn_scores``
    (``attention_hooks``) keep only each recall query's row, so memory stays that of a plain forward. ``fwd_hooks``
    run first (an instrument check writes a known attention there). The gap of a target is its score minus the mean
    score of the query's other causal keys, read after any logit scaling."""
    check_inputs("probe.sharpness.measure_queries", model=model, batch=batch, task=task)
    mask, targets, placebo = query_targets(task, batch)
    qb, qt = mask.nonzero(as_tuple=True)
    stats = QueryStats(sequence=qb.cpu(), keys=(qt + 1).cpu())
    pos = {k: v[qb, qt] for k, v in targets.items()}
    wrong = {k: v[qb, qt] for k, v in placebo.items()}
    t = batch.tokens.shape[1]
    causal = torch.arange(t, device=qt.device)[None, :] <= qt[:, None]  # n key
    hooked = attention_hooks(model)
    numbers = {**{s: k for s, (_, k) in hooked.items()}, **{p: k for p, k in hooked.values()}}

    def layer(name: str) -> int:
        return numbers[name]

    def read_pattern(pattern: Tensor, hook: Any) -> None:
        rows = pattern[qb, :, qt].float()  # n head key
        stats.mass[layer(hook.name)] = {k: _row_gather(rows, p).cpu() for k, p in pos.items()}
        stats.wrong[layer(hook.name)] = {k: _row_gather(rows, p).cpu() for k, p in wrong.items()}

    def read_scores(scores: Tensor, hook: Any) -> None:
        rows = scores[qb, :, qt].double()  # n head key
        total = torch.where(causal[:, None, :], rows, 0.0).sum(-1)
        n = (qt + 1).double()[:, None]
        gaps = {}
        for k, p in pos.items():
            at = _row_gather(rows, p)
            gaps[k] = (at - (total - at) / (n - 1)).cpu()
        stats.gap[layer(hook.name)] = gaps

    hooks = [*fwd_hooks, *((s, read_scores) for s in hooked), *((p, read_pattern) for p, _ in hooked.values())]
    model.run_with_hooks(batch.tokens, return_type=None, fwd_hooks=hooks)
    return stats


# --- the logit scale at evaluation time -------------------------------------------------------------------------
@contextlib.contextmanager
def attention_scale(model: HookedSequenceModel, scale: str, task: TaskConfig) -> Iterator[None]:
    """Within the block every attention layer scales its logits by ``scale`` (``none`` or ``log-length``) with n_train
    from ``task`` (prefix + L_train); the previous scale comes back on exit, also on an exception. A model trained
    with ``ssmax`` keeps its own scale (log-length on top of it would scale twice). A wrapped or bridged model's
    attention has no scale of probe's to set: ``none`` leaves it as it is, ``log-length`` is refused."""
    if scale not in SCALES:
        raise ProbeError(f"unknown scale {scale!r}; choose one of {', '.join(SCALES)}")
    if isinstance(model, WrappedModel):
        if scale != "none":
            raise ProbeError(f"--scale {scale} sets the logit scale of probe's own attention layers; a wrapped or "
                             "bridged model's attention has none to set (run it with --scale none)")
        yield
        return
    layers = [b.attn for b in model.blocks if hasattr(b, "attn")]
    if scale != "none" and any(a.scale == "ssmax" for a in layers):
        raise ProbeError("this model was trained with attn_scale=ssmax; --scale log-length applies to models "
                         "trained without a logit scale")
    before = [(a.scale, a.train_positions) for a in layers]
    try:
        for a in layers:
            if a.scale != "ssmax":
                a.scale = scale
            a.set_train_positions(default_train_positions(task))
        yield
    finally:
        for a, (s, n) in zip(layers, before, strict=True):
            a.scale, a.train_positions = s, n


# --- lengths: mass, gap and accuracy ------------------------------------------------------------------------------
def _summary(stats: list[QueryStats], values: Callable[[QueryStats], Tensor]) -> tuple[float, float, float]:
    """Mean over queries with a bootstrap interval over sequences (answers in one sequence are correlated)."""
    seq = np.concatenate([s.sequence.numpy() + 10_000_000 * i for i, s in enumerate(stats)])
    x = torch.cat([values(s) for s in stats]).double().numpy()
    _, inverse = np.unique(seq, return_inverse=True)
    sums, counts = np.bincount(inverse, weights=x), np.bincount(inverse).astype(float)
    lo, hi = bootstrap_ci(lambda idx: sums[idx].sum(1) / counts[idx].sum(1), len(sums))
    return float(x.mean()), lo, hi


def measure_length(model: HookedSequenceModel, task: TaskConfig, length: int, n_samples: int, seed: int = 0,
                   fwd_hooks: HookList = ()) -> list[QueryStats]:
    """Per-query statistics on the sequences ``probe.evaluate`` scores at ``length`` (same seeds), run in sub-batches
    that fit in memory."""
    check_inputs("probe.sharpness.measure_length", model=model, task=task)
    device = next(model.parameters()).device
    fits = fit_batch_size(model.cfg, length, BATCH, device, prefix=task.prefix_len)
    out, done, chunk = [], 0, 0
    while done < n_samples:
        b = min(BATCH, n_samples - done)
        batch = task.sample(length, b, eval_seed(seed, length, chunk)).to(device)
        for i in range(0, b, fits):
            part = Batch(batch.tokens[i:i + fits], batch.labels[i:i + fits],
                         {k: v[i:i + fits] for k, v in batch.masks.items()}, batch.sums[i:i + fits],
                         batch.prefix_len, batch.length)
            out.append(measure_queries(model, task, part, fwd_hooks))
        done += b
        chunk += 1
    return out


def mass_rows(stats: list[QueryStats], deltas: dict[tuple[int, int, str], float] | None = None,
              ) -> list[dict[str, Any]]:
    """One row per (layer, head, target): ``mass, ci_low, ci_high, wrong_mass, gap, delta, reference,
    uniform_mass, n_queries, n_sequences, mean_keys``. ``reference`` averages e^Δ / (e^Δ + n − 1) over the queries
    with Δ = ``deltas`` (the gap fitted at the training length; this length's own gap where none is given)."""
    keys = torch.cat([s.keys for s in stats]).double()
    n_seq = len({(i, int(q)) for i, s in enumerate(stats) for q in s.sequence.unique()})
    rows = []
    if not len(keys):
        return rows
    for layer in sorted(stats[0].mass):
        for target in TARGETS:
            heads = stats[0].mass[layer][target].shape[1]
            for h in range(heads):
                mass, lo, hi = _summary(stats, lambda s, L=layer, t=target, h=h: s.mass[L][t][:, h])
                gap = float(torch.cat([s.gap[layer][target][:, h] for s in stats]).mean())
                wrong = float(torch.cat([s.wrong[layer][target][:, h] for s in stats]).double().mean())
                delta = (deltas or {}).get((layer, h, target), gap)
                rows.append({"layer": layer, "head": h, "target": target, "mass": mass, "ci_low": lo,
                             "ci_high": hi, "wrong_mass": wrong, "gap": gap, "delta": delta,
                             "reference": float(reference_mass(torch.tensor(delta), keys).mean()),
                             "uniform_mass": float((1 / keys).mean()), "n_queries": len(keys),
                             "n_sequences": n_seq, "mean_keys": float(keys.mean())})
    return rows


def sharpness_curve(model: HookedSequenceModel, task: TaskConfig, lengths: Sequence[int], n_samples: int = 64,
                    seed: int = 0, scale: str = "none", progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Mass rows (``length, scale`` + ``mass_rows``) and recall accuracy rows (``length, scale, subtask, token_acc,
    seq_acc, n_tokens``: ``probe.evaluate.accuracy_at_length`` on the same sequences) at every length; Δ is fitted at
    L_train (measured there whether or not it is in ``lengths``). ``progress``: a bar over the lengths on stderr."""
    check_inputs("probe.sharpness.sharpness_curve", model=model, task=task)
    device = next(model.parameters()).device
    lengths = [int(x) for x in lengths]
    check_lengths(model.cfg, task, [*lengths, task.train_length], device)  # before any work
    with attention_scale(model, scale, task):
        fitted = mass_rows(measure_length(model, task, task.train_length, n_samples, seed))
        deltas = {(r["layer"], r["head"], r["target"]): r["gap"] for r in fitted}
        mass, acc = [], []
        for length in progress_iter(lengths, f"lengths (scale {scale})", progress):
            stats = measure_length(model, task, length, n_samples, seed)
            mass += [{"length": length, "scale": scale, **r} for r in mass_rows(stats, deltas)]
            fits = fit_batch_size(model.cfg, length, BATCH, device, prefix=task.prefix_len)
            for subtask, a in accuracy_at_length(model, task, length, n_samples, BATCH, seed,
                                                 forward_batch=fits).items():
                acc.append({"length": length, "scale": scale, "subtask": subtask, **a})
    return pd.DataFrame(mass), pd.DataFrame(acc)


def recall_head(mass: pd.DataFrame, train_length: int) -> tuple[int, int, str] | None:
    """The (layer, head, target) with the largest mass at L_train without scaling: the head a recall claim is about."""
    at = mass[(mass.length == train_length) & (mass.scale == "none")]
    if at.empty:
        return None
    best = at.loc[at.mass.idxmax()]
    return int(best["layer"]), int(best["head"]), str(best["target"])
