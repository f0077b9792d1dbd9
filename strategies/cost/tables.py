"""The vectorised tables behind `CostModel` (cost_model.py): the terms of Jia et al. 2018, Eq. 1 for
every config of a layer's search space at once, which the search needs whole.

- `LayerTiles`: the largest tile of a layer under any config (as `tiles.largest_tile`), and
  the element counts of many at once, from per-dimension parts computed once (t_c).
- `TransferTables`: t_x of every pair of producer and consumer configs of an edge, each
  element priced over the link it crosses: a receiving device's time is the sum over the
  cluster's link classes of its elements from that class at the class's seconds per element
  plus the class's latency per sending tile. Where a class's port is shared (`Link.shared_by`),
  its seconds per element are multiplied by the receiving config's devices behind that port:
  they take their data through it at once.

Why our own code: the box overlaps factor per dimension (along each dim the needed range of a
tile depends only on its index along that dim), so the whole C_i x C_j matrix of an edge is a
few numpy gathers and products; no library computes this. The tiles a unit of the cluster
(PCIe group, node, rack) holds form a few aligned runs of tile positions, each a box of the
tile grid (`TierViews`), so what a device gets from within its unit factors the same way. The
definition they equal, pair by pair and tile by tile (bytes bit for bit, seconds to rounding),
is in tests/test_cost.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from typing import NamedTuple

import numpy as np

from layerwise.strategies.cost.degree_bounds import (
    EndRows,
    GroupedAt,
    bare_levels,
    end_rows,
    end_seconds,
    group_product,
    grouped_index,
    window_table,
)
from layerwise.strategies.hardware.cluster import Cluster
from layerwise.strategies.hardware.host_memory import check_memory, human_bytes
from layerwise.strategies.model.graph import BYTES_PER_ELEMENT, Layer
from layerwise.strategies.model.space import DIMS, ParallelConfig, tile_range, view_dims
from layerwise.strategies.model.tiles import (
    TileWork,
    as_view,
    needed_ranges,
    passes_through,
)

# Cap on elements of one (producer configs x devices x consumer configs) work array; small
# enough that the passes over it stay in cache.
_CHUNK_ELEMENTS = 1 << 17
_INT32_LIMIT = 2**31
# Bytes per (config, device) of a `ConfigTable` (tile indices twice, state keys and states of
# two groups) and per pair of configs of an edge's matrices (seconds and bytes, and the sorted
# copies `_pairs` returns).
_CONFIG_TABLE_BYTES = 112
_PAIR_BYTES = 32
# the search keeps each edge's per-device terms from its bounds to its exact pass up to this
_KEPT_SIDES_BYTES = 96 << 20
# where the pairs an edge's bounds are asked for exceed this share of all its pairs, the whole
# matrix is priced (a shift copies ~0.4 of its pairs on 64 devices) and read from
_NARROWED_SHARE = 0.4
# A kind of edge's sides are built over every config asked of a search space where the configs
# no edge of that kind asks for, times the devices, are at most the first plus the second times
# the configs it asks for (`_built_over`; its own config table then costs about as much as
# carrying that many more configs on 64 devices)
_UNION_CONFIG_DEVICES = 4096
_UNION_OWN_DEVICES = 64
# One kind of edge's own sides and pass cost about as much as pricing this many per-device
# terms (Inception-v3 on 16 and 64 devices of h200x8: 0.55-0.75 ms a kind, ~69 ns a term):
# kinds built over the same configs are priced together where the terms that adds are fewer
# than this per kind (`TransferTables._batch_pays`)
_KIND_TERMS = 8_000
# and only where each of the batch's stacked tables holds at most this many entries (8-16 MB):
# Inception-v3's batch of 16 kinds on 64 devices of p100x16 needed 3.6 million a table, its
# sides took 58 MB and it ran slower than its kinds alone (51 -> 77 ms)
_BATCH_ENTRIES = 1 << 21
# from this many devices a bound's tables hold each side's ends only (`ConfigTable`)
_ENDS_TABLES_FROM_DEVICES = 32
# Bytes of the parts kept for the edges that share them (`SharedParts`), each of the degree
# bounds' and of the sides' (a degree bound's factor on 16 devices ~80 KB, on 64 up to ~3.4
# MB; the gathers' indices between two spaces of a 3-d net on 64 devices ~23 MB a pass)
_SHARED_PARTS_BYTES = 16 << 20

# Dimensions whose per-dim tables are multiplied into one table: (n, c), (h, w) and (d, pad).
# Every group is two dims, so depth is paired with a padding dim of size 1 that no config
# splits (`_PAD`); an edge whose producer has no depth skips that group (`EdgeDims.active`):
# every term of it is 1 on a device holding a tile, and the other groups already give 0 on
# one that holds none.
_PAD = len(DIMS)
_CHANNEL = DIMS.index("c")
_TABLE_DIMS = _PAD + 1
_GROUPS = ((0, 1), (3, 4), (2, _PAD))
_DEPTH_GROUP = 2


# ---- t_c: the largest tile of each config ----------------------------------------------------


@dataclass(frozen=True)
class TileDim:
    """Along one dimension under one degree: the largest tile's output range (the first such)
    and the length of the range it needs of each input (as `tiles.largest_tile`)."""

    output: tuple[int, int]
    needed: tuple[int, ...]


@dataclass(frozen=True)
class DimLevels:
    """Along one dimension, for every degree 2^0 .. 2^(levels - 1) (an entry per exponent):
    the largest tile's output range (the first such) and the length of the range it needs of
    each input, (inputs, levels)."""

    levels: int
    starts: np.ndarray
    stops: np.ndarray
    needed: np.ndarray


@dataclass(frozen=True)
class TileVolumes:
    """Element counts of each config's largest tile (one entry per config): what its shapes
    in `LayerTiles.largest` multiply out to."""

    output: np.ndarray
    inputs: np.ndarray  # summed over the layer's inputs
    params: np.ndarray  # the weights the tile's device holds (a channel split shards them)


class LayerTiles:
    """A layer's largest tile under any config, from per-dimension parts computed once."""

    def __init__(self, layer: Layer) -> None:
        self.layer = layer
        self._levels: dict[int, DimLevels] = {}
        self._largest: dict[tuple[int, ...], TileWork] = {}
        self._volumes_of: Sequence[ParallelConfig] | None = None
        self._volumes = TileVolumes(np.empty(0), np.empty(0), np.empty(0))

    def along(self, dim: int, degree: int) -> TileDim:
        """The largest tile's part along `dim` when the layer is split `degree` ways (a power
        of two)."""
        level = degree.bit_length() - 1
        levels = self.levels(dim, level + 1)
        return TileDim(output=(int(levels.starts[level]), int(levels.stops[level])),
                       needed=tuple(int(length) for length in levels.needed[:, level]))

    def levels(self, dim: int, levels: int) -> DimLevels:
        """`DimLevels` along `dim` of at least `levels` exponents, every degree's at once (its
        ranges `tiles.needed_ranges` computes together)."""
        known = self._levels.get(dim)
        if known is None or known.levels < levels:
            layer = self.layer
            outs, starts, stops = _largest_tiles(as_view(layer.output_shape)[dim], levels)
            needed = np.zeros((len(layer.input_shapes), levels), dtype=np.int64)
            for index in range(len(layer.input_shapes)):
                if passes_through(layer, index, dim):  # the output's own ranges
                    needed[index] = stops - starts
                else:
                    first, last = needed_ranges(layer, index, dim, outs)
                    needed[index] = np.maximum(last - first, 0)
            self._levels[dim] = known = DimLevels(levels=levels, starts=starts, stops=stops,
                                                  needed=needed)
        return known

    def largest(self, config: ParallelConfig) -> TileWork:
        """`tiles.largest_tile(layer, config)`."""
        if config.degrees not in self._largest:
            layer = self.layer
            parts = [self.along(dim, degree) for dim, degree in enumerate(config.degrees)]
            output_shape = tuple(parts[dim].output[1] - parts[dim].output[0]
                                 for dim in view_dims(len(layer.output_shape)))
            input_shapes = tuple(
                tuple(parts[dim].needed[index] for dim in view_dims(len(shape)))
                for index, shape in enumerate(layer.input_shapes)
            )
            c_start, c_stop = parts[1].output
            param_elements = layer.param_count * (c_stop - c_start) // layer.output_shape[1]
            self._largest[config.degrees] = TileWork.model_construct(
                output_shape=output_shape, input_shapes=input_shapes,
                param_elements=param_elements)
        return self._largest[config.degrees]

    def volumes(self, configs: Sequence[ParallelConfig]) -> TileVolumes:
        """Element counts of each config's largest tile, as products of per-dim lengths."""
        if configs is self._volumes_of:  # t_c and the update read the same list in turn
            return self._volumes
        layer = self.layer
        degrees = np.array([config.degrees for config in configs], dtype=np.int64)
        # 2^e = 0.5 * 2^(e+1)
        exponents = np.frexp(degrees.reshape(-1, len(DIMS)))[1].astype(np.int64) - 1
        out = np.ones(len(configs), dtype=np.int64)
        inputs = np.ones((len(layer.input_shapes), len(configs)), dtype=np.int64)
        out_lengths = []
        for dim in range(len(DIMS)):
            levels = self.levels(dim, int(exponents[:, dim].max(initial=0)) + 1)
            out_lengths.append((levels.stops - levels.starts)[exponents[:, dim]])
            out *= out_lengths[-1]
            inputs *= levels.needed[:, exponents[:, dim]]
        # a channel split shards the weights
        params = layer.param_count * out_lengths[1] // as_view(layer.output_shape)[1]
        self._volumes_of = configs
        self._volumes = TileVolumes(output=out, inputs=inputs.sum(axis=0), params=params)
        return self._volumes


# ---- t_x: per-config tables ------------------------------------------------------------------


@dataclass(frozen=True)
class GroupStates:
    """For one group of two dims, the distinct (exponent, tile index) states a device can be in
    under a list of configs, and the distinct exponent pairs of the configs."""

    state: np.ndarray  # (C, D) state of each config's devices
    state_exponents: np.ndarray  # (2, S) exponent along each of the two dims of each state
    state_tiles: np.ndarray  # (2, S) tile index along each of the two dims of each state
    pair: np.ndarray  # (C,) exponent pair of each config
    pair_exponents: np.ndarray  # (2, A) the exponents of each pair
    # along each of the two dims: the distinct tiles (exponent * width + index) and the
    # tile of each state
    dim_tiles: tuple[np.ndarray, ...]
    dim_tile_of: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class TierViews:
    """What each device's unit of one tier of the cluster (the devices that share a link,
    `Cluster.link_tiers`) holds of each config of a list: the config's tiles on the unit's
    devices, as runs of tiles whose positions in `ParallelConfig.tiles` order are aligned
    blocks of 2^m. Such a run is a box of the tile grid: along each dim the tiles
    [i * 2^(a-k), (i + 1) * 2^(a-k)) of 2^a, the range of tile i of 2^k (the coarse tile). Per
    group of two dims, the distinct (exponent, coarse exponent, coarse index) states; a slot
    without a run reads the zero slot (coarse exponent a, index width - 1)."""

    state: list[np.ndarray]  # per group: (C, M, D) state of each config's M slots per device
    # per group, along each of its two dims: the distinct runs as (fine exponent, coarse
    # exponent, coarse index, first tile, one past the last tile) arrays, and the run of
    # each state
    runs: list[tuple[tuple[np.ndarray, ...], ...]]
    run_of: list[tuple[np.ndarray, ...]]
    # per group, along each of its two dims: the distinct fine exponents of the runs, and
    # each run's among them (the tables' rows the runs count along)
    fine: list[tuple[tuple[np.ndarray, np.ndarray], ...]]


@cache  # many layers share a size along a dim
def _level_ranges(size: int, levels: int) -> tuple[tuple[int, int], ...]:
    """The range of every tile of every power-of-two degree 2^0 .. 2^(levels-1) of a dim of
    `size`, degree after degree (the order of `DimTable`)."""
    return tuple(tile_range(size, 1 << level, index)
                 for level in range(levels) for index in range(1 << level))


@cache  # many layers share a size along a dim
def _largest_tiles(size: int, levels: int,
                   ) -> tuple[tuple[tuple[int, int], ...], np.ndarray, np.ndarray]:
    """The output range of the first longest tile of each degree 2^0 .. 2^(levels-1) of a dim
    of `size`, as ranges and as (starts, stops) arrays (read-only: shared)."""
    ranges = np.array(_level_ranges(size, levels), dtype=np.int64).reshape(-1, 2)
    lengths = ranges[:, 1] - ranges[:, 0]
    largest = [(1 << level) - 1 + int(np.argmax(lengths[(1 << level) - 1:(2 << level) - 1]))
               for level in range(levels)]
    starts, stops = ranges[largest, 0], ranges[largest, 1]
    starts.flags.writeable = stops.flags.writeable = False
    return tuple((int(start), int(stop)) for start, stop in ranges[largest]), starts, stops


def _aligned_runs(first: int, stop: int) -> list[tuple[int, int]]:
    """Tile positions [first, stop) as the fewest aligned blocks (start, log2 length)."""
    runs = []
    while first < stop:
        step = (first & -first or 1 << 62).bit_length() - 1
        while first + (1 << step) > stop:
            step -= 1
        runs.append((first, step))
        first += 1 << step
    return runs


def _unit_runs(config: ParallelConfig, unit: int) -> dict[int, list[tuple[int, int]]]:
    """The aligned runs of tile positions (start, log2 length) that each unit holds."""
    return _block_runs(config.devices, unit)


@cache
def _block_runs(block: tuple[int, ...], unit: int) -> dict[int, list[tuple[int, int]]]:
    """`_unit_runs` of the configs on `block`: the runs depend on the devices alone, and a
    search space puts many configs on each block (at 64 devices, 848 configs on 127)."""
    start = block[0]
    if block == tuple(range(start, start + len(block))):
        # a contiguous block: each unit holds one range of positions
        return {index: _aligned_runs(max(index * unit, start) - start,
                                     min((index + 1) * unit, start + len(block)) - start)
                for index in range(start // unit, (start + len(block) - 1) // unit + 1)}
    held: dict[int, list[int]] = {}
    for position, device in enumerate(block):
        held.setdefault(device // unit, []).append(position)
    units = {}
    for index, positions in held.items():
        runs = units.setdefault(index, [])
        at = 0
        while at < len(positions):  # each stretch of consecutive positions
            length = 1
            while at + length < len(positions) and positions[at + length] == positions[at] + length:
                length += 1
            runs.extend(_aligned_runs(positions[at], positions[at] + length))
            at += length
    return units


def _tier_views(configs: Sequence[ParallelConfig], exponents: np.ndarray, devices: int,
                unit: int) -> TierViews:
    """`TierViews` of `configs` for units of `unit` consecutive devices."""
    levels = devices.bit_length()
    width = (1 << (levels - 1)) + 1
    # one record per run: config, slot, the unit's devices, start position, log2 length
    records = [(row, slot, index * unit, min((index + 1) * unit, devices), start, step)
               for row, config in enumerate(configs)
               for index, runs in _unit_runs(config, unit).items()
               for slot, (start, step) in enumerate(runs)]
    slots = 1 + max((record[1] for record in records), default=0)
    coarse = np.broadcast_to(exponents[:, None, None, :],
                             (len(configs), slots, devices, _TABLE_DIMS)).copy()
    tiles = np.full((len(configs), slots, devices, _TABLE_DIMS), width - 1, dtype=np.int64)
    if records:
        row, slot, first, last, start, step = np.array(records, dtype=np.int64).T
        fine = exponents[row]  # (R, 6)
        # the low bits of a position are the last dims': a run of 2^step spreads over them
        below = np.cumsum(fine[:, ::-1], axis=1)[:, ::-1] - fine  # exponents after each dim
        spread = np.clip(step[:, None] - below, 0, fine)
        index = (start[:, None] >> below) & ((1 << fine) - 1)
        # every device of each run's unit
        count = last - first
        run = np.repeat(np.arange(len(records)), count)
        device = first[run] + np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
        coarse[row[run], slot[run], device] = (fine - spread)[run]
        tiles[row[run], slot[run], device] = (index >> spread)[run]
    states, runs, run_of, fine_of = [], [], [], []
    for d0, d1 in _GROUPS:
        e0 = np.broadcast_to(exponents[:, None, None, d0], coarse.shape[:3])
        e1 = np.broadcast_to(exponents[:, None, None, d1], coarse.shape[:3])
        along0 = (e0 * levels + coarse[..., d0]) * width + tiles[..., d0]
        along1 = (e1 * levels + coarse[..., d1]) * width + tiles[..., d1]
        span = levels * levels * width
        unique, state = np.unique(along0 * span + along1, return_inverse=True)
        states.append(state.reshape(coarse.shape[:3]))
        group_runs, group_run_of = [], []
        for along in (unique // span, unique % span):
            distinct, of = np.unique(along, return_inverse=True)
            index, rest = distinct % width, distinct // width
            rough, fine = rest % levels, rest // levels
            low = index << (fine - rough)
            group_runs.append((fine, rough, index, low, low + (1 << (fine - rough))))
            group_run_of.append(of)
        runs.append(tuple(group_runs))
        run_of.append(tuple(group_run_of))
        fine_of.append(tuple(np.unique(run[0], return_inverse=True) for run in group_runs))
    return TierViews(state=states, runs=runs, run_of=run_of, fine=fine_of)


def _by_size(configs: Sequence[ParallelConfig]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The configs grouped by their number of devices: each group's indices and its devices,
    (configs, tiles)."""
    sizes: dict[int, list[int]] = {}
    for index, config in enumerate(configs):
        sizes.setdefault(config.size, []).append(index)
    return [(np.array(indices), np.array([configs[i].devices for i in indices]))
            for _, indices in sorted(sizes.items())]


def _ends(by_size: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """`by_size` with each config's first and last devices only: the two ends of a block,
    which cross its longest links (on 64 devices of p100x16 their t_x is 0.98-0.99 of all
    devices' on average, at 1/8 of the work)."""
    return [(indices, devices[:, sorted({0, devices.shape[1] - 1})])
            for indices, devices in by_size]


class ConfigTable:
    """Per-config arrays of a list of configs: degree exponents, tile index per device, and
    how each device is linked to the config's devices.

    The list starts with the configs whose other devices all sit in one link class of each
    device (`single`: their classes per device, (single, D)); what each tier's unit of each
    device holds of the rest is in `tiers` (`TierViews`, one per unit size in `units`).
    For each group of two dims it also numbers the distinct states and exponent pairs
    (`GroupStates`), so that an edge's per-dim tables can be multiplied into one small table
    per group. `sharing` (configs, D, link classes) holds, for each config's devices, how many
    of its devices sit behind each class's port (`shared_by` devices per port; None where no
    port is shared).

    `ends_only`: each config's tiles on its first and last devices only (`_ends`), the only
    ones a bound's pass reads on this side: a device's states are then a few per exponent pair
    instead of one per tile, so the edge tables indexed by them shrink by as much (on 256
    devices, 90 states against 4,097 per group). Its sharing still counts every device of a
    config, and it has no tier views (`tiers` is empty: the pass that reads them reads the
    other side's).
    """

    def __init__(self, configs: Sequence[ParallelConfig], devices: int, units: Sequence[int],
                 single: np.ndarray, shared_by: Sequence[int], ends_only: bool = False) -> None:
        count = len(configs)
        self.single = single
        degrees = np.array([config.degrees for config in configs],
                           dtype=np.int64).reshape(count, _PAD)
        self.exponents = np.zeros((count, _TABLE_DIMS), dtype=np.int64)
        self.exponents[:, :_PAD] = np.log2(degrees).astype(np.int64)  # exact: powers of two
        # tile index along each dim of the tile held by each device; -1 where none: tile k
        # of a config (row-major over its degrees, `ParallelConfig.tiles`) on its k-th device
        sizes = degrees.prod(axis=1)
        row, device = _config_devices(configs, sizes)
        position = np.arange(len(row)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        member = np.zeros((count, devices), dtype=bool)
        member[row, device] = True
        after = np.cumprod(degrees[:, ::-1], axis=1)[:, ::-1] // degrees  # tiles per index
        index = position[:, None] // after[row] % degrees[row]
        if ends_only:  # the first and the last tile only
            end = (position == 0) | (position == sizes[row] - 1)
            row, device, index = row[end], device[end], index[end]
        self.tile_of = np.full((count, devices, _TABLE_DIMS), -1, dtype=np.int64)
        self.tile_of[row, device, :_PAD] = index
        self.tile_of[row, device, _PAD] = 0
        # one past the highest device of each config: devices beyond hold no tile
        levels = devices.bit_length()
        width = (1 << (levels - 1)) + 1
        tile = np.where(self.tile_of < 0, width - 1, self.tile_of)  # -1 reads the zero slot
        groups = []
        for d0, d1 in _GROUPS:
            e0, e1 = self.exponents[:, None, d0], self.exponents[:, None, d1]
            key = ((e0 * width + tile[..., d0]) * levels + e1) * width + tile[..., d1]
            unique, state = np.unique(key, return_inverse=True)
            i1, rest = unique % width, unique // width
            s1, rest = rest % levels, rest // levels
            i0, s0 = rest % width, rest // width
            pair_key = self.exponents[:, d0] * levels + self.exponents[:, d1]
            pairs, pair = np.unique(pair_key, return_inverse=True)
            along = [np.unique(exponent * width + index, return_inverse=True)
                     for exponent, index in ((s0, i0), (s1, i1))]
            groups.append(GroupStates(
                state=state.reshape(count, devices), state_exponents=np.stack([s0, s1]),
                state_tiles=np.stack([i0, i1]), pair=pair.reshape(count),
                pair_exponents=np.stack([pairs // levels, pairs % levels]),
                dim_tiles=tuple(tiles for tiles, _ in along),
                dim_tile_of=tuple(tile_of for _, tile_of in along)))
        self.groups: tuple[GroupStates, ...] = tuple(groups)
        self.by_size = _by_size(configs)
        self.ends = _ends(self.by_size)
        # each config's size and the first device of its block (-1 where the block is not
        # a run of consecutive devices), and where each degrees sit on each first device
        self.size = np.array([config.size for config in configs], dtype=np.int64)
        self.start = np.array([config.devices[0] if config.devices == tuple(range(
            config.devices[0], config.devices[0] + config.size)) else -1
            for config in configs], dtype=np.int64)
        degree_ids: dict[tuple[int, ...], int] = {}
        self.degree_id = np.array([degree_ids.setdefault(config.degrees, len(degree_ids))
                                   for config in configs], dtype=np.int64)
        self.at_start = np.full((len(degree_ids), devices), -1, dtype=np.int64)
        runs = self.start >= 0
        self.at_start[self.degree_id[runs], self.start[runs]] = np.flatnonzero(runs)
        first = len(single)
        self.tiers = () if ends_only else tuple(
            _tier_views(configs[first:], self.exponents[first:], devices, unit)
            for unit in units)
        self.sharing = (None if all(size == 1 for size in shared_by)
                        else _sharing(member, shared_by))


def _config_devices(configs: Sequence[ParallelConfig],
                    sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each config's devices in order as (config row, device) arrays; `sizes` holds each
    config's number of devices."""
    row = np.repeat(np.arange(len(configs)), sizes)
    device = np.fromiter(itertools.chain.from_iterable(config.devices for config in configs),
                         dtype=np.int64, count=len(row))
    return row, device


def _sharing(member: np.ndarray, shared_by: Sequence[int]) -> np.ndarray:
    """(configs, D, link classes): for each config's devices, how many of its devices sit in
    the device's run of `shared_by[k]` devices (class k's port); 1 where the port is its own.
    Small counts: float32 holds them exactly, at half the memory of float64."""
    count, devices = member.shape
    sharing = np.ones((count, devices, len(shared_by)), dtype=np.float32)
    for k, size in enumerate(shared_by):
        if size > 1:
            runs = -(-devices // size)
            padded = np.zeros((count, runs * size), dtype=np.int16)  # size <= a node's devices
            padded[:, :devices] = member
            behind = padded.reshape(count, runs, size).sum(axis=2, dtype=np.int16)
            sharing[..., k] = np.maximum(np.repeat(behind, size, axis=1)[:, :devices], 1)
    return sharing


# ---- t_x: per-edge tables --------------------------------------------------------------------


class DimTable:
    """Along one dimension, every pair of power-of-two degrees of the producer and consumer.

    Rows number producer tiles as a * width + i (tile i of 2^a tiles), columns consumer tiles
    as b * width + j; the last slot of i and j is all zeros so that a tile index of -1 (no tile
    on that device) reads zero:
    - pairs[(a, i), (b, j)]: elements shared by producer tile i and the range consumer tile j
      needs (int32: at most the dimension's size);
    - producers_touching[a, (b, j)]: producer tiles of 2^a that consumer tile j needs from;
    - consumers_touching[(a, i), b] and row_sum[(a, i), b]: consumer tiles of 2^b that need
      producer tile i, and the elements of i they need in total;
    - need_len[b, j]: the length of the range consumer tile j needs;
    - touching[a, i, (b, j)]: whether pairs[(a, i), (b, j)] is not zero.
    """

    def __init__(self, producer_size: int, starts: np.ndarray, stops: np.ndarray,
                 levels: int) -> None:
        width = (1 << (levels - 1)) + 1
        self.producer_size = producer_size
        # every (exponent, tile index) of one side, all exponents together
        exponent = np.repeat(np.arange(levels), 1 << np.arange(levels))
        index = np.concatenate([np.arange(1 << level) for level in range(levels)])
        p_starts, p_stops = tile_range(producer_size, 1 << exponent, index)
        self.need_len = np.zeros((levels, width), dtype=np.int64)
        self.need_len[exponent, index] = np.maximum(stops - starts, 0)
        shared = np.maximum(np.minimum(p_stops[:, None], stops[None, :])
                            - np.maximum(p_starts[:, None], starts[None, :]), 0).astype(np.int32)
        touches = shared > 0
        # the sums over each exponent's tiles on the tiles themselves, then placed at each
        # tile's (exponent, index) slot: the padded tables are ~20x larger on 256 devices
        at = exponent * width + index
        first = (1 << np.arange(levels)) - 1  # each exponent's first tile
        self.pairs = np.zeros((levels * width, levels * width), dtype=np.int32)
        self.pairs[at[:, None], at] = shared
        touching = np.zeros((levels * width, levels * width), dtype=bool)
        touching[at[:, None], at] = touches
        # which consumer tiles each producer tile touches, by producer exponent and tile
        self.touching = touching.reshape(levels, width, levels * width)
        self.producers_touching = np.zeros((levels, levels * width), dtype=np.int32)
        self.producers_touching[:, at] = np.add.reduceat(touches, first, axis=0, dtype=np.int32)
        self.consumers_touching = np.zeros((levels * width, levels), dtype=np.int32)
        self.consumers_touching[at] = np.add.reduceat(touches, first, axis=1, dtype=np.int32)
        self.row_sum = np.zeros((levels * width, levels), dtype=np.int64)
        self.row_sum[at] = np.add.reduceat(shared, first, axis=1, dtype=np.int64)
        self._levels, self._width = levels, width

    @cached_property
    def largest_per_consumer_tile(self) -> np.ndarray:
        """(levels, levels * width): of the producer tiles of 2^a, the most elements any one
        shares with the range consumer tile (b, j) needs."""
        return self.pairs.reshape(self._levels, self._width, -1).max(axis=1)

    @cached_property
    def largest_per_producer_tile(self) -> np.ndarray:
        """(levels * width, levels): of the consumer tiles of 2^b, the most elements of
        producer tile (a, i) any one needs."""
        return self.pairs.reshape(-1, self._levels, self._width).max(axis=2)

    @cached_property
    def forward_windows(self) -> np.ndarray:
        """`window_table` of the most elements of the range consumer tile (b, j) needs that
        producer tiles of 2^a hold: one, all, or an aligned run of 2^t of them (a run is one
        tile of 2^(a-t): tiles of power-of-two degrees nest)."""
        single = self.largest_per_consumer_tile.T
        levels = self._levels
        runs = np.zeros((len(single), levels, levels), dtype=np.int64)
        for exponent in range(levels):
            for taken in range(1, exponent):
                runs[:, exponent, taken] = single[:, exponent - taken]
        return window_table(single, np.repeat(single[:, :1], levels, axis=1), runs)

    @cached_property
    def backward_windows(self) -> np.ndarray:
        """`window_table` of the most elements of producer tile (a, i) consumer tiles of 2^b
        need, counted per consumer tile: one, all, or an aligned run of 2^t of them (at most
        2^t times one, and all)."""
        single, whole = self.largest_per_producer_tile, self.row_sum
        runs = np.zeros((len(single), self._levels, self._levels), dtype=np.int64)
        for taken in range(1, self._levels):
            runs[:, :, taken] = np.minimum(whole, single.astype(np.int64) << taken)
        return window_table(single, whole, runs)


def dim_table_bytes(levels: int) -> int:
    """Memory one `DimTable` on 2^(levels-1) devices takes while it is built: the int32
    overlaps and their mask it keeps, over every (exponent, tile) pair, and the int64 shares
    of every pair of tiles (while they are cut to int32)."""
    width = (1 << (levels - 1)) + 1
    tiles = (1 << levels) - 1
    return levels * levels * width * width * (4 + 1) + tiles * tiles * 8


@dataclass(frozen=True)
class GroupTerms:
    """The per-dim tables of one group of two dims multiplied into one table, of one edge or
    of several with equal config tables (`EdgeStack`), indexed by the states and exponent
    pairs that the producer's and consumer's `ConfigTable` number. Each table has a leading
    axis of one entry per distinct pair of the edges' tables along the group's two dims
    (`EdgeStack.entries`)."""

    p_state: np.ndarray  # (P, D) state of each producer config's devices
    q_state: np.ndarray  # (Q, D)
    p_pair: np.ndarray  # (P,) exponent pair of each producer config
    q_pair: np.ndarray  # (Q,)
    same: np.ndarray  # (E, S, T) elements a device holds of what it needs
    recv: np.ndarray  # (E, A, T) producer tiles a consumer tile needs
    row: np.ndarray  # (E, S, B) elements of a producer tile needed in all
    sent: np.ndarray  # (E, S, B) consumer tiles a producer tile feeds
    which: np.ndarray  # (edges,) each edge's entry of the tables (and of its tiers' tables)


def _bound(groups: Sequence[GroupTerms]) -> int:
    """An upper bound on every element count the pairs multiply out to."""
    return max(math.prod(int(group.same.max(initial=0)) for group in groups),
               math.prod(int(group.row.max(initial=0)) for group in groups))


def _spread(small: np.ndarray, at_rows: np.ndarray, at_columns: np.ndarray) -> np.ndarray:
    """A table over distinct runs and tiles (its last two axes) spread over the states: rows
    first (few columns), then columns."""
    return np.take(small.take(at_rows, axis=-2), at_columns, axis=-1)


def _product(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """first * second of int32 element counts, in int64 where a product could reach 2^31."""
    if int(first.max(initial=0)) * int(second.max(initial=0)) >= _INT32_LIMIT:
        first = first.astype(np.int64)
    return first * second


@dataclass(frozen=True)
class EdgeDims:
    """The per-dimension tables of one edge (n, c, d, h, w and the padding dim) and their ids:
    edges with equal ids have equal tables."""

    ids: tuple[int, ...]
    dims: tuple[DimTable, ...]

    @property
    def active(self) -> tuple[int, ...]:
        """The groups of `_GROUPS` the edge's terms multiply: the depth group only where the
        producer has depth (elsewhere every config holds all of its one row)."""
        deep = self.dims[_GROUPS[_DEPTH_GROUP][0]].producer_size > 1
        return tuple(group for group in range(len(_GROUPS))
                     if group != _DEPTH_GROUP or deep)


class DimStack:
    """The tables along one dim of several edges (equal shapes: one device count), read
    together: each of `take`'s gathers is every table's, stacked on a leading axis, so that
    the numpy calls after it compute the terms of them all."""

    def __init__(self, tables: Sequence[DimTable]) -> None:
        self.tables = tables
        self.levels, self.width = tables[0].need_len.shape

    def take(self, name: str, index: np.ndarray, axis: int) -> np.ndarray:
        """Each table's array `name` at `index` along `axis` (of the table's own axes), as
        (tables, ...): the gather first, so that only what it keeps is stacked."""
        if len(self.tables) == 1:
            return np.take(getattr(self.tables[0], name), index, axis=axis)[None]
        return np.stack([np.take(getattr(table, name), index, axis=axis)
                         for table in self.tables])

    def most(self, name: str) -> int:
        """The largest entry of array `name` over every table."""
        return max(int(getattr(table, name).max()) for table in self.tables)


Parts = tuple[np.ndarray | None, ...]


class EdgeStack:
    """The per-dim terms of one edge, or of several between the same two lists of configs
    computed together (`TransferTables.kept_many`: Inception-v3's upper bound on 16 devices
    asks 41 kinds of edge between one pair of lists, their sides each of 5-56 configs, where
    one kind's numpy calls cost more than their arithmetic). A group's tables have one entry per
    distinct pair of the edges' tables along its two dims (`entries`: each edge's entry),
    computed from the distinct tables along each dim stacked (`DimStack`); a dim whose table
    all the edges share is computed once, and read from and kept in `shared` (but the
    channel's, which the kinds of two spaces rarely share)."""

    def __init__(self, edges: Sequence[EdgeDims], shared: SharedParts | None) -> None:
        self.edges = edges
        self.shared = shared
        self.active = edges[0].active

    def _distinct(self, dim: int) -> list[int]:
        """The distinct table ids along `dim`, in the edges' order."""
        return list(dict.fromkeys(edge.ids[dim] for edge in self.edges))

    def entries(self, group: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each edge's entry of the group's tables (K,), and each entry's table along each of
        the group's two dims (indices into `_distinct`)."""
        d0, d1 = _GROUPS[group]
        pairs = [(edge.ids[d0], edge.ids[d1]) for edge in self.edges]
        distinct = {pair: index for index, pair in enumerate(dict.fromkeys(pairs))}
        along = [{table_id: index for index, table_id in enumerate(self._distinct(dim))}
                 for dim in (d0, d1)]
        return (np.array([distinct[pair] for pair in pairs]),
                [np.array([at[pair[k]] for pair in distinct]) for k, at in enumerate(along)])

    def along(self, dim: int, key: tuple[object, ...] | None, holds: Sequence[object],
              compute: Callable[[DimStack], Parts]) -> Parts:
        """`compute`'s arrays over the distinct tables along `dim` (`_distinct`, a leading axis
        of one entry each); where there is one, with a `key`, kept in `shared`."""
        distinct = self._distinct(dim)
        tables = {edge.ids[dim]: edge.dims[dim] for edge in self.edges}
        if len(distinct) > 1:
            return compute(DimStack([tables[table_id] for table_id in distinct]))
        shared = self.shared if key is not None and dim != _CHANNEL else None
        return _read_or_computed(shared, (*(key or ()), distinct[0]), holds,
                     lambda: compute(DimStack([tables[distinct[0]]])))

    def product(self, group: int, first: Parts, second: Parts,
                elements: tuple[int, ...]) -> Parts:
        """The group's tables from its two dims' (`along`): `first` and `second` multiplied
        entry by entry (`entries`), those at `elements` (element counts) in int64 where a
        product could reach 2^31 (`_product`)."""
        _, of = self.entries(group)
        first = tuple(_at(part, of[0]) for part in first)
        second = tuple(_at(part, of[1]) for part in second)
        products: list[np.ndarray | None] = []
        for index, (one, other) in enumerate(zip(first, second, strict=True)):
            if one is None or other is None:
                products.append(None)
            else:
                products.append(_product(one, other) if index in elements else one * other)
        return tuple(products)

    def group(self, group: int, key: tuple[object, ...], holds: Sequence[object],
              compute: Callable[[], Parts]) -> Parts:
        """`compute`'s product of a group's two dims, read from and kept in `shared` where
        every edge shares both tables and neither is the channel's."""
        dims = _GROUPS[group]
        ids = {(edge.ids[dims[0]], edge.ids[dims[1]]) for edge in self.edges}
        shared = self.shared if _CHANNEL not in dims and len(ids) == 1 else None
        return _read_or_computed(shared, (*key, *next(iter(ids))), holds, compute)

    def need(self, qtab: ConfigTable) -> np.ndarray:
        """(K, Q, D) elements each consumer tile needs (0 on a device holding none), K one
        entry per edge or one for all: computed on the devices holding one only (an
        ends-only table's: two of D per config)."""
        rows, devices = np.nonzero(qtab.tile_of[:, :, 0] >= 0)
        held = np.ones((1, len(rows)), dtype=np.int64)
        for dim in range(_TABLE_DIMS):
            lengths = self.along(dim, None, (), lambda stack, dim=dim: (
                np.stack([table.need_len[qtab.exponents[rows, dim],
                                         qtab.tile_of[rows, devices, dim]]
                          for table in stack.tables]),
            ))[0]
            assert lengths is not None  # always computed
            if len(lengths) > 1:  # each edge's
                at = {table_id: index for index, table_id in enumerate(self._distinct(dim))}
                lengths = lengths[[at[edge.ids[dim]] for edge in self.edges]]
            held = held * lengths
        product = np.zeros((len(held), *qtab.tile_of.shape[:2]), dtype=np.int64)
        product[:, rows, devices] = held
        return product

    def terms(self, ptab: ConfigTable, qtab: ConfigTable) -> tuple[GroupTerms, ...]:
        """The per-dim tables of each group of two dims multiplied into one table."""
        groups = []
        for group in self.active:
            p, q = ptab.groups[group], qtab.groups[group]

            def product(group: int = group, p: GroupStates = p,
                        q: GroupStates = q) -> Parts:
                first, second = (
                    self.along(dim, ("dim terms", group, k, id(ptab), id(qtab)), (ptab, qtab),
                               lambda stack, k=k: _dim_terms(stack, p, q, k))
                    for k, dim in enumerate(_GROUPS[group]))
                # counts of tiles at most the number of devices squared
                return self.product(group, first, second, elements=(0,))

            same, recv, row, sent = self.group(group, ("terms", group, id(ptab), id(qtab)),
                                               (ptab, qtab), product)
            assert same is not None and recv is not None and row is not None and sent is not None
            groups.append(GroupTerms(p_state=p.state, q_state=q.state, p_pair=p.pair,
                                     q_pair=q.pair, same=same, recv=recv, row=row, sent=sent,
                                     which=self.entries(group)[0]))
        return tuple(groups)

    def tier_terms(self, ptab: ConfigTable, qtab: ConfigTable,
                   passes: str = "both") -> tuple[TierTerms, ...]:
        """Per tier of the cluster, the per-dim tables over the runs of tiles its units hold
        (`TierViews`), multiplied into one table per group of two dims. Along one dim a run
        is tiles [low, high) of 2^fine, the range of tile `tile` of 2^coarse; each table is
        computed over the distinct runs and tiles of the dim, then spread over the states.
        `passes`: "forward" builds the forward tables only (over the producer's runs: `ptab`
        needs tier views, `qtab` none), "backward" the backward ones only (the other way),
        "both" all."""
        if passes == "both":
            views = list(zip(ptab.tiers, qtab.tiers, strict=True))
        else:
            views = [(view, None) if passes == "forward" else (None, view)
                     for view in (ptab.tiers if passes == "forward" else qtab.tiers)]
        return tuple(self._tier_terms(ptab, qtab, p_view, q_view) for p_view, q_view in views)

    def _tier_terms(self, ptab: ConfigTable, qtab: ConfigTable, p_view: TierViews | None,
                    q_view: TierViews | None) -> TierTerms:
        """One tier's tables: the forward ones where `p_view` is given, the backward ones
        where `q_view` is."""
        terms = TierTerms(same=[], touch=[], row=[], sent=[])
        ids = (id(ptab), id(qtab), id(p_view), id(q_view))
        holds = (ptab, qtab, p_view, q_view)
        for group in self.active:

            def product(group: int = group) -> Parts:
                first, second = (
                    self.along(dim, ("dim tiers", group, k, *ids), holds,
                               lambda stack, k=k: _tier_dim(stack, ptab, qtab, p_view,
                                                            q_view, group, k))
                    for k, dim in enumerate(_GROUPS[group]))
                return self.product(group, first, second, elements=(0, 2))

            same, touch, row, sent = self.group(group, ("tiers", group, *ids), holds, product)
            if same is not None and touch is not None:
                terms.same.append(same)
                terms.touch.append(touch)
            if row is not None and sent is not None:
                terms.row.append(row)
                terms.sent.append(sent)
        return terms


def _read_or_computed(shared: SharedParts | None, key: tuple[object, ...],
                      holds: Sequence[object], compute: Callable[[], Parts]) -> Parts:
    """`compute`'s arrays, read from and kept in `shared` under `key` where given."""
    known = shared.get(key) if shared is not None else None
    if isinstance(known, tuple):
        return known
    parts = compute()
    if shared is not None:
        shared.put(key, parts, [array for array in parts if array is not None], holds)
    return parts


def _at(part: np.ndarray | None, entries: np.ndarray) -> np.ndarray | None:
    """A dim's stacked `part` at each of a group's `entries` (itself where it has one entry,
    or already one per entry in order)."""
    if part is None or len(part) == 1 or (
            len(part) == len(entries) and np.array_equal(entries, np.arange(len(entries)))):
        return part
    return part.take(entries, axis=0)


def _dim_terms(stack: DimStack, p: GroupStates, q: GroupStates, k: int) -> Parts:
    """`EdgeStack.terms`' tables along the group's dim `k`: elements shared (S, T), producer
    tiles touching (A, T), elements of a producer tile needed and consumer tiles it feeds
    (S, B), each with the stack's leading axis."""
    width = stack.width
    # table row of each producer state (S,), column of each consumer state (T,)
    p_at = p.state_exponents[k] * width + p.state_tiles[k]
    q_at = q.state_exponents[k] * width + q.state_tiles[k]
    pairs = stack.take("pairs", p.dim_tiles[k], axis=0).take(q.dim_tiles[k], axis=2)
    return (_spread(pairs, p.dim_tile_of[k], q.dim_tile_of[k]),
            np.take(stack.take("producers_touching", p.pair_exponents[k], axis=0), q_at,
                    axis=2),
            np.take(stack.take("row_sum", p_at, axis=0), q.pair_exponents[k], axis=2),
            np.take(stack.take("consumers_touching", p_at, axis=0), q.pair_exponents[k],
                    axis=2))


def _tier_dim(stack: DimStack, ptab: ConfigTable, qtab: ConfigTable,
              p_view: TierViews | None, q_view: TierViews | None, group: int, k: int) -> Parts:
    """`EdgeStack._tier_terms`' tables along the group's dim `k`, spread over the states, each
    with the stack's leading axis: forward (elements, messages) where `p_view` is given,
    backward (elements, messages) where `q_view` is, None where not."""
    levels, width = stack.levels, stack.width
    kinds = len(stack.tables)
    p, q = ptab.groups[group], qtab.groups[group]
    held = touched = rows = feeds = None
    if p_view is not None:
        # forward: a producer unit's run against each consumer tile; a run covers the coarse
        # tile's range, so its elements are one overlap
        columns = q.dim_tiles[k]
        _, coarse, tile, low, high = p_view.runs[group][k]
        held = stack.take("pairs", coarse * width + tile, axis=0).take(columns, axis=2)
        # the tiles producer runs count along, at the exponents they are of only
        used, level = p_view.fine[group][k]
        touching = np.take(stack.take("touching", used, axis=0), columns, axis=3)
        below = np.zeros((kinds, len(used), width + 1, len(columns)), dtype=np.int32)
        np.cumsum(touching, axis=2, dtype=np.int32, out=below[:, :, 1:])
        touched = below[:, level, high] - below[:, level, low]
        # spread over the states: rows first (few columns), then columns
        at = (p_view.run_of[group][k], q.dim_tile_of[k])
        held, touched = _spread(held, *at), _spread(touched, *at)
    if q_view is not None:
        # backward: each producer tile against a consumer unit's run
        low, high = q_view.runs[group][k][3:]
        # the consumer tiles its runs count along, at their exponents only
        used, level = q_view.fine[group][k]
        overlap = stack.take("pairs", p.dim_tiles[k], axis=0).reshape(
            kinds, -1, levels, width).take(used, axis=2)
        # a sum along a whole level is at most a row of `row_sum`
        wide = np.int32 if stack.most("row_sum") < _INT32_LIMIT else np.int64
        below = np.zeros((*overlap.shape[:3], width + 1), dtype=wide)
        np.cumsum(overlap, axis=3, dtype=wide, out=below[..., 1:])
        # int32: at most a run of tiles times the dimension
        rows = (below[:, :, level, high] - below[:, :, level, low]).astype(np.int32,
                                                                            copy=False)
        below = np.zeros((*overlap.shape[:3], width + 1), dtype=np.int32)
        np.cumsum(overlap > 0, axis=3, dtype=np.int32, out=below[..., 1:])
        feeds = below[:, :, level, high] - below[:, :, level, low]
        at = (p.dim_tile_of[k], q_view.run_of[group][k])
        rows, feeds = _spread(rows, *at), _spread(feeds, *at)
    return held, touched, rows, feeds


@dataclass(frozen=True)
class TierTerms:
    """An edge's tables over one tier's `TierViews`, per group of two dims: forward, what a
    consumer state gets from a producer unit's run (elements, and producer tiles that send:
    (S, T) from the producer's run states S); backward, what consumer tiles of a consumer
    unit's run need of a producer state (elements, and consumer tiles: (S, T) to the
    consumer's run states T)."""

    same: list[np.ndarray]
    touch: list[np.ndarray]
    row: list[np.ndarray]
    sent: list[np.ndarray]


# ---- t_x: pairs of configs, device by device -------------------------------------------------


@dataclass(frozen=True)
class LinkClass:
    """Seconds per element and latency of one tier's link: what a device pays per element
    and per message it gets from a device in its unit of this tier but not of the one
    before (`Cluster.link_tiers`), through a port `shared_by` devices share."""

    seconds_per_element: float
    latency: float
    shared_by: int = 1


@dataclass(frozen=True)
class TierSide:
    """One side's per-device terms over one tier's unit runs (`TierViews`), per group."""

    # per group: (M, D, configs) run state of each slot and device, as a row offset into the
    # tables (state x columns: producer runs) or a column (consumer runs)
    state: list[np.ndarray]
    elements: list[np.ndarray]  # per group: `TierTerms.same` (forward) or `.row` (backward)
    messages: list[np.ndarray]  # per group: `TierTerms.touch` or `.sent`

    def narrowed(self, mixed: np.ndarray) -> TierSide:
        """The terms of the configs at positions `mixed` among those the tier's runs hold."""
        return TierSide(state=[state[..., mixed] for state in self.state],
                        elements=self.elements, messages=self.messages)


@dataclass(frozen=True)
class ProducerSide:
    """The producer configs' per-device terms, (D, P) and per group: a device's terms of every
    producer config are one contiguous row."""

    state: list[np.ndarray]  # per group: (D, P) state of each device
    same_at: list[np.ndarray]  # per group: (D, P) its row offset into `same` (state x T)
    same: list[np.ndarray]  # per group: (S, T) `GroupTerms.same`
    recv: list[np.ndarray]  # per group: (T, P) producer tiles a consumer state needs
    # the first configs' senders are all in one link class of each device: that class,
    # (D, single); the other configs' by the runs of producer tiles each device's units hold
    classes: np.ndarray
    tiers: list[TierSide]
    sharing: np.ndarray | None  # `ConfigTable.sharing`, in the table's order
    # where the consumer's needs differ by edge (sides of several: `KindLayout`), the edge of
    # each producer config, (P,)
    kind: np.ndarray | None = None

    def narrowed(self, at: np.ndarray) -> ProducerSide:
        """The terms of the producer configs at sorted table positions `at` only (the
        single-class configs stay first)."""
        single, mixed = _split(at, self.classes.shape[1])
        return ProducerSide(
            state=[state[:, at] for state in self.state],
            same_at=[same_at[:, at] for same_at in self.same_at], same=self.same,
            recv=[recv[:, at] for recv in self.recv],
            classes=self.classes[:, single],
            tiers=[tier.narrowed(mixed) for tier in self.tiers],
            sharing=None if self.sharing is None else self.sharing[at],
            kind=None if self.kind is None else self.kind[at])


@dataclass(frozen=True)
class ConsumerSide:
    """The consumer configs' per-device terms, (D, Q) and per group."""

    state: list[np.ndarray]  # per group: (D, Q) state of each device
    row: list[np.ndarray]  # per group: (S, Q) elements of a producer state needed in all
    sent: list[np.ndarray]  # per group: (S, Q) consumer tiles a producer state feeds
    need: np.ndarray  # (D, Q) elements each device's consumer tile needs; (K, D, Q) by edge
    classes: np.ndarray  # (D, single) as `ProducerSide`'s
    tiers: list[TierSide]
    sharing: np.ndarray | None

    def narrowed(self, at: np.ndarray) -> ConsumerSide:
        """The terms of the consumer configs at sorted table positions `at` only."""
        single, mixed = _split(at, self.classes.shape[1])
        return ConsumerSide(
            state=[state[:, at] for state in self.state], row=[row[:, at] for row in self.row],
            sent=[sent[:, at] for sent in self.sent], need=self.need[..., at],
            classes=self.classes[:, single],
            tiers=[tier.narrowed(mixed) for tier in self.tiers],
            sharing=None if self.sharing is None else self.sharing[at])


def _split(at: np.ndarray, single: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted table positions `at` as the single-class configs' (the first `single`
    positions) and the others' positions among the others."""
    cut = int(np.searchsorted(at, single))
    return at[:cut], at[cut:] - single


def _priced(own: np.ndarray, total: np.ndarray, own_messages: np.ndarray,
            all_messages: np.ndarray, tiers: Sequence[tuple[np.ndarray, np.ndarray]],
            links: Sequence[LinkClass], per_element: Sequence[float | np.ndarray]) -> np.ndarray:
    """Seconds of one device's traffic, link class by link class: `own` of `total` elements
    are on the device itself, `tiers[k]` the elements and messages within its unit of tier k
    (its own included, nested, innermost first), the rest crosses the outermost link; each
    class's elements at its `per_element` seconds (`_rates`) plus its messages at its
    latency."""
    held, messages = own, own_messages
    seconds = scratch = None
    for (inside, sending), link, rate in zip([*tiers, (total, all_messages)], links,
                                             per_element, strict=True):
        if seconds is None:
            seconds = np.multiply(np.subtract(inside, held), rate)
            scratch = np.empty_like(seconds)
        else:
            seconds += np.multiply(np.subtract(inside, held), rate, out=scratch)
        seconds += np.multiply(np.subtract(sending, messages), link.latency, out=scratch)
        held, messages = inside, sending
    assert seconds is not None  # one link class at least
    return seconds


def _tier_sums(tier: TierSide, other: Sequence[np.ndarray],
               devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Elements and messages within each device's unit of one tier, summed over its run
    slots. `other`: per group, what the other side's state per device adds to the tier's
    state to index the tables (a column, or a row offset), broadcastable to (configs, K,
    other configs)."""
    inside = sending = None
    for slot in range(tier.state[0].shape[0]):
        elements = messages = None
        for group, (table, counts) in enumerate(zip(tier.elements, tier.messages,
                                                    strict=True)):
            at = np.add(tier.state[group][slot][devices], other[group])
            part = table.ravel().take(at)
            elements = part if elements is None else np.multiply(elements, part, out=elements)
            part = counts.ravel().take(at)
            messages = part if messages is None else np.multiply(messages, part, out=messages)
        assert elements is not None and messages is not None  # two groups at least
        inside = elements if inside is None else np.add(inside, elements, out=inside)
        sending = messages if sending is None else np.add(sending, messages, out=sending)
    assert inside is not None and sending is not None  # one slot at least
    return inside, sending


def _rates(links: Sequence[LinkClass],
           sharing: np.ndarray | None) -> list[float | np.ndarray]:
    """Each link class's seconds per element for the receiving devices of a block; `sharing`
    (block configs, devices, classes) multiplies a shared port's by its receivers, as
    (configs, devices, 1) to broadcast over the other side's configs."""
    if sharing is None:
        return [link.seconds_per_element for link in links]
    return [np.float64(link.seconds_per_element) * sharing[..., k, None]  # in float64
            if link.shared_by > 1 else link.seconds_per_element
            for k, link in enumerate(links)]


def _single_figures(links: Sequence[LinkClass], classes: np.ndarray,
                    sharing: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per element and latency of the single-class configs on a block's receiving
    devices, (configs, devices, single) from each device's class (`classes`), a shared port
    priced as `_rates` does: the class's figures gathered from a table of each link class
    (and, where ports are shared, of each receiving device), one gather each."""
    per_element = np.array([link.seconds_per_element for link in links])
    latency = np.array([link.latency for link in links]).take(classes)
    if sharing is None:
        return per_element.take(classes), latency
    count, tiles, kinds = sharing.shape
    rates = per_element * sharing  # (configs, devices, classes), in float64
    at = np.arange(count * tiles, dtype=np.int64).reshape(count, tiles, 1) * kinds + classes
    return rates.reshape(-1).take(at), latency


def _rows(table: np.ndarray, dtype: type) -> np.ndarray:
    """`table` as `dtype`, row-major: the blocks gather its rows and its flat elements, which a
    column-major table turns into strided reads (backward blocks 4x slower) or a copy per
    call (`ravel`)."""
    return np.ascontiguousarray(table, dtype=dtype)


def _forward_block(producer: ProducerSide, consumer: ConsumerSide, links: Sequence[LinkClass],
                   columns: np.ndarray, devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Forward t_x seconds and elements of consumer configs `columns`, each priced over as many
    devices, x every producer config, as (columns, P), over the devices holding the consumer
    tiles (`devices`: (len(columns), tiles); a bound's, each config's ends): a device without
    a consumer tile needs nothing, so its terms are zero and leave the max and the sum
    unchanged."""
    same = recv = None
    q_states = []
    for group in range(len(producer.state)):
        table = producer.same[group]
        q_state = consumer.state[group][devices, columns[:, None]]  # (C, K)
        q_states.append(q_state[..., None])
        part = table.ravel().take(producer.same_at[group][devices]
                                  + q_state[..., None])  # (C, K, P)
        same = part if same is None else np.multiply(same, part, out=same)
        part = producer.recv[group][q_state]
        recv = part if recv is None else np.multiply(recv, part, out=recv)
    assert same is not None and recv is not None  # two groups at least
    if producer.kind is None:
        need = consumer.need[devices, columns[:, None]][..., None]
    else:  # each producer config's edge's (`KindLayout`)
        need = np.moveaxis(consumer.need[:, devices, columns[:, None]], 0, -1).take(
            producer.kind, axis=-1)
    remote = np.subtract(need, same)
    forward = np.empty((len(columns), same.shape[2]))
    first = producer.classes.shape[1]
    sharing = (None if consumer.sharing is None
               else consumer.sharing[columns[:, None], devices])  # the receivers' ports
    if first:
        rate, latency = _single_figures(links, producer.classes[devices], sharing)
        one = remote[..., :first] * rate
        messages = np.subtract(recv[..., :first], same[..., :first] > 0)
        one += messages * latency
        forward[:, :first] = one.max(axis=1)
    if first < same.shape[2]:
        same, recv = same[..., first:], recv[..., first:]
        tiers = [_tier_sums(tier, q_states, devices) for tier in producer.tiers]
        total = need if need.shape[2] == 1 else need[..., first:]
        forward[:, first:] = _priced(same, total, same > 0, recv, tiers, links,
                                     _rates(links, sharing)).max(axis=1)
    return forward, remote.sum(axis=1, dtype=np.int64)


def _backward_block(producer: ProducerSide, consumer: ConsumerSide, links: Sequence[LinkClass],
                    rows: np.ndarray, devices: np.ndarray) -> np.ndarray:
    """Backward t_x seconds of producer configs `rows`, each priced over as many devices, x
    every consumer config, over the devices holding their producer tiles (`devices`:
    (len(rows), tiles)): elsewhere there is no gradient to send. Per device as `_pairs`
    describes."""
    same = row_sum = sent = None
    p_states = []
    for group in range(len(producer.state)):
        table = producer.same[group]
        p_state = producer.state[group][devices, rows[:, None]]  # (R, K)
        p_states.append(p_state[..., None])
        q_state = consumer.state[group][devices]  # (R, K, Q)
        part = table.ravel().take(p_state[..., None] * table.shape[1] + q_state)
        same = part if same is None else np.multiply(same, part, out=same)
        part = np.take(consumer.row[group], p_state, axis=0)
        row_sum = part if row_sum is None else np.multiply(row_sum, part, out=row_sum)
        part = np.take(consumer.sent[group], p_state, axis=0)
        sent = part if sent is None else np.multiply(sent, part, out=sent)
    assert same is not None and row_sum is not None and sent is not None  # two groups at least
    back = np.empty((len(rows), same.shape[2]))
    first = consumer.classes.shape[1]
    sharing = (None if producer.sharing is None
               else producer.sharing[rows[:, None], devices])  # the receivers' ports
    if first:
        rate, latency = _single_figures(links, consumer.classes[devices], sharing)
        one = np.subtract(row_sum[..., :first], same[..., :first]) * rate
        messages = np.subtract(sent[..., :first], same[..., :first] > 0)
        one += messages * latency
        back[:, :first] = one.max(axis=1)
    if first < same.shape[2]:
        same, row_sum, sent = same[..., first:], row_sum[..., first:], sent[..., first:]
        tiers = [_tier_sums(tier, [state * table.shape[1] for state, table in zip(
            p_states, tier.elements, strict=True)], devices) for tier in consumer.tiers]
        back[:, first:] = _priced(same, row_sum, same > 0, sent, tiers, links,
                                  _rates(links, sharing)).max(axis=1)
    return back


@dataclass(frozen=True)
class EdgeSides:
    """One edge's per-device terms of a producer and a consumer list of configs, in their
    config tables' order (`porder`, `qorder`: the list index at each table position)."""

    producer: ProducerSide
    consumer: ConsumerSide
    ptab: ConfigTable
    qtab: ConfigTable
    porder: np.ndarray
    qorder: np.ndarray
    backward: bool  # the producer is not the network input: gradients flow back
    # the producer configs by size (`ConfigTable.by_size` of its axis: `KindLayout.by_size`)
    p_by_size: list[tuple[np.ndarray, np.ndarray]]

    @property
    def nbytes(self) -> int:
        """The memory of the sides' own arrays (the config tables are shared): each side's
        arrays, lists of arrays, and its tiers' arrays."""
        arrays = []
        for side in (self.producer, self.consumer):
            for value in vars(side).values():
                if isinstance(value, np.ndarray):
                    arrays.append(value)
                elif isinstance(value, list):
                    for item in value:  # arrays per group, or TierSides
                        arrays.extend([item] if isinstance(item, np.ndarray) else [
                            *item.state, *item.elements, *item.messages])
        return sum(array.nbytes for array in arrays)

    @cached_property
    def p_position(self) -> np.ndarray:
        """The table position of each producer config of the list."""
        return np.argsort(self.porder)

    @cached_property
    def q_position(self) -> np.ndarray:
        """The table position of each consumer config of the list."""
        return np.argsort(self.qorder)


class SharedParts:
    """Parts of an edge's tables kept for the other edges that share them, keyed by what
    they are computed from, while their bytes fit in `budget` (each value holds the objects
    its key names by id, so that no such id is reused while it lives)."""

    def __init__(self, budget: int) -> None:
        self._values: dict[tuple[object, ...], tuple[object, ...]] = {}
        self._bytes = 0
        self._budget = budget

    def get(self, key: tuple[object, ...]) -> object | None:
        """The value kept under `key`, or None."""
        value = self._values.get(key)
        return None if value is None else value[0]

    def put(self, key: tuple[object, ...], value: object, arrays: Sequence[np.ndarray],
              holds: Sequence[object] = ()) -> None:
        """Keep `value` (whose bytes are `arrays`') where it fits."""
        size = sum(array.nbytes for array in arrays)
        if self._bytes + size <= self._budget:
            self._values[key] = (value, *holds)
            self._bytes += size

    def clear(self) -> None:
        self._values.clear()
        self._bytes = 0


@dataclass(frozen=True)
class EndsBetween:
    """What the degree bounds read of one list of configs' ends (`EndRows`) against another
    list's degrees, the same for every edge between them: the gathers through the degrees
    and through each inner tier's windows (`grouped_index`), and the bare levels
    (`bare_levels`)."""

    index: tuple[np.ndarray, ...]
    window_index: tuple[tuple[np.ndarray, ...], ...]
    bare: np.ndarray


class KeptRequest(NamedTuple):
    """The arguments of one `TransferTables.kept`, in its order: an edge, its two whole search
    spaces and their names, and the positions of the configs kept of each."""

    producer: Layer
    consumer: Layer
    producer_configs: Sequence[ParallelConfig]
    consumer_configs: Sequence[ParallelConfig]
    spaces: tuple[Hashable, Hashable]
    producer_kept: np.ndarray
    consumer_kept: np.ndarray


def _flat(table: np.ndarray) -> np.ndarray:
    """A stacked table (K, S, T) as (K * S, T): each edge's rows after the one before."""
    return table.reshape(table.shape[0] * table.shape[1], table.shape[2])


class KindLayout:
    """Where the producer configs of `kinds` edges sit on one set of sides' producer axis
    (`TransferTables._sides`): the configs whose senders are all in one link class of each
    device first, edge after edge, then the others likewise, so that the first stay first
    (`ProducerSide`). For one edge, the config table's own order: nothing is moved."""

    def __init__(self, kinds: int, single: int, configs: int) -> None:
        self.kinds, self.single, self.count = kinds, single, configs
        every = np.arange(kinds)
        self.kind = np.concatenate([np.repeat(every, single),
                                    np.repeat(every, configs - single)])
        self.position = np.concatenate([np.tile(np.arange(single), kinds),
                                        np.tile(np.arange(single, configs), kinds)])

    def states(self, state: np.ndarray, table: np.ndarray, which: np.ndarray,
               mixed: bool = False) -> np.ndarray:
        """Per-config `state` (configs first; `mixed`: of the configs after the single-class
        ones) at each position, offset into its edge's entry (`which`) of `table` (E, S,
        T)."""
        if self.kinds == 1:
            return state
        cut = self.kinds * self.single if mixed else 0
        kind, position = self.kind[cut:], self.position[cut:] - (self.single if mixed else 0)
        gathered = state[position]
        if len(table) > 1:
            gathered += (which[kind] * table.shape[1]).reshape(-1, *[1] * (state.ndim - 1))
        return gathered

    def rows(self, table: np.ndarray, row: np.ndarray, which: np.ndarray) -> np.ndarray:
        """Row `row[config]` of each position's edge's entry (`which`) of `table` (E, A,
        T)."""
        if self.kinds == 1:
            return table[0][row]
        offset = which[self.kind] * table.shape[1] if len(table) > 1 else 0
        return _flat(table)[offset + row[self.position]]

    def configs(self, per_config: np.ndarray) -> np.ndarray:
        """A per-config array (configs first) at each position."""
        return per_config if self.kinds == 1 else per_config[self.position]

    def order(self, order: np.ndarray) -> np.ndarray:
        """Each position's index into the edges' lists of configs one after another (the
        list index at each config table position: `order`)."""
        return order if self.kinds == 1 else self.kind * self.count + order[self.position]

    def by_size(self, by_size: list[tuple[np.ndarray, np.ndarray]],
                ) -> list[tuple[np.ndarray, np.ndarray]]:
        """`ConfigTable.by_size` over the positions: each size's configs of every edge."""
        if self.kinds == 1:
            return by_size
        at = np.empty((self.kinds, self.count), dtype=np.int64)
        at[self.kind, self.position] = np.arange(len(self.kind))
        return [(at[:, positions].ravel(), np.tile(devices, (self.kinds, 1)))
                for positions, devices in by_size]


class _KindAsked(NamedTuple):
    """One kind of edge in `TransferTables.kept_many`: its sides' key, its per-dim tables, its
    edges' distinct requests (by the configs they ask), every config they ask of each space
    (`rows`, `columns`) and those its sides are built over (`p_built`, `q_built`), as sorted
    indices into the spaces."""

    sides_key: tuple[object, ...]
    edge: EdgeDims
    distinct: dict[tuple[bytes, bytes], KeptRequest]
    rows: np.ndarray
    columns: np.ndarray
    p_built: np.ndarray
    q_built: np.ndarray

    @property
    def first(self) -> KeptRequest:
        """One of its requests (they share layers' kinds and search spaces)."""
        return next(iter(self.distinct.values()))

    def built(self) -> tuple[list[ParallelConfig], list[ParallelConfig]]:
        """The producer and consumer configs its sides are built over."""
        first = self.first
        return ([first.producer_configs[index] for index in self.p_built],
                [first.consumer_configs[index] for index in self.q_built])


def _alone_plan(kind: _KindAsked) -> str:
    """How `TransferTables._kind_alone` prices a kind: "built", every pair of the configs its
    sides are built over where those are fewer pairs than its edges ask for; "asked", every
    pair of the configs its edges ask for where those are at most twice the pairs they ask;
    else "each", each edge's own pairs."""
    asked = sum(len(r.producer_kept) * len(r.consumer_kept) for r in kind.distinct.values())
    if len(kind.p_built) * len(kind.q_built) <= asked:
        return "built"
    if len(kind.distinct) > 1 and len(kind.rows) * len(kind.columns) <= 2 * asked:
        return "asked"
    return "each"


class TransferTables:
    """t_x of every pair of producer and consumer configs of an edge, on `devices` devices of
    `cluster`; the tables it builds are shared by every edge and config list that can."""

    def __init__(self, cluster: Cluster, devices: int) -> None:
        self.cluster = cluster
        self.devices = devices
        self._levels = devices.bit_length()  # power-of-two degrees 2^0 .. 2^(levels-1)
        # the tiers whose units split these devices, and a link class per tier up to the
        # first whose unit holds them all; bytes per element folded into the seconds per
        # byte (a power of two: exact)
        self._units: list[int] = []
        self._links: list[LinkClass] = []
        for size, link in cluster.link_tiers():
            self._links.append(LinkClass(
                seconds_per_element=1.0 / link.bandwidth * BYTES_PER_ELEMENT,
                latency=link.latency, shared_by=link.shared_by))
            if size >= devices:
                break
            self._units.append(size)
        if not self._links:  # a cluster of one device: nothing ever moves
            self._links.append(LinkClass(seconds_per_element=0.0, latency=0.0))
        # shifting every device by a multiple of this (cyclically) keeps which unit of every
        # tier each device is in, and behind which shared port: t_x is unchanged
        self._symmetry = math.lcm(1, *self._units, *(link.shared_by for link in self._links))
        # by the configs' identities and `ends_only`; each entry holds its configs, so that
        # no id it is keyed by can be reused while it lives
        self._config_tables: dict[tuple[object, ...], tuple[Sequence[ParallelConfig],
                                                            np.ndarray, ConfigTable]] = {}
        # what edges share: the degree bounds' (`_ends_between`, `_products`), the sides'
        self._bound_parts = SharedParts(_SHARED_PARTS_BYTES)
        self._side_parts = SharedParts(_SHARED_PARTS_BYTES)
        self._end_row_lists: dict[tuple[int, ...], tuple[Sequence[ParallelConfig],
                                                         EndRows]] = {}
        # `_shifted` per pair of those tables (kept alive there) and group of configs
        self._shift_plans: dict[tuple[int, int, int, int], Shifted | None] = {}
        self._classes: dict[tuple[int, ...], np.ndarray] = {}
        self._needed: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._geometries: dict[tuple[object, ...], int] = {}  # equal layer geometries, one id
        self._geometry_ids: dict[str, int] = {}  # by layer name
        self._dim_tables: dict[tuple[int, bytes, bytes], tuple[int, DimTable]] = {}
        self._edges: dict[tuple[str, str], EdgeDims] = {}  # by producer and consumer name
        self._dim_keys: dict[tuple[str, str, int], tuple[int, bytes, bytes]] = {}
        self._space_ids: dict[Hashable, int] = {}
        self._space_contents: dict[tuple[object, ...], int] = {}
        self._matrices: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray | None]] = {}
        # whole search spaces' sides, kept from their bounds to their kept pairs (`kept`)
        self._bounded_sides: dict[tuple[object, ...], EdgeSides] = {}
        self._kept: dict[tuple[object, ...], np.ndarray] = {}
        # per kind of edge, each matrix `kept` and `kept_many` priced and the configs of its
        # rows and columns, until `forget_sides`: later requests within them read from it
        self._priced_within: dict[tuple[object, ...],
                                  list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self._kept_bytes = 0  # of `_bounded_sides`
        # per-device terms of config pairs computed so far (a pair's forward over its
        # consumer's devices, its backward over its producer's; a bound's over their end
        # devices): the search's work, counted the same on every machine (bench_search
        # prints it; the suite bounds it)
        self.terms_priced = 0

    @property
    def symmetry(self) -> int:
        """Shifting every device by a multiple of this keeps which unit of every tier each
        device is in and behind which shared port: every link between two devices."""
        return self._symmetry

    def matrices(self, producer: Layer, consumer: Layer,
                 producer_configs: Sequence[ParallelConfig],
                 consumer_configs: Sequence[ParallelConfig],
                 spaces: tuple[Hashable, Hashable] | None = None,
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, bytes) of t_x for every pair of producer and consumer configs.

        `spaces` says that the configs are the two layers' whole search spaces and names them
        (equal names, equal lists): edges whose four per-dimension tables and two search spaces
        are equal have equal matrices, which are then computed once (repeated blocks, and
        branches that read one tensor through layers of the same geometry).
        """
        seconds, moved = self._cached(producer, consumer, producer_configs, consumer_configs,
                                      spaces, ends_only=False)
        assert moved is not None  # counted for every exact matrix
        return seconds, moved

    def lower_bounds(self, producer: Layer, consumer: Layer,
                     producer_configs: Sequence[ParallelConfig],
                     consumer_configs: Sequence[ParallelConfig],
                     spaces: tuple[Hashable, Hashable] | None = None) -> np.ndarray:
        """A lower bound of t_x's seconds for every pair, at a fraction of its work: each pass's
        slowest device sought among each config's first and last devices only (`_ends`), a
        maximum over fewer devices. `spaces` as for `matrices`."""
        return self._cached(producer, consumer, producer_configs, consumer_configs, spaces,
                            ends_only=True)[0]

    def lower_bounds_many(self, requests: Sequence[KeptRequest]) -> list[np.ndarray]:
        """`lower_bounds` of many edges between the configs each asks for (`KeptRequest`: the
        positions kept of each whole space), in order, bit for bit its entries: the per-device
        terms built once per kind of edge (equal sides), narrowed to each edge's configs,
        whose pairs only are priced. Below _ENDS_TABLES_FROM_DEVICES those of the whole spaces
        (kept for the exact pass), from there each pass's own over the configs asked
        (`_built_over`)."""
        unions = _asked_unions(requests)
        groups: dict[tuple[object, ...], list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(self._sides_key(request.producer, request.consumer,
                                              request.producer_configs,
                                              request.consumer_configs, request.spaces),
                              []).append(index)
        bounds: dict[int, np.ndarray] = {}  # by request
        for members in groups.values():
            first = requests[members[0]]
            asked = {(requests[index].producer_kept.tobytes(),
                      requests[index].consumer_kept.tobytes()): requests[index]
                     for index in members}
            pairs = sum(len(r.producer_kept) * len(r.consumer_kept) for r in asked.values())
            if pairs > _NARROWED_SHARE * len(first.producer_configs) * len(
                    first.consumer_configs):  # the whole matrix, its pairs copied by shifts
                whole = self.lower_bounds(first.producer, first.consumer,
                                          first.producer_configs, first.consumer_configs,
                                          first.spaces)
                of_group = {key: whole[np.ix_(r.producer_kept, r.consumer_kept)]
                            for key, r in asked.items()}
            elif self.devices < _ENDS_TABLES_FROM_DEVICES:
                sides = self._whole_sides(first.producer, first.consumer, first.producer_configs,
                                          first.consumer_configs, first.spaces)
                backward = sides if first.producer.kind != "input" else None
                of_group = {key: self._ends_of_some(sides, backward, r.producer_kept,
                                                    r.consumer_kept)
                            for key, r in asked.items()}
            else:
                _, _, p_built, q_built = self._kind_configs(list(asked.values()), unions)
                dims = self._edge_dims(first.producer, first.consumer)
                configs = ([first.producer_configs[index] for index in p_built],
                           [first.consumer_configs[index] for index in q_built])
                backward = first.producer.kind != "input"
                forward_sides = self._sides([dims], *configs, backward, "forward")
                backward_sides = (self._sides([dims], *configs, backward, "backward")
                                  if backward else None)
                of_group = {key: self._ends_of_some(
                    forward_sides, backward_sides, np.searchsorted(p_built, r.producer_kept),
                    np.searchsorted(q_built, r.consumer_kept)) for key, r in asked.items()}
            for index in members:
                bounds[index] = of_group[(requests[index].producer_kept.tobytes(),
                                          requests[index].consumer_kept.tobytes())]
        return [bounds[index] for index in range(len(requests))]

    def kinds(self, requests: Sequence[KeptRequest]) -> int:
        """How many kinds of edge `requests` ask for: equal kinds share one build of sides."""
        return len({self._sides_key(request.producer, request.consumer,
                                    request.producer_configs, request.consumer_configs,
                                    request.spaces) for request in requests})

    def degree_bounds(self, producer: Layer, consumer: Layer,
                      producer_configs: Sequence[ParallelConfig],
                      consumer_configs: Sequence[ParallelConfig],
                      spaces: tuple[Hashable, Hashable]) -> np.ndarray:
        """A lower bound of `lower_bounds` from each side's degrees and the other side's
        config (degree_bounds.py), per pair of classes (`degree_classes`: configs of equal
        degrees and equal seconds per element at their ends), (producer classes, consumer
        classes): every pair of configs of those classes has that bound. A small share of
        `lower_bounds`' work; equal edges computed once."""
        key = (*self._sides_key(producer, consumer, producer_configs, consumer_configs,
                                spaces), "degrees")
        if key not in self._matrices:
            self._matrices[key] = (self._degree_bounds(producer, consumer, producer_configs,
                                                       consumer_configs), None)
        return self._matrices[key][0]

    def degree_classes(self, configs: Sequence[ParallelConfig]) -> np.ndarray:
        """(C,) the class of each config for `degree_bounds` (its rows and columns)."""
        return self._end_rows(configs).row

    def _degree_bounds(self, producer: Layer, consumer: Layer,
                       producer_configs: Sequence[ParallelConfig],
                       consumer_configs: Sequence[ParallelConfig]) -> np.ndarray:
        edge = self._edge_dims(producer, consumer)
        dims = edge.dims
        p_rows, q_rows = self._end_rows(producer_configs), self._end_rows(consumer_configs)
        latency = [link.latency for link in self._links]
        # forward, at each consumer class's ends against each producer degrees
        need = np.ones((len(q_rows.exponents), 2, 1), dtype=np.int64)
        for dim, table in enumerate(dims):
            need *= table.need_len.reshape(-1)[q_rows.end_tiles[..., dim]][..., None]
        need = need.astype(np.float64)  # as `group_product` gives them
        between = self._ends_between(q_rows, p_rows)
        largest = self._products(edge, "largest_per_consumer_tile", True, q_rows.ends,
                                 p_rows.degrees, between.index)
        touching = self._products(edge, "producers_touching", True, q_rows.ends,
                                  p_rows.degrees, between.index)
        windows = [self._products(edge, "forward_windows", False, q_rows.ends, codes,
                                  index) * scale
                   for codes, index, scale in zip(p_rows.windows, between.window_index,
                                                  p_rows.window_scale, strict=True)]
        at = q_rows.rows_of_degrees
        forward = end_seconds(q_rows.row_rates, latency, self._units, at(need), at(largest),
                              at(touching), [at(window) for window in windows], between.bare,
                              )  # (consumer classes, producer degrees)
        seconds = p_rows.rows_of_degrees(forward.T)  # (producer classes, consumer classes)
        if producer.kind == "input":  # no gradient flows back into the input
            return np.ascontiguousarray(seconds)
        # backward, at each producer class's ends against each consumer degrees
        between = self._ends_between(p_rows, q_rows)
        total, largest, touching = (
            self._products(edge, name, False, p_rows.ends, q_rows.degrees, between.index)
            for name in ("row_sum", "largest_per_producer_tile", "consumers_touching"))
        windows = [self._products(edge, "backward_windows", False, p_rows.ends, codes,
                                  index) * scale
                   for codes, index, scale in zip(q_rows.windows, between.window_index,
                                                  q_rows.window_scale, strict=True)]
        at = p_rows.rows_of_degrees
        backward = end_seconds(p_rows.row_rates, latency, self._units, at(total), at(largest),
                               at(touching), [at(window) for window in windows], between.bare,
                               )  # (producer classes, consumer degrees)
        return np.ascontiguousarray(seconds + q_rows.rows_of_degrees(backward.T).T)

    def _products(self, edge: EdgeDims, name: str, transposed: bool, ends: GroupedAt,
                  other: GroupedAt, index: tuple[np.ndarray, ...]) -> np.ndarray:
        """(G_e, 2, G_o): the product over dims of the edge's per-dim tables `name` (each
        `transposed` or not) at `ends` against `other`, group by group (`group_product`); the
        factor of the groups without the channel dim kept per their tables while it fits
        (_SHARED_PARTS_BYTES): the edges between two search spaces differ mostly in their
        channel tables (a concatenation's inputs, each block's widths) while the spatial ones
        recur (Inception-v3's 63 kinds on 16 devices: 22 pairs of height and width tables)."""
        def factor(group: int) -> np.ndarray:
            first, second = (getattr(edge.dims[dim], name) for dim in ends.dims[group])
            return group_product(first.T if transposed else first,
                                 second.T if transposed else second, ends, other, index, group)

        channel = [group for group, dims in enumerate(ends.dims) if _CHANNEL in dims]
        rest = [group for group in range(len(ends.dims)) if group not in channel]
        # the other groups' factors multiplied once: element counts, exact in float64 in any
        # order (each product is at most a tensor's elements)
        key = (name, transposed, *(edge.ids[dim] for group in rest for dim in ends.dims[group]),
               id(ends), id(other))
        known = self._bound_parts.get(key)
        if not isinstance(known, np.ndarray) and rest:
            known = factor(rest[0])
            for group in rest[1:]:
                known = known * factor(group)
            self._bound_parts.put(key, known, [known], (ends, other))
        product = None
        for group in channel:  # a fresh array, this product's own
            product = factor(group) if product is None else np.multiply(
                product, factor(group), out=product)
        if not isinstance(known, np.ndarray):
            assert product is not None  # one group at least
            return product
        return known.copy() if product is None else np.multiply(product, known, out=product)

    def _ends_between(self, rows: EndRows, other: EndRows) -> EndsBetween:
        """What the degree bounds read at the ends of `rows` against the degrees of `other`,
        once per pair of lists (the edges between two search spaces share it: Inception-v3's
        63 kinds on 16 devices span 4 pairs), kept while it fits."""
        key = ("between", id(rows), id(other))
        known = self._bound_parts.get(key)
        if isinstance(known, EndsBetween):
            return known
        between = EndsBetween(
            index=grouped_index(rows.ends, other.degrees),
            window_index=tuple(grouped_index(rows.ends, codes) for codes in other.windows),
            bare=bare_levels(rows, other, self._units))
        self._bound_parts.put(key, between, [*between.index, *itertools.chain.from_iterable(
            between.window_index), between.bare], (rows, other))
        return between

    def _end_rows(self, configs: Sequence[ParallelConfig]) -> EndRows:
        """`end_rows` of a list of configs, cached as `_config_table` is."""
        key = tuple(map(id, configs))
        if key not in self._end_row_lists:
            member = np.zeros((len(configs), self.devices), dtype=bool)
            member[_config_devices(configs, np.array([config.size for config in configs]))] = True
            shared_by = [link.shared_by for link in self._links]
            shared = [size > 1 for size in shared_by]
            self._end_row_lists[key] = (list(configs), end_rows(
                configs, _TABLE_DIMS, [link.seconds_per_element for link in self._links],
                _sharing(member, shared_by) if any(shared) else None, shared,
                (1 << (self._levels - 1)) + 1, _GROUPS, self._units))
        return self._end_row_lists[key][1]

    def kept(self, producer: Layer, consumer: Layer,
             producer_configs: Sequence[ParallelConfig],
             consumer_configs: Sequence[ParallelConfig], spaces: tuple[Hashable, Hashable],
             producer_kept: np.ndarray, consumer_kept: np.ndarray) -> np.ndarray:
        """Seconds of t_x between the configs at `producer_kept` and `consumer_kept` of the
        two whole search spaces `spaces` names, bit for bit their entries in `matrices`: from
        the per-device terms `lower_bounds` built for those spaces, so that the search's exact
        pass builds none again. Equal edges with equal kept configs are priced once."""
        key = (*self._sides_key(producer, consumer, producer_configs, consumer_configs,
                                spaces), producer_kept.tobytes(), consumer_kept.tobytes())
        if key not in self._kept:
            sides_key = key[:-2]
            if sides_key in self._bounded_sides:
                self._kept[key] = self._some_pairs(self._bounded_sides[sides_key],
                                                   producer_kept, consumer_kept)
            else:  # not kept (over the budget): the kept configs' own sides
                self._kept[key] = self._pairs(self._sides_of(
                    producer, consumer, [producer_configs[i] for i in producer_kept],
                    [consumer_configs[i] for i in consumer_kept]))[0]
            self._priced_within.setdefault(sides_key, []).append(
                (producer_kept, consumer_kept, self._kept[key]))
        return self._kept[key]

    def kept_many(self, requests: Sequence[KeptRequest]) -> list[np.ndarray]:
        """`kept` of many edges at once, in order. Each kind of edge (equal sides: a network's
        repeated blocks, ResNet-152's 30 kinds for its 259 edges) gets one build of its sides,
        over the configs `_built_over` picks, and kinds built over the same two lists of
        configs share one (`_batch`). A kind alone: where every pair of the configs built is
        fewer pairs than its edges ask for, all are priced at once (`_pairs`, shifts copied);
        else, where the pairs of the configs its edges ask for are at most twice the pairs
        they ask, those are priced in one pass; else each edge's own pairs (`_some_pairs`).
        Each edge's entries are read from them: bit for bit `kept`'s."""
        groups: dict[tuple[object, ...], list[tuple[bytes, bytes, KeptRequest]]] = {}
        for request in requests:
            sides_key = self._sides_key(request.producer, request.consumer,
                                        request.producer_configs, request.consumer_configs,
                                        request.spaces)
            asked = (request.producer_kept.tobytes(), request.consumer_kept.tobytes())
            if (*sides_key, *asked) in self._kept:
                continue
            held = self._held_within(sides_key, request.producer_kept, request.consumer_kept)
            if held is not None:
                self._kept[(*sides_key, *asked)] = held
            elif sides_key not in self._bounded_sides:  # else `kept` reads the bound's sides
                groups.setdefault(sides_key, []).append((*asked, request))
        unions = _asked_unions([request for asking in groups.values()
                                for _, _, request in asking])
        batches: dict[tuple[object, ...], list[_KindAsked]] = {}
        for sides_key, asking in groups.items():
            distinct = {(p_asked, q_asked): request for p_asked, q_asked, request in asking}
            first = asking[0][2]
            kind = _KindAsked(sides_key, self._edge_dims(first.producer, first.consumer),
                              distinct, *self._kind_configs(list(distinct.values()), unions))
            batches.setdefault((*sides_key[1:], kind.p_built.tobytes(), kind.q_built.tobytes(),
                                kind.edge.active), []).append(kind)
        for batch in batches.values():
            if len(batch) > 1 and self._batch_pays(batch):
                self._batch(batch)
            else:
                for kind in batch:
                    self._kind_alone(kind)
        return [self.kept(*request) for request in requests]

    def _batch_pays(self, batch: Sequence[_KindAsked]) -> bool:
        """Whether pricing a batch of kinds together (`_batch`) costs less than each alone:
        where its stacked tables hold at most _BATCH_ENTRIES entries each, and the terms its
        union of columns adds are fewer than _KIND_TERMS per kind it saves building and
        passing alone."""
        first = batch[0].first
        pconfs, qconfs = batch[0].built()
        _, ptab = self._config_table(pconfs)  # as `_sides` builds them, kept for it
        _, qtab = self._config_table(qconfs)
        for group in batch[0].edge.active:
            d0, d1 = _GROUPS[group]
            entries = len({(kind.edge.ids[d0], kind.edge.ids[d1]) for kind in batch})
            if entries * ptab.groups[group].state_exponents.shape[1] * qtab.groups[
                    group].state_exponents.shape[1] > _BATCH_ENTRIES:
                return False
        p_sizes = np.array([config.size for config in first.producer_configs])
        q_sizes = np.array([config.size for config in first.consumer_configs])
        backward = first.producer.kind != "input"

        def terms(rows: np.ndarray, columns: np.ndarray) -> int:
            return len(rows) * int(q_sizes[columns].sum()) + (
                len(columns) * int(p_sizes[rows].sum()) if backward else 0)

        columns = np.unique(np.concatenate([kind.columns for kind in batch]))
        together = sum(terms(kind.rows, columns) for kind in batch)
        alone = 0
        for kind in batch:
            plan = _alone_plan(kind)
            alone += (terms(kind.p_built, kind.q_built) if plan == "built"
                      else terms(kind.rows, kind.columns) if plan == "asked" else
                      sum(terms(request.producer_kept, request.consumer_kept)
                          for request in kind.distinct.values()))
        return together - alone <= (len(batch) - 1) * _KIND_TERMS

    def _kind_alone(self, kind: _KindAsked) -> None:
        """`kept_many`'s pricing of one kind's edges built alone (`_alone_plan`)."""
        p_built, q_built = kind.p_built, kind.q_built
        rows, columns = kind.rows, kind.columns
        sides = self._sides([kind.edge], *kind.built(), kind.first.producer.kind != "input")
        plan = _alone_plan(kind)
        if plan == "built":
            rows, columns = p_built, q_built
            union = self._pairs(sides)[0]
        elif plan == "asked":
            union = self._some_pairs(sides, np.searchsorted(p_built, rows),
                                     np.searchsorted(q_built, columns))
        else:
            union = None
        if union is not None:
            self._read_from(kind, rows, columns, union)
            return
        for (p_asked, q_asked), request in kind.distinct.items():
            key = (*kind.sides_key, p_asked, q_asked)
            if key not in self._kept:  # else another edge asked for the same configs
                self._kept[key] = self._some_pairs(
                    sides, np.searchsorted(p_built, request.producer_kept),
                    np.searchsorted(q_built, request.consumer_kept))
                self._priced_within.setdefault(kind.sides_key, []).append(
                    (request.producer_kept, request.consumer_kept, self._kept[key]))

    def _batch(self, batch: Sequence[_KindAsked]) -> None:
        """`kept_many`'s pricing of kinds whose sides are built over the same two lists of
        configs: one build of all their sides (`_sides` of several edges) and one pass over
        each kind's rows asked x the columns any of them asks, bit for bit each kind's own
        (Inception-v3's upper bound on 16 devices of h200x8: its batch of 41 kinds 40 -> 22
        ms, of 16 kinds 17 -> 8 ms)."""
        p_built, q_built = batch[0].p_built, batch[0].q_built
        sides = self._sides([kind.edge for kind in batch], *batch[0].built(),
                            batch[0].first.producer.kind != "input")
        columns = np.unique(np.concatenate([kind.columns for kind in batch]))
        matrix = self._some_pairs(
            sides, np.concatenate([index * len(p_built) + np.searchsorted(p_built, kind.rows)
                                   for index, kind in enumerate(batch)]),
            np.searchsorted(q_built, columns))
        start = 0
        for kind in batch:
            self._read_from(kind, kind.rows, columns, matrix[start:start + len(kind.rows)])
            start += len(kind.rows)

    def _read_from(self, kind: _KindAsked, rows: np.ndarray, columns: np.ndarray,
                   union: np.ndarray) -> None:
        """Each of a kind's edges' entries read from `union` (t_x between the configs at
        sorted `rows` and `columns` of its two spaces), which later requests may read too."""
        self._priced_within.setdefault(kind.sides_key, []).append((rows, columns, union))
        for (p_asked, q_asked), request in kind.distinct.items():
            key = (*kind.sides_key, p_asked, q_asked)
            if key not in self._kept:  # else another edge asked for the same configs
                self._kept[key] = union[np.ix_(np.searchsorted(rows, request.producer_kept),
                                               np.searchsorted(columns, request.consumer_kept))]

    def _held_within(self, sides_key: tuple[object, ...], producer_kept: np.ndarray,
                     consumer_kept: np.ndarray) -> np.ndarray | None:
        """t_x between `producer_kept` and `consumer_kept` read from a matrix `kept_many`
        priced for the same kind of edge over configs that hold them both (the search's exact
        pass mostly keeps configs among the upper bound's candidates: ResNet-50 on 16 devices
        85 of its 89 edges), or None where none does. Each match is checked config by config
        (a matrix's configs are sorted where a union was priced; an edge's own, as asked)."""
        for rows, columns, matrix in self._priced_within.get(sides_key, ()):
            at_rows = np.searchsorted(rows, producer_kept)
            at_columns = np.searchsorted(columns, consumer_kept)
            if (np.all(at_rows < len(rows)) and np.all(at_columns < len(columns))
                    and np.array_equal(rows[np.minimum(at_rows, len(rows) - 1)], producer_kept)
                    and np.array_equal(columns[np.minimum(at_columns, len(columns) - 1)],
                                       consumer_kept)):
                return matrix[np.ix_(at_rows, at_columns)]
        return None

    def _kind_configs(self, requests: Sequence[KeptRequest],
                      unions: dict[tuple[int, ...], np.ndarray],
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Of one kind of edge's `requests`: every config they ask of the producer's and of
        the consumer's search space, and the configs of each its sides are built over
        (`_built_over`), as sorted indices into those spaces."""
        first = requests[0]
        rows = np.unique(np.concatenate([request.producer_kept for request in requests]))
        columns = np.unique(np.concatenate([request.consumer_kept for request in requests]))
        return (rows, columns, self._built_over(first.producer_configs, rows, unions),
                self._built_over(first.consumer_configs, columns, unions))

    def _built_over(self, configs: Sequence[ParallelConfig], own: np.ndarray,
                    unions: dict[tuple[int, ...], np.ndarray]) -> np.ndarray:
        """The configs (indices into `configs`, a search space) a kind of edge builds a side
        over: those its own edges ask for (`own`), or all any edge asks of that space
        (`unions`, `_asked_unions`) where the extra configs, times the devices, are at most
        _UNION_CONFIG_DEVICES + _UNION_OWN_DEVICES x its own: config tables are then shared by
        the kinds over that space (on 16 devices a table costs about as much for 20 configs as
        for 160, and layers of one space keep much the same configs; on 64 Inception-v3's ends
        bound built 107 tables of its kinds' own configs), while on 256 devices a side of 200
        configs costs 10x one of 20 (Inception-v3's exact pass 18 -> 29 s over the unions)."""
        whole = unions[tuple(map(id, configs))]
        extra = (len(whole) - len(own)) * self.devices
        return whole if extra <= _UNION_CONFIG_DEVICES + _UNION_OWN_DEVICES * len(own) else own

    def forget_sides(self) -> None:
        """Drop the per-device terms kept for `kept` (the search's exact pass is done)."""
        self._bounded_sides.clear()
        self._bound_parts.clear()
        self._side_parts.clear()
        self._kept.clear()
        self._priced_within.clear()
        self._kept_bytes = 0

    def _sides_key(self, producer: Layer, consumer: Layer,
                   producer_configs: Sequence[ParallelConfig],
                   consumer_configs: Sequence[ParallelConfig],
                   spaces: tuple[Hashable, Hashable]) -> tuple[object, ...]:
        """What an edge's sides over two named spaces depend on: equal keys, equal sides."""
        return (self._edge_dims(producer, consumer).ids,
                self._space_id(spaces[0], producer_configs),
                self._space_id(spaces[1], consumer_configs), producer.kind != "input")

    def _whole_sides(self, producer: Layer, consumer: Layer,
                     producer_configs: Sequence[ParallelConfig],
                     consumer_configs: Sequence[ParallelConfig],
                     spaces: tuple[Hashable, Hashable]) -> EdgeSides:
        """The edge's sides over two whole search spaces, kept for `kept` while all those
        kept stay within _KEPT_SIDES_BYTES (on 16 devices Inception-v3's take 62 MB, on 64
        1.8 GB: there the kept configs' own sides are built again, a fraction of the memory)."""
        key = self._sides_key(producer, consumer, producer_configs, consumer_configs, spaces)
        if key in self._bounded_sides:
            return self._bounded_sides[key]
        sides = self._sides_of(producer, consumer, producer_configs, consumer_configs)
        size = sides.nbytes
        if self._kept_bytes + size <= _KEPT_SIDES_BYTES:
            self._bounded_sides[key] = sides
            self._kept_bytes += size
        return sides

    def _sides_of(self, producer: Layer, consumer: Layer,
                  producer_configs: Sequence[ParallelConfig],
                  consumer_configs: Sequence[ParallelConfig]) -> EdgeSides:
        """The edge's sides over two lists of configs, built anew."""
        return self._sides([self._edge_dims(producer, consumer)], producer_configs,
                           consumer_configs, producer.kind != "input")  # no input gradient

    def _cached(self, producer: Layer, consumer: Layer,
                producer_configs: Sequence[ParallelConfig],
                consumer_configs: Sequence[ParallelConfig],
                spaces: tuple[Hashable, Hashable] | None,
                ends_only: bool) -> tuple[np.ndarray, np.ndarray | None]:
        if spaces is None:
            return self._pairs(self._sides_of(producer, consumer, producer_configs,
                                              consumer_configs), ends_only)
        key = (*self._sides_key(producer, consumer, producer_configs, consumer_configs,
                                spaces), ends_only)
        if key in self._matrices:
            return self._matrices[key]
        if ends_only and self.devices >= _ENDS_TABLES_FROM_DEVICES:
            matrices = self._bounds_from_ends(producer, consumer, producer_configs,
                                              consumer_configs)
        elif ends_only:  # the bound's sides, kept for the exact pass over the kept configs
            matrices = self._pairs(self._whole_sides(producer, consumer, producer_configs,
                                                     consumer_configs, spaces), ends_only=True)
        else:
            matrices = self._pairs(self._sides_of(producer, consumer, producer_configs,
                                                  consumer_configs))
        self._matrices[key] = matrices
        return matrices

    def _bounds_from_ends(self, producer: Layer, consumer: Layer,
                          producer_configs: Sequence[ParallelConfig],
                          consumer_configs: Sequence[ParallelConfig],
                          ) -> tuple[np.ndarray, None]:
        """`_pairs(ends_only=True)` from tables of the ends each pass reads: the forward pass
        over the consumers' ends and the backward over the producers', each side's states
        then a few per exponent pair (`ConfigTable`'s `ends_only`); bit for bit the same
        bounds. Nothing is kept for the exact pass: it builds the kept configs' own sides."""
        dims = self._edge_dims(producer, consumer)
        backward = producer.kind != "input"
        forward = self._sides([dims], producer_configs, consumer_configs, backward, "forward")
        return self._pairs(forward, ends_only=True, backward_sides=self._sides(
            [dims], producer_configs, consumer_configs, backward, "backward")
            if backward else None)

    def _space_id(self, space: Hashable, configs: Sequence[ParallelConfig]) -> int:
        """Equal search spaces (as lists of configs) get equal ids."""
        if space not in self._space_ids:
            content = tuple((config.degrees, config.devices) for config in configs)
            self._space_ids[space] = self._space_contents.setdefault(content,
                                                                     len(self._space_contents))
        return self._space_ids[space]

    def check_memory(self, edges: Sequence[tuple[Layer, Layer]], config_counts: Sequence[int] = (),
                     pairs: int = 0) -> None:
        """MemoryNeedError (one line) before any table is built when the tables of `edges`
        (their per-dimension tables; with `config_counts`, the config tables of those search
        spaces, and `pairs` producer x consumer configs in all) would not fit in memory. The
        per-dimension tables grow as (log2 D x D)^2 on D devices: the search's limit."""
        keys = {self._dim_key(producer, consumer, dim)
                for producer, consumer in edges for dim in range(len(DIMS))}
        per_table = dim_table_bytes(self._levels)
        per_config = _CONFIG_TABLE_BYTES + (  # and `ConfigTable.sharing` where a port is shared
            4 * len(self._links) if any(link.shared_by > 1 for link in self._links) else 0)
        # from _ENDS_TABLES_FROM_DEVICES a search space has an ends-only config table too
        tables = 2 if self.devices >= _ENDS_TABLES_FROM_DEVICES else 1
        needed = (len(keys) * per_table
                  + sum(tables * count * self.devices * per_config for count in config_counts)
                  + pairs * _PAIR_BYTES)
        check_memory(needed, f"the cost model on {self.devices} devices ({len(keys)} "
                             f"per-dimension transfer tables of {human_bytes(per_table)} each)",
                     "plan for fewer devices")

    def _dim_key(self, producer: Layer, consumer: Layer, dim: int) -> tuple[int, bytes, bytes]:
        """What the edge's table along `dim` depends on: equal keys share one table."""
        at = (producer.name, consumer.name, dim)
        if at not in self._dim_keys:
            starts, stops = self._needed_ranges(consumer, consumer.inputs.index(producer.name),
                                                dim)
            self._dim_keys[at] = (as_view(producer.output_shape)[dim], starts.tobytes(),
                                  stops.tobytes())
        return self._dim_keys[at]

    def _edge_dims(self, producer: Layer, consumer: Layer) -> EdgeDims:
        """The edge's per-dimension tables and their ids; equal ranges share one table (each
        edge's looked up once: the search asks for them per pass)."""
        key = (producer.name, consumer.name)
        if key not in self._edges:
            self._edges[key] = self._new_edge_dims(producer, consumer)
        return self._edges[key]

    def _new_edge_dims(self, producer: Layer, consumer: Layer) -> EdgeDims:
        input_index = consumer.inputs.index(producer.name)
        ids, dims = [], []
        for dim, size in enumerate(as_view(producer.output_shape)):
            key = self._dim_key(producer, consumer, dim)
            if key not in self._dim_tables:
                starts, stops = self._needed_ranges(consumer, input_index, dim)
                table = DimTable(size, starts, stops, self._levels)
                self._dim_tables[key] = (len(self._dim_tables), table)
            ident, table = self._dim_tables[key]
            ids.append(ident)
            dims.append(table)
        ident, table = self._padding_table()
        return EdgeDims(ids=(*ids, ident), dims=(*dims, table))

    def _padding_table(self) -> tuple[int, DimTable]:
        """The table along the padding dim: one row that every tile holds and needs."""
        key = (1, b"", b"")
        if key not in self._dim_tables:
            ones = np.ones((1 << self._levels) - 1, dtype=np.int64)  # a range per tile
            self._dim_tables[key] = (len(self._dim_tables),
                                     DimTable(1, np.zeros_like(ones), ones, self._levels))
        return self._dim_tables[key]

    def _needed_ranges(self, consumer: Layer, input_index: int,
                       dim: int) -> tuple[np.ndarray, np.ndarray]:
        """(starts, stops) of the input range each consumer tile needs along `dim`, for every
        power-of-two degree in turn (the order of `DimTable`)."""
        if consumer.name not in self._geometry_ids:  # what needed_range reads of the layer
            geometry = (consumer.kind, consumer.output_shape, consumer.input_shapes,
                        consumer.geometry, consumer.concat_dim, consumer.resize)
            self._geometry_ids[consumer.name] = self._geometries.setdefault(
                geometry, len(self._geometries))
        key = (self._geometry_ids[consumer.name], input_index, dim)
        if key not in self._needed:
            outs = _level_ranges(as_view(consumer.output_shape)[dim], self._levels)
            if passes_through(consumer, input_index, dim):  # 2 of a 2-d layer's 5 dims
                starts, stops = np.array(outs, dtype=np.int64).reshape(-1, 2).T
            else:
                starts, stops = needed_ranges(consumer, input_index, dim, outs)
            empty = stops <= starts  # needs nothing (concat): one form, so tables are shared
            self._needed[key] = (np.where(empty, 0, starts), np.where(empty, 0, stops))
        return self._needed[key]

    def _link_classes(self, block: tuple[int, ...]) -> np.ndarray:
        """(D,) the link class (index into the tiers' links) over which each device talks to
        every other device of `block`, or -1 where they span two classes."""
        if block not in self._classes:
            devices = np.arange(self.devices)[:, None]
            held = np.array(block)[None, :]
            classes = np.zeros((self.devices, len(block)), dtype=np.int64)
            for unit in self._units:  # nested units: the class is how many differ
                classes += devices // unit != held // unit
            other = devices != held
            low = np.where(other, classes, len(self._units)).min(axis=1)
            high = np.where(other, classes, 0).max(axis=1)
            self._classes[block] = np.where(high <= low, low, -1)
        return self._classes[block]

    def _config_table(self, configs: Sequence[ParallelConfig],
                      ends_only: bool = False) -> tuple[np.ndarray, ConfigTable]:
        """The config table of `configs` in its order (those in one link class of each device
        first), and that order (cached: layers share search spaces); `ends_only` as
        `ConfigTable`'s, in the same order."""
        # by identity: a search space's configs are built once (`CostModel`), and its ids
        # hash ~50x faster than each config's degrees and devices (526 lookups of up to 848
        # configs on 64 devices); equal configs built apart only miss the cache
        key = (tuple(map(id, configs)), ends_only)
        if key not in self._config_tables:
            classes = np.array([self._link_classes(config.devices)
                                for config in configs]).reshape(len(configs), self.devices)
            mixed = (classes < 0).any(axis=1)
            order = np.argsort(mixed, kind="stable")
            table = ConfigTable([configs[index] for index in order], self.devices,
                                self._units, classes[order[:len(configs) - mixed.sum()]],
                                [link.shared_by for link in self._links], ends_only)
            self._config_tables[key] = (list(configs), order, table)
        _, order, table = self._config_tables[key]
        return order, table

    def _sides(self, edges: Sequence[EdgeDims], pconfs: Sequence[ParallelConfig],
               qconfs: Sequence[ParallelConfig], backward: bool,
               passes: str = "both") -> EdgeSides:
        """The per-device terms `_pairs` describes, of every producer and consumer config: what
        each block of pairs reads, whichever pairs are priced. `passes` "forward" builds what
        a bound's forward pass reads (the consumers' ends-only table: `ConfigTable`),
        "backward" what its backward pass reads (the producers'); what only the other pass
        reads is then left out (empty lists, zero needs).

        Several `edges` (kinds between the same two lists of configs, `EdgeStack`) are one
        set of sides whose producer axis holds every edge's producer configs (`KindLayout`):
        their tables are stacked, and each producer config's states offset into its edge's
        entries, so that one block prices the pairs of them all (`_some_pairs` only)."""
        (porder, ptab) = self._config_table(pconfs, ends_only=passes == "backward")
        (qorder, qtab) = self._config_table(qconfs, ends_only=passes == "forward")
        stack = EdgeStack(edges, self._side_parts)
        groups = stack.terms(ptab, qtab)
        tiers = stack.tier_terms(ptab, qtab, passes)
        forward, backward_pass = passes != "backward", passes != "forward"
        # (K, Q, D) needed elements of each consumer tile (the forward pass's)
        need = (stack.need(qtab) if forward
                else np.zeros((1, len(qconfs), self.devices), np.int64))
        # element counts in int32 where no product can reach 2^31 (counts of tiles always;
        # a unit's elements are at most all of them)
        bound = max(_bound(groups), int(need.max(initial=0)))
        dtype = np.int32 if bound < _INT32_LIMIT else np.int64
        # counts of tiles: at most the devices per group of dims, and in all
        counts = np.int16 if self.devices <= np.iinfo(np.int16).max else np.int32
        layout = KindLayout(len(edges), len(ptab.single), len(pconfs))
        # producer side as (D, P), consumer side as (D, Q); a table (K, S, T) as (K * S, T)
        producer = ProducerSide(
            state=[np.ascontiguousarray(layout.states(terms.p_state, terms.same,
                                                      terms.which).T)
                   for terms in groups],
            same_at=[np.ascontiguousarray(layout.states(terms.p_state, terms.same,
                                                        terms.which).T * terms.same.shape[2])
                     for terms in groups] if forward else [],
            same=[_rows(_flat(terms.same), dtype) for terms in groups],
            recv=[np.ascontiguousarray(layout.rows(terms.recv, terms.p_pair, terms.which).T
                                       .astype(counts))
                  for terms in groups] if forward else [],
            classes=np.ascontiguousarray(np.tile(ptab.single.T, (1, layout.kinds))),
            sharing=None if ptab.sharing is None else layout.configs(ptab.sharing),
            tiers=[TierSide(
                state=[np.ascontiguousarray(layout.states(view.state[g], same, group.which,
                                                          mixed=True)
                                            .transpose(1, 2, 0) * same.shape[2])
                       for g, same, group in zip(stack.active, terms.same, groups,
                                                 strict=True)],
                elements=[_rows(_flat(same), dtype) for same in terms.same],
                messages=[_rows(_flat(touch), counts) for touch in terms.touch])
                for view, terms in zip(ptab.tiers, tiers, strict=True)]
            if forward else [],
            kind=layout.kind if len(need) > 1 else None,
        )
        consumer = ConsumerSide(
            state=[np.ascontiguousarray(terms.q_state.T) for terms in groups],
            row=[_rows(_flat(terms.row[..., terms.q_pair]), dtype) for terms in groups]
            if backward_pass else [],
            sent=[_rows(_flat(terms.sent[..., terms.q_pair]), counts) for terms in groups]
            if backward_pass else [],
            need=np.ascontiguousarray((need[0] if len(need) == 1 else need).swapaxes(-1, -2)
                                      .astype(dtype)),
            classes=np.ascontiguousarray(qtab.single.T),
            sharing=qtab.sharing,
            tiers=[TierSide(
                state=[np.ascontiguousarray(view.state[g].transpose(1, 2, 0))
                       for g in stack.active],
                elements=[_rows(_flat(row), dtype) for row in terms.row],
                messages=[_rows(_flat(sent), counts) for sent in terms.sent])
                for view, terms in zip(qtab.tiers, tiers, strict=True)]
            if backward_pass else [],
        )
        return EdgeSides(producer=producer, consumer=consumer, ptab=ptab, qtab=qtab,
                         porder=layout.order(porder), qorder=qorder, backward=backward,
                         p_by_size=layout.by_size(ptab.by_size))

    def _forward(self, producer: ProducerSide, consumer: ConsumerSide,
                 groups: Sequence[tuple[np.ndarray, np.ndarray]], out: np.ndarray,
                 moved: np.ndarray | None = None,
                 tables: tuple[ConfigTable, ConfigTable] | None = None) -> None:
        """Forward t_x of the consumer configs in `groups` (positions of one size, and the
        devices to price each over) x every producer config, into those rows of `out` (and
        their elements into `moved`), in chunks of _CHUNK_ELEMENTS (`_direct`: groups priced
        over as many devices in one). With `tables` (the consumers' and the producers' config
        tables, `groups` holding every config of each size) the pairs that a shift maps onto
        pairs already priced are copied from them (`_shifted`)."""
        plans = [None if tables is None else self._shifted(*tables, columns)
                 for columns, _ in groups]
        for columns, devices in _direct(groups, plans):
            self._forward_blocks(producer, consumer, columns, devices, out, moved)
        for (_, devices), shifted in zip(groups, plans, strict=True):
            if shifted is not None and len(shifted.rows):
                if len(shifted.others):
                    self._forward_blocks(producer.narrowed(shifted.others), consumer,
                                         shifted.rows, devices[shifted.moved], out, moved,
                                         shifted.others)
                shifted.copy(out)
                if moved is not None:
                    shifted.copy(moved)

    def _forward_blocks(self, producer: ProducerSide, consumer: ConsumerSide,
                        columns_of_size: np.ndarray, devices: np.ndarray, out: np.ndarray,
                        moved: np.ndarray | None, at: np.ndarray | None = None) -> None:
        """`_forward`'s blocks of consumer configs `columns_of_size` x the producer configs of
        `producer`, which are those at table positions `at` (default: all)."""
        producers = producer.state[0].shape[1]
        step = max(1, _CHUNK_ELEMENTS // (devices.shape[1] * producers))
        self.terms_priced += devices.size * producers
        for start in range(0, len(columns_of_size), step):
            columns = columns_of_size[start:start + step]
            block, block_moved = _forward_block(
                producer, consumer, self._links, columns, devices[start:start + step])
            rows = columns if at is None else (columns[:, None], at)
            out[rows] = block
            if moved is not None:
                moved[rows] = block_moved

    def _backward(self, producer: ProducerSide, consumer: ConsumerSide,
                  groups: Sequence[tuple[np.ndarray, np.ndarray]], out: np.ndarray,
                  tables: tuple[ConfigTable, ConfigTable] | None = None) -> None:
        """Backward t_x of the producer configs in `groups` x every consumer config, into those
        rows of `out`, as `_forward` (`tables`: the producers' and the consumers')."""
        plans = [None if tables is None else self._shifted(*tables, rows)
                 for rows, _ in groups]
        for rows, devices in _direct(groups, plans):
            self._backward_blocks(producer, consumer, rows, devices, out)
        for (_, devices), shifted in zip(groups, plans, strict=True):
            if shifted is not None and len(shifted.rows):
                if len(shifted.others):
                    self._backward_blocks(producer, consumer.narrowed(shifted.others),
                                          shifted.rows, devices[shifted.moved], out,
                                          shifted.others)
                shifted.copy(out)

    def _backward_blocks(self, producer: ProducerSide, consumer: ConsumerSide,
                         rows_of_size: np.ndarray, devices: np.ndarray, out: np.ndarray,
                         at: np.ndarray | None = None) -> None:
        """`_backward`'s blocks, as `_forward_blocks`."""
        consumers = consumer.state[0].shape[1]
        step = max(1, _CHUNK_ELEMENTS // (devices.shape[1] * consumers))
        self.terms_priced += devices.size * consumers
        for start in range(0, len(rows_of_size), step):
            rows = rows_of_size[start:start + step]
            out[rows if at is None else (rows[:, None], at)] = _backward_block(
                producer, consumer, self._links, rows, devices[start:start + step])

    def _shifted(self, own: ConfigTable, other: ConfigTable,
                 positions: np.ndarray) -> Shifted | None:
        """`_shift_plan`, once per pair of config tables and group (edges share them)."""
        key = (id(own), id(other), int(positions[0]), len(positions))
        if key not in self._shift_plans:
            self._shift_plans[key] = self._shift_plan(own, other, positions)
        return self._shift_plans[key]

    def _shift_plan(self, own: ConfigTable, other: ConfigTable,
                    positions: np.ndarray) -> Shifted | None:
        """Which pairs of the configs at `positions` (one size, in `own`) x every config of
        `other` a shift maps onto pairs priced directly.

        Shifting both blocks of a pair by k devices (cyclically) leaves its t_x unchanged, bit
        for bit, where k is a multiple of `_symmetry` and of both sizes (each block stays a
        block of its size, aligned as it was): every device meets the same tiles over the same
        links. With `period` the least such multiple of this size, a config whose block starts
        at s >= period is priced against the configs of `other` whose size divides period by
        copying its partner's (the block at s mod period) row, each of them shifted by
        s - s mod period; only the larger configs of `other` are priced. None where no
        multiple of the size divides the devices."""
        size = int(own.size[positions[0]])
        period = math.lcm(size, self._symmetry)
        if self.devices % period:
            return None
        start = own.start[positions]
        shift = start - start % period
        partner = np.where(start >= period, own.at_start[own.degree_id[positions],
                                                          np.maximum(start - shift, 0)], -1)
        moved = np.flatnonzero(partner >= 0)
        if not len(moved):
            return None
        candidates = np.flatnonzero((other.start >= 0) & (period % other.size == 0))
        source = other.at_start[other.degree_id[candidates][None, :],
                                (other.start[candidates][None, :] - shift[moved, None])
                                % self.devices]
        kept = (source >= 0).all(axis=0)
        copied = candidates[kept]
        priced = np.ones(len(other.size), dtype=bool)
        priced[copied] = False
        others = np.flatnonzero(priced)
        direct = np.ones(len(positions), dtype=bool)
        direct[moved] = False
        columns = len(other.size)
        rows = positions[moved]
        return Shifted(direct=direct, moved=moved, rows=rows, others=others,
                       into=(rows[:, None] * columns + copied).ravel(),
                       read=(partner[moved, None] * columns + source[:, kept]).ravel())

    def _pairs(self, sides: EdgeSides, ends_only: bool = False,
               backward_sides: EdgeSides | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Every pair's t_x from per-device terms.

        Per device: `same` elements it holds of what its consumer tile needs, the producer
        tiles it receives from, and (backward) its producer tile's elements needed elsewhere
        and the consumer tiles it sends to; and the same counts within each of its units of
        the cluster's tiers. A device takes its data in one link class after another: forward
        time is the slowest device's sum over link classes of the elements it receives over
        that class's link at its seconds per element plus its latency per message; backward
        likewise for the gradients each producer tile's device receives. A device without a
        consumer tile receives nothing and one without a producer tile sends nothing, all
        terms being >= 0: the forward pass runs over each consumer config's devices
        (`_forward_block`, configs grouped by size), the backward over each producer
        config's (`_backward_block`). One pair alone gives the same bits as in a matrix.
        `ends_only` runs each pass over the first and last devices of each config only: the
        seconds become a lower bound, the elements are not counted (None). `backward_sides`:
        the sides the backward pass reads, where they are not `sides` (a bound's two passes
        read the ends of opposite sides: `_sides`' `passes`).
        """
        pconfs, qconfs = len(sides.porder), len(sides.qorder)
        # forward blocks are consumer configs x producer configs: kept that way (whole rows
        # written) and transposed once; the elements only where they are counted
        forward = np.empty((qconfs, pconfs))
        moved = None if ends_only else np.empty((qconfs, pconfs), dtype=np.int64)
        qtab, ptab = sides.qtab, sides.ptab
        self._forward(sides.producer, sides.consumer, qtab.ends if ends_only else qtab.by_size,
                      forward, moved, (qtab, ptab))
        seconds = forward.T
        if sides.backward:
            back = np.empty((pconfs, qconfs))
            read = backward_sides or sides
            self._backward(read.producer, read.consumer,
                           ptab.ends if ends_only else ptab.by_size, back, (ptab, qtab))
            seconds = seconds + back
        ordered = np.ix_(sides.porder, sides.qorder)
        in_order = np.empty((pconfs, qconfs))
        in_order[ordered] = seconds
        if moved is None:
            return in_order, None
        passes = 2 if sides.backward else 1  # forward, and backward unless input
        elements = np.empty((pconfs, qconfs), dtype=np.int64)
        elements[ordered] = passes * moved.T * BYTES_PER_ELEMENT
        return in_order, elements

    def _ends_of_some(self, forward: EdgeSides, backward: EdgeSides | None,
                      p_kept: np.ndarray, q_kept: np.ndarray) -> np.ndarray:
        """`_pairs(ends_only=True)` of the pairs of producer configs `p_kept` x consumer
        configs `q_kept` (indices into the lists the sides were built from), bit for bit its
        entries: the forward pass from `forward`, the backward from `backward` (None: the
        producer is the input), each narrowed to those configs."""
        p_at, q_at = forward.p_position[p_kept], forward.q_position[q_kept]
        p_sorted, q_sorted = np.unique(p_at), np.unique(q_at)
        seconds = np.empty((len(q_sorted), len(p_sorted)))
        self._forward(forward.producer.narrowed(p_sorted), forward.consumer.narrowed(q_sorted),
                      _narrowed(forward.qtab.ends, q_sorted), seconds)
        seconds = seconds.T
        if backward is not None:  # its tables order the same configs alike: same positions
            back = np.empty((len(p_sorted), len(q_sorted)))
            self._backward(backward.producer.narrowed(p_sorted),
                           backward.consumer.narrowed(q_sorted),
                           _narrowed(backward.ptab.ends, p_sorted), back)
            seconds = seconds + back
        return seconds[np.ix_(np.searchsorted(p_sorted, p_at), np.searchsorted(q_sorted, q_at))]

    def _some_pairs(self, sides: EdgeSides, p_kept: np.ndarray,
                    q_kept: np.ndarray) -> np.ndarray:
        """t_x seconds of the pairs of producer configs `p_kept` x consumer configs `q_kept`
        (indices into the lists `sides` was built from), bit for bit those of `_pairs`: the
        sides narrowed to those configs, each pair's terms being its own."""
        p_at, q_at = sides.p_position[p_kept], sides.q_position[q_kept]  # table positions
        p_sorted, q_sorted = np.unique(p_at), np.unique(q_at)
        producer, consumer = sides.producer.narrowed(p_sorted), sides.consumer.narrowed(q_sorted)
        forward = np.empty((len(q_sorted), len(p_sorted)))
        self._forward(producer, consumer, _narrowed(sides.qtab.by_size, q_sorted), forward)
        seconds = forward.T
        if sides.backward:
            back = np.empty((len(p_sorted), len(q_sorted)))
            self._backward(producer, consumer, _narrowed(sides.p_by_size, p_sorted), back)
            seconds = seconds + back
        return seconds[np.ix_(np.searchsorted(p_sorted, p_at), np.searchsorted(q_sorted, q_at))]


def _asked_unions(requests: Sequence[KeptRequest]) -> dict[tuple[int, ...], np.ndarray]:
    """Per search space (by its configs' ids), every config any of `requests` asks of it."""
    asked: dict[tuple[int, ...], list[np.ndarray]] = {}
    for request in requests:
        for configs, kept in ((request.producer_configs, request.producer_kept),
                              (request.consumer_configs, request.consumer_kept)):
            asked.setdefault(tuple(map(id, configs)), []).append(kept)
    return {space: np.unique(np.concatenate(kept)) for space, kept in asked.items()}


@dataclass(frozen=True)
class Shifted:
    """`TransferTables._shifted`: of a group of configs of one size, those priced directly
    (`direct`, a mask) and those copied (`moved`, their indices in the group; `rows`, their
    table positions), the other side's configs priced directly for them (`others`), and the
    copies as flat positions of the (own x other) matrix: each copied pair (`into`) reads its
    partner's pair (`read`: the block at its start modulo the period, against the other
    config shifted alike). One flat gather and scatter: a third of the time of indexing rows
    by columns (Inception-v3 on 64 devices: 0.45 -> 0.15 s)."""

    direct: np.ndarray
    moved: np.ndarray
    rows: np.ndarray
    others: np.ndarray
    into: np.ndarray
    read: np.ndarray

    def copy(self, out: np.ndarray) -> None:
        """Fill the copied pairs of `out` (own x other table positions) from their partners'
        pairs, priced before."""
        out.put(self.into, out.take(self.read))


def _direct(groups: Sequence[tuple[np.ndarray, np.ndarray]],
            plans: Sequence[Shifted | None]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The configs of `groups` (positions of one size, and the devices priced for each) that
    their shift plans price directly, the groups priced over as many devices merged into one:
    a bound prices every size above one over its two ends, so its passes run one block per
    chunk instead of one per size (on 16 devices, 11 blocks an edge -> 7)."""
    merged: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for (positions, devices), shifted in zip(groups, plans, strict=True):
        direct = slice(None) if shifted is None else shifted.direct
        merged.setdefault(devices.shape[1], []).append((positions[direct], devices[direct]))
    return [(np.concatenate([positions for positions, _ in parts]),
             np.concatenate([devices for _, devices in parts]))
            for parts in merged.values()]


def _narrowed(by_size: list[tuple[np.ndarray, np.ndarray]],
              at: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """`by_size` (`ConfigTable.by_size`) narrowed to the sorted table positions `at`, each
    config numbered by its place in `at`."""
    member = np.zeros(sum(len(positions) for positions, _ in by_size), dtype=bool)
    member[at] = True
    narrowed = []
    for positions, devices in by_size:
        kept = member[positions]
        if kept.any():
            narrowed.append((np.searchsorted(at, positions[kept]), devices[kept]))
    return narrowed
