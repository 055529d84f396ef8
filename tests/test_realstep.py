"""The lookahead at the optimizer's real step: AdamW's next update from its state, its parts, the rollout and the
matched random baseline, each against torch's own optimizer or the run itself."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

from probe.checkpoint import load_checkpoint
from probe.errors import ProbeError
from probe.gradients.adamstep import PARTS, adamw_state, next_update, update_parts
from probe.gradients.decomposition import check_has_lstm, lstm_parameter_names
from probe.gradients.realstep import (
    SUM_TOL,
    RealStepConfig,
    controls,
    matched_random,
    measure_real_step,
    verdicts,
)
from probe.train import ScheduleConfig, TrainConfig, train
from probe.training.rollout import continue_run, weight_difference

from conftest import tiny_model

SMALL = RealStepConfig(batch_size=8, train_eval_batches=2, eval_batches=2, max_factor=4, n_random=3)
TOL = 1e-5
"""float32 (torch's step) against float64 (the update computed here), relative to the update's norm."""


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten() for t in tensors])


# --- the update against torch.optim.AdamW ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def adam_case():
    """A tiny hybrid whose AdamW (every hyperparameter away from torch's defaults, eps large enough to matter) has
    taken three steps; then the next gradient, split into two parts, and the weights torch's step gives."""
    torch.manual_seed(0)
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.95), eps=1e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        for p in model.parameters():
            p.grad = 1e-2 * torch.randn(p.shape, generator=gen)
        opt.step()
    state = adamw_state(opt.state_dict(), model, lr=0.01)
    theta = check_has_lstm(model)
    before = _flat(theta)
    g_att = [1e-2 * torch.randn(p.shape, generator=gen) for p in theta]
    g_rec = [1e-2 * torch.randn(p.shape, generator=gen) for p in theta]
    for p in model.parameters():
        p.grad = 1e-2 * torch.randn(p.shape, generator=gen)
    for p, a, r in zip(theta, g_att, g_rec, strict=True):
        p.grad = a + r
    opt.step()
    taken = before - _flat(theta)
    return state, before, _flat(g_att), _flat(g_rec), taken


def test_the_full_update_is_torch_adamw_s_step_and_the_parts_sum_to_it(adam_case):
    state, theta, g_att, g_rec, taken = adam_case
    parts = update_parts(theta, g_att, g_rec, state)
    assert state.step == 3 and state.source == "adamw-state"
    assert float((parts["full"] - taken).norm() / taken.norm()) < TOL
    total = sum(parts[p] for p in PARTS)
    assert float((total - parts["full"]).norm() / parts["full"].norm()) < 1e-12


@pytest.mark.parametrize("change", [dict(eps=1e-8), dict(lr=0.011), dict(weight_decay=0.0), dict(step=4),
                                    dict(beta1=0.9), dict(beta2=0.999)],
                         ids=["eps", "lr", "weight_decay", "bias_correction", "beta1", "beta2"])
def test_a_wrong_hyperparameter_gives_another_step(adam_case, change):
    """The comparison above is a control: each wrong setting misses torch's step by far more than rounding."""
    state, theta, g_att, g_rec, taken = adam_case
    wrong = update_parts(theta, g_att, g_rec, dataclasses.replace(state, **change))["full"]
    assert float((wrong - taken).norm() / taken.norm()) > 100 * TOL


def test_the_state_is_refused_where_there_is_none():
    with pytest.raises(ProbeError, match="traj_optimizer"):
        adamw_state(None, tiny_model(), lr=1e-3)


def test_snapshots_with_the_optimizer_need_float32_weights():
    with pytest.raises(ProbeError, match="traj_dtype=float32"):
        TrainConfig(traj_optimizer=True)


# --- the matched random baseline ------------------------------------------------------------------------------------
@pytest.mark.parametrize("g_scale", [1.0, 0.0])
def test_matched_random_has_the_norm_and_projection_asked_for(g_scale):
    gen = torch.Generator().manual_seed(0)
    u, g = torch.randn(500, generator=gen, dtype=torch.float64), g_scale * torch.randn(500, generator=gen,
                                                                                       dtype=torch.float64)
    shape = torch.rand(500, generator=gen, dtype=torch.float64) + 0.1
    rs = matched_random(u, g, 4, seed=3, shape=shape)
    for r in rs:
        assert abs(float(r.norm() - u.norm())) < 1e-10 * float(u.norm())
        assert abs(float(r @ g - u @ g)) < 1e-10 * float(u.norm() * g.norm() + 1)
        assert float(r @ u) / float(u.norm()) ** 2 < 0.9  # not u itself
    assert float((rs[0] - rs[1]).norm()) > 0.1 * float(u.norm())  # distinct draws


def test_the_matched_baseline_can_refute_a_claimed_raise():
    """The control passes a raise larger than the matched random's and fails one the matched random matches."""
    def rows(vs_z):
        return pd.DataFrame([
            {"part": "att", "loss": "train", "positions": "<=L", "dL": -1.0, "z": -5.0, "step_norm": 1.0,
             "fraction_of_update": 0.2, "vs_matched": 0.0, "vs_matched_z": 0.0},
            {"part": "att", "loss": "state", "positions": "(1x, 2x]", "dL": 1.0, "z": 5.0, "step_norm": 1.0,
             "fraction_of_update": 0.2, "vs_matched": vs_z, "vs_matched_z": vs_z}])
    info = {"sum_error": 0.0, "match_error": 0.0}
    for vs_z, passed in ((5.0, True), (0.5, False)):
        v = verdicts(rows(vs_z))
        assert v.verdict.tolist() == ["raises"]
        row = [c for c in controls("x", info, v) if c["control"] == "realstep_vs_matched_random"][0]
        assert row["passed"] is passed and row["kind"] == "control"
    # the baseline's words say which loss moved which way against the matched random step
    for vs_z, words in ((5.0, "raises the state loss more than a matched random step"),
                        (-5.0, "lowers the state loss more than a matched random step"),
                        (0.5, "no difference from a matched random step detected on the state loss")):
        assert verdicts(rows(vs_z)).baseline.tolist() == [words]


# --- a run with the optimizer in its snapshots ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny joint hybrid, 30 steps, a snapshot every 10 with AdamW's state; weight decay and a clip that binds."""
    from probe.models import ModelConfig
    from probe.tasks import make_task

    out = tmp_path_factory.mktemp("runs") / "joint"
    task = make_task("interleaved", train_length=8)
    model_cfg = ModelConfig(family="hybrid", vocab_size=task.vocab_size, d_model=16, n_layers=2, n_heads=2)
    cfg = TrainConfig(steps=30, batch_size=16, eval_every=30, eval_samples=8, ckpt_every=30, traj_every=10, lr=3e-3,
                      warmup=5, weight_decay=0.1, grad_clip=0.5, traj_dtype="float32", traj_optimizer=True,
                      schedule=ScheduleConfig())
    train(model_cfg, task, cfg, out, progress=False)
    return out / "trajectory"


@pytest.mark.slow  # trains a 30-step run (module fixture)
def test_next_update_is_the_step_the_run_takes(run):
    snap = load_checkpoint(run / "step_000010.pt")
    floats = [v for v in snap.state_dict.values() if v.is_floating_point()]
    assert snap.optimizer_state and all(v.dtype == torch.float32 for v in floats)
    step = next_update(snap)
    assert step.clip < 1.0  # the clip binds, so its coefficient is part of what is compared
    taken = continue_run(snap, 1)
    names = lstm_parameter_names(taken.model)
    delta = torch.cat([(snap.state_dict[n].double() - taken.first_step[n].double()).flatten() for n in names])
    assert float((step.parts["full"] - delta).norm() / delta.norm()) < TOL
    # the batch and learning rate of another step (the record then rebuilt from the configs) miss it
    moved = next_update(dataclasses.replace(snap, step=11))
    assert float((moved.parts["full"] - delta).norm() / delta.norm()) > 100 * TOL


@pytest.mark.slow  # trains a 30-step run (module fixture)
def test_the_kept_rollout_reproduces_the_run_and_the_cut_one_departs(run):
    snap, later = load_checkpoint(run / "step_000010.pt"), load_checkpoint(run / "step_000030.pt")
    kept = continue_run(snap, 20)
    assert weight_difference(kept.model.state_dict(), later) == 0.0  # bit for bit
    assert weight_difference(continue_run(snap, 20, "cut").model.state_dict(), later) > 1e-4
    # the snapshot is left as it was: a second branch from it starts where the first did
    assert weight_difference(continue_run(snap, 20).model.state_dict(), later) == 0.0
    assert int(snap.optimizer_state["state"][0]["step"]) == 10
    # continued on the batches one step late, it is not the run: the comparison can fail
    late = continue_run(dataclasses.replace(snap, step=11), 19)
    assert weight_difference(late.model.state_dict(), later) > 1e-4


@pytest.mark.slow  # trains a 30-step run (module fixture)
def test_the_rollout_continues_in_the_precision_the_run_trained_in_not_its_config_s(run):
    # a run configured with another precision than the one it ran in (train.precision=auto resolves per machine):
    # continued from its config's literal, it is another run; from its recorded precision, the run itself
    snap, later = load_checkpoint(run / "step_000010.pt"), load_checkpoint(run / "step_000030.pt")
    ran = snap.extra["precision_used"]
    other = "bf16" if ran == "fp32" else "fp32"
    relabelled = dataclasses.replace(snap, train_config={**snap.train_config, "precision": other})
    kept = continue_run(relabelled, 20)
    assert kept.precision == ran and weight_difference(kept.model.state_dict(), later) == 0.0
    # the control: asked for the config's precision, the rollout departs (a rollout that ignored the precision it
    # was given, or read the config's, would pass the line above only by luck of the machine and fail here)
    forced = continue_run(relabelled, 20, precision=other)
    assert forced.precision != ran and weight_difference(forced.model.state_dict(), later) > 1e-5


@pytest.mark.slow  # trains a 30-step run (module fixture)
def test_the_real_step_rows_record_the_moments_the_shares_and_the_baseline(run):
    snap = load_checkpoint(run / "step_000020.pt")
    rows, info = measure_real_step(snap, SMALL)
    assert set(rows.moments) == {"adamw-state"} and set(rows.adam_step) == {21}
    train_rows = rows[rows.positions == "<=L"].set_index("part")
    assert train_rows.loc["full", "fraction_of_update"] == 1.0
    norms = {p: float(info["step"].parts[p].norm()) for p in PARTS}
    assert train_rows.loc["att", "fraction_of_update"] == pytest.approx(norms["att"] / info["step"].parts[
        "full"].norm().item())
    # first order is linear: the parts' changes add up to the full update's
    assert train_rows.loc[list(PARTS), "dL_first"].sum() == pytest.approx(train_rows.loc["full", "dL_first"],
                                                                          rel=1e-6, abs=1e-12)
    # the matched random lowers the training loss as much as attention's part, to first order
    assert train_rows.loc["matched_random", "dL_first"] == pytest.approx(train_rows.loc["att", "dL_first"],
                                                                         rel=1e-6, abs=1e-12)
    assert set(rows[rows.loss == "state"].positions) == {"(1x, 2x]", "(2x, 4x]"}
    checks = pd.DataFrame(controls(str(snap.path), info, verdicts(rows)))
    assert checks.set_index("control").loc[["realstep_parts_sum", "realstep_matched_random"], "passed"].all()


@pytest.mark.slow  # trains a 30-step run (module fixture)
def test_a_snapshot_without_the_optimizer_is_refused(run, tmp_path):
    snap = load_checkpoint(run / "step_000010.pt")
    bare = dataclasses.replace(snap, optimizer_state=None)
    with pytest.raises(ProbeError, match="traj_optimizer"):
        next_update(bare)
    with pytest.raises(ProbeError, match="traj_optimizer"):
        continue_run(bare, 1)


# --- python -m probe.gradients --real-step [--rollout STEPS] --------------------------------------------------------
CLI_SMALL = ["--lengths", "8", "--samples", "8", "--la-eval-batches", "2", "--no-lookahead", "--no-progress"]


def _analysis(obj, kind):
    return pd.DataFrame([r for r in obj["results"] if r["analysis"] == kind])


@pytest.mark.slow  # trains a 30-step run (module fixture)
def test_cli_real_step_rows_are_the_update_s_parts_at_their_shares(run, tmp_path, capsys):
    from probe.gradients import GradientReport
    from probe.gradients import main as gradients_main

    path = run / "step_000020.pt"
    assert gradients_main([str(path), "--real-step", "--json", "--out", str(tmp_path / "o"), *CLI_SMALL]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj == json.loads((tmp_path / "o" / "results.json").read_text())
    rows = _analysis(obj, "real_step")
    assert set(rows.part) == {*PARTS, "full", "matched_random"} and set(rows.checkpoint) == {str(path)}
    assert set(rows.moments) == {"adamw-state"} and set(rows.adam_step) == {21}
    assert set(rows.positions) == {"<=L", "(1x, 2x]", "(2x, 4x]", "(4x, 8x]", "(8x, 16x]"}
    train_rows = rows[rows.positions == "<=L"].set_index("part")
    # each part's share is its norm over the update's, as next_update computes them on its own
    step = next_update(load_checkpoint(path))
    full = float(step.parts["full"].norm())
    assert train_rows.loc["full", "fraction_of_update"] == 1.0
    assert train_rows.update_norm.iloc[0] == pytest.approx(full, rel=1e-12)
    for p in PARTS:
        assert train_rows.loc[p, "fraction_of_update"] == pytest.approx(float(step.parts[p].norm()) / full, rel=1e-9)
    # the parts are additive: their first-order changes sum to the full update's, and their vectors to the update
    for _, df in rows.groupby("positions"):
        by = df.set_index("part")
        assert by.loc[list(PARTS), "dL_first"].sum() == pytest.approx(by.loc["full", "dL_first"], rel=1e-6, abs=1e-12)
    checks = pd.DataFrame(obj["controls"])
    by_name = checks.drop_duplicates("control").set_index("control")
    assert by_name.loc["realstep_parts_sum", "passed"] and by_name.loc["realstep_parts_sum", "value"] <= SUM_TOL
    # the baseline is as long as attention's part and lowers the training loss as much, to first order
    assert by_name.loc["realstep_matched_random", "passed"]
    assert (rows[rows.part == "matched_random"].step_norm.to_numpy()
            == pytest.approx(rows[rows.part == "att"].step_norm.to_numpy(), rel=1e-12))
    assert train_rows.loc["matched_random", "dL_first"] == pytest.approx(train_rows.loc["att", "dL_first"], rel=1e-6,
                                                                         abs=1e-12)
    att = rows[rows.part == "att"]
    assert att[["vs_matched", "vs_matched_se", "vs_matched_z"]].notna().all().all()
    verdict = _analysis(obj, "real_step_verdict")
    assert list(verdict.positions) == ["(1x, 2x]", "(2x, 4x]", "(4x, 8x]", "(8x, 16x]"]
    assert set(verdict.verdict) <= {"raises", "lowers", "no effect detected", "no attention path"}
    assert (verdict.fraction_att == train_rows.loc["att", "fraction_of_update"]).all()
    vs = checks[checks.control == "realstep_vs_matched_random"]
    assert len(vs) == 4 and set(vs.kind) == {"control"} and "rollout_outcome" not in verdict
    assert _analysis(obj, "real_step_rollout").empty
    back = GradientReport.from_json(obj)  # the report reads its rows back
    assert len(back.real_step) == len(rows) and len(back.real_step_verdicts) == 4


@pytest.mark.slow  # trains a 30-step run (module fixture)
def test_cli_rollout_continues_the_run_from_the_same_state(run, capsys):
    from probe.gradients import main as gradients_main

    assert gradients_main([str(run / "step_000010.pt"), "--real-step", "--rollout", "20", *CLI_SMALL]) == 0
    out = capsys.readouterr().out
    assert "real step" in out and "rollout, 20 steps" in out and "FAIL realstep_matches" not in out
    assert gradients_main([str(run / "step_000010.pt"), "--real-step", "--rollout", "20", "--json",
                           *CLI_SMALL]) == 0
    obj = json.loads(capsys.readouterr().out)
    roll = _analysis(obj, "real_step_rollout")
    assert set(roll.positions) == set(_analysis(obj, "real_step").positions) and set(roll.rollout_steps) == {20}
    assert roll.cut_minus_kept.to_numpy() == pytest.approx((roll.loss_cut - roll.loss_kept).to_numpy(), abs=1e-9)
    verdict = _analysis(obj, "real_step_verdict")
    assert set(verdict.rollout_steps) == {20} and verdict.rollout_outcome.notna().all()
    checks = pd.DataFrame(obj["controls"]).set_index("control")
    # the kept branch is the run: its first step is the computed update, its weights the run's snapshot at step 30
    assert checks.loc["realstep_matches_adamw", "passed"] and checks.loc["rollout_reproduces_run", "value"] == 0.0
    assert set(verdict.rollout_reproduced) == {True}


def test_cli_real_step_refuses_a_checkpoint_without_the_optimizer_before_any_work(tmp_path, capsys, monkeypatch):
    import time

    from probe.checkpoint import checkpoint_from_model, save_checkpoint
    from probe.gradients import analysis
    from probe.gradients import main as gradients_main
    from probe.tasks import make_task

    def no_work(*args, **kwargs):
        raise AssertionError("the analysis started on a checkpoint it must refuse")

    monkeypatch.setattr(analysis, "analyze_checkpoint", no_work)
    task = make_task("interleaved", train_length=4)
    path = save_checkpoint(tmp_path / "weights.pt", checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))
    t0 = time.perf_counter()
    assert gradients_main([str(path), "--real-step"]) == 2
    assert time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1, err
    assert str(path) in err and "no optimizer state" in err and "--set train.traj_optimizer=true" in err
    # a rollout needs the real step's snapshot
    assert gradients_main([str(path), "--rollout", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --rollout") and err.count("\n") == 1


def test_cli_real_step_is_off_by_default_and_its_help_s_sizes_are_the_library_s(monkeypatch):
    from probe.gradients import analysis
    from probe.gradients import cli as gcli

    seen = []

    def capture(*args, **kwargs):
        seen.append(kwargs)
        raise RuntimeError("captured")

    monkeypatch.setattr(analysis, "analyze", capture)
    for argv in (["x.pt"], ["x.pt", "--real-step"], ["x.pt", "--real-step", "--rollout", "50", "--samples", "16",
                                                     "--la-eval-batches", "3"]):
        with pytest.raises(RuntimeError, match="captured"):
            gcli.run(gcli.COMMAND.parse(argv))
    default, real, sized = seen
    assert (default["real_step"], default["rollout"]) == (None, 0)
    assert real["real_step"] == RealStepConfig() and real["rollout"] == 0, "--real-step is the study's real step"
    assert sized["real_step"] == RealStepConfig(batch_size=16, train_eval_batches=3, eval_batches=3)
    assert sized["rollout"] == 50
    cfg = RealStepConfig()
    assert (gcli.REAL_STEP_TRAIN_BATCHES, gcli.REAL_STEP_EVAL_BATCHES, gcli.REAL_STEP_MAX_FACTOR,
            gcli.REAL_STEP_RANDOM) == (cfg.train_eval_batches, cfg.eval_batches, cfg.max_factor, cfg.n_random)
