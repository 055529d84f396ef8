"""A point in a run (``At``): a step, or a fraction of all steps, and how ``--set`` spells one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from probe.errors import ProbeError


@dataclass(frozen=True, repr=False)
class At:
    """A point in a run, given either as a step count or as a fraction of all steps (rounded to the nearest step),
    so that a preset can say "4/9 of the run" and still switch at exactly step 2000 of 4500."""

    step: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.step is None) == (self.fraction is None):
            raise ProbeError(f"a point in the run is a step or a fraction, exactly one of them (got step="
                             f"{self.step!r}, fraction={self.fraction!r})")
        if self.step is not None and (isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0):
            raise ProbeError(f"a step must be an integer >= 0, got {self.step!r}")
        if self.fraction is not None and (isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float))
                                          or not 0 <= self.fraction <= 1):
            raise ProbeError(f"a fraction of the run must be a number in [0, 1], got {self.fraction!r}")

    def resolve(self, total_steps: int) -> int:
        """The step this point falls on in a run of ``total_steps``."""
        if self.step is not None:
            return self.step
        return int(round(float(self.fraction or 0) * total_steps))

    @property
    def is_zero(self) -> bool:
        return (self.step if self.step is not None else self.fraction) == 0

    def to_dict(self) -> dict[str, int | float]:
        return {"step": self.step} if self.step is not None else {"fraction": float(self.fraction or 0)}

    def __repr__(self) -> str:
        return f"At(step={self.step})" if self.step is not None else f"At(fraction={self.fraction!r})"

    def __str__(self) -> str:
        return f"step {self.step}" if self.step is not None else f"{self.fraction:g} of the run"

    @classmethod
    def of(cls, value: Any, name: str) -> At:
        """``value`` as a point: an ``At``, or its record ``{"step": N}`` / ``{"fraction": F}``."""
        if isinstance(value, At):
            return value
        if isinstance(value, dict) and set(value) in ({"step"}, {"fraction"}):
            return cls(**value)
        raise ProbeError(f"schedule.{name} must be a step or a fraction of the run, e.g. schedule.{name}=2000 "
                         f"(a step) or schedule.{name}=50% (half the run), got {value!r}")


SPELLINGS = "an integer is a step (2000), a percentage or a number with a decimal point is a fraction of the run " \
            "(50%, 0.5, 1.0 = the whole run)"


def parse_point(value: Any, name: str) -> At:
    """``--set schedule.NAME=VALUE`` as a point: an integer is a step; ``N%`` or a number with a decimal point in
    [0, 1] is a fraction of the run, so ``1.0`` is the whole run and ``1`` is step 1. A number with a decimal point
    above 1 is refused rather than guessed at (it was a step before points were typed)."""
    if isinstance(value, (At, dict)):
        return At.of(value, name)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ProbeError(f"schedule.{name}={value}: a step is >= 0")
        return At(step=value)
    if isinstance(value, float):
        if not 0 <= value <= 1:
            step = int(value) if math.isfinite(value) and value == int(value) and value > 0 else "N"
            raise ProbeError(f"schedule.{name}={value!r}: a fraction of the run is at most 1.0 (the whole run); for "
                             f"a step write an integer (schedule.{name}={step})")
        return At(fraction=value)
    if isinstance(value, str) and value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            percent = -1.0
        if not 0 <= percent <= 100:
            raise ProbeError(f"schedule.{name}={value}: a percentage of the run is 0% to 100%")
        return At(fraction=percent / 100)
    raise ProbeError(f"schedule.{name}={value!r}: {SPELLINGS}")
