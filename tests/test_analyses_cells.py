"""Every analysis and mechanism-study schedule on every recurrent cell: tiny models through each Python API and CLI."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json

import pytest
import torch

from probe import attributions, gradients, probes, shortcuts
from probe.checkpoint import checkpoint_from_model, load_checkpoint, save_checkpoint
from probe.evaluate import accuracy_at_length
from probe.evaluate import main as evaluate_main
from probe.gradients.controls import ROUTE_TOL, SPLIT_TOL
from probe.models import SSM_RANGES, ModelConfig
from probe.schedules.points import At
from probe.schedules.settings import VARIANTS, ScheduleConfig
from probe.tasks import make_task
from probe.training.batches import train_batch_seed
from probe.training.cli import main as train_main
from probe.training.config import TrainConfig
from probe.training.overrides import build_configs
from probe.training.presets import CELL_MODELS, PRESETS
from probe.training.trainer import Trainer

from conftest import tiny_model

CELLS = {"lstm": {}, **{name: dict(fields) for name, fields in CELL_MODELS.items()}}
"""Every cell the slot takes, with the model-config fields that choose it."""
CARRIED = {"lstm": ["h", "c"], "gru": ["h"], **{f"ssm-{r}": ["h", "state"] for r in SSM_RANGES}}
"""The recurrent state each cell carries, as its hook names (study/docs/recurrent.md, "Analyses and schedules on
every cell")."""
TASK = make_task("interleaved", train_length=6)


@pytest.fixture(params=list(CELLS))
def cell(request) -> str:
    return request.param


FAST_CELLS = ("lstm", "gru", "ssm-complex")
"""The cells a whole analysis runs on in the fast tier: the gated pair and the most general scan (a complex
eigenvalue, open); the other scans differ from it only in their eigenvalues' range, and run in the slow tier."""


@pytest.fixture(params=[c if c in FAST_CELLS else pytest.param(c, marks=pytest.mark.slow) for c in CELLS])
def costly_cell(request) -> str:
    """A cell for a test that runs a whole analysis (seconds each): every cell, the ones past FAST_CELLS slow."""
    return request.param


def cell_model(cell: str, family: str = "hybrid", **kw):
    return tiny_model(family, TASK.vocab_size, **CELLS[cell], **kw)


def batch(length: int = 10, n: int = 8, seed: int = 0):
    return TASK.sample(length, n, seed)


# --- gradients: theta is the cell's own parameters, and the split is exact on every cell -------------------------
def test_gradient_theta_is_the_cells_own_parameters(cell):
    model = cell_model(cell)
    theta = gradients.lstm_parameters(model)
    assert len(theta) == 2
    for i, ps in enumerate(theta):
        assert [id(p) for p in ps] == [id(p) for p in model.blocks[i].lstm.parameters()]
    names = gradients.decomposition.lstm_parameter_names(model)
    assert names and all(n.startswith(("blocks.0.lstm.", "blocks.1.lstm.")) for n in names)
    if cell == "lstm":  # the names every shipped number was computed on, in their order
        assert names[:4] == [f"blocks.0.lstm.rnn.{n}" for n in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0",
                                                               "bias_hh_l0")]


def test_gradient_decomposition_is_exact_on_every_cell(cell):
    """Instrument checks per cell: the loss parts add up to the trainer's loss gradient, two independent cuts give
    the same g_rec, attention reaches the cell (g_att != 0) and, with every gate at 0, g_att is exactly 0."""
    model, b = cell_model(cell), batch()
    table = gradients.decompose(model, b).table()
    assert (table.loss_split_residual < SPLIT_TOL).all()
    assert gradients.route_disagreement(model, b) < ROUTE_TOL
    assert (table.att_ratio > 1e-3).all()
    model.set_attention_gate(0.0)
    v = gradients.decompose(model, b).vectors(None)
    assert float(v["g_att"].norm()) == 0.0 and float(v["g_rec"].norm()) > 0


def test_lookahead_predicts_the_real_step_on_every_cell(cell):
    """The first-order prediction matches the float64 step it takes on the cell's own weights."""
    cfg = gradients.LookaheadConfig(n_batches=3, batch_size=8, eval_batches=2, train_eval_batches=2)
    rows = gradients.measure_lookahead(cell_model(cell), TASK, None, cfg)
    assert len(rows) == 9 and (rows.first_order_error < 0.05).all()
    assert (rows[rows.part == "att"].dL_first != 0).all()


def test_trajectory_snapshots_carry_the_cells_second_moments(cell, tmp_path):
    """The trainer saves AdamW's moments of exactly the parameters the lookahead preconditions, for every cell."""
    cfg = TrainConfig(steps=4, batch_size=4, eval_every=4, eval_samples=4, ckpt_every=4, traj_every=4, warmup=1)
    model_cfg = ModelConfig(family="hybrid", vocab_size=TASK.vocab_size, d_model=16, n_layers=1, n_heads=2,
                            **CELLS[cell])
    Trainer(model_cfg, TASK, cfg, tmp_path, progress=False).run()
    snap = load_checkpoint(tmp_path / "trajectory" / "step_000004.pt")
    model = snap.build_model()
    assert set(snap.extra["lstm_adam"]["exp_avg_sq"]) == set(gradients.decomposition.lstm_parameter_names(model))
    moments = gradients.adam_moments(snap, model)
    assert moments is not None and moments.source == "trajectory"
    assert moments.v.numel() == sum(p.numel() for ps in gradients.lstm_parameters(model) for p in ps)


# --- the mechanism-study schedules on every cell ---------------------------------------------------------------
def _one_step_grads(trainer: Trainer, step: int) -> dict[str, torch.Tensor]:
    trainer.optimizer.step = lambda *a, **k: None  # read the step's gradients without moving the weights
    trainer.train_step(step)
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def _train_cfg(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(steps=8, batch_size=8, eval_every=8, eval_samples=8, ckpt_every=8, traj_every=8,
                                 lr=3e-3, warmup=1), **kw})


@pytest.mark.parametrize("cell_name", ["gru", "ssm-positive", "ssm-complex"])
def test_stopgrad_rnn_gives_every_cell_parameter_the_cut_gradient(cell_name, tmp_path):
    """``stopgrad-rnn``: every parameter of the cell (and its pre-LN) gets the gradient with attention's inputs
    detached, which differs from the full one; block 0's MLP below attention gets the full gradient."""
    cfg = _train_cfg(schedule=ScheduleConfig(**VARIANTS["stopgrad-rnn"]), grad_clip=1e9)
    model_cfg = ModelConfig(family="hybrid", vocab_size=TASK.vocab_size, d_model=16, n_layers=2, n_heads=2,
                            **CELLS[cell_name])
    trainer = Trainer(model_cfg, TASK, cfg, tmp_path, progress=False)
    grads = _one_step_grads(trainer, 3)
    model = trainer.model
    g = torch.Generator().manual_seed(train_batch_seed(cfg.seed, 3))
    b = TASK.sample(int(torch.randint(1, TASK.train_length + 1, (1,), generator=g)), cfg.batch_size, g)
    names = [n for n, _ in model.named_parameters()]

    def grad_of(detached: bool) -> dict[str, torch.Tensor]:
        with gradients.attention_inputs_detached(model) if detached else contextlib.nullcontext():
            loss = model(b.tokens, labels=b.labels)
        got = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        return {n: x for n, x in zip(names, got, strict=True) if x is not None}

    cut, full = grad_of(True), grad_of(False)
    cell_params = [n for n in names if ".lstm." in n]
    assert len(cell_params) == 2 * len(list(model.blocks[0].lstm.parameters()))
    for n in cell_params:
        torch.testing.assert_close(grads[n], cut[n], rtol=1e-4, atol=1e-7)
    for n in ("blocks.0.mlp.W_in.weight", "embed.weight"):
        torch.testing.assert_close(grads[n], full[n], rtol=1e-4, atol=1e-7)
    moved = [n for n in cell_params if n.startswith("blocks.0.lstm.") and full[n].dim() == 2]
    assert moved and all((full[n] - cut[n]).norm() > 1e-3 * full[n].norm() for n in moved)


@pytest.mark.parametrize("cell_name", ["gru", "ssm-negative"])
def test_dat_frozen_and_freeze_work_on_every_cell(cell_name, tmp_path):
    """DAT keeps attention untouched until the switch; ``frozen`` keeps attention's weights fixed while its signal
    is on; ``freeze_recurrent_after_switch`` keeps the cell fixed from the switch on."""
    model_cfg = ModelConfig(family="hybrid", vocab_size=TASK.vocab_size, d_model=16, n_layers=1, n_heads=2,
                            **CELLS[cell_name])
    for name, extra in (("dat", dict(freeze_recurrent_after_switch=True)), ("frozen", {})):
        sched = ScheduleConfig(**{**VARIANTS[name], "switch": At(step=4), **extra})
        trainer = Trainer(model_cfg, TASK, _train_cfg(schedule=sched), tmp_path / name, progress=False)
        model = trainer.model
        attn0 = [p.detach().clone() for p in model.attention_parameters()]
        cell0 = [p.detach().clone() for p in model.recurrent_parameters()]
        for step in range(4):
            trainer.train_step(step)
        assert all(torch.equal(p, q) for p, q in zip(model.attention_parameters(), attn0, strict=True))
        assert any(not torch.equal(p, q) for p, q in zip(model.recurrent_parameters(), cell0, strict=True))
        cell4 = [p.detach().clone() for p in model.recurrent_parameters()]
        for step in range(4, 8):
            trainer.train_step(step)
        assert any(not torch.equal(p, q) for p, q in zip(model.attention_parameters(), attn0, strict=True))
        frozen = all(torch.equal(p, q) for p, q in zip(model.recurrent_parameters(), cell4, strict=True))
        assert frozen == (name == "dat")


# --- probes: the state is what the cell carries ----------------------------------------------------------------
def test_probe_state_hooks_are_the_cells_carried_state(cell):
    model = cell_model(cell)
    for i in range(2):
        assert probes.state_names(model, i) == [f"blocks.{i}.lstm.hook_{s}" for s in CARRIED[cell]]
    hooks = probes.default_hooks(model)
    assert len(hooks) == len(set(hooks))
    assert all(n in hooks for i in range(2) for n in probes.state_names(model, i))
    assert ("blocks.0.lstm.hook_h+blocks.0.lstm.hook_c" in hooks) == (cell == "lstm")


def test_patching_the_carried_state_continues_the_source(cell):
    """In a model without attention, the whole carried state of every block, read from a source at t and set in
    a base that shares the source's tokens after t, makes the base's later logits the source's. Broken on purpose:
    setting the output h alone, with the base's other carried state, does not (where the cell carries more)."""
    model = cell_model(cell, family="lstm")
    pair = probes.interchange_pair(TASK, 14, 7, 8, seed=1)
    base, source, t = pair.base.tokens, pair.source.tokens, pair.position
    states = probes.lstm_states_at(model, source, t)
    with torch.no_grad():
        want = model(source)[:, t + 1:]
    torch.testing.assert_close(probes.patched_logits(model, base, t, states)[:, t + 1:], want, rtol=1e-4, atol=1e-4)
    if len(CARRIED[cell]) > 1:
        own = probes.lstm_states_at(model, base, t)
        h_only = {i: (states[i][0], *own[i][1:]) for i in states}
        got = probes.patched_logits(model, base, t, h_only)[:, t + 1:]
        assert (got - want).abs().max() > 1e-2


def test_probe_analysis_runs_on_every_cell(costly_cell):
    """The whole probe analysis on a tiny hybrid: the cell's state vectors are probed, patched and given verdicts,
    and the identity patch (the base's own state set back) changes nothing (an instrument check). Asked for one
    hook, the concatenation of every carried state (a default hook, tested above), the analysis must add each state
    vector itself for its subspace intervention; the other default hooks take the same path and would only multiply
    the probe fits."""
    cell = costly_cell
    model = cell_model(cell)
    state = [n for i in range(2) for n in probes.state_names(model, i)]
    joined = "+".join(state)
    res = probes.probe_model(model, TASK, lengths=[12], hooks=[joined], n_train=16, n_train_beyond=8, n_test=8,
                             n_patch=8)
    assert res.hooks == [joined, *state]
    assert set(res.by_length.hook) == {joined, *state}
    assert set(res.by_length[res.by_length.train_positions == "all"].hook) == set(state)  # what the subspace edits
    assert set(res.interventions.kind) == {"full", "same_sum", "subspace"}
    assert set(res.verdicts.block) == {-1, 0, 1}
    identity = res.controls[res.controls.control == "identity_patch"]
    assert len(identity) == 2 and identity.passed.all()


# --- evaluate, shortcuts, attributions: their own instrument checks pass on every cell -------------------------
def test_evaluate_counts_every_answer_on_every_cell(cell):
    acc = accuracy_at_length(cell_model(cell), TASK, 12, 8)
    assert set(acc) >= {"state", "recall"} and all(0 <= v["token_acc"] <= 1 for v in acc.values())


def test_shortcut_controls_pass_on_every_cell(costly_cell):
    cell = costly_cell
    ckpt = checkpoint_from_model(cell_model(cell), TASK)
    report = shortcuts.analyze(ckpt, n_sequences=8, lengths=[6, 12], window_samples=16)
    assert report.controls and all(c["passed"] for c in report.controls)
    assert report.attention_reason == "ok"


def test_attribution_controls_pass_on_every_cell(cell, tmp_path):
    """The recurrent-only / attention-only occlusions and the cross-position patching hold the cell's output
    (``hook_lstm_out``) exactly: their instrument checks are exact zeros for every cell."""
    path = save_checkpoint(tmp_path / "m.pt", checkpoint_from_model(cell_model(cell), TASK))
    report = attributions.analyze([path], lengths=[6], batch_size=4)
    assert report.controls and all(c["passed"] for c in report.controls)
    assert set(report.components.component) == {cell_model(cell).cfg.rnn, "attn"}  # the cell by its own name


# --- presets: each new cell alone and in the hybrid, joint and DAT ---------------------------------------------
@pytest.mark.parametrize("cell_name", list(CELL_MODELS))
def test_cell_presets_change_only_the_cell(cell_name):
    for name, base in ((cell_name, "lstm"), (f"hybrid-{cell_name}-joint", "hybrid-joint"),
                       (f"hybrid-{cell_name}-dat", "hybrid-dat")):
        assert name in PRESETS
        m, t, c = build_configs(name)
        m0, t0, c0 = build_configs(base)
        assert (m.rnn, m.ssm_range if m.rnn == "ssm" else None) == (
            CELL_MODELS[cell_name]["rnn"], CELL_MODELS[cell_name].get("ssm_range"))
        assert dataclasses.replace(m, rnn="lstm", ssm_range="positive", ssm_state=None) == m0
        assert (t, c) == (t0, c0)


NEW_PRESETS = [n for c in CELL_MODELS for n in (c, f"hybrid-{c}-joint", f"hybrid-{c}-dat")]
TINY = ["model.d_model=16", "model.n_heads=2", "task.train_length=6", "train.batch_size=4", "train.eval_samples=4"]


@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_python_m_probe_train_runs_every_cell_preset(preset, tmp_path):
    assert train_main(["--preset", preset, "--steps", "3", *[a for o in TINY for a in ("--set", o)],
                       "--out", str(tmp_path), "--no-progress"]) == 0
    final = load_checkpoint(tmp_path / "final.pt")
    fields = CELL_MODELS[preset.removeprefix("hybrid-").removesuffix("-joint").removesuffix("-dat")]
    assert final.model_config.rnn == fields["rnn"] and final.step == 3
    assert final.model_config.ssm_range == fields.get("ssm_range", "positive")
    assert final.label == preset  # a run's label names its cell and schedule as the preset does


# --- one CLI smoke per analysis on an SSM checkpoint -----------------------------------------------------------
@pytest.fixture(scope="module")
def ssm_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ssm") / "ssm.pt"
    return save_checkpoint(path, checkpoint_from_model(cell_model("ssm-complex"), TASK))


@pytest.mark.parametrize("module,args", [
    ("evaluate", ["--lengths", "6,12", "--samples", "8"]),
    ("gradients", ["--lengths", "6", "--samples", "8", "--la-batches", "2", "--la-eval-batches", "1"]),
    # one hook asked for (test_probe_analysis_runs_on_every_cell probes the SSM's every state vector)
    ("probes", ["--hooks", "lstm.hook_state", "--lengths", "12", "--n-train", "16", "--n-train-beyond", "8",
                "--samples", "8", "--n-patch", "8"]),
    ("shortcuts", ["--lengths", "6,12", "--samples", "4", "--window-samples", "8"]),
    ("attributions", ["--lengths", "6", "--samples", "4"]),
])
def test_every_analysis_cli_runs_on_an_ssm_checkpoint(module, args, ssm_checkpoint, capsys):
    main = evaluate_main if module == "evaluate" else importlib.import_module(f"probe.{module}.cli").main
    assert main([str(ssm_checkpoint), *args, "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["command"] == module and obj["results"]
