"""README's Python use runs as written, on the shipped checkpoint it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # loads a shipped checkpoint and takes a gradient: about 10 s on a loaded core
def test_the_readme_python_block_runs(monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["cache"]["blocks.1.attn.hook_pattern"].shape == (8, 4, 88, 88)  # as the comment says
    table = namespace["interference"](namespace["model"], namespace["batch"])
    assert set(table["block"].astype(str)) == {"0", "1", "all"} and (table["att_ratio"] > 0).all()
