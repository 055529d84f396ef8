"""Evaluate the reproduction runs and copy what is shipped into ``checkpoints/`` and ``results/``.

Usage: ``python scripts/ship.py [--runs runs/] [--joint-runs runs/precision/joint-fp32]`` after
``python scripts/reproduce.py``. Writes ``checkpoints/<preset>.pt`` (weights only: seed 0, except ``hybrid-joint``,
whose seed is the median of its runs' state accuracy at 3x L_train, from ``--joint-runs`` if given, so that the
analyses see a typical joint run, not its luckiest), ``checkpoints/trajectories/<preset>/`` (hybrid presets, a
subset of the snapshots), ``results/evaluate.json`` and ``results/accuracy_vs_length.png`` (all seeds, lengths 1..100),
``results/runs.json`` (wall time and steps per second of every run) and prints the README table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from probe.checkpoint import load_checkpoint

PRESETS = ["lstm", "transformer", "hybrid-joint", "hybrid-dat"]
TRAJECTORY_STEPS = [0, 250, 500, 1000, 1500, 2000, 2250, 2500, 3500, 4500]


def median_seed_run(variant_dir: Path) -> Path:
    """The run folder (``seedS``) whose state token accuracy at 3x L_train (its eval.json) is the median of the
    variant's runs; with an even count, the lower of the two middle ones."""
    scored = []
    for ev in sorted(variant_dir.glob("seed*/eval.json")):
        rows = json.loads(ev.read_text())["results"]
        train_length = load_checkpoint(ev.parent / "final.pt").task_config.train_length
        acc = next(r["token_acc"] for r in rows if r.get("subtask") == "state" and r.get("length") == 3 * train_length)
        scored.append((acc, ev.parent))
    if not scored:
        raise SystemExit(f"{variant_dir}: no seed*/eval.json")
    scored.sort()
    acc, run = scored[(len(scored) - 1) // 2]
    print(f"hybrid-joint: shipping {run} (state at 3x {100 * acc:.1f} %, the median of {len(scored)} runs: "
          f"{', '.join(f'{100 * a:.1f}' for a, _ in scored)})")
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--no-eval", action="store_true", help="only copy checkpoints and trajectories")
    parser.add_argument("--joint-runs", type=Path, default=None,
                        help="a variant's folder of hybrid-joint runs (seed*/final.pt + eval.json) to ship the median "
                             "seed from (default: RUNS/hybrid-joint)")
    args = parser.parse_args()
    ckpt_dir, results = Path("checkpoints"), Path("results")
    results.mkdir(exist_ok=True)
    finals = sorted(args.runs.glob("*/seed*/final.pt"))
    if not finals:
        print(f"no finished runs under {args.runs}", file=sys.stderr)
        return 2
    for preset in PRESETS:
        src = args.runs / preset / "seed0"
        if preset == "hybrid-joint":
            src = median_seed_run(args.joint_runs or args.runs / preset)
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
