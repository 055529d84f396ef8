"""The hooked sequence model: one block design that is an LSTM, a Transformer or the paper's hybrid."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from probe.models.components import MLP, CausalAttention, HookedLSTM, PosEmbed
from probe.models.config import ModelConfig
from probe.tasks import IGNORE_INDEX


class Block(nn.Module):
    """``[LN -> LSTM] -> [LN -> causal MHA, times the gate] -> LN -> MLP``, each sublayer residual.

    The LSTM sublayer exists for ``lstm`` and ``hybrid``, attention for ``transformer`` and ``hybrid``. ``attn_gate``
    is a buffer (0 = off, 1 = on, in between for ramps) that multiplies attention's output, so attention hooks fire
    and cache keys stay the same whatever the gate; ``hook_attn_out`` sees the gated output that joins the stream.
    ``attn_stopgrad`` (set by the trainer's ``stopgrad`` schedule) detaches the stream where it enters the attention
    sublayer: the forward is unchanged, attention's own weights and LayerNorm still learn, but no gradient flows back
    through attention into the LSTM, the MLPs or the embeddings.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        if cfg.has_lstm:
            self.ln_lstm = nn.LayerNorm(cfg.d_model)
            self.lstm = HookedLSTM(cfg.d_model)
            self.hook_lstm_out = HookPoint()
        if cfg.has_attention:
            self.ln_attn = nn.LayerNorm(cfg.d_model)
            self.attn = CausalAttention(cfg)
            self.hook_attn_out = HookPoint()
            self.register_buffer("attn_gate", torch.ones(()))
            self.attn_stopgrad = False
        self.ln_mlp = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"], positions: Int[Tensor, "batch pos"]) -> Tensor:
        x = self.hook_resid_pre(x)
        if hasattr(self, "lstm"):
            x = x + self.hook_lstm_out(self.lstm(self.ln_lstm(x)))
        if hasattr(self, "attn"):
            attn_in = x.detach() if self.attn_stopgrad else x
            x = x + self.hook_attn_out(self.attn_gate * self.attn(self.ln_attn(attn_in), positions))
        x = x + self.hook_mlp_out(self.mlp(self.ln_mlp(x)))
        return self.hook_resid_post(x)


class HookedSequenceModel(HookedRootModule):
    """An LSTM, Transformer or hybrid as a TransformerLens ``HookedRootModule``.

    >>> from probe.models import ModelConfig, HookedSequenceModel
    >>> model = HookedSequenceModel(ModelConfig(family="hybrid", vocab_size=43, d_model=32, n_layers=2))
    >>> logits, cache = model.run_with_cache(torch.zeros(3, 7, dtype=torch.long))
    >>> tuple(cache["blocks.1.attn.hook_pattern"].shape)
    (3, 4, 7, 7)
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.hook_embed = HookPoint()
        if cfg.family == "transformer" and cfg.pos_encoding in ("learned", "sinusoidal"):
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = nn.LayerNorm(cfg.d_model)
        self.unembed = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.hook_logits = HookPoint()
        self.setup()

    def forward(
        self, tokens: Int[Tensor, "batch pos"], positions: Int[Tensor, "batch pos"] | None = None,
        labels: Int[Tensor, "batch pos"] | None = None,
    ) -> Float[Tensor, "batch pos vocab"] | Float[Tensor, ""]:
        """Logits at every position, or with ``labels`` the mean cross-entropy over labelled positions (a scalar,
        so that ``run_with_cache(..., labels=y, incl_bwd=True)`` works). ``positions`` (default ``0..T-1``) feeds
        the positional encoding only."""
        b, t = tokens.shape
        if positions is None:
            positions = torch.arange(t, device=tokens.device).expand(b, t)
        elif positions.dim() == 1:
            positions = positions.expand(b, t)
        x = self.hook_embed(self.embed(tokens))
        if hasattr(self, "pos_embed"):
            x = x + self.hook_pos_embed(self.pos_embed(positions))
        for block in self.blocks:
            x = block(x, positions)
        logits = self.hook_logits(self.unembed(self.ln_final(x)))
        if labels is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)

    # --- attention gates --------------------------------------------------------------------------------
    @property
    def attention_blocks(self) -> list[Block]:
        return [b for b in self.blocks if hasattr(b, "attn")]

    def attention_gates(self) -> list[float]:
        return [float(b.attn_gate) for b in self.attention_blocks]

    def set_attention_gate(self, value: float | Sequence[float]) -> None:
        """Set every block's gate to ``value``, or block i's to ``value[i]``."""
        blocks = self.attention_blocks
        values = [float(value)] * len(blocks) if isinstance(value, (int, float)) else [float(v) for v in value]
        if len(values) != len(blocks):
            raise ValueError(f"{len(values)} gate values for {len(blocks)} attention blocks")
        for block, v in zip(blocks, values, strict=True):
            block.attn_gate.fill_(v)

    def attention_parameters(self) -> list[nn.Parameter]:
        """Parameters of the attention sublayers (and their pre-LN): what DAT holds back."""
        return [p for b in self.attention_blocks for m in (b.attn, b.ln_attn) for p in m.parameters()]

    def set_attention_stopgrad(self, value: bool) -> None:
        """Detach (True) or not the residual stream where it enters every attention sublayer (training only: the
        forward values do not change)."""
        for block in self.attention_blocks:
            block.attn_stopgrad = bool(value)

    def recurrent_parameters(self) -> list[nn.Parameter]:
        """Parameters of the recurrent sublayers (the LSTMs and their pre-LN): what ``freeze_recurrent_after_switch``
        holds fixed."""
        return [p for b in self.blocks if hasattr(b, "lstm") for m in (b.lstm, b.ln_lstm) for p in m.parameters()]

    @property
    def lstm_layers(self) -> list[HookedLSTM]:
        return [b.lstm for b in self.blocks if hasattr(b, "lstm")]
