"""``probe.bridge``: any hybrid TransformerLens's ``TransformerBridge`` bridges, booted offline and analysed by probe.

>>> import probe
>>> from probe.tasks import make_task
>>> task = make_task("modsum", train_length=8)
>>> tl = probe.bridge.boot("mamba2", task, d_model=32, n_layers=2)  # a TransformerBridge, no download
>>> model = probe.bridge.wrap(tl, task)  # what probe's analyses take, on the bridge's own hook names
>>> model.recurrent_names, model.attention_names
(['blocks.0.mixer', 'blocks.1.mixer'], [])
>>> model.state_sites()  # each Mamba-2 scan's state after every position, [batch, pos, features]
['blocks.0.mixer.scan.hook_state', 'blocks.1.mixer.scan.hook_state']

``boot`` builds a small transformers model of a named architecture from a config (random weights, vocabulary = the
task's), saves a ``tokenizers`` WordLevel tokenizer over that vocabulary to a temporary folder and returns
``TransformerBridge.boot_transformers(folder, hf_model=model, tokenizer=...)``: nothing is downloaded. ``wrap`` gives
the bridge the interface of a ``probe.wrap``-ped model (``BridgedModel``): its attention components
(``blocks.{i}.attn``), its recurrent mixers (``blocks.{i}.mixer``, ``blocks.{i}.linear_attn``, ...) and each block's
output as the residual stream, with a gate on each attention output so DAT trains it, and each recurrent state per
position (``BridgedModel.state_sites``; ``ScanState``: a Mamba / Mamba-2 scan's, read and set causally, a gated
DeltaNet's, read) for the probes and the state interchange. ``ARCHS`` lists the
architectures ``boot`` builds; the table in ``docs/bridge.md`` says which analysis runs on which.
``BridgeModelConfig`` is one of them as a model config, what probe's trainer builds (the ``bridge-*`` presets) and a
checkpoint records (the whole transformers config, so it rebuilds offline).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from probe.core.gates import attribute_set
from probe.errors import ProbeError
from probe.external import WrappedSizes
from probe.models.hooked import Sublayer
from probe.models.recurrent import listened
from probe.wrapped import HookedRNN, WrappedConfig, WrappedModel

# --- tiny configs, one per architecture -----------------------------------------------------------------------------
Fields = Callable[[int, int, int], dict[str, Any]]


def _alternate(n_layers: int, recurrent: str, attention: str) -> list[str]:
    # recurrent first, then attention, repeated: two layers give one of each, as probe's 2-block hybrid has
    return [(recurrent, attention)[i % 2] for i in range(n_layers)]


def _heads(d: int) -> int:
    return max(1, d // 16)


ARCHS: dict[str, tuple[str, Fields]] = {
    # name: (transformers class prefix, (d_model, n_layers, vocab) -> config fields)
    "jamba": ("Jamba", lambda d, n, v: dict(
        hidden_size=d, intermediate_size=2 * d, num_hidden_layers=n, num_attention_heads=_heads(d),
        num_key_value_heads=_heads(d), attn_layer_period=2, attn_layer_offset=1, num_experts=1,
        num_experts_per_tok=1, expert_layer_period=1, expert_layer_offset=0, mamba_d_state=8, mamba_d_conv=4,
        mamba_expand=2, mamba_dt_rank=max(1, d // 16))),
    "qwen3-next": ("Qwen3Next", lambda d, n, v: dict(
        hidden_size=d, intermediate_size=2 * d, num_hidden_layers=n, num_attention_heads=_heads(d),
        num_key_value_heads=1, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, mlp_only_layers=list(range(n)),
        layer_types=_alternate(n, "linear_attention", "full_attention"))),
    "falcon-h1": ("FalconH1", lambda d, n, v: dict(
        hidden_size=d, intermediate_size=2 * d, num_hidden_layers=n, num_attention_heads=_heads(d),
        num_key_value_heads=_heads(d), head_dim=16, mamba_d_ssm=2 * d, mamba_n_heads=2 * d // 16, mamba_d_head=16,
        mamba_d_state=8, mamba_d_conv=4, mamba_n_groups=1, mamba_chunk_size=16)),
    "nemotron-h": ("NemotronH", lambda d, n, v: dict(
        hidden_size=d, intermediate_size=2 * d, num_hidden_layers=n, num_attention_heads=_heads(d),
        num_key_value_heads=_heads(d), head_dim=16, ssm_state_size=8, mamba_num_heads=2 * d // 16,
        mamba_head_dim=16, n_groups=1, chunk_size=16,
        layers_block_type=_alternate(n, "mamba", "attention"))),
    "lfm2": ("Lfm2", lambda d, n, v: dict(
        hidden_size=d, intermediate_size=2 * d, num_hidden_layers=n, num_attention_heads=_heads(d),
        num_key_value_heads=_heads(d), block_auto_adjust_ff_dim=False,
        layer_types=_alternate(n, "conv", "full_attention"))),
    "mamba2": ("Mamba2", lambda d, n, v: dict(
        hidden_size=d, num_hidden_layers=n, num_heads=2 * d // 16, head_dim=16, expand=2, state_size=8,
        n_groups=1, chunk_size=16)),
    "mamba": ("Mamba", lambda d, n, v: dict(
        hidden_size=d, num_hidden_layers=n, state_size=8, expand=2, time_step_rank=max(1, d // 16),
        use_mambapy=False)),
    "falcon-mamba": ("FalconMamba", lambda d, n, v: dict(
        hidden_size=d, num_hidden_layers=n, state_size=8, expand=2, time_step_rank=max(1, d // 16))),
    "rwkv": ("Rwkv", lambda d, n, v: dict(
        hidden_size=d, attention_hidden_size=d, intermediate_size=2 * d, num_hidden_layers=n, context_length=1024)),
    "recurrentgemma": ("RecurrentGemma", lambda d, n, v: dict(
        hidden_size=d, intermediate_size=2 * d, num_hidden_layers=n, num_attention_heads=_heads(d),
        num_key_value_heads=1, head_dim=16, lru_width=d, attention_window_size=2048,
        block_types=_alternate(n, "recurrent", "attention"))),
    "bamba": ("Bamba", lambda d, n, v: dict(
        hidden_size=d, intermediate_size=2 * d, num_hidden_layers=n, num_attention_heads=_heads(d),
        num_key_value_heads=_heads(d), attn_layer_indices=list(range(1, n, 2)), mamba_n_heads=2 * d // 16,
        mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=16)),
    "granitemoehybrid": ("GraniteMoeHybrid", lambda d, n, v: dict(
        hidden_size=d, intermediate_size=2 * d, num_hidden_layers=n, num_attention_heads=_heads(d),
        num_key_value_heads=_heads(d), num_local_experts=0, shared_intermediate_size=2 * d,
        position_embedding_type="rope",  # the bridge's adapter maps a rotary module, which None leaves out
        layer_types=_alternate(n, "mamba", "attention"), mamba_n_heads=2 * d // 16, mamba_d_head=16,
        mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=16)),
    "olmo-hybrid": ("OlmoHybrid", lambda d, n, v: dict(
        hidden_size=d, intermediate_size=2 * d, num_hidden_layers=n, num_attention_heads=_heads(d),
        num_key_value_heads=_heads(d), linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=16, layer_types=_alternate(n, "linear_attention", "full_attention"))),
}
"""The architectures ``boot`` builds, by name. Each config is small and consistent: two layers give one recurrent
and one attention layer (a pure recurrence, Mamba / Mamba-2 / RWKV, has no attention), MLPs 2x wide, one expert
where the architecture has experts (dense MLPs, as probe's are), head width 16, state width 8."""

NO_SPECIAL_TOKENS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
"""Every token id is a task token: a pad id would make its embedding row a padding row (zero, never trained)."""


def _vocab_size(task: Any, vocab_size: int | None) -> int:
    size = vocab_size if vocab_size is not None else getattr(task, "vocab_size", None)
    if not isinstance(size, int) or size < 2:
        raise ProbeError("probe.bridge.boot needs the vocabulary: pass a task (with a vocab_size) or vocab_size=N")
    return size


def config_fields(arch: str, vocab_size: int, d_model: int = 32, n_layers: int = 2, **fields: Any) -> dict[str, Any]:
    """The whole transformers config of ``arch``'s tiny model (``ARCHS``) at this width, depth and vocabulary, with
    no special token ids (``NO_SPECIAL_TOKENS``); ``fields`` override any of it."""
    if arch not in ARCHS:
        raise ProbeError(f"probe.bridge builds {', '.join(ARCHS)}, not {arch!r}; a model you built yourself goes "
                         "straight to TransformerBridge.boot_transformers(name, hf_model=model, tokenizer=...)")
    if d_model % 16 or d_model < 16:
        raise ProbeError(f"d_model={d_model}: give a multiple of 16 (heads and SSM heads are 16 wide)")
    return {"vocab_size": vocab_size, **ARCHS[arch][1](d_model, n_layers, vocab_size), **NO_SPECIAL_TOKENS, **fields}


def hf_model(arch: str, vocab_size: int, d_model: int = 32, n_layers: int = 2, seed: int | None = 0, *,
             recurrent: str = "native", **fields: Any) -> nn.Module:
    """The transformers ``...ForCausalLM`` of ``arch`` (``ARCHS``) built from ``config_fields`` with random weights
    drawn from ``seed`` (None: from torch's random state as it is, as a trainer seeds it), in eval mode, its
    ``config.architectures`` set (what the bridge reads to pick its adapter). ``fields`` override the config's;
    ``recurrent`` ``lstm`` / ``gru`` puts an ``nn.LSTM`` / ``nn.GRU`` in each recurrent layer's place
    (``with_cell``)."""
    return _from_fields(arch, config_fields(arch, vocab_size, d_model, n_layers, **fields), seed, recurrent)


def _from_fields(arch: str, fields: dict[str, Any], seed: int | None, recurrent: str = "native") -> nn.Module:
    import transformers

    check_cell(arch, recurrent)
    prefix = ARCHS[arch][0]
    config = getattr(transformers, f"{prefix}Config")(**fields)
    config.architectures = [f"{prefix}ForCausalLM"]
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        model = getattr(transformers, f"{prefix}ForCausalLM")(config)
        if recurrent != "native":  # drawn in the same stream: the seed gives the same cell weights every time
            with_cell(model, arch, recurrent)
    return model.eval()


# --- an nn.LSTM / nn.GRU in a bridged architecture's layout ---------------------------------------------------------
CELLS = ("native", "lstm", "gru")
"""What a bridged model's recurrent layers run: the architecture's own mixer, or an ``nn.LSTM`` / ``nn.GRU``."""
CELL_SLOTS = {"nemotron-h": "mixer", "olmo-hybrid": "linear_attn"}
"""The architectures whose recurrent mixer an ``nn.LSTM`` / ``nn.GRU`` can take the place of, and the attribute of a
transformers layer that holds it. TransformerLens maps these mixers' inner modules (``in_proj``, ``conv1d``, ...) as
optional, so the bridge boots with a mixer that has none of them; its adapters for Jamba, Qwen3-Next, Bamba,
Falcon-H1, GraniteMoeHybrid and LFM2 require them (booting raises AttributeError: no ``in_proj``)."""


def check_cell(arch: str, recurrent: str) -> None:
    """One line where ``recurrent`` is not a cell of ``CELLS`` or ``arch`` has no slot for it (``CELL_SLOTS``)."""
    if recurrent not in CELLS:
        raise ProbeError(f"recurrent={recurrent!r}: choose one of {', '.join(CELLS)}")
    if recurrent != "native" and arch not in CELL_SLOTS:
        raise ProbeError(f"recurrent={recurrent}: an nn.{recurrent.upper()} takes the place of the recurrent mixer of "
                         f"{' or '.join(CELL_SLOTS)} only; TransformerLens's adapter for {arch} requires the mixer's "
                         "own inner modules (in_proj, ...), which an LSTM does not have")


class RecurrentMixer(nn.Module):
    """An ``nn.LSTM`` or ``nn.GRU`` (one layer, hidden = d_model, batch-first) in a transformers layer's recurrent
    mixer slot, called as the mixer it replaces is (``hidden_states`` [batch, pos, d_model] first, the cache and the
    masks by keyword) and returning the recurrence's output sequence [batch, pos, d_model], as the paper's block adds
    the LSTM's output to the residual stream (no output projection). A 2-D attention mask zeroes the padded
    positions' inputs, as the Mamba mixers do; the cache is not used, so a forward always runs the whole sequence
    (token-by-token generation does not carry the state)."""

    def __init__(self, cell: str, d_model: int) -> None:
        super().__init__()
        self.cell = cell
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(d_model, d_model, batch_first=True)

    def forward(self, hidden_states: Tensor, *args: Any, attention_mask: Tensor | None = None,
                **kwargs: Any) -> Tensor:
        if attention_mask is not None and attention_mask.dim() == 2:
            hidden_states = hidden_states * attention_mask[..., None].to(hidden_states.dtype)
        return self.rnn(hidden_states)[0]


def with_cell(model: nn.Module, arch: str, cell: str) -> nn.Module:
    """``model`` (a transformers ``arch`` model) with each recurrent layer's mixer (``CELL_SLOTS``; an attention or
    MLP in the same slot is kept) replaced, in place, by a fresh ``RecurrentMixer`` running ``cell``."""
    check_cell(arch, cell)
    slot = CELL_SLOTS[arch]
    for layer in model.model.layers:
        mixer = getattr(layer, slot, None)
        if mixer is not None and not type(mixer).__name__.endswith(("Attention", "MLP", "MoE")):
            setattr(layer, slot, RecurrentMixer(cell, model.config.hidden_size))
    return model


def word_tokenizer(vocab_size: int, folder: str) -> Any:
    """A ``tokenizers`` WordLevel tokenizer whose words are the token ids ``"0" .. "V-1"``, saved to ``folder`` and
    read back from it (the bridge's tokenizer set-up reads the name it was loaded from). Analyses pass token ids, so
    it is only what the bridge requires to exist."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {str(i): i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(words, unk_token="0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="0").save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)


def boot(arch: str, task: Any = None, *, vocab_size: int | None = None, d_model: int = 32, n_layers: int = 2,
         seed: int | None = 0, device: str = "cpu", recurrent: str = "native", **fields: Any) -> Any:
    """A ``TransformerBridge`` over a fresh ``arch`` model (``hf_model``; ``recurrent`` ``lstm`` / ``gru``: with an
    ``nn.LSTM`` / ``nn.GRU`` in each recurrent layer's place) sized for ``task``'s vocabulary, booted with no
    download: ``TransformerBridge.boot_transformers(folder, hf_model=..., tokenizer=...)`` on a temporary folder
    holding the tokenizer. Its logits are the transformers model's (tested per architecture)."""
    size = _vocab_size(task, vocab_size)
    return _boot(arch, hf_model(arch, size, d_model, n_layers, seed, recurrent=recurrent, **fields), size, device)


def _boot(arch: str, model: nn.Module, vocab_size: int, device: str = "cpu") -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    with tempfile.TemporaryDirectory() as folder, _offline():
        tokenizer = word_tokenizer(vocab_size, folder)
        bridge = TransformerBridge.boot_transformers(folder, hf_model=model, tokenizer=tokenizer, device=device)
    bridge.probe_arch = arch
    return bridge.eval()


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    # boot_transformers is handed the model and the tokenizer; offline mode makes sure nothing else is fetched
    before = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = before


# --- the bridge as a model probe's analyses take --------------------------------------------------------------------
RECURRENT_KEYS = ("mixer", "mamba", "linear_attn", "conv", "time_mix")
"""A block's component keys that hold its non-attention token mixer (a Mamba / Mamba-2 mixer, a gated DeltaNet, LFM2's
short convolution, RWKV's time mixing), unless the module it wraps is an attention (Nemotron-H keys both ``mixer``)."""


@dataclass(frozen=True)
class Component:
    """One attention or recurrent component of a bridged block: its name (``blocks.{i}.attn``), its index ``block``
    and ``kind``: ``attention``, or the recurrence it runs: ``mamba`` (Mamba-1's selective scan), ``mamba2`` (SSD),
    ``gated-delta`` (a gated DeltaNet), ``lstm`` / ``gru`` (a ``RecurrentMixer``), ``conv`` (a finite short
    convolution), ``opaque`` (a component the bridge exposes by its input and output only)."""

    name: str
    block: int
    kind: str
    module: nn.Module


def _kind(key: str, component: nn.Module) -> str:
    from transformer_lens.model_bridge.generalized_components import (
        AttentionBridge,
        GatedDeltaNetBridge,
        SSM2MixerBridge,
        SSMMixerBridge,
    )

    original = getattr(component, "original_component", None)
    if isinstance(original, RecurrentMixer):
        return original.cell
    wrapped = type(original).__name__
    # Nemotron-H keys its attention "mixer" too; RWKV's time mixing is a recurrence whatever its class is called
    is_attention = key not in ("time_mix", "linear_attn") and wrapped.endswith("Attention")
    if isinstance(component, AttentionBridge) or is_attention:
        return "attention"
    if isinstance(component, SSMMixerBridge):
        return "mamba"
    if isinstance(component, SSM2MixerBridge):
        return "mamba2"
    if isinstance(component, GatedDeltaNetBridge):
        return "gated-delta"
    return "conv" if key == "conv" else "opaque"


def components(bridge: Any) -> list[Component]:
    """Every attention and recurrent component of ``bridge``'s blocks, in block order (a block may hold both, as
    Falcon-H1's do). Absent optional components (Jamba's attention in a Mamba layer) are skipped."""
    found = []
    for i, block in enumerate(bridge.blocks):
        for key in block.submodules or {}:
            if key != "attn" and key not in RECURRENT_KEYS:
                continue
            try:
                module = getattr(block, key)
            except AttributeError:
                continue
            if module is None or getattr(module, "original_component", None) is None:
                continue
            found.append(Component(f"blocks.{i}.{key}", i, _kind(key, module), module))
    return found


class _Gate(nn.Module):
    """One attention component's gate (multiplies its ``hook_out`` before any user hook sees it, as probe's own
    blocks gate attention before ``hook_attn_out``) and stop-gradient switch (its ``hook_in`` detached)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("gate", torch.ones(()))
        self.stopgrad = False

    def out(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return self.gate.to(output.dtype) * output

    def inp(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return output.detach() if self.stopgrad else output


STATE_WIDTH = 4096
"""The most features per position a scan's state site shows as they are; a larger state (channels x state size,
heads x head width x state size) is shown through a fixed random projection onto this many directions
(``ScanState``), never subsampled."""


class BridgedModel(WrappedModel):
    """A ``TransformerBridge`` as a model probe's analyses take: the interface of ``probe.wrap``'s ``WrappedModel``
    (attention and recurrent names, gates, parameters, sublayer outputs), on the bridge's own hook names.

    - attention: each ``blocks.{i}.attn`` (Nemotron-H: the ``blocks.{i}.mixer`` that wraps an attention); its
      ``hook_out`` is after the gate, its ``hook_in`` is what the gradient split detaches;
    - recurrent: each ``blocks.{i}.mixer`` / ``.mamba`` / ``.linear_attn`` / ``.conv`` / ``.time_mix``;
    - residual stream: each block's ``blocks.{i}.hook_out``;
    - every hook the bridge has, by its canonical name (``blocks.0.mixer.in_proj.hook_out``; aliases such as
      ``hook_ssm_decay`` are left out so that nothing is cached twice), and ``hook_logits``.

    The recurrent state per position (``state_sites``): a Mamba / Mamba-2 mixer's scan state is
    ``blocks.{i}.mixer.scan.hook_state`` ``[batch, pos, features]`` (``ScanState``: read from TransformerLens's
    eager scan, at most ``state_width`` features, a fixed random projection above), set causally by its
    ``override_state``; a gated DeltaNet's (``blocks.{i}.linear_attn.scan.hook_state``) is read only
    (``state_reason``). An ``nn.LSTM`` / ``nn.GRU`` in a recurrent layer's place (``RecurrentMixer``, ``boot(...,
    recurrent="lstm")``) is served as ``probe.wrap`` serves one (``HookedRNN``, on its own Parameters, names
    unchanged): ``blocks.{i}.mixer.layers.0.hook_h`` / ``hook_c`` / gates per position, ``[batch, pos, d_model]``,
    and causal state edits. ``hooked_cells``: every state that can be set, the cells probe's interventions act on.
    """

    def __init__(self, bridge: Any, task: Any = None, state_width: int = STATE_WIDTH) -> None:
        HookedRootModule.__init__(self)  # not WrappedModel's: no Site hooks are put on the bridge's components
        self.module = bridge
        self.task = task
        self.forward_kwargs: dict[str, Any] = {}
        self.unwrapped = False
        self.components = components(bridge)
        # an nn.LSTM / nn.GRU mixer's forward served by probe's hooked cells (as probe.wrap serves one), keyed by the
        # component's name: a plain dict, so that its Parameters are not in this wrapper's state_dict twice
        self.rnns: dict[str, HookedRNN] = {}
        for c in self.components:
            if c.kind in ("lstm", "gru"):
                rnn = c.module.original_component.rnn
                self.rnns[c.name] = HookedRNN(rnn, f"{c.name}.rnn")
                rnn.forward = self.rnns[c.name].forward
        # each readable scan's state per position, by its path (held outside the module tree, as the rnns are)
        self.scans = {f"{c.name}.scan": ScanState(c, state_width) for c in self.components
                      if c.kind in (*SETTABLE, "gated-delta") and not state_reason(c)}
        attention = [c for c in self.components if c.kind == "attention"]
        recurrent = [c for c in self.components if c.kind != "attention"]
        if not self.components:
            arch = getattr(bridge, "probe_arch", type(bridge.original_model).__name__)
            raise ProbeError(f"{arch}: TransformerLens bridges it at the block level only (blocks.{{i}}.hook_in / "
                             "hook_out), so it has no attention or recurrent component to split, gate or patch; "
                             "probe.wrap_hf wraps its modules instead")
        self.attention_names = [c.name for c in attention]
        self.recurrent_names = [c.name for c in recurrent]
        self.resid_names = [f"blocks.{i}" for i in range(len(bridge.blocks))]
        self.gates = nn.ModuleList([_Gate() for _ in attention])
        self._handles = []
        for c, gate in zip(attention, self.gates, strict=True):
            self._handles += [c.module.hook_out.register_forward_hook(gate.out),
                              c.module.hook_in.register_forward_hook(gate.inp)]
        self.hook_logits = HookPoint()  # [batch, pos, vocab]
        self.cfg = WrappedConfig(tuple(self.attention_names), tuple(self.recurrent_names), tuple(self.resid_names),
                                 vocab_size=int(bridge.cfg.d_vocab), d_model=int(bridge.cfg.d_model),
                                 n_heads=int(getattr(bridge.cfg, "n_heads", 1) or 1), family="bridge", rnn="bridge")
        self.setup()

    def setup(self) -> None:
        """The bridge's hook points under the names the bridge gives them, and ``hook_logits``."""
        self.hook_logits.name = "hook_logits"
        own = {n: h for n, h in self.module.hook_dict.items() if getattr(h, "name", None) == n}
        cells = {f"{path}.{sub}": h for path, rnn in self.rnns.items() for sub, h in rnn.named_modules()
                 if isinstance(h, HookPoint)}
        cells |= {f"{path}.hook_state": scan.hook_state for path, scan in self.scans.items()}
        for name, h in cells.items():
            h.name = name
        self.hook_dict = {**own, **cells, "hook_logits": self.hook_logits}
        self.mod_dict = dict(self.hook_dict)

    def unwrap(self) -> Any:
        """Remove the gates and the served LSTM / GRU forwards and return the bridge."""
        for handle in self._handles:
            handle.remove()
        for rnn in self.rnns.values():
            del rnn.source.forward
        for scan in self.scans.values():
            scan.remove()
        self.unwrapped = True
        return self.module

    @property
    def attention_modules(self) -> list[nn.Module]:
        return [c.module for c in self.components if c.kind == "attention"]

    @property
    def recurrent_modules(self) -> list[nn.Module]:
        """Each recurrent component as it runs: the ``HookedRNN`` serving an LSTM / GRU mixer (its parameters are
        the mixer's, all of them), the bridge's component otherwise."""
        for rnn in self.rnns.values():
            rnn.borrow()
        return [self.rnns.get(c.name) or c.module for c in self.components if c.kind != "attention"]

    def attention_gates(self) -> list[float]:
        return [float(g.gate) for g in self.gates]

    def set_attention_gate(self, value: float | Sequence[float]) -> None:
        values = [float(value)] * len(self.gates) if isinstance(value, (int, float)) else [float(v) for v in value]
        if len(values) != len(self.gates):
            raise ProbeError(f"{len(values)} gate values for {len(self.gates)} attention components")
        for gate, v in zip(self.gates, values, strict=True):
            gate.gate.fill_(v)

    def set_attention_stopgrad(self, value: bool) -> None:
        for gate in self.gates:
            gate.stopgrad = bool(value)

    @contextlib.contextmanager
    def attention_detached(self, which: Sequence[int] | None = None) -> Iterator[None]:
        with attribute_set([g for i, g in enumerate(self.gates) if which is None or i in which], "stopgrad", True):
            yield

    def sublayer_outputs(self) -> dict[str, Any]:
        return {f"{c.name}.hook_out": Sublayer("attn" if c.kind == "attention" else "recurrent", 0)
                for c in sorted(self.components, key=lambda c: c.kind == "attention")}

    @property
    def hooked_cells(self) -> dict[str, Any]:
        """Every recurrent state that can be set, by path, in block order: each layer of an ``nn.LSTM`` / ``nn.GRU``
        mixer (``blocks.0.mixer.layers.0``) and each Mamba / Mamba-2 scan (``blocks.0.mixer.scan``, a
        ``ScanState``): what the probes' interventions read (``{path}.hook_{s}`` for s in its ``STATES``) and set
        (its ``override_state``)."""
        cells = {**super().hooked_cells, **{p: s for p, s in self.scans.items() if s.settable}}
        return dict(sorted(cells.items(), key=lambda item: int(item[0].split(".")[1])))

    def state_sites(self, edit: bool = False) -> list[str]:
        """The hooks of every recurrent state that can be read per position (``edit``: set, the recurrence
        continuing from it); none: one line with each recurrent component's reason (``state_reason``)."""
        sites = self._states(edit)
        if not sites:
            recurrent = [c for c in self.components if c.kind != "attention"]
            raise ProbeError("; ".join(r for c in recurrent if (r := state_reason(c, edit)))
                             or "this bridged model has no recurrent component")
        return sites

    def _states(self, edit: bool = False) -> list[str]:
        return self.state_hooks() + [f"{p}.hook_state" for p, s in self.scans.items() if not (edit or s.settable)]

    def probe_hooks(self) -> list[str]:
        """Every recurrent state per position (``state_sites``), then each component's and block's output."""
        return [*self._states(), *(f"{n}.hook_out" for n in (*self.recurrent_names, *self.attention_names,
                                                              *self.resid_names))]


def wrap(bridge: Any, task: Any = None, state_width: int = STATE_WIDTH) -> BridgedModel:
    """``bridge`` (a ``TransformerBridge``, e.g. from ``boot``) as a ``BridgedModel`` that probe's analyses take;
    ``task``: the task it answers (the analyses' default); ``state_width``: the most features per position a scan's
    state site shows as they are (``ScanState``). One line where the bridge has no component to name."""
    from transformer_lens.model_bridge import TransformerBridge

    if isinstance(bridge, BridgedModel):
        raise ProbeError("this bridge is already wrapped: use it as it is")
    if not isinstance(bridge, TransformerBridge):
        raise ProbeError(f"probe.bridge.wrap takes a TransformerBridge, got a {type(bridge).__name__}; a model of "
                         "your own goes through probe.wrap(model, attention=[...], recurrent=[...])")
    return BridgedModel(bridge, task, state_width).train(bridge.training)


def model(arch: str, task: Any = None, **kwargs: Any) -> BridgedModel:
    """``wrap(boot(arch, task, **kwargs), task)``: a fresh bridged ``arch`` model, ready for any analysis."""
    return wrap(boot(arch, task, **kwargs), task)


# --- a bridged model as a config the trainer and checkpoints take --------------------------------------------------
NO_ATTENTION = ("mamba", "mamba2", "falcon-mamba", "rwkv")
"""The architectures of ``ARCHS`` that have no attention layer (a pure recurrence): a schedule other than joint does
nothing on them and is refused before any work, as on probe's ``lstm`` family."""


@dataclass(frozen=True)
class BridgeModelConfig(WrappedSizes):
    """A bridged architecture (``arch`` in ``ARCHS``) as a model config: what ``python -m probe.train`` builds (the
    ``bridge-*`` presets, ``--set model.arch=...``) and what a checkpoint records. ``transformers`` holds, once made,
    the whole transformers config (``config_fields`` at this width, depth and vocabulary, with the fields given
    there overriding), so a checkpoint rebuilds the model it was trained as, offline, even if ``ARCHS``'s tiny
    configs change later. The weights come from torch's random state when built (the trainer seeds it).
    ``recurrent``: ``native`` (the architecture's own mixer) or ``lstm`` / ``gru``, an ``nn.LSTM`` / ``nn.GRU`` in
    each recurrent layer's place (``with_cell``; ``CELL_SLOTS`` names the architectures that take one)."""

    arch: str = "jamba"
    d_model: int = 128
    n_layers: int = 2
    vocab_size: int = 0
    transformers: dict[str, Any] = field(default_factory=dict)
    recurrent: str = "native"
    family: str = "bridge"

    def __post_init__(self) -> None:
        given = dict(self.transformers)
        given.pop("vocab_size", None)  # the task's vocabulary wins: a recorded config holds it too
        object.__setattr__(self, "transformers", config_fields(self.arch, self.vocab_size, self.d_model,
                                                               self.n_layers, **given))
        check_cell(self.arch, self.recurrent)

    @property
    def name(self) -> str:
        return f"bridge-{self.arch}" + ("" if self.recurrent == "native" else f"-{self.recurrent}")

    @property
    def has_attention(self) -> bool:  # type: ignore[override]
        return self.arch not in NO_ATTENTION

    @property
    def n_heads(self) -> int:  # type: ignore[override]
        return int(self.transformers.get("num_attention_heads") or 1)

    def build(self, task: Any = None) -> BridgedModel:
        """The bridged model: the transformers model from ``transformers`` (random weights from torch's random
        state), booted offline and wrapped."""
        hf = _from_fields(self.arch, self.transformers, seed=None, recurrent=self.recurrent)
        model = wrap(_boot(self.arch, hf, self.vocab_size), task)
        model.source_config = self  # what its checkpoints record (checkpoint_from_model)
        return model


# --- the per-token transitions of a bridged recurrence ---------------------------------------------------------------
NO_TRANSITION = {
    "conv": "a short convolution keeps a finite window of inputs, not a state: it has no transition to read",
    "opaque": "the bridge exposes it by its input and output only (no decay, gate or beta hook), so its transition "
              "cannot be read",
    **{cell: f"not applicable: an {cell.upper()} is nonlinear (its gates read the state they update), so it has no "
             "per-token linear transition whose eigenvalues the diagnostic could read" for cell in ("lstm", "gru")},
}


def transition_reason(c: Component) -> str | None:
    """Why the per-token transition of recurrent component ``c`` cannot be read from the bridge's hooks, or None."""
    if c.kind in NO_TRANSITION:
        return f"{c.name}: {NO_TRANSITION[c.kind]}"
    if c.kind == "mamba2" and not c.name.endswith(".mixer"):
        # Falcon-H1 multiplies in_proj's output by a fixed mup vector before the split; TransformerLens's SSD
        # reconstruction (which reads blocks.{i}.mixer.in_proj) does not, so its dt would be the wrong one
        return (f"{c.name}: TransformerLens reconstructs a Mamba-2 step (dt) from blocks.{{i}}.mixer hooks only, and "
                "this mixer scales in_proj's output (mup) before the split")
    return None


@contextlib.contextmanager
def eager_scan(comps: Sequence[Component]) -> Iterator[None]:
    """TransformerLens's opt-in Python scan on each Mamba / Mamba-2 mixer: transformers' own scan reads ``dt_proj``'s
    weight and the convolution without calling them, so their hooks fire only on this path (its logits agree with
    the fused path's to float rounding, measured 4e-7 here)."""
    with attribute_set([c.module for c in comps if c.kind in ("mamba", "mamba2")], "eager_scan", True):
        yield


TRANSITION_HOOKS = {"mamba": ("dt_proj.hook_out",), "mamba2": ("in_proj.hook_out", "conv1d.hook_out"),
                    "gated-delta": ("hook_log_decay", "hook_beta")}
"""The hooks (inside the component) each readable recurrence's transition is read from (``transition``)."""


def transition(c: Component, cache: Mapping[str, Tensor]) -> Tensor:
    """The eigenvalues of component ``c``'s per-token transition from ``cache`` (its ``TRANSITION_HOOKS`` by full
    name; an ActivationCache or a plain dict), ``[batch, pos, ...]`` (``transition_eigenvalues`` says which)."""
    m = c.module
    if c.kind == "mamba":
        dt = torch.nn.functional.softplus(cache[f"{c.name}.dt_proj.hook_out"].float())  # [batch, pos, channel]
        return torch.exp(dt[..., None] * -torch.exp(m.A_log.float()))  # [batch, pos, channel, state]
    if c.kind == "mamba2":
        dt = m._ssd_terms(cache, c.block).dt  # [batch, pos, head]
        return torch.exp(dt * -torch.exp(m.A_log.float()))
    decay = torch.exp(cache[f"{c.name}.hook_log_decay"].float())  # [batch, pos, head]
    return torch.stack([decay, decay * (1 - cache[f"{c.name}.hook_beta"].float())], dim=-1)


@torch.no_grad()
def transition_eigenvalues(model: BridgedModel, tokens: Tensor) -> dict[str, Tensor]:
    """The eigenvalues of each recurrent component's per-token transition on ``tokens``, read from the bridge's
    hooks in one forward pass: ``{name: tensor [batch, pos, ...]}``, real (every recurrence bridged today has real
    transitions). Mamba-1: exp(dt_t[c] A[c, s]) per channel and state, dt = softplus(``dt_proj.hook_out``) and
    A = -exp(A_log), the mixer's own discretisation; Mamba-2: exp(dt_t[h] A[h]) per head, dt from TransformerLens's
    SSD reconstruction; gated DeltaNet: its transition exp(g_t)(I - beta_t k_t k_t^T) with k_t unit-norm (the kernel
    normalises it) has eigenvalues exp(g_t) (every direction orthogonal to k_t) and exp(g_t)(1 - beta_t) (along
    k_t), from ``hook_log_decay`` and ``hook_beta``. A component whose transition cannot be read: ProbeError."""
    recurrent = [c for c in model.components if c.kind != "attention"]
    reasons = [r for r in map(transition_reason, recurrent) if r]
    if not recurrent or len(reasons) == len(recurrent):
        raise ProbeError("; ".join(reasons) or "this bridged model has no recurrent component")
    readable = [c for c in recurrent if not transition_reason(c)]
    wanted = {f"{c.name}.{h}" for c in readable for h in TRANSITION_HOOKS[c.kind]}
    with eager_scan(readable):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in wanted)
    return {c.name: transition(c, cache) for c in readable}


def position_first(kind: str, x: Tensor) -> Tensor:
    """A scan tensor of TransformerLens's with its position axis second: Mamba-1's ``hook_ssm_state`` /
    ``hook_ssm_write`` are ``[batch, channel, pos, state]`` and swap (the swap is its own inverse); Mamba-2's
    ``[batch, pos, head, head_dim, state]`` and the gated DeltaNet's ``[batch, pos, head, k, v]`` already are."""
    return x.transpose(1, 2) if kind == "mamba" else x


@torch.no_grad()
def state_residual(model: BridgedModel, tokens: Tensor,
                   eigenvalues: Callable[[BridgedModel, Tensor], dict[str, Tensor]] | None = None) -> dict[str, float]:
    """Instrument check of ``transition_eigenvalues`` on each Mamba / Mamba-2 component (the ones whose scan state
    the bridge exposes, ``hook_ssm_state`` and ``hook_ssm_write`` on TransformerLens's eager scan): the largest
    |a_t * state_{t-1} + write_t - state_t| over every position, relative to the largest |state_t|. Near 0 when the
    transitions read are the ones the scan applied; a wrong dt or A (read from another hook, a wrong
    discretisation) leaves a residual of the state's own order. ``eigenvalues`` replaces the reader (a test feeds a
    broken one). ``{name: residual}``; empty where no component exposes its state."""
    read = eigenvalues or transition_eigenvalues
    comps = [c for c in model.components if c.kind in ("mamba", "mamba2") and not transition_reason(c)]
    if not comps:
        return {}
    eigs = read(model, tokens)
    hooks = {f"{c.name}.hook_ssm_{s}" for c in comps for s in ("state", "write")}
    with eager_scan(comps):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in hooks)
    out = {}
    for c in comps:
        a = eigs[c.name].float()
        state, write = (position_first(c.kind, cache[f"{c.name}.hook_ssm_{s}"].float()) for s in ("state", "write"))
        if c.kind == "mamba2":  # [batch, pos, head, head_dim, state]; a is per head
            a = a[..., None, None]
        predicted = a[:, 1:] * state[:, :-1] + write[:, 1:]
        out[c.name] = float((predicted - state[:, 1:]).abs().max() / state.abs().max().clamp(min=1e-30))
    return out


# --- the recurrent state of a bridged scan, per position -------------------------------------------------------------
PROJECTION_SEED = 0
"""The seed of that projection: the same directions for every model of the same state size (a random-init copy
too), so probes on the trained and on the random-init model read the same features."""

SETTABLE = ("mamba", "mamba2")
"""The scans whose state at position t can be set so that the recurrence continues from it: Mamba-1's and
Mamba-2's, through TransformerLens's ``hook_ssm_write``."""

NO_STATE = {
    "conv": "a short convolution keeps a finite window of inputs, not a recurrent state",
    "opaque": "the bridge exposes it by its input and output only (no state hook)",
}
NO_STATE_EDIT = ("TransformerLens's delta-rule scan shows its state after the scan only (hook_ssm_state: an edit "
                 "there changes the output at its own position, never the next state), and what enters the state "
                 "(k_t, v_t, beta_t) is a rank-one update per head, so no hook of the bridge sets S_t: its state is "
                 "probed, not set")
EDIT_AFTER_SCAN = ("{name} is read after TransformerLens's scan (hook_ssm_state, the state trajectory: an edit there "
                   "changes only the output at its own position, never the next state); {instead}")


def state_reason(c: Component, edit: bool = False) -> str | None:
    """Why recurrent component ``c``'s state at each position cannot be read (``edit``: set, the recurrence
    continuing from it) through the bridge's hooks, or None. An ``nn.LSTM`` / ``nn.GRU`` mixer has probe's own
    per-step hooks; a Mamba / Mamba-2 scan's state is read and set (``ScanState``), a gated DeltaNet's read only."""
    if c.kind in NO_STATE:
        return f"{c.name}: {NO_STATE[c.kind]}"
    if c.kind in ("mamba2", "mamba") and transition_reason(c):
        # Falcon-H1: the eager scan, the only path on which the state hooks fire, leaves out the mup scaling
        return (f"{c.name}: TransformerLens's eager scan (the only path on which its state hooks fire) does not "
                "apply this mixer's mup scaling of in_proj's output, so the state it would show is not the model's")
    if edit and c.kind == "gated-delta":
        return f"{c.name}: {NO_STATE_EDIT}"
    return None


class ScanState(nn.Module):
    """The state of one bridged Mamba / Mamba-2 / gated DeltaNet scan after each position, as a probe site, and
    (Mamba / Mamba-2) a causal edit of it: what ``probe.probes`` reads and sets on a hooked cell of probe's.

    ``hook_state`` ``[batch, pos, features]``: TransformerLens's ``hook_ssm_state`` (the scan's state trajectory,
    ``position_first``) flattened per position; above ``width`` features, its projection onto ``width`` fixed
    orthonormal random directions (``PROJECTION_SEED``). The state hooks fire only on TransformerLens's eager scan
    (a Python loop; its logits agree with the fused kernel's to float rounding), so the scan runs eagerly in a pass
    where ``hook_state`` has a hook or an override is active, and fused otherwise.

    ``hook_ssm_state`` is read after the loop: an edit there changes only the output at its own position, so an
    edit of ``hook_state`` by a hook is refused in one line. ``override_state(t, state)`` sets the state after
    position t through ``hook_ssm_write`` instead, which feeds the loop: with a_t the transition (``transition``,
    read from the same pass) and S the state the writes give, w_t becomes w_t + (state - S_t), so S_t is the given
    state and every later step continues from it; nothing before t changes. On a projected site the given state is
    ``width`` features and the edit moves S_t only within the projection's directions (the least change that makes
    the site read it). A gated DeltaNet's state is read only (``NO_STATE_EDIT``)."""

    STATES: ClassVar[tuple[str, ...]] = ("state",)

    def __init__(self, c: Component, width: int = STATE_WIDTH) -> None:
        super().__init__()
        self.component, self.width = c, width
        self.settable = c.kind in SETTABLE
        self.hook_state = HookPoint()  # [batch, pos, features]
        self._edits: dict[int, Tensor] = {}
        self._seen: dict[str, Tensor] = {}
        self._restore: bool | None = None
        self.projection: Tensor | None = None
        m = c.module
        self._handles = [m.register_forward_pre_hook(self._eager_if_needed),
                         m.register_forward_hook(self._restore_scan, always_call=True),
                         m.hook_ssm_state.register_forward_hook(self._read)]
        if self.settable:
            self._handles += [m.get_submodule(h).register_forward_hook(self._capture(f"{c.name}.{h}"))
                              for h in TRANSITION_HOOKS[c.kind]]
            self._handles.append(m.hook_ssm_write.register_forward_hook(self._write))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _eager_if_needed(self, module: nn.Module, args: tuple) -> None:
        if (listened(self.hook_state) or self._edits) and not module.eager_scan:
            self._restore, module.eager_scan = False, True

    def _restore_scan(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._restore is not None:
            module.eager_scan, self._restore = self._restore, None

    def _project(self, x: Tensor) -> Tensor:
        """``[..., features]`` -> the site's ``[..., width]`` (as it is where it has at most ``width`` features)."""
        if x.shape[-1] <= self.width:
            return x
        if self.projection is None or self.projection.shape[1] != x.shape[-1]:
            drawn = torch.randn(x.shape[-1], self.width, generator=torch.Generator().manual_seed(PROJECTION_SEED))
            self.projection = torch.linalg.qr(drawn).Q.T.contiguous()  # [width, features], orthonormal rows
        return x @ self.projection.to(x).T

    def _lift(self, d: Tensor, features: int) -> Tensor:
        """A change of the site's ``width`` features as the least change of the ``features`` it projects."""
        return d if features <= self.width else d @ self.projection.to(d)

    def _read(self, module: nn.Module, args: tuple, trajectory: Tensor) -> None:
        if not listened(self.hook_state):
            return
        flat = self._project(position_first(self.component.kind, trajectory).flatten(2))
        seen = self.hook_state(flat)
        if seen is not flat and not torch.equal(seen, flat):
            instead = ("set it with override_state (through hook_ssm_write, which the scan reads)" if self.settable
                       else "and no hook sets the delta rule's state (what enters it is a rank-one update per head): "
                            "it is probed, not set")
            raise ProbeError(EDIT_AFTER_SCAN.format(name=self.hook_state.name, instead=instead))

    def _capture(self, name: str) -> Callable[[nn.Module, tuple, Tensor], None]:
        def capture(module: nn.Module, args: tuple, output: Tensor) -> None:
            if self._edits:
                self._seen[name] = output
        return capture

    def _write(self, module: nn.Module, args: tuple, writes: Tensor) -> Tensor | None:
        """The writes with each overridden position's changed so that the state there is the one given."""
        if not self._edits:
            return None
        kind = self.component.kind
        a = transition(self.component, self._seen)  # [batch, pos, ...]
        a = a[..., None, None] if kind == "mamba2" else a
        w = position_first(kind, writes).clone()
        if max(self._edits) >= w.shape[1]:
            raise ProbeError(f"override_state at position {max(self._edits)} of a {w.shape[1]}-position sequence")
        features = w[:, 0].flatten(1).shape[1]
        s = torch.zeros_like(w[:, 0])
        for t in range(max(self._edits) + 1):  # the scan's own step: S_t = a_t S_{t-1} + w_t
            s = a[:, t] * s + w[:, t]
            if t in self._edits:
                given = self._edits[t].to(s)
                if given.shape != (s.shape[0], min(features, self.width)):
                    raise ProbeError(f"override_state: the state of {self.hook_state.name} is (batch, "
                                     f"{min(features, self.width)}) per position, got {tuple(given.shape)} for a "
                                     f"batch of {s.shape[0]}")
                delta = self._lift(given - self._project(s.flatten(1)), features).view_as(s)
                w[:, t] += delta
                s = s + delta
        self._seen = {}
        return position_first(kind, w)

    @contextlib.contextmanager
    def override_state(self, position: int, *states: Tensor) -> Iterator[None]:
        """Within the block, the state after ``position`` is ``states[0]`` (``(batch, features)``, as
        ``hook_state`` shows it) and the scan continues from it; nothing before ``position`` changes. Blocks nest
        (an inner one adds its position, wins where both set one). A gated DeltaNet: one line, nothing is set."""
        c = self.component
        if not self.settable:
            raise ProbeError(f"{c.name}: {NO_STATE_EDIT}")
        if not isinstance(position, int) or len(states) != 1:
            raise ProbeError(f"{c.name}: override_state(position, state) takes one position (an int) and one "
                             f"state (its STATES are {self.STATES}), got {position!r} and {len(states)} states")
        before = self._edits
        self._edits = {**before, position: states[0]}
        try:
            yield
        finally:
            self._edits = before
