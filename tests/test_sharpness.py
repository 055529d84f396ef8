"""Softmax sharpness: the attention scales (none unchanged, log-length 1 in the trained range and sharper beyond,
ssmax learned from an exact start), the diagnostic's instrument check and controls, each broken on purpose, and
the CLI on every family and cell."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

import probe.sharpness.controls as controls_mod
import probe.sharpness.measure as measure_mod
from probe.checkpoint import checkpoint_from_model, load_checkpoint, save_checkpoint
from probe.errors import ProbeError
from probe.models import HookedSequenceModel, ModelConfig
from probe.models.components import MASK_VALUE, CausalAttention, default_train_positions
from probe.sharpness import (
    attention_scale,
    known_attention_check,
    mass_rows,
    measure_length,
    placebo_control,
    reference_mass,
    reinit_control,
    sharpness_curve,
)
from probe.sharpness.cli import main
from probe.tasks import make_task

from conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("hybrid-dat", "hybrid-joint", "transformer")


# --- the scales in the attention -------------------------------------------------------------------------------
def committed_attention(attn: CausalAttention, x: torch.Tensor) -> torch.Tensor:
    """The attention pattern as the code computed it before any scale existed, written out again."""
    b, t, _ = x.shape
    split = (b, t, attn.n_heads, attn.d_head)
    q, k = attn.W_Q(x).view(split), attn.W_K(x).view(split)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(attn.d_head)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), MASK_VALUE)
    return scores.softmax(dim=-1)


@pytest.mark.parametrize("name", SHIPPED)
def test_none_is_bit_identical_to_the_committed_attention_on_shipped_checkpoints(name):
    ckpt = load_checkpoint(ROOT / "checkpoints" / f"{name}.pt")
    assert "attn_scale" not in ckpt.state_dict and ckpt.model_config.attn_scale == "none"
    model = ckpt.build_model()
    assert not any("ssmax" in k for k in model.state_dict())
    batch = ckpt.task_config.sample(40, 3, 5)
    with torch.no_grad():
        logits = model(batch.tokens)
        # the default config, built afresh with the same weights, gives the same logits bit for bit
        other = HookedSequenceModel(ModelConfig(**{**ckpt.model_config.to_dict(), "attn_scale": "none"}))
        other.load_state_dict(ckpt.state_dict)
        assert torch.equal(other.eval()(batch.tokens), logits)
        if ckpt.model_config.pos_encoding == "none":  # the pattern, against the formula written out again
            _, cache = model.run_with_cache(batch.tokens, names_filter=lambda n: n in (
                "blocks.0.ln_attn.hook_normalized", "blocks.0.attn.hook_pattern"))
            ln = model.blocks[0].ln_attn
            x = cache["blocks.0.ln_attn.hook_normalized"] * ln.weight + ln.bias
            assert torch.equal(committed_attention(model.blocks[0].attn, x), cache["pattern", 0])


def fixed_gap_attention(delta: float, n_heads: int = 1) -> CausalAttention:
    """A hand-built head whose every query has logit gap ``delta`` on key 0 over every other key: W_K marks key 0 by
    a coordinate the query always carries."""
    cfg = ModelConfig(family="transformer", d_model=2 * n_heads, n_heads=n_heads, vocab_size=4)
    attn = CausalAttention(cfg)
    with torch.no_grad():
        for lin in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O):
            lin.weight.zero_()
            lin.bias.zero_()
        attn.W_Q.bias.fill_(1.0)  # every query: (1, 1)
        attn.W_K.weight[:, 0] = delta * math.sqrt(attn.d_head) / attn.d_head  # key 0 carries x[0] = 1
    return attn


def key0_mass(attn: CausalAttention, t: int) -> torch.Tensor:
    x = torch.zeros(1, t, attn.n_heads * attn.d_head)
    x[0, 0, 0] = 1.0
    seen = {}
    attn.hook_pattern.add_hook(lambda p, hook: seen.setdefault("p", p))
    try:
        attn(x, torch.arange(t)[None])
    finally:
        attn.hook_pattern.remove_hooks()
    return seen["p"][0, 0, :, 0]  # per query


def test_log_length_is_one_in_the_trained_range_and_sharpens_beyond():
    n_train = 38
    attn = fixed_gap_attention(3.0)
    plain = key0_mass(attn, 4 * n_train)
    assert torch.allclose(plain[1:], reference_mass(torch.tensor(3.0), torch.arange(2, 4 * n_train + 1)).float(),
                          atol=1e-6), "the hand-built head has the gap it was built with"
    attn.scale = "log-length"
    attn.set_train_positions(n_train)
    scaled = key0_mass(attn, 4 * n_train)
    assert torch.equal(scaled[:n_train], plain[:n_train]), "factor exactly 1 up to n_train"
    assert scaled[-1] > plain[-1] + 0.1, (float(scaled[-1]), float(plain[-1]))
    assert bool((scaled[n_train:] > plain[n_train:]).all())
    with pytest.raises(ProbeError, match="at least 2 keys"):
        attn.set_train_positions(1)


def test_ssmax_starts_as_none_at_the_training_length_and_its_s_learns():
    n_train = default_train_positions()
    assert n_train == 38
    torch.manual_seed(0)
    ssmax = CausalAttention(ModelConfig(family="transformer", d_model=8, n_heads=2, attn_scale="ssmax"))
    none = CausalAttention(ModelConfig(family="transformer", d_model=8, n_heads=2))
    none.load_state_dict({k: v for k, v in ssmax.state_dict().items() if k != "ssmax_s"})
    assert torch.allclose(ssmax.ssmax_s, torch.full((2,), 1 / math.log(n_train)))
    x = torch.randn(2, n_train, 8)
    pos = torch.arange(n_train)[None]
    pats = {}
    for name, a in (("ssmax", ssmax), ("none", none)):
        a.hook_pattern.add_hook(lambda p, hook, name=name: pats.setdefault(name, p))
        a(x, pos)
        a.hook_pattern.remove_hooks()
    last = n_train - 1  # the query that sees n_train keys
    assert torch.allclose(pats["ssmax"][:, :, last], pats["none"][:, :, last], atol=1e-6)
    ssmax(x, pos).pow(2).sum().backward()
    assert ssmax.ssmax_s.grad is not None and bool((ssmax.ssmax_s.grad != 0).all())
    model = tiny_model("hybrid", attn_scale="ssmax")
    assert "blocks.1.attn.ssmax_s" in dict(model.named_parameters())
    assert any(p is model.blocks[0].attn.ssmax_s for p in model.attention_parameters()), "DAT holds s back too"


def test_train_set_picks_up_the_field_and_a_bad_scale_is_one_line():
    from probe.training.overrides import build_configs

    model_cfg = build_configs("hybrid-dat", "interleaved", ["model.attn_scale=ssmax"])[0]
    assert model_cfg.attn_scale == "ssmax"
    with pytest.raises(ProbeError, match="attn_scale"):
        ModelConfig(attn_scale="cosine")


def test_attention_scale_restores_and_refuses_ssmax(task):
    model = tiny_model("hybrid", task.vocab_size)
    with pytest.raises(RuntimeError):
        with attention_scale(model, "log-length", task):
            assert model.blocks[0].attn.scale == "log-length"
            assert model.blocks[0].attn.train_positions == task.prefix_len + task.train_length
            raise RuntimeError
    assert model.blocks[0].attn.scale == "none" and model.blocks[0].attn.train_positions == 38
    with pytest.raises(ProbeError, match="ssmax"):
        with attention_scale(tiny_model("hybrid", task.vocab_size, attn_scale="ssmax"), "log-length", task):
            pass


# --- the diagnostic's instrument check and controls -------------------------------------------------------------
@pytest.fixture(scope="module")
def dat():
    ckpt = load_checkpoint(ROOT / "checkpoints" / "hybrid-dat.pt")
    return ckpt.build_model(), ckpt.task_config


@pytest.fixture(scope="module")
def dat_mass(dat):
    model, task = dat
    mass, acc = sharpness_curve(model, task, [task.train_length, 2 * task.train_length], n_samples=16)
    return mass, acc


@pytest.mark.parametrize("task_name", ["interleaved", "recall", "coupled"])
def test_known_attention_is_recovered_exactly_on_every_dictionary_layout(task_name):
    task = make_task(task_name, train_length=6)
    row = known_attention_check(tiny_model("hybrid", task.vocab_size), task, n_samples=4)
    assert row["kind"] == "instrument" and row["passed"], row


@pytest.mark.parametrize("break_it", ["off_by_one", "next_pair"])
def test_known_attention_fails_when_the_measure_reads_the_wrong_position(monkeypatch, task, break_it):
    real = measure_mod.recall_targets
    shift = 1 if break_it == "off_by_one" else 2

    def broken(task_, batch):
        mask, key_pos = real(task_, batch)
        return mask, key_pos + shift

    monkeypatch.setattr(measure_mod, "recall_targets", broken)
    row = known_attention_check(tiny_model("hybrid", task.vocab_size), task, n_samples=4)
    assert not row["passed"] and row["value"] > 0.01


def test_the_shipped_recall_head_passes_both_controls(dat, dat_mass):
    model, task = dat
    mass, acc = dat_mass
    assert acc[(acc.subtask == "recall") & (acc.length == task.train_length)].token_acc.iloc[0] > 0.95
    assert reinit_control(model, task, mass, n_samples=16)["passed"]
    assert placebo_control(mass, task.train_length)["passed"]
    # the reference at L_train uses this length's own gap
    at = mass[mass.length == task.train_length]
    assert (at.delta == at.gap).all()


def test_reinit_control_fails_when_the_reinitialisation_is_skipped(dat, dat_mass, monkeypatch):
    model, task = dat
    monkeypatch.setattr(controls_mod, "reinit_model", lambda m, seed: m)
    row = reinit_control(model, task, dat_mass[0], n_samples=16)
    assert row["kind"] == "control" and not row["passed"], row


def test_controls_fail_on_a_model_without_a_recall_head(task):
    """A random-init hybrid has no learned query-key circuit: neither control may credit it with one."""
    model = tiny_model("hybrid", task.vocab_size, seed=3)
    mass, _ = sharpness_curve(model, task, [task.train_length], n_samples=16)
    assert not reinit_control(model, task, mass, n_samples=16)["passed"]
    assert not placebo_control(mass, task.train_length)["passed"]


def test_placebo_fails_for_a_head_that_attends_to_one_dictionary_slot(task):
    """A head that always reads the first pair's value concentrates as much as a recall head would, but on a slot,
    not on the queried pair: the wrong-pair placebo catches it."""
    model = tiny_model("hybrid", task.vocab_size)

    def slot(scores: torch.Tensor, hook) -> torch.Tensor:
        out = torch.zeros_like(scores)
        out[..., 1] = 8.0
        t = scores.shape[-1]
        return out.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), MASK_VALUE)

    stats = measure_length(model, task, task.train_length, 32, fwd_hooks=[("blocks.1.attn.hook_attn_scores", slot)])
    mass = pd.DataFrame(mass_rows(stats)).assign(length=task.train_length, scale="none")
    best = mass.loc[mass.mass.idxmax()]
    assert best.mass > 0.1  # it does concentrate (on its queries whose pair sits first)
    assert not placebo_control(mass, task.train_length)["passed"]


def test_mass_and_reference_are_consistent(dat_mass, dat):
    _, task = dat
    mass, _ = dat_mass
    assert ((mass.ci_low <= mass.mass + 1e-12) & (mass.mass <= mass.ci_high + 1e-12)).all()
    longer = mass[mass.length == 2 * task.train_length].set_index(["layer", "head", "target"])
    at = mass[mass.length == task.train_length].set_index(["layer", "head", "target"])
    assert (longer.delta == at.gap).all(), "beyond L_train the reference keeps the gap fitted at L_train"
    assert (longer.reference <= at.reference + 1e-12).all(), "more keys, same gap: the reference falls"


# --- the CLI on every family and cell --------------------------------------------------------------------------
@pytest.mark.parametrize(("family", "kw"), [("lstm", {}), ("lstm", {"rnn": "gru"}), ("lstm", {"rnn": "ssm"})])
def test_a_model_without_attention_is_one_line_and_exit_2(family, kw, tmp_path, capsys):
    task = make_task("interleaved", train_length=4)
    path = save_checkpoint(tmp_path / "m.pt", checkpoint_from_model(tiny_model(family, task.vocab_size, **kw), task))
    for extra in ([], ["--json"]):
        assert main([str(path), "--lengths", "4", *extra]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert "does not apply" in captured.err and "no attention" in captured.err


@pytest.mark.parametrize("kw", [{"rnn": "gru"}, {"rnn": "ssm", "ssm_range": "complex"}, {"attn_scale": "ssmax"}])
def test_cli_runs_on_every_cell_with_both_scales(kw, tmp_path, capsys):
    task = make_task("interleaved", train_length=4)
    path = save_checkpoint(tmp_path / "h.pt", checkpoint_from_model(tiny_model("hybrid", task.vocab_size, **kw), task))
    scale = [] if kw.get("attn_scale") == "ssmax" else ["--scale", "log-length"]
    assert main([str(path), "--lengths", "4,16", "--samples", "4", "--json", *scale]) == 0
    obj = json.loads(capsys.readouterr().out)
    frame = pd.DataFrame(obj["results"])
    assert set(frame.scale) == ({"none"} if not scale else {"none", "log-length"})
    assert set(frame.metric) == {"attention_mass", "accuracy"}
    assert {c["control"] for c in obj["controls"]} == {"known_attention", "reinit_attention", "wrong_pair"}
    assert [c["passed"] for c in obj["controls"] if c["kind"] == "instrument"] == [True]


def test_a_task_without_a_dictionary_is_not_applicable(tmp_path, capsys):
    task = make_task("modsum", train_length=4)
    path = save_checkpoint(tmp_path / "t.pt", checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))
    assert main([str(path), "--lengths", "4"]) == 2
    assert "no dictionary" in capsys.readouterr().err


def test_log_length_leaves_a_checkpoint_unchanged_at_its_training_length(dat):
    model, task = dat
    tokens = task.sample(task.train_length, 8, 11).tokens
    longer = task.sample(4 * task.train_length, 8, 11).tokens
    with torch.no_grad():
        plain, plain_long = model(tokens), model(longer)
        with attention_scale(model, "log-length", task):
            assert torch.equal(model(tokens), plain)
            scaled_long = model(longer)
    n_train = task.prefix_len + task.train_length
    assert torch.equal(scaled_long[:, :n_train], plain_long[:, :n_train])
    assert not torch.equal(scaled_long[:, n_train:], plain_long[:, n_train:])


def test_log_length_on_an_ssmax_checkpoint_is_refused_before_any_work(tmp_path, capsys):
    task = make_task("interleaved", train_length=4)
    model = tiny_model("hybrid", task.vocab_size, attn_scale="ssmax")
    path = save_checkpoint(tmp_path / "s.pt", checkpoint_from_model(model, task))
    assert main([str(path), "--scale", "log-length", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ssmax" in err
    assert not (tmp_path / "out").exists()


# --- wrapped and bridged models: through each attention module's own scores and pattern hooks ----------------------
BRIDGE_RUN = ["--set", "model.d_model=32", "--steps", "2", "--set", "schedule.switch=1", "--set", "train.warmup=1",
              "--set", "train.batch_size=4", "--set", "train.eval_samples=4", "--set", "task.train_length=6",
              "--no-progress"]


@pytest.fixture(scope="module")
def bridged_task():
    pytest.importorskip("transformers")
    return make_task("interleaved", train_length=6)


def test_a_bridged_attention_is_read_through_its_hooks_and_the_instrument_check_passes(bridged_task):
    import probe

    model = probe.bridge.model("qwen3-next", bridged_task)
    assert measure_mod.attention_hooks(model) == {"blocks.1.attn.hook_attn_scores": ("blocks.1.attn.hook_pattern", 1)}
    mass, _ = sharpness_curve(model, bridged_task, [6], n_samples=8)
    assert set(mass.layer) == {1} and set(mass["head"]) == {0, 1}
    row = known_attention_check(model, bridged_task, n_samples=4)
    assert row["passed"] and row["value"] <= 1e-5, row


def test_known_attention_on_a_bridge_fails_when_the_measure_reads_the_wrong_position(monkeypatch, bridged_task):
    # Jamba's attention hooks are read-only (transformers' own attention runs): the check writes the pattern too
    import probe

    model = probe.bridge.model("jamba", bridged_task)
    assert known_attention_check(model, bridged_task, n_samples=4)["passed"]
    real = measure_mod.recall_targets
    monkeypatch.setattr(measure_mod, "recall_targets", lambda t, b: (real(t, b)[0], real(t, b)[1] + 1))
    row = known_attention_check(model, bridged_task, n_samples=4)
    assert not row["passed"] and row["value"] > 0.01


def test_a_wrapped_models_reinitialisation_redraws_its_attention_and_nothing_else(bridged_task):
    import probe

    model = probe.bridge.model("qwen3-next", bridged_task)
    other = controls_mod.reinitialised(model, seed=1)
    attention = {n for n, p in model.named_parameters() if any(p is q for q in model.attention_parameters())}
    changed = {n for (n, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True)
               if not torch.equal(p, q)}
    assert changed and changed <= attention  # the q, k, v, o projections; the rest, what attention reads, as trained
    assert {n.rsplit(".", 3)[-3] for n in changed} == {"q_proj", "k_proj", "v_proj", "o_proj"}


def test_an_attention_without_scores_and_log_length_on_a_wrapped_model_are_one_line(bridged_task):
    import probe

    with pytest.raises(ProbeError, match="hook_attn_scores, hook_pattern") as e:
        sharpness_curve(probe.bridge.model("nemotron-h", bridged_task), bridged_task, [6], n_samples=4)
    assert "blocks.1.mixer" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ProbeError, match="has none to set"):
        sharpness_curve(probe.bridge.model("qwen3-next", bridged_task), bridged_task, [6], n_samples=4,
                        scale="log-length")


def test_cli_on_bridged_checkpoints_runs_with_its_controls_or_refuses_before_any_work(bridged_task, tmp_path,
                                                                                        capsys):
    from probe.training.cli import main as train_main

    for preset in ("bridge-qwen3-next-dat", "bridge-nemotron-h-lstm-dat"):
        assert train_main(["--preset", preset, *BRIDGE_RUN, "--out", str(tmp_path / preset)]) == 0
    capsys.readouterr()
    path = tmp_path / "bridge-qwen3-next-dat" / "final.pt"
    assert main([str(path), "--lengths", "6", "--samples", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["metric"] for r in out["results"]} == {"attention_mass", "accuracy"}
    controls = {c["control"]: c for c in out["controls"]}
    assert set(controls) == {"known_attention", "reinit_attention", "wrong_pair"}
    assert controls["known_attention"]["passed"]  # two steps train no recall head: the controls may say so
    lstm = tmp_path / "bridge-nemotron-h-lstm-dat" / "final.pt"
    assert main([str(lstm), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hook_attn_scores" in err and not (tmp_path / "out").exists()
    assert main([str(path), "--scale", "log-length"]) == 2
    assert "has none to set" in capsys.readouterr().err
