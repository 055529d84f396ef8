"""Import a sweep's finished runs into a committed grid of ``results/`` in compact form, and re-aggregate it.

Usage: ``python scripts/collect_runs.py SRC DST [--config sweeps/NAME.toml] [--no-report]``. SRC is a sweep's
``--out`` directory (``VARIANT/seedS/eval.json``, with final.pt and metrics.jsonl where kept) or a ``probe.evaluate
--json`` file over ``.../VARIANT/seedS/final.pt`` checkpoints (``runs.json`` beside it adds wall times). Runs already
in DST that SRC lacks are kept, so a grid run in parts (seeds 0-2, later 3-7) is collected part by part; a run in
both is replaced by SRC's. ``--config`` supplies what old run folders do not record (precision, switch step) when
SRC has no ``sweep.json``. Writes DST/runs.jsonl, DST/curves.csv, DST/training.csv, then (unless --no-report)
``python -m probe.sweep DST --report``'s results.json and results.md (``--figure``, ``--compare``: as the sweep's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from probe.errors import ProbeError
from probe.results import import_runs
from probe.sweep.config import load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="a sweep's --out directory, or an evaluate --json file")
    parser.add_argument("dst", type=Path, help="the grid's directory under results/")
    parser.add_argument("--config", type=Path, help="the sweep's TOML, if SRC has no sweep.json")
    parser.add_argument("--no-report", action="store_true", help="only the compact files")
    parser.add_argument("--figure", action="store_true", help="also the report's accuracy-vs-length figure")
    parser.add_argument("--compare", nargs="+", metavar="VARIANT", default=[],
                        help="also the report's comparisons against these baselines (and their figure)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config).to_dict() if args.config else None
        if args.dst.exists() and not args.dst.is_dir():
            raise ProbeError(f"{args.dst}: a file is in the way; DST names a directory")
        grid = import_runs(args.src, args.dst, config)
        print(f"{args.dst}: {len(grid.runs)} runs of {len(grid.variants)} variants "
              f"({', '.join(grid.variants)})", file=sys.stderr)
        if not args.no_report:
            from probe.sweep.cli import main as sweep_main

            argv = [str(args.dst), "--report", *(["--compare", *args.compare] if args.compare else [])]
            return sweep_main(argv + ([] if args.figure else ["--no-figure"]))
    except ProbeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
