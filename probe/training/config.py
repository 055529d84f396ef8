"""The training config (optimisation, evaluation, saving, the schedule) and the learning rate it gives at each step."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from probe.errors import ProbeError
from probe.schedules.settings import ScheduleConfig

PRECISIONS = ("fp32", "bf16", "bf16+fp32-recurrence", "auto")
"""``bf16``: forward and backward under ``torch.autocast(dtype=bfloat16)``; weights, optimizer state and loss stay
float32 (mixed precision with fp32 master weights). ``bf16+fp32-recurrence``: the same with the recurrent sublayers
run in fp32 (autocast off for them, probe's own cells only): the test of whether bf16 rounding of the recurrence is
what changes a run. ``auto``: bf16 where the device has native bf16 (a CPU with avx512_bf16 or AMX, a CUDA GPU that
supports it), fp32 elsewhere. An explicit ``bf16`` on a CPU without native bf16 keeps the recurrent sublayers in fp32
(docs/guides/training.md says why)."""

OPTIMIZER_IMPLS = ("default", "foreach", "fused")
"""AdamW's implementation: torch's default for the device (a per-parameter loop on CPU), multi-tensor ``foreach``,
or the ``fused`` kernel. Same algorithm; they differ in float rounding and speed (benchmarks/throughput.py)."""


@dataclass(frozen=True, eq=False)
class TrainConfig:
    """Optimisation, evaluation and saving. Batches are a pure function of (seed, step) (``batches``), so a resumed
    run sees exactly the batches the uninterrupted one would have.

    Two configs are equal when they train the same run: a switch at 4/9 of 4500 steps equals one at step 2000."""

    steps: int = 4500
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 200
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_samples: int = 128
    ckpt_every: int = 500
    traj_every: int = 250
    traj_dtype: str = "float16"
    # every snapshot also carries AdamW's whole state (m and v of every parameter, float32: twice the weights' size
    # again), so a run can be continued from it exactly (probe.training.rollout) and the lookahead can take the
    # optimizer's real next step (probe.gradients.realstep); needs traj_dtype float32
    traj_optimizer: bool = False
    seed: int = 0
    threads: int = 1
    precision: str = "fp32"
    optimizer_impl: str = "default"
    compile: bool = False
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "eval_samples", "ckpt_every", "traj_every", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProbeError(f"train.{name} must be a positive integer, got {value!r}")
        for name in ("lr", "weight_decay", "min_lr_ratio", "grad_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ProbeError(f"train.{name} must be a non-negative number, got {value!r}")
        if self.precision not in PRECISIONS:
            raise ProbeError(f"train.precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ProbeError(
                f"train.optimizer_impl {self.optimizer_impl!r}: choose one of {', '.join(OPTIMIZER_IMPLS)}")
        if not isinstance(self.compile, bool):
            raise ProbeError(f"train.compile must be true or false, got {self.compile!r}")
        if not isinstance(self.traj_optimizer, bool):
            raise ProbeError(f"train.traj_optimizer must be true or false, got {self.traj_optimizer!r}")
        if self.traj_optimizer and self.traj_dtype != "float32":
            raise ProbeError("train.traj_optimizer=true makes each snapshot a state to train on from, so it must hold "
                             "the run's own float32 weights: set train.traj_dtype=float32 as well")

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["schedule"] = self.schedule.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """A config as ``to_dict`` wrote it (a field it lacks takes its default). A checkpoint's record is in this
        spelling once loaded: ``probe.checkpoint`` converts a file of an older format."""
        d = dict(d)
        d["schedule"] = ScheduleConfig.from_dict(d.get("schedule") or {})
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ProbeError(f"train config: unknown field(s) {', '.join(unknown)}")
        return cls(**d)

    def resolved(self) -> TrainConfig:
        """This config with every point of its schedule given as the step it falls on in this run."""
        return dataclasses.replace(self, schedule=self.schedule.at_steps(self.steps))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TrainConfig):
            return NotImplemented
        return self.resolved().to_dict() == other.resolved().to_dict()

    def __hash__(self) -> int:
        return hash(json.dumps(self.resolved().to_dict(), sort_keys=True))


def lr_at(cfg: TrainConfig, step: int) -> float:
    """The learning-rate schedule: linear warm-up, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
