"""Where runs execute: a local process pool, or Ray tasks on a local instance or a cluster.

Both take a worker function ``fn(run, opts) -> RunResult`` (``execute_run``, or a wrapper in tests) and yield
``(run, result)`` as runs end, in any order. A worker that dies (SIGKILL, out of memory) costs its run one retry;
the retried run resumes from its last.pt, so it ends as if it had not been interrupted.

Interrupted (SIGINT or SIGTERM in the caller, which raises ``KeyboardInterrupt`` there), an executor tells every run
in flight to stop, waits up to ``GRACE_S`` for each to write its last.pt at its next step boundary, kills what is
left, and re-raises: no worker outlives the sweep, and a rerun resumes every run.
"""

from __future__ import annotations

import builtins
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Protocol

from probe.core import interrupts
from probe.core.extras import require
from probe.errors import ProbeError
from probe.results.config import Run
from probe.sweep.worker import LOG, RunOptions, RunResult, WorkerFn

GRACE_S = 60.0
"""How long an interrupted sweep waits for its runs to stop at a step boundary (a step, then writing last.pt)
before it kills them; a second SIGINT or SIGTERM kills them at once."""


def default_jobs() -> int:
    """Cores this process may use (affinity and container limits included where the OS says)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Executor(Protocol):
    name: str
    parallelism: int
    startup_s: float

    def start(self) -> None: ...
    def map(self, fn: WorkerFn, runs: list[Run], opts: RunOptions) -> Iterator[tuple[Run, RunResult]]: ...
    def close(self) -> None: ...


def _died(run: Run, attempts: int, why: str) -> RunResult:
    return RunResult(run.key, "failed", run.out / LOG,
                     error=f"worker died {attempts} time(s) ({why}); rerun the sweep to resume it from last.pt")


def _context() -> multiprocessing.context.BaseContext:
    """Fresh worker processes, never forks of the caller (whose threads or CUDA context a fork would copy): forked
    from a server that imported torch and probe once per session where the platform has one, else spawned."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # A pool then starts in milliseconds, not seconds. torch._dynamo is what the first AdamW of a process imports
    # (about 5 s of CPU), paid once here rather than once per worker.
    # probe.sweep._forkserver makes the server ignore SIGTERM to the whole group, which would break the pool
    context.set_forkserver_preload(["probe.sweep._forkserver", "probe.sweep.worker", "torch._dynamo"])
    return context


class LocalExecutor:
    """A process pool of ``jobs`` workers (see ``_context``), at most ``jobs`` runs in flight.

    Keeping no more runs in flight than workers means every submitted run is running: when a worker dies, the
    pool is broken and Python kills its other workers, so every run in flight at that moment is resubmitted to a
    fresh pool (resuming from last.pt); a run in flight at more than ``retries`` such breaks is reported failed.
    """

    name = "local"

    def __init__(self, jobs: int | None = None, retries: int = 3) -> None:
        self.parallelism = jobs or default_jobs()
        if self.parallelism < 1:
            raise ProbeError(f"--jobs {jobs}: need at least one worker")
        self.retries = retries
        self.startup_s = 0.0

    def start(self) -> None:
        pass  # workers start with the first runs; their start-up is part of those runs' wall time

    def close(self) -> None:
        pass

    def map(self, fn: WorkerFn, runs: list[Run], opts: RunOptions) -> Iterator[tuple[Run, RunResult]]:
        todo, attempts = deque(runs), Counter[str]()
        context = _context()
        while todo:
            # workers only record SIGINT and SIGTERM: Ctrl-C reaches the whole process group, and a worker stopped
            # anywhere (in the pipe back to this process, in a checkpoint write) would hang the pool or lose a step
            pool = ProcessPoolExecutor(self.parallelism, mp_context=context, initializer=interrupts.install_for_worker)
            inflight: dict[Future[RunResult], Run] = {}
            broken: list[Run] = []
            clean = False
            try:
                while inflight or (todo and not broken):
                    while todo and not broken and len(inflight) < self.parallelism:
                        run = todo.popleft()
                        inflight[pool.submit(fn, run, opts)] = run
                    done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                    for future in done:
                        run = inflight.pop(future)
                        try:
                            result = future.result()
                        except BrokenProcessPool:
                            broken.append(run)
                            continue
                        except Exception as e:  # fn raised, or its result did not pickle: this run's failure
                            result = RunResult(run.key, "failed", run.out / LOG, error=f"{type(e).__name__}: {e}")
                        yield run, result
                clean = True
            except BaseException:  # interrupted, closed early (GeneratorExit) or a bug here: no worker outlives it
                _stop_pool(pool, inflight)
                raise
            finally:
                pool.shutdown(wait=clean, cancel_futures=True)
            for run in reversed(broken):
                attempts[run.key] += 1
                if attempts[run.key] > self.retries:
                    yield run, _died(run, attempts[run.key], "its process pool broke: a worker was killed")
                else:
                    todo.appendleft(run)


def _stop_pool(pool: ProcessPoolExecutor, inflight: dict[Future[RunResult], Run]) -> None:
    """Tell every worker to stop (SIGTERM: its run writes last.pt at its next step boundary and returns), wait up to
    ``GRACE_S`` for the runs in flight, then kill the workers left and reap them."""
    # The pool has no public list of its processes; _processes (pid -> Process) has been there since Python 3.2.
    # Signals go by pid: a Process learns of its end from the fork server, which may be gone.
    pids = list(getattr(pool, "_processes", {}))
    _wait_for(lambda timeout: not wait(inflight, timeout=timeout).not_done, lambda: _signal(pids, signal.SIGTERM))
    _signal([pid for pid in pids if _alive(pid)], signal.SIGKILL)  # idle now, or past the grace period
    pool.shutdown(wait=True, cancel_futures=True)


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    """Running (a zombie, ended but not yet reaped by its parent, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _wait_for(done: Callable[[float], bool], tell: Callable[[], object]) -> None:
    """``tell()`` the workers to stop, then poll ``done(timeout)`` until it is true, ``GRACE_S`` have passed or a
    further signal arrives (which is recorded, not raised: this wait must end in the kill that follows it)."""
    with interrupts.deferred(escalate=False):
        tell()
        asked, deadline = interrupts.count(), time.monotonic() + GRACE_S
        while interrupts.count() == asked and time.monotonic() < deadline:
            if done(0.1):
                return


def _call(fn: WorkerFn, run: Run, opts: RunOptions, stop: str | None = None) -> RunResult:
    # a Ray worker runs task after task: each starts with no stop asked, and Ray's own handlers come back after it
    with interrupts.handling(escalate=False, defer=True), _stopped_by(stop):
        return fn(run, opts)


@contextlib.contextmanager
def _stopped_by(path: str | None) -> Iterator[None]:
    """While a Ray task runs, the file ``path`` appearing asks it to stop: a SIGTERM to its own process, as the local
    pool's workers get from their parent. Not ray.cancel: interrupting a running task races its completion inside
    Ray (a core-worker check fails and the driver aborts), and a file in the sweep's folder, which every node of a
    cluster sees, reaches a task on any node."""
    if path is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            if os.path.exists(path):
                os.kill(os.getpid(), signal.SIGTERM)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


class RayExecutor:
    """One Ray task per run (``num_cpus=1``, plus ``num_gpus=gpus_per_run`` on CUDA), retried by Ray up to
    ``retries`` times if its worker dies. Without ``address``, a local Ray instance with ``jobs`` CPUs; with one,
    an existing cluster whose nodes see the same probe install and the sweep's output directory."""

    name = "ray"

    def __init__(self, jobs: int | None = None, address: str | None = None, retries: int = 3,
                 gpus_per_run: float = 0.0) -> None:
        self.jobs, self.address, self.retries = jobs or default_jobs(), address, retries
        self.gpus_per_run = gpus_per_run
        self.parallelism, self.startup_s, self._owned = self.jobs, 0.0, False
        self._print = builtins.print  # Ray's tqdm support replaces it in this process; close() puts it back
        require("ray")

    def start(self) -> None:
        import ray

        t0 = time.perf_counter()
        if not ray.is_initialized():  # a caller (a notebook, the tests) may have started Ray already
            kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
            if self.address:
                try:
                    ray.init(address=self.address, **kwargs)
                except (ConnectionError, RuntimeError, ValueError) as e:
                    why = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
                    raise ProbeError(f"--address {self.address}: no Ray cluster there ({why}); "
                                     "is `ray start --head` running?") from None
            else:  # "local": never attach to some other `ray start` cluster that happens to run on this machine
                ray.init(address="local", num_cpus=self.jobs, **kwargs)
            self._owned = True
        self.startup_s = time.perf_counter() - t0
        resources = ray.cluster_resources()
        slots = int(resources.get("CPU", 1))
        if self.gpus_per_run:
            gpus = resources.get("GPU", 0)
            if gpus < self.gpus_per_run:
                raise ProbeError(f"--device cuda: the Ray cluster has {gpus:g} GPUs, a run needs {self.gpus_per_run:g}")
            slots = min(slots, int(gpus / self.gpus_per_run))
        self.parallelism = max(1, slots)

    def close(self) -> None:
        import ray

        if self._owned:
            ray.shutdown()
            self._owned = False
            builtins.print = self._print  # a notebook that ran a sweep keeps its own print afterwards

    def map(self, fn: WorkerFn, runs: list[Run], opts: RunOptions) -> Iterator[tuple[Run, RunResult]]:
        import ray

        options: dict[str, Any] = dict(num_cpus=1, max_retries=self.retries)
        if self.gpus_per_run:
            options["num_gpus"] = self.gpus_per_run
        task = ray.remote(_call).options(**options)
        # the sweep's folder, shared by every node: where an interrupted driver asks its tasks to stop
        stop = Path(os.path.commonpath([run.out.parent for run in runs])) / f".stop-{os.getpid()}-{time.time_ns()}"
        pending = {task.remote(fn, run, opts, str(stop)): run for run in runs}
        clean = False
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    run = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except (ray.exceptions.WorkerCrashedError, ray.exceptions.OutOfMemoryError,
                            ray.exceptions.NodeDiedError) as e:  # more deaths than max_retries allows
                        result = _died(run, self.retries + 1, f"Ray: {type(e).__name__}")
                    except ray.exceptions.RayError as e:  # e.g. probe not importable on a cluster's node
                        error = f"Ray could not run it: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1]}"
                        result = RunResult(run.key, "failed", run.out / LOG, error=error)
                    yield run, result
            clean = True
        finally:
            if not clean and pending:  # interrupted (or failed): stop the rest; they resume from last.pt next time
                refs = list(pending)
                _wait_for(lambda timeout: not ray.wait(refs, num_returns=len(refs), timeout=timeout)[1], stop.touch)
                for ref in ray.wait(refs, num_returns=len(refs), timeout=0)[1]:  # past the grace period, or queued
                    ray.cancel(ref, force=True)
            stop.unlink(missing_ok=True)


def make_executor(name: str, jobs: int | None = None, address: str | None = None, retries: int = 3,
                  gpus_per_run: float = 0.0) -> Executor:
    if name == "local":
        if address:
            raise ProbeError("--address is for --executor ray; the local executor runs on this machine")
        return LocalExecutor(jobs, retries)
    if name == "ray":
        return RayExecutor(jobs, address, retries, gpus_per_run)
    raise ProbeError(f"unknown executor {name!r}: use local or ray")
