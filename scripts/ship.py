"""Evaluate the reproduction runs and copy what is shipped into ``checkpoints/`` and ``results/``.

Usage: ``python scripts/ship.py [--runs runs/]`` after ``python scripts/reproduce.py``. Writes
``checkpoints/<preset>.pt`` (seed 0, weights only), ``checkpoints/trajectories/<preset>/`` (hybrid presets, a subset
of the snapshots), ``results/evaluate.json`` and ``results/accuracy_vs_length.png`` (all seeds, lengths 1..100),
``results/runs.json`` (wall time and steps per second of every run) and prints the README table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

PRESETS = ["lstm", "transformer", "hybrid-joint", "hybrid-dat"]
TRAJECTORY_STEPS = [0, 250, 500, 1000, 1500, 2000, 2250, 2500, 3500, 4500]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--no-eval", action="store_true", help="only copy checkpoints and trajectories")
    args = parser.parse_args()
    ckpt_dir, results = Path("checkpoints"), Path("results")
    results.mkdir(exist_ok=True)
    finals = sorted(args.runs.glob("*/seed*/final.pt"))
    if not finals:
        print(f"no finished runs under {args.runs}", file=sys.stderr)
        return 2
    for preset in PRESETS:
        src = args.runs / preset / "seed0"
        if (src / "final.pt").exists():
            shutil.copy(src / "final.pt", ckpt_dir / f"{preset}.pt")
        if preset.startswith("hybrid") and (src / "trajectory").is_dir():
            dst = ckpt_dir / "trajectories" / preset
            shutil.rmtree(dst, ignore_errors=True)
            dst.mkdir(parents=True)
            for step in TRAJECTORY_STEPS:
                snap = src / "trajectory" / f"step_{step:06d}.pt"
                if snap.exists():
                    shutil.copy(snap, dst / snap.name)
    if args.no_eval:
        return 0
    runs = []
    for final in finals:
        log = [json.loads(line) for line in (final.parent / "metrics.jsonl").read_text().splitlines()]
        steps, elapsed = log[-1]["step"], log[-1]["elapsed_s"]
        runs.append({"run": str(final.parent), "preset": final.parent.parent.name, "seed": final.parent.name,
                     "steps": steps, "wall_s": round(elapsed, 1), "steps_per_s": round(steps / elapsed, 2)})
    (results / "runs.json").write_text(json.dumps(runs, indent=1))
    cmd = [sys.executable, "-m", "probe.evaluate", *map(str, finals), "--lengths", "1:100",
           "--samples", str(args.samples), "--out", str(results)]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
