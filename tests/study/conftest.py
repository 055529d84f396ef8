"""Fixtures for the study's tests: its scripts (study/scripts/) are modules beside each other, not a package."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "study" / "scripts"


def _import_scripts(*names: str) -> ModuleType | tuple[ModuleType, ...]:
    # the scripts import one another by bare name (``from doc_format import ...``), so their folder is on the path
    # while they load, and only then
    sys.path.insert(0, str(SCRIPTS))
    try:
        modules = tuple(importlib.import_module(name) for name in names)
    finally:
        sys.path.remove(str(SCRIPTS))
    return modules[0] if len(modules) == 1 else modules


@pytest.fixture(scope="session")
def study_scripts():
    """``study_scripts("doc_blocks_fresh")``: the module from study/scripts/ (several names: a tuple of them)."""
    return _import_scripts
