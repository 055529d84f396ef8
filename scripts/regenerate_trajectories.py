"""Regenerate ``checkpoints/trajectories/<preset>/`` by retraining each shipped hybrid from its recorded configs.

Usage: ``python scripts/regenerate_trajectories.py [--presets hybrid-joint hybrid-dat] [--steps 0 250 ...]
[--work DIR] [--out checkpoints/trajectories]``. For each preset, the shipped ``checkpoints/<preset>.pt`` records its
model, task and training configs and its seed; this trains that run again (``probe.train``'s trainer, fp32, one
thread: about 6-10 min of one core per run), copies the snapshots at ``--steps`` (default: the ten that were
shipped) into ``--out``, and checks that the retrained final weights equal the shipped checkpoint's. An fp32 run is
bit-reproducible on the same CPU only; on another CPU the check reports the largest weight difference and the
snapshots are still written, but the gradient analyses of them will differ in the last digits.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from probe.checkpoint import load_checkpoint
from probe.errors import ProbeError
from probe.train import TrainConfig, train

ROOT = Path(__file__).resolve().parent.parent
STEPS = [0, 250, 500, 1000, 1500, 2000, 2250, 2500, 3500, 4500]


def regenerate(preset: str, steps: list[int], work: Path, out: Path, checkpoints: Path = ROOT / "checkpoints",
               progress: bool = True) -> float:
    """Retrain the shipped ``checkpoints/preset.pt`` into ``work``, copy its snapshots at ``steps`` to
    ``out/preset``; returns the largest absolute difference between the retrained and the shipped final weights
    (0.0: bit-identical)."""
    shipped = load_checkpoint(checkpoints / f"{preset}.pt")
    cfg = TrainConfig.from_dict(shipped.train_config)
    every = cfg.traj_every
    if any(s % every for s in steps):
        # snapshots exist only at multiples of traj_every: a finer grid (e.g. every 25 steps early on) needs the
        # greatest common step; saving snapshots does not touch the training's random streams
        import dataclasses
        import math

        every = math.gcd(*[s for s in steps if s])
        cfg = dataclasses.replace(cfg, traj_every=every)
    run = work / preset
    final = train(shipped.model_config, shipped.task_config, cfg, run, "cpu", progress=progress)
    dst = out / preset
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for step in steps:
        snap = run / "trajectory" / f"step_{step:06d}.pt"
        if not snap.exists():
            raise ProbeError(f"{snap}: no snapshot at step {step} (trained {cfg.steps} steps, every {every})")
        shutil.copy(snap, dst / snap.name)
    a, b = final.state_dict, shipped.state_dict
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in b)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["hybrid-joint", "hybrid-dat"])
    p.add_argument("--steps", nargs="+", type=int, default=STEPS, help="snapshot steps to keep")
    p.add_argument("--work", type=Path, default=None, help="where to train (default: a temporary directory)")
    p.add_argument("--out", type=Path, default=ROOT / "checkpoints" / "trajectories")
    p.add_argument("--checkpoints", type=Path, default=ROOT / "checkpoints", help="where the shipped PRESET.pt are")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="trajectories-"))
    try:
        for preset in args.presets:
            diff = regenerate(preset, sorted(set(args.steps)), work, args.out, args.checkpoints)
            verdict = "bit-identical to the shipped checkpoint" if diff == 0 else (
                f"differs from the shipped checkpoint by up to {diff:.3g} (another CPU or torch version)")
            print(f"{preset}: {len(args.steps)} snapshots in {args.out / preset}; retrained final weights "
                  f"{verdict}", file=sys.stderr)
    except ProbeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
