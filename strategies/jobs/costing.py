"""The cost model a plan or a run is priced with: Jia et al. 2018's Eq. 1 on a cluster's
devices, t_c from a measured profile or from the roofline on the cluster's device."""

from __future__ import annotations

from pathlib import Path

from strategies.cluster import Cluster, load_cluster
from strategies.compute import AnalyticCompute, ProfiledCompute
from strategies.cost import CostModel, Placement
from strategies.errors import LayerwiseError
from strategies.graph import LayerGraph
from strategies.profile import Profile

PLACEMENTS: tuple[Placement, ...] = ("origin", "aligned")


def compute_source(graph: LayerGraph, cluster: Cluster, profile: Path | None, analytic: bool,
                   device_count: int) -> AnalyticCompute | ProfiledCompute:
    """Where t_c comes from: the profile file, checked against `graph`, or the roofline."""
    if analytic and profile:
        raise LayerwiseError("give either --profile FILE or --analytic, not both")
    if analytic:
        return AnalyticCompute(cluster)
    if profile is None:
        raise LayerwiseError(
            f"no cost source: run `layerwise profile {graph.model} --devices {device_count}` "
            "and pass --profile FILE, or plan with --analytic (roofline on the cluster's device)"
        )
    loaded = Profile.load(profile)
    loaded.check_matches(graph, graph.batch)
    return ProfiledCompute(loaded)


def cost_model(graph: LayerGraph, cluster_name: str, devices: int, profile: Path | None,
               analytic: bool, placement: str = "aligned") -> CostModel:
    """Eq. 1 for `graph` on `devices` devices of a cluster, t_c from a profile or the roofline."""
    if placement not in PLACEMENTS:
        raise LayerwiseError(f"--placement must be origin or aligned (got {placement})")
    cluster = load_cluster(cluster_name)
    compute = compute_source(graph, cluster, profile, analytic, devices)
    return CostModel(graph, cluster, devices, compute, placement=placement)  # type: ignore[arg-type]
