"""The strategy registry is the one list of strategy names: everything else derives from it."""

from __future__ import annotations

from typing import get_args

from layerwise.flows.benchmark_config import StrategyName
from layerwise.strategies.schedules import INEXACT, SCHEDULED, STRATEGY_NAMES, schedule_help


def test_the_benchmark_config_accepts_exactly_the_names_the_registry_knows() -> None:
    assert set(get_args(StrategyName)) == set(STRATEGY_NAMES)


def test_the_help_names_every_scheduled_strategy() -> None:
    help_text = schedule_help()
    assert all(name in help_text for name in SCHEDULED)
    assert set(SCHEDULED) >= INEXACT
