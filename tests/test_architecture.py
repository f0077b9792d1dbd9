"""The house's rules, read from the source: `flows -> tasks -> strategies` with no edge back and
no import cycle, and a domain core that imports only torch, numpy and pydantic (plus the
standard library, PyYAML for the cluster and platform specs, which are YAML files, and scipy's
HiGHS in the search's integer-program fallback alone), so it also runs on a bare GPU machine."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("strategies", "tasks", "flows")  # lowest first: an import may only point down
NAMESPACE = "layerwise"  # the one top-level import name the distribution installs
CORE_THIRD_PARTY = {"torch", "numpy", "pydantic", "yaml"}
SOLVER_MODULE = "layerwise.strategies.milp"  # the one core module that imports scipy


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join((NAMESPACE, *path.relative_to(ROOT).with_suffix("").parts))
            found[name.removesuffix(".__init__")] = path
    return found


class _Imports(ast.NodeVisitor):
    """Every module an import names at run time (imports only for type checkers are skipped)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.orelse:
                self.visit(statement)
            return
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.level == 0:
            self.names.add(node.module)
            self.names.update(f"{node.module}.{alias.name}" for alias in node.names)

    def visit_Import(self, node: ast.Import) -> None:
        self.names.update(alias.name for alias in node.names)


def _imports(path: Path) -> set[str]:
    visitor = _Imports()
    visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
    return visitor.names


def _package(name: str) -> str | None:
    """The mapped folder a dotted module name lies in, or None outside the namespace."""
    parts = name.split(".")
    return parts[1] if parts[0] == NAMESPACE and len(parts) > 1 else None


MODULES = _modules()
IMPORTS = {name: _imports(path) for name, path in MODULES.items()}


def test_imports_point_down_from_flows_to_tasks_to_strategies() -> None:
    upward = [(module, name) for module, names in IMPORTS.items() for name in names
              if _package(name) in PACKAGES
              and PACKAGES.index(_package(name)) > PACKAGES.index(_package(module))]
    assert upward == []


def test_no_module_imports_itself_through_others() -> None:
    graph = {module: {name for name in names if name in MODULES and name != module}
             for module, names in IMPORTS.items()}
    cycles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_core_imports_torch_numpy_and_pydantic_only() -> None:
    foreign = {(module, name.split(".")[0]) for module, names in IMPORTS.items()
               if _package(module) == "strategies" for name in names
               if _package(name) != "strategies"
               and name.split(".")[0] not in {*CORE_THIRD_PARTY, *sys.stdlib_module_names}}
    # the search's integer-program fallback: scipy's HiGHS, a numerical library like numpy
    assert foreign == {(SOLVER_MODULE, "scipy")}
