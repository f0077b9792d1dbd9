"""Validation task: accuracy of a trained model against one-process training.

The runtime is exact (every strategy computes what one device computes), so a strategy's model
must classify the validation split as the one-process run with the same seed, data and global
batch does, within the configured tolerance. The check loads model.pt into the plain module
(no parallelism) in eval mode, so it also proves the saved weights are whole.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from strategies.models import build_model
from strategies.run import TrainSettings
from strategies.runtime.datasets import load_dataset
from strategies.runtime.worker import MODEL_FILE, SETTINGS_FILE

EVAL_BATCH = 256


class AccuracyMismatch(RuntimeError):
    """A strategy's validation accuracy is not the one-process run's."""


def validation_accuracy(run_folder: Path) -> float:
    """Share of the validation split the run's model.pt classifies right."""
    settings = TrainSettings.load(run_folder / SETTINGS_FILE)
    module = build_model(settings.model, num_classes=settings.classes,
                         image_size=settings.image_size, in_channels=settings.in_channels)
    module.load_state_dict(torch.load(run_folder / MODEL_FILE, weights_only=True), strict=True)
    module.eval()
    split = load_dataset(settings.dataset, settings.image_size, settings.classes,
                         settings.in_channels, settings.seed, Path(settings.data_root)).val
    correct = 0
    with torch.no_grad():
        for start in range(0, len(split), EVAL_BATCH):
            x, y = split.take(np.arange(start, min(start + EVAL_BATCH, len(split))))
            predicted = module(torch.from_numpy(x)).argmax(dim=1)
            correct += int((predicted == torch.from_numpy(y)).sum())
    return correct / len(split)


def check_accuracy(strategy: str, accuracy: float, baseline: float, tolerance: float) -> None:
    """AccuracyMismatch naming the strategy and both numbers when they differ too much."""
    if abs(accuracy - baseline) > tolerance:
        raise AccuracyMismatch(
            f"strategy '{strategy}': validation accuracy {accuracy:.4f} differs from the "
            f"one-process run's {baseline:.4f} by {abs(accuracy - baseline):.4f} (tolerance "
            f"{tolerance:g})")


@task(name="validate", cache_policy=NO_CACHE)
def measure_accuracy(run_folder: Path) -> float:
    """The validation accuracy of the model a run saved (strategy or one-process baseline)."""
    return validation_accuracy(run_folder)
