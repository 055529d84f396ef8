"""The study's front page and the docs quote study/results/ only through rendered blocks, the check catches a number
that drifted, README.md stays a front page, and every relative link of the documents resolves."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "study" / "scripts"
RENDER = SCRIPTS / "render_docs.py"


# A full render of every block takes minutes of CPU: the one test that makes one is out of the fast tier; `python
# study/scripts/render_docs.py --check` is the same check by hand.
RENDERS_ALL = pytest.mark.slow


def _check(root: Path, *blocks: str) -> subprocess.CompletedProcess:
    """``render_docs.py --check`` on ``root``: every block, or only the named ones (the check's machinery is the same
    for one block as for all, and a full render costs minutes of CPU: one test makes it, the rest check one block)."""
    return subprocess.run([sys.executable, str(RENDER), "--check", "--root", str(root),
                           *(a for b in blocks for a in ("--block", b))], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """README, docs, the study's front page, docs, results and pre-registered claims (with the sweeps they name), in
    a scratch tree that a test may damage."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copy(ROOT / "README.md", root)
    shutil.copytree(ROOT / "docs", root / "docs")
    for part in ("docs", "results", "sweeps"):
        shutil.copytree(ROOT / "study" / part, root / "study" / part)
    for name in ("README.md", "claims.toml", "claims_transfer.toml", "claims_bridged.toml"):
        shutil.copy(ROOT / "study" / name, root / "study")
    return root


@RENDERS_ALL
def test_committed_text_matches_results():
    done = _check(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


def test_readme_is_a_front_page():
    """What probe is, the two commands, the API, the commands, a findings slot and links: no results table (those are
    study/README.md's), and the Python use before the findings. The findings are the one rendered block (five lines
    from the committed results, so they cannot drift from them)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 100
    assert re.findall(r"<!-- render:([\w-]+) -->", text) == ["readme-findings"], \
        "README.md renders only its findings: results tables belong in study/README.md"
    assert text.count("<!-- test-command -->") == 1  # .ci/run runs the block after it
    assert text.count("<!-- findings -->") == 1 and text.count("<!-- /findings -->") == 1
    slot = text[text.index("<!-- findings -->"):text.index("<!-- /findings -->")]
    assert "<!-- render:readme-findings -->" in slot and "<!-- /render:readme-findings -->" in slot
    assert "\n|" not in slot, "the findings hold no table"
    assert text.index("```python") < text.index("## Findings")


def test_every_command_in_the_readme_s_table_runs_as_a_module():
    import importlib.util

    named = set(re.findall(r"^\| `python -m (probe[\w.]*)`", (ROOT / "README.md").read_text(), re.M))
    assert len(named) >= 10
    missing = [m for m in sorted(named)
               if importlib.util.find_spec(m) is None
               or (importlib.util.find_spec(m).submodule_search_locations is not None
                   and importlib.util.find_spec(m + ".__main__") is None)]
    assert not missing, f"README names commands that python -m cannot run: {missing}"


def _table_names(text: str, header: str) -> set[str]:
    """The top folder of every `name`, `name/` or `name/file` in the first column of the first table whose header row
    starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    names = set()
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        names |= {n.split("/")[0] for n in re.findall(r"`([^`]+)`", line.split(" | ")[0])}
    return names


def test_every_grid_and_every_results_entry_has_a_row_in_its_index():
    """A grid file added to study/sweeps/ or a folder added to study/results/ without a row saying what it holds fails
    here (study/README.md's grid table; study/results/README.md's folder table, read alone)."""
    grids = _table_names((ROOT / "study" / "README.md").read_text(), "| grid | question |")
    sweeps = sorted(p.stem for p in (ROOT / "study" / "sweeps").glob("*.toml"))
    assert len(sweeps) >= 10 and len(grids) >= 10
    missing = [name for name in sweeps if name not in grids]
    assert not missing, f"study/README.md's grid table has no row for {missing}"
    entries = _table_names((ROOT / "study" / "results" / "README.md").read_text(), "| folder | what | made by |")
    folders = sorted(p.name for p in (ROOT / "study" / "results").iterdir() if p.name != "README.md")
    assert len(folders) >= 10
    missing = [name for name in folders if name not in entries]
    assert not missing, f"study/results/README.md's table has no row for {missing}"


def test_the_index_check_reads_only_its_own_table():
    text = "| a | b |\n|---|---|\n| `x/`, `y/z.json` | `w` |\n\n| grid | question |\n|---|---|\n| `g` | `h` |\n"
    assert _table_names(text, "| grid | question |") == {"g"}
    assert _table_names(text, "| a | b |") == {"x", "y"}


DOCUMENTS = [ROOT / "README.md", ROOT / "figures" / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "study").rglob("*.md"))]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    links = [m.group(1) for m in re.finditer(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", doc.read_text())
             if not re.match(r"[a-z]+:", m.group(1))]
    missing = [link for link in links if not (doc.parent / link).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing {missing}"


def test_check_fails_when_a_rendered_number_is_edited_by_hand(copy):
    readme = copy / "study" / "README.md"
    text = readme.read_text()
    block = re.search(r"<!-- render:headline -->\n(.*?)<!-- /render:headline -->", text, re.S)
    assert block and re.search(r"\d\.\d", block.group(1)), "the headline block holds no number"
    edited = block.group(1).replace("100.0", "99.0", 1)
    assert edited != block.group(1)
    readme.write_text(text.replace(block.group(1), edited))
    try:
        done = _check(copy, "headline")
        assert done.returncode == 1 and "study/README.md" in done.stdout
    finally:
        readme.write_text(text)


def test_the_headline_block_renders_from_the_copy(copy):
    """Without this, a block that fails to find its file in the scratch tree could make the next test pass (every
    block renders from the committed tree: test_committed_text_matches_results)."""
    done = _check(copy, "headline")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr


def test_check_fails_when_results_change_under_the_text(copy):
    runs = copy / "study" / "results" / "mechanism" / "runs.jsonl"
    original = runs.read_text()
    first, rest = original.split("\n", 1)
    runs.write_text(re.sub(r'"state_acc_3x":[0-9.e-]+', '"state_acc_3x":0.5', first) + "\n" + rest)
    try:
        assert _check(copy, "headline").returncode == 1
    finally:
        runs.write_text(original)


def test_a_pair_listed_as_the_same_cut_must_agree_seed_for_seed(copy):
    """`stopgrad-rnn1` and `rnn1-att1` are counted once because they compute the same gradient; the render refuses
    that when a shared seed's accuracy differs, as it would if the two cuts were not the same."""
    curves = copy / "study" / "results" / "mechanism" / "curves.csv"
    original = curves.read_text()
    lines = original.splitlines()
    header = lines[0].split(",")
    at = {name: header.index(name) for name in ("variant", "seed", "state_correct")}
    for i, line in enumerate(lines[1:], start=1):
        cells = line.split(",")
        if cells[at["variant"]] == "rnn1-att1" and cells[at["seed"]] == "0" and int(cells[at["state_correct"]]) > 10:
            cells[at["state_correct"]] = str(int(cells[at["state_correct"]]) - 10)
            lines[i] = ",".join(cells)
            break
    else:
        pytest.fail("no rnn1-att1 seed 0 row to damage")
    curves.write_text("\n".join(lines) + "\n")
    try:
        done = _check(copy)
        assert done.returncode != 0 and "same cut" in done.stdout + done.stderr
    finally:
        curves.write_text(original)


@pytest.fixture(scope="module")
def blocks(study_scripts):
    return study_scripts("doc_blocks_deep", "doc_blocks_long")


def test_the_depth_screen_stops_a_point_only_when_its_target_is_out_of_reach(blocks):
    """4 of 5 seeds below 50 % is the target: two screen seeds at or above 50 % rule it out, one does not."""
    import pandas as pd

    deep, _ = blocks
    assert deep._screen_verdict(pd.Series([0.6, 0.5])).startswith("stops")  # 50 % is not below 50 %
    assert deep._screen_verdict(pd.Series([0.3, 0.9])).startswith("advances")
    assert deep._screen_verdict(pd.Series([0.2, 0.1])).startswith("advances")
    assert deep._screen_verdict(pd.Series([0.2])).startswith("screen incomplete")
    assert deep._screen_verdict(pd.Series([0.2], index=[3])).startswith("screen incomplete")  # not a screen seed
    # an advanced point is judged on its screen seeds, its other seeds counted apart
    full = deep._screen_verdict(pd.Series([0.3, 0.9, 0.6, 0.7, 0.8]))
    assert full.startswith("advances") and "1 of 5 seeds below overall" in full


def test_the_recipe_target_needs_both_subtasks_at_both_lengths(blocks):
    """A seed meets the target only with state and recall >= 99 % at 4x and >= 95 % at 16x; each single miss fails."""
    import pandas as pd

    _, long = blocks
    good = dict(state_acc_4x=0.995, recall_acc_4x=1.0, state_acc_16x=0.96, recall_acc_16x=0.99)
    misses = [dict(good, state_acc_4x=0.985), dict(good, recall_acc_4x=0.98), dict(good, state_acc_16x=0.94),
              dict(good, recall_acc_16x=0.9)]
    met = long._meets_target(pd.DataFrame([good, *misses]))
    assert list(met) == [True, False, False, False, False]
    assert not long._meets_target(pd.DataFrame([{k: v for k, v in good.items() if "16x" not in k}])).any()
