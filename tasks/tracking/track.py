"""Tracking: MLflow runs for one benchmark, written by the flow's process only.

One experiment per benchmark name, tagged as MLflow's custom model development kind so the UI opens
on its runs; one parent run per flow run; one nested run per (model version, strategy)
(`mlflow.start_run(parent_run_id=...)`, with MLflow's system metrics) holding the params, metrics
(their names are a contract that dashboards read; tests/test_benchmark_flow.py checks them),
train_loss and the step time per step as training runs (rank 0's progress lines, read by the train
task in this process), the strategy JSON, the RunResult, the per-layer table and a heat map of the
per-layer degrees. What the run was made from is recorded by layerwise.tasks.tracking.provenance,
its trained model by layerwise.tasks.tracking.model_registry. The store is created and the runs are
opened here, before any worker starts: two processes creating one SQLite store at once corrupt it;
only this process writes to it.

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
import logging
import os
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Experiment, Metric, Param, RunStatus
from mlflow.utils.time import get_current_time_millis

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.exactness.accuracy import AccuracyCheck
from layerwise.strategies.exactness.reference import Divergence
from layerwise.strategies.jobs.launch import StepProgress
from layerwise.strategies.jobs.planning import predicted_peaks
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.model.space import DIMS, ParallelConfig
from layerwise.strategies.training_run import RunResult
from layerwise.tasks.tracking.figures import degrees_figure
from layerwise.tasks.tracking.owner import orphan_reason, owner_gone
from layerwise.tasks.tracking.provenance import log_sources
from layerwise.tasks.tracking.store_uri import (
    TRACKING_VARIABLE,
    default_tracking_uri,
    sqlite_path,
)

_MAX_PARAM_LENGTH = 500
ORPHAN_TAG = "killed_because"
# the tag MLflow's UI reads to open an experiment on its runs (not on the GenAI overview)
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
SYSTEM_METRICS_SECONDS = 2  # a sample of CPU, memory, disk and network every 2 s
LIVE_FLUSH_SECONDS = 1.0  # per-step points are written at most this often, in one batch


def tracking_uri() -> str:
    """Where runs are tracked: MLFLOW_TRACKING_URI as the operator's environment sets it (a
    tracking server, a worker's own store), else the embedded store in the working directory
    (a deployment's run in its checkout)."""
    return os.environ.get(TRACKING_VARIABLE) or default_tracking_uri(Path.cwd())


def artifact_root(tracking_uri: str) -> str | None:
    """Artifacts next to a SQLite store (`mlartifacts/` beside the file), else the server's."""
    database = sqlite_path(tracking_uri)
    return None if database is None else (database.parent / "mlartifacts").as_uri()


def open_experiment(name: str) -> tuple[MlflowClient, str]:
    """The client on the tracking URI (`tracking_uri`) and the id of experiment `name`,
    created if new.

    Creating a SQLite store (its tables) or an experiment is not safe from two processes at
    once: two flow runs starting together would break the schema migration or both create the
    experiment. A lock file beside the database serialises this part; once the tables exist,
    SQLite's own locking keeps concurrent runs' writes apart.
    """
    uri = tracking_uri()
    with _store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            root = artifact_root(uri)
            location = f"{root}/{safe_name(name)}" if root else None
            experiment_id = client.create_experiment(name, artifact_location=location)
        else:
            experiment_id = experiment.experiment_id
        if experiment is None or EXPERIMENT_KIND_TAG not in experiment.tags:
            client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return client, experiment_id


@contextlib.contextmanager
def _store_lock(tracking_uri: str) -> Iterator[None]:
    """An exclusive lock on `<database>.lock` for a SQLite store; nothing for a server."""
    database = sqlite_path(tracking_uri)
    if database is None:
        yield
        return
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


def safe_name(name: str) -> str:
    return "".join(char if char.isalnum() or char in "-_." else "_" for char in name)


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


@contextlib.contextmanager
def benchmark_run(client: MlflowClient, experiment_id: str, run_name: str,
                  config: dict[str, Any], tags: dict[str, str]) -> Iterator[str]:
    """The flow run's MLflow run, active in this thread while the flow runs (its strategy
    runs nest under it), holding the whole config as params, dvc.lock, and the uncommitted
    changes as a patch when the work tree had any.

    The block sets the run's status (finish_run, fail_run); whatever escapes it fails or kills
    the run (closed_on_exit); MLflow's run stack is left as it was found in every case.
    """
    mlflow.set_tracking_uri(client.tracking_uri)  # MLflow's fluent API: the client's store
    run_id = mlflow.start_run(experiment_id=experiment_id, run_name=run_name,
                              tags=tags).info.run_id
    try:
        with closed_on_exit(client, run_id):
            _log_params(client, run_id, config)
            log_sources(client, run_id)
            yield run_id
    finally:
        _end_active_run(client, run_id)


def _end_active_run(client: MlflowClient, run_id: str) -> None:
    """Pop the active run off MLflow's stack, keeping the status the flow gave it (KILLED if
    it gave none)."""
    status = client.get_run(run_id).info.status
    mlflow.end_run(status if status != "RUNNING" else RunStatus.to_string(RunStatus.KILLED))


@contextlib.contextmanager
def strategy_run(client: MlflowClient, experiment_id: str, parent_id: str, run_name: str,
                 params: dict[str, Any], tags: dict[str, str]) -> Iterator[str]:
    """A run for one (model version, strategy) nested under the active benchmark run, active
    in this thread while its training runs, with MLflow's system metrics sampled meanwhile.

    The block sets the run's status (finish_run, fail_run); whatever escapes it fails or kills
    the run (closed_on_exit); MLflow's run stack is left as it was found in every case.
    """
    # its monitor says at INFO that it starts, stops and skips the GPU, per run
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    mlflow.set_system_metrics_sampling_interval(SYSTEM_METRICS_SECONDS)
    run_id = mlflow.start_run(experiment_id=experiment_id, run_name=run_name, nested=True,
                              parent_run_id=parent_id, tags=tags,
                              log_system_metrics=True).info.run_id
    try:
        with closed_on_exit(client, run_id):
            _log_params(client, run_id, params)
            yield run_id
    finally:
        _end_active_run(client, run_id)


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
    predicted = predicted_peaks(graph, result.strategy,
                                momentum=result.settings.momentum != 0) or []
    client.log_batch(run_id, metrics=run_metrics(result, accuracy, divergence, oracle_seconds,
                                                 predicted))
    if accuracy is not None:
        client.set_tag(run_id, "accuracy_check", accuracy.describe()[:_MAX_PARAM_LENGTH])
    client.log_table(run_id, per_layer_table(result, graph), "per_layer.json")
    client.log_figure(run_id, degrees_figure(result), "per_layer_degrees.png")
    for name in ("strategy.json", "result.json", "train.json"):
        client.log_artifact(run_id, str(run_folder / name))


def run_metrics(result: RunResult, accuracy: AccuracyCheck | None,
                divergence: Divergence | None, oracle_seconds: float | None = None,
                predicted_peak_bytes: Sequence[int] = ()) -> list[Metric]:
    """The contract's metrics but train_loss (logged per step as it comes: LiveSteps), each
    once; the measured peak memory and the memory model's (`predicted_peak_bytes`, where it covers
    the strategy's engine) as their largest over the ranks and per rank (the rank as the
    metric's step). With the ParaDL
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
    if result.wait_seconds_per_step is not None:  # beside predicted t_x and t_s (loss in t_s)
        waited = result.wait_seconds_per_step
        values["measured_transfer_seconds"] = waited.transfer
        values["measured_sync_seconds"] = waited.sync + waited.loss
    if result.peak_memory_bytes_per_rank:
        values["peak_memory_bytes"] = max(result.peak_memory_bytes_per_rank)
    if predicted_peak_bytes:
        values["predicted_peak_memory_bytes"] = max(predicted_peak_bytes)
    per_rank = [Metric(name, float(peak), now, rank)
                for name, peaks in (("peak_memory_bytes_per_rank",
                                     result.peak_memory_bytes_per_rank),
                                    ("predicted_peak_memory_bytes_per_rank",
                                     predicted_peak_bytes))
                for rank, peak in enumerate(peaks)]
    return [Metric(key, float(value), now, 0) for key, value in values.items()] + per_rank


class LiveSteps:
    """train_loss and train_step_seconds per step into a run while training goes on: rank 0's
    progress lines reach the flow's process (the train task reads them), which writes them
    here in batches of at most LIVE_FLUSH_SECONDS, each point with the time it arrived.
    (step_seconds, the contract's metric, is the run's median, logged once at its end.)"""

    def __init__(self, client: MlflowClient, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.pending: list[Metric] = []
        self.flushed_at = get_current_time_millis()

    def __call__(self, progress: StepProgress) -> None:
        now = get_current_time_millis()
        self.pending += [Metric("train_loss", progress.loss, now, progress.step),
                         Metric("train_step_seconds", progress.seconds, now, progress.step)]
        if now - self.flushed_at >= LIVE_FLUSH_SECONDS * 1e3:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.client.log_batch(self.run_id, metrics=self.pending)
        self.pending, self.flushed_at = [], get_current_time_millis()


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
