"""What every CLI shares: argparse types, device choice, the JSON envelope, one ``--out`` layout, exit code 2 with
one line on any user error, and exit code 130 with one line after SIGINT or SIGTERM (``run_command``). Every
``python -m probe.NAME`` command is built from an options dataclass with ``probe.runner``, which runs it here.

Shared flags: ``--lengths`` (one grammar: ``25,75``, ``1:100``, ``1:400:25``), ``--samples`` (sequences per
length), ``--threads``, ``--out DIR`` (``DIR/results.json`` plus the figures), ``--json``, ``--device``, ``--seed``.
Heavy packages (torch, transformer_lens, pandas) are imported only inside the functions that need them, so that
``--help`` and a bad argument answer at once.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from probe.core import interrupts
from probe.core.lengths import parse_lengths
from probe.core.package import __version__
from probe.core.specs import is_factory_spec
from probe.errors import ProbeError

if TYPE_CHECKING:
    import torch

RESULTS = "results.json"
"""The file name of the JSON envelope inside every ``--out`` directory."""

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
"""After SIGINT or SIGTERM (128 + SIGINT, as a shell reports Ctrl-C)."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2 (argparse's own print the usage
    first, which pushes the reason off a narrow terminal)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def make_parser(prog: str, description: str, epilog: str | None = None) -> Parser:
    """The parser of one ``python -m probe.NAME`` command."""
    return Parser(prog=prog, description=description, epilog=epilog,
                  formatter_class=argparse.RawDescriptionHelpFormatter)


# --- argparse types: every CLI checks positivity here, before any work ----------------------------------------------
def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} must be {what}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    return _int_at_least(text, 0, "0 or a positive integer")


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def lengths_arg(text: str) -> list[int]:
    """``--lengths`` as a list of positive ints (the grammar of ``probe.core.lengths``)."""
    try:
        return parse_lengths(text)
    except ProbeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def int_list(minimum: int = 0) -> Callable[[str], list[int]]:
    """A type for a comma list of integers >= ``minimum`` (spans, offsets, run lengths)."""

    def parse(text: str) -> list[int]:
        try:
            out = [int(p) for p in text.split(",") if p.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: use a comma list of integers such as 1,5,12") from None
        if not out or min(out) < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: use integers >= {minimum}")
        return out

    return parse


# --- shared flags -----------------------------------------------------------------------------------------------


JSON_HELP = "print exactly one JSON object on stdout (human text is suppressed)"
OUT_HELP = f"directory for {RESULTS} (the --json object) and the figures (nothing written if omitted)"
DEVICE_HELP = "cpu, cuda, cuda:N or auto (default: cuda if available)"
SEED_HELP = "seed for every random draw (default 0)"


DEFAULT_THREADS = 1
"""Every command's ``--threads`` default. probe's models are small (d_model 128, a few blocks), so a second thread
mostly adds synchronisation, and beside other work (a grid, a notebook) torch's default of one thread per core
oversubscribes the cores; benchmarks/cli_defaults.py measures each command at 1 and 2 threads, idle and beside a
training run."""


def threads_help(default: int) -> str:
    shown = "torch's default, one per core" if default == 0 else str(default)
    return (f"CPU threads for torch (default: {shown}; 0 = torch's default). probe's models are small: more threads "
            "rarely pay, and beside other work they oversubscribe the cores and can run several times slower "
            "(benchmarks/cli_defaults.py)")


def seed_and_threads(args: object) -> None:
    """Seed torch with ``--seed`` and set ``--threads`` (0 keeps torch's default)."""
    import torch

    torch.manual_seed(args.seed)  # type: ignore[attr-defined]
    set_threads(getattr(args, "threads", 0))


def set_threads(threads: int) -> None:
    """``--threads``: torch's CPU threads (0 keeps torch's default)."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


def resolve_device(name: str) -> torch.device:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ProbeError(f"bad --device {name!r}: use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ProbeError(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    return device


# --- checks that cost nothing, before any import of the models ----------------------------------------------------
def check_paths(specs: Sequence[str]) -> None:
    """A path that does not exist, or a pattern that matches nothing: one line, before any heavy import."""
    for spec in specs:
        if any(ch in spec for ch in "*?["):
            if not glob.glob(spec):
                raise ProbeError(f"{spec}: pattern matches no file")
        elif not os.path.exists(spec) and not is_factory_spec(spec):  # package.module:factory: load_factory
            # a bare module name (``mine``, ``mine.py``) is most likely a factory given without its callable
            hint = (" (a model made by a factory is named MODULE:FACTORY, e.g. my_hybrid:factory)"
                    if re.fullmatch(r"[A-Za-z_][\w.]*", spec) else "")
            raise ProbeError(f"{spec}: no such file or directory{hint}")


def check_out(out: str | os.PathLike | None) -> None:
    """``--out`` must be a directory or not exist yet (it is then created)."""
    if out is None:
        return
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ProbeError(f"--out {out}: a file is in the way; --out names a directory")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise ProbeError(f"--out {out}: {parent} is a file, not a directory")


# --- the JSON envelope ------------------------------------------------------------------------------------------
def _clean(value: Any) -> Any:
    """JSON has no NaN: write it as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and callable(value.item):
        return _clean(value.item())
    return value


def tidy(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in rows]


def envelope(command: str, checkpoints: list[str], results: list[dict[str, Any]],
             controls: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """``{probe_version, command, checkpoints, results, controls}``: flat rows, so that
    ``pandas.DataFrame(obj["results"])`` is the natural next line."""
    return {"probe_version": __version__, "command": command, "checkpoints": checkpoints,
            "results": tidy(results), "controls": tidy(controls or []), **extra}


def say(args: object, *text: Any) -> None:
    """Human-readable output: stdout normally, nothing when --json asks for one JSON object (``args``: the parsed
    command line or a command's options)."""
    if not getattr(args, "json", False):
        print(*text)


def parsed(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """The parsed command line, or the exit code argparse ended with: 0 after ``--help``, 2 after a bad argument
    (already said in one line)."""
    try:
        return parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)


def run_command(args: Any, body: Callable[[Any], tuple[dict[str, Any], int]], argv: list[str] | None = None,
                stopped: Callable[[Any, list[str], str, str], str] | None = None) -> int:
    """Run a parsed command line (``args``: the namespace, or a command's options) as every command runs: check the
    paths and ``--out``, call ``body(args) -> (envelope, exit code)``, print the envelope under ``--json``. A
    ``ProbeError`` is one line and exit code 2. SIGINT and SIGTERM stop the run (a loop that knows a safe point
    stops at it, ``probe.core.interrupts``) with one line, ``stopped(args, argv, kept, signal)`` (``kept``: what
    the loop saved, if it said) or ``error: interrupted``, and exit code 130."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    with interrupts.handling():
        try:
            specs = getattr(args, "checkpoints", None)
            check_paths(specs if isinstance(specs, list) else [])  # a positional list; figures' is one directory
            check_out(getattr(args, "out", None))
            result, code = body(args)
        except ProbeError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt as e:
            given = sys.argv[1:] if argv is None else list(argv)
            signal = interrupts.requested() or "SIGINT"
            print(stopped(args, given, str(e), signal) if stopped else "error: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
    if getattr(args, "json", False):
        print(json.dumps(result))
    return code


def write_outputs(out: str | os.PathLike, result: dict[str, Any], figures: dict[str, Any], dpi: int = 120) -> Path:
    """The ``--out`` layout of every analysis: ``OUT/results.json`` (the envelope) and each named figure (closed
    after saving). Returns the path of ``results.json``."""
    import matplotlib.pyplot as plt

    out = Path(out)
    check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS).write_text(json.dumps(result))
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=dpi)
        plt.close(fig)
    return out / RESULTS
