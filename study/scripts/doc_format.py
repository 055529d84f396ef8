"""Formatting shared by the blocks of README.md and docs/*.md that quote study/results/ (doc_blocks*.py)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probe.core.stats import min_attainable_p, t_interval
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
    """A committed grid, read once per process while its files stay as they are (one render reads each grid a dozen
    times); a copy, so that a block that edits its frames edits only its own."""
    path = results_dir(root) / name
    files = tuple(sorted((f.name, f.stat().st_mtime_ns, f.stat().st_size)
                         for f in (path.iterdir() if path.is_dir() else [path]) if f.is_file()))
    grid = _grid_read(path.resolve(), files)
    return dataclasses.replace(grid, runs=grid.runs.copy(), curves=grid.curves.copy(),
                               training=grid.training.copy(), windows=grid.windows.copy(),
                               checkpoints=dict(grid.checkpoints))


@functools.lru_cache(maxsize=64)
def _grid_read(path: Path, files: tuple[tuple[str, int, int], ...]) -> Grid:
    # `files` (each file's name, mtime and size) is only the key: a grid whose files change is read again
    return load_grid(path)


def col(runs: pd.DataFrame, name: str) -> pd.Series:
    """A column of a grid's runs, or NaN for each run where no run has it (a grid evaluated only to 4x has no 16x)."""
    return runs[name] if name in runs else pd.Series(np.nan, index=runs.index)


def runs_of(grid: Grid, variant: str) -> pd.DataFrame:
    return grid.runs[grid.runs.variant == variant].sort_values("seed")


def table(header: Sequence[str], rows: list[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def precision_sentence(runs: pd.DataFrame) -> str:
    """What a grid's runs trained in, as each run's checkpoint records it (``probe.hardware.trained_as``): one
    precision for all, or each with its runs named, a run resumed in another precision (``... (from step N)``) among
    them. ``auto`` is a request, not a record (a run folder without final.pt gives its config's), so it counts as
    unrecorded. A grid that spans sessions on different CPUs can mix precisions under ``train.precision=auto``; its
    comparisons are read knowing so."""
    p = _recorded(runs, "precision", "auto")
    if (p == "unrecorded").all():
        return f"The runs' precision is not recorded ({_n_runs(len(p))})."
    if p.nunique() == 1:
        return f"Trained in {p.iloc[0]}: all {len(p)} runs, as their checkpoints record."
    parts = []
    for value, g in runs.assign(_p=p).groupby("_p", sort=True):
        named = "; ".join(f"`{variant}` seed{'s' if len(r) > 1 else ''} "
                          + ", ".join(map(str, sorted(r.seed.astype(int))))
                          for variant, r in g.groupby("variant", sort=True))
        parts.append(f"{value} in {len(g)} ({named})")
    return ("Trained in more than one precision, as the runs' checkpoints record (e.g. a grid resumed on a CPU where "
            "`auto` resolves otherwise): " + ". ".join(parts) + ".")


def device_sentence(runs: pd.DataFrame) -> str:
    """Where a grid's runs trained, as each run records it (``trained_on``; ``probe.hardware.device_name``): one
    device for all, or each device with its runs counted and their seeds. bf16 kernels differ between CPUs with
    native bf16 (AMX, avx512_bf16), so a grid that spans sessions on different CPUs says so beside its precision;
    a run without the record counts as unrecorded."""
    d = _recorded(runs, "trained_on", "")
    if (d == "unrecorded").all():
        return f"Where the runs trained is not recorded ({_n_runs(len(d))})."
    if d.nunique() == 1:
        return f"Trained on one device, {d.iloc[0]}: all {len(d)} runs."
    parts = [f"{value}: {_n_runs(len(g))} (seed{'s' if g.seed.nunique() > 1 else ''} "
             + ", ".join(map(str, sorted(g.seed.astype(int).unique()))) + ")"
             for value, g in runs.assign(_d=d).groupby("_d", sort=True)]
    return f"Trained on {d.nunique()} devices, as the runs record: " + "; ".join(parts) + "."


def _recorded(runs: pd.DataFrame, name: str, not_a_record: str) -> pd.Series:
    """Each run's ``name`` where it records one, else ``unrecorded`` (missing, or ``not_a_record``)."""
    out = pd.Series("unrecorded", index=runs.index, dtype=object)
    if name in runs:
        known = runs[name].notna() & (runs[name].astype(str) != not_a_record)
        out = out.where(~known, runs[name].astype(object))
    return out


def _n_runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def p_text(x: float) -> str:
    return "–" if not np.isfinite(x) else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")


# --- tests that can reject, or none ---------------------------------------------------------------------------------
ALPHA = 0.05
"""The level every comparison in the docs is judged at, after adjustment for its family."""


def design_min_p(design: str, n: int, m: int | None = None) -> float:
    """The smallest two-sided exact p a design allows: ``"seeds"`` (two groups of n and m seeds, a permutation test of
    the difference of means), ``"pairs"`` (n paired differences, a sign-flip test) or ``"pairings"`` (n runs, a
    permutation test of a rank correlation: 2 / n!)."""
    if design == "seeds":
        return min_attainable_p(n, m)
    if design == "pairs":
        return min_attainable_p(n, paired=True)
    if design == "pairings":
        return min(1.0, 2 / math.factorial(n)) if n >= 2 else math.nan
    raise ValueError(f"design {design!r}: seeds, pairs or pairings")


def min_adjusted(design: str, n: int, m: int | None = None, family: int = 1) -> float:
    """The smallest adjusted p a test of this design can reach in a family of ``family`` tests: its smallest p times
    the family size (Holm's adjustment of the family's smallest p; ``can_reject``'s rule)."""
    return min(1.0, family * design_min_p(design, n, m))


def can_reach(design: str, n: int, m: int | None = None, family: int = 1) -> bool:
    """Whether a test of this design is worth running: its smallest adjusted p is below ALPHA."""
    return min_adjusted(design, n, m, family) < ALPHA


def min_adjusted_text(design: str, n: int, m: int | None = None, family: int = 1) -> str:
    """``"27 × 6.7e-04 = 0.018"``: the family size, the design's smallest p and their product, as a table cell. The
    design's p keeps two significant digits (2/924 is 0.0022, not 0.002: the cell must let a reader recompute it)."""
    p_min = design_min_p(design, n, m)
    shown = f"{p_min:.2g}" if 0.001 <= p_min < 0.01 else p_text(p_min)
    return f"{family} × {shown} = {p_text(min_adjusted(design, n, m, family))}"


def design_text(design: str, n: int, m: int | None = None) -> str:
    return {"seeds": f"{n} vs {m} seeds", "pairs": f"{n} non-zero paired differences", "pairings": f"{n} runs"}[design]


def descriptive(design: str, n: int, m: int | None = None, family: int = 1) -> str:
    """Why a comparison is shown without a p, e.g. ``"descriptive: 5 vs 5 seeds cannot reach adjusted p < 0.05 in a
    family of 14 (smallest attainable 14 × 0.008 = 0.111), so no test"``."""
    return (f"descriptive: {design_text(design, n, m)} cannot reach adjusted p < {ALPHA} in a family of {family} "
            f"(smallest attainable {min_adjusted_text(design, n, m, family)}), so no test")
