"""The package declares what it imports: a clean `pip install -e .` pulls every third-party module probe imports."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
# Imported inside a try or behind an optional extra; each has a fallback or a one-line error naming the extra.
OPTIONAL = {"ray", "psutil", "IPython", "tomli", "transformers"}


def _top_level_imports(package: Path) -> set[str]:
    names: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0].lower().replace("_", "-") for dep in project["dependencies"]}


def test_every_third_party_import_is_a_declared_dependency():
    dists = packages_distributions()
    third_party = {m for m in _top_level_imports(ROOT / "probe")
                   if m not in sys.stdlib_module_names and m != "probe" and m not in OPTIONAL}
    missing = {}
    for module in sorted(third_party):
        owners = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if not owners & _declared():
            missing[module] = sorted(owners)
    assert not missing, f"imported by probe but not in pyproject's dependencies: {missing}"


def test_the_check_sees_an_undeclared_import(tmp_path):
    # The scan must find an import nested in a function, or the check above could pass by seeing nothing.
    (tmp_path / "mod.py").write_text("def f():\n    import sklearn.linear_model\n    from scipy import stats\n")
    assert {"sklearn", "scipy"} <= _top_level_imports(tmp_path)


def test_licence_is_shipped_and_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert project["license"] == "MIT" and project["authors"]


def test_the_distribution_has_its_own_name_and_the_import_name_stays_probe():
    # "probe" is another project's on the package index; `pip install probe` would install that one
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "probe-hybrids"
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["include"] == ["probe*"]


def test_project_urls_are_absolute_and_the_changelog_has_this_version():
    from probe import __version__

    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert urls and all(re.match(r"https://\S+$", u) for u in urls.values()), urls
    assert re.search(rf"^## \[{re.escape(__version__)}\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
