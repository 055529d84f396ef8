"""The repository's binaries (shipped checkpoints, the study's figures) and the hashes they were committed with.

``binaries.json`` at the repository's root lists every tracked ``*.pt`` under ``checkpoints/`` and ``*.png`` under
``figures/`` with its SHA-256. tests/test_binaries.py fails when a file differs from its entry, so a regenerated binary
that nobody meant to change (new bytes from the same inputs, which would grow the history by megabytes) is caught
before it is committed. When a binary's inputs did change (docs/binaries.md says which), regenerate it and record it:
``python docs/binaries.py --update``; ``python docs/binaries.py`` lists what differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "binaries.json"
PATTERNS = ("checkpoints/**/*.pt", "figures/*.png")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def current() -> dict[str, str]:
    """Every binary in the working tree and its hash, by path relative to the repository's root."""
    return {str(p.relative_to(ROOT)): sha256(p) for pattern in PATTERNS for p in sorted(ROOT.glob(pattern))}


def recorded() -> dict[str, str]:
    return json.loads(MANIFEST.read_text())["sha256"] if MANIFEST.exists() else {}


def differences(now: dict[str, str], then: dict[str, str]) -> list[str]:
    """One line per binary that is new, gone or changed since the manifest was written."""
    out = [f"new: {p}" for p in sorted(set(now) - set(then))]
    out += [f"gone: {p}" for p in sorted(set(then) - set(now))]
    out += [f"changed: {p}" for p in sorted(set(now) & set(then)) if now[p] != then[p]]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--update", action="store_true", help="record the binaries as they are now")
    args = p.parse_args(argv)
    now = current()
    diff = differences(now, recorded())
    if args.update:
        MANIFEST.write_text(json.dumps({"about": "docs/binaries.md", "sha256": now}, indent=1) + "\n")
        print(f"recorded {len(now)} binaries ({len(diff)} differed)")
        return 0
    print("\n".join(diff) or f"all {len(now)} binaries as recorded")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
