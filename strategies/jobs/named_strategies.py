"""Every strategy a user can name, as a Strategy priced on a cost model: the one entry point of
`layerwise search`, `layerwise train --strategy NAME`, `layerwise verify` and the benchmark
flow's search task. The names are the registry's (strategies/schedules/__init__.py); the
searched one also reports how its search went.
"""

from __future__ import annotations

from collections.abc import Callable

from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.schedules import SEARCHED
from layerwise.strategies.schedules.loader import build_strategy
from layerwise.strategies.search.elimination import SearchResult
from layerwise.strategies.search.named import searched_strategy
from layerwise.strategies.strategy import Strategy


def strategy_by_name(name: str, cost: CostModel,
                     on_search: Callable[[SearchResult], None] | None = None,
                     memory_limit: int | None = None) -> Strategy:
    """The strategy `name` on `cost`'s graph and devices, with its predicted cost; the search
    (name `layerwise`) holds its plan to `memory_limit` bytes per device (default: the cluster
    device's memory less the reserve) and hands its statistics to `on_search`. ConfigError for
    a name the registry does not hold."""
    if name == SEARCHED:
        strategy, result = searched_strategy(cost, memory_limit)
        if on_search is not None:
            on_search(result)
        return strategy
    return build_strategy(name, cost)
