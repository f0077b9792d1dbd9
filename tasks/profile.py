"""Profiling task: t_c of the tiles the chosen strategies need, measured on this machine.

On CPUs the flow's ranks share this machine, so its `devices` profilers measure at once (one
per rank, `profile_graph_concurrently`); on a GPU each rank has its own device and one profiler
measures. The profile file under data/profiles/ is keyed by model structure, global batch,
device, dtype, torch version and that concurrency (`layerwise.strategies.profile.profile_key`), so it is
the cache: a second benchmark of the same model on the same machine measures nothing, and one
that needs more configurations measures only the missing tiles. A file is reused under the
same rule as `layerwise profile`'s (layerwise.strategies.jobs.profile_reuse).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from layerwise.strategies.baselines import BASELINES, baseline
from layerwise.strategies.graph import LayerGraph
from layerwise.strategies.jobs.profile_reuse import reusable_profile
from layerwise.strategies.profile import (
    concurrent_threads,
    default_profile_path,
    device_name,
    profile_graph_concurrently,
    resolve_device,
)
from layerwise.strategies.space import ParallelConfig
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

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
    name = device_name(target)
    path = default_profile_path(graph, name, processes=processes)
    existing = reusable_profile(path, graph, name, processes)
    if existing is None and path.exists():
        logger.info("profile %s was measured by an older layerwise: measuring it again", path)
    logger.info("measuring t_c of %s's tiles on %s, %d profiler(s) at once%s", graph.model,
                name, processes, f", reusing {existing.tile_count} tiles of {path}"
                if existing is not None else "")
    every = max(1, len(graph.layers) // PROGRESS_LINES)

    def progress(done: int, total: int, layer: str) -> None:
        if done % every == 0 or done == total:
            logger.info("profiled %d/%d layers (%s)", done, total, layer)

    started = time.perf_counter()
    profile = profile_graph_concurrently(
        graph, devices, processes, progress=progress,
        configs=needed_configs(graph, devices, strategies), device=target, existing=existing,
        threads=concurrent_threads(processes))
    measured = profile.tile_count - (existing.tile_count if existing else 0)
    if profile is not existing:
        profile.save(path)
    logger.info("profile %s: %d tiles measured in %.1f s by %d profiler(s) at once, %d reused",
                path, measured, time.perf_counter() - started, processes,
                profile.tile_count - measured)
    return path
