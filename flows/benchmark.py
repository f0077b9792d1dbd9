"""The benchmark flow: data -> calibrate -> profile -> search -> train -> validate -> track.

    layerwise run                           # configs/benchmark.yaml, see flows/cli/run.py
    layerwise run --set strategies=[data,owt] --set steps=80

With `cluster: calibrated` it first measures this machine's links between the `nproc` ranks
(tasks/calibrate.py, once per project). For each model version: build its layer graph at the
global batch, profile t_c on this machine (or take the roofline), search the layer-wise
strategy and cost the baselines, train the one-process reference (strategy data on 1 process,
the same global batch and seed), then train each strategy on `nproc` torchrun processes, check
its validation accuracy against the reference, and record it in a nested MLflow run. A failing
strategy fails its own MLflow run and the others still run; the flow then fails naming it. The
flow prints how long each stage took, its own overhead (everything but torchrun, profiling and
calibration) and a comparison table.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from rich.table import Table

from flows.benchmark_config import CALIBRATED, BenchmarkConfig, ModelVersion
from flows.cli.console import console
from strategies.errors import LayerwiseError
from strategies.graph import LayerGraph, build_graph
from strategies.jobs.job import RUNS_DIR
from strategies.jobs.options import TrainOptions
from strategies.profile import device_name, resolve_device
from strategies.run import RunResult
from strategies.runtime.datasets import ImageSpec
from strategies.schedules import is_exact
from tasks import track
from tasks.calibrate import calibrate_links
from tasks.prepare import prepare_data
from tasks.profile import profile_model
from tasks.search import oracle_step_seconds, search_strategies
from tasks.train import train_strategy
from tasks.validate import check_accuracy, measure_accuracy

REFERENCE_STRATEGY = "data"  # on one process every strategy is this one
MEASURED_STAGES = ("train", "profile", "calibrate")  # the work itself; the rest is overhead


class BenchmarkFailed(RuntimeError):
    """Some strategies failed; their MLflow runs say why, the others finished."""


@dataclass(frozen=True)
class Outcome:
    """What one (model version, strategy) run gave, or why it failed."""

    model: ModelVersion
    strategy: str
    result: RunResult | None = None
    accuracy: float | None = None
    baseline: float | None = None
    error: str | None = None


@dataclass
class StageClock:
    """Wall seconds spent per stage, summed over models and strategies."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started


@dataclass(frozen=True)
class Context:
    """What every model's benchmark shares: the config, the tracking handles, the folder."""

    config: BenchmarkConfig
    client: Any  # MlflowClient
    experiment_id: str
    parent_id: str
    tags: dict[str, str]
    folder: Path
    image: ImageSpec | None
    clock: StageClock
    cluster: str  # what the predictions use: config.cluster, or the calibrated cluster's file


@flow(name="benchmark")
def benchmark(config: BenchmarkConfig) -> list[Outcome]:
    """Benchmark every model version under every strategy; see the module docstring."""
    started = time.perf_counter()
    clock = StageClock()
    with clock.stage("track"):
        client, experiment_id = track.open_experiment(config.name)
    with clock.stage("data"):
        image = prepare_data(config.dataset)
    _check_image(config, image)
    cluster = config.cluster
    if cluster == CALIBRATED:
        with clock.stage("calibrate"):
            cluster = str(calibrate_links(config.nproc))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    with clock.stage("track"):
        tags = track.environment_tags(flow_run.get_id(), device_name(resolve_device(None)),
                                      torch.__version__, _prefect_ui_url())
        parent_id = track.start_parent_run(client, experiment_id, f"benchmark-{stamp}",
                                           config.model_dump(mode="json"), tags)
    context = Context(config=config, client=client, experiment_id=experiment_id,
                      parent_id=parent_id, tags=tags, folder=RUNS_DIR / f"benchmark-{stamp}",
                      image=image, clock=clock, cluster=cluster)
    try:
        outcomes = [outcome for model in config.models
                    for outcome in _benchmark_model(context, model)]
    except (KeyboardInterrupt, SystemExit):  # stopped: say so in MLflow, then stop
        track.kill_run(client, parent_id)
        raise
    failed = [outcome for outcome in outcomes if outcome.error is not None]
    with clock.stage("track"):
        _finish_parent(context, failed, time.perf_counter() - started)
    _print_report(context, outcomes, time.perf_counter() - started)
    if failed:
        raise BenchmarkFailed("; ".join(f"{o.model.name} {o.model.version} {o.strategy}: "
                                        f"{o.error}" for o in failed))
    return outcomes


def _prefect_ui_url() -> str | None:
    """This flow run's page in the Prefect UI; None on the ephemeral API, which has none."""
    from prefect.settings import PREFECT_UI_URL

    return flow_run.get_flow_run_ui_url() if PREFECT_UI_URL.value() else None


def _check_image(config: BenchmarkConfig, image: ImageSpec | None) -> None:
    """A prepared dataset fixes the input size and classes: the config must agree."""
    if image is None:
        return
    for name, fixed in (("image_size", image.image_size), ("classes", image.classes)):
        if getattr(config, name) != fixed:
            raise LayerwiseError(
                f"config {name}: {getattr(config, name)}, but {config.dataset} is prepared with "
                f"{fixed}; set {name}: {fixed}, or change params.yaml's prepare section")


def _benchmark_model(context: Context, model: ModelVersion) -> list[Outcome]:
    """Profile, search, the one-process reference, then every strategy of one model version."""
    config, clock = context.config, context.clock
    folder = context.folder / f"{model.name}-{model.version}".replace(":", "_")
    graph = build_graph(model.name, batch=config.batch_per_device * config.nproc,
                        image_size=config.image_size, num_classes=config.classes,
                        in_channels=context.image.channels if context.image else None)
    profile = None
    if config.profile:
        with clock.stage("profile"):
            profile = profile_model(graph, config.nproc, config.strategies)
    with clock.stage("search"):
        files = search_strategies(graph, context.cluster, config.nproc, profile,
                                  config.strategies, folder / "strategies")
        oracle = oracle_step_seconds(graph, context.cluster, config.nproc, profile,
                                     config.strategies)
    baseline, baseline_error = _reference_accuracy(context, model, folder / "one-process")
    return [_benchmark_strategy(context, model, graph, name, files[name], profile, folder,
                                baseline, baseline_error, oracle.get(name))
            for name in config.strategies]


def _reference_accuracy(context: Context, model: ModelVersion,
                        out: Path) -> tuple[float | None, str | None]:
    """Validation accuracy of one-process training with the same global batch and seed."""
    config = context.config
    options = _train_options(context, nproc=1,
                             batch_per_device=config.batch_per_device * config.nproc,
                             profile=None)
    try:
        with context.clock.stage("train"):
            train_strategy(model.name, REFERENCE_STRATEGY, options, config.steps, out,
                           config.train_deadline_s)
        with context.clock.stage("validate"):
            return measure_accuracy(out), None
    except Exception as error:  # every strategy's run reports it; the flow goes on
        return None, f"the one-process reference failed: {error}"


def _benchmark_strategy(context: Context, model: ModelVersion, graph: LayerGraph,
                        strategy: str, strategy_file: Path, profile: Path | None, folder: Path,
                        baseline: float | None, baseline_error: str | None,
                        oracle_seconds: float | None) -> Outcome:
    """Train, validate and track one strategy; its failure is recorded, not raised."""
    config, clock = context.config, context.clock
    with clock.stage("track"):
        run_id = track.start_child_run(
            context.client, context.experiment_id, context.parent_id,
            f"{model.name}-{model.version}-{strategy}",
            _run_params(context, model, graph, strategy), context.tags)
    out = folder / strategy
    try:
        if baseline is None:
            raise RuntimeError(baseline_error)
        options = _train_options(context, nproc=config.nproc,
                                 batch_per_device=config.batch_per_device, profile=profile)
        with clock.stage("train"):
            result = train_strategy(model.name, str(strategy_file), options, config.steps, out,
                                    config.train_deadline_s)
        with clock.stage("validate"):
            accuracy = measure_accuracy(out)
        with clock.stage("track"):
            track.log_strategy_run(context.client, run_id, result, graph, out, accuracy,
                                   baseline, oracle_seconds)
        exact = is_exact(result.strategy, graph)
        check_accuracy(strategy, accuracy, baseline,
                       config.tolerance if exact else config.inexact_tolerance)
    except Exception as error:  # recorded in its MLflow run; the other strategies go on
        with clock.stage("track"):
            track.fail_run(context.client, run_id, error)
        return Outcome(model=model, strategy=strategy, baseline=baseline, error=str(error))
    except (KeyboardInterrupt, SystemExit):
        track.kill_run(context.client, run_id)
        raise
    with clock.stage("track"):
        track.finish_run(context.client, run_id)
    return Outcome(model=model, strategy=strategy, result=result, accuracy=accuracy,
                   baseline=baseline)


def _train_options(context: Context, *, nproc: int, batch_per_device: int,
                   profile: Path | None) -> TrainOptions:
    """The training run's options for this benchmark."""
    config = context.config
    return TrainOptions(
        nproc=nproc, cluster=context.cluster, dataset=config.dataset,
        batch_per_device=batch_per_device, image_size=config.image_size,
        classes=config.classes, lr=config.lr, momentum=config.momentum,
        weight_decay=config.weight_decay, seed=config.seed,
        profile=str(profile) if profile is not None else None,
        in_channels=context.image.channels if context.image is not None else None)


def _run_params(context: Context, model: ModelVersion, graph: LayerGraph,
                strategy: str) -> dict[str, Any]:
    config = context.config
    return {
        "model": model.name, "model_version": model.version,
        "structure_hash": graph.structure_hash, "devices": config.nproc,
        "cluster": context.cluster, "strategy": strategy,
        "batch_per_device": config.batch_per_device,
        "global_batch": config.batch_per_device * config.nproc, "seed": config.seed,
        "dataset": config.dataset, "image_size": config.image_size, "steps": config.steps,
        "lr": config.lr, "cost_source": "profile" if config.profile else "analytic",
    }


def _finish_parent(context: Context, failed: list[Outcome], elapsed: float) -> None:
    """Stage times on the parent run, a Prefect artifact pointing at it, and its status."""
    seconds = _stage_seconds(context.clock, elapsed)
    for name, value in seconds.items():
        context.client.log_metric(context.parent_id, f"{name.replace(' ', '_')}_seconds", value)
    create_markdown_artifact(
        key="mlflow-run",
        markdown=f"MLflow experiment `{context.config.name}`, parent run "
                 f"`{context.parent_id}` on `{os.environ.get(track.TRACKING_VARIABLE)}`",
        description="Where this benchmark's results are tracked")
    if failed:
        track.fail_run(context.client, context.parent_id,
                       BenchmarkFailed(", ".join(o.strategy for o in failed)))
    else:
        track.finish_run(context.client, context.parent_id)


def _stage_seconds(clock: StageClock, elapsed: float) -> dict[str, float]:
    """Each stage's seconds, then the flow's overhead: all but torchrun and profiling."""
    seconds = dict(clock.seconds)
    seconds["flow overhead"] = elapsed - sum(seconds.get(name, 0.0) for name in MEASURED_STAGES)
    return seconds


def _print_report(context: Context, outcomes: list[Outcome], elapsed: float) -> None:
    stages = _stage_seconds(context.clock, elapsed)
    console.print("stages: " + ", ".join(f"{name} {value:.1f} s" for name, value in
                                         stages.items()) + f"; flow total {elapsed:.1f} s",
                  highlight=False, soft_wrap=True)
    console.print(_comparison_table(outcomes))
    for outcome in outcomes:
        if outcome.error is not None:
            console.print(f"[bold red]failed:[/] {outcome.model.name} {outcome.model.version} "
                          f"{outcome.strategy}: {outcome.error}", highlight=False,
                          soft_wrap=True)
    console.print(f"MLflow: {ui_command(os.environ[track.TRACKING_VARIABLE])}",
                  highlight=False, soft_wrap=True)


def _comparison_table(outcomes: list[Outcome]) -> Table:
    table = Table(title="benchmark: predicted vs measured per training step",
                  title_justify="left")
    for column in ("model", "strategy", "pred. ms", "meas. ms", "samples/s", "pred. bytes",
                   "meas. bytes", "val acc", "1-proc acc"):
        table.add_column(column, justify="left" if column in ("model", "strategy") else "right")
    for outcome in outcomes:
        label = f"{outcome.model.name} {outcome.model.version}"
        result = outcome.result
        if result is None:
            table.add_row(label, outcome.strategy, *["-"] * 5, "failed",
                          _percent(outcome.baseline))
            continue
        predicted = result.predicted_bytes_per_step
        measured = result.bytes_per_step
        table.add_row(
            label, outcome.strategy, f"{result.predicted_step_seconds * 1e3:.2f}",
            f"{result.step_seconds_median * 1e3:.2f}", f"{result.throughput_samples_per_s:,.0f}",
            f"{predicted.transfer + predicted.sync:,}", f"{measured.transfer + measured.sync:,}",
            _percent(outcome.accuracy), _percent(outcome.baseline))
    return table


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def ui_command(tracking_uri: str) -> str:
    """How to look at the results: the MLflow UI on a local store, else the server itself."""
    if tracking_uri.startswith(("sqlite:", "postgresql", "mysql", "mssql")):
        return f"mlflow ui --backend-store-uri {tracking_uri}"
    return f"open {tracking_uri}"
