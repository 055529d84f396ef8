"""The ``--set SECTION.FIELD=VALUE`` grammar: a preset's configs (or a checkpoint's) with overrides applied."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from probe.errors import ProbeError
from probe.external import AnyModelConfig, model_config_class, model_config_from_dict
from probe.schedules import legacy
from probe.schedules.points import At, parse_point
from probe.schedules.settings import (
    POINTS,
    UNUSED_WHY,
    ScheduleConfig,
    check_fits_model,
    unused_settings,
    variant_name,
    variant_settings,
    without_unused,
)
from probe.tasks import TaskConfig, make_task, task_from_dict
from probe.training.config import TrainConfig
from probe.training.presets import PRESETS

SECTIONS = ("model", "task", "train", "schedule")


def parse_value(raw: str) -> Any:
    """A ``--set`` value: JSON where it parses (numbers, true/false, null, lists), the raw string otherwise."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _check_type(section: str, cls: type, name: str, value: Any) -> None:
    """A ``--set`` value must name a field of its config and have that field's type (ints pass as floats)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields or (cls is TrainConfig and name == "schedule"):
        known = sorted(set(fields) - {"schedule"})
        if cls is ScheduleConfig:
            known = sorted({*known, "variant", *(f"{p}_{unit}" for p in POINTS for unit in ("step", "fraction"))})
        raise ProbeError(f"--set {section}.{name}: no such field; {section} has {', '.join(known)}")
    f = fields[name]
    default = f.default if f.default is not dataclasses.MISSING else None
    if default is None or value is None:
        return
    expected = type(default)
    ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise ProbeError(f"--set {section}.{name}={value!r}: expected {expected.__name__}, got {type(value).__name__}")


def _set_schedule(sched: dict[str, Any], name: str, value: Any) -> str:
    """Apply one ``schedule.NAME=VALUE`` to the settings ``sched``; returns the setting it gave."""
    if name == "variant":  # the variant's settings replace the variant-defining ones; timings stay
        if not isinstance(value, str):
            raise ProbeError(f"--set schedule.variant={value!r}: expected a variant name")
        sched.update(variant_settings(value))
        return name
    for point in POINTS:
        if name == point:  # a step (2000) or a fraction of the run (50%, 0.5, 1.0): points.parse_point
            sched[point] = None if value is None else parse_point(value, point)
            return point
        if name in (f"{point}_step", f"{point}_fraction"):
            try:
                sched[point] = At(**{name.removeprefix(point + "_"): value})
            except ProbeError as e:
                raise ProbeError(f"--set schedule.{name}={value!r}: {e}") from None
            return point
    _check_type("schedule", ScheduleConfig, name, value)
    if name == "cut_through" and isinstance(value, (int, list)) and not isinstance(value, bool):
        value = tuple(value) if isinstance(value, list) else (value,)
    sched[name] = value
    return name


def apply_overrides(sections: dict[str, dict[str, Any]], overrides: list[str], where: str = "") -> ScheduleConfig:
    """Apply ``SECTION.FIELD=VALUE`` items in order to the field dicts of ``sections`` (model, task, train,
    schedule); returns the schedule they give. Old schedule spellings are rewritten first
    (``legacy.rewrite_overrides``). A schedule setting given here that would do nothing is refused; one the
    preset gave that a variant given here leaves unread is dropped. ``where`` names the preset in messages."""
    given: dict[str, str] = {}
    for item in legacy.rewrite_overrides(list(overrides)):
        key, sep, raw = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or section not in SECTIONS:
            raise ProbeError(f"bad override {item!r}: use SECTION.FIELD=VALUE with SECTION in {', '.join(SECTIONS)}")
        value = parse_value(raw)
        if section == "schedule":
            given[_set_schedule(sections["schedule"], name, value)] = item
            continue
        if section != "task":  # task fields differ per task and are checked by the task's own dataclass
            model_class = model_config_class(sections["model"].get("family"))
            _check_type(section, {"model": model_class, "train": TrainConfig}[section], name, value)
        sections[section][name] = value
    sched = sections["schedule"]
    for name in unused_settings(sched):
        if name in given:
            raise ProbeError(f"--set {given[name]} does nothing{where} (schedule {variant_name(sched)}): "
                             f"{UNUSED_WHY[name]}")
    return ScheduleConfig(**without_unused(sched))


def build_configs(preset: str, task: str = "interleaved", overrides: list[str] | None = None,
                  **train_overrides: Any) -> tuple[AnyModelConfig, TaskConfig, TrainConfig]:
    """Configs of a preset, with ``section.field=value`` overrides (sections: model, task, train, schedule)."""
    if preset not in PRESETS:
        raise ProbeError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    spec = PRESETS[preset]
    sections: dict[str, dict[str, Any]] = {
        "model": dict(spec["model"]), "task": {}, "train": dict(spec["train"]),
        "schedule": dict(spec["train"].get("schedule", {})),
    }
    sections["train"].pop("schedule", None)
    schedule = apply_overrides(sections, overrides or [], f" in preset {preset}")
    sections["train"].update({k: v for k, v in train_overrides.items() if v is not None})
    try:
        task_cfg = make_task(task, **sections["task"])
        model_class = model_config_class(sections["model"].get("family"))
        model_cfg = model_class(vocab_size=task_cfg.vocab_size, **sections["model"])
        train_cfg = TrainConfig(schedule=schedule, **sections["train"])
    except TypeError as e:
        raise ProbeError(f"preset {preset}: {e}") from None
    try:
        check_fits_model(schedule, model_cfg)
    except ProbeError as e:
        raise ProbeError(f"preset {preset}: {e}") from None
    return model_cfg, task_cfg, train_cfg


def override_configs(model_cfg: AnyModelConfig, task_cfg: TaskConfig, train_cfg: TrainConfig,
                     overrides: list[str]) -> tuple[AnyModelConfig, TaskConfig, TrainConfig]:
    """Given configs (a checkpoint's) with ``section.field=value`` overrides applied, by the same grammar."""
    train = dict(train_cfg.to_dict())
    train.pop("schedule")
    schedule = train_cfg.schedule
    sections = {"model": model_cfg.to_dict(), "task": task_cfg.to_dict(), "train": train,
                "schedule": {f.name: getattr(schedule, f.name) for f in dataclasses.fields(schedule)}}
    schedule = apply_overrides(sections, overrides)
    task_new = task_from_dict(sections["task"])
    model_new = model_config_from_dict(sections["model"])
    check_fits_model(schedule, model_new)
    return model_new, task_new, TrainConfig(schedule=schedule, **sections["train"])

