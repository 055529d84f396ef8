"""The blocks of study/docs/recurrent.md that quote the SSM grids (sweeps/ssm_boundary.toml, ssm_lr.toml,
ssm_complex10.toml): each a function of the committed results only, so that where theory and the trained cells part
follows from the runs by rendering alone. Before a grid is collected its blocks say so and name the command.

The decision rules, fixed before any run of these grids (the first two are the sweep files' own, quoted verbatim):

- Screen (sweeps/ssm_boundary.toml): "a variant is extended to 10 seeds (53-59 added, the same settings) where it
  learns the state beyond 4x, i.e. where a screening seed has state >= 90 % in (4x, 8x] (the window metric
  state_win_4x_8x of runs.jsonl); a variant where no seed does is reported on its 3 seeds as screened, not as a
  finding." The extension's sweep file is rendered from the screen (``extension_toml``): its variants are exactly
  the qualifying ones, its seeds 53-59; it is committed as study/sweeps/ssm_boundary10.toml once the screen is
  complete, run into runs/ssm_boundary10 and collected as its own grid, which these blocks pool with the screen.
- Fit (sweeps/ssm_lr.toml): "it must fit 1x (state >= 99 % in range: state_win_0x_1x >= 0.99 in runs.jsonl) before
  "cannot count" is said. If some lr fits 1x on both seeds, ssm-positive's beyond-range accuracy is judged at that
  lr (and the recurrent grid's comparison redone there); if none does, the claim stays "did not fit at any lr
  tried", not "cannot count"." At a fitting lr "cannot count" is said when every seed there is below 95 % in
  (2x, 4x]; a seed at or above it there is a fitting positive SSM that counts beyond its training lengths.
- Holding and losing (every grid): a seed holds a window when its token accuracy there is >= 95 % (HOLDS); a
  variant loses the state, or one factor of it (parity, mod 5), in the first window beyond the training lengths
  where the mean over its seeds falls below 95 %; it holds it to 16x if no window to (8x, 16x] does.
- Z_10 (the complex SSM, sweeps/ssm_complex10.toml with results/recurrent's seeds 0-4): a schedule learns Z_10
  beyond its training lengths when at least half of its seeds hold the state (mod 10) in (2x, 4x].
- Theory against the cells: theory allows a factor at every length where the range represents it exactly (parity
  from a = -1, in the negative ranges; parity, mod 5 and the state from rotations of modulus 1, in the complex ones;
  nothing beyond remembering in the positive ones); the open ranges reach those transitions only approximately
  (|a| < 1, so a kept state fades: ``fade_400``), yet near enough to the boundary to keep a factor over the 400
  tokens tested (a modulus of 0.9999 keeps 96 % of it), so up to 16x they allow what the closed ones do. They part
  where a factor theory allows is lost before 16x (the gap is what gradient descent found, not what the cell can
  represent), or where a factor theory rules out at arbitrary lengths is held to 16x (the lengths tested are too
  short to show the limit).
- Fit before the comparison (added after the grids were read, when a review found ssm-positive-closed's state, held
  in range by 1 of its 3 seeds, labelled "agree"): theory and a cell are compared on a factor only where the variant
  fits it in range, i.e. every seed holds it there (>= HOLDS in range, ``fits_in_range``); elsewhere the comparison
  is untested, since failing beyond lengths a cell does not fit says nothing about what it can count (the rule
  sweeps/ssm_lr.toml fixed for ssm-positive, at HOLDS rather than its 99 %).
- Schedules (the complex SSM): DAT, stopgrad-rnn and the cell alone each against the joint hybrid, state in
  (4x, 8x], one Holm family of 3; Welch interval, permutation p; a design that cannot reach adjusted p < 0.05 in
  that family is descriptive.
- Windows of results/recurrent's seeds 0-4, which were evaluated before windows existed, are estimated from their
  curves (``estimated_windows``); over the runs that have both, the mean of measured - estimated per beyond window
  and factor is an instrument check (one-sample t, Bonferroni at ESTIMATE_ALPHA), and where any is detectably
  nonzero, or fewer than MIN_CHECK_RUNS runs can test it, the pooled analysis drops the estimated seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.stats as sps
import tomllib
from doc_format import grid_of, min_adjusted_text, p_text, pct, per_seed, results_dir, table

from probe.results import Grid
from probe.sweep.compare import compare
from probe.sweep.plots import cell_and_schedule

WINDOWS = (("0x_1x", "in range", 0, 1), ("1x_2x", "(1x, 2x]", 1, 2), ("2x_4x", "(2x, 4x]", 2, 4),
           ("4x_8x", "(4x, 8x]", 4, 8), ("8x_16x", "(8x, 16x]", 8, 16))
"""The windows of stream positions (probe.windows), as runs.jsonl names them, as reports print them, and their ends
as multiples of L_train."""
FACTORS = (("state", "state (mod 10)", 1 / 10), ("state_mod2", "parity (mod 2)", 1 / 2),
           ("state_mod5", "mod 5", 1 / 5))
"""The running sum mod 10 and its two factors (Z_10 = Z_2 x Z_5), each with its chance floor (1/q)."""
HOLDS = 0.95
"""A seed holds a window when its token accuracy there is at least this; a variant loses a factor in the first
window beyond L_train where the mean over its seeds falls below it."""
SCREEN_BAR = 0.90
"""sweeps/ssm_boundary.toml: a screening seed with state >= this in (4x, 8x] qualifies its variant."""
EXTENSION_SEEDS = tuple(range(53, 60))
FIT_BAR = 0.99
"""sweeps/ssm_lr.toml: the positive SSM fits 1x at an lr where both seeds have state >= this in range."""
ESTIMATE_ALPHA = 0.05
"""The instrument check of the curve estimate: per beyond window and factor, the mean over runs of measured minus
estimated is tested against 0 (one-sample t, two-sided, Bonferroni over the windows x factors at this level); an
estimate detectably biased in any cell (a wrong window bound or length would be) leaves the estimated seeds out. One
run's gap is not the test: the answers of one sequence rise and fall together, so a run's estimate and its measured
window (different sequences below the longest length) differ by several points from sequence-level luck alone."""
MIN_CHECK_RUNS = 3
"""Runs with both measured and estimated windows needed for the bias test (fewer: no check, estimated seeds out)."""

def _plan(name: str) -> dict:
    """A grid's sweep file (study/sweeps/NAME.toml): what was planned before its runs, so that a grid collected part
    way is read against all it will hold, not against the runs it happens to have."""
    return tomllib.loads((Path(__file__).resolve().parents[1] / "sweeps" / f"{name}.toml").read_text())


BOUNDARY_PLAN = _plan("ssm_boundary")
BOUNDARY_VARIANTS = tuple(v["name"] for v in BOUNDARY_PLAN["variant"])
"""The screen's variants: one with no run collected yet is pending, never passed over."""
SCREEN_SEEDS = tuple(int(x) for x in BOUNDARY_PLAN["seeds"])
LR_PLAN = _plan("ssm_lr")
LR_VARIANTS = tuple(v["name"] for v in LR_PLAN["variant"])
LR_SEEDS = tuple(int(x) for x in LR_PLAN["seeds"])
"""sweeps/ssm_lr.toml's seeds (every lr runs both)."""
COMPLEX10_SEEDS = tuple(_plan("ssm_complex10")["seeds"])

# What theory allows at every length, per range, on the running sum mod 10: the closed ranges reach the transitions
# exactly (a = -1, |a| = 1), the open ones only approximately.
ALLOWS = {"positive": (), "negative": ("state_mod2",), "complex": ("state", "state_mod2", "state_mod5")}


def _run_first(grid_name: str) -> str:
    return (f"not run yet: `python -m probe.sweep study/sweeps/{grid_name}.toml --out runs/{grid_name}`, then "
            f"`study/scripts/collect_grid.sh {grid_name}`")


def _grid(root: Path, name: str) -> Grid | None:
    return grid_of(root, name) if (results_dir(root) / name / "runs.jsonl").is_file() else None


def _range_of(variant: str) -> tuple[str, bool]:
    """``hybrid-ssm-negative-closed-dat`` -> ("negative", True): the range and whether it is closed."""
    cell = cell_and_schedule(variant)[0].removeprefix("ssm-")
    return cell.removesuffix("-closed"), cell.endswith("-closed")


def _col(name: str, window: str) -> str:
    return f"{name}_win_{window}"


# --- windows: measured, or estimated from the curves of a grid evaluated before windows ----------------------------
def estimated_windows(grid: Grid, counts: bool = False) -> pd.DataFrame:
    """Per run, each window's token accuracy per factor from the all-position curves: (correct at hi x L - correct
    at lo x L) / (answers at hi x L - answers at lo x L). Position t of any sequence is distributed as in every
    other length (``probe.windows``), so this estimates the window without bias; the two lengths draw different
    sequences, so it is noisier than the measured window. In range it is exact (the all-position accuracy at L).
    With ``counts``, each estimate's answers too (``<factor>_n_<window>``), for its standard error."""
    c = grid.curves
    rows = []
    for (variant, seed), g in c.groupby(["variant", "seed"], sort=False):
        lt = int(g.train_length.iloc[0])
        row: dict = {"variant": variant, "seed": int(seed)}
        for name, _, _ in FACTORS:
            part = g[g.subtask == name].set_index("length")
            if part.empty:
                continue
            right = (part.token_acc * part.n_tokens).round()
            for w, _, lo, hi in WINDOWS:
                if hi * lt not in part.index or (lo and lo * lt not in part.index):
                    continue
                n = part.n_tokens[hi * lt] - (part.n_tokens[lo * lt] if lo else 0)
                r = right[hi * lt] - (right[lo * lt] if lo else 0)
                row[_col(name, w)] = float(np.clip(r / n, 0, 1)) if n > 0 else math.nan
                if counts:
                    row[f"{name}_n_{w}"] = float(n)
        rows.append(row)
    return pd.DataFrame(rows)


def _measured(grid: Grid) -> pd.DataFrame:
    cols = [_col(n, w) for n, _, _ in FACTORS for w, *_ in WINDOWS]
    return grid.runs.reindex(columns=["variant", "seed", *cols])


def window_values(grid: Grid) -> pd.DataFrame:
    """One row per run: every window x factor, measured where the run has its windows (``source`` "measured"),
    else estimated from its curves (``source`` "estimated")."""
    measured = _measured(grid)
    has = measured[_col("state", "4x_8x")].notna()
    est = estimated_windows(grid).set_index(["variant", "seed"])
    out = measured.copy()
    for i in out.index[~has]:
        key = (out.at[i, "variant"], int(out.at[i, "seed"]))
        if key in est.index:
            for c in est.columns:
                out.at[i, c] = est.at[key, c]
    out["source"] = np.where(has, "measured", "estimated")
    return out


def estimate_error(grid: Grid) -> tuple[float, float, float, int]:
    """The instrument check of ``estimated_windows`` (ESTIMATE_ALPHA): over the runs that have both measured and
    estimated windows, per beyond window and factor, the mean of measured - estimated and its one-sample t. Returns
    the largest |mean| (accuracy), the largest |t|, the Bonferroni critical |t| (NaN with fewer than MIN_CHECK_RUNS
    runs) and the number of runs."""
    measured = _measured(grid)
    measured = measured[measured[_col("state", "4x_8x")].notna()].set_index(["variant", "seed"])
    est = estimated_windows(grid).set_index(["variant", "seed"]).reindex(measured.index)
    cols = [_col(n, w) for n, _, _ in FACTORS for w, *_ in WINDOWS[1:] if _col(n, w) in est and _col(n, w) in measured]
    diffs = (measured[cols] - est[cols]) if cols else pd.DataFrame()
    both = diffs.dropna(how="all")
    n = len(both)
    if n < MIN_CHECK_RUNS:
        return math.nan, math.nan, math.nan, n
    means, ts = [], []
    for c in cols:
        d = both[c].dropna().to_numpy(float)
        if len(d) < MIN_CHECK_RUNS:
            continue
        sd = float(np.std(d, ddof=1))
        mean = float(d.mean())
        means.append(abs(mean))
        ts.append(abs(mean) / (sd / math.sqrt(len(d))) if sd > 0 else (0.0 if mean == 0 else math.inf))
    if not ts:
        return math.nan, math.nan, math.nan, n
    crit = float(sps.t.ppf(1 - ESTIMATE_ALPHA / (2 * len(ts)), df=n - 1))
    return max(means), max(ts), crit, n


# --- holding, losing, and theory ------------------------------------------------------------------------------------
def lost_at(values: pd.DataFrame, name: str) -> str | None:
    """The first window beyond L_train where the mean over seeds of ``name`` falls below HOLDS ("in range" if it
    does there already); None if it holds every window to (8x, 16x]; "–" without values."""
    for w, label, _, _ in WINDOWS:
        v = values[_col(name, w)].dropna() if _col(name, w) in values else pd.Series(dtype=float)
        if v.empty:
            return "–"
        if v.mean() < HOLDS:
            return label
    return None


def fits_in_range(values: pd.DataFrame, name: str) -> tuple[int, int]:
    """Seeds holding ``name`` in range (at or above HOLDS) and seeds measured there: the variant fits the factor in
    range when the two are equal (the module docstring's fit rule)."""
    v = values[_col(name, "0x_1x")].dropna() if _col(name, "0x_1x") in values else pd.Series(dtype=float)
    return int((v >= HOLDS).sum()), len(v)


FIT_TEXT = ("The theory column compares a factor only where the variant fits it in range (every seed at or above "
            f"{pct(HOLDS)} % there); elsewhere it says \"untested\": failing beyond lengths a cell does not fit "
            "says nothing about what it can count.")


def theory_verdict(variant: str, name: str, lost: str | None, fit: tuple[int, int] | None = None) -> str:
    """Where theory and the trained cell part on one factor (the module docstring's rule); ``fit`` (seeds holding it
    in range, seeds measured): where fewer than all hold it there, untested (the fit rule)."""
    if lost == "–":
        return "–"
    if fit is not None and fit[0] < fit[1]:
        return f"untested: does not fit in range ({fit[0]} of {fit[1]} seeds at or above {pct(HOLDS)} % there)"
    rng, closed = _range_of(variant)
    allowed = name in ALLOWS.get(rng, ())
    how = "exactly" if closed else "to 16x with |a| near enough to 1; the state fades beyond"
    if allowed and lost is None:
        return f"agree: theory allows it at every length ({how}); held to 16x"
    if allowed:
        return (f"part: theory allows it at every length ({how}); lost in {lost} (what gradient descent found, "
                "not what the cell can represent)")
    if lost is None:
        return ("part: theory rules it out at arbitrary lengths, yet it is held to 16x (the lengths tested are too "
                "short to show the limit)")
    return f"agree: theory rules it out at arbitrary lengths; lost in {lost}"


def _cell(values: pd.Series) -> str:
    v = values.dropna()
    return "–" if v.empty else f"{pct(v.mean())} · {int((v >= HOLDS).sum())}/{len(v)}"


def factor_table(values: pd.DataFrame, variants: list[str], theory: bool = True) -> str:
    """Rows per variant and factor: each window's mean over seeds · seeds holding it, the chance floor, where the
    variant loses it, and (``theory``) how that stands against what theory allows."""
    rows = []
    for v in variants:
        part = values[values.variant == v]
        for name, label, chance in FACTORS:
            if _col(name, "0x_1x") not in part or part[_col(name, "0x_1x")].isna().all():
                continue
            lost = lost_at(part, name)
            row = [f"`{v}`", label, len(part), *[_cell(part[_col(name, w)]) for w, *_ in WINDOWS], pct(chance),
                   "held to 16x" if lost is None else lost]
            rows.append(row + ([theory_verdict(v, name, lost, fits_in_range(part, name))] if theory else []))
    return table(["variant", "factor", "seeds", *[lab for _, lab, _, _ in WINDOWS], "chance", "lost in",
                  *(["theory and the cell"] if theory else [])], rows)


# --- ssm_boundary: the screen and its extension ---------------------------------------------------------------------
def screen(values: pd.DataFrame, variants: list[str]) -> pd.DataFrame:
    """Per variant, the screening seeds' state in (4x, 8x] and the rule's outcome: ``qualifies`` (True: a seed has
    state >= SCREEN_BAR there; False: all three screened and none has; None: fewer screened and none yet)."""
    rows = []
    for v in variants:
        part = values[(values.variant == v) & values.seed.isin(SCREEN_SEEDS)].sort_values("seed")
        w = part[_col("state", "4x_8x")]
        done = int(w.notna().sum())
        hit = bool((w >= SCREEN_BAR).any())
        rows.append({"variant": v, "seeds": list(part.seed), "window": list(w), "screened": done,
                     "qualifies": True if hit else (False if done >= len(SCREEN_SEEDS) else None)})
    return pd.DataFrame(rows)


_EXTENSION_COPIES = {"set", "eval_lengths", "eval_factors", "order"}
"""The screen's settings that the extension copies; extension_toml refuses a screen that sets any other."""


def extension_toml(qualifying: list[str]) -> str:
    """The extension's sweep file: the screen's settings, seeds 53-59, the qualifying variants only (each variant
    of sweeps/ssm_boundary.toml is named after its preset). Rendered from the screen's results and its sweep
    file's settings, not read from a committed extension: study/tests/test_doc_blocks_ssm.py checks that a committed
    study/sweeps/ssm_boundary10.toml is this text."""
    plan = BOUNDARY_PLAN
    uncopied = sorted(set(plan) - _EXTENSION_COPIES - {"name", "seeds", "variant"})
    uncopied += sorted({f"{v.get('name')}.{k}" for v in plan["variant"] for k in set(v) - {"name", "preset"}})
    if uncopied:  # a setting added to the screen later must reach the extension, or the two would differ
        raise ValueError(f"sweeps/ssm_boundary.toml sets {', '.join(uncopied)}, which the extension does not copy; "
                         "add it to extension_toml")
    lines = ["# The 10-seed extension of sweeps/ssm_boundary.toml (its rule: a variant whose screening seeds 50-52",
             "# include one with state >= 90 % in (4x, 8x]), rendered from the committed screen by",
             "# study/scripts/doc_blocks_ssm.py; the same settings, seeds 53-59.",
             'name = "ssm_boundary10"', f"seeds = [{', '.join(map(str, EXTENSION_SEEDS))}]",
             "set = [" + ", ".join(f'"{x}"' for x in plan["set"]) + "]", f'eval_lengths = "{plan["eval_lengths"]}"',
             f"eval_factors = {str(plan['eval_factors']).lower()}", f'order = "{plan["order"]}"']
    for v in qualifying:
        lines += ["", "[[variant]]", f'name = "{v}"', f'preset = "{v}"']
    return "\n".join(lines) + "\n"


def boundary_values(root: Path) -> tuple[pd.DataFrame, list[str]] | None:
    """The screen's runs and, where collected, the extension's, pooled by variant; the screen's variant order."""
    grid = _grid(root, "ssm_boundary")
    if grid is None:
        return None
    values = window_values(grid)
    ext = _grid(root, "ssm_boundary10")
    if ext is not None:
        values = pd.concat([values, window_values(ext)], ignore_index=True)
    return values, grid.variants


def ssm_boundary(root: Path) -> str:
    """Per variant (range x schedule): state and its factors per window over its seeds, then the screen's rule and
    its outcome, and the extension it calls for (its sweep file, rendered)."""
    got = boundary_values(root)
    if got is None:
        return _run_first("ssm_boundary")
    values, variants = got
    sc = screen(values, list(BOUNDARY_VARIANTS))
    rows = [[f"`{r.variant}`", " ".join(map(str, r.seeds)), per_seed(r.window),
             {True: "qualifies: extended to 10 seeds", False: "screened, not extended (reported on its 3 seeds, not "
              "as a finding)", None: f"pending: {r.screened} of {len(SCREEN_SEEDS)} screened, none >= "
              f"{pct(SCREEN_BAR)} % yet"}[r.qualifies]] for r in sc.itertuples()]
    qualifying = list(sc.variant[sc.qualifies.eq(True)])
    planned = {(v, s) for v in BOUNDARY_VARIANTS for s in SCREEN_SEEDS}
    if not sc.qualifies.isna().any():  # the screen decided: its extension's runs are planned too
        planned |= {(v, s) for v in qualifying for s in EXTENSION_SEEDS}
    have = planned & {(v, int(s)) for v, s in values[["variant", "seed"]].itertuples(index=False)}
    pending = ("" if have == planned else
               f"**Provisional**: {len(have)} of the {len(planned)} runs planned so far collected (the screen's "
               f"{len(BOUNDARY_VARIANTS)} variants x {len(SCREEN_SEEDS)} seeds, and the extension's once the screen "
               "decides it); the table reads the runs so far, and its reading of them all is the finding.\n\n")
    text = (pending + "State and its factors per window of positions (%): mean over seeds · seeds at or above "
            f"{pct(HOLDS)} %; screening seeds {', '.join(map(str, SCREEN_SEEDS))} and, where collected, the "
            f"extension's {EXTENSION_SEEDS[0]}-{EXTENSION_SEEDS[-1]}. {FIT_TEXT}\n\n"
            + factor_table(values, variants)
            + f"\n\nThe screen (state in (4x, 8x], each screening seed; the bar: {pct(SCREEN_BAR)} % in one seed):\n\n"
            + table(["variant", "screening seeds", "state (4x, 8x], each seed", "outcome"], rows))
    if sc.qualifies.isna().any():
        return text + "\n\nThe extension is decided once every variant is screened or qualifies."
    if not qualifying:
        return text + "\n\nNo variant qualifies: there is no extension, and every variant stands on its 3 seeds."
    toml = extension_toml(qualifying)
    return (text + f"\n\nThe extension ({len(qualifying)} variant{'s' * (len(qualifying) > 1)}): this file as "
            "`study/sweeps/ssm_boundary10.toml`, then "
            "`python -m probe.sweep study/sweeps/ssm_boundary10.toml --out runs/ssm_boundary10` and "
            "`study/scripts/collect_grid.sh ssm_boundary10`:\n\n```toml\n" + toml + "```")


# --- ssm_lr: does the positive SSM fit 1x at some lr? -----------------------------------------------------------------
def _lr_of(variant: str) -> str:
    """``ssm-positive-lr5e-4`` -> ``5e-4`` (sweeps/ssm_lr.toml names each variant after its train.lr)."""
    return variant.rpartition("-lr")[2] if "-lr" in variant else "the preset's"


def _final_loss(grid: Grid) -> dict[tuple[str, int], float]:
    t = grid.training
    if t.empty or "loss" not in t:
        return {}
    last = t.sort_values("step").groupby(["variant", "seed"]).tail(1)
    return {(r.variant, int(r.seed)): float(r.loss) for r in last.itertuples()}


def lr_verdict(values: pd.DataFrame, variants: list[str], planned: int) -> str:
    """The fit rule's sentence (module docstring) over the lrs whose both seeds are collected."""
    fits, complete = [], []
    for v in variants:
        part = values[values.variant == v]
        inr = part[_col("state", "0x_1x")].dropna()
        if len(inr) >= planned:
            complete.append(v)
            if (inr >= FIT_BAR).all():
                fits.append(v)
    if fits:
        said = []
        for v in fits:
            w = values[values.variant == v][_col("state", "2x_4x")].dropna()
            held = int((w >= HOLDS).sum())
            if len(w) < planned:  # a seed whose (2x, 4x] window was not measured: nothing is said of it
                said.append(f"`{v}` fits 1x on all {planned} seeds; its (2x, 4x] window is measured on {len(w)} of "
                            f"them, so whether it counts there waits")
                continue
            said.append(f"`{v}` fits 1x on all {planned} seeds and "
                        + (f"loses the state beyond its training lengths (every seed below {pct(HOLDS)} % in "
                           f"(2x, 4x]: {per_seed(w)}): at this lr \"cannot count\" is said" if held == 0 else
                           f"holds it in (2x, 4x] in {held} of {len(w)} seeds ({per_seed(w)}): a positive SSM that "
                           "fits counts beyond its training lengths here, so \"cannot count\" is not said"))
        return "; ".join(said) + "."
    missing = [v for v in variants if v not in complete]
    if missing:
        return ("No lr fits 1x on both seeds yet; not every seed is collected (" + ", ".join(f"`{v}`" for v in missing)
                + "), so the verdict waits.")
    return ("The positive SSM never fits 1x at any lr tried (state >= 99 % in range on both seeds at none of them), "
            "so \"cannot count\" is not tested: the claim stays \"did not fit at any lr tried\".")


def ssm_lr(root: Path) -> str:
    """Per learning rate: each seed's state in range and final training loss, the state per window, and the fit
    rule's verdict."""
    grid = _grid(root, "ssm_lr")
    if grid is None:
        return _run_first("ssm_lr")
    values = window_values(grid)
    loss = _final_loss(grid)
    planned = len(LR_SEEDS)
    rows = []
    for v in grid.variants:
        part = values[values.variant == v].sort_values("seed")
        inr = part[_col("state", "0x_1x")]
        fits = "yes" if len(inr.dropna()) >= planned and (inr >= FIT_BAR).all() else "no"
        rows.append([f"`{v}`", _lr_of(v), " ".join(map(str, part.seed)), per_seed(inr),
                     " / ".join(f"{loss[(v, int(s))]:.3g}" if (v, int(s)) in loss else "–" for s in part.seed),
                     fits, *[_cell(part[_col("state", w)]) for w, *_ in WINDOWS[1:]]])
    return (f"State (mod 10) per lr: in range each seed (%), the training loss at the last logged step, whether both "
            f"seeds fit 1x (>= {pct(FIT_BAR)} % in range), and each window beyond it (mean · seeds at or above "
            f"{pct(HOLDS)} %; chance 10):\n\n"
            + table(["variant", "lr", "seeds", "state in range, each seed", "final loss, each seed", "fits 1x",
                     *[lab for _, lab, _, _ in WINDOWS[1:]]], rows)
            + "\n\n" + lr_verdict(values, list(LR_VARIANTS), planned))


# --- ssm_complex10: the complex SSM on 15 seeds per schedule ---------------------------------------------------------
COMPLEX = ("ssm-complex", "hybrid-ssm-complex-joint", "hybrid-ssm-complex-dat", "hybrid-ssm-complex-stopgrad-rnn")
PAIRS = (("hybrid-ssm-complex-dat", "hybrid-ssm-complex-joint"),
         ("hybrid-ssm-complex-stopgrad-rnn", "hybrid-ssm-complex-joint"),
         ("ssm-complex", "hybrid-ssm-complex-joint"))
COMPARED = "(4x, 8x]"


def complex_values(root: Path) -> tuple[pd.DataFrame, str] | None:
    """The complex SSM's four variants: ssm_complex10's seeds and results/recurrent's seeds of the same variants
    (windows estimated from curves there), pooled; and a sentence on what was pooled. Estimated seeds are left out
    when ``estimate_error`` finds the estimate biased, or cannot test it."""
    grid = _grid(root, "ssm_complex10")
    if grid is None:
        return None
    values = window_values(grid)
    bias, t, crit, n = estimate_error(grid)
    unbiased = bool(np.isfinite(crit) and t <= crit)
    check = (f"instrument check of the curve estimate, on the {n} runs with measured windows: the mean of measured "
             f"- estimated is at most {100 * bias:.1f} points in any window and factor, |t| at most {t:.1f} "
             f"(detectably biased above {crit:.1f}: Bonferroni over the cells at {ESTIMATE_ALPHA:g}), "
             + ("no bias detected" if unbiased else "biased")
             if np.isfinite(crit) else
             f"instrument check: {n} runs have measured windows, fewer than the {MIN_CHECK_RUNS} the bias test "
             "needs")
    old = _grid(root, "recurrent")
    if old is None:
        return values[values.variant.isin(COMPLEX)], check
    prior = window_values(old)
    prior = prior[prior.variant.isin(COMPLEX) & ~prior.set_index(["variant", "seed"]).index.isin(
        values.set_index(["variant", "seed"]).index)]
    est = prior.source.eq("estimated")
    if est.any() and not unbiased:
        prior = prior[~est]
        check += "; results/recurrent's estimated seeds are therefore left out"
    pooled = pd.concat([prior, values[values.variant.isin(COMPLEX)]], ignore_index=True)
    return pooled.sort_values(["variant", "seed"], kind="stable"), check


def learns_z10(part: pd.DataFrame) -> str:
    w = part[_col("state", "2x_4x")].dropna()
    if w.empty:
        return "–"
    k = int((w >= HOLDS).sum())
    return f"{'yes' if 2 * k >= len(w) else 'no'} ({k} of {len(w)} seeds hold (2x, 4x])"


def _seeds_text(part: pd.DataFrame) -> str:
    est = part[part.source == "estimated"].seed
    text = " ".join(map(str, part.seed))
    return text + (f" (windows of {' '.join(map(str, est))} estimated from curves)" if len(est) else "")


def _provisional(values: pd.DataFrame) -> str:
    """'' once every variant of sweeps/ssm_complex10.toml has each of its seeds collected; else a clause saying the
    rules below read only the runs so far."""
    planned = {(v, int(s)) for v in COMPLEX for s in COMPLEX10_SEEDS}
    have = planned & {(v, int(s)) for v, s in values[["variant", "seed"]].itertuples(index=False)}
    if have == planned:
        return ""
    return (f"**Provisional**: {len(have)} of ssm_complex10's {len(planned)} runs collected; the rules are read "
            "on the runs so far, and their reading of the complete grid is the finding.\n\n")


def ssm_complex10(root: Path) -> str:
    """Per schedule: the seeds, whether it learns Z_10 (the module docstring's rule), where it loses the state and
    each factor, and every window per factor beside its chance floor."""
    got = complex_values(root)
    if got is None:
        return _run_first("ssm_complex10")
    values, check = got
    variants = [v for v in COMPLEX if (values.variant == v).any()]
    rows = []
    for v in variants:
        part = values[values.variant == v]
        lost = [lost_at(part, n) for n, _, _ in FACTORS]
        rows.append([f"`{v}`", _seeds_text(part), learns_z10(part),
                     *["held to 16x" if x is None else x for x in lost]])
    return (_provisional(values) + "Whether each schedule learns Z_10 beyond its training lengths (at least half of "
            f"its seeds at or above {pct(HOLDS)} % in (2x, 4x]) and where it loses the state and each factor (the "
            f"first window whose mean over seeds falls below {pct(HOLDS)} %); {check}.\n\n"
            + table(["variant", "seeds", "learns Z_10", "state lost in", "parity lost in", "mod 5 lost in"], rows)
            + "\n\nEvery window per factor (%): mean over seeds · seeds at or above "
            f"{pct(HOLDS)} %. {FIT_TEXT}\n\n" + factor_table(values, variants))


def ssm_complex10_compare(root: Path) -> str:
    """DAT, stopgrad-rnn and the cell alone against the joint hybrid, state in (4x, 8x], one Holm family."""
    got = complex_values(root)
    if got is None:
        return _run_first("ssm_complex10")
    values, _ = got
    at = values[["variant", "seed", _col("state", "4x_8x")]].rename(columns={_col("state", "4x_8x"): "token_acc"})
    at = at.dropna().assign(subtask="state", window=COMPARED, hi=0)
    pairs = [(a, b) for a, b in PAIRS if (at.variant == a).any() and (at.variant == b).any()]
    if not pairs:
        return "No schedule and the joint hybrid both have runs yet."
    cmp = compare(pd.DataFrame(), [], windows=at, window=COMPARED, pairs=pairs, family=len(PAIRS))
    k = int(cmp.family.iloc[0])
    rows = []
    for r in cmp.itertuples():
        ci = f"[{100 * r.difference_ci_low:+.1f}, {100 * r.difference_ci_high:+.1f}]"
        verdict = (r.verdict if not r.testable else "differ (Holm p < 0.05)" if r.p_holm < 0.05
                   else f"no difference detected, CI {ci}")
        rows.append([f"`{r.variant}`", f"{r.n_seeds} vs {r.n_seeds_baseline}", pct(r.mean), pct(r.mean_baseline),
                     f"{100 * r.difference:+.1f} {ci}", p_text(r.p_permutation),
                     min_adjusted_text("seeds", r.n_seeds, r.n_seeds_baseline, k), p_text(r.p_holm), verdict])
    return (_provisional(values) + f"Each against `hybrid-ssm-complex-joint`, state in {COMPARED} (%), mean over "
            "seeds; difference of means with its Welch 95 % interval; p: two-sided permutation test over seeds "
            "(exact up to 2,000,000 relabelings, beyond that a seeded Monte Carlo of 200,000); min. adj. p: the "
            f"family's size times the smallest p those seed counts allow; Holm over this family of {k}:\n\n"
            + table(["variant", "seeds", "mean", "joint's", "difference [95 % CI]", "p", "min. adj. p", "Holm p",
                     "verdict"], rows))


def _best_channels(tr: pd.DataFrame, variant: str, order: int) -> pd.DataFrame:
    """Per seed of ``variant``, the row of its channel of ``order`` with the longest drift horizon (any block, whatever
    that horizon). Horizons tie (two exact channels at the 1e6 cap, two at 0): a tie goes to the channel with the
    larger fade_400 (the one that keeps more of its state), then to the later block. Both fade tables read the
    channel chosen here."""
    t = tr[(tr.variant == variant) & (tr.order == order)].drop_duplicates(["seed", "block"])
    if "fade_400" not in t:
        t = t.assign(fade_400=math.nan)
    t = t.sort_values(["seed", "block"]).sort_values(["best_horizon", "fade_400"], kind="stable", na_position="first")
    return t.groupby("seed").tail(1).sort_values("seed")


def _fade_rows(tr: pd.DataFrame, variants: list[tuple[str, int]]) -> tuple[list[list[str]], list[str]]:
    """Per (variant, order): each seed's channel of that order chosen by ``_best_channels``, its horizon and
    fade_400, and the median fade_400 over the run's channels; and the runs read before fade_400."""
    tr = tr.drop_duplicates(["variant", "seed", "block", "order"])
    tr = tr.assign(**{c: math.nan for c in ("fade_400", "median_fade_400") if c not in tr})
    rows, unmeasured = [], []
    for v, order in variants:
        best = _best_channels(tr, v, order)
        if best.empty:
            continue
        measured = best[best.fade_400.notna()]
        unmeasured += [f"`{v}` {s}" for s in best.seed[best.fade_400.isna()]]
        if measured.empty:
            continue
        med = tr[(tr.variant == v) & tr.median_fade_400.notna()].groupby("seed").median_fade_400.first()
        rows.append([f"`{v}`", f"Z_{order}", " ".join(map(str, measured.seed)),
                     " / ".join(f"{h:.0f}" for h in measured.best_horizon),
                     " / ".join(f"{f:.3f}" for f in measured.fade_400),
                     " / ".join(f"{med.get(s, math.nan):.3f}" for s in measured.seed)])
    return rows, unmeasured


FADE_TEXT = ("The fade of each channel's modulus over 400 steps (16x): fade_400 is the product of |a_t| over a "
             "400-token stream, median over sequences (1.0 exactly at |a| = 1; a modulus of 0.999 throughout leaves "
             "0.67). Per seed, the channel of the order shown with the longest drift horizon (any block, whatever "
             "that horizon; a tie goes to the larger fade_400):\n\n")
FADE_HEAD = ["variant", "channel", "seeds", "its drift horizon (steps)", "its fade_400",
             "median fade_400 over the run's channels"]


KEEPS = 0.5
"""A channel keeps its state through a window when at least this share of what it holds entering the window survives
to the window's end (fade_win_*: the product of |a_t| over the window's positions, median over sequences)."""
ORDER_FACTOR = {2: "state_mod2", 5: "state_mod5", 10: "state"}
"""The factor of the running sum a channel of each order tracks (Z_2, Z_5, Z_10)."""


def loss_reasons(best: pd.DataFrame, acc: pd.DataFrame, name: str) -> dict[str, list[int]]:
    """Per seed (``best``: its channel's row, with fade_win_* and phase_win_*; ``acc``: its windows), what the channel
    did in the first window beyond L_train where the seed's ``name`` falls below HOLDS: ``phase`` (its phase error
    through the window reached a half-sector, its modulus kept at least KEEPS), ``modulus`` (it kept less than KEEPS,
    its phase below a half-sector), ``both``, ``neither`` (the channel read kept the state there: the loss is
    elsewhere), or ``holds`` (the seed never falls below HOLDS to 16x); seeds without the windows are left out."""
    out: dict[str, list[int]] = {k: [] for k in ("phase", "modulus", "both", "neither", "holds")}
    by_seed = acc.set_index("seed")
    for r in best.itertuples(index=False):
        if r.seed not in by_seed.index:
            continue
        lost = next((w for w, *_ in WINDOWS[1:] if by_seed.at[r.seed, _col(name, w)] < HOLDS), None)
        if lost is None:
            out["holds"].append(int(r.seed))
            continue
        phase, fade = getattr(r, f"phase_win_{lost}"), getattr(r, f"fade_win_{lost}")
        if not (np.isfinite(phase) and np.isfinite(fade)):
            continue
        key = {(True, True): "both", (True, False): "phase", (False, True): "modulus", (False, False): "neither"}
        out[key[(phase >= 1, fade < KEEPS)]].append(int(r.seed))
    return out


def channel_scope(best: pd.DataFrame) -> tuple[list[int], list[int]]:
    """Per seed (``best``: its channel's row): the seeds whose run passes both controls of ``probe.transitions``
    (reinit and shuffled_digits, which are per run: some channel of an order above 1 counts beyond 4 x L_train), and
    the seeds whose channel read itself counts beyond 4x (its drift horizon reaches ``beyond``, 4 x L_train)."""
    passed = [c for c in ("reinit", "shuffled_digits") if c in best]
    ok = best[passed].eq(True).all(axis=1) if len(passed) == 2 else pd.Series(False, index=best.index)
    counts = (best.best_horizon >= best.beyond) if {"best_horizon", "beyond"} <= set(best) else ok & False
    return [int(x) for x in best.seed[ok]], [int(x) for x in best.seed[counts]]


def fade_window_table(tr: pd.DataFrame, values: pd.DataFrame, variants: list[tuple[str, int]]) -> str:
    """Where each counting channel loses its state, beside where its factor is lost: per variant and order, over the
    seeds whose windows of fade were measured, each window's median fade through it · seeds whose channel keeps at
    least KEEPS of it, and the factor's accuracy there (mean · seeds at or above HOLDS) on the same seeds."""
    rows, missing, reasons = [], [], []
    for v, order in variants:
        best = _best_channels(tr, v, order)
        cols = [f"fade_win_{w}" for w, *_ in WINDOWS]
        if best.empty:
            continue
        if any(c not in best for c in cols):
            missing += [f"`{v}`"]
            continue
        measured = best.dropna(subset=cols)
        missing += [f"`{v}` {s}" for s in sorted(set(best.seed) - set(measured.seed))]
        if measured.empty:
            continue
        name = ORDER_FACTOR[order]
        label = next(lab for n, lab, _ in FACTORS if n == name)
        acc = values[(values.variant == v) & values.seed.isin(measured.seed)]
        fades = [f"{measured[c].median():.3f} · {int((measured[c] >= KEEPS).sum())}/{len(measured)}" for c in cols]
        rows.append([f"`{v}`", f"Z_{order}", " ".join(map(str, measured.seed)), "its fade through the window", *fades])
        phase = [f"phase_win_{w}" for w, *_ in WINDOWS]
        if all(c in measured for c in phase) and measured[phase].notna().all().all():
            rows.append(["", "", "", "its phase error through the window", *[
                f"{measured[c].median():.2f} · {int((measured[c] < 1).sum())}/{len(measured)}" for c in phase]])
            why = loss_reasons(measured, acc, name)
            scope = channel_scope(measured)
            reasons.append([f"`{v}`", label, *[" ".join(map(str, why[k])) or "–" for k in why],
                            *[f"{len(x)} of {len(measured)}: {' '.join(map(str, x))}" if x else f"0 of {len(measured)}"
                              for x in scope]])
        rows.append(["", "", "", f"{label} accuracy", *[_cell(acc[_col(name, w)]) if _col(name, w) in acc else "–"
                                                        for w, *_ in WINDOWS]])
    text = (f"Where the channel loses its state: per seed, the same channel's fade through each window of positions "
            f"(the share of what it holds entering the window that survives to the window's end, not from the "
            f"stream's start; median over seeds · seeds keeping at least {KEEPS:g} of it), and below it the accuracy "
            f"of the factor that channel's order tracks on the same seeds (mean % · seeds at or above {pct(HOLDS)} "
            "%). The windows differ in length (L_train positions in range, 8 x L_train in (8x, 16x]); a channel of "
            "block 0 sees one token a step, one of block 1 sees a context that leaves what training saw. Where the "
            "run was read with it, the phase error the channel accumulates through each window against its fitted "
            "rotation, in half-sectors (pi / order; median over seeds · seeds below 1, where a state entering the "
            "window is still on the right state at its end as far as the phase goes):\n\n"
            + (table(["variant", "channel", "seeds", "measure", *[lab for _, lab, _, _ in WINDOWS]], rows) if rows
               else "No run has its fade per window measured yet."))
    if reasons:
        text += (f"\n\nPer seed, in the first window beyond L_train where the seed's factor falls below {pct(HOLDS)} "
                 f"%, what its channel did there: its phase error reached a half-sector (its modulus kept at least "
                 f"{KEEPS:g}), its modulus kept less than {KEEPS:g} (its phase within a half-sector), both, or "
                 "neither (the channel read kept the state there, so the loss lies elsewhere: another channel, or "
                 "the readout). The channel read is each seed's longest-horizon channel of the order, whatever that "
                 "horizon; the last two columns give the reading's scope: the seeds whose run passes the controls of "
                 "`probe.transitions` (reinit and shuffled_digits, both per run: the run has some channel of an order "
                 "above 1 counting beyond 4 x L_train, a re-initialised model none, and its best counting horizon is "
                 "at least twice the scrambled digits'), and the seeds whose channel read itself counts beyond 4x "
                 "(its drift horizon reaches 4 x L_train). For a seed outside the last column the reading is of a "
                 "channel that does not count beyond 4x:\n\n"
                 + table(["variant", "factor", "the phase", "the modulus", "both", "neither", "held to 16x",
                          "run's controls pass", "its channel counts beyond 4x"], reasons))
    if missing:
        text += ("\n\nNo fade per window measured (read before the columns existed; their checkpoints are not in "
                 "this checkout): " + ", ".join(missing) + ".")
    return text


def _transitions(root: Path, grids: tuple[str, ...]) -> pd.DataFrame | None:
    paths = [results_dir(root) / g / "transitions.csv" for g in grids]
    if not paths[0].is_file():
        return None
    return pd.concat([pd.read_csv(p) for p in paths if p.is_file()], ignore_index=True)


def ssm_complex10_fade(root: Path) -> str:
    """Per schedule and seed, from ``probe.transitions`` (study/scripts/recurrent_transitions.py): the Z_10 channel
    with the longest drift horizon, its horizon and its fade_400 (the share of its state that survives 400 steps),
    and the median fade_400 over every channel."""
    tr = _transitions(root, ("ssm_complex10", "recurrent"))
    if tr is None:
        return ("not run yet: `python study/scripts/recurrent_transitions.py runs/ssm_complex10 --out "
                "study/results/ssm_complex10/transitions.csv` (collect_grid.sh runs it for the ssm_ grids)")
    rows, unmeasured = _fade_rows(tr, [(v, 10) for v in COMPLEX])
    text = FADE_TEXT + table(FADE_HEAD, rows)
    if unmeasured:
        text += ("\n\nNo fade_400 measured (read before the column existed; their checkpoints are not in this "
                 "checkout): " + ", ".join(unmeasured) + ".")
    got = complex_values(root)
    if got is not None:
        text += "\n\n" + fade_window_table(tr, got[0], [(v, 10) for v in COMPLEX])
    return text


def ssm_boundary_fade(root: Path) -> str:
    """The closed ranges' counting channels: per variant the order its range represents exactly (Z_2 through a = -1
    in the negative range, Z_10 through rotations of modulus 1 in the complex one), each seed's channel of that order
    with the longest drift horizon and its fade_400, screen and extension pooled."""
    tr = _transitions(root, ("ssm_boundary", "ssm_boundary10"))
    if tr is None:
        return _run_first("ssm_boundary")
    variants = [(v, {"negative": 2, "complex": 10}[_range_of(v)[0]]) for v in BOUNDARY_VARIANTS
                if _range_of(v)[0] in ("negative", "complex")]
    rows, _ = _fade_rows(tr, variants)
    text = FADE_TEXT + table(FADE_HEAD, rows)
    got = boundary_values(root)
    return text if got is None else text + "\n\n" + fade_window_table(tr, got[0], variants)


BLOCKS: dict[str, Callable[[Path], str]] = {
    "ssm-boundary": ssm_boundary,
    "ssm-boundary-fade": ssm_boundary_fade,
    "ssm-lr": ssm_lr,
    "ssm-complex10": ssm_complex10,
    "ssm-complex10-compare": ssm_complex10_compare,
    "ssm-complex10-fade": ssm_complex10_fade,
}
