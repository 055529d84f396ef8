"""The blocks of study/docs/gradients.md that quote the lookahead at the optimizer's real step
(study/results/gradients/realstep/, from study/scripts/realstep_lookahead.py on the runs of sweeps/realstep.toml):
each a function of the committed results only.

The statement these blocks compute was fixed before any run of the grid. The rule, verbatim (RULE below, and in
study/docs/gradients.md):

A snapshot supports a raise in a window of positions P when each of its instrument checks was recorded and passed (the
parts sum to the update, the matched random step is matched, the kept rollout's first step is AdamW's, and the rollout
reproduces the run where the later snapshot exists), its moments are the optimizer's own (`adamw-state`), and at P:
attention's part, stepped at its real share of the update, raises the state loss (`z_att` > 2), by more than the matched
random step (`vs_matched_z` > 2), and the 50-step rollout without attention's gradient path ends lower there
(`rollout_z` < -2: cut minus kept < 0 with |z| > 2). Attention's part raises the beyond-range loss in window W of run R
when at least 4 consecutive snapshots of R (steps 50 apart, none missing or withheld) support a raise in the same P; W
is the steps from the first to the last snapshot of each such maximal stretch, named with P. A run with no such stretch
reads "none found at real steps". The family is every run x every window of positions beyond L x every stretch of 4
consecutive measured snapshots (5 x 4 x 23 = 460 on the full grid). Under the null (no change in expectation; snapshots
independent) one condition is met by chance with probability q = P(t_3 > 2) = 0.070 (each z is over 4 evaluation
batches), so a snapshot supports a raise with probability at most q (q^3 = 3.4e-4 were its three conditions
independent), a stretch with at most q^4 = 2.4e-5, and the expected number of windows named by chance over the family is
at most 460 x q^4 = 0.011. The snapshots share their evaluation batches, so they are not fully independent: were they
one measurement, the bound would be 20 x q = 1.4 (one chance per run and window of positions); the parts of the update,
each from its own step's training batch, differ between snapshots.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.stats as sps
import tomllib
from doc_blocks_dense import _e
from doc_format import ALPHA, grid_of, pct, results_dir, table
from realstep_lookahead import ROLLOUT, STEPS

from probe.gradients.realstep import Z_DETECT, RealStepConfig
from probe.windows import window_key, windows_for

REALSTEP = ("gradients", "realstep")
FILES = ("realstep", "verdicts", "rollout", "checks")
COMMANDS = ("python -m probe.sweep study/sweeps/realstep.toml --out runs/realstep && python study/scripts/"
            "realstep_lookahead.py runs/realstep/joint/seed{40,41,42,43,44} --work runs/realstep-lookahead "
            "--processes 2")
K = 4
"""Consecutive snapshots that must each support a raise (RULE)."""
GAP = STEPS[1] - STEPS[0]
"""Steps between consecutive snapshots."""
STEP_WINDOWS = ((250, 500), (550, 1000), (1050, 1500))
"""The summary's windows of steps: before the counter forms in some seeds (``rnn0-until250`` fails 2 of 5), while it
forms, after it (``rnn0-until1000`` holds 5 of 5)."""
MOMENTS = "adamw-state"
Q_NULL = float(sps.t.sf(Z_DETECT, df=RealStepConfig().eval_batches - 1))
"""P(z > 2) for one condition under the null: a mean over the evaluation batches divided by its standard error."""
GRID_SEEDS = tuple(int(x) for x in tomllib.loads(
    (Path(__file__).resolve().parents[1] / "sweeps" / "realstep.toml").read_text())["seeds"])
"""The grid's runs (sweeps/realstep.toml): the statement is final once each has every snapshot of STEPS measured."""
REQUIRED = ("realstep_parts_sum", "realstep_matched_random", "realstep_matches_adamw")
"""The instrument checks every snapshot of realstep_lookahead.py carries (rollout_reproduces_run only where the
trajectory holds the snapshot ROLLOUT steps later): a snapshot missing one has not passed it."""
RUN = ["variant", "seed"]
RUNS_GRID = "realstep"
"""The grid's own runs, collected by ``study/scripts/collect_grid.sh realstep`` into study/results/realstep."""
POSITIONS = tuple(w.name for w in windows_for(1, 16))
"""The windows of positions the runs' table shows: in range, then each beyond it to 16x (as windows.csv names them)."""
FORMED = 0.90
"""In-range state accuracy (at L, evaluated during training every 250 steps) from which the counter is read as
formed: the step where a run first reaches it places the lookahead's windows of steps in that run's own time."""
SNAPSHOT = ["variant", "seed", "step"]

RULE = (
    "A snapshot supports a raise in a window of positions P when each of its instrument checks was recorded and "
    "passed (the parts sum to the update, the matched random step is matched, the kept rollout's first step is "
    "AdamW's, and the rollout reproduces the run where the later snapshot exists), its moments are the optimizer's "
    "own (`adamw-state`), and at P: attention's part, stepped at its real share of the update, raises the state loss "
    "(`z_att` > 2), by more than the matched random step (`vs_matched_z` > 2), and the 50-step rollout without "
    "attention's gradient path ends lower there (`rollout_z` < -2: cut minus kept < 0 with |z| > 2). Attention's part"
    " raises the beyond-range loss in window W of run R when at least 4 consecutive snapshots of R (steps 50 apart, "
    "none missing or withheld) support a raise in the same P; W is the steps from the first to the last snapshot of "
    "each such maximal stretch, named with P. A run with no such stretch reads \"none found at real steps\". The "
    "family is every run x every window of positions beyond L x every stretch of 4 consecutive measured snapshots (5 "
    "x 4 x 23 = 460 on the full grid). Under the null (no change in expectation; snapshots independent) one condition"
    " is met by chance with probability q = P(t_3 > 2) = 0.070 (each z is over 4 evaluation batches), so a snapshot "
    "supports a raise with probability at most q (q^3 = 3.4e-4 were its three conditions independent), a stretch with"
    " at most q^4 = 2.4e-5, and the expected number of windows named by chance over the family is at most 460 x q^4 ="
    " 0.011. The snapshots share their evaluation batches, so they are not fully independent: were they one "
    "measurement, the bound would be 20 x q = 1.4 (one chance per run and window of positions); the parts of the "
    "update, each from its own step's training batch, differ between snapshots.")


KEYS = {"realstep": ["part", "loss", "positions"], "verdicts": ["positions"], "rollout": ["loss", "positions"],
        "checks": ["control", "positions"]}
"""What names a row of each CSV within its snapshot: a snapshot measured twice keeps its last rows only."""


def _read(root: Path) -> dict[str, pd.DataFrame] | None:
    """The four CSVs the script writes together, or None before it has run; a row met twice (a snapshot measured
    again) counts once, as its last measurement."""
    base = results_dir(root).joinpath(*REALSTEP)
    if not all((base / f"{name}.csv").is_file() for name in FILES):
        return None
    return {name: pd.read_csv(base / f"{name}.csv").drop_duplicates(SNAPSHOT + KEYS[name], keep="last")
            for name in FILES}


def _not_run() -> str:
    return f"Not run yet: `{COMMANDS}`."


def _n(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _run_name(variant: str, seed: int) -> str:
    return f"`{variant}` seed {int(seed)}"


def withheld(data: dict[str, pd.DataFrame]) -> pd.Series:
    """Per snapshot (variant, seed, step): why its verdicts are withheld ('' when they are not): a failed or missing
    instrument check (one of REQUIRED not recorded for it, or ``rollout_reproduces_run`` where its verdicts say the
    reproduction was measured: ``rollout_reproduced`` not empty), a rollout of other than ROLLOUT steps, or moments
    that are not the optimizer's own."""
    checks, verdicts = data["checks"], data["verdicts"]
    instrument = checks[checks.kind == "instrument"]
    failed = instrument[~instrument.passed.astype(bool)]
    why = failed.groupby(SNAPSHOT).control.agg(lambda c: ", ".join(f"`{x}` failed" for x in sorted(set(c))))
    have = instrument.groupby(SNAPSHOT).control.agg(set)
    snaps = verdicts.groupby(SNAPSHOT).moments.agg(lambda m: sorted(set(m.dropna())))
    reproduced = verdicts.groupby(SNAPSHOT).rollout_reproduced.agg(lambda r: r.notna().any())
    steps = data["rollout"].groupby(SNAPSHOT).rollout_steps.agg(lambda r: sorted({int(x) for x in r.dropna()}))
    out = pd.Series("", index=snaps.index, dtype=object)
    for key, moments in snaps.items():
        reasons = [why[key]] if key in why.index else []
        required = REQUIRED + (("rollout_reproduces_run",) if reproduced.get(key, False) else ())
        missing = [c for c in required if c not in have.get(key, set())]
        if steps.get(key, []) != [ROLLOUT]:
            reasons.append(f"rollout of {', '.join(map(str, steps.get(key, []))) or 'no'} steps, not {ROLLOUT}")
        if missing:
            reasons.append(", ".join(f"`{c}` not recorded" for c in missing))
        if moments != [MOMENTS]:
            reasons.append(f"moments {', '.join(map(str, moments)) or 'not recorded'}")
        out[key] = "; ".join(reasons)
    return out


def judged(data: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """verdicts.csv with ``withheld`` (the reason, '' if none) and the rule's conditions per row: ``raises`` (z_att >
    2), ``beyond_matched`` (vs_matched_z > 2), ``cut_lowers`` (rollout_z < -2) and ``supports`` (all three, not
    withheld)."""
    v = data["verdicts"].copy()
    why = withheld(data)
    v["withheld"] = [why.get(tuple(k), "") for k in v[SNAPSHOT].itertuples(index=False)]
    v["raises"] = v.z_att > Z_DETECT
    v["beyond_matched"] = v.vs_matched_z > Z_DETECT
    v["cut_lowers"] = v.rollout_z < -Z_DETECT
    v["supports"] = (v.withheld == "") & v.raises & v.beyond_matched & v.cut_lowers
    return v


def _runs_of_steps(steps: list[int]) -> list[list[int]]:
    """``steps`` cut into maximal runs of consecutive snapshots, GAP apart (a step met twice, e.g. a snapshot
    measured again, counts once and does not break its run)."""
    out: list[list[int]] = []
    for s in sorted(set(steps)):
        if out and s - out[-1][-1] == GAP:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def stretches(v: pd.DataFrame) -> pd.DataFrame:
    """Every maximal stretch of consecutive supporting snapshots, per run and window of positions: ``first``,
    ``last``, ``n``, and ``named`` (n >= K: the rule names it)."""
    rows = []
    for (variant, seed, positions), g in v.groupby(RUN + ["positions"], sort=False):
        for run in _runs_of_steps(sorted(int(s) for s in g[g.supports].step)):
            rows.append({"variant": variant, "seed": int(seed), "positions": positions, "first": run[0],
                         "last": run[-1], "n": len(run), "named": len(run) >= K})
    return pd.DataFrame(rows, columns=RUN + ["positions", "first", "last", "n", "named"])


def family(v: pd.DataFrame) -> int:
    """Stretches of K consecutive measured snapshots, over every run and window of positions: the rule's tests."""
    n = 0
    for _, g in v.groupby(RUN + ["positions"], sort=False):
        n += sum(max(len(r) - K + 1, 0) for r in _runs_of_steps(sorted(int(s) for s in g.step.unique())))
    return n


def _fails_text(why: pd.Series) -> str:
    bad = why[why != ""]
    return "; ".join(f"{_run_name(variant, seed)} step {int(step)} ({reason})"
                     for (variant, seed, step), reason in bad.items())


def realstep_checks(root: Path) -> str:
    """Each check's passes over the snapshots (the control per window of positions), the moments' source, and the
    snapshots whose verdicts are withheld."""
    data = _read(root)
    if data is None:
        return _not_run()
    checks, why = data["checks"], withheld(data)
    claims = data["verdicts"].set_index(SNAPSHOT + ["positions"]).verdict.isin(["raises", "lowers"])
    rows = []
    for (control, kind), g in checks.groupby(["control", "kind"], sort=False):
        passed = f"{int(g.passed.astype(bool).sum())} of {len(g)}"
        if g.positions.notna().any():
            # a window without a raise or lowering has nothing for the control to refute, and passes
            tested = int(sum(claims.get(tuple(k), False) for k in g[SNAPSHOT + ["positions"]].itertuples(index=False)))
            passed += f" snapshot-windows ({tested} with a raise or lowering to test)"
        else:
            passed += " snapshots"
        rows.append([f"`{control}`", kind, passed, f"{len(g.drop_duplicates(SNAPSHOT))}"])
    text = table(["row", "kind", "passed", "snapshots with the row"], rows)
    n_runs = len(why.reset_index().drop_duplicates(RUN))
    moments = sorted(set(data["verdicts"].moments.dropna()) | set(data["realstep"].moments.dropna()))
    text += (f"\n\n{_n(len(why), 'snapshot')} of {_n(n_runs, 'run')}; moments used: "
             f"{', '.join(f'`{m}`' for m in moments) or 'none recorded'}. ")
    if (why == "").all():
        text += "Every snapshot passed every instrument check, so no verdict is withheld."
    else:
        text += (f"{int((why != '').sum())} of {len(why)} snapshots are withheld (a failed or missing instrument "
                 "check, another rollout length, or moments not the optimizer's own): "
                 f"{_fails_text(why)}. Their verdicts are not read below, and a "
                 "withheld snapshot breaks a stretch of the rule.")
    bad = checks[(checks.kind == "control") & ~checks.passed.astype(bool)]
    if len(bad):
        text += (f" The control `realstep_vs_matched_random` failed in {len(bad)} snapshot-windows: a raise or "
                 "lowering no larger than the matched random step's, read as the matched random explaining it (not "
                 "withheld: the rule's second condition).")
    return text


def _med_range(x: pd.Series) -> str:
    x = x.dropna()
    return "–" if x.empty else f"{pct(x.median())} ({pct(x.min())}–{pct(x.max())})"


def _count(mask: pd.Series) -> str:
    return f"{int(mask.sum())}"


def _median(x: pd.Series, fmt: str = "+.1f") -> str:
    x = x.dropna()
    return "–" if x.empty else format(float(x.median()), fmt)


def realstep_windows(root: Path) -> str:
    """Per run, window of steps and window of positions: attention's share of |u|, its change of the state loss and
    z, against the matched random, the rollout's cut - kept, and whether the rollout reproduces the verdict."""
    data = _read(root)
    if data is None:
        return _not_run()
    v = judged(data)
    read = v[v.withheld == ""]
    rows = []
    for (variant, seed), run in read.groupby(RUN, sort=True):
        inside = np.zeros(len(run), dtype=bool)
        spans = []
        for lo, hi in STEP_WINDOWS:
            at = ((run.step >= lo) & (run.step <= hi)).to_numpy()
            inside |= at
            spans.append((f"{lo}–{hi}", run[at]))
        spans.append(("other steps", run[~inside]))  # a run measured at steps outside the grid's is still shown
        for label, w in spans:
            if w.empty:
                continue
            for positions, g in w.groupby("positions", sort=False):
                lowers = g.z_att < -Z_DETECT
                agrees = (g.raises & g.cut_lowers) | (lowers & (g.rollout_z > Z_DETECT))
                contradicts = (g.raises & (g.rollout_z > Z_DETECT)) | (lowers & g.cut_lowers)
                rows.append([_run_name(variant, seed), label, positions, len(g), _med_range(g.fraction_att),
                             _e(g.dL_att.median()), f"{_median(g.z_att)} · {_count(g.raises)} / {_count(lowers)}",
                             f"{_median(g.vs_matched_z)} · {_count(g.beyond_matched)}",
                             f"{_e(g.rollout_cut_minus_kept.median())} · {_count(g.cut_lowers)}",
                             f"{_count(agrees)} / {_count(contradicts)} of {_count(g.raises | lowers)}",
                             _count(g.supports)])
    if not rows:
        return "Every snapshot is withheld (a failed instrument check, listed above): no verdict is read."
    text = table(["run", "steps", "positions", "snapshots", "att's share of \\|u\\|, % median (range)",
                  "dL_att median", "z_att median · raises / lowers", "vs matched z median · > 2",
                  f"rollout cut − kept median · cut lowers ({ROLLOUT} steps)",
                  "rollout agrees / contradicts, of verdicts", "snapshots supporting a raise"], rows)
    n_held = v[v.withheld != ""].drop_duplicates(SNAPSHOT)
    if len(n_held):
        text += (f"\n\nLeft out of this table: {_n(len(n_held), 'withheld snapshot')} (a failed instrument check, "
                 "listed above).")
    return text


def _sign(z: float) -> str:
    return "?" if not np.isfinite(z) else "+" if z > Z_DETECT else "−" if z < -Z_DETECT else "0"


def realstep_steps(root: Path) -> str:
    """Every snapshot in one cell per run: attention's share of |u| and, per window of positions, three signs (z_att,
    vs_matched_z, the rollout's cut - kept z), bold where the snapshot supports a raise."""
    data = _read(root)
    if data is None:
        return _not_run()
    v = judged(data)
    runs = sorted({(str(a), int(b)) for a, b in v[RUN].itertuples(index=False)})
    cells: dict[tuple[str, int, int], str] = {}
    for (variant, seed, step), g in v.groupby(SNAPSHOT, sort=False):
        if g.withheld.iloc[0]:
            cells[(variant, int(seed), int(step))] = "withheld"
            continue
        codes = []
        for r in g.itertuples():
            code = _sign(r.z_att) + _sign(r.vs_matched_z) + _sign(r.rollout_z)
            codes.append(f"**{code}**" if r.supports else code)
        cells[(variant, int(seed), int(step))] = f"{pct(g.fraction_att.iloc[0])} · {' '.join(codes)}"
    steps = sorted({int(s) for s in v.step})
    rows = [[step, *[cells.get((variant, seed, step), "–") for variant, seed in runs]] for step in steps]
    order = ", ".join(v.drop_duplicates("positions").positions)
    return (f"Each cell: attention's share of \\|u\\| in %, then per window of positions ({order}) three signs: "
            f"`z_att`, `vs_matched_z`, the rollout's cut − kept z (+ above 2, − below −2, 0 between, ? not "
            f"measured). `++−` is a snapshot that supports a raise (bold where no check withholds it).\n\n"
            + table(["step", *[_run_name(variant, seed) for variant, seed in runs]], rows))


def realstep_statement(root: Path) -> str:
    """The pre-registered statement (RULE): the windows where attention's part raises the beyond-range loss, per
    run, or "none found at real steps", with the family's size and its bound under the null."""
    data = _read(root)
    if data is None:
        return (f"{_not_run()} Until it has run, this page states no window where attention's part raises the "
                "beyond-range loss at real steps.")
    v = judged(data)
    found = stretches(v)
    tests = family(v)
    expected = {(seed, step) for seed in GRID_SEEDS for step in STEPS}
    measured = expected & {(int(a), int(b)) for a, b in v[["seed", "step"]].itertuples(index=False)}
    # the rule needs consecutive snapshots: until every one is measured, a stretch may still form in a gap
    final = measured == expected
    pending = ("" if final else f" (provisional: {len(measured)} of the grid's {len(expected)} snapshots measured; "
               "a stretch may still form where one is missing, so this is not the statement yet)")
    n_runs, n_positions = len(v.drop_duplicates(RUN)), v.positions.nunique()
    seeds = sorted(int(s) for s in v.seed.unique())
    rows = []
    for (variant, seed), run in v.groupby(RUN, sort=True):
        read = run[run.withheld == ""]
        named = found[(found.variant == variant) & (found.seed == seed) & found.named]
        longest = found[(found.variant == variant) & (found.seed == seed)].n.max()
        rows.append([_run_name(variant, seed), f"{run.step.nunique()} ({run[run.withheld != ''].step.nunique()})",
                     f"{int(read.raises.sum())} → {int((read.raises & read.beyond_matched).sum())} → "
                     f"{int(read.supports.sum())} of {len(read)}",
                     f"{int(longest) if np.isfinite(longest) else 0}",
                     "; ".join(f"{r.positions}, steps {r.first}–{r.last} ({r.n} snapshots)"
                               for r in named.itertuples()) or "none found at real steps"])
    text = table(["run", "snapshots (withheld)", "snapshot-windows: raises → beyond matched → rollout lowers with "
                  "the cut", "longest stretch supporting a raise", f"windows named (≥ {K} in a row)"], rows)
    read = v[v.withheld == ""]
    explained = read.raises & ~read.beyond_matched
    text += (f"\n\nThe family: {_n(n_runs, 'run')} × {_n(n_positions, 'window')} of positions, {tests} stretches "
             f"of {K} consecutive measured snapshots in all. Under the null one condition is met by chance with "
             f"probability q = P(t_{RealStepConfig().eval_batches - 1} > {Z_DETECT:g}) = {Q_NULL:.3f}, a stretch "
             f"with at most q^{K} = {Q_NULL ** K:.1e}, so at most {tests * Q_NULL ** K:.2g} windows are expected by "
             f"chance (with independent snapshots; one chance per run and window of positions, "
             f"{n_runs * n_positions} × q = {n_runs * n_positions * Q_NULL:.2f}, were they one measurement). "
             f"In {int(explained.sum())} of the {int(read.raises.sum())} snapshot-windows where attention's part "
             "raised the loss, the raise was no larger than the matched random step's: the matched random explains "
             "it, and the rule does not count it.")
    withheld_n = v[v.withheld != ""].drop_duplicates(SNAPSHOT)
    if len(withheld_n):
        text += (f" Withheld (a failed instrument check, above): {_n(len(withheld_n), 'snapshot')}, whose verdicts "
                 "count for nothing and break the stretches they fall in.")
    grid = f"{_n(n_runs, 'run')} (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})"
    named = found[found.named]
    if named.empty:
        best = found.loc[found.n.idxmax()] if len(found) else None
        closest = (f"; the longest stretch was {int(best.n)} snapshot{'s' if best.n > 1 else ''} "
                   f"({_run_name(best.variant, best.seed)}, {best.positions}, steps {best.first}–{best.last})"
                   if best is not None else "; no snapshot supported a raise")
        head = "**None found at real steps**" if final else "**None found so far**"
        return text + (f"\n\n{head}{pending}: in none of the {grid} did attention's part, at its "
                       f"real share of the update, raise the state loss in a window beyond L in {K} consecutive "
                       f"snapshots by more than the matched random step with the cut rollout lowering it"
                       f"{closest}.")
    where = "; ".join(f"{_run_name(variant, seed)}: "
                      + ", ".join(f"{r.positions} over steps {r.first}–{r.last}" for r in g.itertuples())
                      for (variant, seed), g in named.groupby(RUN, sort=True))
    clear = sorted({_run_name(variant, seed) for variant, seed in v[RUN].drop_duplicates().itertuples(index=False)}
                   - {_run_name(variant, seed) for variant, seed in named[RUN].itertuples(index=False)})
    n_named = len(named[RUN].drop_duplicates())
    return text + (f"\n\n**Attention's part raises the beyond-range loss at real steps** in {n_named} of the {grid}"
                   f"{pending}: {where}." + (f" None found {'at real steps' if final else 'so far'} in "
                                             f"{', '.join(clear)}." if clear else ""))


def _formed_at(training: pd.DataFrame) -> str:
    """The first evaluated step whose in-range state accuracy reaches FORMED, or '–' when none does."""
    if "state_acc_1x" not in training:
        return "–"
    at = training[training.state_acc_1x >= FORMED].step
    return "–" if at.empty else str(int(at.min()))


def realstep_runs(root: Path) -> str:
    """The grid's runs themselves: per run, the state and its factors in each window of positions at the end of
    training (the metric of record), the first evaluated step where its state at L reached FORMED, and the final
    training loss, so that each run's lookahead is read beside its own cliff and its own time."""
    if not (results_dir(root) / RUNS_GRID / "runs.jsonl").is_file():
        return ("Not run yet: `python -m probe.sweep study/sweeps/realstep.toml --out runs/realstep && "
                "study/scripts/collect_grid.sh realstep`.")
    grid = grid_of(root, RUNS_GRID)
    if grid.runs.empty:
        return "The grid's results hold no run yet."
    training, windows = grid.training, grid.windows
    rows = []
    for run in grid.runs.sort_values(["variant", "seed"]).to_dict("records"):
        mine = training[(training.variant == run["variant"]) & (training.seed == run["seed"])].sort_values("step") \
            if len(training) else pd.DataFrame()
        last = float(mine.loss.iloc[-1]) if len(mine) and "loss" in mine else math.nan
        for factor, name in (("state", "state (mod 10)"), ("state_mod2", "parity"), ("state_mod5", "mod 5")):
            cells = [pct(run.get(f"{factor}_win_{window_key(w)}", math.nan)) for w in POSITIONS]
            head = [_run_name(run["variant"], run["seed"]), _formed_at(mine),
                    f"{last:.4f}" if math.isfinite(last) else "–"] if factor == "state" else ["", "", ""]
            chance = windows[windows.subtask == factor].chance if len(windows) else pd.Series(dtype=float)
            rows.append([*head, name, *cells, pct(chance.iloc[0]) if len(chance) else "–"])
    steps = grid.runs.steps.max() if "steps" in grid.runs else math.nan
    return (f"Each run at the end of training (step {int(steps) if math.isfinite(steps) else '–'}): token accuracy "
            f"(%) per window of positions; and the first step, of those evaluated during training (every 250), where "
            f"its state accuracy at L reached {pct(FORMED)} % (it may dip below again later):\n\n"
            + table(["run", f"first step with state >= {pct(FORMED)} % at L", "final training loss", "factor",
                     *POSITIONS, "chance"], rows))


def realstep_direction(root: Path) -> str:
    """Descriptive, outside the rule (written after the first 72 snapshots were seen): per run and window of steps,
    which way each reading moves the beyond-range state loss, pooled over the windows of positions, counted where it
    is detected as the rest of this module detects (|z| > 2): attention's part at its real share (one step: raises /
    lowers) and the 50-step rollout without attention's path (cut lowers / cut raises). A run leans one way when more
    of its snapshot-windows go that way. No test: the block was written after the data were seen, and the runs (the
    independent units) are too few for a sign test to reach p < 0.05 (five: 2 / 2^5 = 0.0625 at best)."""
    data = _read(root)
    if data is None:
        return _not_run()
    v = judged(data)
    read = v[v.withheld == ""]
    if read.empty:
        return "Every snapshot is withheld (a failed instrument check, listed above): no verdict is read."

    def counts(g: pd.DataFrame) -> tuple[int, int, int, int]:
        return (int(g.raises.sum()), int((g.z_att < -Z_DETECT).sum()), int(g.cut_lowers.sum()),
                int((g.rollout_z > Z_DETECT).sum()))

    rows, leans = [], []
    for (variant, seed), run in read.groupby(RUN, sort=True):
        spans = [(f"{lo}–{hi}", run[(run.step >= lo) & (run.step <= hi)]) for lo, hi in STEP_WINDOWS]
        spans.append(("**all**", run))  # every snapshot of the run, those outside the windows of steps included
        for i, (label, g) in enumerate(s for s in spans if not s[1].empty):
            raises, lowers, cut_lowers, cut_raises = counts(g)
            rows.append([_run_name(variant, seed) if i == 0 else "", label, f"{g.step.nunique()} · {len(g)}",
                         f"{raises} / {lowers}", f"{cut_lowers} / {cut_raises}"])
        raises, lowers, cut_lowers, cut_raises = counts(run)
        leans.append((np.sign(raises - lowers), np.sign(cut_lowers - cut_raises)))
    text = table(["run", "steps", "snapshots · snapshot-windows",
                  "one step, att's part: raises / lowers the loss (z beyond ±2)",
                  f"rollout ({ROLLOUT} steps): cut lowers / cut raises the loss (z beyond ±2)"], rows)
    n = len(leans)

    def lean(i: int, up: str, down: str) -> str:
        a, b = sum(x[i] > 0 for x in leans), sum(x[i] < 0 for x in leans)
        return f"{up} in {a}, {down} in {b}" + (f", neither in {n - a - b}" if n - a - b else "")

    reach = 2 / 2 ** n if n else 1.0
    few = (f"; and {_n(n, 'run')}, even all leaning one way, cannot reach p < {ALPHA:g} in a two-sided sign test "
           "over runs (the independent units)" if reach >= ALPHA else "")
    return text + (
        f"\n\nPer run, over all its snapshots: attention's part leans to {lean(0, 'raising the loss', 'lowering it')}"
        f" of the {_n(n, 'run')}; the rollout's cut leans to {lean(1, 'lowering the loss', 'raising it')}. "
        "Descriptive, not a test: outside the pre-registered rule and read after the grid's first 72 snapshots"
        f"{few}. A pooled count of snapshot-windows is no test either (the windows of one snapshot share its step, and "
        "a run's snapshots share its trajectory), and the rollout's z is over the evaluation batches, not over how far "
        "two rollouts from the same state drift apart for any small change.")


PARTS = (("full", "the whole update u"), ("att", "attention's part"), ("rec", "the recurrent part"),
         ("momentum", "the momentum term"), ("decay", "weight decay"),
         ("matched_random", "the matched random step"))
"""The rows of realstep.csv, in the parts block's order: u, its four parts, and the baseline matched to ``att``."""


def realstep_parts(root: Path) -> str:
    """Descriptive, outside the rule (written after the whole grid was seen): which part of the real update moves
    which loss. Per part of u stepped alone at its own size (and u itself, and the matched random step), per window of
    steps, pooled over the runs' snapshots that no instrument check withholds: its share of |u| (median), how often it
    raises / lowers the held-out training loss (snapshots) and the state loss beyond L (snapshot-windows), |z| beyond
    2 as everywhere here, the median change of that loss where it raises it (its size: a part of 0.4 % of |u| raises
    by little), and in how many runs it raises the beyond-range loss more often than it lowers it. No test:
    the rule reads attention's part only; this block says where the other parts stand beside it."""
    data = _read(root)
    if data is None:
        return _not_run()
    why = withheld(data)
    rows_all = data["realstep"]
    keep = [why.get(tuple(k), "") == "" for k in rows_all[SNAPSHOT].itertuples(index=False)]
    d = rows_all[keep]
    if d.empty:
        return "Every snapshot is withheld (a failed instrument check, listed above): no part is read."
    train, beyond = d[d.loss == "train"], d[(d.loss == "state") & (d.positions != "<=L")]

    def updown(g: pd.DataFrame) -> str:
        return f"{int((g.z > Z_DETECT).sum())} / {int((g.z < -Z_DETECT).sum())}"

    rows = []
    for part, name in PARTS:
        if not (d.part == part).any():
            continue
        spans = [(f"{lo}–{hi}", lo, hi) for lo, hi in STEP_WINDOWS] + [("**all**", -math.inf, math.inf)]
        for i, (label, lo, hi) in enumerate(spans):
            at = (d.part == part) & (d.step >= lo) & (d.step <= hi)
            t, b = train[at.loc[train.index]], beyond[at.loc[beyond.index]]
            if t.empty and b.empty:
                continue
            lean = b.groupby(RUN).z.agg(lambda z: (z > Z_DETECT).sum() > (z < -Z_DETECT).sum())
            up = b[b.z > Z_DETECT]
            rows.append([f"{name} (`{part}`)" if i == 0 else "", label, str(d[at].drop_duplicates(SNAPSHOT).shape[0]),
                         pct(d[at].fraction_of_update.median()), updown(t), updown(b),
                         _e(up.dL.median()), _g(per_unit(up).median()), f"{int(lean.sum())} of {len(lean)}"])
    text = table(["part", "steps", "snapshots", "share of \\|u\\|, % median",
                  "held-out training loss: raises / lowers (snapshots)",
                  "state loss beyond L: raises / lowers (snapshot-windows)", "beyond L: median change where it raises",
                  "the same per unit of step length", "runs where raises > lowers beyond L"],
                 rows)
    full = train[train.part == "full"]
    if full.empty:
        return text
    up = int((full.z > Z_DETECT).sum())
    return text + (
        f"\n\nThe whole update, at its real size, raised the held-out training loss (z > {Z_DETECT:g}) in {up} of "
        f"{len(full)} snapshots ({pct(up / len(full))} %): one AdamW step is not a descent step on held-out batches "
        "every time, so a one-step raise of a beyond-range loss by any part is read beside this rate, and beside the "
        "matched random step's. Descriptive, not a test: written after the grid was seen; the counts pool runs, "
        "steps and windows of positions, which are not independent.")


def per_unit(rows: pd.DataFrame) -> pd.Series:
    """A part's change of a loss per unit of its own step length (dL / |step|): what a longer step adds by length
    alone divides out, so parts of different sizes compare (a one-step measure is read per unit of step)."""
    return rows.dL / rows.step_norm


def _g(x: float) -> str:
    return "–" if not np.isfinite(x) else f"{x:.2g}"


def parts_reading(data: dict[str, pd.DataFrame]) -> dict[str, object]:
    """The numbers the parts' reading quotes, from the snapshots no instrument check withholds: per part the raises /
    lowers of the beyond-range state loss and of the held-out training loss, the runs where raises outnumber lowers,
    the median change and the median change per unit of step where it raises; and how the beyond-range state loss
    itself moved from the first snapshot to the last, per run and window of positions."""
    why = withheld(data)
    rows = data["realstep"]
    d = rows[[why.get(tuple(k), "") == "" for k in rows[SNAPSHOT].itertuples(index=False)]]
    beyond, train = d[(d.loss == "state") & (d.positions != "<=L")], d[d.loss == "train"]
    out: dict[str, object] = {}
    for part, _ in PARTS:
        b, t = beyond[beyond.part == part], train[train.part == part]
        up = b[b.z > Z_DETECT]
        lean = b.groupby(RUN).z.agg(lambda z: (z > Z_DETECT).sum() > (z < -Z_DETECT).sum())
        out[part] = {"up": int((b.z > Z_DETECT).sum()), "down": int((b.z < -Z_DETECT).sum()),
                     "train_up": int((t.z > Z_DETECT).sum()), "train_down": int((t.z < -Z_DETECT).sum()),
                     "runs_up": int(lean.sum()), "runs": len(lean), "median_up": float(up.dL.median()),
                     "unit_up": float(per_unit(up).median()), "share": float(b.fraction_of_update.median())}
    first, last = min(STEPS), max(STEPS)
    before = beyond.drop_duplicates(SNAPSHOT + ["positions"]).pivot_table(
        index=[*RUN, "positions"], columns="step", values="loss_before")
    if first in before and last in before:
        moved = (before[last] - before[first]).dropna()
        out["loss_fell"], out["cells"], out["span"] = int((moved < 0).sum()), len(moved), (first, last)
    return out


def realstep_parts_reading(root: Path) -> str:
    """What the parts' counts show, and what they do not: descriptive, written after the grid was seen; the
    momentum term has no baseline matched to it (length and projection on the training-loss gradient)."""
    data = _read(root)
    if data is None:
        return _not_run()
    r = parts_reading(data)
    full, mom, att, rnd = r["full"], r["momentum"], r["att"], r["matched_random"]

    def more(x: dict, what: str, key: str = "") -> str:
        up, down = x[f"{key}up"], x[f"{key}down"]
        if up == down:
            return f"raises {what} as often as it lowers it"
        return (f"raises {what} more often than it lowers it" if up > down else
                f"lowers {what} more often than it raises it")

    text = (f"- The whole update u {more(full, 'the state loss beyond L')} ({full['up']} raises, {full['down']} "
            f"lowers, snapshot-windows); its raises outnumber its lowers in {full['runs_up']} of the {full['runs']} "
            "runs.")
    if "loss_fell" in r:
        lo, hi = r["span"]
        text += (f" From step {lo} to step {hi} the state loss beyond L fell in {r['loss_fell']} of the "
                 f"{r['cells']} run × window-of-positions cells.")
    text += (f"\n- The momentum term, stepped alone (median {pct(mom['share'])} % of \\|u\\|), "
             f"{more(mom, 'that loss')} ({mom['up']} / {mom['down']}; raises outnumber lowers in {mom['runs_up']} of "
             f"{mom['runs']} runs), and "
             f"{more(mom, 'the held-out *training* loss', 'train_')} ({mom['train_up']} / "
             f"{mom['train_down']} snapshots)")
    text += (": an overshoot along the momentum, not something of the positions beyond range." if
             mom["train_up"] > mom["train_down"] else ".")
    text += (f"\n- Per unit of step length (the median of dL / \\|step\\| over the snapshot-windows where each raises "
             f"the loss beyond L), the raises are {_g(mom['unit_up'])} for the momentum term, {_g(att['unit_up'])} "
             f"for attention's part and {_g(rnd['unit_up'])} for the matched random step ({_g(full['unit_up'])} for "
             f"u). The momentum term's raises (median {_e(mom['median_up'])} against attention's "
             f"{_e(att['median_up'])}) are ")
    if not (np.isfinite(mom["unit_up"]) and np.isfinite(rnd["unit_up"])):
        text += "not compared per unit of step: one of the two has no raise to compare."
    elif mom["unit_up"] > rnd["unit_up"]:
        text += "larger per unit of step than the matched random step's."
    else:
        text += "no larger per unit of step than the matched random step's: their size is the length of its step."
    return text + ("\n\nA count over pooled snapshot-windows, read after the grid was seen: no test, and no claim "
                   "beyond these five runs.")


BLOCKS: dict[str, Callable[[Path], str]] = {
    "realstep-parts-reading": realstep_parts_reading,
    "realstep-runs": realstep_runs,
    "realstep-checks": realstep_checks,
    "realstep-windows": realstep_windows,
    "realstep-steps": realstep_steps,
    "realstep-statement": realstep_statement,
    "realstep-direction": realstep_direction,
    "realstep-parts": realstep_parts,
}
