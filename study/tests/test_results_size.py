"""study/results/ stays in proportion (8 MiB, 1 MB a file, analysis JSON and grids compact); compacting loses no row it
keeps."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest


@pytest.fixture(scope="module")
def C(study_scripts):
    return study_scripts("compact_results")


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


def test_a_grid_in_an_older_compact_form_is_rewritten_as_probe_results_writes_it_and_loads_the_same(C, tmp_path):
    from probe.results import load_grid

    # an older form: 17-digit summaries, and the "all" counts written out although they are state + recall
    runs = {"variant": "a", "seed": 0, "run": "a/seed0", "label": "x", "train_length": 1, "eval_lengths": "1:2",
            "state_acc_1x": 2 / 3, "state_seq_acc_1x": 0.5, "state_acc_2x": 5 / 6, "state_seq_acc_2x": 0.5}
    curves = ("variant,seed,length,state_n,state_correct,state_seq,recall_n,recall_correct,recall_seq,all_n,"
              "all_correct,all_seq\na,0,1,3,2,1/2,1,1,1,4,3,1/2\na,0,2,6,5,1/2,2,2,1,8,7,1/2\n")
    for name in ("old", "fresh"):  # fresh/ is LEFT_AS_WRITTEN
        (tmp_path / name).mkdir()
        (tmp_path / name / "runs.jsonl").write_text(json.dumps(runs) + "\n")
        (tmp_path / name / "curves.csv").write_text(curves)
    before = load_grid(tmp_path / "old")
    changes, _ = C.plan(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in changes) == ["old/curves.csv", "old/runs.jsonl"]
    for path, text in changes.items():
        path.write_text(text)
    assert "all_n" not in (tmp_path / "old" / "curves.csv").read_text().splitlines()[0].split(",")
    assert '"state_acc_1x":0.666667' in (tmp_path / "old" / "runs.jsonl").read_text()
    after = load_grid(tmp_path / "old")
    pd.testing.assert_frame_equal(after.runs, before.runs, check_exact=True)  # 2 / 3 again, not 0.666667
    pd.testing.assert_frame_equal(after.curves, before.curves, check_exact=True)
    assert C.plan(tmp_path)[0] == {}
