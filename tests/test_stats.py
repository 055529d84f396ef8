"""probe.core.stats as wrappers over scipy.stats: the same numbers as the hand-written implementation they replaced
on the committed seeds, the smallest attainable p of an exact test, Fisher's test and Clopper-Pearson."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from probe.core.stats import (
    benjamini_hochberg,
    bootstrap_ci,
    can_reject,
    clopper_pearson,
    fisher_p,
    holm,
    min_attainable_p,
    paired_interval,
    permutation_p,
    sign_flip_p,
    t_interval,
    welch_interval,
    wilson,
)

EXACT = 1e-12

# State token accuracy at 3x L_train per seed, from the committed grids (results/GRID/curves.csv), rounded to 12
# digits. Every expected value below was computed from these lists with the previous, hand-written implementation
# of probe/core/stats.py (itertools enumeration with a 1e-9 tie tolerance; t, Welch and Wilson intervals from
# their formulas; numpy's bootstrap draws), before it became wrappers over scipy.stats.
SEEDS = {
    "dat": [0.999610339005, 1.0, 0.989089492142, 0.990323418626, 1.0, 1.0, 1.0, 1.0, 0.997402260034, 0.999545395506],
    "frozen-copy": [0.573516041044, 0.490258475127, 0.686063125081, 0.648525782569, 0.551435251331],
    "joint": [0.962982205481, 0.655864397974, 0.591700220808, 0.907455513703, 0.699831146902, 0.676646317704,
              0.797181452137, 0.667878945318, 0.84381088453, 0.598259514223],
    "rnn0-att0": [0.998116638524, 0.999870113002, 0.645863099104, 0.969476555397, 0.696519028445, 0.996622938044,
                  0.996817768541, 1.0],
    "rnn0-att1": [1.0, 0.991947006105, 0.708273801792, 0.990323418626, 1.0, 0.791726198208, 0.999870113002,
                  0.998895960514],
    "rnn1-att1": [0.818223145863, 0.798025717626, 0.666320301338, 0.998376412521, 1.0, 1.0, 1.0, 1.0],
    "stopgrad": [0.999935056501, 1.0, 1.0, 0.995194181062, 0.993440706585],
    "stopgrad-rnn": [0.999870113002, 0.997337316535, 0.992206780101, 0.990518249123, 1.0, 1.0, 0.999025847513,
                     0.998376412521, 1.0, 1.0],
    "stopgrad-rnn1": [0.818223145863, 0.798025717626, 0.666320301338],
    "recipe": [1.0, 0.999935056501, 1.0, 0.998181582024, 0.999935056501, 0.999805169503, 1.0, 1.0, 0.999090791012,
               0.999155734511],
    "repro-dat": [0.999805169503, 1.0, 0.998181582024],
    "repro-joint": [0.924730484479, 0.810884530459, 0.590920898818],
    "switch-100": [0.991297571113, 0.998831017015, 0.54922717236, 0.987595791661, 0.992011949604, 1.0, 1.0,
                   0.999675282504],
    "switch-250": [0.999740226003, 0.999155734511, 0.986816469671, 0.992726328095, 1.0, 1.0, 1.0, 1.0],
}
PAIRS = [("dat", "joint"), ("stopgrad", "joint"), ("stopgrad-rnn1", "frozen-copy"), ("repro-dat", "repro-joint"),
         ("recipe", "dat"), ("switch-250", "switch-100"), ("dat", "stopgrad-rnn"), ("rnn0-att0", "rnn0-att1")]
PERMUTATION_P = [1.082508822446903e-05, 0.000666000666000666, 0.07142857142857142, 0.1, 0.21732447119444023,
                 0.24242424242424243, 0.9079650999155643, 0.6309246309246309]
WELCH = [(0.25743603065330023, 0.16451222962056955, 0.3503598316860309, 10),
         (0.2575529289516, 0.16462695088066537, 0.3504789070225346, 5),
         (0.1708966532452667, 0.008966781059132456, 0.33282652543140095, 3),
         (0.22381694592366663, -0.1977025014355644, 0.6453363932828977, 3),
         (0.0020132484738997203, -0.0010350092661866495, 0.00506150621398609, 10),
         (0.05747499675287504, -0.07454511596535204, 0.18949510947110212, 8),
         (-0.00013638134819971004, -0.003798364476189462, 0.0035256017797900417, 10),
         (-0.022218794648749984, -0.1671546894813748, 0.12271710018387483, 8)]
T = {"dat": (0.9975970905313002, 0.9945616908487003, 1.0006324902139),
     "frozen-copy": (0.5899597350304, 0.4930607753178766, 0.6868586947429234),
     "joint": (0.740161059878, 0.6472566543392466, 0.8330654654167533),
     "rnn0-att0": (0.9129107676321251, 0.7873905832557635, 1.0384309520084867),
     "stopgrad-rnn1": (0.7608563882756667, 0.5559370418094951, 0.9657757347418383),
     "recipe": (0.9996103390051999, 0.9991723308490615, 1.0000483471613382),
     "repro-joint": (0.775511971252, 0.3539718560260815, 1.1970520864779184),
     "switch-100": (0.939829848032125, 0.8078219281079078, 1.0718377679563422)}
PAIRED = [("rnn0-att0", "rnn0-att1", 0.578125, (-0.022218794648749998, -0.13812179509974848, 0.09368420580224847)),
          ("dat", "stopgrad-rnn", 0.8125, (-0.0001363813482000098, -0.0013815211326813023, 0.0011087584362812829)),
          ("rnn1-att1", "rnn0-att1", 0.625, (-0.025011365112374992, -0.13021527160665125, 0.08019254138190125))]
HOLM = [8.660070579575224e-05, 0.004662004662004662, 0.42857142857142855, 0.5, 0.8692978847777609,
        0.8692978847777609, 1.0, 1.0]
BH = [8.660070579575224e-05, 0.002664002664002664, 0.19047619047619047, 0.2, 0.32323232323232326,
      0.32323232323232326, 0.9079650999155643, 0.721056721056721]
WILSON = [(0, 256, (0.0, 0.01478385642587143)), (3, 256, (0.003993287123007758, 0.033881572667882304)),
          (256, 256, (0.9852161435741286, 1.0)), (17, 40, (0.28509392559950375, 0.5780493145800892)),
          (1, 1, (0.20654931437723745, 1.0))]


@pytest.mark.parametrize(("pair", "expected"), list(zip(PAIRS, PERMUTATION_P, strict=True)))
def test_permutation_p_equals_the_previous_implementation_on_committed_seeds(pair, expected):
    a, b = pair
    assert permutation_p(SEEDS[a], SEEDS[b]) == pytest.approx(expected, abs=EXACT)


@pytest.mark.parametrize(("pair", "expected"), list(zip(PAIRS, WELCH, strict=True)))
def test_welch_interval_equals_the_previous_implementation(pair, expected):
    ci = welch_interval(SEEDS[pair[0]], SEEDS[pair[1]])
    assert (ci.estimate, ci.low, ci.high) == pytest.approx(expected[:3], abs=EXACT) and ci.n == expected[3]


@pytest.mark.parametrize("name", T)
def test_t_interval_equals_the_previous_implementation(name):
    ci = t_interval(SEEDS[name])
    assert (ci.estimate, ci.low, ci.high) == pytest.approx(T[name], abs=EXACT) and ci.n == len(SEEDS[name])


@pytest.mark.parametrize(("a", "b", "p", "interval"), PAIRED)
def test_sign_flip_and_paired_interval_equal_the_previous_implementation(a, b, p, interval):
    d = np.asarray(SEEDS[a]) - np.asarray(SEEDS[b])
    assert sign_flip_p(d) == pytest.approx(p, abs=EXACT)
    ci = paired_interval(SEEDS[a], SEEDS[b])
    assert (ci.estimate, ci.low, ci.high) == pytest.approx(interval, abs=EXACT)


def test_adjustments_equal_the_previous_implementation():
    assert holm(PERMUTATION_P) == pytest.approx(HOLM, abs=EXACT)
    assert benjamini_hochberg(PERMUTATION_P) == pytest.approx(BH, abs=EXACT)


@pytest.mark.parametrize(("k", "n", "expected"), WILSON)
def test_wilson_equals_the_previous_implementation(k, n, expected):
    assert wilson(k, n) == pytest.approx(expected, abs=EXACT)


def test_bootstrap_draws_and_percentiles_equal_the_previous_implementation():
    x = (np.arange(37) % 3 == 0).astype(float)
    y = np.where(np.arange(37) % 5 == 0, 1.0, 0.0)
    assert bootstrap_ci(lambda i: x[i].mean(axis=1), 37, seed=3) == pytest.approx(
        (0.1891891891891892, 0.5135135135135135), abs=EXACT)
    with np.errstate(divide="ignore", invalid="ignore"):  # resamples without a y are left out, as before
        assert bootstrap_ci(lambda i: x[i].sum(axis=1) / y[i].sum(axis=1), 37, seed=0) == pytest.approx(
            (0.7777777777777778, 4.0), abs=EXACT)


def test_ties_that_rounding_splits_are_still_ties():
    # theoretically equal means computed in another order differ by ulps around 0, where scipy's relative
    # tolerance is 0: the previous implementation counted them as ties (values from it)
    assert permutation_p([0.1, 0.2, 0.3], [0.3, 0.2, 0.1]) == 1.0
    assert permutation_p([0.1, 0.2, 0.3, 0.6], [0.3, 0.2, 0.1, 0.6, 0.0]) == pytest.approx(0.8095238095238095)
    assert sign_flip_p([0.1, 0.2, -0.3]) == 1.0 and sign_flip_p([0.1, 0.2, -0.3, 0.0, 0.6, -0.6]) == 1.0
    assert permutation_p([1, 1, 1], [1, 1]) == 1.0 and sign_flip_p([0, 0, 0]) == 1.0
    assert math.isnan(permutation_p([], [1.0])) and math.isnan(sign_flip_p([float("nan")]))


# --- what an exact test can reach ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("n1", "n2"), [(3, 5), (5, 5), (2, 2), (1, 4), (4, 6)])
def test_min_attainable_p_is_attained_by_fully_separated_groups(n1, n2):
    low, high = list(range(n1)), [10.0 + i for i in range(n2)]
    assert min_attainable_p(n1, n2) == pytest.approx(permutation_p(low, high), abs=EXACT)
    assert min_attainable_p(n1, n2, alternative="less") == pytest.approx(
        permutation_p(low, high, alternative="less"), abs=EXACT)


@pytest.mark.parametrize("n", [1, 3, 5, 8])
def test_min_attainable_p_of_a_paired_test_is_attained_by_same_sign_differences(n):
    d = [0.1 * (i + 1) for i in range(n)]
    assert min_attainable_p(n, paired=True) == pytest.approx(sign_flip_p(d), abs=EXACT)
    assert min_attainable_p(n, paired=True, alternative="greater") == pytest.approx(
        sign_flip_p(d, alternative="greater"), abs=EXACT)


def test_min_attainable_p_known_values_and_what_a_family_allows():
    assert min_attainable_p(3, 5) == pytest.approx(2 / 56) and min_attainable_p(5, 5) == pytest.approx(2 / 252)
    assert min_attainable_p(5, paired=True) == 0.0625 and min_attainable_p(1, 1) == 1.0
    assert math.isnan(min_attainable_p(0, 5)) and math.isnan(min_attainable_p(0, paired=True))
    # 3 vs 3 seeds: p >= 0.1, never significant; 5 vs 5: 0.0079, significant alone and in a family of 6 (0.048)
    # but not of 7 (0.056); 5 pairs: 1/16 cannot reject even alone
    assert not can_reject(3, 3) and can_reject(5, 5) and can_reject(5, 5, family=6)
    assert not can_reject(5, 5, family=7) and not can_reject(5, paired=True) and can_reject(6, paired=True)
    assert can_reject(3, 5, family=1) and not can_reject(3, 5, family=2)  # 2/56 = 0.036, x2 = 0.071
    assert not can_reject(0, 5)
    with pytest.raises(ValueError):
        min_attainable_p(3)
    with pytest.raises(ValueError):
        can_reject(5, 5, family=0)


# --- counts -------------------------------------------------------------------------------------------------------
def test_fisher_p_is_scipys_and_gives_the_recipe_comparison():
    # 10 of 10 runs meet the target against 7 of 10: the p the README quotes (0.21)
    assert fisher_p(10, 10, 7, 10) == pytest.approx(stats.fisher_exact([[10, 0], [7, 3]]).pvalue)
    assert round(fisher_p(10, 10, 7, 10), 2) == 0.21 and fisher_p(3, 5, 3, 5) == 1.0
    with pytest.raises(ValueError):
        fisher_p(6, 5, 1, 5)


def test_clopper_pearson_is_the_beta_quantile_interval():
    low, high = clopper_pearson(3, 10)
    assert low == pytest.approx(stats.beta.ppf(0.025, 3, 8)) and high == pytest.approx(stats.beta.ppf(0.975, 4, 7))
    assert clopper_pearson(0, 10)[0] == 0.0 and clopper_pearson(10, 10)[1] == 1.0
    # the one-sided upper bound on a failure rate after k failures in n runs
    assert clopper_pearson(1, 10, alternative="less")[1] == pytest.approx(stats.beta.ppf(0.95, 2, 9))
    assert all(math.isnan(v) for v in clopper_pearson(0, 0))


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_the_enumerated_null_is_scipys_exact_null(alternative):
    """permutation_p enumerates the relabelings itself (scipy's enumeration is slow): on unequal groups, ties and a
    large effect, its p is scipy's exact p with the same ties. A null that missed relabelings, counted one twice or
    flipped the statistic's sign would move these p values by at least 1/C(n, k)."""
    from probe.core.stats import _mean_difference, _p_from_null

    rng = np.random.default_rng(3)
    cases = [(rng.normal(0.3, 1, 5), rng.normal(0, 1, 7)), (rng.integers(0, 3, 6) / 4, rng.integers(0, 3, 6) / 4),
             (rng.normal(2, 0.1, 4), rng.normal(0, 0.1, 9)), (rng.normal(0, 0.1, 6), rng.normal(2, 0.1, 5)),
             (np.array([0.9, 0.95, 1.0]), np.array([0.2, 0.99]))]
    ps = []
    for x, y in cases:
        res = stats.permutation_test((x, y), _mean_difference, permutation_type="independent", vectorized=True,
                                  n_resamples=np.inf)
        ps.append(permutation_p(x, y, alternative=alternative))
        assert ps[-1] == pytest.approx(_p_from_null(res, alternative, True), abs=1e-12)
    assert min(ps) < 0.05 < max(ps)  # the cases span a rejection and a non-rejection in every direction asked
