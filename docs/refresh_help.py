"""Rewrite every ``<!-- help:MODULE -->`` block of docs/guides/*.md with that command's --help as it prints now.

Usage: ``python docs/refresh_help.py`` (``--check``: write nothing, exit 1 and name each stale block).
tests/test_guides.py holds the guides to the commands; this is how a changed option's help reaches them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from pathlib import Path

GUIDES = Path(__file__).resolve().parent / "guides"
BLOCK = re.compile(r"(<!-- help:([\w.]+) -->\n```text\n)(.*?)(\n```\n<!-- /help:\2 -->)", re.S)


def command_help(module: str) -> str:
    """``python -m MODULE --help`` as printed at 120 columns (argparse wraps to the terminal's width)."""
    os.environ["COLUMNS"] = "120"
    try:
        command = importlib.import_module(module + ".cli").COMMAND
    except ModuleNotFoundError:
        command = importlib.import_module(module).COMMAND
    return command.build_parser().format_help().rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block is stale")
    args = p.parse_args(argv)
    stale = []
    for path in sorted(GUIDES.glob("*.md")):
        text = path.read_text()
        new = BLOCK.sub(lambda m: m.group(1) + command_help(m.group(2)) + m.group(4), text)
        if new != text:
            stale.append(path.name)
            if not args.check:
                path.write_text(new)
    for name in stale:
        print(f"{'stale' if args.check else 'rewrote'}: docs/guides/{name}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
