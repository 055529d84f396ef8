"""Aggregate a sweep over seeds: per variant the mean, a t-interval and every seed's value at each reported length,
from the run folders or from the compact form committed under ``results/``."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probe.checkpoint import load_checkpoint
from probe.cli import envelope
from probe.core.files import atomic_path, write_text_atomically
from probe.core.stats import fraction_above, t_interval
from probe.core.tables import pipe_table
from probe.errors import ProbeError
from probe.results import FACTORS, SOLVED, Grid, has_run_folders, is_compact, load_grid, write_grid
from probe.results.config import SWEEP_FILE, config_from_dict
from probe.sweep.plots import plot_sweep, plot_windows
from probe.sweep.worker import EVAL

RESULTS, TABLE, FIGURE = "results.json", "results.md", "accuracy_vs_length.png"
WINDOW_FIGURE = "accuracy_by_window.png"
_SEED_DIR = re.compile(r"^seed(-?\d+)$")


@dataclass
class SweepReport:
    """What ``results.json`` holds, as DataFrames: ``curves`` (variant, run, seed, train_length, length, subtask,
    token_acc, seq_acc, n_tokens), ``scores`` (variant, run, seed, subtask, lengthgen_score), ``summary`` (one row
    per variant x subtask x metric x length), ``bands`` (variant, subtask, length, mean, ci_low, ci_high),
    ``windows`` (one row per variant x subtask x window of positions: the metric of record, ``probe.windows``)."""

    name: str
    curves: pd.DataFrame
    scores: pd.DataFrame
    summary: pd.DataFrame
    bands: pd.DataFrame
    result: dict[str, Any]
    grid: Grid | None = None
    windows: pd.DataFrame | None = None

    @property
    def missing(self) -> list[str]:
        return self.result["missing"]


def sweep_members(out: Path) -> tuple[str, list[tuple[str, int]]]:
    """The sweep's name and its (variant, seed) runs: those of ``DIR/sweep.json`` plus every other finished run
    folder of its variants (a grid run in parts records only its last part), else every ``VARIANT/seedS`` folder."""
    found = []
    for ev in out.glob(f"*/seed*/{EVAL}"):
        m = _SEED_DIR.match(ev.parent.name)
        if m:
            found.append((ev.parent.parent.name, int(m.group(1))))
    path = out / SWEEP_FILE
    if path.exists():
        cfg = config_from_dict(json.loads(path.read_text())["config"], str(path))
        members = [(r.variant, r.seed) for r in cfg.runs(out)]
        variants = [v for v, _ in members]
        extra = sorted(set(found) - set(members), key=lambda vs: (variants.index(vs[0]), vs[1])
                       if vs[0] in variants else (len(variants), vs[1]))
        members += [vs for vs in extra if vs[0] in variants]
        order = list(dict.fromkeys(v for v, _ in members))
        return cfg.name, sorted(members, key=lambda vs: (order.index(vs[0]), vs[1]))
    if not found:
        raise ProbeError(f"{out}: no {SWEEP_FILE} and no VARIANT/seedS/{EVAL}; is this a sweep's --out directory?")
    return out.name, sorted(found)


def _weights_digest(state_dict: dict[str, Any]) -> str:
    import torch

    h = hashlib.sha256()
    for name in sorted(state_dict):
        h.update(name.encode())
        h.update(state_dict[name].detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _controls(grid: Grid) -> list[dict[str, Any]]:
    """Checks that need the checkpoints (run folders only; the compact form has none)."""
    controls, digests = [], {}
    for run, path in grid.checkpoints.items():
        ckpt = load_checkpoint(path)
        seed = int(run.rsplit("seed", 1)[1])
        digests[run] = _weights_digest(ckpt.state_dict)
        # Could fail: a sweep that dropped or mixed up seeds trains a run whose checkpoint says another seed.
        controls.append({"control": "seed_matches_folder", "run": run, "checkpoint": f"{run}/final.pt",
                         "checkpoint_seed": ckpt.seed, "passed": ckpt.seed == seed})
    for variant in grid.variants:
        runs = [r for r in digests if r.split("/")[0] == variant]
        if len(runs) >= 2:
            # Could fail: seeds that do not reach the trainer (or a copied folder) give identical weights.
            distinct = len({digests[r] for r in runs})
            controls.append({"control": "seeds_give_distinct_weights", "variant": variant, "runs": len(runs),
                             "distinct": distinct, "passed": distinct == len(runs)})
    return controls


def aggregate(out: str | Path) -> SweepReport:
    """Read a sweep's runs in ``out`` (run folders, or the compact form) into a ``SweepReport``; nothing is
    trained or evaluated."""
    out = Path(out)
    if not out.is_dir():
        raise ProbeError(f"{out}: no such sweep directory")
    missing: list[str] = []
    if has_run_folders(out) or (out / SWEEP_FILE).exists() and not is_compact(out):
        name, members = sweep_members(out)
        grid = load_grid(out, members)
        missing = [f"{v}/seed{s}" for v, s in members if f"{v}/seed{s}" not in set(grid.runs.get("run", []))]
        # a run folder with eval.json but no final.pt is unfinished (the checkpoint is the evidence)
        unfinished = [r for r in grid.runs.get("run", []) if not (out / r / "final.pt").exists()
                      and (out / r).is_dir()]
        if unfinished:
            missing += unfinished
            grid = load_grid(out, [(r.split("/")[0], int(r.rsplit("seed", 1)[1]))
                                   for r in grid.runs.run if r not in unfinished])
    elif is_compact(out):
        grid = load_grid(out)
        name = grid.name
    else:
        raise ProbeError(f"{out}: no finished run (VARIANT/seedS/{EVAL} with final.pt) and no compact grid "
                         f"(runs.jsonl) to aggregate")
    if grid.runs.empty:
        raise ProbeError(f"{out}: no finished run (VARIANT/seedS/{EVAL} with final.pt) to aggregate")
    controls = _controls(grid) if grid.checkpoints else []
    curves = grid.curves
    scores = _scores(grid)
    order = grid.variants
    summary = _summary(grid, order)
    bands = _bands(curves, order)
    windows = window_summary(grid.windows, order)
    # per-run values are in runs.jsonl and curves.csv beside it; the envelope holds what is computed over seeds
    rows = [_ints(r) for r in summary.to_dict("records")] + [_ints(r) for r in windows.to_dict("records")]
    extra: dict[str, Any] = {"sweep": name, "missing": missing, "source": grid.source}
    if not grid.checkpoints:
        extra["controls_not_run"] = "no checkpoints here (compact form): the seed controls need each run's final.pt"
    result = envelope("sweep", sorted(grid.checkpoints and [f"{r}/final.pt" for r in grid.checkpoints]),
                      rows, controls, **extra)
    return SweepReport(name, curves, scores, summary, bands, result, grid, windows)


def _ints(row: dict[str, Any]) -> dict[str, Any]:
    """Counts and lengths as integers (a DataFrame with a missing value turns a whole column into floats)."""
    return {k: int(v) if k in ("factor", "length", "n_seeds", "seeds_above_90") and pd.notna(v) else v
            for k, v in row.items()}


def _scores(grid: Grid) -> pd.DataFrame:
    rows = []
    for r in grid.runs.itertuples():
        for subtask in ("state", "recall", "all"):
            value = getattr(r, f"{subtask}_score", None)
            if value is not None and np.isfinite(value):
                rows.append({"variant": r.variant, "run": r.run, "seed": r.seed, "subtask": subtask,
                             "lengthgen_score": float(value)})
    return pd.DataFrame(rows, columns=["variant", "run", "seed", "subtask", "lengthgen_score"])


def _summary_row(variant: str, subtask: str, metric: str, factor: int | None, length: int | None,
                 per_seed: pd.Series) -> dict[str, Any]:
    per_seed = per_seed.dropna()
    ci = t_interval(per_seed.to_numpy())
    # accuracies live in [0, 1]: cutting the interval there keeps its coverage
    row = {"row": "summary", "checkpoint": None, "variant": variant, "subtask": subtask, "metric": metric,
           "factor": factor, "length": length, "n_seeds": ci.n, "mean": ci.estimate,
           "ci_low": max(0.0, ci.low) if ci.finite else np.nan, "ci_high": min(1.0, ci.high) if ci.finite else np.nan}
    if metric != "lengthgen_score":
        solved, n = fraction_above(per_seed.to_numpy(), SOLVED)
        row["seeds_above_90"] = solved
    return row | {f"seed_{s}": float(v) for s, v in per_seed.items()}


def _summary(grid: Grid, order: list[str]) -> pd.DataFrame:
    curves, rows = grid.curves, []
    scores = _scores(grid)
    for variant in order:
        for subtask in ("state", "recall", "all"):
            part = curves[(curves.variant == variant) & (curves.subtask == subtask)]
            if part.empty or part.token_acc.isna().all():
                continue  # a subtask this task never asks
            for f in FACTORS:
                at = part[part.length == f * part.train_length]
                if len(at):
                    length = int(f * at.train_length.iloc[0])
                    for metric in ("token_acc", "seq_acc"):
                        rows.append(_summary_row(variant, subtask, metric, f, length, at.set_index("seed")[metric]))
            sc = scores[(scores.variant == variant) & (scores.subtask == subtask)]
            rows.append(_summary_row(variant, subtask, "lengthgen_score", None, None,
                                     sc.set_index("seed").lengthgen_score))
    return pd.DataFrame(rows)


def window_summary(windows: pd.DataFrame, order: list[str] | None = None) -> pd.DataFrame:
    """Per variant, subtask and window of stream positions: mean token accuracy with a 95 % t-interval over seeds,
    the seeds above 90 %, the chance floor and every seed's value (``seed_S``): rows ``row="window"``,
    ``metric="window_token_acc"``."""
    rows: list[dict[str, Any]] = []
    if windows is None or windows.empty:
        return pd.DataFrame(rows)
    order = order or list(dict.fromkeys(windows.variant))
    for variant in order:
        part = windows[windows.variant == variant]
        for (subtask, window), g in part.groupby(["subtask", "window"], sort=False):
            row = _summary_row(variant, str(subtask), "window_token_acc", None, None, g.set_index("seed").token_acc)
            rows.append({**row, "row": "window", "window": window, "lo": int(g.lo.iloc[0]), "hi": int(g.hi.iloc[0]),
                         "beyond": bool(g.beyond.iloc[0]), "chance": float(g.chance.iloc[0])})
    return pd.DataFrame(rows)


def windows_markdown(report: SweepReport) -> str:
    """The metric of record as Markdown: per variant and subtask (state, its factors, recall), token accuracy (%)
    per window of stream positions, mean [95 % t-interval] and the seeds above 90 %, beside chance; then every
    seed's values per window."""
    w = report.windows
    if w is None or w.empty:
        return ""
    names = list(dict.fromkeys(w.window))
    head = ["variant", "subtask", "seeds", "chance", *names]
    seed_cols = sorted((c for c in w.columns if c.startswith("seed_")), key=lambda c: int(c[5:]))
    rows, per_seed = [], []
    for (variant, subtask), g in w.groupby(["variant", "subtask"], sort=False):
        by = {r["window"]: r for r in g.to_dict("records")}
        cells = [variant, subtask, str(int(g.n_seeds.max())), _pct(g.chance.iloc[0])]
        cells += [_cell(g[g.window == n]) + f" · {int(by[n]['seeds_above_90'])}/{int(by[n]['n_seeds'])}"
                  if n in by else "–" for n in names]
        rows.append(cells)
        per_seed.append([variant, subtask, *(" / ".join(_pct(by[n][c]) if n in by and c in by[n] else "–"
                                                        for n in names) if g[c].notna().any() else "–"
                                             for c in seed_cols)])
    lines = [f"Per window of stream positions (the metric of record): token accuracy (%), mean [95 % t-interval] over "
             f"seeds, and seeds > 90 %. Sweep `{report.name}`.", "", pipe_table(head, rows), "",
             "Per seed: token accuracy (%) in each window, " + " / ".join(names), "",
             pipe_table(["variant", "subtask", *(c.replace("_", " ") for c in seed_cols)], per_seed)]
    return "\n".join(lines) + "\n\n"


def _bands(curves: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Mean and t-interval over seeds at every length (the figure's bands)."""
    from scipy.stats import t

    frames = []
    for variant in order:
        for subtask, part in curves[curves.variant == variant].groupby("subtask", sort=False):
            grid = part.pivot_table(index="seed", columns="length", values="token_acc", dropna=False)
            n = grid.notna().sum(axis=0).to_numpy()
            mean = grid.mean(axis=0).to_numpy()
            sd = grid.std(axis=0, ddof=1).to_numpy()
            with np.errstate(invalid="ignore", divide="ignore"):
                half = np.where(n >= 2, t.ppf(0.975, np.maximum(n - 1, 1)) * sd / np.sqrt(n), np.nan)
            frames.append(pd.DataFrame({"variant": variant, "subtask": subtask, "length": grid.columns,
                                        "mean": mean, "ci_low": np.clip(mean - half, 0, 1),
                                        "ci_high": np.clip(mean + half, 0, 1),
                                        "train_length": int(part.train_length.max())}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def markdown_table(report: SweepReport) -> str:
    """Token accuracy (%) per variant and subtask: mean [95 % t-interval] over seeds at each reported multiple of
    L_train and the score; sequence accuracy and the seeds above 90 % at 3x and 16x; then every seed's values."""
    s = report.summary
    if s.empty:
        return ""
    tok = s[s.metric == "token_acc"]
    lengths = {int(f): int(tok[tok.factor == f].length.iloc[0]) for f in FACTORS if (tok.factor == f).any()}
    solved_at = [f for f in (3, 16) if f in lengths]
    head = ["variant", "subtask", "seeds", *(f"{f}x ({n})" for f, n in lengths.items()), "score",
            *(f"seq. acc. {f}x" for f in solved_at), *(f"seeds > 90 % at {f}x" for f in solved_at)]
    seed_cols = sorted((c for c in s.columns if c.startswith("seed_")), key=lambda c: int(c[5:]))
    rows, per_seed = [], []
    for (variant, subtask), g in s.groupby(["variant", "subtask"], sort=False):
        t = g[g.metric == "token_acc"]
        cells = [variant, subtask, str(int(g.n_seeds.max()))]
        cells += [_cell(t[t.factor == f]) for f in lengths]
        cells.append(_cell(g[g.metric == "lengthgen_score"]))
        q = g[g.metric == "seq_acc"]
        cells += [_pct(q[q.factor == f]["mean"].iloc[0]) if (q.factor == f).any() else "–" for f in solved_at]
        cells += [f"{int(t[t.factor == f].seeds_above_90.iloc[0])} of {int(t[t.factor == f].n_seeds.iloc[0])}"
                  if (t.factor == f).any() else "–" for f in solved_at]
        rows.append(cells)
        seeds = []
        for c in seed_cols:
            values = [t[t.factor == f][c] for f in lengths] + [g[g.metric == "lengthgen_score"][c]]
            seeds.append(" / ".join(_pct(v.iloc[0]) if len(v) else "–" for v in values)
                         if t[c].notna().any() else "–")
        per_seed.append([variant, subtask, *seeds])
    lines = ["Token accuracy (%), mean [95 % t-interval] over seeds; score = mean over lengths in (L, 3L]; seq. acc. = "
             "sequences with every answer right (mean over seeds). "
             f"Sweep `{report.name}`" + (f"; missing runs: {', '.join(report.missing)}" if report.missing else "."),
             "", pipe_table(head, rows), "",
             "Per seed: token accuracy (%) at " + " / ".join(f"{f}x" for f in lengths) + ", score", "",
             pipe_table(["variant", "subtask", *(c.replace("_", " ") for c in seed_cols)], per_seed)]
    return "\n".join(lines) + "\n"


def _pct(x: float) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def _cell(rows: pd.DataFrame) -> str:
    if rows.empty:
        return "–"
    r = rows.iloc[0]
    ci = f" [{_pct(r.ci_low)}, {_pct(r.ci_high)}]" if np.isfinite(r.ci_low) else ""
    return _pct(r["mean"]) + ci


def write_report(report: SweepReport, out: str | Path, figure: bool = True) -> list[Path]:
    """In ``out``: the compact grid (``runs.jsonl``, ``curves.csv``, ``training.csv``; see ``probe.results``),
    ``results.json`` (the envelope: summary and comparison rows), ``results.md`` and the figures (accuracy vs
    length; per window, where the runs were scored per window)."""
    out = Path(out)
    paths = write_grid(report.grid, out) if report.grid is not None and report.grid.source != "compact" else []
    paths += [out / RESULTS, out / TABLE]
    # each file whole or not at all: a report interrupted half-way leaves the previous one readable
    write_text_atomically(out / RESULTS, json.dumps(report.result, separators=(",", ":")) + "\n")
    write_text_atomically(out / TABLE, windows_markdown(report) + markdown_table(report))
    if figure:
        save_figure(plot_sweep(report.curves, report.bands), out / FIGURE)
        paths.append(out / FIGURE)
        if report.windows is not None and not report.windows.empty and report.grid is not None \
                and not report.grid.windows.empty:
            save_figure(plot_windows(report.grid.windows, report.windows), out / WINDOW_FIGURE)
            paths.append(out / WINDOW_FIGURE)
    return paths


def save_figure(fig: Any, path: Path, dpi: int = 150) -> Path:
    """Save ``fig`` to ``path`` whole or not at all, and close it."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip("."))
    plt.close(fig)
    return path
