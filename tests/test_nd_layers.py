"""1-d and 3-d layers (Jia et al. 2018, Table 1: 1-D conv/pool {n, c, l}, 3-D {n, c, d, h, w}).

Every layer kind of signals and volumes traces into the same layer graph as the 2-d ones, its
configurations name the layer's own dims (`l`; `d`, `h`, `w`), each tile's op equals its part
of the full op (any split, any window), and networks written the way model libraries write
them (tests/idiom_models.py: Volume, Signal; the zoo's cosmoflow3d, unet3d and m5) train
under searched and depth/height/width plans equal to one process in float64, moving the bytes
the cost model predicts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from typer.testing import CliRunner

import layerwise
from layerwise.flows.benchmark_config import load_config
from layerwise.flows.cli import app
from layerwise.strategies.cost.profile import run_tile
from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model import ops
from layerwise.strategies.model.fx_nodes import count_include_pad
from layerwise.strategies.model.graph import build_graph, trace
from layerwise.strategies.model.input_size import spatial_size
from layerwise.strategies.model.space import (
    DIMS,
    ParallelConfig,
    as_view,
    check_config,
    config_text,
    dim_name,
    enumerate_configs,
    max_degree,
    parallel_dims,
)
from layerwise.strategies.model.tiles import (
    config_boxes,
    largest_tile,
    needed_box,
    needed_range,
    needed_ranges,
    real_box,
)
from layerwise.strategies.model.zoo import build_model, input_shape
from layerwise.strategies.search.baselines import baseline
from layerwise.tasks.stages.prepare_data import load_params

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.mark.parametrize(("model", "shape"), [
    ("tests.idiom_models:Volume", (2, 1, 8, 12, 12)),
    ("tests.idiom_models:Signal", (2, 2, 64)),
    ("cosmoflow3d", (2, 1, 32, 32, 32)),
    ("unet3d", (2, 1, 32, 32, 32)),
    ("m5", (2, 1, 4096)),
])
def test_signals_and_volumes_trace_with_their_parameters(model: str, shape: tuple[int, ...]
                                                         ) -> None:
    graph = build_graph(model, batch=2, image_size=shape[2:], in_channels=shape[1])
    plain = build_model(model, image_size=shape[2:], in_channels=shape[1])
    assert graph.input_shape == shape
    assert graph.param_count == sum(p.numel() for p in plain.parameters())
    spatial = len(shape) - 2
    for layer in graph.layers:
        if layer.geometry is not None:
            assert len(layer.geometry.kernel) == spatial, layer.name
        if len(layer.output_shape) == len(shape) and not layer.max_degrees:
            names = "".join(dim_name(layer, dim) for dim in parallel_dims(layer))
            assert names == ("ncl" if spatial == 1 else "ncdhw"), layer.name


def test_configs_are_written_with_the_layers_own_dims() -> None:
    volume = build_graph("tests.idiom_models:Volume", batch=4, image_size=(8, 12, 12),
                         in_channels=1)
    signal = build_graph("tests.idiom_models:Signal", batch=4, image_size=(64,), in_channels=2)
    conv3d, conv1d = volume.by_name["dilated"], signal.by_name["grouped"]
    deep = ParallelConfig.parse("n1c1d2h2w1@0-3")
    assert config_text(conv3d, deep) == "n1c1d2h2w1@0-3"
    assert config_text(conv3d, ParallelConfig.parse("n4c1h1w1@0-3")) == "n4c1d1h1w1@0-3"
    long = ParallelConfig.parse("n1c2l2@0-3")
    assert long.degrees == (1, 2, 1, 1, 2) and config_text(conv1d, long) == "n1c2l2@0-3"
    check_config(conv3d, deep, 4)
    check_config(conv1d, long, 4)
    with pytest.raises(ConfigError, match="cannot be split along h: it splits along n, c, l"):
        check_config(conv1d, ParallelConfig.parse("n1c1h2w1@0-1"), 4)
    with pytest.raises(ConfigError, match="degree 32 along l exceeds its size 16"):
        check_config(conv1d, ParallelConfig.parse("n1c1l32@0-31"), 32)
    # every config of a layer covers its output exactly once
    for layer in (conv3d, conv1d, volume.by_name["up"], signal.by_name["up"]):
        for config in enumerate_configs(layer, 8):
            boxes = config_boxes(layer, config).values()
            assert sum(math.prod(b - a for a, b in box) for box in boxes) == math.prod(
                layer.output_shape)
    up = volume.by_name["up"]  # a transposed conv splits along c, cutting its weight's dim 1
    assert max_degree(up, "c") == up.output_shape[1] == 8 and not up.held_reason
    grouped = trace(nn.Sequential(nn.ConvTranspose3d(4, 4, 2, groups=2)), (2, 4, 3, 3, 3))
    assert max_degree(grouped.layers[-1], "c") == 1
    assert "grouped ConvTranspose3d" in grouped.layers[-1].held_reason


def test_a_depth_split_reads_the_receptive_field_along_depth() -> None:
    """Output planes [d0, d1) of a 3x1x3 convolution dilated by 2 read input planes
    [d0 * 1 - 2, (d1 - 1) - 2 + 2 * 2], clipped: a halo of two planes each side."""
    graph = build_graph("tests.idiom_models:Volume", batch=2, image_size=(8, 12, 12),
                        in_channels=1)
    dilated = graph.by_name["dilated"]
    depth = DIMS.index("d")
    assert needed_range(dilated, 0, depth, (0, 2)) == (0, 4)
    assert needed_range(dilated, 0, depth, (2, 5)) == (0, 5)
    assert needed_range(dilated, 0, DIMS.index("h"), (1, 3)) == (1, 3)  # kernel 1 along h
    signal = build_graph("tests.idiom_models:Signal", batch=2, image_size=(64,), in_channels=2)
    stem = signal.by_name["stem"]  # kernel 9, stride 2, padding 4 along the length
    assert needed_range(stem, 0, DIMS.index("w"), (8, 16)) == (12, 35)


def test_channel_shards_cut_each_tensor_along_its_own_channel_dim() -> None:
    """A 2-way channel split of every layer that allows it: a transposed convolution's weight
    cut along dim 1, a grouped one's and a PReLU's one slope held whole by both channel tiles
    (the slope marked shared: its gradient sums over all the layer's devices), a conv's along
    dim 0; the shards of the two ranks put together give the whole tensors back."""
    from layerwise.strategies.runtime.plan import build_plan
    from layerwise.strategies.runtime.shards import ShardedModel

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1),
                             nn.ConvTranspose2d(4, 4, 2, 2, groups=2), nn.PReLU(),
                             nn.ConvTranspose2d(4, 6, 3, padding=1), nn.Flatten(),
                             nn.Linear(6 * 8 * 8, 10))
    graph = trace(model(), (4, 1, 4, 4))
    plan = build_plan(graph, dict(baseline("model", graph, 2)), 2)
    full = model().state_dict()
    ranks = [{shard.key: shard for shard in ShardedModel(model(), plan, rank).shards()}
             for rank in (0, 1)]
    for key in ("0.weight", "3.weight"):  # conv (4, 1, 3, 3) by rows, transposed (4, 6, 3, 3)
        dim = 0 if key == "0.weight" else 1
        assert [ranks[r][key].dim for r in (0, 1)] == [dim, dim]
        assert torch.equal(torch.cat([ranks[r][key].tensor.detach() for r in (0, 1)], dim),
                           full[key])
    for key in ("1.weight", "2.weight"):  # grouped transposed weight, the shared slope
        for rank in (0, 1):
            assert torch.equal(ranks[rank][key].tensor.detach(), full[key])
    assert ranks[0]["2.weight"].shared and not ranks[0]["3.weight"].shared


def _window_module(draw: st.DrawFn, spatial: int) -> nn.Module:
    kind = draw(st.sampled_from(["conv", "max", "avg", "adaptive", "transposed", "resize"]))
    sizes = [draw(st.integers(1, 3)) for _ in range(spatial)]
    strides = [draw(st.integers(1, 2)) for _ in range(spatial)]
    conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[spatial - 1]
    if kind == "conv":
        groups = draw(st.sampled_from([1, 2]))
        dilation = [draw(st.integers(1, 2)) for _ in range(spatial)]
        padding = [draw(st.integers(0, size)) for size in sizes]
        return conv(4, 4, sizes, stride=strides, padding=padding, dilation=dilation,
                    groups=groups)
    if kind == "transposed":
        transposed = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)[spatial - 1]
        padding = [draw(st.integers(0, size - 1)) for size in sizes]
        groups = draw(st.sampled_from([1, 2]))  # grouped: c held whole
        return transposed(4, 2 * groups, sizes, stride=strides, padding=padding, groups=groups)
    if kind in ("max", "avg"):
        padding = [draw(st.integers(0, size // 2)) for size in sizes]
        ceil_mode = draw(st.booleans())
        if kind == "max":
            pool = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)[spatial - 1]
            return pool(sizes, strides, padding, ceil_mode=ceil_mode)
        pool = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)[spatial - 1]
        return pool(sizes, strides, padding, ceil_mode=ceil_mode,
                    count_include_pad=draw(st.booleans()))
    if kind == "adaptive":
        pool = draw(st.sampled_from([
            (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d),
            (nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)]))[spatial - 1]
        return pool(tuple(draw(st.integers(1, 4)) for _ in range(spatial)))
    mode = draw(st.sampled_from(["nearest", ("linear", "bilinear", "trilinear")[spatial - 1]]))
    return nn.Upsample(scale_factor=draw(st.sampled_from([2.0, 1.5])), mode=mode,
                       align_corners=draw(st.booleans()) if mode != "nearest" else None)


@st.composite
def window_cases(draw: st.DrawFn) -> tuple[nn.Module, torch.Tensor, tuple[int, ...]]:
    spatial = draw(st.sampled_from([1, 3]))
    module = _window_module(draw, spatial)
    shape = (2, 4, *(draw(st.integers(5, 8)) for _ in range(spatial)))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    degrees = tuple(draw(st.sampled_from([1, 2])) for _ in range(len(DIMS)))
    return module, x, degrees


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window_cases())
def test_every_tiles_needed_range_at_once_is_each_tiles_own(case) -> None:
    """The cost tables ask for the needed ranges of every tile of every power-of-two degree
    along a dim at once (a convolution's or pooling's windows as arrays): each is the range
    `needed_range` gives that tile alone, empty tiles (more tiles than rows) included."""
    module, x, _ = case
    layer = trace(nn.Sequential(module), tuple(x.shape)).layers[-1]
    for dim in range(len(DIMS)):
        size = as_view(layer.output_shape)[dim]
        outs = [(index * size // degree, (index + 1) * size // degree)
                for degree in (1, 2, 4, 8, 16) for index in range(degree)]
        starts, stops = needed_ranges(layer, 0, dim, outs)
        assert [(int(start), int(stop)) for start, stop in zip(starts, stops, strict=True)] == [
            needed_range(layer, 0, dim, out) for out in outs]


@pytest.mark.parametrize(("model", "size", "channels"), [
    ("inception_v3", 75, 3), ("resnet18", 32, 3), ("alexnet", 64, 3),
    ("unet3d", (16, 16, 16), 1), ("m5", (1024,), 1), ("tests.idiom_models:Signal", (64,), 2)])
def test_every_tiles_needed_range_at_once_over_every_layer_of_a_network(model, size,
                                                                        channels) -> None:
    """Every layer's needed ranges at once, on every dim of every input (concatenations'
    shifts, the whole input of a linear layer or a convolution's channels, ranges that pass
    through, windows, and the rest one by one): each is `needed_range`'s for that tile."""
    graph = build_graph(model, batch=4, image_size=size, in_channels=channels)
    kinds = set()
    for layer in graph.layers:
        kinds.add(layer.kind)
        for index in range(len(layer.input_shapes)):
            for dim in range(len(DIMS)):
                extent = as_view(layer.output_shape)[dim]
                outs = [(tile * extent // degree, (tile + 1) * extent // degree)
                        for degree in (1, 2, 4, 8, 16, 32) for tile in range(degree)]
                starts, stops = needed_ranges(layer, index, dim, outs)
                assert [(int(start), int(stop)) for start, stop in zip(
                    starts, stops, strict=True)] == [
                    needed_range(layer, index, dim, out) for out in outs], (layer.name, dim)
    assert {"conv", "linear"} & kinds


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window_cases())
def test_each_tile_of_a_1d_or_3d_window_op_is_its_part_of_the_full_op(case) -> None:
    """Conv, transposed conv (its c split cutting the weight's dim 1), max and average pooling
    (ceil mode, padding in the divisor or not), adaptive pooling and upsampling of signals and
    volumes: each tile of any split,
    computed from its needed input box alone, equals the full op's values there."""
    module, x, wanted = case
    layer = trace(nn.Sequential(module), tuple(x.shape)).layers[-1]
    module.double()
    degrees = {dim: degree if degree <= max_degree(layer, dim) else 1
               for dim, degree in zip(DIMS, wanted, strict=True)}
    config = ParallelConfig(**degrees, devices=tuple(range(math.prod(degrees.values()))))
    check_config(layer, config, config.size)
    with torch.no_grad():
        full = module(x)
        for box in config_boxes(layer, config).values():
            needed = real_box(needed_box(layer, 0, box), x.dim())
            part = x[tuple(slice(*extent) for extent in needed)]
            weight = getattr(module, "weight", None)
            bias = getattr(module, "bias", None)
            if weight is not None:  # the tile's channels along the weight's channel dim
                start, stop = box[1]
                dim = layer.channel_dim("weight", tuple(weight.shape))
                if dim is not None:
                    weight = weight.narrow(dim, start, stop - start)
                bias = bias[start:stop]
            tile = ops.layer_op(layer, [part], weight, bias, box,
                                count_include_pad(layer.op, None))
            expected = full[tuple(slice(*extent) for extent in real_box(box, full.dim()))]
            torch.testing.assert_close(tile, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("model", "sizes", "channels"), [
    ("tests.idiom_models:Volume", (8, 12, 12), 1), ("tests.idiom_models:Signal", (64,), 2),
    ("unet3d", (8, 8, 8), 1)])
def test_every_layer_of_a_signal_or_volume_is_profiled_on_its_tiles(model: str,
                                                                     sizes: tuple[int, ...],
                                                                     channels: int) -> None:
    """The profiler times each tile with the runtime's own ops: every 1-d and 3-d layer kind
    and fused op (BatchNorm, InstanceNorm, Dropout of each rank) runs on its tiles."""
    graph = build_graph(model, batch=4, image_size=sizes, in_channels=channels)
    split = baseline("spatial", graph, 4)
    for layer in graph.layers[1:]:
        for config in (ParallelConfig(n=1, devices=(0,)), split[layer.name]):
            tile = largest_tile(layer, config)
            assert tuple(run_tile(layer, tile).shape) == tile.output_shape, (layer.name, config)


def test_the_spatial_baseline_splits_every_spatial_dim() -> None:
    volume = build_graph("tests.idiom_models:Volume", batch=4, image_size=(8, 12, 12),
                         in_channels=1)
    plan = baseline("spatial", volume, 4)
    assert plan["stem"].degrees == (1, 1, 2, 2, 1)  # (8, 6, 6): depth first, then height
    assert plan["up"].degrees == (1, 1, 2, 2, 1) and plan["fc"].degrees == (4, 1, 1, 1, 1)
    signal = build_graph("tests.idiom_models:Signal", batch=4, image_size=(64,), in_channels=2)
    assert baseline("spatial", signal, 4)["grouped"].degrees == (1, 1, 1, 1, 4)


def test_input_shapes_are_given_as_channels_and_sizes(tmp_path) -> None:
    assert input_shape("cosmoflow3d", 2) == (2, 1, 32, 32, 32)
    assert input_shape("cosmoflow3d", 2, image_size=16) == (2, 1, 16, 16, 16)
    assert input_shape("m5", 2, image_size=(2048,), in_channels=2) == (2, 2, 2048)
    result = runner.invoke(app, ["graph", "unet3d", "--input-shape", "1,16,16,8", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["input_shape"][1:] == [1, 16, 16, 8]
    for arguments, message in (
            (["--input-shape", "1,16,x"], "cannot read --input-shape '1,16,x'"),
            (["--input-shape", "1,16,16"], "unet3d takes (N, C, D, H, W) volumes"),
            (["--input-shape", "1,16,16,16", "--image-size", "16"], "not both"),
            (["--input-shape", "1,18,16,16"], "multiples of 4")):
        result = runner.invoke(app, ["graph", "unet3d", *arguments])
        assert result.exit_code != 0 and message in result.output, (arguments, result.output)
    result = runner.invoke(app, ["graph", "resnet18", "--input-shape", "3,32,48"])
    assert result.exit_code != 0 and "takes square images" in result.output


@pytest.mark.parametrize(("name", "section"), [("volumes3d.yaml", "prepare_fields3d"),
                                              ("signals.yaml", "prepare_signals")])
def test_the_volume_and_signal_configs_fit_their_generated_data(name: str, section: str) -> None:
    """`layerwise run --config configs/volumes3d.yaml` (signals.yaml): the config's model
    takes the inputs params.yaml's stage generates, and its strategies name the spatial plan."""
    config = load_config(ROOT / "configs" / name)
    stage = load_params(ROOT / "params.yaml", section)
    assert stage["dataset"] == config.dataset and "spatial" in config.strategies
    sizes = input_shape(config.models[0].name, config.global_batch, config.image_size)[2:]
    assert sizes == spatial_size(stage["image_size"], len(sizes))
    graph = build_graph(config.models[0].name, batch=config.global_batch,
                        image_size=config.image_size, num_classes=config.classes)
    assert graph.by_name[graph.outputs[0]].output_shape == (config.global_batch, config.classes)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize(("model", "shape"), [("tests.idiom_models:Volume", "1,8,12,12"),
                                              ("tests.idiom_models:Signal", "2,64")])
def test_signals_and_volumes_train_equal_to_one_process(tmp_path, workers_import_tests,
                                                        model: str, shape: str,
                                                        nproc: int) -> None:
    """The searched plan and one with every spatial dim split (and, for the volume, height
    alone) train equal to one process in float64."""
    strategies = "layerwise,spatial" + (",spatial_h" if "Volume" in model else "")
    result = runner.invoke(app, ["verify", model, "--strategy", strategies, "--nproc",
                                 str(nproc), "--input-shape", shape, "--batch", "4",
                                 "--steps", "2", "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {d["strategy"] for d in report["divergences"]} == set(strategies.split(","))
    for divergence in report["divergences"]:
        assert divergence["exact"] is True, divergence


def test_monai_style_units_trace_with_prelu_sharded_or_held() -> None:
    """MONAI's UNet as its docs describe it (tests.idiom_models:MonaiUNet): residual units of
    convolution, InstanceNorm, Dropout and PReLU; a PReLU with a slope per channel splits
    along c with its slopes sharded, one with a shared slope along c with the slope held whole
    by every channel tile."""
    for dims, sizes in ((2, 16), (3, (8, 8, 8))):
        model = "tests.idiom_models:MonaiUNet" if dims == 2 else "tests.idiom_models:monai_unet3d"
        graph = build_graph(model, batch=4, image_size=sizes, in_channels=1)
        plain = build_model(model, image_size=sizes, in_channels=1)
        assert graph.param_count == sum(p.numel() for p in plain.parameters())
        shared, per_channel = graph.by_name["down0_conv_0"], graph.by_name["bottom_conv_0"]
        assert [op.op for op in shared.fused] == [f"InstanceNorm{dims}d", "Dropout", "PReLU"]
        assert shared.shared_param_count == 1 and per_channel.shared_param_count == 0
        assert max_degree(shared, "c") == shared.output_shape[1] and not shared.held_reason
        assert max_degree(per_channel, "c") == 8 and not per_channel.held_reason


@pytest.mark.slow
@pytest.mark.parametrize(("model", "shape", "nproc"), [
    ("tests.idiom_models:MonaiUNet", "1,16,16", 4),
    ("tests.idiom_models:monai_unet3d", "1,8,8,8", 2)])
def test_a_monai_style_unet_in_2d_and_3d_trains_equal_to_one_process(
        tmp_path, workers_import_tests, model: str, shape: str, nproc: int) -> None:
    result = runner.invoke(app, ["verify", model, "--strategy", "layerwise,spatial,model",
                                 "--nproc", str(nproc), "--input-shape", shape, "--batch",
                                 str(nproc), "--steps", "2", "--out", str(tmp_path / "v"),
                                 "--json"])
    assert result.exit_code == 0, result.output
    for divergence in json.loads(result.stdout)["divergences"]:
        assert divergence["exact"] is True, divergence
    if nproc == 4:  # split along c, a shared slope's gradient summed over all 4 devices
        shape_options = {"image_size": 16, "in_channels": 1, "batch": nproc}
        planned = layerwise.search(model, devices=nproc, cluster="local", baselines=("model",),
                                   **shape_options).strategies["model"]
        configs = {layer.name: ParallelConfig.parse(layer.config) for layer in planned.layers}
        assert configs["down0_conv_0"].c > 1
        planned.save(tmp_path / "model.json")
        run = layerwise.train(model, str(tmp_path / "model.json"), nproc=nproc, steps=1,
                              out=tmp_path / "run", **shape_options)
        assert run.bytes_per_step == run.predicted_bytes_per_step


@pytest.mark.slow
def test_a_volume_split_along_depth_height_and_width_moves_the_predicted_bytes(
        tmp_path, workers_import_tests) -> None:
    """cosmoflow3d at one sample on 2 processes, every 3-d layer split along depth (the
    spatial plan's first doubling), then 4 processes along depth and height: the halos and
    the gradients' returns move exactly the bytes the cost model prices."""
    for nproc, depth_and_height in ((2, (2, 1)), (4, (2, 2))):
        shape = {"image_size": (16, 16, 16), "batch": 1}
        planned = layerwise.search("cosmoflow3d", devices=nproc, cluster="local",
                                   baselines=("spatial",), **shape).strategies["spatial"]
        first = ParallelConfig.parse(planned.layers[1].config)
        assert (first.d, first.h) == depth_and_height, planned.layers[1]
        path = tmp_path / f"spatial{nproc}.json"
        planned.save(path)
        run = layerwise.train("cosmoflow3d", str(path), nproc=nproc, steps=1,
                              out=tmp_path / f"run{nproc}", **shape)
        assert run.bytes_per_step == run.predicted_bytes_per_step
        assert run.bytes_per_step.transfer > 0  # the halos and returned gradients


@pytest.mark.slow
def test_one_volume_per_device_is_predicted_with_the_native_convolutions_columns(tmp_path):
    """At one volume per process torch's CPU convolution runs its own unfolded GEMM (its
    columns: input channels x 27 taps x output positions, 4.6x cosmoflow3d's first activation
    at 32^3), not oneDNN; each rank's measured peak is within 10% of the prediction."""
    shape = {"image_size": (32, 32, 32), "batch": 2}
    plan = layerwise.search("cosmoflow3d", devices=2, cluster="local", baselines=("data",),
                            **shape)
    path = tmp_path / "data.json"
    plan.strategies["data"].save(path)
    result = layerwise.train("cosmoflow3d", str(path), nproc=2, steps=2, out=tmp_path / "run",
                             **shape)
    predicted = plan.peak_memory(plan.strategies["data"]) or []
    assert len(predicted) == len(result.peak_memory_bytes_per_rank) == 2
    for measured, expected in zip(result.peak_memory_bytes_per_rank, predicted, strict=True):
        assert abs(measured / expected - 1) < 0.1, (measured, expected)


def test_local_parallelisms_auxiliary_head_pools_every_spatial_dim() -> None:
    """Local parallelism's block classifiers take a signal's or a volume's map as they take
    an image's: the mean over every spatial dim, then their Linear."""
    from layerwise.strategies.schedules.local.engine import AuxiliaryHead

    head = AuxiliaryHead(8, 3, torch.Generator().manual_seed(0))
    for shape in ((2, 8, 16), (2, 8, 4, 4), (2, 8, 2, 4, 4)):
        x = torch.randn(shape)
        expected = torch.nn.functional.linear(x.mean(tuple(range(2, x.dim()))), head.weight,
                                              head.bias)
        torch.testing.assert_close(head(x), expected)
