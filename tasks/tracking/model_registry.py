"""A strategy run's trained weights as an MLflow model, and as a version of the model's
registered name when the benchmark config asks (`register_model`), so that strategies can be
compared across model versions with MLflow's own registry."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.models import infer_signature
from mlflow.models.model import ModelInfo
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

from layerwise.strategies.files.locations import MODEL_FILE, SETTINGS_FILE
from layerwise.strategies.model.zoo import build_model, input_shape
from layerwise.strategies.training_run import TrainSettings
from layerwise.tasks.tracking.track import safe_name

MODEL_ARTIFACT = "model"


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
    return safe_name(model)
