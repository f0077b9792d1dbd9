"""Fixtures shared by test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def prefect_server() -> Iterator[None]:
    """Prefect's test harness (a temporary API server on a fresh database) for one module's
    flows. Not longer: the server's background services keep polling, and kept for the whole
    session they slowed every later test on a 2-core machine (the suite went 9:20 -> 11:11 and
    two launcher tests ran out of time)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness():
        yield
