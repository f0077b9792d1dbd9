"""The platform the ParaDL oracle prices: a cluster, with the network as Kahira et al. model it.

    layerwise oracle resnet50 --platform abci

A platform file names a cluster (its devices, nodes and racks) and gives the network figures
ParaDL's equations use: one link per tier a collective can span (inside a node, between nodes
of a rack, across racks) and the link halo exchanges run over inside a node. They live apart
from the cluster presets because they are the paper's model of its machine, kept as published
while the cluster model of the same machine may be refined. Presets sit in
``strategies/oracle/platforms/``; a name or path that is not a platform is read as a cluster,
whose own links then serve every tier and the halos.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.atomic import first_error
from layerwise.strategies.files.documents import YAML_SUFFIXES, parse_yaml, read_yaml
from layerwise.strategies.hardware.cluster import Cluster, Link, Links, Racks, load_cluster
from layerwise.strategies.text import Name

__all__ = ["Platform", "PlatformSpec", "Tiers", "load_platform", "platform_names"]

SCHEMA_VERSION = 1
_PRESETS = "platforms"


class Tiers(BaseModel):
    """The link of each network tier: `node` inside a node, `rack` between nodes of one rack,
    `across_racks` between racks (unused on a cluster without racks)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: Link
    rack: Link
    across_racks: Link | None = None


class PlatformSpec(BaseModel):
    """A platform file: the cluster it refines (preset name, or a path relative to the file),
    the tiers' links and the halo link (None: the tiers' links carry the halos too)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    name: Name = Field(min_length=1)
    description: Name = ""
    cluster: Name = Field(min_length=1)
    tiers: Tiers
    halo: Link | None = None


@dataclass(frozen=True)
class Platform:
    """What the oracle prices on: the cluster with the tiers' links in place of its own, and
    the link a halo exchange inside one node runs over (None: the node's link)."""

    name: str
    cluster: Cluster
    halo: Link | None = None


def platform_names() -> list[str]:
    """The preset platforms, by name."""
    folder = resources.files("layerwise.strategies.oracle") / _PRESETS
    return sorted(Path(entry.name).stem for entry in folder.iterdir()
                  if entry.name.endswith(YAML_SUFFIXES))


def load_platform(name_or_path: str) -> Platform:
    """A preset platform by name, a platform file by path, or else a cluster (preset or file)
    whose own links serve every tier. LayerwiseError (one line) on anything malformed."""
    text = name_or_path.strip()
    if text in platform_names():
        return _preset(text)
    path = Path(text).expanduser()
    if path.suffix.lower() in YAML_SUFFIXES and path.is_file():
        what = f"platform {path}"
        data = read_yaml(path, what)
        if isinstance(data, dict) and "tiers" in data:
            return _platform(data, what, path.parent)
    cluster = load_cluster(text)
    return Platform(name=cluster.name, cluster=cluster)


@cache
def _preset(name: str) -> Platform:
    what = f"platform preset {name}"
    source = resources.files("layerwise.strategies.oracle") / _PRESETS / f"{name}.yaml"
    return _platform(parse_yaml(source.read_text(encoding="utf-8"), what), what, None)


def _platform(data: Any, what: str, folder: Path | None) -> Platform:
    try:
        spec = PlatformSpec.model_validate(data)
    except ValidationError as problem:
        raise LayerwiseError(f"{what}: {first_error(problem)}") from None
    if spec.schema_version != SCHEMA_VERSION:
        raise LayerwiseError(f"{what}: schema_version: this layerwise reads {SCHEMA_VERSION} "
                             f"(got {spec.schema_version})")
    relative = folder / spec.cluster if folder is not None else None
    cluster = load_cluster(str(relative) if relative is not None and relative.is_file()
                           else spec.cluster)
    tiers = spec.tiers
    racks = cluster.racks
    if racks is not None and tiers.across_racks is not None:
        racks = Racks(nodes_per_rack=racks.nodes_per_rack, link=tiers.across_racks)
    priced = cluster.model_copy(update={
        "links": Links(intra_node=tiers.node, inter_node=tiers.rack), "racks": racks})
    return Platform(name=spec.name, cluster=priced, halo=spec.halo)
