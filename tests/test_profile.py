"""Tile profiling: every layer kind runs on its tile's shapes, profiles cover every config,
reuse measures nothing twice, files round-trip, and `layerwise profile` works as a user runs it.
Real torch everywhere; timings are only checked to be positive (tests never assert speed)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import typer
from torch import nn
from typer.testing import CliRunner

from layerwise.flows.cli.measure import register
from layerwise.strategies.cost.compute_time import ProfiledCompute
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.cost.profile import (
    SCHEMA_VERSION,
    Profile,
    build_tile,
    default_profile_path,
    measure_tile,
    missing_tiles,
    profile_graph,
    profile_graph_concurrently,
    profile_key,
    run_tile,
    tile_plan,
)
from layerwise.strategies.cost.tables import LayerTiles
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.hardware.cluster import load_cluster
from layerwise.strategies.hardware.this_machine import device_name
from layerwise.strategies.model import ops
from layerwise.strategies.model.graph import LayerGraph, build_graph, trace
from layerwise.strategies.model.space import ParallelConfig, enumerate_configs
from layerwise.strategies.model.tiles import as_view, largest_tile, needed_range, tile_box
from layerwise.strategies.processes.huge_pages import huge_pages_in_use
from layerwise.strategies.schedules.loader import profiled_configs
from layerwise.strategies.schedules.owt.planner import build_strategy, pass_config
from tests.cli_errors import one_line_error

FAST = {"warmup": 0, "repeats": 1, "threads": 1}


def t_c(profile, layer, config) -> float:
    """The cost model's t_c for one config, read from `profile`."""
    return ProfiledCompute(profile).tile_seconds(layer, largest_tile(layer, config))


@pytest.fixture(scope="module")
def tiny():
    return build_graph("tiny_cnn", batch=8)


@pytest.fixture(scope="module")
def tiny_profile(tiny):
    """tiny_cnn's profile on 2 devices as `layerwise profile` measures it: every config of the
    search space and every config a schedule's pricer reads beyond it."""
    calls: list[tuple[int, int, str]] = []
    profile = profile_graph(tiny, 2, profiled_configs(tiny, 2),
                            progress=lambda *call: calls.append(call), **FAST)
    return profile, calls


def _some_configs(layer, devices=4):
    """One config per distinct degree tuple: sample, channel, height and width splits."""
    chosen: dict[tuple[int, int, int, int], ParallelConfig] = {}
    for config in enumerate_configs(layer, devices):
        chosen.setdefault(config.degrees, config)
    return list(chosen.values())


class _Odd(nn.Module):
    """Kinds tiny_cnn lacks: grouped conv, concat, unfused elementwise, ceil-mode avg pool,
    BatchNorm1d after a linear layer, dilation."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.depthwise = nn.Conv2d(8, 16, 3, padding=2, dilation=2, groups=4, bias=False)
        self.pool = nn.AvgPool2d(3, stride=2, ceil_mode=True)
        self.fc = nn.Linear(24 * 5 * 5, 12)
        self.bn = nn.BatchNorm1d(12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.sigmoid(x)  # producer is the input: stays its own elementwise layer
        a = self.stem(x)
        b = self.depthwise(a)
        x = self.pool(torch.cat([a, b], 1))
        return self.bn(self.fc(torch.flatten(x, 1)))


def test_every_tiny_cnn_layer_runs_on_its_tiles(tiny):
    kinds = set()
    for layer in tiny.layers:
        if layer.kind == "input":
            continue
        kinds.add(layer.kind)
        for config in _some_configs(layer):
            tile = largest_tile(layer, config)
            assert tuple(run_tile(layer, tile).shape) == tile.output_shape, (layer.name, config)
        split = _some_configs(layer)[-1]
        times = measure_tile(layer, largest_tile(layer, split), **FAST)
        assert 0 < times.forward < times.passes
        assert (times.update > 0) == bool(layer.param_count), layer.name
    assert kinds == {"conv", "pool", "adaptive_pool", "add", "flatten", "linear"}


def test_grouped_conv_concat_and_elementwise_tiles_have_the_tile_shape():
    graph = trace(_Odd(), (4, 3, 10, 10), name="odd")
    kinds = {layer.kind for layer in graph.layers}
    assert {"elementwise", "concat", "conv", "pool", "linear", "flatten"} <= kinds
    depthwise = graph.by_name["depthwise"]
    assert depthwise.geometry.groups == 4 and depthwise.geometry.dilation == (2, 2)
    for layer in graph.layers:
        if layer.kind == "input":
            continue
        for config in enumerate_configs(layer, 8):
            tile = largest_tile(layer, config)
            assert tuple(run_tile(layer, tile).shape) == tile.output_shape, (layer.name, config)
    fc = graph.by_name["fc"]
    assert [op.op for op in fc.fused] == ["BatchNorm1d"]
    one_sample = largest_tile(fc, ParallelConfig(n=4, devices=(0, 1, 2, 3)))
    assert measure_tile(fc, one_sample, **FAST).passes > 0  # BatchNorm of a single sample runs


class _Dropping(nn.Module):
    """Dropout of both kinds and a BatchNorm whose tiles hold part of the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop2d = nn.Dropout2d(0.2)
        self.fc = nn.Linear(4 * 6 * 6, 5)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop2d(torch.relu(self.bn(self.conv(x))))
        return self.drop(self.fc(torch.flatten(x, 1)))


class _HardSwishByHand(nn.Module):
    """A model library's own activation, written with torch functions (fx traces into it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


def _apply(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A function fx keeps whole, called with a dtype: nothing a graph document keeps."""
    return torch.tanh(x.to(dtype)).to(x.dtype)


torch.fx.wrap("_apply")


class _LibraryActivations(nn.Module):
    """MobileNetV3's gate (Hardsigmoid, in place), a Softplus with its own beta and a
    hand-written hard swish after a convolution; or, `wrapped`, a call no document keeps."""

    def __init__(self, wrapped: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.gate = nn.Hardsigmoid(inplace=True)
        self.softplus = nn.Softplus(beta=2.0, threshold=5.0)
        self.swish = _HardSwishByHand()
        self.wrapped = wrapped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.softplus(self.gate(self.conv(x)))
        return _apply(x, torch.float64) if self.wrapped else self.swish(x)


def test_activations_taken_by_their_nature_are_profiled_as_the_model_runs_them():
    """The profiler times shapes without the model: the graph keeps each call it needs."""
    model = _LibraryActivations().eval()
    graph = trace(model, (2, 3, 6, 6), name="library")
    gate, softplus = (op.function for op in graph.by_name["conv"].fused)
    assert gate.reference == "torch.nn.modules.activation:Hardsigmoid"
    assert gate.attributes == {"inplace": False}  # a tile keeps its input
    assert softplus.attributes == {"beta": 2.0, "threshold": 5.0}
    clamp = graph.by_name["add"].fused[0].function
    assert (clamp.reference, clamp.args, clamp.tensor_at) == ("torch:clamp", (0.0, 6.0), 0)
    assert LayerGraph.model_validate_json(graph.model_dump_json()) == graph  # still a document
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(5))
    conv = graph.by_name["conv"]
    program = build_tile(conv, largest_tile(conv, ParallelConfig(n=1, devices=(0,))))
    with torch.no_grad():
        program.inputs[0].copy_(x)
        for name, param in program.params.items():
            param.copy_(getattr(model.conv, name))
        assert torch.allclose(program.forward(), model.softplus(model.gate(model.conv(x))))
        assert torch.equal(clamp.build()(x), torch.clamp(x, 0.0, 6.0))
    profile = profile_graph(graph, 2, **FAST)
    assert all(seconds > 0 for layer, tiles in profile.seconds.items() if layer != "x"
               for seconds in tiles.values())
    assert len(profile.seconds["conv"]) == len(tile_plan(graph, 2)["conv"]) > 1


def test_an_activation_the_profiler_cannot_rebuild_is_one_line_naming_the_fix():
    graph = trace(_LibraryActivations(wrapped=True), (2, 3, 6, 6), name="library")
    with pytest.raises(LayerwiseError) as error:
        profile_graph(graph, 2, **FAST)
    message = str(error.value)
    assert "\n" not in message and "'_apply'" in message and "dtype" in message
    assert "--analytic" in message


def test_the_profiler_times_the_runtimes_own_ops(monkeypatch):
    """Every op a tile runs is the function of strategies/model/ops.py that the runtime calls."""
    called: set[str] = set()
    names = ("conv", "pool", "adaptive_pool", "linear", "flatten", "binary", "concat",
             "batch_norm", "dropout", "activation")
    for name in names:
        def spy(*args, _name=name, _op=getattr(ops, name), **kwargs):
            called.add(_name)
            return _op(*args, **kwargs)
        monkeypatch.setattr(ops, name, spy)
    graphs = [build_graph("tiny_cnn", batch=8), trace(_Odd(), (4, 3, 10, 10), name="odd"),
              trace(_Dropping(), (4, 3, 8, 8), name="dropping")]
    for graph in graphs:
        for layer in graph.layers:
            if layer.kind != "input":
                tile = largest_tile(layer, ParallelConfig(n=2, devices=(0, 1)))
                run_tile(layer, tile)
    assert called == set(names)


def test_a_tile_box_has_the_tiles_shapes(tiny):
    for layer in [*tiny.layers, *trace(_Odd(), (4, 3, 10, 10), name="odd").layers]:
        for config in enumerate_configs(layer, 8):
            tile = largest_tile(layer, config)
            box = tile_box(layer, tile)
            assert tuple(stop - start for start, stop in box) == as_view(tile.output_shape)
            for index, shape in enumerate(tile.input_shapes):
                needed = [needed_range(layer, index, dim, box[dim]) for dim in range(5)]
                assert tuple(max(stop - start, 0) for start, stop in needed) == as_view(shape)


def _conv_only(layer):
    return layer.model_copy(update={"fused": ()})


@pytest.mark.parametrize("text", ["n1c1h2w2@0-3", "n2c2h1w1@0-3", "n1c1h4w1@0-3"])
def test_a_conv_tile_computes_the_same_values_as_the_full_layer(tiny, text):
    layer = _conv_only(tiny.by_name["conv2"])  # 3x3, stride 2, padding 1
    config = ParallelConfig.parse(text)
    tile = largest_tile(layer, config)
    program = build_tile(layer, tile)
    generator = torch.Generator().manual_seed(3)
    full_input = torch.randn(layer.input_shapes[0], generator=generator)
    full_weight = torch.randn(layer.param_shapes["weight"], generator=generator)
    n, c, h, w = tile.output_shape
    in_n, in_c, in_h, in_w = tile.input_shapes[0]
    with torch.no_grad():
        program.inputs[0].copy_(full_input[:in_n, :in_c, :in_h, :in_w])
        program.params["weight"].copy_(full_weight[:c])
        expected = torch.nn.functional.conv2d(full_input, full_weight, stride=2, padding=1)
        assert torch.allclose(program.forward(), expected[:n, :c, :h, :w], atol=1e-5)


def test_profile_covers_every_config_of_every_layer(tiny, tiny_profile):
    profile, calls = tiny_profile
    assert [call[2] for call in calls] == [layer.name for layer in tiny.layers]
    assert [call[:2] for call in calls] == [(i, len(tiny.layers))
                                           for i in range(1, len(tiny.layers) + 1)]
    measured = 0
    for layer in tiny.layers:
        # the search space, and for the FC layer OWT's pass of B/2 rows on 2 workers
        configs = [*enumerate_configs(layer, 2),
                   *([pass_config(2)] if layer.name == "fc" else [])]
        distinct = {largest_tile(layer, config).key for config in configs}
        assert set(profile.seconds[layer.name]) == distinct, layer.name
        assert set(profile.update_seconds[layer.name]) == distinct, layer.name
        for config in configs:
            seconds = t_c(profile, layer, config)
            assert seconds == 0 if layer.kind == "input" else seconds > 0
            update = profile.tile_update_seconds(layer.name, largest_tile(layer, config).key)
            assert (update > 0) == bool(layer.param_count), (layer.name, config)
        measured += len(distinct) if layer.kind != "input" else 0
    plan = tile_plan(tiny, 2, profiled_configs(tiny, 2))
    assert measured == sum(len(tiles) for name, tiles in plan.items() if name != "x")
    assert profile.tile_count == sum(len(tiles) for tiles in plan.values())
    assert profile.batch == 8 and profile.devices == 2
    assert profile.structure_hash == tiny.structure_hash
    assert profile.device_type == "cpu" and profile.method == "monotonic-median"
    assert profile.device_name == device_name("cpu")


def test_the_measured_forward_prices_a_recomputed_tile(tiny, tiny_profile):
    """Recomputing a tile costs its measured forward, which the profile keeps for every tile it
    times; a profile from before forwards were recorded falls back to one of the roofline's
    passes of the measured forward + backward."""
    profile, _ = tiny_profile
    layer = tiny.by_name["block_conv1"]
    configs = enumerate_configs(layer, 2)
    tiles = LayerTiles(layer)
    forwards = ProfiledCompute(profile).configs_forward_seconds(layer, tiles, configs)
    for config, forward in zip(configs, forwards, strict=True):
        key = largest_tile(layer, config).key
        assert forward == profile.forward_seconds[layer.name][key]
        assert 0 < forward < profile.seconds[layer.name][key]
    older = Profile.model_validate_json(profile.model_dump_json(exclude={"forward_seconds"}))
    assert older.forward_seconds == {}
    shares = ProfiledCompute(older).configs_forward_seconds(layer, tiles, configs)
    assert list(shares) == [t_c(profile, layer, config) / 3 for config in configs]


def test_reusing_a_complete_profile_measures_nothing(tiny, tiny_profile):
    profile, _ = tiny_profile
    assert all(not tiles for tiles in missing_tiles(
        tile_plan(tiny, 2, profiled_configs(tiny, 2)), profile).values())
    calls: list[str] = []
    again = profile_graph(tiny, 2, existing=profile, progress=lambda *c: calls.append(c[2]),
                          **FAST)
    assert again is profile
    assert len(calls) == len(tiny.layers)


def test_reuse_measures_only_the_missing_tiles(tiny, tiny_profile):
    profile, _ = tiny_profile
    seconds = {name: dict(tiles) for name, tiles in profile.seconds.items()}
    updates = {name: dict(tiles) for name, tiles in profile.update_seconds.items()}
    dropped = seconds.pop("block_conv1")
    updates.pop("block_conv1")
    partial = profile.model_copy(update={"seconds": seconds, "update_seconds": updates})
    missing = missing_tiles(tile_plan(tiny, 2), partial)
    assert {name for name, tiles in missing.items() if tiles} == {"block_conv1"}
    extended = profile_graph(tiny, 2, existing=partial, **FAST)
    assert set(extended.seconds["block_conv1"]) == set(dropped)
    assert set(extended.update_seconds["block_conv1"]) == set(dropped)
    for name, tiles in seconds.items():
        assert extended.seconds[name] == tiles  # the very same floats: reused, not re-measured
        assert extended.update_seconds[name] == updates[name]


def test_given_configs_limit_what_is_measured(tiny):
    layer = tiny.by_name["fc"]
    only = ParallelConfig(n=1, c=2, devices=(0, 1))
    configs = {name: [] for name in tiny.by_name} | {"fc": [only]}
    profile = profile_graph(tiny, 2, configs=configs, **FAST)
    assert {name for name, tiles in profile.seconds.items() if tiles} == {"fc"}
    assert t_c(profile, layer, only) > 0
    with pytest.raises(LayerwiseError, match="layerwise profile"):
        t_c(profile, layer, ParallelConfig(n=2, devices=(0, 1)))


@pytest.mark.slow
def test_a_concurrent_profile_covers_the_same_tiles_with_every_core_busy(tiny):
    """Two profilers at once (as two ranks of a run share the machine): the same tiles as one,
    each timed; the profile says how it was measured."""
    configs = {name: [ParallelConfig(n=2, devices=(0, 1))] for name in tiny.by_name}
    alone = profile_graph(tiny, 2, configs=configs, **FAST)
    calls: list[tuple[int, int, str]] = []
    together = profile_graph_concurrently(tiny, 2, 2, configs=configs,
                                          progress=lambda *call: calls.append(call), **FAST)
    assert {layer: set(tiles) for layer, tiles in together.seconds.items()} == {
        layer: set(tiles) for layer, tiles in alone.seconds.items()} == {
        layer: set(tiles) for layer, tiles in together.update_seconds.items()}
    assert all(seconds > 0 for layer, tiles in together.seconds.items()
               for seconds in tiles.values() if tiny.by_name[layer].kind != "input")
    assert together.method == f"{alone.method}-2-concurrent"
    assert [call[:2] for call in calls] == [(done, len(tiny.layers))
                                           for done in range(1, len(tiny.layers) + 1)]
    assert together.processes == 2 and alone.processes == 1
    assert together.key == profile_key(tiny, together.device_name, processes=2) != alone.key
    assert profile_graph_concurrently(tiny, 2, 1, configs=configs, **FAST).method == alone.method
    # a complete profile is its own answer; one measured alone cannot extend it
    assert profile_graph_concurrently(tiny, 2, 2, configs=configs, existing=together,
                                      **FAST) is together
    with pytest.raises(LayerwiseError, match="2 profiler"):
        profile_graph(tiny, 2, configs=configs, existing=together, **FAST)
    with pytest.raises(LayerwiseError, match="processes must be >= 1"):
        profile_graph_concurrently(tiny, 2, 0, configs=configs, **FAST)


def test_save_and_load_round_trip(tmp_path, tiny_profile):
    profile, _ = tiny_profile
    path = profile.save(tmp_path / "deep" / "p.json")
    assert Profile.load(path) == profile
    assert not list(path.parent.glob(".*.tmp"))


def test_check_matches_rejects_other_structure_and_batch(tiny, tiny_profile):
    profile, _ = tiny_profile
    profile.check_matches(tiny)
    other_batch = build_graph("tiny_cnn", batch=16)
    with pytest.raises(LayerwiseError) as error:
        profile.check_matches(other_batch, source="data/profiles/x.json")
    message = str(error.value)
    assert "profile data/profiles/x.json was made for model tiny_cnn" in message
    assert "batch 8" in message and "batch 16" in message and "\n" not in message
    other_model = build_graph("lenet5", batch=8)
    with pytest.raises(LayerwiseError, match=other_model.structure_hash):
        profile.check_matches(other_model)
    with pytest.raises(LayerwiseError, match="layerwise profile lenet5"):
        profile.check_matches(other_model)
    with pytest.raises(LayerwiseError, match="batch 16"):
        profile.check_matches(tiny, batch=16)


def test_check_device_rejects_another_torch_or_huge_page_setting(tiny_profile):
    profile, _ = tiny_profile
    profile.check_device(profile.device_name, torch.__version__, profile.huge_pages)
    with pytest.raises(LayerwiseError, match="torch 9.9"):
        profile.check_device(profile.device_name, "9.9", profile.huge_pages)
    other = "off" if profile.huge_pages else "on"
    with pytest.raises(LayerwiseError, match=f"this machine .* huge pages {other}"):
        profile.check_device(profile.device_name, torch.__version__, not profile.huge_pages)


@pytest.mark.parametrize(("content", "fragment"), [
    ("{not json", "not valid JSON"),
    ('{"schema_version": 7}', "schema_version 7"),
    ("[1, 2]", "schema_version None"),
    ('{"schema_version": 1, "model": "m"}', "profile again"),
])
def test_bad_profile_files_give_one_line_errors(tmp_path, content, fragment):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(LayerwiseError) as error:
        Profile.load(path)
    assert fragment in str(error.value) and str(path) in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("seconds", [1e308, 3601.0, -1.0])
def test_a_tile_time_no_measurement_gives_is_one_line(tiny_profile, tmp_path, seconds):
    """1e308 s made every step inf and still chose a strategy."""
    profile, _ = tiny_profile
    data = json.loads(profile.model_dump_json())
    layer = next(iter(data["seconds"]))
    data["seconds"][layer][next(iter(data["seconds"][layer]))] = seconds
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(LayerwiseError) as error:
        Profile.load(path)
    assert f"seconds.{layer}." in str(error.value) and "\n" not in str(error.value)


def test_missing_profile_file(tmp_path):
    with pytest.raises(LayerwiseError, match="does not exist"):
        Profile.load(tmp_path / "nothing.json")


def test_missing_tile_names_the_layer_and_the_fix(tiny_profile):
    profile, _ = tiny_profile
    with pytest.raises(LayerwiseError) as error:
        profile.tile_seconds("conv1", "1x2x3")
    message = str(error.value)
    assert "'conv1'" in message and "1x2x3" in message and "layerwise profile tiny_cnn" in message
    with pytest.raises(LayerwiseError, match="no layer 'nope'"):
        profile.tile_seconds("nope", "1x2x3")


def test_profile_paths_separate_model_batch_device_torch_and_huge_pages(tmp_path, tiny):
    path = default_profile_path(tiny, "AMD EPYC 7B13 64-Core", root=tmp_path)
    assert path.parent == tmp_path / "data" / "profiles"
    assert path.name.startswith(f"tiny_cnn-{tiny.structure_hash}-amd-epyc-7b13-64-core-float32-b8")
    assert path.suffix == ".json"
    assert profile_key(tiny, "x", batch=16) != profile_key(tiny, "x")
    assert profile_key(tiny, "x", torch_version="9.9") != profile_key(tiny, "x")
    assert profile_key(tiny, "y") != profile_key(tiny, "x")
    plain = profile_key(tiny, "x", huge_pages=False)
    assert profile_key(tiny, "x", processes=2, huge_pages=False) == plain + "-x2"
    assert profile_key(tiny, "x", huge_pages=True) == plain + "-hugepages"
    assert profile_key(tiny, "x") == profile_key(tiny, "x", huge_pages=huge_pages_in_use())
    user = build_graph("tiny_cnn", batch=8).model_copy(update={"model": "pkg.mod:make"})
    assert "/" not in profile_key(user, "GPU / x") and ":" not in profile_key(user, "x")


def test_profile_key_of_a_profile_is_its_default_file_name(tiny, tiny_profile):
    profile, _ = tiny_profile
    assert profile.key == profile_key(tiny, profile.device_name)
    assert profile.huge_pages is huge_pages_in_use()  # what this process's tensors were on


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tiles_are_timed_with_events(tiny):
    profile = profile_graph(tiny, 2, device="cuda")
    assert profile.device_type == "cuda" and profile.method == "cuda-events-queued"
    assert profile.device_name == torch.cuda.get_device_name()
    layer = tiny.by_name["conv1"]
    assert t_c(profile, layer, ParallelConfig(n=2, devices=(0, 1))) > 0


# ---------------------------------------------------------------------------------------------
# layerwise profile
# ---------------------------------------------------------------------------------------------


def _cli() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def main() -> None:
        """Test harness: a fresh app with only the measurement commands."""

    register(app)
    return app


def _invoke(*args: str):
    return CliRunner().invoke(_cli(), list(args))


PROFILE_ARGS = ("profile", "tiny_cnn", "--devices", "2", "--batch-per-device", "2",
                "--image-size", "16", "--repeats", "1", "--warmup", "0", "--threads", "1")


def test_cli_profile_writes_a_profile_and_reuses_it(tmp_path):
    out = tmp_path / "tmp" / "p.json"
    first = _invoke(*PROFILE_ARGS, "--out", str(out))
    assert first.exit_code == 0, first.output
    profile = Profile.load(out)
    graph = build_graph("tiny_cnn", batch=4, image_size=16)
    profile.check_matches(graph)
    tiles = sum(len(t) for name, t in tile_plan(graph, 2, profiled_configs(graph, 2)).items()
                if name != "x")
    assert f"{tiles} tiles to measure" in first.stdout
    assert "reused 0 tiles" in first.stdout and str(out) in first.stdout
    assert "block_conv1" in first.stdout

    second = _invoke(*PROFILE_ARGS, "--out", str(out), "--json")
    assert second.exit_code == 0, second.output
    document = json.loads(second.stdout)
    assert document["reused"] == tiles and document["measured"] == 0
    assert Profile.load(out) == profile

    wider = _invoke(*PROFILE_ARGS, "--out", str(out), "--devices", "4", "--batch-per-device",
                    "1")
    assert wider.exit_code == 0, wider.output
    assert f"reused {tiles} tiles" in wider.stdout


def test_cli_profile_default_path_is_under_data_profiles(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _invoke(*PROFILE_ARGS, "--json")
    assert result.exit_code == 0, result.output
    path = tmp_path / json.loads(result.stdout)["path"]
    graph = build_graph("tiny_cnn", batch=4, image_size=16)
    assert path == default_profile_path(graph, device_name("cpu"), root=tmp_path)
    assert Profile.load(path).batch == 4


@pytest.mark.slow
def test_cli_profile_with_the_ranks_of_a_run_at_once_has_its_own_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    alone = json.loads(_invoke(*PROFILE_ARGS, "--json").stdout)
    result = _invoke(*PROFILE_ARGS, "--processes", "2", "--json")
    assert result.exit_code == 0, result.output
    together = json.loads(result.stdout)
    assert together["processes"] == 2 and together["measured"] == alone["measured"]
    assert together["path"] == alone["path"].removesuffix(".json") + "-x2.json"
    profile = Profile.load(tmp_path / together["path"])
    assert profile.processes == 2 and profile.method.endswith("-2-concurrent")
    again = json.loads(_invoke(*PROFILE_ARGS, "--processes", "2", "--json").stdout)
    assert again["measured"] == 0 and again["reused"] == together["measured"]
    mixed = _invoke(*PROFILE_ARGS, "--processes", "2", "--out", alone["path"])
    one_line_error(mixed, "1 profiler(s) at once")


def test_cli_profile_rejects_a_profile_of_another_batch(tmp_path):
    out = tmp_path / "p.json"
    assert _invoke(*PROFILE_ARGS, "--out", str(out)).exit_code == 0
    result = _invoke(*PROFILE_ARGS, "--out", str(out), "--batch-per-device", "3")
    assert result.exit_code == 2
    assert "batch 4" in result.stderr and "batch 6" in result.stderr
    forced = _invoke(*PROFILE_ARGS, "--out", str(out), "--batch-per-device", "3", "--force")
    assert forced.exit_code == 0, forced.output
    assert Profile.load(out).batch == 6


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cli_profile_cuda_without_cuda_is_one_line(tmp_path):
    result = _invoke(*PROFILE_ARGS, "--out", str(tmp_path / "p.json"), "--device", "cuda")
    one_line_error(result, "--device cpu")
    assert not (tmp_path / "p.json").exists()


def test_cli_profile_bad_numbers_are_one_line(tmp_path):
    one_line_error(_invoke("profile", "tiny_cnn", "--devices", "0"), "--devices")
    one_line_error(_invoke(*PROFILE_ARGS, "--processes", "0"), "--processes")
    one_line_error(_invoke(*PROFILE_ARGS, "--repeats", "0",
                                   "--out", str(tmp_path / "p.json")), "repeats")
    one_line_error(_invoke("profile", "no_such_net", "--devices", "2"), "no_such_net")


def test_cli_profile_help_explains_the_command():
    result = _invoke("profile", "--help")
    assert result.exit_code == 0
    assert "training-step time" in result.stdout and "--batch-per-device" in result.stdout


def test_the_cost_models_t_c_is_a_tiles_passes_and_its_weight_update(tiny, tiny_profile):
    """A step updates every weight a device holds once: the prediction counts it per tile."""
    profile, _ = tiny_profile
    cost = CostModel(tiny, load_cluster("local"), 2, ProfiledCompute(profile))
    assignment = {layer.name: ParallelConfig(n=2, devices=(0, 1)) for layer in tiny.layers}
    keys = {layer.name: largest_tile(layer, assignment[layer.name]).key for layer in tiny.layers}
    passes = math.fsum(profile.seconds[name][key] for name, key in keys.items())
    updates = math.fsum(profile.update_seconds[name][key] for name, key in keys.items())
    assert updates > 0
    assert cost.evaluate(assignment).compute_seconds == pytest.approx(passes + updates)
    fc = tiny.by_name["fc"]
    sharded = ParallelConfig(c=2, devices=(0, 1))
    assert cost.update_seconds(fc, [sharded])[0] == profile.tile_update_seconds(
        "fc", largest_tile(fc, sharded).key)


def test_owt_schemes_b_and_c_are_priced_at_k_passes_of_their_measured_pass_tile(
        tiny, tiny_profile):
    """b and c run each FC layer K times on B/K rows, reading its weights each time: a profile
    prices that from the pass tile it measured, not from one pass of all B rows (AlexNet on
    2 CPU processes: owt_b's measured step is 1.4-1.8x owt_a's)."""
    profile, _ = tiny_profile
    cost = CostModel(tiny, load_cluster("local"), 2, ProfiledCompute(profile))
    fc = tiny.by_name["fc"]
    whole = profile.seconds["fc"][largest_tile(fc, ParallelConfig(c=2, devices=(0, 1))).key]
    one_pass = profile.seconds["fc"][largest_tile(fc, pass_config(2)).key]
    one_pass_of_all = build_strategy("owt_a", cost).predicted.compute_seconds
    for name in ("owt_b", "owt_c"):
        assert build_strategy(name, cost).predicted.compute_seconds == pytest.approx(
            one_pass_of_all - whole + 2 * one_pass), name


def test_a_profile_from_an_older_layerwise_is_measured_again(tmp_path, tiny_profile):
    """Schema 1 timed forward + backward only: extending it would mix two kinds of t_c."""
    profile, _ = tiny_profile
    path = tmp_path / "old.json"
    old = json.loads(profile.model_dump_json())
    old["schema_version"] = 1
    del old["update_seconds"]
    path.write_text(json.dumps(old))
    assert Profile.reusable(path) is None
    with pytest.raises(LayerwiseError, match="schema_version 1"):
        Profile.load(path)
    assert Profile.reusable(tmp_path / "none.json") is None
    path.write_text("{not json")
    with pytest.raises(LayerwiseError, match="not valid JSON"):
        Profile.reusable(path)


def test_cli_profile_replaces_a_profile_from_an_older_layerwise(tmp_path):
    out = tmp_path / "p.json"
    assert _invoke(*PROFILE_ARGS, "--out", str(out)).exit_code == 0
    old = json.loads(out.read_text())
    old["schema_version"] = 1
    del old["update_seconds"]
    out.write_text(json.dumps(old))
    result = _invoke(*PROFILE_ARGS, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "reused 0 tiles" in result.stdout and "older layerwise" in result.stdout
    assert Profile.load(out).schema_version == SCHEMA_VERSION
