"""Wall time of the same tiny sweep on the local process pool and on a fresh local Ray instance, and Ray's start-up.

Usage: ``python benchmarks/sweep_overhead.py [--steps 40] [--jobs 2]``. Each executor runs the whole command
(``python -m probe.sweep --preset hybrid-joint lstm --seeds 0 1 ...``, tiny models) in a fresh process and a fresh
directory, so imports, worker start-up, training, evaluation and aggregation all count; the order alternates over
``--repeats`` so that machine noise hits both alike. Prints each wall time, the ratio ray / local and Ray's
start-up (``ray.init`` of a local instance, as the sweep reports it).

``--evaluation``: instead, one run of the real ``lstm`` preset for a few steps, evaluated as a full sweep does
(256 sequences at every length up to 4x) and with ``--quick``; prints each run's training and evaluation time from
its log, which is where a short smoke-test sweep spends its time.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "task.train_length=6", "train.batch_size=8",
        "train.eval_every=10", "train.ckpt_every=10", "train.traj_every=20", "train.eval_samples=16",
        "train.warmup=5"]


def sweep(executor: str, out: Path, steps: int, jobs: int) -> tuple[float, float | None]:
    cmd = [sys.executable, "-m", "probe.sweep", "--preset", "hybrid-joint", "lstm", "--seeds", "0", "1",
           "--steps", str(steps), *[a for s in TINY for a in ("--set", s)], "--out", str(out), "--jobs", str(jobs),
           "--executor", executor, "--eval-samples", "16", "--no-progress", "--no-figure"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"{executor} sweep failed:\n{proc.stderr}")
    startup = re.search(r"Ray start-up ([\d.]+) s", proc.stderr)
    return wall, float(startup.group(1)) if startup else None


def evaluation_cost(out: Path, steps: int, quick: bool) -> tuple[float, str]:
    """Wall time of a one-run sweep of the real lstm preset, and its log's evaluation line."""
    cmd = [sys.executable, "-m", "probe.sweep", "--preset", "lstm", "--seeds", "0", "--steps", str(steps),
           "--out", str(out), "--jobs", "1", "--no-progress", "--no-figure", *(["--quick"] if quick else [])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"sweep failed:\n{proc.stderr}")
    line = next(ln for ln in (out / "lstm" / "seed0" / "train.log").read_text().splitlines()
                if ln.startswith("evaluated "))
    return wall, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--evaluation", action="store_true", help="time a short run's evaluation, full and --quick")
    args = parser.parse_args()
    if args.evaluation:
        with tempfile.TemporaryDirectory() as tmp:
            for quick in (True, False):
                wall, line = evaluation_cost(Path(tmp) / f"q{int(quick)}", min(args.steps, 12), quick)
                print(f"{'--quick' if quick else 'default'}: sweep {wall:.1f} s; {line}")
        return
    walls: dict[str, list[float]] = {"local": [], "ray": []}
    startups = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for executor in ("local", "ray") if i % 2 == 0 else ("ray", "local"):
                wall, startup = sweep(executor, Path(tmp) / f"{executor}{i}", args.steps, args.jobs)
                walls[executor].append(wall)
                if startup is not None:
                    startups.append(startup)
                print(f"{executor:5s} run {i}: {wall:6.1f} s" + (f" (Ray start-up {startup:.1f} s)" if startup else ""))
    local, ray = min(walls["local"]), min(walls["ray"])
    print(f"4 runs x {args.steps} steps, {args.jobs} jobs: local {local:.1f} s, ray {ray:.1f} s, "
          f"ratio ray/local {ray / local:.2f}; Ray start-up {min(startups):.1f} s")


if __name__ == "__main__":
    main()
