"""``python -m probe.results collect SRC DST``: a sweep's finished runs into a grid in compact form.

The command line lives apart from the library (``probe.results``) because it reads a sweep's TOML through
``probe.sweep``, which itself reads grids through ``probe.results``: kept here, nothing imports it back.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from probe.errors import ProbeError
from probe.results import import_runs
from probe.results.config import load_config
from probe.runner import Command, CommandGroup, CommandOptions, Report, check_writable, option

# --- the command line ----------------------------------------------------------------------------------------------
_COLLECT = """\
SRC is a sweep's --out directory (VARIANT/seedS/eval.json, with final.pt and metrics.jsonl where kept) or a
probe.evaluate --json file over .../VARIANT/seedS/final.pt checkpoints (runs.json beside it adds wall times). DST
gets runs.jsonl, curves.csv and training.csv (windows.csv where the evaluation had windows). Runs DST already holds
that SRC lacks are kept, so a grid run in parts (seeds 0-2, later 3-7) is collected part by part; a run in both is
replaced by SRC's. --config supplies what old run folders do not record (precision, switch step) when SRC has no
sweep.json. Then python -m probe.sweep DST --report --in-place writes the grid's tables and figures beside it."""


@dataclass
class CollectOptions(CommandOptions):
    """``python -m probe.results collect SRC DST [--config SWEEP.toml]``."""

    src: str = option("", "a sweep's --out directory, or a probe.evaluate --json file", positional=True)
    dst: str = option("", "the grid's directory (created if needed)", positional=True)
    config: str | None = option(None, "the sweep's TOML, where SRC has no sweep.json")
    # every command takes it, so that a script can pass it everywhere; collecting draws no bar
    no_progress: bool = option(False, "accepted for a uniform command line (collect shows no progress)", order=7)


def collect(opts: CollectOptions) -> Report:
    """Import SRC's finished runs into the grid DST; one line on stderr says what DST holds."""
    src, dst = Path(opts.src), Path(opts.dst)
    if not src.exists():
        raise ProbeError(f"{src}: no such file or directory")
    if dst.exists() and not dst.is_dir():
        raise ProbeError(f"{dst}: a file is in the way; DST names a directory")
    check_writable(dst, "DST")
    config = load_config(opts.config).to_dict() if opts.config else None
    grid = import_runs(src, dst, config)
    print(f"{dst}: {len(grid.runs)} runs of {len(grid.variants)} variants ({', '.join(grid.variants)}); "
          f"python -m probe.sweep {dst} --report --in-place writes its tables", file=sys.stderr)
    return Report([], [])


COMMAND = CommandGroup("results", "Grids of results in compact form.", (
    Command("collect", CollectOptions, collect, "Import a sweep's finished runs into a grid in compact form.",
            _COLLECT, results_file=False, summary="a sweep's finished runs into a grid in compact form"),
))
main, build_parser = COMMAND.main, COMMAND.build_parser


if __name__ == "__main__":
    raise SystemExit(main())
