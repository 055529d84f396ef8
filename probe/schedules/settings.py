"""A Delayed Attention Training schedule as independent settings, the rules between them, and the named variants."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import InitVar, dataclass
from typing import Any

from probe.errors import ProbeError
from probe.schedules.points import At

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
CUT_MODES = ("drop", "initial-attention", "mlp-placebo", "random-direction", "lagged-attention", "initial-model")
"""How a recurrent cut treats the gradient it cuts: drops it; replaces it by the gradient through attention's
*initial* weights (attention still learns, but the LSTM never learns through an attention that has learned); keeps
attention's path and instead removes an equal norm from the paths through the MLPs, at most all of theirs (a
placebo: as much gradient taken away where the MLP paths carry that much, none of it attention's; each step logs
whether the cap bound); replaces it by a random direction of the same norm (does *any* injected term
harm?); by the gradient through attention's weights of ``cut_lag`` steps ago (mismatched by a controlled amount); or
by the gradient through a whole model at its initial weights except the recurrent sublayer that learns (a consistent
counterfactual, where ``initial-attention`` mixes initial attention with current MLPs)."""
POINTS = ("switch", "ramp_window", "min_switch", "cut_until")
"""The settings that are points in the run (``At``)."""
SHAPE = ("gate", "attention_trains", "cut", "cut_block", "cut_through", "cut_mode", "cut_lag",
         "freeze_recurrent_after_switch", "adaptive")
"""The settings that make a variant what it is (its name); the others say when and how fast."""
ADAPTIVE_ONLY = ("patience", "min_delta", "target", "min_switch")
"""The settings only an adaptive schedule reads."""


@dataclass(frozen=True)
class ScheduleConfig:
    """A schedule as independent settings; ``VARIANTS`` names the combinations the studies use.

    - ``gate``: the attention gate's curve (``GATES``), the same for every block.
    - ``switch``: when phase 1 ends (``At``: a step or a fraction of the run). Settings that say "until the switch"
      or "from the switch" need one, and a switch that no setting waits for is refused.
    - ``ramp_window``: how long the ``ramp`` gate takes to rise from 0 to 1.
    - ``attention_trains``: ``always`` or ``from-switch`` (``ATTENTION_TRAINS``).
    - ``cut``: whose gradient through attention is cut (``CUTS``); ``cut_block``: with ``recurrent``, block N's
      recurrent sublayer only; ``cut_through``: the blocks whose attention the cut applies to (None: every block);
      ``cut_until``: the cut lasts until this point (None: until the switch, or the whole run without one);
      ``cut_mode``: with ``recurrent``, what becomes of the cut gradient (``CUT_MODES``: dropped, recomputed through
      attention's initial weights, or kept while a matched share of the MLP paths is removed instead). The cut
      leaves the forward unchanged and attention's own weights learning: it is the causal test of "attention's
      gradients pollute the LSTM". ``cut_lag``: with ``cut_mode=lagged-attention``, how many steps old the
      attention weights are that the recurrent sublayer learns through (a part of the variant's name: ``lagged-copy-50``
      and ``lagged-copy-250`` are two variants).
    - ``freeze_recurrent_after_switch``: from the switch on the recurrent sublayers (LSTM and its pre-LN) stop
      training, so that phase 2 cannot co-adapt them; embeddings, MLPs and attention still train.
    - ``adaptive``: switch when the state-subtask validation accuracy of phase 1 has not improved by ``min_delta``
      for ``patience`` evaluations (or reached ``target``), never before ``min_switch``; ``switch`` is then the
      latest switch (the cap).

    ``variant`` names a ``VARIANTS`` entry whose settings to take (``ScheduleConfig(variant="dat",
    switch=At(step=2000))``); with settings given as well it must be their name, as in a record. A setting that no
    other setting reads (a switch in ``joint``, a ramp window without the ramp gate, the adaptive thresholds of a
    fixed switch) is refused: it would be recorded and do nothing. An old record is today's once
    ``legacy.upgrade_schedule`` has converted it (a checkpoint of an older format is converted when it is loaded).
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
    cut_lag: int | None = None
    freeze_recurrent_after_switch: bool = False
    adaptive: bool = False
    patience: int = 3
    min_delta: float = 0.002
    target: float = 0.999
    min_switch: At = At(fraction=0.1)
    variant: InitVar[str | None] = None

    def __post_init__(self, variant: str | None) -> None:
        if isinstance(self.cut_through, list):  # as JSON gives it back
            object.__setattr__(self, "cut_through", tuple(self.cut_through))
        if variant is not None:
            if all(getattr(self, n) == DEFAULTS[n] for n in SHAPE):
                for name, value in variant_settings(variant).items():
                    object.__setattr__(self, name, value)
            elif variant_name(self) != variant:  # a record: its name must fit its settings
                raise ProbeError(f"schedule.variant {variant!r} does not match the settings given, which make "
                                 f"{variant_name(self)!r}")
        for name in POINTS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, At.of(value, name))
        self._validate()
        unused = unused_settings(self)
        if unused:
            raise ProbeError(f"schedule.{unused[0]} does nothing in schedule {self.name}: {UNUSED_WHY[unused[0]]}")

    def _validate(self) -> None:
        for name, allowed in (("gate", GATES), ("attention_trains", ATTENTION_TRAINS), ("cut", CUTS),
                              ("cut_mode", CUT_MODES)):
            if getattr(self, name) not in allowed:
                raise ProbeError(f"schedule.{name} {getattr(self, name)!r}: choose one of {', '.join(allowed)}")
        for name in ("freeze_recurrent_after_switch", "adaptive"):
            if not isinstance(getattr(self, name), bool):
                raise ProbeError(f"schedule.{name} must be true or false")
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
            raise ProbeError(f"schedule.patience must be a positive integer, got {self.patience!r}")
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
            raise ProbeError(f"schedule {', '.join(needs)} needs a switch: set schedule.switch=N (a step) or "
                             f"schedule.switch=F% (a fraction of the run)")
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
        if (self.cut_lag is not None) != (self.cut_mode == "lagged-attention"):
            raise ProbeError("schedule.cut_lag goes with schedule.cut_mode=lagged-attention, and only with it (the "
                             "lag in steps, e.g. 50)")
        if self.cut_lag is not None and (isinstance(self.cut_lag, bool) or not isinstance(self.cut_lag, int)
                                         or self.cut_lag < 1):
            raise ProbeError(f"schedule.cut_lag must be a positive number of steps, got {self.cut_lag!r}")
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
    def from_dict(cls, d: Mapping[str, Any]) -> ScheduleConfig:
        """A schedule as ``to_dict`` writes it, and no other spelling (``legacy.upgrade_schedule`` converts an old
        record)."""
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)} - {"variant"})
        if unknown:
            raise ProbeError(f"schedule: unknown setting(s) {', '.join(unknown)} (an old record? a checkpoint of an "
                             f"older format is converted by load_checkpoint; python -m probe.checkpoint upgrade FILE "
                             f"rewrites it once)")
        return cls(**d)

    def at_steps(self, total_steps: int) -> ScheduleConfig:
        """The same schedule with every point given as the step it falls on in a run of ``total_steps`` (the same
        settings, spelled in steps: not checked again, since a default given in steps no longer looks like one)."""
        resolved = copy.copy(self)
        for name in POINTS:
            if getattr(self, name) is not None:
                object.__setattr__(resolved, name, At(step=getattr(self, name).resolve(total_steps)))
        return resolved


DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ScheduleConfig)}
"""Each setting's default: together, the ``joint`` schedule."""


# --- a setting that does nothing ---------------------------------------------------------------------------------
UNUSED_WHY = {
    "switch": "no setting waits for a switch (a gate, attention_trains=from-switch, freeze_recurrent_after_switch, "
              "adaptive, or a cut without cut_until); drop it, or choose a variant that switches (dat, ramp, frozen, "
              "adaptive)",
    "ramp_window": "only schedule.gate=ramp reads it; drop it",
    **dict.fromkeys(ADAPTIVE_ONLY, "only an adaptive schedule reads it; drop it"),
}
"""Why each setting that ``unused_settings`` can name does nothing, and the fix."""


def unused_settings(settings: ScheduleConfig | Mapping[str, Any]) -> list[str]:
    """The settings given (away from their defaults) that no other setting reads."""
    get = settings.get if isinstance(settings, Mapping) else lambda n, d: getattr(settings, n)

    def s(name: str) -> Any:
        value = get(name, DEFAULTS[name])
        return At.of(value, name) if name in POINTS and value is not None else value

    switch_read = (s("gate") != "on" or s("attention_trains") == "from-switch" or s("freeze_recurrent_after_switch")
                   or s("adaptive") or (s("cut") != "none" and s("cut_until") is None))
    unused = [] if s("switch") is None or switch_read else ["switch"]
    if s("ramp_window") != DEFAULTS["ramp_window"] and s("gate") != "ramp":
        unused.append("ramp_window")
    if not s("adaptive"):
        unused += [n for n in ADAPTIVE_ONLY if s(n) != DEFAULTS[n]]
    return unused


def without_unused(settings: Mapping[str, Any], keep: Iterable[str] = ()) -> dict[str, Any]:
    """``settings`` less those that would do nothing, except ``keep`` (what a user gave: that is refused instead)."""
    drop = set(unused_settings(settings)) - set(keep)
    return {n: v for n, v in settings.items() if n not in drop}


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
    "placebo": dict(cut="recurrent", cut_block=0, cut_mode="mlp-placebo"),  # LSTM 0 loses up to the norm
    # stopgrad-rnn0 removes, taken from its attention-free MLP paths (at most all of theirs: the cap, logged per step);
    # attention's path stays
    # controls for frozen-copy, whose injected gradient mismatches the forward pass: does any injected term harm
    # (random-path), one mismatched by a controlled lag (lagged-copy-K), or only an inconsistent counterfactual
    # (frozen-model-copy: the whole model but LSTM 0 at its initial weights)?
    "random-path": dict(cut="recurrent", cut_block=0, cut_mode="random-direction"),
    "lagged-copy-50": dict(cut="recurrent", cut_block=0, cut_mode="lagged-attention", cut_lag=50),
    "lagged-copy-250": dict(cut="recurrent", cut_block=0, cut_mode="lagged-attention", cut_lag=250),
    "frozen-model-copy": dict(cut="recurrent", cut_block=0, cut_mode="initial-model"),
    # which attention's path into which LSTM: one path at a time, so block 0 and block 1 compare without confound
    "stopgrad-rnn0-att0": dict(cut="recurrent", cut_block=0, cut_through=(0,)),
    "stopgrad-rnn0-att1": dict(cut="recurrent", cut_block=0, cut_through=(1,)),
    "stopgrad-rnn1-att1": dict(cut="recurrent", cut_block=1, cut_through=(1,)),
}
"""The named variants over the settings of ``ScheduleConfig`` (settings not given keep their defaults): a new
variant is one entry. Timings (switch, ramp window, cut_until, the adaptive thresholds) are not part of a name."""
FROZEN_RNN = "+frozen-rnn"
"""Appended to a variant's name: the same with ``freeze_recurrent_after_switch``."""


def variant_settings(name: str) -> dict[str, Any]:
    """The settings of a named variant (a table entry, or one with ``+frozen-rnn`` appended), every variant-making
    setting given."""
    base = name.removesuffix(FROZEN_RNN)
    if name in VARIANTS or base in VARIANTS:
        settings = {n: DEFAULTS[n] for n in SHAPE} | VARIANTS[name if name in VARIANTS else base]
        return settings | ({"freeze_recurrent_after_switch": True} if name not in VARIANTS else {})
    raise ProbeError(f"unknown schedule variant {name!r}; choose one of {', '.join(VARIANTS)} (or one of them "
                     f"with {FROZEN_RNN})")


def _shape(settings: ScheduleConfig | Mapping[str, Any]) -> tuple[Any, ...]:
    get = settings.get if isinstance(settings, Mapping) else lambda n, d: getattr(settings, n)
    return tuple(get(n, DEFAULTS[n]) for n in SHAPE)


def variant_name(cfg: ScheduleConfig | Mapping[str, Any]) -> str:
    """The one name of a schedule's variant: its ``VARIANTS`` entry; else an entry plus ``+frozen-rnn``; else its
    settings that differ from ``joint``'s, spelled out (a combination nobody has named yet). ``cfg`` may be a
    mapping of settings (those not given at their defaults)."""
    shape = _shape(cfg)
    for name, entry in VARIANTS.items():
        if _shape(entry) == shape:
            return name
    settings = dict(zip(SHAPE, shape, strict=True))
    if settings["freeze_recurrent_after_switch"]:
        base = variant_name(dict(settings, freeze_recurrent_after_switch=False))
        if base in VARIANTS:
            return base + FROZEN_RNN
    return ",".join(f"{n}={v}" for n, v in settings.items() if v != DEFAULTS[n])


def check_fits_model(cfg: ScheduleConfig, model: Any) -> None:
    """Refuse a schedule that would do nothing on ``model`` (a ``ModelConfig``): any but ``joint`` on a model
    without attention; a recurrent cut or freeze on one without a recurrent sublayer."""
    if not model.has_attention and cfg != ScheduleConfig():
        raise ProbeError(f"schedule {cfg.name} does nothing on a {model.family} model, which has no attention; drop "
                         f"the schedule settings")
    if not model.has_lstm and (cfg.cut == "recurrent" or cfg.freeze_recurrent_after_switch):
        what = "schedule.cut=recurrent" if cfg.cut == "recurrent" else "schedule.freeze_recurrent_after_switch"
        raise ProbeError(f"{what} does nothing on a {model.family} model, which has no recurrent sublayer; drop it")
