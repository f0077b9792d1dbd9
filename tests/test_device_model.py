"""The analytic device model: waves over the SMs, a launch latency per kernel, memory-bound ops
at memory bandwidth, and the search's vectorised prices equal to one tile's."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.cluster import load_cluster
from strategies.compute import AnalyticCompute
from strategies.cost import CostModel
from strategies.device_model import (
    BLOCKS_PER_MULTIPROCESSOR,
    TILE_EDGE,
    DeviceModel,
    op_kind_efficiencies,
    tiles,
)
from strategies.graph import BYTES_PER_ELEMENT, build_graph
from strategies.space import ParallelConfig
from strategies.tiles import largest_tile

P100 = load_cluster("p100x16")
P = ParallelConfig.parse


def test_a_kernel_of_one_wave_and_a_tenth_costs_two_waves():
    model = DeviceModel(multiprocessors=56, flops_per_second=1e12, bytes_per_second=1e12,
                        kernel_latency=0.0)
    slots = 56 * BLOCKS_PER_MULTIPROCESSOR
    per_block = 1e6
    one_wave = model.gemm_seconds(np.array([slots * per_block]), np.array([slots]))[0]
    tenth_more = int(slots * 1.1)
    longer = model.gemm_seconds(np.array([tenth_more * per_block]), np.array([tenth_more]))[0]
    assert longer == pytest.approx(2 * one_wave)
    # a kernel with fewer blocks than slots takes as long as a full wave of its blocks
    few = model.gemm_seconds(np.array([4 * per_block]), np.array([4]))[0]
    assert few == pytest.approx(one_wave)


def test_a_layers_time_stops_falling_as_its_degree_grows():
    """Jia et al. 2018, Fig. 3: past some degree more devices no longer shorten a tile. The
    last conv of VGG-16 on 32 images: 6,272 output rows x 512 channels are 196 blocks, two
    waves of the P100's 112 slots; a sample split in two fits one wave, and beyond that the
    wave only empties."""
    graph = build_graph("vgg16", batch=32)
    compute = AnalyticCompute(P100)
    conv = graph.by_name["features_28"]
    seconds = np.array([compute.tile_seconds(conv, largest_tile(conv, P(config))) for config in
                        ("n1c1h1w1@0", "n2c1h1w1@0-1", "n4c1h1w1@0-3", "n8c1h1w1@0-7",
                         "n16c1h1w1@0-15")])
    gains = seconds[:-1] / seconds[1:]
    assert gains[0] > 1.5  # two waves become one
    assert np.all(gains[1:] < 1.5)  # one wave stays one: far from the roofline's 2x
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


@pytest.mark.parametrize("model", ["alexnet", "inception_v3"])
def test_the_vectorised_prices_equal_one_tiles(model):
    graph = build_graph(model, batch=64, image_size=96 if model == "inception_v3" else 224)
    cost = CostModel(graph, P100, 4, AnalyticCompute(P100))
    for layer in graph.layers:
        configs = cost.configs[layer.name]
        vector = cost.pass_seconds(layer, configs)
        one = [cost.compute.tile_seconds(layer, largest_tile(layer, config))
               for config in configs]
        assert vector == pytest.approx(one, rel=1e-12), layer.name


def test_a_conv_tile_under_one_wave_costs_a_wave():
    """conv5 of AlexNet at batch 4 on 16 channels: far fewer blocks than the P100's slots."""
    graph = build_graph("alexnet", batch=4)
    conv = graph.by_name["features_10"]
    rows = 4 * conv.output_shape[2] * conv.output_shape[3]
    assert -(-rows // TILE_EDGE) < 56 * BLOCKS_PER_MULTIPROCESSOR
    compute = AnalyticCompute(P100)
    whole = compute.tile_seconds(conv, largest_tile(conv, P("n1c1h1w1@0")))
    half = compute.tile_seconds(conv, largest_tile(conv, P("n2c1h1w1@0-1")))
    assert half > 0.9 * whole  # half the work, (almost) the same waves and launches


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
    backward data and backward weights, each its GEMM time over its DeepBench share."""
    graph = build_graph("alexnet", batch=64)
    conv = graph.by_name["features_3"]
    model = DeviceModel(multiprocessors=56, flops_per_second=1e13, bytes_per_second=1e30,
                        kernel_latency=0.0)
    out_channels = conv.output_shape[1]
    rows = np.prod(conv.output_shape) // out_channels
    in_channels = conv.input_shapes[0][1]
    in_rows = np.prod(conv.input_shapes[0]) // in_channels
    flops = np.array([conv.flops])
    expected = (model.gemm_seconds(flops, tiles(np.array([rows]), out_channels)) / 0.73
                + model.gemm_seconds(flops, tiles(np.array([in_rows]), in_channels)) / 0.62
                + model.weight_gradient_seconds(flops, np.array([out_channels]),
                                                in_channels * 25, np.array([rows])) / 0.50)
    seconds = model.pass_seconds(conv, np.array([np.prod(conv.output_shape)]),
                                 np.array([out_channels]),
                                 np.array([np.prod(conv.input_shapes[0])]),
                                 np.array([conv.param_count]))
    assert seconds == pytest.approx(expected, rel=1e-12)
