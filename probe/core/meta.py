"""Which run, variant and step a result row comes from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probe.checkpoint import Checkpoint


def variant_name(ckpt: Checkpoint) -> str:
    """The variant's one name (``lstm``, ``hybrid-joint``, ``hybrid-dat``, ``hybrid-stopgrad-rnn0``, ...).

    Every analysis names a variant through this function only, so that the name has one source."""
    return ckpt.label


def checkpoint_meta(ckpt: Checkpoint) -> dict[str, Any]:
    """The columns that say which run and step a row comes from. ``schedule`` is the schedule's kind as recorded
    (kept for the columns of shipped results); ``label`` is the variant's one name."""
    path = ckpt.path
    run = str(path.parent.parent if path is not None and path.parent.name == "trajectory" else
              (path.parent if path is not None else "<memory>"))
    return {"checkpoint": str(path) if path is not None else ckpt.name, "run": run,
            "schedule": ckpt.schedule or "none", "label": variant_name(ckpt), "seed": ckpt.seed, "step": ckpt.step,
            "family": ckpt.model_config.family}

