"""probe's imports go one way: a walk over every module's imports (function-level ones included) finds no circle."""

from __future__ import annotations

import ast
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


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The probe modules that running ``path`` can import, wherever the import statement sits (module level,
    function body, try block). Importing ``probe.a.b`` runs ``probe.a`` first, so a package's ``__init__`` is an
    import too, except for the package's own modules (Python has already put the package in place for them)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
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


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PROBE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) for p in paths}


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
