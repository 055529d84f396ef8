"""Where runs execute: a local process pool, or Ray tasks on a local instance or a cluster.

Both take a worker function ``fn(run, opts) -> RunResult`` (``execute_run``, or a wrapper in tests) and yield
``(run, result)`` as runs end, in any order. A worker that dies (SIGKILL, out of memory) costs its run one retry;
the retried run resumes from its last.pt, so it ends as if it had not been interrupted.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from probe.errors import ProbeError
from probe.sweep.config import Run
from probe.sweep.worker import LOG, RunOptions, RunResult, WorkerFn

RAY_INSTALL = 'pip install -e ".[ray]"'


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
    context.set_forkserver_preload(["probe.sweep.worker", "torch._dynamo"])
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
            pool = ProcessPoolExecutor(self.parallelism, mp_context=context)
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
            finally:
                # On an interrupt, do not wait for runs in flight: they resume from last.pt next time.
                pool.shutdown(wait=clean, cancel_futures=True)
            for run in reversed(broken):
                attempts[run.key] += 1
                if attempts[run.key] > self.retries:
                    yield run, _died(run, attempts[run.key], "its process pool broke: a worker was killed")
                else:
                    todo.appendleft(run)


def _call(fn: WorkerFn, run: Run, opts: RunOptions) -> RunResult:
    return fn(run, opts)


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
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ProbeError(f"--executor ray needs Ray, an optional extra: {RAY_INSTALL}") from None

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

    def map(self, fn: WorkerFn, runs: list[Run], opts: RunOptions) -> Iterator[tuple[Run, RunResult]]:
        import ray

        options: dict[str, Any] = dict(num_cpus=1, max_retries=self.retries)
        if self.gpus_per_run:
            options["num_gpus"] = self.gpus_per_run
        task = ray.remote(_call).options(**options)
        pending = {task.remote(fn, run, opts): run for run in runs}
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
        finally:
            for ref in pending:  # interrupted: stop the rest; they resume from last.pt next time
                ray.cancel(ref, force=True)


def make_executor(name: str, jobs: int | None = None, address: str | None = None, retries: int = 3,
                  gpus_per_run: float = 0.0) -> Executor:
    if name == "local":
        if address:
            raise ProbeError("--address is for --executor ray; the local executor runs on this machine")
        return LocalExecutor(jobs, retries)
    if name == "ray":
        return RayExecutor(jobs, address, retries, gpus_per_run)
    raise ProbeError(f"unknown executor {name!r}: use local or ray")
