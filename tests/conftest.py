"""Fixtures shared by test modules."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from layerwise.strategies.processes.huge_pages import use_huge_pages

# As the CLI's main does, before any test imports torch: the tests run what users run.
use_huge_pages()

# Modules whose module-scoped fixture runs a whole flow or launches processes for many tests:
# under xdist each goes whole to one worker, so that the fixture runs once (on every worker that
# got one of its tests, otherwise). xdist_group marks cannot say this: with pytest 9.2,
# `--dist loadgroup` silently ignores them (the worker's nodeid suffix has no effect there).
WHOLE_MODULES = frozenset(f"tests/test_{name}.py" for name in (
    "benchmark_flow", "compare_flow", "pipeline", "local", "owt", "calibrate"))
# The modules whose flows run on Prefect's test harness go to one worker together, so that the
# harness (a database migrated at each start: ~20 s of CPU) starts once in the suite.
HARNESS_MODULES = frozenset(f"tests/test_{name}.py" for name in (
    "benchmark_flow", "compare_flow", "serve"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduling with HARNESS_MODULES one scope, each other of WHOLE_MODULES one
    scope, every other test its own (as `--dist load` spreads them)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModulesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in HARNESS_MODULES:
                return "prefect-test-harness"
            return module if module in WHOLE_MODULES else nodeid

    return ModulesTogether(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first (a stable sort: each keeps its place among its kind), so that the quick
    ones fill in at the end of a parallel run instead of a long one starting last. The tests
    that share a costly module fixture are all slow, so they stay together and it is set up
    once; pytest's own regrouping by parametrized fixtures runs after this."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


HARNESS_STARTS = 3


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """Prefect's test harness (a temporary API server on a fresh database) for the flows of
    every module a test worker runs, stopped at its end. Each start migrates that database:
    ~20 s on 2 cores, 35-45 s while the other tests load them, past the harness's default
    30 s, so it starts once per worker, not once per module. The harness polls the server's
    health with httpx's 5 s read timeout and gives up on the first read that times out, which a
    server still migrating on a loaded machine can cause: that server is stopped and the
    harness started again, up to HARNESS_STARTS times."""
    import httpx
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.testing.utilities import prefect_test_harness

    for start in range(HARNESS_STARTS):
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(prefect_test_harness(server_startup_timeout=120))
            except httpx.ReadTimeout:
                unanswered = SubprocessASGIServer._instances.pop(None, None)
                if unanswered is not None:
                    unanswered.stop()
                if start == HARNESS_STARTS - 1:
                    raise
                continue
            yield
            return


@pytest.fixture()
def workers_import_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun workers import the test models by reference (tests.idiom_models), from this
    checkout."""
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, (str(root), os.environ.get("PYTHONPATH")))))
