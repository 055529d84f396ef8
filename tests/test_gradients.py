"""Gradient interference and attributions: the decomposition's controls, captum attributions, trajectories, CLI."""

from __future__ import annotations

import json
import math

import matplotlib.figure
import pandas as pd
import pytest
import torch

from probe import attributions as A
from probe import gradients as G
from probe.checkpoint import checkpoint_from_model, load_checkpoint, save_checkpoint
from probe.errors import ProbeError
from probe.schedules import ScheduleConfig
from probe.train import TrainConfig, train

from conftest import tiny_model


def no_hooks(model) -> bool:
    return not any(hp.has_hooks() for hp in model.hook_dict.values())


@pytest.fixture
def batch(task):
    return task.sample(8, 24, 0)


# --- the decomposition -------------------------------------------------------------------------------------------
def test_decomposition_matches_the_training_gradient(hybrid, batch):
    dec = G.decompose(hybrid, batch)
    table = dec.table()
    assert (table.residual <= G.RESIDUAL_TOL).all()
    assert dec.forward_diff == 0.0
    # the reference is the gradient of the loss as the trainer computes it
    hybrid.zero_grad()
    hybrid(batch.tokens, labels=batch.labels).backward()
    trained = torch.cat([p.grad.flatten() for ps in G.lstm_parameters(hybrid) for p in ps])
    v = dec.vectors(None)
    assert torch.allclose(v["g_att"] + v["g_rec"], trained, rtol=0, atol=1e-6 * float(trained.norm()))
    # the per-subtask split of g_att is exact
    assert torch.allclose(v["g_att_state"] + v["g_att_recall"], v["g_att"], atol=1e-7)
    assert math.isclose(dec.losses["state"] + dec.losses["recall"], hybrid(batch.tokens, labels=batch.labels).item(),
                        rel_tol=1e-6)
    assert no_hooks(hybrid)


def test_attention_reaches_the_lstm_in_a_random_hybrid(hybrid, batch):
    total = G.interference(hybrid, batch).set_index("block").loc["all"]
    assert 0 < total.att_ratio < 1
    assert -1 <= total.cos_att_rec_state <= 1


def test_lstm_model_has_exactly_zero_attention_gradient(task, batch):
    table = G.interference(tiny_model("lstm", task.vocab_size), batch)
    assert (table.g_att_norm == 0).all() and (table.att_ratio == 0).all()
    assert (table.g_norm > 0).all()
    assert table.cos_att_rec.isna().all()  # no direction to compare


def test_gates_at_zero_give_exactly_zero_and_are_restored(hybrid, batch):
    with G.attention_gates(hybrid, 0.0):
        table = G.interference(hybrid, batch)
    assert (table.g_att_norm == 0).all()
    assert hybrid.attention_gates() == [1.0, 1.0]
    assert G.gate0_control(hybrid, batch) == 0.0
    assert G.interference(hybrid, batch).g_att_norm.gt(0).all()


def test_hand_built_attention_only_case_gives_ratio_one():
    model, batch = G.attention_only_case()
    _, cache = model.run_with_cache(batch.tokens)
    assert (cache["blocks.0.hook_lstm_out"][:, -1] == 0).all()  # the construction: nothing recurrent at the answer
    table = G.interference(model, batch)
    assert (table.g_rec_norm == 0).all() and (table.g_norm > 0).all()
    assert (table.att_ratio == 1.0).all()
    assert all(c["passed"] for c in G.builtin_controls())


def test_hooks_are_removed_even_on_error(hybrid, batch):
    with pytest.raises(RuntimeError), G.attention_inputs_detached(hybrid):
        assert not no_hooks(hybrid)
        raise RuntimeError("boom")
    assert no_hooks(hybrid)


def test_transformer_has_no_answer(task, batch):
    with pytest.raises(ProbeError, match="no LSTM"):
        G.decompose(tiny_model("transformer", task.vocab_size), batch)


# --- attributions ------------------------------------------------------------------------------------------------
def test_integrated_gradients_complete_to_the_ablation_effect(hybrid, batch):
    table = A.component_attribution(hybrid, batch, method="ig", n_steps=32)
    assert set(table.component) == {"lstm", "attn"} and len(table) == 8
    assert (table.delta <= 1e-4 * table.logit.abs().max()).all()
    assert ((table.attribution - table.ablation_effect).abs() <= 1e-4).all()
    # the ablation effect is checked against an independent ablation: zero the hook point's output
    row = table[(table.subtask == "state") & (table.block == 1) & (table.component == "attn")].iloc[0]
    keep, w = A._subtask_weights(batch, "state")
    f = A.AnswerLogit(hybrid)
    one = torch.ones(int(keep.sum()))
    args = (batch.tokens[keep], batch.labels[keep], w[keep])
    with torch.no_grad():
        clean = f(one, *args)
        with hybrid.hooks(fwd_hooks=[("blocks.1.hook_attn_out", lambda x, hook: torch.zeros_like(x))]):
            ablated = f(one, *args)
    assert math.isclose(row.ablation_effect, float((clean - ablated).mean()), rel_tol=1e-5, abs_tol=1e-7)
    assert no_hooks(hybrid)


def test_gated_off_attention_gets_no_attribution(hybrid, batch):
    with G.attention_gates(hybrid, 0.0):
        table = A.component_attribution(hybrid, batch, method="gxa")
    assert (table[table.component == "attn"].attribution == 0).all()
    assert (table[table.component == "lstm"].attribution.abs() > 0).all()
    on = A.component_attribution(hybrid, batch, method="gxa")
    assert (on[on.component == "attn"].attribution.abs() > 0).all()


def test_distance_paths_controls(task, batch):
    lstm = A.distance_attribution(tiny_model("lstm", task.vocab_size), batch)
    assert (lstm.att == 0).all() and lstm.rec.sum(dim=1).allclose(torch.ones(len(lstm.t)))
    model, hb = G.attention_only_case(length=8)
    dist = A.distance_attribution(model, hb)
    far = dist.far_share(0).set_index("path").share
    assert far["recurrent"] == 0.0 and far["attention"] > 0.05
    prof = dist.profile()
    assert math.isclose(prof.mass.sum(), 1.0, rel_tol=1e-5)


def test_distance_is_causal_and_ig_converges(hybrid, batch):
    dist = A.distance_attribution(hybrid, batch, method="ig", n_steps=32, max_targets=3)
    d = dist._distance()
    assert ((dist.rec + dist.att)[d < -1].sum() == 0) if (d < -1).any() else True
    future = (d < 0) & (d != -1)
    assert float((dist.rec + dist.att)[future].abs().sum()) == 0.0
    assert max(dist.delta) < A.DELTA_TOL
    assert len(set(dist.t.tolist())) == 3


# --- checkpoints, trajectories, CLI ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from probe.models import ModelConfig
    from probe.tasks import make_task

    root = tmp_path_factory.mktemp("runs")
    task = make_task("interleaved", train_length=8)
    model_cfg = ModelConfig(family="hybrid", vocab_size=task.vocab_size, d_model=16, n_layers=2, n_heads=2)
    out = {}
    for kind, sched, steps in (("joint", ScheduleConfig(kind="joint"), 40),
                               ("dat", ScheduleConfig(kind="delayed", switch=30), 60)):
        cfg = TrainConfig(steps=steps, batch_size=16, eval_every=steps, eval_samples=8, ckpt_every=steps,
                          traj_every=20, lr=3e-3, warmup=5, schedule=sched)
        train(model_cfg, task, cfg, root / kind, progress=False)
        out[kind] = root / kind
    return out


def test_dat_trajectory_is_zero_before_the_switch(runs):
    rep = G.analyze([runs["dat"] / "trajectory"], lengths=[8], batch_size=16)
    total = rep.interference[rep.interference.block == "all"].set_index("step")
    assert list(total.index) == [0, 20, 40, 60], total
    assert (total.loc[[0, 20], "g_att_norm"] == 0).all() and (total.loc[[0, 20], "gate"] == 0).all()
    assert (total.loc[[40, 60], "g_att_norm"] > 0).all()
    assert rep.attributions.empty  # several checkpoints: no attributions unless asked
    assert all(c["passed"] for c in rep.controls)
    snap = load_checkpoint(runs["dat"] / "trajectory" / "step_000020.pt")
    assert snap.state_dict["embed.weight"].dtype == torch.float16
    assert snap.build_model().embed.weight.dtype == torch.float32
    fig = G.plot_over_training(pd.concat([
        rep.interference, G.analyze([runs["joint"] / "trajectory"], lengths=[8], batch_size=16).interference]))
    assert isinstance(fig, matplotlib.figure.Figure)
    assert {t.get_text() for t in fig.axes[0].get_legend().get_texts()} == {"joint", "delayed"}


def test_schedule_gate_at_the_switch(runs):
    snap = load_checkpoint(runs["dat"] / "trajectory" / "step_000020.pt")
    assert G.schedule_gate(snap) == 0.0
    snap.step = 30  # a snapshot at the switch stores step 29's gate (0); the next update uses gate 1
    assert G.schedule_gate(snap) == 1.0


def test_cli_json_and_figures(runs, tmp_path, capsys):
    rc = G.main([str(runs["joint"] / "final.pt"), "--json", "--length", "8", "--batch", "16", "--attr-batch", "8",
                 "--out", str(tmp_path / "o")])
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["command"] == "gradients" and len(obj["checkpoints"]) == 1
    kinds = {r["analysis"] for r in obj["results"]}
    assert kinds == {"interference", "attribution", "distance", "far_share"}
    assert all("checkpoint" in r for r in obj["results"])
    assert all(c["passed"] for c in obj["controls"])
    assert {p.name for p in (tmp_path / "o").iterdir()} >= {"blocks.png", "attribution_distance.png",
                                                            "components.png", "results.json"}


def test_cli_human_table(runs, capsys):
    assert G.main([str(runs["joint"] / "final.pt"), "--length", "8", "--batch", "8", "--attr", "none"]) == 0
    out = capsys.readouterr().out
    assert "att_ratio" in out and "controls (" in out and "FAIL" not in out


def test_cli_answers_the_lstm_part_explicitly(task, tmp_path, capsys):
    path = tmp_path / "lstm.pt"
    save_checkpoint(path, checkpoint_from_model(tiny_model("lstm", task.vocab_size), task))
    assert G.main([str(path), "--json", "--length", "8", "--batch", "8", "--attr-batch", "4"]) == 0
    obj = json.loads(capsys.readouterr().out)
    rows = [r for r in obj["results"] if r["analysis"] == "interference"]
    assert rows and all(r["g_att_norm"] == 0 and r["cos_att_rec"] is None for r in rows)
    far = [r for r in obj["results"] if r["analysis"] == "far_share" and r["path"] == "attention"]
    assert far and all(r["share"] == 0 for r in far)
    assert G.main([str(path), "--length", "8", "--batch", "8", "--attr", "none"]) == 0
    assert "no attention sublayer" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["missing", "garbage", "transformer", "empty_dir"])
def test_cli_bad_input_exits_2_with_one_line(case, task, tmp_path, capsys):
    if case == "missing":
        arg = tmp_path / "nope.pt"
    elif case == "garbage":
        arg = tmp_path / "garbage.pt"
        arg.write_bytes(b"not a checkpoint at all")
    elif case == "transformer":
        arg = tmp_path / "t.pt"
        save_checkpoint(arg, checkpoint_from_model(tiny_model("transformer", task.vocab_size), task))
    else:
        arg = tmp_path / "empty"
        arg.mkdir()
    assert G.main([str(arg)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    if case == "transformer":
        assert "no LSTM" in err
