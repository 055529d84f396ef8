"""Linear probes and interchange interventions: positive, negative and identity controls on tiny models."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from probe.checkpoint import checkpoint_from_model, save_checkpoint
from probe.evaluate import accuracy_at_length
from probe.models import ModelConfig
from probe.patching import interchange_intervention, interchange_pair
from probe.probes import collect_activations, control_labels, fit_probe, headline, main, probe_model
from probe.schedules import ScheduleConfig
from probe.tasks import make_task
from probe.train import TrainConfig, Trainer

from conftest import tiny_model


@pytest.fixture(scope="module")
def modsum_lstm(tmp_path_factory):
    """A model whose state is known: a 1-layer LSTM trained to track s_t mod 3 (perfect up to 3x its length)."""
    task = make_task("modsum", m=3, n_keys=1, n_values=1, train_length=8)
    cfg = ModelConfig(family="lstm", vocab_size=task.vocab_size, d_model=32, n_layers=1, n_heads=1)
    train_cfg = TrainConfig(steps=400, batch_size=32, lr=1e-2, warmup=20, eval_every=400, ckpt_every=400,
                            traj_every=400, schedule=ScheduleConfig(kind="joint"))
    trainer = Trainer(cfg, task, train_cfg, tmp_path_factory.mktemp("modsum"), progress=False)
    trainer.run()
    model = trainer.model.eval()
    assert accuracy_at_length(model, task, 24, 128)["state"]["token_acc"] > 0.98  # precondition of the controls
    return model, task


def no_hooks_left(model) -> bool:
    return all(not hp.fwd_hooks and not hp.bwd_hooks for hp in model.hook_dict.values()) and \
        all(layer._override is None for layer in model.lstm_layers)


def test_probe_finds_the_state_of_a_state_tracker(modsum_lstm):
    model, task = modsum_lstm
    res = probe_model(model, task, hooks=["lstm.hook_h"], n_train=64, n_test=32, patching=False)
    rows = res.by_length
    assert list(rows.length) == [8, 16, 24, 32]
    assert (rows.probe_acc > 0.95).all()
    assert (rows.probe_acc > rows.majority_acc + 0.5).all()
    # a random LSTM of the same shape does not carry s_t beyond the first positions
    assert (rows.probe_acc - rows.random_init_acc > 0.4).all()
    assert (rows.selectivity > 0.3).all()
    assert rows.converged.all()
    assert no_hooks_left(model)


def test_shuffled_labels_are_not_decodable(modsum_lstm):
    model, task = modsum_lstm
    hooks = ["blocks.0.lstm.hook_h"]
    train = collect_activations(model, task, [8], 64, hooks, seed=1)
    test = collect_activations(model, task, [16], 32, hooks, seed=2)
    shuffled = np.random.default_rng(0).permutation(train.labels)
    x, xt = train.features[hooks[0]], test.features[hooks[0]]
    acc_shuffled = (fit_probe(x, shuffled).predict(xt) == test.labels).mean()
    acc_real = (fit_probe(x, train.labels).predict(xt) == test.labels).mean()
    assert acc_real > 0.95
    assert acc_shuffled < 1 / task.m + 0.12


def test_controls_are_reported(modsum_lstm):
    model, task = modsum_lstm
    res = probe_model(model, task, hooks=["lstm.hook_h", "hook_resid_post"], lengths=[8, 24], n_train=48,
                      n_test=24, n_patch=24)
    shuffled = res.controls[res.controls.control == "shuffled_labels"].iloc[0]
    assert shuffled.passed and shuffled.acc < 1 / task.m + 0.12
    identity = res.controls[res.controls.control == "identity_patch"]
    assert len(identity) == 2 and identity.passed.all() and (identity.changed_frac == 0).all()
    assert set(res.patching.verdict) == {"decodable, used"}
    head = headline(res)
    assert head["best_hook"] in res.hooks and head["probe_acc_1x"] > 0.95 and head["selectivity_3x"] > 0.3
    assert head["iia_1x"] > 0.95 and head["iia_3x"] > 0.95
    assert {"probe_acc", "control_task_acc", "selectivity", "random_init_acc", "majority_acc"} <= \
        set(res.by_position.columns)
    # early positions are decodable by memorising history types (the control task), later ones are not
    pos = res.by_position[(res.by_position.hook == "blocks.0.lstm.hook_h") & (res.by_position.length == 24)]
    assert pos.control_task_acc.iloc[0] > 0.9
    assert pos[pos.position_lo > 6].control_task_acc.mean() < 1 / task.m + 0.15


def test_patching_moves_answers_of_a_state_tracker(modsum_lstm):
    model, task = modsum_lstm
    res, controls = interchange_intervention(model, task, [8, 24], n=32)
    assert (res.iia > 0.95).all() and (res.iia_correct > 0.95).all()
    assert (res.base_follow < 0.05).all() and (res.unpatched_cf < 0.05).all()
    assert (res.model_acc > 0.95).all()
    assert controls.passed.all() and (controls.max_abs_logit_diff < 1e-4).all()
    assert no_hooks_left(model)


def test_state_that_is_decodable_but_cut_off_is_not_used(modsum_lstm):
    """Negative control for patching: the LSTM still computes s_t, but its output never reaches the stream."""
    model, task = modsum_lstm
    model.add_hook("blocks.0.hook_lstm_out", lambda x, hook: torch.zeros_like(x), is_permanent=True)
    try:
        res = probe_model(model, task, hooks=["lstm.hook_h"], lengths=[16], n_train=48, n_test=24, n_patch=24)
    finally:
        model.reset_hooks(including_permanent=True)
    row = res.patching.iloc[0]
    assert row.probe_acc > 0.95
    assert row.iia < 0.6 and abs(row.iia - row.unpatched_cf) < 0.05
    assert row.verdict == "decodable, not used"


def test_interchange_pair_is_a_proper_counterfactual():
    task = make_task("interleaved", m=5, train_length=8)
    pair = interchange_pair(task, 12, 6, 32, seed=3)
    base, src, pos = pair.base, pair.source, pair.position
    assert base.masks["state"][:, pos].all()
    assert torch.equal(base.tokens[:, pos + 1:], src.tokens[:, pos + 1:])
    assert torch.equal(base.tokens[:, : base.prefix_len], src.tokens[:, : base.prefix_len])
    assert (src.sums[:, pos] != base.sums[:, pos]).all()
    # the counterfactual is what the source itself must answer after t, and never the base's answer
    assert torch.equal(pair.counterfactual[pair.later], src.labels[pair.later])
    assert (pair.counterfactual[pair.later] != base.labels[pair.later]).all()


def test_control_task_is_a_random_function_of_the_history():
    tokens = torch.tensor([[1, 2, 3, 0, 4], [1, 2, 3, 1, 4], [2, 1, 3, 0, 4]])
    state = torch.ones_like(tokens, dtype=torch.bool)
    lab = control_labels(tokens, state, m=5, seed=0)
    assert torch.equal(lab[0, :3], lab[1, :3])  # same history, same label
    assert (lab >= 0).all() and (lab < 5).all()
    # a query (not a number) leaves the history unchanged: the label after it is the label without it
    q_tokens = torch.tensor([[1, 9, 2]])
    q_state = torch.tensor([[True, False, True]])
    assert control_labels(q_tokens, q_state, 5)[0, 2] == control_labels(torch.tensor([[1, 2]]), torch.ones(1, 2,
                                                                                     dtype=torch.bool), 5)[0, 1]
    assert control_labels(q_tokens, q_state, 5)[0, 1] == -1
    # not a relabelling of s_t: among positions with the same running sum the control label varies
    g = torch.Generator().manual_seed(0)
    x = torch.randint(5, (200, 10), generator=g)
    lab = control_labels(x, torch.ones_like(x, dtype=torch.bool), 5, seed=1)
    sums = x.cumsum(1) % 5
    assert all(len(torch.unique(lab[:, 5:][sums[:, 5:] == s])) == 5 for s in range(5))
    assert not torch.equal(lab, control_labels(x, torch.ones_like(x, dtype=torch.bool), 5, seed=2))
    bigram = control_labels(x, torch.ones_like(x, dtype=torch.bool), 5, control="bigram")
    same = (x[:, 3] == x[0, 3]) & (x[:, 4] == x[0, 4])
    assert (bigram[same, 4] == bigram[0, 4]).all()


def test_transformer_is_probed_without_patching(task):
    model = tiny_model("transformer", task.vocab_size, pos_encoding="sinusoidal")
    res = probe_model(model, task, lengths=[8], n_train=24, n_test=8)
    assert res.patching.empty
    assert set(res.hooks) == {f"blocks.{i}.{s}" for i in range(2) for s in ("hook_attn_out", "hook_resid_post")}


def test_cli_json_and_figures(tmp_path, capsys, modsum_lstm):
    model, task = modsum_lstm
    lstm_path = save_checkpoint(tmp_path / "lstm.pt", checkpoint_from_model(model, task))
    itask = make_task("interleaved", train_length=8)
    hybrid_path = save_checkpoint(tmp_path / "hybrid.pt", checkpoint_from_model(tiny_model("hybrid", itask.vocab_size),
                                                                                itask))
    out = tmp_path / "out"
    code = main([str(lstm_path), str(hybrid_path), "--json", "--out", str(out), "--lengths", "8,16",
                 "--n-train", "24", "--n-test", "8", "--n-patch", "8"])
    assert code == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["command"] == "probes" and len(obj["checkpoints"]) == 2
    rows = obj["results"]
    assert {r["checkpoint"] for r in rows} == {str(lstm_path), str(hybrid_path)}
    hybrid_hooks = {r["hook"] for r in rows if r["checkpoint"] == str(hybrid_path) and r["analysis"] == "probe"}
    assert "blocks.1.hook_attn_out" in hybrid_hooks and "blocks.0.lstm.hook_c" in hybrid_hooks
    assert any(r["analysis"] == "patching" and r["block"] == -1 for r in rows if r["checkpoint"] == str(hybrid_path))
    assert {c["control"] for c in obj["controls"]} == {"shuffled_labels", "identity_patch"}
    assert json.loads((out / "probes.json").read_text()) == obj
    for name in ("probes_heatmap", "probes_position", "probes_compare"):
        assert (out / f"{name}.png").stat().st_size > 10_000


@pytest.mark.parametrize("argv, message", [
    (["missing.pt"], "no such file"),
    (["{ckpt}", "--hooks", "hook_nonsense"], "no per-position hook matches"),
    (["{ckpt}", "--lengths", "0,5"], "bad --lengths"),
])
def test_cli_user_errors_exit_2(tmp_path, capsys, argv, message):
    task = make_task("interleaved", train_length=8)
    ckpt = save_checkpoint(tmp_path / "h.pt", checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))
    assert main([a.format(ckpt=ckpt) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err


def test_verdicts_name_redundant_storage():
    from probe.probes import _with_verdicts

    probes = pd.DataFrame([
        {"hook": f"blocks.{b}.lstm.hook_h", "length": 8, "probe_acc": acc, "random_init_acc": 0.1,
         "control_task_acc": 0.15, "majority_acc": 0.1, "selectivity": acc - 0.15}
        for b, acc in ((0, 0.95), (1, 0.3))])
    patch = pd.DataFrame([{"length": 8, "block": 0, "iia": 0.3}, {"length": 8, "block": 1, "iia": 0.1},
                          {"length": 8, "block": -1, "iia": 0.9}])
    verdicts = _with_verdicts(patch, probes).set_index("block").verdict
    assert verdicts[0] == "decodable, used jointly"
    assert verdicts[1] == "not decodable, used jointly"
    assert verdicts[-1] == "decodable, used"
    patch.loc[patch.block == -1, "iia"] = 0.2
    assert _with_verdicts(patch, probes).set_index("block").verdict[0] == "decodable, not used"
