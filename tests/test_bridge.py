"""probe.bridge: hybrids TransformerLens bridges, booted offline and analysed by probe; "can this recurrence count?"."""

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may download

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import probe  # noqa: E402
from probe.bridge import ARCHS, boot, transition_eigenvalues, wrap  # noqa: E402
from probe.errors import ProbeError  # noqa: E402
from probe.tasks import make_task  # noqa: E402
from probe.transitions import can_count, eigen_range  # noqa: E402

FAST = {"mamba2", "qwen3-next"}


@pytest.fixture(scope="module")
def task():
    return make_task("interleaved", train_length=6)


@pytest.mark.parametrize("arch", [pytest.param(a, marks=() if a in FAST else pytest.mark.slow) for a in ARCHS])
def test_bridged_logits_are_the_transformers_models(arch, task):
    bridge = boot(arch, task, d_model=32, n_layers=2)
    tokens = task.sample(6, 2, seed=0).tokens
    with torch.no_grad():
        ours, theirs = bridge(tokens), bridge.original_model(tokens, use_cache=False).logits
    # the bridge delegates every forward to the transformers modules: the same operations, so the same bits
    assert ours.shape == (2, tokens.shape[1], task.vocab_size)
    assert torch.equal(ours, theirs)


def test_wrap_names_the_bridges_components(task):
    model = probe.bridge.model("qwen3-next", task)
    assert model.recurrent_names == ["blocks.0.linear_attn"] and model.attention_names == ["blocks.1.attn"]
    assert "blocks.0.linear_attn.hook_beta" in model.hook_dict and "hook_logits" in model.hook_dict
    assert set(model.sublayer_outputs()) == {"blocks.0.linear_attn.hook_out", "blocks.1.attn.hook_out"}


@pytest.mark.slow
def test_nemotron_attention_is_found_by_what_it_wraps(task):
    # Nemotron-H keys attention and Mamba-2 alike "mixer": the class it wraps tells them apart
    model = probe.bridge.model("nemotron-h", task)
    assert model.attention_names == ["blocks.1.mixer"] and model.recurrent_names == ["blocks.0.mixer"]


def test_gate_zero_is_attention_output_zeroed(task):
    model = probe.bridge.model("qwen3-next", task)
    tokens = task.sample(6, 3, seed=1).tokens
    with torch.no_grad():
        zeroed = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_out", lambda x, hook: 0 * x)])
        model.set_attention_gate(0.0)
        gated = model(tokens)
        model.set_attention_gate(1.0)
        on = model(tokens)
    assert torch.equal(gated, zeroed)
    assert not torch.allclose(on, gated)  # the gate acts: attention contributes when it is on
    assert model.attention_gates() == [1.0]


def test_gradient_split_controls_pass_on_a_bridge(task):
    # g_rec_two_routes compares the cut at attn.hook_in (stopgrad) with a detached attn.hook_out: a stopgrad that
    # missed attention's input would make them disagree
    from probe.gradients import analyze_model

    report = analyze_model(probe.bridge.model("qwen3-next", task), task, lengths=[6], batch_size=8)
    assert report.controls and all(c["passed"] for c in report.controls)


def test_a_block_level_bridge_is_refused_in_one_line(task):
    with pytest.raises(ProbeError, match="block level only") as e:
        wrap(boot("recurrentgemma", task))
    assert "\n" not in str(e.value)
    with pytest.raises(ProbeError, match="TransformerBridge"):
        wrap(torch.nn.Linear(2, 2))


# --- can this recurrence count? ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["mamba2", pytest.param("mamba", marks=pytest.mark.slow)])
def test_mamba_transitions_reproduce_the_bridges_state(arch, task):
    """Instrument check: the transitions read from the hooks, applied to the state the scan wrote one step before,
    plus the write, give the next state of TransformerLens's own eager scan (a wrong dt or A would not)."""
    from probe.bridge import state_residual

    model = probe.bridge.model(arch, task)
    tokens = task.sample(6, 2, seed=2).tokens
    assert state_residual(model, tokens)["blocks.0.mixer"] <= 1e-4
    wrong = state_residual(model, tokens, lambda m, t: {k: v.sqrt() for k, v in transition_eigenvalues(m, t).items()})
    assert wrong["blocks.0.mixer"] > 1e-2


def _own_ssm(task, ssm_range):
    from probe.models import HookedSequenceModel, ModelConfig

    torch.manual_seed(0)
    return HookedSequenceModel(ModelConfig(family="lstm", rnn="ssm", ssm_range=ssm_range, d_model=16, n_layers=1),
                               task=task)


@pytest.mark.parametrize("ssm_range, can", [("positive", False), ("negative", True), ("complex", True)])
def test_a_cell_built_to_count_can_and_a_mamba_style_one_cannot(task, ssm_range, can):
    # from the transitions each model computes on data: the three cells differ only in their transitions' range
    summary = can_count(_own_ssm(task, ssm_range), task).set_index("layer").loc["all"]
    assert bool(summary["can_count"]) is can
    assert bool(summary["max_phase"] >= torch.pi / 5) is can


def test_a_bridged_mamba2_cannot_and_its_negated_transitions_can(task):
    model = probe.bridge.model("mamba2", task)
    measured = can_count(model, task).set_index("layer").loc["all"]
    assert measured["range"] == "positive real in (0, 1]" and not measured["can_count"]
    # the control: the same model's transitions, negated, through the same summary (a Mamba-2's A = -exp(A_log)
    # and dt > 0 keep exp(dt A) in (0, 1), so its parametrisation cannot be set to reach them)
    flipped = can_count(model, task, eigenvalues=lambda m, t: {k: -v for k, v in transition_eigenvalues(m, t).items()})
    assert flipped.set_index("layer").loc["all", "can_count"]


def test_eigen_range_names_the_range():
    assert eigen_range(torch.tensor([0.5, 0.9]), 10)["range"] == "positive real in (0, 1]"
    assert eigen_range(torch.tensor([0.5, -0.99]), 2)["range"] == "negative real (reaching -1)"
    rot = torch.polar(torch.ones(3), torch.tensor([0.0, 0.7, 0.1]))  # 0.7 rad > 2 pi / 10
    r = eigen_range(rot, 10)
    assert r["range"] == "complex" and r["can_count"]
    assert not eigen_range(torch.polar(torch.ones(1), torch.tensor([0.5])), 10)["can_count"]  # below 2 pi / 10


def test_a_recurrence_without_a_transition_is_refused_in_one_line(task):
    from probe.bridge import Component, transition_reason

    conv = Component("blocks.0.conv", 0, "conv", torch.nn.Identity())
    assert "finite window" in transition_reason(conv)


# --- the recurrent state through the bridge ---------------------------------------------------------------------------
SITE = "blocks.0.mixer.scan.hook_state"


def _state_runs(model, task, t, scale=20.0):
    """The clean eager pass, the pass with the state after t set to ``scale`` x another sequence's (the site read
    in it) and the pass with the state set to its own: ``(clean, given, edited, seen, same)``."""
    cell = model.hooked_cells["blocks.0.mixer.scan"]
    tokens, source = task.sample(6, 3, seed=0).tokens, task.sample(6, 3, seed=1).tokens
    with torch.no_grad():
        clean, cache = model.run_with_cache(tokens, names_filter=[SITE])
        _, other = model.run_with_cache(source, names_filter=[SITE])
        given = scale * other[SITE][:, t]
        with cell.override_state(t, given):
            edited, seen = model.run_with_cache(tokens, names_filter=[SITE])
        with cell.override_state(t, cache[SITE][:, t]):
            same = model(tokens)
    return clean, given, edited, seen[SITE][:, t], same


@pytest.mark.parametrize("arch", ["mamba2", "mamba"])
def test_the_scan_state_site_is_the_bridges_state_per_position(arch, task):
    """Instrument check: the site is TransformerLens's hook_ssm_state, position first, one vector per position; the
    pass that reads it runs the eager scan (logits within float rounding of the fused kernel's), the next is fused."""
    from probe.bridge import position_first

    model = probe.bridge.model(arch, task)
    mixer = model.components[0].module
    tokens = task.sample(6, 3, seed=0).tokens
    with torch.no_grad():
        fused = model(tokens)
        logits, cache = model.run_with_cache(tokens, names_filter=[SITE, "blocks.0.mixer.hook_ssm_state"])
    assert cache[SITE].shape == (3, tokens.shape[1], 512)  # Mamba-1: 64 channels x 8; Mamba-2: 4 heads x 16 x 8
    assert torch.equal(cache[SITE], position_first(model.components[0].kind,
                                                   cache["blocks.0.mixer.hook_ssm_state"]).flatten(2))
    assert (logits - fused).abs().max() < 1e-5 and not mixer.eager_scan
    assert model.state_sites(edit=True) == [SITE, "blocks.1.mixer.scan.hook_state"] == model.probe_hooks()[:2]


@pytest.mark.parametrize("arch", ["mamba2", "mamba"])
def test_a_state_edit_through_the_scan_is_causal(arch, task):
    model = probe.bridge.model(arch, task)
    t = 8
    clean, given, edited, seen, same = _state_runs(model, task, t)
    assert torch.equal(edited[:, :t], clean[:, :t])  # nothing before t moves, to the bit
    # the output at t and every later one move (float noise is ~1e-7)
    assert (edited[:, t:] - clean[:, t:]).abs().amax(dim=(0, 2)).min() > 1e-3
    # instrument: the scan holds the given state at t, and its own state set back changes nothing
    assert (seen - given).abs().max() / given.abs().max() < 1e-5
    assert (same - clean).abs().max() < 1e-5
    # an edit through the site itself (read after the scan) would change one position only: refused in one line
    with pytest.raises(ProbeError, match="read after TransformerLens's scan.*override_state") as e:
        model.run_with_hooks(task.sample(6, 1, seed=0).tokens, fwd_hooks=[(SITE, lambda x, hook: 0 * x)])
    assert "\n" not in str(e.value) and not model.components[0].module.eager_scan


def test_a_state_edit_that_ignores_the_transitions_misses_the_state_it_was_given(task, monkeypatch):
    # the instrument above fails for a broken edit: one that takes the state before t as the plain sum of the
    # writes (every transition 1) leaves the scan at another state than the one given
    import probe.bridge

    read = probe.bridge.transition
    monkeypatch.setattr(probe.bridge, "transition", lambda c, cache: torch.ones_like(read(c, cache)))
    _, given, _, seen, _ = _state_runs(probe.bridge.model("mamba2", task), task, 8)
    assert (seen - given).abs().max() / given.abs().max() > 1e-3


def test_a_state_wider_than_the_site_is_projected_and_edited_within_the_projection(task):
    from probe.bridge import position_first

    model = wrap(boot("mamba2", task), task, state_width=64)
    cell = model.hooked_cells["blocks.0.mixer.scan"]
    t = 8
    clean, given, edited, seen, same = _state_runs(model, task, t)
    p = cell.projection  # [64, 512], fixed orthonormal rows
    assert p.shape == (64, 512) and torch.allclose(p @ p.T, torch.eye(64), atol=1e-5)
    tokens = task.sample(6, 3, seed=0).tokens
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=[SITE, "blocks.0.mixer.hook_ssm_state"])
        with cell.override_state(t, given):
            _, moved = model.run_with_cache(tokens, names_filter=["blocks.0.mixer.hook_ssm_state"])
    full = position_first("mamba2", cache["blocks.0.mixer.hook_ssm_state"]).flatten(2)
    assert torch.allclose(cache[SITE], full @ p.T, atol=1e-5)
    assert torch.equal(edited[:, :t], clean[:, :t]) and (edited[:, t:] - clean[:, t:]).abs().max() > 1e-2
    assert (seen - given).abs().max() / given.abs().max() < 1e-5 and (same - clean).abs().max() < 1e-5
    # the state moved within the projection's directions only: the rest of it is the base's
    change = position_first("mamba2", moved["blocks.0.mixer.hook_ssm_state"]).flatten(2)[:, t] - full[:, t]
    assert (change - change @ p.T @ p).abs().max() < 1e-5 * change.abs().max()


def test_a_gated_deltanet_state_is_probed_and_its_edit_refused_in_one_line(task):
    from probe.bridge import position_first

    model = probe.bridge.model("qwen3-next", task)
    site = "blocks.0.linear_attn.scan.hook_state"
    assert model.hooked_cells == {} and model.state_sites() == [site] and model.probe_hooks()[0] == site
    tokens = task.sample(6, 2, seed=0).tokens
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=[site, "blocks.0.linear_attn.hook_ssm_state"])
    assert torch.equal(cache[site], position_first("gated-delta",
                                                   cache["blocks.0.linear_attn.hook_ssm_state"]).flatten(2))
    for refused in (lambda: model.state_sites(edit=True),
                    lambda: model.scans["blocks.0.linear_attn.scan"].override_state(3, cache[site][:, 3]).__enter__(),
                    lambda: model.run_with_hooks(tokens, fwd_hooks=[(site, lambda x, hook: 0 * x)])):
        with pytest.raises(ProbeError, match="rank-one update per head") as e:
            refused()
        assert "\n" not in str(e.value)


def test_the_probes_and_the_interchange_run_on_the_bridged_state_with_their_controls(task):
    from probe.probes import probe_model

    model = probe.bridge.model("mamba2", task)
    result = probe_model(model, task, lengths=[6, 12], hooks=model.state_sites(), n_train=24, n_train_beyond=12,
                         n_test=8, n_patch=6, random_subspaces=1)
    assert result.hooks == [SITE, "blocks.1.mixer.scan.hook_state"]
    assert result.by_length[["control_acc", "random_init_acc"]].notna().all().all()
    iv = result.interventions
    assert {"full", "same_sum", "subspace", "subspace_random"} <= set(iv.kind) and set(iv.block) == {0, 1, -1}
    controls = result.controls.set_index("control")
    assert {"permuted_target", "shuffled_labels", "identity_patch", "same_sum", "random_subspace"} <= set(
        controls.index)
    identity = controls.loc[["identity_patch"]]
    assert identity.passed.all() and (identity.value < 1e-5).all()
    assert set(result.verdicts.block) == {0, 1, -1}


def test_a_bridge_without_a_state_to_read_or_set_says_why_per_component(task):
    with pytest.raises(ProbeError, match="finite window of inputs, not a recurrent state") as e:
        probe.bridge.model("lfm2", task).state_sites()
    assert "\n" not in str(e.value)
    with pytest.raises(ProbeError, match="mup scaling"):
        probe.bridge.model("falcon-h1", task).state_sites()
    # an nn.LSTM in the layout: its per-step hooks are the state, read and set
    lstm = probe.bridge.model("nemotron-h", task, recurrent="lstm")
    assert lstm.state_sites(edit=True) == ["blocks.0.mixer.layers.0.hook_h", "blocks.0.mixer.layers.0.hook_c"]


# --- the matrix in docs/bridge.md ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_committed_matrix_is_what_the_code_does():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bridge_matrix

    committed = bridge_matrix.DOC.read_text().partition(bridge_matrix.BEGIN)[2].partition(bridge_matrix.END)[0]
    assert committed.strip() == bridge_matrix.table(bridge_matrix.matrix()).strip()


# --- a bridged model as probe's trainer and checkpoints take it -----------------------------------------------------
SMALL_RUN = ["--set", "model.d_model=32", "--steps", "4", "--set", "schedule.switch=2", "--set", "train.warmup=1",
             "--set", "train.batch_size=4", "--set", "train.eval_samples=4", "--set", "train.traj_every=2",
             "--set", "train.traj_dtype=float32", "--no-progress"]


def test_a_bridge_preset_trains_under_dat_and_its_checkpoint_rebuilds_offline(tmp_path):
    from probe.bridge import BridgeModelConfig
    from probe.checkpoint import load_checkpoint
    from probe.training.cli import main as train_main

    assert train_main(["--preset", "bridge-qwen3-next-dat", *SMALL_RUN, "--out", str(tmp_path / "run")]) == 0
    final = load_checkpoint(tmp_path / "run" / "final.pt")  # torch.load(weights_only=True) inside
    assert isinstance(final.model_config, BridgeModelConfig) and final.label == "bridge-qwen3-next-dat"
    assert final.model_config.transformers["layer_types"] == ["linear_attention", "full_attention"]
    model = final.build_model()
    assert all(torch.equal(final.state_dict[k], v) for k, v in model.state_dict().items())
    # DAT as the trainer runs it: attention held at its initial weights until the switch (step 2), trained after
    snaps = [load_checkpoint(tmp_path / "run" / "trajectory" / f"step_{s:06d}.pt").state_dict for s in (0, 2, 4)]
    attention = [k for k in snaps[0] if ".blocks.1." in k and ".attn." in k and snaps[0][k].is_floating_point()]
    assert attention and all(torch.equal(snaps[0][k], snaps[1][k]) for k in attention)
    assert any(not torch.equal(snaps[1][k], snaps[2][k]) for k in attention)
    recurrent = [k for k in snaps[0] if ".linear_attn." in k and snaps[0][k].is_floating_point()]
    assert any(not torch.equal(snaps[0][k], snaps[1][k]) for k in recurrent)  # the recurrence trains from step 0


def test_a_bridge_config_rebuilds_what_it_recorded_and_draws_weights_from_the_seed(task, monkeypatch):
    from probe.bridge import ARCHS, BridgeModelConfig
    from probe.external import model_config_from_dict

    cfg = BridgeModelConfig(arch="qwen3-next", d_model=32, vocab_size=task.vocab_size)
    recorded = cfg.to_dict()
    prefix, make = ARCHS["qwen3-next"]
    monkeypatch.setitem(ARCHS, "qwen3-next", (prefix, lambda d, n, v: make(d, n, v) | {"intermediate_size": 3 * d}))
    assert model_config_from_dict(recorded).transformers == cfg.transformers  # what was trained, not today's default
    torch.manual_seed(0)
    a = cfg.build(task).state_dict()
    torch.manual_seed(0)
    b = cfg.build(task).state_dict()
    torch.manual_seed(1)
    c = cfg.build(task).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)


def test_dat_on_a_bridged_pure_recurrence_is_refused_before_any_work():
    from probe.training import build_configs

    with pytest.raises(ProbeError, match="does nothing on a bridge model, which has no attention") as e:
        build_configs("bridge-jamba-dat", overrides=["model.arch=mamba2"])
    assert "\n" not in str(e.value)
    with pytest.raises(ProbeError, match="probe.bridge builds"):
        build_configs("bridge-jamba-dat", overrides=["model.arch=gpt2"])


BRIDGE_FACTORY = '''
import probe
from probe.tasks import make_task


def factory():
    task = make_task("interleaved", train_length=6)
    return probe.bridge.boot("qwen3-next", task), task
'''


def test_a_factory_that_returns_a_transformer_bridge_trains_from_the_command_line(tmp_path, monkeypatch):
    from probe.checkpoint import load_checkpoint
    from probe.external import FactoryModelConfig
    from probe.training.cli import main as train_main

    (tmp_path / "my_bridge.py").write_text(BRIDGE_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    assert train_main(["--model", "my_bridge:factory", "--preset", "hybrid-dat", *SMALL_RUN[2:], "--out",
                       str(run)]) == 0
    final = load_checkpoint(run / "final.pt")
    assert isinstance(final.model_config, FactoryModelConfig) and final.label == "my_bridge:factory-dat"
    model = final.build_model()
    assert isinstance(model, probe.bridge.BridgedModel) and model.attention_gates() == [1.0]
    sys.modules.pop("my_bridge", None)


# --- an nn.LSTM / nn.GRU in a bridged layout --------------------------------------------------------------------------
@pytest.mark.parametrize("arch, cell", [("nemotron-h", "lstm"), pytest.param("olmo-hybrid", "gru",
                                                                            marks=pytest.mark.slow)])
def test_an_lstm_in_a_bridged_layout_boots_to_the_transformers_logits(arch, cell, task):
    from probe.bridge import RecurrentMixer

    bridge = boot(arch, task, recurrent=cell)
    tokens = task.sample(6, 2, seed=0).tokens
    with torch.no_grad():
        ours, theirs = bridge(tokens), bridge.original_model(tokens, use_cache=False).logits
    assert torch.equal(ours, theirs)
    model = wrap(bridge, task)
    (name,) = model.recurrent_names
    assert isinstance(model.components[0].module.original_component, RecurrentMixer)
    assert model.components[0].kind == cell and model.attention_names  # the attention layer is kept
    _, cache = model.run_with_cache(tokens)
    # the bridge's own hooks on the component still fire, and probe's per-step ones beside them
    for hook in (f"{name}.hook_in", f"{name}.hook_out", f"{name}.layers.0.hook_h"):
        assert cache[hook].shape == (2, tokens.shape[1], 32)
    assert model.state_hooks() == [f"{name}.layers.0.hook_{s}" for s in (("h", "c") if cell == "lstm" else ("h",))]


def test_the_bridged_lstm_keeps_its_parameter_names_and_its_state_edits_are_causal(task):
    model = probe.bridge.model("nemotron-h", task, recurrent="lstm")
    mixer = model.components[0].module.original_component
    names = set(wrap(boot("nemotron-h", task, recurrent="lstm"), task).state_dict())
    assert set(model.state_dict()) == names and any(k.endswith("mixer._original_component.rnn.weight_hh_l0")
                                                    for k in names)
    cell = model.hooked_cells["blocks.0.mixer.layers.0"]
    assert cell.rnn.weight_hh_l0 is mixer.rnn.weight_hh_l0  # the mixer's own Parameter: an optimizer trains both
    tokens = task.sample(6, 2, seed=3).tokens
    t = 8
    with torch.no_grad():
        fused = model(tokens)
        same = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.mixer.layers.0.hook_c", lambda x, hook: x)])

        def zero_c(c, hook):
            c = c.clone()
            c[:, t] = 0
            return c

        edited = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.mixer.layers.0.hook_c", zero_c)])
        h, c = torch.zeros(2, 32), torch.zeros(2, 32)
        with cell.override_state(t, h, c):
            overridden = model(tokens)
    # the unrolled path that a listened hook takes computes what the fused kernel does
    assert torch.allclose(same, fused, atol=1e-5)
    assert torch.equal(edited[:, :t], fused[:, :t])
    # the recurrence continues from the edited cell state: later positions move, by far more than rounding
    assert (edited[:, t + 1:] - fused[:, t + 1:]).abs().max() > 1e-2
    assert torch.equal(overridden[:, :t], fused[:, :t])
    assert (overridden[:, t + 1:] - fused[:, t + 1:]).abs().max() > 1e-2


def test_an_lstm_goes_only_where_the_bridge_boots_with_one_and_can_count_says_it_does_not_apply(task):
    with pytest.raises(ProbeError, match="requires the mixer's own inner modules") as e:
        boot("jamba", task, recurrent="lstm")
    assert "\n" not in str(e.value)
    with pytest.raises(ProbeError, match="choose one of native, lstm, gru"):
        boot("nemotron-h", task, recurrent="rnn")
    with pytest.raises(ProbeError, match="an LSTM is nonlinear") as e:
        can_count(probe.bridge.model("nemotron-h", task, recurrent="lstm"), task)
    assert "\n" not in str(e.value) and "not applicable" in str(e.value)


def test_the_bridged_lstm_preset_trains_under_dat_and_its_checkpoint_rebuilds_offline(tmp_path):
    from probe.bridge import BridgeModelConfig
    from probe.checkpoint import load_checkpoint
    from probe.training.cli import main as train_main

    run = tmp_path / "run"
    assert train_main(["--preset", "bridge-nemotron-h-lstm-dat", *SMALL_RUN, "--out", str(run)]) == 0
    raw = torch.load(run / "final.pt", weights_only=True)  # a checkpoint is data, never code
    assert raw["model_config"]["recurrent"] == "lstm"
    final = load_checkpoint(run / "final.pt")
    assert isinstance(final.model_config, BridgeModelConfig) and final.label == "bridge-nemotron-h-lstm-dat"
    model = final.build_model()
    assert all(torch.equal(final.state_dict[k], v) for k, v in model.state_dict().items())
    assert model.components[0].kind == "lstm" and "blocks.0.mixer.layers.0.hook_c" in model.hook_dict
    snaps = [load_checkpoint(run / "trajectory" / f"step_{s:06d}.pt").state_dict for s in (0, 2, 4)]
    names = {n for n, p in model.named_parameters() if any(p is q for q in model.attention_parameters())}
    lstm = {n for n, p in model.named_parameters() if any(p is q for q in model.recurrent_parameters())}
    assert names and all(torch.equal(snaps[0][k], snaps[1][k]) for k in names)  # attention held until step 2
    assert any(not torch.equal(snaps[1][k], snaps[2][k]) for k in names)
    assert lstm and any(".rnn." in k for k in lstm) and any(not torch.equal(snaps[0][k], snaps[1][k]) for k in lstm)


def test_a_bridged_recurrence_is_labelled_by_the_models_own_module_or_its_cell(task):
    """The analyses' labels (probe.core.cells) name what the user built: the transformers mixer the bridge wraps,
    or ``lstm`` for an LSTM in a bridged layout, never the bridge's own component class."""
    from probe.core.cells import recurrent_modules

    native = dict(recurrent_modules(probe.bridge.model("nemotron-h", task)))
    assert native == {"blocks.0.mixer": "NemotronHMamba2Mixer"}, native
    lstm = dict(recurrent_modules(probe.bridge.model("nemotron-h", task, recurrent="lstm")))
    assert lstm == {"blocks.0.mixer": "lstm"}, lstm
