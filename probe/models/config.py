"""The model config: one dataclass that describes and builds any of the three families."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from probe.errors import ProbeError

FAMILIES = ("lstm", "transformer", "hybrid")
POS_ENCODINGS = ("none", "learned", "sinusoidal", "rope")


@dataclass(frozen=True)
class ModelConfig:
    """Size and kind of a model. ``max_len`` bounds positions only for ``learned`` encodings (a table)."""

    family: str = "hybrid"
    vocab_size: int = 43
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_mlp: int | None = None
    max_len: int = 512
    pos_encoding: str = "none"

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ProbeError(f"unknown model family {self.family!r}; choose one of {', '.join(FAMILIES)}")
        if self.pos_encoding not in POS_ENCODINGS:
            raise ProbeError(f"unknown pos_encoding {self.pos_encoding!r}; choose one of {', '.join(POS_ENCODINGS)}")
        if self.d_model < 1 or self.n_layers < 1 or self.vocab_size < 2:
            raise ProbeError("d_model and n_layers must be positive and vocab_size at least 2")
        if self.has_attention and self.d_model % self.n_heads:
            raise ProbeError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.pos_encoding == "rope" and (self.d_model // self.n_heads) % 2:
            raise ProbeError("rope needs an even head dimension (d_model / n_heads)")

    @property
    def has_lstm(self) -> bool:
        return self.family in ("lstm", "hybrid")

    @property
    def has_attention(self) -> bool:
        return self.family in ("transformer", "hybrid")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def mlp_dim(self) -> int:
        return self.d_mlp if self.d_mlp is not None else 4 * self.d_model

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
