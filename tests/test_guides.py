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
    assert quoted == printed, (f"{path.relative_to(ROOT)} quotes an old --help of {module}: python "
                               "docs/refresh_help.py rewrites every help block")


FACTORY_BLOCK = re.compile(r"<!-- factory-example:([\w.]+) -->\n```\w+\n(.*?)```", re.S)


@pytest.mark.slow
def test_the_training_guide_s_factory_example_trains_from_the_command_line_and_from_python(tmp_path, monkeypatch,
                                                                                          capsys):
    """docs/guides/training.md's own-model example, as written: the factory module, the command and the Python; both
    runs start without a warning about their settings and learn the state in range."""
    import shlex
    import sys

    from probe.training.cli import main as train_main

    blocks = dict(FACTORY_BLOCK.findall((ROOT / "docs" / "guides" / "training.md").read_text()))
    assert set(blocks) == {"my_hybrid.py", "command", "python"}
    (tmp_path / "my_hybrid.py").write_text(blocks["my_hybrid.py"])
    monkeypatch.chdir(tmp_path)  # the runs/ folders of the example land here
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        argv = shlex.split(blocks["command"].strip())
        assert argv[:3] == ["python", "-m", "probe.train"]
        assert train_main([*argv[3:], "--no-progress"]) == 0
        err = capsys.readouterr().err
        assert "may end near chance" not in err
        namespace: dict = {}
        exec(compile(blocks["python"], "docs/guides/training.md", "exec"), namespace)
        assert "may end near chance" not in capsys.readouterr().err
    finally:
        sys.modules.pop("my_hybrid", None)
    from probe.checkpoint import load_checkpoint

    for run in ("runs/mine", "runs/mine-py"):
        assert load_checkpoint(tmp_path / run / "final.pt").metrics["state_acc_1x"] > 0.9
    assert namespace["final"].metrics["state_acc_1x"] > 0.9
