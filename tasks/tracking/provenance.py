"""What a strategy run was made from, recorded so that its prediction can be rebuilt: MLflow's
source tags (git commit and branch, and a flag for uncommitted changes, which MLflow has no tag
of its own for), the data and machine versions, the dataset as an MLflow dataset input (the md5
DVC recorded for it as digest), and the cluster, calibration and profile files that priced it.
"""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

import mlflow
import numpy as np
import yaml
from mlflow import MlflowClient
from mlflow.data.code_dataset_source import CodeDatasetSource
from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.data.meta_dataset import MetaDataset
from mlflow.types import Schema, TensorSpec
from mlflow.utils.mlflow_tags import (
    MLFLOW_GIT_BRANCH,
    MLFLOW_GIT_COMMIT,
    MLFLOW_SOURCE_NAME,
    MLFLOW_SOURCE_TYPE,
)

from layerwise.strategies.files.locations import PREPARED_DIR
from layerwise.strategies.processes.huge_pages import huge_pages_in_use
from layerwise.strategies.runtime.datasets import ImageSpec

DVC_LOCK = Path("dvc.lock")
GIT_DIRTY_TAG = "git_dirty"  # MLflow has no tag of its own for uncommitted changes
SOURCE_NAME = "layerwise run (flows/benchmark.py)"
PRICED_WITH = "priced_with"  # artifact folder of the cluster (calibration) and profile files


def environment_tags(flow_run_id: str | None, device: str, torch_version: str,
                     flow_run_url: str | None = None) -> dict[str, str]:
    """Tags of every run: MLflow's source tags (git commit and branch, and whether the work
    tree had uncommitted changes), data and machine versions, and the Prefect run (its UI page
    when Prefect has a UI: a server, or PREFECT_UI_URL)."""
    tags = {MLFLOW_SOURCE_NAME: SOURCE_NAME, MLFLOW_SOURCE_TYPE: "JOB",
            MLFLOW_GIT_COMMIT: _git("rev-parse", "HEAD") or "unknown",
            GIT_DIRTY_TAG: {None: "unknown", "": "false"}.get(_git_changes(), "true"),
            "torch_version": torch_version, "device_name": device,
            "huge_pages": str(huge_pages_in_use()).lower(),
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


def source_text(tags: dict[str, str], run_name: str) -> str:
    """Where a registered version came from, in words, from `environment_tags`: the commit
    (with uncommitted changes, when the work tree had any) and the benchmark run."""
    dirty = {"true": " with uncommitted changes", "false": ""}.get(
        tags.get(GIT_DIRTY_TAG, "unknown"), " (uncommitted changes unknown)")
    return f"Commit {tags.get(MLFLOW_GIT_COMMIT, 'unknown')}{dirty}, benchmark run {run_name}"


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


def log_sources(client: MlflowClient, run_id: str) -> None:
    """dvc.lock (which data), and the uncommitted changes to tracked files as a patch that
    `git apply` takes when the work tree had any (which code, beyond the commit tag)."""
    if DVC_LOCK.is_file():
        client.log_artifact(run_id, str(DVC_LOCK))
    changes = _git_changes()
    if changes:
        client.log_text(run_id, changes, "git_diff.patch")


def dvc_data_hash() -> str | None:
    """The md5 DVC recorded for the prepared data in dvc.lock (None without a lock file)."""
    return _prepared_output().get("md5")


def dataset_input(dataset: str, image: ImageSpec | None) -> MetaDataset:
    """The run's data as an MLflow dataset: a prepared dataset's folder as source, the md5 DVC
    recorded for it in dvc.lock as digest (MLflow's own digest of the name and source without
    one), its tensors as schema (a label per sample, or per position); generated data
    (synthetic, segments) names the code that draws it."""
    if image is None:
        source = CodeDatasetSource({"generator": "layerwise.strategies.runtime.datasets"})
        return MetaDataset(source, name=dataset)
    folder = PREPARED_DIR / dataset
    locked = _prepared_output()
    digest = locked.get("md5") if locked.get("path") == folder.as_posix() else None
    schema = Schema([TensorSpec(np.dtype(np.float32),
                                (-1, image.channels, *image.sizes), "x"),
                     TensorSpec(np.dtype(np.int64),
                                (-1, *(image.sizes if image.per_position else ())), "y")])
    with warnings.catch_warnings():  # MLflow registers its local source for two URI schemes
        warnings.simplefilter("ignore", UserWarning)  # and warns that both match a path
        source = resolve_dataset_source(str(folder.resolve()))
    return MetaDataset(source, name=dataset,
                       digest=digest.removesuffix(".dir") if digest else None, schema=schema)


def _prepared_output() -> dict[str, str]:
    """The prepare stage's output as dvc.lock records it: its path and md5 (empty without a
    lock file)."""
    if not DVC_LOCK.is_file():
        return {}
    lock = yaml.safe_load(DVC_LOCK.read_text(encoding="utf-8")) or {}
    outs = lock.get("stages", {}).get("prepare", {}).get("outs", [])
    return {key: str(value) for key, value in (outs[0] if outs else {}).items()
            if key in ("path", "md5")}


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
