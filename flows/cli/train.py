"""`layerwise train`: train a model under a strategy on N torchrun processes and measure it.

    layerwise train tiny_cnn --strategy data --nproc 2 --steps 50 --image-size 16
    layerwise train lenet5 --strategy layerwise --nproc 4 --dataset digits --epochs 3
    layerwise train resnet18 --strategy resnet18.json --nproc 4 --image-size 32 --out runs/r18
    layerwise train resnet18 --resume runs/r18 --steps 400
    layerwise train vgg16 --strategy owt --nproc 4 --image-size 32 --out /shared/vgg16 \\
        --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500

Everything that can be wrong is found before any process starts (exit code 2, one line): the
strategy against the model's layer graph at the global batch (batch per device x processes),
the dataset against the model's input, the run folder. The launcher then writes the run folder
(strategy.json with the cost model's prediction, train.json, graph.json), starts torchrun in
its own process group and follows rank 0's progress lines. A failed run ends with one line
naming the rank that failed first and its error (exit code 1); a finished one with measured
throughput, step time and bytes per step next to the prediction. The job itself is
layerwise.strategies.jobs's, shared with the benchmark flow; this module parses options and draws.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from layerwise.flows.cli.console import (
    GlobalBatch,
    InputShape,
    console,
    error_console,
    human_count,
    input_options,
    print_error,
    print_warning,
    user_errors,
)
from layerwise.strategies.jobs.defaults import (
    DEFAULT_BATCH_PER_DEVICE,
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_TIMEOUT_SECONDS,
)
from layerwise.strategies.learning_rate import (
    DEFAULT_LR,
    DEFAULT_LR_DECAY,
    DEFAULT_WARMUP_STEPS,
    LR_DECAYS,
)
from layerwise.strategies.schedules import schedule_help

if TYPE_CHECKING:
    from layerwise.strategies.jobs.job import Job
    from layerwise.strategies.training_run import RunResult


def register(app: typer.Typer) -> None:
    """Add `train` to the CLI."""
    app.command("train")(train)


@user_errors
def train(
    model: Annotated[str, typer.Argument(help="Zoo name or package.module:factory.")],
    strategy: Annotated[str | None, typer.Option(
        help="layerwise (search now), a baseline (data, model, owt, spatial_h, spatial_w, "
             "spatial), "
             f"a scheduled strategy: {schedule_help()}; or a strategy JSON file from "
             "`layerwise search --save`.")] = None,
    nproc: Annotated[int | None, typer.Option(help="Processes per node.")] = None,
    cluster: Annotated[str | None, typer.Option(
        help="Cluster preset or YAML for the prediction (default local).")] = None,
    profile: Annotated[Path | None, typer.Option(
        help="Profile JSON for the predicted t_c (default: the analytic t_c).")] = None,
    analytic: Annotated[bool, typer.Option(
        help="Predict t_c with the cluster device's analytic model (the default).")] = False,
    dataset: Annotated[str | None, typer.Option(
        help="synthetic (any size, the default), segments (a label per position, the "
             "default for a network scoring every position), digits (run `dvc repro prepare` "
             "first), cifar10, imagefolder or any folder prepared under data/prepared/.")
    ] = None,
    epochs: Annotated[int | None, typer.Option(
        help="Passes over the training split (default 1).")] = None,
    steps: Annotated[int | None, typer.Option(help="Train until this step instead.")] = None,
    batch_per_device: Annotated[int | None, typer.Option(
        help=f"Samples per process; the global batch is this x processes (default "
             f"{DEFAULT_BATCH_PER_DEVICE}).")] = None,
    batch: GlobalBatch = None,
    image_size: Annotated[int | None, typer.Option(
        help="Input height and width (default: the dataset's, else the model's).")] = None,
    classes: Annotated[int | None, typer.Option(help="Number of classes.")] = None,
    in_channels: Annotated[int | None, typer.Option(help="Input channels.")] = None,
    input_shape: InputShape = None,
    lr: Annotated[float | None, typer.Option(
        help=f"SGD's peak learning rate, reached after the warm-up (default {DEFAULT_LR:g}).")
    ] = None,
    warmup_steps: Annotated[int | None, typer.Option(
        help="Steps the learning rate rises over linearly to --lr (default "
             f"{DEFAULT_WARMUP_STEPS}; 0: none).")] = None,
    lr_decay: Annotated[str | None, typer.Option(
        help=f"After the warm-up: {' or '.join(LR_DECAYS)} (default {DEFAULT_LR_DECAY}: "
             "--lr x sqrt(warm-up steps / step)).")] = None,
    momentum: Annotated[float | None, typer.Option(
        help="SGD momentum, in [0, 1) (default 0.9).")] = None,
    weight_decay: Annotated[float | None, typer.Option(
        help="SGD weight decay (default 1e-4).")] = None,
    seed: Annotated[int | None, typer.Option(
        help="Seed of the weights, data order and dropout (default 0).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Run folder (default: a new one under runs/).")] = None,
    checkpoint_every: Annotated[int, typer.Option(
        help="Steps between checkpoints; one is always written at the end.")
    ] = DEFAULT_CHECKPOINT_EVERY,
    resume: Annotated[Path | None, typer.Option(
        help="Continue the run in this folder from its last checkpoint, same settings.")
    ] = None,
    timeout: Annotated[float, typer.Option(
        help="Seconds a collective waits for the other ranks before the run fails.")
    ] = DEFAULT_TIMEOUT_SECONDS,
    nnodes: Annotated[int | None, typer.Option(help="Machines (default 1).")] = None,
    node_rank: Annotated[int | None, typer.Option(
        help="This machine's index, with --nnodes > 1.")] = None,
    rdzv_endpoint: Annotated[str | None, typer.Option(
        help="HOST:PORT of node 0, with --nnodes > 1.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the RunResult JSON.")] = False,
) -> None:
    """Train MODEL under a strategy on N processes with torchrun; measure it against Eq. 1."""
    image_size, in_channels = input_options(image_size, in_channels, input_shape)
    from layerwise.strategies.jobs.job import new_job, resumed_job
    from layerwise.strategies.jobs.launch import TrainingFailed
    from layerwise.strategies.jobs.options import TrainOptions, check_launch_numbers
    from layerwise.strategies.runtime.worker import Fault

    check_launch_numbers(steps, epochs, checkpoint_every, timeout)
    options = TrainOptions.given(
        nproc=nproc, nnodes=nnodes, cluster=cluster,
        profile=str(profile) if profile is not None else None, dataset=dataset,
        batch_per_device=batch_per_device, batch=batch, image_size=image_size,
        classes=classes, in_channels=in_channels, lr=lr, momentum=momentum,
        weight_decay=weight_decay, seed=seed, warmup_steps=warmup_steps, lr_decay=lr_decay)
    Fault.from_environment()  # a malformed drill is a user error before anything starts
    if resume is not None:
        job = resumed_job(resume, model, strategy, options, out, node_rank, rdzv_endpoint)
    else:
        job = new_job(model, strategy, options, out, analytic, node_rank, rdzv_endpoint)
    try:
        with job:  # the run folder is held until the run ends
            result = _run_with_progress_bar(job, steps, epochs, checkpoint_every, timeout,
                                            as_json)
    except TrainingFailed as failure:
        print_error(str(failure))
        raise typer.Exit(code=1) from None
    _report(job, result, as_json)


def _run_with_progress_bar(job: Job, steps: int | None, epochs: int | None,
                           checkpoint_every: int, timeout: float, quiet: bool) -> RunResult:
    """Run the job with a progress bar driven by rank 0's lines; returns its result. Every other
    output line is passed on (to stderr with --json, whose stdout is the result)."""
    from layerwise.strategies.jobs.launch import StepProgress, run_job

    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[loss]}"),
               TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=quiet or not console.is_terminal) as bar:
        task = bar.add_task(f"starting {job.settings.world} processes", total=None, loss="")
        started = False

        def show_line(line: str) -> None:
            (error_console if quiet else bar.console).print(line, markup=False,
                                                            highlight=False)

        def show_progress(progress: StepProgress) -> None:
            nonlocal started
            if not started:  # a resumed run starts part way: estimate the rest from here on
                bar.reset(task, total=progress.steps, completed=progress.step - 1)
                started = True
            finishing = ", saving" if progress.step == progress.steps else ""
            bar.update(task, completed=progress.step, loss=f"loss {progress.loss:.4f}",
                       description=f"step {progress.step}/{progress.steps}{finishing}")

        return run_job(job, steps, epochs, checkpoint_every, timeout, on_warning=print_warning,
                       on_line=show_line, on_progress=show_progress)


def _report(job: Job, result: RunResult, as_json: bool) -> None:
    from layerwise.strategies.files.locations import CHECKPOINT_FILE, MODEL_FILE, RESULT_FILE

    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
        return
    _print_summary(result)
    last = result.steps[-1].step
    console.print(
        f"result      {job.out / RESULT_FILE}\n"
        f"model       {job.out / MODEL_FILE} (a state_dict for the plain module)\n"
        f"checkpoint  {job.out / CHECKPOINT_FILE} (step {last}; continue with --resume "
        f"{job.out} --steps N)", highlight=False, soft_wrap=True)


def _print_summary(result: RunResult) -> None:
    first, last = result.steps[0], result.steps[-1]
    resumed = f", resumed after step {result.resumed_from_step}" if result.resumed_from_step else ""
    console.print(
        f"trained {result.model} under '{result.strategy.name}' on {result.nproc} processes "
        f"({result.backend}, {result.device}): steps {first.step}-{last.step}{resumed}, "
        f"global batch {result.global_batch}, loss {first.loss:.4f} -> {last.loss:.4f}",
        highlight=False, soft_wrap=True)
    console.print(f"execution: {result.strategy.execution.describe()}", highlight=False,
                  soft_wrap=True)
    table = Table(title="per training step", title_justify="left")
    for column in ("", "measured", "predicted"):
        table.add_column(column, justify="left" if not column else "right")
    predicted_samples = result.global_batch / result.predicted_step_seconds
    table.add_row("median step", f"{result.step_seconds_median * 1e3:.2f} ms",
                  f"{result.predicted_step_seconds * 1e3:.2f} ms")
    table.add_row("samples/s", f"{result.throughput_samples_per_s:,.1f}",
                  f"{predicted_samples:,.1f}")
    for category in ("transfer", "sync"):
        table.add_row(f"{category} bytes", f"{getattr(result.bytes_per_step, category):,}",
                      f"{getattr(result.predicted_bytes_per_step, category):,}")
    console.print(table)
    peaks = (", ".join(f"{human_count(peak)}B" for peak in result.peak_memory_bytes_per_rank)
             or "not measured (a schedule's own engine on CPUs)")
    console.print(f"peak memory per rank: {peaks}; the loss's own all-reduces sent "
                  f"{result.loss_bytes_per_step:,} bytes per step (not in Eq. 1)",
                  highlight=False, soft_wrap=True)
