"""The package's imports point down: every module sits in a layer, and no import (at the top of a module or
inside a function) reaches a higher layer, closes a cycle, or goes from one study to another.

    0  boltzmann_attention.ising.*                         the marginal methods
    1  the rest of the library (attention, benchmark, ...)  what a user imports
    2  experiments: data, model, train, sweep, results, recipes, progress, config
    3  experiments: stats, tables, plots, report, claims, lr_rule, staged_report, explore
    4  experiments.studies.<study>.*
    5  experiments.studies (the registry, which finds the studies without importing them by name)
    6  experiments.cli, experiments.benchmarks.* (commands: they may time a study's profile)

A new module needs no entry here: it takes the layer of its package (a new file in ising/ is layer 0, one in
studies/<name>/ belongs to that study, one directly in experiments/ is layer 2 unless listed in REPORT_LAYER).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import boltzmann_attention

ROOT = Path(boltzmann_attention.__file__).parent
PACKAGE = "boltzmann_attention"
EXPERIMENTS = f"{PACKAGE}.experiments"
STUDIES = f"{EXPERIMENTS}.studies"
# the rest of experiments/*.py is layer 2
REPORT_LAYER = {"stats", "tables", "plots", "report", "claims", "lr_rule", "staged_report", "explore"}

# Imports owned by code outside this branch's reach that still point up; each entry is (importer, imported).
# Empty this list once they are gone: the test then holds the whole package to the rule.
KNOWN_UPWARD_IMPORTS: set[tuple[str, str]] = set()


def module_names() -> dict[str, Path]:
    """Every module under the package: dotted name -> file (a package by its __init__.py)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = module_names()


def imports_of(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its file (top level and inside functions),
    relative imports resolved; ``from X import y`` counts as importing X.y when that is a module."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES and "." in target:  # import a.b.c where c is a name
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def layer(name: str) -> int:
    if name == f"{PACKAGE}.ising" or name.startswith(f"{PACKAGE}.ising."):
        return 0
    if name == f"{EXPERIMENTS}.cli" or name.startswith(f"{EXPERIMENTS}.benchmarks"):
        return 6
    if name == STUDIES:
        return 5
    if name.startswith(f"{STUDIES}."):
        return 4
    if name.startswith(f"{EXPERIMENTS}."):
        return 3 if name.split(".")[2] in REPORT_LAYER else 2
    if name == EXPERIMENTS:
        return 2
    return 1


def study(name: str) -> str | None:
    """The study a module belongs to (``experiments.studies.<study>[...]``), None for any other module."""
    return name.split(".")[3] if name.startswith(f"{STUDIES}.") else None


def test_the_walk_sees_the_package():
    assert f"{PACKAGE}.ising.exact" in MODULES and f"{EXPERIMENTS}.cli" in MODULES
    assert f"{EXPERIMENTS}.sweep" in GRAPH[f"{EXPERIMENTS}.cli"]  # a lazy import inside a function counts
    assert f"{PACKAGE}.ising" in GRAPH[f"{EXPERIMENTS}.cli"]      # `from .. import ising`
    assert len({study(m) for m in MODULES if study(m)}) >= 2


def test_the_resolver_and_the_rules_on_a_planted_module(tmp_path, monkeypatch):
    """The checks catch what they are for: a planted upward import, a lazy one, and one between studies."""
    path = tmp_path / "planted.py"
    path.write_text("from ...report import x\n\ndef f():\n    from ..paper import y\n    from ... import cli\n")
    name = f"{STUDIES}.fair.planted"
    monkeypatch.setitem(MODULES, name, path)
    found = imports_of(name, path)
    assert {f"{EXPERIMENTS}.report", f"{STUDIES}.paper", f"{EXPERIMENTS}.cli"} <= found
    assert upward_edges({name: found}) == [(name, f"{EXPERIMENTS}.cli")]
    assert study_edges({name: found}) == [(name, f"{STUDIES}.paper")]


def upward_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if layer(b) > layer(a) and (a, b) not in KNOWN_UPWARD_IMPORTS)


def study_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if study(a) and study(b) and study(a) != study(b))


def test_no_import_points_up():
    assert upward_edges(GRAPH) == []


def test_the_known_exceptions_still_exist():
    """An exception whose import is gone must leave the list, so that the list only shrinks."""
    assert sorted(e for e in KNOWN_UPWARD_IMPORTS if e[1] not in GRAPH.get(e[0], ())) == []


def test_no_study_imports_another():
    assert study_edges(GRAPH) == []


def test_no_cycles():
    """Depth-first search over the import graph; a back edge is a cycle (listed with its modules)."""
    state, cycles = {}, []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(GRAPH):
        if node not in state:
            visit(node, [])
    assert cycles == []


@pytest.mark.parametrize("name", [f"{PACKAGE}.ising.exact", f"{PACKAGE}.attention", f"{EXPERIMENTS}.sweep",
                                  f"{EXPERIMENTS}.report", f"{STUDIES}.paper", STUDIES, f"{EXPERIMENTS}.cli"])
def test_layers_are_ordered(name):
    expected = {f"{PACKAGE}.ising.exact": 0, f"{PACKAGE}.attention": 1, f"{EXPERIMENTS}.sweep": 2,
                f"{EXPERIMENTS}.report": 3, f"{STUDIES}.paper": 4, STUDIES: 5, f"{EXPERIMENTS}.cli": 6}
    assert layer(name) == expected[name]


@pytest.mark.slow
def test_the_package_imports_without_the_qpu_extra_and_names_it():
    """ising.qpu imports D-Wave's packages on first use only: without them the package imports, and QPUSampler
    raises an ImportError naming the [qpu] extra."""
    code = ("import sys\n"
            "for name in ('dimod', 'dwave', 'dwave.system', 'dwave.embedding', 'dwave.graphs', 'minorminer'):\n"
            "    sys.modules[name] = None\n"
            "from boltzmann_attention import ising\n"
            "try:\n"
            "    ising.QPUSampler(object())\n"
            "except ImportError as e:\n"
            "    assert 'boltzmann-attention[qpu]' in str(e), e\n"
            "else:\n"
            "    raise AssertionError('no ImportError')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}  # this checkout's package, as the tests import it
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)
