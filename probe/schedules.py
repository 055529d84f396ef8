"""Delayed Attention Training schedules: map the training step to each block's attention gate and to whether
attention's parameters train (SPEC section 5)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from probe.errors import ProbeError

KINDS = ("joint", "delayed", "ramp", "frozen", "adaptive")


@dataclass(frozen=True)
class ScheduleConfig:
    """``switch`` is the step T at which attention comes on: a step count if >= 1, else a fraction of all steps.

    - ``joint``: gate 1 and attention trains from step 0.
    - ``delayed``: gate 0 and attention's parameters out of the optimizer until T, then gate 1 and training.
    - ``ramp``: like ``delayed`` but the gate rises linearly from 0 at T to 1 at T + ``ramp_window``.
    - ``frozen``: gate 1 from step 0, but attention's parameters frozen (at their initial values) until T.
    - ``adaptive``: like ``delayed``, switching when the state-subtask validation accuracy of the LSTM-only phase
      has not improved by ``min_delta`` for ``patience`` evaluations (or reached ``target``), at the latest at
      ``switch`` (the cap); never before ``min_switch``.
    """

    kind: str = "joint"
    switch: float = 0.0
    ramp_window: float = 0.0
    patience: int = 3
    min_delta: float = 0.002
    target: float = 0.999
    min_switch: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ProbeError(f"unknown schedule {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.switch < 0 or self.ramp_window < 0:
            raise ProbeError("schedule switch and ramp_window must be non-negative")
        if self.kind in ("delayed", "ramp", "frozen", "adaptive") and self.switch == 0:
            raise ProbeError(f"schedule {self.kind} needs a switch step or fraction > 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _steps(value: float, total: int) -> int:
    return int(round(value * total)) if 0 < value < 1 else int(value)


class Schedule:
    """The live schedule of one run. Its only mutable state is the adaptive switch step (saved for resume)."""

    def __init__(self, cfg: ScheduleConfig, total_steps: int, switched_at: int | None = None) -> None:
        self.cfg = cfg
        self.total_steps = total_steps
        self.switch_step = 0 if cfg.kind == "joint" else _steps(cfg.switch, total_steps)
        self.window = _steps(cfg.ramp_window, total_steps)
        self.min_switch = _steps(cfg.min_switch, total_steps)
        self.switched_at = switched_at
        self._best = -1.0
        self._stale = 0

    @property
    def effective_switch(self) -> int:
        if self.cfg.kind == "adaptive" and self.switched_at is not None:
            return self.switched_at
        return self.switch_step

    def gate(self, step: int) -> float:
        """Attention gate at ``step`` (the same for every block)."""
        kind, t = self.cfg.kind, self.effective_switch
        if kind in ("joint", "frozen"):
            return 1.0
        if kind == "ramp":
            if step < t:
                return 0.0
            return 1.0 if self.window == 0 else min(1.0, (step - t + 1) / self.window)
        return 1.0 if step >= t else 0.0

    def attention_trains(self, step: int) -> bool:
        return self.cfg.kind == "joint" or step >= self.effective_switch

    def observe(self, step: int, state_accuracy: float) -> bool:
        """Feed a validation accuracy (adaptive only). Returns True if this observation switches attention on."""
        if self.cfg.kind != "adaptive" or self.switched_at is not None:
            return False
        if state_accuracy > self._best + self.cfg.min_delta:
            self._best, self._stale = state_accuracy, 0
        else:
            self._stale += 1
        if step >= self.min_switch and (self._stale >= self.cfg.patience or state_accuracy >= self.cfg.target):
            self.switched_at = step + 1
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"switched_at": self.switched_at, "best": self._best, "stale": self._stale}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.switched_at = d.get("switched_at")
        self._best = float(d.get("best", -1.0))
        self._stale = int(d.get("stale", 0))
