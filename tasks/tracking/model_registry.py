"""A strategy run's trained weights as an MLflow model, and as a version of the model's
registered name when the benchmark config asks (`register_model`), so that strategies can be
compared across model versions with MLflow's own registry: each version is linked to the
logged model it was made from, tagged with its label, strategy and cluster, and the registry
names each (label, cluster)'s champion (tasks/tracking/champion.py decides which)."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.models import infer_signature
from mlflow.models.model import ModelInfo
from mlflow.protos.databricks_pb2 import (
    RESOURCE_ALREADY_EXISTS,
    RESOURCE_DOES_NOT_EXIST,
    ErrorCode,
)
from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS
from pydantic import BaseModel, ConfigDict

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.locations import MODEL_FILE, SETTINGS_FILE
from layerwise.strategies.model.zoo import build_model, input_shape
from layerwise.strategies.training_run import TrainSettings
from layerwise.tasks.tracking.champion import Champion
from layerwise.tasks.tracking.track import safe_name

MODEL_ARTIFACT = "model"
# the tags of a registered version; its measured step is its run's `step_seconds` metric
LABEL_TAG, STRATEGY_TAG, CLUSTER_TAG = "model_version", "strategy", "cluster"
STEP_METRIC = "step_seconds"
MAX_ALIAS_LENGTH = 255  # MLflow's


class ModelRecord(BaseModel):
    """How a run's trained weights are logged: registered under `registered_name` (None: only
    logged), as the config's `version_label` of the model, trained under `strategy` and
    measured on `cluster` (a preset's name or a cluster file: `cluster_key` names it)."""

    model_config = ConfigDict(frozen=True)

    registered_name: str | None
    version_label: str
    strategy: str
    cluster: str


def log_trained_model(client: MlflowClient, run_folder: Path, record: ModelRecord) -> str | None:
    """The run's trained weights (model.pt in the plain module) as an MLflow model of the
    active run, with its signature and an input example, in torch.export's format (loading it
    needs torch only, not this project's code). With a registered name, also a new version of
    that registered model (`register`): its number, else None.

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
    if record.registered_name is None:
        return None
    return register(client, info, record)


def register(client: MlflowClient, info: ModelInfo, record: ModelRecord) -> str:
    """A new version of the record's registered model (created when new) from the logged
    model, tagged with its label, strategy and cluster, aliased `<label>-<strategy>` (MLflow
    reserves aliases of the form v<N>) and linked to the logged model; its number.

    Through the client: MLflow's fluent `register_model` prints to stderr on every call, and
    it appends the link without looking, so that on a tracking server, whose create handler
    links the version itself, the logged model would list it twice (`link_logged_model`)."""
    assert record.registered_name is not None
    name = record.registered_name
    try:
        client.create_registered_model(name)
    except MlflowException as error:  # another run (or flow) registered it first
        if error.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise
    version = client.create_model_version(
        name, info.model_uri, run_id=info.run_id, model_id=info.model_id,
        tags={LABEL_TAG: record.version_label, STRATEGY_TAG: record.strategy,
              CLUSTER_TAG: cluster_key(record.cluster)})
    link_logged_model(client, info.model_id, name, version.version)
    client.set_registered_model_alias(name, model_alias(record.version_label, record.strategy),
                                      version.version)
    return str(version.version)


def link_logged_model(client: MlflowClient, model_id: str, name: str, version: str) -> None:
    """List the registered version on its logged model, as MLflow's own registration does:
    the logged model's tag `mlflow.modelVersions` (a JSON list of {name, version}) is what
    MLflow's UI reads to show a logged model's versions, "Not registered" without it. A store
    written directly (SQLite) does not write it when a version is created, a tracking server
    does: the entry is added only when missing (as the server's own
    AbstractStore.set_model_versions_tags), so each version is listed once either way."""
    entry = {"name": name, "version": str(version)}
    listed = json.loads(client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS, "[]"))
    if entry not in listed:
        client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps([*listed,
                                                                                  entry])})


def current_champion(client: MlflowClient, name: str, alias: str) -> Champion | None:
    """The version registered model `name` names `alias`, with its strategy and its run's
    measured step; None when the model or the alias does not exist yet."""
    try:
        aliases = client.get_registered_model(name).aliases
    except MlflowException as error:
        if error.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
            return None
        raise
    if alias not in aliases:
        return None
    version = client.get_model_version(name, aliases[alias])
    step = client.get_run(version.run_id).data.metrics.get(STEP_METRIC)
    if step is None or STRATEGY_TAG not in version.tags:
        raise LayerwiseError(f"registered model {name} version {version.version} holds alias "
                             f"{alias} but its run has no {STEP_METRIC} or it has no "
                             f"'{STRATEGY_TAG}' tag: move the alias to a benchmark's version")
    return Champion(version=str(version.version), strategy=version.tags[STRATEGY_TAG],
                    step_seconds=step)


def model_alias(version_label: str, strategy: str) -> str:
    """The registry alias of a (version label, strategy) model: letters, digits, _ and -."""
    return _alias_name(f"{version_label}-{strategy}")


def champion_alias(version_label: str, cluster: str) -> str:
    """The registry alias of a (version label, cluster)'s champion: `champion-<label>-<cluster
    key>`, MLflow's `champion` convention for a registered model holding every label and
    cluster of a model (tasks/tracking/champion.py)."""
    alias = _alias_name(f"champion-{version_label}-{cluster_key(cluster)}")
    if len(alias) > MAX_ALIAS_LENGTH:
        raise LayerwiseError(f"cluster {cluster}: its name makes the champion alias longer "
                             f"than MLflow's {MAX_ALIAS_LENGTH} characters; rename the file")
    return alias


def cluster_key(cluster: str) -> str:
    """A cluster as the registry names it: a cluster file's stem (a calibrated cluster's
    names the device, backend, processes and torch it was measured with), else the preset."""
    path = Path(cluster)
    return path.stem if path.suffix in (".yaml", ".yml") else cluster


def _alias_name(text: str) -> str:
    return "".join(char if char.isalnum() or char in "-_" else "_" for char in text)


def registered_model_name(model: str) -> str:
    """The registry name of a zoo model or a `package.module:factory` reference."""
    return safe_name(model)
