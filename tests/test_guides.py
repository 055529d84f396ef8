"""Each analysis guide quotes its command's --help (options, JSON rows, controls) as the command prints it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- help:([\w.]+) -->\n```text\n(.*?)\n```\n<!-- /help:\1 -->", re.S)
QUOTED = [(path, m.group(1), m.group(2)) for path in sorted((ROOT / "docs" / "guides").glob("*.md"))
          for m in BLOCK.finditer(path.read_text())]


def _command(module: str):
    try:
        return importlib.import_module(module + ".cli").COMMAND
    except ModuleNotFoundError:
        return importlib.import_module(module).COMMAND


def test_every_analysis_has_a_guide_that_quotes_its_help():
    assert {m for _, m, _ in QUOTED} >= {"probe.gradients", "probe.attributions", "probe.probes", "probe.shortcuts",
                                         "probe.sharpness", "probe.transitions"}


@pytest.mark.parametrize("path,module,quoted", QUOTED, ids=[f"{p.name}:{m}" for p, m, _ in QUOTED])
def test_a_guide_s_help_block_is_the_command_s_help(monkeypatch, path, module, quoted):
    monkeypatch.setenv("COLUMNS", "120")  # argparse wraps to the terminal's width
    printed = _command(module).build_parser().format_help().rstrip("\n")
    assert quoted == printed, (f"{path.relative_to(ROOT)} quotes an old --help of {module}: paste the output of "
                               f"COLUMNS=120 python -m {module} --help between its help markers")
