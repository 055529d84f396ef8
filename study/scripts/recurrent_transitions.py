"""Read every SSM run of the recurrent grid with ``probe.transitions`` into study/results/recurrent/transitions.csv.

Usage: ``python study/scripts/recurrent_transitions.py RUNS [--out study/results/recurrent/transitions.csv]
[--samples 32]``.
RUNS is the grid's ``--out`` directory (``VARIANT/seedS/final.pt``). One row per run, block and order o (2, 5, 10 for
m = 10): how many channels count mod o beyond 4 x L_train, the longest drift horizon of a channel of that order,
and whether the run's instrument check and controls passed. Runs already in the file are skipped, so the script can
follow a grid as it lands; a run whose cell is not an SSM is not read (the analysis does not apply to it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from probe.core.progress import progress_iter
from probe.errors import ProbeError
from probe.transitions import analyze

COLUMNS = ["variant", "seed", "block", "order", "channels", "of", "best_horizon", "beyond", "known_rotation",
           "reinit", "shuffled_digits"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="the grid's --out directory")
    parser.add_argument("--out", type=Path, default=Path("study/results/recurrent/transitions.csv"))
    parser.add_argument("--samples", type=int, default=32, help="sequences of length L_train per run (default 32)")
    args = parser.parse_args(argv)
    if not args.runs.is_dir():
        print(f"error: {args.runs}: no such directory", file=sys.stderr)
        return 2
    done = pd.read_csv(args.out) if args.out.exists() else pd.DataFrame(columns=COLUMNS)
    have = set(zip(done.variant, done.seed.astype(int), strict=True))
    todo = sorted((p.parent.parent.name, int(p.parent.name.removeprefix("seed")), p)
                  for p in args.runs.glob("*ssm*/seed*/final.pt"))
    todo = [t for t in todo if t[:2] not in have]
    rows = []
    for variant, seed, path in progress_iter(todo, "transitions", True):
        try:
            r = analyze(path, n_samples=args.samples)
        except ProbeError as e:
            print(f"error: {path}: {e}", file=sys.stderr)
            return 2
        if r.note:
            continue
        passed = {c["control"]: bool(c["passed"]) for c in r.controls}
        for s in r.summary.itertuples():
            rows.append({"variant": variant, "seed": seed, "block": s.block, "order": s.order,
                         "channels": s.channels, "of": s.of, "best_horizon": round(float(s.best_horizon), 1),
                         "beyond": s.beyond, **{k: passed.get(k) for k in COLUMNS[-3:]}})
    if rows:
        out = pd.concat([done, pd.DataFrame(rows)], ignore_index=True).sort_values(["variant", "seed", "block",
                                                                                    "order"])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        out[COLUMNS].to_csv(tmp, index=False)
        tmp.replace(args.out)
    print(f"{args.out}: {len(rows) and len(todo)} runs added, {len(have)} were there", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
