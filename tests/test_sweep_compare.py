"""Seed-level statistics against slow obvious oracles and scipy, and variant comparisons (the committed mechanism
table is recomputed in study/tests/test_mechanism_table.py)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from probe.core.stats import (
    Interval,
    benjamini_hochberg,
    describe_difference,
    fraction_above,
    holm,
    paired_interval,
    permutation_p,
    permutation_p_min,
    sign_flip_p,
    sign_flip_p_min,
    t_interval,
    welch_interval,
)
from probe.errors import ProbeError
from probe.sweep.compare import (
    compare,
    compare_target,
    comparison_table,
    meets_target,
    newcombe_interval,
    parse_compare,
    parse_target,
    plot_seed_dots,
    target_table,
)

accuracies = st.floats(0, 1, allow_nan=False).map(lambda x: round(x, 3))  # ties happen, as at 100 %


def curves(values: dict[str, list[float]], length: int = 75, train_length: int = 25) -> pd.DataFrame:
    rows = [{"variant": v, "seed": s, "subtask": "state", "length": length, "train_length": train_length,
             "token_acc": a} for v, accs in values.items() for s, a in enumerate(accs)]
    return pd.DataFrame(rows)


# --- oracles: the definitions, written out as slowly and plainly as possible ------------------------------------------
def brute_permutation_p(a: list[float], b: list[float]) -> float:
    """Every relabeling, one at a time: twice the smaller tail of the difference of means."""
    pooled, k = list(a) + list(b), len(a)
    observed = sum(a) / len(a) - sum(b) / len(b)
    up = down = total = 0
    for idx in itertools.combinations(range(len(pooled)), k):
        x = [pooled[i] for i in idx]
        y = [pooled[i] for i in range(len(pooled)) if i not in idx]
        d = sum(x) / len(x) - sum(y) / len(y)
        up += d >= observed - 1e-9
        down += d <= observed + 1e-9
        total += 1
    return min(1.0, 2 * min(up, down) / total)


def brute_sign_flip_p(d: list[float]) -> float:
    observed = sum(d) / len(d)
    means = [sum(s * x for s, x in zip(signs, d, strict=True)) / len(d)
             for signs in itertools.product((1, -1), repeat=len(d))]
    up = sum(m >= observed - 1e-9 for m in means)
    down = sum(m <= observed + 1e-9 for m in means)
    return min(1.0, 2 * min(up, down) / len(means))


def holm_rejects(p: list[float], alpha: float) -> set[int]:
    """Holm's step-down procedure at level alpha, as the textbook states it."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    rejected = set()
    for rank, i in enumerate(order):
        if p[i] > alpha / (len(p) - rank):
            break
        rejected.add(i)
    return rejected


def scipy_two_sided(a, b) -> float:
    res = stats.permutation_test((np.asarray(a), np.asarray(b)),
                                 lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis),
                                 permutation_type="independent", n_resamples=np.inf, vectorized=True)
    return float(res.pvalue)


# --- permutation tests ------------------------------------------------------------------------------------------------
@given(st.lists(accuracies, min_size=1, max_size=5), st.lists(accuracies, min_size=1, max_size=5))
def test_permutation_p_is_the_brute_force_enumeration_and_never_below_its_minimum(a, b):
    p = permutation_p(a, b)
    assert p == pytest.approx(brute_permutation_p(a, b), abs=1e-12)
    assert permutation_p_min(len(a), len(b)) - 1e-12 <= p <= 1.0


@pytest.mark.parametrize("a,b", [([0.99, 1.0, 0.988], [0.818, 0.798, 0.666, 0.7, 0.72]),
                                 ([0.62, 0.73, 0.76], [0.99, 0.998, 0.55, 0.9, 0.97]),
                                 ([0.1, 0.5, 0.2, 0.4], [0.3, 0.35])])
def test_permutation_p_agrees_with_scipy_permutation_test(a, b):
    assert permutation_p(a, b) == pytest.approx(scipy_two_sided(a, b), rel=1e-9)


def test_minimum_p_for_3_vs_5_seeds_is_2_over_56_and_is_attained():
    # fully separated groups are the most extreme relabeling; an unequal split has no mirror image of equal |diff|,
    # and doubling the smaller tail is what keeps p from falling to 1/56 (the bug: p 0.018 beside a "minimum" 0.036)
    assert permutation_p_min(3, 5) == pytest.approx(2 / 56)
    assert permutation_p([0.99, 1.0, 0.988], [0.818, 0.798, 0.666, 0.7, 0.72]) == pytest.approx(2 / 56)
    assert permutation_p_min(5, 5) == pytest.approx(2 / 252)
    assert permutation_p([0.99, 0.98, 1.0, 0.97, 0.99], [0.6, 0.7, 0.5, 0.8, 0.65]) == pytest.approx(2 / 252)
    assert permutation_p([0.99, 0.6, 0.98, 0.7, 0.5], [0.5, 0.98, 0.7, 0.99, 0.6]) == 1.0  # same values: no signal


def test_permutation_p_beyond_the_exact_limit_uses_a_seeded_sample_close_to_exact(monkeypatch):
    import probe.core.stats as s

    a, b = [0.9, 0.95, 0.97, 0.8, 0.99, 0.85], [0.6, 0.7, 0.9, 0.65, 0.75, 0.8]
    exact = permutation_p(a, b)
    monkeypatch.setattr(s, "EXACT_LIMIT", 10)
    sampled = permutation_p(a, b)
    assert sampled == permutation_p(a, b)  # reproducible
    assert abs(sampled - exact) < 0.01 and sampled > 0


@given(st.lists(st.floats(-1, 1, allow_nan=False).map(lambda x: round(x, 3)), min_size=1, max_size=8))
def test_sign_flip_p_is_the_brute_force_enumeration(d):
    p = sign_flip_p(d)
    assert p == pytest.approx(brute_sign_flip_p(d), abs=1e-12)
    assert p >= sign_flip_p_min(len(d)) - 1e-12


def test_sign_flip_p_agrees_with_scipy_and_its_minimum_for_5_pairs_is_1_16th():
    d = np.array([-0.015, 0.025, -0.038, -0.019, -0.012])
    ref = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf).pvalue
    assert sign_flip_p(d) == pytest.approx(ref)
    assert sign_flip_p_min(5) == 0.0625 and sign_flip_p([0.1, 0.2, 0.3, 0.1, 0.2]) == 0.0625


# --- intervals --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", [[0.7, 0.8, 0.9], [0.963, 0.656, 0.592, 0.907, 0.700], [1.0, 0.99, 0.98, 0.97]])
def test_t_interval_is_scipys_and_inverts_the_one_sample_t_test(x):
    ci = t_interval(x)
    ref = stats.ttest_1samp(x, 0).confidence_interval(0.95)
    assert (ci.low, ci.high) == pytest.approx((ref.low, ref.high)) and ci.estimate == pytest.approx(np.mean(x))
    # the bounds are exactly the means the t test rejects at 5 %
    assert stats.ttest_1samp(x, ci.low).pvalue == pytest.approx(0.05)
    assert stats.ttest_1samp(x, ci.high).pvalue == pytest.approx(0.05)


def test_t_interval_edge_cases_say_what_n_allows():
    one = t_interval([0.5])
    assert one.estimate == 0.5 and math.isnan(one.low) and not one.finite
    same = t_interval([1.0, 1.0, 1.0])
    assert (same.low, same.high) == (1.0, 1.0)
    assert t_interval([0.5, float("nan"), 0.7]).n == 2  # a seed without the value is left out, not zero


def test_t_interval_holds_its_level_at_3_seeds_where_the_percentile_bootstrap_does_not():
    # The reason for the switch: with 3 seeds a percentile bootstrap interval lies within [min, max] and covers
    # the true mean far less often than 95 %.
    rng = np.random.default_rng(0)
    data = rng.normal(0.0, 1.0, size=(4000, 3))
    t_cover = np.mean([(ci := t_interval(x)).low <= 0 <= ci.high for x in data])
    boot = data[:, rng.integers(0, 3, size=(999, 3))].mean(axis=2)  # (datasets, resamples)
    lo, hi = np.quantile(boot, [0.025, 0.975], axis=1)
    boot_cover = np.mean((lo <= 0) & (0 <= hi))
    assert 0.93 <= t_cover <= 0.97
    assert boot_cover < 0.80


@pytest.mark.parametrize("a,b", [([0.995, 0.99, 1.0], [0.9, 0.6, 0.65, 0.92, 0.7]), ([0.5, 0.6], [0.4, 0.45, 0.41])])
def test_welch_interval_is_scipys_unequal_variance_t_interval(a, b):
    ci = welch_interval(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (ci.low, ci.high) == pytest.approx((ref.low, ref.high))
    assert ci.estimate == pytest.approx(np.mean(a) - np.mean(b))
    shifted = np.asarray(a) - ci.low  # the lower bound is the shift the Welch test rejects at exactly 5 %
    assert stats.ttest_ind(shifted, b, equal_var=False).pvalue == pytest.approx(0.05)
    assert not welch_interval([0.5], b).finite


def test_paired_interval_is_the_t_interval_of_the_differences():
    a, b = [0.963, 0.656, 0.592, 0.907, 0.700], [0.978, 0.631, 0.630, 0.926, 0.712]
    ref = stats.ttest_rel(a, b).confidence_interval(0.95)
    ci = paired_interval(a, b)
    assert (ci.low, ci.high) == pytest.approx((ref.low, ref.high))
    with pytest.raises(ValueError):
        paired_interval([1, 2], [1])


# --- multiplicity -----------------------------------------------------------------------------------------------------
@given(st.lists(st.floats(0.0001, 1, allow_nan=False).map(lambda x: round(x, 4)), min_size=1, max_size=8))
def test_holm_adjusted_p_is_the_smallest_level_at_which_the_step_down_rejects(p):
    adjusted = holm(p)
    for i in range(len(p)):
        if adjusted[i] < 1:
            assert i in holm_rejects(p, adjusted[i] * (1 + 1e-9))
            assert i not in holm_rejects(p, adjusted[i] * (1 - 1e-6))
        else:  # capped: no level below 1 rejects it
            assert i not in holm_rejects(p, 1 - 1e-9)
    assert np.all(adjusted >= np.asarray(p) - 1e-15) and np.all(adjusted <= 1)


@given(st.lists(st.floats(0.0001, 1, allow_nan=False), min_size=1, max_size=10))
def test_bh_is_scipys_false_discovery_control(p):
    assert benjamini_hochberg(p) == pytest.approx(stats.false_discovery_control(p))


def test_a_registered_family_adjusts_over_its_size_with_the_tests_not_run_at_p_1():
    # two tests run of a registered family of 4: Holm multiplies the smallest by 4, not by 2 (a family read part-way
    # adjusted over the tests it has so far would reject here: 0.02 x 2 < 0.05)
    assert holm([0.02, float("nan"), 0.03], family=4) == pytest.approx([0.08, math.nan, 0.09], nan_ok=True)
    assert holm([0.02, 0.03]) == pytest.approx([0.04, 0.04])
    assert benjamini_hochberg([0.02, 0.03], family=4) == pytest.approx(
        stats.false_discovery_control([0.02, 0.03, 1, 1])[:2])
    assert holm([0.02, 0.03], family=2) == pytest.approx(holm([0.02, 0.03]))
    with pytest.raises(ValueError, match="family=1"):
        holm([0.02, 0.03], family=1)
    with pytest.raises(ValueError, match="whole number"):
        holm([0.02], family=2.5)


def test_adjustments_skip_missing_p_values():
    adj = holm([0.01, float("nan"), 0.04])
    assert math.isnan(adj[1]) and adj[0] == pytest.approx(0.02) and adj[2] == pytest.approx(0.04)
    assert math.isnan(benjamini_hochberg([float("nan")])[0])


def test_a_non_significant_difference_is_never_called_equal():
    ci = Interval(-0.003, -0.216, 0.210, 3)
    text = describe_difference(ci, 1.0)
    assert text == "no difference detected, difference CI [-21.6, +21.0]" and "=" not in text
    assert describe_difference(Interval(0.232, 0.03, 0.434, 5), 0.008) == "+23.2 [+3.0, +43.4]"
    assert fraction_above([0.95, 0.9, 0.91, float("nan")], 0.9) == (2, 3)


# --- comparisons ------------------------------------------------------------------------------------------------------
def test_compare_reports_difference_interval_p_minimum_and_adjusted_p():
    joint, dat, stopgrad = [0.6, 0.7, 0.5, 0.65, 0.55, 0.62], [1.0, 0.99, 1.0, 0.98, 1.0, 0.99], \
        [0.65, 0.55, 0.7, 0.6, 0.58, 0.66]
    c = curves({"joint": joint, "dat": dat, "stopgrad": stopgrad})
    rows = compare(c, ["joint", "dat"])
    row = rows[(rows.variant == "dat") & (rows.baseline == "joint")].iloc[0]
    assert row.difference == pytest.approx(np.mean(dat) - np.mean(joint))
    ref = stats.ttest_ind(dat, joint, equal_var=False).confidence_interval()
    assert (row.difference_ci_low, row.difference_ci_high) == pytest.approx((ref.low, ref.high))
    # 6 vs 6 seeds, every dat seed above every joint seed: the most extreme of C(12, 6) relabelings, two-sided
    assert row.p_permutation == pytest.approx(2 / 924) and row.p_min_attainable == pytest.approx(2 / 924)
    # joint-dat appears twice (once per baseline) but is one test: 3 distinct pairs in the family
    assert set(rows.n_tests) == {3} and set(rows.family) == {3}
    assert row.p_holm == pytest.approx(3 * 2 / 924) and row.verdict.startswith("+")
    sg = rows[(rows.variant == "stopgrad") & (rows.baseline == "joint")].iloc[0]
    assert sg.p_permutation > 0.5 and sg.verdict.startswith("no difference detected, difference CI [")
    table = comparison_table(rows)
    assert "| dat | joint | 6 vs 6 |" in table and "Holm" in table and " = " not in table
    with pytest.raises(ProbeError, match="no such variant"):
        compare(c, ["delayed"])


def test_a_comparison_whose_seeds_cannot_reach_significance_is_descriptive_not_a_test():
    # 3 vs 3 seeds: the smallest exact two-sided p is 2/20 = 0.1, above 0.05 before any adjustment; the
    # difference is as large as it can be, and still no test is run or reported
    c = curves({"joint": [0.6, 0.7, 0.5], "dat": [1.0, 0.99, 1.0]})
    row = compare(c, ["joint"]).iloc[0]
    assert not row.testable and np.isnan(row.p_permutation) and np.isnan(row.p_holm)
    assert row.p_min_attainable == pytest.approx(0.1) and "descriptive" in row.verdict
    assert "no test was run" in comparison_table(compare(c, ["joint"]))


def test_seed_dot_figure_has_a_dot_per_seed():
    c = curves({"joint": [0.6, 0.7], "dat": [1.0, 0.99]})
    summary = pd.DataFrame([{"variant": v, "subtask": "state", "metric": "token_acc", "factor": 3, "mean": m,
                             "ci_low": m - 0.05, "ci_high": m + 0.05} for v, m in (("joint", 0.65), ("dat", 0.995))])
    from matplotlib.collections import PathCollection

    fig = plot_seed_dots(c, summary)
    dots = [coll.get_offsets() for coll in fig.axes[0].collections if type(coll) is PathCollection]
    assert sorted(np.concatenate(dots)[:, 1]) == [0.6, 0.7, 0.99, 1.0]  # one dot per seed, at its value


# --- pairs and targets ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("counts", "published"), [
    # Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10 (score, no continuity correction)
    ((56, 70, 48, 80), (0.0524, 0.3339)), ((9, 10, 3, 10), (0.1705, 0.8090)), ((6, 7, 2, 7), (0.0582, 0.8062)),
    ((5, 56, 0, 29), (-0.0381, 0.1926)), ((0, 10, 0, 20), (-0.1611, 0.2775)), ((10, 10, 0, 20), (0.6791, 1.0))])
def test_newcombe_interval_reproduces_the_published_examples(counts, published):
    assert newcombe_interval(*counts) == pytest.approx(published, abs=1e-4)


def runs_frame(met: dict[str, list[bool]]) -> pd.DataFrame:
    """A runs.jsonl-like frame: a run meets the both-16x target exactly when its flag is set (fails one bound
    at a time otherwise, so each bound is exercised)."""
    rows = []
    for v, flags in met.items():
        for s, ok in enumerate(flags):
            r = {"variant": v, "seed": s, "state_win_2x_4x": 1.0, "recall_win_2x_4x": 1.0,
                 "state_win_8x_16x": 0.97, "recall_win_8x_16x": 0.99}
            if not ok:
                r[list(r)[2 + s % 4]] = 0.94  # below every bound of the both-16x target
            rows.append(r)
    return pd.DataFrame(rows)


def test_target_comparison_counts_seeds_and_tests_only_what_can_reject():
    runs = runs_frame({"a": [True] * 10, "b": [False] * 10, "c": [True] * 4 + [False] * 6,
                       "d": [True, False, True], "e": [False, False, True]})
    rows = compare_target(runs, [("a", "b"), ("c", "b"), ("b", "a"), ("d", "e")], parse_target("both-16x"))
    ab = rows.iloc[0]
    assert (ab.k, ab.n_seeds, ab.k_baseline, ab.n_seeds_baseline) == (10, 10, 0, 10)
    assert ab.p_fisher == pytest.approx(stats.fisher_exact([[10, 0], [0, 10]]).pvalue)
    # a-b met twice is one test: the family is 3 pairs; d-e (3 vs 3 seeds) cannot reach 0.05 and is not run,
    # so Holm adjusts over the 2 tests that were
    assert set(rows.family) == {3} and set(rows.n_tests) == {2} and ab.p_holm == pytest.approx(min(1, 2 * ab.p_fisher))
    assert rows.iloc[2].p_holm == ab.p_holm and "the rates differ" in ab.verdict
    cb = rows.iloc[1]
    assert cb.p_fisher == pytest.approx(stats.fisher_exact([[4, 6], [0, 10]]).pvalue) and cb.p_holm > 0.05
    assert cb.verdict.startswith("4 of 10 against 0 of 10: no difference detected, difference +40 points [")
    de = rows.iloc[3]
    assert not de.testable and np.isnan(de.p_fisher) and "descriptive" in de.verdict and "no test" in de.verdict
    assert de.p_min_attainable == pytest.approx(0.1)
    assert "| a | b | 10/10 vs 0/10 |" in target_table(rows) and " = " not in target_table(rows)


def test_a_run_missing_a_window_is_not_counted_as_failing():
    runs = runs_frame({"a": [True, True], "b": [True, False]})
    runs.loc[0, "state_win_8x_16x"] = np.nan  # evaluated too short for (8x, 16x]
    met = meets_target(runs, parse_target("both-16x"))
    assert met.isna().tolist() == [True, False, False, False] and met.tolist()[1:] == [True, True, False]
    row = compare_target(runs, [("a", "b")], parse_target("both-16x")).iloc[0]
    assert (row.k, row.n_seeds) == (1, 1)


def test_pairs_compare_only_the_pairs_asked_for():
    c = curves({"joint-fp32": [0.6, 0.7], "joint-bf16": [0.5, 0.6], "dat-fp32": [1.0, 0.99], "dat-bf16": [0.97, 0.95]})
    rows = compare(c, [], pairs=[("joint-fp32", "joint-bf16"), ("dat-fp32", "dat-bf16")])
    assert list(zip(rows.variant, rows.baseline, strict=True)) == [("joint-fp32", "joint-bf16"),
                                                                   ("dat-fp32", "dat-bf16")]
    assert set(rows.family) == {2}


def test_a_registered_family_counts_the_pairs_with_no_runs_yet():
    # a grid read part-way: one pair of a family of 3 registered has runs. Adjusted over the 1 pair present, 6 vs 6
    # seeds at the extreme reach 2/924 ~ 0.0022; over the registered 3 (two standing in with p = 1) they reach 3 times
    # that. At 4 vs 4 (min p 2/70 ~ 0.029) the pair is a test alone and descriptive in the registered family.
    joint, dat = [0.6, 0.7, 0.5, 0.65, 0.55, 0.62], [1.0, 0.99, 1.0, 0.98, 1.0, 0.99]
    c = curves({"joint": joint, "dat": dat})
    alone = compare(c, [], pairs=[("dat", "joint")]).iloc[0]
    registered = compare(c, [], pairs=[("dat", "joint")], family=3).iloc[0]
    assert alone.p_holm == pytest.approx(2 / 924) and registered.p_holm == pytest.approx(3 * 2 / 924)
    assert registered.family == 3 and registered.n_tests == 1 and registered.adjusted_over == 3
    assert registered.p_bh == pytest.approx(3 * 2 / 924)  # BH's step-up: the stand-ins at 1 leave rank 1 at 3 p
    # a registered pair present but with too few seeds so far is no test yet: it stands in with p = 1 too, so one
    # untestable seed of another variant never lowers the adjustment below the complete grid's
    one_seed = curves({"joint": joint, "dat": dat, "stopgrad": [0.61]})
    mixed = compare(one_seed, [], pairs=[("dat", "joint"), ("stopgrad", "joint")], family=3)
    assert not mixed.iloc[1].testable and mixed.iloc[0].p_holm == pytest.approx(3 * 2 / 924)
    assert "and 2 registered pairs not run as tests (p = 1 each)" in comparison_table(mixed)
    # without a registered family, a pair that cannot reject is left out of the adjustment (Tarone)
    adhoc = compare(one_seed, [], pairs=[("dat", "joint"), ("stopgrad", "joint")]).iloc[0]
    assert adhoc.p_holm == pytest.approx(2 / 924) and adhoc.adjusted_over == 1
    small = curves({"joint": joint[:4], "dat": dat[:4]})
    assert compare(small, [], pairs=[("dat", "joint")]).iloc[0].testable
    assert not compare(small, [], pairs=[("dat", "joint")], family=3).iloc[0].testable
    with pytest.raises(ProbeError, match="family of 1 cannot hold the 2 pairs"):
        compare(curves({"a": joint, "b": dat, "c": joint}), [], pairs=[("a", "b"), ("c", "b")], family=1)


@pytest.mark.parametrize(("words", "message"), [
    (["joint", "dat:joint"], "not both"), (["dat:"], "two different variants"), (["dat:dat"], "two different"),
    (["a:b:c"], "two different variants")])
def test_bad_compare_words_are_one_line_errors(words, message):
    with pytest.raises(ProbeError, match=message):
        parse_compare(words)


@pytest.mark.parametrize("spec", ["state_win_8x_16x", "state_win_8x_16x>=high", "", ">=0.9"])
def test_bad_targets_are_one_line_errors(spec):
    with pytest.raises(ProbeError, match="--target"):
        parse_target(spec)


def test_targets_parse_both_directions_and_unknown_metrics_are_named():
    assert parse_target("a>=0.9, b<0.25") == [("a", ">=", 0.9), ("b", "<", 0.25)]
    # two bounds on one metric are a range, both kept (a dict kept the last one only)
    runs = pd.DataFrame({"variant": ["v"] * 3, "seed": [0, 1, 2], "x": [0.1, 0.25, 0.5]})
    assert meets_target(runs, parse_target("x>=0.2,x<0.3")).tolist() == [False, True, False]
    with pytest.raises(ProbeError, match="state_win_32x_64x not in the runs' summaries"):
        meets_target(runs_frame({"a": [True]}), parse_target("state_win_32x_64x>=0.9"))


def test_window_figure_has_a_dot_per_seed_and_window_and_each_window_s_chance_floor():
    from matplotlib.collections import LineCollection, PathCollection

    from probe.sweep.aggregate import window_summary
    from probe.sweep.plots import plot_windows

    windows_order = [("in range", 0, 25), ("(1x, 2x]", 25, 50), ("(2x, 4x]", 50, 100)]
    rows = [{"variant": v, "seed": s, "window": w, "lo": lo, "hi": hi, "beyond": lo > 0, "subtask": sub,
             "token_acc": acc, "chance": {"state": 0.1, "state_mod2": 0.5, "recall": 0.0625}[sub]}
            for v, base in (("joint", 0.3), ("dat", 0.9)) for s in (0, 1, 2)
            for j, (w, lo, hi) in enumerate(windows_order) for sub in ("state", "state_mod2", "recall")
            for acc in [1.0 if j == 0 else round(base + 0.01 * s, 3)]]
    w = pd.DataFrame(rows)
    fig = plot_windows(w, window_summary(w))
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["state", "state_mod2", "recall"]
    for ax, sub in zip(shown, ("state", "state_mod2", "recall"), strict=True):
        dots = np.concatenate([c.get_offsets() for c in ax.collections if type(c) is PathCollection])
        expect = sorted(w[w.subtask == sub].token_acc)
        assert sorted(dots[:, 1]) == pytest.approx(expect)  # 2 variants x 3 seeds x 3 windows, each at its value
        floors = [c for c in ax.collections if type(c) is LineCollection and c.get_linestyle()[0][1] is not None]
        ys = {round(float(seg[0][1]), 4) for c in floors for seg in c.get_segments()}
        assert ys == {round(w[w.subtask == sub].chance.iloc[0], 4)}


def test_window_panels_follow_the_grid_s_factors_and_windows_stand_in_order_of_position():
    from probe.errors import ProbeError
    from probe.sweep.aggregate import window_summary
    from probe.sweep.plots import plot_windows, window_panels

    rows = [{"variant": "v", "seed": s, "window": w, "lo": lo, "hi": hi, "beyond": lo > 0, "subtask": sub,
             "token_acc": 0.5, "chance": 0.5}
            for s in (0, 1) for sub in ("recall", "state_mod3", "state", "state_mod2")
            # seed 0 lacks the middle window: first appearance would put (2x, 4x] before (1x, 2x]
            for w, lo, hi in (("in range", 0, 6), ("(1x, 2x]", 6, 12), ("(2x, 4x]", 12, 24)) if (s, lo) != (0, 6)]
    w = pd.DataFrame(rows)
    assert window_panels(w) == ["state", "state_mod2", "state_mod3", "recall"]  # modulus 6 = 2 x 3
    fig = plot_windows(w, window_summary(w))
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["in range", "(1x, 2x]", "(2x, 4x]"]
    with pytest.raises(ProbeError, match="not scored per window"):
        plot_windows(w, window_summary(w), subtasks=["state_mod7"])
