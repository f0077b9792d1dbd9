"""Verify task: the exactness of the strategies a benchmark trains, in float64, before training.

The same check as `layerwise verify` (layerwise.strategies.jobs.exactness_check): each strategy file
the search wrote trains a few steps in float64 on the benchmark's processes (one torchrun launch for
all), the plain module the same steps on one process, and every loss and weight is compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from layerwise.strategies.jobs.exactness_check import VerifyReport, verify_strategies
from layerwise.strategies.jobs.launch import StepProgress
from layerwise.strategies.jobs.options import TrainOptions
from layerwise.strategies.model.graph import LayerGraph


@task(name="verify", cache_policy=NO_CACHE)
def verify_exactness(model: str, strategy_files: Sequence[Path], options: TrainOptions,
                     steps: int, out: Path, deadline_s: float,
                     graph: LayerGraph | None = None) -> VerifyReport:
    """Every strategy's divergence from one-process training after `steps` float64 steps
    (`graph`: the model's layer graph for these options, when the flow built it)."""
    logger = get_run_logger()
    logger.info("training %d strategies %d steps each in float64 on %s processes, then the "
                "plain module on one", len(strategy_files), steps, options.nproc)

    def log(name: str, progress: StepProgress) -> None:
        if progress.step == progress.steps:
            logger.info("%s: %d float64 steps done", name, progress.steps)

    report = verify_strategies(model, [str(path) for path in strategy_files], options, steps,
                               out, on_progress=log, deadline_s=deadline_s, graph=graph)
    for divergence in report.divergences:
        verdict = {True: "exact", False: "DIFFERS", None: "inexact by design"}[divergence.exact]
        logger.info("%s: largest difference %.1e (%s), %s", divergence.strategy,
                    divergence.largest, divergence.worst_parameter, verdict)
    return report
