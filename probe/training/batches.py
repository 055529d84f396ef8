"""The training batch of each step: a pure function of (seed, step), drawn by one function that the trainer and every
analysis that draws batches as the trainer does share."""

from __future__ import annotations

from collections.abc import Callable

import torch

from probe.errors import ProbeError
from probe.tasks import Batch, TaskConfig

BatchDraw = Callable[[TaskConfig, int, int], Batch]
"""``draw(task, batch_size, seed)``: one batch."""

SEED_FORMULA = "train.seed * 1000003 + step"
"""How the seed of a step's batch follows from the run's seed (``train_batch_seed``), as checkpoints record it."""


def train_batch_seed(seed: int, step: int) -> int:
    """The seed of the batch of ``step`` in a run seeded ``seed`` (``SEED_FORMULA``)."""
    return seed * 1_000_003 + step


def training_batch(task: TaskConfig, batch_size: int, seed: int) -> Batch:
    """One batch drawn as the trainer draws it: a generator seeded with ``seed``, one length uniform in
    1..L_train, then the batch at that length from the same generator."""
    g = torch.Generator().manual_seed(seed)
    length = int(torch.randint(1, task.train_length + 1, (1,), generator=g))
    return task.sample(length, batch_size, g)


DRAWS: dict[str, BatchDraw] = {"uniform-length": training_batch}
"""The batch draws by the name a checkpoint records (``StepState.batch_draw``); every run so far used the one."""
DRAW = "uniform-length"
"""The draw the trainer uses now."""


def draw_named(name: str) -> BatchDraw:
    """The draw a checkpoint names."""
    if name not in DRAWS:
        raise ProbeError(f"the checkpoint's batches were drawn by {name!r}, which this probe does not know (it knows "
                         f"{', '.join(DRAWS)}): read it with the probe that wrote it")
    return DRAWS[name]
