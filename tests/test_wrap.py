"""probe.wrap / probe.wrap_hf: a user's hybrid and the transformers library's hybrids under probe's analyses."""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import textwrap

import pytest
import torch
from torch import nn

import probe
from probe.errors import ProbeError
from probe.gradients import analyze_model, interference
from probe.gradients.controls import path_sum_residual
from probe.probes import probe_model
from probe.tasks import make_task
from probe.wrapped import HookedRNN, WrappedModel


class Hybrid(nn.Module):
    """The test's own hybrid: nn.Embedding -> nn.LSTM (or nn.GRU) -> causal nn.MultiheadAttention -> nn.Linear, each
    of the middle two residual."""

    def __init__(self, vocab: int, d: int = 16, cell: type[nn.Module] = nn.LSTM, num_layers: int = 1,
                 batch_first: bool = True) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(vocab, d)
        self.lstm = cell(d, d, num_layers=num_layers, batch_first=batch_first)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.unembed = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        h, _ = self.lstm(x if self.batch_first else x.transpose(0, 1))
        x = x + (h if self.batch_first else h.transpose(0, 1))
        mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=tokens.device).triu(1)
        a, _ = self.attn(x, x, x, attn_mask=mask, need_weights=False)
        return self.unembed(x + a)


@pytest.fixture
def task():
    return make_task("interleaved", train_length=8)


def wrapped_hybrid(task, seed: int = 0, **kw) -> WrappedModel:
    torch.manual_seed(seed)
    return probe.wrap(Hybrid(task.vocab_size, **kw).eval(), attention=["attn"], recurrent=["lstm"], task=task)


def no_hooks_left(model: WrappedModel) -> bool:
    return all(not hp._forward_hooks and not hp._backward_hooks for hp in model.hook_dict.values())


# --- the wrapper ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize(("num_layers", "batch_first"), [(1, True), (2, False)])
def test_hooked_cells_carry_the_users_weights(task, cell, num_layers, batch_first):
    torch.manual_seed(0)
    model = Hybrid(task.vocab_size, cell=cell, num_layers=num_layers, batch_first=batch_first).eval()
    params = {id(p) for p in model.lstm.parameters()}
    tokens = task.sample(12, 4, 0).tokens
    expected = model(tokens)
    wrapped = probe.wrap(model, attention=["attn"], recurrent=["lstm"])
    # the user's module stays an nn.LSTM / nn.GRU; the HookedRNN that serves it runs on its own Parameters
    assert type(model.lstm) is cell and isinstance(wrapped.recurrent_modules[0], HookedRNN)
    assert {id(p) for p in wrapped.recurrent_modules[0].parameters()} == params
    torch.testing.assert_close(wrapped(tokens), expected)
    logits, cache = wrapped.run_with_cache(tokens)  # the hooked path: per-step read-outs beside the kernel
    torch.testing.assert_close(logits, expected)
    states = ("h", "c") if cell is nn.LSTM else ("h",)
    for k in range(num_layers):
        for s in states:
            assert cache[f"lstm.layers.{k}.hook_{s}"].shape == (4, tokens.shape[1], 16)
    assert cache["attn.hook_in"].shape == cache["attn.hook_out"].shape == (4, tokens.shape[1], 16)
    assert no_hooks_left(wrapped)


def test_causal_state_edit(task):
    """An edit of hook_h at t changes nothing before t and the recurrence continues from it after t."""
    wrapped = wrapped_hybrid(task)
    tokens = task.sample(12, 4, 1).tokens
    t = 7
    plain, before = wrapped.run_with_cache(tokens)

    def edit(h, hook):
        h = h.clone()
        h[:, t] = 0.5
        return h

    with wrapped.hooks(fwd_hooks=[("lstm.layers.0.hook_h", edit)]):
        edited, after = wrapped.run_with_cache(tokens)
    torch.testing.assert_close(edited[:, :t], plain[:, :t], rtol=0, atol=1e-6)
    assert (edited[:, t:] - plain[:, t:]).abs().amax(dim=(0, 2)).min() > 1e-3  # every later position moves
    h0, h1 = before["lstm.layers.0.hook_h"], after["lstm.layers.0.hook_h"]
    assert torch.equal(h1[:, t], torch.full_like(h1[:, t], 0.5))
    assert (h1[:, t + 1] - h0[:, t + 1]).abs().max() > 1e-3  # h_{t+1} was computed from the edited h_t
    assert no_hooks_left(wrapped)


def test_gate_and_stopgrad(task):
    wrapped = wrapped_hybrid(task)
    tokens = task.sample(8, 2, 0).tokens
    full = wrapped(tokens)
    wrapped.set_attention_gate(0.0)
    assert wrapped.attention_gates() == [0.0]
    _, cache = wrapped.run_with_cache(tokens)
    assert torch.equal(cache["attn.hook_out"], torch.zeros_like(cache["attn.hook_out"]))
    assert not torch.allclose(wrapped(tokens), full)
    wrapped.set_attention_gate(1.0)
    with wrapped.attention_detached():
        torch.testing.assert_close(wrapped(tokens), full)  # the forward is unchanged
    assert wrapped.attention_parameters() and wrapped.recurrent_parameters()
    assert not set(map(id, wrapped.attention_parameters())) & set(map(id, wrapped.recurrent_parameters()))


def test_refusals_are_one_line(task):
    torch.manual_seed(0)
    cases = [
        (lambda: probe.wrap(Hybrid(task.vocab_size), attention=["atn"], recurrent=["lstm"]), "nearest: attn"),
        (lambda: probe.wrap(Hybrid(task.vocab_size), attention=[], recurrent=[]), "attention=[...]"),
        (lambda: HookedRNN(nn.LSTM(4, 4, bidirectional=True)), "bidirectional"),
        (lambda: HookedRNN(nn.LSTM(4, 4, proj_size=2)), "proj_size"),
    ]
    for make, words in cases:
        with pytest.raises(ProbeError, match=words.replace("[", r"\[").replace("]", r"\]")) as e:
            make()
        assert "\n" not in str(e.value)
    other = probe.wrap(nn.Sequential(nn.Embedding(5, 4), nn.Flatten()), recurrent=["0"])
    with pytest.raises(ProbeError, match=r"to logits \(batch, pos, vocab\).*returned \(2, 12\)"):
        other(torch.zeros(2, 3, dtype=torch.long))


def test_what_only_probes_own_models_have_is_refused_in_one_line(task):
    """Analyses written for probe's blocks (shortcuts, sharpness, attention reads) stop on a wrapped model with one
    line that names the analyses that run on it; hasattr still answers False."""
    from probe.models.cache import UnknownHookError
    from probe.wrapped import NotExposedError

    wrapped = wrapped_hybrid(task)
    assert not hasattr(wrapped, "blocks")
    with pytest.raises(NotExposedError, match="probe.gradients .* probe.probes .* probe.attributions") as e:
        wrapped.attention_blocks  # noqa: B018
    assert "\n" not in str(e.value)
    with pytest.raises(UnknownHookError, match="no probe blocks"):
        wrapped.run_with_hooks(task.sample(8, 2, 0).tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", print)])
    assert no_hooks_left(wrapped)


# --- the user's model as it was: tree, state_dict, unwrap, globs -----------------------------------------------------
class Stacked(nn.Module):
    """A plain-PyTorch hybrid of three blocks (nn.LSTM, then causal nn.MultiheadAttention, each residual), for globs."""

    def __init__(self, vocab: int, d: int = 16, n: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(nn.ModuleDict({"lstm": nn.LSTM(d, d, batch_first=True),
                                                   "attn": nn.MultiheadAttention(d, 2, batch_first=True)})
                                    for _ in range(n))
        self.unembed = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=tokens.device).triu(1)
        for block in self.blocks:
            x = x + block["lstm"](x)[0]
            x = x + block["attn"](x, x, x, attn_mask=mask, need_weights=False)[0]
        return self.unembed(x)


def no_hooks_on(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks and "forward" not in m.__dict__
               for m in model.modules())


def test_wrap_keeps_the_users_module_tree_and_state_dict(task):
    torch.manual_seed(0)
    model = Stacked(task.vocab_size).eval()
    keys, saved = list(model.state_dict()), copy.deepcopy(model.state_dict())
    tree = [(n, type(m)) for n, m in model.named_modules()]
    tokens = task.sample(10, 4, 0).tokens
    with torch.no_grad():
        expected = model(tokens)
    wrapped = probe.wrap(model, attention=["blocks.*.attn"], recurrent=["blocks.*.lstm"], task=task)
    assert list(model.state_dict()) == keys and [(n, type(m)) for n, m in model.named_modules()] == tree
    assert list(wrapped.state_dict()) == [f"module.{k}" for k in keys] + [f"sites.blocks.{i}.attn.gate"
                                                                          for i in range(3)]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))  # far from saved: a load that did nothing would leave the logits moved
        assert (wrapped(tokens) - expected).abs().max() > 0.1
        model.load_state_dict(saved)  # into the still-wrapped user model, through its per-step hooked path too
        logits, cache = wrapped.run_with_cache(tokens)
    torch.testing.assert_close(logits, expected)
    assert cache["blocks.2.lstm.layers.0.hook_h"].shape == (4, tokens.shape[1], 16)
    fresh = Stacked(task.vocab_size).eval()  # never wrapped
    fresh.load_state_dict(saved)
    torch.testing.assert_close(fresh(tokens), expected)
    # and the wrapper's own state_dict into a wrapper of another copy
    other = probe.wrap(Stacked(task.vocab_size).eval(), attention=["blocks.*.attn"], recurrent=["blocks.*.lstm"])
    other.load_state_dict(wrapped.state_dict())
    torch.testing.assert_close(other(tokens), expected)


def test_unwrap_restores_the_original_forward(task):
    torch.manual_seed(0)
    model = Hybrid(task.vocab_size, num_layers=2).eval()
    tokens = task.sample(8, 2, 0).tokens
    expected = model(tokens)
    wrapped = probe.wrap(model, attention=["attn"], recurrent=["lstm"])
    assert not no_hooks_on(model) and model.lstm.forward.__self__ is wrapped.recurrent_modules[0]
    with pytest.raises(ProbeError, match="already wrapped by another probe.wrap") as e:
        probe.wrap(model, attention=["attn"], recurrent=["lstm"])
    assert "\n" not in str(e.value)
    wrapped.set_attention_gate(0.0)  # a wrap's gate acts on the user's model while it is wrapped ...
    assert (model(tokens) - expected).abs().max() > 1e-3
    assert wrapped.unwrap() is model
    assert no_hooks_on(model) and model.lstm.forward.__func__ is nn.LSTM.forward
    torch.testing.assert_close(model(tokens), expected)  # ... and not after
    with pytest.raises(ProbeError, match="unwrapped: wrap the model again"):
        wrapped(tokens)
    with probe.wrap(model, attention=["attn"], recurrent=["lstm"]) as again:  # and it can be wrapped again
        torch.testing.assert_close(again(tokens), expected)
    assert no_hooks_on(model)


def test_a_glob_wraps_every_matching_block(task):
    torch.manual_seed(0)
    model = Stacked(task.vocab_size).eval()
    wrapped = probe.wrap(model, attention=["blocks.*.attn"], recurrent=["blocks.*.lstm"], task=task)
    assert wrapped.attention_names == [f"blocks.{i}.attn" for i in range(3)]
    assert wrapped.recurrent_names == [f"blocks.{i}.lstm" for i in range(3)]
    assert list(wrapped.hooked_cells) == [f"blocks.{i}.lstm.layers.0" for i in range(3)]
    wrapped.set_attention_gate([1.0, 0.0, 1.0])
    _, cache = wrapped.run_with_cache(task.sample(8, 2, 0).tokens)
    assert cache["blocks.1.attn.hook_out"].abs().max() == 0 and cache["blocks.2.attn.hook_out"].abs().max() > 1e-3
    for bad, words in [("blocks.*.atn", "no submodule matches 'blocks.*.atn'"), ("block.0.attn", "nearest")]:
        with pytest.raises(ProbeError, match=words) as e:
            probe.wrap(Stacked(task.vocab_size), attention=[bad])
        assert "\n" not in str(e.value)
    with pytest.raises(ProbeError, match="named twice.*blocks.0.attn"):
        probe.wrap(Stacked(task.vocab_size), attention=["blocks.*.attn", "blocks.0.attn"])


def test_an_optimizer_on_the_users_model_trains_what_the_wrapper_runs(task):
    torch.manual_seed(0)
    model = Hybrid(task.vocab_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)  # built before the wrap, on the user's model
    wrapped = probe.wrap(model, attention=["attn"], recurrent=["lstm"], task=task)
    batch = task.sample(8, 8, 0)
    before = wrapped(batch.tokens, batch.labels, return_type="loss")
    before.backward()
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in model.lstm.parameters())
    optimizer.step()
    after = wrapped(batch.tokens, batch.labels, return_type="loss")
    assert after < before - 1e-3
    # the wrapper runs the user's current weights, also where a load replaced the Parameter objects
    fresh = Hybrid(task.vocab_size)
    fresh.load_state_dict(model.state_dict())
    model.load_state_dict({k: v + 0.1 for k, v in model.state_dict().items()}, assign=True)
    fresh.load_state_dict({k: v + 0.1 for k, v in fresh.state_dict().items()})
    logits, _ = wrapped.eval().run_with_cache(batch.tokens)
    torch.testing.assert_close(logits, fresh.eval()(batch.tokens))
    assert {id(p) for p in wrapped.recurrent_parameters()} == {id(p) for p in model.lstm.parameters()}


def test_weights_saved_under_the_old_wrapper_names_load_from_format_1_only(task, tmp_path, monkeypatch):
    """Before wraps kept the user's tree, a wrapped nn.LSTM's weights were saved as ``<name>.layers.{k}.rnn.<w>_l0``
    (state_dict and the trajectory's AdamW moments): a file of format 1 written then is converted as it is read and
    rebuilds with the same weights. Format 2 knows today's names only: the same keys in a format-2 file (which no
    probe writes) are not renamed on the way in, and the build refuses them in one line."""
    from probe.checkpoint import (
        CheckpointError,
        CheckpointFormatWarning,
        checkpoint_from_model,
        load_checkpoint,
        save_checkpoint,
    )
    from probe.external import FactoryModelConfig

    (tmp_path / "old_hybrid.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg, _ = FactoryModelConfig.of("old_hybrid:factory")
    model = cfg.build(task)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)  # not the factory's weights: a load that did nothing would show
    ckpt = checkpoint_from_model(model, task)
    old = dict(ckpt.state_dict)
    for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        old[f"module.lstm.layers.0.rnn.{w}_l0"] = old.pop(f"module.lstm.{w}_l0")
    assert "module.lstm.layers.0.rnn.weight_ih_l0" in old and "module.lstm.weight_ih_l0" not in old
    ckpt.state_dict = old
    ckpt.extra["lstm_adam"] = {"exp_avg_sq": {"module.lstm.layers.0.rnn.bias_hh_l0": torch.ones(64)}}
    current = save_checkpoint(tmp_path / "current.pt", ckpt)
    with pytest.raises(CheckpointError, match="weights do not fit the recorded model config"):
        load_checkpoint(current).build_model()
    obj = torch.load(current, weights_only=True)
    obj["format_version"] = 1
    torch.save(obj, tmp_path / "old.pt")
    with pytest.warns(CheckpointFormatWarning):
        loaded = load_checkpoint(tmp_path / "old.pt")
    rebuilt = loaded.build_model()
    tokens = task.sample(8, 2, 0).tokens
    torch.testing.assert_close(rebuilt(tokens), model.eval()(tokens))
    assert set(loaded.extra["lstm_adam"]["exp_avg_sq"]) == {"module.lstm.bias_hh_l0"}
    sys.modules.pop("old_hybrid", None)


# --- analyses on the wrapped hybrid ----------------------------------------------------------------------------------
def test_gradient_split_and_its_exactness_checks(task):
    wrapped = wrapped_hybrid(task)
    batch = task.sample(8, 8, 0)
    table = interference(wrapped, batch)
    assert list(table.module) == ["lstm", "all"]
    row = table.iloc[0]
    assert 0 < row.att_ratio < 1 and row.loss_split_residual < 1e-5
    report = analyze_model(wrapped, lengths=[8], batch_size=8)
    checks = {c["control"]: c for c in report.controls}
    assert {"loss_split", "g_rec_two_routes", "parts_sum_to_whole", "known_split"} <= set(checks)
    assert all(c["passed"] for c in checks.values()), checks
    # the check could fail: a cut that detaches the query only leaves the key and value paths open
    @contextlib.contextmanager
    def query_only(model):
        handle = model.module.attn.register_forward_pre_hook(lambda m, args: (args[0].detach(), *args[1:]))
        try:
            yield
        finally:
            handle.remove()

    assert path_sum_residual(wrapped, batch, cut=query_only) > 1e-3
    # with attention off, no gradient reaches the recurrence through it
    wrapped.set_attention_gate(0.0)
    assert interference(wrapped, batch).g_att_norm.iloc[0] == 0.0
    assert no_hooks_left(wrapped) and wrapped._site("attn").stopgrad is False


def test_probe_table(task):
    wrapped = wrapped_hybrid(task)
    result = probe_model(wrapped, task, lengths=[8, 16], n_train=24, n_train_beyond=12, n_test=8, patching=False)
    hooks = set(result.by_length.hook)
    assert {"lstm.layers.0.hook_h", "lstm.layers.0.hook_c", "lstm.hook_out", "attn.hook_out"} <= hooks
    cols = {"probe_acc", "control_acc", "selectivity", "random_init_acc", "majority_acc", "n"}
    assert cols <= set(result.by_length.columns)
    assert result.by_length.probe_acc.between(0, 1).all() and not result.controls.empty


def test_random_init_copy_is_hooked_on_its_own(task):
    wrapped = wrapped_hybrid(task)
    other = wrapped.random_init(3)
    tokens = task.sample(8, 2, 0).tokens
    _, cache = other.run_with_cache(tokens)
    _, mine = wrapped.run_with_cache(tokens)
    assert set(cache.keys()) == set(mine.keys())
    assert not torch.allclose(cache["lstm.layers.0.hook_h"], mine["lstm.layers.0.hook_h"])
    assert not torch.equal(other.module.lstm.weight_hh_l0, wrapped.module.lstm.weight_hh_l0)


# --- the command line: package.module:factory in place of a checkpoint ----------------------------------------------
FACTORY = """
    import torch
    from torch import nn

    import probe
    from probe.tasks import make_task


    class Hybrid(nn.Module):
        def __init__(self, vocab):
            super().__init__()
            self.embed, self.lstm = nn.Embedding(vocab, 16), nn.LSTM(16, 16, batch_first=True)
            self.attn, self.unembed = nn.MultiheadAttention(16, 2, batch_first=True), nn.Linear(16, vocab)

        def forward(self, tokens):
            x = self.embed(tokens)
            x = x + self.lstm(x)[0]
            mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).triu(1)  # True: not seen
            return self.unembed(x + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0])


    def factory():
        torch.manual_seed(0)
        task = make_task("interleaved", train_length=8)
        return probe.wrap(Hybrid(task.vocab_size), attention=["attn"], recurrent=["lstm"]), task
"""


def test_cli_takes_a_factory(tmp_path, monkeypatch, capsys):
    from probe.gradients.cli import main

    (tmp_path / "my_hybrid.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    rc = main(["my_hybrid:factory", "--json", "--no-lookahead", "--lengths", "8", "--samples", "8"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    obj = json.loads(out.out)
    assert obj["checkpoints"] == ["my_hybrid:factory"]
    assert {r["module"] for r in obj["results"]} == {"lstm", "all"}
    assert all(c["passed"] for c in obj["controls"])
    # the lookahead steps a float64 copy of the wrapped model: its first-order check holds there too
    rc = main(["my_hybrid:factory", "--json", "--lengths", "8", "--samples", "8", "--la-batches", "2",
               "--la-eval-batches", "2"])
    checks = {c["control"]: c for c in json.loads(capsys.readouterr().out)["controls"]}
    assert rc == 0 and checks["lookahead_first_order"]["passed"]
    assert main(["my_hybrid:nothing", "--json", "--no-lookahead"]) == 2
    assert "no callable 'nothing'" in capsys.readouterr().err


# --- the transformers library's hybrids ------------------------------------------------------------------------------
def tiny_hf(kind: str, vocab: int) -> nn.Module:
    """A few-thousand-parameter model of each architecture, built from a config (nothing is downloaded)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
              "num_key_value_heads": 1}
    if kind == "recurrent_gemma":
        cfg = transformers.RecurrentGemmaConfig(**common, num_hidden_layers=3, lru_width=32, head_dim=16,
                                                attention_window_size=64, conv1d_width=4,
                                                block_types=["recurrent", "recurrent", "attention"])
        return transformers.RecurrentGemmaForCausalLM(cfg).eval()
    if kind == "jamba":
        cfg = transformers.JambaConfig(**common, num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1,
                                       expert_layer_period=2, expert_layer_offset=1, num_experts=2,
                                       num_experts_per_tok=1, mamba_d_state=4, mamba_d_conv=4, mamba_expand=2,
                                       mamba_dt_rank=4)
        return transformers.JambaForCausalLM(cfg).eval()
    cfg = transformers.FalconH1Config(**common, num_hidden_layers=2, head_dim=16, mamba_d_ssm=32, mamba_n_heads=4,
                                      mamba_d_head=8, mamba_d_state=4, mamba_d_conv=4, mamba_n_groups=1,
                                      mamba_chunk_size=16)
    return transformers.FalconH1ForCausalLM(cfg).eval()


@pytest.mark.parametrize("kind", ["recurrent_gemma", "jamba", "falcon_h1"])
def test_wrap_hf(task, kind):
    model = tiny_hf(kind, task.vocab_size)
    tokens = task.sample(8, 2, 0).tokens
    with torch.no_grad():
        expected = model(tokens, use_cache=False).logits
    wrapped = probe.wrap_hf(model, task=task)
    assert wrapped.attention_names and wrapped.recurrent_names and wrapped.resid_names
    torch.testing.assert_close(wrapped(tokens), expected)
    report = analyze_model(wrapped, lengths=[8], batch_size=4)
    assert all(c["passed"] for c in report.controls), report.controls
    t = report.interference
    assert set(t.module) == {*wrapped.recurrent_names, "all"}
    # |g_att| may exceed |g| where the two parts point against each other; Falcon-H1's last mixer sits beside the
    # last attention, not before it, so none of its gradient comes through attention; with attention off, none does
    first = t.iloc[0]
    assert (t.g_norm > 0).all() and first.att_ratio > 0 and t.att_ratio.iloc[-1] > 0
    wrapped.set_attention_gate(0.0)
    assert (analyze_model(wrapped, lengths=[8], batch_size=4).interference.g_att_norm == 0).all()


def test_wrap_hf_probe_table(task):
    wrapped = probe.wrap_hf(tiny_hf("recurrent_gemma", task.vocab_size), task=task)
    result = probe_model(wrapped, task, lengths=[8], hooks=["model.layers.1.hook_out", "model.layers.2.hook_out"],
                         n_train=16, n_train_beyond=8, n_test=8, patching=False)
    assert set(result.by_length.hook) == {"model.layers.1.hook_out", "model.layers.2.hook_out"}


def test_wrap_hf_names_what_it_knows():
    transformers = pytest.importorskip("transformers")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10))
    with pytest.raises(ProbeError, match="recurrent_gemma.*jamba.*falcon_h1.*not 'gpt2'") as e:
        probe.wrap_hf(gpt2)
    assert "\n" not in str(e.value)


# --- the GPU path ----------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gradients_on_cuda_in_eval_mode(task):
    """cuDNN's RNN backward refuses an eval-mode forward; the split must run, and agree with the CPU's."""
    from conftest import tiny_model

    batch = task.sample(8, 8, 0)
    own = tiny_model("hybrid", task.vocab_size)
    wrapped = wrapped_hybrid(task)
    for model in (own, wrapped):
        cpu = interference(model, batch)
        gpu = interference(model.to("cuda").eval(), batch.to("cuda"))
        torch.testing.assert_close(torch.tensor(gpu.g_att_norm.values), torch.tensor(cpu.g_att_norm.values),
                                   rtol=1e-4, atol=1e-6)
    assert torch.backends.cudnn.enabled  # restored after the pass


# --- the docs page ---------------------------------------------------------------------------------------------------
def test_docs_page_runs(capsys):
    """Every python block of docs/your-own-hybrid.md, in order, in one namespace."""
    import re
    from pathlib import Path

    pytest.importorskip("transformers")
    page = (Path(__file__).resolve().parents[1] / "docs" / "your-own-hybrid.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) >= 5
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/your-own-hybrid.md", "exec"), namespace)
    assert "att_ratio" in capsys.readouterr().out


def test_module_docstring_example_runs():
    import doctest

    import probe.wrapped

    assert doctest.testmod(probe.wrapped).failed == 0
