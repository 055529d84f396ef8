"""One writer per folder: ``FOLDER/.lock``, held while a trainer, an evaluator or a sweep writes there."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from probe.errors import ProbeError

try:
    import fcntl
except ImportError:  # not a POSIX system: the lock file alone (_acquire_without_flock)
    fcntl = None  # type: ignore[assignment]

LOCK = ".lock"

# Why not the `filelock` package (torch installs it): it truncates the lock file when it opens it, before it tries
# the lock, so a refused second writer would erase the record of the owner it has to name; and it records no owner.
# The lock itself is the kernel's (flock): it is released when its owner dies, however it dies, so a lock left by a
# killed process is free at once and a reused pid can never keep a folder locked. The file only says who holds it.
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class FolderLocked(ProbeError):
    """Another live process writes this folder."""


@dataclass(frozen=True)
class Owner:
    """Who holds (or held) a folder's lock: process id, host, what it does, and since when (seconds since epoch)."""

    pid: int
    host: str
    what: str
    since: float

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} ({self.what}, since {when})"

    def alive(self) -> bool:
        """Only a process on this host can be asked; one on another host is taken to be alive."""
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, owned by another user
            return True
        return True


@dataclass
class Held:
    """A lock this process holds; ``took_over`` is the record a previous owner left when it died holding it."""

    path: Path
    took_over: Owner | None = None


# folder -> (pid, depth, the Held): a sweep worker holds its run's lock, and the trainer it calls takes it again
_held: dict[Path, tuple[int, int, Held]] = {}


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, what: str) -> Iterator[Held]:
    """Hold ``folder``'s lock for the duration (the folder is created); a second writer gets ``FolderLocked``,
    one line that names the owner. Re-entrant within one process; released (and the file removed) on exit."""
    folder = Path(folder).resolve()
    pid, depth, held = _held.get(folder, (0, 0, None))
    if held is not None and pid == os.getpid():  # a forked child does not hold its parent's lock
        _held[folder] = (pid, depth + 1, held)
        try:
            yield Held(held.path)  # what was taken over is the outer holder's to say
        finally:
            _held[folder] = (pid, depth, held)
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd, held = _acquire(folder / LOCK, what)
    _held[folder] = (os.getpid(), 1, held)
    try:
        yield held
    finally:
        del _held[folder]
        # remove the file while still holding the lock: a waiter that opened it retries on the new file (_acquire)
        Path(held.path).unlink(missing_ok=True)
        if fd >= 0:
            os.close(fd)


def read_owner(path: Path) -> Owner | None:
    """The record in a lock file, or None (no file, or not written yet)."""
    try:
        raw = json.loads(path.read_text() or "null")
        return Owner(int(raw["pid"]), str(raw["host"]), str(raw["what"]), float(raw["since"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _record(what: str) -> bytes:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "what": what,
                       "since": time.time()}).encode()


def _refuse(path: Path, owner: Owner | None) -> FolderLocked:
    who = owner.describe() if owner else "another process (it is writing its record)"
    return FolderLocked(f"{path.parent} is being written by {who}; wait for it to end or stop it, or choose another "
                        "folder")


def _acquire(path: Path, what: str) -> tuple[int, Held]:
    if fcntl is None:
        return -1, _acquire_without_flock(path, what)
    for _ in range(100):  # each retry means an owner released the lock between our open and our flock
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _refuse(path, read_owner(path)) from None
        except OSError as e:
            os.close(fd)
            if e.errno in _NO_FLOCK:
                return -1, _acquire_without_flock(path, what)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the owner removed this file as it released: lock the file that is there now
            os.close(fd)
            continue
        left = read_owner(path)
        os.ftruncate(fd, 0)
        os.pwrite(fd, _record(what), 0)
        return fd, Held(path, took_over=left)
    raise ProbeError(f"{path}: could not take the lock (it changed hands 100 times)")


def _acquire_without_flock(path: Path, what: str) -> Held:
    """Where the filesystem has no flock (some network filesystems): the file alone, created with O_EXCL; a lock
    whose owner is a dead process of this host is stale and taken over. Two processes taking over the same stale
    lock at the same instant could both succeed: a race flock does not have, accepted where flock is missing."""
    took_over = None
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = read_owner(path)
            if owner is None or owner.alive():
                raise _refuse(path, owner) from None
            path.unlink(missing_ok=True)
            took_over = owner
            continue
        with os.fdopen(fd, "wb") as f:
            f.write(_record(what))
        return Held(path, took_over=took_over)
    raise _refuse(path, read_owner(path))
