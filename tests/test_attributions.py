"""probe.attributions: exact occlusion with path patching, attention reads, ablation, IG kept only if it converges;
each control fails on the broken method it guards against."""

from __future__ import annotations

import json

import pytest
import torch

from probe import attributions as A
from probe.attributions import analysis as AA
from probe.attributions import occlusion as O
from probe.checkpoint import checkpoint_from_model, save_checkpoint
from probe.gradients import known_split_case

from conftest import needs_captum, tiny_model


@pytest.fixture
def batch(task):
    return task.sample(8, 8, 0)


def running_sums(tokens, prefix_len, m, key_offset):
    """Oracle: the running sum of the stream's numbers (queries add nothing), recomputed from the tokens."""
    stream = tokens[:, prefix_len:]
    numbers = torch.where(stream < m, stream, 0)
    sums = numbers.cumsum(dim=1) % m
    return torch.cat([torch.full((tokens.shape[0], prefix_len), -1), sums], dim=1)


def test_corrupt_changes_one_token_and_recomputes_the_state_labels(task, batch):
    seq, pos, kind, tok, lab = O.corrupt(batch, task, torch.Generator().manual_seed(0))
    assert ((tok != batch.tokens[seq]).sum(dim=1) == 1).all()  # exactly one token changes, at pos
    assert (tok[torch.arange(len(seq)), pos] != batch.tokens[seq, pos]).all()
    state = (batch.masks["state"] & batch.answer_mask)[seq]
    oracle = running_sums(tok, batch.prefix_len, task.m, task.key_offset)
    assert torch.equal(lab[state], oracle[state])
    assert set(kind.tolist()) == {0, 1, 2}
    # a resampled query key stays a key of the dictionary; a resampled dictionary key leaves it
    q = kind == 1
    keys = batch.tokens[:, 0:2 * task.n_pairs:2]
    assert all(int(tok[r, pos[r]]) in keys[seq[r]].tolist() for r in q.nonzero().flatten().tolist())
    pk = (kind == 2) & (batch.tokens[seq, pos] < task.value_offset)
    assert all(int(tok[r, pos[r]]) not in keys[seq[r]].tolist() for r in pk.nonzero().flatten().tolist())


def test_occlusion_controls_pass_and_paths_are_what_they_claim(task, batch):
    hybrid = tiny_model("hybrid", task.vocab_size)
    occ = O.resample_occlusion(hybrid, batch, task)
    assert occ.causal_max == 0.0 and occ.cross_position_max == 0.0
    prof = occ.profile()
    assert prof[prof.kind == "prefix"].distance.isna().all() and prof[prof.kind == "prefix"].in_prefix.all()
    assert (prof[prof.kind != "prefix"].distance >= 0).all()
    # an LSTM has no path that avoids every LSTM across positions: nothing at distance > 0 moves when they are held
    lstm = O.resample_occlusion(tiny_model("lstm", task.vocab_size), batch, task).profile()
    far = lstm[(lstm.kind != "prefix") & (lstm.distance > 0)].set_index(["kind", "distance", "condition"])
    assert (far.xs("attention_only", level="condition").flip == 0).all()
    assert (far.xs("recurrent_only", level="condition").flip == far.xs("total", level="condition").flip).all()
    # a Transformer has no path that avoids attention across positions
    tr = O.resample_occlusion(tiny_model("transformer", task.vocab_size), batch, task).profile()
    tfar = tr[(tr.kind != "prefix") & (tr.distance > 0)]
    assert (tfar[tfar.condition == "recurrent_only"].flip == 0).all()
    assert tfar[tfar.condition == "total"].flip.max() > 0  # while the unpatched input does move the answers


def test_causality_control_sees_a_leak_from_exactly_the_next_token(task, batch):
    model = tiny_model("hybrid", task.vocab_size)

    def leak(x, hook):  # position t also receives the embedding of t + 1
        return x + torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)

    model.add_hook("hook_embed", leak, is_permanent=True)
    try:
        occ = O.resample_occlusion(model, batch, task)
    finally:
        model.reset_hooks(including_permanent=True)
    assert occ.causal_max > 1e-3


def test_patching_control_fails_when_the_patch_does_not_hold(task, batch, monkeypatch):
    monkeypatch.setitem(O.FROZEN, "both_frozen", ("hook_attn_out",))  # forgets the LSTMs
    occ = O.resample_occlusion(tiny_model("hybrid", task.vocab_size), batch, task)
    assert occ.cross_position_max > 1e-3


def test_reads_follow_a_hand_built_attention():
    model, batch, _ = known_split_case()
    prof, _ = A.read_profile(model, batch, far=2)
    block1 = prof[(prof.block == 1) & ~prof.in_prefix].set_index("distance").mass
    # answer A (t = 6) reads only M1 (distance 4), answer M2 (t = 7) only X (distance 3): half the mass each
    assert block1[4] == pytest.approx(0.5, abs=1e-6) and block1[3] == pytest.approx(0.5, abs=1e-6)
    assert block1.drop([3, 4]).abs().max() < 1e-6


def test_reads_sum_to_one_with_the_prefix_apart(task, batch):
    prof, far = A.read_profile(tiny_model("hybrid", task.vocab_size), batch, far=2)
    for _, b in prof.groupby("block"):
        assert b.mass.sum() == pytest.approx(1.0, abs=1e-5)
        assert b[b.in_prefix].distance.isna().all() and b[b.in_prefix].mass.iloc[0] > 0
    assert ((far.prefix + far.near + far.far) - 1).abs().max() < 1e-5


def test_component_ablation_of_attention_equals_its_gate_at_zero(task, batch):
    model = tiny_model("hybrid", task.vocab_size)
    table = A.component_ablation(model, batch).set_index(["subtask", "block", "component"])
    mask = batch.masks["state"] & batch.answer_mask
    keep = mask.any(dim=1)

    def logit():
        with torch.no_grad():
            out = model(batch.tokens)
        correct = out.gather(-1, batch.labels.clamp(min=0)[..., None])[..., 0]
        return ((correct * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1))[keep].mean()

    clean = logit()
    model.set_attention_gate([1.0, 0.0])  # the other route: gate block 1's attention off
    gated = logit()
    assert table.loc[("state", 1, "attn"), "effect"] == pytest.approx(float(clean - gated), rel=1e-5, abs=1e-6)


@needs_captum
def test_ig_converges_on_a_smooth_model_and_completes_to_the_occlusion_effect(task, batch):
    model = tiny_model("hybrid", task.vocab_size)
    answers = A.choose_answers(batch, 3, 2)
    res = A.position_ig(model, batch, answers, max_steps=64)
    assert res.n_dropped == 0 and len(res.table) > 5
    row = res.table.iloc[-1]
    # the effect is the exact occlusion effect: recompute it with the token replaced by 0
    i, s, t = int(row.sequence), int(row.position) + batch.prefix_len, int(row.t) + batch.prefix_len
    tok = batch.tokens[i:i + 1].clone()
    label = batch.labels[i, t]
    with torch.no_grad():
        before = model(tok)[0, t, label]
        tok[0, s] = 0
        after = model(tok)[0, t, label]
    assert row.effect == pytest.approx(float(before - after), abs=1e-5)
    assert ((res.table.ig - res.table.effect).abs() <= 0.05 * res.table.effect.abs() + 0.02).all()


@needs_captum
def test_ig_control_fails_when_the_path_starts_elsewhere(task, batch):
    model = tiny_model("hybrid", task.vocab_size, d_model=32)
    answers = A.choose_answers(batch, 3, 2)
    # a path from the vocabulary-mean embedding does not end at the token-0 occlusion effect
    wrong = model.embed.weight.detach().mean(dim=0) * 8.0
    res = A.position_ig(model, batch, answers, max_steps=32, reference=wrong)
    assert res.n_dropped / res.n_answers > AA.IG_DROP_TOL
    assert res.kept().empty or res.kept().answer.nunique() < res.n_answers


@needs_captum
def test_cli_json(task, tmp_path, capsys):
    path = tmp_path / "h.pt"
    save_checkpoint(path, checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))
    assert A.main([str(path), "--json", "--lengths", "8", "--samples", "4", "--ig", "--ig-sequences", "1",
                   "--ig-max-steps", "32", "--out", str(tmp_path / "o")]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["command"] == "attributions"
    kinds = {r["analysis"] for r in obj["results"]}
    assert kinds >= {"occlusion", "occlusion_far", "reads", "reads_far", "components", "ig"}
    assert {c["control"] for c in obj["controls"]} == {"occlusion_causal_L8", "patching_cross_position_L8",
                                                      "ig_converged_L8"}
    assert all(isinstance(c["passed"], bool) and c["kind"] == "instrument" for c in obj["controls"])
    assert {p.name for p in (tmp_path / "o").iterdir()} >= {"occlusion.png", "attention_reads.png",
                                                            "components.png", "results.json"}


def test_cli_bad_input_exits_2(tmp_path, capsys):
    assert A.main([str(tmp_path / "nope.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


@pytest.mark.slow  # a trained checkpoint, about 6 s
def test_the_shipped_dat_hybrid_carries_its_state_through_the_lstm():
    """On a trained model (not a hand-built one): DAT's state answers follow a resampled number near and far with
    attention's outputs held clean, and not at all with the LSTMs' held; zeroing block 0's LSTM costs the state
    answer far more than zeroing any attention."""
    from pathlib import Path

    from probe.checkpoint import load_checkpoint

    ckpt = load_checkpoint(Path(__file__).resolve().parents[1] / "checkpoints" / "hybrid-dat.pt")
    report = AA.analyze_checkpoint(ckpt, lengths=[25], batch_size=8)
    follow = report.occlusion_far.set_index(["range", "condition"]).follow
    for where in ("near", "far"):
        assert follow[(where, "total")] > 0.9 and follow[(where, "recurrent_only")] > 0.9
        assert follow[(where, "attention_only")] < 0.1
    state = report.components[report.components.subtask == "state"].set_index(["block", "component"]).effect
    assert state[(0, "lstm")] > 2.0 and max(state[(0, "attn")], state[(1, "attn")]) < 1.0
    assert all(c["passed"] and c["kind"] == "instrument" for c in report.controls)
