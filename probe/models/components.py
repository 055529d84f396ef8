"""Hooked building blocks: positional encodings, LayerNorm, causal attention, the MLP, the recurrent cell's maker."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from probe.errors import ProbeError
from probe.models.config import ModelConfig
from probe.models.gru import HookedGRU
from probe.models.lstm import HookedLSTM
from probe.models.recurrent import HookedRecurrent, listened
from probe.models.ssm import HookedSSM
from probe.tasks import TaskConfig, make_task

__all__ = ["MASK_VALUE", "MLP", "CausalAttention", "HookedGRU", "HookedLSTM", "HookedLayerNorm", "HookedSSM",
           "PosEmbed", "apply_rope", "default_train_positions", "recurrent_cell", "sinusoidal_table"]

MASK_VALUE = -1e5
"""Score written above the causal diagonal: finite (so attributions through scores stay finite), yet exp() of it
underflows to exactly 0 in float32, as TransformerLens does."""


def recurrent_cell(cfg: ModelConfig) -> HookedRecurrent:
    """The recurrent sublayer that ``cfg.rnn`` names (the cells: ``lstm.py``, ``gru.py``, ``ssm.py``)."""
    if cfg.rnn == "gru":
        return HookedGRU(cfg.d_model)
    if cfg.rnn == "ssm":
        return HookedSSM(cfg.d_model, cfg.ssm_state, cfg.ssm_range)
    return HookedLSTM(cfg.d_model)


def sinusoidal_table(positions: Int[Tensor, "*pos"], d_model: int) -> Float[Tensor, "*pos d_model"]:
    """Vaswani et al.'s encoding, evaluated at arbitrary (also negative or shifted) integer positions."""
    half = d_model // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[..., None] * freq
    table = torch.cat([angles.sin(), angles.cos()], dim=-1)
    if d_model % 2:
        table = F.pad(table, (0, 1))
    return table


class PosEmbed(nn.Module):
    """Additive positional encoding (``learned`` table or ``sinusoidal``), evaluated at given positions."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.kind = cfg.pos_encoding
        self.max_len = cfg.max_len
        self.d_model = cfg.d_model
        if self.kind == "learned":
            self.W_pos = nn.Parameter(torch.randn(cfg.max_len, cfg.d_model) * 0.02)

    def forward(self, positions: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        if self.kind == "learned":
            if int(positions.max()) >= self.max_len or int(positions.min()) < 0:
                raise ProbeError(
                    f"position {int(positions.max())} is outside the learned table [0, {self.max_len}); "
                    "use shorter sequences or a model with a larger max_len"
                )
            return self.W_pos[positions]
        return sinusoidal_table(positions, self.d_model)


def apply_rope(x: Float[Tensor, "batch pos head d_head"], positions: Int[Tensor, "batch pos"]) -> Tensor:
    """Rotary position embedding (Su et al.), rotate-half convention."""
    d_head = x.shape[-1]
    half = d_head // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[..., None] * freq  # batch pos half
    cos, sin = angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class HookedLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters and state-dict keys) with TransformerLens's ``hook_scale`` (batch pos 1) and
    ``hook_normalized`` (batch pos d_model): ``out = (x - mean) / scale * weight + bias``.

    The fused ``F.layer_norm`` runs unless one of the two hooks is attached; then the steps are written out so the
    hooks see (and can edit) the scale and the normalized vector.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__(d_model)
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if not (listened(self.hook_scale) or listened(self.hook_normalized)):
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        x = x - x.mean(dim=-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale) * self.weight + self.bias


def default_train_positions(task: TaskConfig | None = None) -> int:
    """n_train: the keys that the last query of the longest training sequence attends to (dictionary prefix plus
    L_train), for ``task`` or, without one, for the default task (the presets' ``interleaved``, 13 + 25 = 38)."""
    task = task or make_task()
    return task.prefix_len + task.train_length


class CausalAttention(nn.Module):
    """Multi-head causal self-attention written out so that q, k, v, scores, pattern, z and each head's output are
    hookable. With rope, ``hook_rot_q`` / ``hook_rot_k`` see q and k after the rotation (what the scores use).
    ``hook_result`` (batch pos head d_model) is each head's output ``z_h W_O[h]`` without the bias, so attention's
    output is ``hook_result.sum(head) + W_O.bias``; it is computed per head only when hooked (else one matmul).

    ``scale`` (from ``cfg.attn_scale``) multiplies the scaled logits ``q.k / sqrt(d_head)`` of the query at position
    t, which sees n_t = t + 1 keys (the prefix counted), before the causal mask: ``none`` by nothing;
    ``log-length`` by max(1, log n_t / log n_train); ``ssmax`` by ``ssmax_s[h] * log n_t`` with ``ssmax_s`` (one per
    head) learned and initialised to 1 / log n_train. ``hook_attn_scores`` sees the scores after this factor.
    ``train_positions`` is n_train (``default_train_positions``); ``set_train_positions`` changes it.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.rope = cfg.pos_encoding == "rope"
        self.scale = cfg.attn_scale
        self.train_positions = default_train_positions()
        self.W_Q = nn.Linear(cfg.d_model, cfg.d_model)
        self.W_K = nn.Linear(cfg.d_model, cfg.d_model)
        self.W_V = nn.Linear(cfg.d_model, cfg.d_model)
        self.W_O = nn.Linear(cfg.d_model, cfg.d_model)
        if self.scale == "ssmax":
            # s log n_train = 1 at initialisation: at the training length the model starts as the unscaled one
            self.ssmax_s = nn.Parameter(torch.full((cfg.n_heads,), 1.0 / math.log(self.train_positions)))
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, pos, head, d_head]
        self.hook_v = HookPoint()  # [batch, pos, head, d_head]
        if self.rope:
            self.hook_rot_q = HookPoint()  # [batch, pos, head, d_head]
            self.hook_rot_k = HookPoint()  # [batch, pos, head, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head, query_pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, head, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model]

    def set_train_positions(self, n: int, reset_ssmax: bool = False) -> None:
        """Set n_train (the keys seen at the training length); with ``reset_ssmax`` also put ``ssmax_s`` back to
        1 / log n (before training: a task whose n_train differs from the default's)."""
        if n < 2:
            raise ProbeError(f"n_train={n}: length scaling needs at least 2 keys at the training length (log 1 = 0)")
        self.train_positions = int(n)
        if reset_ssmax and hasattr(self, "ssmax_s"):
            with torch.no_grad():
                self.ssmax_s.fill_(1.0 / math.log(n))

    def logit_factor(self, t: int, device: torch.device) -> Tensor | None:
        """What the scores of each query row are multiplied by: (query 1) for ``log-length``, (head query 1) for
        ``ssmax``, None for ``none`` (so that path is exactly the unscaled computation)."""
        if self.scale == "none":
            return None
        log_n = torch.arange(1, t + 1, device=device, dtype=torch.float32).log()
        if self.scale == "log-length":
            # never below 1: inside the trained range the checkpoint's logits stay exactly as trained
            return (log_n / math.log(self.train_positions)).clamp(min=1.0)[:, None]
        if self.scale == "ssmax":
            return self.ssmax_s[:, None, None] * log_n[None, :, None]
        raise ProbeError(f"unknown attention scale {self.scale!r}")

    def forward(self, x: Float[Tensor, "batch pos d_model"], positions: Int[Tensor, "batch pos"]) -> Tensor:
        b, t, _ = x.shape
        split = (b, t, self.n_heads, self.d_head)
        q = self.hook_q(self.W_Q(x).view(split))
        k = self.hook_k(self.W_K(x).view(split))
        v = self.hook_v(self.W_V(x).view(split))
        if self.rope:
            q, k = self.hook_rot_q(apply_rope(q, positions)), self.hook_rot_k(apply_rope(k, positions))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.d_head)
        factor = self.logit_factor(t, x.device)
        if factor is not None:
            scores = scores * factor.to(scores.dtype)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = self.hook_attn_scores(scores.masked_fill(causal, MASK_VALUE))
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        z = self.hook_z(torch.einsum("bhqk,bkhd->bqhd", pattern, v))
        if not listened(self.hook_result):
            return self.W_O(z.reshape(b, t, -1))
        w_o = self.W_O.weight.view(-1, self.n_heads, self.d_head)  # d_model head d_head
        result = self.hook_result(torch.einsum("bqhd,mhd->bqhm", z, w_o))
        return result.sum(dim=2) + self.W_O.bias


class MLP(nn.Module):
    """``W_out(gelu(W_in x))`` with ``hook_pre`` (before the GELU) and ``hook_post`` (after), each (batch pos d_mlp)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.W_in = nn.Linear(cfg.d_model, cfg.mlp_dim)
        self.W_out = nn.Linear(cfg.mlp_dim, cfg.d_model)
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_out(self.hook_post(F.gelu(self.hook_pre(self.W_in(x)))))
