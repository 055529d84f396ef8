"""Attributions (occlusion, path patching, component ablation) and the state interventions on a wrapped hybrid."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F
from test_wrap import FACTORY, Hybrid, no_hooks_left, wrapped_hybrid
from torch import nn

import probe
from probe.attributions.components import component_ablation
from probe.attributions.occlusion import resample_occlusion
from probe.errors import ProbeError
from probe.tasks import make_task

from conftest import needs_captum


@pytest.fixture
def task():
    return make_task("interleaved", train_length=8)


def far_flip(occ, condition: str) -> float:
    """Share of the number answers at distance >= 2 whose prediction moved under ``condition`` (an untrained model
    flips a few per cent of them: any flip shows a path open, none that it is closed)."""
    far = occ.far(1)
    return float(far[(far.range == "far") & (far.condition == condition)].flip.iloc[0])


# --- path patching over the named modules ---------------------------------------------------------------------------
def test_path_patching_routes_through_the_named_modules(task):
    """A change at s reaches t > s only along the paths a condition leaves open: with the LSTM's output zero (all
    weights 0) nothing reaches t when attention's outputs are held (``recurrent_only``), while the whole model and
    the attention-only paths still move answers; with attention's gate at 0, the reverse."""
    batch = task.sample(8, 8, 0)
    wrapped = wrapped_hybrid(task)
    with torch.no_grad():
        for p in wrapped.module.lstm.parameters():
            p.zero_()
    occ = resample_occlusion(wrapped, batch, task, seed=1)
    assert far_flip(occ, "recurrent_only") == 0.0
    assert far_flip(occ, "total") > 0 and far_flip(occ, "attention_only") > 0
    assert occ.causal_max == 0.0 and occ.cross_position_max == 0.0

    wrapped = wrapped_hybrid(task)
    wrapped.set_attention_gate(0.0)
    occ = resample_occlusion(wrapped, batch, task, seed=1)
    assert far_flip(occ, "attention_only") == 0.0
    assert far_flip(occ, "total") > 0 and far_flip(occ, "recurrent_only") > 0
    assert no_hooks_left(wrapped)


def test_occlusion_controls_catch_what_they_name(task):
    """The cross-position check fails when a module that mixes positions is left unnamed (attention here: the
    patching cannot hold it), and the causality check fails on an attention that sees later tokens."""
    batch = task.sample(8, 8, 0)
    torch.manual_seed(0)
    unnamed = probe.wrap(Hybrid(task.vocab_size).eval(), recurrent=["lstm"], task=task)
    occ = resample_occlusion(unnamed, batch, task, seed=1)
    assert occ.cross_position_max > 0.05 and occ.causal_max == 0.0

    class Peeking(Hybrid):
        def forward(self, tokens):
            x = self.embed(tokens)
            x = x + self.lstm(x)[0]
            return self.unembed(x + self.attn(x, x, x, need_weights=False)[0])  # no causal mask

    torch.manual_seed(0)
    peeking = probe.wrap(Peeking(task.vocab_size).eval(), attention=["attn"], recurrent=["lstm"], task=task)
    assert resample_occlusion(peeking, batch, task, seed=1).causal_max > 0.05


def test_occlusion_holds_a_module_that_is_not_batch_first(task):
    """An nn.LSTM with batch_first=False hooks (pos, batch, d): holding it clean must index the batch along dim 1, so
    that with attention off, nothing reaches later positions when the LSTM is held (``attention_only``)."""
    batch = task.sample(8, 8, 0)
    wrapped = wrapped_hybrid(task, batch_first=False)
    wrapped.set_attention_gate(0.0)
    occ = resample_occlusion(wrapped, batch, task, seed=1)
    assert far_flip(occ, "attention_only") == 0.0 and far_flip(occ, "recurrent_only") > 0
    assert occ.cross_position_max == 0.0


def test_component_ablation_matches_the_gate(task):
    """Zeroing attention's output is what a gate of 0 does: the ablated accuracy and logit equal the gated model's."""
    batch = task.sample(16, 8, 0)
    wrapped = wrapped_hybrid(task)
    table = component_ablation(wrapped, batch)
    assert list(table[table.subtask == "state"].hook) == ["lstm.hook_out", "attn.hook_out"]
    attn = table[(table.subtask == "state") & (table.component == "attn")].iloc[0]
    with torch.no_grad():
        base = wrapped(batch.tokens)
        wrapped.set_attention_gate(0.0)
        gated = wrapped(batch.tokens)
    mask = (batch.masks["state"] & batch.answer_mask).float()

    def logit(out):  # mean over sequences of each sequence's mean correct logit, as the table reports it
        correct = out.gather(-1, batch.labels.clamp(min=0)[..., None])[..., 0]
        return ((correct * mask).sum(1) / mask.sum(1)).mean()

    assert attn.effect == pytest.approx(float(logit(base) - logit(gated)), abs=1e-4)
    assert abs(attn.effect) > 1e-3  # attention does move the logit, so the equality above is not 0 = 0


class Renamed(nn.Module):
    """A hybrid whose modules carry the user's names, none of them probe's: a GRU ``mixer`` and attention ``mha``."""

    def __init__(self, vocab: int, d: int = 16) -> None:
        super().__init__()
        self.embed, self.mixer = nn.Embedding(vocab, d), nn.GRU(d, d, batch_first=True)
        self.mha, self.unembed = nn.MultiheadAttention(d, 2, batch_first=True), nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        x = x + self.mixer(x)[0]
        mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).triu(1)
        return self.unembed(x + self.mha(x, x, x, attn_mask=mask, need_weights=False)[0])


def test_component_ablation_names_the_users_modules(task):
    """The table and its figure name each sublayer by the user's module and its kind (``mha (attn)``), not by a
    block number the model does not have, and a factory's name is the panel's title as given (no leading '/')."""
    from probe.attributions.plots import plot_components

    torch.manual_seed(0)
    wrapped = probe.wrap(Renamed(task.vocab_size).eval(), attention=["mha"], recurrent=["mixer"], task=task)
    table = component_ablation(wrapped, task.sample(8, 4, 0)).assign(checkpoint="my_hybrid:factory", step=0, length=8)
    state = table[table.subtask == "state"]
    assert list(state.module) == ["mixer", "mha"] and list(state.component) == ["gru", "attn"]
    ax = plot_components(table).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["mixer (gru)", "mha (attn)"]
    assert ax.get_title() == "my_hybrid:factory step 0, length 8"


def test_attributions_cli_takes_a_factory(tmp_path, monkeypatch, capsys):
    from probe.attributions.cli import main

    (tmp_path / "my_hybrid.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    rc = main(["my_hybrid:factory", "--json", "--lengths", "8", "--samples", "4"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    obj = json.loads(out.out)
    analyses = {r["analysis"] for r in obj["results"]}
    assert {"occlusion", "occlusion_far", "components"} <= analyses and "reads" not in analyses
    checks = {c["control"]: c for c in obj["controls"]}
    assert checks["occlusion_causal_L8"]["passed"] and checks["patching_cross_position_L8"]["passed"]


def test_evaluate_of_a_factorys_fresh_model_says_it_was_never_trained(tmp_path, monkeypatch, capsys):
    """A factory's model as built has no training record: the first line says so (it said 'trained in fp32 (AdamW
    default)') and the tables count it as one seed (they said 0, beside '0/1' in the same output)."""
    from probe.evaluate import main

    (tmp_path / "my_hybrid.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["my_hybrid:factory", "--lengths", "8,16", "--samples", "4", "--no-progress"]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "my_hybrid:factory, seed None, never trained" in text and "trained in fp32" not in text
    header = next(line for line in text.splitlines() if line.split()[:3] == ["label", "subtask", "seeds"])
    row = text.splitlines()[text.splitlines().index(header) + 1].split()
    assert row[:3] == ["my_hybrid:factory", "all", "1"]


@needs_captum  # without captum, --ig is refused for that first (tests/test_extras.py)
def test_ig_on_a_factory_is_refused_in_one_line_from_the_command_line(tmp_path, monkeypatch, capsys):
    from probe.attributions.cli import main

    (tmp_path / "my_hybrid.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["my_hybrid:factory", "--json", "--lengths", "8", "--samples", "4", "--ig"]) == 2
    err = capsys.readouterr().err
    assert "hook_embed" in err and len(err.strip().splitlines()) == 1


@needs_captum
def test_ig_is_refused_in_one_line_from_python(task):
    from probe.attributions.analysis import analyze_checkpoint
    from probe.checkpoint import FactoryCheckpoint

    wrapped = wrapped_hybrid(task)
    ckpt = FactoryCheckpoint(path=None, model_config=wrapped.cfg, task_config=task, state_dict={}, model=wrapped,
                             spec="t:f")
    with pytest.raises(ProbeError, match="without --ig"):
        analyze_checkpoint(ckpt, lengths=[8], batch_size=4, ig=True)


# --- interventions on the recurrent state ----------------------------------------------------------------------------
@pytest.mark.parametrize("num_layers", [1, 2])
def test_state_interchange_continues_from_the_source_state(task, num_layers):
    """With attention off, the answers after t depend on the recurrent state after t and the tokens after t alone: the
    base with every layer's state after t set to the source's answers exactly as the source does after t (and as
    the base before t; at t the two differ in the token itself). An override that missed a layer, or set the state
    one step off, fails this."""
    from probe.probes.fit import lstm_blocks
    from probe.probes.interventions import interchange_pair, lstm_states_at, patched_logits

    wrapped = wrapped_hybrid(task, num_layers=num_layers)
    wrapped.set_attention_gate(0.0)
    assert lstm_blocks(wrapped) == list(range(num_layers))
    pair = interchange_pair(task, 16, 6, 8, seed=3)
    t = pair.position
    source_states = lstm_states_at(wrapped, pair.source.tokens, t)
    patched = patched_logits(wrapped, pair.base.tokens, t, source_states)
    with torch.no_grad():
        base, source = wrapped(pair.base.tokens), wrapped(pair.source.tokens)
    torch.testing.assert_close(patched[:, t + 1:], source[:, t + 1:], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(patched[:, :t], base[:, :t], atol=1e-5, rtol=1e-4)
    assert (source[:, t + 1:] - base[:, t + 1:]).abs().max() > 1e-2  # the states differ, so the check has teeth
    only_first = patched_logits(wrapped, pair.base.tokens, t, {0: source_states[0]})
    if num_layers > 1:  # one layer's state is not the whole state: the later layer still carries the base's history
        assert (only_first[:, t + 1:] - source[:, t + 1:]).abs().max() > 1e-3
    assert no_hooks_left(wrapped)


def test_probe_table_with_interventions(task):
    """probe_model with patching on a wrapped nn.LSTM hybrid: interventions per hooked cell, their identity check
    passing, and a verdict per cell and length; a model whose recurrent module has module-level hooks only is
    refused in one line."""
    from probe.probes import probe_model

    wrapped = wrapped_hybrid(task)
    result = probe_model(wrapped, task, lengths=[8, 16], n_train=24, n_train_beyond=12, n_test=8, n_patch=8)
    iv = result.interventions
    assert set(iv.kind) == {"full", "same_sum", "subspace"} and set(iv.block) == {0}
    checks = result.controls[result.controls.control == "identity_patch"]
    assert len(checks) == 2 and checks.passed.all()
    assert set(result.verdicts.block) == {0} and result.verdicts.hook.str.startswith("lstm.layers.0.hook_").all()



class Opaque(nn.Module):
    """A recurrent module that is not an nn.LSTM: wrapped, it has module-level hooks only."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)


class Counter(nn.Module):
    """An exact counter: the one-hot of the running sum mod m of the number tokens (ids below m)."""

    def __init__(self, m: int) -> None:
        super().__init__()
        self.m = m

    def forward(self, tokens):
        numbers = torch.where(tokens < self.m, tokens, 0)
        return F.one_hot(numbers.cumsum(dim=1) % self.m, self.m).float()


class LeakyCounter(Counter):
    """A counter whose output also depends on the history beyond s_t: the running sum shifted by the first number."""

    def forward(self, tokens):
        numbers = torch.where(tokens < self.m, tokens, 0)
        first = numbers.gather(1, (tokens < self.m).float().argmax(dim=1, keepdim=True))
        return F.one_hot((numbers.cumsum(dim=1) + first) % self.m, self.m).float()


class CounterHybrid(nn.Module):
    """Answers every state question from its counter (attention adds to the same logits): a module-level recurrent
    module whose output from t on carries s_t and nothing else of the history."""

    def __init__(self, task) -> None:
        super().__init__()
        self.vocab, m = task.vocab_size, task.m
        self.counter, self.attn = Counter(m), nn.MultiheadAttention(m, 1, batch_first=True)

    def forward(self, tokens):
        c = self.counter(tokens)
        mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=tokens.device).triu(1)
        a, _ = self.attn(c, c, c, attn_mask=mask, need_weights=False)
        return F.pad(10 * c + a, (0, self.vocab - c.shape[-1]))


def test_output_interchange_moves_what_the_module_carries(task):
    """Module level: an exact counter's outputs from t on, from a source with another s_t, move every later state
    answer to the counterfactual (iia 1), and from a same-sum source change none (the control passes); a counter
    that also carries its first number carries more than s_t, and the same control fails on it."""
    from probe.probes.outputs import output_interchange

    counter = probe.wrap(CounterHybrid(task).eval(), attention=["attn"], recurrent=["counter"], task=task)
    results, controls = output_interchange(counter, task, [8, 16], n=8)
    rows = results.set_index(["kind", "length", "test_positions"])
    assert (rows.loc["output"].iia == 1.0).all() and (rows.loc["output"].unpatched_cf == 0.0).all()
    assert (rows.loc["output_same_sum"].changed_frac == 0.0).all()
    assert list(controls.control) == ["output_same_sum"] * 2 and controls.passed.all()

    leaky = CounterHybrid(task).eval()
    leaky.counter = LeakyCounter(task.m)
    leaky = probe.wrap(leaky, attention=["attn"], recurrent=["counter"], task=task)
    _, controls = output_interchange(leaky, task, [8, 16], n=8)
    assert not controls.passed.any() and (controls.changed_frac > 0.5).all()


def test_output_interchange_is_exact_with_attention_off(task):
    """With attention off the later answers depend on the module's outputs after t and the tokens after t alone, so
    the patched base changes exactly where the source's own answers differ from the base's: the ``changed_frac`` of
    ``output`` equals that share counted directly. A swap that started a step late would leave answers unmoved."""
    from probe.probes.interventions import PATCH_SEED_BASE, interchange_pair
    from probe.probes.outputs import output_interchange

    torch.manual_seed(0)
    model = Hybrid(task.vocab_size).eval()
    model.lstm = Opaque(model.lstm)
    opaque = probe.wrap(model, attention=["attn"], recurrent=["lstm"], task=task)
    opaque.set_attention_gate(0.0)
    results, _ = output_interchange(opaque, task, [16], n=32, fractions=[0.5])
    got = results.set_index(["kind", "test_positions"]).loc[("output", "all")]
    pair = interchange_pair(task, 16, 8, 32, PATCH_SEED_BASE + 16 * 100)
    with torch.no_grad():
        base, source = opaque(pair.base.tokens).argmax(-1), opaque(pair.source.tokens).argmax(-1)
    n = int(pair.later.sum())
    direct = int(((base != source) & pair.later).sum())
    # counts of answers; one answer of slack for a near-tie argmax that another batch size rounds the other way
    assert direct >= 3 and abs(round(got.changed_frac * n) - direct) <= 1


def test_probe_model_on_module_level_recurrence(task):
    """probe_model with patching on a wrapped model whose recurrent module has module-level hooks: the output
    interchange rows and their control, no state verdicts."""
    from probe.probes import probe_model, result_rows

    counter = probe.wrap(CounterHybrid(task).eval(), attention=["attn"], recurrent=["counter"], task=task)
    result = probe_model(counter, task, lengths=[8, 16], n_train=24, n_train_beyond=12, n_test=8, n_patch=8)
    assert set(result.interventions.kind) == {"output", "output_same_sum"} and result.verdicts.empty
    same = result.controls[result.controls.control == "output_same_sum"]
    assert len(same) == 2 and same.passed.all()
    _, rows = result_rows(result, 0)
    assert {r["kind"] for r in rows if r["control"] == "output_same_sum"} == {"control"}


@pytest.mark.parametrize("command", ["shortcuts", "sharpness", "transitions"])
def test_analyses_of_probes_own_parts_refuse_a_factory_before_any_work(command, tmp_path, monkeypatch, capsys):
    """What reads probe's attention patterns, positional embedding or SSM transitions says so in one line, exit 2,
    before computing anything (no output folder is written)."""
    import importlib

    (tmp_path / "my_hybrid.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    main = importlib.import_module(f"probe.{command}.cli" if command != "transitions" else "probe.transitions").main
    assert main(["my_hybrid:factory", "--json", "--no-progress", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "does not apply to this checkpoint" in err and len(err.strip().splitlines()) == 1
    assert not any((tmp_path / "out").glob("*"))
