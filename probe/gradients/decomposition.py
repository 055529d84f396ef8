"""The split of the recurrent cells' gradient into the part through attention (g_att) and the recurrent part (g_rec)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from probe.core.cells import cell_label, recurrent_modules
from probe.core.inputs import check_inputs
from probe.core.task import as_batch, two_parts
from probe.errors import ProbeError
from probe.models import HookedSequenceModel
from probe.tasks import IGNORE_INDEX, Batch
from probe.wrapped import WrappedModel

ATTENTION_INPUTS = ("attn.hook_q", "attn.hook_k", "attn.hook_v")

Cut = Callable[[HookedSequenceModel], AbstractContextManager[Any]]
"""A way to remove every gradient path through attention while keeping the forward values: ``cut(model)`` is a
context manager. The analysis uses ``attention_inputs_detached``; the controls compare it with the others."""


def _is_attention_input(name: str) -> bool:
    return name.endswith(ATTENTION_INPUTS)


def _detach(x: Tensor, hook: Any) -> Tensor:
    return x.detach()


@contextlib.contextmanager
def attention_inputs_detached(model: HookedSequenceModel | WrappedModel) -> Iterator[None]:
    """Within the block, every attention sublayer's q, k and v are detached (the method's cut): same forward
    values, no gradient through attention. The hooks are removed on exit, also on an exception. On a wrapped model,
    every tensor input of each named attention module is detached (a forward pre-hook: ``attention_detached``)."""
    if isinstance(model, WrappedModel):
        with model.attention_detached():
            yield
        return
    with model.hooks(fwd_hooks=[(_is_attention_input, _detach)]):
        yield


@contextlib.contextmanager
def attention_stream_detached(model: HookedSequenceModel) -> Iterator[None]:
    """The model's own route (``Block.attn_stopgrad``, what the ``stopgrad`` schedule trains with): the residual
    stream is detached where it enters each attention sublayer, before attention's LayerNorm."""
    before = [b.attn_stopgrad for b in model.attention_blocks]
    model.set_attention_stopgrad(True)
    try:
        yield
    finally:
        for block, value in zip(model.attention_blocks, before, strict=True):
            block.attn_stopgrad = value


@contextlib.contextmanager
def attention_output_detached(model: HookedSequenceModel) -> Iterator[None]:
    """A third route: the gated attention output (``blocks.{i}.hook_attn_out``; a wrapped model's
    ``<attention>.hook_out``) is detached where it joins the stream."""
    if isinstance(model, WrappedModel):
        names = set(model.attention_output_hooks)
        with model.hooks(fwd_hooks=[(lambda n: n in names, _detach)]):
            yield
        return
    with model.hooks(fwd_hooks=[(lambda n: n.endswith("hook_attn_out"), _detach)]):
        yield


def other_routes(model: HookedSequenceModel | WrappedModel) -> list[Cut]:
    """The cuts that must give the method's g_rec by another route: the model's own stopgrad and a detached
    attention output; a wrapped model's stopgrad is the method's own cut, so only the detached output remains."""
    if isinstance(model, WrappedModel):
        return [attention_output_detached]
    return [attention_stream_detached, attention_output_detached]


def lstm_parameters(model: HookedSequenceModel) -> list[list[torch.nn.Parameter]]:
    """theta: per block with a recurrent sublayer (``blocks.{i}.lstm``, any cell), the cell's own parameters in the
    order it registers them (the LSTM's ``weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0``). The LayerNorm before
    the cell is left out: theta is what carries the recurrence, whichever cell it is. A wrapped model: each named
    recurrent module's parameters."""
    return [list(layer.parameters()) for layer in model.lstm_layers]


def lstm_parameter_names(model: HookedSequenceModel) -> list[str]:
    """The state-dict names of theta, flattened in the order of ``lstm_parameters``."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for ps in lstm_parameters(model) for p in ps]


def check_has_lstm(model: HookedSequenceModel) -> list[torch.nn.Parameter]:
    theta = [p for ps in lstm_parameters(model) for p in ps]
    if not theta:
        raise ProbeError("this model has no recurrent sublayer, so there are no recurrent weights whose gradient "
                         "could be split (a transformer); run the analysis on a hybrid or lstm checkpoint")
    return theta


def split_losses(logits: Tensor, batch: Batch, parts: tuple[str, str] = ("state", "recall")) -> dict[str, Tensor]:
    """The two parts of the training loss (mean CE over labelled positions) named by two of the batch's masks; they
    sum exactly to it. A labelled position in both masks counts in the first part; one in neither in the second
    (``check_parts`` refuses that for a user's masks; probe's tasks have none)."""
    a, b = parts
    ce = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX,
                         reduction="none").view_as(batch.labels)
    asked = batch.answer_mask
    n = asked.sum().clamp(min=1)
    first = batch.masks[a] & asked
    return {a: (ce * first).sum() / n, b: (ce * (asked & ~first)).sum() / n}


LossPart = Callable[[Tensor, Any], Tensor]
"""A named part of the loss as a callable: ``f(logits, batch) -> scalar``."""


def check_parts(batch: Any, where: str, parts: Sequence[str] | Mapping[str, LossPart] | None,
                ) -> tuple[tuple[str, str], Callable[[Tensor, Any], dict[str, Tensor]] | None]:
    """The two part names and, for loss callables, the split they make (None for two masks, ``split_losses``).
    Two masks must cover every labelled position between them, so that the parts sum to the training loss and the
    ``loss_split`` check can hold; anything else is refused in one line."""
    names = two_parts(batch, where, parts)
    if isinstance(parts, Mapping):
        fns = dict(parts)
        if not all(callable(f) for f in fns.values()):
            raise ProbeError(f"{where}: parts given as a dict must map each name to a loss callable f(logits, batch)")
        return names, lambda logits, b: {k: fns[k](logits, b) for k in names}
    missing = [m for m in names if m not in batch.masks]
    if missing:
        raise ProbeError(f"{where}: the gradient split needs two named parts; this batch has masks "
                         f"{list(batch.masks)}, not {', '.join(map(repr, missing))}")
    asked = batch.answer_mask
    left = int((asked & ~batch.masks[names[0]] & ~batch.masks[names[1]]).sum())
    if left:
        raise ProbeError(f"{where}: masks {names[0]!r} and {names[1]!r} leave {left} labelled positions out, so "
                         "their parts would not sum to the training loss: add those positions to a mask, or pass "
                         "two loss callables")
    return names, None


def state_loss(logits: Tensor, batch: Batch) -> Tensor:
    """Mean CE over the state answers only (the lookahead's target at an evaluation length)."""
    ce = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX,
                         reduction="none").view_as(batch.labels)
    state = batch.masks["state"] & batch.answer_mask
    return (ce * state).sum() / state.sum().clamp(min=1)


def flat_grad(loss: Tensor, params: list[torch.nn.Parameter], retain: bool = False) -> Tensor:
    """d loss / d params, flattened and concatenated (zeros where a parameter is not reached)."""
    gs = torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(gs, params, strict=True)])


def recurrent_gradient(model: HookedSequenceModel, batch: Batch, cut: Cut = attention_inputs_detached) -> Tensor:
    """g_rec of the training loss on ``batch``, with attention's paths removed by ``cut``."""
    theta = check_has_lstm(model)
    with torch.enable_grad(), cut(model):
        loss = model(batch.tokens, labels=batch.labels)
        return flat_grad(loss, theta)


@dataclass
class Decomposition:
    """Flattened per-block gradients of one batch. Keys of each dict: the two loss parts' names (``parts``: probe's
    tasks ``state`` and ``recall``; a user's, the masks or loss callables it named)."""

    g: list[dict[str, Tensor]]
    g_rec: list[dict[str, Tensor]]
    g_ref: list[Tensor]
    losses: dict[str, float]
    counts: dict[str, int | None]
    parts: tuple[str, str] = ("state", "recall")

    @property
    def n_blocks(self) -> int:
        return len(self.g)

    def vectors(self, block: int | None) -> dict[str, Tensor]:
        """``g, g_rec, g_att`` and their ``_{part}`` parts (``g_att_state``), plus ``g_ref``, for one block (None:
        all)."""
        idx = range(self.n_blocks) if block is None else [block]

        def cat(parts: list[Tensor]) -> Tensor:
            return torch.cat([parts[i] for i in idx])

        a, b = self.parts
        out: dict[str, Tensor] = {"g_ref": cat(self.g_ref)}
        for s in self.parts:
            out[f"g_{s}"] = cat([d[s] for d in self.g])
            out[f"g_rec_{s}"] = cat([d[s] for d in self.g_rec])
            out[f"g_att_{s}"] = out[f"g_{s}"] - out[f"g_rec_{s}"]
        for name in ("g", "g_rec", "g_att"):
            out[name] = out[f"{name}_{a}"] + out[f"{name}_{b}"]
        return out

    def table(self) -> pd.DataFrame:
        """One row per block and one with ``block="all"``; columns documented in the CLI's --help, the parts' names
        in them (``cos_att_state_rec_state``; a user's ``cos_att_copy_rec_copy``)."""
        a, b = self.parts
        rows = []
        for block in [*range(self.n_blocks), None]:
            v = self.vectors(block)
            norm = {k: float(t.norm()) for k, t in v.items()}
            rows.append({
                "block": "all" if block is None else block,
                "g_norm": norm["g"], "g_rec_norm": norm["g_rec"], "g_att_norm": norm["g_att"],
                "att_ratio": ratio(norm["g_att"], norm["g"]),
                "cos_att_rec": cosine(v["g_att"], v["g_rec"]),
                f"cos_att_rec_{a}": cosine(v["g_att"], v[f"g_rec_{a}"]),
                f"cos_att_{a}_rec_{a}": cosine(v[f"g_att_{a}"], v[f"g_rec_{a}"]),
                f"cos_att_{b}_rec_{a}": cosine(v[f"g_att_{b}"], v[f"g_rec_{a}"]),
                f"g_att_{a}_norm": norm[f"g_att_{a}"], f"g_att_{b}_norm": norm[f"g_att_{b}"],
                "loss_split_residual": ratio(float((v["g"] - v["g_ref"]).norm()), norm["g_ref"]),
                "loss": self.losses["all"], f"loss_{a}": self.losses[a], f"loss_{b}": self.losses[b],
                f"n_{a}": self.counts.get(a), f"n_{b}": self.counts.get(b),
            })
        return pd.DataFrame(rows)


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def cosine(a: Tensor, b: Tensor) -> float:
    """Cosine similarity; NaN when either vector is exactly zero (no direction to compare)."""
    na, nb = float(a.norm()), float(b.norm())
    if na == 0 or nb == 0:
        return math.nan
    return float(a @ b) / (na * nb)


def decompose(model: HookedSequenceModel, batch: Batch, cut: Cut = attention_inputs_detached,
              split: Callable[[Tensor, Batch], dict[str, Tensor]] | None = None,
              parts: Sequence[str] | Mapping[str, LossPart] | None = None) -> Decomposition:
    """``g``, ``g_rec`` (per loss part) and the gradient of the whole loss in a pass of its own (``g_ref``), for
    every block. ``batch``: any batch ``probe.core.task.as_batch`` reads. ``parts``: the two named parts of the loss,
    as two of the batch's masks (default: ``state`` and ``recall``, or the batch's two masks) or as two loss
    callables ``{name: f(logits, batch)}``; ``g_ref`` is then the gradient of the model's own loss (masks) or of the
    two callables' sum. ``cut`` and ``split`` are parameters so that the tests can break the method and watch the
    controls fail."""
    where = "probe.gradients.decompose"
    check_inputs(where, model=model)
    batch = as_batch(batch, where)
    names, own_split = check_parts(batch, where, parts)
    if split is None:
        split = own_split or (lambda logits, b: split_losses(logits, b, names))
    theta = lstm_parameters(model)
    flat = check_has_lstm(model)
    sizes = [sum(p.numel() for p in ps) for ps in theta]
    a, b = names

    def per_block(v: Tensor) -> list[Tensor]:
        return list(v.split(sizes))

    with torch.enable_grad():
        losses = split(model(batch.tokens), batch)
        g = {s: per_block(flat_grad(losses[s], flat, retain=s == a)) for s in names}
        with cut(model):
            parts_rec = split(model(batch.tokens), batch)
        g_rec = {s: per_block(flat_grad(parts_rec[s], flat, retain=s == a)) for s in names}
        # the reference: the whole loss in a forward pass of its own (the model's own loss for two masks)
        if own_split is None:
            whole = model(batch.tokens, labels=batch.labels)
        else:
            whole = sum(own_split(model(batch.tokens), batch).values())
        g_ref = per_block(flat_grad(whole, flat))
    counts: dict[str, int | None] = dict.fromkeys(names)
    if own_split is None:
        asked = batch.answer_mask
        first = batch.masks[a] & asked
        counts = {a: int(first.sum()), b: int((asked & ~first).sum())}
    return Decomposition(
        g=[{s: g[s][i] for s in g} for i in range(len(theta))],
        g_rec=[{s: g_rec[s][i] for s in g_rec} for i in range(len(theta))],
        g_ref=g_ref,
        losses={"all": (losses[a] + losses[b]).item(), a: losses[a].item(), b: losses[b].item()},
        counts=counts,
        parts=names,
    )


def interference(model: HookedSequenceModel | WrappedModel, batch: Batch,
                 parts: Sequence[str] | Mapping[str, LossPart] | None = None) -> pd.DataFrame:
    """The interference table of one model on one batch (see ``Decomposition.table``). Each row names its recurrent
    module as the model does (``module``: the user's module path for a wrapped model, ``blocks.i.lstm`` for probe's
    own; ``block`` counts them in order) and its cell kind (``cell``: ``lstm``, ``gru``, ``ssm``, or the module's
    class); the ``all`` row sums them. ``batch`` and ``parts``: as ``decompose`` takes them (any task's batch, any
    two named parts of its loss)."""
    where = "probe.gradients.interference"
    check_inputs(where, model=model)
    table = decompose(model, as_batch(batch, where), parts=parts).table()
    modules = recurrent_modules(model)
    table.insert(1, "module", [n for n, _ in modules] + ["all"])
    table.insert(2, "cell", [k for _, k in modules] + [cell_label(modules)])
    return table
