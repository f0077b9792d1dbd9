"""Cost model: bytes counted by hand and by a naive tile-by-tile count, sync, compute."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from layerwise.strategies.cost import tables as cost_tables
from layerwise.strategies.cost.compute_time import AnalyticCompute
from layerwise.strategies.cost.cost_model import CostModel, configs_for
from layerwise.strategies.errors import ConfigError
from layerwise.strategies.hardware.cluster import DeviceGroups, Link, Racks, load_cluster
from layerwise.strategies.model.graph import build_graph, trace
from layerwise.strategies.model.space import ParallelConfig, enumerate_configs
from layerwise.strategies.model.tiles import as_view, largest_tile, needed_range, output_ranges

P = ParallelConfig.parse
CLUSTER = load_cluster("p100x16-2018")


def model_for(graph, devices: int, cluster=CLUSTER) -> CostModel:
    return CostModel(graph, cluster, devices, AnalyticCompute(cluster), placement="aligned")


def test_halo_rows_after_a_sample_split_are_exactly_the_rows_you_can_count():
    batch, channels, height, width = 4, 5, 8, 8
    graph = trace(nn.Sequential(nn.Conv2d(3, channels, 1), nn.Conv2d(channels, 6, 3, padding=1)),
                  (batch, 3, height, width))
    producer, consumer = graph.layers[1], graph.layers[2]
    seconds, moved = model_for(graph, 2).edge(producer, consumer, [P("n2c1h1w1@0-1")],
                                              [P("n1c1h2w1@0-1")])
    # device 0 computes rows 0-3 of every sample: it needs input rows 0-4 (one halo row) of
    # samples 2-3, which device 1 holds; device 1 symmetrically needs rows 3-7 of samples 0-1
    rows_needed = height // 2 + 1
    forward = 2 * (batch // 2) * channels * rows_needed * width
    assert moved[0, 0] == 2 * forward * 4  # activations forward + their gradients backward
    assert seconds[0, 0] > 0


def test_same_device_overlaps_are_free():
    graph = build_graph("tiny_cnn", batch=8, image_size=8)
    conv = graph.layers[1]  # the first 3x3 conv, fed by the network input
    config = P("n2c1h2w1@0-3")
    cost = model_for(graph, 4)
    seconds, moved = cost.edge(graph.layers[0], conv, [config], [config])
    only_halo = moved[0, 0]
    samples_only = cost.edge(graph.layers[0], conv, [P("n4c1h1w1@0-3")],
                             [P("n4c1h1w1@0-3")])[1][0, 0]
    assert samples_only == 0 and only_halo > 0


@pytest.mark.parametrize("devices", [2, 4])
def test_data_parallel_ring_sync_is_2_p_minus_1_over_p_of_the_weights_per_device(devices):
    graph = build_graph("alexnet", batch=32 * devices, image_size=32, num_classes=10)
    cost = model_for(graph, devices)
    for layer in graph.layers:
        if not layer.param_count:
            continue
        config = ParallelConfig(n=devices, devices=tuple(range(devices)))
        _, moved = cost.sync(layer, [config])
        per_device = moved[0] / devices
        assert per_device == 2 * (devices - 1) / devices * layer.param_count * 4
        assert cost.sync(layer, [ParallelConfig(c=devices, devices=tuple(range(devices)))])[
            1][0] == 0  # channel-split weights are sharded: nothing to reduce


@pytest.mark.parametrize(("statistics", "extra"), [("synced", 4), ("local", 0)])
def test_batch_norm_statistics_are_reduced_only_when_synced(statistics, extra):
    """SyncBatchNorm (the runtime) all-reduces 2 C values forward and 2 C backward per
    BatchNorm; the paper's systems (`local`) normalised each tile by its own statistics."""
    channels, replicas = 6, 4
    graph = trace(nn.Sequential(nn.Conv2d(3, channels, 3), nn.BatchNorm2d(channels)),
                  (8, 3, 8, 8))
    (layer,) = [layer for layer in graph.layers if layer.param_count]
    cost = CostModel(graph, CLUSTER, replicas, AnalyticCompute(CLUSTER),
                     batch_norm_statistics=statistics)
    samples = ParallelConfig(n=replicas, devices=tuple(range(replicas)))
    _, moved = cost.sync(layer, [samples])
    assert moved[0] == 2 * (replicas - 1) * (layer.param_count + extra * channels) * 4
    sharded = ParallelConfig(c=2, devices=(0, 1))  # each device its own channels and stats
    assert cost.sync(layer, [sharded])[1][0] == 0


def test_vgg16_first_fc_layer_syncs_far_more_than_a_channel_split_transfers():
    """Jia et al. 2018, Fig. 2: 2 devices, 32 images per device."""
    graph = build_graph("vgg16", batch=64)
    cost = model_for(graph, 2)
    fc = graph.by_name["classifier_0"]
    _, synced = cost.sync(fc, [P("n2c1h1w1@0-1")])
    assert synced[0] / 2 == pytest.approx(400e6, rel=0.05)  # about 400 MB per device
    _, transferred = cost.edge(graph.by_name["flatten"], fc, [P("n2c1h1w1@0-1")],
                               [P("n1c2h1w1@0-1")])
    assert synced[0] / 2 > 10 * transferred[0, 0]


def test_parameter_server_moves_as_much_as_a_ring_but_takes_longer():
    graph = build_graph("vgg16", batch=128)
    ring = model_for(graph, 4, CLUSTER.model_copy(update={"sync": "ring"}))
    server = model_for(graph, 4, CLUSTER.model_copy(update={"sync": "parameter_server"}))
    fc = graph.by_name["classifier_3"]
    config = [P("n4c1h1w1@0-3")]
    assert ring.sync(fc, config)[1][0] == server.sync(fc, config)[1][0]
    assert server.sync(fc, config)[0][0] > ring.sync(fc, config)[0][0]


@pytest.mark.parametrize(("model", "buckets"), [("lenet5", 1), ("alexnet", 10)])
def test_bucketed_sync_pays_one_ring_latency_per_bucket_of_a_group(model, buckets):
    """The runtime's pattern: data parallelism's gradients (LeNet-5: 0.25 MB, AlexNet at 2
    devices: 228 MB) go in 25 MB buckets, each one all-reduce; per layer, t_s carries its share
    of a latency so that the search still sums over layers."""
    cluster = CLUSTER.model_copy(update={"sync": "bucketed"})
    graph = build_graph(model, batch=8, image_size=32)
    cost = model_for(graph, 2, cluster)
    link = cluster.links.intra_node
    weights = [layer.param_count * 4 for layer in graph.layers if layer.param_count]
    assert -(-sum(weights) // (25 << 20)) == buckets
    data = {layer.name: P("n2c1h1w1@0-1") for layer in graph.layers}
    per_layer = 2 * sum(-(-nbytes // 2) for nbytes in weights) / link.allreduce_bandwidth
    assert cost.evaluate(data).sync_seconds == pytest.approx(
        2 * buckets * link.allreduce_latency + per_layer, rel=1e-9)
    fc = graph.by_name["classifier_0"] if model == "lenet5" else graph.by_name["classifier_1"]
    share = fc.param_count * 4 / (25 << 20)
    assert cost.sync(fc, [P("n2c1h1w1@0-1")])[0][0] == pytest.approx(
        2 * (share * link.allreduce_latency + -(-fc.param_count * 4 // 2)
             / link.allreduce_bandwidth), rel=1e-9)
    channel_split = {name: P("n1c2h1w1@0-1") if layer.param_count else config
                     for (name, config), layer in zip(data.items(), graph.layers, strict=True)}
    # sharded weights: no bucket; what is left is the loss over scores split by class
    output = graph.by_name[graph.outputs[0]]
    assert cost.evaluate(channel_split).sync_seconds == cost.sync(
        output, [channel_split[output.name]])[0][0] > 0
    ring = model_for(graph, 2, CLUSTER.model_copy(update={"sync": "ring"})).evaluate(
        data).sync_seconds  # a latency per layer
    assert ring == pytest.approx(2 * len(weights) * link.allreduce_latency + per_layer)


def naive_edge_elements(producer, consumer, pconf, qconf) -> int:
    """Elements moved forward, by looping over every pair of tiles on different devices."""
    input_index = consumer.inputs.index(producer.name)
    moved = 0
    p_tiles = list(pconf.tiles())
    for q_index, q_device in qconf.tiles():
        needed = []
        for dim in range(5):
            out = output_ranges(consumer, dim, qconf.degrees[dim])[q_index[dim]]
            needed.append(needed_range(consumer, input_index, dim, out))
        for p_index, p_device in p_tiles:
            if p_device == q_device:
                continue
            volume = 1
            for dim in range(5):
                have = output_ranges(producer, dim, pconf.degrees[dim])[p_index[dim]]
                volume *= max(0, min(have[1], needed[dim][1]) - max(have[0], needed[dim][0]))
            moved += volume
    return moved


class _Zoo(nn.Module):
    """Strided, padded, dilated, grouped convs, pooling, a concat and an FC head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)
        self.side = nn.Conv2d(8, 4, 1)
        self.adaptive = nn.AdaptiveAvgPool2d(3)
        self.fc = nn.Linear(12 * 9, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.grouped(x)
        z = torch.cat([self.pool(y), self.pool(self.side(x))], 1)
        return self.fc(torch.flatten(self.adaptive(z), 1))


ZOO_GRAPH = trace(_Zoo(), (4, 3, 22, 18))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), devices=st.sampled_from([2, 4, 8]))
def test_vectorised_bytes_equal_a_naive_tile_by_tile_count(seed, devices):
    rng = random.Random(seed)
    cost = model_for(ZOO_GRAPH, devices)
    producer, consumer = rng.choice([
        (ZOO_GRAPH.by_name[u], ZOO_GRAPH.by_name[v]) for u, v in ZOO_GRAPH.edges
    ])
    pconfs = rng.sample(enumerate_configs(producer, devices), 3)
    qconfs = rng.sample(enumerate_configs(consumer, devices), 3)
    _, moved = cost.edge(producer, consumer, pconfs, qconfs)
    for row, pconf in enumerate(pconfs):
        for column, qconf in enumerate(qconfs):
            passes = 1 if producer.kind == "input" else 2  # the input has no gradient
            expected = passes * naive_edge_elements(producer, consumer, pconf, qconf) * 4
            assert moved[row, column] == expected, (producer.name, consumer.name, pconf, qconf)


def test_search_space_matrices_match_single_pair_evaluation():
    cost = model_for(ZOO_GRAPH, 4)
    producer, consumer = ZOO_GRAPH.by_name["stem"], ZOO_GRAPH.by_name["grouped"]
    seconds, moved = cost.edge(producer, consumer)
    pconfs, qconfs = cost.configs["stem"], cost.configs["grouped"]
    for row, column in [(0, 0), (3, 17), (len(pconfs) - 1, len(qconfs) - 1)]:
        one_seconds, one_moved = cost.edge(producer, consumer, [pconfs[row]], [qconfs[column]])
        assert one_moved[0, 0] == moved[row, column]
        assert one_seconds[0, 0] == pytest.approx(seconds[row, column])


def naive_edge(cost, producer, consumer, pconf, qconf) -> tuple[float, int]:
    """(seconds, bytes) of one pair by the definition, tile by tile and device by device."""
    input_index = consumer.inputs.index(producer.name)

    def box(layer, config, index, needed):
        ranges = []
        for dim in range(5):
            out = output_ranges(layer, dim, config.degrees[dim])[index[dim]]
            ranges.append(needed_range(layer, input_index, dim, out) if needed else out)
        return ranges

    def shared(have, need) -> int:
        volume = 1
        for (h0, h1), (n0, n1) in zip(have, need, strict=True):
            volume *= max(0, min(h1, n1) - max(h0, n0))
        return volume

    def priced(shares, receivers) -> float:
        """A device's ingress: each (sender, receiver, elements) over the link between them,
        whose port the receiving config's devices behind it share."""
        seconds = 0.0
        for sender, receiver, elements in shares:
            link = cost.cluster.link(sender, receiver)
            behind = sum(d // link.shared_by == receiver // link.shared_by for d in receivers)
            seconds += elements * 4 / link.bandwidth * behind + link.latency
        return seconds

    have = {device: box(producer, pconf, index, False) for index, device in pconf.tiles()}
    need = {device: box(consumer, qconf, index, True) for index, device in qconf.tiles()}
    forward = backward = 0.0
    remote_total = 0
    for device, needed in need.items():  # forward: what each consumer tile receives
        shares = [(d, device, shared(h, needed)) for d, h in have.items() if d != device]
        shares = [share for share in shares if share[2] > 0]
        forward = max(forward, priced(shares, qconf.devices))
        remote_total += sum(elements for _, _, elements in shares)
    for device, held in have.items():  # backward: the gradients of what each tile sent
        shares = [(d, device, shared(held, needed)) for d, needed in need.items()
                  if d != device]
        backward = max(backward, priced([share for share in shares if share[2] > 0],
                                        pconf.devices))
    passes = 1 if producer.kind == "input" else 2
    if producer.kind == "input":
        backward = 0.0
    return forward + backward, passes * remote_total * 4


@pytest.mark.parametrize(("model", "devices", "placement"), [
    ("tiny_cnn", 4, "origin"), ("tiny_cnn", 8, "aligned"), ("lenet5", 8, "origin"),
    ("resnet18", 4, "aligned"), ("resnet18", 8, "origin"), ("inception_v3", 4, "origin"),
])
def test_search_space_matrices_equal_the_definition_pair_by_pair(model, devices, placement):
    """The vectorised matrices (blocked by device extent, int32 where safe, tables per pair of
    dims) against single-pair evaluation and an independent tile-by-tile count."""
    graph = build_graph(model, batch=4 * devices, image_size=32)
    cost = CostModel(graph, CLUSTER, devices, AnalyticCompute(CLUSTER), placement=placement)
    for layer in graph.layers:  # t_c's tiles from cached per-dim parts: largest_tile's
        assert all(cost.tiles(layer).largest(config) == largest_tile(layer, config)
                   for config in cost.configs[layer.name])
        assert cost.configs[layer.name] == configs_for(layer, devices, placement)
    rng = random.Random(f"{model}-{devices}")
    done = set()
    for producer_name, consumer_name in graph.edges:
        producer, consumer = graph.by_name[producer_name], graph.by_name[consumer_name]
        seconds, moved = cost.edge(producer, consumer)
        key = (seconds.tobytes(), moved.tobytes())
        # a matrix shared with an earlier edge (repeated blocks, equal branches) is checked
        # at a few pairs against this edge's own definition
        samples = 2 if key in done else 12
        done.add(key)
        pconfs, qconfs = cost.configs[producer_name], cost.configs[consumer_name]
        pairs = {(0, 0), (len(pconfs) - 1, len(qconfs) - 1)}
        pairs |= {(rng.randrange(len(pconfs)), rng.randrange(len(qconfs)))
                  for _ in range(samples)}
        for row, column in sorted(pairs):
            one_seconds, one_moved = cost.edge(producer, consumer, [pconfs[row]],
                                               [qconfs[column]])
            assert one_moved[0, 0] == moved[row, column]
            assert one_seconds[0, 0] == seconds[row, column]
            expected_seconds, expected_bytes = naive_edge(cost, producer, consumer,
                                                          pconfs[row], qconfs[column])
            assert moved[row, column] == expected_bytes, (producer_name, consumer_name, row)
            assert seconds[row, column] == pytest.approx(expected_seconds, rel=1e-12, abs=0)


# Nodes of 6 in PCIe groups of 2, racks of 2 nodes: units that aligned blocks straddle; a
# node's InfiniBand ports each shared by 3 devices, its rack ports by 2
ODD_CLUSTER = CLUSTER.model_copy(update={
    "nodes": 3, "devices_per_node": 6,
    "groups": DeviceGroups(size=2, link=Link(bandwidth=40e9, latency=2e-6)),
    "links": CLUSTER.links.model_copy(update={
        "inter_node": CLUSTER.links.inter_node.model_copy(update={"shared_by": 3})}),
    "racks": Racks(nodes_per_rack=2, link=Link(bandwidth=5e9, latency=30e-6, shared_by=2))})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), devices=st.sampled_from([4, 8, 16]),
       cluster=st.sampled_from([CLUSTER, load_cluster("k20x8"), ODD_CLUSTER]),
       aligned=st.booleans())
def test_configs_on_scattered_devices_equal_the_definition(seed, devices, cluster, aligned):
    """The matrices look at each pair's own devices only (forward the consumer's, backward the
    producer's): right for any device order, not only for aligned blocks, and for units of
    the cluster that blocks straddle."""
    devices = min(devices, cluster.num_devices)
    rng = random.Random(seed)
    cost = model_for(ZOO_GRAPH, devices, cluster)
    producer, consumer = rng.choice([
        (ZOO_GRAPH.by_name[u], ZOO_GRAPH.by_name[v]) for u, v in ZOO_GRAPH.edges
    ])

    def scattered(layer):
        configs = rng.sample(enumerate_configs(layer, devices), 4)
        if aligned:
            return configs
        return [config.model_copy(update={"devices": tuple(rng.sample(range(devices),
                                                                      config.size))})
                for config in configs]

    pconfs, qconfs = scattered(producer), scattered(consumer)
    seconds, moved = cost.edge(producer, consumer, pconfs, qconfs)
    for row, pconf in enumerate(pconfs):
        for column, qconf in enumerate(qconfs):
            expected_seconds, expected_bytes = naive_edge(cost, producer, consumer, pconf, qconf)
            assert moved[row, column] == expected_bytes, (pconf, qconf)
            assert seconds[row, column] == pytest.approx(expected_seconds, rel=1e-12, abs=0)


def test_each_element_crosses_its_own_link():
    """p100x16-2018 (NVLink inside a node of 4, InfiniBand across): a tensor split over devices 3
    and 4, one per node, read by devices 2 and 5, each beside its sender. No byte crosses
    InfiniBand though the producer's devices span two nodes; device 0, reading all four
    quarters from devices 2-5, takes two over NVLink and two over InfiniBand, one after the
    other."""
    graph = build_graph("tiny_cnn", batch=8, image_size=8)
    producer, consumer = graph.layers[1], graph.layers[2]  # two convs: a sample needs its own
    half = math.prod(as_view(producer.output_shape)) // 2
    nvlink, infiniband = CLUSTER.links.intra_node, CLUSTER.links.inter_node
    cost = model_for(graph, 8)
    seconds, moved = cost.edge(producer, consumer, [P("n2c1h1w1@3-4")], [P("n2c1h1w1@2,5")])
    assert moved[0, 0] == 2 * 2 * half * 4
    # forward: each reader takes its half; backward: each sender takes the gradient back
    assert seconds[0, 0] == pytest.approx(2 * (half * 4 / nvlink.bandwidth + nvlink.latency),
                                          rel=1e-12)
    seconds, moved = cost.edge(producer, consumer, [P("n4c1h1w1@2-5")], [P("n1c1h1w1@0")])
    quarter = half // 2
    # backward, devices 4 and 5 take their gradients through node 1's one InfiniBand port
    # (shared_by 4) at once: each at half its bandwidth
    assert infiniband.shared_by == 4
    assert seconds[0, 0] == pytest.approx(
        2 * (quarter * 4 / nvlink.bandwidth + nvlink.latency)
        + 2 * (quarter * 4 / infiniband.bandwidth + infiniband.latency)
        + 2 * quarter * 4 / infiniband.bandwidth + infiniband.latency, rel=1e-12)


@pytest.mark.parametrize(("model", "devices"), [("inception_v3", 8), ("resnet18", 16)])
def test_vectorised_roofline_equals_the_roofline_of_each_largest_tile(model, devices):
    """t_c (passes and update) over a whole search space from per-dimension lengths, once per
    distinct degrees (an aligned space places each at many blocks), against one tile at a
    time."""
    graph = build_graph(model, batch=4 * devices, image_size=32)
    cost = model_for(graph, devices)
    roofline = AnalyticCompute(CLUSTER)
    for layer in graph.layers:
        configs = cost.configs[layer.name]
        assert len({config.degrees for config in configs}) < len(configs)
        tiles = [largest_tile(layer, c) for c in configs]
        passes = [roofline.tile_seconds(layer, tile) for tile in tiles]
        assert cost.pass_seconds(layer, configs).tolist() == passes, layer.name
        updates = [roofline.update_seconds(layer, tile) for tile in tiles]
        assert cost.update_seconds(layer, configs) == pytest.approx(updates, rel=1e-12), (
            layer.name)
        assert cost.compute_seconds(layer, configs) == pytest.approx(
            np.add(passes, updates), rel=1e-12), layer.name


def test_int64_element_counts_give_the_same_matrices(monkeypatch):
    """Element counts run in int32 only where no product can reach 2^31; both agree."""
    graph = build_graph("resnet18", batch=32, image_size=32)
    edges = [(graph.by_name[u], graph.by_name[v]) for u, v in graph.edges[:6]]
    narrow = [model_for(graph, 8).edge(u, v) for u, v in edges]
    monkeypatch.setattr(cost_tables, "_INT32_LIMIT", 0)
    wide = [model_for(graph, 8).edge(u, v) for u, v in edges]
    for (s32, b32), (s64, b64) in zip(narrow, wide, strict=True):
        assert np.array_equal(s32, s64) and np.array_equal(b32, b64)


def test_roofline_compute_scales_with_the_tile():
    """Without SM figures (a CPU, a calibrated cluster) t_c is the roofline: in proportion
    to the tile."""
    graph = build_graph("vgg16", batch=64)
    device = CLUSTER.device.model_copy(update={"multiprocessors": None, "kernel_latency": None})
    cost = model_for(graph, 4, CLUSTER.model_copy(update={"device": device}))
    conv = graph.by_name["features_2"]
    configs = [P("n1c1h1w1@0"), P("n2c1h1w1@0-1"), P("n4c1h1w1@0-3")]
    whole, half, quarter = cost.pass_seconds(conv, configs)
    assert whole == pytest.approx(2 * half, rel=1e-6)
    assert half == pytest.approx(2 * quarter, rel=1e-6)
    # every sample split updates all the weights; a channel split updates its shard
    updates = cost.update_seconds(conv, [*configs, P("n1c2h1w1@0-1")])
    assert updates[0] == updates[1] == updates[2] == pytest.approx(2 * updates[3], rel=1e-6)
    assert cost.compute_seconds(conv, configs).tolist() == pytest.approx(
        [whole + updates[0], half + updates[1], quarter + updates[2]])


def test_more_devices_than_the_cluster_has_is_a_clear_error():
    with pytest.raises(ConfigError, match="has 8 devices, fewer than the 16 asked"):
        CostModel(build_graph("tiny_cnn"), load_cluster("k20x8"), 16,
                  AnalyticCompute(load_cluster("k20x8")))


def test_evaluate_names_missing_layers():
    graph = build_graph("tiny_cnn", batch=4)
    with pytest.raises(ConfigError, match="no config for layer"):
        model_for(graph, 2).evaluate({})


def test_the_view_aligns_spatial_dims_to_the_right():
    assert as_view((8, 10)) == (8, 10, 1, 1, 1)
    assert as_view((8, 3, 100)) == (8, 3, 1, 1, 100)
    assert as_view((8, 3, 32, 24)) == (8, 3, 1, 32, 24)
    assert as_view((8, 3, 16, 32, 24)) == (8, 3, 16, 32, 24)


def test_the_parameter_server_reaches_each_replica_over_its_own_link():
    """Data parallelism over p100x16-2018's 16 GPUs: the server (the first device) sends and
    receives the 3 replicas of its node over NVLink and the 12 of the other nodes over
    InfiniBand, not all 15 over the group's slowest link."""
    graph = build_graph("alexnet", batch=32)
    cost = model_for(graph, 16)
    fc = graph.by_name["classifier_1"]
    seconds, moved = cost.sync(fc, [P("n16c1h1w1@0-15")])
    shard = fc.param_count * 4
    nvlink, infiniband = CLUSTER.links.intra_node, CLUSTER.links.inter_node
    assert seconds[0] == pytest.approx(
        2 * 3 * (nvlink.latency + shard / nvlink.bandwidth)
        + 2 * 12 * (infiniband.latency + shard / infiniband.bandwidth), rel=1e-12)
    assert moved[0] == 2 * 15 * shard


def test_parameter_servers_of_a_channel_split_queue_at_their_node_port():
    """n4c4 on p100x16-2018: the four groups' servers (their first devices, 0-3) sit on node 0 and
    each reaches its three replicas on nodes 1-3 over InfiniBand. Alone each server's round
    trips take 2 x 3 messages; the node's one port (shared_by 4) carries all 4 x 3 gradients
    in, and as many updates out: 12 messages one way, twice a server's own bytes."""
    graph = build_graph("alexnet", batch=32)
    fc = graph.by_name["classifier_1"]
    config = [P("n4c4h1w1@0-15")]
    infiniband = CLUSTER.links.inter_node
    shard = fc.param_count // 4 * 4  # bytes of one group's quarter of the weights
    shared = model_for(graph, 16).sync(fc, config)[0][0]
    assert shared == pytest.approx(12 * shard / infiniband.bandwidth, rel=1e-12)
    own_ports = CLUSTER.model_copy(update={"links": CLUSTER.links.model_copy(update={
        "inter_node": infiniband.model_copy(update={"shared_by": 1})})})
    alone = model_for(graph, 16, own_ports).sync(fc, config)[0][0]
    assert alone == pytest.approx(2 * 3 * (infiniband.latency + shard / infiniband.bandwidth),
                                  rel=1e-12)
    # data parallelism has one server: its own round trips (30 messages) outlast its port's 12
    data = [P("n16c1h1w1@0-15")]
    assert model_for(graph, 16).sync(fc, data)[0][0] == model_for(
        graph, 16, own_ports).sync(fc, data)[0][0]


def test_rings_crossing_one_shared_port_split_its_bandwidth():
    """Under ring sync, n4c4's four replica groups (one device per node each) all cross every
    node's one InfiniBand port: each ring runs at a quarter of its bandwidth; n16's one ring
    crosses each port once and keeps it whole."""
    ring = CLUSTER.model_copy(update={"sync": "ring"})
    graph = build_graph("alexnet", batch=32)
    fc = graph.by_name["classifier_1"]
    infiniband = CLUSTER.links.inter_node
    quarter = fc.param_count // 4 * 4
    seconds = model_for(graph, 16, ring).sync(fc, [P("n4c4h1w1@0-15")])[0][0]
    assert seconds == pytest.approx(
        2 * 3 * (infiniband.latency + -(-quarter // 4) / (infiniband.bandwidth / 4)), rel=1e-12)
    whole = fc.param_count * 4
    assert model_for(graph, 16, ring).sync(fc, [P("n16c1h1w1@0-15")])[0][0] == pytest.approx(
        2 * 15 * (infiniband.latency + -(-whole // 16) / infiniband.bandwidth), rel=1e-12)


def test_scores_split_by_class_pay_the_losss_all_reduces():
    """The cross-entropy over scores split by class all-reduces each sample's maximum, then
    its two sums, over the class group: t_s of the output layer, with no sync bytes (the
    runtime counts them as the loss's), in the node vector the search sees."""
    graph = build_graph("tiny_cnn", 8, 32, 10)
    cluster = load_cluster("local")
    cost = CostModel(graph, cluster, 2, AnalyticCompute(cluster))
    link = cluster.slowest_link([0, 1])
    output = graph.by_name[graph.outputs[0]]
    by_class = ParallelConfig(c=2, devices=(0, 1))
    seconds, moved = cost.sync(output, [by_class])
    loss = link.allreduce_seconds(8 * 4, 2) + link.allreduce_seconds(2 * 8 * 4, 2)
    assert seconds[0] == pytest.approx(loss)
    assert moved[0] == 0
    compute = cost.compute_seconds(output, [by_class])[0]
    assert cost.node_seconds(output)[cost.configs[output.name].index(by_class)] == (
        pytest.approx(compute + loss))
    # a layer inside the network, split by channel too, has nothing to synchronise
    assert cost.sync(graph.by_name["conv2"], [ParallelConfig(c=2, devices=(0, 1))])[0][0] == 0
