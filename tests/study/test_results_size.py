"""study/results/ stays in proportion (6 MB, 1 MB a file, analysis JSON compact); compacting loses no row it keeps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "study" / "scripts"


@pytest.fixture(scope="module")
def C():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import compact_results
    finally:
        sys.path.remove(str(SCRIPTS))
    return compact_results


@pytest.fixture(scope="module")
def read_envelope(C):
    return sys.modules["doc_format"].read_envelope  # imported by compact_results, beside it


def test_the_committed_results_are_compact_and_within_budget(C):
    changes, over = C.plan()
    assert not over, over
    assert not changes, f"run python study/scripts/compact_results.py: {sorted(str(p) for p in changes)}"


def _envelope(rows: list[dict]) -> dict:
    return {"probe_version": "0", "command": "x", "checkpoints": [], "results": rows,
            "controls": [{"control": "c", "passed": True, "value": 0.123456789}]}


def test_compacting_keeps_every_row_its_keys_order_and_nulls_and_is_idempotent(C, read_envelope, tmp_path):
    rows = [{"analysis": "a", "x": 1, "y": 0.1234567891, "z": None},
            {"analysis": "a", "x": 2, "y": 2.0, "z": "s"},
            {"analysis": "b", "k": [1.23456789, 2], "flag": True},
            {"analysis": "a", "x": 3, "y": float("nan"), "z": None}]
    path = tmp_path / "out" / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_envelope(rows)))
    changes, _ = C.plan(tmp_path)
    assert list(changes) == [path]
    path.write_text(changes[path])
    back = read_envelope(path)
    assert [list(r) for r in back["results"]] == [list(r) for r in rows]  # keys, and their order, as written
    assert back["results"][0]["y"] == 0.123457 and back["results"][2]["k"] == [1.23457, 2]  # 6 significant digits
    assert back["results"][1] == rows[1] and back["results"][0]["z"] is None
    assert back["controls"] == _envelope([])["controls"]  # controls as written
    assert len(json.loads(path.read_text())["results"]["tables"]) == 3  # consecutive rows share their columns
    assert C.plan(tmp_path)[0] == {}  # a second pass changes nothing


def test_pruning_drops_only_what_its_rule_names_and_says_so(C, read_envelope, tmp_path):
    rows = [{"analysis": "occlusion", "in_prefix": False, "distance": 3},
            {"analysis": "occlusion", "in_prefix": True, "distance": None},
            {"analysis": "reads", "block": 0}]
    path = tmp_path / "attributions" / "final_shipped.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_envelope(rows)))
    path.write_text(C.plan(tmp_path)[0][path])
    back = read_envelope(path)
    assert back["results"] == rows[1:] and back["compacted"]["rows_dropped"] == 1
    assert "analyze_shipped.sh" in back["compacted"]["regenerate"]
    assert C.plan(tmp_path)[0] == {}  # pruning twice counts the dropped rows once


def test_reports_and_figures_a_command_remakes_are_left_out(C, tmp_path):
    grid = tmp_path / "grid"
    grid.mkdir()
    for name in ("runs.jsonl", "results.md", "results.json", "accuracy_vs_length.png"):
        (grid / name).write_text("{}")
    (tmp_path / "mechanism").mkdir()
    (tmp_path / "mechanism" / "seeds_3x.png").write_text("kept: the docs show it")
    changes, _ = C.plan(tmp_path)
    assert sorted(p.name for p, text in changes.items() if text is None) == ["accuracy_vs_length.png", "results.json"]


def test_a_file_over_its_budget_is_reported(C, tmp_path, monkeypatch):
    monkeypatch.setattr(C, "FILE_BUDGET", 10)
    (tmp_path / "big.csv").write_text("x" * 11)
    assert C.plan(tmp_path)[1] == ["big.csv: 0 KB"]
    assert C.main(["--check", "--root", str(tmp_path)]) == 1
