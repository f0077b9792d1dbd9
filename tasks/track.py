"""Tracking: MLflow runs for one benchmark, written by the flow's process only.

One experiment per benchmark name, tagged as MLflow's custom model development kind so the UI
opens on its runs; one parent run per flow run; one nested run per (model version, strategy)
(`mlflow.start_run(parent_run_id=...)`, with MLflow's system metrics) holding what rebuilds its
prediction: MLflow's source tags (git commit, a flag for a dirty work tree), the dataset as an
MLflow dataset input (its DVC hash as digest), the calibration and profile it was priced with,
the params, metrics (names below are a contract: dashboards and checks read them), train_loss
per step as training runs (rank 0's progress lines, read by the train task in this process),
the strategy JSON, the RunResult, the per-layer table, a heat map of the per-layer degrees, and
the trained weights as an MLflow model (registered under the model's name on request). The
store is created and the runs are opened here, before any worker starts: two processes creating
one SQLite store at once corrupt it; only this process writes to it.

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
import subprocess
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
import yaml
from mlflow import MlflowClient
from mlflow.data.code_dataset_source import CodeDatasetSource
from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import Experiment, Metric, Param, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.models import infer_signature
from mlflow.models.model import ModelInfo
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.types import Schema, TensorSpec
from mlflow.utils.mlflow_tags import (
    MLFLOW_GIT_BRANCH,
    MLFLOW_GIT_COMMIT,
    MLFLOW_SOURCE_NAME,
    MLFLOW_SOURCE_TYPE,
)
from mlflow.utils.time import get_current_time_millis

from strategies.accuracy import AccuracyCheck
from strategies.errors import LayerwiseError
from strategies.graph import LayerGraph
from strategies.jobs.launch import StepProgress
from strategies.models import build_model, input_shape
from strategies.run import RunResult, TrainSettings
from strategies.runtime.datasets import DEFAULT_ROOT, ImageSpec
from strategies.runtime.worker import MODEL_FILE, SETTINGS_FILE
from strategies.space import DIMS, ParallelConfig
from strategies.verify import Divergence
from tasks.figures import degrees_figure
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
# the tag MLflow's UI reads to open an experiment on its runs (not on the GenAI overview)
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
GIT_DIRTY_TAG = "git_dirty"  # MLflow has no tag of its own for uncommitted changes
SOURCE_NAME = "layerwise run (flows/benchmark.py)"
SYSTEM_METRICS_SECONDS = 2  # a sample of CPU, memory, disk and network every 2 s
LIVE_FLUSH_SECONDS = 1.0  # per-step points are written at most this often, in one batch
MODEL_ARTIFACT = "model"
PRICED_WITH = "priced_with"  # artifact folder of the cluster (calibration) and profile files


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
        if experiment is None:
            root = artifact_root(uri)
            location = f"{root}/{_safe_name(name)}" if root else None
            experiment_id = client.create_experiment(name, artifact_location=location)
        else:
            experiment_id = experiment.experiment_id
        if experiment is None or EXPERIMENT_KIND_TAG not in experiment.tags:
            client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return client, experiment_id


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
    """Tags of every run: MLflow's source tags (git commit and branch, and whether the work
    tree had uncommitted changes), data and machine versions, and the Prefect run (its UI page
    when Prefect has a UI: a server, or PREFECT_UI_URL)."""
    tags = {MLFLOW_SOURCE_NAME: SOURCE_NAME, MLFLOW_SOURCE_TYPE: "JOB",
            MLFLOW_GIT_COMMIT: _git("rev-parse", "HEAD") or "unknown",
            GIT_DIRTY_TAG: {None: "unknown", "": "false"}.get(_git_changes(), "true"),
            "torch_version": torch_version, "device_name": device,
            "prefect_flow_run_id": flow_run_id or "none"}
    branch = _git("rev-parse", "--abbrev-ref", "HEAD")
    if branch:
        tags[MLFLOW_GIT_BRANCH] = branch
    if flow_run_url is not None:
        tags["prefect_flow_run_url"] = flow_run_url
    data_hash = dvc_data_hash()
    if data_hash is not None:
        tags["dvc_data_hash"] = data_hash
    return tags


def _git(*arguments: str) -> str | None:
    """git's output in the current directory, stripped; None outside a git work tree."""
    output = _git_output(*arguments)
    return None if output is None else output.strip()


def _git_changes() -> str | None:
    """The uncommitted changes to tracked files as a patch that `git apply` takes ('' when
    clean, None without git)."""
    return _git_output("diff", "HEAD")


def _git_output(*arguments: str) -> str | None:
    finished = subprocess.run(["git", *arguments], capture_output=True, text=True, check=False)
    return finished.stdout if finished.returncode == 0 else None


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
            if DVC_LOCK.is_file():
                client.log_artifact(run_id, str(DVC_LOCK))
            changes = _git_changes()
            if changes:
                client.log_text(run_id, changes, "git_diff.patch")
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
    """The contract's metrics but train_loss (logged per step as it comes: LiveSteps), each
    once. With the ParaDL
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
    return [Metric(key, float(value), now, 0) for key, value in values.items()]


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


def dataset_input(dataset: str, image: ImageSpec | None) -> MetaDataset:
    """The run's data as an MLflow dataset: a prepared dataset's folder as source, the md5 DVC
    recorded for it in dvc.lock as digest (MLflow's own digest of the name and source without
    one), its tensors as schema; synthetic data names the code that draws it."""
    if image is None:
        return MetaDataset(CodeDatasetSource({"generator": "strategies.runtime.datasets"}),
                           name=dataset)
    folder = DEFAULT_ROOT / dataset
    digest = dvc_data_hash() if _locked_output() == folder.as_posix() else None
    schema = Schema([TensorSpec(np.dtype(np.float32),
                                (-1, image.channels, image.image_size, image.image_size), "x"),
                     TensorSpec(np.dtype(np.int64), (-1,), "y")])
    with warnings.catch_warnings():  # MLflow registers its local source for two URI schemes
        warnings.simplefilter("ignore", UserWarning)  # and warns that both match a path
        source = resolve_dataset_source(str(folder.resolve()))
    return MetaDataset(source, name=dataset,
                       digest=digest.removesuffix(".dir") if digest else None, schema=schema)


def _locked_output() -> str | None:
    """The path of the prepare stage's output in dvc.lock (None without one)."""
    if not DVC_LOCK.is_file():
        return None
    lock = yaml.safe_load(DVC_LOCK.read_text(encoding="utf-8")) or {}
    outs = lock.get("stages", {}).get("prepare", {}).get("outs", [])
    return next((str(out["path"]) for out in outs if "path" in out), None)


def log_run_inputs(client: MlflowClient, run_id: str, dataset: str, image: ImageSpec | None,
                   cluster: str, profile: Path | None) -> None:
    """What the active strategy run trains on and was priced with, logged before it trains."""
    log_dataset(dataset, image)
    log_priced_with(client, run_id, cluster, profile)


def log_dataset(dataset: str, image: ImageSpec | None) -> None:
    """The dataset as an input of the active run (the runs list's Datasets column)."""
    mlflow.log_input(dataset_input(dataset, image), context="training")


def log_priced_with(client: MlflowClient, run_id: str, cluster: str,
                    profile: Path | None) -> None:
    """The files the run's prediction was priced with, as artifacts: the cluster file (for a
    calibrated cluster also its calibration's measurements) and the profile of t_c."""
    files = [] if profile is None else [profile]
    cluster_file = Path(cluster)
    if cluster_file.is_file():  # else a preset: its name (the `cluster` param) says it all
        files.append(cluster_file)
        measured = cluster_file.with_name(f"{cluster_file.stem}.calibration.json")
        if measured.is_file():
            files.append(measured)
    for path in files:
        client.log_artifact(run_id, str(path), PRICED_WITH)


def log_trained_model(run_folder: Path, registered_name: str | None,
                      version_label: str, strategy: str) -> ModelInfo:
    """The run's trained weights (model.pt in the plain module) as an MLflow model of the
    active run, with its signature and an input example, in torch.export's format (loading it
    needs torch only, not this project's code). With `registered_name`, also a new version of
    that registered model, tagged with the config's version label and strategy and aliased
    `<label>-<strategy>` (MLflow reserves aliases of the form v<N>).

    The pip requirements are given: inferring them from the environment takes seconds.
    """
    settings = TrainSettings.load(run_folder / SETTINGS_FILE)
    module = build_model(settings.model, num_classes=settings.classes,
                         image_size=settings.image_size, in_channels=settings.in_channels)
    module.load_state_dict(torch.load(run_folder / MODEL_FILE, weights_only=True), strict=True)
    module.eval()
    example = np.zeros(input_shape(settings.model, 2, settings.image_size,
                                   settings.in_channels), np.float32)
    with torch.no_grad():
        output = module(torch.from_numpy(example)).numpy()
    info = mlflow.pytorch.log_model(
        module, name=MODEL_ARTIFACT, signature=infer_signature(example, output),
        input_example=example, pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"])
    if registered_name is not None:
        _register(info, registered_name, version_label, strategy)
    return info


def _register(info: ModelInfo, name: str, version_label: str, strategy: str) -> None:
    """A new version of registered model `name` (created when new) from the logged model,
    through the client: MLflow's fluent registration prints to stderr on every call."""
    client = MlflowClient()
    try:
        client.create_registered_model(name)
    except MlflowException as error:  # another run (or flow) registered it first
        if error.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise
    version = client.create_model_version(
        name, info.model_uri, run_id=info.run_id, model_id=info.model_id,
        tags={"model_version": version_label, "strategy": strategy})
    client.set_registered_model_alias(name, model_alias(version_label, strategy),
                                      version.version)


def model_alias(version_label: str, strategy: str) -> str:
    """The registry alias of a (version label, strategy) model: letters, digits, _ and -."""
    return "".join(char if char.isalnum() or char in "-_" else "_"
                   for char in f"{version_label}-{strategy}")


def registered_model_name(model: str) -> str:
    """The registry name of a zoo model or a `package.module:factory` reference."""
    return _safe_name(model)


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
