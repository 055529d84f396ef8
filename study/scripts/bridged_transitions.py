"""Read "can this recurrence count?" from every trained model of the bridged grid into its results folder.

Usage: ``python study/scripts/bridged_transitions.py RUNS [--out study/results/bridged/transitions.csv]
[--samples 32]``. RUNS is the grid's ``--out`` directory (``VARIANT/seedS/final.pt``, study/sweeps/bridged.toml).
One row per run and recurrent layer (and ``all``): the range of the eigenvalues of the transitions the trained model
computes on the task's sequences at L_train (``probe.transitions.can_count``), whether they can count mod m, and
whether the run's checks passed (``state_reproduction``, ``negated`` and ``longer_sequences``:
``probe.transitions.bridged_controls``). The pre-registered claims (study/claims_bridged.toml) rest on these reading
"cannot" after training, as they did at initialisation: a "can" here would refute the premise for that run, whatever
its accuracy. A run whose recurrence has no linear transition (the LSTM variants) gets one row with the one-line
reason. Runs already in the file are skipped, so the script can follow the grid as it lands.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from probe.core.progress import progress_iter
from probe.transitions import analyze

COLUMNS = ["variant", "seed", "layer", "range", "can_count", "max_phase", "min_real", "max_modulus",
           "state_reproduction", "negated", "longer_sequences", "note"]


def read_run(path: Path, samples: int) -> list[dict]:
    """The rows of one run's final.pt (``analyze`` loads it with ``torch.load(weights_only=True)``)."""
    variant, seed = path.parent.parent.name, int(re.fullmatch(r"seed(\d+)", path.parent.name)[1])
    result = analyze(path, n_samples=samples)
    if result.note:
        return [{"variant": variant, "seed": seed, "layer": "all", "note": result.note}]
    checks = {c["control"]: bool(c["passed"]) for c in result.controls}
    return [{"variant": variant, "seed": seed, **{k: row.get(k) for k in ("layer", "range", "can_count", "max_phase",
                                                                          "min_real", "max_modulus")},
             **{name: checks.get(name) for name in ("state_reproduction", "negated", "longer_sequences")},
             "note": ""} for row in result.can_count.to_dict("records")]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, default=Path("study/results/bridged/transitions.csv"))
    parser.add_argument("--samples", type=int, default=32)
    args = parser.parse_args(argv)
    done = pd.read_csv(args.out) if args.out.exists() else pd.DataFrame(columns=COLUMNS)
    seen = set(zip(done.variant, done.seed, strict=True))
    todo = [p for p in sorted(args.runs.glob("*/seed*/final.pt"))
            if (p.parent.parent.name, int(p.parent.name[4:])) not in seen]
    runs = progress_iter(todo, "transitions", enabled=sys.stderr.isatty())
    rows = [r for p in runs for r in read_run(p, args.samples)]
    if rows:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table = pd.concat([done, pd.DataFrame(rows)], ignore_index=True)[COLUMNS]
        table.sort_values(["variant", "seed"], kind="stable").to_csv(args.out, index=False)
    print(f"{len(todo)} run(s) read into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
