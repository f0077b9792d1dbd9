"""Training task: one training run on local torchrun processes, inside the flow.

It runs the same job as `layerwise train` (layerwise.strategies.jobs): the same checks before any
process starts, the same run folder (strategy.json, train.json, graph.json, checkpoints,
model.pt, result.json, torchrun.log), the same torchrun command in its own process group. What
the task adds: rank 0's output goes to the Prefect run logger, each step's loss to `on_step` as
it arrives (the flow writes it to the run's MLflow record: the workers never write there), and
a deadline stops the whole process group (a Prefect timeout cannot interrupt a blocked read of
a subprocess's output).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from layerwise.strategies.jobs.defaults import DEFAULT_TIMEOUT_SECONDS
from layerwise.strategies.jobs.job import new_job
from layerwise.strategies.jobs.launch import StepProgress, run_job
from layerwise.strategies.jobs.options import TrainOptions, check_launch_numbers
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.training_run import RunResult

PROGRESS_LINES = 5  # progress lines logged per run: enough to see it move, not one per step


@task(name="train", cache_policy=NO_CACHE)
def train_strategy(model: str, strategy: str, options: TrainOptions, steps: int, out: Path,
                   deadline_s: float, graph: LayerGraph | None = None,
                   on_step: Callable[[StepProgress], None] | None = None) -> RunResult:
    """Train `model` under `strategy` (a strategy name or a strategy file) into the new folder
    `out` with the run `options`, stopping torchrun after `deadline_s` seconds; `graph` is the
    model's layer graph for these options when the flow built it already; `on_step` gets
    every step's index and loss while training runs. TrainingFailed names the rank that failed
    first."""
    logger = get_run_logger()
    check_launch_numbers(steps, None, steps, DEFAULT_TIMEOUT_SECONDS)
    logger.info("torchrun: %d processes, %d steps, run folder %s", options.nproc, steps, out)
    with new_job(model, strategy, options, out, analytic=options.profile is None,
                 graph=graph) as job:
        return run_job(job, steps, None, steps, DEFAULT_TIMEOUT_SECONDS,
                       on_warning=lambda warning: logger.warning("%s", warning),
                       on_line=lambda line: logger.info("%s", line),
                       on_progress=_progress_logger(logger, steps, on_step),
                       deadline_s=deadline_s)


def _progress_logger(logger: Any, total: int, on_step: Callable[[StepProgress], None] | None
                     ) -> Callable[[StepProgress], None]:
    """Hands every step to `on_step`; logs rank 0's progress a few times per run and at its
    last step."""
    every = max(1, total // PROGRESS_LINES)

    def log(progress: StepProgress) -> None:
        if on_step is not None:
            on_step(progress)
        if progress.step % every == 0 or progress.step == progress.steps:
            logger.info("step %d/%d loss %.4f", progress.step, progress.steps, progress.loss)

    return log
