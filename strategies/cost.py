"""The cost model of Jia et al. 2018, Eq. 1: t_o = sum of (t_c + t_s) over layers + sum of t_x
over edges, a plain sum with no overlap. Times and exact integer bytes are kept apart.

- t_c(l, c): forward + backward time of the layer's largest tile (devices run their tiles at
  once), from a measured `Profile` or from a roofline on the cluster's device (`--analytic`).
- t_x(e, c_i, c_j): every consumer tile needs a box of its input (tiles.py); the parts of that
  box held by producer tiles on OTHER devices move. Bytes are counted exactly, forward
  (activations) and backward (their gradients, the same regions the other way; the network
  input has no gradient, so its edges move forward only). Devices
  receive at once, each over the slowest link between it and the devices it receives from,
  paying the link latency per message; t_x is the slowest device, forward plus backward.
- t_s(l, c): gradients of weights replicated by n/h/w splits are reduced within each replica
  group (the tiles that share a channel index): ring all-reduce (alpha-beta; 2(r-1) chunks of
  1/r of the shard per device) or the paper's parameter-server round trip, as the cluster says.
  A channel split shards the weights, which then need no sync. A BatchNorm under an n/h/w
  split also reduces its batch statistics in the group (SyncBatchNorm semantics, so the result
  does not depend on the split): an all-reduce of twice the group's channels each way per
  step, which the paper's model leaves out and the runtime's byte count includes.

Why our own code: the box overlaps factor per dimension (along each dim the needed range of a
tile depends only on its index along that dim), so the whole C_i x C_j matrix of an edge is a
few numpy gathers and products; no library computes this.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

from strategies.cluster import Cluster, Link
from strategies.errors import ConfigError
from strategies.graph import BYTES_PER_ELEMENT, Layer, LayerGraph
from strategies.space import ParallelConfig, check_config, enumerate_configs
from strategies.tiles import TileWork, as_4d, largest_tile, needed_range, output_ranges

if TYPE_CHECKING:
    from strategies.profile import Profile

Placement = Literal["origin", "aligned"]

# Cap on elements of one (producer configs x consumer configs x devices) work array.
_CHUNK_ELEMENTS = 4_000_000


class Breakdown(BaseModel):
    """Predicted cost of one training step under a strategy."""

    model_config = ConfigDict(frozen=True)

    step_seconds: float
    compute_seconds: float
    transfer_seconds: float
    sync_seconds: float
    transfer_bytes: int
    sync_bytes: int


class ComputeSource(Protocol):
    """Where t_c comes from: a measured profile or the analytic roofline."""

    name: str

    def tile_seconds(self, layer: Layer, tile: TileWork) -> float: ...


class AnalyticCompute:
    """Roofline t_c on the cluster's device: max(FLOPs / (peak * efficiency), bytes / memory BW).

    Backward costs about twice the forward for layers with weights (input and weight
    gradients) and about the forward for the others; every tensor is read or written once
    per pass.
    """

    name = "analytic"

    def __init__(self, cluster: Cluster) -> None:
        self.flops_per_second = cluster.device.peak_flops_fp32 * cluster.compute_efficiency
        self.bytes_per_second = cluster.device.memory_bandwidth

    def tile_seconds(self, layer: Layer, tile: TileWork) -> float:
        if layer.kind == "input":
            return 0.0
        out_elements = _volume(tile.output_shape)
        fraction = out_elements / _volume(layer.output_shape)
        passes = 3.0 if layer.param_count else 2.0
        flops = layer.flops * fraction * passes
        elements = out_elements + sum(_volume(s) for s in tile.input_shapes) + tile.param_elements
        memory = elements * BYTES_PER_ELEMENT * passes
        return max(flops / self.flops_per_second, memory / self.bytes_per_second)


class ProfiledCompute:
    """t_c measured by `layerwise profile`: the median forward + backward time of the tile."""

    name = "profile"

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    def tile_seconds(self, layer: Layer, tile: TileWork) -> float:
        if layer.kind == "input":
            return 0.0
        return self.profile.tile_seconds(layer.name, tile.key)


def _volume(shape: Sequence[int]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def configs_for(layer: Layer, devices: int, placement: Placement) -> list[ParallelConfig]:
    """The search space of one layer: every config, or only those starting at device 0."""
    configs = enumerate_configs(layer, devices)
    if placement == "origin":
        return [config for config in configs if config.devices[0] == 0]
    return configs


class _ConfigTable:
    """Per-config arrays of one layer: degree exponents, tile index per device, links."""

    def __init__(self, configs: Sequence[ParallelConfig], devices: int) -> None:
        count = len(configs)
        self.exponents = np.zeros((count, 4), dtype=np.int64)
        # tile index along each dim of the tile held by each device; -1 where none
        self.tile_of = np.full((count, devices, 4), -1, dtype=np.int64)
        for row, config in enumerate(configs):
            self.exponents[row] = [degree.bit_length() - 1 for degree in config.degrees]
            for index, device in config.tiles():
                self.tile_of[row, device] = index
        self.blocks = [config.devices for config in configs]


class CostModel:
    """Eq. 1 for one graph on `devices` devices of `cluster`, with t_c from `compute`."""

    def __init__(self, graph: LayerGraph, cluster: Cluster, devices: int,
                 compute: ComputeSource, placement: Placement = "origin") -> None:
        if devices < 1:
            raise ConfigError(f"the number of devices must be >= 1 (got {devices})")
        if devices > cluster.num_devices:
            raise ConfigError(
                f"cluster '{cluster.name}' has {cluster.num_devices} devices, fewer than the "
                f"{devices} asked for; use --devices {cluster.num_devices} or a larger cluster"
            )
        self.graph = graph
        self.cluster = cluster
        self.devices = devices
        self.compute = compute
        self.placement = placement
        self._link_cache: dict[tuple[tuple[int, ...], int], Link | None] = {}
        self._tile_cache: dict[tuple[str, tuple[int, ...]], TileWork] = {}
        self._tables: dict[str, tuple[_ConfigTable, np.ndarray, np.ndarray]] = {}
        self._edge_cache: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._node_cache: dict[tuple[object, ...], np.ndarray] = {}

    # ---- the search space --------------------------------------------------------------

    @cached_property
    def configs(self) -> dict[str, list[ParallelConfig]]:
        return {
            layer.name: configs_for(layer, self.devices, self.placement)
            for layer in self.graph.layers
        }

    # ---- t_c and t_s per layer ---------------------------------------------------------

    def tile(self, layer: Layer, config: ParallelConfig) -> TileWork:
        key = (layer.name, config.degrees)
        if key not in self._tile_cache:
            self._tile_cache[key] = largest_tile(layer, config)
        return self._tile_cache[key]

    def compute_seconds(self, layer: Layer, configs: Sequence[ParallelConfig]) -> np.ndarray:
        return np.array([self.compute.tile_seconds(layer, self.tile(layer, c)) for c in configs])

    def sync(self, layer: Layer,
             configs: Sequence[ParallelConfig]) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, bytes) of gradient and batch-statistics synchronisation for each config."""
        seconds = np.zeros(len(configs))
        total_bytes = np.zeros(len(configs), dtype=np.int64)
        norms = _batch_norms(layer)
        if not layer.param_count and not norms:
            return seconds, total_bytes
        out_channels = as_4d(layer.output_shape)[1]
        # SyncBatchNorm: per BatchNorm, one all-reduce of 2 C_shard values forward (sums of
        # the tiles' means and second moments) and one backward (sums of dy and dy * x_hat)
        statistics = 4 * norms
        for row, config in enumerate(configs):
            replicas = config.size // config.c
            if replicas == 1:
                continue
            # every device of a ring sends 2(r-1) chunks of 1/r of its shard; the shards of
            # all groups add up to the layer's weights; the parameter server moves as much
            reduced = layer.param_count + statistics * out_channels
            total_bytes[row] = 2 * (replicas - 1) * reduced * BYTES_PER_ELEMENT
            worst = 0.0
            for c_index, (c_start, c_stop) in enumerate(output_ranges(layer, 1, config.c)):
                shard = layer.param_count * (c_stop - c_start) // out_channels
                group = [device for index, device in config.tiles() if index[1] == c_index]
                link = self.cluster.slowest_link(group)
                assert link is not None  # a group of r > 1 devices has a slowest link
                group_seconds = 2 * norms * self._sync_seconds(2 * (c_stop - c_start),
                                                               replicas, link)
                if shard:
                    group_seconds += self._sync_seconds(shard, replicas, link)
                worst = max(worst, group_seconds)
            seconds[row] = worst
        return seconds, total_bytes

    def _sync_seconds(self, shard_elements: int, replicas: int, link: Link) -> float:
        shard_bytes = shard_elements * BYTES_PER_ELEMENT
        if self.cluster.sync == "ring":
            chunk = -(-shard_bytes // replicas)
            return 2 * (replicas - 1) * (link.latency + chunk / link.bandwidth)
        # parameter server: the server takes r-1 gradients in and sends r-1 updates out
        return 2 * (replicas - 1) * (link.latency + shard_bytes / link.bandwidth)

    def node_seconds(self, layer: Layer) -> np.ndarray:
        """t_c + t_s of every config in the layer's search space (equal layers computed once)."""
        key = (_layer_key(layer), self.compute.name == "analytic" or layer.name)
        if key not in self._node_cache:
            configs = self.configs[layer.name]
            self._node_cache[key] = (self.compute_seconds(layer, configs)
                                     + self.sync(layer, configs)[0])
        return self._node_cache[key]

    # ---- t_x per edge ------------------------------------------------------------------

    def _link(self, block: tuple[int, ...], device: int) -> Link | None:
        """Slowest link between `device` and the other devices of `block`."""
        key = (block, device)
        if key not in self._link_cache:
            others = set(block) | {device}
            self._link_cache[key] = self.cluster.slowest_link(others) if len(others) > 1 else None
        return self._link_cache[key]

    def _link_arrays(self, blocks: Sequence[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """Seconds per byte and latency from each config's block to each device."""
        per_byte = np.zeros((len(blocks), self.devices))
        latency = np.zeros((len(blocks), self.devices))
        for row, block in enumerate(blocks):
            for device in range(self.devices):
                link = self._link(block, device)
                if link is not None:
                    per_byte[row, device] = 1.0 / link.bandwidth
                    latency[row, device] = link.latency
        return per_byte, latency

    def _table(self, layer: Layer, configs: Sequence[ParallelConfig] | None,
               ) -> tuple[_ConfigTable, np.ndarray, np.ndarray]:
        """Config table and link arrays of a layer's search space (cached) or of `configs`."""
        if configs is not None:
            table = _ConfigTable(configs, self.devices)
            return (table, *self._link_arrays(table.blocks))
        if layer.name not in self._tables:
            table = _ConfigTable(self.configs[layer.name], self.devices)
            self._tables[layer.name] = (table, *self._link_arrays(table.blocks))
        return self._tables[layer.name]

    def edge(self, producer: Layer, consumer: Layer,
             producer_configs: Sequence[ParallelConfig] | None = None,
             consumer_configs: Sequence[ParallelConfig] | None = None,
             ) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, bytes) of t_x for every pair of producer and consumer configs.

        Edges of the search space between layers of equal shapes and geometry (repeated
        blocks) have equal matrices and are computed once.
        """
        input_index = consumer.inputs.index(producer.name)
        if producer_configs is None and consumer_configs is None:
            key = _edge_key(producer, consumer, input_index)
            if key not in self._edge_cache:
                self._edge_cache[key] = self._edge(producer, consumer, input_index, None, None)
            return self._edge_cache[key]
        return self._edge(producer, consumer, input_index, producer_configs, consumer_configs)

    def _edge(self, producer: Layer, consumer: Layer, input_index: int,
              producer_configs: Sequence[ParallelConfig] | None,
              consumer_configs: Sequence[ParallelConfig] | None,
              ) -> tuple[np.ndarray, np.ndarray]:
        pconfs = producer_configs or self.configs[producer.name]
        qconfs = consumer_configs or self.configs[consumer.name]
        tables = _EdgeTables(producer, consumer, input_index, self.devices)
        ptab, p_per_byte, p_latency = self._table(producer, producer_configs)
        qtab, q_per_byte, q_latency = self._table(consumer, consumer_configs)
        need = tables.need(qtab)  # (Q, D) needed elements of each consumer tile
        passes = 1 if producer.kind == "input" else 2  # forward, and backward unless input
        seconds = np.zeros((len(pconfs), len(qconfs)))
        elements = np.zeros((len(pconfs), len(qconfs)), dtype=np.int64)
        rows = max(1, _CHUNK_ELEMENTS // max(1, len(qconfs) * self.devices))
        for start in range(0, len(pconfs), rows):
            part = slice(start, start + rows)
            same, received_from, rows_sum, sent_to = tables.pair_terms(ptab, qtab, part)
            forward_remote = need[None, :, :] - same
            backward_remote = rows_sum - same
            forward = (forward_remote * BYTES_PER_ELEMENT * p_per_byte[part, None, :]
                       + received_from * p_latency[part, None, :]).max(axis=2)
            backward = (backward_remote * BYTES_PER_ELEMENT * q_per_byte[None, :, :]
                        + sent_to * q_latency[None, :, :]).max(axis=2)
            if producer.kind == "input":  # the network input needs no gradient
                backward = np.zeros_like(backward)
            seconds[part] = forward + backward
            elements[part] = passes * forward_remote.sum(axis=2)
        return seconds, elements * BYTES_PER_ELEMENT

    # ---- a whole strategy --------------------------------------------------------------

    def evaluate(self, assignment: dict[str, ParallelConfig]) -> Breakdown:
        """Eq. 1 for one config per layer (configs outside the search space are fine)."""
        compute = sync = transfer = 0.0
        sync_bytes = transfer_bytes = 0
        missing = [layer.name for layer in self.graph.layers if layer.name not in assignment]
        if missing:
            raise ConfigError(f"no config for layer(s) {', '.join(missing[:5])}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
        for layer in self.graph.layers:
            config = assignment[layer.name]
            check_config(layer, config, self.devices)
            compute += float(self.compute_seconds(layer, [config])[0])
            seconds, moved = self.sync(layer, [config])
            sync += float(seconds[0])
            sync_bytes += int(moved[0])
        for producer_name, consumer_name in self.graph.edges:
            producer = self.graph.by_name[producer_name]
            consumer = self.graph.by_name[consumer_name]
            seconds, moved = self.edge(producer, consumer, [assignment[producer_name]],
                                       [assignment[consumer_name]])
            transfer += float(seconds[0, 0])
            transfer_bytes += int(moved[0, 0])
        return Breakdown(
            step_seconds=compute + sync + transfer, compute_seconds=compute,
            transfer_seconds=transfer, sync_seconds=sync, transfer_bytes=transfer_bytes,
            sync_bytes=sync_bytes,
        )


def _batch_norms(layer: Layer) -> int:
    """BatchNorms a layer runs (fused into it, or the layer itself)."""
    ops = [layer.op, *(fused.op for fused in layer.fused)]
    return sum(op.startswith("BatchNorm") for op in ops)


def _layer_key(layer: Layer) -> tuple[object, ...]:
    """What a layer's search space and analytic costs depend on (not its name)."""
    return (layer.kind, layer.label, layer.output_shape, layer.input_shapes, layer.geometry,
            layer.concat_dim, layer.flops, layer.param_count)


def _edge_key(producer: Layer, consumer: Layer, input_index: int) -> tuple[object, ...]:
    """What an edge's search-space matrices depend on: shapes, kinds and geometry."""
    return (producer.kind, producer.output_shape, _layer_key(consumer), input_index)


class _EdgeTables:
    """Per-dimension overlap tables of one edge for every pair of power-of-two degrees.

    overlap[d][a, b, i, j] = elements along dim d shared by producer tile i (of 2^a) and the
    range consumer tile j (of 2^b) needs; the last slot of i and j is all zeros so that a
    tile index of -1 (no tile on that device) reads zero.
    """

    def __init__(self, producer: Layer, consumer: Layer, input_index: int, devices: int) -> None:
        levels = devices.bit_length()
        width = (1 << (levels - 1)) + 1
        shape = (levels, levels, width, width)
        self.overlap = np.zeros((4, *shape), dtype=np.int64)
        self.need_len = np.zeros((4, levels, width), dtype=np.int64)
        for dim in range(4):
            producer_ranges = [
                np.array(output_ranges(producer, dim, 1 << a)).T for a in range(levels)
            ]
            for b in range(levels):
                starts, stops = np.array([
                    needed_range(consumer, input_index, dim, out)
                    for out in output_ranges(consumer, dim, 1 << b)
                ]).T
                self.need_len[dim, b, : 1 << b] = np.maximum(stops - starts, 0)
                for a, (p_starts, p_stops) in enumerate(producer_ranges):
                    shared = (np.minimum(p_stops[:, None], stops[None, :])
                              - np.maximum(p_starts[:, None], starts[None, :]))
                    self.overlap[dim, a, b, : 1 << a, : 1 << b] = np.maximum(shared, 0)
        touching = self.overlap > 0
        self.producers_touching = touching.sum(axis=3)  # (4, a, b, j): producer tiles per j
        self.consumers_touching = touching.sum(axis=4)  # (4, a, b, i): consumer tiles per i
        self.row_sum = self.overlap.sum(axis=4)  # (4, a, b, i): elements of i needed, total

    def need(self, qtab: _ConfigTable) -> np.ndarray:
        product = np.ones(qtab.tile_of.shape[:2], dtype=np.int64)
        for dim in range(4):
            product *= self.need_len[dim, qtab.exponents[:, dim, None], qtab.tile_of[:, :, dim]]
        return product

    def pair_terms(self, ptab: _ConfigTable, qtab: _ConfigTable, part: slice,
                   ) -> tuple[np.ndarray, ...]:
        """For producer configs `part` x all consumer configs x devices: elements a device
        already holds, producer tiles a consumer tile receives from, elements of a producer
        tile needed by all consumers, and consumer tiles a producer tile sends to.

        Each table is read through flat offsets: a producer part (its degree exponent and
        tile index) plus a consumer part, one add and one `take` per dimension.
        """
        levels, width = self.overlap.shape[1], self.overlap.shape[3]
        a = ptab.exponents[part, None, :]  # (P, 1, 4)
        b = qtab.exponents[:, None, :]  # (Q, 1, 4)
        i = ptab.tile_of[part]  # (P, D, 4); -1 reads the zero slot
        j = qtab.tile_of  # (Q, D, 4)
        i = np.where(i < 0, width - 1, i)
        j = np.where(j < 0, width - 1, j)
        shape = (i.shape[0], j.shape[0], i.shape[1])
        same = np.ones(shape, dtype=np.int64)
        received_from = np.ones(shape, dtype=np.int64)
        row_sum = np.ones(shape, dtype=np.int64)
        sent_to = np.ones(shape, dtype=np.int64)
        for dim in range(4):
            producer_ab = (a[..., dim] * levels)[:, None, :]  # (P, 1, 1)
            consumer_b = b[..., dim][None, :, :]  # (1, Q, 1)
            ab = producer_ab + consumer_b  # (P, Q, 1): index of (a, b)
            pair = ab * width * width + (i[:, None, :, dim] * width + j[None, :, :, dim])
            same *= self.overlap[dim].ravel().take(pair)
            by_consumer = ab * width + j[None, :, :, dim]
            received_from *= self.producers_touching[dim].ravel().take(by_consumer)
            by_producer = ab * width + i[:, None, :, dim]
            row_sum *= self.row_sum[dim].ravel().take(by_producer)
            sent_to *= self.consumers_touching[dim].ravel().take(by_producer)
        held = same > 0
        consumer_present = (qtab.tile_of[None, :, :, 0] >= 0)
        producer_present = (ptab.tile_of[part, None, :, 0] >= 0)
        received_from = np.where(consumer_present, received_from - held, 0)
        sent_to = np.where(producer_present, sent_to - held, 0)
        row_sum = np.where(producer_present, row_sum, 0)
        return same, received_from, row_sum, sent_to
