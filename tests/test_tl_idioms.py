"""What a TransformerLens user types on day one works on probe's models, and means what it means in TransformerLens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformer_lens import ActivationCache, patching

from probe.errors import ProbeError
from probe.models import UnknownHookError
from probe.tasks import IGNORE_INDEX, make_task

from conftest import tiny_model

B, T = 3, 9


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 43, (B, T), generator=torch.Generator().manual_seed(seed))


def no_hooks_left(model) -> bool:
    return all(not hp.has_hooks() and not hp._forward_hooks and not hp._backward_hooks
               for hp in model.hook_dict.values())


# --- the cache ------------------------------------------------------------------------------------------------------
def test_run_with_cache_returns_an_activation_cache_with_shorthand_keys():
    model = tiny_model("hybrid")
    _, cache = model.run_with_cache(tokens())
    assert isinstance(cache, ActivationCache) and cache.model is model
    assert torch.equal(cache["pattern", 1], cache["blocks.1.attn.hook_pattern"])
    assert torch.equal(cache["h", 0, "lstm"], cache["blocks.0.lstm.hook_h"])
    assert torch.equal(cache["resid_pre", -1], cache["blocks.1.hook_resid_pre"])
    assert torch.equal(cache["scale"], cache["ln_final.hook_scale"])
    assert torch.equal(cache["post", 0], cache["blocks.0.mlp.hook_post"])
    stacked = cache.stack_activation("resid_post")
    assert torch.equal(stacked, torch.stack([cache["blocks.0.hook_resid_post"], cache["blocks.1.hook_resid_post"]]))
    _, one = model.run_with_cache(tokens()[:1], remove_batch_dim=True)
    assert one["pattern", 0].shape == (2, T, T)


@pytest.mark.parametrize("family,pos", [("lstm", "none"), ("transformer", "learned"), ("hybrid", "none")])
def test_decompose_resid_sums_to_the_stream_for_every_family(family, pos):
    model = tiny_model(family, pos_encoding=pos)
    _, cache = model.run_with_cache(tokens())
    parts, labels = cache.decompose_resid(return_labels=True)
    torch.testing.assert_close(parts.sum(0), cache["resid_post", -1], rtol=0, atol=1e-5)
    if family != "transformer":
        assert "0_lstm_out" in labels and "1_lstm_out" in labels
    # the stream entering block 1's MLP
    mid = cache.decompose_resid(layer=1, mlp_input=True)
    torch.testing.assert_close(mid.sum(0), cache["resid_mid", 1], rtol=0, atol=1e-5)
    if family == "transformer":
        with pytest.raises(ProbeError, match="no lstm sublayer"):
            cache.decompose_resid(mode="lstm", incl_embeds=False)
    else:
        lstm_only, lstm_labels = cache.decompose_resid(mode="lstm", incl_embeds=False, return_labels=True)
        assert lstm_labels == ["0_lstm_out", "1_lstm_out"]
        torch.testing.assert_close(lstm_only[1], cache["lstm_out", 1])


def test_accumulated_resid_and_logit_lens_end_at_the_logits():
    model = tiny_model("hybrid")
    logits, cache = model.run_with_cache(tokens())
    stack, labels = cache.accumulated_resid(incl_mid=True, apply_ln=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    torch.testing.assert_close(model.unembed(stack[-1]), logits, rtol=0, atol=1e-5)


def test_apply_ln_uses_each_blocks_own_layernorm_scale():
    model = tiny_model("hybrid")
    _, cache = model.run_with_cache(tokens())
    into_block = cache.apply_ln_to_stack(cache["resid_pre", 1][None], layer=1)[0]
    torch.testing.assert_close(into_block, cache["blocks.1.ln_lstm.hook_normalized"], rtol=0, atol=1e-5)
    into_mlp = cache.apply_ln_to_stack(cache["resid_mid", 0][None], layer=0, mlp_input=True)[0]
    torch.testing.assert_close(into_mlp, cache["blocks.0.ln_mlp.hook_normalized"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["lstm", "hybrid"])
def test_logit_attrs_of_the_decomposition_add_up_to_the_logit(family):
    model = tiny_model(family)
    x = tokens()
    target = tokens(3)
    logits, cache = model.run_with_cache(x)
    attrs = cache.logit_attrs(cache.decompose_resid(), tokens=target)
    assert attrs.shape == (1 + 3 * 2 if family == "hybrid" else 1 + 2 * 2, B, T)
    # what no component owns: the unembedding bias and the final LayerNorm's bias
    constant = model.b_U[target] + (model.ln_final.bias * model.unembed.weight[target]).sum(-1)
    torch.testing.assert_close(attrs.sum(0) + constant, logits.gather(-1, target[..., None])[..., 0],
                               rtol=0, atol=1e-4)


def test_head_results_sum_to_the_attention_output():
    model = tiny_model("hybrid")
    model.set_attention_gate([1.0, 0.5])
    _, cache = model.run_with_cache(tokens())
    heads, labels = cache.stack_head_results(return_labels=True)
    assert labels == ["L0H0", "L0H1", "L1H0", "L1H1"]
    for layer, gate in enumerate([1.0, 0.5]):
        out = heads[2 * layer: 2 * layer + 2].sum(0) + model.blocks[layer].attn.W_O.bias
        torch.testing.assert_close(gate * out, cache["attn_out", layer], rtol=0, atol=1e-5)
    # computed from hook_z when hook_result was not cached
    _, partial = model.run_with_cache(tokens(), names_filter=lambda n: not n.endswith("hook_result"))
    torch.testing.assert_close(partial.stack_head_results(), heads, rtol=0, atol=1e-5)


def test_a_misspelled_key_in_the_cache_names_the_nearest():
    model = tiny_model("hybrid")
    _, cache = model.run_with_cache(tokens())
    with pytest.raises(KeyError) as info:
        cache["blocks.0.lstm.hook_hh"]
    assert isinstance(info.value, ProbeError)
    assert "blocks.0.lstm.hook_h" in str(info.value) and "\n" not in str(info.value)


# --- hooks TransformerLens users expect ------------------------------------------------------------------------------
def test_mlp_neuron_hooks():
    model = tiny_model("hybrid")
    x = tokens()
    base, cache = model.run_with_cache(x)
    torch.testing.assert_close(cache["post", 0], F.gelu(cache["pre", 0]))

    def kill(a, hook):
        a[..., :] = 0
        return a

    with model.hooks(fwd_hooks=[("blocks.0.mlp.hook_post", kill)]):
        out, ablated = model.run_with_cache(x, names_filter="blocks.0.hook_mlp_out")
    torch.testing.assert_close(ablated["blocks.0.hook_mlp_out"], model.blocks[0].mlp.W_out.bias.expand(B, T, 16))
    assert (out - base).abs().max() > 1e-3


def test_layernorm_scale_hooks():
    model = tiny_model("hybrid")
    x = tokens()
    base, cache = model.run_with_cache(x)
    torch.testing.assert_close(model(x), base, rtol=0, atol=1e-5)  # written-out LayerNorm = the fused one
    stream = cache["resid_post", 1]
    std = (stream.var(-1, unbiased=False, keepdim=True) + model.ln_final.eps).sqrt()
    torch.testing.assert_close(cache["scale"], std)
    doubled = model.run_with_hooks(x, fwd_hooks=[("ln_final.hook_scale", lambda a, hook: 2 * a)])
    w, b = model.ln_final.weight, model.ln_final.bias
    expected = model.unembed((cache["ln_final.hook_normalized"] / 2) * w + b)
    torch.testing.assert_close(doubled, expected, rtol=0, atol=1e-5)


def test_per_head_results_are_hookable():
    model = tiny_model("hybrid")
    x = tokens()

    def zero_head_0(a, hook):
        a[:, :, 0] = 0
        return a

    by_result = model.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_result", zero_head_0)])
    by_z = model.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_z", zero_head_0)])
    torch.testing.assert_close(by_result, by_z, rtol=0, atol=1e-5)
    assert (by_result - model(x)).abs().max() > 1e-3


def test_rotary_hooks_see_the_rotated_queries_and_keys():
    from probe.models.components import apply_rope

    model = tiny_model("transformer", pos_encoding="rope")
    x = tokens()
    _, cache = model.run_with_cache(x)
    positions = torch.arange(T).expand(B, T)
    torch.testing.assert_close(cache["rot_q", 0], apply_rope(cache["q", 0], positions))
    q, k = cache["rot_q", 1], cache["rot_k", 1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / (q.shape[-1] ** 0.5)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    torch.testing.assert_close(scores.masked_fill(causal, 0), cache["attn_scores", 1].masked_fill(causal, 0))
    assert "blocks.0.attn.hook_rot_q" not in tiny_model("hybrid").hook_dict


def test_lstm_gate_hooks_are_the_cell_s_own_gates():
    model = tiny_model("lstm")
    _, cache = model.run_with_cache(tokens())
    i, f, g, o, c, h = (cache[f"blocks.1.lstm.hook_{p}"] for p in "ifgoch")
    c_prev = torch.cat([torch.zeros_like(c[:, :1]), c[:, :-1]], dim=1)
    torch.testing.assert_close(c, f * c_prev + i * g, rtol=0, atol=1e-5)
    torch.testing.assert_close(h, o * torch.tanh(c), rtol=0, atol=1e-5)
    assert f.min() >= 0 and f.max() <= 1 and g.min() >= -1 and g.max() <= 1


# --- forward and helpers ---------------------------------------------------------------------------------------------
def test_return_type_as_in_hooked_transformer():
    model = tiny_model("hybrid")
    x, y = tokens(), tokens(5)
    y[:, :3] = IGNORE_INDEX
    logits = model(x)
    assert torch.equal(model(x, return_type="logits"), logits)
    expected = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(model(x, labels=y, return_type="loss"), expected)
    torch.testing.assert_close(model(x, labels=y), expected)  # labels alone still mean the loss
    both_logits, both_loss = model(x, labels=y, return_type="both")
    assert torch.equal(both_logits, logits) and torch.equal(both_loss, model(x, labels=y))
    per_token = model(x, labels=y, return_type="loss", loss_per_token=True)
    assert per_token.shape == (B, T) and torch.all(per_token[:, :3] == 0)
    torch.testing.assert_close(per_token.sum() / (y != IGNORE_INDEX).sum(), expected)
    assert model(x, return_type=None) is None
    with pytest.raises(ProbeError, match="labels"):
        model(x, return_type="loss")
    with pytest.raises(ProbeError, match="return_type"):
        model(x, return_type="probs")


def test_token_names_on_the_model():
    task = make_task("interleaved", train_length=8)
    model = tiny_model("hybrid", vocab_size=task.vocab_size)
    batch = task.sample(5, 2, 0)
    with pytest.raises(ProbeError, match="task"):
        model.to_str_tokens(batch.tokens[0])
    model.task = task
    names = model.to_str_tokens(batch.tokens[0])
    assert len(names) == batch.tokens.shape[1] and "|" in names
    assert model.to_str_tokens(batch.tokens) == [names, model.to_str_tokens(batch.tokens[1])]
    assert [model.to_single_token(n) for n in names] == batch.tokens[0].tolist()
    with pytest.raises(ProbeError, match="no token"):
        model.to_single_token("banana")


def test_transformer_lens_patching_helpers_run_on_the_hybrid():
    model = tiny_model("hybrid")
    clean, corrupted = tokens(0), tokens(1)
    answer = clean[:, -1:]
    _, clean_cache = model.run_with_cache(clean)

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(-1, answer).mean()

    assert model.cfg.device == torch.device("cpu") and model.cfg.n_key_value_heads is None
    resid = patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    assert resid.shape == (2, T)

    # one cell by hand: block 1's resid_pre at position 4 from the clean run
    def patch(a, hook):
        a[:, 4] = clean_cache[hook.name][:, 4]
        return a

    by_hand = metric(model.run_with_hooks(corrupted, fwd_hooks=[("blocks.1.hook_resid_pre", patch)]))
    torch.testing.assert_close(resid[1, 4], by_hand)
    assert (resid - metric(model(corrupted))).abs().max() > 1e-2, "some patch moves the metric"
    every = patching.get_act_patch_block_every(model, corrupted, clean_cache, metric)
    assert every.shape == (3, 2, T)
    heads = patching.get_act_patch_attn_head_out_by_pos(model, corrupted, clean_cache, metric)
    assert heads.shape == (2, T, 2)
    assert no_hooks_left(model)


def test_config_keeps_checkpoint_fields_and_follows_the_device():
    from probe.models import HookedSequenceModel, ModelConfig

    cfg = ModelConfig(family="hybrid", d_model=16, n_heads=2)
    model = HookedSequenceModel(cfg)
    assert model.cfg == cfg and model.cfg.to_dict() == cfg.to_dict()
    assert model.cfg.normalization_type == "LN" and model.cfg.d_vocab == cfg.vocab_size
    model.to(torch.float64)
    assert model.cfg.device == torch.device("cpu")


# --- misspelled hook names --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["run_with_hooks", "hooks", "add_hook", "names_filter", "names_filter_list"])
def test_a_misspelled_hook_name_is_one_line_naming_the_nearest(how):
    model = tiny_model("hybrid")
    wrong = "blocks.0.lstm.hook_hh"
    with pytest.raises(UnknownHookError) as info:
        if how == "run_with_hooks":
            model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.hook_mlp_out", lambda a, hook: a),
                                                      (wrong, lambda a, hook: a)])
        elif how == "hooks":
            with model.hooks(bwd_hooks=[(wrong, lambda g, hook: g)]):
                pass
        elif how == "add_hook":
            model.add_hook(wrong, lambda a, hook: a)
        elif how == "names_filter":
            model.run_with_cache(tokens(), names_filter=wrong)
        else:
            model.run_with_cache(tokens(), names_filter=["hook_embed", wrong])
    message = str(info.value)
    assert isinstance(info.value, ProbeError) and "\n" not in message
    assert repr(wrong) in message and "blocks.0.lstm.hook_h" in message
    assert no_hooks_left(model)


# --- what TransformerLens users reach for next ------------------------------------------------------------------------
def test_stacked_weights_are_the_ones_the_forward_uses():
    from transformer_lens import FactoredMatrix

    model = tiny_model("hybrid")
    model.set_attention_gate([1.0, 0.5])
    _, cache = model.run_with_cache(tokens())
    assert model.W_Q.shape == model.W_K.shape == model.W_V.shape == (2, 2, 16, 8)
    assert model.W_O.shape == (2, 2, 8, 16) and model.b_Q.shape == (2, 2, 8) and model.b_O.shape == (2, 16)
    assert model.W_in.shape == (2, 16, 64) and model.W_out.shape == (2, 64, 16)
    assert model.b_in.shape == (2, 64) and model.b_out.shape == (2, 16)
    for layer in (0, 1):
        ln_attn, ln_mlp = model.blocks[layer].ln_attn, model.blocks[layer].ln_mlp
        x = cache["normalized", layer, "ln_attn"] * ln_attn.weight + ln_attn.bias
        for name in "QKV":
            w, b = getattr(model, f"W_{name}")[layer], getattr(model, f"b_{name}")[layer]
            expected = torch.einsum("btd,hde->bthe", x, w) + b
            torch.testing.assert_close(expected, cache[name.lower(), layer], rtol=0, atol=1e-5)
        torch.testing.assert_close(torch.einsum("bthe,hed->bthd", cache["z", layer], model.W_O[layer]),
                                   cache["result", layer], rtol=0, atol=1e-5)
        pre = cache["normalized", layer, "ln_mlp"] * ln_mlp.weight + ln_mlp.bias
        torch.testing.assert_close(pre @ model.W_in[layer] + model.b_in[layer], cache["pre", layer],
                                   rtol=0, atol=1e-5)
    assert isinstance(model.OV, FactoredMatrix) and isinstance(model.QK, FactoredMatrix)
    torch.testing.assert_close(model.OV.AB, model.W_V @ model.W_O)
    torch.testing.assert_close(model.QK.AB, model.W_Q @ model.W_K.transpose(-2, -1))
    with pytest.raises(ProbeError, match="no attention"):
        _ = tiny_model("lstm").W_Q


def test_d_mlp_is_the_mlp_width_also_for_configs_saved_without_it():
    from probe.checkpoint import load_checkpoint
    from probe.models import ModelConfig

    assert tiny_model("hybrid").cfg.d_mlp == 64
    old = ModelConfig(family="lstm", d_model=32).to_dict() | {"d_mlp": None}
    cfg = ModelConfig.from_dict(old)
    assert cfg.d_mlp == cfg.mlp_dim == 128 and cfg == ModelConfig(family="lstm", d_model=32, d_mlp=128)
    ckpt = load_checkpoint(sorted(__import__("pathlib").Path(__file__).parents[1].glob("checkpoints/*.pt"))[0])
    assert ckpt.model_config.d_mlp == ckpt.build_model().blocks[0].mlp.W_in.out_features


def test_to_tokens_and_to_str_tokens_of_a_string():
    task = make_task("interleaved", train_length=8)
    model = tiny_model("hybrid", vocab_size=task.vocab_size)
    model.task = task
    ids = model.to_tokens("k1 v2 |  3 4")
    assert ids.shape == (1, 5) and ids.dtype == torch.long
    assert model.to_str_tokens(ids[0]) == ["k1", "v2", "|", "3", "4"] == model.to_str_tokens("k1 v2 | 3 4")
    assert model.to_tokens(["1 2", "3 4"]).tolist() == [[1, 2], [3, 4]]
    model(model.to_tokens("k0 v0 | 1 2 3"))
    with pytest.raises(ProbeError, match="no token named 'x'"):
        model.to_tokens("1 x 3")
    with pytest.raises(ProbeError, match="one length"):
        model.to_tokens(["1 2", "3"])


def test_neuron_results_add_up_to_the_mlp_output():
    model = tiny_model("hybrid")
    _, cache = model.run_with_cache(tokens())
    neurons = cache.get_neuron_results(1)
    assert neurons.shape == (B, T, 64, 16)
    torch.testing.assert_close(neurons.sum(-2) + model.b_out[1], cache["mlp_out", 1], rtol=0, atol=1e-5)
    torch.testing.assert_close(cache.get_neuron_results(1, neuron_slice=[3, 5], pos_slice=2),
                               neurons[:, 2, [3, 5]], rtol=0, atol=0)
    stack, labels = cache.stack_neuron_results(2, return_labels=True)
    assert stack.shape == (128, B, T, 16) and labels[64] == "L1N0"
    direction = torch.randn(16, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(cache.stack_neuron_results(2, apply_ln=True, project_output_onto=direction),
                               cache.apply_ln_to_stack(stack, 2) @ direction, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family,pos", [("lstm", "none"), ("transformer", "learned"), ("hybrid", "none")])
def test_full_resid_decomposition_sums_to_the_stream(family, pos):
    model = tiny_model(family, pos_encoding=pos)
    if family == "hybrid":
        model.set_attention_gate([1.0, 0.5])  # heads and their bias are gated
    _, cache = model.run_with_cache(tokens())
    parts, labels = cache.get_full_resid_decomposition(return_labels=True)
    assert len(labels) == len(parts) and labels[-1] == "bias"
    assert ("L1H1" in labels) == (family != "lstm") and ("1_lstm_out" in labels) == (family != "transformer")
    assert ("pos_embed" in labels) == (pos == "learned") and "L1N63" in labels
    torch.testing.assert_close(parts.sum(0), cache["resid_post", -1], rtol=0, atol=1e-4)
    for kwargs, target in (({"layer": 1, "mlp_input": True}, cache["resid_mid", 1]),
                           ({"layer": 1, "expand_neurons": False}, cache["resid_pre", 1]),
                           ({"layer": 0}, cache["resid_pre", 0])):
        torch.testing.assert_close(cache.get_full_resid_decomposition(**kwargs).sum(0), target, rtol=0, atol=1e-4)
    # with the final LayerNorm applied and projected onto a token's direction, the parts add up to its logit
    direction = model.tokens_to_residual_directions(5)
    folded, _ = cache.get_full_resid_decomposition(apply_ln=True, project_output_onto=direction, return_labels=True)
    assert folded.shape == (len(labels), B, T)
    constant = model.b_U[5] + model.ln_final.bias @ model.W_U[:, 5]
    logits = cache["hook_logits"][..., 5]
    torch.testing.assert_close(folded.sum(0) + constant, logits, rtol=0, atol=1e-4)
