"""Delayed Attention Training schedules: map the training step to each block's attention gate and to whether
attention's parameters train (SPEC section 5)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from probe.errors import ProbeError

KINDS = ("joint", "delayed", "ramp", "frozen", "adaptive", "stopgrad")
SWITCHED_KINDS = ("delayed", "ramp", "frozen", "adaptive")
"""Kinds that need a switch step T > 0."""
STOPGRAD_SCOPES = {"all": "", "recurrent": "-rnn", "nonrecurrent": "-nonrnn"}
"""Whose gradient ``stopgrad`` cuts at attention (with the suffix of the variant's name): every parameter's, the
recurrent sublayers' only, or every parameter's but theirs; ``recurrent:N`` (suffix ``-rnnN``) is block N's recurrent
sublayer only."""
_BLOCK_SCOPE = re.compile(r"recurrent:(\d+)")


def split_scope(scope: str) -> tuple[str, int | None]:
    """``(scope, block)``: ``recurrent:N`` is ``("recurrent", N)``; any other scope has block None."""
    m = _BLOCK_SCOPE.fullmatch(scope)
    return ("recurrent", int(m.group(1))) if m else (scope, None)


def scope_suffix(scope: str) -> str:
    """The variant-name suffix of a ``stopgrad_scope`` ("" for one this version does not know)."""
    name, block = split_scope(scope)
    return STOPGRAD_SCOPES.get(name, "") + ("" if block is None else str(block))


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
    - ``stopgrad``: gate 1 and attention trains from step 0, but the residual stream is detached where it enters
      each attention sublayer, so no gradient reaches the LSTMs, MLPs or embeddings through attention (the causal
      test of "attention's gradients pollute the LSTM"). With ``switch`` > 0 the detach lasts until T only, then the
      full gradient flows. ``stopgrad_scope`` says whose gradient is cut: ``all`` (the detach above);
      ``recurrent``: only the recurrent sublayers' parameters (LSTMs and their pre-LN) get the gradient with every
      path through attention removed, while the MLPs, embeddings and unembedding get the full gradient; or
      ``nonrecurrent``, the complement: the LSTMs get the full gradient and every other parameter the cut one; or
      ``recurrent:N``: block N's LSTM (and pre-LN) only. The split scopes take two backward passes a step; they tell
      whether (and which) LSTM must be shielded.

    ``freeze_recurrent_after_switch`` (any kind with a switch): from T on, the recurrent sublayers (LSTM and its
    pre-LN) stop training, so phase 2 cannot co-adapt the LSTM; embeddings, MLPs and attention still train.
    """

    kind: str = "joint"
    switch: float = 0.0
    ramp_window: float = 0.0
    patience: int = 3
    min_delta: float = 0.002
    target: float = 0.999
    min_switch: float = 0.1
    freeze_recurrent_after_switch: bool = False
    stopgrad_scope: str = "all"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ProbeError(f"unknown schedule {self.kind!r}; choose one of {', '.join(KINDS)}")
        for name in ("switch", "ramp_window", "min_switch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ProbeError(f"schedule.{name} must be a non-negative number, got {value!r}")
        if self.kind in SWITCHED_KINDS and self.switch == 0:
            raise ProbeError(f"schedule {self.kind} needs a switch step or fraction > 0")
        if not isinstance(self.freeze_recurrent_after_switch, bool):
            raise ProbeError("schedule.freeze_recurrent_after_switch must be true or false")
        if self.freeze_recurrent_after_switch and (self.kind not in SWITCHED_KINDS and
                                                   not (self.kind == "stopgrad" and self.switch > 0)):
            raise ProbeError(f"schedule {self.kind} has no switch: freeze_recurrent_after_switch needs one")
        if not isinstance(self.stopgrad_scope, str) or split_scope(self.stopgrad_scope)[0] not in STOPGRAD_SCOPES:
            raise ProbeError(f"schedule.stopgrad_scope must be one of {', '.join(STOPGRAD_SCOPES)} or recurrent:N "
                             f"(block N's LSTM only), got {self.stopgrad_scope!r}")
        if self.stopgrad_scope != "all" and self.kind != "stopgrad":
            raise ProbeError(f"schedule.stopgrad_scope={self.stopgrad_scope} needs schedule.kind=stopgrad")

    @property
    def name(self) -> str:
        """The variant's name as recorded in tables: the kind, the stopgrad scope's suffix (``-rnn``, ``-nonrnn``),
        plus ``+frozen-rnn`` when the LSTM stops at T."""
        return (self.kind + scope_suffix(self.stopgrad_scope)
                + ("+frozen-rnn" if self.freeze_recurrent_after_switch else ""))

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
        if cfg.kind in ("delayed", "ramp", "frozen") and self.switch_step >= total_steps:
            raise ProbeError(
                f"schedule {cfg.kind}: attention would switch on at step {self.switch_step}, after the last step "
                f"({total_steps}); give schedule.switch as a fraction (e.g. 0.44) or train longer"
            )
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
        if kind == "stopgrad":
            return 1.0
        return 1.0 if step >= t else 0.0

    def attention_trains(self, step: int) -> bool:
        return self.cfg.kind in ("joint", "stopgrad") or step >= self.effective_switch

    def stopgrad(self, step: int) -> bool:
        """Whether attention's backward path is cut at ``step`` (``stopgrad`` only; until T if T > 0)."""
        return self.cfg.kind == "stopgrad" and (self.switch_step == 0 or step < self.switch_step)

    def stopgrad_all(self, step: int) -> bool:
        """Whether the stream entering attention is detached for every parameter at ``step``."""
        return self.stopgrad(step) and self.cfg.stopgrad_scope == "all"

    def stopgrad_split(self, step: int) -> str | None:
        """The split scope (``recurrent``, ``recurrent:N`` or ``nonrecurrent``: two backward passes) in force at
        ``step``, else None."""
        return self.cfg.stopgrad_scope if self.stopgrad(step) and self.cfg.stopgrad_scope != "all" else None

    def recurrent_trains(self, step: int) -> bool:
        return not (self.cfg.freeze_recurrent_after_switch and step >= self.effective_switch)

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
