"""The blocks of study/docs/gradients.md that quote results/gradients/dense/ (dense_lookahead.py: the beyond-range
lookahead over the first 500 steps of several runs of the mechanism grid): each a function of the committed results
only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import scipy.stats as sps
from doc_format import can_reach, descriptive, grid_of, min_adjusted_text, p_text, pct
from doc_format import table as _table

from probe.core.stats import holm

DENSE = ("study", "results", "gradients", "dense")
WINDOW = (50, 500)
"""The steps whose snapshots the per-run statistics average (step 0 is the initialisation: every run starts from
its own random weights, and Adam has no moments yet)."""
REAL = 1.0
"""The step scale the statistics are read at: a real optimizer update."""


def _read(root: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(root.joinpath(*DENSE, name))


def _rows(la: pd.DataFrame, part: str, loss: str, positions: str) -> pd.DataFrame:
    """One direction's rows (``att`` or ``rec``, the rest) for one target, at step_scale 1 (a step as long as the
    real update), inside the window."""
    sel = la[(la.part == part) & (la.loss == loss) & (la.positions == positions) & (la.step_scale == REAL)]
    return sel[(sel.step >= WINDOW[0]) & (sel.step <= WINDOW[1])]


def per_run(root: Path) -> pd.DataFrame:
    """One row per run: its grid accuracy at 3x and the lookahead's statistics over the window."""
    la, verdicts = _read(root, "lookahead.csv"), _read(root, "verdicts.csv")
    grid = grid_of(root, "mechanism").runs.set_index(["variant", "seed"])
    rows = []
    for (variant, seed), _ in la.groupby(["variant", "seed"]):
        run = la[(la.variant == variant) & (la.seed == seed)]
        v = verdicts[(verdicts.variant == variant) & (verdicts.seed == seed)]
        v = v[(v.step >= WINDOW[0]) & (v.step <= WINDOW[1])]
        far, train = _rows(run, "att", "state", ">L"), _rows(run, "att", "train", "<=L")
        far_rest, train_rest = _rows(run, "rec", "state", ">L"), _rows(run, "rec", "train", "<=L")
        acc = grid.state_acc_3x.get((variant, seed), np.nan)
        rows.append({
            "variant": variant, "seed": int(seed), "state_3x": acc, "n_steps": len(far),
            "steps": f"{int(far.step.min())}–{int(far.step.max())}" if len(far) else "–",
            "verdicts": ", ".join(f"{k} {n}" for k, n in v.verdict.value_counts().items()),
            "att_beyond": far.effect.mean(), "rest_beyond": far_rest.effect.mean(),
            "att_vs_rest_z": far.vs_rec_z.mean(), "att_train": train.effect.mean(),
            "rest_train": train_rest.effect.mean()})
    return pd.DataFrame(rows).sort_values(["variant", "state_3x"])


def _e(x: float) -> str:
    return "–" if not np.isfinite(x) else f"{x:+.2e}"


def lookahead_dense_runs(root: Path) -> str:
    rows = []
    for r in per_run(root).itertuples():
        rows.append([f"`{r.variant}` seed {r.seed}", pct(r.state_3x), f"{r.n_steps} ({r.steps})", r.verdicts,
                     _e(r.att_beyond), _e(r.rest_beyond), f"{r.att_vs_rest_z:+.1f}", _e(r.att_train),
                     _e(r.rest_train)])
    return _table(["run", "state at 3x (grid)", "snapshots (steps)", "verdicts at step_scale 1",
                   "att: state loss beyond L, per unit step", "rest: same", "att − rest, mean z",
                   "att: training loss, per unit step", "rest: same"], rows)


def _spearman_exact(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Spearman's rho and its exact two-sided permutation p (every pairing of x with y; 120 for 5 runs)."""
    rho = float(sps.spearmanr(x, y).statistic)
    res = sps.permutation_test((x, y), lambda a, b: sps.spearmanr(a, b).statistic, permutation_type="pairings",
                               n_resamples=np.inf, alternative="two-sided")
    return rho, float(res.pvalue)


def lookahead_dense_order(root: Path) -> str:
    runs = per_run(root)
    joint = runs[runs.variant == "joint"].dropna(subset=["state_3x"])
    if len(joint) < 3:
        return f"Fewer than 3 joint runs with a lookahead ({len(joint)}): no ordering test."
    stats = [("att_beyond", "attention's part: state loss beyond L, per unit step"),
             ("att_vs_rest_z", "attention's part minus the rest's, beyond L (mean z)")]
    n, k = len(joint), len(stats)
    run = can_reach("pairings", n, family=k)
    found = [_spearman_exact(joint.state_3x.to_numpy(), joint[stat].to_numpy()) for stat, _ in stats]
    adjusted = holm(np.array([p for _, p in found])) if run else np.full(k, np.nan)
    rows = [[what, n, f"{rho:+.2f}", p_text(p) if run else "–", min_adjusted_text("pairings", n, family=k),
             p_text(adj) if run else descriptive("pairings", n, family=k)]
            for (_, what), (rho, p), adj in zip(stats, found, adjusted, strict=True)]
    return (f"A Holm family of {k} (one test a statistic); with {n} runs the smallest exact p is 2/{n}! and the "
            f"smallest attainable adjusted p {min_adjusted_text('pairings', n, family=k)}. State at 3x: the mean over "
            "all 75 positions, in-range ones included.\n\n"
            + _table(["statistic (mean over the window, at step_scale 1)", "joint runs", "Spearman rho with state at "
                      "3x", "exact p", "min. adj. p", f"Holm p (over {k})"], rows))


BLOCKS = {
    "lookahead-dense-runs": lookahead_dense_runs,
    "lookahead-dense-order": lookahead_dense_order,
}
