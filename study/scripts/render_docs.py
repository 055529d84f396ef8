"""Render every number that study/README.md, docs/ and study/docs/ quote from study/results/ into their marked blocks,
or check them."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import doc_blocks  # noqa: E402  (the block renderers, beside this file)

# A block is `<!-- render:NAME -->` ... `<!-- /render:NAME -->`; what lies between is owned by this script.
BLOCK = re.compile(r"(<!-- render:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /render:(?P=name) -->)", re.S)


def documents(root: Path) -> list[Path]:
    # README.md is the front page and quotes no result; a block there would still be rendered and checked
    return [root / "README.md", root / "study" / "README.md", *sorted((root / "docs").rglob("*.md")),
            *sorted((root / "study" / "docs").glob("*.md"))]


def render_text(text: str, blocks: dict[str, Callable[[Path], str]], root: Path, where: str,
                only: set[str] | None = None) -> str:
    def fill(m: re.Match[str]) -> str:
        name = m.group("name")
        if only is not None and name not in only:
            return m.group(0)
        if name not in blocks:
            raise SystemExit(f"{where}: unknown render block {name!r}; known: {', '.join(sorted(blocks))}")
        body = blocks[name](root).rstrip("\n") + "\n"
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 and show a diff if a committed block differs from study/results/")
    p.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    p.add_argument("--block", action="append", default=None, metavar="NAME",
                   help="render or check only this block (repeatable; a full render takes minutes of CPU)")
    args = p.parse_args(argv)
    only = set(args.block) if args.block else None
    if only and (unknown := only - set(doc_blocks.BLOCKS)):
        p.error(f"unknown block(s) {', '.join(sorted(unknown))}")
    stale = []
    for path in documents(args.root):
        text = path.read_text()
        new = render_text(text, doc_blocks.BLOCKS, args.root, str(path.relative_to(args.root)), only)
        if new == text:
            continue
        stale.append(path)
        if args.check:
            rel = str(path.relative_to(args.root))
            diff = difflib.unified_diff(text.splitlines(True), new.splitlines(True), rel, rel + " (rendered)")
            sys.stdout.writelines(diff)
        else:
            path.write_text(new)
    if args.check and stale:
        print(f"{len(stale)} document(s) disagree with study/results/: run python study/scripts/render_docs.py",
              file=sys.stderr)
        return 1
    if not args.check:
        print(f"rendered {len(stale)} document(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
