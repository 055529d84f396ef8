"""study/scripts/doc_blocks_claims.py: claims.toml's target claims judged by the rule the file states (the found rate
rounded down over the fresh seeds), beside the bars as filed; the verdicts that change are named."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from probe.sweep.claims import load_claims

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def C(study_scripts):
    return study_scripts("doc_blocks_claims")


def test_the_rule_rounds_the_found_rate_down_over_the_fresh_seeds(C):
    assert C.rule_bar(9, 10) == 9 and C.rule_bar(4, 5) == 8 and C.rule_bar(1, 1) == 10
    assert C.rule_bar(2, 3) == 6 and C.rule_bar(7, 10) == 7  # 7 / 10 * 10 is 7.000...1 in floats: integers here
    assert C.rule_bar(0, 4) == 0


def test_a_window_is_estimated_from_two_all_position_means(C):
    runs = pd.DataFrame({"state_acc_2x": [1.0, 0.9], "state_acc_4x": [0.6, 0.9], "state_acc_8x": [0.5, 0.5]})
    assert C.estimated_window(runs, "state_win_2x_4x").round(6).tolist() == [0.2, 0.9]
    assert C.estimated_window(runs, "state_win_0x_1x").isna().all()  # no 1x column: not measured
    assert C.estimated_window(runs, "state_win_8x_16x").isna().all()
    assert C.estimated_window(runs, "state_mod5_win_2x_4x").isna().all()  # a factor: all-position means lack it


def test_every_target_claim_names_runs_of_its_found_seeds(C):
    claims = load_claims(ROOT / "study" / "claims.toml")
    targets = [c for c in claims.claims if c.kind == "target"]
    assert {c.id for c in targets} == set(C.FOUND)
    for c in targets:
        meets, _ = C.found_meets(ROOT, c)
        assert list(meets.index) == list(c.found_on)
        assert meets.notna().all() or c.id == "dat-16x-fp32", c.id  # fp32 seeds 0-4 were evaluated to 4x only


def test_the_committed_verdicts_by_the_rule(C):
    """On the committed grid the rule raises five bars above the file's and turns `joint-parity-fp32` (8 of 10
    fresh seeds, bar 10 by the rule: found on one seed that met it) from confirmed to not confirmed."""
    rows = {r["claim"]: r for r in C.rule_rows(ROOT)}
    parity = rows["joint-parity-fp32"]
    assert (parity["found_k"], parity["found_n"], parity["file_bar"], parity["rule_bar"]) == (1, 1, 8, 10)
    assert parity["filed"] is True and parity["ruled"] is False
    assert [r["claim"] for r in C.changed(list(rows.values()))] == ["joint-parity-fp32"]
    assert rows["dat-16x-bf16"]["rule_bar"] == rows["dat-16x-bf16"]["file_bar"] == 7
    text = C.fresh_claims_rule(ROOT)
    assert "Verdicts that change: `joint-parity-fp32` from confirmed to not confirmed" in text
    yes, no = C.confirmed_by_rule(ROOT)
    assert "joint-parity-fp32" in no and len(yes) + len(no) == 16


def test_a_verdict_changes_only_where_the_fresh_count_lies_between_the_two_bars(C, monkeypatch):
    runs = C._fresh(ROOT).copy()
    runs.loc[runs.variant == "joint-fp32", "state_mod2_win_8x_16x"] = 1.0  # all 10 keep parity: meets 10 as well
    monkeypatch.setattr(C, "_fresh", lambda root: runs)
    assert C.changed(C.rule_rows(ROOT)) == []
    assert C.fresh_claims_rule(ROOT).count("No verdict changes.") == 1
