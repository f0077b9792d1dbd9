"""The cost model of Jia et al. 2018, Eq. 1: t_o = sum of (t_c + t_s) over layers + sum of t_x
over edges, a plain sum with no overlap. Times and exact integer bytes are kept apart.

- t_c(l, c): the compute one training step spends on the layer's largest tile (devices run
  their tiles at once): its forward + backward and the SGD update of its weight shard. From a
  measured `Profile` or from a roofline on the cluster's device (`--analytic`; the update
  memory-bound): see compute_time.py.
- t_x(e, c_i, c_j): every consumer tile needs a box of its input (model/tiles.py); the parts of that
  box held by producer tiles on OTHER devices move. Bytes are counted exactly, forward
  (activations) and backward (their gradients, the same regions the other way; the network
  input has no gradient, so its edges move forward only). Devices
  receive at once, each element over the link it crosses (`Cluster.link`): a device's time is
  the sum over link classes (PCIe group, node, rack, beyond) of the elements it receives over
  that class at the link's bandwidth plus the link's latency per sending device (backward: the
  gradients each producer tile's device receives); t_x is the slowest device, forward plus
  backward.
- t_s(l, c): gradients of weights replicated by n/h/w splits are reduced within each replica
  group (the tiles that share a channel index): ring all-reduce (alpha-beta; 2(r-1) chunks of
  1/r of the shard per device) or the paper's parameter-server round trip (the group's first
  device takes r-1 gradients in and sends r-1 updates out, each over its link to that replica),
  as the cluster says. The groups of a config reduce at once: where they cross a port that
  devices share (`Link.shared_by`), their rings split its bandwidth and their servers' messages
  queue at it (ports.py).
  With `sync: bucketed` (the runtime's pattern: a group's gradients all-reduced in buckets of
  GRADIENT_BUCKET_BYTES) a layer's t_s carries the ring latencies in proportion to its share of
  a bucket, so that t_s stays a sum over layers for the search; `evaluate` adds what that leaves
  out, the rest of each group's last bucket's latency (ceil(G/B) buckets for G bytes). Where
  the cluster says how fast a device copies gradients (`bucket_copy_bandwidth`, measured by
  `layerwise calibrate`), t_s also carries each device's copy of its shard into the bucket's
  flat buffer, which the runtime makes before every bucket's all-reduce.
  A channel split shards the weights, which then need no sync. A BatchNorm under an n/h/w
  split also reduces its batch statistics in the group (SyncBatchNorm semantics, so the result
  does not depend on the split): an all-reduce of twice the group's channels each way per
  step, which the paper's model leaves out and the runtime's byte count includes. The paper's
  systems normalised each tile by its own statistics (FlexFlow's BatchNorm runs cuDNN's batch
  norm on each partition's tile, src/ops/batch_norm.cu): `batch_norm_statistics="local"`
  prices that, for replaying their experiments; the runtime always runs SyncBatchNorm.

The search needs t_c + t_s of every config of a layer and t_x of every pair of configs of an
edge; tables.py computes those vectorised over whole search spaces.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from layerwise.strategies.breakdown import Breakdown
from layerwise.strategies.cost.compute_time import ComputeSource
from layerwise.strategies.cost.tables import KeptRequest, LayerTiles, TransferTables
from layerwise.strategies.errors import ConfigError
from layerwise.strategies.hardware.cluster import GRADIENT_BUCKET_BYTES, Cluster, Link
from layerwise.strategies.hardware.ports import ServerPorts, ring_links, shares_ports
from layerwise.strategies.model.graph import BYTES_PER_ELEMENT, Layer, LayerGraph
from layerwise.strategies.model.space import (
    DIMS,
    Degrees,
    ParallelConfig,
    check_config,
    degree_choices,
    dim_sizes,
    enumerate_configs,
    max_degree,
    parallel_dims,
    placements,
)
from layerwise.strategies.model.tiles import as_view, output_ranges

Placement = Literal["origin", "aligned"]
BatchNormStatistics = Literal["synced", "local"]
# How much of the edge tables' memory a CostModel has checked: nothing yet, the per-dimension
# tables (any t_x), or the whole search spaces' tables too (the search)
_UNCHECKED, _DIM_TABLES, _SEARCH_SPACES = 0, 1, 2


def configs_for(layer: Layer, devices: int, placement: Placement) -> list[ParallelConfig]:
    """The search space of one layer: every config, or only those starting at device 0."""
    configs = enumerate_configs(layer, devices)
    if placement == "origin":
        return [config for config in configs if config.devices[0] == 0]
    return configs


class CostModel:
    """Eq. 1 for one graph on `devices` devices of `cluster`, with t_c from `compute`."""

    def __init__(self, graph: LayerGraph, cluster: Cluster, devices: int,
                 compute: ComputeSource, placement: Placement = "aligned",
                 placement_note: str | None = None,
                 batch_norm_statistics: BatchNormStatistics = "synced") -> None:
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
        self.placement_note = placement_note  # why a default search took a smaller space
        self.batch_norm_statistics = batch_norm_statistics
        self._transfers = TransferTables(cluster, devices)
        self._spaces: dict[tuple[object, ...], list[ParallelConfig]] = {}
        self._space_lists: dict[tuple[int, ...], list[ParallelConfig]] = {}  # by degree limits
        self._space_keys: dict[str, tuple[object, ...]] = {}  # by layer name
        self._degree_classes: dict[tuple[object, ...], np.ndarray] = {}  # by space
        self._built: dict[tuple[tuple[int, ...], tuple[int, ...]], ParallelConfig] = {}
        self._tiles: dict[str, LayerTiles] = {}
        self._nodes: dict[tuple[object, ...], np.ndarray] = {}
        self._replica_links: dict[tuple[object, ...], list[GroupLinks]] = {}
        self._whole_links: dict[tuple[int, ...], GroupLinks] = {}
        self._group_slowest: dict[tuple[object, ...], list[Link]] = {}
        self._kinds: dict[tuple[int, ...], tuple[
            list[ParallelConfig], list[tuple[int, int, tuple[int, ...]]], np.ndarray,
            np.ndarray]] = {}
        self._shared_ports = shares_ports(cluster, devices)
        self._server_ports: dict[tuple[object, ...], ServerPorts] = {}
        self._replica_link_ids: dict[tuple[object, ...], tuple[int, ...]] = {}
        self._link_ids: dict[GroupLinks, int] = {}
        self._link_groups: list[GroupLinks] = []  # by id
        self._group_seconds: dict[tuple[int, ...], float] = {}
        self._memory_checked = _UNCHECKED
        self._degree_lists: dict[tuple[int, ...], tuple[
            list[ParallelConfig], Sequence[ParallelConfig], np.ndarray]] = {}

    # ---- the search space --------------------------------------------------------------

    @cached_property
    def configs(self) -> dict[str, list[ParallelConfig]]:
        return {layer.name: self._configs_for(layer) for layer in self.graph.layers}

    @property
    def terms_priced(self) -> int:
        """Per-device terms of config pairs this model has computed (a pair's forward over its
        consumer's devices, its backward over its producer's; a bound's over two devices
        each): the work itself, the same on every machine."""
        return self._transfers.terms_priced

    def _configs_for(self, layer: Layer) -> list[ParallelConfig]:
        """`configs_for`, enumerated once per distinct set of dim sizes and split dims."""
        key = self._space_of(layer)
        if key not in self._spaces:
            # the degrees `degree_choices` allows depend on each dim's largest degree alone:
            # spaces of different sizes share one list (Inception-v3's 31 on 16 devices, 4)
            limits = tuple(min(max_degree(layer, dim), self.devices) for dim in DIMS)
            if limits not in self._space_lists:
                # as `configs_for`, built without re-validating configs legal by
                # construction, each config once for every space that holds it
                self._space_lists[limits] = [
                    self._config(degrees, block)
                    for degrees in degree_choices(layer, self.devices)
                    for block in placements(math.prod(degrees), self.devices)
                    if self.placement == "aligned" or block[0] == 0
                ]
            self._spaces[key] = self._space_lists[limits]
        return list(self._spaces[key])

    def _space_of(self, layer: Layer) -> tuple[object, ...]:
        """`_space_key` of a layer of the graph, once per layer (the search asks per edge)."""
        if layer.name not in self._space_keys:
            self._space_keys[layer.name] = _space_key(layer)
        return self._space_keys[layer.name]

    def _config(self, degrees: Degrees, block: tuple[int, ...]) -> ParallelConfig:
        if (degrees, block) not in self._built:
            n, c, d, h, w = degrees
            self._built[(degrees, block)] = ParallelConfig.model_construct(
                n=n, c=c, d=d, h=h, w=w, devices=block)
        return self._built[(degrees, block)]

    # ---- node cost: t_c + t_s ----------------------------------------------------------

    def node_seconds(self, layer: Layer) -> np.ndarray:
        """t_c + t_s of every config in the layer's search space (equal layers computed once,
        unless t_c is looked up by layer name)."""
        key = (_layer_key(layer), self.compute.by_layer_name and layer.name,
               layer.name == self.graph.outputs[0])  # the loss's all-reduces (`sync`)
        if key not in self._nodes:
            configs = self.configs[layer.name]
            self._nodes[key] = (self.compute_seconds(layer, configs)
                                + self.sync(layer, configs)[0])
        return self._nodes[key]

    def compute_seconds(self, layer: Layer, configs: Sequence[ParallelConfig]) -> np.ndarray:
        """t_c of each config: the tile's forward + backward and its weight update. Each
        depends on a config's degrees alone (its largest tile), so each is computed once per
        distinct degrees (`_distinct_degrees`)."""
        distinct, of = self._distinct_degrees(configs)
        seconds = self.compute.configs_seconds(layer, self.tiles(layer), distinct)
        if layer.param_count:
            seconds = seconds + self.compute.configs_update_seconds(layer, self.tiles(layer),
                                                                    distinct)
        return seconds[of]

    def pass_seconds(self, layer: Layer, configs: Sequence[ParallelConfig]) -> np.ndarray:
        """Forward + backward of each config's largest tile."""
        distinct, of = self._distinct_degrees(configs)
        return self.compute.configs_seconds(layer, self.tiles(layer), distinct)[of]

    def recompute_seconds(self, layer: Layer, configs: Sequence[ParallelConfig]) -> np.ndarray:
        """What recomputing each config's tile forward in the backward adds to t_c: the
        tile's forward, measured by the profile (the device model's or roofline's share of
        the pass without one)."""
        distinct, of = self._distinct_degrees(configs)
        return self.compute.configs_forward_seconds(layer, self.tiles(layer), distinct)[of]

    def update_seconds(self, layer: Layer, configs: Sequence[ParallelConfig]) -> np.ndarray:
        """The SGD update of each config's largest weight shard (once per step)."""
        if not layer.param_count:
            return np.zeros(len(configs))
        distinct, of = self._distinct_degrees(configs)
        return self.compute.configs_update_seconds(layer, self.tiles(layer), distinct)[of]

    def distinct_degrees(self, layer: Layer) -> tuple[Sequence[ParallelConfig], np.ndarray]:
        """The layer's search space by degrees: the first config of each distinct degrees,
        and each config's index among those (one array per search space)."""
        return self._distinct_degrees(self.configs[layer.name])

    def _distinct_degrees(self, configs: Sequence[ParallelConfig],
                          ) -> tuple[Sequence[ParallelConfig], np.ndarray]:
        """The first config of each distinct degrees in `configs` (`configs` itself where all
        differ, so that a list's per-list caches still hit) and each config's index among
        those: t_c depends on a config's degrees alone, and aligned spaces place each degrees
        at many blocks (on 64 devices 848 configs, 210 degrees). Cached by the configs'
        identities (a search space's are built once), each entry holding its configs so that
        no id it is keyed by is reused while it lives; a list of one config (a strategy's
        layer priced alone) as it is."""
        if len(configs) <= 1:
            return configs, np.zeros(len(configs), dtype=np.int64)
        key = tuple(map(id, configs))
        if key not in self._degree_lists:
            at: dict[tuple[int, ...], int] = {}
            of = np.fromiter((at.setdefault(config.degrees, len(at)) for config in configs),
                             dtype=np.int64, count=len(configs))
            of.flags.writeable = False  # shared by every layer of the space
            distinct = (configs if len(at) == len(configs) else
                        [configs[index] for index in np.unique(of, return_index=True)[1]])
            self._degree_lists[key] = (list(configs), distinct, of)
        return self._degree_lists[key][1:]

    def tiles(self, layer: Layer) -> LayerTiles:
        """The layer's largest tile under any config (what t_c times), built once per layer."""
        if layer.name not in self._tiles:
            self._tiles[layer.name] = LayerTiles(layer)
        return self._tiles[layer.name]

    def sync(self, layer: Layer,
             configs: Sequence[ParallelConfig]) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, bytes) of gradient and batch-statistics synchronisation for each config,
        and on the output layer the loss's all-reduces over scores split by class (their
        seconds only: the runtime counts their bytes as the loss's, not as sync)."""
        seconds = np.zeros(len(configs))
        total_bytes = np.zeros(len(configs), dtype=np.int64)
        norms = _batch_norms(layer) if self.batch_norm_statistics == "synced" else 0
        if layer.plane_norms:
            self._plane_sync(layer, configs, seconds, total_bytes)
        if layer.name == self.graph.outputs[0]:
            self._loss_sync(layer, configs, seconds)
        if not layer.param_count and not norms:
            return seconds, total_bytes
        out_channels = as_view(layer.output_shape)[1]
        shared = layer.shared_param_count
        # SyncBatchNorm: per BatchNorm, one all-reduce of 2 C_shard values forward (sums of
        # the tiles' means and second moments) and one backward (sums of dy and dy * x_hat)
        statistics = 4 * norms
        kinds, kind_of, replicas = self._sync_kinds(configs)
        # a tensor every channel tile holds whole (a PReLU's one slope) is summed over all of
        # the layer's devices; with c whole those are its replicas, as any weight's
        if shared:
            for row in np.flatnonzero([config.c > 1 for config in configs]):
                config = configs[row]
                links = self._whole_group_links(config.devices)
                seconds[row] += self._sync_seconds(shared, config.size, links, gradients=True)
                total_bytes[row] += 2 * (config.size - 1) * shared * BYTES_PER_ELEMENT
        synced = kind_of >= 0  # configs with replicas of their weight shards
        if not synced.any():
            return seconds, total_bytes
        # every device of a ring sends 2(r-1) chunks of 1/r of its shard; the shards of all
        # groups add up to the layer's weights; the parameter server moves as much
        params = np.array([layer.param_count - (shared if c > 1 else 0) for c, _, _ in kinds])
        reduced = params[kind_of[synced]] + statistics * out_channels
        total_bytes[synced] += 2 * (replicas[synced] - 1) * reduced * BYTES_PER_ELEMENT
        worst = np.array([self._kind_sync_seconds(layer, kind, int(param_count), out_channels,
                                                  norms)
                          for kind, param_count in zip(kinds, params, strict=True)])
        slowest = worst[kind_of[synced]]
        if self._shared_ports and self.cluster.sync == "parameter_server":
            for position, row in enumerate(np.flatnonzero(synced)):
                param_count = int(params[kind_of[row]])
                if param_count:
                    slowest[position] = max(self._servers(configs[row]).seconds(
                        [param_count * (stop - start) // out_channels * BYTES_PER_ELEMENT
                         for start, stop in output_ranges(layer, 1, configs[row].c)]),
                        slowest[position])
        seconds[synced] += slowest
        return seconds, total_bytes

    def _plane_sync(self, layer: Layer, configs: Sequence[ParallelConfig],
                    seconds: np.ndarray, total_bytes: np.ndarray) -> None:
        """Add the plane norms' statistics sync under each config that splits d, h or w: per
        InstanceNorm or GroupNorm one all-reduce forward (sums and second moments) and one
        backward (sums of dy and dy * x_hat), each of 2 values per (sample, statistic) of the
        tile (a channel's, a group's: `Layer.plane_norms`), over the devices holding one
        plane's tiles (ops.sync_instance_norm, ops.group_norm)."""
        batch = as_view(layer.output_shape)[0]
        norms = layer.plane_norms  # computed from the layer's ops on each read
        for row, config in enumerate(configs):
            planes = config.d * config.h * config.w
            if planes == 1:
                continue
            groups = np.array(config.devices).reshape(config.n * config.c, planes)
            for statistics in norms:
                values = 2 * -(-batch // config.n) * -(-statistics // config.c)
                slowest = self._slowest_group_link(groups, values * BYTES_PER_ELEMENT)
                seconds[row] += 2 * slowest.allreduce_seconds(values * BYTES_PER_ELEMENT,
                                                              planes)
                total_bytes[row] += (2 * 2 * (planes - 1) * 2 * batch * statistics
                                     * BYTES_PER_ELEMENT)

    def _loss_sync(self, layer: Layer, configs: Sequence[ParallelConfig],
                   seconds: np.ndarray) -> None:
        """Add the cross-entropy's all-reduces under each config that splits the scores by
        class: over each channel group, the per-sample maximum, then the per-sample sums of
        exponentials and target scores (two values per sample), forward only
        (functions.sharded_cross_entropy). Unpriced, the loss's waits (these two and the step's
        loss sum) were 5-6 ms of a 35 ms step of tiny_cnn's channel-split plan on this
        project's CPUs."""
        sizes = as_view(layer.output_shape)
        for row, config in enumerate(configs):
            if config.c == 1:
                continue
            # a value per sample (and position) of the tile's scores
            samples = math.prod(-(-size // degree) for dim, (size, degree) in enumerate(zip(
                sizes, config.degrees, strict=True)) if dim != 1) * BYTES_PER_ELEMENT
            groups = np.array(config.devices).reshape(config.n, config.c, -1).transpose(
                0, 2, 1).reshape(-1, config.c)
            slowest = self._slowest_group_link(groups, samples)
            seconds[row] += (slowest.allreduce_seconds(samples, config.c)
                             + slowest.allreduce_seconds(2 * samples, config.c))

    def _slowest_group_link(self, groups: np.ndarray, nbytes: int) -> Link:
        """The link of the group (a row of `groups`, device ids) whose all-reduce of `nbytes`
        takes longest: the groups reduce at once and the step waits for the slowest."""
        return max(self._groups_links(groups),
                   key=lambda link: link.allreduce_seconds(nbytes, groups.shape[1]))

    def _groups_links(self, groups: np.ndarray) -> list[Link]:
        """Each group's slowest link, in order, once each (equal groups of devices recur in
        every layer of a search space: looked up once per search)."""
        key = (groups.shape, groups.tobytes())
        if key not in self._group_slowest:
            links: list[Link] = []
            for group in groups:
                link = self.cluster.slowest_link(group.tolist())
                assert link is not None  # a group of more than one device
                if link not in links:
                    links.append(link)
            self._group_slowest[key] = links
        return self._group_slowest[key]

    def _sync_kinds(self, configs: Sequence[ParallelConfig]
                    ) -> tuple[list[tuple[int, int, tuple[int, ...]]], np.ndarray, np.ndarray]:
        """What a layer's gradient sync depends on besides the layer, once per search space:
        the distinct (c, replicas, each replica group's link id) of the configs with replicas,
        each config's index among them (-1: no replicas), and each config's replicas. Cached
        by the configs' identities, each entry holding its configs (as `_distinct_degrees`)."""
        key = tuple(map(id, configs))
        if key not in self._kinds:
            kinds: dict[tuple[int, int, tuple[int, ...]], int] = {}
            kind_of = np.full(len(configs), -1)
            replicas = np.array([config.size // config.c for config in configs])
            for row, config in enumerate(configs):
                if replicas[row] > 1:
                    kind = (config.c, int(replicas[row]), self._group_link_ids(config))
                    kind_of[row] = kinds.setdefault(kind, len(kinds))
            self._kinds[key] = (list(configs), list(kinds), kind_of, replicas)
        _, kinds_of_space, kind_of_config, replicas_of_config = self._kinds[key]
        return kinds_of_space, kind_of_config, replicas_of_config

    def _kind_sync_seconds(self, layer: Layer, kind: tuple[int, int, tuple[int, ...]],
                           param_count: int, out_channels: int, norms: int) -> float:
        """The slowest replica group's sync of a layer under configs of one kind
        (`_sync_kinds`)."""
        c, replicas, link_ids = kind
        worst = 0.0
        for (c_start, c_stop), links in zip(output_ranges(layer, 1, c), link_ids, strict=True):
            # equal groups take equal time, in this layer and in every other
            key = (c_stop - c_start, links, replicas, param_count, out_channels, norms)
            if key not in self._group_seconds:
                self._group_seconds[key] = self._group_sync_seconds(
                    param_count * (c_stop - c_start) // out_channels, c_stop - c_start,
                    replicas, self._link_groups[links], norms)
            worst = max(worst, self._group_seconds[key])
        return worst

    def _group_sync_seconds(self, shard: int, channels: int, replicas: int,
                            links: GroupLinks, norms: int) -> float:
        """One replica group's sync: its BatchNorms' statistics (two all-reduces of 2
        `channels` values each) and its `shard` of gradients."""
        seconds = 2 * norms * self._sync_seconds(2 * channels, replicas, links)
        if shard:
            seconds += self._sync_seconds(shard, replicas, links, gradients=True)
        return seconds

    def _group_link_ids(self, config: ParallelConfig) -> tuple[int, ...]:
        """`_group_links` as small integers (equal links, equal ids), cheap to hash; once per
        degrees and block modulo the cluster's symmetry (a block moved by a multiple of it has
        the same links)."""
        key = (config.degrees, self._shifted_back(config.devices))
        if key not in self._replica_link_ids:
            ids = []
            for links in self._group_links(config):
                if links not in self._link_ids:
                    self._link_ids[links] = len(self._link_groups)
                    self._link_groups.append(links)
                ids.append(self._link_ids[links])
            self._replica_link_ids[key] = tuple(ids)
        return self._replica_link_ids[key]

    def _shifted_back(self, devices: tuple[int, ...]) -> tuple[int, ...]:
        """A contiguous block moved back by the largest multiple of the cluster's symmetry
        (`TransferTables.symmetry`) that keeps it on the devices; other device lists as they
        are. Its replica groups sit at the same positions in it and every link between two of
        its devices is unchanged."""
        start, size = devices[0], len(devices)
        if devices != tuple(range(start, start + size)):
            return devices
        start %= self._transfers.symmetry
        return tuple(range(start, start + size))

    def _whole_group_links(self, devices: tuple[int, ...]) -> GroupLinks:
        """The links of a group of all of a layer's devices (`_group_links` for one group; a
        shared port's split is left out: what crosses it is a few bytes)."""
        if devices not in self._whole_links:
            self._whole_links[devices] = self._links_of(
                list(devices), self.cluster.slowest_link(list(devices)))
        return self._whole_links[devices]

    def _links_of(self, group: list[int], slowest: Link | None) -> GroupLinks:
        """A group's ring link `slowest` and the links from its first device (the parameter
        server) to each other, slowest first: only a parameter server's sync reads those (a
        ring's the slowest link alone), so other syncs leave them out (on 256 devices 62
        thousand lookups in Inception-v3's search)."""
        assert slowest is not None  # a group of more than one device has a slowest link
        if self.cluster.sync != "parameter_server":
            return GroupLinks(slowest, ())
        server = (self.cluster.link(group[0], member) for member in group[1:])
        return GroupLinks(slowest, tuple(sorted(
            (link for link in server if link is not None),
            key=lambda link: (link.bandwidth, link.latency))))

    def _replica_groups(self, config: ParallelConfig) -> list[list[int]]:
        """The devices of each channel index: the replicas of one weight shard."""
        n, c, d, h, w = config.degrees
        devices = np.array(config.devices).reshape(n, c, d * h * w)
        return [devices[:, c_index].ravel().tolist() for c_index in range(c)]

    def _servers(self, config: ParallelConfig) -> ServerPorts:
        """The parameter servers' messages through shared ports under `config`."""
        key = (config.degrees, config.devices)
        if key not in self._server_ports:
            self._server_ports[key] = ServerPorts.of(self.cluster, self._replica_groups(config))
        return self._server_ports[key]

    def _group_links(self, config: ParallelConfig) -> list[GroupLinks]:
        """The links of each replica group (the devices of one channel index): the link its
        ring runs at (its slowest, a shared port's bandwidth split among the groups crossing
        it; under a parameter server, where no ring runs, its slowest), and the links from its
        first device (the parameter server) to each other."""
        key = (config.degrees, config.devices)
        if key not in self._replica_links:
            groups = self._replica_groups(config)
            rings = (ring_links(self.cluster, groups)
                     if self._shared_ports and self.cluster.sync != "parameter_server"
                     else [self.cluster.slowest_link(group) for group in groups])
            self._replica_links[key] = [self._links_of(group, slowest)
                                        for group, slowest in zip(groups, rings, strict=True)]
        return self._replica_links[key]

    def _sync_seconds(self, shard_elements: int, replicas: int, links: GroupLinks,
                      gradients: bool = False) -> float:
        """One all-reduce of a shard over its replica group (BatchNorm statistics are always
        an all-reduce of their own; gradients share buckets under `sync: bucketed`)."""
        shard_bytes = shard_elements * BYTES_PER_ELEMENT
        link = links.slowest
        if self.cluster.sync == "parameter_server":
            # the server takes r-1 gradients in and sends r-1 updates out, one after another,
            # each over the link between the server and that replica (Jia et al. 2018,
            # section 3: devices send gradients to the server, which sends parameters back)
            return sum(2 * (member.latency + shard_bytes / member.bandwidth)
                       for member in links.server)
        if gradients and self.cluster.sync == "bucketed":
            chunk = -(-shard_bytes // replicas)
            # and each device's copy of its shard into the bucket's flat buffer, where measured
            copy = self.cluster.bucket_copy_bandwidth
            return 2 * (replicas - 1) * (
                link.allreduce_latency * shard_bytes / GRADIENT_BUCKET_BYTES
                + chunk / link.allreduce_bandwidth) + (shard_bytes / copy if copy else 0.0)
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
            param_count, shared = layer.param_count, layer.shared_param_count
            if shared and config.c > 1:  # summed over all the layer's devices (`sync`)
                group = tuple(sorted(config.devices))
                group_bytes[group] = group_bytes.get(group, 0) + shared * BYTES_PER_ELEMENT
                group_latency[group] = max(group_latency.get(group, 0.0), self._whole_group_links(
                    config.devices).slowest.allreduce_latency)
                param_count -= shared
            replicas = config.size // config.c
            if replicas == 1 or not param_count:
                continue
            out_channels = as_view(layer.output_shape)[1]
            devices = np.array(config.devices).reshape(config.n, config.c, -1)
            for c_index, ((c_start, c_stop), link) in enumerate(zip(
                    output_ranges(layer, 1, config.c), self._group_links(config), strict=True)):
                group = tuple(sorted(devices[:, c_index].ravel().tolist()))
                shard = param_count * (c_stop - c_start) // out_channels
                group_bytes[group] = group_bytes.get(group, 0) + shard * BYTES_PER_ELEMENT
                group_latency[group] = max(group_latency.get(group, 0.0),
                                           link.slowest.allreduce_latency)
        waits = np.zeros(self.devices)
        for group, nbytes in group_bytes.items():
            buckets = nbytes / GRADIENT_BUCKET_BYTES
            rest = -(-nbytes // GRADIENT_BUCKET_BYTES) - buckets
            waits[list(group)] += 2 * (len(group) - 1) * group_latency[group] * rest
        return float(waits.max())

    # ---- edge cost: t_x ----------------------------------------------------------------

    def edge(self, producer: Layer, consumer: Layer,
             producer_configs: Sequence[ParallelConfig] | None = None,
             consumer_configs: Sequence[ParallelConfig] | None = None,
             ) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, bytes) of t_x for every pair of producer and consumer configs, by default
        of the two layers' whole search spaces (then computed once per distinct edge)."""
        whole = producer_configs is None and consumer_configs is None
        self.check_memory(whole_spaces=whole)
        if whole:
            return self._transfers.matrices(
                producer, consumer, self.configs[producer.name], self.configs[consumer.name],
                spaces=(self._space_of(producer), self._space_of(consumer)))
        return self._transfers.matrices(producer, consumer,
                                       producer_configs or self.configs[producer.name],
                                       consumer_configs or self.configs[consumer.name])

    def pair(self, producer: Layer, consumer: Layer, producer_config: ParallelConfig,
             consumer_config: ParallelConfig) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, bytes) of t_x of one pair of configs, as 1x1 matrices; computed once per
        distinct edge and pair (a network's repeated blocks price the same pair again)."""
        self.check_memory(whole_spaces=False)
        return self._transfers.matrices(
            producer, consumer, [producer_config], [consumer_config],
            spaces=(_config_key(producer_config), _config_key(consumer_config)))

    def edge_lower_bound(self, producer: Layer, consumer: Layer) -> np.ndarray:
        """Seconds at most t_x for every pair of configs of the two layers' whole search
        spaces, from each config's first and last devices only (the search's bounds need no
        more; an eighth of the work on 64 devices)."""
        self.check_memory(whole_spaces=True)
        return self._transfers.lower_bounds(
            producer, consumer, self.configs[producer.name], self.configs[consumer.name],
            spaces=(self._space_of(producer), self._space_of(consumer)))

    def edge_lower_bounds(self, kept: Mapping[str, np.ndarray],
                          ) -> dict[tuple[str, str], np.ndarray]:
        """`edge_lower_bound` of every edge of the graph between the configs at `kept[name]`
        of each layer, bit for bit its entries: each kind of edge's per-device terms built
        once, only the pairs asked for priced (`TransferTables.lower_bounds_many`)."""
        self.check_memory(whole_spaces=True)
        return dict(zip(self.graph.edges, self._transfers.lower_bounds_many(
            self._requests(kept)), strict=True))

    def edge_degree_bound(self, producer: Layer, consumer: Layer) -> np.ndarray:
        """Seconds at most `edge_lower_bound`'s for every pair of classes of configs of the
        two layers' whole search spaces (`degree_classes`), from each config and the other
        side's degrees alone (degree_bounds.py): the search's first pruning, at a small share
        of the work (on 64 devices 848 configs make about 210 classes)."""
        self.check_memory(whole_spaces=True)
        return self._transfers.degree_bounds(
            producer, consumer, self.configs[producer.name], self.configs[consumer.name],
            spaces=(self._space_of(producer), self._space_of(consumer)))

    def degree_classes(self, layer: Layer) -> np.ndarray:
        """The class of each config of the layer's search space for `edge_degree_bound`:
        configs of equal degrees whose ends see the same seconds per element."""
        key = self._space_of(layer)
        if key not in self._degree_classes:  # the search asks per layer, several times
            self._degree_classes[key] = self._transfers.degree_classes(self.configs[layer.name])
        return self._degree_classes[key]

    def kept_edge(self, producer: Layer, consumer: Layer, producer_kept: np.ndarray,
                  consumer_kept: np.ndarray) -> np.ndarray:
        """t_x seconds between the configs at indices `producer_kept` and `consumer_kept` of the
        two layers' search spaces, bit for bit those of `edge`, from the per-device terms
        `edge_lower_bound` built (equal edges with equal kept configs computed once)."""
        return self._transfers.kept(
            producer, consumer, self.configs[producer.name], self.configs[consumer.name],
            (self._space_of(producer), self._space_of(consumer)), producer_kept, consumer_kept)

    def kept_edges(self, kept: Mapping[str, np.ndarray]) -> dict[tuple[str, str], np.ndarray]:
        """`kept_edge` of every edge of the graph, with `kept[name]` the configs kept of each
        layer: the edges of a network's repeated blocks share one build of their per-device
        terms (`TransferTables.kept_many`)."""
        return dict(zip(self.graph.edges, self._transfers.kept_many(self._requests(kept)),
                        strict=True))

    def edge_kinds(self) -> int:
        """How many kinds of edge the graph has: edges of one kind (equal per-dimension
        tables and search spaces) share their per-device terms."""
        return self._transfers.kinds(self._requests({
            layer.name: np.arange(0) for layer in self.graph.layers}))

    def _requests(self, kept: Mapping[str, np.ndarray]) -> list[KeptRequest]:
        """Every edge of the graph with its whole spaces and the configs `kept` of each."""
        graph = self.graph
        return [KeptRequest(
            graph.by_name[u], graph.by_name[v], self.configs[u], self.configs[v],
            (self._space_of(graph.by_name[u]), self._space_of(graph.by_name[v])), kept[u],
            kept[v])
            for u, v in graph.edges]

    def forget_kept_tables(self) -> None:
        """Free what `kept_edge` reads (the search is done with it)."""
        self._transfers.forget_sides()

    def check_memory(self, whole_spaces: bool) -> None:
        """Refuse (one line) before building any table of the edges that would not fit in
        memory: the per-dimension tables every edge needs, then with `whole_spaces` (the
        search) the tables of the whole search spaces too. Each is checked once."""
        if self._memory_checked == _SEARCH_SPACES or (
                not whole_spaces and self._memory_checked == _DIM_TABLES):
            return
        edges = [(self.graph.by_name[u], self.graph.by_name[v]) for u, v in self.graph.edges]
        if self._memory_checked < _DIM_TABLES:
            self._transfers.check_memory(edges)
            self._memory_checked = _DIM_TABLES
        if whole_spaces and self._memory_checked < _SEARCH_SPACES:
            spaces = {self._space_of(layer): len(self.configs[layer.name])
                      for layer in self.graph.layers}
            pairs = sum(len(self.configs[u.name]) * len(self.configs[v.name]) for u, v in edges)
            self._transfers.check_memory(edges, list(spaces.values()), pairs)
            self._memory_checked = _SEARCH_SPACES

    # ---- a whole strategy --------------------------------------------------------------

    def evaluate(self, assignment: dict[str, ParallelConfig],
                 recompute: Collection[str] = ()) -> Breakdown:
        """Eq. 1 for one config per layer (configs outside the search space are fine), the
        layers in `recompute` running their forward twice."""
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
            if layer.name in recompute:
                compute += float(self.recompute_seconds(layer, [config])[0])
            seconds, moved = self.sync(layer, [config])
            sync += float(seconds[0])
            sync_bytes += int(moved[0])
        for producer_name, consumer_name in self.graph.edges:
            producer = self.graph.by_name[producer_name]
            consumer = self.graph.by_name[consumer_name]
            seconds, moved = self.pair(producer, consumer, assignment[producer_name],
                                       assignment[consumer_name])
            transfer += float(seconds[0, 0])
            transfer_bytes += int(moved[0, 0])
        sync += self.bucket_latency_rest(assignment)
        return Breakdown(
            step_seconds=compute + sync + transfer, compute_seconds=compute,
            transfer_seconds=transfer, sync_seconds=sync, transfer_bytes=transfer_bytes,
            sync_bytes=sync_bytes,
        )


@dataclass(frozen=True)
class GroupLinks:
    """The links of one replica group: its slowest (a ring's bottleneck) and, in order, those
    from its parameter server (its first device) to each other device (empty unless the
    cluster syncs through a parameter server)."""

    slowest: Link
    server: tuple[Link, ...]


def _batch_norms(layer: Layer) -> int:
    """BatchNorms a layer runs (fused into it, or the layer itself)."""
    ops = [layer.op, *(fused.op for fused in layer.fused)]
    return sum(op.startswith("BatchNorm") for op in ops)


def _layer_key(layer: Layer) -> tuple[object, ...]:
    """What a layer's search space and analytic costs depend on (not its name)."""
    return (layer.kind, layer.label, layer.output_shape, layer.input_shapes, layer.geometry,
            layer.concat_dim, layer.resize, layer.channels, layer.flops, layer.param_count)


def _config_key(config: ParallelConfig) -> tuple[object, ...]:
    """A search space of one config, named by it."""
    return ("config", config.degrees, config.devices)


def _space_key(layer: Layer) -> tuple[object, ...]:
    """What a layer's search space depends on: its dimension sizes and which it may split,
    and how far."""
    return (tuple(dim_sizes(layer).values()), parallel_dims(layer),
            tuple(sorted(layer.max_degrees.items())))
