"""The shortcut tests' shared sequences and the model's unperturbed answers to them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool, Int
from torch import Tensor

from probe.core.seeds import SHORTCUTS
from probe.tasks import Batch, TaskConfig

SEED_BASE = SHORTCUTS
"""The ``shortcuts`` entry of ``probe.core.seeds``: the same (seed, length) gives the same sequences to every test,
so that their effects are measured on one sample."""
Forward = Callable[..., Tensor]
"""A model or any ``tokens (batch, pos) [, positions=] -> logits (batch, pos, vocab)`` function."""
DEFAULT_FACTORS = (1, 2, 3, 4)
"""The tests run at 1x-4x the training length unless told otherwise."""


def device_of(forward: Forward) -> torch.device:
    params = getattr(forward, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return torch.device("cpu")


def sample(task: TaskConfig, length: int, n: int, seed: int) -> Batch:
    """The shared test sequences at one length (on the CPU)."""
    return task.sample(int(length), n, SEED_BASE + seed * 10_000 + int(length))


@torch.no_grad()
def predict(forward: Forward, tokens: Int[Tensor, "batch pos"], positions: Tensor | None = None,
            chunk: int = 256) -> Int[Tensor, "batch pos"]:
    """Argmax answer at every position (CPU), in chunks of sequences to bound memory."""
    device = device_of(forward)
    out = []
    for s in range(0, len(tokens), chunk):
        kw = {} if positions is None else {"positions": positions[s: s + chunk].to(device)}
        out.append(forward(tokens[s: s + chunk].to(device), **kw).argmax(-1).cpu())
    return torch.cat(out)


@dataclass
class Sampled:
    """Test sequences and the model's unperturbed answers to them."""

    batch: Batch
    pred: Int[Tensor, "batch pos"]


def baselines(forward: Forward, task: TaskConfig, lengths: Iterable[int], n: int, seed: int
              ) -> dict[int, Sampled]:
    """The unperturbed answers at every length, computed once and shared by the tests of one checkpoint."""
    out = {}
    for length in lengths:
        batch = sample(task, int(length), n, seed)
        out[int(length)] = Sampled(batch, predict(forward, batch.tokens))
    return out


def last_state_answer(batch: Batch) -> Int[Tensor, " batch"]:
    """Position of the last state question of each sequence (-1 where none is asked)."""
    state = batch.masks["state"]
    t = state.shape[1] - 1 - state.flip(1).to(torch.int8).argmax(dim=1)
    return torch.where(state.any(1), t, -1)


def counts(right: Bool[Tensor, "batch pos"], mask: Bool[Tensor, "batch pos"]) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence: answers asked and answers right."""
    return mask.sum(1).numpy().astype(float), (right & mask).sum(1).numpy().astype(float)
