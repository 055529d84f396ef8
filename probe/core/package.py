"""probe's version, and one clear line when a folder named ``probe`` shadows the installed package.

Run from the parent of a clone named ``probe/`` (or any folder holding a ``probe/`` without ``__init__.py``), Python
takes that folder for a namespace package ``probe``: ``probe/__init__.py`` never runs, and the first
``from probe import __version__`` used to end in a traceback that named neither the folder nor the fix."""

from __future__ import annotations

import sys
from pathlib import Path

import probe


def shadowing_folders() -> list[str]:
    """The folders Python took for the package ``probe`` that hold no ``__init__.py`` (empty when probe is itself)."""
    if getattr(probe, "__file__", None) is not None:
        return []
    return [str(Path(p).resolve()) for p in getattr(probe, "__path__", []) if not (Path(p) / "__init__.py").exists()]


def shadow_message(folders: list[str]) -> str:
    """The one line that names the folder in the way and the fix."""
    where = folders[0] if folders else "a folder on sys.path"
    return (f"a folder named probe ({where}, without __init__.py) shadows the installed probe package: run from "
            "another folder, or rename that folder")


def _run_as_command() -> bool:
    """Whether this process is ``python -m probe.NAME`` (then the refusal is a CLI's: one line, exit 2)."""
    argv = getattr(sys, "orig_argv", [])
    command = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"), "")
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return command.startswith("probe.") or (main is not None and str(main.name).startswith("probe."))


def _refuse_shadow() -> None:
    if getattr(probe, "__file__", None) is not None:
        return
    message = shadow_message(shadowing_folders())
    if _run_as_command():
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)
    raise ImportError(message)  # a library import: the same words, as the exception Python users expect


_refuse_shadow()

from probe import __version__  # noqa: E402  (after the check: under a shadowing folder this import fails)

__all__ = ["__version__", "shadow_message", "shadowing_folders"]
