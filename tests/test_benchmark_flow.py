"""The benchmark flow end to end on real components: Prefect's test harness, MLflow on a
temporary SQLite file, torchrun with 2 gloo processes, nothing mocked.

One flow run (tiny_cnn at 8x8 on synthetic data, profiled and its links calibrated on this CPU,
data and OWT scheme b, 6 steps) is shared by the checks: starting torchrun costs seconds per
run, the steps milliseconds. The flows that fail are cut short before or at their training,
but for a champion's regression, which takes the shortest flow that measures a step (~20 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from layerwise.flows.benchmark_config import PROJECT_CONFIG, BenchmarkConfig, load_config
from layerwise.flows.cli import app
from layerwise.flows.cli.run import embedded_environment
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.exactness.reference import EXACT_TOLERANCE
from layerwise.strategies.hardware.calibrate import calibration_path
from layerwise.tasks.tracking import owner, provenance, track

pytestmark = pytest.mark.slow

STRATEGIES = ("data", "owt_b")  # a baseline and a scheduled strategy (its own engine)
OVERRIDES = ("name=test-benchmark", "models.0.name=tiny_cnn", "dataset=synthetic",
             "image_size=8", "classes=10", "nproc=2", "batch_per_device=4", "steps=6",
             "strategies=[data,owt_b]", "memory_limit=1KB",
             "profile=true", "cluster=calibrated", "train_deadline_s=240")
# the shortest flow: one strategy, analytic costs, no verify stage, 2 steps
SHORT = ("models.0.name=tiny_cnn", "dataset=synthetic", "image_size=8", "classes=10",
         "nproc=2", "batch_per_device=4", "steps=2", "strategies=[data]", "profile=false",
         "cluster=local", "verify_steps=0")
ARTIFACTS = {"strategy.json", "result.json", "train.json", "per_layer.json",
             "per_layer_degrees.png"}
METRICS = {"predicted_step_seconds", "step_seconds", "throughput_samples_per_s",
           "transfer_bytes_per_step", "sync_bytes_per_step", "predicted_transfer_bytes_per_step",
           "predicted_sync_bytes_per_step", "cost_model_error", "train_loss", "val_accuracy",
           "baseline_val_accuracy", "accuracy_gap", "accuracy_gap_images",
           "accuracy_tolerance_images", "step_seconds_p25", "step_seconds_p75",
           "verify_max_difference"}


@pytest.fixture(scope="module")
def benchmarked(prefect_server, tmp_path_factory):
    """The flow run once in a fresh project folder; its MLflow client and outcomes."""
    from layerwise.flows.benchmark import benchmark

    project = tmp_path_factory.mktemp("project")
    uri = f"sqlite:///{project / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        outcomes = benchmark(load_config(None, OVERRIDES))
    return MlflowClient(tracking_uri=uri), outcomes, project


def test_the_flow_tracks_one_parent_and_a_nested_run_per_strategy(benchmarked):
    client, outcomes, project = benchmarked
    assert [outcome.error for outcome in outcomes] == [None] * len(STRATEGIES)
    experiment = client.get_experiment_by_name("test-benchmark")
    assert experiment is not None
    assert experiment.artifact_location.startswith((project / "mlartifacts").as_uri())
    runs = client.search_runs([experiment.experiment_id])
    parents = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    children = [run for run in runs if "mlflow.parentRunId" in run.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert {run.data.tags["mlflow.parentRunId"] for run in children} == {parents[0].info.run_id}
    assert sorted(run.data.params["strategy"] for run in children) == list(STRATEGIES)
    assert experiment.tags[track.EXPERIMENT_KIND_TAG] == track.EXPERIMENT_KIND  # UI: runs
    assert [found.dataset.name for found in parents[0].inputs.dataset_inputs] == ["synthetic"]
    for tag in ("mlflow.source.git.commit", "mlflow.source.name", "mlflow.source.type",
                provenance.GIT_DIRTY_TAG, "torch_version", "device_name", "huge_pages",
                "prefect_flow_run_id"):
        assert parents[0].data.tags[tag]
    for run in runs:  # what a later flow reads to tell a killed writer's runs (test_faults.py)
        assert run.data.tags[owner.OWNER_PID] == str(os.getpid())


def test_the_per_layer_figure_shows_each_dims_degree_and_the_devices(benchmarked):
    """Data parallelism on 2 processes: every layer's n at degree 2 (log2 1), nothing else
    split, and every layer on both devices (not a bar of 2+1+1+1 per layer)."""
    import numpy as np

    from layerwise.tasks.tracking.figures import degrees_figure

    _, outcomes, _ = benchmarked
    [data] = [outcome.result for outcome in outcomes if outcome.strategy == "data"]
    assert data is not None
    heat, devices, _ = degrees_figure(data).axes  # heat map, device block, colour bar
    layers = len(data.strategy.layers)
    expected = np.zeros((4, layers))
    expected[0] = 1.0
    assert np.array_equal(heat.images[0].get_array(), expected)
    assert len(devices.patches) == 2 * layers


def test_the_latest_summary_and_table_are_where_dvc_yaml_reads_them(benchmarked):
    import yaml

    from layerwise.flows.benchmark import SUMMARY_FILE, TABLE_FILE

    client, _, project = benchmarked
    declared = yaml.safe_load((Path(__file__).parents[1] / "dvc.yaml").read_text())
    assert declared["metrics"] == [str(SUMMARY_FILE)]
    assert {next(iter(plot.values()))["y"][str(TABLE_FILE)] for plot in declared["plots"]} \
        == {"run"}
    summary = json.loads((project / SUMMARY_FILE).read_text(encoding="utf-8"))
    assert set(summary["tiny_cnn v1"]) == set(STRATEGIES) and summary["mlflow_run_id"]
    data = summary["tiny_cnn v1"]["data"]
    assert data["passed"] and data["measured_ms"] > 0 and data["sync_bytes"] > 0
    lines = (project / TABLE_FILE).read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("run,") and len(lines) == 1 + len(STRATEGIES)
    assert f",{data['sync_bytes']}," in lines[1 + STRATEGIES.index("data")]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_strategy_run_holds_params_metrics_and_artifacts(benchmarked, strategy):
    client, _, _ = benchmarked
    experiment = client.get_experiment_by_name("test-benchmark")
    [run] = client.search_runs([experiment.experiment_id],
                               f"params.strategy = '{strategy}'")
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["model"] == "tiny_cnn" and params["model_version"] == "v1"
    assert params["devices"] == "2" and params["cluster"] == str(calibration_path(2))
    assert params["batch_per_device"] == "4" and params["global_batch"] == "8"
    assert params["memory_limit_bytes"] == "1000"
    assert len(params["structure_hash"]) > 8 and params["seed"] == "0"
    metrics = run.data.metrics
    assert set(metrics) >= METRICS
    assert abs(metrics["accuracy_gap_images"]) <= metrics["accuracy_tolerance_images"]
    assert metrics["verify_max_difference"] <= EXACT_TOLERANCE  # data and owt_b are exact
    assert metrics["step_seconds_p25"] <= metrics["step_seconds"] <= metrics["step_seconds_p75"]
    assert metrics["transfer_bytes_per_step"] == metrics["predicted_transfer_bytes_per_step"]
    assert metrics["sync_bytes_per_step"] == metrics["predicted_sync_bytes_per_step"]
    # the memory model covers the layer-wise runtime (data), not OWT's hand-offs (owt_b)
    assert ("predicted_peak_memory_bytes" in metrics) == (strategy == "data")
    if strategy == "data":
        predicted = client.get_metric_history(run.info.run_id,
                                              "predicted_peak_memory_bytes_per_rank")
        assert sorted(metric.step for metric in predicted) == [0, 1]
        assert max(metric.value for metric in predicted) == metrics[
            "predicted_peak_memory_bytes"]
    # ParaDL predicts data parallelism; it has no equivalent of OWT's mixed split
    assert ("oracle_step_seconds" in metrics) == (strategy == "data")
    if strategy == "data":
        assert metrics["oracle_step_seconds"] > 0
        assert metrics["oracle_accuracy"] == pytest.approx(
            metrics["oracle_step_seconds"] / metrics["step_seconds"])
    losses = client.get_metric_history(run.info.run_id, "train_loss")
    assert sorted(metric.step for metric in losses) == [1, 2, 3, 4, 5, 6]
    step_times = client.get_metric_history(run.info.run_id, "train_step_seconds")
    assert sorted(metric.step for metric in step_times) == [1, 2, 3, 4, 5, 6]
    assert all(metric.value > 0 for metric in step_times)
    # logged as the steps arrived, before the results were
    [result_time] = [m.timestamp for m in client.get_metric_history(run.info.run_id,
                                                                     "step_seconds")]
    assert max(metric.timestamp for metric in losses) <= result_time
    assert len({metric.timestamp for metric in losses}) > 1
    assert any(name.startswith("system/") for name in metrics)  # MLflow's system metrics
    [dataset] = run.inputs.dataset_inputs
    assert dataset.dataset.name == "synthetic" and dataset.tags[0].value == "training"
    artifacts = {artifact.path for artifact in client.list_artifacts(run.info.run_id)}
    assert artifacts >= ARTIFACTS
    priced = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "priced_with")}
    path = calibration_path(2)
    assert priced >= {path.name, f"{path.stem}.calibration.json"}
    assert any(name.startswith("tiny_cnn") for name in priced - {path.name}), priced  # profile


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_strategy_runs_model_is_registered_and_rebuilds_its_predictions(benchmarked,
                                                                         strategy):
    """`register_model: true`: each run's weights are a registry version of the model's name,
    aliased `<version label>-<strategy>`, linked to the run's logged model (MLflow's UI lists
    the version on the logged model's page), that loads with MLflow alone and predicts."""
    import mlflow
    import numpy as np
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    client, _, _ = benchmarked
    version = client.get_model_version_by_alias("tiny_cnn", f"v1-{strategy}")
    experiment_id = client.get_experiment_by_name("test-benchmark").experiment_id
    [run] = client.search_runs([experiment_id], f"params.strategy = '{strategy}'")
    assert version.run_id == run.info.run_id
    assert version.tags == {"model_version": "v1", "strategy": strategy,
                            "cluster": calibration_path(2).stem}
    [logged] = client.search_logged_models([experiment_id],
                                           filter_string=f"source_run_id = '{run.info.run_id}'")
    assert json.loads(logged.tags[MLFLOW_MODEL_VERSIONS]) == [
        {"name": "tiny_cnn", "version": str(version.version)}]
    mlflow.set_tracking_uri(client.tracking_uri)  # as every flow run sets it (tracking/track.py)
    model = mlflow.pyfunc.load_model(f"models:/tiny_cnn@v1-{strategy}")
    inputs = model.metadata.get_input_schema().inputs[0]
    assert inputs.shape == (-1, 3, 8, 8)
    assert model.predict(np.zeros((5, 3, 8, 8), np.float32)).shape == (5, 10)
    table = Path(client.download_artifacts(run.info.run_id, "per_layer.json"))
    assert "conv1" in table.read_text(encoding="utf-8")


def test_the_fastest_eligible_strategy_is_crowned_and_every_version_described(benchmarked):
    """The first run on this cluster crowns its fastest eligible strategy: owt_b, as data
    parallelism is over the declared 1 KB. Each version's description says its strategy, its
    measured step and speed-up, why it is or is not champion, and the commit; the summary names
    the champion."""
    from layerwise.flows.benchmark import summary_lines
    from layerwise.tasks.tracking.model_registry import champion_alias

    client, outcomes, _ = benchmarked
    alias = champion_alias("v1", str(calibration_path(2)))
    assert alias == f"champion-v1-{calibration_path(2).stem}".replace(".", "_")
    champion = client.get_model_version_by_alias("tiny_cnn", alias)
    assert champion.tags["strategy"] == "owt_b"
    [parent] = client.search_runs([client.get_experiment_by_name(
        "test-benchmark").experiment_id], "tags.`mlflow.parentRunId` IS NULL")
    commit = parent.data.tags["mlflow.source.git.commit"]
    by_name = {outcome.strategy: outcome for outcome in outcomes}
    for strategy in STRATEGIES:
        version = client.get_model_version_by_alias("tiny_cnn", f"v1-{strategy}")
        step = by_name[strategy].result.step_seconds_median
        assert version.description.startswith(
            f"Strategy '{strategy}' of tiny_cnn, model version label v1, on cluster "
            f"{calibration_path(2).stem}: {step * 1e3:.1f} ms per step measured")
        assert f"Commit {commit}" in version.description
        assert parent.info.run_name in version.description
    data = client.get_model_version_by_alias("tiny_cnn", "v1-data").description
    assert "1.00x data parallelism measured in the same run" in data
    assert "Never champion: its peak memory is over the declared 0.0 MB per device." in data
    assert f"Champion ({alias}): 'owt_b'" in champion.description
    standing = by_name["owt_b"].standing
    assert standing is not None and standing.champion.version == str(champion.version)
    assert f"{alias}: 'owt_b' (registry version {champion.version}" in "\n".join(
        summary_lines(outcomes))


@pytest.fixture(scope="module")
def failing_project(tmp_path_factory) -> Path:
    """The project of the failing flows: one store for them all (creating one takes seconds),
    an experiment each."""
    return tmp_path_factory.mktemp("failing")


@pytest.fixture
def project(failing_project, monkeypatch) -> MlflowClient:
    """The failing flows' project as the working directory, tracking into its store."""
    uri = f"sqlite:///{failing_project / 'mlflow.db'}"
    monkeypatch.chdir(failing_project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return MlflowClient(tracking_uri=uri)


def test_an_error_inside_the_flow_fails_its_run_and_its_start_closes_orphans(prefect_server,
                                                                            project):
    """A corrupt cached profile breaks the flow at its profile stage: its MLflow run ends
    FAILED with the error, not RUNNING. Before that, the flow's start marked KILLED the run a
    killed flow had left RUNNING (its writer's pid does not exist)."""
    from layerwise.flows.benchmark import benchmark
    from layerwise.strategies.cost.profile import default_profile_path
    from layerwise.strategies.hardware.this_machine import device_name
    from layerwise.strategies.model.graph import build_graph

    client, experiment_id = track.open_experiment("failing")
    gone = {**owner.owner_tags(), owner.OWNER_PID: str(2**22 + 1)}  # above Linux's pid_max
    orphan = client.create_run(experiment_id, run_name="orphan", tags=gone).info.run_id
    graph = build_graph("tiny_cnn", batch=8, image_size=8, num_classes=10)
    profile = default_profile_path(graph, device_name("cpu"), processes=2)
    profile.parent.mkdir(parents=True)
    profile.write_text("{not json", encoding="utf-8")
    with pytest.raises(LayerwiseError, match="profile"):
        benchmark(load_config(None, [*SHORT, "name=failing", "profile=true"]))
    assert client.get_run(orphan).info.status == "KILLED"
    [run] = client.search_runs([experiment_id], "attributes.run_name != 'orphan'")
    assert run.info.status == "FAILED" and "LayerwiseError" in run.data.tags["error"]


def test_a_failed_training_fails_its_run_and_the_flows(prefect_server, project):
    """Training that fails (here: past a deadline torchrun cannot meet) inside a strategy's
    run ends that run and the flow's FAILED, each saying why."""
    from layerwise.flows.benchmark import benchmark

    state = benchmark(load_config(None, [*SHORT, "name=deadline", "train_deadline_s=0.01"]),
                      return_state=True)
    assert state.is_failed()
    experiment = project.get_experiment_by_name("deadline")
    assert experiment is not None
    runs = project.search_runs([experiment.experiment_id])
    assert sorted(run.info.status for run in runs) == ["FAILED", "FAILED"]
    [child] = [run for run in runs if "mlflow.parentRunId" in run.data.tags]
    assert "deadline" in child.data.tags["error"]


def test_a_champion_slower_than_it_recorded_fails_the_flow_in_one_line(prefect_server,
                                                                       project):
    """A champion recorded on a faster machine (0.1 ms per step): data parallelism, its
    strategy, measured again by the shortest flow is far slower, so the flow run and its parent
    MLflow run end Failed with one line naming the model, label, cluster, how much slower and
    the champion's version, which also heads the run's summary; the alias stays where it was."""
    from layerwise.flows.benchmark import benchmark
    from layerwise.tasks.tracking.model_registry import champion_alias

    experiment_id = project.create_experiment("champion-regression")
    seed = project.create_run(experiment_id, run_name="a faster machine").info.run_id
    project.log_metric(seed, "step_seconds", 1e-4)
    project.set_terminated(seed)
    project.create_registered_model("tiny_cnn")
    recorded = project.create_model_version("tiny_cnn", f"runs:/{seed}/model", run_id=seed,
                                            tags={"strategy": "data"})
    alias = champion_alias("v1", "local")
    project.set_registered_model_alias("tiny_cnn", alias, recorded.version)
    state = benchmark(load_config(None, [*SHORT, "name=champion-regression"]), return_state=True)
    assert state.is_failed()
    assert state.message.startswith(
        "champion regression: tiny_cnn v1 on local: 'data' ran "), state.message
    assert state.message.endswith(
        f"slower than the 0.1 ms its champion version {recorded.version} recorded (margin 5%)")
    assert "\n" not in state.message
    [parent] = project.search_runs([experiment_id], "attributes.run_name != 'a faster machine'"
                                   " AND tags.`mlflow.parentRunId` IS NULL")
    assert parent.info.status == "FAILED" and state.message in parent.data.tags["error"]
    assert parent.data.tags["mlflow.note.content"].startswith(f"- {state.message}")
    assert project.get_model_version_by_alias("tiny_cnn", alias).version == recorded.version


def test_benchmarks_started_in_one_second_get_folders_of_their_own(monkeypatch, tmp_path):
    from layerwise.strategies.jobs.run_folder import make_stamped_folder

    stamp = "20260101-000000"
    with ThreadPoolExecutor(max_workers=4) as pool:
        folders = list(pool.map(lambda _: make_stamped_folder(tmp_path, "benchmark", stamp),
                                range(8)))
    assert sorted(folder.name for folder in folders) == sorted(
        [f"benchmark-{stamp}"] + [f"benchmark-{stamp}-{suffix}" for suffix in range(2, 9)])


def test_a_bad_config_field_is_one_line_naming_it(tmp_path):
    result = CliRunner().invoke(app, ["run", "--set", "strategies=[data,nope]"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "strategies.1" in lines[0], result.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnproc: two\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["run", "--config", str(bad)])
    assert result.exit_code == 2, result.stderr
    assert "nproc: Input should be a valid integer" in result.stderr, result.stderr


def test_a_partial_config_takes_the_embedded_benchmark_for_the_rest(tmp_path):
    """Every field defaults to configs/benchmark.yaml's value, so a file (or a deployment's
    parameter) names only what it changes; a global batch alone replaces the default batch
    per device."""
    assert BenchmarkConfig() == load_config(None)
    partial = tmp_path / "partial.yaml"
    partial.write_text("name: x\nsteps: 5\nbatch: 4\n", encoding="utf-8")
    config = load_config(partial)
    assert (config.name, config.steps, config.batch, config.batch_per_device) == ("x", 5, 4, None)
    assert config.model_copy(update={"name": "layerwise-benchmark", "steps": 150, "batch": None,
                                     "batch_per_device": 32}) == BenchmarkConfig()


@pytest.mark.parametrize(("override", "fragment"), [
    ("models.0.name=nope", "config models.0.name: unknown model 'nope'"),
    ("cluster=nowhere", "config cluster: unknown cluster 'nowhere'"),
    ("nproc=4096", "fewer than nproc 4096"),
    ("dataset=digits", "params.yaml, which is not here"),
])
def test_what_would_fail_in_the_flow_is_one_line_before_it_starts(tmp_path, monkeypatch,
                                                                   override, fragment):
    monkeypatch.chdir(tmp_path)  # no params.yaml here; nothing of Prefect or MLflow is created
    for name in embedded_environment(tmp_path):  # what `run` sets, restored afterwards
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, ["run", "--set", override])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert not any(tmp_path.iterdir())


def test_run_says_what_it_will_do_before_prefect_starts():
    """`layerwise run`'s first lines, before Prefect's seconds of start-up: the models,
    strategies, processes, steps and the stages the config turns on, in the flow's order."""
    from layerwise.flows.cli.run import plan_line

    assert plan_line(load_config(None)) == (
        "benchmark 'layerwise-benchmark': wide_fc v1 x 3 strategies (layerwise, data, owt) on 2 "
        "processes, 150 steps each; stages: data, calibrate, profile, search, verify, train, "
        "validate, track")
    short = plan_line(load_config(None, SHORT))
    assert short.endswith("stages: data, search, train, validate, track"), short


def test_run_sets_prefects_settings_before_anything_imports_prefect(tmp_path):
    """Prefect reads its settings once, on import: set later, the local server's home and its
    120 s first-start limit would not apply (its first start takes ~20 s on 2 cores, Prefect's
    own limit)."""
    script = ("from layerwise.flows.cli.run import prepare_run\n"
              "prepare_run(None, ['dataset=synthetic'])\n"
              "from prefect.settings import get_current_settings\n"
              "settings = get_current_settings()\n"
              "print(settings.home, settings.server.ephemeral.startup_timeout_seconds)\n")
    environment = {name: value for name, value in os.environ.items()
                   if name not in embedded_environment(tmp_path)}
    shown = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=environment,
                           capture_output=True, text=True, check=True, timeout=120)
    home, timeout = shown.stdout.split()
    assert Path(home) == tmp_path.resolve() / ".prefect" and timeout == "120"


def test_a_local_run_turns_off_both_clients_usage_reports(tmp_path):
    """`layerwise run`'s defaults turn off Prefect's and MLflow's usage reports, as the libraries
    decide it outside CI and tests (MLflow takes DO_NOT_TRACK=true only, not 1)."""
    script = ("from layerwise.flows.cli.run import use_embedded_environment\n"
              "use_embedded_environment()\n"
              "from mlflow.telemetry.utils import is_telemetry_disabled\n"
              "from prefect._internal.analytics.enabled import is_telemetry_enabled\n"
              "print(is_telemetry_disabled(), is_telemetry_enabled())\n")
    # a user's shell: none of the variables by which the libraries recognise CI or a test
    environment = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    shown = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=environment,
                           capture_output=True, text=True, check=True, timeout=120)
    assert shown.stdout.split() == ["True", "False"], shown.stdout


def test_the_profile_stage_measures_with_the_ranks_of_a_cpu_run_at_once(benchmarked):
    """On CPUs the flow's ranks share this machine: its profile is measured by one profiler per
    rank at once, in a file of its own; a scheduled strategy (OWT scheme b chooses by cost)
    needs every configuration."""
    from layerwise.strategies.cost.profile import (
        Profile,
        default_profile_path,
        missing_tiles,
        tile_plan,
    )
    from layerwise.strategies.hardware.this_machine import device_name
    from layerwise.strategies.model.graph import build_graph

    _, _, project = benchmarked
    graph = build_graph("tiny_cnn", batch=8, image_size=8, num_classes=10)
    path = project / default_profile_path(graph, device_name("cpu"), processes=2)
    profiles = [found.name for found in (project / "data" / "profiles").iterdir()
                if not found.name.startswith("cluster-")]
    assert profiles == [path.name]
    profile = Profile.load(path)
    assert profile.processes == 2 and profile.method.endswith("-2-concurrent")
    assert not any(missing_tiles(tile_plan(graph, 2), profile).values())


def test_a_calibrated_cluster_is_measured_kept_and_used_by_the_runs(benchmarked, monkeypatch):
    """`cluster: calibrated` measures this machine's links between the flow's ranks before the
    search, keeps them under data/profiles/ for later runs, and every run uses that file."""
    from layerwise.strategies.hardware.cluster import load_cluster
    from layerwise.tasks.calibrate import calibrate_links

    client, _, project = benchmarked
    path = calibration_path(2)
    cluster = load_cluster(project / path)
    assert cluster.name == "local-calibrated" and cluster.num_devices == 2
    assert cluster.sync == "bucketed" and cluster.links.intra_node.ring_latency is not None
    assert (project / path).with_name(f"{path.stem}.calibration.json").is_file()
    experiment = client.get_experiment_by_name("test-benchmark")
    [run] = client.search_runs([experiment.experiment_id], "params.strategy = 'data'")
    settings = Path(client.download_artifacts(run.info.run_id, "train.json"))
    assert json.loads(settings.read_text(encoding="utf-8"))["cluster"] == str(path)
    measured = (project / path).stat().st_mtime_ns
    monkeypatch.chdir(project)
    assert calibrate_links(2) == path  # the next run reuses the file: nothing measured
    assert (project / path).stat().st_mtime_ns == measured


def test_the_batch_is_global_or_per_device_and_setting_one_replaces_the_other(tmp_path):
    from layerwise.strategies.errors import LayerwiseError

    per_device = load_config(None, ["nproc=2", "batch_per_device=8"])
    assert (per_device.batch, per_device.global_batch) == (None, 16)
    global_batch = load_config(None, ["nproc=2", "batch=1"])  # below the processes
    assert (global_batch.batch_per_device, global_batch.global_batch) == (None, 1)
    both = tmp_path / "both.yaml"
    both.write_text(PROJECT_CONFIG.read_text(encoding="utf-8") + "batch: 4\n",
                    encoding="utf-8")
    with pytest.raises(LayerwiseError, match="set batch .global. or batch_per_device"):
        load_config(both)


def test_calibrating_needs_two_ranks():
    from layerwise.strategies.errors import LayerwiseError

    with pytest.raises(LayerwiseError, match="nproc >= 2") as error:
        load_config(None, ["cluster=calibrated", "nproc=1"])
    assert "\n" not in str(error.value)


def test_a_failed_check_keeps_every_measured_number_and_says_what_failed(benchmarked):
    """The report of a strategy whose fp32 accuracy check fails (here: the data run's outcome
    one image from the reference, with no tolerance) still shows its step time, bytes and
    accuracy; only its status column and the summary name the failure."""
    from dataclasses import replace

    from layerwise.flows.benchmark import _table_rows, summary_lines
    from layerwise.strategies.exactness.accuracy import check_accuracy

    _, outcomes, _ = benchmarked
    data = next(outcome for outcome in outcomes if outcome.strategy == "data")
    passed = _table_rows([data])[0]
    assert data.accuracy is not None and data.divergence is not None
    reference = data.accuracy.reference_correct
    worse = check_accuracy(reference - 1 if reference else 1, reference, data.accuracy.images,
                           0.0)
    failed = replace(data, accuracy=worse, error=f"accuracy {worse.describe()}")
    row = _table_rows([failed])[0]
    assert row["status"] == "accuracy differs" and passed["status"] == "passed"
    for column in ("pred. ms", "meas. ms (IQR)", "pred. bytes", "meas. bytes", "verify"):
        assert row[column] == passed[column] != "-"
    assert row["val acc"] == f"{worse.accuracy:.2%}"
    lines = summary_lines([failed])
    assert sum(line.startswith("failed:") for line in lines) == 1


def test_a_declared_memory_marks_every_strategy_over_it(benchmarked):
    """With memory_limit 1 KB data parallelism is over: the table marks its predicted and
    measured peak and the summary names it; owt_b's engine is neither predicted nor measured
    yet, which the summary says instead of a verdict."""
    from dataclasses import replace

    from layerwise.flows.benchmark import _table_rows, summary_lines

    _, outcomes, _ = benchmarked
    by_name = {outcome.strategy: outcome for outcome in outcomes}
    assert by_name["data"].predicted_peak_bytes > 1000
    assert by_name["data"].fits is False and by_name["data"].measured_peak_bytes > 1000
    assert by_name["owt_b"].fits is None
    rows = {row["strategy"]: row for row in _table_rows(outcomes)}
    assert rows["data"]["peak MB pred./meas."].endswith(" over")
    assert rows["owt_b"]["peak MB pred./meas."] == "-/-"
    lines = summary_lines(outcomes)
    [memory] = [line for line in lines if " memory, " in line]
    assert "'data' does not fit (" in memory and "'owt_b' not judged" in memory
    assert lines[0].startswith("tiny_cnn v1: no strategy fits 0.0 MB per device; 'data' ran ")
    # the fastest of those that fit is named, a faster one that does not fit is not crowned
    data = by_name["data"]
    peak = max(data.predicted_peak_bytes, data.measured_peak_bytes)
    fitting = replace(data, strategy="layerwise", memory_limit=peak)
    over = replace(data, memory_limit=peak, result=data.result.model_copy(
        update={"step_seconds_median": data.result.step_seconds_median / 2,
                "peak_memory_bytes_per_rank": (peak + 1,)}))
    first = summary_lines([over, fitting])[0]
    assert first.startswith(f"tiny_cnn v1: of the strategies that fit {peak / 1e6:,.1f} MB per "
                            "device, 'layerwise' ran fastest (") and first.endswith(
        "'data' ran " f"{over.result.step_seconds_median * 1e3:.1f} ms but does not fit.")


def test_a_failed_accuracy_check_is_a_failed_task_logged_without_a_traceback(prefect_server):
    """The check returns a Failed state (an expected outcome, not an exception): Prefect logs it
    as an error, and no empty traceback ("NoneType: None") follows the message."""
    import logging

    from prefect import flow

    from layerwise.tasks.validate import judge_accuracy

    class Lines(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.ERROR)
            self.setFormatter(logging.Formatter("%(message)s"))
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(self.format(record))

    @flow
    def check() -> object:
        return judge_accuracy(50, 116, 1024, 0.0, return_state=True)

    logger, lines = logging.getLogger("prefect.task_runs"), Lines()
    logger.addHandler(lines)
    try:
        state = check(return_state=True)
    finally:
        logger.removeHandler(lines)
    assert state.is_failed()
    assert state.result(raise_on_failure=False).result(raise_on_failure=False).passed is False
    failed = [line for line in lines.lines if "66 image(s) apart" in line]
    assert failed and not any("NoneType: None" in line for line in lines.lines), lines.lines


def test_the_data_stage_pushes_what_it_prepared_so_a_second_clone_pulls_it(
        prefect_server, tmp_path, monkeypatch):
    """The flow's data stage runs `dvc repro` and then `dvc push` to the project's remote (a
    per-user folder outside every clone, HOME pointing into the test's folder): a second clone's
    `dvc pull` gets the same bytes with no push by hand, and leaves the clone clean."""
    import shutil

    from prefect import flow

    from layerwise.tasks.prepare import prepare_data
    from tests.dvc_repo import ROOT, data_repo, dvc, run

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    repo = data_repo(tmp_path)
    shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    @flow(name="data-stage")
    def data_stage() -> None:
        prepare_data("digits")

    data_stage()
    remote = tmp_path / "home" / ".cache" / "layerwise" / "dvc-remote"  # .dvc/config's
    assert any(path.is_file() for path in remote.rglob("*"))
    assert not (repo / "dvc-remote").exists()
    prepared = repo / "data" / "prepared" / "digits"
    before = {path.name: path.read_bytes() for path in prepared.iterdir()}
    run(["git", "add", "-A"], repo)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "data"], repo)
    second = tmp_path / "second"
    run(["git", "clone", "-q", str(repo), str(second)], tmp_path)
    dvc("pull", "prepare", cwd=second)
    assert {path.name: path.read_bytes()
            for path in (second / "data" / "prepared" / "digits").iterdir()} == before
    dvc("repro", "prepare", cwd=second)  # the first run of the clone: nothing to rebuild
    assert run(["git", "status", "--porcelain"], second).stdout == ""


def test_a_searched_plan_slower_than_data_parallelism_is_a_regression():
    """The nightly's guard: the searched plan's first quartile above data parallelism's third
    is named, with both medians; overlapping quartiles (a tie on a noisy machine), a data
    parallelism that does not fit, or a run without both strategies is not."""
    from layerwise.flows.benchmark import Outcome, regressions
    from layerwise.flows.benchmark_config import ModelVersion
    from layerwise.strategies.training_run import RunResult

    model = ModelVersion(name="wide_fc", version="v2")

    def measured(strategy: str, median: float, quartiles: tuple[float, float],
                 **fields) -> Outcome:
        result = RunResult.model_construct(step_seconds_median=median,
                                           step_seconds_quartiles=quartiles,
                                           peak_memory_bytes_per_rank=())
        return Outcome(model=model, strategy=strategy, result=result, **fields)

    data = measured("data", 0.100, (0.095, 0.105))
    assert regressions([measured("layerwise", 0.130, (0.120, 0.140)), data]) == [
        "regression: wide_fc v2's searched plan ran 130.0 ms per step, slower than data "
        "parallelism's 100.0 (its quartiles 120.0-140.0 ms above 95.0-105.0)"]
    assert regressions([measured("layerwise", 0.104, (0.100, 0.110)), data]) == []
    assert regressions([measured("layerwise", 0.130, (0.120, 0.140)),
                        measured("data", 0.1, (0.095, 0.105), memory_limit=1,
                                 predicted_peak_bytes=2)]) == []
    assert regressions([measured("owt", 0.130, (0.120, 0.140)), data]) == []


def test_a_champion_regression_fails_the_flow_by_the_same_guard():
    """The champion's verdict rides on its model version's outcomes: its regression line is
    one of the guard's, once however many strategies carry it."""
    from layerwise.flows.benchmark import Outcome, regressions
    from layerwise.flows.benchmark_config import ModelVersion
    from layerwise.strategies.training_run import RunResult
    from layerwise.tasks.tracking.champion import Champion, Measured, settle

    model = ModelVersion(name="wide_fc", version="v2")
    held = Champion(version="3", strategy="data", step_seconds=0.100)
    standing = settle("wide_fc", "v2", "local", "champion-v2-local", held,
                      [Measured(strategy="data", version="4", step_seconds=0.120)], 0.05)
    result = RunResult.model_construct(step_seconds_median=0.120,
                                       step_seconds_quartiles=(0.119, 0.121),
                                       peak_memory_bytes_per_rank=())
    outcomes = [Outcome(model=model, strategy=strategy, result=result, standing=standing)
                for strategy in ("data", "owt")]
    assert regressions(outcomes) == [
        "champion regression: wide_fc v2 on local: 'data' ran 120.0 ms per step, 20.0% slower "
        "than the 100.0 ms its champion version 3 recorded (margin 5%)"]
