"""The notebooks' one setup call: inline figures at a small size, one thread, a seed, the shipped checkpoints."""

from __future__ import annotations

import base64
import io
import os
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from probe.errors import ProbeError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from probe.checkpoint import Checkpoint


@dataclass(frozen=True)
class Notebook:
    """What ``setup`` found: the repository ``root`` (relative to the working directory, so that paths printed in a
    notebook's outputs are the same on every machine) and the checkpoints it loaded, by name (``"hybrid-dat"``)."""

    root: Path
    checkpoints: dict[str, Checkpoint]

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    def path(self, name: str) -> Path:
        """The shipped checkpoint ``checkpoints/{name}.pt``."""
        return self.checkpoint_dir / f"{name}.pt"

    def __getitem__(self, name: str) -> Checkpoint:
        return self.checkpoints[name]


def find_root(start: Path | None = None) -> Path:
    """The nearest folder at or above ``start`` (default: the working directory) that holds ``checkpoints/``, relative
    to the working directory: a notebook runs from ``notebooks/`` in Jupyter (``..``) or from the repository root
    (``.``)."""
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "checkpoints").is_dir():
            return Path(os.path.relpath(folder))
    raise ProbeError(f"no checkpoints/ folder at or above {start}: start Jupyter inside the probe repository "
                     "(jupyter lab notebooks/)")


def _png(fig: Figure, dpi: int) -> str:
    """A figure as a base64 PNG of at most 256 colours: a third of the bytes of matplotlib's own PNG, so that
    notebooks committed with their outputs stay small."""
    from PIL import Image

    raw = io.BytesIO()
    fig.savefig(raw, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    out = io.BytesIO()
    Image.open(raw).convert("RGB").quantize(256).save(out, format="png", optimize=True)
    return base64.b64encode(out.getvalue()).decode("ascii")


def setup(*names: str, seed: int = 0, threads: int = 1, dpi: int = 80, start: Path | None = None) -> Notebook:
    """Inline figures at ``dpi`` as 256-colour PNGs (inside IPython, whatever ``MPLBACKEND`` says), ``threads`` torch
    threads, the global torch seed, and the shipped checkpoints ``names`` loaded (``setup("hybrid-dat", "lstm")``)."""
    import matplotlib as mpl
    from matplotlib.figure import Figure

    # transformer_lens imports tqdm.auto, which warns in a kernel without ipywidgets; nothing here shows a progress bar
    warnings.filterwarnings("ignore", message="IProgress not found")
    from probe.checkpoint import load_checkpoint

    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: keep matplotlib's backend
        get_ipython = None
    shell = get_ipython() if get_ipython else None
    if shell is not None:
        shell.run_line_magic("matplotlib", "inline")
        shell.display_formatter.formatters["image/png"].for_type(Figure, partial(_png, dpi=dpi))
    mpl.rcParams.update({"figure.dpi": dpi, "savefig.dpi": dpi})
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    root = find_root(start)
    nb = Notebook(root, {})
    for name in names:
        nb.checkpoints[name] = load_checkpoint(nb.path(name))
    return nb
