"""Hooked models: hook names and shapes, hook hygiene, fused vs unrolled LSTM, gates, causality, positions."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from probe.errors import ProbeError
from probe.models import HookedLSTM, HookedRecurrent, InnerHookPoint

from conftest import run_hooked, set_at, tiny_model

B, T = 3, 9


def expected_hooks(family: str, n_layers: int, pos: str) -> dict[str, tuple[int, ...]]:
    """Every hook point of a tiny model (d_model 16, 2 heads, d_mlp 64) and the shape it caches."""
    d, h, mlp = 16, 2, 64
    ln = lambda p: {p + "hook_scale": (B, T, 1), p + "hook_normalized": (B, T, d)}  # noqa: E731
    shapes: dict[str, tuple[int, ...]] = {"hook_embed": (B, T, d), "hook_logits": (B, T, 43), **ln("ln_final.")}
    if family == "transformer" and pos in ("learned", "sinusoidal"):
        shapes["hook_pos_embed"] = (B, T, d)
    for i in range(n_layers):
        p = f"blocks.{i}."
        shapes |= {p + "hook_resid_pre": (B, T, d), p + "hook_mlp_out": (B, T, d), p + "hook_resid_post": (B, T, d),
                   p + "hook_resid_mid": (B, T, d), p + "mlp.hook_pre": (B, T, mlp), p + "mlp.hook_post": (B, T, mlp),
                   **ln(p + "ln_mlp.")}
        if family != "transformer":
            shapes |= {p + f"lstm.hook_{x}": (B, T, d) for x in "ifgoch"}
            shapes |= {p + "hook_lstm_out": (B, T, d), **ln(p + "ln_lstm.")}
        if family != "lstm":
            shapes |= {p + f"attn.hook_{x}": (B, T, h, d // h) for x in "qkvz"}
            shapes |= {p + "attn.hook_attn_scores": (B, h, T, T), p + "attn.hook_pattern": (B, h, T, T),
                       p + "attn.hook_result": (B, T, h, d), p + "hook_attn_out": (B, T, d), **ln(p + "ln_attn.")}
            if pos == "rope":
                shapes |= {p + "attn.hook_rot_q": (B, T, h, d // h), p + "attn.hook_rot_k": (B, T, h, d // h)}
    return shapes


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 43, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family,pos", [("lstm", "none"), ("hybrid", "none"), ("hybrid", "rope"),
                                        ("transformer", "learned"), ("transformer", "sinusoidal"),
                                        ("transformer", "rope"), ("transformer", "none")])
def test_run_with_cache_has_every_hook_with_its_shape(family, pos):
    model = tiny_model(family, pos_encoding=pos)
    expected = expected_hooks(family, 2, pos)
    assert set(model.hook_dict) == set(expected)
    calls: dict[str, int] = {}

    def count(x, hook):
        calls[hook.name] = calls.get(hook.name, 0) + 1

    logits, cache = model.run_with_cache(tokens())
    assert {k: tuple(v.shape) for k, v in cache.items()} == expected
    with model.hooks(fwd_hooks=[(lambda n: True, count)]):
        model(tokens())
    assert calls == {k: 1 for k in expected}, "every HookPoint fires exactly once per forward"
    torch.testing.assert_close(cache["hook_logits"], logits)


def test_ablating_attention_through_a_hook_equals_gate_zero():
    model = tiny_model("hybrid")
    x = tokens()
    base = model(x)
    ablated = model.run_with_hooks(x, fwd_hooks=[(lambda n: n.endswith("hook_attn_out"), lambda a, hook: a * 0)])
    assert not torch.allclose(base, ablated)
    model.set_attention_gate(0.0)
    torch.testing.assert_close(model(x), ablated, rtol=0, atol=0)


def test_patching_an_lstm_output_changes_only_later_positions_downstream():
    model = tiny_model("lstm")
    x = tokens()
    base = model(x)
    # a random direction with a large norm: adding a constant to every feature is what LayerNorm removes exactly
    direction = 10.0 * torch.randn(16, generator=torch.Generator().manual_seed(7))

    def patch(a, hook):
        a = a.clone()
        a[:, 5] += direction
        return a

    out = model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_lstm_out", patch)])
    torch.testing.assert_close(out[:, :5], base[:, :5], rtol=0, atol=1e-6)
    assert (out[:, 5:] - base[:, 5:]).abs().amax(dim=(0, 2)).min() > 1e-2, "every later position moves"


def test_backward_hooks_and_incl_bwd():
    model = tiny_model("hybrid")
    grads = {}

    def save(g, hook):
        grads[hook.name] = g.detach().clone()

    with model.hooks(bwd_hooks=[("blocks.1.hook_attn_out", save), ("blocks.0.lstm.hook_h", save)]):
        model(tokens()).sum().backward()
    assert grads["blocks.1.hook_attn_out"].shape == (B, T, 16)
    assert grads["blocks.0.lstm.hook_h"].abs().sum() > 0
    model.zero_grad()
    labels = tokens(5)
    loss, cache = model.run_with_cache(tokens(), labels=labels, incl_bwd=True, names_filter=lambda n: "resid" in n)
    assert loss.dim() == 0
    assert cache["blocks.0.hook_resid_pre_grad"].shape == (B, T, 16)
    assert cache["blocks.1.hook_resid_post_grad"].abs().sum() > 0
    assert all(not hp.has_hooks() for hp in model.hook_dict.values())


def test_no_hook_survives_an_exception_inside_a_hook_context():
    model = tiny_model("hybrid")

    def boom(a, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks(fwd_hooks=[("blocks.0.hook_mlp_out", boom)], bwd_hooks=[("hook_embed", lambda g, hook: g)]):
            model(tokens())
    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(tokens(), fwd_hooks=[("blocks.1.attn.hook_pattern", boom)])
    assert all(not hp.has_hooks() for hp in model.hook_dict.values())
    assert all(not hp._forward_hooks and not hp._backward_hooks for hp in model.hook_dict.values())


def test_unrolled_lstm_matches_fused():
    model = tiny_model("hybrid", d_model=32)
    x = tokens(1)
    recurrent = lambda n: ".lstm.hook_" in n  # noqa: E731
    fused_logits, fused = model.run_with_cache(x, names_filter=recurrent)
    for lstm in model.lstm_layers:
        lstm.force_unrolled = True
    unrolled_logits, unrolled = model.run_with_cache(x, names_filter=recurrent)
    for lstm in model.lstm_layers:
        lstm.force_unrolled = False
    assert len(fused) == 12
    for name in fused:
        torch.testing.assert_close(unrolled[name], fused[name], rtol=0, atol=1e-5)
    torch.testing.assert_close(unrolled_logits, fused_logits, rtol=0, atol=1e-5)
    # c_T read out beside the fused kernel is the kernel's own final cell state
    lstm = model.blocks[0].lstm
    _, (_, c_n) = lstm.rnn(model.blocks[0].ln_lstm(model.embed(x)))
    torch.testing.assert_close(fused["blocks.0.lstm.hook_c"][:, -1], c_n[0], rtol=0, atol=1e-5)


def test_caching_every_hook_runs_the_fused_kernel(monkeypatch):
    model = tiny_model("hybrid")
    x = tokens()
    base = model(x)

    step = HookedLSTM.step

    def no_loop(self, xi_t, state, put, gates=None):
        # a read-out scans c_t over gates computed beside the kernel; a step that computes its own gates is the loop
        assert gates is not None, "a forward whose hooks only read must not unroll the LSTM"
        return step(self, xi_t, state, put, gates)

    monkeypatch.setattr(HookedLSTM, "step", no_loop)
    logits, cache = model.run_with_cache(x)
    torch.testing.assert_close(logits, base, rtol=0, atol=1e-5)
    assert "blocks.1.lstm.hook_c" in cache and "blocks.0.lstm.hook_f" in cache


def test_override_state_fused_and_unrolled_agree():
    model = tiny_model("lstm")
    lstm = model.blocks[0].lstm
    x = tokens()
    h = torch.randn(B, 16)
    c = torch.randn(B, 16)
    with lstm.override_state(4, h, c):
        fused = model(x)
        lstm.force_unrolled = True
        unrolled = model(x)
        lstm.force_unrolled = False
    torch.testing.assert_close(fused, unrolled, rtol=0, atol=1e-5)
    base = model(x)
    torch.testing.assert_close(fused[:, :4], base[:, :4])
    assert not torch.allclose(fused[:, 4:], base[:, 4:])


def test_hybrid_with_gates_zero_is_exactly_the_lstm_model():
    hybrid = tiny_model("hybrid", seed=1)
    lstm = tiny_model("lstm", seed=2)
    missing, unexpected = hybrid.load_state_dict(lstm.state_dict(), strict=False)
    assert not unexpected and all(".attn." in k or "ln_attn" in k or "attn_gate" in k for k in missing)
    hybrid.set_attention_gate(0.0)
    x = tokens(3)
    assert torch.equal(hybrid(x), lstm(x))


@pytest.mark.parametrize("family,pos", [("hybrid", "none"), ("transformer", "learned"), ("transformer", "rope")])
def test_attention_is_causal(family, pos):
    model = tiny_model(family, pos_encoding=pos)
    x = tokens()
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 1) % 43
    torch.testing.assert_close(model(x)[:, :6], model(y)[:, :6], rtol=0, atol=1e-6)
    _, cache = model.run_with_cache(x)
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert torch.all(pattern.triu(1) == 0)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(B, 2, T))


def test_gate_values_and_attention_parameters():
    model = tiny_model("hybrid")
    model.set_attention_gate([0.0, 0.5])
    assert model.attention_gates() == [0.0, 0.5]
    names = {n for n, p in model.named_parameters() if any(p is q for q in model.attention_parameters())}
    assert names and all(".attn." in n or "ln_attn" in n for n in names)
    with pytest.raises(ValueError):
        model.set_attention_gate([1.0])


def test_positions_argument_moves_the_positional_code_only():
    model = tiny_model("transformer", pos_encoding="learned", max_len=32)
    x = tokens()
    default = model(x)
    torch.testing.assert_close(model(x, positions=torch.arange(T)), default)
    assert not torch.allclose(model(x, positions=torch.arange(T) + 3), default)
    with pytest.raises(ProbeError, match="max_len"):
        model(x, positions=torch.arange(T) + 30)
    nope = tiny_model("hybrid")
    torch.testing.assert_close(nope(x, positions=torch.arange(T) + 3), nope(x))


def test_rope_depends_only_on_relative_position():
    model = tiny_model("transformer", pos_encoding="rope")
    x = tokens()
    torch.testing.assert_close(model(x, positions=torch.arange(T) + 11), model(x), rtol=0, atol=1e-4)


def test_bad_model_configs_raise():
    from probe.models import ModelConfig

    with pytest.raises(ProbeError, match="family"):
        ModelConfig(family="gru")
    with pytest.raises(ProbeError, match="divisible"):
        ModelConfig(d_model=10, n_heads=4)
    with pytest.raises(ProbeError, match="pos_encoding"):
        ModelConfig(pos_encoding="alibi")


# --- causal edits of the recurrent state ----------------------------------------------------------------------------
def _state(model, x, block: int) -> dict[str, torch.Tensor]:
    """Block ``block``'s gates and states on the unedited run, from the cache."""
    _, cache = model.run_with_cache(x, names_filter=lambda n: n.startswith(f"blocks.{block}.lstm."))
    return {k.rsplit("_", 1)[-1]: v for k, v in cache.items()}


@pytest.mark.parametrize("family,block", [("lstm", 0), ("lstm", 1), ("hybrid", 0), ("hybrid", 1)])
@pytest.mark.parametrize("api", ["run_with_hooks", "hooks", "add_hook"])
def test_editing_hook_h_at_t_is_override_state_at_t(family, block, api):
    model = tiny_model(family)
    x, t = tokens(), 4
    state = _state(model, x, block)
    h_new = 3 * torch.randn(B, 16, generator=torch.Generator().manual_seed(1))
    out = run_hooked(model, x, [(f"blocks.{block}.lstm.hook_h", set_at(t, h_new))], api)
    # the recurrence continues from (edited h_t, the run's own c_t)
    with model.blocks[block].lstm.override_state(t, h_new, state["c"][:, t]):
        expected = model(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    base = model(x)
    torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=1e-6)
    assert (out[:, t + 1:] - base[:, t + 1:]).abs().amax(dim=(0, 2)).min() > 1e-3, "every later position moves"
    assert all(not hp.has_hooks() for hp in model.hook_dict.values())


@pytest.mark.parametrize("family", ["lstm", "hybrid"])
def test_editing_hook_c_at_t_moves_h_from_t_on(family):
    model = tiny_model(family)
    x, t = tokens(), 4
    state = _state(model, x, 0)
    c_new = 3 * torch.randn(B, 16, generator=torch.Generator().manual_seed(2))
    with model.hooks(fwd_hooks=[("blocks.0.lstm.hook_c", set_at(t, c_new))]):
        out, cache = model.run_with_cache(x, names_filter="blocks.0.lstm.hook_h")
    # h_t is computed from c_t: the state after t is (o_t tanh(c_new), c_new)
    h_t = state["o"][:, t] * torch.tanh(c_new)
    with model.blocks[0].lstm.override_state(t, h_t, c_new):
        expected = model(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(cache["blocks.0.lstm.hook_h"][:, t], h_t, rtol=0, atol=1e-6)
    assert (cache["blocks.0.lstm.hook_h"][:, t] - state["h"][:, t]).abs().max() > 1e-2
    torch.testing.assert_close(cache["blocks.0.lstm.hook_h"][:, :t], state["h"][:, :t], rtol=0, atol=1e-6)


def test_editing_hook_h_and_hook_c_at_t_is_override_state():
    model = tiny_model("hybrid")
    x, t = tokens(), 3
    g = torch.Generator().manual_seed(3)
    h_new, c_new = torch.randn(B, 16, generator=g), 3 * torch.randn(B, 16, generator=g)
    out = model.run_with_hooks(x, fwd_hooks=[("blocks.1.lstm.hook_c", set_at(t, c_new)),
                                             ("blocks.1.lstm.hook_h", set_at(t, h_new))])
    with model.blocks[1].lstm.override_state(t, h_new, c_new):
        expected = model(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_zeroing_the_forget_gate_at_t_forgets_the_past():
    model = tiny_model("lstm")
    x, t = tokens(), 5
    state = _state(model, x, 0)
    out = model.run_with_hooks(x, fwd_hooks=[("blocks.0.lstm.hook_f", set_at(t, torch.zeros(B, 16)))])
    c_t = state["i"][:, t] * state["g"][:, t]
    with model.blocks[0].lstm.override_state(t, state["o"][:, t] * torch.tanh(c_t), c_t):
        expected = model(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    assert (out[:, t:] - model(x)[:, t:]).abs().max() > 1e-3


def test_an_edit_after_t_changes_nothing_before_t():
    model = tiny_model("hybrid")
    x, t = tokens(), 6
    base = model(x)
    hooks = [(f"blocks.{i}.lstm.hook_{p}", set_at(t, torch.full((B, 16), 0.9))) for i in (0, 1) for p in "fch"]
    out = model.run_with_hooks(x, fwd_hooks=hooks)
    torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=1e-6)
    assert (out[:, t:] - base[:, t:]).abs().amax(dim=(0, 2)).min() > 1e-3


def test_an_edit_that_depends_on_its_input_at_every_step_matches_a_step_by_step_loop():
    model = tiny_model("lstm", n_layers=1)
    x = tokens()
    v = torch.randn(16, generator=torch.Generator().manual_seed(4))
    calls = []

    def steer(a, hook):
        calls.append(1)
        return 0.5 * a + v

    with model.hooks(fwd_hooks=[("blocks.0.lstm.hook_h", steer)]):
        out, cache = model.run_with_cache(x, names_filter="blocks.0.hook_lstm_out")
    # the reference: the edit applied inside an explicit loop over time
    r = model.blocks[0].lstm.rnn
    inp = model.blocks[0].ln_lstm(model.embed(x))
    h, c, hs = torch.zeros(B, 16), torch.zeros(B, 16), []
    for s in range(T):
        i, f, g, o = (inp[:, s] @ r.weight_ih_l0.T + r.bias_ih_l0 + r.bias_hh_l0 + h @ r.weight_hh_l0.T).chunk(4, -1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        h = 0.5 * (o.sigmoid() * c.tanh()) + v
        hs.append(h)
    torch.testing.assert_close(cache["blocks.0.hook_lstm_out"], torch.stack(hs, 1), rtol=0, atol=1e-5)
    assert len(calls) <= T + 2  # one call per position it settles, and the first two passes
    plain = model(x)
    assert (out - plain).abs().max() > 1e-2


def test_a_hook_that_never_settles_is_a_probe_error():
    model = tiny_model("lstm")

    def noise(a, hook):
        return a + torch.randn_like(a)

    with pytest.raises(ProbeError, match="did not settle"):
        model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.lstm.hook_h", noise)])
    with pytest.raises(ProbeError, match="shape"):
        model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.lstm.hook_c", lambda a, hook: a[:, :-1])])
    assert all(not hp.has_hooks() for hp in model.hook_dict.values())


def test_gradients_under_a_state_patch_equal_those_of_override_state():
    model = tiny_model("hybrid")
    x, y, t = tokens(), tokens(5), 4
    g = torch.Generator().manual_seed(6)
    h_new, c_new = torch.randn(B, 16, generator=g), torch.randn(B, 16, generator=g)

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    hooked = grads(model.run_with_hooks(x, labels=y, fwd_hooks=[("blocks.0.lstm.hook_c", set_at(t, c_new)),
                                                                ("blocks.0.lstm.hook_h", set_at(t, h_new))]))
    with model.blocks[0].lstm.override_state(t, h_new, c_new):
        expected = grads(model(x, labels=y))
    assert hooked.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(hooked[name], expected[name], rtol=1e-4, atol=1e-6)
    reading = grads(model.run_with_hooks(x, labels=y, fwd_hooks=[(lambda n: "lstm" in n, lambda a, hook: None)]))
    plain = grads(model(x, labels=y))
    for name in plain:
        torch.testing.assert_close(reading[name], plain[name], rtol=0, atol=1e-6)
    assert expected["blocks.0.lstm.rnn.weight_hh_l0"].abs().sum() > 0


def test_shipped_checkpoints_load_with_the_new_hook_points():
    from pathlib import Path

    from probe.checkpoint import load_checkpoint

    paths = sorted(Path(__file__).parents[1].glob("checkpoints/*.pt"))
    assert paths
    for path in paths:
        model = load_checkpoint(path).build_model()  # strict load_state_dict
        assert not any(".hook_" in k for k in model.state_dict())


# --- override_state: several positions, bounds, nesting -----------------------------------------------------------
def _states(seed: int, *shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g), 3 * torch.randn(*shape, generator=g)


def test_override_state_at_several_positions_is_hook_edits_there_on_every_path():
    model = tiny_model("hybrid")
    lstm, x = model.blocks[1].lstm, tokens()
    h, c = _states(8, B, 2, 16)
    with lstm.override_state([6, 2], h, c):  # the order given, not sorted: h[:, 0] is position 6's
        fused = model(x)
        lstm.force_unrolled = True
        unrolled = model(x)
        lstm.force_unrolled = False
    torch.testing.assert_close(unrolled, fused, rtol=0, atol=1e-5)
    with lstm.override_state(2, h[:, 1], c[:, 1]), lstm.override_state(6, h[:, 0], c[:, 0]):
        torch.testing.assert_close(model(x), fused, rtol=0, atol=1e-6)

    def put(name, k, t):
        def hook(a, hook):
            a[:, t] = (h if name == "h" else c)[:, k]
            return a
        return hook

    hooks = [(f"blocks.1.lstm.hook_{p}", put(p, k, t)) for p in "ch" for k, t in ((0, 6), (1, 2))]
    for api in ("run_with_hooks", "hooks", "add_hook"):
        torch.testing.assert_close(run_hooked(model, x, hooks, api), fused, rtol=0, atol=1e-5)
    base = model(x)
    torch.testing.assert_close(fused[:, :2], base[:, :2], rtol=0, atol=1e-6)
    assert not torch.allclose(fused[:, 2:], base[:, 2:])


@pytest.mark.parametrize("positions,shape,match", [
    (T, (B, 16), "outside 0..8"),
    ([3, T + 2], (B, 2, 16), "outside 0..8"),
    (-1, (B, 16), "integers >= 0"),
    ([2, 2], (B, 2, 16), "distinct"),
    (3, (B, 15), r"h must have shape \(batch, 16\)"),
    ([1, 2], (B, 16), r"h must have shape \(batch, 2, 16\)"),
    (3, (B + 1, 16), "batch"),
])
def test_override_state_out_of_bounds_or_misshapen_is_one_line(positions, shape, match):
    model = tiny_model("lstm")
    lstm = model.blocks[0].lstm
    h, c = _states(0, *shape)
    with pytest.raises(ProbeError, match=match) as info:
        with lstm.override_state(positions, h, c):
            model(tokens())
    assert "\n" not in str(info.value)
    with pytest.raises(ProbeError, match="2 states expected"):
        with lstm.override_state(3, h):
            pass
    assert lstm.overridden_positions == () and lstm._override is None
    torch.testing.assert_close(model(tokens()), tiny_model("lstm")(tokens()))


def test_override_state_nests_and_restores_on_exit_and_on_exceptions():
    model = tiny_model("lstm")
    lstm, x = model.blocks[0].lstm, tokens()
    (h2, c2), (h5, c5), (h5b, c5b) = _states(1, B, 16), _states(2, B, 16), _states(3, B, 16)
    base = model(x)
    with lstm.override_state(2, h2, c2):
        outer = model(x)
        with lstm.override_state(5, h5, c5):
            assert lstm.overridden_positions == (2, 5)
            with lstm.override_state([2, 5], torch.stack([h2, h5], 1), torch.stack([c2, c5], 1)):
                both = model(x)
            torch.testing.assert_close(model(x), both, rtol=0, atol=0)
        torch.testing.assert_close(model(x), outer, rtol=0, atol=0)
        with pytest.raises(RuntimeError, match="boom"):
            with lstm.override_state(5, h5b, c5b):  # an inner block wins where both set a position
                with lstm.override_state(5, h5, c5):
                    assert lstm.overridden_positions == (2, 5)
                    raise RuntimeError("boom")
        assert lstm.overridden_positions == (2,)
        torch.testing.assert_close(model(x), outer, rtol=0, atol=0)
    assert lstm.overridden_positions == ()
    torch.testing.assert_close(model(x), base, rtol=0, atol=0)
    assert not torch.allclose(outer[:, 2:], base[:, 2:])


def test_override_state_used_inside_a_hook_leaves_the_running_forward_and_the_layer_as_they_were():
    model = tiny_model("lstm")
    lstm, x = model.blocks[0].lstm, tokens()
    h, c = _states(4, B, 16)
    inner = {}

    def probe_inside(a, hook):
        # an analysis that asks the same layer a counterfactual while the forward is running
        with lstm.override_state(3, h, c):
            inner["h"] = lstm.unrolled(model.blocks[0].ln_lstm(model.embed(x)))["h"]
        return None

    out = model.run_with_hooks(x, fwd_hooks=[("blocks.0.lstm.hook_h", probe_inside)])
    torch.testing.assert_close(out, model(x), rtol=0, atol=1e-6)
    torch.testing.assert_close(inner["h"][:, 3], h)
    assert lstm.overridden_positions == ()

    def raise_inside(a, hook):
        with lstm.override_state(3, h, c):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(x, fwd_hooks=[("blocks.0.lstm.hook_c", raise_inside)])
    assert lstm.overridden_positions == ()
    assert all(not hp.has_hooks() for hp in model.hook_dict.values())


def test_the_unrolled_reference_is_the_cached_run():
    model = tiny_model("lstm", d_model=32)
    x = tokens(2)
    _, cache = model.run_with_cache(x, names_filter=lambda n: n.startswith("blocks.0.lstm."))
    values = model.blocks[0].lstm.unrolled(model.blocks[0].ln_lstm(model.embed(x)))
    assert set(values) == set("ifgoch")
    for p, v in values.items():
        torch.testing.assert_close(v, cache[f"blocks.0.lstm.hook_{p}"], rtol=0, atol=1e-5)


def test_backward_hooks_on_the_gates_and_cell_state_warn_that_they_never_fire():
    import warnings

    model = tiny_model("lstm")
    fired = []

    def record(g, hook):
        fired.append(hook.name)

    with pytest.warns(UserWarning, match=r"blocks\.0\.lstm\.hook_c never fires") as caught:
        model.add_hook("blocks.0.lstm.hook_c", record, dir="bwd")
    assert len(caught) == 1
    with pytest.warns(UserWarning, match="hook_f never fires"):
        with model.hooks(bwd_hooks=[("blocks.1.lstm.hook_f", record)]):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the output's backward hook fires: no warning
        with model.hooks(bwd_hooks=[("blocks.0.lstm.hook_h", record)]):
            model(tokens()).sum().backward()
    model.reset_hooks()
    assert fired == ["blocks.0.lstm.hook_h"]


def test_fp32_recurrence_keeps_the_kernel_in_float32_under_bf16_autocast():
    model = tiny_model("hybrid")
    x = tokens()
    reference = model(x)
    model.set_fp32_recurrence(True)
    lstm = model.blocks[0].lstm
    inp = model.blocks[0].ln_lstm(model.embed(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = lstm(inp.bfloat16())
        logits = model(x)
        edited = model.run_with_hooks(x, fwd_hooks=[("blocks.0.lstm.hook_h", set_at(4, torch.zeros(B, 16)))])
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, lstm(inp), rtol=0, atol=2e-2)  # the input was rounded to bf16
    assert (logits.float() - reference).abs().max() < 0.1
    assert (edited.float() - logits.float()).abs().max() > 1e-2


# --- the hook reference in docs/guides/hooks.md -----------------------------------------------------------------------
def documented_hooks() -> dict[str, str]:
    """docs/guides/hooks.md's table: hook name (``blocks.{i}.`` for a block's) -> documented shape, e.g.
    ``B, T, d``. In a cell, a name after the first that starts with ``hook_`` is in the first's module; ``{a,b}``
    lists alternatives."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "guides" / "hooks.md").read_text()
    table: dict[str, str] = {}
    for cell, shape in re.findall(r"^\| (`[^|]+?) \| \(([^)]*)\) \|", text, flags=re.M):
        names = re.findall(r"`([^`]+)`", cell)
        module = names[0].rpartition(".")[0]
        for k, name in enumerate(names):
            name = f"{module}.{name}" if k and name.startswith("hook_") else name
            alternatives = re.search(r"\{([^}]*,[^}]*)\}", name)
            expanded = [name] if alternatives is None else \
                [name.replace(alternatives.group(0), a) for a in alternatives.group(1).split(",")]
            table |= {n: shape for n in expanded}
    return table


def test_docs_hook_table_is_the_models_hooks_with_their_shapes():
    import re

    table = documented_hooks()
    seen = set()
    cells = [{"rnn": "gru"}, {"rnn": "ssm", "ssm_range": "positive"}, {"rnn": "ssm", "ssm_range": "negative"},
             {"rnn": "ssm", "ssm_range": "complex", "ssm_state": 12}]
    for family, pos, cell in [("lstm", "none", {}), ("hybrid", "none", {}), ("hybrid", "rope", {}),
                              ("transformer", "learned", {}), ("transformer", "sinusoidal", {})] + \
            [(family, "none", cell) for family in ("lstm", "hybrid") for cell in cells]:
        model = tiny_model(family, pos_encoding=pos, **cell)
        # k: the SSM's channels, s: the real numbers in its state
        ssm = getattr(model.blocks[0], "lstm", None)
        size = {"B": B, "T": T, "d": 16, "H": 2, "dh": 8, "d_mlp": 64, "vocab": 43, "1": 1,
                "k": getattr(ssm, "k", None), "s": getattr(ssm, "n_state", None)}
        _, cache = model.run_with_cache(tokens())
        assert set(cache.keys()) == set(model.hook_dict)
        for name, value in cache.items():
            template = re.sub(r"^blocks\.\d+\.", "blocks.{i}.", name)
            assert template in table, f"{name} ({family}, {pos}, {cell}) is not in docs/guides/hooks.md"
            documented = tuple(size[s.strip()] for s in table[template].split(","))
            assert tuple(value.shape) == documented, f"{name}: {tuple(value.shape)}, documented ({table[template]})"
            seen.add(template)
    assert seen == set(table), f"documented but in no model: {sorted(set(table) - seen)}"


# --- the template: a second cell gets hooks, causal edits and override_state from HookedRecurrent alone ----------
class LeakyCell(HookedRecurrent):
    """A one-gate cell, ``a = sigmoid(W x + U h_prev)``, ``h = a h_prev + (1 - a) tanh(V x)``; its "kernel" is a
    plain loop."""

    GATES = ("a",)
    STATES = ("h",)

    def __init__(self, d: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(2 * d, d, generator=g) / d**0.5)
        self.u = torch.nn.Parameter(torch.randn(d, d, generator=g) / d**0.5)
        self.hook_a = InnerHookPoint()  # [batch, pos, d]
        self.hook_h = HookPoint()  # [batch, pos, d]

    def fused(self, x, state=None):
        h = torch.zeros(x.shape[0], self.u.shape[0]) if state is None else state[0]
        outs = []
        for xi in self.input_share(x).unbind(1):
            a = torch.sigmoid(xi[:, : h.shape[1]] + h @ self.u.T)
            h = a * h + (1 - a) * torch.tanh(xi[:, h.shape[1]:])
            outs.append(h)
        return torch.stack(outs, 1), (h,)

    def input_share(self, x):
        return x @ self.w.T

    def gate_values(self, xi, h_prev):
        return (torch.sigmoid(xi[..., : h_prev.shape[-1]] + h_prev @ self.u.T),)

    def advance(self, xi_t, gates, state, put):
        (a,), d = gates, state[0].shape[-1]
        return (put("h", a * state[0] + (1 - a) * torch.tanh(xi_t[:, d:])),)

    def initial_state(self, batch, like):
        return (like.new_zeros(batch, self.u.shape[0]),)


class _Root(HookedRootModule):
    def __init__(self, cell):
        super().__init__()
        self.cell = cell
        self.setup()

    def forward(self, x):
        return self.cell(x)


def test_a_new_cell_gets_causal_edits_and_override_state_from_the_template():
    root = _Root(LeakyCell(8))
    cell = root.cell
    x = torch.randn(B, T, 8, generator=torch.Generator().manual_seed(1))
    _, cache = root.run_with_cache(x)
    unrolled = cell.unrolled(x)
    for p in "ah":
        torch.testing.assert_close(cache[f"cell.hook_{p}"], unrolled[p], rtol=0, atol=1e-6)
    h_new = torch.randn(B, 8, generator=torch.Generator().manual_seed(2))
    out = root.run_with_hooks(x, fwd_hooks=[("cell.hook_h", set_at(4, h_new))])
    with cell.override_state(4, h_new):
        torch.testing.assert_close(out, root(x), rtol=0, atol=1e-6)
    torch.testing.assert_close(out[:, :4], cache["cell.hook_h"][:, :4], rtol=0, atol=0)
    assert (out[:, 5:] - cache["cell.hook_h"][:, 5:]).abs().amax(dim=(0, 2)).min() > 1e-3
    with pytest.warns(UserWarning, match=r"cell\.hook_a never fires.*cell\.hook_h sees"):
        root.add_hook("cell.hook_a", lambda g, hook: None, dir="bwd")
    root.reset_hooks()
