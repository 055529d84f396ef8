"""study/docs/transfer.md's table: every committed seed's value in its window, a variant without runs says so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _root(tmp_path: Path, runs: list[dict]) -> Path:
    (tmp_path / "study" / "sweeps").mkdir(parents=True)
    shutil.copy(ROOT / "study" / "sweeps" / "transfer.toml", tmp_path / "study" / "sweeps")
    out = tmp_path / "study" / "results" / "transfer"
    out.mkdir(parents=True)
    (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    (out / "windows.csv").write_text("variant,seed,window,subtask,chance\nm7-joint,71,in range,state,0.142857\n"
                                     "m7-joint,71,in range,recall,0.0625\n")
    return tmp_path


def _run(variant: str, seed: int, state: float, recall: float = 1.0) -> dict:
    keys = ("0x_1x", "1x_2x", "2x_4x", "4x_8x", "8x_16x")
    return {"variant": variant, "seed": seed, **{f"state_win_{k}": state for k in keys},
            **{f"recall_win_{k}": recall for k in keys}}


def test_each_seed_lands_in_its_row_in_seed_order_and_missing_variants_say_so(study_scripts, tmp_path):
    T = study_scripts("doc_blocks_transfer")
    text = T.transfer_seeds(_root(tmp_path, [_run("m7-joint", 72, 0.25), _run("m7-joint", 71, 0.5),
                                             _run("coupled-cut", 70, 1.0, 0.9)]))
    rows = {line.split(" | ")[0].strip("| ") + "/" + line.split(" | ")[1]: line for line in text.splitlines()
            if line.startswith("| ") and "task" not in line}
    joint = rows["interleaved, m = 7/joint"]
    assert "| 71, 72 |" in joint and "| 50.0 / 25.0 |" in joint, joint  # seed order, not file order
    assert "14.3 / 6.2" in joint
    assert "none yet" in rows["interleaved, m = 7/DAT"]
    assert "| 90.0 |" in rows["coupled, m = 10/block-0 cut (`stopgrad-rnn0`)"]
    assert "3 of 48 runs committed" in text


def test_the_page_s_block_is_rendered_from_the_committed_results(study_scripts):
    T, R = study_scripts("doc_blocks_transfer", "render_docs")
    page = (ROOT / "study" / "docs" / "transfer.md").read_text()
    assert R.render_text(page, T.BLOCKS, ROOT, "transfer.md") == page, "python study/scripts/render_docs.py"
