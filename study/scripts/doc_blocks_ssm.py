"""The blocks of study/docs/recurrent.md that quote the SSM grids (sweeps/ssm_boundary.toml, ssm_lr.toml,
ssm_complex10.toml): each a function of the committed results only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

BLOCKS: dict[str, Callable[[Path], str]] = {}
