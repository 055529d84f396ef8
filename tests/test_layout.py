"""The library stands apart from its study: nothing in probe/ imports, runs or reads study/ or scripts/."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDY = ("study", "scripts")
# a path into the study: the folder's name as a path segment ("study/results", "../scripts"), or alone as a string
# ("study", as in ROOT / "study"); the word in prose ("the mechanism study", "scripts that use it") is not one
SEGMENT = re.compile(r"(?:^|[/\\])(?:study|scripts)(?:[/\\]|$)")


def reaches_into_the_study(source: str) -> list[str]:
    """Every import of, and every string that names a path into, ``study/`` or ``scripts/`` (subprocess arguments,
    ``Path(...) / "scripts"``, ``sys.path`` entries and defaults are strings too); comments are not code."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words = [w.strip("`'\"(),;:") for w in node.value.split()]
            alone = len(words) == 1 and SEGMENT.search(words[0])
            if alone or any(SEGMENT.search(w) and re.search(r"[/\\]", w) for w in words):
                found.append(f"line {node.lineno}: {node.value.strip()[:80]!r}")
            continue
        else:
            continue
        found += [f"line {node.lineno}: import {n}" for n in names if n.split(".")[0] in STUDY]
    return found


def test_the_package_never_reaches_into_the_study():
    found = {str(p.relative_to(ROOT)): hits for p in sorted((ROOT / "probe").rglob("*.py"))
             if (hits := reaches_into_the_study(p.read_text()))}
    assert not found, f"probe/ reaches into study/ or scripts/: {found}"


@pytest.mark.parametrize("code", [
    "import scripts.render_docs",
    "from study.scripts import ship",
    "subprocess.run([sys.executable, 'scripts/ship.py'])",
    "REPO / 'scripts' / script",
    "p.add_argument('--results', default='study/results')",
    "path = ROOT / 'study'",
    "'''Run python study/scripts/x.py first.'''",
])
def test_the_check_sees_an_import_a_path_and_a_subprocess(code):
    assert reaches_into_the_study(code)


@pytest.mark.parametrize("code", [
    "# scripts/ship.py once lived here",
    "'''Old spellings that the mechanism study and scripts used.'''",
    "from probe.results import load_grid",
    "x = 'results/reproduction'",
])
def test_prose_and_the_package_s_own_paths_pass(code):
    assert not reaches_into_the_study(code)


def test_the_study_is_where_the_docs_say():
    """study/ holds the grids, results, rendering and write-ups; nothing is left at the old top-level places."""
    for part in ("sweeps", "results", "scripts", "docs"):
        assert (ROOT / "study" / part).is_dir(), part
    for old in ("sweeps", "results", "scripts"):
        assert not (ROOT / old).exists(), f"{old}/ is back at the top level"
