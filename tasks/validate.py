"""Validation tasks: a trained model's correct validation images, and the check of an fp32 run's
accuracy against one-process training.

The check loads model.pt into the plain module (no parallelism) in eval mode, so it also proves the
saved weights are whole. Float32 runs are judged statistically (strategies/exactness/accuracy.py):
exactness itself is proven in float64 by the verify stage.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, Failed, State

from layerwise.strategies.exactness.accuracy import AccuracyCheck, check_accuracy
from layerwise.strategies.files.locations import MODEL_FILE, SETTINGS_FILE
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.runtime.datasets import load_dataset
from layerwise.strategies.training_run import TrainSettings

EVAL_BATCH = 256


def validation_counts(run_folder: Path) -> tuple[int, int, int]:
    """(correct, predictions, predictions per sample) of the run's model.pt on the validation
    split: a prediction per image, or per position of a network that scores every position."""
    settings = TrainSettings.load(run_folder / SETTINGS_FILE)
    module = build_model(settings.model, num_classes=settings.classes,
                         image_size=settings.image_size, in_channels=settings.in_channels)
    module.load_state_dict(torch.load(run_folder / MODEL_FILE, weights_only=True), strict=True)
    module.eval()
    split = load_dataset(settings.dataset, settings.image_size, settings.classes,
                         settings.in_channels, settings.seed, Path(settings.data_root)).val
    correct = predictions = 0
    with torch.no_grad():
        for start in range(0, len(split), EVAL_BATCH):
            x, y = split.take(np.arange(start, min(start + EVAL_BATCH, len(split))))
            predicted = module(torch.from_numpy(x)).argmax(dim=1)
            correct += int((predicted == torch.from_numpy(y)).sum())
            predictions += y.size
    return correct, predictions, predictions // max(1, len(split))


def validation_accuracy(run_folder: Path) -> float:
    """Share of the validation split's predictions the run's model.pt gets right."""
    correct, predictions, _ = validation_counts(run_folder)
    return correct / predictions


@task(name="validate", cache_policy=NO_CACHE)
def measure_accuracy(run_folder: Path) -> tuple[int, int, int]:
    """(correct, predictions, per sample) of the model a run saved (strategy or one-process
    reference)."""
    return validation_counts(run_folder)


@task(name="check accuracy", cache_policy=NO_CACHE)
def judge_accuracy(correct: int, reference_correct: int, images: int,
                   tolerance: float | None, per_sample: int = 1) -> State:
    """A completed state holding the AccuracyCheck, or a failed one that says why: an
    expected outcome of a benchmark, reported as the task's state rather than a traceback."""
    check = check_accuracy(correct, reference_correct, images, tolerance, per_sample)
    if check.passed:
        return Completed(data=check, message=check.describe())
    _quiet_empty_tracebacks(logging.getLogger("prefect.task_runs"))
    return Failed(data=check, message=f"accuracy {check.describe()}")


class _NoEmptyTraceback(logging.Filter):
    """Prefect logs a task that returns a Failed state with `exc_info=True`; outside an
    `except` block that is (None, None, None), printed as a stray "NoneType: None" line under
    the message. A record without an exception keeps its message and loses that line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is not None and record.exc_info[0] is None:
            record.exc_info = None
        return True


def _quiet_empty_tracebacks(logger: logging.Logger) -> None:
    if not any(isinstance(existing, _NoEmptyTraceback) for existing in logger.filters):
        logger.addFilter(_NoEmptyTraceback())


def accuracy_of(state: State) -> AccuracyCheck:
    """The AccuracyCheck a `judge_accuracy` state holds, passed or not."""
    return state.result(raise_on_failure=False)
