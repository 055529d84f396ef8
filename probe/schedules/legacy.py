"""Every old spelling of a schedule, read here and nowhere else, so that an old record or sweep means what it meant
when it was written.

The ways in, each used in one place: ``upgrade_schedule`` turns a recorded schedule of any age into today's record,
once (``probe.checkpoint`` calls it when it reads a file of an older format, and ``python -m probe.checkpoint upgrade``
rewrites such a file with it); ``rewrite_overrides`` turns old ``--set schedule.*`` items into today's (the ``--set``
grammar); and ``old_kind`` names a schedule in the old vocabulary of kinds that the ``schedule`` column of results has
always used (``Checkpoint.schedule``).

The old spellings:

- ``kind`` (``joint``, ``delayed``, ``ramp``, ``frozen``, ``adaptive``, ``stopgrad``) and ``stopgrad_scope`` (``all``,
  ``recurrent``, ``nonrecurrent``, ``recurrent:N``) named a variant before schedules were independent settings;
  ``delayed`` is today's ``dat``.
- A point (``switch``, ``ramp_window``, ``min_switch``, ``cut_until``) recorded as a bare number was a step if >= 1 (or
  0) and a fraction of the run if in (0, 1): a recorded ``1.0`` is step 1. A recorded switch of 0 meant no switch.
  (``--set schedule.switch=1.0`` today is the whole run: ``points.parse_point``.)
- A record may hold a setting that did nothing (a switch in ``joint``): it is dropped, since it did nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from probe.errors import ProbeError
from probe.schedules.points import At
from probe.schedules.settings import (
    DEFAULTS,
    FROZEN_RNN,
    POINTS,
    SHAPE,
    ScheduleConfig,
    variant_name,
    variant_settings,
    without_unused,
)

KINDS = {"joint": "joint", "delayed": "dat", "ramp": "ramp", "frozen": "frozen", "adaptive": "adaptive",
         "stopgrad": "stopgrad"}
"""Each old kind and the variant it names today."""
ALIASES = {"delayed": "dat"}
"""Old variant names (``--set schedule.variant=delayed``)."""
_SCOPE = re.compile(r"(all|recurrent|nonrecurrent)(?::(\d+))?")


def _scope(scope: Any) -> dict[str, Any]:
    """The cut an old ``stopgrad_scope`` meant."""
    m = _SCOPE.fullmatch(scope) if isinstance(scope, str) else None
    if m is None or (m.group(2) is not None and m.group(1) != "recurrent"):
        raise ProbeError(f"schedule.stopgrad_scope must be one of all, recurrent, nonrecurrent or recurrent:N "
                         f"(block N's LSTM only), got {scope!r}")
    return {"cut": m.group(1), "cut_block": None if m.group(2) is None else int(m.group(2))}


def _kind(kind: Any) -> str:
    if kind not in KINDS:
        raise ProbeError(f"unknown schedule {kind!r}; choose one of {', '.join(KINDS)} (or set schedule.variant to "
                         f"one of today's variants)")
    return KINDS[kind]


def _point(value: Any, name: str) -> At | None:
    """A recorded point: today's ``{"step": N}`` / ``{"fraction": F}``, or an old bare number."""
    if value is None or isinstance(value, (At, dict)):
        return None if value is None else At.of(value, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise ProbeError(f"schedule.{name} must be a non-negative number, got {value!r}")
    return At(fraction=float(value)) if 0 < value < 1 else At(step=int(value))


def _settings(record: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded schedule of any age as today's settings (those it gives), not yet checked as a whole: old kinds
    and scopes as the settings they meant, bare-number points as ``At``, an old switch of 0 as none."""
    d = dict(record)
    kind, scope = d.pop("kind", None), d.pop("stopgrad_scope", None)
    if kind is not None or scope is not None:
        given = [n for n in SHAPE if n in d and n != "freeze_recurrent_after_switch" and d[n] != DEFAULTS[n]]
        if given or "variant" in d:
            raise ProbeError(f"schedule: give either the old kind/stopgrad_scope or the settings "
                             f"({', '.join(given or ['variant'])}), not both")
        frozen = bool(d.pop("freeze_recurrent_after_switch", False))
        d.update(variant_settings(_kind(kind or "joint")), freeze_recurrent_after_switch=frozen)
        if scope is not None and scope != "all":
            if kind != "stopgrad":
                raise ProbeError(f"schedule.stopgrad_scope={scope} needs schedule.kind=stopgrad")
            d.update(_scope(scope))
        elif scope is not None:
            _scope(scope)
    for name in POINTS:
        if name in d:
            d[name] = _point(d[name], name)
    if d.get("switch") is not None and d["switch"].is_zero:
        d["switch"] = None  # an old switch of 0 meant "no switch"
    if isinstance(d.get("cut_through"), list):
        d["cut_through"] = tuple(d["cut_through"])
    return d


def why_not_today(record: Mapping[str, Any]) -> str:
    """Why ``record``, which today's ``ScheduleConfig.from_dict`` refused, is not a schedule record of today: an old
    spelling (named with the function that converts it), or no schedule at all (with the reason). For a writer's
    refusal only: nothing converted here enters a file."""
    try:
        upgrade_schedule(record)
    except (ProbeError, TypeError) as e:
        return f"is not a schedule ({e})"
    return "is in an old spelling; probe.schedules.legacy.upgrade_schedule converts it to today's"


def upgrade_schedule(record: Mapping[str, Any]) -> dict[str, Any]:
    """A schedule as a record of any age spelt it, as today's record (``ScheduleConfig.to_dict``): old kinds and
    scopes, bare-number points and settings that did nothing all mean what they meant. A record that was never a
    schedule (an unknown kind, a variant that needs a switch and has none) is a ``ProbeError``."""
    return ScheduleConfig.from_dict(without_unused(_settings(record))).to_dict()


def rewrite_overrides(items: list[str]) -> list[str]:
    """``--set`` items with the old schedule spellings in today's: ``schedule.kind=K`` is ``schedule.variant`` of K's
    variant, ``schedule.variant=delayed`` is ``dat``, and ``schedule.stopgrad_scope=S`` (applied last, onto whatever
    variant the other items chose) is ``schedule.cut`` and ``schedule.cut_block``. Other items pass unchanged."""
    out: list[str] = []
    scope: str | None = None
    stopgrad = False
    for item in items:
        key, sep, raw = item.partition("=")
        if key == "schedule.kind":
            out.append(f"schedule.variant={_kind(raw)}")
            stopgrad = raw == "stopgrad"
        elif key == "schedule.variant" and sep:
            out.append(f"schedule.variant={ALIASES.get(raw, raw)}")
            stopgrad = raw.startswith("stopgrad")
        elif key == "schedule.stopgrad_scope":
            scope = raw
        else:
            out.append(item)
    if scope is not None:
        cut = _scope(scope)
        if stopgrad:
            block = "null" if cut["cut_block"] is None else cut["cut_block"]
            out += [f"schedule.cut={cut['cut']}", f"schedule.cut_block={block}"]
        elif scope != "all":  # "all" without a stopgrad kind was the old default: nothing to do
            raise ProbeError(f"schedule.stopgrad_scope={scope} needs schedule.kind=stopgrad")
    return out


def old_kind(cfg: ScheduleConfig | Mapping[str, Any]) -> str:
    """``cfg`` (or its settings) in the old vocabulary of kinds (``joint``, ``delayed``, ``ramp``, ``frozen``,
    ``adaptive``, ``stopgrad``); a combination the old kinds cannot express gets its variant name."""
    name = variant_name(cfg).removesuffix(FROZEN_RNN)
    if name.startswith("stopgrad"):
        return "stopgrad"
    return "delayed" if name == "dat" else name
