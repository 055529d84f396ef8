"""Grids of variants x seeds, run by a local process pool or by Ray, resumable, aggregated with t-intervals.

Usage: ``python -m probe.sweep CONFIG.toml --out DIR`` (see ``--help``). API: ``load_config`` or
``config_from_presets`` -> ``run_sweep(cfg, out, make_executor("local"))`` -> ``aggregate(out)``.
"""

from probe.results.config import Run, SweepConfig, Variant, config_from_presets, load_config
from probe.sweep.aggregate import SweepReport, aggregate, markdown_table, write_report
from probe.sweep.executors import LocalExecutor, RayExecutor, make_executor
from probe.sweep.runner import SweepOutcome, run_sweep
from probe.sweep.worker import RunOptions, RunResult, execute_run

__all__ = [
    "LocalExecutor", "RayExecutor", "Run", "RunOptions", "RunResult", "SweepConfig", "SweepOutcome", "SweepReport",
    "Variant", "aggregate", "config_from_presets", "execute_run", "load_config", "make_executor", "markdown_table",
    "run_sweep", "write_report",
]
