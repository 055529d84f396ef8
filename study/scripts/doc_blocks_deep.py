"""The blocks of study/docs/reproduction.md that quote results/deep/ (sweeps/deep.toml: the 4-block search for the
paper's cliff to chance): each a function of the committed results only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from doc_format import (
    can_reach,
    descriptive,
    grid_of,
    mean_ci,
    min_adjusted_text,
    p_text,
    pct,
    per_seed,
    results_dir,
    runs_of,
)
from doc_format import col as _col
from doc_format import table as _table

from probe.core.stats import holm, permutation_p, welch_interval

DEEP_CLIFF, SOLVED = 0.5, 0.95
"""The search's target (issue: the paper's regime): the joint hybrid below DEEP_CLIFF at 3x in at least 4 of 5
seeds, while DAT holds SOLVED at 3x in every seed."""
PAIRS = {"deep4-joint": "joint", "deep4-dat": "dat"}
"""Each 4-block variant and the 2-block variant of the mechanism grid that differs from it only in depth."""


def _count(values: pd.Series, test) -> str:
    values = values.dropna()
    return f"{int(test(values).sum())} of {len(values)}" if len(values) else "–"


def deep(root: Path) -> str:
    """Per variant, 4 blocks beside the same seeds of the 2-block grid: state accuracy at 3x and 16x per seed, the
    seeds below the deep-cliff mark and above the solved mark, recall at 16x, and depth's effect at 3x (Welch
    interval, exact permutation p over seeds, one pre-specified test per schedule, Holm over the two: a test is run
    only where its seeds can reach adjusted p < 0.05 in that family of two)."""
    if not (results_dir(root) / "deep").is_dir():
        return "No run of `study/sweeps/deep.toml` is committed yet."
    deep_grid, two = grid_of(root, "deep"), grid_of(root, "mechanism")
    rows, tests = [], []
    for variant, base in PAIRS.items():
        r4 = runs_of(deep_grid, variant)
        if r4.empty:
            continue
        r2 = runs_of(two, base)
        r2 = r2[r2.seed.isin(r4.seed)]
        for name, r in ((f"`{base}`, 2 blocks", r2), (f"`{variant}`, 4 blocks", r4)):
            at16 = _col(r, "state_acc_16x")
            rows.append([name, len(r), per_seed(r.state_acc_3x), mean_ci(r.state_acc_3x),
                         _count(r.state_acc_3x, lambda v: v < DEEP_CLIFF),
                         _count(r.state_acc_3x, lambda v: v >= SOLVED),
                         per_seed(at16) if at16.notna().any() else "not evaluated",
                         pct(_col(r, "recall_acc_16x").min())])
        if len(r4) >= 2 and len(r2) >= 2:
            tests.append((variant, base, r4.state_acc_3x.to_numpy(), r2.state_acc_3x.to_numpy()))
    if not rows:
        return "No run of `study/sweeps/deep.toml` is committed yet."
    table = _table(["variant", "seeds", "state at 3x, each seed (all positions)", "mean [95 % t-CI]",
                    f"seeds below {100 * DEEP_CLIFF:.0f} % at 3x", f"seeds ≥ {100 * SOLVED:.0f} % at 3x",
                    "state at 16x, each seed (all positions)", "lowest recall at 16x (all positions)"], rows)
    return table + ("\n\n" + _depth_effect(tests) if tests else "")


def _depth_effect(tests: list[tuple[str, str, np.ndarray, np.ndarray]]) -> str:
    """Depth's effect at 3x per schedule: the difference with its Welch interval, and the permutation p with its
    Holm adjustment over the schedules where the seeds can reach adjusted p < 0.05 in that family; else descriptive."""
    k = len(tests)
    ok = [can_reach("seeds", len(a), len(b), k) for _, _, a, b in tests]
    p = [permutation_p(a, b) if run else np.nan for (_, _, a, b), run in zip(tests, ok, strict=True)]
    adjusted = holm(np.asarray(p, dtype=float))
    parts = []
    for (variant, base, a, b), run, raw, adj in zip(tests, ok, p, adjusted, strict=True):
        diff = welch_interval(a, b)
        text = (f"`{variant}` − `{base}` at 3x (all 75 positions, in-range ones included): {100 * diff.estimate:+.1f} "
                f"[{100 * diff.low:+.1f}, {100 * diff.high:+.1f}], ")
        text += (f"p {p_text(raw)}, Holm p {p_text(adj)}" if run else descriptive("seeds", len(a), len(b), k))
        parts.append(text)
    designs = sorted({(len(a), len(b)) for _, _, a, b in tests})
    return (f"Depth's effect, same seeds (a Holm family of {k}; smallest attainable adjusted p "
            + ", ".join(f"{min_adjusted_text('seeds', n, m, k)} at {n} vs {m} seeds" for n, m in designs) + "): "
            + "; ".join(parts) + ".")


SCREEN = {"deep4-d64-joint": "d_model 64", "deep4-lr1e-3-joint": "lr 1e-3", "deep4-9000-joint": "9000 steps"}
"""The search's later points (study/sweeps/deep.toml), each one change from point 1 (4 blocks at the presets' settings),
screened with two joint seeds before any DAT run."""
SCREEN_SEEDS, TARGET_BELOW, TARGET_OF = (0, 1), 4, 5


def _screen_verdict(acc: pd.Series) -> str:
    """The screen's rule on the screen seeds' state accuracy at 3x (``acc`` indexed by seed): the target needs
    TARGET_BELOW of TARGET_OF joint seeds below DEEP_CLIFF, so a point whose screen seeds leave too few seeds to get
    there cannot reach it (a count, not a test). Seeds beyond the screen, where a point advanced, are counted apart."""
    acc = acc.dropna()
    screen = acc[acc.index.isin(SCREEN_SEEDS)]
    if len(screen) < len(SCREEN_SEEDS):
        return f"screen incomplete ({len(screen)} of {len(SCREEN_SEEDS)} seeds)"
    above = int((screen >= DEEP_CLIFF).sum())
    if above > TARGET_OF - TARGET_BELOW:
        verdict = (f"stops: {above} of {len(screen)} screen seeds at or above {100 * DEEP_CLIFF:.0f} %, so at most "
                   f"{TARGET_OF - above} of {TARGET_OF} can be below")
    else:
        verdict = f"advances: {len(screen) - above} of {len(screen)} screen seeds below {100 * DEEP_CLIFF:.0f} %"
    if len(acc) > len(screen):
        below = int((acc < DEEP_CLIFF).sum())
        verdict += f"; {below} of {len(acc)} seeds below overall"
    return verdict


def deep_screen(root: Path) -> str:
    """Each later point of the search: its joint seeds' state accuracy at 3x and 16x, recall at 16x, and the
    screen's verdict."""
    if not (results_dir(root) / "deep").is_dir():
        return "No run of `study/sweeps/deep.toml` is committed yet."
    grid = grid_of(root, "deep")
    rows = []
    for variant, change in SCREEN.items():
        r = runs_of(grid, variant)
        if r.empty:
            rows.append([f"`{variant}`", change, 0, "not run", "not run", "–", "not run"])
            continue
        rows.append([f"`{variant}`", change, len(r), per_seed(r.state_acc_3x), per_seed(_col(r, "state_acc_16x")),
                     pct(_col(r, "recall_acc_16x").min()), _screen_verdict(r.set_index("seed").state_acc_3x)])
    return _table(["variant", "change from point 1", "seeds", "state at 3x, each seed (all positions)",
                   "state at 16x, each seed (all positions)",
                   "lowest recall at 16x (all positions)", "screen"], rows)


BLOCKS = {"deep": deep, "deep-screen": deep_screen}
