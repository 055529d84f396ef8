"""Run a sweep: skip finished runs, hand the others to an executor, show one progress bar over runs."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from probe.checkpoint import load_checkpoint
from probe.core import interrupts
from probe.core.files import write_text_atomically
from probe.core.lock import folder_lock
from probe.core.package import __version__
from probe.core.progress import progress_bar
from probe.errors import ProbeError
from probe.results.config import SWEEP_FILE, Run, SweepConfig
from probe.sweep.executors import Executor
from probe.sweep.worker import LOG, RunOptions, RunResult, WorkerFn, check_final, execute_run, run_state


@dataclass
class SweepOutcome:
    """Every run's result, in the config's order; wall time of the sweep and of the executor's start-up."""

    results: list[RunResult]
    wall_s: float
    startup_s: float = 0.0
    executor: str = "local"
    failed: list[RunResult] = field(init=False)

    def __post_init__(self) -> None:
        self.failed = [r for r in self.results if not r.ok]


def write_sweep_file(cfg: SweepConfig, out: Path) -> Path:
    """Write ``DIR/sweep.json`` (the config this sweep ran, for ``--report``)."""
    out.mkdir(parents=True, exist_ok=True)
    # never a torn sweep.json, which --report and every rerun read
    return write_text_atomically(out / SWEEP_FILE, json.dumps({"probe_version": __version__, "config": cfg.to_dict()},
                                                              separators=(",", ":")))


def plan(cfg: SweepConfig, out: str | Path) -> list[tuple[Run, str]]:
    """Every run with its state: finished, trained (to evaluate), interrupted (to resume) or new."""
    return [(run, run_state(run)) for run in cfg.runs(out)]


def run_sweep(cfg: SweepConfig, out: str | Path, executor: Executor, opts: RunOptions | None = None,
              progress: bool = True, worker: WorkerFn = execute_run) -> SweepOutcome:
    """Run every unfinished run of ``cfg`` in ``out/VARIANT/seedS`` on ``executor``; never raises for a run's own
    failure (see ``SweepOutcome.failed``). ``worker`` is what each run executes (tests wrap it to kill workers).

    The sweep holds ``out``'s lock throughout: a second sweep on the same folder is refused (``FolderLocked``) before
    it writes anything. Interrupted (``KeyboardInterrupt``; SIGINT and SIGTERM where the caller handles them with
    ``probe.core.interrupts``), every run in flight stops with its last.pt written and ``Interrupted`` says, in one
    line, what every run keeps."""
    opts = opts or RunOptions()
    out = Path(out)
    with folder_lock(out, "sweep"):
        try:
            return _run_sweep(cfg, out, executor, opts, progress, worker)
        except KeyboardInterrupt:
            raise interrupts.stopped(kept(cfg, out)) from None


def _run_sweep(cfg: SweepConfig, out: Path, executor: Executor, opts: RunOptions, progress: bool,
               worker: WorkerFn) -> SweepOutcome:
    t0 = time.perf_counter()
    write_sweep_file(cfg, out)
    results: dict[str, RunResult] = {}
    todo: list[Run] = []
    runs = cfg.runs(out)
    for run in runs:
        if run_state(run) != "finished":
            todo.append(run)
            continue
        try:
            check_final(run, opts.device)
            results[run.key] = RunResult(run.key, "skipped", run.out / LOG)
        except ProbeError as e:
            results[run.key] = RunResult(run.key, "failed", run.out / LOG, error=str(e))
    bar = progress_bar(len(runs), cfg.name, progress, initial=len(results), unit="run")
    failed = sum(not r.ok for r in results.values())
    for result in results.values():
        if not result.ok:
            bar.write(f"FAILED {result.key}: {result.error}", file=sys.stderr)
    ended = None
    try:
        if todo:
            executor.start()
            bar.set_postfix_str(f"running {min(executor.parallelism, len(todo))}, failed {failed}")
            ended = executor.map(worker, todo, opts)
            for n_done, (run, result) in enumerate(ended, start=1):
                results[run.key] = result
                failed += not result.ok
                if not result.ok:
                    bar.write(f"FAILED {run.key}: {result.error} (log: {result.log})", file=sys.stderr)
                bar.update(1)
                bar.set_postfix_str(f"running {min(executor.parallelism, len(todo) - n_done)}, failed {failed}")
    finally:
        if ended is not None:
            ended.close()  # now, not when the traceback is freed: an interrupted executor stops its workers here
        bar.close()
        executor.close()
    return SweepOutcome([results[run.key] for run in runs], time.perf_counter() - t0, executor.startup_s,
                        executor.name)


def kept(cfg: SweepConfig, out: str | Path, shown: int = 4) -> str:
    """What the runs of ``cfg`` in ``out`` keep, in words: finished, trained (final.pt, to evaluate), stopped with
    last.pt (the step of the first ``shown``), not started."""
    by_state: dict[str, list[Run]] = {}
    for run, state in plan(cfg, out):
        by_state.setdefault(state, []).append(run)
    parts = []
    if by_state.get("finished"):
        parts.append(f"{len(by_state['finished'])} finished")
    if by_state.get("trained"):
        parts.append(f"{len(by_state['trained'])} trained and not yet evaluated")
    if by_state.get("interrupted"):
        stopped = by_state["interrupted"]
        steps = ", ".join(f"{r.key} at step {_step(r.out / 'last.pt')}" for r in stopped[:shown])
        parts.append(f"{len(stopped)} with last.pt ({steps}{', ...' if len(stopped) > shown else ''})")
    if by_state.get("new"):
        parts.append(f"{len(by_state['new'])} not started")
    return f"of {sum(map(len, by_state.values()))} runs in {out}, " + ", ".join(parts)


def _step(last: Path) -> str:
    try:
        return str(load_checkpoint(last).step)
    except ProbeError as e:
        return f"? ({e})"
