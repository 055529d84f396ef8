"""The compact form of a grid (probe.results): smaller on disk, and the same grid when read back."""

from __future__ import annotations

from fractions import Fraction

import pandas as pd
import pytest

from probe.results import Grid, _score, _significant, grid_texts, load_grid, run_summary, write_grid

LT = 4  # L_train of the synthetic runs: lengths 4, 8, 12 are 1x, 2x, 3x
THRESHOLDS = (Fraction(1, 4), Fraction(9, 10), Fraction(19, 20), Fraction(99, 100))
"""Every threshold a claim or a doc judges an accuracy against: at chance (below 25 %), the cliff and SOLVED (90 %),
holds (95 %), the recipe's target and parity kept (99 %)."""


def _nearest(t: Fraction, n: int) -> tuple[int, int]:
    """The counts c of the ratios c / n nearest ``t`` from below and from above, neither equal to it."""
    exact = t.numerator * n
    return -(-exact // t.denominator) - 1, exact // t.denominator + 1


def _stays_on_its_side(t: Fraction, n: int, digits: int = 6) -> bool:
    below, above = _nearest(t, n)
    return _significant(below / n, digits) < t < _significant(above / n, digits)


def test_six_digits_keep_a_threshold_p_over_q_only_while_n_times_q_is_below_two_million():
    # the gap between c / n and p / q (when not equal) is at least 1 / (n q), and 6 digits move a ratio in [0.1, 1)
    # by at most 5e-7: safe while n q <= 2e6. Checked on the rounding itself where the gaps are narrowest, the
    # largest n under that bound ...
    for t in THRESHOLDS:
        bound = 2_000_000 // t.denominator
        assert all(_stays_on_its_side(t, n) for n in range(bound - 5_000, bound + 1)), t
    # ... and not beyond it: "counts below 1e6 keep every threshold" is false at 6 digits. 20 001 answers at 99 %
    # is below the windows' 41 000 and the curves' 102 400, so the loader restores exact values (next test)
    first = [next(n for n in range(2_000_000 // t.denominator, 10**6) if not _stays_on_its_side(t, n))
             for t in THRESHOLDS]
    assert first == [500_001, 200_009, 100_001, 20_001]
    assert all(_stays_on_its_side(t, n, digits=8) for t, n in zip(THRESHOLDS, first, strict=True))


def _grid(counts: dict[str, dict[int, tuple[int, int, int]]], samples: int = 8, all_is_sum: bool = True) -> Grid:
    """A grid from answer counts: per run ``{length: (state asked, state right, recall right)}``, every position an
    answer (recall asked = samples x length - state asked); "all" is their sum unless ``all_is_sum`` is False (then
    one answer more is asked of it, as in a task whose "all" counts something else too)."""
    curves, runs = [], []
    for run, by_length in counts.items():
        variant, seed = run.split("/seed")
        rows = []
        for length, (n_state, c_state, c_recall) in by_length.items():
            n_recall = samples * length - n_state
            n_all, c_all = n_state + n_recall + (not all_is_sum), c_state + c_recall
            for subtask, n, c in (("state", n_state, c_state), ("recall", n_recall, c_recall),
                                  ("all", n_all, c_all), ("state_mod2", n_state, min(n_state, c_state + 1))):
                rows.append({"variant": variant, "run": run, "seed": int(seed), "label": "x", "train_length": LT,
                             "length": length, "subtask": subtask, "token_acc": c / n, "seq_acc": (c == n) / 1,
                             "n_tokens": n, "checkpoint": f"{run}/final.pt"})
        curve = pd.DataFrame(rows)
        meta = {"label": "x", "train_length": LT, "steps": 10, "wall_s": 1.5}
        runs.append(run_summary(variant, int(seed), curve, _score(curve, LT), meta))
        curves.append(curve)
    return Grid("g", pd.DataFrame(runs), pd.concat(curves, ignore_index=True))


def _same(a: Grid, b: Grid) -> None:
    pd.testing.assert_frame_equal(a.runs, b.runs, check_exact=True)
    pd.testing.assert_frame_equal(a.curves, b.curves, check_exact=True)


def test_a_summary_rounded_onto_a_threshold_reads_back_exact_and_keeps_its_verdict(tmp_path):
    # 19 801 of 20 001 right is above 99 % by 5e-7: 6 digits write it as 0.99, which ">" would no longer pass
    n = 20_001
    grid = _grid({"a/seed0": {4: (n, 19_801, 0), 8: (n, n, 0), 12: (n, 31, 0)}}, samples=6_000)
    exact = grid.runs.state_acc_1x[0]
    assert exact > 0.99 and _significant(exact, 6) == 0.99  # the premise: rounding alone would land on 0.99
    write_grid(grid, tmp_path)
    assert '"state_acc_1x":0.99,' in (tmp_path / "runs.jsonl").read_text()  # the file, for its reader, rounded
    back = load_grid(tmp_path)
    assert back.runs.state_acc_1x[0] == exact and back.runs.state_acc_1x[0] > 0.99  # the loader, exact
    _same(grid, back)
    assert grid_texts(back) == grid_texts(grid)  # a second pass writes the same files
    from probe.evaluate import lengthgen_score

    # the scores are restored by the loader's copy of the evaluation's score: the two must agree bit for bit
    assert _score(grid.curves, LT) == lengthgen_score(grid.curves, LT)


def test_a_summary_value_the_counts_do_not_give_stays_as_written(tmp_path):
    # the loader restores only the value a rounding came from: one edited by hand is read as it stands
    write_grid(_grid({"a/seed0": {4: (20, 19, 12), 8: (40, 33, 24), 12: (60, 41, 36)}}), tmp_path)
    text = (tmp_path / "runs.jsonl").read_text()
    assert '"state_acc_2x":0.825,' in text
    (tmp_path / "runs.jsonl").write_text(text.replace('"state_acc_2x":0.825,', '"state_acc_2x":0.5,'))
    assert load_grid(tmp_path).runs.state_acc_2x[0] == 0.5


@pytest.mark.parametrize("all_is_sum", [True, False])
def test_curves_leave_out_only_the_columns_that_are_sums_on_every_line(tmp_path, all_is_sum):
    grid = _grid({"a/seed0": {4: (20, 19, 12), 8: (40, 33, 24), 12: (60, 41, 36)},
                  "b/seed1": {4: (20, 20, 12), 8: (40, 40, 24), 12: (60, 2, 0)}}, all_is_sum=all_is_sum)
    write_grid(grid, tmp_path)
    header = (tmp_path / "curves.csv").read_text().splitlines()[0].split(",")
    assert ("all_n" in header) is not all_is_sum  # the one column that is not the sum when all_is_sum is False
    assert "all_correct" not in header and "state_mod2_n" not in header and "state_mod2_correct" in header
    assert {"state_n", "recall_n", "state_correct", "recall_correct", "all_seq"} <= set(header)
    _same(grid, load_grid(tmp_path))
