"""Tracking task: one strategy run's measurements into its MLflow run (tasks/tracking/track.py).

A task of its own, so that the Prefect UI shows the logging as a step of the flow and a failure to
log as a failed task. tasks/tracking/track.py itself imports no Prefect: the CLI reads its defaults
before Prefect may be imported (Prefect reads its settings once, on import).
"""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

from layerwise.strategies.exactness.accuracy import AccuracyCheck
from layerwise.strategies.exactness.reference import Divergence
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.training_run import RunResult
from layerwise.tasks.tracking.model_registry import ModelRecord, log_trained_model
from layerwise.tasks.tracking.track import log_strategy_run


@task(name="track", cache_policy=NO_CACHE)
def record_strategy_run(client: MlflowClient, run_id: str, result: RunResult,
                        graph: LayerGraph, run_folder: Path, accuracy: AccuracyCheck | None,
                        divergence: Divergence | None, oracle_seconds: float | None,
                        model: ModelRecord) -> str | None:
    """Log what the run measured and how its checks went, whether they passed or not, then
    its trained weights as an MLflow model of the run (active in this thread): the number of
    its registry version, None when it is not registered."""
    log_strategy_run(client, run_id, result, graph, run_folder, accuracy, divergence,
                     oracle_seconds)
    return log_trained_model(client, run_folder, model)
