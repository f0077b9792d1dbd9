"""Search task: the optimal layer-wise strategy, the baselines (Eq. 1) and the scheduled
strategies from the literature (each with its own schedule's prediction).

Every strategy is saved as the JSON `layerwise train --strategy FILE` takes, so the training
task runs exactly what was searched and the tracking task logs exactly what ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from layerwise.strategies.jobs.named_strategies import strategy_by_name
from layerwise.strategies.jobs.pricing import cost_model
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.search.elimination import SearchResult


@task(name="search", cache_policy=NO_CACHE)
def search_strategies(graph: LayerGraph, cluster: str, devices: int, profile: Path | None,
                      strategies: Sequence[str], out: Path,
                      memory_limit: int | None = None) -> dict[str, Path]:
    """Strategy name -> its JSON file in `out`, predicted with the profile or the roofline;
    the searched one held to `memory_limit` bytes per device (default: the cluster's)."""
    logger = get_run_logger()
    cost = cost_model(graph, cluster, devices, profile, analytic=profile is None)

    def log_search(result: SearchResult) -> None:
        logger.info("layer-wise search: %.3f s (%s, %d of %d configs kept by the bounds, "
                    "final graph %d node(s))", result.search_seconds, result.search_method,
                    result.configs_kept, result.configs, result.final_graph_nodes)
        if memory_limit is not None:
            logger.info("held to %.1f MB per device: at most %.1f%% slower than the best plan "
                        "that fits", memory_limit / 1e6, result.optimality_gap * 100)

    files = {}
    for name in strategies:
        strategy = strategy_by_name(name, cost, on_search=log_search, memory_limit=memory_limit)
        files[name] = strategy.save(out / f"{name}.strategy.json")
        logger.info("%s: predicted %.3f ms per step, %d transfer + %d sync bytes", name,
                    strategy.predicted.step_seconds * 1e3, strategy.predicted.transfer_bytes,
                    strategy.predicted.sync_bytes)
    return files


@task(name="oracle", cache_policy=NO_CACHE)
def oracle_step_seconds(graph: LayerGraph, cluster: str, devices: int, profile: Path | None,
                        strategies: Sequence[str]) -> dict[str, float]:
    """ParaDL's predicted step time of each strategy it has an equivalent of, with the same
    t_c as the search (strategy name -> seconds; strategies it cannot predict are left out)."""
    from layerwise.strategies.oracle.paradl import step_case, summary_from_graph

    logger = get_run_logger()
    if graph.batch % devices:
        logger.info("ParaDL: skipped, its cases take the same samples on every device and the "
                    "batch %d does not divide over %d devices", graph.batch, devices)
        return {}
    cost = cost_model(graph, cluster, devices, profile, analytic=profile is None)
    summary = summary_from_graph(graph, cost.compute)
    predicted = {}
    for name in strategies:
        case = step_case(summary, cost.cluster, name, devices, graph.batch // devices)
        if case is not None and case.epoch_seconds is not None:
            predicted[name] = case.epoch_seconds
            logger.info("ParaDL %s (as %s): %.3f ms per step, %s-bound", name, case.strategy,
                        case.epoch_seconds * 1e3, case.bottleneck)
    return predicted
