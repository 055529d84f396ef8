"""``python -m probe.results collect SRC DST``: a sweep's finished runs into a grid in compact form.

The command line lives apart from the library (``probe.results``) because it reads a sweep's TOML through
``probe.sweep``, which itself reads grids through ``probe.results``: kept here, nothing imports it back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from probe.cli import make_parser, run_cli
from probe.errors import ProbeError
from probe.results import import_runs
from probe.results.config import load_config
from probe.runner import check_writable

# --- the command line ----------------------------------------------------------------------------------------------
_COLLECT = """\
SRC is a sweep's --out directory (VARIANT/seedS/eval.json, with final.pt and metrics.jsonl where kept) or a
probe.evaluate --json file over .../VARIANT/seedS/final.pt checkpoints (runs.json beside it adds wall times). DST
gets runs.jsonl, curves.csv and training.csv (windows.csv where the evaluation had windows). Runs DST already holds
that SRC lacks are kept, so a grid run in parts (seeds 0-2, later 3-7) is collected part by part; a run in both is
replaced by SRC's. --config supplies what old run folders do not record (precision, switch step) when SRC has no
sweep.json. Then python -m probe.sweep DST --report --in-place writes the grid's tables and figures beside it."""


def main(argv: list[str] | None = None) -> int:
    """``python -m probe.results collect SRC DST [--config SWEEP.toml]``: a bad input is one line and exit code 2."""
    parser = make_parser("python -m probe.results", "Grids of results in compact form.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    collect = commands.add_parser("collect", help="a sweep's finished runs into a grid in compact form",
                                  description="Import a sweep's finished runs into a grid in compact form.",
                                  epilog=_COLLECT, formatter_class=argparse.RawDescriptionHelpFormatter)
    collect.add_argument("src", help="a sweep's --out directory, or a probe.evaluate --json file")
    collect.add_argument("dst", help="the grid's directory (created if needed)")
    collect.add_argument("--config", help="the sweep's TOML, where SRC has no sweep.json")
    # every command takes it, so that a script can pass it everywhere; collecting draws no bar
    collect.add_argument("--no-progress", action="store_true", help="accepted for a uniform command line (collect "
                                                                    "shows no progress)")

    def body(args: argparse.Namespace) -> dict[str, Any]:
        src, dst = Path(args.src), Path(args.dst)
        if not src.exists():
            raise ProbeError(f"{src}: no such file or directory")
        if dst.exists() and not dst.is_dir():
            raise ProbeError(f"{dst}: a file is in the way; DST names a directory")

        check_writable(dst, "DST")
        config = None
        if args.config:
            config = load_config(args.config).to_dict()
        grid = import_runs(src, dst, config)
        print(f"{dst}: {len(grid.runs)} runs of {len(grid.variants)} variants ({', '.join(grid.variants)}); "
              f"python -m probe.sweep {dst} --report --in-place writes its tables", file=sys.stderr)
        return {}

    return run_cli(parser, body, argv, emits_json=False)


if __name__ == "__main__":
    raise SystemExit(main())
