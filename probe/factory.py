"""``package.module:factory`` wherever a CLI takes a checkpoint: a callable returning a wrapped model and its task."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from probe.checkpoint import Checkpoint, CheckpointError
from probe.core.specs import is_factory_spec
from probe.tasks import TaskConfig

__all__ = ["FactoryCheckpoint", "is_factory_spec", "load_factory"]


@dataclass
class FactoryCheckpoint(Checkpoint):
    """A live model from a factory, served to the analyses in place of a checkpoint file: no path, no training
    record (so no schedule gate and no optimizer moments), the model itself instead of a state dict."""

    model: Any = None
    spec: str = ""

    @property
    def name(self) -> str:
        return self.spec

    @property
    def label(self) -> str:
        return self.spec

    def build_model(self, device: torch.device | str = "cpu") -> Any:
        return self.model.to(device).eval()


def load_factory(spec: str) -> FactoryCheckpoint:
    """Import ``package.module``, call ``callable()`` and check that it returned ``(model, task)``: a wrapped model
    (``probe.wrap``, ``probe.wrap_hf``) or one of probe's, and a ``TaskConfig``. The current folder is importable,
    as for ``python -m``. Every failure is one line (``CheckpointError``)."""
    from probe.wrapped import WrappedModel

    module_name, _, attr = spec.partition(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise CheckpointError(f"{spec}: no such file, and module {module_name!r} cannot be imported ({e}); give a "
                              "checkpoint path or package.module:factory") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise CheckpointError(f"{spec}: module {module_name} has no callable {attr!r}")
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[1], TaskConfig)):
        raise CheckpointError(f"{spec}: the factory must return (model, task): a model from probe.wrap and a "
                              f"probe.tasks TaskConfig; it returned {type(made).__name__}")
    model, task = made
    if not isinstance(model, WrappedModel) and not hasattr(model, "blocks"):
        raise CheckpointError(f"{spec}: the factory's model is a {type(model).__name__}: wrap it with "
                              "probe.wrap(model, attention=[...], recurrent=[...]) first")
    if model.task is None:
        model.task = task
    return FactoryCheckpoint(path=None, model_config=model.cfg, task_config=task, state_dict={}, model=model,
                             spec=spec)
