"""Hooked models: hook names and shapes, hook hygiene, fused vs unrolled LSTM, gates, causality, positions."""

from __future__ import annotations

import pytest
import torch

from probe.errors import ProbeError

from conftest import tiny_model

B, T = 3, 9


def spec_hooks(family: str, n_layers: int, pos: str) -> dict[str, tuple[int, ...]]:
    d, h = 16, 2
    shapes: dict[str, tuple[int, ...]] = {"hook_embed": (B, T, d), "hook_logits": (B, T, 43)}
    if family == "transformer" and pos in ("learned", "sinusoidal"):
        shapes["hook_pos_embed"] = (B, T, d)
    for i in range(n_layers):
        p = f"blocks.{i}."
        shapes |= {p + "hook_resid_pre": (B, T, d), p + "hook_mlp_out": (B, T, d), p + "hook_resid_post": (B, T, d)}
        if family != "transformer":
            shapes |= {p + "lstm.hook_h": (B, T, d), p + "lstm.hook_c": (B, T, d), p + "hook_lstm_out": (B, T, d)}
        if family != "lstm":
            shapes |= {p + f"attn.hook_{x}": (B, T, h, d // h) for x in "qkvz"}
            shapes |= {p + "attn.hook_attn_scores": (B, h, T, T), p + "attn.hook_pattern": (B, h, T, T),
                       p + "hook_attn_out": (B, T, d)}
    return shapes


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 43, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family,pos", [("lstm", "none"), ("hybrid", "none"), ("hybrid", "rope"),
                                        ("transformer", "learned"), ("transformer", "sinusoidal"),
                                        ("transformer", "rope"), ("transformer", "none")])
def test_run_with_cache_has_every_spec_hook_with_its_shape(family, pos):
    model = tiny_model(family, pos_encoding=pos)
    expected = spec_hooks(family, 2, pos)
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

    def patch(a, hook):
        a = a.clone()
        a[:, 5] += 1.0
        return a

    out = model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_lstm_out", patch)])
    torch.testing.assert_close(out[:, :5], base[:, :5])
    assert not torch.allclose(out[:, 5:], base[:, 5:])


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
    fused_logits, fused = model.run_with_cache(x, names_filter=lambda n: n.endswith("hook_h"))
    assert not model.blocks[0].lstm.hook_c.has_hooks()
    unrolled_logits, unrolled = model.run_with_cache(x, names_filter=lambda n: n.endswith(("hook_h", "hook_c")))
    for i in range(2):
        torch.testing.assert_close(unrolled[f"blocks.{i}.lstm.hook_h"], fused[f"blocks.{i}.lstm.hook_h"],
                                   rtol=0, atol=1e-5)
    torch.testing.assert_close(unrolled_logits, fused_logits, rtol=0, atol=1e-5)
    # c_T from the unrolled path is the fused kernel's final cell state
    lstm = model.blocks[0].lstm
    _, (_, c_n) = lstm.rnn(model.blocks[0].ln_lstm(model.embed(x)))
    torch.testing.assert_close(unrolled["blocks.0.lstm.hook_c"][:, -1], c_n[0], rtol=0, atol=1e-5)


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
