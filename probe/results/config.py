"""Sweep configs: variants (a preset plus overrides, with a name) x seeds, read from TOML or the command line."""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from probe.core.lengths import parse_lengths
from probe.errors import ProbeError
from probe.training.presets import PRESETS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 installs tomli (pyproject)
    import tomli as tomllib

SWEEP_FILE = "sweep.json"
"""In a sweep's directory: its config as JSON, so that ``--report`` knows which runs belong to it."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TOP_KEYS = {"name", "seeds", "set", "steps", "task", "variant", "eval_lengths", "eval_samples", "eval_factors",
             "order"}
ORDERS = ("variant", "seed")
_VARIANT_KEYS = {"name", "preset", "set", "seeds", "steps", "task"}


@dataclass(frozen=True)
class Variant:
    """A preset plus ``SECTION.FIELD=VALUE`` overrides, run in ``DIR/name/seedS``. ``seeds``, ``steps`` and
    ``task`` left at None take the sweep's."""

    name: str
    preset: str
    overrides: tuple[str, ...] = ()
    seeds: tuple[int, ...] | None = None
    steps: int | None = None
    task: str | None = None


@dataclass(frozen=True)
class Run:
    """One training run of a sweep: exactly ``probe.train`` with these arguments, in ``out``."""

    variant: str
    preset: str
    seed: int
    task: str
    overrides: tuple[str, ...]
    steps: int | None
    out: Path

    @property
    def key(self) -> str:
        return f"{self.variant}/seed{self.seed}"

    def train_argv(self, resume: bool = False) -> list[str]:
        """The ``python -m probe.train`` command line equivalent to this run (what ``--dry-run`` prints)."""
        argv = [sys.executable, "-m", "probe.train", "--preset", self.preset, "--task", self.task,
                "--seed", str(self.seed), "--out", str(self.out), "--no-progress"]
        if self.steps is not None:
            argv += ["--steps", str(self.steps)]
        for item in self.overrides:
            argv += ["--set", item]
        return argv + (["--resume"] if resume else [])

    def command(self, resume: bool = False) -> str:
        return shlex.join(self.train_argv(resume))


@dataclass(frozen=True)
class SweepConfig:
    """Variants x seeds; ``overrides`` apply to every variant, before its own (so a variant's win)."""

    name: str
    variants: tuple[Variant, ...]
    seeds: tuple[int, ...] = ()
    overrides: tuple[str, ...] = ()
    steps: int | None = None
    task: str = "interleaved"
    eval_lengths: str | None = None
    eval_samples: int | None = None
    eval_factors: bool = False
    order: str = "variant"

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ProbeError(f"sweep {self.name!r}: order {self.order!r} is not one of {', '.join(ORDERS)}")
        if not self.variants:
            raise ProbeError(f"sweep {self.name!r} has no variants: add a [[variant]] table or pass --preset")
        names = [v.name for v in self.variants]
        for v in self.variants:
            if not _NAME.match(v.name):
                raise ProbeError(f"bad variant name {v.name!r}: use letters, digits, '.', '_' or '-' (a folder name)")
            if names.count(v.name) > 1:
                raise ProbeError(f"variant name {v.name!r} is used twice; each variant needs its own folder")
            if v.preset not in PRESETS:
                raise ProbeError(f"variant {v.name!r}: unknown preset {v.preset!r}; choose one of {', '.join(PRESETS)}")
            seeds = self.seeds if v.seeds is None else v.seeds
            if not seeds:
                raise ProbeError(f"variant {v.name!r} has no seeds: set seeds = [0, 1, ...] or pass --seeds")
            if len(set(seeds)) != len(seeds):
                raise ProbeError(f"variant {v.name!r}: seeds {list(seeds)} repeat a seed")

    def runs(self, out: str | Path) -> list[Run]:
        """Every run, each in ``out/VARIANT/seedS`` (absolute, for remote workers): variant-major in config order, or
        with ``order = "seed"`` seed-major (every variant's first seed, then every variant's second, ...), so that a
        grid stopped part-way has as many seeds of each variant as it could."""
        root = Path(out).resolve()
        runs = [
            Run(variant=v.name, preset=v.preset, seed=s, task=v.task or self.task,
                overrides=self.overrides + v.overrides, steps=v.steps if v.steps is not None else self.steps,
                out=root / v.name / f"seed{s}")
            for v in self.variants for s in (self.seeds if v.seeds is None else v.seeds)
        ]
        if self.order == "seed":
            rank = {v.name: i for i, v in enumerate(self.variants)}
            position = {(r.variant, r.seed): i for v in self.variants
                        for i, r in enumerate(r for r in runs if r.variant == v.name)}
            runs.sort(key=lambda r: (position[r.variant, r.seed], rank[r.variant]))
        return runs

    def without(self, done: set[tuple[str, int]]) -> SweepConfig | None:
        """The runs of this config that ``done`` ((variant, seed) pairs) does not hold: each variant keeps its other
        seeds, a variant with none left is dropped; None when nothing is left to run."""
        variants = []
        for v in self.variants:
            seeds = tuple(s for s in (self.seeds if v.seeds is None else v.seeds) if (v.name, s) not in done)
            if seeds:
                variants.append(replace(v, seeds=seeds))
        return replace(self, variants=tuple(variants)) if variants else None

    def with_command_line(self, seeds: list[int] | None = None, steps: int | None = None,
                          overrides: list[str] | None = None) -> SweepConfig:
        """What the command line adds to a config file: ``--seeds`` and ``--steps`` replace every variant's,
        ``--set`` overrides come last (they win over the file's)."""
        variants = tuple(
            replace(v, seeds=None if seeds else v.seeds, steps=None if steps is not None else v.steps,
                    overrides=v.overrides + tuple(overrides or ()))
            for v in self.variants
        )
        return replace(self, variants=variants, seeds=tuple(seeds) if seeds else self.seeds,
                       steps=steps if steps is not None else self.steps)

    def to_dict(self) -> dict[str, Any]:
        """The TOML's shape, as JSON (written to ``DIR/sweep.json`` so ``--report`` knows the runs)."""
        d: dict[str, Any] = {"name": self.name, "seeds": list(self.seeds), "set": list(self.overrides),
                             "task": self.task}
        for key in ("steps", "eval_lengths", "eval_samples"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.eval_factors:
            d["eval_factors"] = True
        if self.order != "variant":
            d["order"] = self.order
        d["variant"] = []
        for v in self.variants:
            row: dict[str, Any] = {"name": v.name, "preset": v.preset, "set": list(v.overrides)}
            for key in ("seeds", "steps", "task"):
                value = getattr(v, key)
                if value is not None:
                    row[key] = list(value) if key == "seeds" else value
            d["variant"].append(row)
        return d


def config_from_dict(d: dict[str, Any], source: str = "sweep config") -> SweepConfig:
    """Validate the TOML's tables (unknown keys are errors: a misspelt ``seed`` must not silently run seed 0)."""
    unknown = set(d) - _TOP_KEYS
    if unknown:
        raise ProbeError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}; "
                         f"allowed: {', '.join(sorted(_TOP_KEYS))}")
    raw_variants = d.get("variant", [])
    if not isinstance(raw_variants, list):
        raise ProbeError(f"{source}: 'variant' must be an array of tables ([[variant]])")
    variants = []
    for i, v in enumerate(raw_variants):
        where = f"{source}: variant {i + 1}"
        if not isinstance(v, dict):
            raise ProbeError(f"{where}: must be a table")
        unknown = set(v) - _VARIANT_KEYS
        if unknown:
            raise ProbeError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                             f"allowed: {', '.join(sorted(_VARIANT_KEYS))}")
        if "preset" not in v:
            raise ProbeError(f"{where}: needs a preset (one of {', '.join(PRESETS)})")
        preset = _typed(v["preset"], str, f"{where}: preset")
        seeds = v.get("seeds")
        variants.append(Variant(
            name=_typed(v.get("name", preset), str, f"{where}: name"), preset=preset,
            overrides=_overrides(v.get("set", []), f"{where}: set"),
            seeds=None if seeds is None else _seeds(seeds, f"{where}: seeds"),
            steps=_steps(v.get("steps"), f"{where}: steps"),
            task=None if "task" not in v else _typed(v["task"], str, f"{where}: task"),
        ))
    return SweepConfig(
        name=_typed(d.get("name", "sweep"), str, f"{source}: name"), variants=tuple(variants),
        seeds=_seeds(d.get("seeds", []), f"{source}: seeds"),
        overrides=_overrides(d.get("set", []), f"{source}: set"), steps=_steps(d.get("steps"), f"{source}: steps"),
        task=_typed(d.get("task", "interleaved"), str, f"{source}: task"),
        eval_lengths=_eval_lengths(d.get("eval_lengths"), f"{source}: eval_lengths"),
        eval_samples=_steps(d.get("eval_samples"), f"{source}: eval_samples"),
        eval_factors=_typed(d.get("eval_factors", False), bool, f"{source}: eval_factors"),
        order=_typed(d.get("order", "variant"), str, f"{source}: order"),
    )


def read_toml(path: str | Path, what: str = "sweep config") -> dict[str, Any]:
    """A TOML file as a dict; a missing file, a directory or bad TOML is one line naming ``what`` it should be."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ProbeError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise ProbeError(f"{path} is a directory; pass a .toml {what} (or, for a sweep, the directory with "
                         "--report)") from None
    except tomllib.TOMLDecodeError as e:
        raise ProbeError(f"{path}: not valid TOML ({e})") from None


def load_config(path: str | Path) -> SweepConfig:
    """Read a sweep TOML (format: docs/guides/sweeps.md)."""
    path = Path(path)
    d = read_toml(path)
    return config_from_dict(d, str(path))


def config_from_presets(presets: list[str], seeds: list[int], task: str = "interleaved") -> SweepConfig:
    """The ``--preset P [P ...] --seeds S [S ...]`` shorthand: one variant per preset, named after it."""
    name = "+".join(presets)
    return SweepConfig(name=name, variants=tuple(Variant(name=p, preset=p) for p in presets),
                       seeds=tuple(seeds), task=task)


def _typed(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind):
        raise ProbeError(f"{where} must be a {kind.__name__}, got {value!r}")
    return value


def _seeds(value: Any, where: str) -> tuple[int, ...]:
    # bool is an int to Python, never a seed
    if not isinstance(value, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise ProbeError(f"{where} must be a list of integers, got {value!r}")
    return tuple(value)


def _steps(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ProbeError(f"{where} must be a positive integer, got {value!r}")
    return value


DEFAULT_LENGTHS = "16x"
"""A grid's final evaluation unless its config or command line says otherwise: every length to 4x L_train, then
every L_train to 16x (1..100, 125, ..., 400 at L_train 25)."""


def eval_lengths_for(spec: str | None, train_length: int) -> list[int]:
    """The lengths a run is evaluated at. ``None``: ``DEFAULT_LENGTHS``. ``"4x"``: every length up to 4x L_train.
    ``"Kx"`` with K > 4: that, then every L_train up to K x L_train (16x of L 25: 1..100, 125, 150, ..., 400).
    ``"coarse"``: every (L_train / 5)-th length up to 4x. Otherwise a comma list of lengths and START:STOP[:STEP] ranges
    (``"1:100,125:400:25"``); pieces combine."""
    if spec is None:
        spec = DEFAULT_LENGTHS
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if part == "coarse":  # what --quick evaluates: a curve's shape at a fifth of the cost
            step = max(1, train_length // 5)
            out |= set(range(step, 4 * train_length + 1, step)) | {train_length, 2 * train_length,
                                                                   3 * train_length, 4 * train_length}
        elif re.fullmatch(r"\d+x", part):
            k = int(part[:-1])
            if k < 1:
                raise ProbeError(f"eval lengths {spec!r}: {part} must be at least 1x")
            out |= set(range(1, min(k, 4) * train_length + 1))
            out |= set(range(5 * train_length, k * train_length + 1, train_length))
        elif ":" in part:
            out |= set(parse_lengths(part, "--eval-lengths"))
        else:
            out |= set(parse_lengths(part, "--eval-lengths"))
    return sorted(out)


def _eval_lengths(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ProbeError(f"{where} must be a string such as \"16x\" or \"1:100,125:400:25\", got {value!r}")
    eval_lengths_for(value, 25)  # the grammar, checked before any run
    return value


def _overrides(value: Any, where: str) -> tuple[str, ...]:
    # Checked for shape only: whether SECTION.FIELD exists is the trainer's to say, per run (its log names it).
    if not isinstance(value, list) or not all(isinstance(s, str) and "=" in s for s in value):
        raise ProbeError(f"{where} must be a list of \"SECTION.FIELD=VALUE\" strings, got {value!r}")
    return tuple(value)
