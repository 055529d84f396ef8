"""One run inside a worker process: train or resume it with ``probe.train``, then evaluate its final.pt."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from probe.checkpoint import load_checkpoint
from probe.core import interrupts
from probe.core.files import write_text_atomically
from probe.core.lock import FolderLocked, Held, folder_lock
from probe.errors import ProbeError
from probe.evaluate import evaluate_checkpoints, evaluate_windows, evaluation_envelope
from probe.hardware import precision_used
from probe.results.config import Run, eval_lengths_for
from probe.training.config import TrainConfig
from probe.training.overrides import build_configs
from probe.training.trainer import train

LOG, EVAL = "train.log", "eval.json"


@dataclass(frozen=True)
class RunOptions:
    """What every run of a sweep shares. ``eval_samples``: sequences per length of the final evaluation;
    ``eval_lengths``: its lengths (``probe.results.config.eval_lengths_for``; None: ``DEFAULT_LENGTHS``, to 16x);
    ``eval_factors``: also the state answers' accuracy modulo each factor of the modulus (``probe.evaluate
    --factors``); ``note``: a line for every run's log (what ``--quick`` reduced)."""

    device: str = "cpu"
    eval_samples: int = 256
    eval_lengths: str | None = None
    eval_factors: bool = False
    note: str | None = None


@dataclass(frozen=True)
class RunResult:
    """How a run ended. ``status``: trained, resumed, evaluated (final.pt was there), skipped, failed, or interrupted
    (asked to stop: ``error`` then says what it kept, if anything)."""

    key: str
    status: str
    log: Path
    wall_s: float = 0.0
    error: str | None = None
    resumed_from: int | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed"


WorkerFn = Callable[[Run, RunOptions], RunResult]


def run_state(run: Run) -> str:
    """``finished`` (final.pt and eval.json), ``trained`` (final.pt only), ``interrupted`` (last.pt) or ``new``."""
    if (run.out / "final.pt").exists():
        return "finished" if (run.out / EVAL).exists() else "trained"
    return "interrupted" if (run.out / "last.pt").exists() else "new"


def check_final(run: Run, device: str = "cpu") -> None:
    """A finished run is only reused if it was trained with this run's configs (as ``--resume`` demands).

    One difference is no difference: ``train.precision=auto`` against a checkpoint from before the trainer kept
    ``auto`` in its config and recorded what it ran as (``extra["precision_used"]``) beside it, which holds the
    resolved ``bf16`` or ``fp32`` instead. That checkpoint is this run's when ``auto`` resolves to the same precision
    on ``device``; on a CPU where it resolves to the other one it is not, and is refused as before. (With Ray on a
    cluster this runs on the driver: a driver whose hardware differs from the training nodes' judges by its own.)"""
    model_cfg, task_cfg, train_cfg = build_configs(run.preset, run.task, list(run.overrides), steps=run.steps,
                                                   seed=run.seed)
    try:
        ckpt = load_checkpoint(run.out / "final.pt")
    except ProbeError as e:  # damaged: never reused, and never trained over without being asked
        raise ProbeError(f"{e}; delete it to train this run again") from None
    recorded = TrainConfig.from_dict(ckpt.train_config)
    if train_cfg.precision == "auto" and recorded.precision != "auto" and "precision_used" not in ckpt.extra \
            and recorded.precision == precision_used("auto", torch.device(device))[0]:
        recorded = dataclasses.replace(recorded, precision="auto")
    if ckpt.model_config != model_cfg or ckpt.task_config != task_cfg or recorded != train_cfg:
        raise ProbeError(f"{run.out / 'final.pt'} was trained with other configs than this sweep's "
                         f"{run.key}; choose another --out or delete that run folder")


def execute_run(run: Run, opts: RunOptions) -> RunResult:
    """Train (resuming from last.pt if there is one), evaluate into eval.json; never raises for the run's own
    failures (they come back as ``status="failed"`` with a one-line error, the traceback in train.log).

    The run holds its folder's lock throughout (another writer is refused, and so is this run if another holds it).
    Asked to stop (``probe.core.interrupts``), training stops at its next step with last.pt written and an evaluation
    stops at once (eval.json is written last, atomically): ``status="interrupted"``."""
    t0 = time.perf_counter()
    log = run.out / LOG
    try:
        # a run that has not started when the stop is asked does not start; nothing is written before the lock
        with interrupts.raising(), folder_lock(run.out, f"sweep run {run.key}") as held:
            return _execute(run, opts, held, t0)
    except FolderLocked as e:
        return RunResult(run.key, "failed", log, time.perf_counter() - t0, str(e))
    except KeyboardInterrupt as e:
        return RunResult(run.key, "interrupted", log, time.perf_counter() - t0, str(e) or None)


def _execute(run: Run, opts: RunOptions, held: Held, t0: float) -> RunResult:
    log = run.out / LOG
    torch.set_num_threads(1)
    with _output_to(log):
        state = run_state(run)
        print(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {run.key} ({state}) pid {os.getpid()} on {opts.device}: "
              f"{run.command(resume=state == 'interrupted')}", flush=True)
        if held.took_over is not None:
            print(f"took over the lock of {held.took_over.describe()}, which ended without releasing it", flush=True)
        phase = "training"
        try:
            resumed_from = None
            if state in ("trained", "finished"):
                check_final(run, opts.device)
                status = "evaluated"
            else:
                if state == "interrupted":
                    resumed_from = _resume_step(run.out / "last.pt")
                    print(f"resuming from step {resumed_from}", flush=True)
                model_cfg, task_cfg, train_cfg = build_configs(
                    run.preset, run.task, list(run.overrides), steps=run.steps, seed=run.seed)
                train(model_cfg, task_cfg, train_cfg, run.out, opts.device, resume=state == "interrupted",
                      progress=False)
                status = "resumed" if state == "interrupted" else "trained"
            phase = "evaluating"
            evaluate_run(run, opts)
        except KeyboardInterrupt as e:
            kept = f"kept {e}" if str(e) else (
                "final.pt kept; it is evaluated on the next run" if phase == "evaluating" else "nothing new kept")
            print(f"=== {run.key}: interrupted while {phase} after {time.perf_counter() - t0:.1f} s: {kept}",
                  flush=True)
            raise interrupts.stopped(kept) from None
        # A run's own failure (bad override, non-finite loss, a bug it triggers) must not stop the other runs of
        # the sweep: it is caught here, whatever its type, reported in one line, its traceback kept in the log.
        except Exception as e:
            traceback.print_exc()
            error = str(e) if isinstance(e, ProbeError) else f"{type(e).__name__}: {e}"
            return RunResult(run.key, "failed", log, time.perf_counter() - t0, error.splitlines()[0])
        wall = time.perf_counter() - t0
        print(f"=== {run.key}: {status} in {wall:.1f} s", flush=True)
    return RunResult(run.key, status, log, wall, resumed_from=resumed_from)


def _resume_step(last: Path) -> int:
    """The step ``last`` holds; a damaged last.pt is refused with what to do about it (never trained over)."""
    try:
        return load_checkpoint(last).step
    except ProbeError as e:
        raise ProbeError(f"{e}; to train this run again from step 0, delete {last}") from None


def evaluate_run(run: Run, opts: RunOptions) -> Path:
    """``python -m probe.evaluate final.pt --samples N --lengths ... --json`` into eval.json (no indentation),
    written last and atomically: its presence marks the run finished."""
    final = run.out / "final.pt"
    if opts.note:
        print(opts.note, flush=True)
    lengths = eval_lengths_for(opts.eval_lengths, load_checkpoint(final).task_config.train_length)
    t0 = time.perf_counter()
    curves = evaluate_checkpoints([final], lengths, opts.eval_samples, device=opts.device, factors=opts.eval_factors)
    windows = evaluate_windows([final], max(lengths), opts.eval_samples, device=opts.device)
    print(f"evaluated {len(lengths)} lengths x {opts.eval_samples} sequences, and the windows of positions to "
          f"{max(lengths)}, in {time.perf_counter() - t0:.1f} s", flush=True)
    return write_text_atomically(run.out / EVAL, json.dumps(evaluation_envelope(curves, [final], windows),
                                                            separators=(",", ":")))


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors too, so C++ warnings and tracebacks land there)
    to ``path`` for the duration, then restore them: a pool or Ray worker runs many runs in turn."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
