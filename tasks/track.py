"""Tracking: MLflow runs for one benchmark, written by the flow's process only.

One experiment per benchmark name; one parent run per flow run; one nested run per (model
version, strategy) with the params, metrics (names below are a contract: dashboards and checks
read them), the strategy JSON, the RunResult, the per-layer table and a figure of the per-layer
degrees. The store is created and the runs are opened here, before any worker starts: two
processes creating one SQLite store at once corrupt it.

No run stays RUNNING once its flow is gone: an error or an interruption closes it as FAILED or
KILLED (`closed_on_exit`), and since a SIGKILL leaves nothing to do that, every run names the
process that writes it (host, pid and when that process started: a pid alone may have been
reused) and the next flow on that host marks the runs of a dead writer KILLED
(`close_orphaned_runs`).

Default store: `sqlite:////<project>/mlflow.db` with artifacts in `<project>/mlartifacts`;
MLFLOW_TRACKING_URI switches to any other store or a tracking server with no code change.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from matplotlib.figure import Figure
from mlflow import MlflowClient
from mlflow.entities import Experiment, Metric, Param, RunStatus
from mlflow.utils.time import get_current_time_millis

from strategies.accuracy import AccuracyCheck
from strategies.errors import LayerwiseError
from strategies.graph import LayerGraph
from strategies.run import RunResult
from strategies.space import DIMS, ParallelConfig
from strategies.verify import Divergence
from tasks.owner import orphan_reason, owner_gone

TRACKING_VARIABLE = "MLFLOW_TRACKING_URI"
DVC_LOCK = Path("dvc.lock")
METRIC_NAMES = (
    "predicted_step_seconds", "predicted_compute_seconds", "predicted_transfer_seconds",
    "predicted_sync_seconds", "step_seconds", "throughput_samples_per_s",
    "transfer_bytes_per_step", "sync_bytes_per_step", "predicted_transfer_bytes_per_step",
    "predicted_sync_bytes_per_step", "cost_model_error", "train_loss", "val_accuracy",
    "baseline_val_accuracy", "accuracy_gap",
)
_MAX_PARAM_LENGTH = 500
ORPHAN_TAG = "killed_because"


def default_tracking_uri(project: Path) -> str:
    """The embedded store: a SQLite file in the project (absolute paths take four slashes)."""
    return f"sqlite:///{(project / 'mlflow.db').resolve()}"


def artifact_root(tracking_uri: str) -> str | None:
    """Artifacts next to a SQLite store (`mlartifacts/` beside the file), else the server's."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    return (Path(tracking_uri[len(prefix):]).parent / "mlartifacts").as_uri()


def open_experiment(name: str) -> tuple[MlflowClient, str]:
    """The client on MLFLOW_TRACKING_URI and the id of experiment `name`, created if new.

    Creating a SQLite store (its tables) or an experiment is not safe from two processes at
    once: two flow runs starting together would break the schema migration or both create the
    experiment. A lock file beside the database serialises this part; once the tables exist,
    SQLite's own locking keeps concurrent runs' writes apart.
    """
    uri = os.environ[TRACKING_VARIABLE]
    with _store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            return client, experiment.experiment_id
        root = artifact_root(uri)
        location = f"{root}/{_safe_name(name)}" if root else None
        return client, client.create_experiment(name, artifact_location=location)


@contextlib.contextmanager
def _store_lock(tracking_uri: str) -> Iterator[None]:
    """An exclusive lock on `<database>.lock` for a SQLite store; nothing for a server."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        yield
        return
    database = Path(tracking_uri[len(prefix):])
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(database.with_name(database.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def find_experiment(client: MlflowClient, name: str) -> Experiment:
    """Experiment `name` for reading it back, or one line naming the ones that exist."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment
    known = sorted(found.name for found in client.search_experiments())
    raise LayerwiseError(f"no MLflow experiment '{name}' in {client.tracking_uri}; it has: "
                         f"{', '.join(known) or 'none'} (`layerwise run` creates it)")


def _safe_name(name: str) -> str:
    return "".join(char if char.isalnum() or char in "-_." else "_" for char in name)


def environment_tags(flow_run_id: str | None, device: str, torch_version: str,
                     flow_run_url: str | None = None) -> dict[str, str]:
    """Tags of every run: code, data and machine versions, and the Prefect run (its UI page
    when Prefect has a UI: a server, or PREFECT_UI_URL)."""
    tags = {"git_commit": _git_commit(), "torch_version": torch_version, "device_name": device,
            "prefect_flow_run_id": flow_run_id or "none"}
    if flow_run_url is not None:
        tags["prefect_flow_run_url"] = flow_run_url
    data_hash = dvc_data_hash()
    if data_hash is not None:
        tags["dvc_data_hash"] = data_hash
    return tags


def _git_commit() -> str:
    finished = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=False)
    return finished.stdout.strip() if finished.returncode == 0 else "unknown"


def dvc_data_hash() -> str | None:
    """The md5 DVC recorded for the prepared data in dvc.lock (None without a lock file)."""
    if not DVC_LOCK.is_file():
        return None
    lock = yaml.safe_load(DVC_LOCK.read_text(encoding="utf-8")) or {}
    outs = lock.get("stages", {}).get("prepare", {}).get("outs", [])
    return next((str(out["md5"]) for out in outs if "md5" in out), None)


def close_orphaned_runs(client: MlflowClient, experiment_id: str) -> list[str]:
    """Mark KILLED the experiment's runs still RUNNING whose writing process on this host is
    gone (killed with SIGKILL, or the machine went down), with a tag saying so; their ids.

    A run of another host, or one without owner tags (an older layerwise), is left alone:
    whether its writer lives cannot be told from here.
    """
    running, token = [], None
    while True:  # every page first: closing runs while paging would shift the later pages
        page = client.search_runs([experiment_id], "attributes.status = 'RUNNING'",
                                  page_token=token)
        running += page
        token = page.token
        if not token:
            break
    orphans = [run for run in running if owner_gone(run.data.tags)]
    for run in orphans:
        client.set_tag(run.info.run_id, ORPHAN_TAG, orphan_reason(run.data.tags))
        kill_run(client, run.info.run_id)
    return [run.info.run_id for run in orphans]


@contextlib.contextmanager
def closed_on_exit(client: MlflowClient, run_id: str) -> Iterator[None]:
    """Whatever leaves the block, the run does not stay RUNNING: an error fails it (FAILED,
    its line and traceback logged), an interruption (Ctrl-C, SIGTERM) kills it (KILLED).
    A block that ends normally sets the run's status itself."""
    try:
        yield
    except Exception as error:
        fail_run(client, run_id, error)
        raise
    except BaseException:
        kill_run(client, run_id)
        raise


def start_parent_run(client: MlflowClient, experiment_id: str, run_name: str,
                     config: dict[str, Any], tags: dict[str, str]) -> str:
    """The flow run's MLflow run, holding the whole config as params and dvc.lock."""
    run = client.create_run(experiment_id, run_name=run_name, tags=tags)
    with closed_on_exit(client, run.info.run_id):
        _log_params(client, run.info.run_id, config)
        if DVC_LOCK.is_file():
            client.log_artifact(run.info.run_id, str(DVC_LOCK))
    return run.info.run_id


def start_child_run(client: MlflowClient, experiment_id: str, parent_id: str, run_name: str,
                    params: dict[str, Any], tags: dict[str, str]) -> str:
    """A nested run for one (model version, strategy), opened before its training starts."""
    run = client.create_run(experiment_id, run_name=run_name,
                            tags={**tags, "mlflow.parentRunId": parent_id})
    with closed_on_exit(client, run.info.run_id):
        _log_params(client, run.info.run_id, params)
    return run.info.run_id


def _log_params(client: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    client.log_batch(run_id, params=[Param(key, _param_text(value))
                                     for key, value in params.items()])


def _param_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:_MAX_PARAM_LENGTH]


def log_strategy_run(client: MlflowClient, run_id: str, result: RunResult, graph: LayerGraph,
                        run_folder: Path, accuracy: AccuracyCheck | None,
                        divergence: Divergence | None,
                        oracle_seconds: float | None = None) -> None:
    """Metrics, the per-layer table and figure, the strategy JSON and the RunResult, whether
    or not the run's checks passed (a failed check must not hide what was measured)."""
    client.log_batch(run_id, metrics=run_metrics(result, accuracy, divergence, oracle_seconds))
    if accuracy is not None:
        client.set_tag(run_id, "accuracy_check", accuracy.describe()[:_MAX_PARAM_LENGTH])
    client.log_table(run_id, per_layer_table(result, graph), "per_layer.json")
    client.log_figure(run_id, degrees_figure(result), "per_layer_degrees.png")
    for name in ("strategy.json", "result.json", "train.json"):
        client.log_artifact(run_id, str(run_folder / name))


def run_metrics(result: RunResult, accuracy: AccuracyCheck | None,
                divergence: Divergence | None,
                oracle_seconds: float | None = None) -> list[Metric]:
    """The contract's metrics; train_loss once per step, the rest once. With the ParaDL
    oracle's step time, also it and its accuracy (predicted / measured, as Kahira et al.);
    with the float64 verify stage's divergence, its largest relative difference."""
    now = get_current_time_millis()
    predicted = result.strategy.predicted
    low, high = result.step_seconds_quartiles
    values = {
        "predicted_step_seconds": predicted.step_seconds,
        "predicted_compute_seconds": predicted.compute_seconds,
        "predicted_transfer_seconds": predicted.transfer_seconds,
        "predicted_sync_seconds": predicted.sync_seconds,
        "step_seconds": result.step_seconds_median,
        "step_seconds_p25": low,
        "step_seconds_p75": high,
        "throughput_samples_per_s": result.throughput_samples_per_s,
        "transfer_bytes_per_step": result.bytes_per_step.transfer,
        "sync_bytes_per_step": result.bytes_per_step.sync,
        "predicted_transfer_bytes_per_step": result.predicted_bytes_per_step.transfer,
        "predicted_sync_bytes_per_step": result.predicted_bytes_per_step.sync,
        # relative to the measurement, as Jia et al. report theirs ("within 10%")
        "cost_model_error": abs(result.step_seconds_median - predicted.step_seconds)
        / result.step_seconds_median,
    }
    if accuracy is not None:
        values |= {"val_accuracy": accuracy.accuracy,
                   "baseline_val_accuracy": accuracy.reference_accuracy,
                   "accuracy_gap": accuracy.accuracy - accuracy.reference_accuracy,
                   "accuracy_gap_images": accuracy.correct - accuracy.reference_correct,
                   "accuracy_tolerance_images": accuracy.tolerance_images}
    if divergence is not None:
        values["verify_max_difference"] = divergence.largest
    if oracle_seconds is not None:
        values["oracle_step_seconds"] = oracle_seconds
        values["oracle_accuracy"] = oracle_seconds / result.step_seconds_median
    metrics = [Metric(key, float(value), now, 0) for key, value in values.items()]
    metrics += [Metric("train_loss", record.loss, now, record.step) for record in result.steps]
    return metrics


def per_layer_table(result: RunResult, graph: LayerGraph) -> dict[str, list[Any]]:
    """One row per layer: its type, output, config, degrees and the bytes it sent per step."""
    rows: dict[str, list[Any]] = {column: [] for column in (
        "layer", "type", "output", "config", *DIMS, "devices", "transfer_bytes", "sync_bytes")}
    for choice in result.strategy.layers:
        layer = graph.by_name[choice.name]
        config = ParallelConfig.parse(choice.config)
        sent = result.bytes_per_step_by_layer.get(choice.name, {})
        for column, value in (
            ("layer", layer.name), ("type", layer.label),
            ("output", "x".join(map(str, layer.output_shape))), ("config", choice.config),
            *zip(DIMS, config.degrees, strict=True), ("devices", config.size),
            ("transfer_bytes", sent.get("transfer", 0)), ("sync_bytes", sent.get("sync", 0)),
        ):
            rows[column].append(value)
    return rows


def degrees_figure(result: RunResult) -> Figure:
    """Stacked bars of each layer's n/c/h/w degrees: where the strategy splits what.

    A bare Figure (no pyplot): no global figure state, no GUI backend on a headless machine.
    """
    names = [choice.name for choice in result.strategy.layers]
    configs = [ParallelConfig.parse(choice.config) for choice in result.strategy.layers]
    figure = Figure(figsize=(max(6.0, 0.45 * len(names)), 3.6))
    axes = figure.subplots()
    bottom = [0] * len(names)
    for index, dim in enumerate(DIMS):
        heights = [config.degrees[index] for config in configs]
        axes.bar(names, heights, bottom=bottom, label=dim)
        bottom = [low + high for low, high in zip(bottom, heights, strict=True)]
    axes.set_ylabel("degree")
    axes.set_title(f"{result.model}: per-layer degrees under '{result.strategy.name}'")
    axes.tick_params(axis="x", labelrotation=60, labelsize=7)
    axes.legend(ncols=4, fontsize=8)
    figure.tight_layout()
    return figure


def finish_run(client: MlflowClient, run_id: str) -> None:
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))


def kill_run(client: MlflowClient, run_id: str) -> None:
    """Mark a run KILLED: the flow was interrupted (Ctrl-C, SIGTERM) while it was open, or
    its process was killed outright."""
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.KILLED))


def fail_run(client: MlflowClient, run_id: str, error: BaseException) -> None:
    """Mark the run FAILED with the error's line (and its traceback as an artifact)."""
    client.set_tag(run_id, "error", f"{type(error).__name__}: {error}"[:_MAX_PARAM_LENGTH])
    client.log_text(run_id, "".join(traceback.format_exception(error)), "error.txt")
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
