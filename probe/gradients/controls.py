"""Instrument checks of the gradient analysis, each of which a broken method fails (the tests break it on purpose)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from probe.core.rows import threshold_row
from probe.gradients.decomposition import (
    Cut,
    attention_inputs_detached,
    check_has_lstm,
    decompose,
    flat_grad,
    other_routes,
    recurrent_gradient,
)
from probe.models import HookedSequenceModel, ModelConfig
from probe.tasks import IGNORE_INDEX, Batch
from probe.wrapped import WrappedModel

ROUTE_TOL = 1e-5
"""g_rec computed by two routes may differ by float rounding only (measured: below 1e-7 of |g|)."""
SPLIT_TOL = 1e-5
KNOWN_SPLIT_TOL = 1e-5
FIRST_ORDER_TOL = 0.05
"""|measured - first-order| change of a loss, relative to the largest first-order change of that loss over the three
parts. At the default step (|eta d_full| = 1e-6 |theta|) the second-order term stays below it on the shipped
checkpoints; a wrong gradient, preconditioner or sign gives an error of order 1 at any step size."""


# --- g_rec two independent ways ---------------------------------------------------------------------------------
def route_disagreement(model: HookedSequenceModel, batch: Batch, cut: Cut = attention_inputs_detached) -> float:
    """max over the two other routes of |g_rec(cut) - g_rec(route)| / |g|: the method's cut (hooks that detach q, k
    and v) against the model's own ``attn_stopgrad`` (the stream detached before attention's LayerNorm) and a
    detached ``hook_attn_out`` (a wrapped model: its detached attention outputs, ``other_routes``). A cut that
    leaves a path through attention open (detaching q only, or nothing) disagrees by about that path's share of the
    gradient."""
    theta = check_has_lstm(model)
    with torch.enable_grad():
        g = flat_grad(model(batch.tokens, labels=batch.labels), theta)
    norm = float(g.norm())
    if norm == 0:
        return 0.0
    mine = recurrent_gradient(model, batch, cut)
    others = [recurrent_gradient(model, batch, route) for route in other_routes(model)]
    return max(float((mine - o).norm()) / norm for o in others)


def attention_outputs(model: HookedSequenceModel | WrappedModel) -> list[str]:
    """The hook of each attention output where it joins the stream (after the gate)."""
    if isinstance(model, WrappedModel):
        return model.attention_output_hooks
    return [f"blocks.{i}.hook_attn_out" for i, b in enumerate(model.blocks) if hasattr(b, "attn")]


def path_sum_residual(model: HookedSequenceModel | WrappedModel, batch: Batch,
                      cut: Cut = attention_inputs_detached) -> float:
    """|g_rec + g_att' - g| / |g|: the two parts against the whole gradient, each computed on its own.

    g: a plain pass; g_rec: the method's cut; g_att': every path through attention, grouped by the last attention
    output a_k it crosses, sum_k (d a_k / d theta)^T u_k, where u_k = dL/da_k along paths that cross no further
    attention (a pass in which every attention output is a leaf) and d a_k / d theta is taken in a plain pass. It
    uses no cut, so a cut that leaves a path through attention open, or cuts a recurrent one, fails it."""
    theta = check_has_lstm(model)
    names = attention_outputs(model)
    with torch.enable_grad():
        g = flat_grad(model(batch.tokens, labels=batch.labels), theta)
        g_rec = recurrent_gradient(model, batch, cut)
        leaves: dict[str, Tensor] = {}

        def as_leaf(x: Tensor, hook: Any) -> Tensor:
            leaves[hook.name] = x.detach().requires_grad_(True)
            return leaves[hook.name]

        u: tuple[Tensor | None, ...] = ()
        if names:  # an lstm model has no attention: g_att is 0 and g_rec must be g
            with model.hooks(fwd_hooks=[(n, as_leaf) for n in names]):
                loss = model(batch.tokens, labels=batch.labels)
            u = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
        outs: dict[str, Tensor] = {}

        def keep(x: Tensor, hook: Any) -> Tensor:
            outs[hook.name] = x
            return x

        if names:
            with model.hooks(fwd_hooks=[(n, keep) for n in names]):
                model(batch.tokens)
        pairs = [(outs[n], v) for n, v in zip(names, u, strict=True) if v is not None and outs[n].requires_grad]
        if pairs:
            gs = torch.autograd.grad([o for o, _ in pairs], theta, grad_outputs=[v for _, v in pairs],
                                     allow_unused=True)
            g_att = torch.cat([(torch.zeros_like(p) if d is None else d).flatten() for d, p in zip(gs, theta,
                                                                                                 strict=True)])
        else:
            g_att = torch.zeros_like(g)
    norm = float(g.norm())
    return float((g_rec + g_att - g).norm()) / norm if norm > 0 else 0.0


# --- a hand-built 2-block hybrid whose split is known ------------------------------------------------------------
ORDINARY, M1, X, A, M2 = 0, 4, 5, 6, 7
"""Token ids of the hand-built case: 0-3 ordinary, M1 (read by A's query), X (read by M2's query), the answer
tokens A and M2."""
KNOWN_SEQUENCE = (1, 3, M1, 2, X, 0, A, M2)


def known_split_case(batch_size: int = 4, seed: int = 0) -> tuple[HookedSequenceModel, Batch, Tensor]:
    """A 2-block hybrid and a batch with two answers per sequence whose gradient paths are known by construction.

    Answer A (position 6) can reach the LSTM weights only along paths that avoid attention; answer M2 (position 7)
    only through attention. Construction: both LSTMs' output gates read coordinate 0 of their input with weight
    -1000, which the marker tokens M1 and M2 set high, so at M1 and M2 the LSTM outputs and their derivatives are
    exactly 0 in float32 (sigmoid(-2000)); the MLPs' output weights are 0 and block 0's gate is 0; block 1's single
    head is saturated (score margins near 1000, so the softmax and its derivative are exact one-hots): A's query
    reads only M1, whose stream does not depend on the LSTM weights, and M2's query reads only X, whose stream does.
    So ``g_rec`` is exactly the gradient of A's loss and ``g_att`` exactly that of M2's loss, both computable
    without any cut (``answer_masks``): ``|g_att| / |g|`` is known and lies strictly between 0 and 1.
    Returns (model, batch, mask of the attention-path answers)."""
    gen = torch.Generator().manual_seed(seed)
    vocab, d = 8, 16
    # an LSTM whatever the checkpoint's cell: the construction needs its output gate, and the case checks the cut
    model = HookedSequenceModel(ModelConfig(family="hybrid", vocab_size=vocab, d_model=d, n_layers=2, n_heads=1,
                                            rnn="lstm"))
    flags = {M1: [0, 1], M2: [0, 4], A: [2], X: [3]}  # coordinate 0 = marker, 1 = M1, 2 = A, 3 = X, 4 = M2
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        for name, p in model.named_parameters():
            if name.endswith(("ln_lstm.weight", "ln_attn.weight", "ln_mlp.weight", "ln_final.weight")):
                p.fill_(1.0)
            elif ".ln_" in name or name.startswith("ln_final"):
                p.zero_()
        emb = torch.randn(vocab, d, generator=gen) * 0.5
        emb[:, :5] = 0.0
        emb[:, 0] = -5.0  # not a marker: LayerNorm gives coordinate 0 a value near -3, so the output gate is open
        for token, coords in flags.items():
            for c in coords:
                emb[token, c] = 10.0
        model.embed.weight.copy_(emb)
        o = slice(3 * d, 4 * d)  # PyTorch's gate order: input, forget, cell, output
        for layer in model.lstm_layers:
            r = layer.rnn
            r.weight_ih_l0[o] = 0.0
            r.weight_ih_l0[o, 0] = -1000.0
            r.weight_hh_l0[o] = 0.0
            r.bias_ih_l0[o] = 0.0
            r.bias_hh_l0[o] = 0.0
        for block in model.blocks:
            block.mlp.W_out.weight.zero_()
            block.mlp.W_out.bias.zero_()
        attn = model.blocks[1].attn
        for lin in (attn.W_Q, attn.W_K):
            lin.weight.zero_()
            lin.bias.zero_()
        # one head of width 16: A's query (coordinate 2) meets M1's key (1) along u1, M2's query (4) X's key (3)
        # along u2, with scale 30 so that the score margins are near 1000
        attn.W_Q.weight[0, 2] = attn.W_Q.weight[1, 4] = 30.0
        attn.W_K.weight[0, 1] = attn.W_K.weight[1, 3] = 30.0
    model.set_attention_gate([0.0, 1.0])
    tokens = torch.tensor(KNOWN_SEQUENCE).repeat(batch_size, 1)
    tokens[:, :2] = torch.randint(4, (batch_size, 2), generator=gen)  # the sequences differ before M1
    labels = torch.full_like(tokens, IGNORE_INDEX)
    labels[:, 6:] = torch.randint(vocab, (batch_size, 2), generator=gen)
    asked = labels != IGNORE_INDEX
    batch = Batch(tokens=tokens, labels=labels, masks={"state": asked, "recall": torch.zeros_like(asked)},
                  sums=torch.zeros_like(tokens), prefix_len=0, length=tokens.shape[1])
    via_attention = torch.zeros_like(asked)
    via_attention[:, 7] = True
    return model.eval(), batch, via_attention


def answer_gradients(model: HookedSequenceModel, batch: Batch, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Plain autograd, no cut: the gradients of the loss terms of the answers outside ``mask`` and inside it
    (normalised by all answers, as the training loss is)."""
    theta = check_has_lstm(model)
    with torch.enable_grad():
        logits = model(batch.tokens)
        ce = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX,
                             reduction="none").view_as(batch.labels)
        n = batch.answer_mask.sum()
        outside = flat_grad((ce * (batch.answer_mask & ~mask)).sum() / n, theta, retain=True)
        inside = flat_grad((ce * mask).sum() / n, theta)
    return outside, inside


def known_split_error(cut: Cut = attention_inputs_detached, decomposition: Callable[..., Any] = decompose,
                      ) -> dict[str, float]:
    """On ``known_split_case``: the error of g_att and g_rec against the known answer gradients, relative to |g|,
    and the share |g_att| / |g| measured and expected."""
    model, batch, via_attention = known_split_case()
    v = decomposition(model, batch, cut=cut).vectors(None)
    rec_expected, att_expected = answer_gradients(model, batch, via_attention)
    norm = float(v["g"].norm())
    return {"error": max(float((v["g_att"] - att_expected).norm()), float((v["g_rec"] - rec_expected).norm())) / norm,
            "share": float(v["g_att"].norm()) / norm,
            "share_expected": float(att_expected.norm()) / float((att_expected + rec_expected).norm())}


def builtin_controls(cut: Cut = attention_inputs_detached) -> list[dict[str, Any]]:
    """The model-independent control: the hand-built 2-block case."""
    k = known_split_error(cut)
    return [threshold_row("<hand-built 2-block>", "known_split", k["error"], KNOWN_SPLIT_TOL,
                        "max(|g_att - g_known_att|, |g_rec - g_known_rec|) / |g| on a hand-built 2-block hybrid "
                        f"whose attention-path share is known ({k['share_expected']:.3f}; measured "
                        f"{k['share']:.3f}); fails if the cut leaves a path through attention open or cuts a "
                        "recurrent one", share=k["share"], share_expected=k["share_expected"])]


# --- rows from computed tables ----------------------------------------------------------------------------------
def loss_split_control(checkpoint: str, table: pd.DataFrame) -> dict[str, Any]:
    return threshold_row(checkpoint, "loss_split", float(table.loss_split_residual.max()), SPLIT_TOL,
                       "|g_a + g_b - g_train| / |g_train| for the two loss parts (probe's tasks: state, recall), "
                       "g_train from the model's own loss (two loss callables: their sum) in a pass of its own: "
                       "fails if the split does not add up to that loss (it checks the loss split, not the "
                       "attention/recurrent split)")


def first_order_control(checkpoint: str, rows: pd.DataFrame) -> dict[str, Any]:
    """Measured loss change after the step against its first-order prediction (see ``lookahead``)."""
    value = float(rows.first_order_error.max()) if len(rows) else 0.0
    return threshold_row(checkpoint, "lookahead_first_order", value, FIRST_ORDER_TOL,
                       "max |dL measured - dL first-order| / max over parts |dL first-order| after a real step: "
                       "fails if the gradient, the preconditioner or the step used for the prediction are not "
                       "the ones that change the loss")
