"""Stopping on SIGINT or SIGTERM without losing work: loops that know their safe points stop at the next one."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A stop asked by SIGINT or SIGTERM. A KeyboardInterrupt, so that code which cleans up on Ctrl-C cleans up on it
    too; its message, where it has one, says what was kept."""


@dataclass
class _State:
    requests: int = 0  # signals received while handling
    signal: str | None = None  # the first one's name
    escalate: bool = True  # each signal after the first raises at once, even where the first was deferred
    raised: bool = False  # the request has been raised once (a worker raises it once only)
    modes: list[bool] = field(default_factory=list)  # True: defer (the code checks requested()), False: raise at once


_state = _State()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _state.requests += 1
    _state.signal = _state.signal or signal.Signals(signum).name
    if _state.escalate and _state.requests > 1:
        _state.raised = True
        raise Interrupted()
    _raise_if_due()


def _raise_if_due() -> None:
    deferring = _state.modes[-1] if _state.modes else False
    if _state.signal and not deferring and not _state.raised:
        _state.raised = True
        raise Interrupted()


def requested() -> str | None:
    """The name of the signal that asked to stop (SIGINT, SIGTERM), or None."""
    return _state.signal


def count() -> int:
    """Signals received since handling began (a second one means: stop now)."""
    return _state.requests


def stopped(kept: str) -> Interrupted:
    """The exception a loop raises when it has stopped at a safe point; ``kept`` says what it saved."""
    _state.raised = True
    return Interrupted(kept)


@contextlib.contextmanager
def handling(escalate: bool = True, defer: bool = False) -> Iterator[None]:
    """Within: SIGINT and SIGTERM ask to stop. Where nothing defers (``deferred``), the request raises
    ``Interrupted`` at once; with ``escalate``, every further signal raises at once wherever it lands (a user who
    presses Ctrl-C twice). Handlers are installed in the main thread only and restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _state
    saved, old = _state, {s: signal.getsignal(s) for s in SIGNALS}
    _state = _State(escalate=escalate, modes=[defer])
    for s in SIGNALS:
        signal.signal(s, _on_signal)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _state = saved


def install_for_worker() -> None:
    """For the life of a worker process of a sweep: a signal only records the request (the parent's SIGTERM and the
    terminal's SIGINT to the whole group arrive both, and mean one stop); a run in progress stops at its next safe
    point, and one that has not started does not start."""
    global _state
    _state = _State(escalate=False, modes=[True])
    for s in SIGNALS:
        signal.signal(s, _on_signal)


@contextlib.contextmanager
def deferred(escalate: bool | None = None) -> Iterator[None]:
    """Within: a request is only recorded; the code checks ``requested()`` where stopping loses nothing. On a
    normal exit into code that does not defer, a pending request is raised. ``escalate`` overrides whether a
    further signal raises at once (a parent waiting for its workers does not want to be cut short)."""
    before = _state.escalate
    _state.modes.append(True)
    if escalate is not None:
        _state.escalate = escalate
    try:
        yield
    finally:
        _state.modes.pop()
        _state.escalate = before
    _raise_if_due()


@contextlib.contextmanager
def raising() -> Iterator[None]:
    """Within: a request raises at once (a pending one on entry): code with no safe point of its own, whose work is
    redone on the next run, such as an evaluation that writes its file last and atomically."""
    _state.modes.append(False)
    try:
        _raise_if_due()
        yield
    finally:
        _state.modes.pop()
