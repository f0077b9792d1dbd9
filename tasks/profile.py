"""Profiling task: t_c of the tiles the chosen strategies need, measured on this machine.

On CPUs the flow's ranks share this machine, so its `devices` profilers measure at once (one
per rank); on a GPU each rank has its own device and one profiler measures. The profile file
under data/profiles/ is keyed by model structure, global batch, device, dtype, torch version
and that concurrency (`profile_key` in strategies/cost/profile.py), so it is the cache: a second
benchmark of the same model on the same machine measures nothing, and one that needs more
configurations measures only the missing tiles. Reuse and measurement are `layerwise profile`'s
own (strategies/jobs/profiling.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from layerwise.strategies.cost.profile import concurrent_threads
from layerwise.strategies.hardware.this_machine import resolve_device
from layerwise.strategies.jobs.profiling import measure_profile, plan_profile
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.search.baselines import BASELINES, baseline

PROGRESS_LINES = 4  # progress lines logged per profile: enough to see it move


def needed_configs(graph: LayerGraph, devices: int, strategies: Sequence[str]
                   ) -> dict[str, list[ParallelConfig]] | None:
    """Per layer, the configs whose t_c the strategies' costs read; None means all of them:
    the layer-wise search costs every configuration, and the scheduled strategies (OWT's
    schemes, pipelines, local parallelism) choose theirs by cost over many."""
    if any(name not in BASELINES for name in strategies):
        return None
    assignments = [baseline(name, graph, devices) for name in strategies]
    return {layer.name: sorted({assignment[layer.name] for assignment in assignments},
                               key=lambda config: config.text)
            for layer in graph.layers}


@task(name="profile", cache_policy=NO_CACHE)
def profile_model(graph: LayerGraph, devices: int, strategies: Sequence[str]) -> Path:
    """The profile file covering `strategies` on `devices` devices, measuring what it lacks."""
    logger = get_run_logger()
    target = resolve_device(None)
    processes = devices if target.type == "cpu" else 1
    plan = plan_profile(graph, devices, processes, target,
                        configs=needed_configs(graph, devices, strategies))
    if plan.stale:
        logger.info("profile %s was measured by an older layerwise: measuring it again",
                    plan.path)
    logger.info("measuring t_c of %s's tiles on %s, %d profiler(s) at once%s", graph.model,
                plan.device_name, processes, f", reusing {plan.reused_count} tiles of "
                f"{plan.path}" if plan.existing is not None else "")
    every = max(1, len(graph.layers) // PROGRESS_LINES)

    def progress(done: int, total: int, layer: str) -> None:
        if done % every == 0 or done == total:
            logger.info("profiled %d/%d layers (%s)", done, total, layer)

    started = time.perf_counter()
    measure_profile(plan, progress=progress, threads=concurrent_threads(processes))
    logger.info("profile %s: %d tiles measured in %.1f s by %d profiler(s) at once, %d reused",
                plan.path, plan.measured_count, time.perf_counter() - started, processes,
                plan.reused_count)
    return plan.path
