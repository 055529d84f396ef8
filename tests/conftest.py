"""Shared fixtures: tiny models and checkpoints that build in milliseconds, and a clean plotting environment."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from hypothesis import settings

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("MPLCONFIGDIR", tempfile.mkdtemp(prefix="mpl-"))
os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="ipy-"))
torch.set_num_threads(1)

# No example database: hypothesis would otherwise write .hypothesis/ into the working tree; every property test is
# derandomized so that a failure reproduces from the test alone.
settings.register_profile("probe", database=None, derandomize=True)
settings.load_profile("probe")

from probe.models import HookedSequenceModel, ModelConfig  # noqa: E402
from probe.tasks import make_task  # noqa: E402


@pytest.fixture
def task():
    return make_task("interleaved", train_length=8)


def tiny_model(family: str = "hybrid", vocab_size: int = 43, seed: int = 0, **kw) -> HookedSequenceModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(family=family, vocab_size=vocab_size, **{"d_model": 16, "n_layers": 2, "n_heads": 2, **kw})
    return HookedSequenceModel(cfg).eval()


@pytest.fixture
def hybrid(task):
    return tiny_model("hybrid", task.vocab_size)


def set_at(t: int, value: torch.Tensor):
    """A forward hook that writes ``value`` at position ``t`` (a causal edit of one position)."""
    def hook(a, hook):
        a[:, t] = value
        return a
    return hook


def run_hooked(model, x, hooks, api: str):
    """The same forward hooks through each of TransformerLens's hook APIs."""
    if api == "run_with_hooks":
        return model.run_with_hooks(x, fwd_hooks=hooks)
    if api == "hooks":
        with model.hooks(fwd_hooks=hooks):
            return model(x)
    for name, fn in hooks:
        model.add_hook(name, fn)
    try:
        return model(x)
    finally:
        model.reset_hooks()
