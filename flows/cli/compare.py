"""`layerwise compare`: strategies across model versions, from what `layerwise run` tracked.

    layerwise compare
    layerwise compare --experiment nightly --all
    layerwise compare --json > comparison.json
    layerwise compare --log          # also log table, figure and report on the newest run
    MLFLOW_TRACKING_URI=http://mlflow:5000 layerwise compare --experiment nightly

The same embedded defaults as `layerwise run` (flows/cli/run.py). The experiment and its store are
checked before Prefect starts, so a wrong name costs a second and prints one line.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.table import Table

from layerwise.flows.cli.console import console, print_json, user_errors
from layerwise.flows.cli.run import start_local_api, use_embedded_environment
from layerwise.strategies.errors import FailedError, LayerwiseError
from layerwise.strategies.text import printable

if TYPE_CHECKING:
    from layerwise.flows.compare import Comparison, StrategyRow


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
    log: Annotated[bool, typer.Option(
        "--log", help="Also log the comparison (table, figure, JSON) on the newest benchmark "
                      "run in MLflow; without it nothing is written there.")] = False,
) -> None:
    """Compare predicted vs measured time, bytes and accuracy per model version and strategy."""
    from layerwise.flows.benchmark_config import load_config

    name = experiment or load_config(None).name
    use_embedded_environment()
    _check_experiment(name)
    start_local_api()
    from layerwise.flows.compare import compare as compare_flow
    from layerwise.flows.flow_runs import owned_flow_runs

    with owned_flow_runs():
        comparison = compare_flow(name, all_runs, log)
    if as_json:
        print_json(comparison.model_dump(mode="json"))
        return
    _print(comparison)


def _check_experiment(name: str) -> None:
    """One line, before Prefect starts, when there is no store, no such experiment or no run
    in it (inside the flow the same errors would come with Prefect's traceback)."""
    from layerwise.tasks.tracking.store_uri import TRACKING_VARIABLE, sqlite_path
    from layerwise.tasks.tracking.track import find_experiment

    uri = os.environ[TRACKING_VARIABLE]
    store = sqlite_path(uri)
    # an empty file too: opening it would write MLflow's tables into it, and compare writes
    # nothing unless asked (--log)
    if store is not None and (not store.is_file() or store.stat().st_size == 0):
        raise LayerwiseError(f"no MLflow store at {uri}: run `layerwise run` first, or set "
                             f"{TRACKING_VARIABLE} to your tracking server")
    from mlflow import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        experiment = find_experiment(client, name)
        runs = client.search_runs([experiment.experiment_id], max_results=1)
    except LayerwiseError:
        raise
    except Exception as error:  # the store's own failure (a damaged file, a server's error)
        first = (str(error).strip().splitlines() or [""])[0]
        raise FailedError(f"cannot read the MLflow store {uri} ({TRACKING_VARIABLE}): "
                          f"{type(error).__name__}: {printable(first)}") from None
    if not runs:
        raise LayerwiseError(f"experiment '{name}' has no benchmark runs yet: "
                             "run `layerwise run` first")


def _print(comparison: Comparison) -> None:
    """One table per benchmark run (its name and status in the title), every value whole."""
    from layerwise.flows.compare import champion_line, change_lines

    for parent in comparison.parent_runs:
        rows = [_cells(row) for row in comparison.rows if row.parent_run_id == parent.run_id]
        title = (f"{comparison.experiment}, run {parent.run_name} ({parent.status.lower()}): "
                 "predicted vs measured per training step")
        console.print(_table(title, rows) if rows else f"{title}: no strategy runs",
                      highlight=False)
    for change in comparison.changes:
        console.print("what changed: " + "\n".join(change_lines(change)), highlight=False,
                      soft_wrap=True)
    for row in comparison.champions:
        console.print(f"champion: {champion_line(row)}", highlight=False, soft_wrap=True)
    if comparison.logged_on_run is not None:
        console.print(f"logged on MLflow run {comparison.logged_on_run}: "
                      f"{', '.join(comparison.artifacts)}", highlight=False, soft_wrap=True)


COLUMNS = ("model", "strategy", "pred. ms", "ParaDL ms", "meas. ms", "samples/s",
           "transfer B pred.", "transfer B meas.", "sync B pred.", "sync B meas.",
           "peak MB pred.", "peak MB meas.", "val acc", "1-proc acc", "status")
NUMERIC = frozenset({"pred. ms", "ParaDL ms", "meas. ms", "samples/s", "transfer B pred.",
                     "transfer B meas.", "sync B pred.", "sync B meas.", "peak MB pred.",
                     "peak MB meas.", "val acc", "1-proc acc"})


def _table(title: str, rows: list[list[str]]) -> Table:
    """Every value whole, however narrow the terminal: headers wrap at their spaces and the
    status (with a failed run's error) folds instead; no vertical rules, to leave room."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    for index, column in enumerate(COLUMNS):
        status = column == "status"
        widest = max([len(word) for word in column.split()]
                     + [len(cells[index]) for cells in rows])
        table.add_column(column, justify="right" if column in NUMERIC else "left",
                         overflow="fold", min_width=len("finished") if status else None,
                         width=None if status else widest)
    for cells in rows:
        table.add_row(*cells)
    return table


def _cells(row: StrategyRow) -> list[str]:
    """A run's cells after the parent run's name: model, strategy, numbers, status."""
    metric = row.metrics
    cells = [f"{row.model} {row.model_version}", row.strategy]
    if metric["step_seconds"] is None:  # nothing was measured: the run failed before
        cells += ["-"] * 11 + [_percent(metric["baseline_val_accuracy"])]
    else:
        cells += [_number(metric["predicted_step_seconds"], 1e3, ".2f"),
                  _number(metric["oracle_step_seconds"], 1e3, ".2f"),
                  _number(metric["step_seconds"], 1e3, ".2f"),
                  _number(metric["throughput_samples_per_s"], 1, ",.0f"),
                  *(_number(metric[name], 1, ",.0f") for name in (
                      "predicted_transfer_bytes_per_step", "transfer_bytes_per_step",
                      "predicted_sync_bytes_per_step", "sync_bytes_per_step")),
                  _number(metric["predicted_peak_memory_bytes"], 1e-6, ",.1f"),
                  _number(metric["peak_memory_bytes"], 1e-6, ",.1f"),
                  _percent(metric["val_accuracy"]),
                  _percent(metric["baseline_val_accuracy"])]
    return [*cells, row.status.lower() if row.error is None
            else f"{row.status.lower()}: {row.error}"]


def _number(value: float | None, scale: float, spec: str) -> str:
    return "-" if value is None else format(value * scale, spec)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"
