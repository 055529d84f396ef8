"""The sequences an analysis measures on: the same for every checkpoint at one (seed, length)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from probe.core.seeds import GRADIENTS

if TYPE_CHECKING:
    import torch

    from probe.tasks import Batch, TaskConfig


def analysis_batch(task: TaskConfig, length: int, batch_size: int, seed: int,
                   device: torch.device | str = "cpu") -> Batch:
    """The batch every checkpoint of the gradient and attribution analyses sees at ``length`` (the same across a
    trajectory, so that curves over training compare one sample)."""
    return task.sample(length, batch_size, GRADIENTS + seed * 1_000_000 + length).to(device)
