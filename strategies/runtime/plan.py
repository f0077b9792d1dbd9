"""The static plan of a Strategy: every tile's box, every message between layers, every group.

All ranks build the same plan from the same graph and assignment, so they agree on who sends
what to whom without talking. Boxes are global (start, stop) ranges over the 5-d view
(n, c, d, h, w) of a layer's output (`space.as_view`).

Redistribution (Jia et al. 2018, section 4, the regions t_x counts): consumer tile q of layer L
needs box B_q of input k (`tiles.needed_range`: receptive field, clipped); producer tile p
holds box T_p. The piece B_q ∩ T_p moves from p's device to q's device, or is copied when both
are the same device. Producer tiles partition their tensor, so the pieces of B_q cover it
exactly once; the elements that cross devices are the cost model's transfer elements.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from functools import cached_property

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.graph import Layer, LayerGraph
from layerwise.strategies.model.space import Degrees, ParallelConfig, check_config
from layerwise.strategies.model.tiles import Box, box_volume, indexed_box, needed_box
from layerwise.strategies.strategy import check_recompute

TileIndex = Degrees


def intersect(first: Box, second: Box) -> Box | None:
    """The common box of two boxes, or None if they share no element."""
    ranges = tuple((max(a[0], b[0]), min(a[1], b[1])) for a, b in zip(first, second, strict=True))
    if any(start >= stop for start, stop in ranges):
        return None
    return ranges


def is_empty(box: Box) -> bool:
    return any(start >= stop for start, stop in box)


def shape_of(box: Box) -> tuple[int, ...]:
    return tuple(stop - start for start, stop in box)


def local_slices(box: Box, origin: Box) -> tuple[slice, ...]:
    """Index of `box` inside a tensor that holds `origin` (both global, of one rank)."""
    return tuple(slice(b[0] - o[0], b[1] - o[0]) for b, o in zip(box, origin, strict=True))


@dataclass(frozen=True)
class Tile:
    """One device's part of a layer's output."""

    device: int
    index: TileIndex
    box: Box


@dataclass(frozen=True)
class Piece:
    """Part of a producer tile that a consumer tile needs: `box` moves source -> target."""

    source: int
    target: int
    box: Box

    @property
    def remote(self) -> bool:
        return self.source != self.target


@dataclass(frozen=True)
class InputPlan:
    """How the tiles of one consumer layer get input `index` from its producer."""

    index: int
    producer: str
    needed: dict[int, Box]  # consumer device -> box it needs (only non-empty boxes)
    pieces: tuple[Piece, ...]

    def sends_from(self, device: int) -> list[Piece]:
        return [p for p in self.pieces if p.source == device and p.remote]

    def received_by(self, device: int) -> list[Piece]:
        """Pieces the device's needed box is made of, local copies included."""
        return [p for p in self.pieces if p.target == device]

    @property
    def remote_elements(self) -> int:
        return sum(box_volume(p.box) for p in self.pieces if p.remote)


@dataclass(frozen=True)
class LayerPlan:
    """A layer under its config: tiles, inputs and the groups its devices form."""

    layer: Layer
    config: ParallelConfig
    tiles: dict[int, Tile]  # device -> tile
    inputs: tuple[InputPlan, ...]

    def replica_group(self, device: int) -> tuple[int, ...]:
        """Devices holding tiles with the same channel range as `device`'s tile.

        They hold the same weight shard (replicated by the n/h/w splits) and the same channels
        of any BatchNorm, so gradients and batch statistics are reduced among them.
        """
        channel = self.tiles[device].index[1]
        return tuple(sorted(t.device for t in self.tiles.values() if t.index[1] == channel))

    def channel_group(self, device: int) -> tuple[int, ...]:
        """Devices holding the other channel shards of `device`'s samples and positions."""
        index = self.tiles[device].index
        return tuple(sorted(
            t.device for t in self.tiles.values()
            if (t.index[0], *t.index[2:]) == (index[0], *index[2:])
        ))

    def plane_group(self, device: int) -> tuple[int, ...]:
        """Devices holding the other spatial tiles of `device`'s samples and channels: those an
        InstanceNorm's or GroupNorm's statistics are summed over."""
        index = self.tiles[device].index
        return tuple(sorted(t.device for t in self.tiles.values()
                            if t.index[:2] == index[:2]))

    @property
    def devices(self) -> tuple[int, ...]:
        """Every device holding a tile: the group a tensor held whole by every channel tile
        (`Layer.shared_param_count`) sums its gradient over."""
        return tuple(sorted(self.tiles))

    def plane_groups(self) -> list[tuple[int, ...]]:
        return sorted({self.plane_group(device) for device in self.tiles})

    def replica_groups(self) -> list[tuple[int, ...]]:
        return sorted({self.replica_group(device) for device in self.tiles})

    def channel_groups(self) -> list[tuple[int, ...]]:
        return sorted({self.channel_group(device) for device in self.tiles})


def plan_layer(layer: Layer, config: ParallelConfig, producers: dict[str, LayerPlan]) -> LayerPlan:
    tiles = {
        device: Tile(device=device, index=index, box=indexed_box(layer, index, config.degrees))
        for index, device in config.tiles()
    }
    inputs = []
    for index, producer_name in enumerate(layer.inputs):
        producer = producers[producer_name]
        needed: dict[int, Box] = {}
        pieces: list[Piece] = []
        for device, tile in tiles.items():
            box = needed_box(layer, index, tile.box)
            if is_empty(box):
                continue
            needed[device] = box
            for source in producer.tiles.values():
                common = intersect(box, source.box)
                if common is not None:
                    pieces.append(Piece(source=source.device, target=device, box=common))
        inputs.append(InputPlan(index=index, producer=producer_name, needed=needed,
                                pieces=tuple(pieces)))
    return LayerPlan(layer=layer, config=config, tiles=tiles, inputs=tuple(inputs))


@dataclass(frozen=True)
class StrategyPlan:
    """The plan of every layer of a graph under one assignment, on `world` devices."""

    graph: LayerGraph
    layers: tuple[LayerPlan, ...]
    world: int
    recompute: frozenset[str] = frozenset()  # layers whose forward the backward runs again

    @cached_property
    def by_name(self) -> dict[str, LayerPlan]:
        return {plan.layer.name: plan for plan in self.layers}

    @cached_property
    def output(self) -> LayerPlan:
        return self.by_name[self.graph.outputs[0]]

    def groups(self) -> list[tuple[int, ...]]:
        """Every device group that runs a collective, in one order all ranks share."""
        found: set[tuple[int, ...]] = set()
        for plan in self.layers:
            found.update(group for group in plan.replica_groups() if len(group) > 1)
            if plan.layer.plane_norms:  # their statistics are summed over each plane
                found.update(group for group in plan.plane_groups() if len(group) > 1)
            if plan.layer.shared_param_count and len(plan.devices) > 1:
                found.add(plan.devices)
        found.update(group for group in self.output.channel_groups() if len(group) > 1)
        return sorted(found, key=lambda group: (len(group), group))


def build_plan(graph: LayerGraph, assignment: dict[str, ParallelConfig], world: int,
               recompute: Collection[str] = ()) -> StrategyPlan:
    """Check the assignment (and the layers to recompute) against the graph and plan every
    layer (raises ConfigError)."""
    missing = [layer.name for layer in graph.layers if layer.name not in assignment]
    if missing:
        raise ConfigError(f"no config for layer(s) {', '.join(missing[:5])}")
    if len(graph.outputs) != 1:
        raise ConfigError(
            f"model '{graph.model}' has {len(graph.outputs)} outputs; layerwise trains models "
            "with one output of class scores (build auxiliary heads off, e.g. aux_logits=False)"
        )
    output = graph.by_name[graph.outputs[0]]
    if len(output.output_shape) < 2 or output.output_shape[0] != graph.batch:
        raise ConfigError(
            f"model '{graph.model}' outputs shape {output.output_shape}; layerwise trains with "
            "cross-entropy on (batch, classes) scores, or (batch, classes, *positions) for a "
            "score per position"
        )
    plans: dict[str, LayerPlan] = {}
    for layer in graph.layers:
        config = assignment[layer.name]
        check_config(layer, config, world)
        plans[layer.name] = plan_layer(layer, config, plans)
    check_recompute(graph, recompute)
    return StrategyPlan(graph=graph, layers=tuple(plans.values()), world=world,
                        recompute=frozenset(recompute))
