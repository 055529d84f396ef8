"""Training a wrapped model: DAT's gate and held-back attention, a gradient cut through the named modules, and
checkpoints that record what rebuilds the model (a factory spec or a transformers config)."""

from __future__ import annotations

import dataclasses
import sys
import textwrap

import pytest
import torch

import probe
from probe.checkpoint import CheckpointError, checkpoint_from_model, load_checkpoint
from probe.errors import ProbeError
from probe.external import FactoryModelConfig, HFModelConfig, call_factory
from probe.schedules.points import At
from probe.schedules.settings import ScheduleConfig, variant_settings
from probe.tasks import make_task
from probe.training.cli import main as train_main
from probe.training.config import TrainConfig
from probe.training.trainer import Trainer

FACTORY = '''
import torch
from torch import nn

import probe
from probe.tasks import make_task


class Hybrid(nn.Module):
    def __init__(self, vocab, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, d, batch_first=True)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.unembed = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        x = x + self.lstm(x)[0]
        mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).triu(1)
        return self.unembed(x + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0])


def factory():
    task = make_task("interleaved", train_length=8)
    return probe.wrap(Hybrid(task.vocab_size), attention=["attn"], recurrent=["lstm"]), task
'''


@pytest.fixture
def factory_spec(tmp_path, monkeypatch):
    """``tiny_hybrid_<n>:factory``, importable from a temporary folder (a fresh module name per test)."""
    name = f"tiny_hybrid_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:factory"
    sys.modules.pop(name, None)


def _train_cfg(variant: str, steps: int = 8, **schedule) -> TrainConfig:
    sched = ScheduleConfig(**{**variant_settings(variant), **schedule})
    return TrainConfig(steps=steps, batch_size=8, lr=1e-2, warmup=1, eval_every=steps, eval_samples=8,
                       ckpt_every=steps, traj_every=steps, schedule=sched)


def _snapshot(params):
    return [p.detach().clone() for p in params]


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_delayed_holds_attention_back_until_the_switch(factory_spec, tmp_path):
    model_cfg, task = FactoryModelConfig.of(factory_spec)
    trainer = Trainer(model_cfg, task, _train_cfg("dat", switch=At(step=4)), tmp_path / "run", progress=False)
    model = trainer.model
    attention, recurrent = model.attention_parameters(), model.recurrent_parameters()
    assert attention and recurrent
    start_att, start_rec = _snapshot(attention), _snapshot(recurrent)
    gates = []
    for step in range(4):
        trainer.train_step(step)
        gates.append(model.attention_gates())
    assert gates == [[0.0]] * 4
    assert _same(_snapshot(attention), start_att)  # no update, no weight decay: out of the optimizer
    assert not _same(_snapshot(recurrent), start_rec)
    for step in range(4, 8):
        trainer.train_step(step)
        gates.append(model.attention_gates())
    assert gates[4:] == [[1.0]] * 4
    assert not _same(_snapshot(attention), start_att)


def test_a_stopgrad_cut_gives_the_recurrent_module_the_detached_gradient(factory_spec, tmp_path):
    """``stopgrad-rnn``: the recurrent module's gradient is the one with attention's inputs detached; every other
    parameter keeps the full gradient (which differs from the detached one, so the test can fail)."""
    model_cfg, task = FactoryModelConfig.of(factory_spec)
    trainer = Trainer(model_cfg, task, _train_cfg("stopgrad-rnn"), tmp_path / "run", progress=False)
    model = trainer.model
    batch = task.sample(8, 8, seed=0)

    def loss_fn():
        logits = model(batch.tokens)
        return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(),
                                                         ignore_index=-100)

    rec, embed = model.recurrent_parameters(), [model.module.embed.weight]
    with model.attention_detached():
        detached = torch.autograd.grad(loss_fn()[1], rec + embed)
    full = torch.autograd.grad(loss_fn()[1], rec + embed)
    assert not all(torch.allclose(a, b) for a, b in zip(detached, full, strict=True))
    model.zero_grad(set_to_none=True)
    trainer.schedule.gradient_policy(0).backward(model, loss_fn)
    for p, want in zip(rec, detached[:len(rec)], strict=True):
        torch.testing.assert_close(p.grad, want)
    torch.testing.assert_close(model.module.embed.weight.grad, full[-1])
    assert not model.attention_gates() == [] and not any(s.stopgrad for s in model._attention_sites())


def test_cuts_that_need_probes_own_blocks_are_refused(factory_spec, tmp_path):
    model_cfg, task = FactoryModelConfig.of(factory_spec)
    with pytest.raises(ProbeError, match="mlp-placebo cut needs probe's own blocks"):
        Trainer(model_cfg, task, _train_cfg("placebo"), tmp_path / "a", progress=False)
    with pytest.raises(ProbeError, match="1 named recurrent module"):
        Trainer(model_cfg, task, _train_cfg("stopgrad-rnn1"), tmp_path / "b", progress=False)


def test_a_factory_checkpoint_round_trips(factory_spec, tmp_path, capsys):
    assert train_main(["--model", factory_spec, "--preset", "hybrid-dat", "--steps", "6", "--no-progress",
                       "--set", "train.eval_samples=8", "--set", "train.batch_size=8", "--out",
                       str(tmp_path / "run")]) == 0
    ckpt = load_checkpoint(tmp_path / "run" / "final.pt")  # torch.load(weights_only=True) inside
    assert ckpt.model_config == FactoryModelConfig.of(factory_spec)[0]
    assert ckpt.label == f"{factory_spec}-dat"
    model = ckpt.build_model()
    assert isinstance(model, probe.WrappedModel)
    state = ckpt.state_dict
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert model.attention_gates() == [1.0]


def test_what_cannot_be_rebuilt_is_refused_in_one_line(factory_spec, tmp_path, capsys):
    model_cfg, task = FactoryModelConfig.of(factory_spec)
    hand_made, _ = call_factory(factory_spec)  # probe.wrap(...) alone: nothing says how to rebuild it
    with pytest.raises(CheckpointError, match="built by hand cannot be saved") as e:
        checkpoint_from_model(hand_made, task)
    assert "\n" not in str(e.value)
    assert checkpoint_from_model(model_cfg.build(task), task).model_config == model_cfg
    trainer = Trainer(model_cfg, task, _train_cfg("joint", steps=2), tmp_path / "run", progress=False)
    trainer.run()
    moved = dataclasses.replace(model_cfg, factory="no_such_module_here:factory")
    ckpt = load_checkpoint(tmp_path / "run" / "final.pt")
    ckpt.model_config = moved
    with pytest.raises(CheckpointError, match="cannot rebuild its model.*no_such_module_here.*PYTHONPATH") as e:
        ckpt.build_model()
    assert str(e.value).startswith(str(tmp_path / "run" / "final.pt"))  # the path given, not only "final.pt"
    assert train_main(["--model", factory_spec, "--set", "model.d_model=8", "--out", str(tmp_path / "x")]) == 2
    assert "drop --set model.d_model=8" in capsys.readouterr().err


def test_a_model_without_its_factory_s_name_asks_for_module_colon_factory(factory_spec, tmp_path, capsys):
    module = factory_spec.split(":")[0]
    for given, said in [(module, "give MODULE:FACTORY"), (f"{module}.py:factory", f"not its file: {module}:factory")]:
        assert train_main(["--model", given, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert said in err and "has no callable" not in err and len(err.strip().splitlines()) == 1


def test_a_transformers_hybrid_trains_and_reloads_from_its_recorded_config(tmp_path):
    pytest.importorskip("transformers")
    task = make_task("interleaved", train_length=8)
    cfg = HFModelConfig(arch="recurrentgemma", d_model=16, n_layers=2, n_heads=2, vocab_size=task.vocab_size)
    assert cfg.transformers["block_types"] == ["recurrent", "attention"]
    trainer = Trainer(cfg, task, _train_cfg("dat", steps=4, switch=At(step=2)), tmp_path / "run", progress=False)
    assert trainer.model.recurrent_names and trainer.model.attention_names
    trainer.run()
    ckpt = load_checkpoint(tmp_path / "run" / "final.pt")
    assert ckpt.model_config == cfg and ckpt.label == "hf-recurrentgemma-dat"
    # the whole transformers config is recorded: a change of probe's defaults does not change what reloads
    assert ckpt.model_config.transformers["lru_width"] == 16
    tokens = task.sample(8, 2, seed=1).tokens
    torch.testing.assert_close(ckpt.build_model()(tokens), trainer.model.eval()(tokens))
