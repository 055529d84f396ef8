"""Formatting shared by the blocks of README.md and docs/*.md that quote study/results/ (doc_blocks*.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probe.core.stats import t_interval
from probe.results import Grid, load_grid


def pct(x: float) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def mean_ci(values: Sequence[float]) -> str:
    """Mean with its 95 % t-interval over seeds, in %, clipped to [0, 100] (accuracy cannot leave it)."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return pct(values.mean()) if len(values) else "–"
    iv = t_interval(values)
    return f"{pct(iv.estimate)} [{pct(max(iv.low, 0.0))}, {pct(min(iv.high, 1.0))}]"


def per_seed(values: Sequence[float]) -> str:
    return " / ".join(pct(v) for v in values)


def rows_of(results: list[dict[str, Any]] | dict[str, Any]) -> list[dict[str, Any]]:
    """An envelope's ``results`` as a list of rows: as an analysis writes them, or as tables of rows that share their
    columns (``{"tables": [{"columns": [...], "rows": [[...], ...]}]}``, the form compact_results.py commits)."""
    if isinstance(results, list):
        return results
    return [dict(zip(t["columns"], row, strict=True)) for t in results["tables"] for row in t["rows"]]


def read_envelope(path: Path) -> dict[str, Any]:
    """A JSON envelope (``{..., "results", "controls"}``) with its results as a list of dicts, in either form."""
    obj = json.loads(Path(path).read_text())
    return {**obj, "results": rows_of(obj.get("results", []))}


def results_dir(root: Path) -> Path:
    """The committed results of the study, in the repository at ``root``."""
    return root / "study" / "results"


def grid_of(root: Path, name: str) -> Grid:
    return load_grid(results_dir(root) / name)


def col(runs: pd.DataFrame, name: str) -> pd.Series:
    """A column of a grid's runs, or NaN for each run where no run has it (a grid evaluated only to 4x has no 16x)."""
    return runs[name] if name in runs else pd.Series(np.nan, index=runs.index)


def runs_of(grid: Grid, variant: str) -> pd.DataFrame:
    return grid.runs[grid.runs.variant == variant].sort_values("seed")


def table(header: Sequence[str], rows: list[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def p_text(x: float) -> str:
    return "–" if not np.isfinite(x) else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")
