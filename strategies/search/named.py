"""The layer-wise family by name: the searched optimum (Jia et al. 2018, Algorithm 1: node and
edge elimination under Eq. 1) and the baselines, one config per layer priced by Eq. 1. The
registry's first entry names this module's `build_strategy`."""

from __future__ import annotations

from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.cost.memory import memory_budget
from layerwise.strategies.schedules import SEARCHED
from layerwise.strategies.search.baselines import baseline
from layerwise.strategies.search.elimination import SearchResult
from layerwise.strategies.search.memory_fit import optimal_within
from layerwise.strategies.strategy import Strategy


def searched_strategy(cost: CostModel, memory_limit: int | None = None
                      ) -> tuple[Strategy, SearchResult]:
    """The optimal layer-wise strategy under `cost` within `memory_limit` bytes per device
    (default: the cluster device's memory less the reserve), and how the search went."""
    budget = (memory_limit if memory_limit is not None
              else memory_budget(cost.cluster.device.memory_bytes))
    result = optimal_within(cost, budget)
    strategy = Strategy.from_assignment(
        SEARCHED, cost.graph, cost.devices, cost.cluster.name, cost.compute.name,
        result.assignment, result.predicted, recompute=result.recompute)
    return strategy, result


def build_strategy(name: str, cost: CostModel) -> Strategy:
    """The searched strategy (`layerwise`) or the baseline `name` on `cost`'s graph and
    devices, with its predicted cost."""
    if name == SEARCHED:
        return searched_strategy(cost)[0]
    assignment = baseline(name, cost.graph, cost.devices)
    return Strategy.from_assignment(name, cost.graph, cost.devices, cost.cluster.name,
                                    cost.compute.name, assignment, cost.evaluate(assignment))
