"""What both lookaheads start from: their sizes (``LookaheadConfig``), AdamW's moments at a checkpoint
(``Moments``), the seeds of their batches, and a step along the recurrent weights. ``lookahead`` (first order) and
``beyond`` (the one the CLI runs) both import it; neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from probe.checkpoint import Checkpoint
from probe.core.seeds import LOOKAHEAD
from probe.gradients.decomposition import lstm_parameter_names
from probe.models import HookedSequenceModel

LOOKAHEAD_SEED_BASE = LOOKAHEAD
"""Lookahead batches: the ``lookahead`` entry of ``probe.core.seeds``. Their training-distribution batches are drawn
as the run's trainer drew its own (``probe.training.state.StepState.draw``), from seeds of their own."""


def lookahead_seed(seed: int) -> int:
    """The first seed of a lookahead's batches; each kind of batch is an offset from it."""
    return LOOKAHEAD_SEED_BASE + seed * 10_000_000


@dataclass(frozen=True)
class LookaheadConfig:
    """Sizes of the lookahead (``beyond.measure_beyond_range``; the first-order ``measure_lookahead`` reads the
    first six)."""

    n_batches: int = 24          # training-distribution batches whose gradients are averaged into d_part
    batch_size: int = 64
    eval_batches: int = 8        # evaluation batches for the state-loss targets
    train_eval_batches: int = 8  # held-out training-distribution batches for the training-loss target
    rel_step: float = 1e-6       # first-order check step (first-order lookahead: the step), / |theta|
    lengths: tuple[int, ...] | None = None  # first-order lookahead's evaluation lengths (default L and 3 L)
    scales: tuple[float, ...] = (0.01, 0.1, 0.3, 1.0)  # step lengths, x the optimizer's update size
    n_random: int = 4            # random directions (fixed seed) in the baseline
    factor: int = 3              # evaluation sequences are factor x L long


@dataclass
class Moments:
    """AdamW's second moments of theta, flattened in the order of ``lstm_parameters``."""

    v: Tensor
    step: int
    beta2: float
    eps: float
    source: str  # "trajectory" (ckpt.extra["lstm_adam"]) or "optimizer" (ckpt.optimizer_state)
    m: Tensor | None = None  # first moments: only a full optimizer state holds them
    beta1: float = 0.9
    lr: float | None = None  # the learning rate of the last update, when stored

    def precondition(self, g: Tensor) -> Tensor:
        return g / ((self.v / (1 - self.beta2 ** self.step)).sqrt() + self.eps)


def adam_moments(ckpt: Checkpoint, model: HookedSequenceModel) -> Moments | None:
    """theta's second moments from a checkpoint: a trajectory snapshot's ``extra["lstm_adam"]`` or a full optimizer
    state (``last.pt``; its integer ids follow the order of ``model.parameters()``). None when it holds neither
    (older snapshots, weights-only files, the snapshot taken before the first step)."""
    names = lstm_parameter_names(model)
    shapes = dict(model.named_parameters())
    adam = ckpt.extra.get("lstm_adam") or {}
    if adam.get("exp_avg_sq") and all(n in adam["exp_avg_sq"] for n in names):
        v = torch.cat([adam["exp_avg_sq"][n].float().reshape(shapes[n].shape).flatten() for n in names])
        return Moments(v, int(adam["step"]), float(adam["beta2"]), float(adam["eps"]), "trajectory",
                       beta1=float(adam.get("beta1", 0.9)), lr=float(adam["lr"]) if "lr" in adam else None)
    opt = ckpt.optimizer_state
    if not opt or not opt.get("state"):
        return None
    ids = [i for group in opt["param_groups"] for i in group["params"]]
    order = [n for n, _ in model.named_parameters()]
    if len(ids) != len(order):
        return None  # an optimizer over a different parameter list: its ids cannot be mapped to names
    by_name = dict(zip(order, ids, strict=True))
    group_of = {i: group for group in opt["param_groups"] for i in group["params"]}
    states = [opt["state"].get(by_name[n]) for n in names]
    if any(s is None or "exp_avg_sq" not in s for s in states):
        return None
    group = group_of[by_name[names[0]]]
    m = torch.cat([s["exp_avg"].float().flatten() for s in states]) if all("exp_avg" in s for s in states) else None
    return Moments(torch.cat([s["exp_avg_sq"].float().flatten() for s in states]), int(max(float(s["step"])
                   for s in states)), float(group["betas"][1]), float(group["eps"]), "optimizer", m=m,
                   beta1=float(group["betas"][0]), lr=float(group["lr"]) if "lr" in group else None)


def add_step(params: list[torch.nn.Parameter], step: Tensor) -> None:
    """theta += ``step`` (a flat vector in the order of ``params``), in place."""
    off = 0
    for p in params:
        n = p.numel()
        p.add_(step[off:off + n].view_as(p).to(p.dtype))
        off += n
