"""The blocks of study/docs/mechanism.md that quote results/coadaptation2/ (sweeps/coadaptation2.toml: the controls
that tell co-adaptation from "a mismatched injected gradient harms"): each a function of the committed results only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

BLOCKS: dict[str, Callable[[Path], str]] = {}
