"""Shared fixtures: tiny models and checkpoints that build in milliseconds, and a clean plotting environment. The
study's tests, which import its scripts, are apart: study/tests/conftest.py."""

from __future__ import annotations

import importlib.util
import os
import tempfile

import pytest
import torch
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("MPLCONFIGDIR", tempfile.mkdtemp(prefix="mpl-"))
os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="ipy-"))
torch.set_num_threads(1)

# No example database: hypothesis would otherwise write .hypothesis/ into the working tree; every property test is
# derandomized so that a failure reproduces from the test alone.
settings.register_profile("probe", database=None, derandomize=True)
settings.load_profile("probe")
# ... and without a database it still keeps other files (its unicode tables) under .hypothesis/ in the current
# folder: point its home at a temporary folder, so a test run writes nothing into the checkout
set_hypothesis_home_dir(tempfile.mkdtemp(prefix="hypothesis-"))

from probe.models import HookedSequenceModel, ModelConfig  # noqa: E402
from probe.tasks import make_task  # noqa: E402

needs_captum = pytest.mark.skipif(importlib.util.find_spec("captum") is None,
                                  reason="integrated gradients need captum: pip install -e '.[attributions]'")
"""Marks a test of integrated gradients, the [attributions] extra: an install without it skips the test."""


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


def assert_fused_matches_unrolled(cell, x: torch.Tensor, w: torch.Tensor, label: str, tol: float = 1e-4) -> None:
    """An SSM cell run fused (the scan, the state read back from its output) and unrolled step by step on the same
    input, each backpropagating ``(h * w).sum()``: its output, state, input gradient and every parameter's gradient
    agree within ``tol`` of the unrolled tensor's largest value (at least 1e-2, for a gradient that is zero in exact
    arithmetic). ``label`` heads each failure's message."""
    results = []
    for path in ("fused", "unrolled"):
        xg = x.clone().requires_grad_()
        cell.zero_grad()
        if path == "fused":
            out = cell.fused(xg)[0]
            xi = cell.input_share(xg)
            state = cell.read_out_states(xi, cell.gate_values(xi), out, {"state"})["state"]
        else:
            values = cell.unrolled(xg)
            out, state = values["h"], values["state"]
        (out * w).sum().backward()
        grads = [xg.grad] + [p.grad.clone() for p in cell.parameters()]
        results.append((out.detach(), state.detach(), grads))
    (out_f, s_f, g_f), (out_u, s_u, g_u) = results
    for fast, ref, what in [(out_f, out_u, "h"), (s_f, s_u, "state")] + [
            (gf, gu, f"grad {k}") for k, (gf, gu) in enumerate(zip(g_f, g_u, strict=True))]:
        scale = ref.abs().max().clamp(min=1e-2)
        err = float((fast - ref).abs().max() / scale)
        assert err < tol, f"{label} {what}: max error {err:.2e} of the scale {float(scale):.2e}"
