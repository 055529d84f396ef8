"""The model config: one dataclass that describes and builds any of the three families."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise ProbeError(f"model config: unknown field(s) {', '.join(sorted(unknown))}")
        return cls(**d)
