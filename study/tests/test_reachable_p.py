"""No committed table or rendered sentence reports a p from a design that cannot reach adjusted p < 0.05.

Every table with a p column must carry, per row, the smallest adjusted p its design can reach ("min. adj. p": the
family size times the design's smallest exact p, ``K × m = X``); the test recomputes m from the row's design (its
"seeds" cell "n vs m", a "pairs" count, or a count of runs whose rank correlation is permuted) and fails on a row
that reports a p where X is not below 0.05. A rendered sentence that quotes a p must name its family ("a Holm family
of K") and its designs ("n vs m seeds"), and the same rule applies to it. README.md is left out: its tables are the
front page's and are rewritten apart (study/docs/mechanism.md carries the same comparisons with their designs)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from probe.core.stats import min_attainable_p

ROOT = Path(__file__).resolve().parents[2]
ALPHA = 0.05
DOCUMENTS = [*sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "study" / "docs").glob("*.md")),
             *([ROOT / "study" / "README.md"] if (ROOT / "study" / "README.md").exists() else [])]

P_HEADER = re.compile(r"(^|\s)p($|\s|\()")
NUMBER = re.compile(r"^(\d+(\.\d+)?(e-?\d+)?)$")
MIN_ADJ = re.compile(r"(\d+) × ([\d.e-]+) = ([\d.e-]+)")
P_IN_TEXT = re.compile(r"\bp (?:= )?(\d\.\d+(e-\d+)?|\d\.\de-\d+|1\.0)\b")
BLOCK = re.compile(r"<!-- render:([\w-]+) -->\n(.*?)<!-- /render:\1 -->", re.S)


def _min_p(header: list[str], row: list[str]) -> float | None:
    """The smallest exact p of the row's design, or None where no design column can be read."""
    cells = dict(zip(header, row, strict=False))
    if m := re.fullmatch(r"(\d+) vs (\d+)", cells.get("seeds", "").strip()):
        return min_attainable_p(int(m.group(1)), int(m.group(2)))
    if (n := cells.get("pairs", "").strip()).isdigit():
        return min_attainable_p(int(n), paired=True)
    runs = next((c for h, c in cells.items() if h.endswith("runs") and c.strip().isdigit()), None)
    if runs is not None:
        return min(1.0, 2 / math.factorial(int(runs)))
    return None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.06 * max(a, b) + 1e-6  # the cells round to 3 decimals or 2 significant digits


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip()):
            header = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            out.append((header, rows))
        else:
            i += 1
    return out


def violations(text: str, where: str = "") -> list[str]:
    """Every table row or rendered sentence of ``text`` that reports a p its design could not have made significant
    after adjustment, or that reports a p without the smallest adjusted p its design allows."""
    found = []
    for header, rows in _tables(text):
        p_cols = [j for j, h in enumerate(header) if P_HEADER.search(h) and not h.startswith("min.")]
        if not p_cols:
            continue
        adj = next((j for j, h in enumerate(header) if h.startswith("min. adj. p")), None)
        for row in rows:
            reported = [row[j] for j in p_cols if j < len(row) and NUMBER.match(row[j])]
            if not reported:
                continue
            if adj is None or adj >= len(row) or not (m := MIN_ADJ.search(row[adj])):
                found.append(f"{where}: a p without the smallest adjusted p its design allows: {' | '.join(row)}")
                continue
            k, m_p, x = int(m.group(1)), float(m.group(2)), float(m.group(3))
            design = _min_p(header, row)
            if design is not None and not _close(design, m_p):
                found.append(f"{where}: min. adj. p says {m_p} for a design whose smallest p is {design:.3g}: "
                             f"{' | '.join(row)}")
            true = min(1.0, k * (design if design is not None else m_p))
            if true >= ALPHA or x >= ALPHA:
                found.append(f"{where}: p reported from a design that cannot reach adjusted p < {ALPHA} "
                             f"({k} × {design if design is not None else m_p:.3g} = {true:.3g}): {' | '.join(row)}")
    for block in BLOCK.finditer(text):
        for line in block.group(2).splitlines():
            if line.startswith("|") or not P_IN_TEXT.search(line):
                continue
            fam = re.search(r"family of (\d+)", line)
            designs = [(int(a), int(b)) for a, b in re.findall(r"(\d+) vs (\d+) seeds", line)]
            if not fam or not designs:
                found.append(f"{where} (render:{block.group(1)}): a p without its family and design: {line[:160]}")
                continue
            worst = max(min(1.0, int(fam.group(1)) * min_attainable_p(a, b)) for a, b in designs)
            if worst >= ALPHA:
                found.append(f"{where} (render:{block.group(1)}): p reported from a design that cannot reach "
                             f"adjusted p < {ALPHA} (smallest attainable {worst:.3g}): {line[:160]}")
    return found


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_p_from_a_design_that_cannot_reject(path: Path):
    assert violations(path.read_text(), str(path.relative_to(ROOT))) == []


PLANTED_ROWS = {
    # the precision table as it was: a sign-flip p over 5 pairs (smallest 0.0625) and no smallest adjusted p
    "sign-flip without design": """
| variant | pairs | bf16 − fp32 [95 % t-CI] | sign-flip p | Spearman |
|---|---|---|---|---|
| joint | 5 | -1.2 [-4.0, +1.7] | 0.312 | 1.00 |
""",
    # a secondary comparison at 5 vs 5 seeds in a family of 14: 14 × 0.008 = 0.11
    "5 vs 5 in a family of 14": """
| family (size) | variant | seeds | difference [95 % CI] | p | min. adj. p | Holm p | verdict |
|---|---|---|---|---|---|---|---|
| secondary (14) | `gru` | 5 vs 5 | +6.8 [-18.9, +32.5] | 0.825 | 14 × 0.008 = 0.111 | – | no difference detected |
""",
    # a row that understates its design's smallest p (5 vs 5 written as if 5 vs 10)
    "understated minimum": """
| variant | seeds | p | min. adj. p | Holm p (over 27) |
|---|---|---|---|---|
| stopgrad | 5 vs 5 | 0.008 | 27 × 6.7e-04 = 0.018 | 0.21 |
""",
    # a rendered sentence with a p at 5 vs 5 seeds in a family of 27
    "sentence": """<!-- render:x -->
Depth's effect (a Holm family of 27; 5 vs 5 seeds): +23.6 [+3.4, +43.8], p 0.008, Holm p 0.21.
<!-- /render:x -->
""",
    # a rendered sentence with "p = " and no family: a sign test over 5 runs (smallest p 0.0625)
    "sentence with p =": """<!-- render:x -->
Attention's part leans to lowering the loss in 5 of 5 runs (two-sided sign test over runs: p = 0.0625).
<!-- /render:x -->
""",
    # a rendered sentence with a p and no family
    "sentence without family": """<!-- render:x -->
`deep4-joint` − `joint` at 3x: +23.6 [+3.4, +43.8], p 0.008 (smallest attainable 0.008).
<!-- /render:x -->
""",
}


@pytest.mark.parametrize("name", PLANTED_ROWS)
def test_a_planted_row_fails(name: str):
    assert violations(PLANTED_ROWS[name], name), f"the scan missed the planted {name!r}"


def test_a_design_that_can_reject_passes():
    text = """
| variant | seeds | p | min. adj. p | Holm p (over 27) |
|---|---|---|---|---|
| stopgrad | 5 vs 10 | 6.7e-04 | 27 × 6.7e-04 = 0.018 | 0.016 |
| gru | 5 vs 5 | – | 14 × 0.008 = 0.111 | – |
"""
    assert violations(text) == []
