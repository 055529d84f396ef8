"""The study's tests: its documents rendered from its results, its scripts. Run apart from the library's tests
(`python -m pytest study/tests`); the study's scripts are importable here, and nowhere in the library's tests."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import torch
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("MPLCONFIGDIR", tempfile.mkdtemp(prefix="mpl-"))
os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="ipy-"))
torch.set_num_threads(1)
settings.register_profile("probe-study", database=None, derandomize=True)
settings.load_profile("probe-study")
set_hypothesis_home_dir(tempfile.mkdtemp(prefix="hypothesis-"))

from probe.models import HookedSequenceModel, ModelConfig  # noqa: E402

STUDY_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def tiny_model(family: str = "hybrid", vocab_size: int = 43, seed: int = 0, **kw) -> HookedSequenceModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(family=family, vocab_size=vocab_size, **{"d_model": 16, "n_layers": 2, "n_heads": 2, **kw})
    return HookedSequenceModel(cfg).eval()


def _import_scripts(*names: str) -> ModuleType | tuple[ModuleType, ...]:
    # the study's scripts are modules beside each other, not a package: they import one another by bare name
    # (``from doc_format import ...``), so their folder is on the path while they load, and only then
    sys.path.insert(0, str(STUDY_SCRIPTS))
    try:
        modules = tuple(importlib.import_module(name) for name in names)
    finally:
        sys.path.remove(str(STUDY_SCRIPTS))
    return modules[0] if len(modules) == 1 else modules


@pytest.fixture(scope="session")
def study_scripts():
    """``study_scripts("doc_blocks_fresh")``: that module of study/scripts/ (several names: a tuple of them)."""
    return _import_scripts
