"""`layerwise init` (flows/cli/init.py, flows/project_files.py): a project folder where an
installed layerwise runs its benchmark, written from the checkout's own files; and an installed
package, in a fresh virtual environment, that inits an empty folder and runs the benchmark
there."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from prefect.utilities.importtools import import_object
from typer.testing import CliRunner

from layerwise.flows.benchmark_config import PROJECT_CONFIG, load_config
from layerwise.flows.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
WRITTEN = ("params.yaml", "dvc.yaml", "prefect.yaml", ".gitignore", "configs/benchmark.yaml",
           "configs/segments3d.yaml", "configs/signals.yaml", "configs/volumes.yaml",
           "configs/volumes3d.yaml")


def _yaml(path: Path) -> object:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_init_writes_the_checkouts_project_adapted_to_an_installed_package(tmp_path):
    project = tmp_path / "benchmarks"
    result = runner.invoke(app, ["init", str(project)])
    assert result.exit_code == 0, result.output
    assert sorted(str(path.relative_to(project)) for path in project.rglob("*")
                  if path.is_file()) == sorted(WRITTEN)
    for name in ("params.yaml", ".gitignore", *(n for n in WRITTEN if n.startswith("configs"))):
        assert (project / name).read_text() == (ROOT / name).read_text(), name
    # the data stages as the checkout's, without its source files as dependencies
    stages, ours = _yaml(project / "dvc.yaml")["stages"], _yaml(ROOT / "dvc.yaml")["stages"]
    assert list(stages) == list(ours)
    for name, stage in stages.items():
        assert "deps" not in stage
        assert stage == {key: value for key, value in ours[name].items() if key != "deps"}
    # the deployment runs the installed flow, with the same parameters
    [deployment] = _yaml(project / "prefect.yaml")["deployments"]
    [checkout] = _yaml(ROOT / "prefect.yaml")["deployments"]
    assert deployment["entrypoint"] == "layerwise.flows.benchmark:benchmark"
    assert import_object(deployment["entrypoint"]).name == "benchmark"
    assert deployment["parameters"] == checkout["parameters"]
    assert f"cd {project} && layerwise run" in result.output


def test_init_keeps_what_is_there_unless_forced(tmp_path):
    (tmp_path / "params.yaml").write_text("prepare: {dataset: cifar10}\n")
    result = runner.invoke(app, ["init", str(tmp_path)])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "params.yaml already there; nothing written" in lines[0]
    assert [path.name for path in tmp_path.iterdir()] == ["params.yaml"]
    assert (tmp_path / "params.yaml").read_text() == "prepare: {dataset: cifar10}\n"
    assert runner.invoke(app, ["init", str(tmp_path), "--force"]).exit_code == 0
    assert (tmp_path / "params.yaml").read_text() == (ROOT / "params.yaml").read_text()
    afile = tmp_path / "afile"
    afile.write_text("")
    result = runner.invoke(app, ["init", str(afile)])
    assert result.exit_code == 2 and "is a file, not a folder" in result.stderr


def test_a_folder_without_a_benchmark_file_runs_the_embedded_one(tmp_path, monkeypatch):
    from_file = load_config(None)  # the suite runs in the checkout: its configs/benchmark.yaml
    assert PROJECT_CONFIG.is_file()
    monkeypatch.chdir(tmp_path)
    assert load_config(None) == from_file
    assert load_config(None, ["steps=7"]).steps == 7
    assert load_config(None, ["models.0.name=lenet5"]).models[0].name == "lenet5"
    assert load_config(None, ["batch=8"]).batch_per_device is None


@pytest.mark.slow
def test_installed_layerwise_inits_an_empty_folder_and_runs_the_benchmark(tmp_path):
    """`pip install` of the checkout into a fresh virtual environment (its dependencies those
    this suite runs on: no download), then `layerwise init` and `layerwise run` in an empty
    folder, nothing of the checkout on the path: the run completes and is tracked there."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # a user's shell: none of the suite's own settings of Prefect, MLflow or the path
    environment = {key: value for key, value in os.environ.items()
                   if key != "PYTHONPATH" and not key.startswith(("MLFLOW_", "PREFECT_"))}
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", str(ROOT)], check=True, env=environment,
                   cwd=tmp_path)
    project = tmp_path / "empty"
    project.mkdir()
    layerwise = venv / "bin" / "layerwise"
    subprocess.run([layerwise, "init"], check=True, cwd=project, env=environment)
    finished = subprocess.run(
        [layerwise, "run", "--set", "steps=4", "--set", "warmup_steps=1", "--set",
         "strategies=[data]", "--set", "profile=false", "--set", "verify_steps=0",
         "--set", "cluster=local", "--set", "dataset=synthetic"],
        cwd=project, env=environment, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert "'data' ran fastest" in finished.stdout
    located = subprocess.run([venv / "bin" / "python", "-c",
                              "import layerwise; print(layerwise.__file__)"],
                             cwd=project, env=environment, capture_output=True, text=True)
    assert located.stdout.startswith(str(site))  # the installed package, not the checkout
    assert (project / "mlflow.db").is_file() and (project / "runs").is_dir()
