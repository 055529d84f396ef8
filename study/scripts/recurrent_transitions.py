"""Read every SSM run of a grid with ``probe.transitions`` into its results folder's transitions.csv.

Usage: ``python study/scripts/recurrent_transitions.py RUNS [--out study/results/recurrent/transitions.csv]
[--samples 32]``; study/scripts/collect_grid.sh runs it for the ssm_ grids (``--out study/results/NAME/...``).
RUNS is the grid's ``--out`` directory (``VARIANT/seedS/final.pt``). One row per run, block and order o (2, 5, 10 for
m = 10): how many channels count mod o beyond 4 x L_train, the longest drift horizon of a channel of that order,
that channel's ``fade_400`` (the share of its state that survives a 400-token stream) and ``fade_win_*`` (the share
that survives each window of positions: in range, (1x, 2x], ... (8x, 16x]) and ``phase_win_*`` (the phase error it
accumulates through each window, in half-sectors: below 1 the state is still right), the median ``fade_400`` over every
channel of the run (both blocks), and whether the run's instrument check and controls passed. Runs already in the
file are skipped, so the script can follow a grid as it lands (rows written before a fade column existed keep it
empty; ``--redo`` reads every run of RUNS again and replaces its rows); a run whose cell is not an SSM is not read
(the analysis does not apply to it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from probe.core.progress import progress_iter
from probe.errors import ProbeError
from probe.transitions import analyze

COLUMNS = ["variant", "seed", "block", "order", "channels", "of", "best_horizon", "beyond", "fade_400",
           "median_fade_400", "known_rotation", "reinit", "shuffled_digits"]


def _best_fades(channels: pd.DataFrame, block: int, order: int) -> dict[str, float]:
    """``fade_400`` and each ``fade_win_*`` of the channel of this block and order with the longest drift horizon (the
    one whose horizon ``summarize`` reports), to 4 significant digits (a fade beyond the range can be 1e-30, which
    4 decimals would print as 0); NaN where the block has no channel of that order."""
    part = channels[(channels.block == block) & (channels.order == order)]
    columns = [c for c in channels if c == "fade_400" or c.startswith(("fade_win_", "phase_win_"))]
    if not len(part):
        return dict.fromkeys(columns, float("nan"))
    best = part.loc[part.horizon.idxmax()]
    return {c: float(f"{float(best[c]):.4g}") for c in columns}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="the grid's --out directory")
    parser.add_argument("--out", type=Path, default=Path("study/results/recurrent/transitions.csv"))
    parser.add_argument("--samples", type=int, default=32, help="sequences of length L_train per run (default 32)")
    parser.add_argument("--redo", action="store_true",
                        help="read every run of RUNS again and replace its rows (e.g. after a column was added)")
    args = parser.parse_args(argv)
    if not args.runs.is_dir():
        print(f"error: {args.runs}: no such directory", file=sys.stderr)
        return 2
    done = pd.read_csv(args.out) if args.out.exists() else pd.DataFrame(columns=COLUMNS)
    todo = sorted((p.parent.parent.name, int(p.parent.name.removeprefix("seed")), p)
                  for p in args.runs.glob("*ssm*/seed*/final.pt"))
    if args.redo:
        again = {t[:2] for t in todo}
        done = done[[k not in again for k in zip(done.variant, done.seed.astype(int), strict=True)]]
    have = set(zip(done.variant, done.seed.astype(int), strict=True))
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
        median = round(float(r.channels.fade_400.median()), 4)
        for s in r.summary.itertuples():
            rows.append({"variant": variant, "seed": seed, "block": s.block, "order": s.order,
                         "channels": s.channels, "of": s.of, "best_horizon": round(float(s.best_horizon), 1),
                         "beyond": s.beyond, **_best_fades(r.channels, s.block, s.order),
                         "median_fade_400": median, **{k: passed.get(k) for k in COLUMNS[-3:]}})
    if rows:
        out = pd.concat([done, pd.DataFrame(rows)], ignore_index=True).sort_values(["variant", "seed", "block",
                                                                                    "order"])
        # in window order, as probe.transitions writes them: each window's fade, then each window's phase error
        windows = [c for c in out if c.startswith("fade_win_")] + [c for c in out if c.startswith("phase_win_")]
        at = COLUMNS.index("fade_400") + 1
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        out.reindex(columns=COLUMNS[:at] + windows + COLUMNS[at:]).to_csv(tmp, index=False)
        tmp.replace(args.out)
    read = len({(r["variant"], r["seed"]) for r in rows})
    print(f"{args.out}: {read} runs read{' (their rows replaced)' if args.redo else ''}, {len(have)} kept as they "
          "were", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
