"""Progress on stderr: a bar over a long loop, or one line, never under ``--json``."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def progress_iter(items: Iterable[T], desc: str, enabled: bool, total: int | None = None) -> Iterable[T]:
    """``items`` with a tqdm bar on stderr when ``enabled``."""
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False, file=sys.stderr, total=total)


def note(text: str, enabled: bool = True) -> None:
    """One line on stderr (the phase that starts now), so that a long quiet phase says what it is doing."""
    if enabled:
        print(text, file=sys.stderr, flush=True)
