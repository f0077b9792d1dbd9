"""The compare flow: strategies across model versions, read back from MLflow.

    layerwise compare                                   # the embedded config's experiment
    layerwise compare --experiment nightly --all --json

For every nested run (one per model version and strategy) of the experiment's newest parent
run (or of all of them): predicted vs measured step time, throughput, bytes per step (transfer
and sync, predicted and measured) and validation accuracy against the one-process baseline.
When one model has two versions, it also says what changed between them: the structure hash,
the layers added or removed (by name, from each version's logged per-layer table) and the
metric deltas per strategy. Per model version and cluster of the newest run it names the
champion the registry holds (alias `champion-<label>-<cluster>`, its strategy and recorded
step, and that strategy's step in the newest run) beside the best challenger of the newest
run: the fastest finished strategy other than the champion's. The table is a Prefect artifact
of the compare run; only with
`log` (`--log`) is the comparison also logged on the newest parent run (a table, a figure and
the whole report as JSON, under `compare-TIMESTAMP/` so repeated comparisons never mix): a
query alone writes nothing to MLflow. Runs are read with `mlflow.search_runs` (it pages by
itself), so a tracking server (MLFLOW_TRACKING_URI) works as the embedded SQLite store does.
Runs left RUNNING by a flow that was killed are marked KILLED first (tasks/tracking/track.py), so no
status shown is a dead flow's.
"""

from __future__ import annotations

import datetime
import json
import tempfile
from pathlib import Path

import mlflow
import numpy as np
from matplotlib.figure import Figure
from mlflow import MlflowClient
from mlflow.entities import Run
from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel

from layerwise.strategies.errors import LayerwiseError
from layerwise.tasks.tracking import track
from layerwise.tasks.tracking.model_registry import (
    champion_alias,
    cluster_key,
    current_champion,
    registered_model_name,
)

SCHEMA_VERSION = 1
COMPARED_METRICS = (
    "predicted_step_seconds", "step_seconds", "throughput_samples_per_s",
    "predicted_transfer_bytes_per_step", "transfer_bytes_per_step",
    "predicted_sync_bytes_per_step", "sync_bytes_per_step", "cost_model_error",
    "val_accuracy", "baseline_val_accuracy", "oracle_step_seconds", "verify_max_difference",
    "predicted_peak_memory_bytes", "peak_memory_bytes",
)
DELTA_METRICS = ("step_seconds", "throughput_samples_per_s", "transfer_bytes_per_step",
                 "sync_bytes_per_step", "peak_memory_bytes", "val_accuracy")
PARENT_TAG = "mlflow.parentRunId"
PER_LAYER_TABLE = "per_layer.json"


class ParentRun(BaseModel):
    """One benchmark flow run."""

    run_id: str
    run_name: str
    status: str
    start_time: int


class StrategyRow(BaseModel):
    """One (model version, strategy) run and its compared metrics (None: not logged)."""

    parent_run_id: str
    parent_run_name: str
    run_id: str
    model: str
    model_version: str
    structure_hash: str
    strategy: str
    cluster: str  # the run's `cluster` param: a preset's name or a cluster file
    status: str
    start_time: int
    error: str | None
    metrics: dict[str, float | None]


class VersionChange(BaseModel):
    """What differs between two versions of one model."""

    model: str
    before: str
    after: str
    before_hash: str
    after_hash: str
    structure_changed: bool
    layers_added: list[str]
    layers_removed: list[str]
    deltas: dict[str, dict[str, float]]  # strategy -> metric -> after minus before


class ChampionRow(BaseModel):
    """A model version's champion on one cluster, as the registry holds it (None: no
    champion yet), beside the best challenger of the newest benchmark run (its fastest
    finished strategy other than the champion's)."""

    model: str
    model_version: str
    cluster: str
    alias: str
    champion_version: str | None
    champion_strategy: str | None
    champion_step_seconds: float | None  # recorded by the champion version's run
    champion_latest_seconds: float | None  # its strategy's step in the newest run
    challenger_strategy: str | None
    challenger_step_seconds: float | None


class Comparison(BaseModel):
    """The whole report: what `--json` prints and what is logged as comparison.json."""

    schema_version: int = SCHEMA_VERSION
    experiment: str
    tracking_uri: str
    parent_runs: list[ParentRun]
    rows: list[StrategyRow]
    changes: list[VersionChange]
    champions: list[ChampionRow] = []
    logged_on_run: str | None = None
    artifacts: list[str] = []


@flow(name="compare")
def compare(experiment: str, all_runs: bool = False, log: bool = False) -> Comparison:
    """Compare the strategies of the newest (or every) benchmark run, logging the comparison
    on the newest only with `log`; see the module docstring."""
    uri = track.tracking_uri()
    client = MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(uri)
    found = track.find_experiment(client, experiment)
    if log:  # only a compare asked to write closes a killed flow's runs (KILLED)
        track.close_orphaned_runs(client, found.experiment_id)
    parents = _parent_runs(found.experiment_id, all_runs)
    if not parents:
        raise LayerwiseError(f"experiment '{experiment}' has no benchmark runs yet: "
                             "run `layerwise run` first")
    rows = [row for parent in parents
            for row in strategy_rows(found.experiment_id, parent)]
    comparison = Comparison(
        experiment=experiment, tracking_uri=uri,
        parent_runs=[ParentRun(run_id=run.info.run_id, run_name=run.info.run_name,
                               status=run.info.status, start_time=run.info.start_time)
                     for run in parents],
        rows=rows, changes=_version_changes(client, rows),
        champions=champion_rows(client, [row for row in rows
                                         if row.parent_run_id == parents[0].info.run_id]))
    if log:
        newest = parents[0].info.run_id
        comparison = comparison.model_copy(update={
            "logged_on_run": newest, "artifacts": _log_comparison(client, newest, comparison)})
    _create_prefect_artifacts(comparison)
    return comparison


def _runs(experiment_id: str, filter_string: str, order: str,
          max_results: int | None = None) -> list[Run]:
    """The matching runs by start time (mlflow.search_runs reads every page by itself)."""
    found = mlflow.search_runs([experiment_id], filter_string, output_format="list",
                               order_by=[f"attributes.start_time {order}"],
                               **({} if max_results is None else {"max_results": max_results}))
    assert isinstance(found, list)
    return found


def _parent_runs(experiment_id: str, all_runs: bool) -> list[Run]:
    """The benchmark flow runs (the runs without a parent), newest first."""
    return _runs(experiment_id, f"tags.`{PARENT_TAG}` IS NULL", "DESC",
                 None if all_runs else 1)


def strategy_rows(experiment_id: str, parent: Run) -> list[StrategyRow]:
    """The parent's nested runs in the order they ran (the config's order)."""
    children = _runs(experiment_id, f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'", "ASC")
    return [StrategyRow(
        parent_run_id=parent.info.run_id, parent_run_name=parent.info.run_name,
        run_id=run.info.run_id, model=run.data.params.get("model", "?"),
        model_version=run.data.params.get("model_version", "?"),
        structure_hash=run.data.params.get("structure_hash", ""),
        strategy=run.data.params.get("strategy", "?"),
        cluster=run.data.params.get("cluster", "?"), status=run.info.status,
        start_time=run.info.start_time, error=run.data.tags.get("error"),
        metrics={name: run.data.metrics.get(name) for name in COMPARED_METRICS},
    ) for run in children]


def champion_rows(client: MlflowClient, rows: list[StrategyRow]) -> list[ChampionRow]:
    """Per (model, version, cluster) of one benchmark run's rows: the registry's champion and
    the run's best challenger."""
    groups: dict[tuple[str, str, str], list[StrategyRow]] = {}
    for row in rows:
        groups.setdefault((row.model, row.model_version, row.cluster), []).append(row)
    return [_champion_row(client, model, version, cluster, group)
            for (model, version, cluster), group in groups.items()]


def _champion_row(client: MlflowClient, model: str, version: str, cluster: str,
                  rows: list[StrategyRow]) -> ChampionRow:
    alias = champion_alias(version, cluster)
    champion = current_champion(client, registered_model_name(model), alias)
    steps = {row.strategy: row.metrics.get("step_seconds") for row in rows
             if row.status == "FINISHED" and row.metrics.get("step_seconds") is not None}
    challengers = {strategy: step for strategy, step in steps.items()
                   if champion is None or strategy != champion.strategy}
    challenger = min(challengers, key=lambda strategy: challengers[strategy], default=None)
    return ChampionRow(
        model=model, model_version=version, cluster=cluster_key(cluster), alias=alias,
        champion_version=None if champion is None else champion.version,
        champion_strategy=None if champion is None else champion.strategy,
        champion_step_seconds=None if champion is None else champion.step_seconds,
        champion_latest_seconds=None if champion is None else steps.get(champion.strategy),
        challenger_strategy=challenger,
        challenger_step_seconds=None if challenger is None else challengers[challenger])


def champion_line(row: ChampionRow) -> str:
    """A model version's champion and challenger in words, for the terminal and Prefect."""
    head = f"{row.model} {row.model_version} on {row.cluster} ({row.alias}): "
    if row.champion_strategy is None:
        head += "no champion registered yet"
    else:
        assert row.champion_step_seconds is not None
        latest = ("" if row.champion_latest_seconds is None
                  else f", {_ms(row.champion_latest_seconds)} in the newest run")
        head += (f"champion '{row.champion_strategy}' (registry version "
                 f"{row.champion_version}, {_ms(row.champion_step_seconds)} per step "
                 f"recorded{latest})")
    if row.challenger_strategy is None:
        return head + "; no challenger in the newest run"
    assert row.challenger_step_seconds is not None
    return (head + f"; best challenger of the newest run '{row.challenger_strategy}', "
            f"{_ms(row.challenger_step_seconds)} per step")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _version_changes(client: MlflowClient, rows: list[StrategyRow]) -> list[VersionChange]:
    """Each model's consecutive versions (in the order they first ran), compared pairwise.

    A version seen in several parent runs (`--all`) is represented by its newest runs: the
    rows come newest parent first, so the first row per (model, version, strategy) wins.
    """
    newest: dict[tuple[str, str], dict[str, StrategyRow]] = {}
    for row in rows:
        newest.setdefault((row.model, row.model_version), {}).setdefault(row.strategy, row)
    versions: dict[str, list[str]] = {}
    for row in sorted(rows, key=lambda row: row.start_time):
        listed = versions.setdefault(row.model, [])
        if row.model_version not in listed:
            listed.append(row.model_version)
    return [_version_change(client, model, newest[(model, before)], newest[(model, after)],
                            before, after)
            for model, labels in versions.items()
            for before, after in zip(labels, labels[1:], strict=False)]


def _version_change(client: MlflowClient, model: str, before: dict[str, StrategyRow],
                    after: dict[str, StrategyRow], before_label: str,
                    after_label: str) -> VersionChange:
    before_hash = next(iter(before.values())).structure_hash
    after_hash = next(iter(after.values())).structure_hash
    added, removed = layer_changes(_layer_names(client, before), _layer_names(client, after))
    deltas = {}
    for strategy in (name for name in after if name in before):
        old, new = before[strategy].metrics, after[strategy].metrics
        deltas[strategy] = {metric: new[metric] - old[metric] for metric in DELTA_METRICS
                            if new.get(metric) is not None and old.get(metric) is not None}
    return VersionChange(model=model, before=before_label, after=after_label,
                         before_hash=before_hash, after_hash=after_hash,
                         structure_changed=before_hash != after_hash, layers_added=added,
                         layers_removed=removed, deltas=deltas)


def layer_changes(before: list[str], after: list[str]) -> tuple[list[str], list[str]]:
    """Layer names only in `after` (added) and only in `before` (removed), in layer order."""
    return ([name for name in after if name not in set(before)],
            [name for name in before if name not in set(after)])


def _layer_names(client: MlflowClient, runs: dict[str, StrategyRow]) -> list[str]:
    """The layers of a version, from the per-layer table of any of its finished runs (every
    strategy of a version traces the same graph); none when no run logged one."""
    for row in runs.values():
        if row.status != "FINISHED":
            continue
        with tempfile.TemporaryDirectory() as folder:
            path = client.download_artifacts(row.run_id, PER_LAYER_TABLE, folder)
            table = json.loads(Path(path).read_text(encoding="utf-8"))
        column = table["columns"].index("layer")
        return [str(values[column]) for values in table["data"]]
    return []


def table_rows(comparison: Comparison) -> list[dict[str, object]]:
    """One flat record per (model version, strategy): the MLflow and Prefect table."""
    return [{"parent_run": row.parent_run_name, "model": row.model, "version": row.model_version,
             "strategy": row.strategy, "status": row.status, **row.metrics}
            for row in comparison.rows]


def _log_comparison(client: MlflowClient, run_id: str, comparison: Comparison) -> list[str]:
    """Table, figure and report on the newest parent run, in a folder of their own."""
    folder = f"compare-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    records = table_rows(comparison)
    logged = [f"{folder}/comparison.json", f"{folder}/comparison.png"]
    client.log_dict(run_id, comparison.model_dump(mode="json"), logged[0])
    client.log_figure(run_id, comparison_figure(comparison.rows), logged[1])
    if records:  # a table needs columns
        logged.append(f"{folder}/comparison_table.json")
        client.log_table(run_id, {key: [record[key] for record in records] for key in records[0]},
                         logged[-1])
    return logged


def comparison_figure(rows: list[StrategyRow]) -> Figure:
    """Per run, predicted beside measured: the step time, the transfer bytes and the sync
    bytes per step, each on its own axes (a strategy's sync bytes can dwarf another's
    transfer), the legend beside the axes, never on the bars.

    A bare Figure (no pyplot), as in tasks/tracking/track.py: no global state, no GUI backend.
    """
    measured = [row for row in rows if row.metrics.get("step_seconds") is not None]
    labels = [f"{row.model} {row.model_version}\n{row.strategy}" for row in measured]
    figure = Figure(figsize=(max(7.0, 1.3 * len(labels) + 3.0), 8.0), layout="constrained")
    panels = figure.subplots(3, 1, sharex=True)
    positions, width = np.arange(len(labels)), 0.38
    for axes, (unit, scale, predicted, actual) in zip(panels, (
            ("ms per step", 1e3, "predicted_step_seconds", "step_seconds"),
            ("transfer MB per step", 1e-6, "predicted_transfer_bytes_per_step",
             "transfer_bytes_per_step"),
            ("sync MB per step", 1e-6, "predicted_sync_bytes_per_step", "sync_bytes_per_step"),
    ), strict=True):
        for offset, kind, name, color in ((-width / 2, "predicted", predicted, "#9ecae1"),
                                          (width / 2, "measured", actual, "#3182bd")):
            axes.bar(positions + offset, [scale * (row.metrics.get(name) or 0.0)
                                          for row in measured], width, label=kind, color=color)
        axes.set_ylabel(unit)
    panels[0].set_title("predicted vs measured per training step")
    panels[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    panels[-1].set_xticks(positions, labels, fontsize=8)
    return figure


def _create_prefect_artifacts(comparison: Comparison) -> None:
    """The table (and what changed) on the Prefect flow run, pointing back at MLflow."""
    where = f"MLflow experiment `{comparison.experiment}`"
    if comparison.logged_on_run is not None:
        where += (f", logged on run `{comparison.logged_on_run}`, folder "
                  f"`{comparison.artifacts[0].split('/')[0]}`")
    create_table_artifact(table=table_rows(comparison), key="strategy-comparison",
                          description=f"Predicted vs measured per strategy. {where}")
    if comparison.changes:
        create_markdown_artifact(
            markdown="\n".join(f"- {line}" for change in comparison.changes
                               for line in change_lines(change)),
            key="model-version-changes", description=f"What changed between versions. {where}")
    if comparison.champions:
        create_markdown_artifact(
            markdown="\n".join(f"- {champion_line(row)}" for row in comparison.champions),
            key="champions", description=f"Champion and challenger per model version. {where}")


def change_lines(change: VersionChange) -> list[str]:
    """What changed between two versions, as lines for the terminal and Prefect."""
    head = f"{change.model} {change.before} -> {change.after}: "
    if change.structure_changed:
        head += f"structure changed ({change.before_hash[:12]} -> {change.after_hash[:12]})"
    else:
        head += f"same structure ({change.after_hash[:12]})"
    if change.layers_added:
        head += f"; layers added: {', '.join(change.layers_added)}"
    if change.layers_removed:
        head += f"; layers removed: {', '.join(change.layers_removed)}"
    lines = [head]
    for strategy, delta in change.deltas.items():
        parts = []
        if "step_seconds" in delta:
            parts.append(f"step {delta['step_seconds'] * 1e3:+.2f} ms")
        if "throughput_samples_per_s" in delta:
            parts.append(f"{delta['throughput_samples_per_s']:+,.0f} samples/s")
        for name, label in (("transfer_bytes_per_step", "transfer"),
                            ("sync_bytes_per_step", "sync")):
            if name in delta:
                parts.append(f"{label} {delta[name]:+,.0f} B")
        if "val_accuracy" in delta:
            parts.append(f"val acc {delta['val_accuracy'] * 100:+.2f} pp")
        lines.append(f"  {strategy}: {', '.join(parts) or 'no metrics in both'}")
    return lines
