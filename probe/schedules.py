"""Delayed Attention Training schedules: independent settings, one table of named variants, and the live schedule."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import InitVar, dataclass
from typing import TYPE_CHECKING, Any

from probe.errors import ProbeError

if TYPE_CHECKING:
    from torch import Tensor, nn

    from probe.models import HookedSequenceModel


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
        """``value`` as a point: an ``At``, or its dict form ``{"step": N}`` / ``{"fraction": F}``."""
        if isinstance(value, At):
            return value
        if isinstance(value, dict) and set(value) in ({"step"}, {"fraction"}):
            return cls(**value)
        raise ProbeError(f"schedule.{name} must be a step or a fraction of the run: set schedule.{name}_step=N or "
                         f"schedule.{name}_fraction=F, got {value!r}")

    @classmethod
    def legacy(cls, value: Any, name: str) -> At:
        """How a bare number meant a point before points were typed: a step if >= 1 (or 0), a fraction if in (0, 1).
        Only old checkpoints and the old ``--set schedule.switch=X`` spelling are read this way."""
        if isinstance(value, (At, dict)):
            return cls.of(value, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
            raise ProbeError(f"schedule.{name} must be a non-negative number, got {value!r}")
        return cls(fraction=float(value)) if 0 < value < 1 else cls(step=int(value))


GATES = ("on", "off-until-switch", "ramp")
"""The attention gate's curve: 1 throughout; 0 until the switch, then 1; or 0 until the switch, then rising linearly
to 1 over ``ramp_window``."""
ATTENTION_TRAINS = ("always", "from-switch")
"""When attention's parameters (and its pre-LN) train; before that they have no gradient, so AdamW skips them: no
update, no weight decay, no moment state."""
CUTS = ("none", "all", "recurrent", "nonrecurrent")
"""Whose gradient through attention is cut: nobody's; every parameter's (the residual stream is detached where it
enters attention); the recurrent sublayers' only (LSTMs and their pre-LN; ``cut_block`` narrows it to one block's); or
every parameter's but theirs. The split cuts take two backward passes a step."""
CUT_MODES = ("drop", "initial-attention", "mlp-placebo")
"""How a recurrent cut treats the gradient it cuts: drops it; replaces it by the gradient through attention's
*initial* weights (attention still learns, but the LSTM never learns through an attention that has learned); or keeps
attention's path and instead removes an equal norm from the paths through the MLPs (a placebo: as much gradient
taken away, none of it attention's)."""
POINTS = ("switch", "ramp_window", "min_switch", "cut_until")
"""The settings that are points in the run (``At``)."""
SHAPE = ("gate", "attention_trains", "cut", "cut_block", "cut_through", "cut_mode", "freeze_recurrent_after_switch",
         "adaptive")
"""The settings that make a variant what it is (its name); the others say when and how fast."""


@dataclass(frozen=True)
class ScheduleConfig:
    """A schedule as independent settings; ``VARIANTS`` names the combinations the studies use.

    - ``gate``: the attention gate's curve (``GATES``), the same for every block.
    - ``switch``: when phase 1 ends (``At``: a step or a fraction of the run). Settings that say "until the switch"
      or "from the switch" need one.
    - ``ramp_window``: how long the ``ramp`` gate takes to rise from 0 to 1.
    - ``attention_trains``: ``always`` or ``from-switch`` (``ATTENTION_TRAINS``).
    - ``cut``: whose gradient through attention is cut (``CUTS``); ``cut_block``: with ``recurrent``, block N's
      recurrent sublayer only; ``cut_through``: the blocks whose attention the cut applies to (None: every block);
      ``cut_until``: the cut lasts until this point (None: until the switch, or the whole run without one);
      ``cut_mode``: with ``recurrent``, what becomes of the cut gradient (``CUT_MODES``: dropped, recomputed through
      attention's initial weights, or kept while a matched share of the MLP paths is removed instead). The cut
      leaves the forward unchanged and attention's own weights learning: it is the causal test of "attention's
      gradients pollute the LSTM".
    - ``freeze_recurrent_after_switch``: from the switch on the recurrent sublayers (LSTM and its pre-LN) stop
      training, so that phase 2 cannot co-adapt them; embeddings, MLPs and attention still train.
    - ``adaptive``: switch when the state-subtask validation accuracy of phase 1 has not improved by ``min_delta``
      for ``patience`` evaluations (or reached ``target``), never before ``min_switch``; ``switch`` is then the
      latest switch (the cap).

    ``variant`` names a ``VARIANTS`` entry whose settings to take (``ScheduleConfig(variant="dat",
    switch=At(step=2000))``); with settings given as well it must be their name, as in a record. ``kind`` and
    ``stopgrad_scope`` are the old way to say this (a kind name and a scope string); given to the
    constructor, they are translated into the settings above and stored no more (``from_dict`` reads old
    checkpoints the same way). Bare numbers for the points are then read as they were: a step if >= 1, else a
    fraction.
    """

    gate: str = "on"
    switch: At | None = None
    ramp_window: At = At(step=0)
    attention_trains: str = "always"
    cut: str = "none"
    cut_block: int | None = None
    cut_through: tuple[int, ...] | None = None
    cut_until: At | None = None
    cut_mode: str = "drop"
    freeze_recurrent_after_switch: bool = False
    adaptive: bool = False
    patience: int = 3
    min_delta: float = 0.002
    target: float = 0.999
    min_switch: At = At(fraction=0.1)
    variant: InitVar[str | None] = None
    kind: InitVar[str | None] = None
    stopgrad_scope: InitVar[str | None] = None

    def __post_init__(self, variant: str | None, kind: str | None, stopgrad_scope: str | None) -> None:
        if isinstance(self.cut_through, list):  # as JSON gives it back
            object.__setattr__(self, "cut_through", tuple(self.cut_through))
        if variant is not None:
            if kind is not None or stopgrad_scope is not None:
                raise ProbeError("schedule: give a variant or the old kind/stopgrad_scope, not both")
            defaults = ScheduleConfig()
            if all(getattr(self, n) == getattr(defaults, n) for n in SHAPE):
                for name, value in variant_settings(variant).items():
                    object.__setattr__(self, name, value)
            elif variant_name(self) != ALIASES.get(variant, variant):  # a record: its name must fit its settings
                raise ProbeError(f"schedule.variant {variant!r} does not match the settings given, which make "
                                 f"{variant_name(self)!r}")
        if kind is not None or stopgrad_scope is not None:
            defaults = ScheduleConfig()
            changed = [n for n in SHAPE if getattr(self, n) != getattr(defaults, n)
                       and n != "freeze_recurrent_after_switch"]
            if changed:
                raise ProbeError(f"schedule: give either the old kind/stopgrad_scope or the settings "
                                 f"({', '.join(changed)}), not both")
            for name, value in _from_kind(kind or "joint", stopgrad_scope or "all").items():
                object.__setattr__(self, name, value)
            for name in POINTS:
                value = getattr(self, name)
                if value is not None and not isinstance(value, At):
                    object.__setattr__(self, name, At.legacy(value, name))
            if self.switch is not None and self.switch.is_zero:
                object.__setattr__(self, "switch", None)  # an old switch of 0 meant "no switch"
        for name in POINTS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, At.of(value, name))
        self._validate()

    def _validate(self) -> None:
        for name, allowed in (("gate", GATES), ("attention_trains", ATTENTION_TRAINS), ("cut", CUTS),
                              ("cut_mode", CUT_MODES)):
            if getattr(self, name) not in allowed:
                raise ProbeError(f"schedule.{name} {getattr(self, name)!r}: choose one of {', '.join(allowed)}")
        for name in ("freeze_recurrent_after_switch", "adaptive"):
            if not isinstance(getattr(self, name), bool):
                raise ProbeError(f"schedule.{name} must be true or false")
        for name in ("patience",):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProbeError(f"schedule.{name} must be a positive integer, got {value!r}")
        for name in ("min_delta", "target"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ProbeError(f"schedule.{name} must be a non-negative number, got {value!r}")
        if self.switch is not None and self.switch.is_zero:
            raise ProbeError("schedule.switch must come after step 0 (a schedule without a switch has none)")
        needs = [what for what, used in (
            (f"gate={self.gate}", self.gate != "on"),
            ("attention_trains=from-switch", self.attention_trains == "from-switch"),
            ("freeze_recurrent_after_switch", self.freeze_recurrent_after_switch),
            ("adaptive", self.adaptive)) if used]
        if needs and self.switch is None:
            raise ProbeError(f"schedule {', '.join(needs)} needs a switch: set schedule.switch_step=N or "
                             f"schedule.switch_fraction=F")
        if self.cut_block is not None and (self.cut != "recurrent" or isinstance(self.cut_block, bool)
                                           or not isinstance(self.cut_block, int) or self.cut_block < 0):
            raise ProbeError(f"schedule.cut_block={self.cut_block!r} needs schedule.cut=recurrent and a block "
                             f"index >= 0")
        if self.cut_through is not None and (self.cut == "none" or not self.cut_through or not all(
                isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in self.cut_through)):
            raise ProbeError(f"schedule.cut_through={list(self.cut_through)!r} needs a schedule.cut and a list of "
                             f"block indices")
        if self.cut_until is not None and self.cut == "none":
            raise ProbeError("schedule.cut_until needs a schedule.cut")
        if self.cut_mode != "drop" and self.cut != "recurrent":
            raise ProbeError(f"schedule.cut_mode={self.cut_mode} needs schedule.cut=recurrent")
        if self.cut_mode == "mlp-placebo" and self.cut_through is not None:
            # the placebo's share is attention's as a whole: its MLP paths are those that avoid every attention
            raise ProbeError("schedule.cut_mode=mlp-placebo measures the path through every attention; drop "
                             "schedule.cut_through")

    @property
    def name(self) -> str:
        """The variant's one name (``joint``, ``dat``, ``stopgrad-rnn0``, ``dat+frozen-rnn``, ...)."""
        return variant_name(self)

    def to_dict(self) -> dict[str, Any]:
        """The settings, plus the variant's name for whoever reads the record (it is checked when read back)."""
        d: dict[str, Any] = {"variant": self.name}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            d[f.name] = value.to_dict() if isinstance(value, At) else list(value) if isinstance(value, tuple) else value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScheduleConfig:
        """A schedule as ``to_dict`` wrote it, or as an old checkpoint recorded it (``kind``, ``switch`` as a bare
        number, ``stopgrad_scope``, ``freeze_recurrent_after_switch``): both mean exactly what they meant."""
        known = {f.name for f in dataclasses.fields(cls)} | {"variant", "kind", "stopgrad_scope"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ProbeError(f"schedule: unknown setting(s) {', '.join(unknown)}")
        return cls(**d)

    def at_steps(self, total_steps: int) -> ScheduleConfig:
        """The same schedule with every point given as the step it falls on in a run of ``total_steps``."""
        points = {n: At(step=getattr(self, n).resolve(total_steps)) for n in POINTS if getattr(self, n) is not None}
        return dataclasses.replace(self, **points)

    def with_variant(self, name: str) -> ScheduleConfig:
        """These timings with the settings of the variant ``name`` (``VARIANTS``; ``delayed`` is ``dat``)."""
        shape = variant_settings(name)
        return dataclasses.replace(self, **{n: shape.get(n, getattr(ScheduleConfig(), n)) for n in SHAPE})


# --- the variants -------------------------------------------------------------------------------------------------
_DAT = dict(gate="off-until-switch", attention_trains="from-switch")
VARIANTS: dict[str, dict[str, Any]] = {
    "joint": {},  # attention on and training from step 0
    "dat": _DAT,  # Delayed Attention Training: attention off and out of the optimizer until the switch
    "ramp": dict(_DAT, gate="ramp"),  # like dat, the gate rising over ramp_window from the switch
    "frozen": dict(attention_trains="from-switch"),  # attention's forward on, its weights at their init until T
    "adaptive": dict(_DAT, adaptive=True),  # dat, switching when the LSTM-only phase plateaus
    "stopgrad": dict(cut="all"),  # no gradient back through attention into anything below it
    "stopgrad-rnn": dict(cut="recurrent"),  # ... into the recurrent sublayers only
    "stopgrad-nonrnn": dict(cut="nonrecurrent"),  # ... into everything but the recurrent sublayers
    "stopgrad-rnn0": dict(cut="recurrent", cut_block=0),  # ... into block 0's recurrent sublayer only
    "stopgrad-rnn1": dict(cut="recurrent", cut_block=1),  # ... into block 1's recurrent sublayer only
    "dat+frozen-rnn": dict(_DAT, freeze_recurrent_after_switch=True),  # dat; the LSTMs stop learning at the switch
    # co-adaptation: is it gradient through an attention *that is learning* that harms block 0's LSTM?
    "frozen-copy": dict(cut="recurrent", cut_block=0, cut_mode="initial-attention"),  # LSTM 0 learns through
    # attention's initial weights only, while attention itself learns normally
    "placebo": dict(cut="recurrent", cut_block=0, cut_mode="mlp-placebo"),  # LSTM 0 loses as much gradient as
    # stopgrad-rnn0 removes, taken from its attention-free MLP paths; attention's path stays
    # which attention's path into which LSTM: one path at a time, so block 0 and block 1 compare without confound
    "stopgrad-rnn0-att0": dict(cut="recurrent", cut_block=0, cut_through=(0,)),
    "stopgrad-rnn0-att1": dict(cut="recurrent", cut_block=0, cut_through=(1,)),
    "stopgrad-rnn1-att1": dict(cut="recurrent", cut_block=1, cut_through=(1,)),
}
"""The named variants over the settings of ``ScheduleConfig`` (settings not given keep their defaults): a new
variant is one entry. Timings (switch, ramp window, cut_until, the adaptive thresholds) are not part of a name."""
ALIASES = {"delayed": "dat"}
"""Other names a variant is known by (``delayed`` is the old kind of ``dat``)."""
_FROZEN_RNN = "+frozen-rnn"


def variant_settings(name: str) -> dict[str, Any]:
    """The settings of a named variant (an alias, or a table entry with ``+frozen-rnn`` appended, works too)."""
    name = ALIASES.get(name, name)
    if name in VARIANTS:
        return dict(VARIANTS[name])
    base = name.removesuffix(_FROZEN_RNN)
    if base != name and ALIASES.get(base, base) in VARIANTS:
        return dict(VARIANTS[ALIASES.get(base, base)], freeze_recurrent_after_switch=True)
    raise ProbeError(f"unknown schedule variant {name!r}; choose one of {', '.join(VARIANTS)} (or one of them "
                     f"with {_FROZEN_RNN})")


def _shape(settings: dict[str, Any]) -> tuple[Any, ...]:
    defaults = ScheduleConfig()
    return tuple(settings.get(n, getattr(defaults, n)) for n in SHAPE)


def variant_name(cfg: ScheduleConfig | dict[str, Any]) -> str:
    """The one name of a schedule's variant: its ``VARIANTS`` entry; else an entry plus ``+frozen-rnn``; else its
    settings that differ from ``joint``'s, spelled out (a combination nobody has named yet).

    ``cfg`` may also be a schedule as a checkpoint recorded it, old or new: only the settings that make the variant
    are read, so a record whose timings are incomplete is still named."""
    settings = shape_of(cfg) if isinstance(cfg, dict) else {n: getattr(cfg, n) for n in SHAPE}
    shape = _shape(settings)
    for name, entry in VARIANTS.items():
        if _shape(entry) == shape:
            return name
    if settings.get("freeze_recurrent_after_switch"):
        base = variant_name(dict(settings, freeze_recurrent_after_switch=False))
        if base in VARIANTS:
            return base + _FROZEN_RNN
    defaults = ScheduleConfig()
    return ",".join(f"{n}={v}" for n, v in zip(SHAPE, shape, strict=True) if v != getattr(defaults, n))


def shape_of(d: dict[str, Any]) -> dict[str, Any]:
    """The variant-making settings of a recorded schedule (old ``kind``/``stopgrad_scope`` records translated)."""
    if "kind" in d or "stopgrad_scope" in d:
        shape = _from_kind(d.get("kind") or "joint", d.get("stopgrad_scope") or "all")
        shape["freeze_recurrent_after_switch"] = bool(d.get("freeze_recurrent_after_switch", False))
        return shape
    shape = {n: d[n] for n in SHAPE if n in d}
    if isinstance(shape.get("cut_through"), list):
        shape["cut_through"] = tuple(shape["cut_through"])
    return shape


# --- the old vocabulary -------------------------------------------------------------------------------------------
OLD_KINDS = ("joint", "delayed", "ramp", "frozen", "adaptive", "stopgrad")
_OLD_SCOPE = re.compile(r"(all|recurrent|nonrecurrent)(?::(\d+))?")


def _from_kind(kind: str, scope: str) -> dict[str, Any]:
    """The settings an old ``kind`` and ``stopgrad_scope`` meant."""
    if kind not in OLD_KINDS:
        raise ProbeError(f"unknown schedule {kind!r}; choose one of {', '.join(OLD_KINDS)}")
    m = _OLD_SCOPE.fullmatch(scope) if isinstance(scope, str) else None
    if m is None or (m.group(2) is not None and m.group(1) != "recurrent"):
        raise ProbeError(f"schedule.stopgrad_scope must be one of all, recurrent, nonrecurrent or recurrent:N "
                         f"(block N's LSTM only), got {scope!r}")
    if scope != "all" and kind != "stopgrad":
        raise ProbeError(f"schedule.stopgrad_scope={scope} needs schedule.kind=stopgrad")
    settings = variant_settings("stopgrad" if kind == "stopgrad" else kind)
    if kind == "stopgrad":
        settings["cut"] = m.group(1)
        settings["cut_block"] = None if m.group(2) is None else int(m.group(2))
    return settings


def old_kind(cfg: ScheduleConfig | dict[str, Any]) -> str:
    """``cfg`` in the old vocabulary of kinds (``joint``, ``delayed``, ``ramp``, ``frozen``, ``adaptive``,
    ``stopgrad``), which the ``schedule`` column of results has always used; a combination the old kinds cannot
    express gets its variant name."""
    name = variant_name(cfg).removesuffix(_FROZEN_RNN)
    if name.startswith("stopgrad"):
        return "stopgrad"
    return "delayed" if name == "dat" else name


# --- the live schedule ---------------------------------------------------------------------------------------------
class Schedule:
    """The live schedule of one run. Its only mutable state is the adaptive switch step (saved for resume)."""

    def __init__(self, cfg: ScheduleConfig, total_steps: int, switched_at: int | None = None) -> None:
        self.cfg = cfg
        self.total_steps = total_steps
        self.switch_step = 0 if cfg.switch is None else cfg.switch.resolve(total_steps)
        self.window = cfg.ramp_window.resolve(total_steps)
        self.min_switch = cfg.min_switch.resolve(total_steps)
        fixed = (cfg.gate != "on" or cfg.attention_trains == "from-switch") and not cfg.adaptive
        if fixed and self.switch_step >= total_steps:
            raise ProbeError(
                f"schedule {cfg.name}: attention would switch on at step {self.switch_step}, after the last step "
                f"({total_steps}); give the switch as a fraction (schedule.switch_fraction=0.44) or train longer"
            )
        self.switched_at = switched_at
        self.initial_attention: dict[str, Tensor] | None = None
        self._best = -1.0
        self._stale = 0

    @property
    def effective_switch(self) -> int:
        """The step phase 2 starts at: the adaptive switch once it has happened, else the configured one."""
        if self.cfg.adaptive and self.switched_at is not None:
            return self.switched_at
        return self.switch_step

    def gate(self, step: int) -> float:
        """Attention gate at ``step`` (the same for every block)."""
        t = self.effective_switch
        if self.cfg.gate == "on":
            return 1.0
        if step < t:
            return 0.0
        if self.cfg.gate == "ramp" and self.window > 0:
            return min(1.0, (step - t + 1) / self.window)
        return 1.0

    def attention_trains(self, step: int) -> bool:
        return self.cfg.attention_trains == "always" or step >= self.effective_switch

    def recurrent_trains(self, step: int) -> bool:
        return not (self.cfg.freeze_recurrent_after_switch and step >= self.effective_switch)

    def cuts(self, step: int) -> bool:
        """Whether attention's backward path is cut at ``step``."""
        if self.cfg.cut == "none":
            return False
        if self.cfg.cut_until is not None:
            return step < self.cfg.cut_until.resolve(self.total_steps)
        return self.cfg.switch is None or step < self.effective_switch

    def gradient_policy(self, step: int) -> GradientPolicy:
        """How the gradient of ``step`` is taken: plainly, or with attention's backward path cut for some
        parameters."""
        if not self.cuts(step):
            return PLAIN
        if self.cfg.cut == "all":
            return DetachAttention(self.cfg.cut_through)
        if self.cfg.cut_mode == "initial-attention":
            if self.initial_attention is None:
                raise ProbeError(f"schedule {self.cfg.name}: the gradient through attention's initial weights needs "
                                 f"them; call Schedule.remember_initial(model) on the freshly built model")
            return InitialAttentionPath(self.cfg.cut_block, self.cfg.cut_through, self.initial_attention)
        if self.cfg.cut_mode == "mlp-placebo":
            return MlpPlacebo(self.cfg.cut_block)
        return SplitCut(self.cfg.cut, self.cfg.cut_block, self.cfg.cut_through)

    def remember_initial(self, model: HookedSequenceModel) -> None:
        """Keep the initial weights of the attention the ``initial-attention`` cut routes through; call it on the
        freshly built model (a resumed run rebuilds it from the same seed before loading its weights, so it keeps the
        same ones). A no-op for other schedules."""
        if self.cfg.cut_mode != "initial-attention":
            return
        names = {id(p): n for n, p in model.named_parameters()}
        through = self.cfg.cut_through
        chosen = [b for i, b in enumerate(model.blocks) if hasattr(b, "attn") and (through is None or i in through)]
        self.initial_attention = {names[id(p)]: p.detach().clone() for b in chosen for m in (b.attn, b.ln_attn)
                                  for p in m.parameters()}

    def check_model(self, model: HookedSequenceModel) -> None:
        """Refuse, before any training, a cut that names blocks the model does not have."""
        n = len(model.blocks)
        block = self.cfg.cut_block
        if block is not None and not (block < n and model.recurrent_parameters(block)):
            raise ProbeError(f"schedule {self.cfg.name}: the model has no recurrent sublayer in block {block} "
                             f"({n} blocks)")
        for b in self.cfg.cut_through or ():
            if not (b < n and hasattr(model.blocks[b], "attn")):
                raise ProbeError(f"schedule.cut_through: the model has no attention in block {b} ({n} blocks)")

    def observe(self, step: int, state_accuracy: float) -> bool:
        """Feed a validation accuracy (adaptive only). Returns True if this observation switches attention on."""
        if not self.cfg.adaptive or self.switched_at is not None:
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


# --- gradient policies: how a step's gradient is taken ------------------------------------------------------------
LossFn = Callable[[], "tuple[Tensor, Tensor]"]
"""Runs the model's forward on the step's batch and returns ``(logits, loss)``."""


class GradientPolicy:
    """Takes one step's gradient: runs ``loss_fn`` and leaves the gradient in each parameter's ``.grad`` (which the
    caller has zeroed). Returns ``(logits, loss)`` of the forward the step reports."""

    def backward(self, model: HookedSequenceModel, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        logits, loss = loss_fn()
        loss.backward()
        return logits, loss


PLAIN = GradientPolicy()


@contextmanager
def _detached(model: HookedSequenceModel, blocks: tuple[int, ...] | None) -> Iterator[None]:
    """Within the block the stream entering the attention of ``blocks`` (None: every block) is detached."""
    chosen = [b for i, b in enumerate(model.blocks) if hasattr(b, "attn") and (blocks is None or i in blocks)]
    for b in chosen:
        b.attn_stopgrad = True
    try:
        yield
    finally:
        for b in chosen:
            b.attn_stopgrad = False


class DetachAttention(GradientPolicy):
    """Every parameter's gradient through attention is cut: the stream is detached where it enters attention, so
    attention's own weights still learn but nothing below it learns through it."""

    def __init__(self, blocks: tuple[int, ...] | None = None) -> None:
        self.blocks = blocks

    def backward(self, model: HookedSequenceModel, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        with _detached(model, self.blocks):
            return super().backward(model, loss_fn)


def _grads(loss_fn: LossFn, params: list[nn.Parameter], *contexts: Any) -> list[Tensor]:
    """The gradient of ``params`` in a forward run inside ``contexts`` (zeros where a parameter is unreached)."""
    import torch

    with ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        _, loss = loss_fn()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


@contextmanager
def _mlp_inputs_detached(model: HookedSequenceModel) -> Iterator[None]:
    """Within the block the stream entering every MLP sublayer is detached (a hook on its pre-LN; the stream itself
    and the forward values are untouched)."""
    handles = [b.ln_mlp.register_forward_pre_hook(lambda _m, args: (args[0].detach(), *args[1:]))
               for b in model.blocks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def _parameters_replaced(model: HookedSequenceModel, values: dict[str, Tensor]) -> Iterator[None]:
    """Within the block the named parameters read as ``values`` (constants), as ``torch.func.functional_call`` would;
    the model's own parameters (and their optimizer state) are untouched and back on exit."""
    saved = []
    try:
        for name, value in values.items():
            prefix, _, leaf = name.rpartition(".")
            module = model.get_submodule(prefix)
            saved.append((module, leaf, module._parameters[leaf]))
            module._parameters[leaf] = value
        yield
    finally:
        for module, leaf, param in reversed(saved):
            module._parameters[leaf] = param


class SplitCut(GradientPolicy):
    """One side's gradient through attention is cut, the other's kept: a forward with the stream detached at
    attention gives the cut side's gradient (for the LSTM weights, the ``g_rec`` of probe.gradients), a plain forward
    and backward the rest; the cut side's ``.grad`` is then replaced. Two backward passes a step."""

    def __init__(self, side: str, block: int | None = None, through: tuple[int, ...] | None = None) -> None:
        self.side, self.block, self.through = side, block, through

    def parameters(self, model: HookedSequenceModel) -> list[nn.Parameter]:
        """The parameters whose gradient avoids attention."""
        if self.side == "recurrent":
            return model.recurrent_parameters(self.block)
        rec = {id(p) for p in model.recurrent_parameters()}
        return [p for p in model.parameters() if id(p) not in rec]

    def backward(self, model: HookedSequenceModel, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        import torch

        params = self.parameters(model)
        trained = [p for p in params if p.requires_grad]
        with _detached(model, self.through):
            _, cut_loss = loss_fn()
            grads = torch.autograd.grad(cut_loss, trained, allow_unused=True) if trained else ()
        found = dict(zip(map(id, trained), grads, strict=True))
        logits, loss = super().backward(model, loss_fn)
        for p in params:  # these learn only from paths that avoid attention
            p.grad = found.get(id(p))  # None where the parameter is frozen or unreached, as after a plain backward
        return logits, loss


class InitialAttentionPath(GradientPolicy):
    """Block ``block``'s recurrent sublayer (every block's if None) learns through attention as it was at
    initialisation, never through the attention that has learned since:

        g_lstm = g_cut(theta) + [g_full(theta_0) - g_cut(theta_0)]

    where g_cut is the gradient with the stream detached at the attention of ``through`` (None: every block), g_full
    the plain one, theta the current weights and theta_0 the same with those attentions' weights (and their pre-LN)
    at their initial values. The bracket is the path through the initial attention; at step 0 the sum is the plain
    gradient. Every other parameter, attention included, gets the plain gradient. Four backward passes a step."""

    def __init__(self, block: int | None, through: tuple[int, ...] | None, initial: dict[str, Tensor]) -> None:
        self.block, self.through, self.initial = block, through, initial

    def backward(self, model: HookedSequenceModel, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        params = [p for p in model.recurrent_parameters(self.block) if p.requires_grad]
        if not params:
            return super().backward(model, loss_fn)
        cut = _grads(loss_fn, params, _detached(model, self.through))
        with _parameters_replaced(model, self.initial):
            full_0 = _grads(loss_fn, params)
            cut_0 = _grads(loss_fn, params, _detached(model, self.through))
        logits, loss = super().backward(model, loss_fn)
        for p, c, f0, c0 in zip(params, cut, full_0, cut_0, strict=True):
            p.grad = c + (f0 - c0)
        return logits, loss


class MlpPlacebo(GradientPolicy):
    """A placebo for ``stopgrad-rnnN``: block ``block``'s recurrent sublayer (every block's if None) loses as much
    gradient norm as the cut through attention would remove, but from a path that is not attention's. With g_full the
    plain gradient, g_na the gradient with the stream detached at every attention, and g_none the gradient with it
    detached at every attention and every MLP:

        g_att = g_full - g_na     (every path through some attention: kept whole)
        g_mlp = g_na - g_none     (every path through some MLP and no attention: the placebo's path)
        g_lstm = g_full - s * g_mlp,   s = min(1, |g_att| / |g_mlp|)

    norms taken over the sublayer's parameters together, so the removed norm |s * g_mlp| equals |g_att| (or is all of
    g_mlp where that is smaller). Every other parameter gets the plain gradient. Three backward passes a step."""

    def __init__(self, block: int | None) -> None:
        self.block = block

    def backward(self, model: HookedSequenceModel, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        import torch

        params = [p for p in model.recurrent_parameters(self.block) if p.requires_grad]
        if not params:
            return super().backward(model, loss_fn)
        no_att = _grads(loss_fn, params, _detached(model, None))
        neither = _grads(loss_fn, params, _detached(model, None), _mlp_inputs_detached(model))
        logits, loss = super().backward(model, loss_fn)
        full = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        att_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(f - n)
                                                         for f, n in zip(full, no_att, strict=True)]))
        mlp = [n - z for n, z in zip(no_att, neither, strict=True)]
        mlp_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(m) for m in mlp]))
        scale = torch.clamp(att_norm / mlp_norm, max=1.0) if mlp_norm > 0 else mlp_norm.new_zeros(())
        for p, f, m in zip(params, full, mlp, strict=True):
            p.grad = f - scale * m
        return logits, loss
