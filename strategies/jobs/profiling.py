"""Profile or reuse: the one way `layerwise profile` and the flow's profile task get t_c.

A profile's t_c are times of the tiles of one layer graph at one global batch, measured on one
device with one torch and dtype, by a number of profilers at once (ranks that share a CPU slow
each other down). Reusing it for anything else would price Eq. 1 with times that are not this
run's, so every one of those is checked before a saved profile is extended; then only the tiles
it lacks are measured, and the file is rewritten only when something was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from layerwise.strategies.cost.profile import (
    Profile,
    ProgressCallback,
    default_profile_path,
    missing_tiles,
    profile_graph_concurrently,
    tile_plan,
)
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.hardware.this_machine import device_name
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.tiles import TileWork
from layerwise.strategies.processes.huge_pages import huge_pages_in_use
from layerwise.strategies.schedules.loader import profiled_configs


class ProfileMismatchError(LayerwiseError):
    """A readable profile file measured for another graph, device or process count."""


def reusable_profile(path: Path, graph: LayerGraph, device: str,
                     processes: int) -> Profile | None:
    """The profile at `path` to extend, or None when there is none (no file, or one measured
    by an older layerwise, to be measured again). LayerwiseError for a broken file;
    ProfileMismatchError when it is for another graph structure or batch, another device,
    torch, dtype or huge-page setting, or another process count."""
    existing = Profile.reusable(path)
    if existing is None:
        return None
    try:
        existing.check_matches(graph, source=path)
        existing.check_device(device, torch.__version__, huge_pages_in_use(), source=path)
        existing.check_processes(processes, source=path)
    except LayerwiseError as error:
        raise ProfileMismatchError(str(error)) from None
    return existing


@dataclass(frozen=True)
class ProfilePlan:
    """What a profile run will do: where its file is, what it reuses, which tiles it measures."""

    graph: LayerGraph
    devices: int
    processes: int
    device: torch.device
    path: Path
    existing: Profile | None
    stale: bool  # the file at `path` was measured by an older layerwise: it is replaced
    configs: Mapping[str, Sequence[ParallelConfig]]
    tiles: dict[str, dict[str, TileWork]]  # layer -> tile key -> tile, input layers left out
    to_measure: dict[str, dict[str, TileWork]]  # the tiles `existing` lacks

    @property
    def device_name(self) -> str:
        return device_name(self.device)

    @property
    def measured_count(self) -> int:
        return sum(len(tiles) for tiles in self.to_measure.values())

    @property
    def reused_count(self) -> int:
        return sum(len(tiles) for tiles in self.tiles.values()) - self.measured_count


def plan_profile(graph: LayerGraph, devices: int, processes: int, device: torch.device,
                 path: Path | None = None, force: bool = False,
                 configs: Mapping[str, Sequence[ParallelConfig]] | None = None) -> ProfilePlan:
    """The profile of `graph`'s tiles on up to `devices` devices, measured by `processes`
    profilers at once on `device`, at `path` (default: the file its key names under
    data/profiles/); `configs` per layer (default: every config any strategy's pricer reads).
    The file there is reused unless `force`; ProfileMismatchError when it is for another
    graph, device or process count."""
    name = device_name(device)
    path = path if path is not None else default_profile_path(graph, name, processes=processes)
    existing = None if force else reusable_profile(path, graph, name, processes)
    chosen = configs if configs is not None else profiled_configs(graph, devices)
    plan = tile_plan(graph, devices, chosen)
    todo = missing_tiles(plan, existing)
    computed = {layer.name for layer in graph.layers if layer.kind != "input"}
    return ProfilePlan(
        graph=graph, devices=devices, processes=processes, device=device, path=path,
        existing=existing, stale=path.exists() and not force and existing is None,
        configs=chosen, tiles={name: plan[name] for name in plan if name in computed},
        to_measure={name: todo[name] for name in todo if name in computed and todo[name]})


def measure_profile(plan: ProfilePlan, progress: ProgressCallback | None = None,
                    threads: int | None = None, warmup: int | None = None,
                    repeats: int | None = None) -> Profile:
    """The profile `plan` describes: the reused one extended by the tiles it lacks, saved to
    `plan.path` atomically when anything was measured."""
    profile = profile_graph_concurrently(
        plan.graph, plan.devices, plan.processes, progress=progress, device=plan.device,
        configs=plan.configs, existing=plan.existing, threads=threads, warmup=warmup,
        repeats=repeats)
    if profile is not plan.existing:
        profile.save(plan.path)
    return profile
