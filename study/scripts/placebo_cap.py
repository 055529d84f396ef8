"""The placebo's per-step norm log, summarised per run into its grid's placebo_cap.csv.

Usage: ``python study/scripts/placebo_cap.py RUNS OUT`` (study/scripts/collect_grid.sh runs it for coadaptation2).
RUNS is a sweep's ``--out`` directory (``VARIANT/seedS/metrics.jsonl``), OUT the grid's results folder. The
``placebo`` schedule (probe/training/policies.py, ``MlpPlacebo``) logs one line per step: the norm of block 0's
LSTM's gradient through attention (``placebo_attention_norm``: the target, what ``stopgrad-rnn0`` removes), the norm
of its path through the MLPs (``placebo_mlp_norm``: the source), the norm it removed from that path and whether the
cap bound (the MLP path held less than the target, so all of it was removed and the removal fell short). 4500 such
lines a run are too many to commit (``probe.results collect`` keeps only the evaluation lines); the match needs
only this summary, one row per finished run (``eval.json`` present) whose log has them:

- ``steps`` logged, ``bound_steps`` (the cap bound) and ``bound_steps_early`` (of them, those at steps 1-EARLY:
  the window in which withholding attention's gradient was found to be enough, ``rnn0-until1000``);
- ``ratio_median``, ``ratio_min``: the removed norm over the target norm, per step (1 where the cap did not bind;
  steps with a zero target left out); ``ratio_total``: removed over target, each summed over the steps;
- ``attention_norm_median``, ``mlp_norm_median``: each path's norm, median over steps; ``scale_median``,
  ``scale_max``: the share of the MLP path removed.

Rows of runs that RUNS does not hold are kept, so the file follows a grid as it lands, as collect does.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

FILE = "placebo_cap.csv"
EARLY = 1000
COLUMNS = ["variant", "seed", "steps", "bound_steps", "bound_steps_early", "ratio_median", "ratio_min",
           "ratio_total", "attention_norm_median", "mlp_norm_median", "scale_median", "scale_max"]
_KEYS = ("placebo_attention_norm", "placebo_mlp_norm", "placebo_removed_norm", "placebo_scale", "placebo_cap_bound")
_DIGITS = 6  # as training.csv: a summary for a table and a threshold, not for recomputation


def _round(x: float) -> float:
    return x if not math.isfinite(x) else float(f"{x:.{_DIGITS}g}")


def summarize(lines: list[dict]) -> dict[str, float | int] | None:
    """The summary of one run's log lines (``metrics.jsonl`` parsed), or None when it has no placebo line. A step
    logged twice (a log written before a resume trimmed it) counts once, its last line."""
    by_step = {int(r["step"]): r for r in lines if all(k in r for k in _KEYS)}
    if not by_step:
        return None
    log = pd.DataFrame([by_step[s] for s in sorted(by_step)])
    target, removed = log.placebo_attention_norm.to_numpy(float), log.placebo_removed_norm.to_numpy(float)
    bound = log.placebo_cap_bound.astype(bool).to_numpy()
    some = target > 0
    ratio = removed[some] / target[some]
    return {"steps": len(log), "bound_steps": int(bound.sum()),
            "bound_steps_early": int((bound & (log.step.to_numpy() <= EARLY)).sum()),
            "ratio_median": _round(float(np.median(ratio))) if len(ratio) else math.nan,
            "ratio_min": _round(float(ratio.min())) if len(ratio) else math.nan,
            "ratio_total": _round(float(removed.sum() / target.sum())) if target.sum() > 0 else math.nan,
            "attention_norm_median": _round(float(np.median(target))),
            "mlp_norm_median": _round(float(log.placebo_mlp_norm.median())),
            "scale_median": _round(float(log.placebo_scale.median())),
            "scale_max": _round(float(log.placebo_scale.max()))}


def read_runs(runs: Path) -> pd.DataFrame:
    """A summary row for every finished run under ``runs`` whose ``metrics.jsonl`` holds placebo lines."""
    rows = []
    for folder in sorted(p.parent for p in runs.glob("*/seed*/eval.json")):
        metrics = folder / "metrics.jsonl"
        if not metrics.exists():
            continue
        lines = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
        summary = summarize(lines)
        if summary is not None:
            rows.append({"variant": folder.parent.name, "seed": int(folder.name.removeprefix("seed")), **summary})
    return pd.DataFrame(rows, columns=COLUMNS)


def collect(runs: Path, out: Path) -> pd.DataFrame:
    """``out/placebo_cap.csv`` with the runs of ``runs`` (replacing their rows) and every other row kept."""
    new = read_runs(runs)
    path = out / FILE
    if path.exists():
        old = pd.read_csv(path)
        keys = set(zip(new.variant, new.seed, strict=True))
        old = old[[(v, s) not in keys for v, s in zip(old.variant, old.seed, strict=True)]]
        new = pd.concat([old, new], ignore_index=True) if len(new) else old
    new = new.sort_values(["variant", "seed"]).reset_index(drop=True)
    if len(new):
        out.mkdir(parents=True, exist_ok=True)
        new[COLUMNS].to_csv(path, index=False)
    return new


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", type=Path, help="a sweep's --out directory (VARIANT/seedS/metrics.jsonl)")
    p.add_argument("out", type=Path, help="the grid's results folder (placebo_cap.csv is written there)")
    args = p.parse_args(argv)
    if not args.runs.is_dir():
        print(f"{args.runs}: no such run folder", file=sys.stderr)
        return 2
    table = collect(args.runs, args.out)
    print(f"{args.out / FILE}: {len(table)} placebo runs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
