"""A plain-PyTorch twin of the hybrid: the same computation with the same weights, no HookPoint modules.

Benchmarks time probe's hooked model against this twin side by side.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from probe.models import HookedSequenceModel
from probe.models.components import MASK_VALUE


def plain_forward(model: HookedSequenceModel, tokens: Tensor) -> Tensor:
    """The forward pass of ``model`` (family hybrid / lstm / transformer without positional code) with plain ops."""
    x = model.embed(tokens)
    b, t = tokens.shape
    causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).triu(1)
    for block in model.blocks:
        if hasattr(block, "lstm"):
            h, _ = block.lstm.rnn(F.layer_norm(x, (x.shape[-1],), block.ln_lstm.weight, block.ln_lstm.bias))
            x = x + h
        if hasattr(block, "attn"):
            a = block.attn
            y = F.layer_norm(x, (x.shape[-1],), block.ln_attn.weight, block.ln_attn.bias)
            q = a.W_Q(y).view(b, t, a.n_heads, a.d_head)
            k = a.W_K(y).view(b, t, a.n_heads, a.d_head)
            v = a.W_V(y).view(b, t, a.n_heads, a.d_head)
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(a.d_head)
            pattern = scores.masked_fill(causal, MASK_VALUE).softmax(-1)
            z = torch.einsum("bhqk,bkhd->bqhd", pattern, v).reshape(b, t, -1)
            x = x + block.attn_gate * a.W_O(z)
        y = F.layer_norm(x, (x.shape[-1],), block.ln_mlp.weight, block.ln_mlp.bias)
        x = x + block.mlp.W_out(F.gelu(block.mlp.W_in(y)))
    return model.unembed(F.layer_norm(x, (x.shape[-1],), model.ln_final.weight, model.ln_final.bias))
