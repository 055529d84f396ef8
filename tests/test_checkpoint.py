"""Checkpoints: round trip, atomic writes, and one-line errors for every kind of bad file."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from probe.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    checkpoint_from_model,
    load_checkpoint,
    resolve_checkpoints,
    save_checkpoint,
)
from probe.tasks import make_task

from conftest import tiny_model


@pytest.fixture
def saved(tmp_path, task):
    model = tiny_model("hybrid", task.vocab_size)
    model.set_attention_gate([0.0, 1.0])
    path = save_checkpoint(tmp_path / "c.pt", checkpoint_from_model(
        model, task, train_config={"seed": 3, "schedule": {"kind": "delayed"}}, step=7, metrics={"acc": 0.5}))
    return model, path


def test_round_trip_gives_identical_outputs(saved, task):
    model, path = saved
    ckpt = load_checkpoint(path)
    assert ckpt.step == 7 and ckpt.metrics == {"acc": 0.5} and ckpt.seed == 3 and ckpt.label == "hybrid-dat"
    assert ckpt.task_config == task and ckpt.model_config == model.cfg
    again = ckpt.build_model()
    assert again.attention_gates() == [0.0, 1.0]
    x = task.sample(12, 4, 0).tokens
    assert torch.equal(again(x), model(x))


def test_save_is_atomic_and_leaves_no_temp_file(saved, tmp_path, task, monkeypatch):
    _, path = saved
    before = path.read_bytes()

    def broken_save(obj, f, *a, **k):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, load_checkpoint(path))
    assert path.read_bytes() == before, "a failed write must not touch the existing checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def one_line(err: pytest.ExceptionInfo, path: Path, *words: str) -> None:
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg, msg
    for w in words:
        assert w in msg, msg


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path / "nope.pt")
    one_line(e, tmp_path / "nope.pt", "no such file")


def test_truncated_file(saved, tmp_path):
    _, path = saved
    cut = tmp_path / "cut.pt"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(cut)
    one_line(e, cut, "truncated")


def test_random_bytes(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(junk)
    one_line(e, junk)


def test_foreign_torch_file(tmp_path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"model": {"w": torch.zeros(2)}}, foreign)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(foreign)
    one_line(e, foreign, "not a probe checkpoint")


def test_future_format_version(saved, tmp_path):
    _, path = saved
    obj = torch.load(path, weights_only=True)
    obj["format_version"] = FORMAT_VERSION + 1
    future = tmp_path / "future.pt"
    torch.save(obj, future)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(future)
    one_line(e, future, "upgrade probe")


class _Payload:
    """Unpickling this would create a file: a checkpoint that runs code."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_pickle_that_would_run_code_is_refused(tmp_path):
    target = tmp_path / "pwned.txt"
    evil = tmp_path / "evil.pt"
    torch.save({"format": "probe-checkpoint", "payload": _Payload(str(target))}, evil, pickle_module=pickle)
    assert not target.exists()
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(evil)
    one_line(e, evil, "refused")
    assert not target.exists(), "loading a checkpoint must never run code"


def test_weights_that_do_not_fit_the_config(saved, tmp_path):
    _, path = saved
    obj = torch.load(path, weights_only=True)
    obj["model_config"]["d_model"] = 32
    bad = tmp_path / "bad.pt"
    torch.save(obj, bad)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(bad).build_model()
    one_line(e, bad.name, "do not fit")


def test_resolve_checkpoints(tmp_path, saved):
    _, path = saved
    assert resolve_checkpoints([str(tmp_path)]) == [path]
    assert resolve_checkpoints([str(tmp_path / "*.pt")]) == [path]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no \\*.pt"):
        resolve_checkpoints([str(empty)])


def test_end_to_end_config_to_step_to_save_to_load(tmp_path):
    """config -> model -> one optimizer step on a task batch -> save -> load -> same logits."""
    from probe.models import HookedSequenceModel, ModelConfig

    task = make_task("interleaved", train_length=10)
    torch.manual_seed(0)
    model = HookedSequenceModel(ModelConfig(family="hybrid", vocab_size=task.vocab_size, d_model=16, n_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = task.sample(10, 8, 0)
    before = model(batch.tokens).detach()
    loss = model(batch.tokens, labels=batch.labels)
    loss.backward()
    opt.step()
    after = model(batch.tokens).detach()
    assert not torch.equal(before, after)
    path = save_checkpoint(tmp_path / "e2e.pt", checkpoint_from_model(
        model, task, step=1, optimizer_state=opt.state_dict()))
    ckpt = load_checkpoint(path)
    assert torch.equal(ckpt.build_model()(batch.tokens), after)
    assert ckpt.optimizer_state["state"], "optimizer state is kept for resume"
