"""Ship the reproduction: checkpoints into ``checkpoints/``, the runs' evaluations into ``study/results/``.

Usage: ``python study/scripts/ship.py [--runs runs/] [--joint-runs runs/precision/joint-fp32]`` after
``python study/scripts/reproduce.py``, from the repository's root. Writes ``checkpoints/<preset>.pt`` (weights only:
seed 0, except ``hybrid-joint``, whose seed is the median of its runs' state accuracy at 3x L_train, from
``--joint-runs`` if given, so that the analyses see a typical joint run, not its luckiest),
``checkpoints/trajectories/<preset>/`` (hybrid presets, a subset of the snapshots; ``python -m probe.retrain
checkpoints/<preset>.pt --out DIR`` remakes them from the shipped checkpoints), and the reproduction grid in compact
form, ``study/results/reproduction/`` (every run's evaluation from the sweep, with wall time and steps: ``python -m
probe.results collect RUNS study/results/reproduction``), and prints its table.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from probe.errors import ProbeError
from probe.results import import_runs, load_grid

PRESETS = ["lstm", "transformer", "hybrid-joint", "hybrid-dat"]
TRAJECTORY_STEPS = [0, 250, 500, 1000, 1500, 2000, 2250, 2500, 3500, 4500]


def median_seed_run(variant_dir: Path) -> Path:
    """The run folder (``seedS``) whose state token accuracy at 3x L_train is the median of the variant's runs; with
    an even count, the lower of the two middle ones."""
    try:
        runs = load_grid(variant_dir.parent).runs
    except ProbeError as e:
        raise SystemExit(str(e)) from None
    runs = runs[runs.variant == variant_dir.name].sort_values("state_acc_3x", kind="stable")
    if runs.empty:
        raise SystemExit(f"{variant_dir}: no evaluated seed*/ run")
    pick = runs.iloc[(len(runs) - 1) // 2]
    run = variant_dir / f"seed{int(pick.seed)}"
    print(f"hybrid-joint: shipping {run} (state at 3x {100 * pick.state_acc_3x:.1f} %, the median of {len(runs)} "
          f"runs: {', '.join(f'{100 * a:.1f}' for a in runs.state_acc_3x)})")
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--no-eval", action="store_true", help="only copy checkpoints and trajectories")
    parser.add_argument("--joint-runs", type=Path, default=None,
                        help="a variant's folder of hybrid-joint runs (seed*/final.pt + eval.json) to ship the median "
                             "seed from (default: RUNS/hybrid-joint)")
    args = parser.parse_args()
    ckpt_dir, results = Path("checkpoints"), Path("study") / "results"  # run from the repository root
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
    # the sweep evaluated every run (eval.json); collecting them is a conversion, not a re-evaluation
    from probe.sweep.cli import main as sweep_main

    try:
        import_runs(args.runs, results / "reproduction")
    except ProbeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return sweep_main([str(results / "reproduction"), "--report", "--no-figure", "--in-place"])


if __name__ == "__main__":
    sys.exit(main())
