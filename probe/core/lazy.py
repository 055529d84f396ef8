"""Lazy package exports: ``python -m probe.NAME --help`` must not pay for importing every analysis module."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a package whose public ``names`` (name -> its submodule, or a module's
    full dotted name for a name the package re-exports from a floor below) are imported on first use (PEP 562)."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = names[name] if "." in names[name] else f"{package}.{names[name]}"
        value = getattr(importlib.import_module(module), name)
        importlib.import_module(package).__dict__[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
