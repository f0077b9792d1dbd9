"""Fixtures shared by test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def prefect_server() -> Iterator[None]:
    """Prefect's test harness (a temporary API server on a fresh database, ~20 s to start on
    2 cores) for one module's flows, stopped when the module is done."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness():
        yield
