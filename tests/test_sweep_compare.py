"""Variant comparisons over seeds: the exact permutation test and the per-seed figure."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from probe.errors import ProbeError
from probe.sweep.compare import compare, comparison_table, permutation_p, plot_seed_dots


def curves(values: dict[str, list[float]], length: int = 75, train_length: int = 25) -> pd.DataFrame:
    rows = [{"variant": v, "seed": s, "subtask": "state", "length": length, "train_length": train_length,
             "token_acc": a} for v, accs in values.items() for s, a in enumerate(accs)]
    return pd.DataFrame(rows)


def test_permutation_p_separates_disjoint_groups_and_not_overlapping_ones():
    # five seeds each, fully separated: the observed split is the most extreme of C(10, 5) = 252 (two-sided: 2)
    assert permutation_p([0.99, 0.98, 1.0, 0.97, 0.99], [0.6, 0.7, 0.5, 0.8, 0.65]) == pytest.approx(2 / 252)
    # the same values in both groups: every split is at least as extreme
    assert permutation_p([0.99, 0.6, 0.98, 0.7, 0.5], [0.5, 0.98, 0.7, 0.99, 0.6]) == 1.0


def test_compare_reports_difference_p_and_what_n_allows():
    c = curves({"joint": [0.6, 0.7, 0.5], "dat": [1.0, 0.99, 1.0], "stopgrad": [0.65, 0.55, 0.7]})
    rows = compare(c, ["joint"]).set_index("variant")
    assert rows.loc["dat", "difference"] == pytest.approx(0.99667 - 0.6, abs=1e-4)
    assert rows.loc["dat", "p_permutation"] == pytest.approx(2 / math.comb(6, 3))
    assert rows.loc["dat", "p_min_attainable"] == pytest.approx(0.1)
    assert rows.loc["stopgrad", "p_permutation"] > 0.5
    assert "| dat | joint | 3 vs 3 |" in comparison_table(rows.reset_index())
    with pytest.raises(ProbeError, match="no such variant"):
        compare(c, ["delayed"])


def test_seed_dot_figure_has_a_dot_per_seed(tmp_path):
    c = curves({"joint": [0.6, 0.7], "dat": [1.0, 0.99]})
    summary = pd.DataFrame([{"variant": v, "subtask": "state", "metric": "token_acc", "factor": 3, "mean": m,
                             "ci_low": m - 0.05, "ci_high": m + 0.05} for v, m in (("joint", 0.65), ("dat", 0.995))])
    fig = plot_seed_dots(c, summary)
    dots = sum(len(coll.get_offsets()) for coll in fig.axes[0].collections)
    assert dots >= 4
