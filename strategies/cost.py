"""The cost model of Jia et al. 2018, Eq. 1: t_o = sum of (t_c + t_s) over layers + sum of t_x
over edges, a plain sum with no overlap. Times and exact integer bytes are kept apart.

- t_c(l, c): the compute one training step spends on the layer's largest tile (devices run
  their tiles at once): its forward + backward and the SGD update of its weight shard (the
  paper's t_c leaves the update out; ParaDL counts it as WU_l, and a data-parallel device
  updates every weight: ~30% of AlexNet's step on a CPU). Both from a measured `Profile` or
  from a roofline on the cluster's device (`--analytic`; the update memory-bound).
- t_x(e, c_i, c_j): every consumer tile needs a box of its input (tiles.py); the parts of that
  box held by producer tiles on OTHER devices move. Bytes are counted exactly, forward
  (activations) and backward (their gradients, the same regions the other way; the network
  input has no gradient, so its edges move forward only). Devices
  receive at once, each over the slowest link between it and the devices it receives from,
  paying the link latency per message; t_x is the slowest device, forward plus backward.
- t_s(l, c): gradients of weights replicated by n/h/w splits are reduced within each replica
  group (the tiles that share a channel index): ring all-reduce (alpha-beta; 2(r-1) chunks of
  1/r of the shard per device) or the paper's parameter-server round trip, as the cluster says.
  With `sync: bucketed` (the runtime's pattern: a group's gradients all-reduced in buckets of
  GRADIENT_BUCKET_BYTES) a layer's t_s carries the ring latencies in proportion to its share of
  a bucket, so that t_s stays a sum over layers for the search; `evaluate` adds what that leaves
  out, the rest of each group's last bucket's latency (ceil(G/B) buckets for G bytes).
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
from functools import cache, cached_property
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from strategies.breakdown import Breakdown
from strategies.cluster import GRADIENT_BUCKET_BYTES, Cluster, Link
from strategies.errors import ConfigError
from strategies.graph import BYTES_PER_ELEMENT, Layer, LayerGraph
from strategies.space import (
    ParallelConfig,
    check_config,
    degree_choices,
    dim_sizes,
    enumerate_configs,
    parallel_dims,
    placements,
    tile_range,
)
from strategies.tiles import TileWork, as_4d, needed_range, output_ranges

if TYPE_CHECKING:
    from strategies.profile import Profile

Placement = Literal["origin", "aligned"]
# along one dim: the largest tile's output range and the needed length of each input
_TileDim = tuple[tuple[int, int], tuple[int, ...]]

# Cap on elements of one (producer configs x devices x consumer configs) work array; small
# enough that the passes over it stay in cache.
_CHUNK_ELEMENTS = 1 << 17
_INT32_LIMIT = 2**31


class ComputeSource(Protocol):
    """Where t_c comes from: a measured profile or the analytic roofline."""

    name: str

    def tile_seconds(self, layer: Layer, tile: TileWork) -> float:
        """Forward + backward of the tile."""
        ...

    def update_seconds(self, layer: Layer, tile: TileWork) -> float:
        """The SGD update of the tile's weight shard (0 without weights)."""
        ...


# A memory-bound SGD-with-momentum update reads weight, gradient and momentum and writes weight
# and momentum (weight decay reuses the weight it reads).
WEIGHT_UPDATE_ACCESSES = 5


def weight_update_seconds(weights: int | np.ndarray, memory_bandwidth: float,
                          ) -> float | np.ndarray:
    """The update of `weights` elements on the roofline: memory-bound,
    WEIGHT_UPDATE_ACCESSES * 4 bytes per weight / memory bandwidth (ParaDL's WU_l)."""
    return WEIGHT_UPDATE_ACCESSES * BYTES_PER_ELEMENT * weights / memory_bandwidth


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
        return float(self.volume_seconds(
            layer, np.int64(_volume(tile.output_shape)),
            np.int64(sum(_volume(s) for s in tile.input_shapes)),
            np.int64(tile.param_elements)))

    def update_seconds(self, layer: Layer, tile: TileWork) -> float:
        return float(weight_update_seconds(tile.param_elements, self.bytes_per_second))

    def volume_seconds(self, layer: Layer, out_elements: np.ndarray, input_elements: np.ndarray,
                       param_elements: np.ndarray) -> np.ndarray:
        """The roofline from element counts alone (arrays: one entry per tile)."""
        if layer.kind == "input":
            return np.zeros(np.shape(out_elements))
        fraction = out_elements / _volume(layer.output_shape)
        passes = 3.0 if layer.param_count else 2.0
        flops = layer.flops * fraction * passes
        memory = (out_elements + input_elements + param_elements) * BYTES_PER_ELEMENT * passes
        return np.maximum(flops / self.flops_per_second, memory / self.bytes_per_second)


class ProfiledCompute:
    """t_c measured by `layerwise profile`: the tile's median forward + backward time and
    median weight update."""

    name = "profile"

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    def tile_seconds(self, layer: Layer, tile: TileWork) -> float:
        if layer.kind == "input":
            return 0.0
        return self.profile.tile_seconds(layer.name, tile.key)

    def update_seconds(self, layer: Layer, tile: TileWork) -> float:
        if layer.kind == "input":
            return 0.0
        return self.profile.tile_update_seconds(layer.name, tile.key)


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


@cache
def _tile_indices(degrees: tuple[int, int, int, int]) -> np.ndarray:
    """(size, 4) tile index along (n, c, h, w) of each tile, in `ParallelConfig.tiles` order."""
    size = degrees[0] * degrees[1] * degrees[2] * degrees[3]
    return np.stack(np.unravel_index(np.arange(size), degrees), axis=1).astype(np.int64)


# Dimensions whose per-dim tables are multiplied into one table: (n, c) and (h, w).
_GROUPS = ((0, 1), (2, 3))


class _ConfigTable:
    """Per-config arrays of one layer: degree exponents, tile index per device, links.

    For each group of two dims it also numbers the distinct (exponent, tile index) states a
    device can be in (`state`, (C, D)) and the distinct exponent pairs (`pair`, (C,)), so that
    an edge's per-dim tables can be multiplied into one small table per group.
    """

    def __init__(self, configs: Sequence[ParallelConfig], devices: int) -> None:
        count = len(configs)
        self.exponents = np.zeros((count, 4), dtype=np.int64)
        # tile index along each dim of the tile held by each device; -1 where none
        self.tile_of = np.full((count, devices, 4), -1, dtype=np.int64)
        for row, config in enumerate(configs):
            self.exponents[row] = [degree.bit_length() - 1 for degree in config.degrees]
            self.tile_of[row, list(config.devices)] = _tile_indices(config.degrees)
        self.blocks = [config.devices for config in configs]
        # one past the highest device of each config: devices beyond hold no tile
        self.extent = np.array([max(block) + 1 for block in self.blocks], dtype=np.int64)
        levels = devices.bit_length()
        width = (1 << (levels - 1)) + 1
        tile = np.where(self.tile_of < 0, width - 1, self.tile_of)  # -1 reads the zero slot
        # per group: (state (C, D), state exponents (2, S), state tiles (2, S),
        #             pair (C,), pair exponents (2, A))
        self.groups: list[tuple[np.ndarray, ...]] = []
        for d0, d1 in _GROUPS:
            e0, e1 = self.exponents[:, None, d0], self.exponents[:, None, d1]
            key = ((e0 * width + tile[..., d0]) * levels + e1) * width + tile[..., d1]
            unique, state = np.unique(key, return_inverse=True)
            i1, rest = unique % width, unique // width
            s1, rest = rest % levels, rest // levels
            i0, s0 = rest % width, rest // width
            pair_key = self.exponents[:, d0] * levels + self.exponents[:, d1]
            pairs, pair = np.unique(pair_key, return_inverse=True)
            self.groups.append((state.reshape(count, devices), np.stack([s0, s1]),
                                np.stack([i0, i1]), pair.reshape(count),
                                np.stack([pairs // levels, pairs % levels])))


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
        self._link_cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._group_link_cache: dict[tuple[object, ...], list[Link]] = {}
        self._tile_cache: dict[tuple[str, tuple[int, ...]], TileWork] = {}
        self._tile_dim_cache: dict[tuple[str, int, int], _TileDim] = {}
        self._config_cache: dict[tuple[object, ...], list[ParallelConfig]] = {}
        self._tables: dict[tuple[object, ...], tuple[_ConfigTable, np.ndarray, np.ndarray]] = {}
        self._edge_cache: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._levels = devices.bit_length()  # power-of-two degrees 2^0 .. 2^(levels-1)
        self._needed_cache: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._dim_tables: dict[tuple[int, bytes, bytes], tuple[int, _DimTable]] = {}
        self._space_ids: dict[tuple[object, ...], int] = {}
        self._space_contents: dict[tuple[object, ...], int] = {}
        self._node_cache: dict[tuple[object, ...], np.ndarray] = {}

    # ---- the search space --------------------------------------------------------------

    @cached_property
    def configs(self) -> dict[str, list[ParallelConfig]]:
        return {layer.name: self._configs_for(layer) for layer in self.graph.layers}

    def _configs_for(self, layer: Layer) -> list[ParallelConfig]:
        """`configs_for`, enumerated once per distinct set of dim sizes and split dims."""
        key = _space_key(layer)
        if key not in self._config_cache:
            # as `configs_for`, built without re-validating configs legal by construction
            self._config_cache[key] = [
                ParallelConfig.model_construct(n=n, c=c, h=h, w=w, devices=block)
                for n, c, h, w in degree_choices(layer, self.devices)
                for block in placements(n * c * h * w, self.devices)
                if self.placement == "aligned" or block[0] == 0
            ]
        return list(self._config_cache[key])

    # ---- t_c and t_s per layer ---------------------------------------------------------

    def tile(self, layer: Layer, config: ParallelConfig) -> TileWork:
        """`tiles.largest_tile(layer, config)`, from per-dimension parts computed once."""
        key = (layer.name, config.degrees)
        if key not in self._tile_cache:
            parts = [self._tile_dim(layer, dim, degree)
                     for dim, degree in enumerate(config.degrees)]
            rank = len(layer.output_shape)
            output_shape = tuple(stop - start for (start, stop), _ in parts)[:rank]
            input_shapes = tuple(
                tuple(part[1][index] for part in parts)[: len(shape)]
                for index, shape in enumerate(layer.input_shapes)
            )
            c_start, c_stop = parts[1][0]
            param_elements = layer.param_count * (c_stop - c_start) // as_4d(layer.output_shape)[1]
            self._tile_cache[key] = TileWork.model_construct(
                output_shape=output_shape, input_shapes=input_shapes,
                param_elements=param_elements)
        return self._tile_cache[key]

    def _tile_dim(self, layer: Layer, dim: int, degree: int) -> _TileDim:
        """Along `dim`: the largest tile's output range (the first such) and the length of
        the range it needs of each input (as `tiles.largest_tile`)."""
        key = (layer.name, dim, degree)
        if key not in self._tile_dim_cache:
            ranges = output_ranges(layer, dim, degree)
            largest = max(ranges, key=lambda r: r[1] - r[0])
            lengths = []
            for index in range(len(layer.input_shapes)):
                start, stop = needed_range(layer, index, dim, largest)
                lengths.append(max(stop - start, 0))
            self._tile_dim_cache[key] = (largest, tuple(lengths))
        return self._tile_dim_cache[key]

    def compute_seconds(self, layer: Layer, configs: Sequence[ParallelConfig]) -> np.ndarray:
        """t_c of each config: the tile's forward + backward and its weight update."""
        return self.pass_seconds(layer, configs) + self.update_seconds(layer, configs)

    def pass_seconds(self, layer: Layer, configs: Sequence[ParallelConfig]) -> np.ndarray:
        """Forward + backward of each config's largest tile. The roofline needs only its
        element counts, which are products of per-dimension lengths: vectorised over configs."""
        if isinstance(self.compute, AnalyticCompute):
            return self.compute.volume_seconds(layer, *self._tile_volumes(layer, configs))
        return np.array([self.compute.tile_seconds(layer, self.tile(layer, c)) for c in configs])

    def update_seconds(self, layer: Layer, configs: Sequence[ParallelConfig]) -> np.ndarray:
        """The SGD update of each config's largest weight shard (once per step)."""
        if not layer.param_count:
            return np.zeros(len(configs))
        if isinstance(self.compute, AnalyticCompute):
            return np.asarray(weight_update_seconds(self._tile_volumes(layer, configs)[2],
                                                    self.compute.bytes_per_second), dtype=float)
        return np.array([self.compute.update_seconds(layer, self.tile(layer, c))
                         for c in configs])

    def _tile_volumes(self, layer: Layer, configs: Sequence[ParallelConfig],
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Output, summed input and parameter elements of each config's largest tile (as
        `tile`, whose shapes multiply out to these)."""
        exponents = np.array([[degree.bit_length() - 1 for degree in config.degrees]
                              for config in configs], dtype=np.int64).reshape(-1, 4)
        out = np.ones(len(configs), dtype=np.int64)
        inputs = np.ones((len(layer.input_shapes), len(configs)), dtype=np.int64)
        out_lengths = []
        for dim in range(4):
            parts = [self._tile_dim(layer, dim, 1 << level)
                     for level in range(int(exponents[:, dim].max(initial=0)) + 1)]
            out_lengths.append(
                np.array([stop - start for (start, stop), _ in parts])[exponents[:, dim]])
            out *= out_lengths[-1]
            inputs *= np.array([lengths for _, lengths in parts], dtype=np.int64).reshape(
                len(parts), -1).T[:, exponents[:, dim]]
        # a channel split shards the weights
        params = layer.param_count * out_lengths[1] // as_4d(layer.output_shape)[1]
        return out, inputs.sum(axis=0), params

    def sync(self, layer: Layer,
             configs: Sequence[ParallelConfig]) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, bytes) of gradient and batch-statistics synchronisation for each config."""
        seconds = np.zeros(len(configs))
        total_bytes = np.zeros(len(configs), dtype=np.int64)
        norms = _batch_norms(layer)
        if not layer.param_count and not norms:
            return seconds, total_bytes
        out_channels = as_4d(layer.output_shape)[1]
        param_count = layer.param_count
        # SyncBatchNorm: per BatchNorm, one all-reduce of 2 C_shard values forward (sums of
        # the tiles' means and second moments) and one backward (sums of dy and dy * x_hat)
        statistics = 4 * norms
        for row, config in enumerate(configs):
            replicas = config.size // config.c
            if replicas == 1:
                continue
            # every device of a ring sends 2(r-1) chunks of 1/r of its shard; the shards of
            # all groups add up to the layer's weights; the parameter server moves as much
            reduced = param_count + statistics * out_channels
            total_bytes[row] = 2 * (replicas - 1) * reduced * BYTES_PER_ELEMENT
            worst = 0.0
            done: set[tuple[int, float, float]] = set()  # equal groups take equal time
            for (c_start, c_stop), link in zip(output_ranges(layer, 1, config.c),
                                               self._group_links(config), strict=True):
                key = (c_stop - c_start, link.latency, link.bandwidth)
                if key in done:
                    continue
                done.add(key)
                shard = param_count * (c_stop - c_start) // out_channels
                group_seconds = 2 * norms * self._sync_seconds(2 * (c_stop - c_start),
                                                               replicas, link)
                if shard:
                    group_seconds += self._sync_seconds(shard, replicas, link, gradients=True)
                worst = max(worst, group_seconds)
            seconds[row] = worst
        return seconds, total_bytes

    def _group_links(self, config: ParallelConfig) -> list[Link]:
        """Slowest link of each replica group (the devices of one channel index)."""
        key = (config.degrees, config.devices)
        if key not in self._group_link_cache:
            n, c, h, w = config.degrees
            devices = np.array(config.devices).reshape(n, c, h * w)
            links = []
            for c_index in range(c):
                link = self.cluster.slowest_link(devices[:, c_index].ravel().tolist())
                assert link is not None  # a group of r > 1 devices has a slowest link
                links.append(link)
            self._group_link_cache[key] = links
        return self._group_link_cache[key]

    def _sync_seconds(self, shard_elements: int, replicas: int, link: Link,
                      gradients: bool = False) -> float:
        """One all-reduce of a shard over its replica group (BatchNorm statistics are always
        an all-reduce of their own; gradients share buckets under `sync: bucketed`)."""
        shard_bytes = shard_elements * BYTES_PER_ELEMENT
        if self.cluster.sync == "parameter_server":
            # the server takes r-1 gradients in and sends r-1 updates out
            return 2 * (replicas - 1) * (link.latency + shard_bytes / link.bandwidth)
        if gradients and self.cluster.sync == "bucketed":
            chunk = -(-shard_bytes // replicas)
            return 2 * (replicas - 1) * (
                link.allreduce_latency * shard_bytes / GRADIENT_BUCKET_BYTES
                + chunk / link.allreduce_bandwidth)
        return link.allreduce_seconds(shard_bytes, replicas)

    def bucket_latency_rest(self, assignment: dict[str, ParallelConfig]) -> float:
        """Under `sync: bucketed`, the latencies a step pays beyond the layers' shares in t_s.

        Each replica group (a set of devices) sums its layers' gradient shards, G bytes, in
        ceil(G/B) bucket all-reduces of 2(r-1) ring steps each; t_s charged G/B of them. A
        device waits for every group it belongs to, one after another: the slowest device's
        sum is the step's. Zero for the other sync modes.
        """
        if self.cluster.sync != "bucketed":
            return 0.0
        group_bytes: dict[tuple[int, ...], int] = {}
        group_latency: dict[tuple[int, ...], float] = {}
        for layer in self.graph.layers:
            config = assignment[layer.name]
            replicas = config.size // config.c
            if replicas == 1 or not layer.param_count:
                continue
            out_channels = as_4d(layer.output_shape)[1]
            devices = np.array(config.devices).reshape(config.n, config.c, config.h * config.w)
            for c_index, ((c_start, c_stop), link) in enumerate(zip(
                    output_ranges(layer, 1, config.c), self._group_links(config), strict=True)):
                group = tuple(sorted(devices[:, c_index].ravel().tolist()))
                shard = layer.param_count * (c_stop - c_start) // out_channels
                group_bytes[group] = group_bytes.get(group, 0) + shard * BYTES_PER_ELEMENT
                group_latency[group] = max(group_latency.get(group, 0.0),
                                           link.allreduce_latency)
        waits = np.zeros(self.devices)
        for group, nbytes in group_bytes.items():
            buckets = nbytes / GRADIENT_BUCKET_BYTES
            rest = -(-nbytes // GRADIENT_BUCKET_BYTES) - buckets
            waits[list(group)] += 2 * (len(group) - 1) * group_latency[group] * rest
        return float(waits.max())

    def node_seconds(self, layer: Layer) -> np.ndarray:
        """t_c + t_s of every config in the layer's search space (equal layers computed once)."""
        key = (_layer_key(layer), self.compute.name == "analytic" or layer.name)
        if key not in self._node_cache:
            configs = self.configs[layer.name]
            self._node_cache[key] = (self.compute_seconds(layer, configs)
                                     + self.sync(layer, configs)[0])
        return self._node_cache[key]

    # ---- t_x per edge ------------------------------------------------------------------

    def _block_links(self, block: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Seconds per byte and latency of the slowest link between each device and the other
        devices of `block` (zero where there is no other device)."""
        if block not in self._link_cache:
            per_byte = np.zeros(self.devices)
            latency = np.zeros(self.devices)
            members = set(block)
            inside = self.cluster.slowest_link(members) if len(members) > 1 else None
            for device in range(self.devices):
                if device in members:
                    link = inside
                else:
                    link = self.cluster.slowest_link(members | {device})
                if link is not None:
                    per_byte[device] = 1.0 / link.bandwidth
                    latency[device] = link.latency
            self._link_cache[block] = (per_byte, latency)
        return self._link_cache[block]

    def _link_arrays(self, blocks: Sequence[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """Seconds per byte and latency from each config's block to each device."""
        rows = [self._block_links(block) for block in blocks]
        return (np.array([per_byte for per_byte, _ in rows]).reshape(len(blocks), self.devices),
                np.array([latency for _, latency in rows]).reshape(len(blocks), self.devices))

    def _table(self, configs: Sequence[ParallelConfig],
               ) -> tuple[_ConfigTable, np.ndarray, np.ndarray]:
        """Config table and link arrays of `configs` (cached: layers share search spaces)."""
        key = tuple((config.degrees, config.devices) for config in configs)
        if key not in self._tables:
            table = _ConfigTable(configs, self.devices)
            self._tables[key] = (table, *self._link_arrays(table.blocks))
        return self._tables[key]

    def edge(self, producer: Layer, consumer: Layer,
             producer_configs: Sequence[ParallelConfig] | None = None,
             consumer_configs: Sequence[ParallelConfig] | None = None,
             ) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, bytes) of t_x for every pair of producer and consumer configs.

        Edges whose four per-dimension tables and two search spaces are equal have equal
        matrices, which are computed once: repeated blocks, and branches that read one
        tensor through layers of the same geometry.
        """
        dim_ids, tables = self._edge_tables(producer, consumer)
        if producer_configs is None and consumer_configs is None:
            key = (dim_ids, self._space_id(producer), self._space_id(consumer),
                   producer.kind != "input")
            if key not in self._edge_cache:
                self._edge_cache[key] = self._edge(producer, tables, None, consumer, None)
            return self._edge_cache[key]
        return self._edge(producer, tables, producer_configs, consumer, consumer_configs)

    def _space_id(self, layer: Layer) -> int:
        """Equal search spaces (as lists of configs) get equal ids."""
        key = _space_key(layer)
        if key not in self._space_ids:
            content = tuple((config.degrees, config.devices) for config in self.configs[layer.name])
            self._space_ids[key] = self._space_contents.setdefault(content,
                                                                   len(self._space_contents))
        return self._space_ids[key]

    def _edge_tables(self, producer: Layer,
                     consumer: Layer) -> tuple[tuple[int, ...], _EdgeTables]:
        """The edge's per-dimension tables and their ids; equal ranges share one table."""
        input_index = consumer.inputs.index(producer.name)
        producer_sizes = as_4d(producer.output_shape)
        ids, dims = [], []
        for dim, size in enumerate(producer_sizes):
            starts, stops = self._needed_ranges(consumer, input_index, dim)
            key = (size, starts.tobytes(), stops.tobytes())
            if key not in self._dim_tables:
                table = _DimTable(size, (starts, stops), self._levels)
                self._dim_tables[key] = (len(self._dim_tables), table)
            ident, table = self._dim_tables[key]
            ids.append(ident)
            dims.append(table)
        return tuple(ids), _EdgeTables(dims)

    def _needed_ranges(self, consumer: Layer, input_index: int,
                       dim: int) -> tuple[np.ndarray, np.ndarray]:
        """(starts, stops) of the input range each consumer tile needs along `dim`, for every
        power-of-two degree in turn (the order of `_DimTable`)."""
        key = (consumer.name, input_index, dim)
        if key not in self._needed_cache:
            ranges = [needed_range(consumer, input_index, dim, out)
                      for level in range(self._levels)
                      for out in output_ranges(consumer, dim, 1 << level)]
            starts, stops = np.array(ranges, dtype=np.int64).reshape(-1, 2).T
            empty = stops <= starts  # needs nothing (concat): one form, so tables are shared
            self._needed_cache[key] = (np.where(empty, 0, starts), np.where(empty, 0, stops))
        return self._needed_cache[key]

    def _edge(self, producer: Layer, tables: _EdgeTables,
              producer_configs: Sequence[ParallelConfig] | None, consumer: Layer,
              consumer_configs: Sequence[ParallelConfig] | None,
              ) -> tuple[np.ndarray, np.ndarray]:
        """Every pair's t_x from per-device terms (see `_pair_block`).

        A device outside both configs' blocks holds and needs nothing, so its terms are zero
        and, all terms being >= 0, leave the max and the sum over devices unchanged. Configs
        are therefore sorted by extent (one past their highest device) and each block of pairs
        only looks at devices below the larger extent of the two.
        """
        pconfs = producer_configs or self.configs[producer.name]
        qconfs = consumer_configs or self.configs[consumer.name]
        ptab, p_per_byte, p_latency = self._table(pconfs)
        qtab, q_per_byte, q_latency = self._table(qconfs)
        terms = tables.terms(ptab, qtab)
        need = tables.need(qtab)  # (Q, D) needed elements of each consumer tile
        # element counts in int32 where no product can reach 2^31 (counts of tiles always)
        bound = max(terms.bound(), int(need.max(initial=0)))
        dtype = np.int32 if bound < _INT32_LIMIT else np.int64
        backward = producer.kind != "input"  # the network input needs no gradient
        p_order = np.argsort(ptab.extent, kind="stable")
        q_order = np.argsort(qtab.extent, kind="stable")
        # producer side as (P, D), consumer side as (D, Q), both in extent order; bytes per
        # element are folded into the seconds per byte (a power of two: exact)
        groups = range(len(_GROUPS))
        producer_side = (
            [state[p_order] for state in terms.p_state],
            [terms.same[g].astype(dtype, copy=False) for g in groups],
            [terms.recv[g][terms.p_pair[g][p_order]] for g in groups],
            p_per_byte[p_order] * BYTES_PER_ELEMENT, p_latency[p_order],
        )
        consumer_side = (
            [np.ascontiguousarray(state[q_order].T) for state in terms.q_state],
            [terms.row[g][:, terms.q_pair[g][q_order]].astype(dtype) for g in groups],
            [terms.sent[g][:, terms.q_pair[g][q_order]] for g in groups],
            np.ascontiguousarray(need[q_order].T.astype(dtype)),
            np.ascontiguousarray(q_per_byte[q_order].T * BYTES_PER_ELEMENT),
            np.ascontiguousarray(q_latency[q_order].T),
        )
        p_extent, q_extent = ptab.extent[p_order], qtab.extent[q_order]
        if len(pconfs) * len(qconfs) * self.devices <= _CHUNK_ELEMENTS:
            # small: one block over every device costs less than many calls
            p_extent = np.full(len(pconfs), self.devices)
            q_extent = np.full(len(qconfs), self.devices)
        seconds = np.zeros((len(pconfs), len(qconfs)))
        elements = np.zeros((len(pconfs), len(qconfs)), dtype=np.int64)
        for extent in np.unique(np.concatenate([p_extent, q_extent])):
            p_at = np.searchsorted(p_extent, [extent, extent], side="left")
            p_at[1] = np.searchsorted(p_extent, extent, side="right")
            q_at = np.searchsorted(q_extent, [extent, extent], side="left")
            q_at[1] = np.searchsorted(q_extent, extent, side="right")
            # producers at this extent x consumers up to it; producers below x consumers at it
            for p_rows, q_columns in ((slice(p_at[0], p_at[1]), slice(0, q_at[1])),
                                      (slice(0, p_at[0]), slice(q_at[0], q_at[1]))):
                if p_rows.stop <= p_rows.start or q_columns.stop <= q_columns.start:
                    continue
                columns = q_columns.stop - q_columns.start
                step = max(1, _CHUNK_ELEMENTS // (int(extent) * columns))
                for start in range(p_rows.start, p_rows.stop, step):
                    rows = slice(start, min(start + step, p_rows.stop))
                    seconds[rows, q_columns], elements[rows, q_columns] = _pair_block(
                        producer_side, consumer_side, rows, q_columns, int(extent), backward)
        passes = 2 if backward else 1  # forward, and backward unless input
        p_back, q_back = np.argsort(p_order), np.argsort(q_order)
        seconds = seconds[p_back][:, q_back]
        elements = elements[p_back][:, q_back]
        return seconds, passes * elements * BYTES_PER_ELEMENT

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
        sync += self.bucket_latency_rest(assignment)
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


def _space_key(layer: Layer) -> tuple[object, ...]:
    """What a layer's search space depends on: its dimension sizes and which it may split."""
    return (tuple(dim_sizes(layer).values()), parallel_dims(layer))


class _DimTable:
    """Along one dimension, every pair of power-of-two degrees of the producer and consumer.

    Rows number producer tiles as a * width + i (tile i of 2^a tiles), columns consumer tiles
    as b * width + j; the last slot of i and j is all zeros so that a tile index of -1 (no tile
    on that device) reads zero:
    - pairs[(a, i), (b, j)]: elements shared by producer tile i and the range consumer tile j
      needs (int32: at most the dimension's size);
    - producers_touching[a, (b, j)]: producer tiles of 2^a that consumer tile j needs from;
    - consumers_touching[(a, i), b] and row_sum[(a, i), b]: consumer tiles of 2^b that need
      producer tile i, and the elements of i they need in total;
    - need_len[b, j]: the length of the range consumer tile j needs.
    """

    def __init__(self, producer_size: int, needed: tuple[np.ndarray, np.ndarray],
                 levels: int) -> None:
        width = (1 << (levels - 1)) + 1
        # every (exponent, tile index) of one side, all exponents together
        exponent = np.repeat(np.arange(levels), 1 << np.arange(levels))
        index = np.concatenate([np.arange(1 << level) for level in range(levels)])
        p_starts, p_stops = tile_range(producer_size, 1 << exponent, index)
        starts, stops = needed
        self.need_len = np.zeros((levels, width), dtype=np.int64)
        self.need_len[exponent, index] = np.maximum(stops - starts, 0)
        shared = (np.minimum(p_stops[:, None], stops[None, :])
                  - np.maximum(p_starts[:, None], starts[None, :]))
        overlap = np.zeros((levels, width, levels, width), dtype=np.int32)
        overlap[exponent[:, None], index[:, None], exponent[None, :],
                index[None, :]] = np.maximum(shared, 0)
        touching = overlap > 0
        self.pairs = overlap.reshape(levels * width, levels * width)
        self.producers_touching = touching.sum(axis=1, dtype=np.int32).reshape(levels, -1)
        self.consumers_touching = touching.sum(axis=3, dtype=np.int32).reshape(-1, levels)
        self.row_sum = overlap.sum(axis=3, dtype=np.int64).reshape(-1, levels)


class _EdgeTables:
    """The four per-dimension tables of one edge (n, c, h, w)."""

    def __init__(self, dims: Sequence[_DimTable]) -> None:
        self.dims = dims

    def need(self, qtab: _ConfigTable) -> np.ndarray:
        product = np.ones(qtab.tile_of.shape[:2], dtype=np.int64)
        for dim, table in enumerate(self.dims):
            product *= table.need_len[qtab.exponents[:, dim, None], qtab.tile_of[:, :, dim]]
        return product

    def terms(self, ptab: _ConfigTable, qtab: _ConfigTable) -> _Terms:
        """The per-dim tables of each group of two dims multiplied into one table, indexed by
        the states and exponent pairs the two config tables number (see `_ConfigTable`)."""
        terms = _Terms()
        width = self.dims[0].need_len.shape[1]
        for group, dims in enumerate(_GROUPS):
            p_state, p_exp, p_tile, p_pair, p_pair_exp = ptab.groups[group]
            q_state, q_exp, q_tile, q_pair, q_pair_exp = qtab.groups[group]
            parts = []
            for k, dim in enumerate(dims):
                table = self.dims[dim]
                p_at = p_exp[k] * width + p_tile[k]  # table row of each producer state (S,)
                q_at = q_exp[k] * width + q_tile[k]  # table column of each consumer state (T,)
                parts.append((
                    np.take(table.pairs[p_at], q_at, axis=1),  # (S, T)
                    np.take(table.producers_touching[p_pair_exp[k]], q_at, axis=1),  # (A, T)
                    np.take(table.row_sum[p_at], q_pair_exp[k], axis=1),  # (S, B)
                    np.take(table.consumers_touching[p_at], q_pair_exp[k], axis=1),  # (S, B)
                ))
            (same, recv, row, sent), (same_1, recv_1, row_1, sent_1) = parts
            if int(same.max(initial=0)) * int(same_1.max(initial=0)) >= _INT32_LIMIT:
                same = same.astype(np.int64)
            terms.p_state.append(p_state)
            terms.q_state.append(q_state)
            terms.p_pair.append(p_pair)
            terms.q_pair.append(q_pair)
            terms.same.append(same * same_1)
            terms.recv.append(recv * recv_1)  # at most the number of devices squared
            terms.row.append(row * row_1)
            terms.sent.append(sent * sent_1)
        return terms


class _Terms:
    """An edge's group tables for two config tables (see `_EdgeTables.terms`)."""

    def __init__(self) -> None:
        self.p_state: list[np.ndarray] = []  # (P, D) state of each producer config's devices
        self.q_state: list[np.ndarray] = []  # (Q, D)
        self.p_pair: list[np.ndarray] = []  # (P,) exponent pair of each producer config
        self.q_pair: list[np.ndarray] = []  # (Q,)
        self.same: list[np.ndarray] = []  # (S, T) elements a device holds of what it needs
        self.recv: list[np.ndarray] = []  # (A, T) producer tiles a consumer tile needs
        self.row: list[np.ndarray] = []  # (S, B) elements of a producer tile needed in all
        self.sent: list[np.ndarray] = []  # (S, B) consumer tiles a producer tile feeds

    def bound(self) -> int:
        """An upper bound on every element count the pairs multiply out to."""
        return max(int(self.same[0].max(initial=0)) * int(self.same[1].max(initial=0)),
                   int(self.row[0].max(initial=0)) * int(self.row[1].max(initial=0)))


_Side = tuple[object, ...]


def _pair_block(producer_side: _Side, consumer_side: _Side, rows: slice, columns: slice,
                extent: int, backward: bool) -> tuple[np.ndarray, np.ndarray]:
    """t_x seconds and forward elements of producer configs `rows` x consumer configs
    `columns`, over devices [0, extent), as (P, D, Q) arrays reduced over D.

    Per device: `same` elements it holds of what its consumer tile needs, the producer tiles
    it receives from, and (backward) its producer tile's elements needed elsewhere and the
    consumer tiles it sends to. Forward time is the slowest device's remote elements over its
    producer block's link plus latency per message; backward likewise over the consumer's.
    The expression and its order of operations are the reference's, so results are equal
    bit for bit.
    """
    p_state, same_tables, recv_tables, p_byte, p_latency = producer_side
    q_state, row_tables, sent_tables, need, q_byte, q_latency = consumer_side
    devices = slice(0, extent)
    same = recv = None
    for group in range(2):
        table = same_tables[group]
        index = (p_state[group][rows, devices, None] * table.shape[1]
                 + q_state[group][None, devices, columns])
        part = table.ravel().take(index)
        same = part if same is None else np.multiply(same, part, out=same)
        part = np.take(recv_tables[group][rows], q_state[group][devices, columns], axis=1)
        recv = part if recv is None else np.multiply(recv, part, out=recv)
    held = same > 0
    np.subtract(recv, held, out=recv)
    remote = np.subtract(need[None, devices, columns], same)
    forward = remote * p_byte[rows, devices, None]
    forward += recv * p_latency[rows, devices, None]
    seconds = forward.max(axis=1)
    elements = remote.sum(axis=1, dtype=np.int64)
    if backward:
        row_sum = sent = None
        for group in range(2):
            state = p_state[group][rows, devices]
            part = np.take(row_tables[group][:, columns], state, axis=0)
            row_sum = part if row_sum is None else np.multiply(row_sum, part, out=row_sum)
            part = np.take(sent_tables[group][:, columns], state, axis=0)
            sent = part if sent is None else np.multiply(sent, part, out=sent)
        np.subtract(sent, held, out=sent)
        np.subtract(row_sum, same, out=row_sum)
        back = row_sum * q_byte[None, devices, columns]
        back += sent * q_latency[None, devices, columns]
        seconds = seconds + back.max(axis=1)
    return seconds, elements
