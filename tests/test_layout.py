"""The codebase's shape: no import cycles, imports go one way, and files a person can hold.

The import graph is read from the source with :mod:`ast` (nothing is imported), counting every
``import`` and ``from ... import`` statement, also those inside functions: a function-level import
that closes a loop is a cycle waiting for the first caller. Rooms and their direction:

    pipelines (the tools, and pipelines.sweeps) -> pipelines.beam -> pipelines.run -> pipelines.executors -> core
    benchmarks -> pipelines, core;   core imports neither pipelines nor benchmarks
"""
from __future__ import annotations

import ast
import os
from typing import Dict, Iterator, List, Set

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("core", "pipelines", "benchmarks")
MAX_LINES = 400
TOOLS = ("pipelines.train", "pipelines.process", "pipelines.collect", "pipelines.evaluate", "pipelines.report",
         "pipelines.sweep", "pipelines.sweeps")


def _modules() -> Dict[str, str]:
    """Dotted module name -> file path, for every .py file under the three packages."""
    found = {}
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                    found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name an import statement in ``tree`` reaches, ``from a import b`` as ``a.b``
    (which resolves to the module ``a`` where ``b`` is a name defined in it)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # ``from pkg import sub`` needs the submodule, not a name of pkg's __init__ (which is
            # already initializing when a submodule imports its sibling): resolve each name.
            yield from (f"{prefix}.{alias.name}" for alias in node.names)


def import_graph() -> Dict[str, Set[str]]:
    """Module -> the project modules it imports (a name resolves to the longest module it names)."""
    modules = _modules()
    graph: Dict[str, Set[str]] = {}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        targets = set()
        for name in _imported_names(tree, module, path.endswith("__init__.py")):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_loop_and_only_loops():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_core_pipelines_or_benchmarks():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize("room, forbidden", [
    ("core", ("pipelines", "benchmarks")),
    ("pipelines", ("benchmarks",)),
    ("pipelines.executors", ("pipelines.run", "pipelines.beam") + TOOLS),
    ("pipelines.run", ("pipelines.beam",) + TOOLS),
    ("pipelines.beam", TOOLS),
])
def test_imports_go_one_way(room, forbidden):
    graph = import_graph()
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() if m == room or m.startswith(room + ".")
                    for t in targets if any(t == f or t.startswith(f + ".") for f in forbidden))
    assert upward == []


def test_files_are_at_most_400_lines():
    too_long = {}
    for path in _modules().values():
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            too_long[os.path.relpath(path, ROOT)] = n
    assert too_long == {}


def test_the_suites_longest_files_exist():
    """tests/conftest.py orders the longest test files first by name: a renamed file would fall silently
    back to the collection order (and could run alone at the end of a CI run)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("suite_conftest", os.path.join(ROOT, "tests", "conftest.py"))
    suite = importlib.util.module_from_spec(spec)     # by path: other conftest modules of the suite share its name
    spec.loader.exec_module(suite)
    assert [f for f in suite.LONGEST_FILES if not os.path.isfile(os.path.join(ROOT, f))] == []
