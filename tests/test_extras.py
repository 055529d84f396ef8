"""Optional extras: each is declared in pyproject under the name its refusal gives, and a missing one is refused in
one line that names the ``pip install`` adding it, before any work."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from probe.core.extras import EXTRAS, install_line, require
from probe.errors import ProbeError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(deps: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower() for d in deps}


@pytest.mark.parametrize("module", sorted(EXTRAS))
def test_each_extra_is_declared_under_its_name_and_is_not_a_hard_dependency(module):
    extra, _ = EXTRAS[module]
    assert module in _names(PROJECT["optional-dependencies"][extra]), f"[{extra}] does not install {module}"
    assert module not in _names(PROJECT["dependencies"]), f"{module} is still a hard dependency"


def _hide(monkeypatch, module: str) -> None:
    # a None entry in sys.modules makes `import module` raise ImportError, as on an install without the extra
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize("module", sorted(EXTRAS))
def test_a_missing_extra_is_one_line_naming_its_install(monkeypatch, module):
    _hide(monkeypatch, module)
    with pytest.raises(ProbeError) as e:
        require(module)
    msg = str(e.value)
    assert "\n" not in msg and install_line(EXTRAS[module][0]) in msg, msg


def test_attributions_ig_without_captum_exits_2_in_one_line_and_the_rest_still_runs(monkeypatch, tmp_path, capsys):
    from probe import attributions as A
    from probe.checkpoint import checkpoint_from_model, save_checkpoint
    from probe.tasks import make_task

    task = make_task("interleaved", train_length=8)
    path = save_checkpoint(tmp_path / "c.pt", checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))
    _hide(monkeypatch, "captum")
    args = [str(path), "--lengths", "8", "--samples", "4", "--ig", "--ig-sequences", "1", "--ig-max-steps", "16"]
    assert A.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[attributions]" in err, err
    assert A.main(args[:-5]) == 0, "without --ig the analysis needs no captum"


def test_the_ray_executor_without_ray_is_refused_before_any_work(monkeypatch):
    from probe.sweep.executors import RayExecutor

    _hide(monkeypatch, "ray")
    with pytest.raises(ProbeError, match=r"\[ray\]"):
        RayExecutor(jobs=1)
