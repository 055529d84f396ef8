"""study/scripts/doc_blocks_fresh.py: the grid's status and the claims' verdicts are rendered from the runs alone."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def F(study_scripts):
    return study_scripts("doc_blocks_fresh")


def _runs(F, value: float = 1.0) -> pd.DataFrame:
    """Every fresh run, every window metric at ``value``."""
    metrics = [f"{s}_win_{w}" for s in ("state", "recall", "state_mod2", "state_mod5") for w, _ in F.WINDOWS]
    rows = [{"variant": f"{stem}-{prec}", "seed": seed, **dict.fromkeys(metrics, value)}
            for stem in F.PRESETS for prec in F.PRECISIONS for seed in F.SEEDS]
    return pd.DataFrame(rows)


def test_the_status_says_complete_only_when_every_seed_of_every_variant_is_there(F, monkeypatch):
    runs = _runs(F)
    monkeypatch.setattr(F, "_fresh", lambda root: runs)
    assert F.fresh_status(ROOT).startswith("The grid is complete: all 80 runs")
    short = runs[~((runs.variant == "dat4-fp32") & (runs.seed >= 18))]
    monkeypatch.setattr(F, "_fresh", lambda root: short)
    text = F.fresh_status(ROOT)
    assert text.startswith("The grid is not finished: 78 of 80") and "dat4-fp32 8" in text and "joint-bf16 10" in text


def test_the_claims_block_groups_each_claim_by_the_verdict_the_runs_give(F, monkeypatch):
    # every window held everywhere: DAT's claims are confirmed, the cliff and mod-5-at-chance claims are not, and
    # DAT cannot beat a joint hybrid that is as good (a one-sided test that finds nothing says so, with its interval)
    monkeypatch.setattr(F, "_fresh", lambda root: _runs(F, 1.0))
    text = F.fresh_claims(ROOT)
    confirmed, rest = text.split("- **Not confirmed", 1)
    assert "`dat-4x-bf16`" in confirmed and "`dat-16x-fp32`" in confirmed and "`joint-cliff-bf16`" not in confirmed
    assert "`joint-cliff-bf16`" in rest and "no difference detected in the claimed direction" in rest
    assert "Pending" not in text
    # the joint hybrid far below DAT in (2x, 4x] on every seed: the comparisons are confirmed
    noisy = _runs(F, 1.0)
    noisy.loc[noisy.variant.str.match(r"joint-"), "state_win_2x_4x"] = [0.2 + 0.01 * i for i in range(20)]
    monkeypatch.setattr(F, "_fresh", lambda root: noisy)
    confirmed = F.fresh_claims(ROOT).split("- **Not confirmed", 1)[0]
    assert "`dat-beats-joint-bf16`" in confirmed and "`dat-beats-joint-fp32`" in confirmed
    # a seed missing from DAT in bf16: its comparison waits, its 4x claim (every seed) cannot be decided yet
    part = noisy[~((noisy.variant == "dat-bf16") & (noisy.seed == 19))]
    monkeypatch.setattr(F, "_fresh", lambda root: part)
    pending = F.fresh_claims(ROOT).split("- **Pending", 1)[1]
    assert "`dat-beats-joint-bf16`" in pending and "`dat-4x-bf16`" in pending and "`dat-4x-fp32`" not in pending


def test_the_recipe_s_limit_names_the_window_and_the_factor_where_its_runs_miss(F, monkeypatch):
    runs = _runs(F, 1.0)
    joint4 = runs.variant.str.startswith("joint4-")
    early = joint4 & (runs.seed == 10)  # mod 5 lost in (2x, 4x], parity kept
    runs.loc[early, ["state_win_2x_4x", "state_mod5_win_2x_4x"]] = 0.6
    late = joint4 & (runs.seed == 11) & (runs.variant == "joint4-fp32")  # holds to 8x, parity lost in (8x, 16x]
    runs.loc[late, ["state_win_8x_16x", "state_mod2_win_8x_16x"]] = [0.5, 0.7]
    monkeypatch.setattr(F, "_fresh", lambda root: runs)
    text = F.fresh_recipe(ROOT).split("\n")[-1]
    assert "(3 of 20 runs)" in text and "(2x, 4x] in 2 and only in (8x, 16x] in 1" in text
    assert "In 2 of them the mod-5 part" in text and "parity falls below 99 % in 1 (0 with the mod-5 part below the " \
        "bar too; lowest 70.0 % in (8x, 16x], joint4-fp32, seed 11)" in text and text.endswith("in most runs.")
    runs.loc[joint4, "state_mod2_win_2x_4x"] = 0.5  # now parity is what falls first: no mod-5 conclusion
    assert F.fresh_recipe(ROOT).endswith("in every one of them.")
