"""docs/api/build.py builds the API reference from the docstrings: a page for every main module, with its public
names on it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# module -> names its page must document (an anchor pdoc writes for each public function, class or constant)
PAGES = {
    "probe/checkpoint": ["load_checkpoint", "Checkpoint"],
    "probe/models/hooked": ["HookedSequenceModel"],
    "probe/tasks": ["make_task"],
    "probe/wrapped": ["wrap", "WrappedModel"],
    "probe/runner": ["Command", "Options", "Report"],
    "probe/evaluate": [],
    "probe/gradients": [],
    "probe/probes": [],
    "probe/shortcuts": [],
    "probe/sharpness": [],
    "probe/training": [],
    "probe/sweep": [],
}


@pytest.mark.slow  # imports every module of probe: about 20 s of CPU
def test_the_api_reference_builds_with_a_page_per_main_module(tmp_path):
    pytest.importorskip("pdoc")
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "api" / "build.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "index.html").exists() and (tmp_path / "probe.html").exists()
    for module, names in PAGES.items():
        page = tmp_path / f"{module}.html"
        assert page.exists(), f"no page for {module.replace('/', '.')}"
        html = page.read_text()
        missing = [n for n in names if f'id="{n}"' not in html]
        assert not missing, f"{module}.html does not document {missing}"


def test_the_module_list_has_no_cli_entry_point_and_reaches_subpackages():
    spec = importlib.util.spec_from_file_location("api_build", ROOT / "docs" / "api" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    found = build.modules()
    assert "probe" in found and "probe.training.trainer" in found and "probe.models.hooked" in found
    assert not [m for m in found if m.endswith("__main__")]
