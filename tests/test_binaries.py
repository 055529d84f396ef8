"""Shipped binaries change only on purpose: each checkpoint and figure is as binaries.json recorded it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("binaries", ROOT / "docs" / "binaries.py")
binaries = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(binaries)


def test_every_binary_is_as_recorded():
    diff = binaries.differences(binaries.current(), binaries.recorded())
    assert not diff, ("binaries differ from binaries.json (regenerate one only when its inputs change, "
                      f"docs/binaries.md; then python docs/binaries.py --update): {'; '.join(diff)}")


def test_the_check_sees_a_changed_a_new_and_a_missing_binary():
    then = {"checkpoints/a.pt": "1", "figures/b.png": "2", "figures/c.png": "3"}
    now = {"checkpoints/a.pt": "1", "figures/b.png": "9", "figures/d.png": "4"}
    assert binaries.differences(now, then) == ["new: figures/d.png", "gone: figures/c.png", "changed: figures/b.png"]
    assert binaries.differences(then, then) == []
