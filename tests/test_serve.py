"""`layerwise serve` without a scheduler to talk to, and prefect.yaml's deployment.

No Prefect server can be started here, so these check the paths a user hits first: a bad cron
string, no PREFECT_API_URL, and a PREFECT_API_URL where nothing answers; each is one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prefect.settings import PREFECT_API_URL, temporary_settings
from typer.testing import CliRunner

from flows.benchmark_config import load_config
from flows.cli import app
from flows.cli.serve import check_cron

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


@pytest.mark.parametrize("cron", ["0 2 * *", "every night", "61 2 * * *"])
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
