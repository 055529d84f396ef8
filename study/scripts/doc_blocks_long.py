"""The blocks of README.md and study/docs/reproduction.md that quote results/long/ (sweeps/long.toml: the headline
presets to 16x, 10 seeds) and results/recipe/ (sweeps/recipe.toml: a recipe beyond DAT): each a function of the
committed results only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from doc_format import can_reach, descriptive, grid_of, min_adjusted_text, p_text, pct, per_seed, results_dir, runs_of
from doc_format import col as _col
from doc_format import table as _table

from probe.core.stats import paired_interval, sign_flip_p

HOLDS = 0.95
"""A seed holds a length when both subtasks' token accuracy there is at least this (the headline's mark)."""
TARGET = {4: 0.99, 16: 0.95}
"""The recipe's target (issue: a recipe beyond DAT): both subtasks at least this at each multiple of L_train, in
every seed."""
FACTORS = (1, 2, 3, 4, 8, 16)
BASELINES = {"joint": "`hybrid-joint`", "dat": "`hybrid-dat`"}
RECIPE = "joint-4block"
"""The recipe grid's variant that trains the preset ``hybrid-recipe``."""


def _grid_or_none(root: Path, name: str):
    return grid_of(root, name) if (results_dir(root) / name / "runs.jsonl").is_file() else None


def _holds(r: pd.DataFrame, factor: int, level: float) -> pd.Series:
    """Per seed: both subtasks at least ``level`` at ``factor`` x L_train (False where it was not evaluated)."""
    state, recall = f"state_acc_{factor}x", f"recall_acc_{factor}x"
    if state not in r or recall not in r:
        return pd.Series(False, index=r.index)
    return (r[state] >= level) & (r[recall] >= level)


def _meets_target(r: pd.DataFrame) -> pd.Series:
    return np.logical_and.reduce([_holds(r, f, level) for f, level in TARGET.items()])


def _models(root: Path) -> list[tuple[str, pd.DataFrame]]:
    """(name, runs) of the long grid's two presets, then the recipe (its screened candidates are in ``recipe``)."""
    out = []
    long = _grid_or_none(root, "long")
    if long is not None:
        out += [(name, runs_of(long, v)) for v, name in BASELINES.items() if not runs_of(long, v).empty]
    recipe = _grid_or_none(root, "recipe")
    if recipe is not None and not runs_of(recipe, RECIPE).empty:
        out.append(("`hybrid-recipe` (4 blocks, joint)", runs_of(recipe, RECIPE)))
    return out


def long_readme(root: Path) -> str:
    """Per model: the seeds that hold each length (both subtasks ≥ HOLDS), the state accuracy at 16x of every seed,
    and the sequences with every answer right at 16x (mean over seeds)."""
    models = _models(root)
    if not models:
        return "No run of `study/sweeps/long.toml` is committed yet."
    rows = []
    for name, r in models:
        holds = [f"{int(_holds(r, f, HOLDS).sum())} of {len(r)}" if f"state_acc_{f}x" in r else "–" for f in FACTORS]
        rows.append([name, len(r), *holds, per_seed(_col(r, "state_acc_16x")), pct(_col(r, "all_seq_acc_16x").mean())])
    return _table(["model", "seeds", *[f"{f}x" for f in FACTORS], "state at 16x, each seed (all positions)",
                   "exact match at 16x"], rows)


def long_seeds(root: Path) -> str:
    """Every seed of every model: state accuracy at 3x / 4x / 16x and recall at 16x; then whether the rerun seeds
    of the long grid reproduce the mechanism grid's committed values (same configs, same CPU kind)."""
    models = _models(root)
    if not models:
        return "No run of `study/sweeps/long.toml` is committed yet."
    rows = []
    for name, r in models:
        cols = ["state_acc_3x", "state_acc_4x", "state_acc_8x", "state_acc_16x", "state_seq_acc_16x",
                "recall_acc_16x"]
        for seed, values in zip(r.seed, zip(*(_col(r, c) for c in cols), strict=True), strict=True):
            rows.append([name, seed, *map(pct, values)])
    table = _table(["model", "seed", "state 3x", "state 4x", "state 8x", "state 16x", "state exact match 16x",
                    "recall 16x"], rows)
    return table + "\n\n" + _rerun_check(root)


RETRAINED = (0, 1, 2, 3, 4)
"""The long grid's seeds trained again (sweeps/long.toml); seeds 5-9 are the mechanism grid's checkpoints evaluated
again, equal to that grid's values by construction and so no check of anything."""


def _rerun_check(root: Path) -> str:
    long, mech = _grid_or_none(root, "long"), _grid_or_none(root, "mechanism")
    if long is None or mech is None:
        return ""
    cols = [f"{s}_acc_{f}x" for s in ("state", "recall") for f in (1, 2, 3, 4)]
    worst, n = 0.0, 0
    for v in BASELINES:
        a, b = runs_of(long, v).set_index("seed"), runs_of(mech, v).set_index("seed")
        shared = a.index.intersection(b.index).intersection(RETRAINED)
        if len(shared):
            n += len(shared)
            diff = (a.loc[shared, cols] - b.loc[shared, cols]).abs().to_numpy()
            worst = max(worst, float(diff.max()))  # a NaN (a value one grid lacks) makes the check say nothing
    if n == 0 or not np.isfinite(worst):
        return ""
    return (f"Seeds 0–4 were trained again with the mechanism grid's configs on the same kind of CPU; over those {n} "
            f"runs the largest difference from that grid's committed state or recall accuracy at 1x–4x is "
            f"{100 * worst:.2f} points (the evaluation draws the same sequences, so only different weights could "
            "differ). Seeds 5–9 are that grid's checkpoints, evaluated again to 16x.")


SELECTED = {"joint-4block": (0, 1, 2, 3, 4), "dat-wd0": (2, 3, 8), "dat-shield": (2, 3, 8)}
"""Seeds each recipe candidate was chosen on (sweeps/recipe.toml): the screen's seeds (picked where DAT drifts) and
the depth grid's seeds of the 4-block joint hybrid, seen before it became the recipe. No test uses them."""


def recipe(root: Path) -> str:
    """Per recipe candidate against DAT on the same seeds: every seed's state accuracy at 4x and 16x, the seeds
    meeting the target (both subtasks ≥ 99 % at 4x and ≥ 95 % at 16x), on the seeds it was chosen on and on the
    others apart; then, on the others only, the paired difference in state accuracy at 16x (t interval over seed
    pairs; an exact sign-flip p only where the pairs that differ can reach p < 0.05, one pre-specified test per
    candidate, else descriptive)."""
    long, rec = _grid_or_none(root, "long"), _grid_or_none(root, "recipe")
    if long is None or rec is None:
        return "No run of `study/sweeps/recipe.toml` is committed yet."
    dat = runs_of(long, "dat").set_index("seed")
    rows, tests = [], []
    for v in rec.variants:
        r = runs_of(rec, v).set_index("seed")
        for part, seeds in (("chosen on", [x for x in r.index if x in SELECTED.get(v, ())]),
                            ("test", [x for x in r.index if x not in SELECTED.get(v, ())])):
            seeds = [x for x in seeds if x in dat.index]
            if not seeds:
                continue
            for name, x in ((f"`{v}`", r.loc[seeds]), ("`dat`, same seeds", dat.loc[seeds])):
                rows.append([name, part, ", ".join(map(str, seeds)), per_seed(_col(x, "state_acc_4x")),
                             per_seed(_col(x, "state_acc_16x")), pct(_col(x, "recall_acc_16x").min()),
                             f"{int(_meets_target(x).sum())} of {len(x)}"])
            a, b = _col(r.loc[seeds], "state_acc_16x").to_numpy(), _col(dat.loc[seeds], "state_acc_16x").to_numpy()
            ok = np.isfinite(a) & np.isfinite(b)
            if part == "test" and ok.sum() >= 2:
                diff = paired_interval(a[ok], b[ok])
                moved = int(np.count_nonzero(a[ok] - b[ok]))  # a tie cannot change sign: the attainable p needs these
                text = (f"`{v}` − `dat` at 16x (all 400 positions, in-range ones included) on its test seeds, paired "
                        f"by seed ({int(ok.sum())} pairs, {moved} of them differing): {100 * diff.estimate:+.1f} "
                        f"[{100 * diff.low:+.1f}, {100 * diff.high:+.1f}], ")
                text += (f"sign-flip p {p_text(sign_flip_p(a[ok] - b[ok]))} (smallest attainable "
                         f"{min_adjusted_text('pairs', moved)})" if can_reach("pairs", moved)
                         else descriptive("pairs", moved))
                tests.append(text)
    table = _table(["model", "which", "seeds", "state at 4x, each seed (all positions)",
                    "state at 16x, each seed (all positions)",
                    "lowest recall at 16x (all positions)", "seeds meeting the target"], rows)
    return table + ("\n\n" + "; ".join(tests) + "." if tests else "")


BLOCKS = {"long-readme": long_readme, "long-seeds": long_seeds, "recipe": recipe}
