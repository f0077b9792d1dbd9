"""`layerwise serve`: the paths a user hits first (a bad cron string, no PREFECT_API_URL, a
PREFECT_API_URL where nothing answers: one line each), prefect.yaml's deployment, and a served
deployment that really runs against Prefect's test server.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prefect.settings import PREFECT_API_URL, temporary_settings
from typer.testing import CliRunner

from layerwise.flows.benchmark_config import load_config
from layerwise.flows.cli import app
from layerwise.flows.cli.serve import check_cron
from tests.distributed import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with the embedded defaults already set (the CLI keeps them)."""
    monkeypatch.chdir(tmp_path)
    for name, value in (("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}"),
                        ("PREFECT_HOME", str(tmp_path / ".prefect")),
                        ("PREFECT_SERVER_ANALYTICS_ENABLED", "false")):
        monkeypatch.setenv(name, value)
    return tmp_path


def one_error_line(arguments: list[str]) -> str:
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("cron", ["0 2 * *", "every night", "61 2 * * *", "0 0 2 * * *"])
def test_a_bad_cron_string_is_one_line(project, cron):
    assert "not a cron expression" in one_error_line(["serve", "--cron", cron])


def test_without_a_server_it_says_to_start_one(project):
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        line = one_error_line(["serve", "--cron", "0 2 * * *"])
    assert "prefect server start" in line and "PREFECT_API_URL" in line


def test_a_server_that_does_not_answer_is_named(project):
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        line = one_error_line(["serve", "--cron", "0 2 * * *"])
    assert "http://127.0.0.1:9/api does not answer" in line and "prefect server start" in line


def test_prefect_yaml_deploys_the_benchmark_flow_with_the_embedded_config():
    [deployment] = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    path, _, function = deployment["entrypoint"].partition(":")
    assert (path, function) == ("flows/benchmark.py", "benchmark")
    assert f'@flow(name="benchmark")\ndef {function}(' in (ROOT / path).read_text()
    [schedule] = deployment["schedules"]
    check_cron(schedule["cron"])
    assert deployment["parameters"]["config"] == load_config(None).model_dump(mode="json")
    # the operator's environment says where runs are tracked: the deployment pins no store
    assert "MLFLOW_TRACKING_URI" not in deployment["work_pool"]["job_variables"]["env"]


def test_runs_are_tracked_where_the_environment_says_else_in_the_working_directory(
        tmp_path, monkeypatch):
    from layerwise.tasks.tracking import track

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client, _ = track.open_experiment("unset")
    assert client.tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert (tmp_path / "mlflow.db").is_file()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'operator.db'}")
    client, _ = track.open_experiment("set")
    assert client.tracking_uri.endswith("operator.db")


# the shortest flow that still trains, validates and tracks: the verify stage is the benchmark
# flow test's (tests/test_benchmark_flow.py), not what a deployment adds
SERVED = ("name=served", "models.0.name=tiny_cnn", "dataset=synthetic", "image_size=8",
          "batch_per_device=4", "steps=2", "strategies=[data]", "profile=false",
          "cluster=local", "train_deadline_s=240", "verify_steps=0")
SERVE_LIMIT_SECONDS = 600  # far above a served run's ~60 s: reached only if it never fires
# what an operator passes to one run (`prefect deployment run ... --param config='{...}'`): the
# fields it names, every other one the embedded benchmark's (the learning rate, the seed, ...)
PARTIAL = {"name": "served", "models": [{"name": "tiny_cnn"}], "dataset": "synthetic",
           "image_size": 8, "batch": 8, "steps": 3, "strategies": ["data"], "profile": False,
           "cluster": "local", "verify_steps": 0, "register_model": False}


@pytest.mark.slow
def test_a_served_deployment_runs_the_benchmark_and_lands_in_mlflow(prefect_server, tmp_path):
    """`layerwise serve` registers the deployment against a real server; a run started through
    the API with a partial config (the fields it changes) executes in the serve process's
    runner (where Prefect rebuilds the flow's parameter model from its entrypoint), completes
    with the embedded benchmark's values for the rest, and writes its MLflow runs."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from mlflow import MlflowClient
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    from layerwise.flows.cli.serve import DEPLOYMENT_NAME

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    environment = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(),
                   "PREFECT_RUNNER_POLL_FREQUENCY": "1", "MLFLOW_TRACKING_URI": uri,
                   "PREFECT_HOME": str(tmp_path / ".prefect"),
                   "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    command = [str(Path(sys.executable).parent / "layerwise"), "serve", "--cron", "0 2 * * *"]
    for override in SERVED:
        command += ["--set", override]
    server = subprocess.Popen(command, cwd=tmp_path, env=environment, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + SERVE_LIMIT_SECONDS
        run = None
        while run is None and time.monotonic() < deadline and server.poll() is None:
            try:
                run = run_deployment(f"benchmark/{DEPLOYMENT_NAME}",
                                     parameters={"config": PARTIAL},
                                     timeout=SERVE_LIMIT_SECONDS)
            except ObjectNotFound:  # not registered yet: serve is still starting
                time.sleep(2)
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        assert run is not None
        assert run.state is not None and run.state.is_completed(), run.state
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("served")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert {run.info.status for run in runs} == {"FINISHED"}
    [parent] = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    defaults = load_config(None)
    assert parent.data.params["steps"] == "3" and parent.data.params["batch"] == "8"
    assert parent.data.params["lr"] == str(defaults.lr)
    assert parent.data.params["batch_per_device"] == "null"


@pytest.mark.slow
def test_a_work_pool_worker_tracks_where_the_operator_says(prefect_server, tmp_path):
    """The operator's path: a project `layerwise init` wrote, its prefect.yaml deployed with
    `prefect deploy` to a work pool, a process worker started with MLFLOW_TRACKING_URI at a
    real `mlflow server` on loopback; a run with a partial config completes on that worker
    and its MLflow runs are in that server, none in the project's SQLite file."""
    import asyncio
    import os
    import signal
    import subprocess
    import sys
    import time

    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.deployments import run_deployment

    from layerwise.flows.cli.serve import DEPLOYMENT_NAME

    project = tmp_path / "project"
    assert CliRunner().invoke(app, ["init", str(project)]).exit_code == 0
    binaries = Path(sys.executable).parent
    port = free_port()
    tracking = f"http://127.0.0.1:{port}"
    mlflow_server = subprocess.Popen(
        [binaries / "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{tmp_path / 'operator.db'}",
         "--default-artifact-root", str(tmp_path / "operator-artifacts"), "--workers", "1"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    environment = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(),
                   "PREFECT_HOME": str(tmp_path / ".prefect"),
                   "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    environment.pop("MLFLOW_TRACKING_URI", None)
    worker = None
    try:
        async def create_pool() -> None:
            async with get_client() as client:
                await client.create_work_pool(WorkPoolCreate(name="layerwise", type="process"))

        asyncio.run(create_pool())
        subprocess.run([binaries / "prefect", "--no-prompt", "deploy", "--name",
                        DEPLOYMENT_NAME], cwd=project, env=environment, check=True,
                       capture_output=True)
        run = run_deployment(f"benchmark/{DEPLOYMENT_NAME}", parameters={"config": PARTIAL},
                             timeout=0)
        worker = subprocess.Popen(
            [binaries / "prefect", "worker", "start", "--pool", "layerwise", "--run-once"],
            env={**environment, "MLFLOW_TRACKING_URI": tracking}, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        worker.wait(SERVE_LIMIT_SECONDS)

        async def final_state():
            async with get_client() as client:
                return (await client.read_flow_run(run.id)).state

        state = asyncio.run(final_state())
        assert state is not None and state.is_completed(), (state, worker.stderr.read())
        deadline = time.monotonic() + 60
        client = MlflowClient(tracking_uri=tracking)
        experiment = None
        while experiment is None and time.monotonic() < deadline:
            try:
                experiment = client.get_experiment_by_name("served")
            except Exception:  # the server still starting: it answered the worker before
                time.sleep(1)
        assert experiment is not None
        runs = client.search_runs([experiment.experiment_id])
        assert runs and {run.info.status for run in runs} == {"FINISHED"}
        assert not (project / "mlflow.db").exists()
    finally:
        for process in (worker, mlflow_server):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(60)
