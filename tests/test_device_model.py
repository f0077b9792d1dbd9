"""The analytic device model: waves over the SMs, a launch latency per kernel, memory-bound ops
at memory bandwidth, the host's floor under a small tile, and the search's vectorised prices
equal to one tile's."""

from __future__ import annotations

import numpy as np
import pytest

from layerwise.strategies.cost.compute_time import AnalyticCompute
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.hardware.cluster import load_cluster
from layerwise.strategies.hardware.device_model import (
    GEMM_EFFICIENCY,
    SPLIT_FACTORS,
    TILE_SHAPES,
    DeviceModel,
    Gemm,
    blocks_per_multiprocessor,
    layer_gemms,
    op_kind_efficiencies,
)
from layerwise.strategies.model.graph import BYTES_PER_ELEMENT, build_graph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.tiles import largest_tile

P100 = load_cluster("p100x16-2018")
P = ParallelConfig.parse


def test_a_kernel_of_one_wave_and_a_tenth_costs_two_waves():
    """With one tile shape and no split, a GEMM of 1.1 waves of blocks costs two waves."""
    model = DeviceModel(multiprocessors=56, flops_per_second=1e12, bytes_per_second=1e30,
                        kernel_latency=0.0, tile_shapes=TILE_SHAPES[:1], split_factors=(1,))
    slots = 56 * blocks_per_multiprocessor(TILE_SHAPES[0])
    edge = TILE_SHAPES[0][0]

    def seconds(blocks: int) -> float:
        rows = blocks * edge
        return model.gemm_seconds(np.array([2.0 * rows * edge * 1024]), gemm(rows, edge, 1024))[0]

    assert seconds(int(slots * 1.1)) == pytest.approx(2 * seconds(slots))
    # a kernel with fewer blocks than slots takes as long as a full wave of its blocks
    assert seconds(4) == pytest.approx(seconds(slots))


def gemm(rows, columns, depth) -> Gemm:
    return Gemm(*(np.atleast_1d(np.asarray(size)) for size in (rows, columns, depth)))


def test_a_gemm_with_one_small_dimension_is_not_priced_at_one_tile_shapes_waves():
    """DeepBench's 1760 x 128 x 1760 on a P100 (56 SMs, 732 GB/s): 14 blocks of 128 x 128 on
    112 slots. The fixed tile prices it several times a large GEMM's rate; the model picks a
    smaller tile or a split of the reduction and prices it within 2x of that rate."""
    device = dict(multiprocessors=56, flops_per_second=8.93e12, bytes_per_second=732e9,
                  kernel_latency=5e-6)
    problem = gemm(1760, 128, 1760)
    flops = np.array([2.0 * 1760 * 128 * 1760])
    at_full_rate = flops[0] / device["flops_per_second"]
    fixed = DeviceModel(**device, tile_shapes=TILE_SHAPES[:1], split_factors=(1,))
    assert fixed.gemm_seconds(flops, problem)[0] > 5 * at_full_rate
    chosen = DeviceModel(**device)
    assert chosen.gemm_seconds(flops, problem)[0] < 2 * at_full_rate
    assert chosen.chosen_kernel(flops[0], problem) != (TILE_SHAPES[0], 1)


def test_a_large_gemm_keeps_the_large_tile_unsplit():
    """Smaller tiles reuse each loaded element less and a split only adds its reduction, so a
    GEMM that fills the device many times over runs the 128 x 128 tile whole."""
    model = DeviceModel(multiprocessors=56, flops_per_second=8.93e12, bytes_per_second=732e9,
                        kernel_latency=5e-6)
    problem = gemm(7680, 5481, 2560)
    assert model.chosen_kernel(2.0 * 7680 * 5481 * 2560, problem) == (TILE_SHAPES[0], 1)


def test_a_split_pays_the_pass_over_its_partial_outputs():
    """Each split of the reduction costs at least two passes (write, read) over its rows x
    columns partial output at memory bandwidth plus the summing kernel's launch, however
    fast the device computes."""
    model = DeviceModel(multiprocessors=56, flops_per_second=1e30, bytes_per_second=1e9,
                        kernel_latency=1e-6)
    kernels = model.gemm_kernel_seconds(np.array([2.0 * 256 * 256 * 4096]),
                                        gemm(256, 256, 4096), GEMM_EFFICIENCY)[0]
    for index, split in enumerate(SPLIT_FACTORS):
        reduction = 2 * split * 256 * 256 * BYTES_PER_ELEMENT / 1e9 + 1e-6 if split > 1 else 0
        assert np.all(kernels[:, index] >= reduction)


def test_without_split_k_a_small_gemm_leaves_sms_idle_but_backward_weights_still_splits():
    """One worker's slice of AlexNet's FC6 in OWT on 8 K20s (13 SMs): 128 rows x 512 of the
    4,096 neurons over 9,216 inputs. Unsplit, the forward's few blocks leave most SMs idle; a
    library with split-K fills them; backward weights splits its sum over the rows either way."""
    device = dict(multiprocessors=13, flops_per_second=2e12, bytes_per_second=208e9,
                  kernel_latency=5e-6)
    problems = layer_gemms(np.array([128]), np.array([512]), np.array([128]), 9216, 1)
    flops = np.array([2.0 * 128 * 512 * 9216])
    split = DeviceModel(**device).layer_gemm_seconds(flops, problems, (1.0, 1.0, 1.0))
    unsplit = DeviceModel(**device, split_k=False).layer_gemm_seconds(flops, problems,
                                                                       (1.0, 1.0, 1.0))
    assert unsplit[0] > 2 * split[0]
    assert unsplit[2] == split[2]


@pytest.mark.parametrize("grow", ["rows", "columns", "depth"])
@pytest.mark.parametrize(("rows", "columns", "depth"), [
    (1, 4096, 9216), (128, 512, 9216), (1760, 128, 1760), (64, 363, 1), (6272, 512, 4608)])
def test_a_gemms_time_never_falls_when_its_work_grows(grow, rows, columns, depth):
    model = DeviceModel(multiprocessors=56, flops_per_second=1e13, bytes_per_second=732e9,
                        kernel_latency=5e-6)
    sizes = {"rows": rows, "columns": columns, "depth": depth}
    sizes[grow] = np.arange(sizes[grow], sizes[grow] + 3000)
    problem = gemm(*(np.broadcast_to(sizes[name], (3000,)) for name in ("rows", "columns",
                                                                          "depth")))
    flops = 2.0 * problem.rows * problem.columns * problem.depth
    seconds = model.gemm_seconds(flops, problem)
    assert np.all(np.diff(seconds) >= 0)


@pytest.mark.parametrize("model_name", ["alexnet", "vgg16"])
def test_no_chosen_kernel_beats_the_devices_peak(model_name):
    """Each layer's three GEMMs, at every degree of a batch and a channel split: the fastest
    kernel still does every multiply-add at no more than the device's peak rate (a smaller
    tile or a split reorganises the work, never removes it)."""
    graph = build_graph(model_name, batch=32)
    model = AnalyticCompute(P100).device_model
    for layer in graph.layers:
        if layer.kind not in ("conv", "linear"):
            continue
        for degree in (1, 4, 16):
            rows = np.prod(layer.output_shape) // layer.output_shape[1] // degree
            out_channels = -(-layer.output_shape[1] // degree)
            in_channels = layer.input_shapes[0][1]
            in_rows = np.prod(layer.input_shapes[0]) // in_channels
            kernel = layer.geometry.kernel if layer.geometry else (1, 1)
            for problem in layer_gemms(np.array([rows]), np.array([out_channels]),
                                       np.array([in_rows]), in_channels,
                                       kernel[0] * kernel[1]):
                flops = 2.0 * float(problem.rows[0] * problem.columns[0] * problem.depth[0])
                seconds = model.gemm_seconds(np.array([flops]), problem)[0]
                assert seconds >= flops / model.flops_per_second * (1 - 1e-12), (
                    layer.name, degree, model.chosen_kernel(flops, problem))


def test_a_layers_time_falls_slower_than_its_work():
    """Jia et al. 2018, Fig. 3: more devices shorten a tile less than in proportion. The last
    conv of VGG-16 on 32 images split over up to 16 devices: no step more than halves the
    time, and the 16th share of the work costs more than a 16th of the whole (partly filled
    waves, split reductions and launches)."""
    graph = build_graph("vgg16", batch=32)
    compute = AnalyticCompute(P100)
    conv = graph.by_name["features_28"]
    seconds = np.array([compute.tile_seconds(conv, largest_tile(conv, P(config))) for config in
                        ("n1c1h1w1@0", "n2c1h1w1@0-1", "n4c1h1w1@0-3", "n8c1h1w1@0-7",
                         "n16c1h1w1@0-15")])
    assert np.all(seconds[:-1] / seconds[1:] <= 2)
    assert 16 * seconds[-1] > seconds[0]
    assert seconds[-1] > 3 * P100.device.kernel_latency


def test_a_pooling_layer_is_priced_at_memory_bandwidth_plus_its_launches():
    graph = build_graph("vgg16", batch=64)
    pool = graph.by_name["features_4"]
    compute = AnalyticCompute(P100)
    tile = largest_tile(pool, P("n1c1h1w1@0"))
    elements = np.prod(pool.output_shape) + np.prod(pool.input_shapes[0])
    expected = (2 * elements * BYTES_PER_ELEMENT / P100.device.memory_bandwidth
                + 2 * P100.device.kernel_latency)
    assert compute.tile_seconds(pool, tile) == pytest.approx(expected)


def test_the_update_pays_bandwidth_and_one_launch_per_weight_tensor():
    graph = build_graph("alexnet", batch=32)
    fc = graph.by_name["classifier_1"]
    compute = AnalyticCompute(P100)
    seconds = compute.update_seconds(fc, largest_tile(fc, P("n1c1h1w1@0")))
    assert seconds == pytest.approx(5 * 4 * fc.param_count / P100.device.memory_bandwidth
                                    + 2 * P100.device.kernel_latency)


def test_a_small_tile_takes_at_least_its_hosts_floor_and_a_large_one_its_kernels():
    """On a preset whose device gives the host's per-layer and per-op cost, a tile takes the
    longer of its kernels and that floor: a pool of two samples' 16x16 maps costs the floor for
    one op, a fused conv+BatchNorm+ReLU tile for three; a large convolution keeps its kernels'
    time."""
    h200 = load_cluster("h200x8")
    layer_s, op_s = h200.device.host_layer_seconds, h200.device.host_op_seconds
    assert (layer_s, op_s) == (pytest.approx(110e-6), pytest.approx(44e-6))
    compute = AnalyticCompute(h200)
    small = build_graph("resnet18", batch=2, image_size=32)
    pool = small.by_name["maxpool"]
    assert compute.tile_seconds(pool, largest_tile(pool, P("n1c1h1w1@0"))) == pytest.approx(
        layer_s + op_s)
    conv = small.by_name["conv1"]
    assert len(conv.fused) == 2
    assert compute.tile_seconds(conv, largest_tile(conv, P("n1c1h1w1@0"))) == pytest.approx(
        layer_s + 3 * op_s)
    without = AnalyticCompute(h200.model_copy(update={"device": h200.device.model_copy(
        update={"host_layer_seconds": None, "host_op_seconds": None})}))
    assert without.tile_seconds(pool, largest_tile(pool, P("n1c1h1w1@0"))) < layer_s + op_s
    large = build_graph("resnet18", batch=256).by_name["conv1"]
    tile = largest_tile(large, P("n1c1h1w1@0"))
    assert without.tile_seconds(large, tile) > layer_s + 3 * op_s
    assert compute.tile_seconds(large, tile) == without.tile_seconds(large, tile)


@pytest.mark.parametrize(("model", "preset"), [("alexnet", "p100x16-2018"),
                                               ("inception_v3", "p100x16-2018"),
                                               ("resnet18", "h200x8")])
def test_the_vectorised_prices_equal_one_tiles(model, preset):
    """The search's vectors equal one tile's price, the host's floor included (h200x8)."""
    cluster = load_cluster(preset)
    graph = build_graph(model, batch=64, image_size=96 if model == "inception_v3" else 224)
    cost = CostModel(graph, cluster, 4, AnalyticCompute(cluster))
    for layer in graph.layers:
        configs = cost.configs[layer.name]
        vector = cost.pass_seconds(layer, configs)
        one = [cost.compute.tile_seconds(layer, largest_tile(layer, config))
               for config in configs]
        assert vector == pytest.approx(one, rel=1e-12), layer.name


def test_a_conv_tile_under_one_wave_saves_little_by_halving():
    """conv5 of AlexNet at batch 4: 676 output rows of 256 channels, a few blocks of any tile on
    the P100's SMs; half the batch runs in (almost) the same waves and the same launches."""
    graph = build_graph("alexnet", batch=4)
    conv = graph.by_name["features_10"]
    compute = AnalyticCompute(P100)
    whole = compute.tile_seconds(conv, largest_tile(conv, P("n1c1h1w1@0")))
    half = compute.tile_seconds(conv, largest_tile(conv, P("n2c1h1w1@0-1")))
    assert half > 0.6 * whole  # the roofline: half


@pytest.mark.parametrize(("model", "layer", "shares"), [
    # AlexNet's conv1: 11x11, stride 4: implicit GEMM, its input gradient strided
    ("alexnet", "features_0", (0.73, 0.31, 0.50)),
    # AlexNet's conv2: 5x5, stride 1
    ("alexnet", "features_3", (0.73, 0.62, 0.50)),
    # VGG-16's 3x3 stride-1 convolutions: Winograd in all three passes
    ("vgg16", "features_2", (0.63, 0.63, 0.81)),
    # a fully connected layer: the large SGEMM itself
    ("vgg16", "classifier_0", (1.0, 1.0, 1.0)),
])
def test_each_op_kind_runs_at_its_deepbench_share_of_a_large_gemm(model, layer, shares):
    graph = build_graph(model, batch=8)
    assert op_kind_efficiencies(graph.by_name[layer]) == shares


def test_a_convolutions_passes_are_priced_at_their_op_kinds_shares():
    """AlexNet's conv2 at batch 64 on a device without latency or memory limit: forward,
    backward data and backward weights, each its GEMM at its DeepBench share."""
    graph = build_graph("alexnet", batch=64)
    conv = graph.by_name["features_3"]
    model = DeviceModel(multiprocessors=56, flops_per_second=1e13, bytes_per_second=1e30,
                        kernel_latency=0.0)
    out_channels = conv.output_shape[1]
    rows = np.prod(conv.output_shape) // out_channels
    in_channels = conv.input_shapes[0][1]
    in_rows = np.prod(conv.input_shapes[0]) // in_channels
    flops = np.array([float(conv.flops)])
    problems = layer_gemms(np.array([rows]), np.array([out_channels]), np.array([in_rows]),
                           in_channels, 25)
    expected = sum(model.gemm_seconds(flops, problem, share)
                   for problem, share in zip(problems, (0.73, 0.62, 0.50), strict=True))
    seconds = model.pass_seconds(conv, np.array([np.prod(conv.output_shape)]),
                                 np.array([out_channels]),
                                 np.array([np.prod(conv.input_shapes[0])]),
                                 np.array([conv.param_count]))
    assert seconds == pytest.approx(expected, rel=1e-12)
