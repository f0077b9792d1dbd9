"""Champion task: after a model version's strategies ran, the registry's verdict for its
(model, label, cluster) (tasks/tracking/champion.py's rule): every version this run registered
described, and the champion alias moved when a strategy earned it.

A task of its own, so that the Prefect UI shows the verdict as a step of the flow.
"""

from __future__ import annotations

from mlflow import MlflowClient
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict

from layerwise.tasks.tracking.champion import (
    Measured,
    Standing,
    settle,
    standing_line,
    version_description,
)
from layerwise.tasks.tracking.model_registry import champion_alias, cluster_key, current_champion


class ChampionKey(BaseModel):
    """Which champion: the registered model, the model it registers, the config's version
    label and the cluster the steps were measured on (a preset's name or a cluster file)."""

    model_config = ConfigDict(frozen=True)

    registered_name: str
    model: str
    label: str
    cluster: str


@task(name="champion", cache_policy=NO_CACHE)
def settle_champion(client: MlflowClient, key: ChampionKey, measured: list[Measured],
                    margin: float, source: str) -> Standing:
    """`record_standing`, its verdict in the task's log (a regression as an error)."""
    standing = record_standing(client, key, measured, margin, source)
    logger = get_run_logger()
    logger.info("%s", standing_line(standing))
    if standing.regression is not None:
        logger.error("%s", standing.regression)
    return standing


def record_standing(client: MlflowClient, key: ChampionKey, measured: list[Measured],
                    margin: float, source: str) -> Standing:
    """Read the current champion, settle this run's `measured` versions against it, describe
    each of them (with `source`: the commit and benchmark run) and move the alias when it
    moves."""
    alias = champion_alias(key.label, key.cluster)
    previous = current_champion(client, key.registered_name, alias)
    standing = settle(key.model, key.label, cluster_key(key.cluster), alias, previous, measured,
                      margin)
    for entry in measured:
        client.update_model_version(key.registered_name, entry.version,
                                    description=version_description(entry, standing, source))
    if standing.moved:
        assert standing.champion is not None
        client.set_registered_model_alias(key.registered_name, alias, standing.champion.version)
    return standing
