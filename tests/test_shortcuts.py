"""Shortcut tests: a briefly trained learned-position Transformer is flagged, a trained LSTM is not (N/A for
positions, no drop on the window test), perturbations leave position-free models exactly unchanged, the window test
and the attention statistics recover known answers, and the CLI speaks JSON and fails in one line."""

from __future__ import annotations

import json
import math

import pytest
import torch

from probe.attention import attention_controls, entropy_vs_length, head_diagnostics, recall_targets
from probe.errors import ProbeError
from probe.models import ModelConfig
from probe.schedules import ScheduleConfig
from probe.shortcuts import (
    Perturbation,
    analyze,
    main,
    oracle_forward,
    perturbations,
    perturbed_logits,
    pooled_rows,
    position_controls,
    positional_randomization,
    running_sum_labels,
    window_test,
)
from probe.tasks import make_task
from probe.train import TrainConfig, train

from conftest import tiny_model

MODSUM3 = dict(m=3, train_length=8)


def _train(tmp_path_factory, name: str, model_cfg: ModelConfig, steps: int, lr: float):
    task = make_task("modsum", **MODSUM3)
    cfg = TrainConfig(steps=steps, batch_size=32, lr=lr, warmup=20, eval_every=steps, eval_samples=32,
                      ckpt_every=steps, traj_every=steps, schedule=ScheduleConfig(kind="joint"))
    out = tmp_path_factory.mktemp(name)
    train(model_cfg, task, cfg, out, progress=False)
    return out / "final.pt"


@pytest.fixture(scope="module")
def transformer_ckpt(tmp_path_factory):
    """A Transformer with a learned absolute-position table, trained briefly on running sums mod 3."""
    vocab = make_task("modsum", **MODSUM3).vocab_size
    cfg = ModelConfig(family="transformer", vocab_size=vocab, d_model=16, n_layers=1, n_heads=2,
                      pos_encoding="learned", max_len=64)
    return _train(tmp_path_factory, "transformer", cfg, steps=400, lr=3e-3)


@pytest.fixture(scope="module")
def lstm_ckpt(tmp_path_factory):
    """An LSTM trained on the same task: it learns the exact mod-3 counter."""
    vocab = make_task("modsum", **MODSUM3).vocab_size
    cfg = ModelConfig(family="lstm", vocab_size=vocab, d_model=16, n_layers=1, n_heads=2)
    return _train(tmp_path_factory, "lstm", cfg, steps=300, lr=1e-2)


@pytest.fixture(scope="module")
def transformer_report(transformer_ckpt):
    return analyze(transformer_ckpt, n_batches=6, batch_size=64, window_samples=256)


@pytest.fixture(scope="module")
def lstm_report(lstm_ckpt):
    return analyze(lstm_ckpt, n_batches=6, batch_size=64, window_samples=256)


# --- the controls of SPEC section 8 -----------------------------------------------------------------------------
def test_learned_position_transformer_is_flagged(transformer_report):
    pos = transformer_report.positional
    assert pos.applicable and pos.flagged
    score = pos.score.set_index("subtask").loc["all"]
    assert score.score > 0.1 and score.score_ci_low > 0, "the drop is real, not batch noise"
    state = pos.drops[pos.drops.subtask == "state"]
    assert (state["drop"] > 0).sum() >= 4, "most perturbations cost accuracy"
    assert pos.drops[pos.drops.subtask == "recall"].applicable.eq(False).all(), "modsum asks no recall questions"
    assert all(c["passed"] for c in transformer_report.controls)


def test_lstm_is_not_flagged_positions_not_applicable_and_no_window_drop(lstm_report):
    pos = lstm_report.positional
    assert not pos.applicable and not pos.flagged
    assert "not applicable" in pos.reason and "pos_encoding='none'" in pos.reason
    assert pos.drops.applicable.eq(False).all() and pos.score.score.isna().all()
    win = lstm_report.window
    assert win.applicable and not win.windowed
    assert win.table.acc_old.iloc[0] > 0.95
    assert (win.table.acc_new > 0.95).all(), "a state tracker keeps its accuracy on the new labels at every k"
    assert (win.table.retained > 0.9).all() and win.score < 0.1
    # its predictions follow the new labels, not the old ones: agreement falls to about P(label unchanged)
    assert (win.table.agree_old[win.table.k <= 2] < 0.6).all()
    assert lstm_report.heads.empty and "no attention" in lstm_report.attention_reason
    assert all(c["passed"] for c in lstm_report.controls)


@pytest.mark.parametrize("family,pos", [("lstm", "none"), ("hybrid", "none"), ("transformer", "none"),
                                        ("hybrid", "learned")])
def test_every_perturbation_leaves_a_position_free_model_exactly_unchanged(family, pos):
    task = make_task("interleaved", train_length=8)
    model = tiny_model(family, task.vocab_size, pos_encoding=pos)
    tokens = task.sample(8, 16, 0).tokens
    base = model(tokens)
    g = torch.Generator().manual_seed(0)
    for pert in perturbations([1, 3, 8]):
        assert torch.equal(perturbed_logits(model, tokens, pert, g, 21), base), pert.name
    result = positional_randomization(model, task, n_batches=2, batch_size=8)
    assert not result.applicable and not result.flagged and "not applicable" in result.reason
    controls = {c["control"]: c for c in position_controls(model, task, [1, 3])}
    assert controls["perturbation_max_abs_logit_diff"]["value"] == 0
    assert all(c["passed"] for c in controls.values())


def test_trained_lstm_checkpoint_is_exactly_invariant(lstm_ckpt):
    from probe.checkpoint import load_checkpoint

    model = load_checkpoint(lstm_ckpt).build_model()
    tokens = make_task("modsum", **MODSUM3).sample(8, 32, 1).tokens
    g = torch.Generator().manual_seed(1)
    for pert in perturbations([1, 2, 8]):
        assert torch.equal(perturbed_logits(model, tokens, pert, g, 8), model(tokens))


def test_perturbations_reach_models_that_read_positions_and_respect_their_kind():
    task = make_task("interleaved", train_length=8)
    tokens = task.sample(8, 8, 0).tokens
    g = torch.Generator().manual_seed(0)
    learned = tiny_model("transformer", task.vocab_size, pos_encoding="learned", max_len=24)
    base = learned(tokens)
    for pert in perturbations([1, 2]):
        assert not torch.allclose(perturbed_logits(learned, tokens, pert, g, 21), base), pert.name
    assert perturbed_logits(learned, tokens, Perturbation("offset", 8), g, 21) is None, "leaves the table: N/A"
    controls = {c["control"]: c for c in position_controls(learned, task, [1, 2])}
    assert controls["identity_perturbation_max_abs_diff"]["value"] == 0 and all(
        c["passed"] for c in controls.values())
    rope = tiny_model("transformer", task.vocab_size, pos_encoding="rope")
    base = rope(tokens)
    # rope depends on relative position only: an offset changes nothing (up to rounding), a permutation does
    torch.testing.assert_close(perturbed_logits(rope, tokens, Perturbation("offset", 5), g, 21), base,
                               rtol=0, atol=1e-4)
    assert not torch.allclose(perturbed_logits(rope, tokens, Perturbation("permute"), g, 21), base, atol=1e-3)
    assert not torch.allclose(perturbed_logits(rope, tokens, Perturbation("random"), g, 21), base, atol=1e-3)


def test_random_vectors_keep_the_norm_of_the_positional_code():
    model = tiny_model("transformer", pos_encoding="sinusoidal")
    tokens = torch.randint(0, 43, (4, 9))
    seen = {}
    g = torch.Generator().manual_seed(0)

    def grab(x, hook):
        seen["x"] = x

    with model.hooks(fwd_hooks=[("hook_pos_embed", grab)]):
        perturbed_logits(model, tokens, Perturbation("random"), g, 9)
    original = model.pos_embed(torch.arange(9).expand(4, 9))
    # the hook sees the original code; the replacement must match its per-position norm
    torch.testing.assert_close(seen["x"], original)
    replaced = {}
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: replaced.setdefault("r", x))]):
        perturbed_logits(model, tokens, Perturbation("random"), g, 9)
    code = replaced["r"] - model.embed(tokens)
    torch.testing.assert_close(code.norm(dim=-1), original.norm(dim=-1), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(code, original, atol=1e-2)
    assert all(not hp.has_hooks() for hp in model.hook_dict.values())


# --- window test ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["modsum", "interleaved", "coupled"])
def test_recomputed_state_labels_match_the_generator(name):
    task = make_task(name, train_length=8)
    batch = task.sample(12, 64, 3)
    labels = running_sum_labels(task, batch.tokens, batch.prefix_len)
    state = batch.masks["state"]
    assert torch.equal(labels[state], batch.labels[state])


@pytest.mark.parametrize("name", ["interleaved", "coupled"])
def test_window_test_separates_a_tracker_from_a_windowed_model(name):
    task = make_task(name, train_length=12)
    p = task.prefix_len
    tracker = window_test(oracle_forward(task, p), task, n_samples=256)
    assert (tracker.table.acc_new == 1).all() and not tracker.windowed and tracker.score == 0
    assert (tracker.table.p_label_same < 0.25).all(), "resampling really changes the labels (about 1/m stay)"
    windowed = window_test(oracle_forward(task, p, window=1), task, n_samples=256).table
    far = windowed[windowed.k >= 1]
    assert (far.agree_old == 1).all(), "answers built from the last 2 numbers ignore what lies further back"
    assert (far.acc_new - far.chance).abs().max() < 0.1, "...so on the new labels they are at chance"
    assert (far.p_label_same < 0.25).all()
    na = window_test(oracle_forward(task, p), make_task("recall"))
    assert not na.applicable and "not applicable" in na.reason


# --- attention diagnostics ----------------------------------------------------------------------------------------
def test_attention_statistics_on_known_patterns():
    assert all(c["passed"] for c in attention_controls())


def test_recall_targets_point_at_the_key_and_its_value():
    for name in ("interleaved", "coupled"):
        task = make_task(name, train_length=8)
        batch = task.sample(10, 32, 0)
        mask, key_pos = recall_targets(task, batch)
        assert mask.sum() > 0 and torch.equal(mask, batch.masks["recall"])
        assert torch.equal(batch.tokens.gather(1, key_pos + 1)[mask], batch.labels[mask])
    modsum = make_task("modsum")
    assert not recall_targets(modsum, modsum.sample(5, 4, 0))[0].any()


def test_uniform_attention_is_all_position_and_maximal_entropy():
    """W_Q = W_K = 0 makes every head uniform over the causal keys: its pattern is a function of position alone
    (pos share 1), its entropy is log(#keys) at every length, its recall mass the uniform one."""
    task = make_task("interleaved", train_length=8)
    model = tiny_model("hybrid", task.vocab_size)
    with torch.no_grad():
        for block in model.attention_blocks:
            block.attn.W_Q.weight.zero_()
            block.attn.W_Q.bias.zero_()
    heads = head_diagnostics(model, task, batch_size=32)
    assert len(heads) == 4
    assert (heads.pos_share > 1 - 1e-9).all() and (heads.content_share.abs() < 1e-9).all()
    assert (heads.entropy - heads.uniform_entropy).abs().max() < 1e-4
    assert (heads.recall_value_mass - heads.recall_uniform_mass).abs().max() < 1e-6
    assert (heads.mean_distance - heads.uniform_distance).abs().max() < 1e-4
    ent = entropy_vs_length(model, task, [4, 16], batch_size=16)
    assert (ent.norm_entropy > 1 - 1e-4).all()
    assert ent[ent.length == 16].entropy.min() > ent[ent.length == 4].entropy.max()
    with pytest.raises(ProbeError, match="no attention"):
        head_diagnostics(tiny_model("lstm", task.vocab_size), task)


# --- CLI --------------------------------------------------------------------------------------------------------
def test_cli_json_side_by_side_and_figures(transformer_ckpt, lstm_ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    code = main([str(transformer_ckpt), str(lstm_ckpt), "--json", "--out", str(out), "--batches", "2",
                 "--batch-size", "16", "--window-samples", "64", "--entropy-lengths", "4,8"])
    assert code == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["command"] == "shortcuts" and obj["checkpoints"] == [str(transformer_ckpt), str(lstm_ckpt)]
    rows = obj["results"]
    assert all("checkpoint" in r and "analysis" in r for r in rows)
    lstm_rows = [r for r in rows if r["checkpoint"] == str(lstm_ckpt)]
    score = next(r for r in lstm_rows if r["analysis"] == "shortcut_score" and r["subtask"] == "all")
    assert score["applicable"] is False and score["score"] is None and "not applicable" in score["reason"]
    assert {r["analysis"] for r in lstm_rows if r.get("applicable") is False} >= {"positional", "head", "entropy"}
    tr_rows = [r for r in rows if r["checkpoint"] == str(transformer_ckpt)]
    assert {r["analysis"] for r in tr_rows} >= {"positional", "shortcut_score", "window", "head", "entropy"}
    assert obj["controls"] and all(c["passed"] for c in obj["controls"])
    for name in ("shortcuts.json", "drops.png", "window.png", "entropy.png", "heads.png"):
        assert (out / name).stat().st_size > 0


def test_pooled_rows_average_checkpoints_of_one_label(transformer_report, lstm_report):
    rows = pooled_rows([transformer_report, transformer_report, lstm_report])
    pooled = [r for r in rows if r["analysis"] == "shortcut_score_pooled" and r["subtask"] == "all"]
    assert len(pooled) == 1 and pooled[0]["n_seeds"] == 2
    assert math.isclose(pooled[0]["score"], transformer_report.positional.overall)


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "missing.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "no such file" in err and "\n" not in err
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert main([str(bad), "--offsets", "1,x"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
