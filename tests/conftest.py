"""Fixtures shared by test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def prefect_server() -> Iterator[None]:
    """Prefect's test harness (a temporary API server on a fresh database) for one module's
    flows, stopped when the module is done. Its first start migrates that database: ~20 s on
    2 cores, 35-45 s while the other tests load them, past the harness's default 30 s."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
