"""Regenerate trajectory snapshots by retraining a run from its recorded configs: the shipped hybrids, or any run
folder of a grid, in full or only its first steps.

Usage: ``python scripts/regenerate_trajectories.py [--presets hybrid-joint hybrid-dat | --runs RUN_DIR ...]
[--steps 0 250 ...] [--until STEP] [--work DIR] [--out checkpoints/trajectories]``.

- ``--presets``: the shipped ``checkpoints/<preset>.pt`` records its model, task and training configs and its seed;
  this trains that run again (``probe.train``'s trainer, one thread: about 6-10 min of one core per run in fp32),
  copies the snapshots at ``--steps`` (default: the ten that were shipped) into ``--out/<preset>``, and checks that
  the retrained final weights equal the shipped checkpoint's.
- ``--runs``: a run folder of a sweep (``final.pt`` and ``trajectory/``); the snapshots go to
  ``--out/<variant>-<seed>`` (the folder's last two names joined by ``-``).
- ``--until STEP``: train only the run's first STEP steps (its learning-rate and attention schedules still span the
  whole run, so these steps are exactly the full run's). The check is then against the run's own snapshots up to
  STEP (``RUN_DIR/trajectory``, or ``checkpoints/trajectories/<preset>`` for a shipped preset): it ties the dense
  snapshots to the run whose accuracy was measured, at about STEP/steps of the cost. E.g. the early window of five
  joint runs of the mechanism grid, a snapshot every 25 steps, about 1 min of one core each:
  ``python scripts/regenerate_trajectories.py --runs runs/mechanism/joint/seed{5,6,7,8,9} --steps $(seq 0 25 500)
  --until 500 --out runs/dense``.

A run is bit-reproducible on the same CPU only (bf16 runs as well, with the same kernels); on another CPU the check
reports the largest weight difference and the snapshots are still written, but analyses of them will differ in the
last digits.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from probe.checkpoint import load_checkpoint
from probe.errors import ProbeError
from probe.train import TrainConfig, train

ROOT = Path(__file__).resolve().parent.parent
STEPS = [0, 250, 500, 1000, 1500, 2000, 2250, 2500, 3500, 4500]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        raise ProbeError(f"the retrained weights have other tensors than the reference: {sorted(a.keys() ^ b.keys())}")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in b)


def retrain(source: Path, name: str, steps: list[int], work: Path, out: Path, reference: Path | None = None,
            until: int | None = None, progress: bool = True) -> float:
    """Retrain the run whose final checkpoint is ``source`` into ``work/name``, copy its snapshots at ``steps`` to
    ``out/name``; return the largest absolute weight difference from the original run (0.0: bit-identical): the
    final weights, or with ``until`` every snapshot of ``reference`` (a trajectory folder) at a step up to ``until``."""
    original = load_checkpoint(source)
    cfg = TrainConfig.from_dict(original.train_config)
    if until is not None and not 0 < until <= cfg.steps:
        raise ProbeError(f"--until {until}: the run has {cfg.steps} steps")
    last = cfg.steps if until is None else until
    if any(s > last or s < 0 for s in steps):
        raise ProbeError(f"--steps: {[s for s in steps if s > last or s < 0]} lie outside the trained steps 0..{last}")
    if any(s % cfg.traj_every for s in steps):
        # snapshots exist only at multiples of traj_every: a finer grid (e.g. every 25 steps early on) needs the
        # greatest common step; saving snapshots does not touch the training's random streams
        cfg = dataclasses.replace(cfg, traj_every=math.gcd(*[s for s in steps if s]))
    checks: list[Path] = []
    if until is not None:
        checks = [] if reference is None else [p for p in sorted(reference.glob("step_*.pt"))
                                                 if int(p.stem.split("_")[1]) <= until]
        if not checks:
            raise ProbeError(f"{name}: no snapshot of the original run up to step {until} in {reference} to check "
                             f"the retrained steps against")
    run = work / name
    shutil.rmtree(run, ignore_errors=True)
    final = train(original.model_config, original.task_config, cfg, run, "cpu", progress=progress, until=until)
    dst = out / name
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for step in steps:
        snap = run / "trajectory" / f"step_{step:06d}.pt"
        if not snap.exists():
            raise ProbeError(f"{snap}: no snapshot at step {step} (trained {last} steps, every {cfg.traj_every})")
        shutil.copy(snap, dst / snap.name)
    if until is None:
        return _max_diff(final.state_dict, original.state_dict)
    return max(_max_diff(load_checkpoint(run / "trajectory" / p.name).state_dict, load_checkpoint(p).state_dict)
               for p in checks)


def regenerate(preset: str, steps: list[int], work: Path, out: Path, checkpoints: Path = ROOT / "checkpoints",
               progress: bool = True, until: int | None = None) -> float:
    """Retrain the shipped ``checkpoints/preset.pt`` (``retrain``); with ``until`` it is checked against the shipped
    snapshots in ``checkpoints/trajectories/preset``."""
    return retrain(checkpoints / f"{preset}.pt", preset, steps, work, out,
                   reference=checkpoints / "trajectories" / preset, until=until, progress=progress)


def regenerate_run(run_dir: Path, steps: list[int], work: Path, out: Path, progress: bool = True,
                   until: int | None = None) -> tuple[str, float]:
    """Retrain a sweep's run folder (``final.pt``, ``trajectory/``) into ``out/<variant>-<seed>``."""
    if not (run_dir / "final.pt").is_file():
        raise ProbeError(f"{run_dir}: not a finished run folder (no final.pt)")
    name = f"{run_dir.parent.name}-{run_dir.name}"
    return name, retrain(run_dir / "final.pt", name, steps, work, out, reference=run_dir / "trajectory",
                         until=until, progress=progress)


def _retrain_all(args: argparse.Namespace, steps: list[int], work: Path) -> Iterator[tuple[str, float]]:
    """(name, largest weight difference) of each run or preset, retrained one after the other."""
    if args.runs:
        for run in args.runs:
            yield regenerate_run(run, steps, work, args.out, until=args.until)
    else:
        for preset in args.presets or ["hybrid-joint", "hybrid-dat"]:
            yield preset, regenerate(preset, steps, work, args.out, args.checkpoints, until=args.until)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--presets", nargs="+", default=None, help="shipped presets (default hybrid-joint hybrid-dat)")
    which.add_argument("--runs", nargs="+", type=Path, default=None, help="run folders of a sweep")
    p.add_argument("--steps", nargs="+", type=int, default=None,
                   help=f"snapshot steps to keep (default {' '.join(map(str, STEPS))})")
    p.add_argument("--until", type=int, default=None, help="train only the first UNTIL steps of each run")
    p.add_argument("--work", type=Path, default=None, help="where to train (default: a temporary directory)")
    p.add_argument("--out", type=Path, default=ROOT / "checkpoints" / "trajectories")
    p.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints", help="where the shipped PRESET.pt are")
    args = p.parse_args(argv)
    steps = sorted(set(args.steps or STEPS))
    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="trajectories-"))
    against = "the original run's snapshots" if args.until is not None else "the original final weights"
    try:
        for name, diff in _retrain_all(args, steps, work):
            verdict = f"bit-identical to {against}" if diff == 0 else (
                f"differs from {against} by up to {diff:.3g} (another CPU or torch version)")
            print(f"{name}: {len(steps)} snapshots in {args.out / name}; retrained weights {verdict}", file=sys.stderr)
    except ProbeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
