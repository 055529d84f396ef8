"""probe: why Transformer-RNN hybrids do or do not length-generalize, and Delayed Attention Training."""

import importlib
from typing import Any

from probe.core.lazy import lazy_exports

__version__ = "0.1.0"

# a user's own hybrid (probe/wrapped.py) and the transformers library's (probe/hf.py), imported on first use
_lazy_getattr, _lazy_dir = lazy_exports(__name__, {"wrap": "wrapped", "WrappedModel": "wrapped", "wrap_hf": "hf"})
__all__ = ["WrappedModel", "__version__", "wrap", "wrap_hf"]


def __getattr__(name: str) -> Any:
    """``probe.wrap`` and the others above; an analysis package on first use (``probe.gradients.interference``)."""
    try:
        return _lazy_getattr(name)
    except AttributeError:
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise
        return importlib.import_module(f"{__name__}.{name}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_lazy_dir()})
