"""Progress on stderr: a bar over a long loop, or one line, never under ``--json``. Every progress bar in probe
comes from here (tqdm, written to stderr), so that ``--json``, ``--quiet`` and ``--no-progress`` silence them all."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def progress_iter(items: Iterable[T], desc: str, enabled: bool, total: int | None = None) -> Iterable[T]:
    """``items`` with a tqdm bar on stderr when ``enabled``."""
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False, file=sys.stderr, total=total)


class _Silent:
    """A bar that draws nothing; ``write`` still prints its line (as tqdm's does when disabled)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def write(self, text: str, file: Any = None) -> None:
        print(text, file=file or sys.stderr)

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, enabled: bool, initial: int = 0, unit: str = "it", leave: bool = True,
                 unit_scale: bool = False) -> Any:
    """A bar of ``total`` steps on stderr that the caller advances (``update``, ``set_postfix_str``, ``write``,
    ``close``): for loops whose steps arrive out of order or carry live numbers (runs of a sweep, training steps),
    or whose steps differ in cost (advance by each step's work, so that the time left is estimated from the work
    left; ``unit_scale`` shows large counts as 1.2M). When not ``enabled``, an object with the same methods that
    draws nothing."""
    if not enabled:
        return _Silent()
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=leave, file=sys.stderr, dynamic_ncols=True,
                unit_scale=unit_scale)


def note(text: str, enabled: bool = True) -> None:
    """One line on stderr (the phase that starts now), so that a long quiet phase says what it is doing."""
    if enabled:
        print(text, file=sys.stderr, flush=True)
