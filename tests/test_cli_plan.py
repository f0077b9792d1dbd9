"""`layerwise search` and `layerwise reproduce` as a user and a script read them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.strategies.errors import ConfigError, LayerwiseError
from layerwise.strategies.hardware.cluster import load_cluster
from layerwise.strategies.jobs.pricing import resolved_placement
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.space import ParallelConfig, enumerate_configs
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.strategy import Strategy
from tests.cli_errors import one_line_error

runner = CliRunner()
SEARCH = ("search", "tiny_cnn", "--devices", "4", "--cluster", "p100x16-2018", "--analytic",
          "--batch-per-device", "4")



def test_search_json_follows_the_contract():
    result = runner.invoke(app, [*SEARCH, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    for key in ("schema_version", "model", "devices", "cluster", "cost_source",
                "search_seconds", "search_method", "optimality_gap", "final_graph_nodes",
                "strategies"):
        assert key in document
    assert document["cost_source"] == "analytic" and document["devices"] == 4
    # the whole space by default, solved exactly
    assert document["placement"] == "aligned" and document["optimality_gap"] == 0
    assert document["placement_note"] is None
    assert set(document["strategies"]) == {"layerwise", "data", "model", "owt"}
    graph = build_graph("tiny_cnn", batch=16)
    best = document["strategies"]["layerwise"]["step_seconds"]
    for entry in document["strategies"].values():
        assert entry["step_seconds"] == pytest.approx(
            entry["compute_seconds"] + entry["transfer_seconds"] + entry["sync_seconds"])
        assert isinstance(entry["transfer_bytes"], int) and isinstance(entry["sync_bytes"], int)
        assert len(entry["peak_memory_bytes_per_device"]) == 4
        assert [layer["name"] for layer in entry["layers"]] == [lay.name for lay in graph.layers]
        for layer in entry["layers"]:
            ParallelConfig.parse(layer["config"])
        assert best <= entry["step_seconds"] * (1 + 1e-9)
    # data parallelism holds every weight four times on every device (weights, gradients,
    # momentum, bucket); tiny_cnn's activations outweigh its weights, and a channel split keeps
    # every sample's on every device where the sample split keeps a quarter
    weights = 4 * sum(p.numel() for p in build_model("tiny_cnn", num_classes=10).parameters())
    data, model = (document["strategies"][name]["peak_memory_bytes_per_device"]
                   for name in ("data", "model"))
    assert min(data) > 4 * weights and min(model) > max(data)


def test_search_holds_its_plan_to_the_memory_limit_and_marks_the_baselines_over_it():
    """tiny_cnn's fastest plan puts every layer on one device (3.5 MB there); data needs 1.1
    MB per device and model 2.7 MB. Under a 2 MB limit the searched plan is the fastest the
    search finds within it, with its proven gap; model is marked."""
    default = json.loads(runner.invoke(app, [*SEARCH, "--json"]).stdout)
    assert default["memory_budget_bytes"] == int(16 * 2**30 * 0.9)  # P100's 16 GiB less 10%
    assert all(entry["fits"] for entry in default["strategies"].values())
    assert default["memory_rounds"] == 0
    fastest = default["strategies"]["layerwise"]
    assert max(fastest["peak_memory_bytes_per_device"]) > 2_000_000

    document = json.loads(runner.invoke(app, [*SEARCH, "--memory-limit", "2MB",
                                              "--json"]).stdout)
    assert document["memory_budget_bytes"] == 2_000_000
    fits = {name: entry["fits"] for name, entry in document["strategies"].items()}
    assert fits == {name: max(entry["peak_memory_bytes_per_device"]) <= 2_000_000
                    for name, entry in document["strategies"].items()}
    assert fits["layerwise"] and fits["data"] and not fits["model"]
    held = document["strategies"]["layerwise"]["step_seconds"]
    assert fastest["step_seconds"] <= held <= document["strategies"]["data"]["step_seconds"]
    assert document["memory_rounds"] > 0 and 0 <= document["optimality_gap"] < 1
    printed = runner.invoke(app, [*SEARCH, "--memory-limit", "2MB"]).stdout
    assert "does not fit: model needs 2.7 MB on its fullest device, over the 2.0 MB" in printed
    assert "does not fit: data" not in printed and "does not fit: layerwise" not in printed
    assert "held to 2.0 MB per device" in printed


def test_a_global_batch_under_the_device_count_is_planned_with_spatial_splits():
    """VGG-16 at 512x512 on 16 devices with 4 images in all: a sample split uses at most 4
    devices, so the searched plan reaches the rest by height, width and channel splits."""
    result = runner.invoke(app, ["search", "vgg16", "--devices", "16", "--cluster", "p100x16-2018",
                                 "--analytic", "--batch", "4", "--image-size", "512",
                                 "--baselines", "data", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["batch"] == 4
    configs = [ParallelConfig.parse(layer["config"])
               for layer in document["strategies"]["layerwise"]["layers"]]
    assert all(config.n <= 4 for config in configs)
    assert any(config.h * config.w > 1 and config.size == 16 for config in configs)
    strategies = document["strategies"]
    assert strategies["layerwise"]["step_seconds"] < strategies["data"]["step_seconds"]


def test_search_saves_a_strategy_that_loads_and_fits_the_model(tmp_path):
    path = tmp_path / "strategy.json"
    result = runner.invoke(app, [*SEARCH, "--save", str(path)])
    assert result.exit_code == 0, result.output
    assert "layer-wise strategy" in result.stdout and "saved" in result.stdout
    strategy = Strategy.load(path)
    graph = build_graph("tiny_cnn", batch=16)
    assignment = strategy.check_against(graph, 4)
    assert set(assignment) == {layer.name for layer in graph.layers}
    with pytest.raises(ConfigError, match="made for tiny_cnn"):
        strategy.check_against(build_graph("lenet5", batch=16), 4)


def test_strategy_file_errors_are_one_line(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Strategy.load(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        Strategy.load(tmp_path / "missing.json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"name": "x"}))
    with pytest.raises(ConfigError, match="wrong.json: model"):
        Strategy.load(wrong)


def test_search_needs_a_cost_source():
    result = runner.invoke(app, ["search", "tiny_cnn", "--devices", "2", "--cluster", "local"])
    one_line_error(result, "layerwise profile tiny_cnn --devices 2", "--analytic")
    given = "tests.idiom_models:Activations(num_classes=3)"  # pasted into a shell as one word
    result = runner.invoke(app, ["search", given, "--devices", "2", "--cluster", "local"])
    one_line_error(result, f"layerwise profile '{given}' --devices 2")


def test_search_rejects_bad_requests():
    one_line_error(runner.invoke(app, [*SEARCH, "--baselines", "data,nope"]),
                   "unknown baseline(s) nope")
    one_line_error(runner.invoke(app, [*SEARCH, "--placement", "random"]), "--placement")
    one_line_error(
        runner.invoke(app, ["search", "tiny_cnn", "--devices", "16", "--cluster", "k20x8",
                            "--analytic"]), "has 8 devices")


@pytest.mark.slow
def test_reproduce_optcnn_covers_the_papers_grid():
    result = runner.invoke(app, ["reproduce", "optcnn", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    rows = document["rows"]
    assert len(rows) == 3 * 5 * 4
    for model in ("alexnet", "vgg16", "inception_v3"):
        for devices in (1, 2, 4, 8, 16):
            cell = {r["strategy"]: r for r in rows
                    if r["model"] == model and r["devices"] == devices}
            best = cell["layerwise"]["images_per_second"]
            assert all(best >= r["images_per_second"] * (1 - 1e-9) for r in cell.values())
    # the same hardware synchronising with a ring all-reduce: searched again, the optimum in
    # every cell, and data parallelism gaining with every doubling of GPUs, as in the paper
    ring = document["ring_all_reduce"]["rows"]
    assert len(ring) == 3 * 5 * 4
    for model in ("alexnet", "vgg16", "inception_v3"):
        cells = [{r["strategy"]: r["images_per_second"] for r in ring
                  if r["model"] == model and r["devices"] == devices}
                 for devices in (1, 2, 4, 8, 16)]
        assert all(cell["layerwise"] >= max(cell.values()) * (1 - 1e-9) for cell in cells)
        data = [cell["data"] for cell in cells]
        assert all(later > earlier for earlier, later in zip(data[:-1], data[1:], strict=True)), (
            model, data)
    vgg = {layer["name"]: layer["config"] for layer in document["vgg16_4_gpus_layerwise"]}
    assert vgg["features_0"] == "n4c1h1w1@0-3"
    assert ParallelConfig.parse(vgg["classifier_0"]).c > 1
    one_line_error(runner.invoke(app, ["reproduce", "alexnet2012"]), "available: optcnn")


def two_p100s(folder: Path) -> Path:
    """A user's cluster file: one node of two P100s, its network card shared by both."""
    preset = load_cluster("p100x16-2018")
    links = preset.links.model_copy(update={
        "inter_node": preset.links.inter_node.model_copy(update={"shared_by": 2})})
    path = folder / "two.yaml"
    path.write_text(preset.model_copy(update={
        "name": "two_p100", "nodes": 1, "devices_per_node": 2, "links": links}).to_yaml())
    return path


def test_reproduce_optcnn_on_a_users_cluster_and_batch(tmp_path):
    """--cluster and --batch-per-device: the grid stops at the cluster's device count, every
    row is priced at the batch asked for, the ratios to data parallelism are printed."""
    two = two_p100s(tmp_path)
    result = runner.invoke(app, ["reproduce", "optcnn", "--cluster", str(two),
                                 "--batch-per-device", "2", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["cluster"], document["batch_per_device"]) == ("two_p100", 2)
    assert document["sync"] == "parameter_server" and document["cost_source"] == "analytic"
    assert {(row["model"], row["devices"]) for row in document["rows"]} == {
        (model, devices) for model in ("alexnet", "vgg16", "inception_v3") for devices in (1, 2)}
    for row in document["rows"]:
        if row["strategy"] == "data":
            assert row["vs_data"] == 1.0
    for entry in document["summary"]:
        assert entry["speedup_over_best_other"] >= 1 - 1e-9
        assert entry["paper_speedup_over_best_other"] is None  # the paper states 16 GPUs
    printed = runner.invoke(app, ["reproduce", "optcnn", "--cluster", str(two),
                                  "--batch-per-device", "2"])
    assert printed.exit_code == 0, printed.output
    assert "throughput over data parallelism" in printed.stdout
    assert "2 images per device" in printed.stdout
    assert "BatchNorm statistics: local" in printed.stdout


def test_reproduce_optcnn_prices_synced_batch_norm_statistics_when_asked(tmp_path):
    """The paper's systems normalised each GPU's tile by its own statistics (the default);
    `--batch-norm synced` adds SyncBatchNorm's all-reduce of 4 values per channel of every
    BatchNorm, to data parallelism's bytes exactly, and nothing where there is no BatchNorm."""
    two = two_p100s(tmp_path)
    documents = {}
    for statistics in ("local", "synced"):
        result = runner.invoke(app, ["reproduce", "optcnn", "--cluster", str(two),
                                     "--batch-per-device", "2", "--batch-norm", statistics,
                                     "--json"])
        assert result.exit_code == 0, result.output
        documents[statistics] = json.loads(result.stdout)
        assert documents[statistics]["batch_norm_statistics"] == statistics
    data = {statistics: {(row["model"], row["devices"]): row["gb_per_step"]
                         for row in document["rows"] if row["strategy"] == "data"}
            for statistics, document in documents.items()}
    graph = build_graph("inception_v3", batch=4)
    channels = sum(layer.output_shape[1] for layer in graph.layers
                   for op in (layer.op, *(fused.op for fused in layer.fused))
                   if op.startswith("BatchNorm"))
    added = (data["synced"][("inception_v3", 2)] - data["local"][("inception_v3", 2)]) * 1e9
    assert added == pytest.approx(2 * (2 - 1) * 4 * channels * 4, rel=1e-9)
    for model in ("alexnet", "vgg16"):  # no BatchNorm
        assert data["synced"][(model, 2)] == data["local"][(model, 2)]
    one_line_error(runner.invoke(app, ["reproduce", "optcnn", "--batch-norm", "global"]),
                   "--batch-norm must be local or synced")


@pytest.mark.parametrize(("arguments", "fragment"), [
    (["optcnn", "--batch-per-device", "0"], "--batch-per-device must be >= 1"),
    (["optcnn", "--cluster", "nowhere"], "unknown cluster 'nowhere'"),
    (["owt", "--cluster", "p100x16-2018"], "apply to optcnn"),
    (["owt", "--batch-norm", "synced"], "apply to optcnn"),
])
def test_reproduce_refuses_bad_options_in_one_line(arguments, fragment):
    one_line_error(runner.invoke(app, ["reproduce", *arguments]), fragment)


def test_profile_then_search_with_measured_costs(tmp_path):
    profile = tmp_path / "tiny.json"
    made = runner.invoke(app, ["profile", "tiny_cnn", "--devices", "2", "--batch-per-device", "2",
                               "--image-size", "8", "--repeats", "1", "--warmup", "0",
                               "--threads", "1", "--out", str(profile)])
    assert made.exit_code == 0, made.output
    result = runner.invoke(app, ["search", "tiny_cnn", "--devices", "2", "--batch-per-device",
                                 "2", "--image-size", "8", "--cluster", "local", "--profile",
                                 str(profile), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["cost_source"] == "profile"
    assert document["strategies"]["layerwise"]["compute_seconds"] > 0
    mismatch = runner.invoke(app, ["search", "tiny_cnn", "--devices", "2", "--batch-per-device",
                                   "4", "--image-size", "8", "--cluster", "local", "--profile",
                                   str(profile)])
    one_line_error(mismatch, "batch 4", "layerwise profile tiny_cnn")
    # the paper's replay on the measured profile: its model, at its device count and batch
    replay = runner.invoke(app, ["reproduce", "optcnn", "--cluster", "local", "--profile",
                                 str(profile), "--json"])
    assert replay.exit_code == 0, replay.output
    document = json.loads(replay.stdout)
    assert document["cost_source"] == "profile" and document["batch_per_device"] == 2
    assert {(row["model"], row["devices"]) for row in document["rows"]} == {("tiny_cnn", 2)}
    one_line_error(runner.invoke(app, ["reproduce", "optcnn", "--cluster", "local", "--profile",
                                       str(profile), "--batch-per-device", "4"]),
                   "--batch-per-device 4", "profile's 2 images per device")


def test_search_with_paradl_adds_the_oracles_cases_agreeing_on_data_parallelism():
    # ParaDL's closed form syncs by ring all-reduce: compare on a ring cluster (its own)
    result = runner.invoke(app, ["search", "vgg16", "--devices", "4", "--cluster", "abci",
                                 "--analytic", "--baselines", "data,paradl", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    cases = {case["strategy"]: case for case in document["paradl"]}
    assert set(cases) == {"serial", "data", "spatial", "filter", "channel", "pipeline",
                          "data+filter", "data+spatial"}
    assert not cases["serial"]["feasible"] and "p=4" in cases["serial"]["reason"]
    # two independent models of one data-parallel step: Eq. 1 and ParaDL's closed form
    eq1 = document["strategies"]["data"]["step_seconds"]
    assert cases["data"]["epoch_seconds"] == pytest.approx(eq1, rel=0.1)


def test_search_with_pipeline_reports_its_stages_next_to_the_layerwise_optimum():
    result = runner.invoke(app, ["search", "alexnet", "--devices", "4", "--cluster", "local",
                                 "--analytic", "--image-size", "32", "--batch-per-device", "4",
                                 "--baselines", "data,pipeline", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    pipeline = document["pipeline"]
    graph = build_graph("alexnet", batch=16, image_size=32)
    covered = [name for stage in pipeline["stages"] for name in stage["layers"]]
    assert covered == [layer.name for layer in graph.layers]
    stages = len(pipeline["stages"])
    assert pipeline["bubble_fraction"] == pytest.approx(
        (stages - 1) / (pipeline["micro_batches"] + stages - 1))
    predicted = document["strategies"]["pipeline"]["step_seconds"]
    assert predicted == pytest.approx(pipeline["step_seconds"])


def test_the_default_placement_takes_the_whole_space_unless_it_would_take_minutes():
    """`auto`: aligned where bench_search measured seconds, origin beyond, with the reason."""
    graph = build_graph("resnet18", batch=64)
    assert resolved_placement(graph, 64, "auto") == ("aligned", None)
    placement, note = resolved_placement(graph, 128, "auto")
    assert placement == "origin"
    assert "resnet18 on 128 devices" in note and "--placement aligned" in note
    pairs = sum(len(enumerate_configs(layer, 128)) ** 2 for layer in graph.layers)
    assert f"prices {pairs:,} config pairs" in note
    assert resolved_placement(graph, 128, "aligned") == ("aligned", None)
    with pytest.raises(LayerwiseError, match="auto, aligned or origin"):
        resolved_placement(graph, 4, "everywhere")


def test_a_profile_at_a_global_batch_prices_the_search_at_that_batch(tmp_path):
    """`profile --batch` and `search --batch` meet at one global batch (2 images on 4 devices);
    a search at another batch names the profile command that fits it."""
    profile = tmp_path / "profile.json"
    shape = ["--devices", "4", "--image-size", "8"]
    made = runner.invoke(app, ["profile", "tiny_cnn", *shape, "--batch", "2", "--repeats", "1",
                               "--warmup", "0", "--out", str(profile)])
    assert made.exit_code == 0, made.output
    assert "global batch 2 (given)" in made.stdout
    searched = runner.invoke(app, ["search", "tiny_cnn", *shape, "--batch", "2", "--cluster",
                                   "local", "--profile", str(profile), "--json"])
    assert searched.exit_code == 0, searched.output
    document = json.loads(searched.stdout)
    assert document["batch"] == 2 and document["cost_source"] == "profile"
    other = runner.invoke(app, ["search", "tiny_cnn", *shape, "--batch", "4", "--cluster",
                                "local", "--profile", str(profile)])
    one_line_error(other, "`layerwise profile tiny_cnn --devices N --batch 4 --input-shape 3,8,8`")
