"""Training task: one `layerwise train` run on local torchrun processes, inside the flow.

It goes through the CLI's own machinery (flows/cli_train.py): the same checks before any
process starts, the same run folder (strategy.json, train.json, graph.json, checkpoints,
model.pt, result.json, torchrun.log), the same torchrun command in its own process group. What
the task adds: rank 0's output goes to the Prefect run logger, and a deadline stops the whole
process group (a Prefect timeout cannot interrupt a blocked read of a subprocess's output).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.cli_train import (
    check_numbers,
    failure_line,
    new_job,
    run_torchrun,
    torchrun_command,
    total_steps,
    write_run_folder,
)
from strategies.run import RunResult
from strategies.runtime.worker import (
    DEFAULT_TIMEOUT_SECONDS,
    PROGRESS_PREFIX,
    RESULT_FILE,
)

PROGRESS_LINES = 5  # progress lines logged per run: enough to see it move, not one per step


class TrainingFailed(RuntimeError):
    """torchrun exited non-zero; the message names the rank that failed first and its error."""


@task(name="train", cache_policy=NO_CACHE)
def train_strategy(model: str, strategy: str, options: dict[str, Any], steps: int, out: Path,
                   deadline_s: float) -> RunResult:
    """Train `model` under `strategy` (a baseline name or a strategy file) into the new folder
    `out`; `options` are `layerwise train`'s run options (nproc, dataset, batch_per_device,
    image_size, classes, in_channels, lr, momentum, weight_decay, seed, cluster, profile)."""
    logger = get_run_logger()
    check_numbers(options, steps, None, steps, DEFAULT_TIMEOUT_SECONDS)
    job = new_job(model, strategy, options, out, analytic=options.get("profile") is None)
    total = total_steps(job, steps, None)
    command = torchrun_command(job, total, total, DEFAULT_TIMEOUT_SECONDS, None, None)
    write_run_folder(job)
    logger.info("torchrun: %d processes, %d steps, run folder %s", job.settings.nproc, total,
                out)
    code = run_torchrun(command, job, _forward_to(logger, total), deadline_s)
    if code != 0:
        raise TrainingFailed(failure_line(out, code, range(job.settings.nproc)))
    return RunResult.load(out / RESULT_FILE)


def _forward_to(logger: Any, total: int) -> Callable[[IO[str]], None]:
    """A follower that logs every output line, and rank 0's progress a few times per run."""
    every = max(1, total // PROGRESS_LINES)

    def follow(lines: IO[str]) -> None:
        for line in lines:
            if not line.startswith(PROGRESS_PREFIX):
                logger.info("%s", line.rstrip("\n"))
                continue
            progress = json.loads(line[len(PROGRESS_PREFIX):])
            if progress["step"] % every == 0 or progress["step"] == progress["steps"]:
                logger.info("step %d/%d loss %.4f", progress["step"], progress["steps"],
                            progress["loss"])

    return follow
