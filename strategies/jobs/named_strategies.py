"""Every strategy a user can name, as a Strategy priced on a cost model.

`layerwise` is the optimal layer-wise strategy (Jia et al. 2018, Algorithm 1: node and edge
elimination under Eq. 1), the baselines are one config per layer (layerwise.strategies.baselines, priced
by Eq. 1), the scheduled strategies from the literature run with their own schedule and
prediction (layerwise.strategies.schedules). `layerwise search`, `layerwise train --strategy NAME` and
the benchmark flow's search task all resolve names here.
"""

from __future__ import annotations

from collections.abc import Callable

from layerwise.strategies.baselines import BASELINES, baseline
from layerwise.strategies.cost import CostModel
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.schedules import SCHEDULED, scheduled_strategy
from layerwise.strategies.search import SearchResult, optimal_strategy
from layerwise.strategies.strategy import Strategy

LAYERWISE = "layerwise"


def strategy_names() -> tuple[str, ...]:
    """The names `strategy_by_name` takes: the searched one, the baselines, the scheduled."""
    return (LAYERWISE, *BASELINES, *SCHEDULED)


def searched_strategy(cost: CostModel) -> tuple[Strategy, SearchResult]:
    """The optimal layer-wise strategy under `cost`, and how the search went."""
    result = optimal_strategy(cost)
    strategy = Strategy.from_assignment(
        LAYERWISE, cost.graph, cost.devices, cost.cluster.name, cost.compute.name,
        result.assignment, result.predicted)
    return strategy, result


def strategy_by_name(name: str, cost: CostModel,
                     on_search: Callable[[SearchResult], None] | None = None) -> Strategy:
    """The strategy `name` on `cost`'s graph and devices, with its predicted cost; a search
    (name `layerwise`) also hands its statistics to `on_search`."""
    if name == LAYERWISE:
        strategy, result = searched_strategy(cost)
        if on_search is not None:
            on_search(result)
        return strategy
    if name in BASELINES:
        assignment = baseline(name, cost.graph, cost.devices)
        return Strategy.from_assignment(name, cost.graph, cost.devices, cost.cluster.name,
                                        cost.compute.name, assignment,
                                        cost.evaluate(assignment))
    if name in SCHEDULED:
        return scheduled_strategy(name, cost)
    raise LayerwiseError(f"unknown strategy '{name}'; choose from {', '.join(strategy_names())}")
