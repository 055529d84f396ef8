"""Pre-registered confirmation: claims judged on fresh seeds (``python -m probe.sweep --confirm``)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from probe.errors import ProbeError
from probe.sweep.claims import judge, load_claims
from probe.sweep.cli import main

TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "task.train_length=6", "train.batch_size=8",
        "train.eval_every=20", "train.ckpt_every=20", "train.traj_every=40", "train.eval_samples=16",
        "train.warmup=5"]
SWEEP = f"""name = "tiny"
seeds = [3, 4]
steps = 40
set = {json.dumps(TINY)}
eval_samples = 16
eval_lengths = "4x"

[[variant]]
name = "lstm"
preset = "lstm"

[[variant]]
name = "joint"
preset = "hybrid-joint"
"""
COMPARISON = """
[[claim]]
id = "lstm-beats-joint"
variant = "lstm"
versus = "joint"
metric = "state_win_1x_2x"
found_on = [0, 1]
"""
"""A comparison claim: the LSTM's state in (1x, 2x] above the joint hybrid's."""


def _files(tmp_path, claims: str, seeds: list[int] | None = None, extra: str = ""):
    sweep = (SWEEP if seeds is None else SWEEP.replace("seeds = [3, 4]", f"seeds = {seeds}")) + extra
    (tmp_path / "sweep.toml").write_text(sweep)
    (tmp_path / "claims.toml").write_text('sweep = "sweep.toml"\n' + claims)
    return tmp_path / "claims.toml"


TARGET = """
[[claim]]
id = "holds"
variant = "lstm"
found_on = [0, 1]
target = { state_win_1x_2x = 0.9 }
seeds_needed = 2
"""
"""A target claim: the LSTM's state in (1x, 2x] at 90 % or more in both fresh seeds."""


def _runs(values: dict[str, list[float]], metric: str = "state_win_1x_2x") -> pd.DataFrame:
    return pd.DataFrame([{"variant": v, "seed": 3 + i, metric: x} for v, xs in values.items()
                         for i, x in enumerate(xs)])


def test_a_target_claim_is_confirmed_refuted_or_pending_by_the_fresh_seeds_alone(tmp_path):
    claims = load_claims(_files(tmp_path, TARGET))
    verdict = judge(claims, _runs({"lstm": [0.95, 0.91]}))[0]
    assert verdict["confirmed"] is True and verdict["seeds_meeting"] == 2
    verdict = judge(claims, _runs({"lstm": [0.95, 0.5]}))[0]
    assert verdict["confirmed"] is False and "1 of 2" in verdict["verdict"]
    verdict = judge(claims, _runs({"lstm": [0.95]}))[0]  # one seed still to run: could go either way
    assert verdict["confirmed"] is None and verdict["verdict"] == "pending: 1 of 1 so far, 1 seed to run"


def test_a_comparison_that_cannot_reach_significance_is_not_run_as_a_test(tmp_path):
    claims = load_claims(_files(tmp_path, COMPARISON))
    row = judge(claims, _runs({"lstm": [0.99, 0.98], "joint": [0.2, 0.3]}))[0]
    # 2 vs 2 seeds: the smallest one-sided exact p is 1/6, so no data could confirm it
    assert row["confirmed"] is None and row["verdict"].startswith("not testable")
    assert row["p_min_attainable"] == pytest.approx(1 / 6) and "p_permutation" not in row


def test_claims_found_on_their_fresh_seeds_or_naming_unknown_variants_are_refused(tmp_path):
    with pytest.raises(ProbeError, match=r"seeds \[3\] it was found on"):
        load_claims(_files(tmp_path, '[[claim]]\nid = "a"\nvariant = "lstm"\nfound_on = [3]\n'
                                     'target = { state_win_1x_2x = 0.9 }\nseeds_needed = 1\n'))
    with pytest.raises(ProbeError, match="does not have"):
        load_claims(_files(tmp_path, '[[claim]]\nid = "a"\nvariant = "gru"\nfound_on = [0]\n'
                                     'target = { state_win_1x_2x = 0.9 }\nseeds_needed = 1\n'))
    with pytest.raises(ProbeError, match="needs 3 seeds"):
        load_claims(_files(tmp_path, '[[claim]]\nid = "a"\nvariant = "lstm"\nfound_on = [0]\n'
                                     'target = { state_win_1x_2x = 0.9 }\nseeds_needed = 3\n'))


def test_confirm_trains_the_fresh_seeds_and_judges_each_claim(tmp_path, capsys):
    # end to end: a claim that holds of any model (accuracy at least 0) is confirmed, one no model can meet
    # (above 100 %) is not; both judged on the two fresh seeds that --confirm trained
    path = _files(tmp_path, """
[[claim]]
id = "trivially-true"
variant = "lstm"
found_on = [0]
target = { state_win_1x_2x = 0.0, recall_win_2x_4x = 0.0 }
seeds_needed = 2

[[claim]]
id = "impossible"
variant = "joint"
found_on = [0]
target = { state_win_1x_2x = 1.01 }
seeds_needed = 1
""")
    # the verdicts hold of any model, so the runs train the fewest steps that still checkpoint and evaluate
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(sweep.read_text().replace("steps = 40", "steps = 4").replace("_every=20", "_every=4")
                     .replace("traj_every=40", "traj_every=4").replace("warmup=5", "warmup=1"))
    out = tmp_path / "runs"
    assert main(["--confirm", str(path), "--out", str(out), "--jobs", "2", "--no-progress", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    verdicts = {r["claim"]: r["confirmed"] for r in result["results"]}
    assert verdicts == {"trivially-true": True, "impossible": False}
    assert (out / "claims.md").exists() and (out / "lstm" / "seed4" / "final.pt").exists()
    # judged again without training: the same verdicts from the runs already there
    assert main(["--confirm", str(path), "--out", str(out), "--no-train", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert {r["claim"]: r["confirmed"] for r in again["results"]} == verdicts
    assert main(["--confirm", str(tmp_path / "none.toml"), "--out", str(out)]) == 2
    assert "no such claims file" in capsys.readouterr().err


def test_a_comparison_is_confirmed_only_in_its_direction_and_quotes_the_difference_with_its_interval(tmp_path):
    # six fresh seeds a side: the smallest one-sided exact p, 1/924, can reject
    claims = load_claims(_files(tmp_path, COMPARISON, seeds=[3, 4, 5, 6, 7, 8]))
    high, low = [0.99, 0.98, 0.97, 0.99, 0.96, 0.98], [0.30, 0.25, 0.40, 0.35, 0.20, 0.33]
    row = judge(claims, _runs({"lstm": high, "joint": low}))[0]
    assert row["confirmed"] is True and row["verdict"].startswith("confirmed: difference +")
    assert 0.5 < row["difference_ci_low"] < row["difference"] < row["difference_ci_high"] < 0.8
    # the reverse: a large effect against the claimed direction is not a confirmation, and the interval says which
    row = judge(claims, _runs({"lstm": low, "joint": high}))[0]
    assert row["confirmed"] is False and "no difference detected in the claimed direction" in row["verdict"]
    assert row["difference_ci_high"] < -0.5 and "CI [-" in row["verdict"]


def test_a_comparison_judged_while_its_family_waits_is_adjusted_over_the_whole_family(tmp_path):
    # a second comparison of the family (dat against joint) still waits for dat's seeds: the first is adjusted over
    # both, the waiting one standing in with p = 1, never over the one test run
    waiting = COMPARISON.replace('"lstm-beats-joint"', '"dat-beats-joint"').replace('variant = "lstm"',
                                                                                  'variant = "dat"')
    claims = load_claims(_files(tmp_path, COMPARISON + waiting, seeds=[3, 4, 5, 6, 7, 8],
                                extra='[[variant]]\nname = "dat"\npreset = "hybrid-dat"\n'))
    high, low = [0.99, 0.98, 0.97, 0.99, 0.96, 0.98], [0.30, 0.25, 0.40, 0.35, 0.20, 0.33]
    first, second = judge(claims, _runs({"lstm": high, "joint": low, "dat": high[:3]}))
    assert second["verdict"] == "pending: 3 seeds to run"
    assert first["p_holm"] == pytest.approx(2 * first["p_permutation"])
    assert "over a family of 2; 6 vs 6 seeds" in first["verdict"]


def test_a_seed_whose_window_was_not_measured_is_not_judged(tmp_path):
    claims = load_claims(_files(tmp_path, TARGET))
    verdict = judge(claims, _runs({"lstm": [0.95, float("nan")]}))[0]
    assert verdict["confirmed"] is None and verdict["n_seeds"] == 1 and verdict["seeds_meeting"] == 1
