"""A model's recurrent modules in the user's terms: each one's name and cell kind, for the labels of every analysis.

Duck-typed (no import of the models): a wrapped model names its recurrent modules (``recurrent_names``, the user's
own module paths), probe's own models hold their cell in each block's ``lstm`` slot and name its kind in
``cfg.rnn`` (``lstm``, ``gru``, ``ssm``), whatever the slot is called."""

from __future__ import annotations

from typing import Any

TORCH_CELLS = {"LSTM": "lstm", "GRU": "gru", "RNN": "rnn"}


def cell_kind(module: Any) -> str:
    """``lstm`` / ``gru`` / ``rnn`` for torch's recurrent modules, else the module's class name (a Mamba mixer, an
    RG-LRU, a user's own cell). A TransformerLens bridge component is named by the model's own module it wraps
    (``original_component``: ``NemotronHMamba2Mixer``, not the bridge's ``SSM2MixerBridge``), and a module that says
    which torch cell it runs (``cell``: probe.bridge's LSTM / GRU in a bridged layout) by that cell."""
    module = getattr(module, "original_component", None) or module
    cell = getattr(module, "cell", None)
    if isinstance(cell, str) and cell in TORCH_CELLS.values():
        return cell
    name = type(module).__name__
    return TORCH_CELLS.get(name, name)


def recurrent_modules(model: Any) -> list[tuple[str, str]]:
    """``(module path, cell kind)`` of each recurrent module, in the order the analyses count them (``block``)."""
    names = getattr(model, "recurrent_names", None)
    if names is not None:  # a wrapped model: the user's modules, as they named them
        return [(n, cell_kind(model.module.get_submodule(n))) for n in names]
    kind = str(getattr(getattr(model, "cfg", None), "rnn", "lstm"))
    return [(f"blocks.{i}.lstm", kind) for i, b in enumerate(getattr(model, "blocks", [])) if hasattr(b, "lstm")]


def is_recurrent_hook(hook: str, modules: list[tuple[str, str]]) -> bool:
    """Whether every part of ``hook`` (``a+b`` names a concatenation) is a hook inside a recurrent module."""
    return all(any(part.startswith(f"{name}.") for name, _ in modules) for part in hook.split("+"))


def cell_label(modules: list[tuple[str, str]]) -> str:
    """The cell kind(s) of a model in one word: ``gru``, or ``lstm/gru`` for a mix; ``none`` without any."""
    kinds = list(dict.fromkeys(k for _, k in modules))
    return "/".join(kinds) if kinds else "none"
