"""One runner for every ``python -m probe.NAME`` command: an options dataclass is the command line, a run returns a
``Report``.

A field of the options dataclass is a flag (``samples`` -> ``--samples``; a bool is a switch; its ``help``,
``type``, hidden old spellings and so on in the field's metadata, written with ``option``). ``Options`` holds the
flags every analysis shares (``--threads``, ``--json``, ``--out``, ``--device``, ``--seed``) and
``CheckpointOptions`` those of every analysis of checkpoints (the checkpoints, ``--lengths`` in one grammar,
``--samples``); a command subclasses one and adds its own fields. ``Command(name, options, run, ...)`` builds the
parser, and its ``main`` parses, checks the paths and ``--out`` before any heavy import, seeds torch, calls
``run(options) -> Report``, prints the report's text (nothing but the JSON object under ``--json``), writes
``OUT/results.json`` (the envelope ``{probe_version, command, checkpoints, results, controls}``) and the report's
figures, and turns a ``ProbeError`` into one line and exit code 2. ``--out`` is tried for writing before any work
(``check_writable``), so that an unwritable one costs a second, not the analysis; progress goes to stderr, also
under ``--json``, unless ``--no-progress``::

    @dataclass
    class SharpnessOptions(CheckpointOptions):
        scale: str = option("none", "log-length: also ... (default %(default)s)", choices=("none", "log-length"))

    COMMAND = Command("sharpness", SharpnessOptions, run, DESCRIPTION, HELP_JSON)
    main, build_parser = COMMAND.main, COMMAND.build_parser

The commands that are not analyses stand on the same runner: their options subclass ``CommandOptions`` (the one
flag every command takes, ``--no-progress``) and name the flags they have (``probe.train``'s ``--out`` is a run
folder, ``probe.sweep`` has no ``--threads``); a report may carry an exit code (a sweep whose run failed exits 1);
``stopped`` writes the line that follows SIGINT or SIGTERM (what was kept, the command that resumes); and
``CommandGroup`` holds commands under one name (``python -m probe.results collect``). Every command parses, refuses
in one line with exit code 2, stops on SIGINT and SIGTERM with exit code 130 and prints its ``--json`` here.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from probe.cli import (
    DEFAULT_THREADS,
    DEVICE_HELP,
    JSON_HELP,
    OUT_HELP,
    RESULTS,
    SEED_HELP,
    Parser,
    envelope,
    lengths_arg,
    make_parser,
    nonnegative_int,
    parsed,
    positive_int,
    run_command,
    say,
    seed_and_threads,
    threads_help,
    write_outputs,
)
from probe.core.lengths import GRAMMAR
from probe.errors import ProbeError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["CheckpointOptions", "Command", "CommandGroup", "CommandOptions", "Options", "Report", "check_writable",
           "lengths_option", "option", "samples_option", "threads_option"]

Opts = TypeVar("Opts", bound="CommandOptions")
_MISSING: Any = dataclasses.MISSING


def option(default: Any = _MISSING, help: str = "", *, type: Callable[[str], Any] | None = None,
           flag: str | None = None, aliases: Sequence[str] = (), metavar: str | None = None,
           choices: Sequence[Any] | None = None, nargs: str | int | None = None, action: str | None = None,
           positional: bool = False, required: bool = False, order: int = 0,
           default_factory: Callable[[], Any] | None = None) -> Any:
    """A field of an options dataclass that is also a flag: ``--NAME`` (underscores as hyphens) unless ``flag``
    spells it; a field whose default is a bool is a switch (``store_true``); ``type`` parses the text (default: the
    default's type, a string for a list); ``action="append"`` collects a repeated flag; ``aliases`` are old
    spellings that still parse, hidden from ``--help``; ``help`` may say ``%(default)s``; ``required``: a flag the
    command line must give. ``order`` places the flag in ``--help``: 0 in the order of the fields, > 0 after the
    command's own flags (the shared tail: --threads ... --seed), < 0 first. A list default is copied for each
    instance."""
    meta = {"help": help, "type": type, "flag": flag, "aliases": tuple(aliases), "metavar": metavar,
            "choices": choices, "nargs": nargs, "action": action, "positional": positional, "required": required,
            "order": order}
    if default_factory is None and isinstance(default, list):
        default_factory, default = (lambda d=tuple(default): list(d)), _MISSING
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def lengths_option(default_help: str, aliases: Sequence[str] = ()) -> Any:
    """``--lengths`` in the grammar of ``probe.core.lengths`` (None: the analysis's default, said in ``--help``)."""
    return option(None, f"stream lengths: {GRAMMAR} (default: {default_help})", type=lengths_arg, metavar="LENGTHS",
                  aliases=aliases)


def samples_option(default: int, what: str = "sequences per length", aliases: Sequence[str] = ()) -> Any:
    """``--samples``: how many sequences, per length."""
    return option(default, f"{what} (default {default})", type=positive_int, metavar="N", aliases=aliases)


def threads_option(default: int = DEFAULT_THREADS, order: int = 1) -> Any:
    """``--threads`` (0 = torch's default; every command defaults to ``DEFAULT_THREADS``)."""
    return option(default, threads_help(default), type=nonnegative_int, metavar="N", order=order)


NO_PROGRESS_HELP = "no progress bars or phase lines on stderr (shown by default, also with --json)"


@dataclass
class CommandOptions:
    """The flag every command takes (``--no-progress``); a command that is not an analysis subclasses this and
    names the flags it has, so that none of them means nothing."""

    no_progress: bool = option(False, NO_PROGRESS_HELP, order=7)

    @property
    def progress(self) -> bool:
        """Whether to draw progress on stderr: yes, also under ``--json`` (stdout stays one object), unless
        ``--no-progress``."""
        return not self.no_progress

    def prepare(self) -> None:
        """What the options ask of this process before the run (nothing here; ``Options`` seeds torch and sets
        its threads)."""

    def folders(self) -> dict[str, str | None]:
        """The folders the run writes, by the flag that names them: each is tried for writing before any work."""
        return {"--out": getattr(self, "out", None)}


@dataclass
class Options(CommandOptions):
    """The flags every analysis shares."""

    threads: int = threads_option()
    json: bool = option(False, JSON_HELP, order=3)
    out: str | None = option(None, OUT_HELP, metavar="DIR", order=4)
    device: str = option("auto", DEVICE_HELP, order=5)
    seed: int = option(0, SEED_HELP, type=int, order=6)

    def prepare(self) -> None:
        seed_and_threads(self)


@dataclass
class CheckpointOptions(Options):
    """The flags of every analysis of checkpoints; a subclass redefines ``lengths`` and ``samples`` to say its
    defaults."""

    checkpoints: list[str] = option(help="checkpoint files, run or trajectory directories, or globs",
                                    positional=True, nargs="+", default_factory=list)
    lengths: list[int] | None = lengths_option("the analysis's")
    samples: int = samples_option(64)


def check_writable(out: str | os.PathLike | None, flag: str = "--out") -> None:
    """Try ``--out`` for writing before any work: create it (and any missing parents), write and remove a
    temporary file in it, then remove what was created, so that a refused run leaves nothing behind. An
    unwritable ``--out`` (``/proc/x``, a read-only disk) is a ``ProbeError`` in under a second, not a traceback
    after the analysis."""
    if out is None:
        return
    path = Path(out)
    made = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-write-test-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ProbeError(f"{flag} {out}: cannot write there ({e.strerror or e}); name a directory you can write"
                         ) from None
    finally:
        for p in made:  # deepest first; a directory someone else filled meanwhile stays
            try:
                p.rmdir()
            except OSError:
                break


def stored_gate_option() -> Any:
    """``--stored-gate``: the gate stored in the checkpoint instead of the schedule's gate at its step."""
    return option(False, "use the gate stored in the checkpoint, not the schedule's gate at its step", order=2)


@dataclass
class Report:
    """What an analysis returns to the runner: the envelope's rows, the text a person reads, and the figures.

    ``figures`` is called only when ``--out`` asks for files (drawing costs time); ``extra`` adds keys to the
    envelope (``notes``, ``memory``); ``save`` writes further files into ``--out`` beside ``results.json`` and
    the figures, and returns their names. ``command`` names the envelope's command where a mode of the command
    names itself (``sweep --confirm``); ``exit_code`` is 1 where part of the work failed (a sweep's run)."""

    checkpoints: list[str]
    results: list[dict[str, Any]]
    controls: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    figures: Callable[[], dict[str, Figure]] | None = None
    dpi: int = 120
    extra: dict[str, Any] = field(default_factory=dict)
    save: Callable[[Path, dict[str, Any]], list[str]] | None = None
    command: str | None = None
    exit_code: int = 0

    @classmethod
    def of_envelope(cls, result: dict[str, Any], exit_code: int = 0) -> Report:
        """The report of an envelope built elsewhere (a sweep's aggregate, which writes it to its own files)."""
        head = ("probe_version", "command", "checkpoints", "results", "controls")
        return cls(result["checkpoints"], result["results"], result["controls"], command=result["command"],
                   extra={k: v for k, v in result.items() if k not in head}, exit_code=exit_code)


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _argument(f: dataclasses.Field) -> tuple[list[str], dict[str, Any]]:
    """``add_argument``'s arguments for one field."""
    m = f.metadata
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    kw: dict[str, Any] = {"help": m["help"]}
    if m["positional"]:
        return [f.name], {**kw, "nargs": m["nargs"], **({"metavar": m["metavar"]} if m["metavar"] else {})}
    kw["dest"] = f.name
    kw["default"] = default
    if m["required"]:
        kw["required"] = True
    if m["action"] or isinstance(default, bool):
        kw["action"] = m["action"] or "store_true"
        if kw["action"] != "append":
            return [_flag(f)], kw
    kw["type"] = m["type"] or (type(default) if default is not None and not isinstance(default, list) else None)
    for key in ("metavar", "choices", "nargs"):
        if m[key] is not None:
            kw[key] = m[key]
    return [_flag(f)], kw


@dataclass(frozen=True)
class Command(Generic[Opts]):
    """One ``python -m probe.NAME`` command: ``options`` (a dataclass of ``option`` fields) and ``run(options) ->
    Report``. ``description`` heads ``--help``; ``epilog`` documents the JSON columns. ``results_file``: whether
    ``--out`` receives ``results.json`` (a run folder, a sweep's folder and a folder of snapshots are written by
    the command itself). ``stopped(options, argv, kept, signal)`` is the one line after SIGINT or SIGTERM (``kept``:
    what the stopped loop saved, if it said); without it, ``error: interrupted``. ``summary`` is the command's line
    in its group's ``--help``."""

    name: str
    options: type[Opts]
    run: Callable[[Opts], Report]
    description: str
    epilog: str | None = None
    results_file: bool = True
    stopped: Callable[[Opts, list[str], str, str], str] | None = None
    summary: str | None = None

    @property
    def prog(self) -> str:
        return f"python -m probe.{self.name}"

    def build_parser(self) -> Parser:
        """The parser: one argument per field, the command's own flags between the shared head (checkpoints,
        --lengths, --samples) and the shared tail (--threads ... --seed)."""
        parser = make_parser(self.prog, self.description, self.epilog)
        self.add_arguments(parser)
        return parser

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """One argument per field of the options, in the order of their ``order``, then of the fields."""
        fields = [f for f in dataclasses.fields(self.options) if f.init]
        for f in sorted(fields, key=lambda f: f.metadata.get("order", 0)):
            if "help" not in f.metadata:
                continue  # a plain field the command fills itself
            args, kw = _argument(f)
            parser.add_argument(*args, **kw)
            for alias in f.metadata["aliases"]:  # a switch's old spelling is a switch too
                same = {"action": kw["action"]} if "action" in kw else {"type": kw.get("type")}
                parser.add_argument(alias, dest=f.name, help=argparse.SUPPRESS, **same)

    def parse(self, argv: list[str] | None = None) -> Opts:
        """The options of a command line (argparse's exit on a bad one: one line, code 2)."""
        return self.from_namespace(self.build_parser().parse_args(argv))

    def from_namespace(self, args: argparse.Namespace) -> Opts:
        names = {f.name for f in dataclasses.fields(self.options) if f.init}
        return self.options(**{k: v for k, v in vars(args).items() if k in names})

    def main(self, argv: list[str] | None = None) -> int:
        """Parse, check, run, print, write: 0 on success (or the report's exit code), 2 with one line on a user
        error, 130 after SIGINT or SIGTERM (``probe.cli.run_command``)."""
        args = parsed(self.build_parser(), argv)
        return args if isinstance(args, int) else self.execute(args, argv)

    def execute(self, args: argparse.Namespace, argv: list[str] | None = None) -> int:
        """Run a parsed command line."""
        return run_command(self.from_namespace(args), self._body, argv, self.stopped)

    def _body(self, opts: Opts) -> tuple[dict[str, Any], int]:
        for flag, folder in opts.folders().items():
            check_writable(folder, flag)  # before torch is imported: an unwritable --out answers at once
        opts.prepare()
        out = getattr(opts, "out", None)
        report = self.run(opts)
        result = envelope(report.command or self.name, report.checkpoints, report.results, report.controls,
                          **report.extra)
        if report.text:
            say(opts, report.text)
        if out and self.results_file:
            figures = report.figures() if report.figures else {}
            try:
                write_outputs(out, result, figures, dpi=report.dpi)
                names = [RESULTS, *figures, *(report.save(Path(out), result) if report.save else [])]
            except OSError as e:  # writable when checked, not now (a full disk, a folder removed meanwhile)
                raise ProbeError(f"--out {out}: writing the results failed ({e.strerror or e})") from None
            say(opts, f"wrote {', '.join(names)} to {out}")
        return result, report.exit_code


@dataclass(frozen=True)
class CommandGroup:
    """``python -m probe.NAME COMMAND ...``: commands under one name (``python -m probe.results collect``), each
    a ``Command`` with its own options, run as the runner runs any command."""

    name: str
    description: str
    commands: tuple[Command, ...]

    def build_parser(self) -> Parser:
        parser = make_parser(f"python -m probe.{self.name}", self.description)
        sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        for command in self.commands:
            command.add_arguments(sub.add_parser(command.name, help=command.summary, description=command.description,
                                                 epilog=command.epilog,
                                                 formatter_class=argparse.RawDescriptionHelpFormatter))
        return parser

    def main(self, argv: list[str] | None = None) -> int:
        """Parse, then run the command named: as ``Command.main``."""
        args = parsed(self.build_parser(), argv)
        if isinstance(args, int):
            return args
        return next(c for c in self.commands if c.name == args.command).execute(args, argv)
