"""The blocks of study/docs/mechanism.md that quote results/coadaptation2/ (sweeps/coadaptation2.toml: the controls
that tell co-adaptation from "a mismatched injected gradient harms"): each a function of the committed results only.

Co-adaptation, the reading under test: the joint hybrid's cliff comes from block 0's LSTM learning through an
attention that is itself learning. The rules below were written, here and in study/docs/mechanism.md, before any run
of the grid existed, except R8 (its fp32 twin), written after the bf16 ends had separated provisionally and before
any run of the twin; the blocks apply them and nothing else (study/tests/test_doc_blocks_coadaptation.py checks that
the two texts agree and that every verdict is reachable).

Measures, per seed. Beyond range: the state's token accuracy at stream positions in (2x, 4x] (windows.csv, the
metric of record). Fit: the state's token accuracy at 1x (length 25, every position in range) and the training loss
at the last step (training.csv: the running mean the trainer logs at each evaluation).

Comparisons. Difference of means over seeds with its Welch 95 % interval and the exact two-sided permutation p. Family B
(state in (2x, 4x], 14 comparisons): `joint` against `stopgrad-rnn0`; each of `random-path`, `lagged-copy-50`,
`lagged-copy-250`, `frozen-model-copy`, `frozen-copy` and `placebo` against `joint` and against `stopgrad-rnn0`;
`lagged-copy-250` against `lagged-copy-50`. Family F (fit, 12 comparisons): each of those six against `stopgrad-rnn0` on
the state at 1x and on the final training loss. Holm within each family at 0.05 over its registered size: a comparison
not run as a test (no runs yet, or too few seeds so far) stands in with p = 1. A comparison whose design cannot reach
adjusted p < 0.05 (its smallest exact p times the family size) is shown descriptively and detects nothing. "Detectably
below" ("above"): Holm-adjusted p < 0.05 with the difference below (above) 0.

Decision rules (pre-registered):

R1. Ends: a control is read only if `joint` is detectably below `stopgrad-rnn0` in (2x, 4x]. If that comparison
cannot be tested at the seeds committed there is no verdict yet; if it is tested and not detected there is no
verdict.

R2. Fit: a variant fails to fit when its state at 1x is detectably below `stopgrad-rnn0`'s or its final training
loss is detectably above it; it fits when neither is detected and both comparisons were tested; otherwise its fit is
untested.

R3. Beyond range: a variant harms when its state in (2x, 4x] is detectably below `stopgrad-rnn0`'s (like `joint` when no
difference from `joint` is detected, more than `joint` when detectably below it, partly when detectably above it); it
holds when it is detectably above `joint` and tested against `stopgrad-rnn0` without being detectably below it;
otherwise it is undecided at its seed counts (untested where a comparison it needs could not be tested).

R4. Reading: a variant that harms and fits reads "harms"; one that harms and fails to fit reads "fails to fit" (its
harm beyond range is not told apart from its failure in range); one that holds reads "holds", whatever its fit;
anything else reads "undecided".

R5. Lag: the lagged copies harm at both lags with no dose when both read "harms" and `lagged-copy-250` is tested against
`lagged-copy-50` with no difference detected; the harm grows with the lag when `lagged-copy-250` reads "harms" and is
detectably below `lagged-copy-50`; they hold at both lags when both read "holds"; otherwise the lag is undecided.

R6. Verdict on co-adaptation, the first that applies: (a) no verdict (yet) by R1; (b) `random-path` reads "harms" or
"fails to fit": untested by these controls, since an injected term of the cut's norm harms whatever its direction;
(c) `random-path` does not read "holds": no verdict; (d) `frozen-model-copy` reads "harms": not supported, since the
harm then needs gradient shaped by attention but not an attention that learns; (e) `frozen-model-copy` reads "holds"
and the lagged copies harm at both lags with no dose: consistent with co-adaptation; (f) `frozen-model-copy` reads
"holds" and the lagged copies hold at both lags: not as co-adaptation predicted, since an attention that learns,
seen 50 or 250 steps late, does not harm; (g) `frozen-model-copy` reads "holds" and the harm grows with the lag:
mixed, co-adaptation undecided; (h) otherwise undecided at these seed counts. Beside (e) to (h), when
`frozen-model-copy` holds and `frozen-copy` reads "harms" or "fails to fit": frozen-copy's cliff came from mixing an
initial attention with current MLPs and unembedding, not from the attention being frozen.

R7. Placebo: its norm matches in a seed when the cap bound on at most 5 % of the seed's logged steps and the norm it
removed, summed over the steps, is at least 95 % of the norm `stopgrad-rnn0` would have removed (attention's path,
summed). Its reading is interpreted only when the norm matched in every seed: "harms" says an equal norm removed
from the MLP paths does not do what the cut through attention does; "holds" says the amount of gradient removed may
be what matters.

R8. Precision: the ends' separation is confirmed in both precisions when R1 separates them in bf16 and, in the fp32
twin (`sweeps/coadaptation2_fp32.toml`: `joint` and `stopgrad-rnn0` on the same seeds in plain fp32), `joint` is
detectably below `stopgrad-rnn0` in (2x, 4x] by a single two-sample test as in R1 (exact permutation p < 0.05, a
family of one), counting only runs whose checkpoints record fp32 for the whole run. It is not confirmed in fp32 when
that test is run and detects no difference or the reverse; it is pending while the fp32 design cannot reach p <
0.05; it is not read while R1 does not separate the bf16 ends. The reading is final once every run of the ends in
both grids is committed, provisional before. The controls' readings (R2 to R7) are bf16 readings.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import tomllib
from doc_format import (
    ALPHA,
    can_reach,
    col,
    descriptive,
    device_sentence,
    grid_of,
    min_adjusted_text,
    p_text,
    pct,
    per_seed,
    precision_sentence,
    results_dir,
    table,
)
from placebo_cap import EARLY
from placebo_cap import FILE as CAP_FILE

from probe.core.stats import holm, permutation_p, welch_interval

GRID = "coadaptation2"
JOINT, CUT = "joint", "stopgrad-rnn0"
CONTROLS = ("random-path", "lagged-copy-50", "lagged-copy-250", "frozen-model-copy")
"""The controls for frozen-copy (sweeps/coadaptation2.toml says what each separates)."""
RERUNS = ("frozen-copy", "placebo")
"""Rerun beside the controls on the same seeds: frozen-copy to 16x, placebo with its cap logged per step."""
READ = (*CONTROLS, *RERUNS)
VARIANTS = (JOINT, CUT, *READ)
LAG = ("lagged-copy-250", "lagged-copy-50")
HOLDS = 0.95
"""A seed holds a window when its token accuracy there is at least this (as in the fresh grid's tables)."""
CAP_BOUND_MAX = 0.05
MATCH_TOTAL_MIN = 0.95
"""R7: the placebo's norm matches in a seed when the cap bound on at most CAP_BOUND_MAX of its steps and it removed
at least MATCH_TOTAL_MIN of the target norm over the run."""
FP32_GRID = "coadaptation2_fp32"
"""R8's grid: the two ends on the same seeds in plain fp32."""


def _sweep_seeds(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in tomllib.loads(
        (Path(__file__).resolve().parents[1] / "sweeps" / f"{name}.toml").read_text())["seeds"])


GRID_SEEDS = _sweep_seeds(GRID)
"""sweeps/coadaptation2.toml's seeds: every variant runs each; the verdict is final once all are committed."""
FP32_SEEDS = _sweep_seeds(FP32_GRID)


def _not_run(name: str) -> str:
    return (f"Not run yet: `python -m probe.sweep study/sweeps/{name}.toml --out runs/{name}`, then "
            f"`study/scripts/collect_grid.sh {name}`.")


NOT_RUN = _not_run(GRID)
MEASURES = {"beyond": "state in (2x, 4x] (points)", "state_1x": "state at 1x (points)",
            "loss": "final training loss"}
WINDOWS = (("state_win_2x_4x", "state (2x, 4x]"), ("state_win_8x_16x", "state (8x, 16x]"),
           ("state_mod2_win_8x_16x", "parity (8x, 16x] (chance 50)"),
           ("state_mod5_win_8x_16x", "mod 5 (8x, 16x] (chance 20)"),
           ("recall_win_8x_16x", "recall (8x, 16x] (chance 6.2)"))


# --- the per-seed values ------------------------------------------------------------------------------------------
def values(root: Path, name: str = GRID) -> pd.DataFrame | None:
    """One row per committed run of grid ``name``: variant, seed, the fit measures (``state_1x``, ``loss``: the last
    logged training loss), the windows, and where and in what precision it trained; None before it is collected."""
    if not (results_dir(root) / name / "runs.jsonl").is_file():
        return None
    grid = grid_of(root, name)
    runs = grid.runs
    out = pd.DataFrame({"variant": runs.variant, "seed": runs.seed.astype(int), "state_1x": col(runs, "state_acc_1x"),
                        "beyond": col(runs, "state_win_2x_4x"), "precision": col(runs, "precision"),
                        "trained_on": col(runs, "trained_on"),
                        **{c: col(runs, c) for c, _ in WINDOWS}})
    t = grid.training
    if len(t) and "loss" in t:
        t = t[t.loss.notna()].sort_values("step")
        last = t.groupby(["variant", "seed"], sort=False).tail(1)[["variant", "seed", "loss"]]
        out = out.merge(last.assign(seed=last.seed.astype(int)), on=["variant", "seed"], how="left")
    else:
        out["loss"] = math.nan
    return out.sort_values(["variant", "seed"]).reset_index(drop=True)


def _of(v: pd.DataFrame, variant: str, measure: str) -> np.ndarray:
    return v.loc[v.variant == variant, measure].dropna().to_numpy(float)


# --- the two families ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    variant: str
    baseline: str
    measure: str
    n: int
    m: int
    estimate: float
    low: float
    high: float
    family: int
    testable: bool
    p: float
    p_holm: float

    @property
    def direction(self) -> str:
        """"below" / "above" (detected after Holm), "none" (tested, not detected), "untested" (descriptive)."""
        if not self.testable:
            return "untested"
        if self.p_holm < ALPHA:
            return "below" if self.estimate < 0 else "above"
        return "none"


BEYOND_PAIRS = [(JOINT, CUT, "beyond"), *[(v, b, "beyond") for v in READ for b in (JOINT, CUT)], (*LAG, "beyond")]
FIT_PAIRS = [(v, CUT, m) for v in READ for m in ("state_1x", "loss")]


def family(v: pd.DataFrame, pairs: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], Comparison]:
    """Every pair of ``pairs`` with both sides committed, tested as probe.sweep.compare tests (Welch interval, exact
    permutation p where the design can reach adjusted p < ALPHA in the registered family, Holm over the tests run
    and, at p = 1, every other registered pair: no runs yet, or too few seeds so far).
    compare() reads accuracies from curves or windows; family F also tests the training loss, so both families go
    through this one routine over per-seed values."""
    present = [(a, b, m) for a, b, m in pairs if len(_of(v, a, m)) and len(_of(v, b, m))]
    k = len(pairs)  # the registered family: a pair with no runs yet stands in with p = 1
    rows = []
    for a, b, m in present:
        x, y = _of(v, a, m), _of(v, b, m)
        diff = welch_interval(x, y)
        ok = can_reach("seeds", len(x), len(y), k)
        rows.append(dict(variant=a, baseline=b, measure=m, n=len(x), m=len(y), estimate=diff.estimate, low=diff.low,
                         high=diff.high, family=k, testable=ok, p=permutation_p(x, y) if ok else math.nan))
    # every registered pair not run as a test (no runs yet, or seeds too few so far) stands in with p = 1
    adjusted = holm([r["p"] for r in rows], family=k)  # an untestable pair's p is NaN: not a test
    return {(r["variant"], r["baseline"], r["measure"]): Comparison(**r, p_holm=float(q))
            for r, q in zip(rows, adjusted, strict=True)}


# --- the readings (R1-R6) -----------------------------------------------------------------------------------------
def _direction(cmp: dict, a: str, b: str, m: str) -> str:
    c = cmp.get((a, b, m))
    return "missing" if c is None else c.direction


def ends(beyond: dict) -> str:
    """R1: "separated", "untested" (the design cannot test it, or a side has no run) or "not separated"."""
    d = _direction(beyond, JOINT, CUT, "beyond")
    return {"below": "separated", "untested": "untested", "missing": "untested"}.get(d, "not separated")


def fit_reading(fit: dict, variant: str) -> str:
    """R2."""
    s1, loss = _direction(fit, variant, CUT, "state_1x"), _direction(fit, variant, CUT, "loss")
    if s1 == "below" or loss == "above":
        return "fails to fit"
    if {s1, loss} & {"untested", "missing"}:
        return "fit untested"
    return "fits"


def beyond_reading(beyond: dict, variant: str) -> str:
    """R3."""
    ds, dj = _direction(beyond, variant, CUT, "beyond"), _direction(beyond, variant, JOINT, "beyond")
    if ds == "below":
        return {"none": "harms like joint", "below": "harms more than joint",
                "above": "harms partly (between the ends)"}.get(dj, "harms")
    if dj == "above" and ds in ("none", "above"):
        return "holds like stopgrad-rnn0" if ds == "none" else "holds, above stopgrad-rnn0"
    if {ds, dj} & {"untested", "missing"}:
        return "untested"
    return "undecided"


def reading(fit_r: str, beyond_r: str) -> str:
    """R4."""
    if beyond_r.startswith("holds"):
        return "holds"
    if beyond_r.startswith("harms"):
        return {"fits": "harms", "fails to fit": "fails to fit"}.get(fit_r, "undecided")
    return "undecided"


def lag_reading(readings: dict[str, str], beyond: dict) -> str:
    """R5."""
    r250, r50 = (readings.get(v) for v in LAG)
    dose = _direction(beyond, *LAG, "beyond")
    if r250 == "harms" and dose == "below":
        return "harm grows with the lag"
    if r250 == r50 == "harms" and dose == "none":
        return "harm at both lags, no dose"
    if r250 == r50 == "holds":
        return "hold at both lags"
    return "undecided"


@dataclass(frozen=True)
class Verdict:
    rule: str
    text: str


def _n(v: pd.DataFrame, variant: str) -> int:
    return len(_of(v, variant, "beyond"))


def verdict(v: pd.DataFrame) -> tuple[Verdict, dict[str, str], dict, dict]:
    """R6 from the committed runs: the verdict, each read variant's reading, and the two families."""
    beyond, fit = family(v, BEYOND_PAIRS), family(v, FIT_PAIRS)
    state = ends(beyond)
    readings = {x: reading(fit_reading(fit, x), beyond_reading(beyond, x)) for x in READ}
    if state == "untested":
        n, m, k = _n(v, JOINT), _n(v, CUT), len(BEYOND_PAIRS)
        why = (f"{n} vs {m} seeds of `joint` and `stopgrad-rnn0` cannot reach adjusted p < {ALPHA} in family B of {k} "
               f"(smallest attainable {min_adjusted_text('seeds', n, m, k)})" if n and m
               else "`joint` or `stopgrad-rnn0` has no committed run")
        return Verdict("a", f"No verdict yet: {why}, so the two ends cannot be told apart and no control can be read; "
                            "co-adaptation is untested, not refuted."), readings, beyond, fit
    if state == "not separated":
        c = beyond[(JOINT, CUT, "beyond")]
        found = ("detectably above it: the reverse of the premise" if c.direction == "above"
                 else "no difference detected")
        return Verdict("a", "No verdict: `joint` was not detectably below `stopgrad-rnn0` in (2x, 4x] on these seeds "
                            f"(difference {_points(c)} points, {found}), so no control can be read "
                            "against the two ends; co-adaptation is untested, not refuted."), readings, beyond, fit
    rp, fmc, fc = readings["random-path"], readings["frozen-model-copy"], readings["frozen-copy"]
    if rp in ("harms", "fails to fit"):
        what = "harms" if rp == "harms" else "fails to fit"
        return Verdict("b", f"Co-adaptation untested by these controls: a random direction of the cut's norm "
                            f"(`random-path`) {what} too, so an injected term of that size harms whatever its "
                            "direction, and neither `frozen-copy` nor the lagged copies can speak to co-adaptation; "
                            "not refuted."), readings, beyond, fit
    if rp != "holds":
        return Verdict("c", f"No verdict: `random-path` is {rp} at {_n(v, 'random-path')} seeds, and without it no "
                            "control tells co-adaptation from \"an injected term of that size harms\"; co-adaptation "
                            "is untested, not refuted."), readings, beyond, fit
    if fmc == "harms":
        return Verdict("d", "Co-adaptation not supported: a random direction of the cut's norm holds (`random-path`), "
                            "so the harm needs gradient shaped by attention, but block 0's LSTM learning through a "
                            "frozen, consistent copy of the initial model (`frozen-model-copy`) is harmed too, so it "
                            "does not need an attention that learns."), readings, beyond, fit
    lag = lag_reading(readings, beyond)
    if fmc == "holds" and lag == "harm at both lags, no dose":
        out = Verdict("e", "Consistent with co-adaptation: block 0's LSTM learning through an attention that learns "
                           "harms, 50 or 250 steps late alike (no dose of the lag detected), while learning through a "
                           "frozen, consistent copy of the initial model (`frozen-model-copy`) or taking a random "
                           "direction of the same norm (`random-path`) does not.")
    elif fmc == "holds" and lag == "hold at both lags":
        out = Verdict("f", "Not as co-adaptation predicted: `random-path` and `frozen-model-copy` hold, and so do both "
                           "lagged copies: an attention that learns, seen 50 or 250 steps late, does not harm; the "
                           "harm needs the gradient through attention as it is at that step (`joint`).")
    elif fmc == "holds" and lag == "harm grows with the lag":
        out = Verdict("g", "Mixed, co-adaptation undecided: the harm grows with the lag (`lagged-copy-250` below "
                           "`lagged-copy-50`), as \"a mismatched gradient harms\" predicts, while a frozen, consistent "
                           "counterfactual (`frozen-model-copy`) holds, as co-adaptation predicts; neither reading "
                           "accounts for both.")
    else:
        out = Verdict("h", "Undecided at these seed counts: `random-path` holds, but `frozen-model-copy` reads "
                           f"\"{fmc}\" and the lagged copies \"{lag}\" (`lagged-copy-50` {readings['lagged-copy-50']}, "
                           f"`lagged-copy-250` {readings['lagged-copy-250']}); co-adaptation is untested, not "
                           "refuted.")
    if fmc == "holds" and fc in ("harms", "fails to fit"):
        out = Verdict(out.rule, out.text + f" `frozen-copy` {'harms' if fc == 'harms' else 'fails to fit'} on the same "
                                           "seeds while `frozen-model-copy` holds: frozen-copy's cliff came from "
                                           "mixing an initial attention with current MLPs and unembedding, not from "
                                           "the attention being frozen.")
    return out, readings, beyond, fit


# --- the placebo's cap (R7) -----------------------------------------------------------------------------------------
def cap_table(root: Path) -> pd.DataFrame | None:
    path = results_dir(root) / GRID / CAP_FILE
    if not path.is_file():
        return None
    cap = pd.read_csv(path)
    cap = cap[cap.variant == "placebo"].sort_values("seed")
    return cap.assign(matched=(cap.bound_steps <= CAP_BOUND_MAX * cap.steps) & (cap.ratio_total >= MATCH_TOTAL_MIN))


def _placebo_seeds(v: pd.DataFrame) -> set[int]:
    """The seeds `placebo`'s reading is made from: its committed runs with the state in (2x, 4x]."""
    return {int(x) for x in v.loc[(v.variant == "placebo") & v.beyond.notna(), "seed"]}


def placebo_sentence(root: Path, v: pd.DataFrame, readings: dict[str, str], separated: bool) -> str:
    cap = cap_table(root)
    seeds = _placebo_seeds(v)
    n = len(seeds)
    if n == 0:
        return "No `placebo` run is committed yet."
    logged = set() if cap is None else set(cap.seed) & seeds
    if logged != seeds:
        return (f"`placebo`'s cap log is summarised for {len(logged)} of its {n} seeds (`python "
                "study/scripts/placebo_cap.py runs/coadaptation2 study/results/coadaptation2`): its reading is not "
                "interpreted.")
    cap = cap[cap.seed.isin(seeds)]  # a cap row of a seed with no committed run says nothing about this reading
    k = int(cap.matched.sum())
    r = readings["placebo"]
    if k < len(cap):
        return (f"`placebo`'s norm matched in {k} of {len(cap)} seeds only (the cap bound on more than "
                f"{pct(CAP_BOUND_MAX)} % of the steps, or it removed less than {pct(MATCH_TOTAL_MIN)} % of the "
                f"target): its reading (\"{r}\") is not interpreted.")
    if not separated:
        return f"`placebo`'s norm matched in {k} of {k} seeds; with the ends not separated it is not read."
    said = {"harms": "an equal norm removed from the MLP paths does not do what the cut through attention does: "
                     "attention's path, not the amount of gradient, is what matters",
            "holds": "removing an equal norm from the MLP paths holds as the cut does: the amount of gradient removed "
                     "may be what matters, not attention's path"}
    if r in said:
        return f"`placebo` (norm matched in {k} of {k} seeds) {r}, so {said[r]}."
    return f"`placebo` (norm matched in {k} of {k} seeds) reads \"{r}\": it says nothing either way."


# --- the blocks ---------------------------------------------------------------------------------------------------
def _cell(values: np.ndarray) -> str:
    return "–" if not len(values) else f"{pct(values.mean())} · {int((values >= HOLDS).sum())}/{len(values)}"


def _loss(x: float) -> str:
    return "–" if not np.isfinite(x) else f"{x:.4f}"


def _loss_cell(values: np.ndarray) -> str:
    return "–" if not len(values) else f"{_loss(values.mean())} ({_loss(values.min())}–{_loss(values.max())})"


def coadaptation_variants(root: Path) -> str:
    """Per variant: seeds; state at 1x and the windows (mean over seeds · seeds at 95 % or more); the final training
    loss (mean, and its range over seeds)."""
    v = values(root)
    if v is None:
        return NOT_RUN
    rows = [[f"`{x}`", _n(v, x), _cell(_of(v, x, "state_1x")), _loss_cell(_of(v, x, "loss")),
             *[_cell(_of(v, x, c)) for c, _ in WINDOWS]] for x in VARIANTS]
    return (table(["variant", "seeds", "state at 1x", "final training loss (range)", *[w for _, w in WINDOWS]], rows)
            + "\n\n" + precision_sentence(v) + " " + device_sentence(v))


def coadaptation_seeds(root: Path) -> str:
    """Every seed: state at 1x, final training loss, state in (2x, 4x] and in (8x, 16x], in seed order."""
    v = values(root)
    if v is None:
        return NOT_RUN
    rows = []
    for x in VARIANTS:
        r = v[v.variant == x]
        rows.append([f"`{x}`", " ".join(str(s) for s in r.seed) or "–", per_seed(r.state_1x),
                     " / ".join(_loss(y) for y in r.loss), per_seed(r.state_win_2x_4x), per_seed(r.state_win_8x_16x)])
    return table(["variant", "seeds", "state at 1x, each seed", "final training loss, each seed",
                  "state (2x, 4x], each seed", "state (8x, 16x], each seed"], rows)


def _points(c: Comparison) -> str:
    return f"{100 * c.estimate:+.1f} [{100 * c.low:+.1f}, {100 * c.high:+.1f}]"


def _difference(c: Comparison) -> str:
    if c.measure == "loss":
        return f"{c.estimate:+.4f} [{c.low:+.4f}, {c.high:+.4f}]"
    return _points(c)


def _result(c: Comparison) -> str:
    if not c.testable:
        return descriptive("seeds", c.n, c.m, c.family)
    return {"below": "detectably below", "above": "detectably above"}.get(c.direction, "no difference detected")


def _family_table(cmp: dict, with_measure: bool) -> str:
    rows = [[f"`{c.variant}` − `{c.baseline}`", *([MEASURES[c.measure]] if with_measure else []),
             f"{c.n} vs {c.m}", _difference(c), p_text(c.p) if c.testable else "–",
             min_adjusted_text("seeds", c.n, c.m, c.family), p_text(c.p_holm) if c.testable else "–", _result(c)]
            for c in cmp.values()]
    return table(["comparison", *(["measure"] if with_measure else []), "seeds", "difference [95 % Welch CI]", "p",
                  "min. adj. p", "Holm p", "result"], rows)


def _caption(cmp: dict, what: str) -> str:
    c = next(iter(cmp.values()))
    run = sum(x.testable for x in cmp.values())
    designs = sorted({(x.n, x.m) for x in cmp.values()}, key=lambda d: (d[0] * d[1], d))
    return (f"{what}: a Holm family of {c.family}, {run} run as tests; smallest attainable adjusted p by design: "
            + "; ".join(f"{n} vs {m} seeds {min_adjusted_text('seeds', n, m, c.family)}" for n, m in designs) + ".")


def coadaptation_compare(root: Path) -> str:
    """Families B (beyond range) and F (fit), each with its size and the smallest adjusted p its designs allow."""
    v = values(root)
    if v is None:
        return NOT_RUN
    beyond, fit = family(v, BEYOND_PAIRS), family(v, FIT_PAIRS)
    out = []
    if beyond:
        out += [_caption(beyond, "Family B, the state in (2x, 4x] (points; exact two-sided permutation p)"),
                _family_table(beyond, False)]
    if fit:
        out += [_caption(fit, "Family F, fit against `stopgrad-rnn0` (state at 1x in points; the loss as logged)"),
                _family_table(fit, True)]
    return "\n\n".join(out) or "No pair of the two families has both sides committed yet."


def coadaptation_readings(root: Path) -> str:
    """Each read variant's fit (R2), its reading beyond range (R3), and the two together (R4); R5 for the lags."""
    v = values(root)
    if v is None:
        return NOT_RUN
    result, readings, beyond, fit = verdict(v)
    separated = ends(beyond) == "separated"
    rows = [[f"`{x}`", _n(v, x), fit_reading(fit, x), beyond_reading(beyond, x),
             readings[x] if separated else "not read (R1)"] for x in READ]
    lag = lag_reading(readings, beyond) if separated else "not read (R1)"
    return (table(["variant", "seeds", "fit (R2)", "beyond range (R3)", "reading (R4)"], rows)
            + f"\n\nThe ends (R1): {ends(beyond)}. The lag (R5): {lag}. Verdict rule (R6): ({result.rule}).")


def _design(variants: tuple[str, ...], seeds: tuple[int, ...]) -> set[tuple[str, int]]:
    """The (variant, seed) runs of a sweep's design."""
    return {(x, s) for x in variants for s in seeds}


def _committed(v: pd.DataFrame, variants: tuple[str, ...], seeds: tuple[int, ...]) -> set[tuple[str, int]]:
    """The (variant, seed) runs of a sweep's design that are committed with their state in (2x, 4x]."""
    have = v.loc[v.beyond.notna(), ["variant", "seed"]].itertuples(index=False)
    return _design(variants, seeds) & {(x, int(s)) for x, s in have}


def settled(v: pd.DataFrame, result: Verdict, beyond: dict, fit: dict) -> bool:
    """Whether a verdict read on part of the grid is already the complete grid's: so far only rule (b), once the
    runs it rests on are all in and its detections cannot be undone by the runs still to come.
    (b) needs R1's separation and `random-path` harming beyond range (detectably below `stopgrad-rnn0`); with
    `random-path`'s fit comparisons tested, it then reads "harms" or "fails to fit", (b) either way. Once `joint`,
    `stopgrad-rnn0` and `random-path` have every seed committed, those values are final, and only Holm's adjustment
    can still move as other pairs become tests. Holm's adjusted p of a test is at most the family's size times the
    largest p at or below its own, so a detection whose family size times p is below ALPHA stays a detection whatever
    the other pairs give."""
    if result.rule != "b":
        return False
    rp = "random-path"
    if _committed(v, (JOINT, CUT, rp), GRID_SEEDS) != _design((JOINT, CUT, rp), GRID_SEEDS):
        return False
    tested = [fit.get((rp, CUT, m)) for m in ("state_1x", "loss")]
    if not all(c is not None and c.testable for c in tested):
        return False
    needed = [beyond.get((JOINT, CUT, "beyond")), beyond.get((rp, CUT, "beyond"))]
    return all(c is not None and c.testable and c.estimate < 0 and c.family * c.p < ALPHA for c in needed)


def coadaptation_verdict(root: Path) -> str:
    """The verdict on co-adaptation (R6) and the placebo's reading (R7)."""
    v = values(root)
    if v is None:
        return NOT_RUN + " Until it runs, co-adaptation is untested, not refuted."
    result, readings, beyond, fit = verdict(v)
    expected, have = _design(VARIANTS, GRID_SEEDS), _committed(v, VARIANTS, GRID_SEEDS)
    # a verdict read at every collection of a grid in progress would be a test repeated until it passes
    if have == expected:
        pending = ""
    elif settled(v, result, beyond, fit):
        pending = (f"Settled with {len(have)} of the grid's {len(expected)} runs committed (the verdict is the rules' "
                   "reading of the complete grid, and the runs still to come cannot change this one: `joint`, "
                   "`stopgrad-rnn0` and `random-path` have every seed in, and the two detections rule (b) rests "
                   f"on stay below {ALPHA} at the family's whole size, "
                   + ", ".join(f"{c.family} × {c.p:.2g} = {c.family * c.p:.3f}"
                               for c in (beyond[(JOINT, CUT, 'beyond')], beyond[('random-path', CUT, 'beyond')]))
                   + ", whatever Holm's adjustment becomes): ")
    else:
        pending = (f"Provisional ({len(have)} of the grid's {len(expected)} runs committed; the verdict is the rules' "
                   "reading of the complete grid, this is their reading of the runs so far): ")
    return (f"{pending}**{result.text}**\n\n"
            + placebo_sentence(root, v, readings, ends(beyond) == "separated"))


def coadaptation_placebo(root: Path) -> str:
    """R7: per placebo seed, the cap's use and the norm removed against the target, from its per-step log (the
    seeds of its committed runs only, as R7 reads them)."""
    v = values(root)
    if v is None:
        return NOT_RUN
    cap, seeds = cap_table(root), _placebo_seeds(v)
    if not seeds:
        return "No `placebo` run is committed yet."
    if cap is not None:
        cap = cap[cap.seed.isin(seeds)]
    if cap is None or cap.empty:
        return ("No placebo cap log is summarised yet (`python study/scripts/placebo_cap.py runs/coadaptation2 "
                "study/results/coadaptation2`).")
    rows = [[int(r.seed), int(r.steps), f"{int(r.bound_steps)} ({pct(r.bound_steps / r.steps)} %)",
             int(r.bound_steps_early), pct(r.ratio_total), f"{pct(r.ratio_median)} / {pct(r.ratio_min)}",
             f"{r.attention_norm_median:.3g}", f"{r.mlp_norm_median:.3g}",
             f"{pct(r.scale_median)} / {pct(r.scale_max)}", "yes" if r.matched else "no"] for r in cap.itertuples()]
    return (table(["seed", "steps logged", "cap bound (share)", f"of them at steps 1-{EARLY}",
                   "removed / target, summed (%)", "removed / target per step, median / min (%)",
                   "attention path norm, median", "MLP path norm, median",
                   "share of the MLP path removed, median / max (%)", "matched (R7)"], rows)
            + f"\n\nMatched (R7: cap bound on at most {pct(CAP_BOUND_MAX)} % of steps, at least "
              f"{pct(MATCH_TOTAL_MIN)} % of the target removed over the run) in {int(cap.matched.sum())} of "
              f"{len(cap)} seeds. " + _cap_summary(cap))


def _cap_summary(cap: pd.DataFrame) -> str:
    """What the prose says of the placebo's cap, over the seeds shown: the range of each share and how many seeds'
    MLP paths carried less than attention's path at the median step."""
    def span(x: pd.Series) -> str:
        lo, hi = pct(x.min()), pct(x.max())
        return f"{lo} %" if lo == hi else f"{lo}–{hi} %"

    below = int((cap.mlp_norm_median < cap.attention_norm_median).sum())
    return (f"Over these {len(cap)} seeds the cap bound on {span(cap.bound_steps / cap.steps)} of the steps, the "
            f"placebo removed {span(cap.ratio_total)} of the target summed over the run, and the MLP paths' median "
            f"norm was below attention's path's in {below} of {len(cap)}.")


# --- the ends in fp32 (R8) ------------------------------------------------------------------------------------------
ENDS = (JOINT, CUT)
REMEASURED = "Re-measured in fp32 on the same seeds (not a replication)"
"""R8's positive reading, named for what it is: the twin trains the bf16 grid's seeds with the same initialisations
and batches in another precision, so it re-measures the bf16 result and does not replicate it."""
NO_REPLICATION = "A replication on fresh fp32 seeds, which the bf16 grid never used, has not been run."


def fp32_values(root: Path) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """R8's runs: the fp32 twin's committed runs of the two ends whose checkpoints record fp32, and those left out
    (recorded otherwise, or not recorded); None before the twin is collected."""
    v = values(root, FP32_GRID)
    if v is None:
        return None
    v = v[v.variant.isin(ENDS)]
    # exactly "fp32": a run resumed in another precision reads "bf16 (from step 0), fp32 (from step N)" and is left
    # out. The column is the checkpoint's record (probe.hardware.trained_as) wherever final.pt was read; a run folder
    # without one gives its config's request, but such a run has no evaluation either, so no state in (2x, 4x] to count
    fp32 = v.precision.astype(str).eq("fp32")
    return v[fp32].reset_index(drop=True), v[~fp32].reset_index(drop=True)


@dataclass(frozen=True)
class PrecisionReading:
    reading: str
    """"re-measured", "not confirmed", "pending" or "not read". R8 as registered calls its first outcome "confirmed in
    both precisions"; the twin reuses the bf16 grid's seeds, initialisations and batches, so it re-measures the bf16
    result in another precision and does not replicate it: the reading is named for that."""
    comparison: Comparison | None
    text: str


def precision_reading(root: Path) -> PrecisionReading | None:
    """R8 on the committed runs; None before the fp32 twin is collected."""
    got = fp32_values(root)
    if got is None:
        return None
    v32, _ = got
    bf = values(root)
    state = "untested" if bf is None else ends(family(bf, BEYOND_PAIRS))
    cmp = family(v32, [(JOINT, CUT, "beyond")]).get((JOINT, CUT, "beyond"))
    if state != "separated":
        why = {"untested": "R1 cannot yet test the bf16 ends", "not separated": "R1 does not separate the bf16 ends"}
        return PrecisionReading("not read", cmp, f"Not read: {why[state]}, so there is no separation to confirm.")
    if cmp is None or not cmp.testable:
        n, m = (0, 0) if cmp is None else (cmp.n, cmp.m)
        why = (f"{n} vs {m} fp32 seeds cannot reach p < {ALPHA} (smallest attainable "
               f"{min_adjusted_text('seeds', n, m, 1)})" if n and m
               else "an end has no committed fp32 run with its state in (2x, 4x]")
        return PrecisionReading("pending", cmp, f"Pending: {why}; the separation is a bf16 finding so far.")
    said = (f"`joint` − `stopgrad-rnn0` in (2x, 4x], fp32: {_points(cmp)} points at {cmp.n} vs {cmp.m} seeds, exact "
            f"p {p_text(cmp.p)} (a family of 1)")
    if cmp.direction == "below":
        return PrecisionReading("re-measured", cmp, f"{REMEASURED}: {said}, detectably below, as in bf16 by R1. "
                                                    f"{NO_REPLICATION}")
    found = "detectably above: the reverse" if cmp.direction == "above" else "no difference detected"
    return PrecisionReading("not confirmed", cmp, f"Not confirmed in fp32: {said}, {found}.")


def coadaptation_fp32(root: Path) -> str:
    """R8: per seed, each end's state in (2x, 4x] in bf16 beside fp32, the fp32 test and its reading."""
    got = fp32_values(root)
    if got is None:
        return _not_run(FP32_GRID) + " Until it runs, the ends' separation is a bf16 finding."
    v32, left = got
    bf = values(root)
    bf = bf if bf is not None else v32.iloc[:0]
    seeds = sorted(set(v32.seed) | set(bf.loc[bf.variant.isin(ENDS), "seed"]))

    def at(v: pd.DataFrame, x: str, s: int, c: str = "beyond") -> str:
        r = v.loc[(v.variant == x) & (v.seed == s), c]
        return pct(r.iloc[0]) if len(r) else "–"

    rows = [[s, *[at(frame, x, s) for x in ENDS for frame in (bf, v32)]] for s in seeds]
    rows.append(["mean · seeds at 95 % or more (each column's own seeds)",
                 *[_cell(_of(frame, x, "beyond")) for x in ENDS for frame in (bf, v32)]])
    out = [table(["seed", *[f"`{x}` {p}" for x in ENDS for p in ("bf16", "fp32")]], rows)]
    fit = "; ".join(f"`{x}` state at 1x {_cell(_of(v32, x, 'state_1x'))}, (8x, 16x] "
                    f"{_cell(_of(v32, x, 'state_win_8x_16x'))}" for x in ENDS)
    out.append(f"In fp32: {fit}. {precision_sentence(v32) if len(v32) else ''} "
               f"{device_sentence(v32) if len(v32) else ''}".replace("  ", " ").rstrip())
    if len(left):
        named = ", ".join(f"`{r.variant}` seed {r.seed} ({r.precision})" for r in left.itertuples())
        out.append(f"Left out, not recorded as fp32: {named}.")
    agree = _agreement(bf, v32)
    if agree:
        out.append(agree)
    out.append(f"{_fp32_pending(bf, v32)}**{precision_reading(root).text}**")
    return "\n\n".join(out)


def _agreement(bf: pd.DataFrame, v32: pd.DataFrame) -> str:
    """Per end, the Pearson correlation over seeds of the state in (2x, 4x] between the precisions: how far the
    twin's seeds repeat the bf16 seeds' outcomes (why it is a re-measurement, not a replication)."""
    parts = []
    for x in ENDS:
        a, b = (f.loc[f.variant == x].set_index("seed")["beyond"] for f in (bf, v32))
        both = pd.concat([a, b], axis=1, join="inner").dropna()
        if len(both) < 3 or (both.std() == 0).any():
            continue
        r = float(np.corrcoef(both.iloc[:, 0], both.iloc[:, 1])[0, 1])
        parts.append((f"`{x}` r = {r:.2f} over {len(both)} seeds", r))
    if not parts:
        return ""
    alike = all(r >= 0.7 for _, r in parts)
    return ("Per seed, the state in (2x, 4x] in bf16 against fp32 (Pearson, descriptive): "
            + "; ".join(t for t, _ in parts) + ". The twin reuses the bf16 grid's seeds, initialisations and batches"
            + (", and the seeds that fall in one precision largely fall in the other" if alike else "")
            + ": it re-measures the bf16 result, it does not replicate it.")


def _fp32_pending(bf: pd.DataFrame, v32: pd.DataFrame) -> str:
    """"" once every run of the ends is committed in both grids, else "Provisional (k of n ...): "."""
    # like the verdict, R8 is read on complete grids: a reading repeated at every collection would be a test repeated
    # until it passes
    counts = [(len(_committed(frame, ENDS, seeds_of)), len(ENDS) * len(seeds_of), what)
              for frame, seeds_of, what in ((bf, GRID_SEEDS, "bf16"), (v32, FP32_SEEDS, "fp32"))]
    if all(k == n for k, n, _ in counts):
        return ""
    return ("Provisional (" + "; ".join(f"{k} of the {n} {what} runs of the ends committed" for k, n, what in counts)
            + "): ")


# --- the study's front page -----------------------------------------------------------------------------------------
def _against(c: Comparison | None) -> str:
    """A comparison as the front page quotes it: its result, the difference in points with its interval, Holm's p."""
    if c is None:
        return "not run yet"
    diff = f"{_difference(c)}{'' if c.measure == 'loss' else ' points'}, {c.n} vs {c.m} seeds"
    if not c.testable:
        return f"{diff}, descriptive only"
    return f"{_result(c)} ({diff}, Holm p {p_text(c.p_holm)} in a family of {c.family})"


def _holding(v: pd.DataFrame, variant: str, measure: str) -> str:
    """"k of n seeds (the others: seed s at x %, ...)" for a variant's seeds at HOLDS or more in ``measure``."""
    r = v[(v.variant == variant) & v[measure].notna()]
    short = r[r[measure] < HOLDS]
    others = "; ".join(f"seed {int(x.seed)} at {pct(getattr(x, measure))} %" for x in short.itertuples())
    return f"{len(r) - len(short)} of {len(r)} seeds" + (f" (the others: {others})" if 0 < len(short) < len(r) else "")


def coadaptation_readme(root: Path) -> str:
    """study/README.md's paragraph on the co-adaptation controls: the ends, random-path, the verdict and its state,
    frozen-copy to 16x, the placebo's cap and the fp32 twin, every number from the blocks above."""
    v = values(root)
    if v is None:
        return NOT_RUN + " Until it runs, co-adaptation is untested, not refuted."
    result, readings, beyond, fit = verdict(v)
    expected, have = _design(VARIANTS, GRID_SEEDS), _committed(v, VARIANTS, GRID_SEEDS)
    state = ("complete" if have == expected
             else "settled before the grid is complete" if settled(v, result, beyond, fit) else "provisional")
    rp = "random-path"
    out = [f"- *The controls for `frozen-copy`* (`coadaptation2`, seeds {GRID_SEEDS[0]}–{GRID_SEEDS[-1]}, bf16; "
           f"{len(have)} of its {len(expected)} runs committed; state in (2x, 4x] unless named): the cut "
           f"(`stopgrad-rnn0`) is at 95 % or more in {_holding(v, CUT, 'beyond')}, and `joint` against it is "
           f"{_against(beyond.get((JOINT, CUT, 'beyond')))}. A random direction of the cut's norm (`{rp}`) "
           f"against the cut: {_against(beyond.get((rp, CUT, 'beyond')))}; against `joint`: "
           f"{_against(beyond.get((rp, JOINT, 'beyond')))}; its final training loss against the cut: "
           f"{_against(fit.get((rp, CUT, 'loss')))}.",
           f"  The verdict (rule R6 ({result.rule}), {state}): **{result.text}**"]
    fc = v[(v.variant == "frozen-copy") & v.state_win_8x_16x.notna()]
    if len(fc):
        held = [int(s) for s in fc.loc[fc.state_win_8x_16x >= HOLDS, "seed"]]
        out.append(f"  `frozen-copy` rerun on these seeds holds to 16x (state in (8x, 16x] at 95 % or more) in "
                   f"{len(held)} of {len(fc)} seeds" + (f" ({', '.join(map(str, held))})" if held else "") + ".")
    seeds, cap = _placebo_seeds(v), cap_table(root)
    if seeds:
        said = placebo_sentence(root, v, readings, ends(beyond) == "separated")
        whole = cap is not None and seeds <= set(cap.seed)  # the summary only over a log of every seed R7 reads
        out.append(f"  Rerun with its cap logged, {said}" + (f" {_cap_summary(cap[cap.seed.isin(seeds)])}"
                                                             if whole else ""))
    got = fp32_values(root)
    if got is None:
        out.append(f"  In fp32 (rule R8): its twin (`{FP32_GRID}`) is not yet run.")
    else:
        out.append(f"  In fp32 (rule R8): {_fp32_pending(v, got[0])}"
                   f"{precision_reading(root).text}")
    return "\n".join(out)


def rules() -> list[str]:
    """The pre-registered rules as this docstring states them, each on one line (the docs must state them alike)."""
    text = re.sub(r"\s+", " ", __doc__)
    return [m.group(0).strip() for m in re.finditer(r"R\d\. .*?(?= R\d\. |$)", text)]


BLOCKS: dict[str, Callable[[Path], str]] = {
    "coadaptation-variants": coadaptation_variants,
    "coadaptation-seeds": coadaptation_seeds,
    "coadaptation-compare": coadaptation_compare,
    "coadaptation-readings": coadaptation_readings,
    "coadaptation-verdict": coadaptation_verdict,
    "coadaptation-placebo": coadaptation_placebo,
    "coadaptation-fp32": coadaptation_fp32,
    "coadaptation-readme": coadaptation_readme,
}
