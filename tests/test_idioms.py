"""Models written the way users write them (tests/idiom_models.py): padding="same" and
"valid", reflect/replicate/circular padding, x.view(x.size(0), -1), the mean over h and w,
GroupNorm, LayerNorm over a sample and over the channels (between ConvNeXt's permutes). Each
traces with its own parameter count, the dims its ops allow and how far (GroupNorm's channel
degree divides its groups, a reflect padding's tiles hold the rows it mirrors); the space offers
and accepts only those degrees; all of them in one network train equal to one process in float64
on 2 and 4 processes under every strategy that applies (one torchrun launch per process count),
the baselines among them splitting GroupNorm along c and the paddings and LayerNorm over the
channels along h and w. A strategy file is priced afresh before launch. The refusals (shared
weights, an even kernel with padding="same", other permutes, strategy files that do not fit the
run) are rows of tests/test_bad_input.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import layerwise
from layerwise.flows.cli import app
from layerwise.strategies.cost.profile import build_tile
from layerwise.strategies.errors import ConfigError
from layerwise.strategies.exactness.reference import EXACT_TOLERANCE
from layerwise.strategies.jobs.job import new_job
from layerwise.strategies.jobs.options import TrainOptions
from layerwise.strategies.jobs.pricing import cost_model
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.space import DIMS as SPLIT_DIMS
from layerwise.strategies.model.space import (
    ParallelConfig,
    check_config,
    degree_choices,
    enumerate_configs,
    parallel_dims,
    view_dims,
)
from layerwise.strategies.model.tiles import largest_tile, needed_range
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.schedules import INEXACT
from layerwise.strategies.schedules.pipeline.planner import optimal_pipeline, plan_strategy
from layerwise.strategies.search.baselines import baseline
from layerwise.strategies.strategy import Strategy
from layerwise.strategies.training_run import RunResult
from tests.chosen_plans import exact_on_4_processes_with_the_predicted_bytes

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent

# model class in tests/idiom_models.py -> the dims each of its layers may split, graph order
DIMS = {
    "SamePadding": ["nchw", "nchw", "nchw", "nchw", "n", "nc"],
    "ViewFlatten": ["nchw", "nchw", "n", "nc"],
    "ReshapeFlatten": ["nchw", "nchw", "n", "nc"],
    "MeanPool": ["nchw", "nchw", "nchw", "nc", "n", "nc", "nc"],
    "GroupNormNet": ["nchw", "nchw", "nhw", "nchw", "n", "nc"],
    "LayerNormNet": ["nchw", "n", "n", "n", "nc"],
    "PaddingModes": ["nchw", "nchw", "nchw", "nchw", "nc", "nc", "nc"],
    "ChannelsLastNorm": ["nchw", "nhw", "nchw", "nhw", "nchw", "nc", "nc"],
    "ShuffleUnits": ["nchw"] * 17 + ["nc", "nchw", "nc", "nc", "nc"],
    "LayerScale": ["nchw", "nhw", "nhw", "nchw", "nchw", "nhw", "nchw", "nhw", "nchw", "nchw",
                   "nh", "nhw", "n", "nc"],
    "ConvNeXtBlocks": ["nchw", "nhw", "nhw", "nchw", "nchw", "nhw", "nchw", "nhw", "nchw",
                       "nchw", "nchw", "nhw", "n", "nc"],
}
# model -> layer -> the largest degree its ops allow along a dim (graph --json's max_degrees)
LIMITS = {
    "GroupNormNet": {"conv1": {"c": 2}, "conv2": {"c": 1}},
    "LayerNormNet": {"conv": {"c": 1, "h": 1, "w": 1}, "hidden": {"c": 1}},
    "PaddingModes": {"wide": {"h": 2, "w": 2}, "circular": {"h": 1, "w": 1}},
    "ChannelsLastNorm": {"conv": {"c": 1}, "layer_norm": {"c": 1}},
    "LayerScale": {"stem_0": {"c": 1}, "stage1_depthwise": {"c": 1}, "add": {"c": 1},
                   "stage2_depthwise": {"c": 1}, "add_1": {"c": 1, "w": 1},
                   "adaptive_avg_pool2d": {"c": 1}},
    "ConvNeXtBlocks": {"features_0_0": {"c": 1}, "features_1_0_block_0": {"c": 1},
                       "add": {"c": 1}, "features_3_0_block_0": {"c": 1}, "avgpool": {"c": 1}},
}
# image size per model (a stem that halves twice needs 16)
SIZES = {"LayerScale": 16, "ConvNeXtBlocks": 16}


@pytest.mark.parametrize("name", sorted(DIMS))
def test_each_idiom_traces_with_its_own_parameters(name: str) -> None:
    model = f"tests.idiom_models:{name}"
    size = SIZES.get(name, 8)
    result = runner.invoke(app, ["graph", model, "--image-size", str(size), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    plain = build_model(model, image_size=size)
    assert document["param_count"] == sum(p.numel() for p in plain.parameters())
    assert [layer["parallel_dims"] for layer in document["layers"]] == DIMS[name]
    assert {layer["name"]: layer["max_degrees"] for layer in document["layers"]
            if layer["max_degrees"]} == LIMITS.get(name, {})


def test_layer_norm_over_the_channels_is_one_layer_with_its_permutes() -> None:
    graph = build_graph("tests.idiom_models:ChannelsLastNorm", batch=2, image_size=8)
    fused, alone = graph.by_name["conv"], graph.by_name["layer_norm"]
    assert fused.label == "Conv2d+LayerNorm(channels)+relu"
    assert fused.fused[0].fx_nodes == ("permute", "norm", "permute_1")
    assert fused.value_node == "relu" and fused.output_shape == (2, 8, 8, 8)
    assert alone.fx_nodes == ("permute_2", "layer_norm", "permute_3")
    assert alone.value_node == "permute_3" and alone.inputs == ("mix",)
    assert graph.by_name["add"].inputs == ("mix", "layer_norm")


def test_chunks_slices_and_shuffles_of_the_channels_are_layers_reading_what_they_move() -> None:
    """ShuffleNetV2's chunk (its getitems: a layer each, the chunk run with the first), its
    channel shuffle (sizes read off the tensor, a 5-d view, a transpose, the view back: one
    layer) and a slice x[:, :4] are channel maps: each output channel is one input channel,
    and a tile of output channels needs the input channels its sources reach."""
    graph = build_graph("tests.idiom_models:ShuffleUnits", batch=2, image_size=8)
    shuffle, first, second = (graph.by_name[name]
                              for name in ("view_1", "getitem_4", "getitem_5"))
    assert shuffle.kind == first.kind == second.kind == "channels"
    assert shuffle.channels == (0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15)
    assert shuffle.op == "channels(view,transpose,contiguous,view)" and shuffle.inputs == ("cat",)
    assert shuffle.fx_nodes == ("size", "getitem", "getitem_1", "getitem_2", "getitem_3",
                                "floordiv", "view", "transpose", "contiguous", "view_1")
    assert first.fx_nodes == ("chunk", "getitem_4") and second.fx_nodes == ("getitem_5",)
    assert first.inputs == second.inputs == ("view_1",)
    assert (first.channels, second.channels) == (tuple(range(8)), tuple(range(8, 16)))
    assert graph.by_name["getitem_10"].channels == (0, 1, 2, 3)
    assert needed_range(shuffle, 0, 1, (0, 8)) == (0, 12)  # sources 0, 8, 1, 9, ..., 3, 11
    assert needed_range(shuffle, 0, 1, (8, 16)) == (4, 16)
    assert needed_range(second, 0, 1, (0, 4)) == (8, 12) and needed_range(
        second, 0, 3, (2, 4)) == (2, 4)


def test_parameters_used_directly_are_held_by_the_op_that_reads_them() -> None:
    """ConvNeXt's layer scale (`self.layer_scale * x`, one value per channel in dim 0) fuses
    into its producer and shards along c with it; LayerNorm2d's F.layer_norm holds its
    weight and bias; a bias with a value per column holds w whole and, shared by every
    channel, c too; the Linear layers between the permutes are 1x1 convolutions of the
    (N, C, H, W) tensor, their permutes run with the first and last op."""
    graph = build_graph("tests.idiom_models:ConvNeXtBlocks", batch=2, image_size=16)
    project = graph.by_name["features_1_0_block_5"]
    assert project.label == "Linear(channels)+mul_param+stochastic_depth"
    assert project.kind == "conv"
    assert project.geometry.kernel == (1, 1) and project.output_shape == (2, 8, 8, 8)
    assert project.param_shapes == {"weight": (8, 32), "bias": (8,),
                                    "features.1.0.layer_scale": (8, 1, 1)}
    assert project.fused[0].fx_nodes == ("features_1_0_layer_scale", "mul")
    assert project.after == ("permute_3",) and not project.max_degrees
    norm = graph.by_name["features_1_0_block_0"]
    assert norm.fused[0].fx_nodes == ("permute_2", "features_1_0_block_2")
    stem = graph.by_name["features_0_0"]
    assert stem.fused[0].fx_nodes == ("features_0_1_weight", "features_0_1_bias", "permute",
                                      "layer_norm", "permute_1")
    assert stem.param_shapes["features.0.1.weight"] == (8,)
    scaled = build_graph("tests.idiom_models:LayerScale", batch=2, image_size=16)
    assert scaled.by_name["add_1"].max_degrees == {"c": 1, "w": 1}
    assert "position_bias holds a value per position along w" in scaled.by_name[
        "add_1"].held_reason


def _offered(layer, devices: int) -> dict[str, list[int]]:
    choices = degree_choices(layer, devices)
    return {dim: sorted({degrees[index] for degrees in choices})
            for index, dim in enumerate(SPLIT_DIMS) if index in view_dims(len(layer.output_shape))}


def test_the_space_offers_and_accepts_only_the_degrees_the_ops_allow() -> None:
    graph = build_graph("tests.idiom_models:Idioms", batch=16, image_size=8)
    offered = {name: _offered(graph.by_name[name], 16)
               for name in ("same", "dilated", "wide", "replicate", "circular")}
    assert offered["same"] == {"n": [1, 2, 4, 8, 16], "c": [1, 2], "h": [1, 2, 4, 8],
                               "w": [1, 2, 4, 8]}
    assert offered["dilated"]["c"] == [1, 2, 4]
    assert offered["wide"]["h"] == offered["wide"]["w"] == [1, 2]
    assert offered["replicate"] == {"n": [1, 2, 4, 8, 16], "c": [1], "h": [1, 2, 4, 8],
                                    "w": [1, 2, 4, 8]}
    assert offered["circular"]["h"] == offered["circular"]["w"] == [1]
    refused = [("same", "n1c4h1w1@0-3", "'same' (Conv2d+GroupNorm(6)+relu) splits along c at "
                "most 2 ways, not 4: GroupNorm(6) takes its statistics over each group's "
                "channels"),
               ("wide", "n1c1h4w1@0-3", "splits along h at most 2 ways, not 4: reflect padding "
                "(2, 2) is applied by the border tiles"),
               ("replicate", "n1c2h1w1@0-1", "cannot be split along c: it splits along n, h, w")]
    for name, text, reason in refused:
        with pytest.raises(ConfigError) as error:
            check_config(graph.by_name[name], ParallelConfig.parse(text), 4)
        assert reason in str(error.value) and "\n" not in str(error.value)


def test_graph_says_which_layers_are_held_whole_and_why() -> None:
    result = runner.invoke(app, ["graph", "tests.idiom_models:Idioms", "--image-size", "8"])
    assert result.exit_code == 0, result.output
    held = " ".join(result.stdout.split()).split("held: ")[1:]
    assert len(held) == 9
    assert held[0].startswith("layer 'same' (Conv2d+GroupNorm(6)+relu) splits along n, c, h, "
                              "w (c at most 2 ways): GroupNorm(6) takes its statistics over each "
                              "group's channels, so a channel split keeps whole groups (a degree "
                              "dividing 6)")
    assert held[2].startswith("layer 'wide' (Conv2d(padding_mode=reflect)) splits along n, c, "
                              "h, w (h at most 2 ways, w at most 2 ways): reflect padding")
    assert held[3].startswith("layer 'replicate' (Conv2d(padding_mode=replicate)+LayerNorm("
                              "channels)) splits only along n, h, w: LayerNorm over the channels")
    assert "splits only along n, c: circular padding wraps around" in held[4]


def test_train_says_which_layers_are_held_before_it_starts(tmp_path) -> None:
    options = TrainOptions.given(nproc=2, image_size=8, batch_per_device=4)
    with new_job("tests.idiom_models:LayerNormNet", "spatial_h", options, tmp_path / "run",
                 analytic=True) as job:
        assert [line.split(":")[0] for line in job.warnings] == ["held", "held"]
        assert job.strategy.assignment()["conv"].text == "n2c1h1w1@0-1"


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_every_idiom_trains_equal_to_one_process(tmp_path, workers_import_tests,
                                                  nproc: int) -> None:
    result = runner.invoke(app, ["verify", "tests.idiom_models:Idioms", "--strategy", "all",
                                 "--nproc", str(nproc), "--image-size", "8", "--steps", "2",
                                 "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    checked = {d["strategy"]: d for d in report["divergences"]}
    assert {"data", "model", "spatial_h", "spatial_w", "spatial", "layerwise",
            "pipeline"} <= set(checked)
    graph = build_graph("tests.idiom_models:Idioms", batch=4 * nproc, image_size=8)
    split = {name: {layer: baseline(name, graph, nproc)[layer].degrees for layer in
                    ("same", "dilated", "reflect", "wide", "replicate", "layer_norm_1")}
             for name in ("model", "spatial_h", "spatial_w")}
    assert split["model"]["same"] == (1, 2, 1, 1, 1) and split["model"]["dilated"][1] == nproc
    assert split["spatial_h"]["wide"] == (1, 1, 1, 2, 1) and split["spatial_w"]["wide"] == (
        1, 1, 1, 1, 2)
    for layer in ("reflect", "replicate", "layer_norm_1"):
        assert split["spatial_h"][layer] == (1, 1, 1, nproc, 1), layer
        assert split["spatial_w"][layer] == (1, 1, 1, 1, nproc), layer
    for name, divergence in checked.items():
        largest = max(divergence["max_loss_difference"], divergence["max_parameter_difference"])
        if name in INEXACT:
            assert largest > 1e3 * EXACT_TOLERANCE, divergence
        else:
            assert divergence["exact"] is True and largest <= EXACT_TOLERANCE, divergence


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_library_blocks_train_equal_to_one_process_and_move_the_predicted_bytes(
        tmp_path, workers_import_tests, nproc: int) -> None:
    """ShuffleNetV2's units, ConvNeXt's block (Linear layers between permutes, a layer scale),
    LayerNorm2d and a bias used directly, in one network: the searched plan, the channel split
    (through the chunk and the shuffles, each tile reading the channels its sources reach),
    every spatial dim split and the pipeline train equal to one process in float64, and the
    channel split moves exactly the bytes the cost model predicts."""
    result = runner.invoke(app, ["verify", "tests.idiom_models:LibraryBlocks", "--strategy",
                                 "layerwise,model,spatial,pipeline", "--nproc", str(nproc),
                                 "--image-size", "8", "--steps", "2",
                                 "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    checked = {d["strategy"]: d for d in json.loads(result.stdout)["divergences"]}
    assert set(checked) == {"layerwise", "model", "spatial", "pipeline"}
    for name in ("layerwise", "model", "spatial"):
        assert checked[name]["exact"] is True, checked[name]
    run = RunResult.load(tmp_path / "v" / "model" / "result.json")
    assert run.bytes_per_step.transfer == 2 * run.predicted_bytes_per_step.transfer > 0


@pytest.mark.slow
def test_activations_by_their_elementwise_nature_split_everywhere_exactly(
        tmp_path, workers_import_tests) -> None:
    """Hardsigmoid, Mish, SELU, Softplus, CELU, F.hardswish and F.mish, named by no list, fuse
    into their convolutions as elementwise ops, so every conv splits along n, c, h and w; the
    gates multiply and add along every dim too, each tile reading all of a gate's broadcast
    dims (their gradients summed back over the tiles); the strategies splitting them (and a
    leaky ReLU and an average pool, cosmoflow2d's) train equal to one process in float64."""
    graph = build_graph("tests.idiom_models:Activations", batch=8, image_size=8)
    fused = {layer.name: [op.op for op in layer.fused] for layer in graph.layers}
    assert fused["conv1"] == ["Hardsigmoid"] and fused["conv2"] == ["Mish", "hardswish"]
    assert fused["conv3"] == ["SELU", "Softplus"]
    assert fused["conv4"] == ["CELU", "mish", "LeakyReLU"] and graph.by_name["pool"].kind == "pool"
    assert all(parallel_dims(graph.by_name[name]) == ("n", "c", "h", "w")
               and not graph.by_name[name].max_degrees
               for name in ("conv1", "conv2", "conv3", "conv4", "mul", "mul_1", "add"))
    # the gates broadcast: a squeeze-and-excitation scale along h and w, a spatial one along c
    assert graph.by_name["mul"].input_shapes == ((8, 8, 1, 1), (8, 8, 8, 8))
    assert graph.by_name["mul_1"].input_shapes == ((8, 8, 8, 8), (8, 1, 8, 8))
    assert graph.by_name["add"].inputs == ("mul_1", "excite")
    for name, degrees in (("spatial_h", (1, 1, 1, 2, 1)), ("model", (1, 2, 1, 1, 1))):
        plan = baseline(name, graph, 2)
        assert all(plan[layer].degrees == degrees for layer in ("mul", "mul_1", "add"))
    result = runner.invoke(app, ["verify", "tests.idiom_models:Activations", "--strategy",
                                 "layerwise,model,spatial_h,spatial_w", "--nproc", "2",
                                 "--image-size", "8", "--steps", "2",
                                 "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    for divergence in json.loads(result.stdout)["divergences"]:
        assert divergence["exact"] is True, divergence


def test_a_pipeline_file_is_priced_for_the_run_not_as_saved(tmp_path) -> None:
    graph = build_graph("tiny_cnn", batch=16, image_size=8)
    cost = cost_model(graph, "local", 2, None, True)
    planned = plan_strategy(optimal_pipeline(cost, stages=2, micro_batches=2), graph)
    stale = planned.model_copy(update={"predicted": planned.predicted.model_copy(
        update={"transfer_bytes": 1, "sync_bytes": 7, "step_seconds": 9.0})})
    stale.save(tmp_path / "stale.json")
    options = TrainOptions.given(nproc=2, image_size=8, batch_per_device=8)
    with new_job("tiny_cnn", str(tmp_path / "stale.json"), options, tmp_path / "run",
                 analytic=True) as job:
        assert job.strategy.predicted == planned.predicted
        assert job.strategy.execution == planned.execution
    # a larger batch moves more across the cut: the file's bytes are of its own batch
    options = TrainOptions.given(nproc=2, image_size=8, batch_per_device=16)
    with new_job("tiny_cnn", str(tmp_path / "stale.json"), options, tmp_path / "run32",
                 analytic=True) as job:
        assert job.strategy.predicted.transfer_bytes == 2 * planned.predicted.transfer_bytes
        assert Strategy.model_validate(job.strategy.model_dump()) == job.strategy


@pytest.mark.slow
def test_owt_schemes_hand_off_a_view_flatten(tmp_path, workers_import_tests) -> None:
    """OWT's engine replays the conv part node by node, x.size(0) included (Idioms has two
    flattens, which OWT does not take)."""
    result = runner.invoke(app, ["verify", "tests.idiom_models:ViewFlatten", "--strategy",
                                 "owt_a,owt_b,owt_c", "--nproc", "2", "--image-size", "8",
                                 "--steps", "2", "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    divergences = json.loads(result.stdout)["divergences"]
    assert [d["strategy"] for d in divergences] == ["owt_a", "owt_b", "owt_c"]
    assert all(d["exact"] is True for d in divergences), divergences


def test_an_encoder_decoder_traces_with_its_transposed_convs_and_instance_norms() -> None:
    """A U-Net written as MONAI's BasicUNet writes its blocks: each ConvTranspose2d is a conv
    layer reading a halo on its input side, split along c by dim 1 of its weight (where it
    keeps its output channels; the profiler's tile has that shard), and each InstanceNorm fuses
    into its conv, which still splits along h and w."""
    graph = build_graph("tests.idiom_models:TinyUNet", batch=4, image_size=16)
    plain = build_model("tests.idiom_models:TinyUNet", image_size=16)
    assert graph.param_count == sum(p.numel() for p in plain.parameters())
    up = graph.by_name["up1"]
    assert up.kind == "conv" and up.geometry.transposed and up.max_degrees == {}
    assert up.channel_dim("weight", up.param_shapes["weight"]) == 1  # (16 in, 8 out, 2, 2)
    square = graph.by_name["up0"]  # (8 in, 8 out, 2, 2): only the layer says which dim
    tile = build_tile(square, largest_tile(square, ParallelConfig.parse("n1c4h1w1@0-3")))
    assert tile.params["weight"].shape == (8, 2, 2, 2) and tile.params["bias"].shape == (2,)
    assert up.output_shape == (4, 8, 8, 8) and up.input_shapes == ((4, 16, 4, 4),)
    # stride 2, kernel 3, padding 1: input row i adds into output rows 2i - 1 .. 2i + 1, so
    # output rows [4, 8) read input rows [2, 5) (row 4 reaches row 7) and rows [0, 3) [0, 2)
    refine = graph.by_name["refine"]
    height = SPLIT_DIMS.index("h")
    assert needed_range(refine, 0, height, (4, 8)) == (2, 5)
    assert needed_range(refine, 0, height, (0, 3)) == (0, 2)
    block = graph.by_name["down0_0"]
    assert [op.op for op in block.fused] == ["InstanceNorm2d", "LeakyReLU"]
    assert parallel_dims(block) == ("n", "c", "h", "w") and not block.max_degrees


@pytest.mark.slow
def test_an_encoder_decoder_split_along_h_and_w_equals_one_process(
        tmp_path, workers_import_tests) -> None:
    """Its transposed convolutions, InstanceNorms (statistics summed over each plane's tiles),
    skip concatenations and pools split along h, along w, along c (the transposed
    convolutions' weights cut along dim 1) and as searched train equal to one
    process in float64 on 4 processes; split along h, the statistics' all-reduces move the
    bytes predicted."""
    result = runner.invoke(app, ["verify", "tests.idiom_models:TinyUNet", "--strategy",
                                 "layerwise,spatial_h,spatial_w,data,model", "--nproc", "4",
                                 "--image-size", "16", "--steps", "2",
                                 "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {d["strategy"] for d in report["divergences"]} == {
        "layerwise", "spatial_h", "spatial_w", "data", "model"}
    for divergence in report["divergences"]:
        assert divergence["exact"] is True, divergence
    graph = build_graph("tests.idiom_models:TinyUNet", batch=16, image_size=16)
    split = baseline("spatial_h", graph, 4)
    assert split["up0"].degrees == (1, 1, 1, 4, 1) and split["down0_0"].degrees == (1, 1, 1, 4, 1)
    assert baseline("model", graph, 4)["up0"].c == 4
    # the InstanceNorms' statistics all-reduces move exactly the bytes the cost model prices,
    # a recomputed block's too (its second forward takes back the statistics of its first)
    shape = {"image_size": 16, "batch_per_device": 4}
    planned = layerwise.search("tests.idiom_models:TinyUNet", devices=4, cluster="local",
                               baselines=("spatial_h",), **shape).strategies["spatial_h"]
    recomputed = planned.model_copy(update={"recompute": ("down0_0", "merge1_3")})
    recomputed.save(tmp_path / "recomputed.json")
    run = layerwise.train("tests.idiom_models:TinyUNet", str(tmp_path / "recomputed.json"),
                          nproc=4, steps=1, out=tmp_path / "run", **shape)
    assert run.strategy.recompute == ("down0_0", "merge1_3")
    assert run.bytes_per_step == run.predicted_bytes_per_step
    assert all(layer["sync"] for name, layer in run.bytes_per_step_by_layer.items()
               if name.startswith(("down", "bottom", "merge")))


@pytest.mark.slow
def test_instance_norms_split_along_samples_and_height_at_once_equal_one_process(
        tmp_path, workers_import_tests) -> None:
    """An InstanceNorm's statistics are summed over the tiles of one plane: with n and h both
    split those are pairs inside each replica group, groups the plan creates like any other
    (they were missing: rank 2 stopped with KeyError (2, 3)); float64, 4 processes, with the
    bytes the cost model prices."""
    shape = {"image_size": 16, "batch_per_device": 2}
    graph = build_graph("tests.idiom_models:TinyUNet", batch=8, image_size=16)
    chosen = _first_configs(graph, lambda config: config.n == 2 and config.h == 2)
    assert sum(bool(graph.by_name[name].plane_norms) and config.n == 2 == config.h
               for name, config in chosen.items()) >= 4
    exact_on_4_processes_with_the_predicted_bytes("tests.idiom_models:TinyUNet", chosen,
                                                  tmp_path, **shape)


def _first_configs(graph, wanted) -> dict[str, ParallelConfig]:
    """Each layer's first config on 4 devices that `wanted` takes, else its first."""
    return {layer.name: next((c for c in enumerate_configs(layer, 4) if wanted(c)),
                             enumerate_configs(layer, 4)[0]) for layer in graph.layers}


def test_upsampling_reads_the_rows_its_interpolation_weights_reach() -> None:
    """nn.Upsample and F.interpolate are layers of their own, each output tile needing the
    input rows torch's interpolation weights reach: half the rows of a 2x nearest upsampling
    read their own half of the input; a bilinear one one row past it (align_corners or not),
    which the halo exchange brings; a fractional nearest factor (1.5) its own share again."""
    graph = build_graph("tests.idiom_models:Upsampling", batch=4, image_size=16)
    height = SPLIT_DIMS.index("h")
    reads = {name: (needed_range(graph.by_name[name], 0, height, (0, size // 2)),
                    needed_range(graph.by_name[name], 0, height, (size // 2, size)))
             for name, size in (("nearest", 16), ("interpolate", 16), ("cornered", 16),
                                ("bilinear", 32), ("interpolate_1", 48))}
    assert reads == {"nearest": ((0, 4), (4, 8)), "interpolate": ((0, 5), (3, 8)),
                     "cornered": ((0, 5), (3, 8)), "bilinear": ((0, 9), (7, 16)),
                     "interpolate_1": ((0, 16), (16, 32))}
    assert graph.by_name["cornered"].op == "Upsample(bilinear, align_corners=True)"
    assert graph.by_name["interpolate"].resize.scales == (None, None)  # given a size
    assert graph.by_name["interpolate_1"].resize.scales == (1.5, 1.5)
    assert all(graph.by_name[name].kind == "resize" and not graph.by_name[name].max_degrees
               for name in reads)


@pytest.mark.slow
def test_upsampling_split_along_h_and_w_equals_one_process(tmp_path, workers_import_tests
                                                            ) -> None:
    """Nearest and bilinear upsampling tiles (both align_corners, by a factor or to a size)
    train equal to one process in float64 on 4 processes under every split of h, w and c."""
    result = runner.invoke(app, ["verify", "tests.idiom_models:Upsampling", "--strategy",
                                 "layerwise,spatial_h,spatial_w,model", "--nproc", "4",
                                 "--image-size", "16", "--steps", "2",
                                 "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    divergences = json.loads(result.stdout)["divergences"]
    assert len(divergences) == 4
    assert all(divergence["exact"] is True for divergence in divergences), divergences


@pytest.mark.slow
def test_group_norms_split_along_channels_and_height_at_once_equal_one_process(
        tmp_path, workers_import_tests) -> None:
    """A GroupNorm's statistics (module or function) are summed over the tiles of one plane,
    each tile holding whole groups: c and h split at once train equal to one process in
    float64 on 4 processes and move the bytes the cost model prices."""
    shape = {"image_size": 8, "batch_per_device": 2}
    graph = build_graph("tests.idiom_models:GroupNormSplits", batch=8, image_size=8)
    assert [graph.by_name[name].plane_norms for name in ("conv1", "conv2")] == [(4,), (2,)]
    chosen = _first_configs(graph, lambda config: config.c == 2 and config.h == 2)
    assert chosen["conv1"].text == chosen["conv2"].text == "n1c2h2w1@0-3"
    run = exact_on_4_processes_with_the_predicted_bytes("tests.idiom_models:GroupNormSplits",
                                                        chosen, tmp_path,
                                                         **shape)
    assert run.bytes_per_step_by_layer["conv1"]["sync"] > 0

