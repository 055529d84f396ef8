"""Attributions (occlusion, path patching, component ablation) and the state interventions on a wrapped hybrid."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from test_wrap import FACTORY, Hybrid, no_hooks_left, wrapped_hybrid

import probe
from probe.attributions.components import component_ablation
from probe.attributions.occlusion import resample_occlusion
from probe.errors import ProbeError
from probe.tasks import make_task


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
    assert main(["my_hybrid:factory", "--json", "--lengths", "8", "--samples", "4", "--ig"]) == 2
    err = capsys.readouterr().err
    assert "hook_embed" in err and len(err.strip().splitlines()) == 1


def test_ig_is_refused_in_one_line_from_python(task):
    from probe.attributions.analysis import analyze_checkpoint
    from probe.checkpoint import FactoryCheckpoint

    wrapped = wrapped_hybrid(task)
    ckpt = FactoryCheckpoint(path=None, model_config=wrapped.cfg, task_config=task, state_dict={}, model=wrapped,
                             spec="t:f")
    with pytest.raises(ProbeError, match="without --ig"):
        analyze_checkpoint(ckpt, lengths=[8], batch_size=4, ig=True)
