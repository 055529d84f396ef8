"""``probe.wrap_hf``: the transformers library's hybrids (RecurrentGemma, Jamba, Falcon-H1) wrapped by module class."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from probe.errors import ProbeError
from probe.tasks import TaskConfig
from probe.wrapped import WrappedModel, wrap

Kinds = tuple[Callable[[str], bool], Callable[[str], bool]]

KNOWN: dict[str, tuple[str, Kinds]] = {
    # model_type: (what it is, (is an attention module's class name, is a recurrent module's class name))
    "recurrent_gemma": ("RecurrentGemma / Griffin: RG-LRU blocks and local attention",
                        (lambda c: c.startswith("RecurrentGemma") and c.endswith("Attention"),
                         lambda c: c == "RecurrentGemmaRecurrentBlock")),
    "jamba": ("Jamba: Mamba mixers and attention",
              (lambda c: c.startswith("Jamba") and "Attention" in c and "DecoderLayer" not in c,
               lambda c: c == "JambaMambaMixer")),
    "falcon_h1": ("Falcon-H1: a Mamba-2 mixer beside attention in every layer",
                  (lambda c: c.startswith("FalconH1") and c.endswith("Attention"),
                   lambda c: c == "FalconH1Mixer")),
}
"""The architectures ``wrap_hf`` knows, by ``config.model_type``. Class names are matched rather than classes
imported, so that the attention variants a transformers version adds (``...SdpaAttention``) are found too."""


def hf_modules(model: nn.Module) -> tuple[list[str], list[str], list[str]]:
    """The paths of the attention modules, the recurrent modules and the decoder layers (the residual stream after
    each) of a transformers RecurrentGemma, Jamba or Falcon-H1 model, in the model's order."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in KNOWN:
        known = ", ".join(f"{k} ({v[0].split(':')[0]})" for k, v in KNOWN.items())
        raise ProbeError(f"wrap_hf knows {known}, not {model_type or type(model).__name__!r}: wrap it with "
                         "probe.wrap(model, attention=[...], recurrent=[...]) and the paths of its modules")
    is_attention, is_recurrent = KNOWN[model_type][1]
    attention, recurrent, layers = [], [], []
    for name, module in model.named_modules():
        cls = type(module).__name__
        if is_attention(cls):
            attention.append(name)
        elif is_recurrent(cls):
            recurrent.append(name)
        elif cls.endswith("DecoderLayer"):
            layers.append(name)
    if not attention or not recurrent:
        raise ProbeError(f"{type(model).__name__}: found {len(attention)} attention and {len(recurrent)} recurrent "
                         f"modules; a {model_type} model this transformers version builds differently: use probe.wrap "
                         "with the module paths")
    return attention, recurrent, layers


def wrap_hf(model: nn.Module, task: TaskConfig | None = None) -> WrappedModel:
    """A transformers RecurrentGemma, Jamba or Falcon-H1 model (``...ForCausalLM``, built from a config or loaded)
    wrapped with ``probe.wrap``: its attention modules, its recurrent modules (the RG-LRU recurrent block, the Mamba
    mixers) and each decoder layer's output as the residual stream. The recurrent modules are not ``nn.LSTM`` /
    ``nn.GRU``, so they have module-level hooks (``hook_in``, ``hook_out``) only. Every call passes
    ``use_cache=False`` (an analysis runs whole sequences, never a generation cache). Any other architecture is
    refused in one line that lists the known ones."""
    attention, recurrent, layers = hf_modules(model)
    return wrap(model, attention=attention, recurrent=recurrent, resid=layers, task=task,
                forward_kwargs={"use_cache": False})
