"""Fixtures shared by test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """Prefect's test harness (a temporary API server on a fresh database), started once per
    test process for every module that runs flows: it takes ~20 s to start on 2 cores."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness():
        yield
