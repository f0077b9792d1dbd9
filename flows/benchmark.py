"""The benchmark flow: data -> calibrate -> profile -> search -> verify -> train -> validate
-> track.

    layerwise run                           # configs/benchmark.yaml, see flows/cli/run.py
    layerwise run --set strategies=[data,owt] --set steps=80

With `cluster: calibrated` it first measures this machine's links between the `nproc` ranks
(tasks/calibrate.py, once per project). For each model version: build its layer graph at the
global batch, profile t_c on this machine (or take the analytic t_c), search the layer-wise
strategy and cost the baselines, prove every strategy file exact in float64 against one process
(a few steps, tasks/verify.py), train the one-process reference (strategy data on 1 process,
the same global batch and seed), then train each strategy on `nproc` torchrun processes, judge
its validation accuracy against the reference (a binomial bound in images, strategies/
accuracy.py), and record it in a nested MLflow run: its inputs (dataset, calibration,
profile) before training, its loss per step while it trains, its results and trained model
(registered with `register_model: true`) after. Once a model version's strategies ran, its
champion in the registry is settled: the alias `champion-<label>-<cluster>` moves to a
strategy's version only when it beats the champion by `champion_margin`, measured in the same
run (tasks/tracking/champion.py). A failed check fails its own task and MLflow run, keeps
every measured number, and the other strategies still run; the flow then ends Failed, naming
it once. With `fail_on_regression`, so does a regression: the searched plan slower than data
parallelism, or a champion's strategy slower than its recorded step by the margin. Whatever
ends the flow, its MLflow runs do not stay RUNNING: an error closes them FAILED, Ctrl-C or
SIGTERM KILLED, and the runs of a flow killed outright (SIGKILL) are marked KILLED when the next
flow starts (tasks/tracking/track.py). Each benchmark's folder runs/benchmark-STAMP is created
by it alone (make_stamped_folder). The flow prints how long each stage took, its own overhead
(everything but torchrun, profiling and calibration), a comparison table and, in words, which
strategy won by how much and where the champion stands; the table is also the flow run's
Prefect artifact.
"""

import contextlib
import csv
import io
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from prefect.states import Completed, Failed, State
from rich.table import Table

from layerwise.flows.benchmark_config import CALIBRATED, BenchmarkConfig, ModelVersion
from layerwise.flows.cli.console import console
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.exactness.accuracy import AccuracyCheck
from layerwise.strategies.exactness.reference import Divergence
from layerwise.strategies.files.atomic import write_atomic
from layerwise.strategies.hardware.this_machine import device_name, resolve_device
from layerwise.strategies.jobs.job import RUNS_DIR
from layerwise.strategies.jobs.options import TrainOptions
from layerwise.strategies.jobs.planning import predicted_peaks
from layerwise.strategies.jobs.run_folder import make_stamped_folder
from layerwise.strategies.model.graph import LayerGraph, build_graph
from layerwise.strategies.model.input_size import spatial_size
from layerwise.strategies.model.space import DIMS, ParallelConfig
from layerwise.strategies.runtime.datasets import ImageSpec
from layerwise.strategies.schedules import SEARCHED, is_exact
from layerwise.strategies.training_run import RunResult
from layerwise.tasks.calibrate import calibrate_links
from layerwise.tasks.champion import ChampionKey, settle_champion
from layerwise.tasks.prepare import prepare_data
from layerwise.tasks.profile import profile_model
from layerwise.tasks.record import record_strategy_run
from layerwise.tasks.search import oracle_step_seconds, search_strategies
from layerwise.tasks.tracking import model_registry as registry
from layerwise.tasks.tracking import provenance, track
from layerwise.tasks.tracking.champion import Measured, Standing, standing_line
from layerwise.tasks.tracking.figures import SPLIT_WORDS
from layerwise.tasks.tracking.owner import owner_tags
from layerwise.tasks.train import train_strategy
from layerwise.tasks.validate import accuracy_of, judge_accuracy, measure_accuracy
from layerwise.tasks.verify import verify_exactness

REFERENCE_STRATEGY = "data"  # on one process every strategy is this one
BASELINE_STRATEGY = "data"  # what the summary measures the winner against
MEASURED_STAGES = ("train", "profile", "calibrate", "verify")  # the work; the rest is overhead


class BenchmarkFailed(RuntimeError):
    """Some strategies failed; their MLflow runs say why, the others finished."""


@dataclass(frozen=True)
class Outcome:
    """What one (model version, strategy) run measured and how its checks went.

    Every measured number is kept whatever failed: `error` says what failed (a check or the
    run itself), `result` is None only when nothing was measured.
    """

    model: ModelVersion
    strategy: str
    result: RunResult | None = None
    accuracy: AccuracyCheck | None = None
    divergence: Divergence | None = None
    error: str | None = None
    # the memory model's peak on the fullest device (None: an engine it does not cover), and
    # the bytes a device may hold when the config declares them
    predicted_peak_bytes: int | None = None
    memory_limit: int | None = None
    # the run's version of the model's registered name (None: not registered), and the
    # registry's verdict on its (model, label, cluster) champion after every strategy ran
    registered_version: str | None = None
    standing: Standing | None = None

    @property
    def measured_peak_bytes(self) -> int | None:
        peaks = self.result.peak_memory_bytes_per_rank if self.result is not None else ()
        return max(peaks) if peaks else None

    @property
    def fits(self) -> bool | None:
        """Whether the run fits the declared memory, predicted and measured (None: no limit
        declared, or nothing to judge)."""
        known = [peak for peak in (self.predicted_peak_bytes, self.measured_peak_bytes)
                 if peak is not None]
        if self.memory_limit is None or not known:
            return None
        return max(known) <= self.memory_limit

    @property
    def label(self) -> str:
        return f"{self.model.name} {self.model.version} {self.strategy}"

    @property
    def status(self) -> str:
        if self.error is None:
            return "passed"
        if self.result is None:
            return "run failed"
        if self.divergence is not None and self.divergence.exact is False:
            return "not exact"
        return "accuracy differs" if self.accuracy is not None and not self.accuracy.passed \
            else "failed"


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


@dataclass(frozen=True)
class Reference:
    """The one-process run every strategy's accuracy is judged against."""

    correct: int | None = None
    images: int | None = None  # validation predictions (positions of a dense output)
    error: str | None = None

    @property
    def accuracy(self) -> float | None:
        return None if self.correct is None or not self.images else self.correct / self.images


@flow(name="benchmark")
def benchmark(config: BenchmarkConfig) -> list[Outcome] | State:
    """Benchmark every model version under every strategy; see the module docstring."""
    started = time.perf_counter()
    clock = StageClock()
    with clock.stage("track"):
        client, experiment_id = track.open_experiment(config.name)
        track.close_orphaned_runs(client, experiment_id)
    with clock.stage("data"):
        image = prepare_data.with_options(task_run_name=f"prepare data[{config.dataset}]")(
            config.dataset, config.dvc_push)
    _check_image(config, image)
    cluster = config.cluster
    if cluster == CALIBRATED:
        with clock.stage("calibrate"):
            cluster = str(calibrate_links.with_options(
                task_run_name=f"calibrate[{config.nproc} processes]")(config.nproc))
    folder = make_stamped_folder(RUNS_DIR, "benchmark")
    with clock.stage("track"):
        tags = provenance.environment_tags(
            flow_run.get_id(), device_name(resolve_device(None)), torch.__version__,
            _prefect_ui_url()) | owner_tags()
    # an error: FAILED; Ctrl-C, SIGTERM: KILLED
    with track.benchmark_run(client, experiment_id, folder.name,
                             config.model_dump(mode="json"), tags) as parent_id:
        with clock.stage("track"):
            provenance.log_dataset(config.dataset, image)
        context = Context(config=config, client=client, experiment_id=experiment_id,
                          parent_id=parent_id, tags=tags, folder=folder, image=image,
                          clock=clock, cluster=cluster)
        outcomes = [outcome for model in config.models
                    for outcome in _settle_champion(context, model,
                                                    _benchmark_model(context, model))]
        failed = [outcome for outcome in outcomes if outcome.error is not None]
        slower = regressions(outcomes) if config.fail_on_regression else []
        with clock.stage("track"):
            _finish_parent(context, outcomes, failed, time.perf_counter() - started, slower)
            write_reports(outcomes, parent_id)
    _print_report(context, outcomes, time.perf_counter() - started)
    if failed:
        return Failed(message=f"{len(failed)} of {len(outcomes)} strategy runs failed: "
                              + ", ".join(outcome.label for outcome in failed), data=outcomes)
    if slower:
        return Failed(message="; ".join(slower), data=outcomes)
    return Completed(data=outcomes)


def regressions(outcomes: list[Outcome]) -> list[str]:
    """What a nightly run must not pass over in silence, one line each: per model version,
    the searched plan slower than data parallelism (`_searched_regressions`), and its
    champion's strategy slower than the champion's recorded step (tasks/tracking/champion.py)."""
    return _searched_regressions(outcomes) + [standing.regression
                                              for standing in _standings(outcomes)
                                              if standing.regression is not None]


def _standings(outcomes: list[Outcome]) -> list[Standing]:
    """Each model version's champion verdict, once, in the config's order."""
    return list(dict.fromkeys(outcome.standing for outcome in outcomes
                              if outcome.standing is not None))


def _searched_regressions(outcomes: list[Outcome]) -> list[str]:
    """Per model version, the searched plan measured slower than data parallelism beyond the
    measurement's spread (its first quartile above data's third), where both ran and data
    fits the declared memory."""
    found = []
    for model in dict.fromkeys(outcome.model for outcome in outcomes):
        mine = {outcome.strategy: outcome for outcome in outcomes if outcome.model == model}
        searched, data = mine.get(SEARCHED), mine.get(BASELINE_STRATEGY)
        if (searched is None or data is None or searched.result is None or data.result is None
                or data.fits is False):
            continue
        if searched.result.step_seconds_quartiles[0] > data.result.step_seconds_quartiles[1]:
            found.append(
                f"regression: {model.name} {model.version}'s searched plan ran "
                f"{searched.result.step_seconds_median * 1e3:.1f} ms per step, slower than "
                f"{BASELINE_STRATEGY} parallelism's {data.result.step_seconds_median * 1e3:.1f} "
                f"(its quartiles {_milliseconds(searched.result.step_seconds_quartiles)} ms "
                f"above {_milliseconds(data.result.step_seconds_quartiles)})")
    return found


def _milliseconds(quartiles: tuple[float, float]) -> str:
    return "-".join(f"{value * 1e3:.1f}" for value in quartiles)


def _prefect_ui_url() -> str | None:
    """This flow run's page in the Prefect UI; None on the ephemeral API, which has none."""
    from prefect.settings import PREFECT_UI_URL

    return flow_run.get_flow_run_ui_url() if PREFECT_UI_URL.value() else None


def _check_image(config: BenchmarkConfig, image: ImageSpec | None) -> None:
    """A prepared dataset fixes the input size and classes: the config must agree."""
    if image is None:
        return
    for name, fixed in (("image_size", image.image_size), ("classes", image.classes)):
        given = getattr(config, name)
        if name == "image_size" and spatial_size(given, len(image.sizes)) == image.sizes:
            continue  # a cube's side for a prepared volume
        if given != fixed:
            raise LayerwiseError(
                f"config {name}: {getattr(config, name)}, but {config.dataset} is prepared with "
                f"{fixed}; set {name}: {fixed}, or change its section in params.yaml")


def _benchmark_model(context: Context, model: ModelVersion) -> list[Outcome]:
    """Profile, search, verify, the one-process reference, then every strategy of one model."""
    config, clock = context.config, context.clock
    label = f"{model.name} {model.version}"
    folder = context.folder / f"{model.name}-{model.version}".replace(":", "_")
    graph = build_graph(model.name, batch=config.global_batch,
                        image_size=config.image_size, num_classes=config.classes,
                        in_channels=context.image.channels if context.image else None)
    profile = None
    if config.profile:
        with clock.stage("profile"):
            profile = profile_model.with_options(task_run_name=f"profile[{label}]")(
                graph, config.nproc, config.strategies)
    with clock.stage("search"):
        files = search_strategies.with_options(task_run_name=f"search[{label}]")(
            graph, context.cluster, config.nproc, profile, config.strategies,
            folder / "strategies", config.memory_limit)
        oracle = oracle_step_seconds.with_options(task_run_name=f"oracle[{label}]")(
            graph, context.cluster, config.nproc, profile, config.strategies)
    divergences, verify_error = ({}, None) if config.verify_steps == 0 else _verify(
        context, model, graph, files, profile, folder / "verify")
    reference = _reference_accuracy(context, model, graph, folder / "one-process")
    return [_benchmark_strategy(context, model, graph, name, files[name], profile, folder,
                                reference, divergences.get(name), verify_error,
                                oracle.get(name))
            for name in config.strategies]


def _verify(context: Context, model: ModelVersion, graph: LayerGraph, files: dict[str, Path],
            profile: Path | None, out: Path) -> tuple[dict[str, Divergence], str | None]:
    """Each strategy file's float64 divergence from one process, by strategy name."""
    config = context.config
    options = _train_options(context, nproc=config.nproc, profile=profile)
    try:
        with context.clock.stage("verify"):
            report = verify_exactness.with_options(
                task_run_name=f"verify[{model.name} {model.version}]")(
                model.name, list(files.values()), options, config.verify_steps, out,
                config.train_deadline_s, graph)
    except Exception as error:  # each strategy's outcome reports it; training goes on
        return {}, f"the float64 verify stage failed: {error}"
    return dict(zip(files, report.divergences, strict=True)), None


def _reference_accuracy(context: Context, model: ModelVersion, graph: LayerGraph,
                        out: Path) -> Reference:
    """Validation counts of one-process training with the same global batch and seed."""
    config = context.config
    label = f"{model.name} {model.version} one-process"
    options = _train_options(context, nproc=1, profile=None)
    try:
        with context.clock.stage("train"):
            train_strategy.with_options(task_run_name=f"train[{label}]")(
                model.name, REFERENCE_STRATEGY, options, config.steps, out,
                config.train_deadline_s, graph)
        with context.clock.stage("validate"):
            correct, images, _ = measure_accuracy.with_options(
                task_run_name=f"validate[{label}]")(out)
    except Exception as error:  # every strategy's run reports it; the flow goes on
        return Reference(error=f"the one-process reference failed: {error}")
    return Reference(correct=correct, images=images)


def _benchmark_strategy(context: Context, model: ModelVersion, graph: LayerGraph,
                        strategy: str, strategy_file: Path, profile: Path | None, folder: Path,
                        reference: Reference, divergence: Divergence | None,
                        verify_error: str | None, oracle_seconds: float | None) -> Outcome:
    """Train, validate, judge and track one strategy; a failure is recorded, not raised."""
    config, clock = context.config, context.clock
    label = f"{model.name} {model.version} {strategy}"
    out = folder / strategy
    result = check = version = None
    with track.strategy_run(  # what escapes: FAILED or KILLED
            context.client, context.experiment_id, context.parent_id,
            f"{model.name}-{model.version}-{strategy}",
            _run_params(context, model, graph, strategy), context.tags) as run_id:
        try:
            with clock.stage("track"):
                provenance.log_run_inputs(context.client, run_id, config.dataset,
                                          context.image, context.cluster, profile)
            options = _train_options(context, nproc=config.nproc, profile=profile)
            live = track.LiveSteps(context.client, run_id)
            try:
                with clock.stage("train"):
                    result = train_strategy.with_options(task_run_name=f"train[{label}]")(
                        model.name, str(strategy_file), options, config.steps, out,
                        config.train_deadline_s, graph, on_step=live)
            finally:
                live.flush()
            if reference.correct is not None and reference.images is not None:
                with clock.stage("validate"):
                    correct, images, per_sample = measure_accuracy.with_options(
                        task_run_name=f"validate[{label}]")(out)
                    exact = is_exact(result.strategy, graph)
                    verdict = judge_accuracy.with_options(
                        task_run_name=f"check accuracy[{label}]")(
                        correct, reference.correct, images,
                        config.tolerance if exact else config.inexact_tolerance, per_sample,
                        return_state=True)
                    check = accuracy_of(verdict)
            with clock.stage("track"):
                version = record_strategy_run.with_options(task_run_name=f"track[{label}]")(
                    context.client, run_id, result, graph, out, check, divergence,
                    oracle_seconds, registry.ModelRecord(
                        registered_name=registry.registered_model_name(model.name)
                        if config.register_model else None,
                        version_label=model.version, strategy=strategy,
                        cluster=context.cluster))
            error = _first_failure(reference, divergence, verify_error, check)
        except Exception as failure:  # recorded in its MLflow run; the other strategies go on
            error = str(failure)
        with clock.stage("track"):
            if error is None:
                track.finish_run(context.client, run_id)
            else:
                track.fail_run(context.client, run_id, BenchmarkFailed(error))
    peaks = None if result is None else predicted_peaks(
        graph, result.strategy, momentum=config.momentum != 0)
    return Outcome(model=model, strategy=strategy, result=result, accuracy=check,
                   divergence=divergence, error=error,
                   predicted_peak_bytes=max(peaks) if peaks else None,
                   memory_limit=config.memory_limit, registered_version=version)


def _settle_champion(context: Context, model: ModelVersion,
                     outcomes: list[Outcome]) -> list[Outcome]:
    """The registry's champion verdict for the model version's registered strategies, on
    each of its outcomes (unchanged when none was registered)."""
    measured = [_measured(outcome, outcomes) for outcome in outcomes
                if outcome.registered_version is not None and outcome.result is not None]
    if not measured:
        return outcomes
    key = ChampionKey(registered_name=registry.registered_model_name(model.name),
                      model=model.name, label=model.version, cluster=context.cluster)
    with context.clock.stage("track"):
        standing = settle_champion.with_options(
            task_run_name=f"champion[{model.name} {model.version}]")(
            context.client, key, measured, context.config.champion_margin,
            provenance.source_text(context.tags, context.folder.name))
    return [replace(outcome, standing=standing) for outcome in outcomes]


def _measured(outcome: Outcome, outcomes: list[Outcome]) -> Measured:
    """A registered run as the champion's rule reads it: ineligible when it failed a check
    or does not fit the declared memory."""
    assert outcome.result is not None and outcome.registered_version is not None
    speedup = _speedup(outcome, outcomes)
    ineligible = outcome.error
    if ineligible is None and outcome.fits is False:
        ineligible = (f"its peak memory is over the declared "
                      f"{_megabytes(outcome.memory_limit)} MB per device")
    return Measured(strategy=outcome.strategy, version=outcome.registered_version,
                    step_seconds=outcome.result.step_seconds_median,
                    first_quartile_seconds=outcome.result.step_seconds_quartiles[0],
                    speedup=None if speedup is None else speedup[0], ineligible=ineligible)


def _first_failure(reference: Reference, divergence: Divergence | None,
                   verify_error: str | None, check: AccuracyCheck | None) -> str | None:
    """Why a trained strategy failed its checks, or None when it passed them all."""
    if verify_error is not None:
        return verify_error
    if divergence is not None and divergence.exact is False:
        return (f"not exact: float64 training left one process's by "
                f"{divergence.largest:.1e} ({divergence.worst_parameter}), above "
                f"{divergence.tolerance:g}")
    if reference.error is not None:
        return reference.error
    if check is not None and not check.passed:
        return f"accuracy {check.describe()}"
    return None


def _train_options(context: Context, *, nproc: int, profile: Path | None) -> TrainOptions:
    """The run options of this benchmark's training jobs: the config's global batch on
    `nproc` processes (all of it on one for the reference)."""
    config = context.config
    per_device = None if config.batch is not None else config.global_batch // nproc
    return TrainOptions(
        nproc=nproc, cluster=context.cluster, dataset=config.dataset,
        batch_per_device=per_device, batch=config.batch, image_size=config.image_size,
        classes=config.classes, lr=config.lr, momentum=config.momentum,
        weight_decay=config.weight_decay, seed=config.seed,
        warmup_steps=config.warmup_steps, lr_decay=config.lr_decay,
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
        "global_batch": config.global_batch, "seed": config.seed,
        "dataset": config.dataset, "image_size": config.image_size, "steps": config.steps,
        "lr": config.lr, "cost_source": "profile" if config.profile else "analytic",
        "memory_limit_bytes": config.memory_limit,
    }


def _finish_parent(context: Context, outcomes: list[Outcome], failed: list[Outcome],
                   elapsed: float, slower: list[str]) -> None:
    """Stage times and the summary on the parent run, the results table and a pointer to
    MLflow as Prefect artifacts, and the parent's status (failed for a failed strategy run or
    a regression of the searched plan, `slower`)."""
    seconds = _stage_seconds(context.clock, elapsed)
    for name, value in seconds.items():
        context.client.log_metric(context.parent_id, f"{name.replace(' ', '_')}_seconds", value)
    summary = "\n".join(f"- {line}" for line in [*slower, *summary_lines(outcomes)])
    _log_summary(context, outcomes, summary)
    create_table_artifact(key="benchmark-results", table=_table_rows(outcomes),
                          description="Predicted vs measured per training step, checks")
    create_markdown_artifact(key="benchmark-summary", markdown=summary,
                             description="Which strategy won, by how much, and the checks")
    create_markdown_artifact(
        key="mlflow-run",
        markdown=f"MLflow experiment `{context.config.name}`, parent run "
                 f"`{context.parent_id}` on `{track.tracking_uri()}`"
                 + _run_link(track.tracking_uri(), context.experiment_id, context.parent_id),
        description="Where this benchmark's results are tracked")
    if failed:
        track.fail_run(context.client, context.parent_id,
                       BenchmarkFailed(", ".join(o.strategy for o in failed)))
    elif slower:
        track.fail_run(context.client, context.parent_id, BenchmarkFailed("; ".join(slower)))
    else:
        track.finish_run(context.client, context.parent_id)


def _log_summary(context: Context, outcomes: list[Outcome], summary: str) -> None:
    """What a reader of the parent run looks for, on the run itself: the summary as its
    description (MLflow's `mlflow.note.content`) and as summary.md, per model version the
    winning strategy (tag `winner.<model>.<version>`) with its measured and predicted speed-up
    over data parallelism (metrics `speedup_measured.<model>.<version>`, `_predicted`), the
    results table, and the figure of predicted beside measured per strategy."""
    from layerwise.flows.compare import comparison_figure, strategy_rows

    client, run_id = context.client, context.parent_id
    client.set_tag(run_id, "mlflow.note.content", summary)
    client.log_text(run_id, summary + "\n", "summary.md")
    for model in dict.fromkeys(outcome.model for outcome in outcomes):
        winner = _winner([outcome for outcome in outcomes if outcome.model == model])
        if winner is None:
            continue
        label = f"{model.name}.{model.version}"
        client.set_tag(run_id, f"winner.{label}", winner.strategy)
        speedup = _speedup(winner, outcomes)
        if speedup is not None:
            client.log_metric(run_id, f"speedup_measured.{label}", speedup[0])
            client.log_metric(run_id, f"speedup_predicted.{label}", speedup[1])
    rows = _table_rows(outcomes)
    if rows:
        client.log_table(run_id, {key: [row[key] for row in rows] for key in rows[0]},
                         "results.json")
    client.log_figure(run_id, comparison_figure(strategy_rows(
        context.experiment_id, client.get_run(run_id))), "comparison.png")


def _winner(outcomes: list[Outcome]) -> Outcome | None:
    """The fastest measured strategy of one model version; where a declared memory rules
    some out, the fastest of those that fit (the summary's rule)."""
    measured = [outcome for outcome in outcomes if outcome.result is not None]
    if any(outcome.fits is False for outcome in measured):
        measured = [outcome for outcome in measured if outcome.fits is True]
    return min(measured, key=lambda outcome: outcome.result.step_seconds_median, default=None)


def _run_link(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """A link to the run's page where the tracking URI is a server the reader can open."""
    if not tracking_uri.startswith(("http://", "https://")):
        return ""
    url = f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return f": [{url}]({url})"


def _stage_seconds(clock: StageClock, elapsed: float) -> dict[str, float]:
    """Each stage's seconds, then the flow's overhead: all but torchrun and profiling."""
    seconds = dict(clock.seconds)
    seconds["flow overhead"] = elapsed - sum(seconds.get(name, 0.0) for name in MEASURED_STAGES)
    return seconds


REPORTS = Path("reports")  # dvc.yaml's metrics and plots: the latest benchmark of the project
SUMMARY_FILE, TABLE_FILE = REPORTS / "benchmark.json", REPORTS / "strategies.csv"


def write_reports(outcomes: list[Outcome], parent_id: str) -> None:
    """The latest benchmark as DVC reads it: per model version and strategy its numbers
    (`dvc metrics show`), and one CSV row each (`dvc plots show`). Git-ignored: a run must
    leave a clone clean; its MLflow run holds every run's copy."""
    summary: dict[str, Any] = {"mlflow_run_id": parent_id}
    columns = ("predicted_ms", "measured_ms", "transfer_bytes", "sync_bytes", "val_accuracy")
    table = io.StringIO()
    writer = csv.writer(table, lineterminator="\n")
    writer.writerow(["run", "model", "strategy", *columns])
    for outcome in outcomes:
        if outcome.result is None:
            continue
        result, check = outcome.result, outcome.accuracy
        values = {"predicted_ms": result.predicted_step_seconds * 1e3,
                  "measured_ms": result.step_seconds_median * 1e3,
                  "transfer_bytes": result.bytes_per_step.transfer,
                  "sync_bytes": result.bytes_per_step.sync,
                  "val_accuracy": None if check is None else check.accuracy,
                  "passed": outcome.error is None}
        label = f"{outcome.model.name} {outcome.model.version}"
        summary.setdefault(label, {})[outcome.strategy] = values
        writer.writerow([outcome.label, label, outcome.strategy,
                         *(_csv_number(values[key]) for key in columns)])
    REPORTS.mkdir(exist_ok=True)
    write_atomic(SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    write_atomic(TABLE_FILE, table.getvalue())


def _csv_number(value: float | None) -> str:
    """Byte counts whole, times and shares to six significant digits, nothing for None."""
    if value is None:
        return ""
    return str(value) if isinstance(value, int) else f"{value:.6g}"


COLUMNS = ("model", "strategy", "pred. ms", "meas. ms (IQR)", f"x {BASELINE_STRATEGY}",
           "pred. bytes", "meas. bytes", "peak MB pred./meas.", "val acc", "1-proc acc",
           "verify", "status")


def _table_rows(outcomes: list[Outcome]) -> list[dict[str, str]]:
    """One row of formatted numbers per outcome; '-' only for what was not measured."""
    rows = []
    for outcome in outcomes:
        result, check, divergence = outcome.result, outcome.accuracy, outcome.divergence
        speedup = _speedup(outcome, outcomes)
        values = [f"{outcome.model.name} {outcome.model.version}", outcome.strategy]
        if result is None:
            values += ["-"] * 5
        else:
            low, high = result.step_seconds_quartiles
            predicted = result.predicted_bytes_per_step
            measured = result.bytes_per_step
            values += [f"{result.predicted_step_seconds * 1e3:.1f}",
                       f"{result.step_seconds_median * 1e3:.1f} ({low * 1e3:.1f}-"
                       f"{high * 1e3:.1f})",
                       "-" if speedup is None else f"{speedup[0]:.2f}",
                       f"{predicted.transfer + predicted.sync:,}",
                       f"{measured.transfer + measured.sync:,}"]
        values += [_peak_text(outcome),
                   "-" if check is None else f"{check.accuracy:.2%}",
                   "-" if check is None else f"{check.reference_accuracy:.2%}",
                   _verify_text(divergence), outcome.status]
        rows.append(dict(zip(COLUMNS, values, strict=True)))
    return rows


def _megabytes(size: int | None) -> str:
    return "-" if size is None else f"{size / 1e6:,.1f}"


def _peak_text(outcome: Outcome) -> str:
    """Predicted and measured peak of the fullest device; 'over' when it does not fit the
    declared memory."""
    text = (f"{_megabytes(outcome.predicted_peak_bytes)}/"
            f"{_megabytes(outcome.measured_peak_bytes)}")
    return text + (" over" if outcome.fits is False else "")


def _verify_text(divergence: Divergence | None) -> str:
    if divergence is None:
        return "-"
    verdict = {True: "exact", False: "DIFFERS", None: "inexact"}[divergence.exact]
    return f"{verdict} {divergence.largest:.0e}"


def _speedup(outcome: Outcome, outcomes: list[Outcome]) -> tuple[float, float] | None:
    """(measured, predicted) step time of the same model's baseline over this one's."""
    baseline = next((other for other in outcomes if other.model == outcome.model
                     and other.strategy == BASELINE_STRATEGY and other.result is not None),
                    None)
    if baseline is None or outcome.result is None:
        return None
    return (baseline.result.step_seconds_median / outcome.result.step_seconds_median,
            baseline.result.predicted_step_seconds / outcome.result.predicted_step_seconds)


def _print_report(context: Context, outcomes: list[Outcome], elapsed: float) -> None:
    stages = _stage_seconds(context.clock, elapsed)
    console.print("stages: " + ", ".join(f"{name} {value:.1f} s" for name, value in
                                         stages.items()) + f"; flow total {elapsed:.1f} s",
                  highlight=False, soft_wrap=True)
    table = Table(title="benchmark: predicted vs measured per training step (median after "
                        "warm-up, interquartile range)", title_justify="left")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("model", "strategy", "verify",
                                                              "status") else "right")
    for row in _table_rows(outcomes):
        style = None if row["status"] == "passed" else "red"
        table.add_row(*row.values(), style=style)
    console.print(table)
    where = ui_command(track.tracking_uri(), context.experiment_id)
    console.print(f"MLflow: {where}", highlight=False, soft_wrap=True)


def summary_lines(outcomes: list[Outcome]) -> list[str]:
    """In words, per model: which strategy won and by how much, its champion in the registry,
    and how the checks went."""
    lines = []
    for model in dict.fromkeys(outcome.model for outcome in outcomes):
        mine = [outcome for outcome in outcomes if outcome.model == model]
        lines += (_winner_lines(model, mine) + _memory_lines(model, mine)
                  + [standing_line(standing) for standing in _standings(mine)]
                  + _check_lines(mine))
    return lines


def _memory_lines(model: ModelVersion, outcomes: list[Outcome]) -> list[str]:
    """With a declared device memory: which strategies fit it, and what the searched plan
    splits to fit."""
    judged = [outcome for outcome in outcomes if outcome.fits is not None]
    if not judged:
        return []
    limit = judged[0].memory_limit
    assert limit is not None  # fits is judged only against a declared limit

    def peaks(outcome: Outcome) -> str:
        return (f"{_megabytes(outcome.predicted_peak_bytes)} MB predicted, "
                f"{_megabytes(outcome.measured_peak_bytes)} MB measured")

    verdicts = [f"'{outcome.strategy}' does not fit ({peaks(outcome)})"
                for outcome in judged if not outcome.fits]
    verdicts += [f"'{outcome.strategy}' not judged (its engine's memory is neither predicted "
                 "nor measured yet)" for outcome in outcomes
                 if outcome.fits is None and outcome.result is not None]
    if any(outcome.fits for outcome in judged):
        verdicts.append("the others fit" if verdicts else "every strategy fits")
    lines = [f"{model.name} {model.version} memory, {_megabytes(limit)} MB per device: "
             + "; ".join(verdicts) + "."]
    searched = next((outcome for outcome in judged if outcome.strategy == SEARCHED), None)
    if searched is not None and searched.result is not None:
        lines.append(f"The searched plan {'fits' if searched.fits else 'does NOT fit'} "
                     f"({peaks(searched)}): it splits {_split_summary(searched.result)}"
                     f"{_why_it_splits(searched.result)}.")
    return lines


def _why_it_splits(result: RunResult) -> str:
    """Why a plan held to a memory limit splits as it does, where that follows from its
    configs: space splits below a sample per device, channel splits of weight shards."""
    degrees = [ParallelConfig.parse(choice.config) for choice in result.strategy.layers]
    if any(config.d > 1 or config.h > 1 or config.w > 1 for config in degrees):
        below = (" at fewer samples than devices, where a split over samples runs out"
                 if result.global_batch < result.nproc else "")
        return ("; a split over depth, height or width puts a part of each sample's "
                f"activations on each device{below}")
    if any(config.c > 1 for config in degrees):
        return "; a split over channels puts a shard of each layer's weights on each device"
    return ""


def _winner_lines(model: ModelVersion, outcomes: list[Outcome]) -> list[str]:
    measured = [outcome for outcome in outcomes if outcome.result is not None]
    if not measured:
        return []
    if any(outcome.fits is False for outcome in measured):
        return [_fitting_winner_line(model, measured)]
    best = min(measured, key=lambda outcome: outcome.result.step_seconds_median)
    speedup = _speedup(best, outcomes)
    if speedup is None or best.strategy == BASELINE_STRATEGY:
        return [f"{model.name} {model.version}: '{best.strategy}' ran fastest, "
                f"{best.result.step_seconds_median * 1e3:.1f} ms per step."]
    execution = best.result.strategy.execution
    schedule = "" if execution.kind == "layerwise" else f" ({execution.describe()})"
    lines = [f"{model.name} {model.version}: '{best.strategy}' won{schedule}: "
             f"{speedup[0]:.2f}x the throughput of {BASELINE_STRATEGY} parallelism measured "
             f"({best.result.step_seconds_median * 1e3:.1f} against "
             f"{best.result.step_seconds_median * speedup[0] * 1e3:.1f} ms per step), "
             f"{speedup[1]:.2f}x predicted. It splits {_split_summary(best.result)}."]
    searched = next((outcome for outcome in measured if outcome.strategy == SEARCHED
                     and outcome is not best), None)
    if searched is not None:
        ratio = _speedup(searched, outcomes)
        tied = searched.result.step_seconds_quartiles[0] <= best.result.step_seconds_quartiles[1]
        assert ratio is not None
        lines.append(f"The searched strategy ran {ratio[0]:.2f}x ({ratio[1]:.2f}x predicted)"
                     + (f", inside the interquartile range of '{best.strategy}': a tie on "
                        "this machine." if tied else "."))
    return lines


def _fitting_winner_line(model: ModelVersion, measured: list[Outcome]) -> str:
    """The fastest strategy among those that fit the declared memory; those that do not fit
    are named, not crowned (and those not judged are left to the memory line)."""
    limit = next(outcome.memory_limit for outcome in measured if outcome.fits is False)
    fitting = sorted((outcome for outcome in measured if outcome.fits is True),
                     key=lambda outcome: outcome.result.step_seconds_median)
    over = "; ".join(f"'{outcome.strategy}' ran {outcome.result.step_seconds_median * 1e3:.1f} "
                     "ms but does not fit" for outcome in measured if outcome.fits is False)
    label = f"{model.name} {model.version}"
    if not fitting:
        return f"{label}: no strategy fits {_megabytes(limit)} MB per device; {over}."
    best = fitting[0]
    against = (f" against {fitting[1].result.step_seconds_median * 1e3:.1f} for "
               f"'{fitting[1].strategy}'" if len(fitting) > 1 else "")
    return (f"{label}: of the strategies that fit {_megabytes(limit)} MB per device, "
            f"'{best.strategy}' ran fastest ({best.result.step_seconds_median * 1e3:.1f} ms "
            f"per step{against}); {over}.")


def _split_summary(result: RunResult) -> str:
    """Which layers the strategy splits how, in words: 'x..flatten over samples (n2), ...'."""
    groups: list[tuple[str, str, str]] = []
    for choice in result.strategy.layers:
        degrees = ParallelConfig.parse(choice.config).degrees
        split = " and ".join(f"{SPLIT_WORDS[dim]} ({dim}{degree})"
                             for dim, degree in zip(DIMS, degrees, strict=True) if degree > 1)
        split = f"over {split}" if split else "on one device"
        if groups and groups[-1][2] == split:
            groups[-1] = (groups[-1][0], choice.name, split)
        else:
            groups.append((choice.name, choice.name, split))
    return ", ".join(f"{first}{'' if first == last else '..' + last} {split}"
                     for first, last, split in groups)


def _check_lines(outcomes: list[Outcome]) -> list[str]:
    lines = []
    verified = [o.divergence for o in outcomes if o.divergence is not None
                and o.divergence.exact is not None]
    if verified and all(d.exact for d in verified):
        lines.append(f"verify: every exact strategy ({len(verified)}) matched one process in "
                     f"float64 within {verified[0].tolerance:g} (largest difference "
                     f"{max(d.largest for d in verified):.0e}).")
    checks = [o.accuracy for o in outcomes if o.accuracy is not None]
    if checks and all(check.passed for check in checks):
        worst = max(checks, key=lambda check: check.difference_images)
        lines.append(f"accuracy: every fp32 run within its tolerance of one-process training "
                     f"(at most {worst.difference_images} of {worst.images} {worst.unit} "
                     "apart; "
                     f"tolerance {worst.tolerance_images}, {worst.rule}).")
    for outcome in outcomes:
        if outcome.error is not None:
            lines.append(f"failed: {outcome.label}: {outcome.error}")
    return lines


def ui_command(tracking_uri: str, experiment_id: str) -> str:
    """How to look at the results: the MLflow UI on a local store, else the server itself,
    opened on the experiment's runs (MLflow's UI starts in its GenAI view unless told)."""
    page = f"#/experiments/{experiment_id}?workflowType=machine_learning"
    if tracking_uri.startswith(("sqlite:", "postgresql", "mysql", "mssql")):
        return (f"mlflow ui --backend-store-uri {tracking_uri}, then open "
                f"http://127.0.0.1:5000/{page}")
    return f"open {tracking_uri.rstrip('/')}/{page}"
