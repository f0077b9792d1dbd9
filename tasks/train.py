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

from layerwise.strategies.jobs.failure import failure_line
from layerwise.strategies.jobs.job import new_job, total_steps
from layerwise.strategies.jobs.launch import (
    StepProgress,
    run_torchrun,
    torchrun_command,
    write_run_folder,
)
from layerwise.strategies.jobs.options import TrainOptions, check_launch_numbers
from layerwise.strategies.run import RunResult
from layerwise.strategies.runtime.worker import DEFAULT_TIMEOUT_SECONDS, RESULT_FILE
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

PROGRESS_LINES = 5  # progress lines logged per run: enough to see it move, not one per step


class TrainingFailed(RuntimeError):
    """torchrun exited non-zero; the message names the rank that failed first and its error."""


@task(name="train", cache_policy=NO_CACHE)
def train_strategy(model: str, strategy: str, options: TrainOptions, steps: int, out: Path,
                   deadline_s: float,
                   on_step: Callable[[StepProgress], None] | None = None) -> RunResult:
    """Train `model` under `strategy` (a strategy name or a strategy file) into the new folder
    `out` with the run `options`, stopping torchrun after `deadline_s` seconds; `on_step` gets
    every step's index and loss while training runs."""
    logger = get_run_logger()
    check_launch_numbers(steps, None, steps, DEFAULT_TIMEOUT_SECONDS)
    with new_job(model, strategy, options, out, analytic=options.profile is None) as job:
        total = total_steps(job, steps, None)
        command = torchrun_command(job, total, total, DEFAULT_TIMEOUT_SECONDS)
        for warning in job.warnings:
            logger.warning("%s", warning)
        write_run_folder(job)
        logger.info("torchrun: %d processes, %d steps, run folder %s", job.settings.nproc,
                    total, out)
        code = run_torchrun(command, job, on_line=lambda line: logger.info("%s", line),
                            on_progress=_progress_logger(logger, total, on_step),
                            deadline_s=deadline_s)
    if code != 0:
        raise TrainingFailed(failure_line(out, code, job.settings.nproc))
    return RunResult.load(out / RESULT_FILE)


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
