"""The model registry on a real MLflow store (a temporary SQLite file), nothing mocked: each
strategy run's trained weights logged and registered as the benchmark's track task does it,
linked to their logged model, and the champion alias settled as the benchmark's champion task
does it (tasks/champion.py), by the rule of tasks/tracking/champion.py.

Each test is one (model version label, cluster) of one registered model, as the benchmark keeps
every label and cluster of a model under one name; a registration costs about a second.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_MODEL_VERSIONS

from layerwise.strategies.files.locations import MODEL_FILE, SETTINGS_FILE
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.training_run import TrainSettings
from layerwise.tasks.champion import ChampionKey, record_standing
from layerwise.tasks.tracking import provenance
from layerwise.tasks.tracking.champion import (
    Champion,
    Measured,
    Standing,
    beats,
    regressed,
    settle,
    standing_line,
)
from layerwise.tasks.tracking.model_registry import (
    ModelRecord,
    champion_alias,
    link_logged_model,
    log_trained_model,
)

pytestmark = pytest.mark.slow

NAME, CLUSTER, MARGIN = "tiny_cnn", "data/profiles/cluster-cpu-gloo-x2.yaml", 0.05
SOURCE = "Commit 0123abc, benchmark run benchmark-20260101-000000"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Iterator[tuple[MlflowClient, str, Path]]:
    """A fresh store as the flow opens it (the global tracking URI set: MLflow's SQL registry
    resolves a `models:/` source through it), an experiment, and a trained run's folder."""
    folder = tmp_path_factory.mktemp("registry")
    run_folder = folder / "run"
    run_folder.mkdir()
    settings = TrainSettings(model=NAME, strategy="data", nproc=1, nnodes=1, cluster="local",
                             profile=None, dataset="synthetic", data_root="data", batch=2,
                             image_size=8, classes=10, in_channels=3, lr=0.1, momentum=0.0,
                             weight_decay=0.0, seed=0)
    settings.save(run_folder / SETTINGS_FILE)
    torch.save(build_model(NAME, num_classes=10, image_size=8, in_channels=3).state_dict(),
               run_folder / MODEL_FILE)
    previous = mlflow.get_tracking_uri()
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    try:
        yield client, client.create_experiment("registry"), run_folder
    finally:
        mlflow.set_tracking_uri(previous)


def strategy_run(store: tuple[MlflowClient, str, Path], label: str, strategy: str,
                 step_seconds: float, ineligible: str | None = None) -> Measured:
    """A strategy's run as the benchmark records it: its measured step, its trained weights
    logged and registered; what the champion task is given."""
    client, experiment_id, run_folder = store
    with mlflow.start_run(experiment_id=experiment_id) as run:
        client.log_metric(run.info.run_id, "step_seconds", step_seconds)
        version = log_trained_model(client, run_folder, ModelRecord(
            registered_name=NAME, version_label=label, strategy=strategy, cluster=CLUSTER))
    assert version is not None
    return Measured(strategy=strategy, version=version, step_seconds=step_seconds,
                    speedup=None, ineligible=ineligible)


def settle_run(client: MlflowClient, label: str, measured: list[Measured]) -> Standing:
    return record_standing(client, ChampionKey(registered_name=NAME, model=NAME, label=label,
                                               cluster=CLUSTER), measured, MARGIN, SOURCE)


def champion_of(client: MlflowClient, label: str) -> tuple[str, str]:
    """(version, strategy) the label's champion alias names."""
    version = client.get_model_version_by_alias(NAME, champion_alias(label, CLUSTER))
    return str(version.version), version.tags["strategy"]


def test_the_first_run_crowns_its_fastest_passing_strategy_and_describes_each(store):
    """The fastest run failed its accuracy check: never champion; the fastest that passed is.
    Every version says its strategy, measured step, where it ran, its standing and source."""
    client = store[0]
    data = strategy_run(store, "first", "data", 0.010)
    owt = strategy_run(store, "first", "owt", 0.008)
    failed = strategy_run(store, "first", "layerwise", 0.006,
                          ineligible="accuracy 30 image(s) apart")
    standing = settle_run(client, "first", [data, owt, failed])
    assert champion_of(client, "first") == (owt.version, "owt")
    assert standing.previous is None and standing.moved
    assert standing_line(standing) == (
        "tiny_cnn first on cluster-cpu-gloo-x2, alias champion-first-cluster-cpu-gloo-x2: "
        f"'owt' (registry version {owt.version}, 8.0 ms per step) crowned, the first champion.")
    descriptions = {entry.strategy: client.get_model_version(NAME, entry.version).description
                    for entry in (data, owt, failed)}
    for strategy, step in (("data", "10.0 ms"), ("owt", "8.0 ms"), ("layerwise", "6.0 ms")):
        assert descriptions[strategy].startswith(
            f"Strategy '{strategy}' of tiny_cnn, model version label first, on cluster "
            f"cluster-cpu-gloo-x2: {step} per step measured")
        assert descriptions[strategy].endswith(f"{SOURCE}.")
    assert "Champion (champion-first-cluster-cpu-gloo-x2): 'owt'" in descriptions["owt"]
    assert f"Not champion: 'owt' (registry version {owt.version})" in descriptions["data"]
    assert "Never champion: accuracy 30 image(s) apart." in descriptions["layerwise"]


def test_a_challenger_takes_the_alias_only_when_faster_by_the_margin(store):
    """3% faster than the champion measured in the same run leaves the alias; 10% faster than
    its recorded step (its strategy did not run) moves it, and the standing says against
    which step."""
    client = store[0]
    crowned = strategy_run(store, "margin", "data", 0.010)
    settle_run(client, "margin", [crowned])
    near = [strategy_run(store, "margin", "data", 0.010),
            strategy_run(store, "margin", "owt", 0.0097)]
    stays = settle_run(client, "margin", near)
    assert champion_of(client, "margin") == (crowned.version, "data")
    assert not stays.moved and stays.reference_recorded is False
    assert "3.0% faster than 'data' at 10.0 ms measured in the same run (margin 5%)" \
        in standing_line(stays)
    assert "stays champion" in standing_line(stays)
    faster = strategy_run(store, "margin", "owt", 0.009)
    moved = settle_run(client, "margin", [faster])
    assert champion_of(client, "margin") == (faster.version, "owt")
    assert moved.moved and moved.previous == Champion(version=crowned.version,
                                                      strategy="data", step_seconds=0.010)
    assert ("10.0% faster than the 10.0 ms 'data' recorded as champion, as it did not run in "
            "this run (margin 5%)" in standing_line(moved))
    assert "took it from 'data'" in client.get_model_version(NAME, faster.version).description


def test_the_champions_strategy_slower_than_recorded_by_the_margin_is_a_regression(store):
    client = store[0]
    crowned = strategy_run(store, "slower", "data", 0.010)
    settle_run(client, "slower", [crowned])
    standing = settle_run(client, "slower", [strategy_run(store, "slower", "data", 0.011)])
    assert standing.regression == (
        "champion regression: tiny_cnn slower on cluster-cpu-gloo-x2: 'data' ran 11.0 ms per "
        f"step, 10.0% slower than the 10.0 ms its champion version {crowned.version} recorded "
        "(margin 5%)")
    assert champion_of(client, "slower") == (crowned.version, "data")  # nothing beat it


def test_each_version_is_listed_once_on_its_logged_model(store):
    """What MLflow's UI reads to show a logged model's versions (else "Not registered"):
    the logged model's `mlflow.modelVersions`. Linking again, as after a tracking server's
    own link, adds nothing."""
    client, experiment_id, _ = store
    entry = strategy_run(store, "linked", "data", 0.010)
    run_id = client.get_model_version(NAME, entry.version).run_id
    [logged] = client.search_logged_models([experiment_id],
                                           filter_string=f"source_run_id = '{run_id}'")
    expected = [{"name": NAME, "version": entry.version}]
    assert json.loads(logged.tags[MLFLOW_MODEL_VERSIONS]) == expected
    link_logged_model(client, logged.model_id, NAME, entry.version)
    assert json.loads(client.get_logged_model(logged.model_id).tags[MLFLOW_MODEL_VERSIONS]) \
        == expected


def measured(strategy: str, step_seconds: float, ineligible: str | None = None) -> Measured:
    return Measured(strategy=strategy, version=strategy, step_seconds=step_seconds,
                    ineligible=ineligible)


def test_the_margin_is_a_share_of_the_champions_step_both_ways():
    assert beats(0.095, 0.100, 0.05) and not beats(0.0951, 0.100, 0.05)
    assert regressed(0.1051, 0.100, 0.05) and not regressed(0.105, 0.100, 0.05)
    assert beats(0.0999, 0.100, 0.0)  # no margin: any faster step
    held = Champion(version="1", strategy="data", step_seconds=0.100)
    standing = settle("m", "v1", "local", "champion-v1-local", held,
                      [measured("data", 0.110)], 0.025)
    assert standing.regression is not None and standing.regression.endswith("(margin 2.5%)")


def test_a_regression_holds_even_in_the_faster_quarter_of_the_steps():
    """A run whose median is 20% over the recorded step but whose faster quarter is within
    the margin is noise on a shared machine, not a regression; one whose first quartile is
    over it too is."""
    held = Champion(version="1", strategy="data", step_seconds=0.100)
    noisy = Measured(strategy="data", version="2", step_seconds=0.120,
                     first_quartile_seconds=0.104)
    slower = noisy.model_copy(update={"first_quartile_seconds": 0.110})
    assert settle("m", "v1", "local", "champion-v1-local", held, [noisy],
                  MARGIN).regression is None
    regression = settle("m", "v1", "local", "champion-v1-local", held, [slower],
                        MARGIN).regression
    assert regression is not None and "120.0 ms per step (first quartile 110.0 ms), 20.0% " \
        "slower than the 100.0 ms" in regression


def test_no_eligible_strategy_crowns_nothing_and_an_ineligible_one_never_takes_the_alias():
    none = settle("m", "v1", "local", "champion-v1-local", None,
                  [measured("owt", 0.001, "not exact")], MARGIN)
    assert none.champion is None and not none.moved
    assert standing_line(none).endswith("no eligible strategy ran, so there is no champion yet.")
    held = Champion(version="1", strategy="data", step_seconds=0.010)
    kept = settle("m", "v1", "local", "champion-v1-local", held,
                  [measured("data", 0.010), measured("owt", 0.001, "over memory")], MARGIN)
    assert kept.champion == held and kept.challenger is None and kept.regression is None
    assert standing_line(kept).endswith("stays champion: no eligible challenger ran.")


def test_the_source_names_the_commit_and_whether_the_tree_was_clean():
    tags = {MLFLOW_GIT_COMMIT: "0123abc", provenance.GIT_DIRTY_TAG: "false"}
    assert provenance.source_text(tags, "b-1") == "Commit 0123abc, benchmark run b-1"
    dirty = {**tags, provenance.GIT_DIRTY_TAG: "true"}
    assert provenance.source_text(dirty, "b-1") == (
        "Commit 0123abc with uncommitted changes, benchmark run b-1")
