"""README.md's findings are rendered from the committed results (study/scripts/doc_blocks_findings.py): the block in
the README is the render, a changed result changes it, and the five corrected readings stay corrected."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def M(study_scripts):
    return study_scripts("doc_blocks_findings", "doc_blocks_fresh", "doc_blocks_claims")


def test_the_findings_name_the_transfer_page(rendered):
    assert "**Other tasks** ([transfer](study/docs/transfer.md)" in rendered


def _block() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- render:readme-findings -->\n(.*?)<!-- /render:readme-findings -->", text, re.S)
    assert m, "README.md has no readme-findings block"
    return m.group(1)


@pytest.fixture(scope="module")
def rendered(M) -> str:
    return M[0].readme_findings(ROOT)


def test_the_readme_s_findings_are_the_render_of_the_committed_results(rendered):
    assert _block() == rendered.rstrip("\n") + "\n", "run python study/scripts/render_docs.py"


def test_the_findings_fit_the_front_page(rendered):
    lines = rendered.splitlines()
    assert len(lines) <= 19 and all(len(line) <= 120 for line in lines)
    assert sum(line.startswith("- ") for line in lines) == 7  # the six of the mod-10 study, and the transfer line


def test_the_corrected_readings_stay_corrected(rendered):
    flat = " ".join(rendered.split())
    assert "not the machine" not in flat and "machine and seed are not told apart" in flat
    assert "Fisher p 0.505" in flat
    assert "mostly in (2x, 4x]" not in flat and "3 fall below 95 % in (2x, 4x], 4 miss 99 % there narrowly" in flat
    assert "both precisions (joint" not in flat
    assert "re-measured in fp32 on the same seeds (not a replication)" in flat
    assert "6 of 16 (7 as filed; `joint-parity-fp32` changes)" in flat
    assert "momentum" not in flat


def test_a_result_that_changes_changes_the_findings(M, monkeypatch, rendered):
    findings, fresh, claims = M
    runs = fresh._fresh(ROOT).copy()
    runs.loc[(runs.variant == "joint-bf16") & (runs.seed == 12), "state_win_8x_16x"] = 0.99
    for mod in (findings, claims):
        monkeypatch.setattr(mod, "_fresh", lambda root: runs)
    text = " ".join(findings.readme_findings(ROOT).split())
    assert text != " ".join(rendered.split())
    assert "holds (8x, 16x] in 4 of 10 fresh seeds (bf16)" in text
