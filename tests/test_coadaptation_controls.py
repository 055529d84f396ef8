"""The co-adaptation controls (random-path, lagged-copy-K, frozen-model-copy) and the placebo's per-step log, each
against gradients computed here by an independent route (hooks and hand-made copies of the model)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_train import (
    TASK,
    TWO_BLOCKS,
    _batch,
    _grid_toml,
    _lstm,
    _norm,
    _one_step_grads,
    _oracle,
    tiny_cfg,
    variant,
)
from test_train_wrapped import _train_cfg, factory_spec  # noqa: F401 (factory_spec is a fixture)

from probe.checkpoint import load_checkpoint, save_checkpoint
from probe.errors import ProbeError
from probe.models import HookedSequenceModel
from probe.schedules.settings import ScheduleConfig
from probe.training.overrides import build_configs
from probe.training.policies import MlpPlacebo, random_direction_seed
from probe.training.trainer import Trainer


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.flatten() @ b.flatten()) / (a.norm() * b.norm()))


def _attention_names(model) -> list[str]:
    ids = {id(p) for p in model.attention_parameters()}
    return [n for n, p in model.named_parameters() if id(p) in ids]


def _with(model, values: dict[str, torch.Tensor]):
    """A copy of ``model`` with the named parameters set to ``values``: the counterfactual, made by hand."""
    other = copy.deepcopy(model)
    params = dict(other.named_parameters())
    with torch.no_grad():
        for n, v in values.items():
            params[n].copy_(v)
    return other


def _through(model, values, batch, lstm0) -> dict[str, torch.Tensor]:
    """LSTM 0's gradient as the counterfactual policies define it, from separate forwards with hooks:
    g_cut(current) + [g_full(counterfactual) - g_cut(counterfactual)]."""
    other = _with(model, values)
    cut = _oracle(model, batch, lstm0, *[b.attn for b in model.attention_blocks])
    full_0 = _oracle(other, batch, lstm0)
    cut_0 = _oracle(other, batch, lstm0, *[b.attn for b in other.attention_blocks])
    return {n: cut[n] + full_0[n] - cut_0[n] for n in lstm0}


# --- names and settings ------------------------------------------------------------------------------------------
def test_the_controls_are_named_variants_and_the_lag_is_a_setting():
    assert variant("lagged-copy-50").cut_lag == 50 and variant("lagged-copy-250").name == "lagged-copy-250"
    assert build_configs("hybrid-joint", overrides=["schedule.variant=lagged-copy-50", "schedule.cut_lag=250"]
                         )[2].schedule.name == "lagged-copy-250"
    assert ScheduleConfig(cut="recurrent", cut_block=0, cut_mode="lagged-attention", cut_lag=7).name \
        == "cut=recurrent,cut_block=0,cut_mode=lagged-attention,cut_lag=7"  # nobody named it yet
    for name in ("random-path", "frozen-model-copy", "lagged-copy-50"):
        assert ScheduleConfig.from_dict(variant(name).to_dict()) == variant(name)
    with pytest.raises(ProbeError, match="cut_lag goes with schedule.cut_mode=lagged-attention"):
        ScheduleConfig(cut="recurrent", cut_mode="lagged-attention")
    with pytest.raises(ProbeError, match="cut_lag goes with"):
        build_configs("hybrid-joint", overrides=["schedule.variant=stopgrad-rnn0", "schedule.cut_lag=5"])
    with pytest.raises(ProbeError, match="positive number of steps"):
        ScheduleConfig(cut="recurrent", cut_mode="lagged-attention", cut_lag=0)


# --- random-path ---------------------------------------------------------------------------------------------------
def test_random_path_replaces_attentions_part_by_a_random_direction_of_its_norm_per_tensor(tmp_path):
    """LSTM 0 gets g_cut + r with |r_p| = |g_att,p| in every tensor; r is not attention's part (cosine near 0, as
    for independent directions in this many dimensions); every other parameter gets the plain gradient."""
    cfg = tiny_cfg(schedule=variant("random-path"), grad_clip=1e9)
    trainer = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path / "a", progress=False)
    model = trainer.model
    names = [n for n, _ in model.named_parameters()]
    lstm0 = _lstm(model, 0)
    cosines = []
    for step in range(12):
        batch = _batch(cfg, step)
        full = _oracle(model, batch, names)
        cut = _oracle(model, batch, lstm0, *[b.attn for b in model.attention_blocks])
        grads = _one_step_grads(trainer, step)
        for n in lstm0:
            g_att, injected = full[n] - cut[n], grads[n] - cut[n]
            assert abs(injected.norm() - g_att.norm()) <= 1e-4 * g_att.norm() + 1e-9, n
            if g_att.numel() >= 256:
                cosines.append(_cos(injected, g_att))
        assert _norm({n: grads[n] - full[n] for n in lstm0}) > 0.5 * _norm({n: full[n] - cut[n] for n in lstm0})
        for n in set(names) - set(lstm0):
            torch.testing.assert_close(grads[n], full[n], rtol=1e-4, atol=1e-7)
    cosines = torch.tensor(cosines)
    assert cosines.abs().max() < 0.3 and cosines.mean().abs() < 0.1, "orthogonal to attention's part on average"


def test_random_path_draws_from_the_run_seed_and_step_only(tmp_path):
    """The same (seed, step) gives the same direction in a fresh trainer (what resume needs); another step or seed
    another direction."""
    def injected(seed: int, step: int, out: str) -> torch.Tensor:
        cfg = tiny_cfg(schedule=variant("random-path"), grad_clip=1e9, seed=seed)
        trainer = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path / out, progress=False)
        cut = _oracle(trainer.model, _batch(cfg, step), ["blocks.0.lstm.rnn.weight_hh_l0"],
                      *[b.attn for b in trainer.model.attention_blocks])
        return _one_step_grads(trainer, step)["blocks.0.lstm.rnn.weight_hh_l0"] - cut["blocks.0.lstm.rnn.weight_hh_l0"]

    first = injected(0, 5, "a")
    assert torch.equal(first, injected(0, 5, "b"))
    assert abs(_cos(first, injected(0, 6, "c"))) < 0.3 and abs(_cos(first, injected(1, 5, "d"))) < 0.3
    assert random_direction_seed(0, 5) != random_direction_seed(0, 6) != random_direction_seed(1, 5)


def test_random_path_trains_a_wrapped_model(factory_spec, tmp_path):  # noqa: F811
    """Only the split cut's two passes are needed, which a wrapped model has: its recurrent module gets the detached
    gradient plus a direction of attention's norm."""
    from probe.external import FactoryModelConfig

    model_cfg, task = FactoryModelConfig.of(factory_spec)
    trainer = Trainer(model_cfg, task, _train_cfg("random-path"), tmp_path / "run", progress=False)
    model = trainer.model
    batch = task.sample(8, 8, seed=0)

    def loss_fn():
        logits = model(batch.tokens)
        return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(),
                                                         ignore_index=-100)

    rec = model.recurrent_parameters()
    with model.attention_detached():
        detached = torch.autograd.grad(loss_fn()[1], rec)
    full = torch.autograd.grad(loss_fn()[1], rec)
    model.zero_grad(set_to_none=True)
    trainer.schedule.gradient_policy(0).backward(model, loss_fn)
    for p, d, f in zip(rec, detached, full, strict=True):
        torch.testing.assert_close((p.grad - d).norm(), (f - d).norm(), rtol=1e-4, atol=1e-8)
        if p.numel() >= 256:
            assert abs(_cos(p.grad - d, f - d)) < 0.3


def test_the_counterfactual_controls_refuse_a_wrapped_model_in_one_line(factory_spec, tmp_path):  # noqa: F811
    from probe.external import FactoryModelConfig

    model_cfg, task = FactoryModelConfig.of(factory_spec)
    for name in ("lagged-copy-50", "frozen-model-copy"):
        with pytest.raises(ProbeError, match="cut needs probe's own blocks") as e:
            Trainer(model_cfg, task, _train_cfg(name), tmp_path / name, progress=False)
        assert "\n" not in str(e.value) and "random-path" in str(e.value)


# --- lagged-copy-K -------------------------------------------------------------------------------------------------
LAG = ScheduleConfig(cut="recurrent", cut_block=0, cut_mode="lagged-attention", cut_lag=3)


def test_lagged_copy_learns_through_attention_as_it_was_k_steps_before(tmp_path):
    """At step t, LSTM 0's gradient goes through attention's weights of step max(t - k, 0), recorded here before
    each step; neither k - 1 nor k + 1 steps back gives it, nor the plain gradient."""
    cfg = tiny_cfg(schedule=LAG, grad_clip=1e9, lr=0.03, warmup=1)
    trainer = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path, progress=False)
    model = trainer.model
    attn, lstm0 = _attention_names(model), _lstm(model, 0)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    for step in range(8):
        params = dict(model.named_parameters())
        seen[step] = {n: params[n].detach().clone() for n in attn}
        before = copy.deepcopy(model)
        trainer.train_step(step)  # the update happens; the step's gradient stays in .grad (no clipping at 1e9)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if n in lstm0}
        batch = _batch(cfg, step)
        want = _through(before, seen[max(step - 3, 0)], batch, lstm0)
        for n in lstm0:
            torch.testing.assert_close(grads[n], want[n], rtol=1e-4, atol=1e-6)
        if step >= 5:  # attention has moved enough for a wrong lag, or none, to be seen
            full = _oracle(before, batch, lstm0)
            for wrong in (step - 2, step - 4):
                off = _through(before, seen[wrong], batch, lstm0)
                assert _norm({n: off[n] - want[n] for n in lstm0}) > 0.02 * _norm(want)
            assert _norm({n: full[n] - want[n] for n in lstm0}) > 0.05 * _norm(want)
    assert sorted(trainer.schedule.history.kept) == [5, 6, 7], "k copies kept between steps, no more"


def test_lagged_copy_resumes_exactly_from_a_checkpoint_and_keeps_its_copies_out_of_snapshots(tmp_path):
    cfg = tiny_cfg(schedule=LAG, steps=10, lr=0.03, warmup=1)
    first = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path, progress=False)
    for step in range(5):
        first.train_step(step)
    first.step = 5
    ckpt = first.checkpoint()
    assert [s for s, _ in ckpt.extra["schedule_state"]["attention_history"]] == [2, 3, 4]
    assert "attention_history" not in first.checkpoint(with_optimizer=False).extra["schedule_state"]
    save_checkpoint(tmp_path / "last.pt", ckpt)
    resumed = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path, progress=False)
    assert resumed.resume()
    for trainer in (first, resumed):
        trainer.train_step(5)
    for (n, p), q in zip(first.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), n

    ckpt.extra["schedule_state"].pop("attention_history")  # a checkpoint without the copies cannot continue exactly
    save_checkpoint(tmp_path / "last.pt", ckpt)
    blind = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path, progress=False)
    assert blind.resume()
    with pytest.raises(ProbeError, match="needs those of step 2"):
        blind.train_step(5)


# --- frozen-model-copy ---------------------------------------------------------------------------------------------
def test_frozen_model_copy_learns_through_the_initial_model_with_its_current_lstm(tmp_path):
    """The counterfactual is the whole model at the seed's initial weights except LSTM 0 (and its pre-LN), which is
    current: built here from the seed by hand. It differs from frozen-copy's, whose MLPs and embeddings are current,
    and from the plain gradient; at step 0 it is the plain gradient."""
    cfg = tiny_cfg(schedule=variant("frozen-model-copy"), grad_clip=1e9)
    fresh = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path / "a", progress=False)
    names = [n for n, _ in fresh.model.named_parameters()]
    plain = _oracle(fresh.model, _batch(cfg, 3), names)
    at_init = _one_step_grads(fresh, 3)
    for n in names:
        torch.testing.assert_close(at_init[n], plain[n], rtol=1e-4, atol=1e-7)

    trainer = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path / "b", progress=False)
    model = trainer.model
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # every weight moves, as training would move it, LSTM 0's included
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    grads = _one_step_grads(trainer, 3)
    assert not any(b.attn_stopgrad for b in model.attention_blocks)

    torch.manual_seed(cfg.seed)
    initial = dict(HookedSequenceModel(TWO_BLOCKS).named_parameters())  # the seed's initialisation, rebuilt here
    lstm0 = _lstm(model, 0)
    batch = _batch(cfg, 3)
    want = _through(model, {n: initial[n].detach() for n in names if n not in lstm0}, batch, lstm0)
    full = _oracle(model, batch, names)
    for n in lstm0:
        torch.testing.assert_close(grads[n], want[n], rtol=1e-4, atol=1e-6)
    for n in set(names) - set(lstm0):
        torch.testing.assert_close(grads[n], full[n], rtol=1e-4, atol=1e-7)
    frozen_copy = _through(model, {n: initial[n].detach() for n in _attention_names(model)}, batch, lstm0)
    assert _norm({n: frozen_copy[n] - want[n] for n in lstm0}) > 0.1 * _norm(want), "not frozen-copy's"
    assert _norm({n: full[n] - want[n] for n in lstm0}) > 0.1 * _norm(want), "not the plain gradient"
    everything = _through(model, {n: initial[n].detach() for n in names}, batch, lstm0)  # LSTM 0 reset too
    assert _norm({n: everything[n] - want[n] for n in lstm0}) > 0.1 * _norm(want), "LSTM 0 stays current"


# --- the placebo's log ---------------------------------------------------------------------------------------------
def _placebo_norms(model, batch) -> dict[str, float]:
    lstm0 = _lstm(model, 0)
    attn, mlps = [b.attn for b in model.attention_blocks], [b.mlp for b in model.blocks]
    full, no_att = _oracle(model, batch, lstm0), _oracle(model, batch, lstm0, *attn)
    neither = _oracle(model, batch, lstm0, *attn, *mlps)
    att = _norm({n: full[n] - no_att[n] for n in lstm0})
    mlp = _norm({n: no_att[n] - neither[n] for n in lstm0})
    return {"placebo_attention_norm": att, "placebo_mlp_norm": mlp, "placebo_removed_norm": min(att, mlp)}


def test_the_placebo_logs_each_steps_norms_to_metrics_jsonl_across_a_resume(tmp_path):
    """Every step's line holds the norm of attention's path, of the MLP path, the norm removed and whether the cap
    bound, as computed here from the weights the step started from (the seed's, and a checkpoint's)."""
    cfg = tiny_cfg(schedule=variant("placebo"), steps=6, ckpt_every=3, eval_every=3)
    Trainer(TWO_BLOCKS, TASK, cfg, tmp_path, progress=False).run(until=3)
    torch.manual_seed(cfg.seed)
    expected = {1: _placebo_norms(HookedSequenceModel(TWO_BLOCKS).train(), _batch(cfg, 0))}
    at3 = HookedSequenceModel(TWO_BLOCKS).train()
    at3.load_state_dict(load_checkpoint(tmp_path / "last.pt").state_dict)
    expected[4] = _placebo_norms(at3, _batch(cfg, 3))
    resumed = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path, progress=False)
    assert resumed.resume()
    resumed.run(until=4)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r for r in lines if "placebo_attention_norm" in r}
    assert sorted(logged) == [1, 2, 3, 4], "one line per step, none repeated by the resume"
    assert [r["step"] for r in lines if "state_acc_1x" in r] == [3], "the evaluation lines are as before"
    for step, want in expected.items():
        for key, value in want.items():
            assert logged[step][key] == pytest.approx(value, rel=1e-4), (step, key)
        assert logged[step]["placebo_cap_bound"] == (want["placebo_attention_norm"] > want["placebo_mlp_norm"])
        assert logged[step]["placebo_scale"] == pytest.approx(want["placebo_removed_norm"]
                                                              / want["placebo_mlp_norm"], rel=1e-4)


@pytest.mark.parametrize("mlp_scale, binds", [(1.0, False), (1e-3, True)])
def test_the_placebo_log_says_whether_the_cap_bound(mlp_scale, binds, tmp_path):
    """With the MLPs' output shrunk, their path holds less than attention's: all of it is removed, the removed norm
    falls short of attention's and the log says the cap bound."""
    trainer = Trainer(TWO_BLOCKS, TASK, tiny_cfg(schedule=variant("placebo")), tmp_path, progress=False)
    model = trainer.model
    with torch.no_grad():
        for b in model.blocks:
            for p in b.mlp.parameters():
                p.mul_(mlp_scale)
    batch = _batch(trainer.cfg, 3)  # a batch where the tiny model's MLP path holds more than attention's
    policy = MlpPlacebo(0)
    assert policy.log is None
    policy.backward(model, lambda: (None, model(batch.tokens, labels=batch.labels)))
    want = _placebo_norms(model, batch)
    assert policy.log["placebo_cap_bound"] is binds
    assert (want["placebo_attention_norm"] > want["placebo_mlp_norm"]) is binds
    assert policy.log["placebo_removed_norm"] == pytest.approx(want["placebo_removed_norm"], rel=1e-4)
    assert policy.log["placebo_scale"] == pytest.approx(1.0 if binds else want["placebo_attention_norm"]
                                                        / want["placebo_mlp_norm"], rel=1e-4)


# --- the grid that runs them ---------------------------------------------------------------------------------------
def test_the_second_coadaptation_grid_runs_each_control_at_the_mechanism_grids_settings_to_16x():
    """Eight seeds of each variant, nothing but the schedule (and seed) differing from the mechanism grid's joint,
    evaluated at 1x and to 16x (so its windows of positions reach 400)."""
    import dataclasses

    from probe.results.config import eval_lengths_for, load_config

    joint = next(r for r in load_config(_grid_toml("mechanism")).runs("/tmp/unused") if r.key == "joint/seed0")
    joint_cfg = build_configs(joint.preset, joint.task, list(joint.overrides), steps=joint.steps, seed=joint.seed)
    grid = load_config(_grid_toml("coadaptation2"))
    assert eval_lengths_for(grid.eval_lengths, 25)[0] == 25 and max(eval_lengths_for(grid.eval_lengths, 25)) == 400
    names: dict[str, list[int]] = {}
    for run in grid.runs("/tmp/unused"):
        model_cfg, task_cfg, train_cfg = build_configs(run.preset, run.task, list(run.overrides), steps=run.steps,
                                                       seed=run.seed)
        folder = run.key.split("/")[0]
        assert train_cfg.schedule.name == folder, "each folder is named by its variant"
        assert model_cfg == joint_cfg[0] and task_cfg == joint_cfg[1]
        same = dataclasses.replace(train_cfg, seed=joint.seed, schedule=joint_cfg[2].schedule)
        assert same == joint_cfg[2], f"{folder}: only the schedule and seed differ from the mechanism grid's joint"
        names.setdefault(folder, []).append(run.seed)
    assert set(names) >= {"joint", "stopgrad-rnn0", "random-path", "lagged-copy-50", "lagged-copy-250",
                          "frozen-model-copy"}
    assert all(len(seeds) >= 8 for seeds in names.values())
