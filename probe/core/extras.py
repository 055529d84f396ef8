"""Optional extras: a feature that needs a package only it uses imports it here, and a missing one is one line."""

from __future__ import annotations

import importlib
from types import ModuleType

from probe.errors import ProbeError

EXTRAS = {
    "captum": ("attributions", "integrated gradients (python -m probe.attributions --ig)"),
    "ray": ("ray", "the Ray executor (python -m probe.sweep --executor ray)"),
}
"""Import name -> (the extra that installs it, the feature that needs it)."""


def install_line(extra: str) -> str:
    """The command that adds ``extra`` to an installed probe (a checkout's editable install or the package)."""
    return f"pip install 'probe-hybrids[{extra}]' (from a checkout: pip install -e '.[{extra}]')"


def require(module: str) -> ModuleType:
    """Import an optional dependency, or refuse in one line naming the feature and the ``pip install`` that adds it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        extra, feature = EXTRAS[top]
        raise ProbeError(f"{feature} needs {top}, an optional extra: {install_line(extra)}") from None
