"""The blocks of README.md and docs/*.md that quote study/results/: each a function of the committed results only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from doc_format import (
    can_reach,
    descriptive,
    mean_ci,
    min_adjusted_text,
    pct,
    per_seed,
    read_envelope,
    results_dir,
)
from doc_format import grid_of as _grid
from doc_format import p_text as _p
from doc_format import runs_of as _runs
from doc_format import table as _table
from scipy import stats as sps

from probe.core.stats import paired_interval, sign_flip_p
from probe.results import Grid
from probe.sweep.compare import compare

SOLVED = 0.95
"""A seed "holds" a length when its token accuracy there is at least this, on the subtask in question."""

WHAT = {
    "joint": "attention on and training from step 0",
    "dat": "attention off and out of the optimizer until step 2000",
    "stopgrad": "attention trains from step 0; no gradient flows back through it into the stream",
    "stopgrad-rnn": "as `stopgrad`, but only the LSTMs lose the gradient through attention",
    "stopgrad-nonrnn": "the complement: only the LSTMs keep the gradient through attention",
    "stopgrad-rnn0": "only block 0's LSTM loses it (through both attentions)",
    "stopgrad-rnn1": "only block 1's LSTM loses it",
    "frozen": "random attention in the forward pass from step 0, its weights fixed until step 2000",
    "dat-frozen-rnn": "DAT, and the LSTM frozen from the switch on",
    "frozen-copy": "attention learns from step 0; block 0's LSTM gets its gradient through attention's initial weights",
    "placebo": "block 0's LSTM loses gradient from the MLP paths instead, up to the norm `stopgrad-rnn0` removes "
               "(at most all of theirs)",
    "rnn0-until250": "`stopgrad-rnn0` for the first 250 steps only",
    "rnn0-until1000": "`stopgrad-rnn0` for the first 1000 steps only",
    "rnn0-att0": "only attention 0's path into block 0's LSTM is cut",
    "rnn0-att1": "only attention 1's path into block 0's LSTM is cut",
    "rnn1-att1": "only attention 1's path into block 1's LSTM is cut",
}


def _holds(runs: pd.DataFrame, factor: int) -> str:
    ok = (runs[f"state_acc_{factor}x"] >= SOLVED) & (runs[f"recall_acc_{factor}x"] >= SOLVED)
    return f"{int(ok.sum())} of {len(runs)}"


# --- README ---------------------------------------------------------------------------------------------------------
def headline(root: Path) -> str:
    rows = []
    for grid_name, variants, note in [("reproduction", ["lstm", "transformer", "hybrid-joint", "hybrid-dat"], "fp32"),
                                      ("mechanism", ["joint", "dat"], "bf16")]:
        grid = _grid(root, grid_name)
        for v in variants:
            r = _runs(grid, v)
            name = v if grid_name == "reproduction" else f"hybrid-{v}"
            rows.append([f"`{name}`", f"{grid_name} ({note})", len(r), mean_ci(r.state_acc_1x), mean_ci(r.state_acc_3x),
                         per_seed(r.state_acc_3x), mean_ci(r.recall_acc_3x), _holds(r, 3)])
    return _table(["model", "grid", "seeds", "state at 1x (all positions)", "state at 3x (all positions)",
                   "state at 3x, each seed (all positions)", "recall at 3x (all positions)",
                   f"seeds ≥ {100 * SOLVED:.0f} % on both at 3x"], rows)


MIN_TESTED = 3
"""A variant enters the comparisons (and their Holm family) once it has this many seeds; before that it is listed as
in progress with its seeds, untested (1 or 2 seeds against 10 cannot reach p < 0.05 after any adjustment)."""


SAME_AS = {"stopgrad-rnn1": "rnn1-att1"}
"""Variants that compute the same gradient as another: block 1's LSTM sits above attention 0, so only attention 1's
path reaches it, and `stopgrad-rnn1` is `rnn1-att1`. The comparisons count such a pair once, under the second name
(more seeds), after checking that every seed they share ended with the same accuracies at every length — a check
that fails if the two cuts differ."""


def _distinct(grid: Grid) -> list[str]:
    """The grid's variants with each SAME_AS pair counted once."""
    out = []
    for v in grid.variants:
        twin = SAME_AS.get(v)
        if twin in grid.variants:
            keys = ["seed", "length", "subtask"]
            both = grid.curves[grid.curves.variant == v].merge(grid.curves[grid.curves.variant == twin], on=keys)
            if both.empty or not (both.token_acc_x == both.token_acc_y).all():
                raise ValueError(f"{v} and {twin} are listed as the same cut, but their shared seeds differ")
            continue
        out.append(v)
    return out


def _tested(grid: Grid) -> list[str]:
    return [v for v in _distinct(grid) if len(_runs(grid, v)) >= MIN_TESTED]


def _mechanism_comparisons(root: Path) -> tuple[Grid, pd.DataFrame]:
    grid = _grid(root, "mechanism")
    return grid, compare(grid.curves[grid.curves.variant.isin(_tested(grid))], ["joint", "dat"])


def mechanism_in_progress(grid: Grid) -> str:
    """The variants with fewer than MIN_TESTED seeds: each seed's state accuracy at 3x, no test."""
    short = [v for v in _distinct(grid) if v not in _tested(grid)]
    if not short:
        return ""
    items = [f"`{v}` ({len(r := _runs(grid, v))} seed{'s' if len(r) > 1 else ''}: {per_seed(r.state_acc_3x)})"
             for v in short]
    return (f"\n\nIn progress, fewer than {MIN_TESTED} seeds and not tested yet (state at 3x, each seed): "
            + "; ".join(items) + ".")


README_VARIANTS = ["joint", "dat", "stopgrad-rnn", "stopgrad-nonrnn", "stopgrad-rnn0", "rnn0-until1000",
                   "rnn0-until250", "frozen", "frozen-copy", "placebo"]
"""The rows the README's table shows (the question each answers is in its bullets); study/docs/mechanism.md shows every
variant, and the Holm family is the whole table's either way."""


def mechanism_short(root: Path) -> str:
    grid, cmp = _mechanism_comparisons(root)
    vs_joint = cmp[cmp.baseline == "joint"].set_index("variant")
    rows = []
    for v in [v for v in README_VARIANTS if v in _tested(grid)]:
        r = _runs(grid, v)
        if v in vs_joint.index:
            c = vs_joint.loc[v]
            diff = f"{100 * c.difference:+.1f} [{100 * c.difference_ci_low:+.1f}, {100 * c.difference_ci_high:+.1f}]"
            p = f"{_p(c.p_permutation)} ({_p(c.p_holm)})"
        else:
            diff, p = "—", "—"
        rows.append([f"`{v}`", WHAT.get(v, ""), len(r), mean_ci(r.state_acc_3x), diff, p, mean_ci(r.recall_acc_3x)])
    n_tests = int(cmp.n_tests.iloc[0])
    return (_table(["variant", "what it changes", "seeds", "state at 3x [95 % CI] (all positions)",
                    "vs `joint` [95 % CI]",
                    f"p (Holm over {n_tests})", "recall at 3x (all positions)"], rows) + mechanism_in_progress(grid))


def _pairs_once(cmp: pd.DataFrame) -> list:
    """Each tested pair once (a table with two baselines lists dat vs joint and joint vs dat): the row whose baseline
    is listed first."""
    seen, rows = set(), []
    for r in cmp.itertuples():
        if (pair := frozenset((r.variant, r.baseline))) not in seen:
            seen.add(pair)
            rows.append(r)
    return rows


def family_caption(cmp: pd.DataFrame, what: str) -> str:
    """One line naming a comparison table's Holm family, its size and the smallest adjusted p each of its designs can
    reach (the family size times the design's smallest exact p)."""
    k = int(cmp.n_tests.iloc[0])
    designs = sorted({(int(r.n_seeds), int(r.n_seeds_baseline)) for r in cmp.itertuples()},
                     key=lambda d: (d[0] * d[1], d))
    parts = [f"{n} vs {m} seeds {min_adjusted_text('seeds', n, m, k)}" for n, m in designs]
    return (f"Holm family: {what}, {k} distinct tests (a pair met twice counts once); smallest attainable "
            "adjusted p by design: " + "; ".join(parts) + ".")


def _min_adj(r, k: int) -> str:
    return min_adjusted_text("seeds", int(r.n_seeds), int(r.n_seeds_baseline), k)


def mechanism_holm(root: Path) -> str:
    """Which comparisons of the mechanism table survive Holm's adjustment at the seed counts committed now."""
    _, cmp = _mechanism_comparisons(root)
    rows = _pairs_once(cmp)
    alpha = 0.05
    sig = [r for r in rows if r.p_holm < alpha]
    raw = [r for r in rows if r.p_holm >= alpha and r.p_permutation < alpha]

    def name(r) -> str:
        return (f"`{r.variant}` vs `{r.baseline}` ({100 * r.difference:+.1f} points, {r.n_seeds} vs "
                f"{r.n_seeds_baseline} seeds, Holm p {_p(r.p_holm)})")

    n = int(cmp.n_tests.iloc[0])
    lines = [f"Of the {n} comparisons (a Holm family of {n}; its smallest attainable adjusted p is "
             + ", ".join(sorted({f"{min_adjusted_text('seeds', r.n_seeds, r.n_seeds_baseline, n)} at {r.n_seeds} vs "
                                 f"{r.n_seeds_baseline} seeds" for r in rows}))
             + f"), significant after Holm's adjustment (p < {alpha}): "
             + ("; ".join(name(r) for r in sig) if sig else "none") + "."]
    if raw:
        lines.append(f"Below {alpha} before the adjustment only (same family of {n}): "
                     + "; ".join(name(r) for r in raw) + ".")
    return "\n".join(lines)


# --- study/docs/reproduction.md ---------------------------------------------------------------------------------------
def reproduction(root: Path) -> str:
    grid = _grid(root, "reproduction")
    c = grid.curves
    rows = []
    for v in grid.variants:
        for sub in ("state", "recall"):
            runs = _runs(grid, v)
            within = c[(c.variant == v) & (c.subtask == sub) & (c.length <= c.train_length)]
            train_mean = within.groupby("seed").token_acc.mean().sort_index()
            cells = [mean_ci(train_mean)] + [mean_ci(runs[f"{sub}_acc_{k}x"]) for k in (1, 2, 3, 4)]
            rows.append([v, sub, len(runs), *cells, mean_ci(runs[f"{sub}_score"])])
    return _table(["preset", "subtask", "seeds", "1..1x", "1x (25)", "2x (50)", "3x (75)", "4x (100)", "score"], rows)


def reproduction_seeds(root: Path) -> str:
    grid = _grid(root, "reproduction")
    rows = []
    for v in grid.variants:
        r = _runs(grid, v)
        cells = [" / ".join(pct(s[f"state_acc_{k}x"]) for k in (1, 2, 3, 4)) for _, s in r.iterrows()]
        seq = " / ".join(f"{100 * x:.0f}" for x in r.state_seq_acc_4x)
        rows.append([v, *[f"seed {s}: {c}" for s, c in zip(r.seed, cells, strict=True)], f"{seq} %"])
    n = max(len(row) for row in rows) - 2
    return _table(["preset", *[f"run {i + 1}" for i in range(n)], "sequence acc. at 4x"], rows)


def lr_compare(root: Path) -> str:
    new, old = _grid(root, "reproduction"), _grid(root, "lr1e-3")
    rows = []
    for v in new.variants:
        if v not in old.variants:
            continue
        a, b = _runs(old, v).set_index("seed"), _runs(new, v).set_index("seed")
        seeds = sorted(set(a.index) & set(b.index))
        rows.append([v, ", ".join(map(str, seeds)), per_seed(a.loc[seeds].state_acc_3x),
                     per_seed(b.loc[seeds].state_acc_3x), per_seed(a.loc[seeds].recall_acc_3x)])
    return _table(["preset", "seeds", "state at 3x, lr 1e-3", "state at 3x, lr 2e-3 (the presets)",
                   "recall at 3x, lr 1e-3"], rows)


# --- docs/checkpoints.md --------------------------------------------------------------------------------------------
def shipped_joint(root: Path) -> str:
    r = _runs(_grid(root, "precision"), "joint-fp32")
    median = float(np.median(r.state_acc_3x))
    pick = r.seed[np.isclose(r.state_acc_3x, median)].tolist()
    rows = [[int(s), pct(a), pct(b), "shipped" if int(s) in pick else ""]
            for s, a, b in zip(r.seed, r.state_acc_3x, r.recall_acc_3x, strict=True)]
    return _table(["seed", "state at 3x (all positions)", "recall at 3x (all positions)", ""], rows)


# --- study/docs/mechanism.md ------------------------------------------------------------------------------------------
def mechanism_table(root: Path) -> str:
    grid = _grid(root, "mechanism")
    rows = []
    for v in grid.variants:
        r = _runs(grid, v)
        for sub in ("state", "recall"):
            rows.append([v, sub, len(r), *[mean_ci(r[f"{sub}_acc_{k}x"]) for k in (1, 2, 3, 4)],
                         mean_ci(r[f"{sub}_score"])])
    return _table(["variant", "subtask", "seeds", "1x (25)", "2x (50)", "3x (75)", "4x (100)", "score"], rows)


def mechanism_seeds(root: Path) -> str:
    grid = _grid(root, "mechanism")
    rows = []
    for v in grid.variants:
        r = _runs(grid, v)
        rows.append([v, len(r), ", ".join(map(str, r.seed)), per_seed(r.state_acc_3x), per_seed(r.state_acc_4x),
                     f"{pct(r.recall_acc_3x.min())}–{pct(r.recall_acc_3x.max())}", _holds(r, 3)])
    return _table(["variant", "seeds", "which", "state at 3x, each seed (all positions)",
                   "state at 4x, each seed (all positions)",
                   "recall at 3x, range", f"seeds ≥ {100 * SOLVED:.0f} % on both at 3x"], rows)


def mechanism_compare(root: Path) -> str:
    _, cmp = _mechanism_comparisons(root)
    rows = []
    for r in cmp.itertuples():
        rows.append([r.variant, r.baseline, f"{r.n_seeds} vs {r.n_seeds_baseline}",
                     f"{100 * r.difference:+.1f} [{100 * r.difference_ci_low:+.1f}, {100 * r.difference_ci_high:+.1f}]",
                     _p(r.p_permutation), _min_adj(r, int(r.n_tests)), _p(r.p_holm), r.verdict])
    k = int(cmp.n_tests.iloc[0])
    return (family_caption(cmp, "every comparison of this table") + "\n\n"
            + _table(["variant", "baseline", "seeds", "difference [95 % Welch CI]", "p", "min. adj. p",
                      f"Holm p (over {k})", "verdict"], rows))


def _focused(root: Path, variants: list[str], baselines: list[str]) -> str:
    """A pre-specified question of the mechanism grid, answered among its own variants: each seed with the runs
    below SOLVED and the bound on that failure rate, then every pair against ``baselines`` with its own Holm family
    (these pairs are not in the table's family). Variants with fewer than MIN_TESTED seeds are listed, untested."""
    grid = _grid(root, "mechanism")
    rows = []
    for v in variants:
        r = _runs(grid, v)
        k = int((r.state_acc_3x < SOLVED).sum())
        rows.append([f"`{v}`", WHAT.get(v, ""), len(r), per_seed(r.state_acc_3x), mean_ci(r.state_acc_3x),
                     f"{k} of {len(r)}", f"{100 * _failure_bound(k, len(r)):.0f} %" if len(r) else "–"])
    out = _table(["variant", "what it changes", "seeds", "state at 3x, each seed (all positions)", "mean [95 % t-CI]",
                  f"runs below {100 * SOLVED:.0f} %", "95 % upper bound on the failure rate"], rows)
    tested = [v for v in variants if len(_runs(grid, v)) >= MIN_TESTED]
    if len(tested) < len(variants):
        return out + f"\n\nNot tested yet: fewer than {MIN_TESTED} seeds of " + ", ".join(
            f"`{v}`" for v in variants if v not in tested) + "."
    cmp = compare(grid.curves[grid.curves.variant.isin(tested)], baselines)
    rows = [[f"`{r.variant}` vs `{r.baseline}`", f"{r.n_seeds} vs {r.n_seeds_baseline}",
             f"{100 * r.difference:+.1f} [{100 * r.difference_ci_low:+.1f}, {100 * r.difference_ci_high:+.1f}]",
             _p(r.p_permutation), _min_adj(r, int(r.n_tests)), _p(r.p_holm), r.verdict] for r in _pairs_once(cmp)]
    k = int(cmp.n_tests.iloc[0])
    return (out + "\n\n" + family_caption(cmp, "this question's own comparisons") + "\n\n"
            + _table(["comparison", "seeds", "difference [95 % Welch CI]", "p", "min. adj. p", f"Holm p (over {k})",
                      "verdict"], rows))


def mechanism_blocks(root: Path) -> str:
    """Block 0 vs block 1 without the confound: one attention's path into one LSTM at a time."""
    return _focused(root, ["rnn0-att0", "rnn0-att1", "rnn1-att1"], ["rnn1-att1", "rnn0-att1"])


def mechanism_early(root: Path) -> str:
    """Is shielding block 0's LSTM early enough? The early-only cuts against the whole-run cut (each against
    `joint` is in the table's family)."""
    return _focused(root, ["rnn0-until250", "rnn0-until1000", "stopgrad-rnn0"], ["stopgrad-rnn0"])


def _failure_bound(k: int, n: int, level: float = 0.95) -> float:
    """One-sided Clopper–Pearson upper bound on a per-run failure rate after k failures in n runs."""
    return 1.0 if k >= n else float(sps.beta.ppf(level, k + 1, n - k))


def switch(root: Path) -> str:
    mech, grid = _grid(root, "mechanism"), _grid(root, "switch")
    entries = [("0 (`joint`)", _runs(mech, "joint"))]
    entries += [(v.removeprefix("switch-"), _runs(grid, v)) for v in grid.variants if v.startswith("switch-")]
    entries.insert(next(i for i, (s, _) in enumerate(entries) if s.isdigit() and int(s) > 2000) if any(
        s.isdigit() and int(s) > 2000 for s, _ in entries) else len(entries), ("2000 (`dat`)", _runs(mech, "dat")))
    entries += [("`adaptive`", _runs(grid, "adaptive"))]
    rows = []
    for name, r in entries:
        k = int((r.state_acc_3x < SOLVED).sum())
        rows.append([name, len(r), per_seed(r.state_acc_3x), f"{k} of {len(r)}",
                     f"{100 * _failure_bound(k, len(r)):.0f} %", pct(r.recall_acc_3x.min())])
    return _table(["switch step", "seeds", "state at 3x, each seed (all positions)", f"runs below {100 * SOLVED:.0f} %",
                   "95 % upper bound on the failure rate", "lowest recall at 3x (all positions)"], rows)


def _paired_test(d: np.ndarray, family: int) -> str:
    """A sign-flip test of paired differences only where its design can reach adjusted p < 0.05 in its family (each
    row its own test; Bonferroni, which Holm's smallest adjusted p equals); else why none was run."""
    n = int(np.count_nonzero(d))  # a zero difference has no sign to flip
    if not can_reach("pairs", n, family=family):
        return descriptive("pairs", n, family=family)
    return (f"sign-flip p {_p(sign_flip_p(d))}, Bonferroni over {family} {_p(min(1.0, family * sign_flip_p(d)))} "
            f"(smallest attainable {min_adjusted_text('pairs', n, family=family)})")


def precision(root: Path) -> str:
    fp32, bf16 = _grid(root, "precision"), _grid(root, "mechanism")
    rows = []
    variants = ("joint", "dat")
    for v in variants:
        a = _runs(fp32, f"{v}-fp32").set_index("seed").state_acc_3x
        b = _runs(bf16, v).set_index("seed").state_acc_3x
        seeds = sorted(set(a.index) & set(b.index))
        d = (b.loc[seeds] - a.loc[seeds]).to_numpy()
        iv = paired_interval(b.loc[seeds].to_numpy(), a.loc[seeds].to_numpy())
        rho = sps.spearmanr(a.loc[seeds], b.loc[seeds]).statistic
        rows.append([v, len(seeds), per_seed(a.loc[seeds]), per_seed(b.loc[seeds]),
                     f"{100 * d.mean():+.1f} [{100 * iv.low:+.1f}, {100 * iv.high:+.1f}]", f"{rho:.2f}",
                     _paired_test(d, len(variants))])
    return _table(["variant", "pairs", "fp32, each seed", "bf16 + fused AdamW, each seed",
                   "bf16 − fp32 [95 % t-CI]", "Spearman", "test"], rows)


def mechanism_shortcuts(root: Path) -> str:
    """Knock-out and sum-preserving tests of seeds 0 and 1 of the mechanism variants (``probe.shortcuts``)."""

    rows = []
    for name in ("mechanism_seed01", "stopgrad_rnn_seed01", "stopgrad_nonrnn_seed01"):
        results = read_envelope(results_dir(root) / "mechanism" / "shortcuts" / f"{name}.json")["results"]
        for ckpt in dict.fromkeys(r["checkpoint"] for r in results if str(r["checkpoint"]).endswith(".pt")):
            mine = [r for r in results if r["checkpoint"] == ckpt]

            def effect(test: str, length: int, mine: list[dict] = mine, **match: object) -> str:
                hit = [r for r in mine if r["test"] == test and r["length"] == length
                       and all(r.get(k) == v for k, v in match.items())]
                return f"{hit[0]['effect']:.3f}" if hit else "–"

            variant, seed = Path(ckpt).parent.parent.name, Path(ckpt).parent.name.removeprefix("seed")
            rows.append([f"{variant} seed {seed}",
                         " / ".join(effect("attention_knockout", L, blocks="all", subtask="state") for L in (25, 75)),
                         " / ".join(effect("attention_knockout", L, blocks="all", subtask="recall") for L in (25, 75)),
                         " / ".join(effect("sum_preserving", L, k=3.0) for L in (25, 75))])
    return _table(["run", "state drop with every attention gate at 0, L 25 / 75", "recall drop, L 25 / 75",
                   "sum-preserving (k = 3): answers changed at L 25 / 75"], rows)


def sharpness(root: Path) -> str:
    """The recall head's attention mass on the queried value vs length, with and without log-length scaling."""

    rows = read_envelope(results_dir(root) / "sharpness" / "results.json")["results"]
    out = []
    for label in dict.fromkeys(r["label"] for r in rows):
        mass = [r for r in rows if r["label"] == label and r["metric"] == "attention_mass" and r["target"] == "value"]
        train = [r for r in mass if r["length"] == r["train_length"] and r["scale"] == "none"]
        head = max(train, key=lambda r: r["mass"])
        for length in sorted({r["length"] for r in mass}):
            cell = {}
            for scale in ("none", "log-length"):
                m = next(r for r in mass if (r["layer"], r["head"], r["length"], r["scale"])
                         == (head["layer"], head["head"], length, scale))
                acc = {r["subtask"]: r["token_acc"] for r in rows if r["label"] == label and r["metric"] == "accuracy"
                       and r["length"] == length and r["scale"] == scale}
                cell[scale] = (m, acc)
            (m0, a0), (m1, a1) = cell["none"], cell["log-length"]
            out.append([label, f"L{head['layer']}H{head['head']}", length,
                        f"{m0['mass']:.3f} [{m0['ci_low']:.3f}, {m0['ci_high']:.3f}]",
                        f"{m1['mass']:.3f} [{m1['ci_low']:.3f}, {m1['ci_high']:.3f}]", f"{m0['reference']:.3f}",
                        f"{a0['recall']:.3f} / {a1['recall']:.3f}", f"{a0['state']:.3f} / {a1['state']:.3f}"])
    return _table(["checkpoint", "recall head", "L", "mass (none)", "mass (log-length)", "reference",
                   "recall acc (none / log-length)", "state acc (none / log-length)"], out)


def _sharpness_of(path: Path) -> tuple[list[dict], dict, dict]:
    """A ``probe.sharpness`` results.json: its rows, recall accuracy per (checkpoint, length, scale), and the recall
    head's value-mass row per (checkpoint, length, scale), the recall head being each checkpoint's head with the
    largest mass on the value at L_train without a scale."""

    rows = read_envelope(path)["results"]
    recall = {(r["checkpoint"], r["length"], r["scale"]): r["token_acc"] for r in rows
              if r["metric"] == "accuracy" and r["subtask"] == "recall"}
    value = [r for r in rows if r["metric"] == "attention_mass" and r["target"] == "value"]
    head = {}  # checkpoint -> (its largest mass at L_train, layer, head)
    for r in value:
        if r["scale"] == "none" and r["length"] == r["train_length"] and r["mass"] > head.get(r["checkpoint"], (0,))[0]:
            head[r["checkpoint"]] = (r["mass"], r["layer"], r["head"])
    mass = {(r["checkpoint"], r["length"], r["scale"]): r for r in value
            if (r["layer"], r["head"]) == head[r["checkpoint"]][1:]}
    return rows, recall, mass


def sharpness_seeds(root: Path) -> str:
    """Several seeds of a grid: per variant and length, each seed's recall accuracy without and with log-length
    scaling, and its recall head's mass on the value (the head with the largest such mass at L_train, per seed)."""
    rows, recall, mass = _sharpness_of(results_dir(root) / "sharpness" / "mechanism" / "results.json")
    out = []
    for label in dict.fromkeys(r["label"] for r in rows):
        ckpts = list(dict.fromkeys(r["checkpoint"] for r in rows if r["label"] == label))
        for length in sorted({r["length"] for r in rows if r["label"] == label}):
            cells = []
            for scale in ("none", "log-length"):
                acc = [recall[c, length, scale] for c in ckpts]
                cells += [per_seed(acc), f"{int(sum(a >= 0.99 for a in acc))} of {len(acc)}",
                          mean_ci([mass[c, length, scale]["mass"] for c in ckpts])]
            ref = np.mean([mass[c, length, "none"]["reference"] for c in ckpts])
            out.append([label, len(ckpts), length, *cells, pct(float(ref))])
    return _table(["model", "seeds", "L", "recall, each seed", "seeds ≥ 99 %", "recall head's mass (%) [95 % t-CI]",
                   "recall with log-length, each seed", "seeds ≥ 99 %", "mass with log-length (%)",
                   "reference e^Δ/(e^Δ+n−1) (%)"], out)


def sharpness_ssmax(root: Path) -> str:
    """DAT on seeds 0-4 (the long grid) without a scale and with log-length at evaluation, beside DAT trained with
    scalable softmax on the same seeds (study/sweeps/ssmax.toml): per length, each seed's recall, the seeds >= 99 %, and
    the recall head's mass on the value (mean over seeds, t-interval)."""
    base = results_dir(root) / "sharpness"
    if not (base / "ssmax" / "results.json").is_file() or not (base / "long-dat" / "results.json").is_file():
        return "No sharpness measurement of `study/sweeps/ssmax.toml`'s runs is committed yet."
    out = []
    for name, folder, scale in (("`dat`", "long-dat", "none"), ("`dat`, log-length at evaluation", "long-dat",
                                                               "log-length"), ("`dat-ssmax`", "ssmax", "none")):
        rows, recall, mass = _sharpness_of(base / folder / "results.json")
        ckpts = list(dict.fromkeys(r["checkpoint"] for r in rows))
        for length in sorted({r["length"] for r in rows}):
            acc = [recall[c, length, scale] for c in ckpts]
            out.append([name, len(ckpts), length, per_seed(acc), f"{int(sum(a >= 0.99 for a in acc))} of {len(acc)}",
                        mean_ci([mass[c, length, scale]["mass"] for c in ckpts]),
                        pct(float(np.mean([mass[c, length, scale]["reference"] for c in ckpts])))])
    table = _table(["model", "seeds", "L", "recall, each seed", "seeds ≥ 99 %", "recall head's mass (%) [95 % t-CI]",
                    "reference e^Δ/(e^Δ+n−1) (%)"], out)
    if not (results_dir(root) / "ssmax" / "runs.jsonl").is_file():
        return table
    ssmax = _runs(_grid(root, "ssmax"), "dat-ssmax")
    dat = _runs(_grid(root, "long"), "dat")
    dat = dat[dat.seed.isin(ssmax.seed)]
    return table + (f"\n\nThe grids' evaluation (256 sequences a length), seeds {', '.join(map(str, ssmax.seed))}: "
                    f"state accuracy at 16x `dat` {per_seed(dat.state_acc_16x)}, `dat-ssmax` "
                    f"{per_seed(ssmax.state_acc_16x)}; at 4x `dat` {per_seed(dat.state_acc_4x)}, `dat-ssmax` "
                    f"{per_seed(ssmax.state_acc_4x)}; recall at 16x `dat-ssmax` {per_seed(ssmax.recall_acc_16x)}.")


def throughput(root: Path) -> str:
    """The benchmark's own table (``python benchmarks/throughput.py``, saved in study/results/throughput.txt)."""
    text = (results_dir(root) / "throughput.txt").read_text()
    head, table = text.split("\n\n", 2)[:2]
    return "```\n" + head.strip() + "\n```\n\n" + table.strip()


BLOCKS: dict[str, Callable[[Path], str]] = {
    "throughput": throughput,
    "sharpness": sharpness,
    "sharpness-seeds": sharpness_seeds,
    "sharpness-ssmax": sharpness_ssmax,
    "mechanism-shortcuts": mechanism_shortcuts,
    "headline": headline,
    "mechanism-short": mechanism_short,
    "mechanism-holm": mechanism_holm,
    "reproduction": reproduction,
    "reproduction-seeds": reproduction_seeds,
    "lr-compare": lr_compare,
    "shipped-joint": shipped_joint,
    "mechanism-table": mechanism_table,
    "mechanism-seeds": mechanism_seeds,
    "mechanism-compare": mechanism_compare,
    "switch": switch,
    "mechanism-blocks": mechanism_blocks,
    "mechanism-early": mechanism_early,
    "precision": precision,
}

# the analyses' blocks (study/docs/gradients.md, probes.md, shortcuts.md) live beside this file
from doc_blocks_analyses import BLOCKS as _ANALYSES  # noqa: E402

BLOCKS.update(_ANALYSES)
from doc_blocks_recurrent import BLOCKS as _RECURRENT  # noqa: E402

BLOCKS.update(_RECURRENT)
from doc_blocks_dense import BLOCKS as _DENSE  # noqa: E402

BLOCKS.update(_DENSE)
from doc_blocks_deep import BLOCKS as _DEEP  # noqa: E402
from doc_blocks_long import BLOCKS as _LONG  # noqa: E402

BLOCKS.update(_DEEP)
BLOCKS.update(_LONG)
from doc_blocks_claims import BLOCKS as _CLAIMS  # noqa: E402
from doc_blocks_findings import BLOCKS as _FINDINGS  # noqa: E402
from doc_blocks_fresh import BLOCKS as _FRESH  # noqa: E402

BLOCKS.update(_FRESH)
BLOCKS.update(_CLAIMS)
BLOCKS.update(_FINDINGS)
from doc_blocks_coadaptation import BLOCKS as _COADAPTATION  # noqa: E402
from doc_blocks_realstep import BLOCKS as _REALSTEP  # noqa: E402
from doc_blocks_ssm import BLOCKS as _SSM  # noqa: E402
from doc_blocks_transfer import BLOCKS as _TRANSFER  # noqa: E402

BLOCKS.update(_COADAPTATION)
BLOCKS.update(_SSM)
BLOCKS.update(_REALSTEP)
BLOCKS.update(_TRANSFER)
