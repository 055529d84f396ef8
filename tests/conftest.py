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
