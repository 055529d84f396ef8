"""The memory plan against an exact count: the bytes CPU tensors hold at the peak of a forward pass, as the allocator
counts them (``TensorPeak``), which is deterministic where the resident set is not."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from torch import nn

from probe.checkpoint import checkpoint_from_model, save_checkpoint
from probe.memory import PROBE_FAMILIES, SSM_CHUNK, ForwardCost, TensorPeak, estimate_note, forward_cost
from probe.models import HookedSequenceModel, ModelConfig
from probe.tasks import make_task

MARGIN = (0.9, 1.2)
"""plan / counted bytes: the plan counts what the forward pass holds at its peak, a little over (the SSM's scan at
short lengths) and never under by more than the allocator's rounding. The plan before this count existed (every
sublayer's activations at once, three T x T tensors) read 1.7-2.1 here; counting the scores once reads below 0.9."""


def counted(model: nn.Module, tokens: torch.Tensor) -> int:
    """``TensorPeak`` of one forward pass and its argmax, as evaluate runs them (after a warm-up)."""
    with torch.no_grad():
        model(tokens[:1])
        with TensorPeak() as peak:
            model(tokens).argmax(-1)
    return peak.bytes


@pytest.mark.parametrize("kw", [dict(family="hybrid"), dict(family="hybrid", rnn="gru"),
                                dict(family="transformer", pos_encoding="rope", attn_scale="ssmax"),
                                dict(family="lstm"), dict(family="lstm", rnn="gru", d_mlp=8),
                                dict(family="lstm", rnn="ssm", d_mlp=8),
                                dict(family="lstm", rnn="ssm", ssm_range="complex", d_mlp=8)])
# the per-position terms lead (20: the SSM's scan pads it to 24); the scores lead
@pytest.mark.parametrize("positions, batch", [(20, 64), (160, 8)])
def test_the_plan_counts_the_tensors_a_forward_pass_holds_at_its_peak(kw, positions, batch):
    torch.manual_seed(0)
    cfg = ModelConfig(**{"vocab_size": 43, "d_model": 16, "n_layers": 2, "n_heads": 2, **kw})
    model = HookedSequenceModel(cfg).eval()
    exact = counted(model, torch.randint(0, 43, (batch, positions)))
    plan = batch * forward_cost(cfg, positions).total
    assert MARGIN[0] <= plan / exact <= MARGIN[1], (plan, exact)


def test_the_margin_refuses_a_plan_that_counts_the_scores_once_or_every_sublayer_at_once():
    """The control of the test above: two wrong plans it must catch, on the hybrid where attention leads."""
    torch.manual_seed(0)
    cfg = ModelConfig(family="hybrid", vocab_size=43, d_model=16, n_layers=2, n_heads=2)
    exact = counted(HookedSequenceModel(cfg).eval(), torch.randint(0, 43, (8, 160)))
    cost = forward_cost(cfg, 160)
    assert cost.attention > cost.tokens  # the scores lead here, so counting them once shows
    once = dataclasses.replace(cost, attention=cost.attention // 2)
    d = cfg.d_model
    summed = ForwardCost(3 * cfg.n_heads * 160**2 * 4, 160 * (12 * d + 2 * cfg.mlp_dim + 2 * cfg.vocab_size) * 4)
    for wrong in (once, summed):
        assert not MARGIN[0] <= 8 * wrong.total / exact <= MARGIN[1]


class Hybrid(nn.Module):
    """A plain-PyTorch hybrid: embedding, LSTM, causal nn.MultiheadAttention (2 heads: its eval path writes out
    the T x T scores), unembedding."""

    def __init__(self, vocab: int, d: int = 16) -> None:
        super().__init__()
        self.embed, self.lstm = nn.Embedding(vocab, d), nn.LSTM(d, d, batch_first=True)
        self.attn, self.unembed = nn.MultiheadAttention(d, 2, batch_first=True), nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        x = x + self.lstm(x)[0]
        mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).triu(1)
        return self.unembed(x + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0])


def test_a_wrapped_hybrids_plan_is_read_from_its_widths_and_heads():
    import probe

    torch.manual_seed(0)
    task = make_task("interleaved", train_length=4)
    wrapped = probe.wrap(Hybrid(task.vocab_size).eval(), attention=["attn"], recurrent=["lstm"], task=task)
    exact = counted(wrapped, torch.randint(0, task.vocab_size, (8, 160)))
    assert MARGIN[0] <= 8 * forward_cost(wrapped.cfg, 160).total / exact <= MARGIN[1]


def test_the_planners_copies_of_the_models_constants_agree():
    from probe.models.config import FAMILIES
    from probe.models.ssm import CHUNK

    assert PROBE_FAMILIES == FAMILIES and SSM_CHUNK == CHUNK


def test_the_default_run_plans_the_windows_length_and_says_the_plan_is_an_estimate(tmp_path, capsys):
    """The default evaluation's costliest pass is the windows' at 16 x L_train; a plan over the curve's lengths alone
    (4 x L_train) is the one the issue measured at a fifth of the peak."""
    from probe.evaluate import main

    task = make_task("interleaved", train_length=4)
    torch.manual_seed(0)
    model = HookedSequenceModel(ModelConfig(family="hybrid", vocab_size=task.vocab_size, d_model=16, n_layers=2,
                                            n_heads=2)).eval()
    path = save_checkpoint(tmp_path / "a.pt", checkpoint_from_model(model, task, train_config={"seed": 0}))
    assert main([str(path), "--samples", "4", "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)["memory"]
    assert mem["planned_length"] == 16 * task.train_length and mem["planned_batch"] == 4
    assert mem["planned_bytes"] == 4 * forward_cost(model.cfg, task.prefix_len + 16 * task.train_length).total
    assert mem["planned_note"] == estimate_note(model.cfg)
    assert main([str(path), "--samples", "4"]) == 0
    assert f"; {estimate_note(model.cfg)}), measured" in capsys.readouterr().out


def test_the_plan_says_it_is_an_estimate_and_how_far_off_the_benchmark_found_it():
    """In the refusal too; a wrapped model's says that probe cannot see inside it and quotes the wrapped rows."""
    import probe
    from probe.errors import ProbeError
    from probe.memory import PLAN_RATIOS, fit_batch_size

    ours = ModelConfig(family="hybrid", vocab_size=43, d_model=16, n_layers=2, n_heads=2)
    lo, hi = PLAN_RATIOS["probe"]
    assert estimate_note(ours) == f"an estimate: {lo:.2f}-{hi:.2f}x the measured peak on benchmarks/evaluate_memory.py"
    with pytest.raises(ProbeError, match=rf"\(2 heads x 100000\^2 attention scores; an estimate: {lo:.2f}-{hi:.2f}x"):
        fit_batch_size(ours, 100_000, 1, available=2**30)
    task = make_task("interleaved", train_length=4)
    wrapped = probe.wrap(Hybrid(task.vocab_size).eval(), attention=["attn"], recurrent=["lstm"], task=task)
    lo, hi = PLAN_RATIOS["wrapped"]
    assert "cannot see inside it" in estimate_note(wrapped.cfg) and f"{lo:.2f}-{hi:.2f}x" in estimate_note(wrapped.cfg)
    with pytest.raises(ProbeError, match=rf"cannot see inside it: {lo:.2f}-{hi:.2f}x the measured peak"):
        fit_batch_size(wrapped.cfg, 100_000, 1, available=2**30)
    assert "not benchmarked" in estimate_note(ours, grad=True)


def test_the_sweeps_guide_quotes_the_ranges_the_plan_holds():
    """docs/guides/sweeps.md prints the benchmark's table and says which ranges ``PLAN_RATIOS`` took from it; a
    range changed in one place and not the other (a new benchmark row) fails here."""
    from pathlib import Path

    from probe.memory import PLAN_RATIOS

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "sweeps.md").read_text()
    said = re.search(r"`PLAN_RATIOS` holds ([\d.]+)-([\d.]+) for probe's models and ([\d.]+)-([\d.]+) for the "
                     r"wrapped ones", " ".join(guide.split()))
    assert said, "docs/guides/sweeps.md no longer says which ranges PLAN_RATIOS holds"
    quoted = [float(x) for x in said.groups()]
    assert quoted == [*PLAN_RATIOS["probe"], *PLAN_RATIOS["wrapped"]]
