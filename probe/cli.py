"""What every CLI shares: common flags, device choice, the JSON envelope (SPEC section 9) and exit code 2 on
user errors, printed as one line."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from probe import __version__
from probe.errors import ProbeError


def add_common_args(parser: argparse.ArgumentParser, json_flag: bool = True) -> None:
    if json_flag:
        parser.add_argument("--json", action="store_true",
                            help="print exactly one JSON object on stdout (human text is suppressed)")
    parser.add_argument("--out", default=None, help="directory for figures and results (nothing written if omitted)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: cuda if available)")
    parser.add_argument("--seed", type=int, default=0, help="seed for every random draw (default 0)")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ProbeError(f"bad --device {name!r}: use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ProbeError(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    return device


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
    return {"probe_version": __version__, "command": command, "checkpoints": checkpoints,
            "results": tidy(results), "controls": tidy(controls or []), **extra}


def say(args: argparse.Namespace, *text: Any) -> None:
    """Human-readable output: stdout normally, nothing when --json asks for one JSON object."""
    if not getattr(args, "json", False):
        print(*text)


def run_cli(parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace], dict[str, Any]],
            argv: list[str] | None = None, emits_json: bool = True) -> int:
    """Parse, run ``body``, print its JSON envelope under --json; a ProbeError becomes one line and exit code 2."""
    args = parser.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        result = body(args)
    except ProbeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    if emits_json and getattr(args, "json", False):
        print(json.dumps(result))
    return 0


def write_outputs(out: str | os.PathLike, result: dict[str, Any], figures: dict[str, Any], dpi: int = 120) -> None:
    """An analysis's ``--out``: ``results.json`` (the envelope) and each named figure, closed after saving."""
    from pathlib import Path

    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=dpi)
        plt.close(fig)


def add_threads_and_gate_args(parser: argparse.ArgumentParser) -> None:
    """``--threads`` and ``--stored-gate``, shared by the gradient-based analyses."""
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for torch (default 1: these small models run fastest on one; 0 = torch's "
                             "default)")
    parser.add_argument("--stored-gate", action="store_true",
                        help="use the gate stored in the checkpoint, not the schedule's gate at its step")


def seed_and_threads(args: argparse.Namespace) -> None:
    """Seed torch with ``--seed`` and set ``--threads`` (0 keeps torch's default)."""
    torch.manual_seed(args.seed)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

