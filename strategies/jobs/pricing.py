"""The cost model a plan or a run is priced with: Jia et al. 2018's Eq. 1 on a cluster's
devices, t_c from a measured profile or from the cluster device's analytic model."""

from __future__ import annotations

import shlex
from pathlib import Path

from layerwise.strategies.cost.compute_time import AnalyticCompute, ProfiledCompute
from layerwise.strategies.cost.cost_model import BatchNormStatistics, CostModel, Placement
from layerwise.strategies.cost.profile import Profile
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.hardware.cluster import Cluster, load_cluster
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.model.space import count_configs

AUTO = "auto"
PLACEMENTS: tuple[str, ...] = (AUTO, "aligned", "origin")
# The most devices whose whole space the default (`auto`) searches. bench_search on one core
# here, whole space, 64 devices: AlexNet 0.5 s, VGG-16 and ResNet-18 0.8 s, ResNets 1.5-1.7 s,
# Inception-v3 3.8 s (p100x16; h200x8 3.3 s); 128 devices: AlexNet 2.8 s, VGG-16 3.6 s,
# ResNet-18 4.4 s, and the 1,816-config spaces' tables grow 4.6x. Beyond it `auto` searches
# the origin space and says so.
AUTO_ALIGNED_DEVICES = 64


def compute_source(graph: LayerGraph, cluster: Cluster, profile: Path | None, analytic: bool,
                   device_count: int) -> AnalyticCompute | ProfiledCompute:
    """Where t_c comes from: the profile file, checked against `graph`, or the analytic model."""
    if analytic and profile:
        raise LayerwiseError("give either --profile FILE or --analytic, not both")
    if analytic:
        return AnalyticCompute(cluster)
    if profile is None:
        raise LayerwiseError(
            f"no cost source: run `layerwise profile {shlex.quote(graph.model)} --devices "
            f"{device_count}` "
            "and pass --profile FILE, or plan with --analytic (t_c from the cluster device's "
            "analytic model)"
        )
    loaded = Profile.load(profile)
    loaded.check_matches(graph, graph.batch)
    return ProfiledCompute(loaded)


def resolved_placement(graph: LayerGraph, devices: int, placement: str,
                       ) -> tuple[Placement, str | None]:
    """The placement a search runs with, and the line saying why when `auto` could not take
    the whole space: aligned (any block of devices aligned to its size) up to
    AUTO_ALIGNED_DEVICES devices, then origin (every layer's devices start at device 0)."""
    if placement not in PLACEMENTS:
        raise LayerwiseError(f"--placement must be auto, aligned or origin (got {placement})")
    if placement != AUTO:
        return placement, None  # type: ignore[return-value]
    if devices <= AUTO_ALIGNED_DEVICES:
        return "aligned", None
    pairs = sum(count_configs(layer, devices) ** 2 for layer in graph.layers)
    return "origin", (f"placement origin: the whole space of {graph.model} on {devices} devices "
                      f"prices {pairs:,} config pairs, searched in seconds up to "
                      f"{AUTO_ALIGNED_DEVICES} devices; every layer's devices start at device 0 "
                      "(--placement aligned searches it all, in minutes)")


def cost_model(graph: LayerGraph, cluster_name: str, devices: int, profile: Path | None,
               analytic: bool, placement: str = AUTO,
               batch_norm_statistics: BatchNormStatistics = "synced") -> CostModel:
    """Eq. 1 for `graph` on `devices` devices of a cluster, t_c from a profile or the analytic
    model; its `placement_note` says when `auto` searched less than the whole space."""
    chosen, note = resolved_placement(graph, devices, placement)
    cluster = load_cluster(cluster_name)
    compute = compute_source(graph, cluster, profile, analytic, devices)
    return CostModel(graph, cluster, devices, compute, placement=chosen, placement_note=note,
                     batch_norm_statistics=batch_norm_statistics)
