"""Aggregate a sweep's run folders: rows per run x length x subtask, and per variant the mean, a bootstrap 95 % CI
over seeds and every seed's value of token accuracy at 1x-4x and of the length-generalization score."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from probe.checkpoint import load_checkpoint
from probe.cli import envelope
from probe.errors import ProbeError
from probe.sweep.config import SWEEP_FILE, config_from_dict
from probe.sweep.worker import EVAL

RESULTS, TABLE, FIGURE = "results.json", "results.md", "accuracy_vs_length.png"
FACTORS = (1, 2, 3, 4)
N_RESAMPLES = 9999
_SEED_DIR = re.compile(r"^seed(-?\d+)$")


@dataclass
class SweepReport:
    """What ``results.json`` holds, as DataFrames: ``curves`` (variant, run, seed, train_length, length, subtask,
    token_acc, seq_acc, n_tokens), ``scores`` (variant, run, seed, subtask, lengthgen_score), ``summary`` (one row
    per variant x subtask x metric), ``bands`` (variant, subtask, length, mean, ci_low, ci_high) for the figure."""

    name: str
    curves: pd.DataFrame
    scores: pd.DataFrame
    summary: pd.DataFrame
    bands: pd.DataFrame
    result: dict[str, Any]

    @property
    def missing(self) -> list[str]:
        return self.result["missing"]


def sweep_members(out: Path) -> tuple[str, list[tuple[str, int]]]:
    """The sweep's name and its (variant, seed) runs: those of ``DIR/sweep.json``, else every ``VARIANT/seedS``
    folder with an eval.json (run folders made before sweeps existed)."""
    found = []
    for ev in out.glob(f"*/seed*/{EVAL}"):
        m = _SEED_DIR.match(ev.parent.name)
        if m:
            found.append((ev.parent.parent.name, int(m.group(1))))
    path = out / SWEEP_FILE
    if path.exists():
        cfg = config_from_dict(json.loads(path.read_text())["config"], str(path))
        members = [(r.variant, r.seed) for r in cfg.runs(out)]
        variants = {v for v, _ in members}
        # a grid run in parts (--seeds 0 1, then --seeds 2 3) records its last part: keep the earlier parts' runs
        extra = sorted(set(found) - set(members), key=lambda vs: ([v for v, _ in members].index(vs[0]), vs[1]))
        members += [vs for vs in extra if vs[0] in variants]
        order = list(dict.fromkeys(v for v, _ in members))
        return cfg.name, sorted(members, key=lambda vs: (order.index(vs[0]), vs[1]))
    if not found:
        raise ProbeError(f"{out}: no {SWEEP_FILE} and no VARIANT/seedS/{EVAL}; is this a sweep's --out directory?")
    return out.name, sorted(found)


def bootstrap_ci(values: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap CI of the mean over axis 0 (seeds) of a (seeds, k) array, one interval per column; NaN where a
    column has fewer than two finite values.

    scipy's percentile method, not BCa: with 3-5 seeds BCa's acceleration estimate is unstable, and it returns NaN
    when every seed agrees (common at 100 % accuracy). A fixed generator makes ``--report`` reproducible."""
    from scipy.stats import bootstrap

    values = np.asarray(values, dtype=float)
    lo, hi = np.full(values.shape[1], np.nan), np.full(values.shape[1], np.nan)
    complete = np.isfinite(values).all(axis=0)
    if values.shape[0] >= 2 and complete.any():
        ci = bootstrap((values[:, complete],), np.mean, axis=0, vectorized=True, confidence_level=confidence,
                       n_resamples=N_RESAMPLES, method="percentile", rng=np.random.default_rng(0)).confidence_interval
        lo[complete], hi[complete] = ci.low, ci.high
    for j in np.flatnonzero(~complete):  # a seed without this subtask at this length: CI over the others
        col = values[np.isfinite(values[:, j]), j]
        if len(col) >= 2:
            lo[j], hi[j] = bootstrap_ci(col[:, None], confidence)
    return lo, hi


def _weights_digest(state_dict: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(state_dict):
        h.update(name.encode())
        h.update(state_dict[name].detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def aggregate(out: str | Path) -> SweepReport:
    """Read every run folder of the sweep in ``out`` (nothing is trained or evaluated) into a ``SweepReport``."""
    out = Path(out)
    if not out.is_dir():
        raise ProbeError(f"{out}: no such sweep directory")
    name, members = sweep_members(out)
    run_rows: list[dict[str, Any]] = []
    controls: list[dict[str, Any]] = []
    missing, checkpoints, digests = [], [], {}
    for variant, seed in members:
        rel = f"{variant}/seed{seed}"
        folder = out / rel
        if not (folder / EVAL).exists() or not (folder / "final.pt").exists():
            missing.append(rel)
            continue
        ckpt = load_checkpoint(folder / "final.pt")
        digests[rel] = _weights_digest(ckpt.state_dict)
        checkpoints.append(f"{rel}/final.pt")
        rows = json.loads((folder / EVAL).read_text())["results"]
        for r in rows:
            # checkpoint relative to the sweep directory, so a moved or copied sweep reports the same rows
            run_rows.append({"row": "run", "variant": variant, "run": rel, **r, "checkpoint": f"{rel}/final.pt",
                             "seed": seed, "train_length": ckpt.task_config.train_length})
        # Could fail: a sweep that dropped or mixed up seeds trains a run whose checkpoint says another seed.
        controls.append({"control": "seed_matches_folder", "run": rel, "checkpoint": f"{rel}/final.pt",
                         "checkpoint_seed": ckpt.seed, "passed": ckpt.seed == seed})
    if not run_rows:
        raise ProbeError(f"{out}: no finished run (VARIANT/seedS/{EVAL} with final.pt) to aggregate")
    frame = pd.DataFrame(run_rows)
    is_score = frame.get("metric", pd.Series(index=frame.index, dtype=object)) == "lengthgen_score"
    curves = frame[~is_score].drop(columns=["row", "metric"], errors="ignore").reset_index(drop=True)
    scores = frame[is_score][["variant", "run", "seed", "subtask", "token_acc"]].rename(
        columns={"token_acc": "lengthgen_score"}).reset_index(drop=True)
    order = list(dict.fromkeys(v for v, _ in members))
    for variant in order:
        runs = [rel for rel in digests if rel.split("/")[0] == variant]
        if len(runs) >= 2:
            # Could fail: seeds that do not reach the trainer (or a copied folder) give identical weights.
            controls.append({"control": "seeds_give_distinct_weights", "variant": variant, "runs": len(runs),
                             "distinct": len({digests[r] for r in runs}),
                             "passed": len({digests[r] for r in runs}) == len(runs)})
    summary = _summary(curves, scores, order)
    bands = _bands(curves, order)
    result = envelope("sweep", checkpoints, run_rows + summary.to_dict("records"), controls,
                      sweep=name, missing=missing)
    return SweepReport(name, curves, scores, summary, bands, result)


def _summary_row(variant: str, subtask: str, metric: str, factor: int | None, length: int | None,
                 per_seed: pd.Series) -> dict[str, Any]:
    per_seed = per_seed.dropna()
    lo, hi = bootstrap_ci(per_seed.to_numpy()[:, None]) if len(per_seed) else (np.array([np.nan]),) * 2
    row = {"row": "summary", "checkpoint": None, "variant": variant, "subtask": subtask, "metric": metric,
           "factor": factor, "length": length, "n_seeds": len(per_seed),
           "mean": float(per_seed.mean()) if len(per_seed) else math.nan, "ci_low": lo[0], "ci_high": hi[0]}
    return row | {f"seed_{s}": float(v) for s, v in per_seed.items()}


def _summary(curves: pd.DataFrame, scores: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    rows = []
    for variant in order:
        for subtask in curves.subtask.unique():
            part = curves[(curves.variant == variant) & (curves.subtask == subtask)]
            if part.empty or part.token_acc.isna().all():
                continue  # a subtask this task never asks
            for f in FACTORS:
                at = part[part.length == f * part.train_length]
                if len(at):
                    rows.append(_summary_row(variant, subtask, "token_acc", f, int(f * at.train_length.iloc[0]),
                                             at.set_index("seed").token_acc))
            sc = scores[(scores.variant == variant) & (scores.subtask == subtask)]
            rows.append(_summary_row(variant, subtask, "lengthgen_score", None, None,
                                     sc.set_index("seed").lengthgen_score))
    return pd.DataFrame(rows)


def _bands(curves: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    frames = []
    for variant in order:
        for subtask, part in curves[curves.variant == variant].groupby("subtask", sort=False):
            grid = part.pivot_table(index="seed", columns="length", values="token_acc", dropna=False)
            lo, hi = bootstrap_ci(grid.to_numpy())
            frames.append(pd.DataFrame({"variant": variant, "subtask": subtask, "length": grid.columns,
                                        "mean": grid.mean(axis=0).to_numpy(), "ci_low": lo, "ci_high": hi,
                                        "train_length": int(part.train_length.max())}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def markdown_table(report: SweepReport) -> str:
    """Token accuracy (%) per variant and subtask: mean [bootstrap 95 % CI] over seeds at 1x-4x and the
    length-generalization score, then every seed's values."""
    s = report.summary
    if s.empty:
        return ""
    lengths = {f: int(s[(s.factor == f)].length.dropna().iloc[0]) for f in FACTORS if (s.factor == f).any()}
    head = ["variant", "subtask", "seeds", *(f"{f}x ({n})" for f, n in lengths.items()), "score"]
    lines = [f"Token accuracy (%), mean [bootstrap 95 % CI] over seeds; score = mean over lengths in (L, 3L]. "
             f"Sweep `{report.name}`" + (f"; missing runs: {', '.join(report.missing)}" if report.missing else "."),
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    seed_cols = sorted((c for c in s.columns if c.startswith("seed_")), key=lambda c: int(c[5:]))
    per_seed = ["", "Per seed: token accuracy (%) at " + " / ".join(f"{f}x" for f in lengths) + ", score", "",
                "| variant | subtask | " + " | ".join(c.replace("_", " ") for c in seed_cols) + " |",
                "|---|---|" + "---|" * len(seed_cols)]
    for (variant, subtask), g in s.groupby(["variant", "subtask"], sort=False):
        cells = [variant, subtask, str(int(g.n_seeds.max()))]
        for f in lengths:
            cells.append(_cell(g[g.factor == f]))
        cells.append(_cell(g[g.metric == "lengthgen_score"]))
        lines.append("| " + " | ".join(cells) + " |")
        seeds = []
        for c in seed_cols:
            values = [g[g.factor == f][c] for f in lengths] + [g[g.metric == "lengthgen_score"][c]]
            seeds.append(" / ".join(_pct(v.iloc[0]) if len(v) else "–" for v in values)
                         if g[c].notna().any() else "–")
        per_seed.append(f"| {variant} | {subtask} | " + " | ".join(seeds) + " |")
    return "\n".join(lines + per_seed) + "\n"


def _pct(x: float) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def _cell(rows: pd.DataFrame) -> str:
    if rows.empty:
        return "–"
    r = rows.iloc[0]
    ci = f" [{_pct(r.ci_low)}, {_pct(r.ci_high)}]" if np.isfinite(r.ci_low) else ""
    return _pct(r["mean"]) + ci


def write_report(report: SweepReport, out: str | Path, figure: bool = True) -> list[Path]:
    """``results.json`` (SPEC section 9 envelope), ``results.md`` and the accuracy-vs-length figure in ``out``."""
    from probe.sweep.plots import plot_sweep

    out = Path(out)
    paths = [out / RESULTS, out / TABLE]
    paths[0].write_text(json.dumps(report.result, indent=1) + "\n")
    paths[1].write_text(markdown_table(report))
    if figure:
        import matplotlib.pyplot as plt

        fig = plot_sweep(report.curves, report.bands)
        fig.savefig(out / FIGURE, dpi=150)
        plt.close(fig)
        paths.append(out / FIGURE)
    return paths
