"""``probe.wrap``: a user's own hybrid (any ``nn.Module`` from token ids to logits) as a hooked model probe analyses.

>>> import torch
>>> from torch import nn
>>> import probe
>>> class Tiny(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.embed, self.lstm = nn.Embedding(43, 16), nn.LSTM(16, 16, batch_first=True)
...         self.attn, self.unembed = nn.MultiheadAttention(16, 2, batch_first=True), nn.Linear(16, 43)
...     def forward(self, tokens):
...         x = self.embed(tokens)
...         x = x + self.lstm(x)[0]
...         mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).triu(1)  # True: not seen
...         return self.unembed(x + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0])
>>> wrapped = probe.wrap(Tiny(), attention=["attn"], recurrent=["lstm"])
>>> logits, cache = wrapped.run_with_cache(torch.zeros(2, 5, dtype=torch.long))
>>> tuple(cache["lstm.layers.0.hook_h"].shape), tuple(cache["attn.hook_out"].shape)
((2, 5, 16), (2, 5, 16))
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import fnmatch
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import EllipsisType, MethodType
from typing import Any, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from probe.core.gates import attribute_set
from probe.errors import ProbeError
from probe.models.cache import unknown_hook
from probe.models.config import ModelConfig
from probe.models.gru import HookedGRU
from probe.models.hooked import Sublayer, resolve_return_type
from probe.models.lstm import HookedLSTM
from probe.models.recurrent import HookedRecurrent, cudnn_backprop_ok, listened
from probe.tasks import IGNORE_INDEX, TaskConfig


# --- nn.LSTM / nn.GRU served by probe's hooked cells ----------------------------------------------------------------
class HookedRNN(nn.Module):
    """A user's ``nn.LSTM`` or ``nn.GRU`` (any ``num_layers``, ``batch_first`` or not, with its inter-layer dropout),
    called as the original is (``rnn(x)`` -> ``(output, (h_n, c_n))`` or ``(output, h_n)``), each layer served by
    probe's ``HookedLSTM`` / ``HookedGRU`` holding the user's own ``Parameter`` objects.

    So every layer has per-timestep hook points, ``layers.{k}.hook_h`` (and ``hook_c``, the gates) of shape
    ``[batch, pos, hidden]`` whatever ``batch_first`` says, and an edit of them is causal: the recurrence continues
    from the edited state (``HookedRecurrent``). Without hooks the layers run the fused kernel.

    An initial state ``hx`` other than zeros is refused, and so are ``bidirectional`` and ``proj_size`` (a backward
    recurrence or a projected state is not a causal state edit). After an edit of ``hook_c`` the returned ``c_n`` is
    read back from the gates of the edited run and does not carry the edit itself (``output`` and ``h_n`` do).

    ``probe.wrap`` keeps it outside the user's module tree: the user's module stays where it was, its ``forward``
    served by this one's until ``unwrap()``. Each call first takes the user's module's current Parameters (one that
    was replaced, by ``load_state_dict(assign=True)`` or a swap on ``.to()``, is picked up) and its train / eval
    mode."""

    def __init__(self, rnn: nn.LSTM | nn.GRU, name: str = "rnn") -> None:
        super().__init__()
        self.__dict__["source"] = rnn  # not a submodule: its parameters stay the user's, under the user's names
        kind = type(rnn).__name__
        if rnn.bidirectional or getattr(rnn, "proj_size", 0):
            raise ProbeError(f"{name}: a bidirectional {kind} or one with proj_size has no causal per-step state to "
                             "hook; wrap it as a module-level recurrent module by passing a copy that is not an "
                             f"nn.{kind} subclass, or use a unidirectional one without projection")
        if not rnn.bias:
            raise ProbeError(f"{name}: an nn.{kind} with bias=False is not supported by the hooked cells; "
                             "build it with bias=True (zero biases compute the same)")
        self.mode = "LSTM" if isinstance(rnn, nn.LSTM) else "GRU"
        self.batch_first = rnn.batch_first
        self.dropout = float(rnn.dropout)
        self.hidden_size = rnn.hidden_size
        cell: type[HookedRecurrent] = HookedLSTM if isinstance(rnn, nn.LSTM) else HookedGRU
        self.layers = nn.ModuleList()
        for k in range(rnn.num_layers):
            layer = cell(rnn.hidden_size, rnn.input_size if k == 0 else rnn.hidden_size)  # type: ignore[call-arg]
            for suffix in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                # the same Parameter objects: an optimizer built on the user's model still trains them
                setattr(layer.rnn, f"{suffix}_l0", getattr(rnn, f"{suffix}_l{k}"))
            self.layers.append(layer.to(rnn.weight_ih_l0.device))

    def borrow(self) -> None:
        """Take the source module's current Parameters and train / eval mode (identity checks: nothing is copied)."""
        src = self.source
        for k, layer in enumerate(self.layers):
            for suffix in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                mine, theirs = layer.rnn._parameters[f"{suffix}_l0"], getattr(src, f"{suffix}_l{k}")
                if mine is not theirs:
                    setattr(layer.rnn, f"{suffix}_l0", theirs)
        if self.training != src.training:
            self.train(src.training)

    def forward(self, x: Tensor, hx: Any = None) -> tuple[Tensor, Any]:
        self.borrow()
        if hx is not None and any(bool(h.any()) for h in (hx if isinstance(hx, tuple) else (hx,))):
            raise ProbeError("a hooked recurrent layer starts from zeros: an initial state hx is not supported; "
                             "set the state with override_state or a hook on hook_h instead")
        unbatched = x.dim() == 2
        x = x[None] if unbatched else (x if self.batch_first else x.transpose(0, 1))
        finals = []
        with cudnn_backprop_ok(x, self.training):
            for k, layer in enumerate(self.layers):
                if k and self.dropout:
                    x = F.dropout(x, self.dropout, self.training)
                x, final = self._run(layer, x)
                finals.append(final)
        out = x[0] if unbatched else (x if self.batch_first else x.transpose(0, 1))
        states = [torch.stack(s) for s in zip(*finals, strict=True)]  # (num_layers, batch, hidden) each
        if unbatched:
            states = [s[:, 0] for s in states]
        return out, (tuple(states) if self.mode == "LSTM" else states[0])

    @staticmethod
    def _run(layer: HookedRecurrent, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One layer's output sequence and final state(s)."""
        if not layer.force_unrolled and not layer.overridden_positions and not any(
                listened(layer.hook_point(p)) for p in layer.points):
            return layer.fused(x)
        out = layer(x)
        inner = [s for s in layer.STATES[1:]]
        read = layer._read_out(layer.input_share(x), out, set(inner)) if inner else {}
        return out, (out[:, -1], *(read[s][:, -1] for s in inner))

    def extra_repr(self) -> str:
        return f"{self.mode}, layers={len(self.layers)}, batch_first={self.batch_first}"


# --- hook points on a named module ----------------------------------------------------------------------------------
def _first_tensor(args: tuple, kwargs: dict) -> Tensor | None:
    for v in (*args, *kwargs.values()):
        if isinstance(v, Tensor):
            return v
    return None


def _map_tensors(v: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``fn`` on a tensor, or on each tensor of a tuple or list (one level: a model's (cos, sin) pair)."""
    if isinstance(v, Tensor):
        return fn(v)
    if isinstance(v, (tuple, list)):
        return type(v)(fn(t) if isinstance(t, Tensor) else t for t in v)
    return v


class Site(nn.Module):
    """The hook points of one named module: ``hook_in`` sees (and may replace) the module's first tensor input,
    ``hook_out`` its first tensor output (the output itself, or element 0 of a tuple); an attention site also holds
    ``gate`` (0 = off, 1 = on; it multiplies the output before ``hook_out``, as probe's own blocks gate attention) and
    ``stopgrad`` (every tensor input detached: the forward is unchanged, no gradient flows back through the module's
    inputs). Its ``pre`` and ``post`` are the forward pre-hook and forward hook on the user's module."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False

    def activate(self, attention: bool) -> None:
        self.active = True
        self.hook_in = HookPoint()  # [the module's first tensor input, in its own layout: batch pos d_in]
        self.hook_out = HookPoint()  # [its first tensor output: batch pos d_out; attention's after the gate]
        self.attention = attention
        self.stopgrad = False
        if attention:
            self.register_buffer("gate", torch.ones(()))

    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        x = _first_tensor(args, kwargs)
        if x is None:
            return args, kwargs
        y = self.hook_in(x.detach() if self.stopgrad else x)

        def swap(t: Tensor) -> Tensor:
            # self-attention gets one tensor as query, key and value: each is the hooked one
            return y if t is x else (t.detach() if self.stopgrad else t)

        return (tuple(_map_tensors(a, swap) for a in args),
                {k: _map_tensors(v, swap) for k, v in kwargs.items()})

    def post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        first = output if isinstance(output, Tensor) else (
            output[0] if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor) else None)
        if first is None:
            return output
        if self.attention:
            first = self.gate.to(first.dtype) * first
        first = self.hook_out(first)
        if isinstance(output, Tensor):
            return first
        if hasattr(output, "_fields"):  # a named tuple
            return output._replace(**{output._fields[0]: first})
        return type(output)((first, *output[1:]))


def _nearest(name: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    return f"; nearest: {', '.join(close)}" if close else ""


def resolve_names(model: nn.Module, patterns: Sequence[str]) -> list[str]:
    """The submodule paths ``patterns`` name in ``model``, in the order given: an exact path, or an fnmatch pattern
    over ``named_modules()`` names (``blocks.*.attn``; ``*`` also crosses dots), which stands for every match in the
    model's order. A path the model lacks, or a pattern that matches nothing, is one line naming the nearest."""
    names = [n for n, _ in model.named_modules() if n]
    out: list[str] = []
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        if any(c in pattern for c in "*?["):
            hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise ProbeError(f"{type(model).__name__}: no submodule matches {pattern!r}"
                                 f"{_nearest(pattern, names)}")
            out += hits
        elif pattern in names:
            out.append(pattern)
        else:
            raise ProbeError(f"{type(model).__name__} has no submodule {pattern!r}{_nearest(pattern, names)}")
    return out


def _is_ours(fn: Any, owners: type | tuple[type, ...]) -> bool:
    """Whether ``fn`` is a bound method of an ``owners`` instance: a hook or a forward that a wrap installed."""
    return isinstance(fn, MethodType) and isinstance(fn.__self__, owners)


def _wrapped_by_probe(model: nn.Module) -> bool:
    """Whether some wrap's hooks or served forward are still on ``model``'s modules."""
    return any(_is_ours(m.__dict__.get("forward"), HookedRNN)
               or any(_is_ours(h, Site) for h in (*m._forward_pre_hooks.values(), *m._forward_hooks.values()))
               for m in model.modules())


# --- the config an analysis reads -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class WrappedConfig:
    """What probe's analyses read from a model's config, for a wrapped model: the family ``wrapped``, which kinds of
    module it has, and sizes for the memory planner (read from the model: the embedding's width, the number of named
    modules, attention heads where the module says). Not a ``ModelConfig``: a wrapped model is not built from one."""

    attention: tuple[str, ...]
    recurrent: tuple[str, ...]
    resid: tuple[str, ...] = ()
    vocab_size: int = 0
    d_model: int = 0
    n_heads: int = 1
    family: str = "wrapped"
    rnn: str = "wrapped"
    pos_encoding: str = "none"
    max_len: int = sys.maxsize

    @property
    def has_lstm(self) -> bool:
        return bool(self.recurrent)

    @property
    def has_attention(self) -> bool:
        return bool(self.attention)

    @property
    def n_layers(self) -> int:
        return max(1, len(self.attention) + len(self.recurrent))

    @property
    def mlp_dim(self) -> int:
        return 4 * self.d_model

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- the wrapped model ----------------------------------------------------------------------------------------------
class NotExposedError(ProbeError, AttributeError):
    """An analysis asked a wrapped model for a part of probe's own models (its blocks, embedding, attention
    pattern). An ``AttributeError`` too, so that ``hasattr`` and ``getattr(..., default)`` keep working."""


PROBE_MODEL_PARTS = frozenset({"blocks", "embed", "unembed", "ln_final", "pos_embed", "attention_blocks", "W_E",
                               "W_U", "b_U", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "QK", "OV",
                               "W_in", "W_out", "b_in", "b_out", "set_fp32_recurrence", "accumulated_bias"})
"""What analyses written for probe's own blocks read; on a wrapped model each is refused in one line."""

def refuse_wrapped(name: str, model_config: Any, reads: str) -> None:
    """One line, before any work, where an analysis that reads ``reads`` of probe's own models is given a wrapped,
    transformers or factory model (any config but probe's ``ModelConfig``)."""
    if not isinstance(model_config, ModelConfig):
        raise ProbeError(f"{name}: this analysis does not apply to this checkpoint (it reads {reads}, which a wrapped "
                         f"model does not expose); on a wrapped model run {WORKS_ON_WRAPPED}")


WORKS_ON_WRAPPED = ("probe.gradients (the split and the lookahead), probe.probes (its interventions where an nn.LSTM / "
                    "nn.GRU is named) and probe.attributions (occlusion, path patching, component ablation)")


class WrappedModel(HookedRootModule):
    """A user's ``nn.Module`` as a TransformerLens ``HookedRootModule``; built by ``probe.wrap``.

    Hook names (the named module's path in the user's model, ``<name>``):

    - ``<name>.hook_in`` -- the module's first tensor input, ``[batch, pos, d_in]`` in the module's own layout
      (``[pos, batch, d]`` for a module that is not batch-first); a hook may edit it;
    - ``<name>.hook_out`` -- its first tensor output, ``[batch, pos, d_out]`` likewise; for an attention module the
      output after its gate (what joins the stream);
    - ``<name>.layers.{k}.hook_h`` / ``hook_c`` / gates -- per timestep, ``[batch, pos, hidden]``, for each layer of
      an ``nn.LSTM`` / ``nn.GRU`` named as recurrent (``HookedRNN``); an edit at position t is causal;
    - ``hook_logits`` -- ``[batch, pos, vocab]``;
    - and every ``HookPoint`` the user's model has itself, under its own path.

    A recurrent module that is not an ``nn.LSTM`` / ``nn.GRU`` (an RG-LRU, a Mamba mixer, a custom cell) has
    ``hook_in`` / ``hook_out`` only: its state is not exposed per step, so analyses that edit or read the state
    inside the recurrence refuse it.

    **The user's model keeps its module tree and its ``state_dict`` keys.** Forward hooks on the named modules call
    the hook points; a named ``nn.LSTM`` / ``nn.GRU`` stays where it is and its ``forward`` is served by a
    ``HookedRNN`` on its own Parameter objects, held here, outside the user's tree. So a ``state_dict`` saved before
    the wrap loads into the wrapped model's user module and into a fresh copy alike, and an optimizer built on the
    user's model trains what the wrapper runs. This wrapper's own ``state_dict`` is the user's under ``module.``,
    plus each attention gate (``sites.<name>.gate``). ``unwrap()`` (or leaving a ``with probe.wrap(...)`` block)
    removes every hook and served forward and returns the user's model as it was.
    """

    def __init__(self, model: nn.Module, attention: Sequence[str], recurrent: Sequence[str],
                 resid: Sequence[str] = (), task: TaskConfig | None = None,
                 forward_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        if isinstance(model, WrappedModel):
            raise ProbeError("this model is already wrapped: use it as it is")
        if _wrapped_by_probe(model):
            raise ProbeError(f"this {type(model).__name__} is already wrapped by another probe.wrap: use that wrapper, "
                             "or call its unwrap() first")
        attention, recurrent, resid = (resolve_names(model, names) for names in (attention, recurrent, resid))
        named = [*attention, *recurrent, *resid]
        if len(set(named)) != len(named):
            twice = sorted({n for n in named if named.count(n) > 1})
            raise ProbeError(f"a module is named twice in attention / recurrent / resid: {', '.join(twice)}")
        self.module = model
        self.task = task
        self.forward_kwargs = dict(forward_kwargs or {})
        self.attention_names, self.recurrent_names, self.resid_names = attention, recurrent, resid
        self.unwrapped = False
        # a plain dict, not a submodule: the hooked cells hold the user's Parameters, which would otherwise appear a
        # second time in this wrapper's state_dict; setup() names their hook points
        self.rnns: dict[str, HookedRNN] = {n: HookedRNN(model.get_submodule(n), n) for n in recurrent
                                           if type(model.get_submodule(n)) in (nn.LSTM, nn.GRU)}
        self.sites = nn.Module()
        for n in named:
            site = self._site(n)
            site.activate(attention=n in attention)
            module = model.get_submodule(n)
            # bound methods of the site (and of the HookedRNN), so that a deepcopy of the wrapped model calls its own
            # copies, and unwrap() finds them by their owner
            module.register_forward_pre_hook(site.pre, with_kwargs=True)
            module.register_forward_hook(site.post, with_kwargs=True)
            if n in self.rnns:
                module.forward = self.rnns[n].forward
        self.hook_logits = HookPoint()  # [batch, pos, vocab]
        self.cfg = self._config()
        self.setup()

    def unwrap(self) -> nn.Module:
        """Remove every hook and served ``forward`` this wrap put on the user's model and return the model, as it was
        before ``probe.wrap`` (its Parameters carry whatever training did meanwhile). The wrapper is not usable
        afterwards; wrap the model again to analyse it."""
        sites = set(map(id, self.sites.modules()))
        for m in self.module.modules():
            for hooks in (m._forward_pre_hooks, m._forward_hooks):
                for key in [k for k, h in hooks.items() if _is_ours(h, Site) and id(h.__self__) in sites]:
                    del hooks[key]  # what RemovableHandle.remove() does, found by owner rather than by handle
                    for extra in (m._forward_hooks_with_kwargs, m._forward_pre_hooks_with_kwargs,
                                  m._forward_hooks_always_called):
                        extra.pop(key, None)
            served = m.__dict__.get("forward")
            if _is_ours(served, HookedRNN) and served.__self__ in self.rnns.values():
                del m.forward
        self.unwrapped = True
        return self.module

    def __enter__(self) -> WrappedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unwrap()

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in PROBE_MODEL_PARTS:
                raise NotExposedError(f"this analysis reads model.{name}, a part of probe's own blocks that a wrapped "
                                      f"model does not expose; on a wrapped model run {WORKS_ON_WRAPPED}") from None
            raise

    def _check_names(self, names: Any) -> None:
        """A hook name the model does not have is one line naming the nearest ones (an analysis written for probe's
        blocks asks for ``blocks.{i}...`` names)."""
        for name in [names] if isinstance(names, str) else names if isinstance(names, (list, tuple)) else []:
            if isinstance(name, str) and name not in self.hook_dict:
                what = ("a wrapped model has no hook" if not name.startswith("blocks.") else
                        f"a wrapped model has no probe blocks (on it run {WORKS_ON_WRAPPED}), so no hook")
                raise unknown_hook(name, self.hook_dict, what)

    def add_hook(self, name: Any, hook: Callable, *args: Any, **kwargs: Any) -> None:
        self._check_names(name)
        super().add_hook(name, hook, *args, **kwargs)

    def _enable_hook_with_name(self, name: str, hook: Callable, dir: Literal["fwd", "bwd"]) -> None:
        self._check_names(name)  # the path of hooks(...) and run_with_hooks(...) for a hook given by name
        super()._enable_hook_with_name(name, hook, dir)

    def get_caching_hooks(self, names_filter: Any = None, *args: Any, **kwargs: Any) -> tuple[dict, list, list]:
        self._check_names(names_filter)
        return super().get_caching_hooks(names_filter, *args, **kwargs)

    def _site(self, name: str) -> Site:
        node: nn.Module = self.sites
        for part in name.split("."):
            if part not in node._modules:
                node.add_module(part, Site())
            node = node._modules[part]  # type: ignore[assignment]
        return node  # type: ignore[return-value]

    def _config(self) -> WrappedConfig:
        embeds = [m for m in self.module.modules() if isinstance(m, nn.Embedding)]
        heads = [int(getattr(m, "num_heads", 0) or getattr(getattr(m, "config", None), "num_attention_heads", 0) or 1)
                 for m in self.attention_modules]
        return WrappedConfig(tuple(self.attention_names), tuple(self.recurrent_names), tuple(self.resid_names),
                             vocab_size=self.task.vocab_size if self.task else (embeds[0].num_embeddings if embeds
                                                                                  else 0),
                             d_model=embeds[0].embedding_dim if embeds else 0, n_heads=max(heads, default=1))

    def setup(self) -> None:
        """TransformerLens's ``setup``, with each hook point named by its path in the user's model (``lstm.hook_in``,
        not ``sites.lstm.hook_in``)."""
        self.mod_dict, self.hook_dict = {}, {}
        # the hooked cells are held outside the module tree (``rnns``): their hook points are named here, by path
        held = [(f"module.{path}.{sub}", m) for path, rnn in self.rnns.items() for sub, m in rnn.named_modules() if sub]
        for name, module in [*self.named_modules(), *held]:
            short = name.partition(".")[2] if name.startswith(("module.", "sites.")) else name
            if name.startswith("module."):
                self.mod_dict.setdefault(short, module)
            if isinstance(module, HookPoint):
                if short in self.hook_dict:
                    raise ProbeError(f"two hook points would be named {short!r}: rename the module that has one")
                module.name = short
                self.hook_dict[short] = module
                self.mod_dict[short] = module

    # --- the forward ------------------------------------------------------------------------------------------------
    def forward(
        self, tokens: Int[Tensor, "batch pos"], labels: Int[Tensor, "batch pos"] | None = None,
        return_type: Literal["logits", "loss", "both"] | None | EllipsisType = ..., loss_per_token: bool = False,
    ) -> Float[Tensor, "batch pos vocab"] | Float[Tensor, ""] | tuple[Tensor, Tensor] | None:
        """As ``HookedSequenceModel.forward``: logits, or the cross-entropy against ``labels`` at every labelled
        position (``IGNORE_INDEX`` elsewhere; no next-token shift: every answer is read at its own position)."""
        if self.unwrapped:
            raise ProbeError("this wrapper was unwrapped: wrap the model again with probe.wrap to analyse it")
        return_type = resolve_return_type(return_type, labels)
        with cudnn_backprop_ok(tokens, self.training):  # the user's own RNN modules, if any
            out = self.module(tokens, **self.forward_kwargs)
        logits = out if isinstance(out, Tensor) else getattr(out, "logits", None)
        if logits is None and isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
            logits = out[0]
        if logits is None or logits.dim() != 3 or logits.shape[:2] != tokens.shape:
            got = tuple(logits.shape) if isinstance(logits, Tensor) else type(out).__name__
            raise ProbeError(f"the wrapped model must map tokens {tuple(tokens.shape)} to logits (batch, pos, vocab) "
                             f"or an output with .logits; it returned {got}")
        logits = self.hook_logits(logits)
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        b, t = tokens.shape
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="none" if loss_per_token else "mean")
        loss = loss.view(b, t) if loss_per_token else loss
        return loss if return_type == "loss" else (logits, loss)

    # --- modules --------------------------------------------------------------------------------------------------
    @property
    def attention_modules(self) -> list[nn.Module]:
        return [self.module.get_submodule(n) for n in self.attention_names]

    @property
    def recurrent_modules(self) -> list[nn.Module]:
        """The named recurrent modules, each as it runs: the ``HookedRNN`` that serves a named ``nn.LSTM`` /
        ``nn.GRU`` (its parameters are the user's module's own), the user's module itself otherwise."""
        for rnn in self.rnns.values():
            rnn.borrow()  # a Parameter the user replaced since the last forward
        return [self.rnns.get(n) or self.module.get_submodule(n) for n in self.recurrent_names]

    @property
    def lstm_layers(self) -> list[nn.Module]:
        """The recurrent modules, under the name probe's analyses read (``lstm_parameters``: theta is their
        parameters)."""
        return self.recurrent_modules

    @property
    def hooked_cells(self) -> dict[str, HookedRecurrent]:
        """Each layer with per-step hooks, by its path (``lstm.layers.0``): those of named ``nn.LSTM`` / ``nn.GRU``."""
        return {f"{n}.layers.{k}": layer for n, m in zip(self.recurrent_names, self.recurrent_modules, strict=True)
                if isinstance(m, HookedRNN) for k, layer in enumerate(m.layers)}

    def state_hooks(self) -> list[str]:
        """The per-step state hooks of every hooked cell (``lstm.layers.0.hook_h``, ``lstm.layers.0.hook_c``, ...)."""
        return [f"{path}.hook_{s}" for path, cell in self.hooked_cells.items() for s in cell.STATES]

    def probe_hooks(self) -> list[str]:
        """What a probe of the state reads by default: every per-step state, each named module's output (but that of
        a module that is not batch-first: its layout is [pos, batch, ...])."""
        named = [*self.recurrent_names, *self.attention_names, *self.resid_names]
        return [*self.state_hooks(), *(f"{n}.hook_out" for n in named
                                       if getattr(self.module.get_submodule(n), "batch_first", True) is not False)]

    def sublayer_outputs(self) -> dict[str, Sublayer]:
        """Each named recurrent and attention module's ``hook_out`` (attention's after the gate), in the order named
        (recurrent first), with the dimension that indexes the batch (1 for an ``nn.LSTM`` / ``nn.GRU`` or another
        module that says ``batch_first=False``): what path patching holds and component ablation zeroes. A module's
        output is only its first tensor output; paths that leave it another way (a returned state fed onwards) are
        not held, and the attributions' cross-position check says so when it matters."""
        def batch_dim(name: str) -> int:
            return 0 if getattr(self.module.get_submodule(name), "batch_first", True) is not False else 1

        return {**{f"{n}.hook_out": Sublayer("recurrent", batch_dim(n)) for n in self.recurrent_names},
                **{f"{n}.hook_out": Sublayer("attn", batch_dim(n)) for n in self.attention_names}}

    @property
    def attention_output_hooks(self) -> list[str]:
        return [f"{n}.hook_out" for n in self.attention_names]

    def _attention_sites(self) -> list[Site]:
        return [self._site(n) for n in self.attention_names]

    # --- what DAT and the gradient split act on ---------------------------------------------------------------------
    def attention_gates(self) -> list[float]:
        return [float(s.gate) for s in self._attention_sites()]

    def set_attention_gate(self, value: float | Sequence[float]) -> None:
        """Set every attention module's gate to ``value``, or the i-th named one's to ``value[i]``."""
        sites = self._attention_sites()
        values = [float(value)] * len(sites) if isinstance(value, (int, float)) else [float(v) for v in value]
        if len(values) != len(sites):
            raise ProbeError(f"{len(values)} gate values for {len(sites)} attention modules")
        for site, v in zip(sites, values, strict=True):
            site.gate.fill_(v)

    def set_attention_stopgrad(self, value: bool) -> None:
        """Detach (True) or not every tensor input of every attention module: the forward is unchanged, and no
        gradient reaches the rest of the model through attention."""
        for site in self._attention_sites():
            site.stopgrad = bool(value)

    @contextlib.contextmanager
    def attention_detached(self, which: Sequence[int] | None = None) -> Iterator[None]:
        """Within the block, the inputs of the ``which``-th named attention modules (None: every one) are detached
        (``set_attention_stopgrad``; what a schedule's gradient cut acts through); restored on exit."""
        sites = [s for i, s in enumerate(self._attention_sites()) if which is None or i in which]
        with attribute_set(sites, "stopgrad", True):
            yield

    def attention_parameters(self) -> list[nn.Parameter]:
        """Parameters of the named attention modules: what DAT holds back."""
        return list(dict.fromkeys(p for m in self.attention_modules for p in m.parameters()))

    def recurrent_parameters(self, which: int | None = None) -> list[nn.Parameter]:
        """Parameters of the named recurrent modules (with ``which``, the ``which``-th one's only): what a schedule's
        recurrent cut and freeze act on."""
        modules = self.recurrent_modules if which is None else self.recurrent_modules[which:which + 1]
        return list(dict.fromkeys(p for m in modules for p in m.parameters()))

    def random_init(self, seed: int) -> WrappedModel:
        """A copy with every submodule's parameters re-initialised from ``seed`` (each module's own
        ``reset_parameters``; gates kept): the random-init control of the probes. A parameter that no submodule can
        reset (a bare ``nn.Parameter``) is drawn from N(0, 0.02^2)."""
        # a module may keep a tensor of its last forward as a plain attribute (RecurrentGemma keeps its recurrent
        # state and keys), which deepcopy refuses while it is part of a graph: the copy gets it detached
        memo = {id(t): t.detach() for m in self.modules() for t in vars(m).values()
                if isinstance(t, Tensor) and t.grad_fn is not None}
        other = copy.deepcopy(self, memo)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            reset: set[int] = set()
            for m in other.module.modules():
                fn = getattr(m, "reset_parameters", None) or getattr(m, "_reset_parameters", None)
                if callable(fn) and not isinstance(m, WrappedModel):
                    fn()
                    reset |= {id(p) for p in m.parameters(recurse=False)}
            for p in other.module.parameters():
                if id(p) not in reset:
                    p.normal_(0.0, 0.02)
        return other.eval()


def wrap(model: nn.Module, attention: Sequence[str] = (), recurrent: Sequence[str] = (),
         resid: Sequence[str] = (), *, task: TaskConfig | None = None,
         forward_kwargs: dict[str, Any] | None = None) -> WrappedModel:
    """``model`` (token ids ``(batch, pos)`` -> logits ``(batch, pos, vocab)``, or an output with ``.logits``) as a
    ``HookedRootModule`` that probe's analyses take, given the paths of its attention and recurrent submodules (and
    optionally of residual-stream points, e.g. each block). Hook names and what is exposed: ``WrappedModel``.

    Each name is a path in ``model.named_modules()`` or an fnmatch pattern over them (``blocks.*.attn`` names every
    block's attention). ``task``: the task the model answers (the analyses' default); ``forward_kwargs``: passed to
    every call of ``model`` (``{"use_cache": False}`` for a transformers model). The model keeps its module tree,
    its ``state_dict`` keys and its train / eval mode; its named modules run through hooks until ``unwrap()`` (see
    ``WrappedModel``)."""
    if not attention and not recurrent:
        raise ProbeError("wrap needs the names of the model's attention and/or recurrent modules "
                         "(attention=[...], recurrent=[...])")
    wrapped = WrappedModel(model, attention, recurrent, resid, task=task, forward_kwargs=forward_kwargs)
    return wrapped.train(model.training)
