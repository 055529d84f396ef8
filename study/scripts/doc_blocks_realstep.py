"""The blocks of study/docs/gradients.md that quote the lookahead at the optimizer's real step
(study/results/gradients/realstep/, from study/scripts/realstep_lookahead.py on the runs of sweeps/realstep.toml):
each a function of the committed results only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

BLOCKS: dict[str, Callable[[Path], str]] = {}
