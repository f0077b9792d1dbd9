"""The house's rules, read from the source.

- One namespace: every module is `layerwise.*`; its parts point one way,
  `layerwise` (the public API) -> flows -> tasks -> strategies, with no edge back.
- Inside the core, floors: each module lies on one floor and imports only its own floor and
  those below, the modules the registry names by "module:attribute" strings included (they
  are imported by the loader, so they count as its imports).
- No import cycle, string-loaded modules included.
- The core imports only torch, numpy and pydantic (plus the standard library, PyYAML for the
  cluster and platform specs, and scipy's HiGHS in the search's integer program alone), so it
  also runs on a bare GPU machine.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "layerwise"  # the one top-level import name the distribution installs
PACKAGES = ("strategies", "tasks", "flows")  # lowest first: an import may only point down
CORE = f"{NAMESPACE}.strategies"
CORE_THIRD_PARTY = {"torch", "numpy", "pydantic", "yaml"}
SOLVER_MODULE = f"{CORE}.search.integer_program"  # the one core module that imports scipy
LOADER = f"{CORE}.schedules.loader"  # the one core module that imports by "module:attr" path
STRING_PATH = re.compile(rf"{NAMESPACE}\.[\w.]+:\w+")

# The core's floors, lowest first (docs/architecture.md); a module lies on the floor of the
# longest pattern naming it or its package, `*` standing for one name.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("errors", "text", "files", "processes", "hyperparameters", "learning_rate",
                "sgd", "jobs.defaults")),
    ("model", ("model",)),
    ("contracts", ("execution", "schedules", "schedules.*.execution", "breakdown", "strategy",
                   "training_run")),
    ("hardware", ("hardware",)),
    ("cost", ("cost",)),
    ("planning", ("search", "oracle", "schedules.*.planner")),
    # the calibration times links through the runtime's own halo exchange
    ("runtime", ("runtime", "schedules.*.engine", "exactness", "hardware.calibrate")),
    ("top", ("jobs", "schedules.loader", "runtime.worker")),
)


def _modules() -> dict[str, Path]:
    found = {NAMESPACE: ROOT / NAMESPACE / "__init__.py"}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join((NAMESPACE, *path.relative_to(ROOT).with_suffix("").parts))
            found[name.removesuffix(".__init__")] = path
    return found


class _Imports(ast.NodeVisitor):
    """Every module an import names at run time (imports only for type checkers are skipped),
    and every module a "module:attribute" string names."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.string_loaded: set[str] = set()

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

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and STRING_PATH.fullmatch(node.value):
            self.string_loaded.add(node.value.partition(":")[0])


def _visit(path: Path) -> _Imports:
    visitor = _Imports()
    visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
    return visitor


MODULES = _modules()
VISITS = {name: _visit(path) for name, path in MODULES.items()}
STRING_LOADED = {module for visit in VISITS.values() for module in visit.string_loaded}
# What each module imports at run time; the loader imports every string-loaded module.
IMPORTS = {name: visit.names | (STRING_LOADED if name == LOADER else set())
           for name, visit in VISITS.items()}


def _part(name: str) -> str | None:
    """The namespace's part a module lies in: a mapped folder, or the namespace itself."""
    parts = name.split(".")
    if parts[0] != NAMESPACE:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else NAMESPACE


def _rank(name: str) -> int:
    return (*PACKAGES, NAMESPACE).index(_part(name))  # type: ignore[arg-type]


def _floor(module: str) -> int | None:
    relative = module.removeprefix(CORE).lstrip(".")
    best: tuple[int, int] | None = None
    for index, (_, patterns) in enumerate(FLOORS):
        for pattern in patterns:
            regex = re.escape(pattern).replace(r"\*", r"\w+") + r"(\..+)?"
            if re.fullmatch(regex, relative) and (best is None or len(pattern) > best[1]):
                best = (index, len(pattern))
    return None if best is None else best[0]


def test_every_module_the_distribution_installs_is_in_the_namespace() -> None:
    assert [name for name in MODULES if _part(name) is None] == []
    assert STRING_LOADED - set(MODULES) == set()


def test_imports_point_down_from_the_api_to_flows_to_tasks_to_strategies() -> None:
    upward = [(module, name) for module, names in IMPORTS.items() for name in names
              if _part(name) is not None and _rank(name) > _rank(module)]
    assert upward == []


def test_every_core_module_lies_on_a_floor_and_imports_none_above_it() -> None:
    core = [name for name in MODULES if name.startswith(f"{CORE}.")]
    assert [name for name in core if _floor(name) is None] == []
    upward = [(module, FLOORS[_floor(module)][0], name, FLOORS[_floor(name)][0])
              for module in core for name in IMPORTS[module]
              if name in MODULES and name.startswith(f"{CORE}.")
              and _floor(name) > _floor(module)]
    assert upward == []


def test_only_the_loader_imports_core_modules_by_path() -> None:
    holders = {name for name, visit in VISITS.items() if visit.string_loaded}
    assert holders <= {f"{CORE}.schedules", LOADER}
    assert STRING_LOADED, "the registry names its planners and engines by path"


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
               if _part(module) == "strategies" for name in names
               if _part(name) != "strategies"
               and name.split(".")[0] not in {*CORE_THIRD_PARTY, *sys.stdlib_module_names}}
    # the search's integer-program fallback: scipy's HiGHS, a numerical library like numpy
    assert foreign == {(SOLVER_MODULE, "scipy")}
