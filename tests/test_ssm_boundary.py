"""The SSM's closed ranges: transitions that reach |a| = 1 and a = -1 exactly, through the module from a zero state."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from probe.errors import ProbeError
from probe.models import SSM_RANGES, HookedSSM, ModelConfig
from probe.models.ssm import CLOSED_MARGIN, RANGES

from conftest import assert_fused_matches_unrolled

CLOSED = ["positive-closed", "negative-closed", "complex-closed"]
KEEP, MOVE, START = 0, 1, 2
"""One-hot inputs of the hand-set cells: the identity, the transition under test (a flip, a rotation), and the token
that writes the first input through the input gate."""


# --- the ranges as config values -----------------------------------------------------------------------------------
def test_the_closed_ranges_are_config_values_with_the_open_ranges_layout():
    assert SSM_RANGES == RANGES and set(CLOSED) < set(RANGES)
    for kind in CLOSED:
        cfg = ModelConfig(rnn="ssm", ssm_range=kind, d_model=16, n_heads=2)
        open_kind = kind.removesuffix("-closed")
        closed, opened = HookedSSM(16, 16, kind), HookedSSM(16, 16, open_kind)
        assert cfg.ssm_range == kind and closed.base == open_kind and closed.closed and not opened.closed
        # the same parameters and hook points, so a hook or an analysis reads a closed cell as it reads an open one
        assert {n: p.shape for n, p in closed.state_dict().items()} == {n: p.shape
                                                                         for n, p in opened.state_dict().items()}
        assert closed.GATES == opened.GATES and closed.sizes == opened.sizes
    with pytest.raises(ProbeError, match="even for ssm_range=complex-closed"):
        ModelConfig(rnn="ssm", ssm_range="complex-closed", ssm_state=15)
    for make in (lambda: ModelConfig(rnn="ssm", ssm_range="closed"), lambda: HookedSSM(4, 4, "closed")):
        with pytest.raises(ProbeError) as err:
            make()
        assert "\n" not in str(err.value) and all(r in str(err.value) for r in RANGES)


def test_a_closed_range_starts_at_the_open_ranges_transitions():
    """The initialisation: with the same seed (the same dt draw) and x's part of the step size at 0, each closed range's
    transitions are the open range's (exact in real arithmetic; float32 rounds the inverse softplus)."""
    x = torch.zeros(1, 1, 16)
    for kind in CLOSED:
        a = {}
        for k in (kind, kind.removesuffix("-closed")):
            torch.manual_seed(3)
            cell = HookedSSM(16, 16, k)
            with torch.no_grad():
                cell.in_proj.weight.zero_()
            a[k] = cell.transition(cell.gate_values(cell.input_share(x)))
        opened = a[kind.removesuffix("-closed")]
        assert opened.abs().min() < 0.8 and opened.abs().max() > 0.95  # the slow and the fast channels both
        torch.testing.assert_close(a[kind], opened, rtol=0, atol=1e-6)


# --- (4) saturation ------------------------------------------------------------------------------------------------
def _constant_step(kind: str, pre: float) -> HookedSSM:
    """A default cell (A = 1..16 over its channels) whose step-size pre-activation is ``pre`` at every input."""
    torch.manual_seed(0)
    cell = HookedSSM(8, 8, kind)
    with torch.no_grad():
        cell.in_proj.weight[: cell.k] = 0.0
        cell.in_proj.bias[: cell.k] = pre
    return cell


@pytest.mark.parametrize("kind", CLOSED)
def test_a_closed_range_saturates_exactly_at_a_finite_pre_activation_and_the_open_range_does_not(kind):
    """A step-size pre-activation of -7 (A up to 16: Δ A <= 0.015, below ln(1.05) for the cap at 1 and below the
    0.024 at which negative-closed's (1 + δ)(2 ρ - 1) reaches 1) gives |a| == 1.0 exactly on every channel and every
    position, through the module's step-by-step path (``hook_a``: a_t, or r_t for complex); +6 gives a == -1.0
    exactly for negative-closed. The open range at the same pre-activations stays off the boundary by a margin
    (r <= exp(-0.0009) at -7; at +6, a = 2 e^-8 - 1 = -0.99933 at most: the clamp at e^-8 stops it). Once
    saturated, no gradient reaches the step size."""
    x = torch.randn(2, 20, 8, generator=torch.Generator().manual_seed(0))
    cell, opened = _constant_step(kind, -7.0), _constant_step(kind.removesuffix("-closed"), -7.0)
    with torch.no_grad():
        assert bool((cell.unrolled(x)["a"] == 1.0).all())
        assert float(opened.unrolled(x)["a"].max()) < 0.9992
        if kind == "negative-closed":
            assert bool((_constant_step(kind, 6.0).unrolled(x)["a"] == -1.0).all())
            assert float(_constant_step("negative", 6.0).unrolled(x)["a"].min()) > -0.9995
    if kind == "negative-closed":
        cell = _constant_step(kind, 6.0)
    # saturated everywhere: the step-size rows and A_log get exactly no gradient, the value rows do
    cell.fused(x)[0].pow(2).sum().backward()
    assert float(cell.in_proj.weight.grad[: cell.k].abs().max()) == 0.0 and float(cell.A_log.grad.abs().max()) == 0.0
    assert float(cell.in_proj.weight.grad[-cell.n_state:].abs().max()) > 0.0


# --- (1) parity: a = -1 exactly ------------------------------------------------------------------------------------
def _flipper(kind: str) -> HookedSSM:
    """One real channel set by hand, on one-hot inputs (KEEP, MOVE, START): step-size pre-activation +30 on MOVE (a
    flip: a = -1 for negative-closed, 2 e^-8 - 1 for negative, the closest it comes) and -30 elsewhere (a = 1);
    START writes 1 through the input gate (b = sigmoid(30) = 1), the other tokens write 0; the output is the state."""
    layer = HookedSSM(d_model=3, state=1, kind=kind)
    with torch.no_grad():
        for p in layer.parameters():
            p.zero_()  # A_log = 0: A = 1
        layer.in_proj.bias[0] = -30.0  # rows: step size, input gate, value
        layer.in_proj.weight[0, MOVE] = 60.0
        layer.in_proj.bias[1] = 30.0
        layer.in_proj.weight[2, START] = 1.0
        layer.out_proj.weight[0, 0] = 1.0
    return layer


def _drive(layer: HookedSSM, moves: torch.Tensor, unrolled: bool) -> torch.Tensor:
    """START then ``moves`` (0/1: KEEP/MOVE) through the module's forward from its zero state; the outputs after
    START."""
    layer.force_unrolled = unrolled
    seq = torch.cat([torch.full((moves.shape[0], 1), START), moves], dim=1)
    with torch.no_grad():
        return layer(F.one_hot(seq, 3).float())[:, 1:]


@pytest.mark.parametrize("unrolled", [False, True], ids=["fused", "step-by-step"])
def test_negative_closed_keeps_parity_exactly_over_1200_steps_and_negative_fades(unrolled):
    """The state is exactly (-1)^(flips so far) at every one of 1200 positions (a sign read off it is the parity, and
    its magnitude never moves); the open range with the same weights flips too, but each flip multiplies the state
    by 1 - 2 e^-8: after n flips |s| = (1 - 2 e^-8)^n, below 0.8 after the ~600 flips here."""
    moves = torch.randint(0, 2, (4, 1200), generator=torch.Generator().manual_seed(0))
    parity = 1.0 - 2.0 * (moves.cumsum(1) % 2).float()
    state = _drive(_flipper("negative-closed"), moves, unrolled)[..., 0]
    assert torch.equal(state, parity)
    faded = _drive(_flipper("negative"), moves, unrolled)[..., 0]
    assert torch.equal(torch.sign(faded), parity)  # the sign is right ...
    n_flips = moves.sum(1).float()
    assert float(n_flips.min()) > 500
    assert float(faded[:, -1].abs().max()) < 0.8  # ... but the state is fading
    torch.testing.assert_close(faded[:, -1].abs(), (1 - 2 * math.exp(-8.0)) ** n_flips, rtol=1e-3, atol=0)


# --- (2) Z_10: |a| = 1 exactly with a rotation by 2 pi / 10 ----------------------------------------------------------
def _rotator(kind: str) -> HookedSSM:
    """One complex channel set by hand, on one-hot inputs: a step-size pre-activation of -5 on every token (A = 1:
    Δ = softplus(-5) = 0.0067 <= ln 1.05, so r = 1 exactly for complex-closed, and exp(-0.0067) = 0.9933 for
    complex); θ = 2 pi / 10 on MOVE and 0 elsewhere; START writes 1 + 0i through the input gate; the output is
    (Re s, Im s)."""
    layer = HookedSSM(d_model=3, state=2, kind=kind)
    with torch.no_grad():
        for p in layer.parameters():
            p.zero_()
        layer.in_proj.bias[0] = -5.0  # rows: step size, phase, input gate, value (Re, Im)
        layer.in_proj.weight[1, MOVE] = 2 * math.pi / 10
        layer.in_proj.bias[2] = 30.0
        layer.in_proj.weight[3, START] = 1.0
        layer.out_proj.weight[0, 0] = layer.out_proj.weight[1, 1] = 1.0
    return layer


@pytest.mark.parametrize("unrolled", [False, True], ids=["fused", "step-by-step"])
def test_complex_closed_counts_mod_10_from_the_angle_for_1000_ones_and_complex_fades(unrolled):
    """After n ones the state's angle is 2 pi n / 10 mod 2 pi: the nearest tenth of a turn decodes n mod 10 exactly
    at every position, n up to 1000 (row 0 is all ones), and the modulus stays 1 (float32's rounding of cos and sin
    moves it by ~1e-7 a step). The open range with the same weights rotates the same but fades as 0.9933^n: 1e-3
    after 1000 ones."""
    ones = (torch.rand(3, 1000, generator=torch.Generator().manual_seed(0)) < 0.7).long()
    ones[0] = 1
    count = ones.cumsum(1)
    out = _drive(_rotator("complex-closed"), ones, unrolled)
    state = torch.complex(out[..., 0], out[..., 1])
    decoded = torch.round(torch.angle(state) / (2 * math.pi / 10)).long() % 10
    assert int(count.max()) == 1000 and torch.equal(decoded, count % 10)
    assert float((state.abs() - 1).abs().max()) < 1e-3
    faded = _drive(_rotator("complex"), ones, unrolled)
    assert float(faded[0, -1].norm()) < 0.01


# --- (3) the fused scan against the step-by-step path ---------------------------------------------------------------
def _spread(kind: str) -> HookedSSM:
    """A closed cell whose transitions cover their range, saturated positions included: large and varied
    pre-activations (in_proj x 4, random biases, A from e^-1 to e^3), phases of order pi."""
    torch.manual_seed(0)
    cell = HookedSSM(8, 8, kind)
    with torch.no_grad():
        cell.in_proj.weight.mul_(4)
        cell.in_proj.bias.normal_()
        cell.A_log.uniform_(-1.0, 3.0)
        if cell.complex:
            cell.in_proj.weight[cell.k : 2 * cell.k].mul_(3)
    return cell


@pytest.mark.parametrize("kind", CLOSED)
def test_the_fused_scan_agrees_with_the_step_by_step_path_on_the_closed_ranges(kind):
    """Forward (output and state) and every gradient, at lengths within a chunk and across many, on inputs that put
    some positions on the boundary (|a| == 1, and a == -1 for negative-closed) and others inside it. Tolerance as in
    tests/test_cells.py's scan test (the same comparison, conftest's ``assert_fused_matches_unrolled``): 1e-4 of the
    largest value (float32 rounding is ~1e-5 after 300 steps; a wrong transition, sign or chunk boundary is off by
    O(1))."""
    cell = _spread(kind)
    for t_len in (1, 9, 64, 300):
        x = torch.randn(2, t_len, 8, generator=torch.Generator().manual_seed(t_len))
        a = cell.gate_values(cell.input_share(x))[0]
        if t_len >= 64:
            assert bool((a.abs() == 1.0).any()) and bool((a.abs() < 0.9).any())
            if kind == "negative-closed":
                assert bool((a == -1.0).any()) and bool((a == 1.0).any())
        w = torch.randn(2, t_len, 8, generator=torch.Generator().manual_seed(1000 + t_len))
        assert_fused_matches_unrolled(cell, x, w, f"{kind} T={t_len}")


def test_closed_margin_is_what_the_saturation_thresholds_are_computed_from():
    """The thresholds the docstrings quote: |a| = 1 from Δ A <= ln(1 + δ), a = -1 from Δ A >= -ln(δ / (2 (1 + δ))),
    checked on either side of each (a real cell, A = 1)."""
    cap, flip = math.log1p(CLOSED_MARGIN), -math.log(CLOSED_MARGIN / (2 * (1 + CLOSED_MARGIN)))
    for kind, delta_a, expected in (("positive-closed", 0.99 * cap, 1.0), ("negative-closed", 1.01 * flip, -1.0)):
        cell = HookedSSM(1, 1, kind)
        with torch.no_grad():
            cell.A_log.zero_()
            cell.in_proj.weight.zero_()
        for d, hits in ((delta_a, True), (delta_a * (1.02 if expected == 1.0 else 0.98), False)):
            with torch.no_grad():
                cell.in_proj.bias[0] = math.log(math.expm1(d))  # softplus(bias) = d
            with torch.no_grad():
                a = float(cell.gate_values(cell.input_share(torch.zeros(1, 1, 1)))[0])
            assert (a == expected) == hits, (kind, d, a)
