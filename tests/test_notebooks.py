"""Every notebook is committed executed, with a reading of each result, and still runs top to bottom on the shipped
checkpoints."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from probe.errors import ProbeError
from probe.notebook import find_root

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_BYTES = 300_000
"""Figures are drawn at 80 dpi in 256 colours so that a notebook with its outputs stays a small file."""


def _code(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _images(cell) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def test_there_are_notebooks():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_executed(path):
    """Executed top to bottom, no error or warning, small, no machine's paths, and every result followed by
    markdown that says what to see in it."""
    assert path.stat().st_size < MAX_BYTES
    nb = nbformat.read(path, as_version=4)
    cells = _code(nb)
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1))
    outputs = [o for c in cells for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error" or o.get("name") == "stderr"]
    assert str(ROOT) not in json.dumps(outputs)
    for cell, after in zip(nb.cells, nb.cells[1:] + [None], strict=True):
        if cell.cell_type == "code" and cell.outputs:
            assert after is not None and after.cell_type == "markdown", f"no reading after: {cell.source[:60]!r}"


NUMBER = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")
REL_TOL, ABS_TOL = 0.02, 0.02
"""How far a re-executed number may move from the committed one: the notebooks' readings quote these outputs, and
another CPU or library version may round the last digits differently but must not change a finding."""


def _text(cell) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        elif "text/plain" in o.get("data", {}):
            parts.append(o["data"]["text/plain"])
    return "".join(parts)


def _numbers(cell) -> list[float]:
    return [float(x) for x in NUMBER.findall(_text(cell))]


def test_number_comparison_catches_a_changed_result():
    """The comparison below must see a changed finding, or the notebook test could pass on any output."""
    def cell(text: str):
        return nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output("stream", text=text)])

    before, after = cell("state at 3x: 0.776 [0.35, 1.0]"), cell("state at 3x: 0.512 [0.35, 1.0]")
    assert not _close(_numbers(after), _numbers(before))
    assert _close(_numbers(before), [0.7761, 0.35, 1.0])


def _close(new: list[float], old: list[float]) -> bool:
    if len(new) != len(old):
        return False
    return all(abs(a - b) <= max(ABS_TOL, REL_TOL * abs(b)) for a, b in zip(new, old, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    """From notebooks/, as Jupyter starts it; ``MPLBACKEND=agg`` does not stop ``setup`` drawing figures inline."""
    monkeypatch.setenv("MPLBACKEND", "agg")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    committed = nbformat.read(path, as_version=4)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    client.execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert [_images(c) for c in _code(nb)] == [_images(c) for c in _code(committed)]
    # the readings quote the committed outputs: every printed number must come out the same within the tolerance
    for new, old in zip(_code(nb), _code(committed), strict=True):
        if "time" in new.source or "perf_counter" in new.source:
            continue  # wall-clock figures differ by machine
        assert _close(_numbers(new), _numbers(old)), (
            f"{path.name}: output changed in cell {new.source[:60]!r}: {_text(new)[:300]!r} vs {_text(old)[:300]!r}")
    print(f"{path.name}: {time.perf_counter() - t0:.1f} s")


def test_setup_outside_the_repository_names_the_fix(tmp_path):
    with pytest.raises(ProbeError, match="jupyter lab notebooks/"):
        find_root(tmp_path)
