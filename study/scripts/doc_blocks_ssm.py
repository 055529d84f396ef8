"""The blocks of study/docs/recurrent.md and gradients.md that quote the SSM grids (sweeps/ssm_boundary.toml,
ssm_lr.toml, ssm_complex10.toml) and the lookahead at the optimizer's real step (sweeps/realstep.toml): each a
function of the committed results only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

BLOCKS: dict[str, Callable[[Path], str]] = {}
