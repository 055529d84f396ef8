"""Files written whole or not at all: a temporary file beside the target, renamed over it once complete."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends, removed if it fails
    or is interrupted, so that ``path`` is always the old file or the new one, never a torn one. Its name ends in
    ``.tmp``: pass the format explicitly to writers that infer it from the suffix (``savefig(format="png")``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: no half-written file is left beside the target
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    """``Path(path).write_text(text)``, whole or not at all."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)
