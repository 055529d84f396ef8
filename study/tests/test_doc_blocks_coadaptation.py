"""study/scripts/doc_blocks_coadaptation.py: the pre-registered readings of the co-adaptation controls come out each
way on synthetic grids written by probe.results' own writer, the rules in the docs are the module's, and the
placebo's cap summary is right on a real tiny placebo run collected through the normal pipeline."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from probe.results import Grid, import_runs, window_columns, write_grid

ROOT = Path(__file__).resolve().parents[2]
SEEDS = tuple(range(20, 28))
HOLDS = (0.995, 0.002, 0.99)
"""(state at 1x, final training loss, state in (2x, 4x]): a run that fits and generalizes."""
HARMS = (0.995, 0.002, 0.70)
UNFIT = (0.960, 0.009, 0.60)
"""Fits worse in range (the old frozen-copy's 97.0 % and 0.0097) and falls off the cliff."""
WINDOWS = {"in range": (0, 1), "(1x, 2x]": (1, 2), "(2x, 4x]": (2, 4), "(4x, 8x]": (4, 8), "(8x, 16x]": (8, 16)}
L = 25


@pytest.fixture(scope="module")
def D(study_scripts):
    return study_scripts("doc_blocks_coadaptation", "placebo_cap")


def _grid(spec: dict[str, tuple[float, float, float] | list[float]], seeds=SEEDS, rng_seed: int = 0) -> Grid:
    """A compact grid: per variant, its seeds' state at 1x, final loss and (2x, 4x] drawn around ``spec`` (a list
    gives each seed's (2x, 4x] value as it is), the later windows at the (2x, 4x] value less 5 points."""
    rng = np.random.default_rng(rng_seed)
    runs, curves, windows, training = [], [], [], []
    n = 2000
    for variant, target in spec.items():
        for i, seed in enumerate(seeds):
            if isinstance(target, list):
                s1, loss, beyond = 0.995, 0.002, target[i]
            else:
                s1, loss, beyond = target
            s1 = min(1.0, s1 + rng.uniform(-0.003, 0.003))
            beyond = float(np.clip(beyond + (0 if isinstance(target, list) else rng.uniform(-0.02, 0.02)), 0, 1))
            loss = loss * rng.uniform(0.9, 1.1)
            run = f"{variant}/seed{seed}"
            for name, (lo, hi) in WINDOWS.items():
                later = max(0.0, beyond - 0.05)
                acc = {"in range": s1, "(1x, 2x]": min(1.0, beyond + 0.05), "(2x, 4x]": beyond}.get(name, later)
                for subtask, a, chance in (("state", acc, 0.1), ("state_mod2", min(1.0, acc + 0.1), 0.5),
                                           ("state_mod5", acc, 0.2), ("recall", 1.0, 1 / 16)):
                    right = round(a * n)
                    windows.append(dict(variant=variant, run=run, seed=seed, window=name, lo=lo * L, hi=hi * L,
                                        beyond=lo > 0, subtask=subtask, n_tokens=n, right=right,
                                        token_acc=right / n, seq_acc=0.0, chance=chance))
            right = round(s1 * n)
            curves += [dict(variant=variant, seed=seed, length=L, subtask="state", n_tokens=n, token_acc=right / n,
                            seq_acc=0.5),
                       dict(variant=variant, seed=seed, length=L, subtask="recall", n_tokens=n, token_acc=1.0,
                            seq_acc=1.0)]
            runs.append(dict(variant=variant, seed=seed, run=run, label=variant, train_length=L, steps=4500,
                             state_acc_1x=right / n, recall_acc_1x=1.0))
            # the last step's loss is the one read; an earlier, larger one must not be
            training += [dict(variant=variant, seed=seed, step=2250, loss=10 * loss),
                         dict(variant=variant, seed=seed, step=4500, loss=loss)]
    w = pd.DataFrame(windows)
    cols = window_columns(w)
    runs = pd.DataFrame([{**r, **cols[r["run"]]} for r in runs])
    return Grid("coadaptation2", runs, pd.DataFrame(curves).assign(run=None), pd.DataFrame(training), windows=w)


def _cap_lines(steps: int, bound: int) -> list[dict]:
    """A placebo log: target norm 1 at every step; the MLP path holds 2 (the cap does not bind) except on ``bound``
    steps, where it holds 0.5 and all of it is removed."""
    lines = []
    for step in range(1, steps + 1):
        mlp = 0.5 if step <= bound else 2.0
        removed = min(1.0, mlp)
        lines.append({"step": step, "placebo_attention_norm": 1.0, "placebo_mlp_norm": mlp,
                      "placebo_removed_norm": removed, "placebo_scale": removed / mlp,
                      "placebo_cap_bound": mlp < 1.0})
    return lines


def _write(tmp_path: Path, D, spec, seeds=SEEDS, cap_bound: int | None = 2) -> Path:
    """The repository layout a block reads: study/results/coadaptation2/ with the compact files and, for the
    placebo's seeds, placebo_cap.csv (100 logged steps each, the cap bound on ``cap_bound`` of them)."""
    _, C = D
    out = tmp_path / "study" / "results" / "coadaptation2"
    write_grid(_grid(spec, seeds), out)
    if cap_bound is not None and "placebo" in spec:
        rows = [{"variant": "placebo", "seed": s, **C.summarize(_cap_lines(100, cap_bound))} for s in seeds]
        pd.DataFrame(rows, columns=C.COLUMNS).to_csv(out / C.FILE, index=False)
    return tmp_path


def _spec(**over) -> dict:
    """Every variant of the grid: the two ends, and each read variant as ``over`` says (default: holds)."""
    base = {"joint": HARMS, "stopgrad-rnn0": HOLDS, "random-path": HOLDS, "lagged-copy-50": HARMS,
            "lagged-copy-250": HARMS, "frozen-model-copy": HOLDS, "frozen-copy": UNFIT, "placebo": HARMS}
    return {**base, **{k.replace("_", "-"): v for k, v in over.items()}}


def _verdict(D, root: Path):
    B, _ = D
    return B.verdict(B.values(root))


# --- each verdict reached ------------------------------------------------------------------------------------------
def test_co_adaptation_is_supported_when_only_a_learning_attention_harms_and_a_misfit_is_told_apart(D, tmp_path):
    B, _ = D
    root = _write(tmp_path, D, _spec())
    result, readings, beyond, fit = _verdict(D, root)
    assert result.rule == "e" and result.text.startswith("Consistent with co-adaptation")
    assert readings == {"random-path": "holds", "lagged-copy-50": "harms", "lagged-copy-250": "harms",
                        "frozen-model-copy": "holds", "frozen-copy": "fails to fit", "placebo": "harms"}
    # frozen-copy fails to fit: its cliff is not read as a failure to generalize, and the verdict says where it
    # came from only because frozen-model-copy, the consistent counterfactual, holds
    assert B.fit_reading(fit, "frozen-copy") == "fails to fit" and B.fit_reading(fit, "placebo") == "fits"
    assert "frozen-copy's cliff came from mixing" in result.text
    assert len(beyond) == 14 and len(fit) == 12 and all(c.testable for c in [*beyond.values(), *fit.values()])
    text = B.coadaptation_verdict(root)
    assert "attention's path, not the amount of gradient" in text  # the placebo matched in every seed, and harms
    assert text.startswith("**Consistent with co-adaptation")  # every run of the grid is in: final


def test_a_part_way_family_is_adjusted_over_its_registered_size_whatever_the_other_variants_hold(D):
    # the ends at 8 seeds each; random-path at 2 seeds (no test yet); the 12 other pairs of family B with no runs.
    # joint vs stopgrad-rnn0 is the only test: Holm multiplies its p by all 14, never by the 2 pairs present
    B, _ = D
    rows = [dict(variant=x, seed=s, beyond=b, state_1x=0.995, loss=0.002)
            for x, b in ((B.JOINT, 0.6), (B.CUT, 0.99)) for s in SEEDS]
    rows += [dict(variant="random-path", seed=s, beyond=0.99, state_1x=0.995, loss=0.002) for s in SEEDS[:2]]
    beyond = B.family(pd.DataFrame(rows), B.BEYOND_PAIRS)
    ends = beyond[(B.JOINT, B.CUT, "beyond")]
    assert ends.testable and not beyond[("random-path", B.CUT, "beyond")].testable
    assert ends.family == 14 and ends.p_holm == pytest.approx(min(1.0, 14 * ends.p))


def test_a_grid_read_part_way_gives_a_provisional_reading_not_the_verdict(D, tmp_path):
    # 6 of 8 seeds: 6 vs 6 can reach adjusted p < 0.05 in a family of 14, so the rules already read something
    B, _ = D
    text = B.coadaptation_verdict(_write(tmp_path, D, _spec(), seeds=SEEDS[:6]))
    assert text.startswith("Provisional (48 of the grid's 64 runs committed;") and "**Consistent with" in text


def test_a_random_direction_that_harms_leaves_co_adaptation_untested(D, tmp_path):
    result, readings, _, _ = _verdict(D, _write(tmp_path, D, _spec(random_path=HARMS)))
    assert readings["random-path"] == "harms" and result.rule == "b"
    assert result.text.startswith("Co-adaptation untested by these controls")


def test_a_verdict_b_is_settled_before_the_grid_is_complete_only_when_no_later_run_can_undo_it(D, tmp_path):
    """(b) rests on `joint`, `stopgrad-rnn0` and `random-path` alone: with every seed of those in and both detections
    below 0.05 at the family's whole size, the runs still to come cannot change it. Each condition can fail."""
    B, _ = D
    three = {k: v for k, v in _spec(random_path=HARMS).items() if k in (B.JOINT, B.CUT, "random-path")}
    text = B.coadaptation_verdict(_write(tmp_path / "in", D, three))
    assert text.startswith("Settled with 24 of the grid's 64 runs committed") and "**Co-adaptation untested" in text
    # one seed of random-path missing: its values may still move
    part = B.coadaptation_verdict(_write(tmp_path / "part", D, three, seeds=SEEDS[:7]))
    assert part.startswith("Provisional (21 of the grid's 64 runs committed;")
    # a detection that only Holm's current step-down makes (14 x p >= 0.05) could be undone as other pairs become tests
    root = _write(tmp_path / "bound", D, three)
    v = B.values(root)
    result, _, beyond, fit = B.verdict(v)
    assert B.settled(v, result, beyond, fit)
    key = ("random-path", B.CUT, "beyond")
    beyond[key] = dataclasses.replace(beyond[key], p=0.004, p_holm=0.04)
    assert beyond[key].direction == "below" and not B.settled(v, result, beyond, fit)
    # any other rule is never called settled early
    other = {k: v for k, v in _spec().items() if k in (B.JOINT, B.CUT, "random-path")}
    assert B.coadaptation_verdict(_write(tmp_path / "c", D, other)).startswith("Provisional")


def test_a_random_direction_that_fails_to_fit_leaves_it_untested_too(D, tmp_path):
    B, _ = D
    root = _write(tmp_path, D, _spec(random_path=UNFIT))
    result, readings, beyond, fit = _verdict(D, root)
    assert B.beyond_reading(beyond, "random-path") == "harms more than joint"
    assert readings["random-path"] == "fails to fit" and result.rule == "b" and "fails to fit too" in result.text


def test_a_consistent_frozen_counterfactual_that_harms_means_no_co_adaptation(D, tmp_path):
    result, readings, _, _ = _verdict(D, _write(tmp_path, D, _spec(frozen_model_copy=HARMS)))
    assert readings["frozen-model-copy"] == "harms" and result.rule == "d"
    assert result.text.startswith("Co-adaptation not supported")


def test_lagged_copies_that_hold_are_not_as_predicted_and_a_dose_is_mixed(D, tmp_path):
    result, _, _, _ = _verdict(D, _write(tmp_path / "hold", D, _spec(lagged_copy_50=HOLDS, lagged_copy_250=HOLDS)))
    assert result.rule == "f" and result.text.startswith("Not as co-adaptation predicted")
    result, readings, beyond, _ = _verdict(D, _write(tmp_path / "dose", D,
                                                     _spec(lagged_copy_50=(0.995, 0.002, 0.85),
                                                           lagged_copy_250=(0.995, 0.002, 0.55))))
    assert beyond[("lagged-copy-250", "lagged-copy-50", "beyond")].direction == "below"
    assert readings["lagged-copy-50"] == readings["lagged-copy-250"] == "harms"
    assert result.rule == "g" and result.text.startswith("Mixed, co-adaptation undecided")


@pytest.mark.parametrize("control, rule, opening", [("frozen-model-copy", "h", "Undecided at these seed counts"),
                                                     ("random-path", "c", "No verdict: `random-path` is undecided")])
def test_a_control_between_the_ends_with_a_wide_spread_is_undecided(D, tmp_path, control, rule, opening):
    # half its seeds like stopgrad-rnn0, half like joint: neither detectably below the one nor above the other
    split = [0.99, 0.70, 0.99, 0.70, 0.99, 0.70, 0.99, 0.70]
    B, _ = D
    result, readings, beyond, _ = _verdict(D, _write(tmp_path, D, {**_spec(), control: split}))
    assert B.beyond_reading(beyond, control) == "undecided"
    assert readings[control] == "undecided" and result.rule == rule and result.text.startswith(opening)


def test_a_design_too_small_to_test_gives_no_verdict_yet_and_no_p(D, tmp_path):
    B, _ = D
    root = _write(tmp_path, D, _spec(), seeds=SEEDS[:4])
    result, readings, beyond, _ = _verdict(D, root)
    assert result.rule == "a" and result.text.startswith("No verdict yet: 4 vs 4 seeds")
    assert not any(c.testable for c in beyond.values())
    compare = B.coadaptation_compare(root)
    assert "descriptive: 4 vs 4 seeds cannot reach adjusted p < 0.05 in a family of 14" in compare
    from test_reachable_p import violations

    assert violations(compare) == []


def test_ends_that_do_not_separate_give_no_verdict(D, tmp_path):
    result, _, _, _ = _verdict(D, _write(tmp_path, D, _spec(joint=HOLDS)))
    assert result.rule == "a" and result.text.startswith("No verdict: `joint` was not detectably below")


def test_an_unmatched_placebo_is_not_interpreted(D, tmp_path):
    B, _ = D
    root = _write(tmp_path, D, _spec(), cap_bound=20)  # the cap bound on 20 % of the steps
    text = B.coadaptation_verdict(root)
    assert "matched in 0 of 8 seeds only" in text and "not interpreted" in text
    table = B.coadaptation_placebo(root)
    assert "| 20 | 100 | 20 (20.0 %) |" in table and "in 0 of 8 seeds" in table
    # the summary the prose leans on: the cap bound on 20 of 100 steps, where half the target was removed (0.9 in all),
    # and the MLP path (2.0 at the median step) carried more than attention's (1.0)
    assert table.endswith("Over these 8 seeds the cap bound on 20.0 % of the steps, the placebo removed 90.0 % of the "
                          "target summed over the run, and the MLP paths' median norm was below attention's path's "
                          "in 0 of 8.")
    assert "in 8 of 8 seeds" in B.coadaptation_placebo(_write(tmp_path / "ok", D, _spec()))


def test_the_placebo_is_read_only_from_a_cap_log_of_its_own_seeds(D, tmp_path):
    # as many cap rows as placebo seeds, but one of them for a seed with no committed run: seed 20's match is unknown
    B, C = D
    root = _write(tmp_path, D, _spec())
    path = root / "study" / "results" / "coadaptation2" / C.FILE
    cap = pd.read_csv(path)
    cap.loc[cap.seed == 20, "seed"] = 99
    cap.to_csv(path, index=False)
    text = B.coadaptation_verdict(root)
    assert "summarised for 7 of its 8 seeds" in text and "not interpreted" in text
    table = B.coadaptation_placebo(root)
    assert "| 99 |" not in table and "in 7 of 7 seeds" in table  # the table shows what R7 reads


# --- the ends in fp32 (R8) ---------------------------------------------------------------------------------------
def _write_fp32(root: Path, spec: dict, seeds=SEEDS, precision: str = "fp32", rng_seed: int = 1) -> Path:
    """study/results/coadaptation2_fp32/: the two ends' runs, each recording ``precision``."""
    grid = _grid(spec, seeds, rng_seed)
    grid.runs["precision"] = precision
    write_grid(grid, root / "study" / "results" / "coadaptation2_fp32")
    return root


def test_the_ends_are_re_measured_in_fp32_only_when_fp32_separates_them_too(D, tmp_path):
    B, _ = D
    root = _write_fp32(_write(tmp_path, D, _spec()), {"joint": HARMS, "stopgrad-rnn0": HOLDS})
    r = B.precision_reading(root)
    assert r.reading == "re-measured" and r.comparison.direction == "below" and r.comparison.family == 1
    text = B.coadaptation_fp32(root)
    # the twin reuses the bf16 seeds: a re-measurement, never called a confirmation or a replication of it
    assert "**Re-measured in fp32 on the same seeds (not a replication)" in text and "Provisional" not in text
    assert "A replication on fresh fp32 seeds, which the bf16 grid never used, has not been run." in text
    assert "Confirmed in both precisions" not in text and "it re-measures the bf16 result" in text
    assert text.startswith("| seed | `joint` bf16 | `joint` fp32 | `stopgrad-rnn0` bf16 | `stopgrad-rnn0` fp32 |")
    # fp32 runs whose cut holds no better than joint: not confirmed, and not said to differ between precisions
    same = _write_fp32(_write(tmp_path / "same", D, _spec()), {"joint": HARMS, "stopgrad-rnn0": HARMS})
    r = B.precision_reading(same)
    assert r.reading == "not confirmed" and r.text.endswith("no difference detected.")
    # the reverse in fp32 is named as such
    rev = _write_fp32(_write(tmp_path / "rev", D, _spec()), {"joint": HOLDS, "stopgrad-rnn0": HARMS})
    r = B.precision_reading(rev)
    assert r.reading == "not confirmed" and r.comparison.direction == "above" and "the reverse" in r.text
    # bf16 ends that do not separate leave nothing to confirm, whatever fp32 shows
    flat = _write_fp32(_write(tmp_path / "flat", D, _spec(joint=HOLDS)), {"joint": HARMS, "stopgrad-rnn0": HOLDS})
    assert B.precision_reading(flat).reading == "not read"


def test_fp32_ends_too_few_to_test_are_pending_and_provisional(D, tmp_path):
    B, _ = D
    root = _write_fp32(_write(tmp_path, D, _spec()), {"joint": HARMS, "stopgrad-rnn0": HOLDS}, seeds=SEEDS[:3])
    r = B.precision_reading(root)
    assert r.reading == "pending" and not r.comparison.testable and "3 vs 3 fp32 seeds cannot reach" in r.text
    text = B.coadaptation_fp32(root)
    assert "Provisional (16 of the 16 bf16 runs of the ends committed; 6 of the 16 fp32 runs" in text
    # 4 vs 4 is the smallest design a single test can decide (exact p at least 2/70)
    four = _write_fp32(_write(tmp_path / "four", D, _spec()), {"joint": HARMS, "stopgrad-rnn0": HOLDS},
                       seeds=SEEDS[:4])
    assert B.precision_reading(four).reading == "re-measured"
    # a reading on half the twin is labelled as such, never shown as the final one
    text = B.coadaptation_fp32(four)
    assert "Provisional (16 of the 16 bf16 runs of the ends committed; 8 of the 16 fp32 runs" in text


def test_runs_that_did_not_record_fp32_are_not_counted_as_fp32(D, tmp_path):
    """The broken method this catches: a twin whose runs fell back to bf16 (``train.precision=auto`` on a CPU with
    bf16 kernels, or a resume there) would confirm bf16 with bf16. Such runs are named and left out."""
    B, _ = D
    root = _write_fp32(_write(tmp_path, D, _spec()), {"joint": HARMS, "stopgrad-rnn0": HOLDS}, precision="bf16")
    r = B.precision_reading(root)
    assert r.reading == "pending" and "an end has no committed fp32 run" in r.text
    assert "Left out, not recorded as fp32: `joint` seed 20 (bf16)" in B.coadaptation_fp32(root)
    # a run resumed in another precision names both: it is not an fp32 run either (a filter that looked for "fp32"
    # anywhere in the record would count it)
    mixed = "bf16 (from step 0), fp32 (from step 2500)"
    root = _write_fp32(_write(tmp_path / "mixed", D, _spec()), {"joint": HARMS, "stopgrad-rnn0": HOLDS},
                       precision=mixed)
    assert B.precision_reading(root).reading == "pending"
    assert f"`stopgrad-rnn0` seed 27 ({mixed})" in B.coadaptation_fp32(root)


def test_the_front_page_paragraph_quotes_the_blocks_numbers_and_each_seed_that_fails(D, tmp_path):
    """study/README.md's paragraph: the ends with the cut's failing seed named, random-path against both ends and its
    fit, the verdict with its state, frozen-copy's seeds that hold to 16x, the placebo's match and the fp32 twin."""
    B, _ = D
    cut = [0.99] * 7 + [0.61]
    frozen = [1.0, 0.6, 0.6, 1.0, 0.6, 0.6, 0.6, 0.6]  # (8x, 16x] sits 5 points lower: seeds 20 and 23 at 95 %
    root = _write(tmp_path, D, _spec(random_path=HARMS, stopgrad_rnn0=cut, frozen_copy=frozen))
    text = B.coadaptation_readme(root)
    assert text.startswith("- *The controls for `frozen-copy`* (`coadaptation2`, seeds 20–27, bf16; 64 of its 64 runs")
    assert "is at 95 % or more in 7 of 8 seeds (the others: seed 27 at 61.0 %)" in text
    assert "`joint` against it is detectably below (" in text
    assert "The verdict (rule R6 (b), complete): **Co-adaptation untested by these controls" in text
    assert "holds to 16x (state in (8x, 16x] at 95 % or more) in 2 of 8 seeds (20, 23)." in text
    assert "Rerun with its cap logged, `placebo` (norm matched in 8 of 8 seeds) harms" in text
    assert "Over these 8 seeds the cap bound on 2.0 % of the steps" in text
    assert text.endswith("In fp32 (rule R8): its twin (`coadaptation2_fp32`) is not yet run.")
    # part-way, the state says so; with the fp32 twin in, its reading replaces the sentence
    part = B.coadaptation_readme(_write(tmp_path / "part", D, _spec(), seeds=SEEDS[:6]))
    assert "48 of its 64 runs committed" in part and "(rule R6 (e), provisional)" in part
    both = _write_fp32(_write(tmp_path / "both", D, _spec()), {"joint": HARMS, "stopgrad-rnn0": HOLDS})
    assert "In fp32 (rule R8): Re-measured in fp32 on the same seeds (not a replication)" in B.coadaptation_readme(both)
    # half the twin: its reading is labelled provisional here as in the fp32 block
    half = _write_fp32(_write(tmp_path / "half", D, _spec()), {"joint": HARMS, "stopgrad-rnn0": HOLDS},
                       seeds=SEEDS[:4])
    assert ("In fp32 (rule R8): Provisional (16 of the 16 bf16 runs of the ends committed; 8 of the 16 fp32 runs of "
            "the ends committed): Re-measured in fp32 on the same seeds") in B.coadaptation_readme(half)
    # every p it quotes names its family and design, as study/tests/test_reachable_p.py asks of a rendered sentence
    spec = importlib.util.spec_from_file_location("reachable_p", Path(__file__).with_name("test_reachable_p.py"))
    reachable = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reachable)
    for root in (tmp_path, both, half):
        readme = f"<!-- render:r -->\n{B.coadaptation_readme(root)}\n<!-- /render:r -->\n"
        fp32 = f"<!-- render:f -->\n{B.coadaptation_fp32(root)}\n<!-- /render:f -->\n"
        assert reachable.violations(readme) == [] and reachable.violations(fp32) == []
    # a cap log short of a seed R7 reads: the placebo is not interpreted, and no summary over part of its seeds
    short = _write(tmp_path / "short", D, _spec())
    path = short / "study" / "results" / "coadaptation2" / "placebo_cap.csv"
    pd.read_csv(path).query("seed != 20").to_csv(path, index=False)
    text = B.coadaptation_readme(short)
    assert "summarised for 7 of its 8 seeds" in text and "Over these" not in text


# --- what the doc shows -------------------------------------------------------------------------------------------
def test_the_tables_show_fit_and_windows_per_variant_and_every_p_with_its_design(D, tmp_path):
    B, _ = D
    root = _write(tmp_path, D, _spec())
    table = B.coadaptation_variants(root)
    row = next(line for line in table.splitlines() if line.startswith("| `frozen-copy`"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # state at 1x below 97 %, the last step's loss (not the earlier, ten times larger one)
    assert cells[1] == "8" and float(cells[2].split()[0]) < 97 and 0.008 < float(cells[3].split()[0]) < 0.01
    assert float(cells[4].split()[0]) < 65  # (2x, 4x]: the cliff
    from test_reachable_p import violations

    assert violations(B.coadaptation_compare(root)) == []
    assert "Holm family of 14" in B.coadaptation_compare(root) and "Holm family of 12" in B.coadaptation_compare(root)
    assert "| `frozen-copy` | 8 | fails to fit |" in B.coadaptation_readings(root)


def test_the_variants_table_says_what_precision_the_runs_trained_in(D, tmp_path):
    """A grid that spans sessions can resume on a CPU where ``train.precision=auto`` resolves otherwise: the block
    says so, naming the runs, instead of letting mixed runs pass for one precision's."""
    B, _ = D
    grid = _grid(_spec())
    out = tmp_path / "study" / "results" / "coadaptation2"
    grid.runs["precision"] = "bf16"
    write_grid(grid, out)
    assert (f"Trained in bf16: all {len(grid.runs)} runs, as their checkpoints record. Where the runs trained is "
            f"not recorded ({len(grid.runs)} runs).") in B.coadaptation_variants(tmp_path)
    mixed = "bf16 (from step 0), fp32 (from step 2750)"
    grid.runs.loc[grid.runs.seed >= 26, "precision"] = "fp32"
    grid.runs.loc[(grid.runs.variant == "random-path") & (grid.runs.seed == 25), "precision"] = mixed
    write_grid(grid, out)
    text = B.coadaptation_variants(tmp_path)
    n = grid.runs.variant.nunique()
    assert f". {mixed} in 1 (`random-path` seed 25)." in text
    assert (f"bf16 in {6 * n - 1} (`frozen-copy` seeds 20, 21, 22, 23, 24, 25; " in text
            and "`random-path` seeds 20, 21, 22, 23, 24; " in text)
    assert f"fp32 in {2 * n} (`frozen-copy` seeds 26, 27; " in text
    # a run folder without final.pt reports its config's request, not what ran: not a record
    grid.runs["precision"] = "auto"
    write_grid(grid, out)
    assert f"The runs' precision is not recorded ({len(grid.runs)} runs)." in B.coadaptation_variants(tmp_path)


def test_the_variants_table_says_on_which_devices_the_runs_trained(D, tmp_path):
    """bf16 kernels differ between CPUs (AMX, avx512_bf16): a grid that spans sessions on different CPUs names each
    with its runs, instead of one device passing for all."""
    B, _ = D
    grid = _grid(_spec())
    out = tmp_path / "study" / "results" / "coadaptation2"
    xeon, epyc = "cpu (Intel(R) Xeon(R) Processor, native bf16)", "cpu (AMD EPYC, native bf16)"
    grid.runs["trained_on"] = xeon
    write_grid(grid, out)
    assert B.coadaptation_variants(tmp_path).endswith(f"Trained on one device, {xeon}: all {len(grid.runs)} runs.")
    grid.runs.loc[grid.runs.seed >= 21, "trained_on"] = epyc
    grid.runs.loc[(grid.runs.variant == "joint") & (grid.runs.seed == 21), "trained_on"] = xeon
    write_grid(grid, out)
    n = grid.runs.variant.nunique()
    text = B.coadaptation_variants(tmp_path)
    later = ", ".join(str(s) for s in sorted(set(grid.runs.seed)) if s >= 21)
    assert text.endswith(f"Trained on 2 devices, as the runs record: {epyc}: {len(grid.runs) - n - 1} runs (seeds "
                         f"{later}); {xeon}: {n + 1} runs (seeds 20, 21).")


def test_not_run_yet_renders_a_command_not_a_number(D, tmp_path):
    B, _ = D
    for name, block in B.BLOCKS.items():
        text = block(tmp_path)
        assert text.startswith("Not run yet") and not re.search(r"\d\.\d", text), name


def test_the_rules_in_the_docs_are_the_modules_verbatim(D):
    B, _ = D
    doc = re.sub(r"\s+", " ", (ROOT / "study" / "docs" / "mechanism.md").read_text())
    rules = B.rules()
    assert [r.split(".")[0] for r in rules] == [f"R{i}" for i in range(1, 9)]
    missing = [r[:60] for r in rules if r not in doc]
    assert not missing, f"study/docs/mechanism.md does not state these rules as the module does: {missing}"


# --- the placebo's cap, from a real run -----------------------------------------------------------------------------
def _placebo_run(folder: Path, mlp_scale: float) -> list[dict]:
    # the library's tests' tiny run (tests/test_train.py), built here: the study's tests do not import the library's
    from probe.evaluate import evaluate_checkpoints, evaluate_windows, evaluation_envelope
    from probe.models import ModelConfig
    from probe.schedules.settings import VARIANTS, ScheduleConfig
    from probe.tasks import make_task
    from probe.training.trainer import TrainConfig, Trainer

    task = make_task("interleaved", train_length=6)
    model = ModelConfig(family="hybrid", vocab_size=task.vocab_size, d_model=16, n_layers=2, n_heads=2)
    cfg = TrainConfig(steps=6, batch_size=8, eval_every=3, eval_samples=16, ckpt_every=6, traj_every=6, lr=3e-3,
                      warmup=5, schedule=ScheduleConfig(**VARIANTS["placebo"]))
    trainer = Trainer(model, task, cfg, folder, progress=False)
    with torch.no_grad():
        for b in trainer.model.blocks:
            for p in b.mlp.parameters():
                p.mul_(mlp_scale)
    trainer.run()
    final = folder / "final.pt"
    curves = evaluate_checkpoints([final], [6, 12], 8)
    windows = evaluate_windows([final], 24, 8)
    (folder / "eval.json").write_text(json.dumps(evaluation_envelope(curves, [final], windows)))
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_the_cap_summary_of_a_real_placebo_run_through_collect(D, tmp_path):
    """Six steps of the placebo on a tiny model, once as it is and once with the MLPs' output shrunk so that their
    path holds less than attention's: the summary counts the steps the cap bound (recomputed here from the two
    norms, not from the logged flag) and the removed share; collect keeps the per-step lines out of training.csv."""
    _, C = D
    runs = tmp_path / "runs"
    logs = {seed: _placebo_run(runs / "placebo" / f"seed{seed}", scale) for seed, scale in ((0, 1.0), (1, 1e-3))}
    for lines in logs.values():
        steps = [r for r in lines if "placebo_attention_norm" in r]
        att = np.array([r["placebo_attention_norm"] for r in steps])
        mlp = np.array([r["placebo_mlp_norm"] for r in steps])
        got = C.summarize(lines)
        assert got["steps"] == 6 and got["bound_steps"] == int((att > mlp).sum())
        ratio = np.minimum(att, mlp) / att
        assert got["ratio_median"] == pytest.approx(np.median(ratio), rel=1e-4)
        assert got["ratio_min"] == pytest.approx(ratio.min(), rel=1e-4)
        assert got["ratio_total"] == pytest.approx(np.minimum(att, mlp).sum() / att.sum(), rel=1e-4)
    shrunk = C.summarize(logs[1])
    assert shrunk["bound_steps"] == 6 and shrunk["bound_steps_early"] == 6 and shrunk["ratio_total"] < 0.05
    assert shrunk["scale_median"] == 1.0  # all of the MLP path removed, and still short of the target

    out = tmp_path / "results"
    import_runs(runs, out)
    assert C.main([str(runs), str(out)]) == 0
    training = pd.read_csv(out / "training.csv")
    assert len(training) == 2 * 2 and training.loss.notna().all()  # two evaluations a run, no per-step line
    cap = pd.read_csv(out / C.FILE)
    assert list(cap.seed) == [0, 1] and list(cap.columns) == C.COLUMNS
    assert cap.set_index("seed").loc[1, "bound_steps"] == 6
    # a later collect of part of the grid keeps the rows of the runs it no longer sees
    (runs / "placebo" / "seed0" / "eval.json").unlink()
    assert C.main([str(runs), str(out)]) == 0
    assert list(pd.read_csv(out / C.FILE).seed) == [0, 1]
