"""The blocks of README.md and study/docs/recurrent.md that quote results/recurrent/ (sweeps/recurrent.toml):
each a function of the committed results only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from doc_format import can_reach, descriptive, mean_ci, min_adjusted_text, pct, per_seed, read_envelope, results_dir
from doc_format import col as _col
from doc_format import grid_of as _grid
from doc_format import p_text as _p
from doc_format import runs_of as _runs
from doc_format import table as _table

from probe.core.stats import holm
from probe.sweep.compare import compare
from probe.sweep.plots import cell_and_schedule

GRID = "recurrent"
THRESHOLD = 0.90
"""A seed "solves" a length when its state accuracy there is above this (the issue's fraction of seeds)."""
FACTORS = (3, 16)


def _cells(variants: list[str]) -> list[tuple[str, list[str]]]:
    """The grid's variants grouped by cell, in config order: [(cell, [variant, ...]), ...]."""
    out: dict[str, list[str]] = {}
    for v in variants:
        out.setdefault(cell_and_schedule(v)[0], []).append(v)
    return list(out.items())


def _solved(runs: pd.DataFrame, factor: int) -> str:
    values = _col(runs, f"state_acc_{factor}x").dropna()
    return f"{int((values > THRESHOLD).sum())} of {len(values)}" if len(values) else "–"


def recurrent_short(root: Path) -> str:
    """README: per cell and schedule, state accuracy at 1x, 3x and 16x (mean, 95 % t-interval), the parity and
    mod-5 parts at 16x, recall at 3x, and how many seeds solve 3x and 16x."""
    grid = _grid(root, GRID)
    rows = []
    # the LSTM for reference: the reproduction's LSTM (fp32, to 4x) and the long grid's hybrids (bf16, to 16x: the
    # mechanism grid's joint and dat runs evaluated again)
    for name, variant, schedule in (("reproduction", "lstm", "alone"), ("long", "joint", "joint"),
                                    ("long", "dat", "dat")):
        r = _runs(_grid(root, name), variant)
        at16 = _col(r, "state_acc_16x").dropna()
        rows.append([f"`lstm` ({name})", schedule, len(r), mean_ci(r.state_acc_1x), mean_ci(r.state_acc_3x),
                     mean_ci(at16) if len(at16) else "not evaluated", "not evaluated", "not evaluated",
                     "not evaluated", "not evaluated",
                     mean_ci(r.recall_acc_3x) if schedule != "alone" else pct(r.recall_acc_3x.mean()),
                     _solved(r, 3), _solved(r, 16) if len(at16) else "not evaluated"])
    for cell, variants in _cells(grid.variants):
        for v in variants:
            r = _runs(grid, v)
            schedule = cell_and_schedule(v)[1]
            rows.append([f"`{cell}`", schedule, len(r), mean_ci(r.state_acc_1x), mean_ci(r.state_acc_3x),
                         mean_ci(_col(r, "state_acc_16x").dropna()),
                         _fewer(_col(r, "state_mod2_acc_4x"), len(r)),
                         _fewer(_col(r, "state_mod5_acc_4x"), len(r)),
                         _fewer(_col(r, "state_mod2_acc_16x"), len(r)),
                         _fewer(_col(r, "state_mod5_acc_16x"), len(r)),
                         mean_ci(r.recall_acc_3x) if schedule != "alone" else pct(r.recall_acc_3x.mean()),
                         _solved(r, 3), _solved(r, 16)])
    pc = f"{100 * THRESHOLD:.0f}"
    return _table(["cell", "schedule", "seeds", "state 1x", "state 3x", "state 16x", "parity 4x", "mod 5 4x",
                   "parity 16x", "mod 5 16x",
                   "recall 3x", f"seeds > {pc} % at 3x", f"seeds > {pc} % at 16x"], rows)


def _fewer(values: pd.Series, n: int) -> str:
    """``mean_ci`` of the values there are, saying over how many seeds when some runs lack the column."""
    have = values.dropna()
    return mean_ci(have) + (f" ({len(have)} seeds)" if 0 < len(have) < n else "")


def _cell(runs: pd.DataFrame, factor: int) -> str:
    if runs.empty:
        return "–"
    values = _col(runs, f"state_acc_{factor}x").dropna()
    if not len(values):
        return "–"
    return f"{pct(values.mean())} ({int((values > THRESHOLD).sum())}/{len(values)})"


def recurrent_readme(root: Path) -> str:
    """README: one row per cell; state accuracy at 3x (and 16x for the hybrids) per schedule: the mean over seeds
    and, in brackets, how many seeds are above 90 %."""
    grid = _grid(root, GRID)
    lstm = [("reproduction", "lstm", "alone"), ("mechanism", "joint", "joint"), ("mechanism", "dat", "dat")]
    lstm.append(("mechanism", "stopgrad-rnn", "stopgrad-rnn"))
    by = {s: _runs(_grid(root, name), v) for name, v, s in lstm}
    long = _grid(root, "long")  # the same joint and dat runs, evaluated again to 16x (study/sweeps/long.toml)
    rows = [["`lstm`", *(_cell(by[s], 3) for s in ("alone", "joint", "dat", "stopgrad-rnn")),
             *(_cell(_runs(long, s), 16) for s in ("joint", "dat"))]]
    for cell, variants in _cells(grid.variants):
        by = {cell_and_schedule(v)[1]: _runs(grid, v) for v in variants}
        empty = pd.DataFrame()
        rows.append([f"`{cell}`", *(_cell(by.get(s, empty), 3) for s in ("alone", "joint", "dat", "stopgrad-rnn")),
                     *(_cell(by.get(s, empty), 16) for s in ("joint", "dat"))])
    return _table(["cell", "alone, 3x", "joint, 3x", "DAT, 3x", "stopgrad-rnn, 3x", "joint, 16x", "DAT, 16x"], rows)


def recurrent_seeds(root: Path) -> str:
    """study/docs/recurrent.md: every seed, state accuracy at 3x, 4x and 16x and the sequence accuracy at 3x."""
    grid = _grid(root, GRID)
    rows = []
    for v in grid.variants:
        r = _runs(grid, v)
        rows.append([f"`{v}`", ", ".join(map(str, r.seed)), per_seed(r.state_acc_3x), per_seed(r.state_acc_4x),
                     per_seed(_col(r, "state_acc_16x")), per_seed(_col(r, "state_seq_acc_3x")),
                     f"{pct(r.recall_acc_3x.min())}–{pct(r.recall_acc_3x.max())}"])
    return _table(["variant", "seeds", "state 3x, each seed", "state 4x", "state 16x", "sequences all right at 3x",
                   "recall 3x, range"], rows)


PRIMARY_FACTOR = 3


def _comparisons(root: Path) -> pd.DataFrame:
    """Within each cell, every hybrid schedule and the cell alone against that cell's joint hybrid, state accuracy
    at 3x and at 16x. The primary family, fixed before any run, is DAT against joint at 3x for each cell (does DAT
    transfer?); Holm's adjustment runs over that family alone. Everything else is secondary: the cell alone, every
    comparison at 16x, and stopgrad-rnn (added after seed 0 had been seen). With 5 seeds a side the smallest
    attainable p is 2/252 = 0.008, so the secondary family (14 comparisons) could reject nothing: a secondary
    comparison is tested only if its seeds can reach adjusted p < 0.05 in that family, else it is descriptive (the
    difference and its interval, no p)."""
    grid = _grid(root, GRID)
    frames = []
    for cell, variants in _cells(grid.variants):
        joint = f"hybrid-{cell}-joint"
        if joint not in variants:
            continue
        curves = grid.curves[grid.curves.variant.isin(variants)]
        for factor in FACTORS:
            if not (curves.length == factor * curves.train_length).any():
                continue
            frames.append(compare(curves, [joint], factor=factor).assign(cell=cell))
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    primary = (out.factor == PRIMARY_FACTOR) & out.variant.str.startswith("hybrid-") & out.variant.str.endswith("-dat")
    out["family"] = np.where(primary, "primary", "secondary")
    out["family_size"] = np.where(primary, int(primary.sum()), int((~primary).sum()))
    out["testable"] = [can_reach("seeds", r.n_seeds, r.n_seeds_baseline, r.family_size) for r in out.itertuples()]
    out.loc[~out.testable, "p_permutation"] = np.nan
    out["p_holm"] = np.nan
    for fam in ("primary", "secondary"):
        run = (out.family == fam) & out.testable
        out.loc[run, "p_holm"] = holm(out.loc[run, "p_permutation"].to_numpy())
    out["n_primary"] = int(primary.sum())
    return out


def _interval(lo: float, hi: float) -> str:
    return "–" if not (np.isfinite(lo) and np.isfinite(hi)) else f"[{100 * lo:+.1f}, {100 * hi:+.1f}]"


def recurrent_compare(root: Path) -> str:
    """study/docs/recurrent.md: the comparisons against each cell's joint hybrid."""
    cmp = _comparisons(root)
    if cmp.empty:
        return "No cell has both a joint hybrid and another variant with finished runs yet."
    rows = []
    for r in cmp.sort_values(["family", "factor"], kind="stable").itertuples():
        ci = _interval(r.difference_ci_low, r.difference_ci_high)
        k = int(r.family_size)
        if not r.testable:
            verdict = descriptive("seeds", r.n_seeds, r.n_seeds_baseline, k)
        else:
            verdict = "differ (Holm p < 0.05)" if r.p_holm < 0.05 else f"no difference detected, CI {ci}"
        rows.append([f"{r.family} ({k})", f"`{r.cell}`", f"`{r.variant}`", f"{r.factor}x",
                     f"{r.n_seeds} vs {r.n_seeds_baseline}", pct(r.mean), pct(r.mean_baseline),
                     f"{100 * r.difference:+.1f} {ci}", _p(r.p_permutation),
                     min_adjusted_text("seeds", r.n_seeds, r.n_seeds_baseline, k), _p(r.p_holm), verdict])
    n = int(cmp.n_primary.iloc[0]) if len(cmp) else 0
    return (f"Each against its cell's joint hybrid (`hybrid-CELL-joint`), state token accuracy (%), the mean over "
            f"every position of a sequence of that length (in-range positions included, so not a per-window "
            f"measure of length generalization); difference of means with its Welch 95 % interval; p: exact "
            f"two-sided permutation test over seeds; min. adj. p: the family's size times the smallest p those seed "
            f"counts allow. Primary (fixed before the runs): DAT against joint at 3x, a Holm family of {n}; "
            f"secondary (the cell alone, stopgrad-rnn, and 16x): a family of {len(cmp) - n}, tested only where its "
            f"seeds can reach adjusted p < 0.05 in it, else descriptive.\n\n"
            + _table(["family (size)", "cell", "variant", "length", "seeds", "mean", "joint's", "difference [95 % CI]",
                      "p", "min. adj. p", "Holm p", "verdict"], rows))


def recurrent_transitions(root: Path) -> str:
    """study/docs/recurrent.md: per SSM variant, how many seeds have a channel that counts mod 2, 5 or 10 beyond 4 x
    L_train (``probe.transitions``, any block), the longest drift horizon of such a channel per seed, and the state
    accuracy at 16x of the seeds with a Z_10 channel and of those without."""
    path = results_dir(root) / GRID / "transitions.csv"
    tr = pd.read_csv(path)
    grid = _grid(root, GRID)
    acc = grid.runs.set_index(["variant", "seed"])
    rows = []
    for variant in [v for v in grid.variants if v in set(tr.variant)]:
        t = tr[tr.variant == variant]
        per_seed = t.groupby(["seed", "order"]).agg(channels=("channels", "sum"), best=("best_horizon", "max"))
        seeds = sorted(t.seed.unique())
        cells = [f"`{variant}`", len(seeds)]
        for order in (2, 5, 10):
            part = per_seed.xs(order, level="order")
            cells.append(f"{int((part.channels > 0).sum())} of {len(seeds)}")
        z10 = per_seed.xs(10, level="order")
        cells.append(" / ".join(f"{b:.0f}" for b in z10.best))
        graded = [s for s in seeds if (variant, s) in acc.index]
        with_z10 = [acc.loc[(variant, s), "state_acc_16x"] for s in graded if z10.loc[s, "channels"] > 0]
        without = [acc.loc[(variant, s), "state_acc_16x"] for s in graded if z10.loc[s, "channels"] == 0]
        cells += [_seeds_or_dash(with_z10), _seeds_or_dash(without)]
        claimed = t[t.channels > 0]
        checks = claimed[["known_rotation", "reinit", "shuffled_digits"]]
        ok = checks.notna().all().all() and checks.astype(bool).all().all()
        cells.append("–" if claimed.empty else "all passed" if ok else "see transitions.csv")
        rows.append(cells)
    return _table(["variant", "seeds", "a channel of order 2", "of order 5", "of order 10",
                   "longest Z_10 drift horizon, each seed (steps)", "state 16x, seeds with a Z_10 channel",
                   "state 16x, seeds without", "checks of the seeds with a counting channel"], rows)


def _schedule_of(checkpoint: str) -> str:
    return cell_and_schedule(Path(checkpoint).parent.parent.name)[1]


def recurrent_shortcuts(root: Path) -> str:
    """study/docs/recurrent.md: shortcut tests of the complex SSM's joint and DAT hybrids (seed 0): the state accuracy
    each block's attention carries (knock-out drop with its 95 % interval) and the answers a sum-preserving
    perturbation of the last 3 numbers changes (an exact tracker changes none), by length."""
    data = read_envelope(results_dir(root) / GRID / "analyses" / "shortcuts.json")
    res = pd.DataFrame(data["results"])
    res["schedule"] = res.checkpoint.map(_schedule_of)
    rows = []
    for schedule in ("joint", "dat"):
        part = res[res.schedule == schedule]
        ko = part[(part.test == "attention_knockout") & (part.subtask == "state")]
        sp = part[(part.test == "sum_preserving") & (part.k == 3)]
        for length in sorted(ko.length.dropna().unique()):
            at = ko[ko.length == length].set_index("blocks")
            s3 = sp[sp.length == length]

            def drop(b: str, at=at) -> str:
                r = at.loc[b]
                return f"{100 * r.effect:.1f} [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}]"

            changed = (f"{100 * s3.effect.iloc[0]:.1f} [{100 * s3.ci_low.iloc[0]:.1f}, {100 * s3.ci_high.iloc[0]:.1f}]"
                       if len(s3) else "–")
            rows.append([schedule, int(length), pct(at.loc["0"].baseline_acc), drop("0"), drop("1"), changed])
    checks = pd.DataFrame(data["controls"])
    inst = checks[checks.kind == "instrument"]
    return (_table(["schedule", "length", "state accuracy", "drop, attention 0 off", "drop, attention 1 off",
                    "answers changed by a sum-preserving edit of the last 3 numbers"], rows)
            + f"\n\nInstrument checks: {int(inst.passed.sum())} of {len(inst)} passed.")


def recurrent_probes(root: Path) -> str:
    """study/docs/recurrent.md: the probes' verdicts on the complex SSM's joint and DAT hybrids (seed 0), per block and
    length: best probe accuracy for s_t, the whole-state interchange (later answers that follow the source), and
    the verdict ``probe.probes`` draws from them and its controls."""
    v = pd.read_csv(results_dir(root) / GRID / "analyses" / "probes_verdicts.csv")
    rows = []
    for r in v.itertuples():
        block = "both" if r.block < 0 else str(r.block)
        rows.append([f"`{r.label}`", block, int(r.length), r.test_positions, pct(r.probe_acc), pct(r.control_acc),
                     pct(r.iia_full), pct(r.same_sum_changed), r.verdict])
    return _table(["model", "block", "length", "positions", "probe for s_t", "probe for the permuted-sum control",
                   "whole-state interchange followed", "changed by a same-sum source", "verdict"], rows)


def _seeds_or_dash(values: list[float]) -> str:
    return per_seed(values) if values else "–"


BLOCKS = {
    "recurrent-probes": recurrent_probes,
    "recurrent-readme": recurrent_readme,
    "recurrent-shortcuts": recurrent_shortcuts,
    "recurrent-transitions": recurrent_transitions,
    "recurrent-short": recurrent_short,
    "recurrent-seeds": recurrent_seeds,
    "recurrent-compare": recurrent_compare,
}
