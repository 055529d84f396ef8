"""Imported by the local executor's fork server alone (its preload): the server then ignores SIGTERM, as it already
ignores SIGINT.

A stop sent to the whole process group (a terminal's Ctrl-C, a scheduler's SIGTERM) must reach the sweep and its
workers, which stop in order, and not kill the server: the pool reads the server's death as the death of every worker
and breaks, while the workers go on training unseen. The server still ends when the sweep does (it reads its end of a
pipe to the sweep), and the workers it forks set their own handlers (``interrupts.install_for_worker``)."""

from __future__ import annotations

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
