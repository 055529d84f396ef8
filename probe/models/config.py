"""The model config: one dataclass that describes and builds any of the three families."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from probe.errors import ProbeError

FAMILIES = ("lstm", "transformer", "hybrid")
POS_ENCODINGS = ("none", "learned", "sinusoidal", "rope")
CELLS = ("lstm", "gru", "ssm")
SSM_RANGES = ("positive", "negative", "complex", "positive-closed", "negative-closed", "complex-closed")
ATTN_SCALES = ("none", "log-length", "ssmax")


@dataclass(frozen=True)
class ModelConfig:
    """Size and kind of a model. ``max_len`` bounds positions only for ``learned`` encodings (a table).

    ``d_mlp`` defaults to 4 x ``d_model``, resolved when the config is made, so that ``cfg.d_mlp`` is the MLP's width
    as TransformerLens reads it (a config saved before this stores None and loads as the same model).

    ``rnn`` is the recurrent sublayer's cell in the ``lstm`` and ``hybrid`` families: ``lstm`` (the default, so a
    config saved before the field existed loads as the model it was), ``gru`` or ``ssm``. The
    SSM's ``ssm_range`` says where its transitions lie (``positive`` (0, 1), ``negative`` (-1, 1), ``complex``; the
    same with the boundary reached exactly: ``positive-closed`` (0, 1], ``negative-closed`` [-1, 1],
    ``complex-closed``; ``probe.models.ssm.RANGES``), and ``ssm_state`` is the number of real numbers in its state per
    layer (default d_model; the complex ranges keep ``ssm_state / 2`` complex channels, so it must be even). The two
    are ignored by the other cells.

    ``attn_scale`` multiplies every attention logit at a query that sees n keys: ``none`` (the default, so a config
    saved before the field existed loads as the model it was), ``log-length`` (by max(1, log n / log n_train), no
    parameter: a checkpoint trained without it can be evaluated with it) or ``ssmax`` (by s_h log n, a learned s per
    head, Scalable-Softmax). n is the number of keys a query sees, n_train that of the last query of the longest
    training sequence (the dictionary prefix + L_train).
    """

    family: str = "hybrid"
    vocab_size: int = 43
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_mlp: int | None = None  # None: 4 x d_model, resolved in __post_init__
    max_len: int = 512
    pos_encoding: str = "none"
    rnn: str = "lstm"
    ssm_state: int | None = None  # None: d_model, resolved in __post_init__ for rnn="ssm"
    ssm_range: str = "positive"
    attn_scale: str = "none"

    def __post_init__(self) -> None:
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)  # frozen: resolving a default, not a change
        if self.family not in FAMILIES:
            raise ProbeError(f"unknown model family {self.family!r}; choose one of {', '.join(FAMILIES)}")
        if self.rnn not in CELLS:
            raise ProbeError(f"unknown recurrent cell rnn={self.rnn!r}; choose one of {', '.join(CELLS)}")
        if self.ssm_range not in SSM_RANGES:
            raise ProbeError(f"unknown ssm_range {self.ssm_range!r}; choose one of {', '.join(SSM_RANGES)}")
        if self.rnn == "ssm":
            if self.ssm_state is None:
                object.__setattr__(self, "ssm_state", self.d_model)  # frozen: resolving a default
            if self.ssm_state < 1 or (self.ssm_range.startswith("complex") and self.ssm_state % 2):
                raise ProbeError(f"ssm_state={self.ssm_state} must be positive, and even for "
                                 f"ssm_range={self.ssm_range} (it counts real numbers: real and imaginary parts)")
        if self.attn_scale not in ATTN_SCALES:
            raise ProbeError(f"unknown attn_scale {self.attn_scale!r}; choose one of {', '.join(ATTN_SCALES)}")
        if self.pos_encoding not in POS_ENCODINGS:
            raise ProbeError(f"unknown pos_encoding {self.pos_encoding!r}; choose one of {', '.join(POS_ENCODINGS)}")
        if self.d_model < 1 or self.n_layers < 1 or self.vocab_size < 2 or self.d_mlp < 1:  # type: ignore[operator]
            raise ProbeError("d_model, d_mlp and n_layers must be positive and vocab_size at least 2")
        if self.has_attention and self.d_model % self.n_heads:
            raise ProbeError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.pos_encoding == "rope" and (self.d_model // self.n_heads) % 2:
            raise ProbeError("rope needs an even head dimension (d_model / n_heads)")

    @property
    def has_lstm(self) -> bool:
        """Whether the blocks have the recurrent sublayer (``blocks.{i}.lstm``, whatever the cell)."""
        return self.family in ("lstm", "hybrid")

    @property
    def has_attention(self) -> bool:
        return self.family in ("transformer", "hybrid")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def mlp_dim(self) -> int:
        """The MLP's width (``d_mlp``; the older name)."""
        return self.d_mlp

    # --- the names TransformerLens's helpers read (``transformer_lens.patching``, ``ActivationCache``) ----------
    # Properties, not fields: a checkpoint's config stays what it was.
    @property
    def device(self) -> torch.device:
        """The device of the model that holds this config (the model records it when it moves); cpu otherwise."""
        return self.__dict__.get("_device", torch.device("cpu"))

    def _record_device(self, device: torch.device) -> None:
        object.__setattr__(self, "_device", torch.device(device))  # frozen: this is bookkeeping, not config

    @property
    def n_ctx(self) -> int:
        return self.max_len

    @property
    def d_vocab(self) -> int:
        return self.vocab_size

    @property
    def d_vocab_out(self) -> int:
        return self.vocab_size

    @property
    def normalization_type(self) -> str:
        return "LN"

    @property
    def final_rms(self) -> bool:
        return False

    @property
    def attn_only(self) -> bool:
        return False

    @property
    def act_fn(self) -> str:
        return "gelu"

    @property
    def n_key_value_heads(self) -> int | None:
        return None

    @property
    def positional_embedding_type(self) -> str:
        return {"learned": "standard", "rope": "rotary"}.get(self.pos_encoding, self.pos_encoding)

    @property
    def default_prepend_bos(self) -> bool:
        return False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise ProbeError(f"model config: unknown field(s) {', '.join(sorted(unknown))}")
        return cls(**d)
