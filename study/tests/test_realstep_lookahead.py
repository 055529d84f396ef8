"""study/scripts/realstep_lookahead.py and study/sweeps/realstep.toml: every snapshot measured once with its checks,
and the grid is the mechanism grid's joint with resumable snapshots."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from probe.gradients.realstep import RealStepConfig
from probe.train import ScheduleConfig, TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]
SMALL = RealStepConfig(batch_size=8, train_eval_batches=2, eval_batches=2, max_factor=4, n_random=2)


@pytest.fixture(scope="module")
def R(study_scripts):
    return study_scripts("realstep_lookahead")


def test_the_grid_is_the_mechanism_grid_s_joint_with_snapshots_to_resume_from():
    from probe.results.config import eval_lengths_for, load_config
    from probe.training.overrides import build_configs

    def configs(run):
        return build_configs(run.preset, run.task, list(run.overrides), steps=run.steps, seed=run.seed)

    joint = next(r for r in load_config(ROOT / "study" / "sweeps" / "mechanism.toml").runs("unused")
                 if r.key == "joint/seed0")
    model_ref, task_ref, train_ref = configs(joint)
    grid = load_config(ROOT / "study" / "sweeps" / "realstep.toml")
    assert max(eval_lengths_for(grid.eval_lengths, 25)) == 400
    runs = grid.runs("unused")
    assert len(runs) >= 5
    for run in runs:
        model_cfg, task_cfg, train_cfg = configs(run)
        assert model_cfg == model_ref and task_cfg == task_ref
        assert train_cfg.traj_optimizer and train_cfg.traj_dtype == "float32" and train_cfg.traj_every == 50
        same = dataclasses.replace(train_cfg, seed=joint.seed, traj_every=train_ref.traj_every,
                                   traj_optimizer=False, traj_dtype=train_ref.traj_dtype)
        assert same == train_ref, "only the seed and the snapshots differ from the mechanism grid's joint"


@pytest.mark.slow  # trains a 20-step run
def test_the_script_measures_each_snapshot_once_with_its_checks(R, tmp_path, monkeypatch):
    from probe.models import ModelConfig
    from probe.tasks import make_task

    run = tmp_path / "joint" / "seed0"
    task = make_task("interleaved", train_length=8)
    model_cfg = ModelConfig(family="hybrid", vocab_size=task.vocab_size, d_model=16, n_layers=2, n_heads=2)
    cfg = TrainConfig(steps=20, batch_size=8, eval_every=20, eval_samples=8, ckpt_every=20, traj_every=5, lr=3e-3,
                      warmup=5, traj_dtype="float32", traj_optimizer=True, schedule=ScheduleConfig())
    train(model_cfg, task, cfg, run, progress=False)
    # step 20 is the run's last snapshot: its rollout has no later one to reproduce
    objs = [R.measure(run / "trajectory" / f"step_{s:06d}.pt", tmp_path / "work" / f"{s}.json", 5, SMALL)
            for s in (5, 10, 20)]
    R.collect(objs, tmp_path / "out")
    verdicts = pd.read_csv(tmp_path / "out" / "verdicts.csv")
    checks = pd.read_csv(tmp_path / "out" / "checks.csv")
    assert list(verdicts.columns) == R.VERDICT_COLUMNS and sorted(set(verdicts.step)) == [5, 10, 20]
    assert set(verdicts.moments) == {"adamw-state"} and verdicts.rollout_outcome.notna().all()
    assert set(verdicts[verdicts.step < 20].rollout_reproduced) == {True}
    assert verdicts[verdicts.step == 20].rollout_reproduced.isna().all()
    assert (verdicts.fraction_att > 0).all() and set(verdicts.positions) == {"(1x, 2x]", "(2x, 4x]"}
    passed = checks.set_index(["step", "control"]).passed
    for control in ("realstep_parts_sum", "realstep_matched_random", "realstep_matches_adamw",
                    "rollout_reproduces_run"):
        assert passed.xs(control, level="control").all(), control
    assert set(checks[checks.control == "realstep_matches_adamw"].step) == {5, 10, 20}
    # no later snapshot: the reproduction check is left out rather than written as a NaN that reads as failed
    assert set(checks[checks.control == "rollout_reproduces_run"].step) == {5, 10}
    assert "realstep_vs_matched_random" in set(checks.control)

    def fail(*a, **k):
        raise AssertionError("a cached snapshot was measured again")

    monkeypatch.setattr(R, "real_step_report", fail)
    R.measure(run / "trajectory" / "step_000005.pt", tmp_path / "work" / "5.json", 5, SMALL)
    assert R.main([str(run), "--steps", "7", "--work", str(tmp_path / "w2"), "--out", str(tmp_path / "o2")]) == 2


@pytest.mark.parametrize("flag", [["--rollout", "0"], ["--processes", "0"]])
def test_a_rollout_or_pool_of_nothing_is_refused_before_any_work(R, tmp_path, flag, capsys):
    # no rollout means no check that the update is the run's own: every snapshot would be withheld
    with pytest.raises(SystemExit) as exit_:
        R.main([str(tmp_path), *flag])
    assert exit_.value.code == 2 and "must be at least 1" in capsys.readouterr().err
