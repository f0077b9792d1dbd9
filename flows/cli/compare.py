"""`layerwise compare`: strategies across model versions, from what `layerwise run` tracked.

    layerwise compare
    layerwise compare --experiment nightly --all
    layerwise compare --json > comparison.json
    MLFLOW_TRACKING_URI=http://mlflow:5000 layerwise compare --experiment nightly

The same embedded defaults as `layerwise run` (flows/cli/run.py). The experiment and its store are
checked before Prefect starts, so a wrong name costs a second and prints one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from flows.cli.console import console, print_json, user_errors
from flows.cli.run import start_local_api, use_embedded_environment
from strategies.errors import LayerwiseError

if TYPE_CHECKING:
    from flows.compare import Comparison


def register(app: typer.Typer) -> None:
    """Add `compare` to the CLI."""
    app.command("compare")(compare)


@user_errors
def compare(
    experiment: Annotated[str | None, typer.Option(
        help="MLflow experiment (default: the embedded config's name, as `layerwise run`).")
    ] = None,
    all_runs: Annotated[bool, typer.Option(
        "--all", help="Every benchmark run of the experiment, not only the newest.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")
                       ] = False,
) -> None:
    """Compare predicted vs measured time, bytes and accuracy per model version and strategy."""
    from flows.benchmark_config import load_config

    name = experiment or load_config(None).name
    use_embedded_environment()
    _check_experiment(name)
    start_local_api()
    from flows.compare import compare as compare_flow
    from flows.flow_runs import owned_flow_runs

    with owned_flow_runs():
        comparison = compare_flow(name, all_runs)
    if as_json:
        print_json(comparison.model_dump(mode="json"))
        return
    _print(comparison)


def _check_experiment(name: str) -> None:
    """One line, before Prefect starts, when there is no store, no such experiment or no run
    in it (inside the flow the same errors would come with Prefect's traceback)."""
    from tasks.track import TRACKING_VARIABLE, find_experiment

    uri = os.environ[TRACKING_VARIABLE]
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise LayerwiseError(f"no MLflow store at {uri}: run `layerwise run` first, or set "
                             f"{TRACKING_VARIABLE} to your tracking server")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = find_experiment(client, name)
    if not client.search_runs([experiment.experiment_id], max_results=1):
        raise LayerwiseError(f"experiment '{name}' has no benchmark runs yet: "
                             "run `layerwise run` first")


def _print(comparison: Comparison) -> None:
    from flows.compare import change_lines

    several = len(comparison.parent_runs) > 1
    table = Table(title=f"{comparison.experiment}: predicted vs measured per training step",
                  title_justify="left")
    columns = (["run"] if several else []) + [
        "model", "strategy", "pred. ms", "ParaDL ms", "meas. ms", "samples/s",
        "transfer B pred.",
        "transfer B meas.", "sync B pred.", "sync B meas.", "val acc", "1-proc acc", "status"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("run", "model", "strategy")
                         else "right")
    for row in comparison.rows:
        metric = row.metrics
        cells = [f"{row.model} {row.model_version}", row.strategy]
        if metric["step_seconds"] is None:  # nothing was measured: the run failed before
            cells += ["-"] * 9 + [_percent(metric["baseline_val_accuracy"])]
        else:
            cells += [_number(metric["predicted_step_seconds"], 1e3, ".2f"),
                      _number(metric["oracle_step_seconds"], 1e3, ".2f"),
                      _number(metric["step_seconds"], 1e3, ".2f"),
                      _number(metric["throughput_samples_per_s"], 1, ",.0f"),
                      *(_number(metric[name], 1, ",.0f") for name in (
                          "predicted_transfer_bytes_per_step", "transfer_bytes_per_step",
                          "predicted_sync_bytes_per_step", "sync_bytes_per_step")),
                      _percent(metric["val_accuracy"]),
                      _percent(metric["baseline_val_accuracy"])]
        cells.append(row.status.lower() if row.error is None
                     else f"{row.status.lower()}: {row.error}")
        table.add_row(*([row.parent_run_name] if several else []), *cells)
    console.print(table)
    for change in comparison.changes:
        console.print("what changed: " + "\n".join(change_lines(change)), highlight=False,
                      soft_wrap=True)
    console.print(f"logged on MLflow run {comparison.logged_on_run}: "
                  f"{', '.join(comparison.artifacts)}", highlight=False, soft_wrap=True)


def _number(value: float | None, scale: float, spec: str) -> str:
    return "-" if value is None else format(value * scale, spec)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"
