"""The hooked sequence model: one block design that is an LSTM, a Transformer or the paper's hybrid."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from types import EllipsisType
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import FactoredMatrix, HookedRootModule
from transformer_lens.hook_points import HookPoint

from probe.errors import ProbeError
from probe.models.cache import SequenceActivationCache, unknown_hook
from probe.models.components import MLP, CausalAttention, HookedLayerNorm, PosEmbed, recurrent_cell
from probe.models.config import ModelConfig
from probe.models.recurrent import HookedRecurrent
from probe.tasks import IGNORE_INDEX, TaskConfig
from probe.viz import token_labels

RETURN_TYPES = ("logits", "loss", "both", None)


class Sublayer(NamedTuple):
    """A sublayer output that joins the stream: its ``kind`` (``recurrent`` or ``attn``) and the dimension of its
    hook's tensor that indexes the batch (0 but for a wrapped module that is not batch-first)."""

    kind: str
    batch_dim: int = 0


def resolve_return_type(return_type: Any, labels: Tensor | None) -> str | None:
    """A forward's ``return_type``: unset (``...``) is ``"loss"`` when ``labels`` are given, else ``"logits"``; an
    unknown one, or a loss without labels, is one line (``ProbeError``)."""
    if return_type is ...:
        return_type = "logits" if labels is None else "loss"
    if return_type not in RETURN_TYPES:
        raise ProbeError(f"return_type must be logits, loss, both or None, not {return_type!r}")
    if return_type in ("loss", "both") and labels is None:
        raise ProbeError(f"return_type={return_type!r} needs labels= (the answer at every position, "
                         "IGNORE_INDEX where nothing is asked)")
    return return_type


class Block(nn.Module):
    """``[LN -> recurrent cell] -> [LN -> causal MHA, times the gate] -> LN -> MLP``, each sublayer residual.

    ``hook_resid_mid`` is the stream entering the MLP sublayer (TransformerLens's ``resid_mid``).

    The recurrent sublayer exists for ``lstm`` and ``hybrid``, attention for ``transformer`` and ``hybrid``. It is
    ``blocks.{i}.lstm`` (with ``ln_lstm`` and ``hook_lstm_out``) whatever the cell (``cfg.rnn``): one name for the
    slot, as TransformerLens keeps ``attn`` for every attention variant, so hook names, cache keys, checkpoints and
    every analysis read any cell the same way (docs/guides/hooks.md). ``attn_gate``
    is a buffer (0 = off, 1 = on, in between for ramps) that multiplies attention's output, so attention hooks fire
    and cache keys stay the same whatever the gate; ``hook_attn_out`` sees the gated output that joins the stream.
    ``attn_stopgrad`` (set by the trainer's ``stopgrad`` schedule) detaches the stream where it enters the attention
    sublayer: the forward is unchanged, attention's own weights and LayerNorm still learn, but no gradient flows back
    through attention into the LSTM, the MLPs or the embeddings.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        if cfg.has_lstm:
            self.ln_lstm = HookedLayerNorm(cfg.d_model)
            self.lstm = recurrent_cell(cfg)
            self.hook_lstm_out = HookPoint()  # [batch, pos, d_model]
        if cfg.has_attention:
            self.ln_attn = HookedLayerNorm(cfg.d_model)
            self.attn = CausalAttention(cfg)
            self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
            self.register_buffer("attn_gate", torch.ones(()))
            self.attn_stopgrad = False
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.ln_mlp = HookedLayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"], positions: Int[Tensor, "batch pos"]) -> Tensor:
        x = self.hook_resid_pre(x)
        if hasattr(self, "lstm"):
            x = x + self.hook_lstm_out(self.lstm(self.ln_lstm(x)))
        if hasattr(self, "attn"):
            attn_in = x.detach() if self.attn_stopgrad else x
            x = x + self.hook_attn_out(self.attn_gate * self.attn(self.ln_attn(attn_in), positions))
        x = self.hook_resid_mid(x)
        x = x + self.hook_mlp_out(self.mlp(self.ln_mlp(x)))
        return self.hook_resid_post(x)


class HookedSequenceModel(HookedRootModule):
    """An LSTM, Transformer or hybrid as a TransformerLens ``HookedRootModule``.

    >>> from probe.models import ModelConfig, HookedSequenceModel
    >>> model = HookedSequenceModel(ModelConfig(family="hybrid", vocab_size=43, d_model=32, n_layers=2))
    >>> logits, cache = model.run_with_cache(torch.zeros(3, 7, dtype=torch.long))
    >>> tuple(cache["pattern", 1].shape)
    (3, 4, 7, 7)

    ``run_with_cache`` returns a TransformerLens ``ActivationCache`` (``SequenceActivationCache``); hook names and
    their semantics are listed in docs/guides/hooks.md; a misspelled name raises ``UnknownHookError`` (a
    ``ProbeError`` and a ``KeyError``) naming the nearest ones. ``task`` (optional) gives ``to_str_tokens`` its
    vocabulary.
    """

    def __init__(self, cfg: ModelConfig, task: TaskConfig | None = None) -> None:
        super().__init__()
        # the model's own copy: it records the model's device (cfg.device), which a shared config could not
        self.cfg = dataclasses.replace(cfg)
        self.task = task
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        if cfg.family == "transformer" and cfg.pos_encoding in ("learned", "sinusoidal"):
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = HookedLayerNorm(cfg.d_model)
        self.unembed = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.hook_logits = HookPoint()  # [batch, pos, vocab]
        self.setup()

    def forward(
        self, tokens: Int[Tensor, "batch pos"], positions: Int[Tensor, "batch pos"] | None = None,
        labels: Int[Tensor, "batch pos"] | None = None,
        return_type: Literal["logits", "loss", "both"] | None | EllipsisType = ..., loss_per_token: bool = False,
    ) -> Float[Tensor, "batch pos vocab"] | Float[Tensor, ""] | tuple[Tensor, Tensor] | None:
        """Logits at every position (``return_type="logits"``), the cross-entropy against ``labels`` (``"loss"``:
        the mean over labelled positions, a scalar, so ``run_with_cache(..., labels=y, incl_bwd=True)`` works; with
        ``loss_per_token`` a (batch, pos) tensor, 0 where unlabelled), ``"both"`` (logits, loss), or None. The default
        is ``"loss"`` when ``labels`` are given, else ``"logits"``. Every answer is read at its own position, so the
        loss needs ``labels`` (no next-token shift). ``positions`` (default ``0..T-1``) feeds the positional encoding
        only."""
        return_type = resolve_return_type(return_type, labels)
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
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="none" if loss_per_token else "mean")
        loss = loss.view(b, t) if loss_per_token else loss
        return loss if return_type == "loss" else (logits, loss)

    # --- TransformerLens idioms -------------------------------------------------------------------------------
    def run_with_cache(self, *model_args: Any, **kwargs: Any) -> tuple[Any, SequenceActivationCache]:
        """TransformerLens's ``run_with_cache``; the cache is an ``ActivationCache`` bound to this model."""
        out, cache = super().run_with_cache(*model_args, **kwargs)
        return out, SequenceActivationCache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    def get_caching_hooks(self, names_filter: Any = None, *args: Any, **kwargs: Any) -> tuple[dict, list, list]:
        self._check_names(names_filter)
        return super().get_caching_hooks(names_filter, *args, **kwargs)

    def add_caching_hooks(self, names_filter: Any = None, *args: Any, **kwargs: Any) -> dict:
        self._check_names(names_filter)
        return super().add_caching_hooks(names_filter, *args, **kwargs)

    def add_hook(self, name: str | Callable[[str], bool], hook: Callable, *args: Any, **kwargs: Any) -> None:
        self._check_names(name)
        super().add_hook(name, hook, *args, **kwargs)

    def _enable_hook_with_name(self, name: str, hook: Callable, dir: Literal["fwd", "bwd"]) -> None:
        # the path of model.hooks(...) and run_with_hooks(...) for a hook given by name
        self._check_names(name)
        super()._enable_hook_with_name(name, hook, dir)

    def _check_names(self, names: Any) -> None:
        """A name (or list of names) that is not a hook point is a one-line error naming the nearest ones; a
        filter function is the caller's business."""
        for name in [names] if isinstance(names, str) else names if isinstance(names, (list, tuple)) else []:
            if name not in self.hook_dict:
                raise unknown_hook(name, self.hook_dict)

    def _apply(self, fn: Callable, recurse: bool = True) -> HookedSequenceModel:
        module = super()._apply(fn, recurse)
        self.cfg._record_device(self.embed.weight.device)  # .to() / .cuda() end here
        return module

    @property
    def W_E(self) -> Float[Tensor, "vocab d_model"]:
        return self.embed.weight

    @property
    def W_U(self) -> Float[Tensor, "d_model vocab"]:
        return self.unembed.weight.T

    @property
    def b_U(self) -> Float[Tensor, "vocab"]:
        return self.unembed.bias

    # TransformerLens's stacked weights: [n_layers, ...], heads split as in HookedTransformer. Copies, not views of
    # the parameters: the attention and MLP weights live in nn.Linear modules (checkpoint keys stay as they are).
    def _attention(self, what: str) -> list[CausalAttention]:
        if not self.cfg.has_attention:
            raise ProbeError(f"{what}: an {self.cfg.family} model has no attention")
        return [b.attn for b in self.blocks]

    def _split_in(self, name: str) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        h, dh, d = self.cfg.n_heads, self.cfg.d_head, self.cfg.d_model
        return torch.stack([getattr(a, name).weight.view(h, dh, d).transpose(1, 2) for a in self._attention(name)])

    def _split_bias(self, name: str) -> Float[Tensor, "n_layers n_heads d_head"]:
        h, dh = self.cfg.n_heads, self.cfg.d_head
        return torch.stack([getattr(a, name).bias.view(h, dh) for a in self._attention(name.replace("W", "b"))])

    @property
    def W_Q(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._split_in("W_Q")

    @property
    def W_K(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._split_in("W_K")

    @property
    def W_V(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._split_in("W_V")

    @property
    def W_O(self) -> Float[Tensor, "n_layers n_heads d_head d_model"]:
        h, dh, d = self.cfg.n_heads, self.cfg.d_head, self.cfg.d_model
        return torch.stack([a.W_O.weight.view(d, h, dh).permute(1, 2, 0) for a in self._attention("W_O")])

    @property
    def b_Q(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        return self._split_bias("W_Q")

    @property
    def b_K(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        return self._split_bias("W_K")

    @property
    def b_V(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        return self._split_bias("W_V")

    @property
    def b_O(self) -> Float[Tensor, "n_layers d_model"]:
        """Attention's output bias, before the gate (the stream gets ``attn_gate * b_O``)."""
        return torch.stack([a.W_O.bias for a in self._attention("b_O")])

    @property
    def QK(self) -> FactoredMatrix:
        """Each head's ``W_Q W_K^T`` (d_model x d_model), as a ``FactoredMatrix``; with rope the scores also depend
        on the relative position, which this leaves out (as TransformerLens does)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """Each head's ``W_V W_O`` (d_model x d_model), as a ``FactoredMatrix``, before the attention gate."""
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def W_in(self) -> Float[Tensor, "n_layers d_model d_mlp"]:
        return torch.stack([b.mlp.W_in.weight.T for b in self.blocks])

    @property
    def b_in(self) -> Float[Tensor, "n_layers d_mlp"]:
        return torch.stack([b.mlp.W_in.bias for b in self.blocks])

    @property
    def W_out(self) -> Float[Tensor, "n_layers d_mlp d_model"]:
        return torch.stack([b.mlp.W_out.weight.T for b in self.blocks])

    @property
    def b_out(self) -> Float[Tensor, "n_layers d_model"]:
        return torch.stack([b.mlp.W_out.bias for b in self.blocks])

    def accumulated_bias(self, layer: int, mlp_input: bool = False,
                         include_mlp_biases: bool = True) -> Float[Tensor, "d_model"]:
        """What the biases of blocks before ``layer`` add to the stream (each attention's ``attn_gate * b_O`` and,
        with ``include_mlp_biases``, each MLP's ``b_out``); with ``mlp_input``, block ``layer``'s attention bias too.
        The recurrent cell's biases act inside its recurrence, so its whole output is one component instead."""
        total = torch.zeros(self.cfg.d_model, device=self.embed.weight.device)
        blocks = list(self.blocks[:layer])
        for block in blocks + ([self.blocks[layer]] if mlp_input else []):
            if hasattr(block, "attn"):
                total = total + block.attn_gate * block.attn.W_O.bias
        if include_mlp_biases:
            for block in blocks:
                total = total + block.mlp.W_out.bias
        return total

    def tokens_to_residual_directions(self, tokens: int | str | Int[Tensor, "..."]) -> Float[Tensor, "... d_model"]:
        """The direction in the final residual stream (after centring and dividing by ``ln_final``'s scale) that
        gives each token's logit: its unembedding row times ``ln_final.weight``. Folding the LN weight in makes
        ``cache.logit_attrs`` exact for these models, whose LayerNorms are not folded: the attributions of
        ``decompose_resid(apply_ln=True)`` sum to the logit minus a constant (``b_U`` and ``ln_final.bias``'s
        share)."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        index = torch.as_tensor(tokens, device=self.unembed.weight.device)
        return self.unembed.weight[index] * self.ln_final.weight

    def _task(self, task: TaskConfig | None) -> TaskConfig:
        task = task or self.task
        if task is None:
            raise ProbeError("token names come from the task's vocabulary: pass task= or set model.task")
        if task.vocab_size != self.cfg.vocab_size:
            raise ProbeError(f"task {task.name} has {task.vocab_size} tokens, the model {self.cfg.vocab_size}")
        return task

    def to_str_tokens(self, tokens: str | Int[Tensor, "pos"] | Int[Tensor, "batch pos"],
                      task: TaskConfig | None = None) -> list[str] | list[list[str]]:
        """Readable names of tokens (``3`` number, ``k5`` key, ``v2`` value, ``|`` SEP), as
        ``probe.viz.token_labels``; a batch gives one list per sequence, a string (``"k1 v2 | 3 4"``) its names."""
        task = self._task(task)
        if isinstance(tokens, str):
            tokens = self.to_tokens(tokens, task)[0]
        tokens = torch.as_tensor(tokens)
        if tokens.dim() == 2:
            return [token_labels(task, row) for row in tokens]
        return token_labels(task, tokens.reshape(-1))

    def to_single_token(self, label: str, task: TaskConfig | None = None) -> int:
        """The token id of one name from ``to_str_tokens`` (``"k5"`` -> the fifth key)."""
        task = self._task(task)
        names = self.to_str_tokens(torch.arange(task.vocab_size), task)
        if label not in names:
            raise ProbeError(f"no token named {label!r}; names are numbers 0..{task.m - 1}, k0.., v0.. and |")
        return names.index(label)

    def to_tokens(self, text: str | Sequence[str], task: TaskConfig | None = None) -> Int[Tensor, "batch pos"]:
        """Token ids of whitespace-separated names (``"k1 v2 | 3 4"``), on the model's device: ``(1, pos)`` for a
        string, ``(batch, pos)`` for a list of strings of one length. The task vocabulary has no BOS token, so
        nothing is prepended."""
        task = self._task(task)
        texts = [text] if isinstance(text, str) else list(text)
        rows = [[self.to_single_token(name, task) for name in t.split()] for t in texts]
        if not rows or any(len(r) != len(rows[0]) for r in rows) or not rows[0]:
            raise ProbeError(f"to_tokens needs non-empty strings of one length, got lengths {[len(r) for r in rows]}")
        return torch.tensor(rows, dtype=torch.long, device=self.embed.weight.device)

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

    @contextlib.contextmanager
    def attention_detached(self, blocks: Sequence[int] | None = None) -> Iterator[None]:
        """Within the block the stream entering the attention of ``blocks`` (None: every block) is detached (what a
        schedule's gradient cut acts through); restored on exit."""
        chosen = [b for i, b in enumerate(self.blocks) if hasattr(b, "attn") and (blocks is None or i in blocks)]
        for b in chosen:
            b.attn_stopgrad = True
        try:
            yield
        finally:
            for b in chosen:
                b.attn_stopgrad = False

    def recurrent_parameters(self, block: int | None = None) -> list[nn.Parameter]:
        """Parameters of the recurrent sublayers (any cell, and their pre-LN): what ``freeze_recurrent_after_switch``
        holds fixed; with ``block``, that block's only (none if it has no recurrent sublayer)."""
        blocks = self.blocks if block is None else [self.blocks[block]]
        return [p for b in blocks if hasattr(b, "lstm") for m in (b.lstm, b.ln_lstm) for p in m.parameters()]

    @property
    def lstm_layers(self) -> list[HookedRecurrent]:
        """Every block's recurrent sublayer (an ``HookedLSTM``, ``HookedGRU`` or ``HookedSSM``, as ``cfg.rnn``
        says)."""
        return [b.lstm for b in self.blocks if hasattr(b, "lstm")]

    def sublayer_outputs(self) -> dict[str, Sublayer]:
        """Each sublayer output that joins the stream, in forward order: ``blocks.{i}.hook_lstm_out`` (recurrent, any
        cell) and ``blocks.{i}.hook_attn_out`` (attention, after the gate), each ``[batch, pos, d_model]``. What
        path patching holds and component ablation zeroes (``WrappedModel.sublayer_outputs`` for a wrapped model)."""
        out = {}
        for i, b in enumerate(self.blocks):
            if hasattr(b, "lstm"):
                out[f"blocks.{i}.hook_lstm_out"] = Sublayer("recurrent", 0)
            if hasattr(b, "attn"):
                out[f"blocks.{i}.hook_attn_out"] = Sublayer("attn", 0)
        return out

    def set_fp32_recurrence(self, value: bool) -> None:
        """Run every recurrent sublayer with autocast off and its input in float32 (True), or as the rest (False):
        for CPUs whose fused recurrent kernel has no bf16 version under ``torch.autocast``."""
        for layer in self.lstm_layers:
            layer.fp32_recurrence = bool(value)
