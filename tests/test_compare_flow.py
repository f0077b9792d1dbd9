"""The compare flow on a real MLflow store: the benchmark flow writes it, compare reads it back.

One benchmark run (tiny_cnn labelled v1 and v2 at 8x8 on synthetic data, strategy data, 2
processes, 4 steps) in Prefect's test harness with MLflow on a temporary SQLite file, and an
older run that a killed flow left RUNNING; then `layerwise compare --json --log` and
`layerwise compare --all` (a query alone, which writes nothing to MLflow) as a user runs them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from layerwise.flows.benchmark_config import load_config
from layerwise.flows.cli import app
from layerwise.flows.compare import COMPARED_METRICS, DELTA_METRICS, layer_changes
from layerwise.tasks.tracking import owner, track

pytestmark = pytest.mark.slow

EXPERIMENT = "test-compare"
VERSIONS = ("v1", "v2")
OVERRIDES = (f"name={EXPERIMENT}", "dataset=synthetic", "image_size=8", "classes=10",
             "nproc=2", "batch_per_device=4", "steps=4", "strategies=[data]", "profile=false",
             "cluster=local", "train_deadline_s=240", "verify_steps=0",
             "models=[{name: tiny_cnn, version: v1}, {name: tiny_cnn, version: v2}]")


@pytest.fixture(scope="module")
def compared(prefect_server, tmp_path_factory):
    """The benchmark flow once, then `layerwise compare --json --log` and `--all` on its
    store."""
    from layerwise.flows.benchmark import benchmark

    project = tmp_path_factory.mktemp("project")
    uri = f"sqlite:///{project / 'mlflow.db'}"
    started = datetime.now(UTC)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        # set, so the CLI's embedded defaults change nothing outside this test
        for name, value in (("MLFLOW_TRACKING_URI", uri),
                            ("PREFECT_HOME", str(project / ".prefect")),
                            ("PREFECT_SERVER_ANALYTICS_ENABLED", "false")):
            patch.setenv(name, value)
        benchmark(load_config(None, OVERRIDES))
        _leave_an_orphan(MlflowClient(tracking_uri=uri))
        result = CliRunner().invoke(app, ["compare", "--experiment", EXPERIMENT, "--json",
                                          "--log"])
        assert result.exit_code == 0, result.output
        printed = CliRunner().invoke(app, ["compare", "--experiment", EXPERIMENT, "--all"])
        assert printed.exit_code == 0, printed.output
        artifacts = _prefect_artifacts(since=started)
    return MlflowClient(tracking_uri=uri), json.loads(result.stdout), artifacts, printed.stdout


def _leave_an_orphan(client: MlflowClient) -> None:
    """A run started before the benchmark by a process that is gone, still RUNNING."""
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    gone = {**owner.owner_tags(), owner.OWNER_PID: str(2**22 + 1)}  # above Linux's pid_max
    client.create_run(experiment.experiment_id, run_name="orphan", start_time=1, tags=gone)


def _prefect_artifacts(since: datetime) -> dict[str, str]:
    """Keyed artifacts on the shared test server created by this module's flow run."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return {artifact.key: artifact.type for artifact in client.read_artifacts()
                if artifact.key and artifact.created is not None and artifact.created >= since}


def test_every_version_and_strategy_is_listed_with_its_metrics(compared):
    _, report, _, _ = compared
    assert report["experiment"] == EXPERIMENT and len(report["parent_runs"]) == 1
    rows = report["rows"]
    assert [(row["model_version"], row["strategy"]) for row in rows] == [
        (version, "data") for version in VERSIONS]
    for row in rows:
        assert row["model"] == "tiny_cnn" and row["status"] == "FINISHED"
        assert set(row["metrics"]) == set(COMPARED_METRICS)
        metrics = row["metrics"]
        # verify_steps=0 here: the skipped float64 stage logs nothing, everything else is there
        assert metrics.pop("verify_max_difference") is None
        assert all(value is not None for value in metrics.values()), row
        assert metrics["transfer_bytes_per_step"] == metrics["predicted_transfer_bytes_per_step"]
        assert metrics["sync_bytes_per_step"] == metrics["predicted_sync_bytes_per_step"]


def test_two_versions_of_a_model_say_what_changed(compared):
    _, report, _, _ = compared
    [change] = report["changes"]
    assert (change["model"], change["before"], change["after"]) == ("tiny_cnn", "v1", "v2")
    assert not change["structure_changed"]  # the same network under two labels
    assert change["layers_added"] == [] and change["layers_removed"] == []
    assert set(change["deltas"]["data"]) == set(DELTA_METRICS)
    # same seed, data and exact runtime: the accuracy is the same, the bytes too
    assert change["deltas"]["data"]["val_accuracy"] == 0
    assert change["deltas"]["data"]["sync_bytes_per_step"] == 0


def test_the_comparison_is_logged_on_the_parent_run_and_in_prefect(compared):
    client, report, prefect_artifacts, _ = compared
    parent = report["parent_runs"][0]["run_id"]
    assert report["logged_on_run"] == parent
    folder = report["artifacts"][0].split("/")[0]
    logged = {artifact.path for artifact in client.list_artifacts(parent, folder)}
    assert logged == set(report["artifacts"])
    table = json.loads(Path(client.download_artifacts(
        parent, f"{folder}/comparison_table.json")).read_text(encoding="utf-8"))
    assert len(table["data"]) == len(VERSIONS) and "step_seconds" in table["columns"]
    assert prefect_artifacts["strategy-comparison"] == "table"
    assert prefect_artifacts["model-version-changes"] == "markdown"


def test_the_table_and_what_changed_are_printed_with_whole_names(compared):
    _, report, _, printed = compared
    assert "predicted vs measured" in printed
    assert "what changed: tiny_cnn v1 -> v2: same structure" in printed
    assert report["parent_runs"][0]["run_name"] in printed  # in 160 columns, not cut
    assert "finished" in printed  # each run's status


def test_a_query_without_log_writes_nothing_to_mlflow(compared):
    """`compare --all` ran after `compare --json --log`: only the latter's folder is there."""
    client, report, _, printed = compared
    parent = report["parent_runs"][0]["run_id"]
    folders = [artifact.path for artifact in client.list_artifacts(parent)
               if artifact.path.startswith("compare-")]
    assert folders == [report["artifacts"][0].split("/")[0]]
    assert "logged on MLflow run" not in printed


def test_a_run_a_killed_flow_left_running_is_marked_killed(compared):
    """By the compare asked to write (--log); a query alone writes nothing."""
    client, *_ = compared
    experiment = client.get_experiment_by_name(EXPERIMENT)
    [orphan] = client.search_runs([experiment.experiment_id], "attributes.run_name = 'orphan'")
    assert orphan.info.status == "KILLED" and track.ORPHAN_TAG in orphan.data.tags


def test_layer_changes_keep_layer_order():
    before, after = ["conv1", "pool1", "fc1"], ["conv1", "conv2", "pool1", "fc2"]
    assert layer_changes(before, after) == (["conv2", "fc2"], ["fc1"])


def test_an_unknown_experiment_is_one_line(compared, tmp_path, monkeypatch):
    client, *_ = compared
    monkeypatch.chdir(tmp_path)
    for name, value in (("MLFLOW_TRACKING_URI", client.tracking_uri),
                        ("PREFECT_HOME", str(tmp_path)),
                        ("PREFECT_SERVER_ANALYTICS_ENABLED", "false")):
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["compare", "--experiment", "absent"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'absent'" in lines[0] and EXPERIMENT in lines[0], result.stderr


def test_the_parent_run_carries_the_summary_winners_table_and_figure(compared):
    """What a reader opens first, on the benchmark's parent run itself: the summary as the
    run's description and summary.md, each model version's winner as a tag with its speed-up
    over data parallelism (here data alone ran: 1.0), the results table and the figure."""
    client, report, _, _ = compared
    parent = client.get_run(report["parent_runs"][0]["run_id"])
    note = parent.data.tags["mlflow.note.content"]
    assert note.startswith("- tiny_cnn v1: 'data' ran fastest") and "tiny_cnn v2" in note
    for version in VERSIONS:
        assert parent.data.tags[f"winner.tiny_cnn.{version}"] == "data"
        assert parent.data.metrics[f"speedup_measured.tiny_cnn.{version}"] == 1.0
        assert parent.data.metrics[f"speedup_predicted.tiny_cnn.{version}"] == 1.0
    logged = {artifact.path for artifact in client.list_artifacts(parent.info.run_id)}
    assert {"summary.md", "results.json", "comparison.png"} <= logged
    assert client.download_artifacts(parent.info.run_id, "summary.md").endswith("summary.md")


def test_each_versions_champion_is_named_beside_the_newest_runs_challenger(compared):
    """The benchmark crowned data, its one strategy, for each label on the local cluster:
    compare reads the champion from the registry (its recorded step is the newest run's, which
    crowned it) and finds no other strategy to challenge it."""
    _, report, prefect_artifacts, printed = compared
    champions = report["champions"]
    assert [(row["model_version"], row["cluster"], row["alias"], row["champion_strategy"])
            for row in champions] == [(version, "local", f"champion-{version}-local", "data")
                                      for version in VERSIONS]
    steps = {row["model_version"]: row["metrics"]["step_seconds"] for row in report["rows"]}
    for row in champions:
        assert row["champion_step_seconds"] == row["champion_latest_seconds"] \
            == steps[row["model_version"]]
        assert row["challenger_strategy"] is None and row["challenger_step_seconds"] is None
    version = champions[0]["champion_version"]
    assert (f"champion: tiny_cnn v1 on local (champion-v1-local): champion 'data' (registry "
            f"version {version}, ") in printed
    assert prefect_artifacts["champions"] == "markdown"
