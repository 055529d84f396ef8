"""The recurrent slot's cells (GRU, SSM): config, fast vs step-by-step agreement, causal edits, override_state."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from probe.errors import ProbeError
from probe.models import HookedGRU, HookedLSTM, HookedSequenceModel, HookedSSM, ModelConfig
from probe.models.ssm import MIN_LOG_MAGNITUDE, chunked_scan, linear_scan

from conftest import assert_fused_matches_unrolled, run_hooked, set_at, tiny_model

B, T, D = 3, 9, 16
CELLS = [{"rnn": "gru"}, {"rnn": "ssm", "ssm_range": "positive"}, {"rnn": "ssm", "ssm_range": "negative"},
         {"rnn": "ssm", "ssm_range": "complex"}]
CELL_IDS = ["gru", "ssm-positive", "ssm-negative", "ssm-complex"]


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 43, (B, T), generator=torch.Generator().manual_seed(seed))


def _carried(model, block: int = 0) -> str:
    """The hook point of the state the recurrence carries: h for the GRU, s for the SSM."""
    return "h" if model.cfg.rnn == "gru" else "state"


# --- the config ---------------------------------------------------------------------------------------------------
def test_the_cell_is_a_config_field_and_old_configs_load_as_lstm():
    old = ModelConfig(family="hybrid", d_model=16, n_heads=2).to_dict()
    for key in ("rnn", "ssm_state", "ssm_range"):
        old.pop(key)
    cfg = ModelConfig.from_dict(old)
    assert cfg.rnn == "lstm" and cfg.ssm_state is None
    assert ModelConfig(rnn="ssm", d_model=16, n_heads=2).ssm_state == 16
    for family in ("lstm", "hybrid"):
        for kw, cls in [({}, HookedLSTM), ({"rnn": "gru"}, HookedGRU), ({"rnn": "ssm"}, HookedSSM)]:
            assert all(type(layer) is cls for layer in tiny_model(family, **kw).lstm_layers)
    with pytest.raises(ProbeError, match="rnn='mamba'.*lstm, gru, ssm"):
        ModelConfig(rnn="mamba")
    with pytest.raises(ProbeError, match="ssm_range 'real'"):
        ModelConfig(rnn="ssm", ssm_range="real")
    with pytest.raises(ProbeError, match="even"):
        ModelConfig(rnn="ssm", ssm_range="complex", ssm_state=15)
    for kw in ({"rnn": "gru"}, {"rnn": "ssm", "ssm_range": "complex", "ssm_state": 6}):
        model = tiny_model("hybrid", **kw)
        saved = ModelConfig.from_dict(model.cfg.to_dict())
        assert saved == model.cfg
        again = HookedSequenceModel(saved)
        again.load_state_dict(model.state_dict())  # strict: the same parameters under the same names
        torch.testing.assert_close(again.eval()(tokens()), model(tokens()), rtol=0, atol=0)


def test_shipped_checkpoints_load_as_lstm_with_unchanged_hook_names():
    from pathlib import Path

    from probe.checkpoint import load_checkpoint

    paths = sorted(Path(__file__).parents[1].glob("checkpoints/*.pt"))
    assert paths
    for path in paths:
        ckpt = load_checkpoint(path)
        model = ckpt.build_model()  # strict load_state_dict
        assert model.cfg.rnn == "lstm"
        if model.cfg.has_lstm:
            assert all(type(layer) is HookedLSTM for layer in model.lstm_layers)
            assert {f"blocks.0.lstm.hook_{p}" for p in "ifgoch"} | {"blocks.0.hook_lstm_out"} <= set(model.hook_dict)
            assert "blocks.0.lstm.rnn.weight_hh_l0" in model.state_dict()


# --- fused vs step by step, through the model ----------------------------------------------------------------------
@pytest.mark.parametrize("kw", CELLS, ids=CELL_IDS)
def test_unrolled_cell_matches_fused_on_every_hook(kw):
    model = tiny_model("hybrid", **kw)
    x = tokens(1)
    recurrent = lambda n: ".lstm.hook_" in n  # noqa: E731
    fused_logits, fused = model.run_with_cache(x, names_filter=recurrent)
    for layer in model.lstm_layers:
        layer.force_unrolled = True
    unrolled_logits, unrolled = model.run_with_cache(x, names_filter=recurrent)
    for layer in model.lstm_layers:
        layer.force_unrolled = False
    assert set(fused) == set(unrolled) and len(fused) == 2 * len(model.lstm_layers[0].points)
    for name in fused:
        torch.testing.assert_close(unrolled[name], fused[name], rtol=0, atol=1e-5)
    torch.testing.assert_close(unrolled_logits, fused_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(model(x), fused_logits, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kw", CELLS, ids=CELL_IDS)
def test_caching_every_hook_of_a_cell_runs_its_fused_kernel(kw, monkeypatch):
    model = tiny_model("hybrid", **kw)
    cls = type(model.lstm_layers[0])
    step = cls.step

    def no_loop(self, xi_t, state, put, gates=None):
        assert gates is not None, "a forward whose hooks only read must not unroll the cell"
        return step(self, xi_t, state, put, gates)

    base = model(tokens())
    monkeypatch.setattr(cls, "step", no_loop)
    logits, cache = model.run_with_cache(tokens())
    torch.testing.assert_close(logits, base, rtol=0, atol=1e-6)
    assert all(f"blocks.1.lstm.hook_{p}" in cache for p in model.lstm_layers[1].points)


def test_gru_is_pytorchs_gru_equations():
    model = tiny_model("lstm", rnn="gru", n_layers=1)
    x = tokens(2)
    _, cache = model.run_with_cache(x)
    r = model.blocks[0].lstm.rnn
    inp = model.blocks[0].ln_lstm(model.embed(x))
    h, hs, ns = torch.zeros(B, D), [], []
    for t in range(T):
        gi, gh = F.linear(inp[:, t], r.weight_ih_l0, r.bias_ih_l0), F.linear(h, r.weight_hh_l0, r.bias_hh_l0)
        (ir, iz, in_), (hr, hz, hn) = gi.chunk(3, -1), gh.chunk(3, -1)
        rr, zz = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + rr * hn)
        h = (1 - zz) * n + zz * h
        hs.append(h)
        ns.append(n)
    torch.testing.assert_close(cache["blocks.0.lstm.hook_h"], torch.stack(hs, 1), rtol=0, atol=1e-5)
    torch.testing.assert_close(cache["blocks.0.lstm.hook_n"], torch.stack(ns, 1), rtol=0, atol=1e-5)


# --- the SSM's chunked scan against its step-by-step reference ------------------------------------------------------
def _ssm(kind: str, regime: str, d: int = 8, state: int = 8, seed: int = 0) -> HookedSSM:
    """An SSM cell whose transitions cover their range: ``spread`` from clamped resets (|a| = e^-8) to ~1 and, for
    negative, flips; ``slow`` all near 1, where a state keeps every input of 400 steps (the most rounding)."""
    torch.manual_seed(seed)
    cell = HookedSSM(d, state, kind)
    with torch.no_grad():
        if regime == "spread":
            cell.in_proj.weight.mul_(4)
            cell.in_proj.bias.normal_()
            cell.A_log.uniform_(-1.0, 3.0)
        else:
            cell.A_log.fill_(-3.0)
        if kind == "complex":
            cell.in_proj.weight[cell.k : 2 * cell.k].mul_(3)  # phases of order pi
    return cell


LENGTHS = [1, 2, 7, 25, 64, 100, 400]


@pytest.mark.parametrize("regime", ["spread", "slow"])
@pytest.mark.parametrize("kind", ["positive", "negative", "complex"])
def test_ssm_chunked_scan_agrees_with_the_step_by_step_reference(kind, regime):
    """Forward and gradients, at lengths 1..400. Tolerance: float32 rounds to 2^-24 ~ 6e-8; a transition product in
    the scan is exp of a cumulative sum of log-magnitudes that reaches 64 in a chunk, so it carries a relative error
    up to ~64 * 2^-24 ~ 4e-6, and the reference rounds once per step (~T * 2^-24 ~ 2.4e-5 after 400 steps). Both
    are relative to the scale of the state, so the check is 1e-4 of the largest value (a few times both bounds;
    a wrong transition or chunk boundary is off by O(1)), or of 1e-2 for a gradient that is zero in exact arithmetic
    (A's at T = 1, where the state has no past)."""
    cell = _ssm(kind, regime)
    for t_len in LENGTHS:
        x = torch.randn(2, t_len, 8, generator=torch.Generator().manual_seed(t_len))
        xi = cell.input_share(x)
        a = cell.gate_values(xi)[0]
        if regime == "spread" and t_len >= 100:
            if kind == "negative":  # flips near -1, near +1, and magnitudes near 0
                assert (a < -0.99).any() and (a > 0.9).any() and (a.abs() < 0.05).any()
            else:  # clamped resets and slow decays
                assert (a.abs() <= 1.01 * math.exp(MIN_LOG_MAGNITUDE)).any() and (a.abs() > 0.9).any()
        if regime == "slow":
            assert a.abs().min() > 0.8
        w = torch.randn(2, t_len, 8, generator=torch.Generator().manual_seed(1000 + t_len))
        assert_fused_matches_unrolled(cell, x, w, f"{kind} {regime} T={t_len}")


def test_chunked_scan_keeps_a_state_through_padding_and_long_decays():
    # a = 1 everywhere: the state is the running sum; a = e^-8 then 1: the first input all but vanishes
    u = torch.ones(1, 19, 1)
    s, last = chunked_scan(torch.zeros(1, 19, 1), u, torch.zeros(1, 1))
    torch.testing.assert_close(s[0, :, 0], torch.arange(1.0, 20.0))
    torch.testing.assert_close(last, s[:, -1])
    log_mag = torch.zeros(1, 400, 1)
    log_mag[:, 1] = MIN_LOG_MAGNITUDE
    flip = torch.zeros(1, 400, 1, dtype=torch.bool)
    flip[:, 3::2] = True  # the sign alternates from position 3 on
    u = torch.zeros(1, 400, 1)
    u[:, 0] = 1.0
    s, _ = chunked_scan(log_mag, u, torch.zeros(1, 1), flip=flip)
    expected = math.exp(MIN_LOG_MAGNITUDE) * torch.tensor([(-1.0) ** max(0, (t - 1) // 2) for t in range(400)])
    expected[0] = 1.0
    torch.testing.assert_close(s[0, :, 0], expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_linear_scans_backward_is_the_adjoint_scan(dtype):
    """``linear_scan``'s hand-written backward (the adjoint run backwards in time) against finite differences, for
    signed real and complex transitions, a start state, and lengths within one chunk and across three."""
    g = torch.Generator().manual_seed(0)
    for t_len in (1, 7, 19):
        a = (2 * torch.rand(2, t_len, 3, generator=g, dtype=torch.float64) - 1) * 0.95
        if dtype.is_complex:
            a = torch.polar(a.abs(), 4 * torch.rand(2, t_len, 3, generator=g, dtype=torch.float64))
        u = torch.randn(2, t_len, 3, generator=g, dtype=dtype)
        s0 = torch.randn(2, 3, generator=g, dtype=dtype)
        inputs = tuple(v.clone().requires_grad_() for v in (a, u, s0))
        assert torch.autograd.gradcheck(lambda *v: linear_scan(*v), inputs)


START = 10
"""The counter's start token (input 10); inputs 0..9 are the digits."""


def _rotation_counter(modulus: float = 1.0, phase_step: float = 2 * math.pi / 10) -> HookedSSM:
    """A complex SSM with one channel whose parameters are set by hand, fed one-hot inputs (digits 0..9, START): on
    digit d its transition is modulus * exp(i d phase_step) and it writes nothing; on START it writes the unit vector
    1 + 0i; out_proj reads the state out as (Re s, Im s). With modulus 1 and phase_step 2 pi / 10 it is the theory's
    Z_10 counter, reached through the module's own parametrisation (a step size softplus(-30) ~ 1e-13 gives |a| = 1
    to float precision)."""
    layer = HookedSSM(d_model=START + 2, state=2, kind="complex")
    with torch.no_grad():
        for p in layer.parameters():
            p.zero_()  # A_log = 0: the step size alone sets log|a| = -softplus(row 0)
        step = -30.0 if modulus == 1.0 else math.log(math.expm1(-math.log(modulus)))
        layer.in_proj.bias[0] = step  # rows: step size, phase, input gate, value (Re, Im)
        layer.in_proj.weight[1, :START] = phase_step * torch.arange(START)
        layer.in_proj.bias[2] = 30.0  # input gate 1
        layer.in_proj.weight[3, START] = 1.0  # the value: 1 + 0i on START, 0 on every digit
        layer.out_proj.weight[0, 0] = layer.out_proj.weight[1, 1] = 1.0
    return layer


def _counts_mod_10(layer: HookedSSM, digits: torch.Tensor) -> bool:
    """Feed START then ``digits`` through the module's forward from its zero state; the check passes when at every
    position the state lies within sin(pi / 10) (half the distance between neighbouring 10th roots of unity) of
    exp(2 pi i s_t / 10), s_t the running sum mod 10: a nearest-root readout decodes the sum at every length."""
    seq = torch.cat([torch.full((digits.shape[0], 1), START), digits], dim=1)
    out = layer(F.one_hot(seq, START + 2).float())[:, 1:]
    state = torch.complex(out[..., 0], out[..., 1])
    target = torch.polar(torch.ones(()), 2 * math.pi * (digits.cumsum(1) % 10).float() / 10)
    return bool(((state - target).abs() < math.sin(math.pi / 10)).all())


@pytest.mark.parametrize("unrolled", [False, True], ids=["fused", "step-by-step"])
def test_a_complex_ssm_set_to_rotate_by_2pi_over_10_counts_mod_10_to_length_400(unrolled):
    """Through the module (its gates, transition and scan, or its step-by-step path) from the zero state: the
    hand-set channel tracks the running sum mod 10 over 400 digits."""
    digits = torch.randint(0, 10, (8, 400), generator=torch.Generator().manual_seed(0))
    layer = _rotation_counter()
    layer.force_unrolled = unrolled
    assert _counts_mod_10(layer, digits)


@pytest.mark.parametrize("modulus, phase_step, short", [
    (0.99, 2 * math.pi / 10, True), (0.999, 2 * math.pi / 10, True), (1.0, 1.002 * 2 * math.pi / 10, True),
    (1.0, 2 * math.pi / 9, False), (1.0, 0.0, False)],
    ids=["modulus-0.99", "modulus-0.999", "phase-0.2pc-off", "phase-2pi/9", "no-rotation"])
def test_the_same_check_fails_a_counter_that_fades_or_rotates_wrongly(modulus, phase_step, short):
    """What the theory needs, shown by its absence: a modulus below 1 fades the state (0.999^400 = 0.67, already
    too far from the unit circle at 16 x L_train) and a phase 0.2 % off drifts out of its sector, though both pass
    over the first 12 digits; a wrong group, or no rotation, fails at once."""
    digits = torch.randint(0, 10, (8, 400), generator=torch.Generator().manual_seed(0))
    assert _counts_mod_10(_rotation_counter(modulus, phase_step), digits[:, :12]) == short
    assert not _counts_mod_10(_rotation_counter(modulus, phase_step), digits)


# --- causal edits and override_state for every cell -----------------------------------------------------------------
@pytest.mark.parametrize("kw", CELLS, ids=CELL_IDS)
@pytest.mark.parametrize("api", ["run_with_hooks", "hooks", "add_hook"])
def test_editing_the_carried_state_at_t_is_override_state_at_t(kw, api):
    model = tiny_model("hybrid", **kw)
    layer, x, t = model.blocks[1].lstm, tokens(), 4
    p = _carried(model)
    _, cache = model.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.1.lstm."))
    new = 3 * torch.randn(cache[f"blocks.1.lstm.hook_{p}"][:, t].shape, generator=torch.Generator().manual_seed(1))
    out = run_hooked(model, x, [(f"blocks.1.lstm.hook_{p}", set_at(t, new))], api)
    if p == "h":
        override = (new,)
    else:  # the SSM's output at t is read from the edited state
        override = (layer.out_proj(new), new)
    with layer.override_state(t, *override):
        expected = model(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    base = model(x)
    torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=1e-6)
    assert (out[:, t:] - base[:, t:]).abs().amax(dim=(0, 2)).min() > 1e-4, "position t and every later one move"
    assert all(not hp.has_hooks() for hp in model.hook_dict.values())


@pytest.mark.parametrize("kw", CELLS, ids=CELL_IDS)
def test_override_state_fused_unrolled_and_several_positions(kw):
    model = tiny_model("lstm", **kw)
    layer, x = model.blocks[0].lstm, tokens()
    shapes = [init.shape[1:] for init in layer.initial_state(1, torch.zeros(1))]
    g = torch.Generator().manual_seed(3)
    states = [torch.randn(B, 2, *s, generator=g) for s in shapes]
    with layer.override_state([6, 2], *states):
        fused = model(x)
        layer.force_unrolled = True
        unrolled = model(x)
        layer.force_unrolled = False
    torch.testing.assert_close(unrolled, fused, rtol=0, atol=1e-5)
    with layer.override_state(2, *[s[:, 1] for s in states]), layer.override_state(6, *[s[:, 0] for s in states]):
        torch.testing.assert_close(model(x), fused, rtol=0, atol=1e-6)
    base = model(x)
    torch.testing.assert_close(fused[:, :2], base[:, :2], rtol=0, atol=1e-6)
    assert not torch.allclose(fused[:, 2:], base[:, 2:])
    assert layer.overridden_positions == ()
    with pytest.raises(ProbeError, match=f"{layer.STATES[0]} must have shape"):
        with layer.override_state(3, *[torch.zeros(B, 5) for _ in shapes]):
            pass
    with pytest.raises(ProbeError, match="outside 0..8"):
        with layer.override_state(T, *[s[:, 0] for s in states]):
            model(x)


def _ssm_oracle(layer: HookedSSM, x: torch.Tensor, steer=None) -> torch.Tensor:
    """The SSM's equations in torch's complex numbers, one step at a time, with ``steer`` applied to the state after
    every step: an implementation independent of ``advance`` and of the scan."""
    parts = layer.in_proj(x).split(layer.sizes, dim=-1)
    r = torch.exp((-F.softplus(parts[0]) * layer.A_log.exp()).clamp(min=MIN_LOG_MAGNITUDE))
    b, v = torch.sigmoid(parts[-2]), parts[-1]
    if layer.kind == "complex":
        a = r * torch.exp(1j * parts[1])
        v = torch.view_as_complex(v.unflatten(-1, (layer.k, 2)).contiguous())
    elif layer.kind == "negative":
        a = 2 * r - 1
        a = torch.where(a.abs() < math.exp(MIN_LOG_MAGNITUDE), math.exp(MIN_LOG_MAGNITUDE), a)
    else:
        a = r
    s = torch.zeros_like(v[:, 0])
    hs = []
    for t in range(x.shape[1]):
        s = a[:, t] * s + b[:, t] * v[:, t]
        real = torch.view_as_real(s).flatten(-2) if s.is_complex() else s
        if steer is not None:
            real = steer(real)
            s = torch.view_as_complex(real.unflatten(-1, (layer.k, 2)).contiguous()) if s.is_complex() else real
        hs.append(layer.out_proj(real))
    return torch.stack(hs, 1)


@pytest.mark.parametrize("kw", CELLS, ids=CELL_IDS)
def test_an_edit_that_depends_on_its_input_at_every_step_matches_a_step_by_step_loop(kw):
    model = tiny_model("lstm", n_layers=1, **kw)
    layer, x = model.blocks[0].lstm, tokens()
    p = _carried(model)
    width = layer.initial_state(1, torch.zeros(1))[-1].shape[-1]
    vec = torch.randn(width, generator=torch.Generator().manual_seed(4))
    calls = []

    def steer(a, hook=None):
        calls.append(1)
        return 0.5 * a + vec

    with model.hooks(fwd_hooks=[(f"blocks.0.lstm.hook_{p}", steer)]):
        out, cache = model.run_with_cache(x, names_filter="blocks.0.hook_lstm_out")
    inp = model.blocks[0].ln_lstm(model.embed(x))
    if p == "h":  # the GRU: PyTorch's cell, steered after every step
        cell = torch.nn.GRUCell(D, D)
        cell.load_state_dict({k.removesuffix("_l0"): v for k, v in layer.rnn.state_dict().items()})
        h, hs = torch.zeros(B, D), []
        for t in range(T):
            h = 0.5 * cell(inp[:, t], h) + vec
            hs.append(h)
        expected = torch.stack(hs, 1)
    else:
        expected = _ssm_oracle(layer, inp, lambda s: 0.5 * s + vec)
        torch.testing.assert_close(_ssm_oracle(layer, inp), layer(inp), rtol=0, atol=1e-5)
    torch.testing.assert_close(cache["blocks.0.hook_lstm_out"], expected, rtol=0, atol=1e-5)
    assert len(calls) <= T + 2
    assert (out - model(x)).abs().max() > 1e-3


def test_editing_a_gate_at_t_moves_the_step_it_feeds():
    # GRU: the candidate is computed from the edited reset gate; SSM: a zero transition forgets the past
    model = tiny_model("lstm", rnn="gru")
    x, t = tokens(), 5
    _, cache = model.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.0.lstm."))
    layer = model.blocks[0].lstm
    inp = model.blocks[0].ln_lstm(model.embed(x))
    with model.hooks(fwd_hooks=[("blocks.0.lstm.hook_r", set_at(t, torch.zeros(B, D)))]):
        _, edited = model.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.0.lstm."))
    d = D
    n_t = torch.tanh(F.linear(inp[:, t], layer.rnn.weight_ih_l0[2 * d :], layer.rnn.bias_ih_l0[2 * d :]))
    torch.testing.assert_close(edited["blocks.0.lstm.hook_n"][:, t], n_t, rtol=0, atol=1e-6)
    z = cache["blocks.0.lstm.hook_z"][:, t]
    torch.testing.assert_close(edited["blocks.0.lstm.hook_h"][:, t],
                               (1 - z) * n_t + z * cache["blocks.0.lstm.hook_h"][:, t - 1], rtol=0, atol=1e-6)
    torch.testing.assert_close(edited["blocks.0.lstm.hook_h"][:, :t], cache["blocks.0.lstm.hook_h"][:, :t])

    for kind in ("positive", "negative", "complex"):
        model = tiny_model("lstm", rnn="ssm", ssm_range=kind)
        layer = model.blocks[0].lstm
        _, cache = model.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.0.lstm."))
        out = model.run_with_hooks(x, fwd_hooks=[("blocks.0.lstm.hook_a", set_at(t, torch.zeros(B, layer.k)))])
        b_t = cache["blocks.0.lstm.hook_b"][:, t].repeat_interleave(2 if kind == "complex" else 1, dim=-1)
        s_t = b_t * layer.input_share(model.blocks[0].ln_lstm(model.embed(x)))[:, t, -layer.n_state :]
        with layer.override_state(t, layer.out_proj(s_t), s_t):
            torch.testing.assert_close(out, model(x), rtol=0, atol=1e-5)
        assert (out[:, t:] - model(x)[:, t:]).abs().max() > 1e-4


@pytest.mark.parametrize("kind", ["positive", "complex"])
def test_editing_the_ssms_output_moves_that_output_alone(kind):
    # the recurrence carries s, not h: an edit of h at t is not fed back
    model = tiny_model("lstm", rnn="ssm", ssm_range=kind, n_layers=1)
    x, t = tokens(), 4
    new = torch.randn(B, D, generator=torch.Generator().manual_seed(7))
    with model.hooks(fwd_hooks=[("blocks.0.lstm.hook_h", set_at(t, new))]):
        _, edited = model.run_with_cache(x, names_filter=lambda n: n.endswith(("hook_lstm_out", "hook_state")))
    _, base = model.run_with_cache(x, names_filter=lambda n: n.endswith(("hook_lstm_out", "hook_state")))
    expected = base["blocks.0.hook_lstm_out"].clone()
    expected[:, t] = new
    torch.testing.assert_close(edited["blocks.0.hook_lstm_out"], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(edited["blocks.0.lstm.hook_state"], base["blocks.0.lstm.hook_state"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("kw", CELLS, ids=CELL_IDS)
def test_gradients_under_a_state_patch_equal_those_of_override_state(kw):
    model = tiny_model("hybrid", **kw)
    layer, x, y, t = model.blocks[0].lstm, tokens(), tokens(5), 4
    g = torch.Generator().manual_seed(6)
    states = [torch.randn(B, *s.shape[1:], generator=g) for s in layer.initial_state(1, torch.zeros(1))]

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}

    hooks = [(f"blocks.0.lstm.hook_{p}", set_at(t, s)) for p, s in zip(layer.STATES, states, strict=True)]
    hooked = grads(model.run_with_hooks(x, labels=y, fwd_hooks=hooks))
    with layer.override_state(t, *states):
        expected = grads(model(x, labels=y))
    assert hooked.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(hooked[name], expected[name], rtol=1e-4, atol=1e-6)


# --- precision ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["positive", "negative", "complex"])
def test_ssm_runs_in_float32_under_bf16_autocast_with_gradients(kind):
    model = tiny_model("hybrid", rnn="ssm", ssm_range=kind)
    layer, x, y = model.blocks[0].lstm, tokens(), tokens(5)
    inp = model.blocks[0].ln_lstm(model.embed(x))
    reference = layer(inp)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(inp.bfloat16())
        loss = model(x, labels=y)
        edited = model.run_with_hooks(x, fwd_hooks=[("blocks.0.lstm.hook_state",
                                                     set_at(4, torch.zeros(B, layer.n_state)))])
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference, rtol=0, atol=2e-2)  # the input was rounded to bf16
    assert (edited.float() - model(x).float()).abs().max() > 1e-3
    loss.backward()
    assert layer.A_log.grad is not None and layer.A_log.grad.dtype == torch.float32
    assert torch.isfinite(layer.in_proj.weight.grad).all() and layer.in_proj.weight.grad.abs().sum() > 0


def test_backward_hooks_on_an_ssm_state_warn_and_on_its_output_fire():
    model = tiny_model("lstm", rnn="ssm", ssm_range="complex")
    with pytest.warns(UserWarning, match=r"blocks\.0\.lstm\.hook_state never fires"):
        model.add_hook("blocks.0.lstm.hook_state", lambda g, hook: None, dir="bwd")
    model.reset_hooks()
    fired = []
    with model.hooks(bwd_hooks=[("blocks.0.lstm.hook_h", lambda g, hook: fired.append(hook.name))]):
        model(tokens()).sum().backward()
    assert fired == ["blocks.0.lstm.hook_h"]
