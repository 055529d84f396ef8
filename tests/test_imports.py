"""probe's imports go one way: a walk over every module's imports (function-level ones included) finds no circle,
between modules nor between the top-level subpackages and modules of ``probe``, which stand on these floors (a name
imports only from its own floor or one below; docs/architecture.md draws them):

0. ``errors``, ``core``, ``hardware``, ``memory``: what every module stands on.
1. ``tasks``, ``viz`` (a task's token names), ``schedules`` (a schedule as data), ``cli``, ``runner`` (the command
   line's plumbing).
2. ``models``.
3. ``wrapped``, ``hf``, ``external``, ``bridge``: a user's hybrid, the transformers library's, and the configs that
   rebuild them.
4. ``checkpoint``; ``windows`` (a model's accuracy at a length and per window, the metric the trainer evaluates with).
5. ``training``.
6. The analyses: ``evaluate``, ``attention``, ``gradients``, ``probes``, ``shortcuts``, ``sharpness``,
   ``attributions``, ``transitions``.
7. ``results`` (a grid's config and data), ``sweep`` (runs a grid and reports it).
8. The commands and the front door: ``train``, ``retrain``, ``figures``, ``notebook``, ``probe`` (``__init__``).

An import inside a function is for an optional dependency or for a heavy one that a command must not pay before it
is needed; every such import is named in an allow-list below with its reason.
"""

from __future__ import annotations

import ast
import functools
import textwrap
from pathlib import Path

PROBE = Path(__file__).parent.parent / "probe"


def module_name(path: Path) -> str:
    parts = path.relative_to(PROBE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside ``if TYPE_CHECKING:``: read by type checkers, never run, so no import happens."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


@functools.cache
def _parse(source: str) -> tuple[ast.AST, dict[ast.AST, ast.AST]]:
    """A module's tree and each node's parent, parsed once per test process (two walks read every file; nothing
    edits a tree)."""
    tree = ast.parse(source)
    return tree, {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The probe modules that running ``path`` can import, wherever the import statement sits (module level,
    function body, try block). Importing ``probe.a.b`` runs ``probe.a`` first, so a package's ``__init__`` is an
    import too, except for the package's own modules (Python has already put the package in place for them)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree, parents = _parse(path.read_text())
    named: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:  # a relative import
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        named.add(base)
        named |= {f"{base}.{alias.name}" for alias in node.names}  # kept below only where it is a module
    found = set()
    for name in named:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in modules and prefix != me and not me.startswith(prefix + "."):
                found.add(prefix)
    return found


@functools.cache
def _parsed_graph() -> dict[str, frozenset[str]]:
    # parsed once per test process: six tests walk the same files
    paths = sorted(PROBE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): frozenset(imports_of(p, modules)) for p in paths}


def import_graph() -> dict[str, set[str]]:
    """probe's module graph: each module and the probe modules it can import (a fresh copy, free to plant in)."""
    return {k: set(v) for k, v in _parsed_graph().items()}


def components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): each holds at least one circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component, spelled as a path from its first module back to it."""
    return [cycle_through(graph, c, min(c)) for c in components(graph)]


def cycle_through(graph: dict[str, set[str]], component: set[str], start: str) -> list[str]:
    """A shortest circle from ``start`` back to it inside its component, by breadth-first search."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in {component}")  # unreachable for a strongly connected component


FLOORS = [
    {"errors", "core", "hardware", "memory"},
    {"tasks", "viz", "schedules", "cli", "runner"},
    {"models"},
    {"wrapped", "hf", "external", "bridge"},
    {"checkpoint", "windows"},
    {"training"},
    {"evaluate", "attention", "gradients", "probes", "shortcuts", "sharpness", "attributions", "transitions"},
    {"results", "sweep"},
    {"train", "retrain", "figures", "notebook", "probe"},
]
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


def top(module: str) -> str:
    """``probe.training.trainer`` -> ``training``; the package itself is ``probe``."""
    return module.split(".")[1] if "." in module else module


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed onto ``probe``'s top-level subpackages and modules."""
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        out.setdefault(top(a), set()).update(top(b) for b in targets if top(b) != top(a))
    return out


def upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports (``a -> b``, subpackage level) that climb to a higher floor."""
    return sorted(f"{a} -> {b}" for a, targets in subpackage_graph(graph).items() for b in targets
                  if FLOOR[b] > FLOOR[a])


def test_probe_has_no_import_cycle():
    cycles = find_cycles(import_graph())
    assert not cycles, "import circle(s) in probe/: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_walk_sees_function_level_imports_and_finds_a_planted_cycle():
    """The instrument check: a cycle closed only by an import inside a function is found and named."""
    graph = import_graph()
    assert "probe.checkpoint" in graph["probe.evaluate"]  # imported inside functions only
    assert "probe.training" in graph["probe.results"]  # the package's __init__ runs before any of its modules
    planted = {k: set(v) for k, v in graph.items()}
    planted["probe.checkpoint"].add("probe.evaluate")  # closed only by evaluate's function-level import
    found = next(c for c in components(planted) if "probe.evaluate" in c)
    assert cycle_through(planted, found, "probe.evaluate") == ["probe.evaluate", "probe.checkpoint", "probe.evaluate"]


def test_a_tree_walk_finds_no_cycle_where_there_is_none():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]


def test_no_two_subpackages_import_each_other_directly_or_through_others():
    layers = subpackage_graph(import_graph())
    cycles = find_cycles(layers)
    assert not cycles, "subpackages in a circle: " + "; ".join(" -> ".join(c) for c in cycles)


def test_every_subpackage_has_a_floor_and_imports_only_downwards():
    layers = subpackage_graph(import_graph())
    assert not set(layers) - set(FLOOR), f"give these a floor in FLOORS: {sorted(set(layers) - set(FLOOR))}"
    assert not upward(import_graph()), f"imports that climb a floor: {upward(import_graph())}"


def test_a_planted_upward_import_is_caught_and_its_circle_named():
    """The instrument check: ``core`` importing ``sweep`` (which stands on core) closes a circle through the floors
    between them that the module-level walk does not see (no module comes back to itself); both tests above fail on
    it."""
    planted = {k: set(v) for k, v in import_graph().items()}
    planted["probe.core.tables"].add("probe.sweep.executors")
    assert find_cycles(planted) == []
    circle = next(c for c in find_cycles(subpackage_graph(planted)) if "core" in c)
    assert circle[0] == circle[-1] and "sweep" in circle
    assert "core -> sweep" in upward(planted)


# --- imports inside functions ----------------------------------------------------------------------------------
_STARTUP = ("a command's --help and its one-line refusals (a missing file, an unwritable --out) answer before the "
            "models are imported: transformer_lens alone takes seconds")
_FIGURES = ("figures only: matplotlib and seaborn cost about a second at import, which an analysis run without figures "
            "and every --help should not pay")
LAZY_MODULES = {
    "transformers": "optional: the hf extra (pip install -e '.[hf]')",
    "ray": "optional: the ray extra (python -m probe.sweep --executor ray)",
    "tokenizers": "only where a bridged model saves its tokenizer; it comes with transformers, the hf extra",
    "psutil": "optional: not a dependency, used where it is installed",
    "resource": "Unix only",
    "IPython": "present only inside a notebook kernel",
    "matplotlib": _FIGURES,
    "seaborn": _FIGURES,
    "PIL": "figures only: the notebook helper's image check",
    "scipy": "scipy.stats costs about half a second at import; core.stats is imported by every command, and only "
             "a test or an interval needs it",
    "tqdm": "a progress bar only when one is drawn (tqdm.auto looks for a notebook's widgets at import)",
    "transformer_lens": "seconds at import: the input checks of core need its class only when handed a model, and "
                        "the bridge only when a model is bridged",
    "torch": _STARTUP + "; torch is most of that (and a schedule, probe.training.policies, is read without it by "
                        "the grid loader)",
    "pandas": _STARTUP,
}
"""Modules that may be imported inside a function anywhere in probe, each for its reason."""
LAZY_PROBE_IMPORTERS = {
    "probe.evaluate": _STARTUP,
    "probe.transitions": _STARTUP,
    "probe.retrain": _STARTUP,
    "probe.figures": _STARTUP,
    "probe.notebook": "the shipped checkpoints load after the warning filter that quiets tqdm's notebook probe",
    "probe.results": "a compact grid is read (python -m probe.sweep --report, the study's renders) without torch "
                     "or the models; only a run folder's checkpoint and configs need them",
}
"""Modules of probe that may import other modules of probe inside a function (besides every ``cli`` and
``__main__`` module, which may, for ``_STARTUP``'s reason)."""


def function_level_imports(source: str) -> list[tuple[str, int]]:
    """(imported module, line) of each import statement inside a function, outside ``if TYPE_CHECKING:``."""
    tree, parents = _parse(source)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or _type_checking_only(node, parents):
            continue
        up, inside = node, False
        while up in parents and not inside:
            up = parents[up]
            inside = isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if inside:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                "probe" if node.level else node.module or ""]
            found += [(name, node.lineno) for name in names]
    return found


def refused_lazy_imports(module: str, source: str) -> list[str]:
    """The function-level imports of ``module`` that no allow-list entry covers."""
    own = module.rsplit(".", 1)[-1] in ("cli", "__main__") or module in LAZY_PROBE_IMPORTERS
    return [f"{module}:{line} imports {name}" for name, line in function_level_imports(source)
            if not (name.split(".")[0] in LAZY_MODULES or (name.split(".")[0] == "probe" and own))]


def test_imports_inside_functions_are_only_optional_or_heavy_ones():
    refused, used = [], set()
    for path in sorted(PROBE.rglob("*.py")):
        source, module = path.read_text(), module_name(path)
        refused += refused_lazy_imports(module, source)
        for name, _ in function_level_imports(source):
            used.add(name.split(".")[0])
            if name.startswith("probe"):
                used.add(module)
    assert not refused, "import these at the top of the module (or give a reason here): " + "; ".join(refused)
    stale = sorted((set(LAZY_MODULES) | set(LAZY_PROBE_IMPORTERS)) - used)
    assert not stale, f"allow-list entries no import needs any more: {stale}"


def test_a_planted_function_level_import_is_refused():
    """The instrument check: a stdlib or probe import hidden in a library function is named; one of matplotlib, or
    one in a command's module, is not."""
    source = textwrap.dedent("""
        def f():
            import json
            from probe.training import trainer
            import matplotlib.pyplot as plt
    """)
    assert refused_lazy_imports("probe.core.stats", source) == [
        "probe.core.stats:3 imports json", "probe.core.stats:4 imports probe.training"]
    assert refused_lazy_imports("probe.gradients.cli", source) == ["probe.gradients.cli:3 imports json"]
