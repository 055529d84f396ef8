"""Retrain a run from the configs and seed its checkpoint records, to regenerate its trajectory snapshots.

Usage: ``python -m probe.retrain SOURCE [SOURCE ...] --out DIR [--steps S ...] [--until STEP] [--work DIR]``.

A SOURCE is a run folder of a sweep or of ``probe.train`` (``final.pt`` and ``trajectory/``; the snapshots go to
``DIR/<variant>-<seed>``, the folder's last two names joined by ``-``) or a checkpoint ``NAME.pt`` shipped beside a
``trajectories/NAME/`` folder (the snapshots go to ``DIR/NAME``). The run is trained again with ``probe.train``'s
trainer on the CPU, and the snapshots at ``--steps`` (default: the steps of the snapshots the run already has) are
copied out. The retrained weights are checked against the original run: its final weights, or with ``--until STEP``
(only the run's first STEP steps: its learning-rate and attention schedules still span the whole run, so these steps
are exactly the full run's) each of its snapshots up to STEP. A run is bit-reproducible on the same CPU only; on
another CPU the check reports the largest weight difference and the snapshots are still written.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.cli import JSON_HELP, nonnegative_int, positive_int, say, set_threads
from probe.errors import ProbeError
from probe.runner import Command, CommandOptions, Report, option, threads_option

FINAL, TRAJECTORY, SHIPPED_TRAJECTORIES = "final.pt", "trajectory", "trajectories"


@dataclass(frozen=True)
class Source:
    """A run to retrain: its final checkpoint, the name its snapshots go under, and its own snapshots (if any)."""

    checkpoint: Path
    name: str
    reference: Path | None

    @classmethod
    def of(cls, path: str | Path) -> Source:
        """A run folder (``final.pt``, ``trajectory/``) or a shipped ``NAME.pt`` (``trajectories/NAME/`` beside it)."""
        path = Path(path)
        if path.is_dir() or path.name == FINAL:
            run = path if path.is_dir() else path.parent
            if not (run / FINAL).is_file():
                raise ProbeError(f"{run}: not a finished run folder (no {FINAL})")
            snaps = run / TRAJECTORY
            return cls(run / FINAL, f"{run.parent.name}-{run.name}", snaps if snaps.is_dir() else None)
        if not path.is_file():
            raise ProbeError(f"{path}: no such checkpoint or run folder")
        snaps = path.parent / SHIPPED_TRAJECTORIES / path.stem
        return cls(path, path.stem, snaps if snaps.is_dir() else None)

    def snapshot_steps(self) -> list[int]:
        return [] if self.reference is None else sorted(_step(p) for p in self.reference.glob("step_*.pt"))


def _step(snapshot: Path) -> int:
    return int(snapshot.stem.split("_")[1])


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    if a.keys() != b.keys():
        raise ProbeError(f"the retrained weights have other tensors than the reference: {sorted(a.keys() ^ b.keys())}")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in b)


def retrain(source: Source, steps: list[int] | None, work: str | Path, out: str | Path, until: int | None = None,
            progress: bool = True) -> float:
    """Retrain ``source`` into ``work/NAME`` and copy its snapshots at ``steps`` (default: the steps the run's own
    snapshots have) to ``out/NAME``. Returns the largest absolute weight difference from the original run (0.0:
    bit-identical): the final weights, or with ``until`` every snapshot of the original run up to that step."""
    from probe.checkpoint import load_checkpoint
    from probe.train import TrainConfig, train

    original = load_checkpoint(source.checkpoint)
    cfg = TrainConfig.from_dict(original.train_config)
    if until is not None and not 0 < until <= cfg.steps:
        raise ProbeError(f"--until {until}: {source.name} has {cfg.steps} steps")
    last = cfg.steps if until is None else until
    if steps is None:  # the run's own snapshots, those up to the last step trained here
        steps = [s for s in source.snapshot_steps() if s <= last]
    steps = sorted(set(steps))
    if not steps:
        raise ProbeError(f"{source.name}: no snapshot of the original run to take the steps from; pass --steps")
    if any(s > last for s in steps):
        raise ProbeError(f"--steps: {[s for s in steps if s > last]} lie outside the trained steps 0..{last}")
    if any(s % cfg.traj_every for s in steps):
        # snapshots exist only at multiples of traj_every: a finer grid (e.g. every 25 steps early on) needs the
        # greatest common step; saving snapshots does not touch the training's random streams
        cfg = dataclasses.replace(cfg, traj_every=math.gcd(*[s for s in steps if s]))
    checks = [] if until is None or source.reference is None else \
        [p for p in sorted(source.reference.glob("step_*.pt")) if _step(p) <= until]
    if until is not None and not checks:
        raise ProbeError(f"{source.name}: no snapshot of the original run up to step {until} to check the retrained "
                         f"steps against")
    run = Path(work) / source.name
    shutil.rmtree(run, ignore_errors=True)
    final = train(original.model_config, original.task_config, cfg, run, "cpu", progress=progress, until=until)
    dst = Path(out) / source.name
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for step in steps:
        snap = run / TRAJECTORY / f"step_{step:06d}.pt"
        if not snap.exists():
            raise ProbeError(f"{snap}: no snapshot at step {step} (trained {last} steps, every {cfg.traj_every})")
        shutil.copy(snap, dst / snap.name)
    if until is None:
        return _max_diff(final.state_dict, original.state_dict)
    return max(_max_diff(load_checkpoint(run / TRAJECTORY / p.name).state_dict, load_checkpoint(p).state_dict)
               for p in checks)


@dataclass
class RetrainOptions(CommandOptions):
    """The command line of ``python -m probe.retrain``: the runs, where their snapshots go, which steps."""

    sources: list[str] = option(help="a run folder (final.pt, trajectory/) or a shipped NAME.pt with "
                                     "trajectories/NAME/ beside it", positional=True, nargs="+", metavar="SOURCE",
                                default_factory=list)
    out: str | None = option(None, "where the snapshots go: DIR/NAME/step_XXXXXX.pt", metavar="DIR", required=True)
    steps: list[int] | None = option(None, "snapshot steps to keep (default: the steps of the run's own snapshots)",
                                     nargs="+", type=nonnegative_int, metavar="S")
    until: int | None = option(None, "train only the first STEP steps of each run, checked against its snapshots "
                                     "up to STEP", type=positive_int, metavar="STEP")
    work: str | None = option(None, "where to train (default: a temporary directory)", metavar="DIR")
    json: bool = option(False, JSON_HELP)
    threads: int = threads_option(order=8)

    def prepare(self) -> None:
        set_threads(self.threads)

    def folders(self) -> dict[str, str | None]:
        return {"--out": self.out, "--work": self.work}  # before minutes of training, not after them


def run(opts: RetrainOptions) -> Report:
    """Retrain every source (each checked before any training) and say, per run, how its weights compare."""
    sources = [Source.of(s) for s in opts.sources]
    out = Path(opts.out)
    work = Path(opts.work) if opts.work else Path(tempfile.mkdtemp(prefix="retrain-"))
    against = "the original run's snapshots" if opts.until is not None else "the original final weights"
    rows = []
    try:
        for source in sources:
            diff = retrain(source, opts.steps, work, out, opts.until, progress=opts.progress)
            n = len(list((out / source.name).glob("step_*.pt")))
            verdict = f"bit-identical to {against}" if diff == 0 else (
                f"differs from {against} by up to {diff:.3g} (another CPU or torch version)")
            say(opts, f"{source.name}: {n} snapshots in {out / source.name}; retrained weights {verdict}")
            rows.append({"source": str(source.checkpoint), "name": source.name, "snapshots": n,
                         "until": opts.until, "max_weight_diff": diff, "identical": diff == 0})
    finally:
        if opts.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return Report([str(s.checkpoint) for s in sources], rows)


COMMAND = Command("retrain", RetrainOptions, run, (__doc__ or "").split("\n\n")[0],
                  "Example: python -m probe.retrain runs/mechanism/joint/seed5 --steps $(seq 0 25 500) --until 500 "
                  "--out runs/dense", results_file=False)
main, build_parser = COMMAND.main, COMMAND.build_parser


if __name__ == "__main__":
    sys.exit(main())
