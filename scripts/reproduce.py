"""Rerun the paper reproduction: every preset x seed on the interleaved task, two runs at a time (one per core).

Usage: ``python scripts/reproduce.py [--seeds 0 1 2] [--presets ...] [--runs runs/] [--jobs 2]``.
Each run is ``python -m probe.train --preset P --seed S --out runs/P/seedS``; a run that already finished
(``final.pt`` present) is skipped, an interrupted one is resumed. Then ``python scripts/ship.py`` evaluates the
runs and copies what is shipped into ``checkpoints/``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PRESETS = ["hybrid-dat", "hybrid-joint", "lstm", "transformer"]


def run_one(preset: str, seed: int, runs: Path) -> tuple[str, int, float, int]:
    out = runs / preset / f"seed{seed}"
    if (out / "final.pt").exists():
        return preset, seed, 0.0, 0
    cmd = [sys.executable, "-m", "probe.train", "--preset", preset, "--seed", str(seed), "--out", str(out),
           "--no-progress", "--set", "train.threads=1"]
    if (out / "last.pt").exists():
        cmd.append("--resume")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(out / "train.log", "a") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    return preset, seed, time.perf_counter() - t0, rc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--presets", nargs="+", default=PRESETS)
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (one core each)")
    args = parser.parse_args()
    jobs = [(p, s) for s in args.seeds for p in args.presets]
    failed = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for preset, seed, wall, rc in pool.map(lambda j: run_one(*j, args.runs), jobs):
            status = "ok" if rc == 0 else f"FAILED (exit {rc}, see train.log)"
            print(f"{preset:14s} seed {seed}: {wall:7.1f} s  {status}", flush=True)
            failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
