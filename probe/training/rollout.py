"""Continue a run from a snapshot for a few steps, as the run itself (``kept``) or without attention's gradient path
into the recurrent sublayers (``cut``): the real-step lookahead's non-linear check.

A snapshot written with ``train.traj_optimizer=true`` (or a ``last.pt``) holds the weights, AdamW's state and the
schedule's state; the batch of each step is a pure function of (seed, step). So the run's own trainer, loaded from
it, takes exactly the steps the run took: the ``kept`` branch must reproduce the run's later snapshot bit for bit on
the machine, precision and thread count that trained it, which ``weight_difference`` checks. The ``cut`` branch
takes the same steps with the recurrent sublayers' (and their pre-LN's) gradient through attention dropped, as
``stopgrad-rnn`` trains; every other parameter learns as in the run.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from probe.checkpoint import Checkpoint
from probe.errors import ProbeError
from probe.training.config import TrainConfig
from probe.training.policies import PLAIN, GradientPolicy, SplitCut
from probe.training.trainer import Trainer

BRANCHES = ("kept", "cut")


class _WithoutAttentionPath:
    """The run's schedule, except that each step's gradient policy drops the recurrent sublayers' gradient through
    attention. Only a run whose own step is plain can be cut this way: cutting on top of another surgery would
    measure something else."""

    def __init__(self, schedule: Any) -> None:
        self._schedule = schedule

    def __getattr__(self, name: str) -> Any:
        return getattr(self._schedule, name)

    def gradient_policy(self, step: int) -> GradientPolicy:
        if self._schedule.gradient_policy(step) is not PLAIN:
            raise ProbeError(f"step {step}: the run's own schedule already changes the gradient there; the cut "
                             "branch is defined for a run whose steps are plain (joint)")
        return SplitCut("recurrent")


@dataclass
class Rollout:
    """``steps`` steps of the run from ``start`` on one ``branch``: the model after them (eval mode), its weights
    after the first step (``first_step``: the real next update, taken by torch's AdamW) and each step's loss."""

    branch: str
    start: int
    steps: int
    model: Any
    first_step: dict[str, Tensor]
    losses: list[float]
    precision: str


def continue_run(ckpt: Checkpoint, steps: int, branch: str = "kept", device: str | torch.device = "cpu",
                 precision: str | None = None) -> Rollout:
    """Load the run's state at ``ckpt`` into its own trainer and take ``steps`` steps on ``branch``. Nothing is
    written to disk (the trainer's loop, which writes, is not run; ``train_step`` is).

    ``precision`` (a ``train.precision``) defaults to the one the run was training in when it wrote ``ckpt`` (its
    ``precision_used``), not its config's literal: a run configured ``auto`` would otherwise continue in whatever
    this machine resolves ``auto`` to, and the kept branch would not be the run. Where this machine cannot run it
    as recorded (bf16 without native bf16 keeps the recurrence in fp32), ``Rollout.precision`` says what ran."""
    if branch not in BRANCHES:
        raise ProbeError(f"branch {branch!r}: choose one of {', '.join(BRANCHES)}")
    if not ckpt.optimizer_state:
        raise ProbeError(f"{ckpt.name}: holds no optimizer state, so the run cannot be continued from it; write "
                         "snapshots with --set train.traj_optimizer=true --set train.traj_dtype=float32")
    low = sorted({str(v.dtype) for v in ckpt.state_dict.values() if v.is_floating_point()} - {"torch.float32"})
    if low:
        raise ProbeError(f"{ckpt.name}: its weights are stored as {', '.join(low)}, not the run's float32 ones, so "
                         "continuing from them is not the run")
    cfg = TrainConfig.from_dict(ckpt.train_config)
    precision = precision or ckpt.extra.get("precision_used")
    if precision is not None:
        cfg = dataclasses.replace(cfg, precision=precision)
    trainer = Trainer(ckpt.model_config, ckpt.task_config, cfg, ckpt.path.parent if ckpt.path else ".", device,
                      progress=False)
    trainer.model.load_state_dict(ckpt.state_dict)
    trainer.schedule.load_state_dict(ckpt.extra.get("schedule_state") or {})
    # a copy: the optimizer keeps tensors it is given as they are and steps them in place, which would change
    # the checkpoint that the next branch starts from
    trainer.optimizer.load_state_dict(copy.deepcopy(ckpt.optimizer_state))
    trainer.step = ckpt.step
    if branch == "cut":
        trainer.schedule = _WithoutAttentionPath(trainer.schedule)
    losses, first = [], {}
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)  # as the run trained: another thread count sums in another order
    try:
        for step in range(ckpt.step, ckpt.step + steps):
            losses.append(trainer.train_step(step)[0])
            if step == ckpt.step:
                first = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    finally:
        torch.set_num_threads(threads)
    return Rollout(branch, ckpt.step, steps, trainer.model.eval(), first, losses, trainer.precision_used)


def weight_difference(state: dict[str, Tensor], ckpt: Checkpoint) -> float:
    """The largest absolute difference between ``state`` and the weights ``ckpt`` holds (0.0: bit-identical)."""
    if state.keys() != ckpt.state_dict.keys():
        raise ProbeError(f"{ckpt.name}: holds other tensors than the continued run: "
                         f"{sorted(state.keys() ^ ckpt.state_dict.keys())}")
    return max(float((state[k].double() - ckpt.state_dict[k].double()).abs().max()) for k in state)
