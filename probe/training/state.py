"""What training applied at a checkpoint's step: each attention block's gate, the learning rate, and how the step's
batch is drawn. The trainer records it in every checkpoint (``extra["step_state"]``); analyses read it from there
(``step_state``), and for a checkpoint written before the record existed it is rebuilt from the recorded configs.

"At step s" is the state of the update a run continuing from the checkpoint takes next: after s optimizer steps, the
gate and learning rate of step s and the batch of step s (the weights' own gate buffers still hold step s - 1's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from probe.errors import ProbeError
from probe.training.batches import DRAW, SEED_FORMULA, BatchDraw, draw_named, train_batch_seed
from probe.training.config import TrainConfig, lr_at
from probe.training.schedule import Schedule

if TYPE_CHECKING:
    from probe.checkpoint import Checkpoint

KEY = "step_state"
"""Where a checkpoint's ``extra`` holds the record."""


@dataclass(frozen=True)
class StepState:
    """The training state at one step (module docstring)."""

    step: int
    gates: tuple[float, ...] | None  # each attention block's gate, in block order; None: no schedule recorded
    lr: float | None  # the learning rate of step ``step``; None: no training config recorded
    batch_draw: str = DRAW  # a name in ``batches.DRAWS``
    batch_seed: int = 0  # the seed of step ``step``'s batch (``batches.SEED_FORMULA``)
    batch_size: int = 64
    recorded: bool = True  # False: rebuilt from the configs of a checkpoint written before the record

    @property
    def draw(self) -> BatchDraw:
        """The function that draws a batch as this run's trainer did: ``draw(task, batch_size, seed)``."""
        return draw_named(self.batch_draw)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "gates": None if self.gates is None else list(self.gates), "lr": self.lr,
                "batch": {"draw": self.batch_draw, "seed": self.batch_seed, "seed_formula": SEED_FORMULA,
                          "size": self.batch_size}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepState:
        batch = d.get("batch") or {}
        gates = d.get("gates")
        return cls(step=int(d["step"]), gates=None if gates is None else tuple(float(g) for g in gates),
                   lr=None if d.get("lr") is None else float(d["lr"]), batch_draw=str(batch.get("draw", DRAW)),
                   batch_seed=int(batch.get("seed", 0)), batch_size=int(batch.get("size", 64)))


def state_at(schedule: Schedule, cfg: TrainConfig, step: int, n_attention: int) -> StepState:
    """The state of ``step`` in a run of ``cfg`` (the trainer records it; old checkpoints rebuild it this way)."""
    return StepState(step, (schedule.gate(step),) * n_attention, lr_at(cfg, step), DRAW,
                     train_batch_seed(cfg.seed, step), cfg.batch_size)


def step_state(ckpt: Checkpoint) -> StepState:
    """The training state at ``ckpt``'s step: as recorded, or rebuilt from the recorded configs (``recorded``
    False; ``gates`` None when no schedule is recorded, ``lr`` None when the training config cannot be read). A
    record of another step than the checkpoint's (a checkpoint object whose ``step`` was moved) is not its state,
    and the configs decide."""
    step = int(ckpt.step or 0)
    record = ckpt.extra.get(KEY)
    if isinstance(record, dict) and int(record.get("step", -1)) == step:
        return StepState.from_dict(record)
    try:
        cfg = TrainConfig.from_dict(ckpt.train_config)
    except (ProbeError, TypeError, KeyError, ValueError):
        lr = ckpt.train_config.get("lr")
        return StepState(step, None, float(lr) if lr else None, recorded=False)
    n_attention = ckpt.model_config.n_layers if ckpt.model_config.has_attention else 0
    rebuilt = state_at(Schedule(cfg.schedule, cfg.steps, switched_at=(ckpt.extra.get("schedule_state") or {})
                                .get("switched_at")), cfg, step, n_attention)
    gates = rebuilt.gates if ckpt.train_config.get("schedule") else None
    return StepState(step, gates, rebuilt.lr, rebuilt.batch_draw, rebuilt.batch_seed, rebuilt.batch_size, False)


def schedule_gate(ckpt: Checkpoint) -> list[float] | None:
    """Each attention block's gate at the checkpoint's step, as the trainer recorded it (rebuilt from the configs of
    a checkpoint written before the record); None when no schedule is recorded or the model has no attention."""
    if not ckpt.model_config.has_attention:
        return None
    gates = step_state(ckpt).gates
    return list(gates) if gates else None
