"""Attention gates as a context manager: set them for a block of code, get the previous ones back on exit (and the
same for any attribute of a few objects: a stop-gradient flag, a scan switch)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def attention_gates(model: Any, value: float | Sequence[float] | None) -> Iterator[None]:
    """Within the block the model's attention gates are ``value`` (one for all, or one per attention block; None
    leaves them as they are); the previous gates come back on exit, also on an exception. A gate left at 0 would
    silently turn every later analysis of the same model into the LSTM-only model's. A model without attention
    (no gates) is left alone."""
    before = list(model.attention_gates())
    if value is not None and before:
        model.set_attention_gate(value)
    try:
        yield
    finally:
        if before:
            model.set_attention_gate(before)


@contextlib.contextmanager
def attribute_set(objects: Sequence[Any], name: str, value: Any) -> Iterator[None]:
    """Within the block every object's ``name`` is ``value``; each object's previous value comes back on exit, also
    on an exception."""
    before = [getattr(o, name) for o in objects]
    for o in objects:
        setattr(o, name, value)
    try:
        yield
    finally:
        for o, v in zip(objects, before, strict=True):
            setattr(o, name, v)
