"""What a checkpoint argument names: a file, or ``package.module:factory`` (a callable returning a wrapped model)."""

from __future__ import annotations

import re
from pathlib import Path

FACTORY_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
"""``package.module:callable``, as in entry points."""


def is_factory_spec(spec: str) -> bool:
    """Whether ``spec`` names a factory rather than a file: it reads ``package.module:callable`` and no such file
    exists. Cheap (no import of the models), so that CLIs can check their arguments before any work."""
    return bool(FACTORY_SPEC.match(spec)) and not Path(spec).exists()
