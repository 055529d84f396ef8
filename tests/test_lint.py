"""ruff runs inside the test suite, so that CI (which runs only pytest) fails on a lint finding as it does on a bug."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_ruff_finds_nothing():
    done = _ruff(".")
    assert done.returncode == 0, f"ruff check . found:\n{done.stdout[-4000:]}{done.stderr[-1000:]}"


def test_ruff_with_this_config_sees_a_finding(tmp_path):
    # the same configuration on a file with an unused import and an unsorted block: the check above can fail
    (tmp_path / "bad.py").write_text("import sys\nimport os\n\nprint(os.sep)\n")
    done = _ruff("--config", str(ROOT / "pyproject.toml"), str(tmp_path / "bad.py"))
    assert done.returncode == 1
    assert "F401" in done.stdout and "I001" in done.stdout
