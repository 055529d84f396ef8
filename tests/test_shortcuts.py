"""Shortcut tests: every control passes on the right method and fails on the broken method it guards against; a
learned-position Transformer is flagged by the offset score and a trained LSTM is not; the knock-out, sum-preserving
and identity-run tests separate hand-built trackers from hand-built shortcuts; the CLI speaks JSON and fails in one
line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from probe.attention import attention_controls, entropy_vs_length, head_diagnostics, recall_targets
from probe.core.gates import attention_gates
from probe.core.stats import bootstrap_ci, wilson
from probe.errors import ProbeError
from probe.models import ModelConfig
from probe.schedules.settings import ScheduleConfig
from probe.shortcuts import (
    Perturbation,
    analyze,
    attention_knockout,
    check_perturbation,
    effects_table,
    forgetful,
    identity_run,
    identity_run_controls,
    knockout_controls,
    offset_controls,
    pad_stream,
    perturbations,
    perturbed_logits,
    pooled_rows,
    position_controls,
    position_limited,
    positional_tests,
    sum_preserving,
    sum_preserving_controls,
    sum_preserving_perturbation,
    tracker,
    window_test,
    windowed,
    zero_run,
)
from probe.shortcuts.oracles import GatedRecall
from probe.shortcuts.sampling import Sampled, baselines, sample
from probe.shortcuts.sums import Perturbed
from probe.shortcuts.window import resample_before, window_controls
from probe.tasks import make_task
from probe.training.config import TrainConfig
from probe.training.trainer import train

from conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]
MODSUM3 = dict(m=3, train_length=8)
SMALL = dict(n_sequences=48, lengths=[8, 16], runs=[8, 16], window_samples=64, entropy_lengths=[4, 8])


def _train(tmp_path_factory, name: str, model_cfg: ModelConfig, steps: int, lr: float):
    task = make_task("modsum", **MODSUM3)
    cfg = TrainConfig(steps=steps, batch_size=32, lr=lr, warmup=20, eval_every=steps, eval_samples=32,
                      ckpt_every=steps, traj_every=steps, schedule=ScheduleConfig())
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
    return analyze(transformer_ckpt, **SMALL)


@pytest.fixture(scope="module")
def lstm_report(lstm_ckpt):
    return analyze(lstm_ckpt, **SMALL)


@pytest.fixture(scope="module")
def interleaved():
    return make_task("interleaved", train_length=12)


def _passed(rows):
    return {c["control"]: c["passed"] for c in rows}


# --- the task's own labels ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,kw", [("modsum", {}), ("modsum", {"last_only": True}), ("recall", {}),
                                     ("interleaved", {}), ("coupled", {})])
def test_relabel_reproduces_the_generator(name, kw):
    task = make_task(name, train_length=8, **kw)
    for seed, length in [(0, 1), (1, 7), (2, 40)]:
        batch = task.sample(length, 64, seed)
        again = task.relabel(batch.tokens)
        assert torch.equal(again.labels, batch.labels) and torch.equal(again.sums, batch.sums)
        assert all(torch.equal(again.masks[s], batch.masks[s]) for s in batch.masks)


def test_relabel_refuses_tokens_that_are_not_a_task_sequence(interleaved):
    batch = interleaved.sample(10, 4, 0)
    bad = batch.tokens.clone()
    bad[:, -1] = interleaved.sep
    with pytest.raises(ProbeError, match="not a interleaved sequence"):
        interleaved.relabel(bad)
    missing = batch.tokens.clone()
    keys = set(missing[0, 0:12:2].tolist())
    missing[0, -1] = next(k for k in range(interleaved.key_offset, interleaved.value_offset) if k not in keys)
    with pytest.raises(ProbeError, match="not in the dictionary"):
        interleaved.relabel(missing)


# --- intervals ----------------------------------------------------------------------------------------------------
def test_wilson_and_bootstrap_intervals():
    lo, hi = wilson(0, 100)
    assert lo == 0 and 0.03 < hi < 0.04, "0 of 100 still bounds the rate at about 3.7 %"
    lo, hi = wilson(50, 100)
    assert 0.40 < lo < 0.41 and 0.59 < hi < 0.60
    same = pd.Series([3.0] * 20).to_numpy()
    assert bootstrap_ci(lambda i: same[i].mean(1), 20) == (3.0, 3.0)
    x = torch.arange(200, dtype=torch.float64).numpy()
    lo, hi = bootstrap_ci(lambda i: x[i].mean(1), 200)
    assert lo < x.mean() < hi and hi - lo < 20


# --- oracles ------------------------------------------------------------------------------------------------------
def test_oracles_answer_iid_streams_as_designed(interleaved):
    batch = interleaved.sample(30, 64, 0)
    for oracle in (tracker(interleaved), forgetful(interleaved, 8)):
        pred = oracle(batch.tokens).argmax(-1)
        assert torch.equal(pred[batch.answer_mask], batch.labels[batch.answer_mask]), "exact on i.i.d. streams"
    limited = position_limited(interleaved, 6)(batch.tokens).argmax(-1)
    stream = torch.arange(batch.tokens.shape[1]) - batch.prefix_len
    early, late = batch.masks["state"] & (stream < 6), batch.masks["state"] & (stream >= 6)
    assert torch.equal(limited[early], batch.labels[early]) and (limited[late] != batch.labels[late]).all()
    local = windowed(interleaved, 1)(batch.tokens).argmax(-1)
    assert (local[batch.masks["state"]] != batch.labels[batch.masks["state"]]).float().mean() > 0.5


# --- attention knock-out --------------------------------------------------------------------------------------------
def test_knockout_finds_attention_where_an_answer_needs_it(interleaved):
    table = attention_knockout(GatedRecall(interleaved), interleaved, [12, 24], n_sequences=64)
    effect = table.set_index(["length", "blocks", "subtask"]).effect
    for length in (12, 24):
        assert effect[(length, "1", "recall")] > 0.8 and effect[(length, "all", "recall")] > 0.8
        assert effect[(length, "0", "recall")] == 0 and effect[(length, "0", "state")] == 0
        assert effect[(length, "1", "state")] == 0
    lstm = attention_knockout(tiny_model("lstm", interleaved.vocab_size), interleaved, [12], n_sequences=8)
    assert not lstm.applicable.any() and lstm.reason.str.contains("no attention").all()


def test_knockout_on_the_shipped_dat_hybrid():
    """DAT's recall goes through attention (a real model that needs it: with both gates at 0 recall falls to about
    chance); with every attention output weight zeroed (attention it cannot use) no knock-out changes an answer."""
    from probe.checkpoint import load_checkpoint

    ckpt = load_checkpoint(ROOT / "checkpoints" / "hybrid-dat.pt")
    model, task = ckpt.build_model(), ckpt.task_config
    effect = attention_knockout(model, task, [25], n_sequences=32).set_index(["blocks", "subtask"]).effect
    assert effect[("all", "recall")] > 0.5 and effect[("all", "state")] == 0
    assert model.attention_gates() == [1.0, 1.0]
    assert _passed(knockout_controls(model, task, n_sequences=32)) == {
        "knockout_recall_oracle_block1": True, "knockout_unused_attention_changes_nothing": True,
        "knockout_restores_gates": True}


def test_gates_are_restored_even_on_an_exception(hybrid):
    with pytest.raises(RuntimeError), attention_gates(hybrid, 0.0):
        assert hybrid.attention_gates() == [0.0, 0.0]
        raise RuntimeError("boom")
    assert hybrid.attention_gates() == [1.0, 1.0]


class _GateIgnoring:
    """The model, except that every gate change is dropped."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def set_attention_gate(self, value):
        pass


def _knockout_that_sets_no_gate(model, task, lengths=None, n_sequences=256, seed=0, baseline=None, progress=False):
    return attention_knockout(_GateIgnoring(model), task, lengths, n_sequences, seed, baseline)


def _knockout_of_the_wrong_block(model, task, lengths=None, n_sequences=256, seed=0, baseline=None, progress=False):
    table = attention_knockout(model, task, lengths, n_sequences, seed, baseline)
    return table.assign(blocks=table.blocks.replace({"0": "1", "1": "0"}))


def _knockout_that_leaves_gates_off(model, task, lengths=None, n_sequences=256, seed=0, baseline=None,
                                    progress=False):
    table = attention_knockout(model, task, lengths, n_sequences, seed, baseline)
    model.set_attention_gate(0.0)
    return table


def _unpaired_knockout(model, task, lengths=None, n_sequences=256, seed=0, baseline=None, progress=False):
    """Broken: the unperturbed answers come from other sequences than the knocked-out ones."""
    lengths = lengths or [task.train_length]
    mine, other = (baselines(model, task, lengths, n_sequences, s) for s in (seed, seed + 1))
    return attention_knockout(model, task, lengths, n_sequences, seed,
                              {n: Sampled(mine[n].batch, other[n].pred) for n in lengths})


@pytest.mark.parametrize("broken,control", [
    (_knockout_that_sets_no_gate, "knockout_recall_oracle_block1"),
    (_knockout_of_the_wrong_block, "knockout_recall_oracle_block1"),
    (_knockout_that_leaves_gates_off, "knockout_restores_gates"),
    (_unpaired_knockout, "knockout_unused_attention_changes_nothing"),
])
def test_each_knockout_control_fails_on_its_broken_method(broken, control):
    from probe.checkpoint import load_checkpoint

    ckpt = load_checkpoint(ROOT / "checkpoints" / "hybrid-dat.pt")
    model, task = ckpt.build_model(), ckpt.task_config
    assert _passed(knockout_controls(model, task, n_sequences=32))[control]
    assert not _passed(knockout_controls(model, task, n_sequences=32, method=broken))[control]


# --- sum-preserving perturbation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["modsum", "interleaved", "coupled"])
def test_sum_preserving_perturbation_moves_two_stream_numbers_and_keeps_later_labels(name):
    task = make_task(name, train_length=12)
    for seed, k in [(0, 2), (1, 3), (2, 10)]:
        batch = sample(task, 30, 128, seed)
        pert = sum_preserving_perturbation(task, batch, k, torch.Generator().manual_seed(seed))
        assert pert.valid.float().mean() > 0.5
        assert check_perturbation(task, batch, pert, k) == (0, "ok")
        moved = (pert.tokens != batch.tokens)
        assert (moved.sum(1)[pert.valid] == 2).all() and not moved[~pert.valid].any()
        assert not moved[:, : batch.prefix_len].any(), "never the dictionary"
        assert (batch.tokens[moved] < task.m).all(), "never a query key"


def _perturb_plus_plus(task, batch, k, g):
    """Broken: both numbers move by +d, so the sum after them changes by 2d."""
    p = sum_preserving_perturbation(task, batch, k, g)
    tokens = p.tokens.clone()
    rows = torch.arange(len(tokens))[p.valid]
    d = (batch.tokens[rows, p.i[p.valid]] - p.tokens[rows, p.i[p.valid]]) % task.m
    tokens[rows, p.i[p.valid]] = (batch.tokens[rows, p.i[p.valid]] + d) % task.m
    return Perturbed(tokens, p.target, p.i, p.j)


def _perturb_a_query(task, batch, k, g):
    """Broken: the first moved position may be a query key (it becomes a number)."""
    p = sum_preserving_perturbation(task, batch, k, g)
    tokens = p.tokens.clone()
    queries = batch.masks["recall"]
    rows = torch.arange(len(tokens))[queries.any(1)]
    first = queries.to(torch.int8).argmax(1)[rows]
    tokens[rows, first] = 0
    return Perturbed(tokens, p.target, torch.where(queries.any(1), queries.to(torch.int8).argmax(1), p.i), p.j)


def _perturb_nothing(task, batch, k, g):
    """Broken: d = 0."""
    p = sum_preserving_perturbation(task, batch, k, g)
    return Perturbed(batch.tokens.clone(), p.target, p.i, p.j)


@pytest.mark.parametrize("broken,failing", [
    (_perturb_plus_plus, {"sum_preserving_labels_unchanged", "sum_preserving_tracker_oracle"}),
    (_perturb_a_query, {"sum_preserving_labels_unchanged"}),
    (_perturb_nothing, {"sum_preserving_labels_unchanged", "sum_preserving_windowed_oracle"}),
])
def test_each_sum_preserving_control_fails_on_its_broken_perturbation(interleaved, broken, failing):
    right = _passed(sum_preserving_controls(interleaved, [12, 24], n_sequences=64))
    assert all(right.values())
    wrong = _passed(sum_preserving_controls(interleaved, [12, 24], n_sequences=64, perturb=broken))
    assert {c for c, ok in wrong.items() if not ok} >= failing


@pytest.mark.slow  # trains a 300-400-step model (module fixture)
def test_sum_preserving_separates_a_tracker_from_a_local_shortcut(interleaved, lstm_ckpt):
    exact = sum_preserving(tracker(interleaved), interleaved, [12, 36], n_sequences=128).table
    assert (exact.effect == 0).all() and not exact.flagged.any() and (exact.changed_if_right == 0).all()
    local = sum_preserving(windowed(interleaved, 1), interleaved, [12, 36], n_sequences=128).table
    assert (local.effect > 0.3).all() and local.flagged.all()
    from probe.checkpoint import load_checkpoint

    ckpt = load_checkpoint(lstm_ckpt)
    lstm = sum_preserving(ckpt.build_model(), ckpt.task_config, [8], (3, 6), n_sequences=128).table
    assert (lstm.effect < 0.02).all() and not lstm.flagged.any(), "at L_train the trained mod-3 counter tracks"


# --- identity run -------------------------------------------------------------------------------------------------
def test_identity_run_separates_a_tracker_from_a_counting_model(interleaved):
    exact = identity_run(tracker(interleaved), interleaved, [10, 30], n_sequences=64)
    assert exact.violations == 0 and (exact.table.effect == 0).all() and (exact.table.acc == 1).all()
    counting = identity_run(forgetful(interleaved, 8), interleaved, [10, 30], n_sequences=64).table
    after = counting[(counting["where"] == "after") & (counting.subtask == "state")]
    late, opening = after[after["head"] > 0], after[after["head"] == 0]
    assert (late.baseline_acc == 1).all() and (late.acc < 0.3).all() and late.flagged.all()
    assert len(opening) and (opening.effect == 0).all(), "forgetting a sum of 0 loses nothing"
    recall = counting[counting.subtask == "recall"]
    assert (recall.effect == 0).all(), "recall does not go through the forgotten sum"


def _run_of_ones(task, batch, head, r):
    tokens = zero_run(task, batch, head, r)
    tokens[:, batch.prefix_len + head: batch.prefix_len + head + r] = 1
    return tokens


def _run_that_touches_the_tail(task, batch, head, r):
    tokens = zero_run(task, batch, head, r)
    last = tokens[:, -1]
    tokens[:, -1] = torch.where(last < task.m, (last + 1) % task.m, last)
    return tokens


def _no_run(task, batch, head, r):
    return batch.tokens.clone()


@pytest.mark.parametrize("broken,failing", [
    (_run_of_ones, {"identity_run_is_identity"}),
    (_run_that_touches_the_tail, {"identity_run_is_identity"}),
    (_no_run, {"identity_run_is_identity", "identity_run_forgetful_oracle"}),
])
def test_each_identity_run_control_fails_on_its_broken_run(interleaved, broken, failing):
    assert all(_passed(identity_run_controls(interleaved, [10, 30])).values())
    wrong = _passed(identity_run_controls(interleaved, [10, 30], make_run=broken))
    assert {c for c, ok in wrong.items() if not ok} >= failing


def test_identity_run_tracker_control_fails_when_answers_are_read_at_the_wrong_position(interleaved, monkeypatch):
    """Broken measurement: every answer of the run sequences read one position late."""
    import probe.shortcuts.runs as module

    right = module.predict
    assert _passed(identity_run_controls(interleaved, [10, 30]))["identity_run_tracker_oracle"]
    monkeypatch.setattr(module, "predict", lambda forward, tokens: torch.roll(right(forward, tokens), 1, dims=1))
    assert not _passed(identity_run_controls(interleaved, [10, 30]))["identity_run_tracker_oracle"]


# --- positional offset and position dependence --------------------------------------------------------------------
@pytest.mark.slow  # trains a 300-400-step model (module fixture)
def test_learned_position_transformer_is_flagged(transformer_report):
    pos = transformer_report.positional
    assert pos.applicable and pos.flagged and pos.headline == "index"
    score = pos.score_of("index", "all")
    assert score.effect > 0.1 and score.ci_low > 0, "the drop is real, not sampling noise"
    assert set(pos.dependence.perturbation) == {"random", "permute"}
    state = pos.offset[(pos.offset.subtask == "state") & (pos.offset.method == "index")]
    assert (state.effect > 0).sum() >= 2, "most offsets cost accuracy"
    assert not pos.offset[pos.offset.subtask == "recall"].applicable.any(), "modsum asks no recall questions"
    assert all(c["passed"] for c in transformer_report.controls)


@pytest.mark.slow  # trains a 300-400-step model (module fixture)
def test_lstm_is_not_flagged_and_is_a_tracker_on_every_test(lstm_report):
    pos = lstm_report.positional
    assert not pos.applicable and not pos.flagged and pos.headline == "pad"
    assert "not applicable" in pos.reason and "pos_encoding='none'" in pos.reason
    assert not pos.dependence.applicable.any()
    pad = pos.score_of("pad", "state")
    assert pad.applicable and pad.effect < 0.05
    assert not lstm_report.knockout.applicable.any()
    tests = lstm_report.tests
    assert tests[(tests.test == "sum_preserving") & (tests.length == 8)].effect.max() < 0.02
    win = lstm_report.window
    assert win.applicable and not win.windowed and (win.table.acc_new > 0.95).all()
    assert (win.table.agree_old[win.table.k <= 2] < 0.6).all(), "its predictions follow the new labels"
    assert lstm_report.heads.empty and "no attention" in lstm_report.attention_reason
    assert all(c["passed"] for c in lstm_report.controls)


def _pad_with_ones(tokens, prefix_len, k):
    return pad_stream(tokens, prefix_len, k).index_fill(1, torch.arange(prefix_len, prefix_len + k), 1)


def _pad_nothing(tokens, prefix_len, k):
    return torch.cat([tokens, torch.zeros(len(tokens), k, dtype=tokens.dtype)], dim=1)


@pytest.mark.parametrize("broken", [_pad_with_ones, _pad_nothing])
def test_each_offset_control_fails_on_its_broken_padding(interleaved, broken):
    assert all(_passed(offset_controls(interleaved)).values())
    wrong = _passed(offset_controls(interleaved, pad=broken))
    assert not wrong["offset_tracker_oracle"]


def test_offset_position_control_fails_when_the_shift_never_reaches_the_model(interleaved, monkeypatch):
    """Broken method: the index shift is computed but the model is called without the shifted positions."""
    import probe.shortcuts.positional as module

    assert _passed(offset_controls(interleaved))["offset_position_oracle"]
    monkeypatch.setattr(module, "perturbed_logits", lambda model, tokens, pert, g, n: model(tokens))
    assert not _passed(offset_controls(interleaved))["offset_position_oracle"]


def test_offset_scores_only_answers_that_stay_in_the_training_range(interleaved):
    """The position-limited oracle (right before stream position 6 of L_train 12) moved 2 later: the answers at 4
    and 5 cross position 6; only answers at positions 0..9 are read (10 and 11 would leave the range)."""
    limited = position_limited(interleaved)
    result = positional_tests(limited, interleaved, [2], n_sequences=64)
    batch = sample(interleaved, 12, 64, 0)
    p = batch.prefix_len
    read = int(batch.masks["state"][:, p: p + 10].sum())
    crossing = int(batch.masks["state"][:, p + 4: p + 6].sum())
    for method in ("index", "pad"):
        row = result.offset[(result.offset.method == method) & (result.offset.subtask == "state")].iloc[0]
        assert row.n_answers == read
        assert abs(row.effect * read - crossing) < 1e-6, "exactly the crossing answers are lost"
    with pytest.raises(ProbeError, match="offsets"):
        positional_tests(limited, interleaved, [12], n_sequences=8)


@pytest.mark.parametrize("family,pos", [("lstm", "none"), ("hybrid", "none"), ("transformer", "none"),
                                        ("hybrid", "learned")])
def test_every_index_perturbation_leaves_a_position_free_model_exactly_unchanged(family, pos):
    task = make_task("interleaved", train_length=8)
    model = tiny_model(family, task.vocab_size, pos_encoding=pos)
    tokens = task.sample(8, 16, 0).tokens
    base = model(tokens)
    g = torch.Generator().manual_seed(0)
    for pert in perturbations([1, 3, 7]):
        assert torch.equal(perturbed_logits(model, tokens, pert, g, 21), base), pert.name
    result = positional_tests(model, task, n_sequences=8)
    assert not result.applicable and "not applicable" in result.reason
    assert result.score_of("pad", "all") is not None, "padding applies to every family"
    controls = {c["control"]: c for c in position_controls(model, task, [1, 3])}
    assert controls["perturbation_max_abs_logit_diff"]["value"] == 0
    assert all(c["passed"] for c in controls.values())


@pytest.mark.slow  # trains a 300-400-step model (module fixture)
def test_trained_lstm_checkpoint_is_exactly_invariant_to_index_perturbations(lstm_ckpt):
    from probe.checkpoint import load_checkpoint

    model = load_checkpoint(lstm_ckpt).build_model()
    tokens = make_task("modsum", **MODSUM3).sample(8, 32, 1).tokens
    g = torch.Generator().manual_seed(1)
    for pert in perturbations([1, 2, 7]):
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
    torch.testing.assert_close(seen["x"], original)
    replaced = {}
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: replaced.setdefault("r", x))]):
        perturbed_logits(model, tokens, Perturbation("random"), g, 9)
    code = replaced["r"] - model.embed(tokens)
    torch.testing.assert_close(code.norm(dim=-1), original.norm(dim=-1), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(code, original, atol=1e-2)
    assert all(not hp.has_hooks() for hp in model.hook_dict.values())


# --- window test --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["interleaved", "coupled"])
def test_window_test_separates_a_tracker_from_a_windowed_model(name):
    task = make_task(name, train_length=12)
    exact = window_test(tracker(task), task, n_samples=256)
    assert (exact.table.acc_new == 1).all() and not exact.windowed and exact.score == 0
    assert (exact.table.p_label_same < 0.25).all(), "resampling really changes the labels (about 1/m stay)"
    local = window_test(windowed(task, 1), task, n_samples=256).table
    far = local[local.k >= 1]
    assert (far.agree_old == 1).all(), "answers built from the last 2 positions ignore what lies further back"
    assert (far.acc_new - far.chance).abs().max() < 0.1, "...so on the new labels they are at chance"
    na = window_test(tracker(task), make_task("recall"))
    assert not na.applicable and "not applicable" in na.reason


def _resample_nothing(task, tokens, target, k, g):
    """Broken: the positions are chosen but every number keeps its old value."""
    _, drawn = resample_before(task, tokens, target, k, g)
    return tokens.clone(), drawn


def _resample_one_too_far(task, tokens, target, k, g):
    """Broken: an off-by-one at the border also redraws position t - k, one the test claims to keep."""
    return resample_before(task, tokens, target + 1, k, g)


def _resample_to_zero(task, tokens, target, k, g):
    """Broken: the redrawn numbers are all 0, not uniform, so the new label is the sum of the kept positions."""
    new, drawn = resample_before(task, tokens, target, k, g)
    return torch.where(drawn, 0, new), drawn


def _answers_read_one_late(monkeypatch):
    """Broken measurement: every answer read one position late, so the answer scored at t is the one at t - 1."""
    import probe.shortcuts.window as module

    right = module.predict
    monkeypatch.setattr(module, "predict", lambda forward, tokens: torch.roll(right(forward, tokens), 1, dims=1))
    return {}


# Each window check -> (the breakage that must make it fail, where its value must lie for the correct method,
# where for the broken one). Both bounds sit well away from the check's threshold (chance + 0.1, or exactly 1), so
# that a pass or a failure by sampling noise alone does not count.
_WINDOW_BREAKAGES = {
    "window_tracker_oracle_acc_new": (_answers_read_one_late, lambda v, c: v == 1, lambda v, c: v < 0.5),
    "window_resampling_changes_labels": (lambda mp: {"resample": _resample_nothing},
                                         lambda v, c: v < c + 0.06, lambda v, c: v > 0.9),
    "window_windowed_oracle_agree_old": (lambda mp: {"resample": _resample_one_too_far},
                                         lambda v, c: v == 1, lambda v, c: v < 0.8),
    "window_windowed_oracle_acc_new": (lambda mp: {"resample": _resample_to_zero},
                                       lambda v, c: v < c + 0.06, lambda v, c: v > 0.9),
}


def _window_rows(rows):
    return {r["control"]: r for r in rows}


@pytest.mark.parametrize("control", list(_WINDOW_BREAKAGES))
def test_each_window_check_passes_on_the_correct_method_and_fails_on_its_broken_one(interleaved, monkeypatch,
                                                                                    control):
    breakage, right_side, wrong_side = _WINDOW_BREAKAGES[control]
    c = 1 / interleaved.m
    right = _window_rows(window_controls(interleaved))
    assert set(right) == set(_WINDOW_BREAKAGES) and all(r["kind"] == "instrument" for r in right.values())
    assert right[control]["passed"] and right_side(right[control]["value"], c), right[control]
    wrong = _window_rows(window_controls(interleaved, **breakage(monkeypatch)))
    assert not wrong[control]["passed"] and wrong_side(wrong[control]["value"], c), wrong[control]


def test_window_checks_fail_only_where_their_breakage_reaches(interleaved):
    """Each breakage of the resampling is seen by its own check and by no other: a redraw to zeros still changes
    the labels and keeps the kept positions; an off-by-one at the border still changes the labels at random; numbers
    left as they were change no label, so the w = 1 model stays at its (chance) accuracy."""
    failing = {name: {r["control"] for r in window_controls(interleaved, resample=broken) if not r["passed"]}
               for name, broken in [("zero", _resample_to_zero), ("far", _resample_one_too_far),
                                    ("nothing", _resample_nothing)]}
    assert failing["zero"] == {"window_windowed_oracle_acc_new"}
    assert failing["far"] == {"window_windowed_oracle_agree_old"}
    assert failing["nothing"] == {"window_resampling_changes_labels"}


def test_window_kept_positions_check_sees_an_off_by_one_at_every_k(interleaved):
    """The off-by-one is caught at k = 2 and 8 alone, where a model that sees only the last 2 positions would not
    notice it (it never looks back as far as t - k)."""
    rows = _window_rows(window_controls(interleaved, ks=[2, 8], resample=_resample_one_too_far))
    assert not rows["window_windowed_oracle_agree_old"]["passed"]
    assert rows["window_windowed_oracle_agree_old"]["value"] < 0.8


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
    """W_Q = 0 makes every head uniform over the causal keys: its pattern is a function of position alone (pos share
    1), its entropy is log(#keys) at every length, its recall mass the uniform one."""
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


# --- analyze, tables, CLI -----------------------------------------------------------------------------------------
def test_analyze_a_hybrid_leaves_no_hook_and_no_gate_changed(tmp_path):
    from probe.checkpoint import checkpoint_from_model, save_checkpoint

    task = make_task("interleaved", train_length=8)
    model = tiny_model("hybrid", task.vocab_size)
    model.set_attention_gate([1.0, 0.5])
    path = tmp_path / "hybrid.pt"
    save_checkpoint(path, checkpoint_from_model(model, task))
    report = analyze(path, **{**SMALL, "n_sequences": 16})
    assert {c["control"]: c["passed"] for c in report.controls}["gates_unchanged_by_analysis"]
    tests = set(report.tests.test)
    assert {"attention_knockout", "sum_preserving", "identity_run", "positional_offset", "offset_score"} <= tests
    na = report.tests[~report.tests.applicable.astype(bool)]
    assert set(na.test) <= {"position_dependence", "positional_offset", "offset_score"}
    pad = na[na.method == "pad"]  # an untrained model has no skill to lose: its score (only) is not defined
    assert pad.test.eq("offset_score").all() and pad.reason.str.contains("chance|not learned").all()
    assert na[na.test == "positional_offset"].method.eq("index").all(), "nothing else is N/A for a hybrid"
    table = effects_table([report])
    assert {8, 16} <= set(table.columns)


@pytest.mark.slow  # trains a 300-400-step model (module fixture)
def test_cli_json_reports_every_test_with_intervals_and_controls(transformer_ckpt, lstm_ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    code = __import__("probe.shortcuts.cli", fromlist=["main"]).main(
        [str(transformer_ckpt), str(lstm_ckpt), "--json", "--out", str(out), "--samples", "16", "--lengths", "8,16",
         "--runs", "8", "--window-samples", "32", "--entropy-lengths", "4,8", "--no-progress"])
    assert code == 0
    captured = capsys.readouterr()
    obj = json.loads(captured.out)  # progress (on stderr, also under --json) never reaches the JSON on stdout
    assert "it/s" not in captured.err and "%|" not in captured.err, "--no-progress is silent (no progress bars)"
    assert obj["command"] == "shortcuts" and obj["checkpoints"] == [str(transformer_ckpt), str(lstm_ckpt)]
    rows = pd.DataFrame(obj["results"])
    assert {"checkpoint", "test"} <= set(rows.columns)
    four = rows[rows.test.isin(["attention_knockout", "sum_preserving", "identity_run", "positional_offset"])]
    assert {"length", "subtask", "effect", "ci_low", "ci_high"} <= set(four.columns)
    for ckpt in (transformer_ckpt, lstm_ckpt):
        mine = four[four.checkpoint == str(ckpt)]
        assert set(mine.test) == {"attention_knockout", "sum_preserving", "identity_run", "positional_offset"}
    lstm = rows[rows.checkpoint == str(lstm_ckpt)]
    assert not lstm[lstm.test == "attention_knockout"].applicable.any()
    state = lstm[(lstm.test.isin(["sum_preserving", "identity_run"])) & (lstm.subtask == "state")]
    assert state.applicable.all() and state.ci_high.notna().all()
    assert obj["controls"] and all("passed" in c for c in obj["controls"])
    assert all(c["passed"] and c["kind"] == "instrument" for c in obj["controls"])
    assert json.loads((out / "results.json").read_text()) == obj
    for name in ("results.json", "tests.csv", "controls.csv", "tests.png", "drops.png", "window.png",
                 "entropy.png", "heads.png"):
        assert (out / name).stat().st_size > 0


@pytest.mark.slow  # trains a 300-400-step model (module fixture)
def test_pooled_rows_average_checkpoints_of_one_label(transformer_report, lstm_report):
    rows = pooled_rows([transformer_report, transformer_report, lstm_report])
    pooled = [r for r in rows if r["test"] == "offset_score_pooled" and r["subtask"] == "all"
              and r["method"] == "index"]
    assert len(pooled) == 1 and pooled[0]["n_seeds"] == 2
    assert math.isclose(pooled[0]["effect"], transformer_report.positional.overall)


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    from probe.shortcuts.cli import main

    assert main([str(tmp_path / "missing.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "no such file" in err and "\n" not in err
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert main([str(bad), "--offsets", "1,x"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_python_dash_m_still_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "probe.shortcuts", "--help"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert "attention_knockout" in out and "sum_preserving" in out and "identity_run" in out
