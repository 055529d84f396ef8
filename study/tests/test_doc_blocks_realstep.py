"""study/scripts/doc_blocks_realstep.py: the pre-registered statement of the real-step lookahead comes out each way on
synthetic results written in the script's own layout (its ``collect``, with the verdicts, controls and rollout
outcomes of ``probe.gradients.realstep``), a failed instrument check withholds its snapshot, and the rule in the
module is the rule in study/docs/gradients.md."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from probe.core.rows import threshold_row
from probe.gradients import realstep as RS

ROOT = Path(__file__).resolve().parents[2]
WINDOWS = ["(1x, 2x]", "(2x, 4x]", "(4x, 8x]", "(8x, 16x]"]
NULL = (0.4, 0.3, -0.5)
"""(z_att, vs_matched_z, rollout_z) of a window where nothing is detected."""
RAISE = (3.5, 3.0, -4.0)
"""A raise beyond the matched random that the cut rollout reproduces: every condition of the rule."""
SE = 1e-4


@pytest.fixture(scope="module")
def S(study_scripts):
    return study_scripts("realstep_lookahead", "doc_blocks_realstep")


@pytest.fixture(autouse=True)
def two_seed_grid(S, monkeypatch):
    """The synthetic grids here are seeds 40 and 41 at every step: the whole grid, as far as the blocks know."""
    assert S[1].GRID_SEEDS == (40, 41, 42, 43, 44)  # sweeps/realstep.toml's
    monkeypatch.setattr(S[1], "GRID_SEEDS", (40, 41))


def snapshot(seed: int, step: int, effects: dict[str, tuple[float, float, float]], share: float = 0.05,
             adamw_error: float = 1e-6) -> dict:
    """One snapshot's rows as ``realstep_lookahead.measure`` returns them, built by probe's own ``verdicts``,
    ``controls`` and ``outcome`` from attention's rows: ``effects`` maps a window to (z_att, vs_matched_z,
    rollout_z), NULL elsewhere; ``adamw_error`` above the tolerance fails ``realstep_matches_adamw``."""
    name = f"runs/realstep/joint/seed{seed}/trajectory/step_{step:06d}.pt"
    common = {"step_norm": share, "fraction_of_update": share, "moments": "adamw-state", "update_norm": 1.0}
    rows = [{"part": "att", "loss": "train", "positions": "<=L", "dL": -1e-3, "dL_se": SE, "z": -10.0, **common}]
    for w in WINDOWS:
        z_att, z_m, _ = effects.get(w, NULL)
        rows.append({"part": "att", "loss": "state", "positions": w, "dL": z_att * SE, "dL_se": SE, "z": z_att,
                     "vs_matched": z_m * SE, "vs_matched_se": SE, "vs_matched_z": z_m, **common})
    rows = pd.DataFrame(rows)
    verdict = RS.verdicts(rows)
    checks = RS.controls(name, {"sum_error": 0.0, "match_error": 0.0}, verdict)
    checks.append(threshold_row(name, "realstep_matches_adamw", adamw_error, RS.ADAMW_TOL, "the kept first step"))
    checks.append(threshold_row(name, "rollout_reproduces_run", 0.0, 0.0, "the kept branch's last weights"))
    roll = [effects.get(w, NULL)[2] for w in verdict.positions]
    verdict = verdict.assign(moments="adamw-state", fraction_rec=0.3, fraction_momentum=0.9, fraction_decay=0.002,
                             rollout_steps=50, rollout_cut_minus_kept=[z * SE for z in roll], rollout_z=roll,
                             rollout_reproduced=True)
    verdict["rollout_outcome"] = verdict.rollout_z.map(RS.outcome)
    rollout = [{"loss": "state", "positions": w, "loss_kept": 3.0, "loss_cut": 3.0 + z * SE, "cut_minus_kept": z * SE,
                "cut_minus_kept_se": SE, "cut_minus_kept_z": z, "rollout_steps": 50}
               for w, z in zip(verdict.positions, roll, strict=True)]
    keep = {"checkpoint": name, "run": f"joint/seed{seed}", "variant": "joint", "seed": seed, "step": step}
    return {"realstep": [{**keep, **r} for r in rows.to_dict("records")],
            "verdicts": [{**keep, **r} for r in verdict.to_dict("records")],
            "rollout": [{**keep, **r} for r in rollout], "controls": [{**keep, **c} for c in checks]}


def write(S, root: Path, effects: dict[tuple[int, str, int], tuple[float, float, float]] | None = None,
          failed: frozenset[tuple[int, int]] = frozenset(), seeds=(40, 41)) -> Path:
    """The grid's results at every step of the script's default: ``effects[(seed, window, step)]`` overrides NULL,
    ``failed`` holds the (seed, step) whose ``realstep_matches_adamw`` fails."""
    R, _ = S
    effects = effects or {}
    objs = [snapshot(seed, step, {w: effects[(seed, w, step)] for w in WINDOWS if (seed, w, step) in effects},
                     adamw_error=1.0 if (seed, step) in failed else 1e-6)
            for seed in seeds for step in R.STEPS]
    R.collect(objs, root / "study" / "results" / "gradients" / "realstep")
    return root


def raise_over(seed: int, window: str, steps, effect=RAISE) -> dict:
    return {(seed, window, s): effect for s in steps}


def _edit(root: Path, name: str, edit) -> None:
    """Rewrite one of the committed CSVs through ``edit`` (a snapshot lost, measured twice, ...)."""
    path = root / "study" / "results" / "gradients" / "realstep" / f"{name}.csv"
    edit(pd.read_csv(path)).to_csv(path, index=False)


def blocks(S, root: Path) -> dict[str, str]:
    return {name: f(root) for name, f in S[1].BLOCKS.items()}


def test_the_csvs_are_in_the_script_s_layout(S, tmp_path):
    R, _ = S
    base = write(S, tmp_path) / "study" / "results" / "gradients" / "realstep"
    assert list(pd.read_csv(base / "verdicts.csv").columns) == R.VERDICT_COLUMNS
    assert list(pd.read_csv(base / "realstep.csv").columns) == R.REALSTEP_COLUMNS
    assert list(pd.read_csv(base / "rollout.csv").columns) == R.ROLLOUT_COLUMNS


def test_a_raise_in_one_window_is_named_with_its_run_window_and_steps(S, tmp_path):
    root = write(S, tmp_path, raise_over(40, "(2x, 4x]", range(600, 801, 50)))
    b = blocks(S, root)
    statement = b["realstep-statement"]
    assert ("**Attention's part raises the beyond-range loss at real steps** in 1 of the 2 runs (seeds 40, 41): "
            "`joint` seed 40: (2x, 4x] over steps 600–800.") in statement
    assert "None found at real steps in `joint` seed 41." in statement
    assert "**None found at real steps**" not in statement
    assert "2 runs × 4 windows of positions, 184 stretches of 4" in statement  # 2 x 4 x (26 - 4 + 1)
    # the window's row: 5 supporting snapshots, each verdict a raise that the rollout reproduces
    row = next(line for line in b["realstep-windows"].splitlines()
               if line.startswith("| `joint` seed 40 | 550–1000 | (2x, 4x] |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "10" and cells[4] == "5.0 (5.0–5.0)"
    assert cells[6].endswith("· 5 / 0") and cells[7].endswith("· 5") and cells[9] == "5 / 0 of 5"
    assert cells[10] == "5"
    steps = {line.split("|")[1].strip(): line for line in b["realstep-steps"].splitlines()[4:]}
    assert "**++−**" in steps["700"] and "**" not in steps["550"] and "**" not in steps["850"]
    assert "Every snapshot passed every instrument check" in b["realstep-checks"]


def test_no_raise_reads_none_found(S, tmp_path):
    statement = blocks(S, write(S, tmp_path))["realstep-statement"]
    assert "**None found at real steps**: in none of the 2 runs (seeds 40, 41)" in statement
    assert "no snapshot supported a raise" in statement
    assert "raises the beyond-range loss at real steps**" not in statement


def test_until_every_snapshot_is_measured_the_statement_is_provisional(S, tmp_path):
    # seed 41's step 700 not measured yet: its 3-long stretches either side may join into one of 7
    root = write(S, tmp_path, raise_over(41, "(2x, 4x]", [550, 600, 650, 750, 800, 850]))
    _edit(root, "verdicts", lambda v: v[~((v.seed == 41) & (v.step == 700))])
    statement = blocks(S, root)["realstep-statement"]
    assert "**None found so far** (provisional: 51 of the grid's 52 snapshots measured" in statement
    assert "**None found at real steps**" not in statement
    raised = write(S, tmp_path / "raised", raise_over(40, "(2x, 4x]", range(600, 801, 50)))
    _edit(raised, "verdicts", lambda v: v[~((v.seed == 41) & (v.step == 1500))])
    statement = blocks(S, raised)["realstep-statement"]
    assert ("in 1 of the 2 runs (seeds 40, 41) (provisional: 51 of the grid's 52 snapshots measured" in statement
            and "None found so far in `joint` seed 41." in statement)


@pytest.mark.parametrize("n, named", [(3, False), (4, True)])
def test_the_rule_needs_four_consecutive_snapshots(S, tmp_path, n, named):
    last = 600 + 50 * (n - 1)
    statement = blocks(S, write(S, tmp_path, raise_over(41, "(8x, 16x]", range(600, last + 1, 50))))[
        "realstep-statement"]
    if named:
        assert f"`joint` seed 41: (8x, 16x] over steps 600–{last}." in statement
    else:
        assert "**None found at real steps**" in statement
        assert f"the longest stretch was {n} snapshots (`joint` seed 41, (8x, 16x], steps 600–{last})" in statement


def test_a_raise_that_the_matched_random_explains_too_is_not_named(S, tmp_path):
    explained = (3.5, 0.5, -4.0)  # attention's part raises the loss, and the cut lowers it, but no more than random
    b = blocks(S, write(S, tmp_path, raise_over(40, "(2x, 4x]", range(600, 801, 50), explained)))
    assert "**None found at real steps**" in b["realstep-statement"]
    assert ("In 5 of the 5 snapshot-windows where attention's part raised the loss, the raise was no larger than the "
            "matched random step's") in b["realstep-statement"]
    assert "The control `realstep_vs_matched_random` failed in 5 snapshot-windows" in b["realstep-checks"]


@pytest.mark.parametrize("rollout_z, agreement", [(0.5, "0 / 0 of 5"), (4.0, "0 / 5 of 5")])
def test_a_raise_that_the_rollout_does_not_reproduce_is_not_named(S, tmp_path, rollout_z, agreement):
    b = blocks(S, write(S, tmp_path, raise_over(40, "(2x, 4x]", range(600, 801, 50), (3.5, 3.0, rollout_z))))
    assert "**None found at real steps**" in b["realstep-statement"]
    row = next(line for line in b["realstep-windows"].splitlines()
               if line.startswith("| `joint` seed 40 | 550–1000 | (2x, 4x] |"))
    assert [c.strip() for c in row.strip("|").split("|")][9] == agreement


@pytest.mark.parametrize("failed_step, named", [(700, False), (900, True)])
def test_a_failed_instrument_check_withholds_its_snapshot(S, tmp_path, failed_step, named):
    root = write(S, tmp_path, raise_over(40, "(2x, 4x]", range(600, 801, 50)), failed=frozenset({(40, failed_step)}))
    b = blocks(S, root)
    assert "| `realstep_matches_adamw` | instrument | 51 of 52 snapshots | 52 |" in b["realstep-checks"]
    assert ("1 of 52 snapshots are withheld (a failed or missing instrument check, another rollout length, or "
            f"moments not the optimizer's own): `joint` "
            f"seed 40 step {failed_step} (`realstep_matches_adamw` failed)") in b["realstep-checks"]
    assert "Left out of this table: 1 withheld snapshot" in b["realstep-windows"]
    cell = next(line for line in b["realstep-steps"].splitlines() if line.startswith(f"| {failed_step} |"))
    assert cell.split("|")[2].strip() == "withheld"
    assert "Withheld (a failed instrument check, above): 1 snapshot" in b["realstep-statement"]
    if named:  # outside the stretch: the window stands
        assert "`joint` seed 40: (2x, 4x] over steps 600–800." in b["realstep-statement"]
    else:  # inside it: 600-650 and 750-800 are two stretches of 2
        assert "**None found at real steps**" in b["realstep-statement"]
        assert "the longest stretch was 2 snapshots" in b["realstep-statement"]


def test_a_snapshot_missing_an_instrument_check_is_withheld_as_if_it_failed(S, tmp_path):
    # the stretch 600-800 with step 700's realstep_matches_adamw row lost: no evidence that its step is the run's
    root = write(S, tmp_path, raise_over(40, "(2x, 4x]", range(600, 801, 50)))
    _edit(root, "checks", lambda c: c[~((c.seed == 40) & (c.step == 700) & (c.control == "realstep_matches_adamw"))])
    b = blocks(S, root)
    assert "seed 40 step 700 (`realstep_matches_adamw` not recorded)" in b["realstep-checks"]
    assert "**None found at real steps**" in b["realstep-statement"]


@pytest.mark.parametrize("lose, reason", [
    ("reproduction", "`rollout_reproduces_run` not recorded"),  # its verdicts say it was measured
    ("rollout length", "rollout of 10 steps, not 50")])
def test_a_snapshot_without_its_reproduction_check_or_with_another_rollout_is_withheld(S, tmp_path, lose, reason):
    root = write(S, tmp_path, raise_over(40, "(2x, 4x]", range(600, 801, 50)))
    at = lambda d: (d.seed == 40) & (d.step == 700)  # noqa: E731
    if lose == "reproduction":
        _edit(root, "checks", lambda c: c[~(at(c) & (c.control == "rollout_reproduces_run"))])
    else:
        _edit(root, "rollout", lambda r: r.assign(rollout_steps=r.rollout_steps.where(~at(r), 10)))
    b = blocks(S, root)
    assert f"seed 40 step 700 ({reason})" in b["realstep-checks"]
    assert "**None found at real steps**" in b["realstep-statement"]


def test_a_snapshot_measured_twice_does_not_break_its_stretch(S, tmp_path):
    root = write(S, tmp_path, raise_over(40, "(2x, 4x]", range(600, 801, 50)))
    _edit(root, "verdicts", lambda v: pd.concat([v, v[(v.seed == 40) & (v.step == 700)]], ignore_index=True))
    assert "`joint` seed 40: (2x, 4x] over steps 600–800." in blocks(S, root)["realstep-statement"]


def test_before_the_grid_every_block_names_its_command(S, tmp_path):
    for name, text in blocks(S, tmp_path).items():
        assert text.startswith("Not run yet: `python -m probe.sweep study/sweeps/realstep.toml"), name
        then = "study/scripts/collect_grid.sh realstep" if name == "realstep-runs" else \
            "study/scripts/realstep_lookahead.py runs/realstep/joint/seed{40,41,42,43,44}"
        assert then in text, name


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"^> ", "", text, flags=re.M)).strip()


def test_the_rule_is_written_verbatim_in_the_module_and_the_doc_and_its_numbers_are_the_design_s(S):
    R, M = S
    rule = _words(M.RULE)
    assert rule in _words(M.__doc__) and rule in _words((ROOT / "study" / "docs" / "gradients.md").read_text())
    grid_runs = 5  # sweeps/realstep.toml's seeds
    tests = grid_runs * len(WINDOWS) * (len(R.STEPS) - M.K + 1)
    assert f"{grid_runs} x {len(WINDOWS)} x {len(R.STEPS) - M.K + 1} = {tests}" in rule
    assert f"q = P(t_3 > 2) = {M.Q_NULL:.3f}" in rule and f"q^{M.K} = {M.Q_NULL ** M.K:.1e}".replace("e-05", "e-5") \
        in rule
    assert f"{tests} x q^{M.K} = {tests * M.Q_NULL ** M.K:.3f}" in rule
    assert f"{grid_runs * len(WINDOWS)} x q = {grid_runs * len(WINDOWS) * M.Q_NULL:.1f}" in rule
    assert f"at least {M.K} consecutive" in rule and R.ROLLOUT == 50 and M.GAP == 50


def _runs_rows(text: str) -> dict[tuple[str, str], list[str]]:
    """The realstep-runs table as (run, factor) -> its cells, the run carried down to its factor rows."""
    out, run = {}, ""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not line.startswith("| ") or cells[0] == "run" or len(cells) < 5:
            continue
        run = cells[0] or run
        out[(run, cells[3])] = cells
    return out


def test_the_runs_block_reads_each_window_and_when_the_counter_formed(S, tmp_path):
    """The runs' block against the committed grid copied and edited: each window's cell is windows.csv's right / asked
    for that run and window (another route than the summary columns the block reads), a second variant on the same
    seeds keeps its own numbers, the first step whose state at L reaches 90 % moves with the training log (exactly 0.90
    counts, 0.899 does not), and the final training loss and each factor's chance floor are read."""
    import json

    src = ROOT / "study" / "results" / "realstep"
    dst = tmp_path / "study" / "results" / "realstep"
    dst.mkdir(parents=True)
    for f in ("runs.jsonl", "curves.csv", "windows.csv", "training.csv"):
        (dst / f).write_bytes((src / f).read_bytes())
    training = pd.read_csv(dst / "training.csv")
    training.loc[training.seed == 40, "state_acc_1x"] = training.loc[training.seed == 40, "step"].map(
        lambda s: 0.90 if s >= 750 else 0.5)
    training.loc[training.seed == 41, "state_acc_1x"] = 0.899
    other = training[training.seed == 42].assign(variant="other", loss=9.9, state_acc_1x=0.95)
    pd.concat([training, other]).to_csv(dst / "training.csv", index=False)
    # a second variant on seed 42 that answers nothing right beyond range: a block reading by seed alone shows it
    windows = pd.read_csv(src / "windows.csv")
    w42 = windows[windows.seed == 42].assign(variant="other")
    w42.loc[w42.beyond, "right"] = 0
    pd.concat([windows, w42]).to_csv(dst / "windows.csv", index=False)
    curves = pd.read_csv(src / "curves.csv")
    pd.concat([curves, curves[curves.seed == 42].assign(variant="other")]).to_csv(dst / "curves.csv", index=False)
    lines = (src / "runs.jsonl").read_text().splitlines()
    run42 = json.loads(next(line for line in lines if json.loads(line)["seed"] == 42))
    zeroed = {k: 0.0 for k in run42 if "_win_" in k and not k.endswith("_win_0x_1x")}
    (dst / "runs.jsonl").write_text("\n".join(lines + [json.dumps({**run42, **zeroed, "variant": "other",
                                                                   "run": "other/seed42"})]) + "\n")
    rows = _runs_rows(S[1].realstep_runs(tmp_path))
    assert rows[("`joint` seed 40", "state (mod 10)")][1] == "750"
    assert rows[("`joint` seed 41", "state (mod 10)")][1] == "–"
    assert rows[("`other` seed 42", "state (mod 10)")][1:3] == ["250", "9.9000"]
    assert rows[("`other` seed 42", "mod 5")][5:9] == ["0.0"] * 4
    final = training[(training.seed == 43) & (training.variant == "joint")].sort_values("step").loss.iloc[-1]
    assert rows[("`joint` seed 43", "state (mod 10)")][2] == f"{final:.4f}"
    assert [rows[("`joint` seed 43", f)][-1] for f in ("state (mod 10)", "parity", "mod 5")] == ["10.0", "50.0",
                                                                                                 "20.0"]
    header = ["in range", "(1x, 2x]", "(2x, 4x]", "(4x, 8x]", "(8x, 16x]"]
    for seed in (42, 43):
        for factor, subtask in (("state (mod 10)", "state"), ("parity", "state_mod2"), ("mod 5", "state_mod5")):
            cells = rows[(f"`joint` seed {seed}", factor)]
            for i, window in enumerate(header):
                w = windows[(windows.seed == seed) & (windows.window == window) & (windows.subtask == subtask)]
                assert cells[4 + i] == f"{100 * w.right.iloc[0] / w.n_tokens.iloc[0]:.1f}", (seed, factor, window)
    assert S[1].realstep_runs(tmp_path / "elsewhere").startswith("Not run yet")


LOWER_CUT_RAISES = (-3.0, 0.0, 3.0)
"""Attention's part lowers the loss in one step; the 50-step rollout without its path raises it."""
BELOW = (-1.0, 0.0, 1.0)
"""The same signs below the detection threshold (|z| < 2): counted by neither reading."""


def test_the_direction_block_counts_each_reading_per_run_and_the_runs_lean(S, tmp_path):
    R, _ = S
    late = [s for s in R.STEPS if s > 500]
    effects = {}
    for s in R.STEPS:
        # seed 40: lowers in (1x, 2x]; in the other windows the same signs, undetected (a count by sign would take them)
        effects[(40, "(1x, 2x]", s)] = LOWER_CUT_RAISES
        effects.update({(40, w, s): BELOW for w in WINDOWS[1:]})
        effects[(43, "(2x, 4x]", s)] = RAISE  # seed 43: raises throughout; seed 42: nothing detected
    # seed 41: raises in two windows at steps 250-500, lowers in one at every later step: its first window of steps
    # leans one way, the whole run the other
    effects.update(raise_over(41, "(4x, 8x]", range(250, 501, 50)))
    effects.update(raise_over(41, "(8x, 16x]", range(250, 501, 50)))
    effects.update({(41, "(1x, 2x]", s): LOWER_CUT_RAISES for s in late})
    text = blocks(S, write(S, tmp_path, effects, seeds=(40, 41, 42, 43)))["realstep-direction"]
    lines = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    n, k = len(R.STEPS), len(late)
    assert lines[1] == ["`joint` seed 40", "250–500", "6 · 24", "0 / 6", "0 / 6"]
    whole = [row[2:] for row in lines if row[1] == "**all**"]
    assert whole == [[f"{n} · {4 * n}", f"0 / {n}", f"0 / {n}"],
                     [f"{n} · {4 * n}", f"12 / {k}", f"12 / {k}"],
                     [f"{n} · {4 * n}", "0 / 0", "0 / 0"],
                     [f"{n} · {4 * n}", f"{n} / 0", f"{n} / 0"]]
    assert next(row for row in lines if row[0] == "`joint` seed 41")[3:] == ["12 / 0", "12 / 0"]
    assert ("attention's part leans to raising the loss in 1, lowering it in 2, neither in 1 of the 4 runs; the "
            "rollout's cut leans to lowering the loss in 1, raising it in 2, neither in 1.") in text
    assert "4 runs, even all leaning one way, cannot reach p < 0.05" in text
    assert "Descriptive, not a test" in text and "p =" not in text


def test_the_direction_block_leaves_out_withheld_snapshots(S, tmp_path):
    R, _ = S  # every snapshot of seed 40 but the first fails an instrument check
    effects = raise_over(40, "(2x, 4x]", R.STEPS)
    text = blocks(S, write(S, tmp_path, effects, failed=frozenset((40, s) for s in R.STEPS[1:])))["realstep-direction"]
    assert "| `joint` seed 40 | 250–500 | 1 · 4 | 1 / 0 | 1 / 0 |" in text


def test_the_direction_block_says_when_its_runs_could_not_reach_significance_at_all(S, tmp_path):
    R, _ = S
    seeds = (40, 41, 42, 43, 44, 45)  # six runs: all one way would be 2 / 2^6 = 0.031
    effects = {(seed, "(1x, 2x]", s): LOWER_CUT_RAISES for s in R.STEPS for seed in seeds}
    text = blocks(S, write(S, tmp_path, effects, seeds=seeds))["realstep-direction"]
    assert "lowering it in 6 of the 6 runs" in text and "Descriptive, not a test" in text
    assert "cannot reach" not in text


def _with_part(part: str, z_train: float, z_beyond: float, seeds=(40,)):
    """An edit that adds ``part``'s rows (share 0.9) to every snapshot of ``seeds``: its z on the training loss and
    in every window beyond L."""
    def edit(d: pd.DataFrame) -> pd.DataFrame:
        att = d[(d.part == "att") & d.seed.isin(seeds)]
        z = [z_train if p == "<=L" else z_beyond for p in att.positions]
        add = att.assign(part=part, fraction_of_update=0.9, vs_matched=float("nan"), vs_matched_z=float("nan"), z=z,
                         dL=[x * SE for x in z])
        return pd.concat([d, add], ignore_index=True)
    return edit


def test_the_parts_block_counts_each_part_s_raises_and_leaves_out_withheld_snapshots(S, tmp_path):
    # seed 40's momentum raises both losses everywhere; seed 41's lowers them; u raises seed 41's training loss
    R, _ = S
    root = write(S, tmp_path, failed=frozenset({(40, R.STEPS[0])}))
    _edit(root, "realstep", _with_part("momentum", 3.0, 5.0, seeds=(40,)))
    _edit(root, "realstep", _with_part("momentum", -3.0, -5.0, seeds=(41,)))
    _edit(root, "realstep", _with_part("full", 2.5, 0.0, seeds=(41,)))
    text = blocks(S, root)["realstep-parts"]
    rows = {}
    part = None
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| part"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            part = cells[0] or part
            rows[(part, cells[1])] = cells[2:]
    n = len(R.STEPS)
    # seed 40's first snapshot is withheld: n - 1 of its snapshots are read, n of seed 41's
    assert rows[("the momentum term (`momentum`)", "**all**")] == [
        str(2 * n - 1), "90.0", f"{n - 1} / {n}", f"{4 * (n - 1)} / {4 * n}", "+5.00e-04", "0.01", "1 of 2"]
    assert rows[("attention's part (`att`)", "**all**")][2:] == [f"0 / {2 * n - 1}", "0 / 0", "–", "–", "0 of 2"]
    assert rows[("the whole update u (`full`)", "**all**")][2] == f"{n} / 0"
    assert f"raised the held-out training loss (z > 2) in {n} of {n} snapshots (100.0 %)" in text
    assert "Descriptive, not a test" in text


@pytest.mark.parametrize(("z_random", "said"), [
    (3.0, "larger per unit of step than the matched random step's."),  # 5e-4 / 0.05 against 3e-4 / 0.05
    (8.0, "no larger per unit of step than the matched random step's: their size is the length of its step."),
    (None, "not compared per unit of step: one of the two has no raise to compare."),
])
def test_the_parts_reading_compares_the_momentum_term_per_unit_of_step(S, tmp_path, z_random, said):
    """The withdrawn reading ("the beyond-range loss rises through the momentum term", "six times attention's part")
    compared raw sizes of steps of different lengths; the reading now divides by each part's step length and says
    which way the comparison with the matched random step comes out, from the rows alone."""
    root = write(S, tmp_path)
    _edit(root, "realstep", _with_part("momentum", 3.0, 5.0, seeds=(40, 41)))
    _edit(root, "realstep", _with_part("full", -3.0, -3.0, seeds=(40, 41)))
    if z_random is not None:
        _edit(root, "realstep", _with_part("matched_random", -3.0, z_random, seeds=(40, 41)))
    text = blocks(S, root)["realstep-parts-reading"]
    n = len(S[0].STEPS)
    assert f"- The whole update u lowers the state loss beyond L more often than it raises it (0 raises, {8 * n} " \
           "lowers" in text and "in 0 of the 2 runs" in text
    assert f"raises the held-out *training* loss more often than it lowers it ({2 * n} / 0 snapshots): an overshoot" \
        in text
    assert "the raises are 0.01 for the momentum term" in text and text.split("\n\n")[0].endswith(said)
    assert "rises through the momentum term" not in text and "no test" in text
