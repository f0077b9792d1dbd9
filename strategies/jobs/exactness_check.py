"""The exactness check of `layerwise verify` and the benchmark flow's verify stage.

Every strategy asked for becomes a training job in float64 (its own run folder under `out`), all of
them train K steps one after another in one torchrun launch (starting processes costs seconds, a few
small steps milliseconds), and each run's losses and final weights are compared with the plain
module trained on the same settings and batches (strategies/exactness/reference.py). The settings
differ only in the strategy, so one reference serves them all: it is trained first, saved once, and
each run's rank 0 compares against it in the worker, so no run writes its weights. The runs write no
checkpoint either: they are never resumed, and AlexNet's fifteen would take 14 GB of disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.exactness.reference import Divergence, reference_run
from layerwise.strategies.files.locations import DIVERGENCE_FILE, ERRORS_DIR, REFERENCE_FILE
from layerwise.strategies.jobs.defaults import DEFAULT_TIMEOUT_SECONDS
from layerwise.strategies.jobs.failure import RankFailure, failure_line
from layerwise.strategies.jobs.job import Job, job_graph, new_job
from layerwise.strategies.jobs.launch import (
    StepProgress,
    run_torchrun,
    torchrun_command,
    write_run_folder,
)
from layerwise.strategies.jobs.options import TrainOptions
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.processes.owned_folder import owned_folder
from layerwise.strategies.schedules import STRATEGY_NAMES

ALL = "all"


class VerifyFailed(RuntimeError):
    """The float64 runs could not be trained (a worker failed): not a verdict on exactness."""


class Skipped(BaseModel):
    """A strategy `all` named that does not apply to this model and process count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: str
    reason: str


class VerifyReport(BaseModel):
    """Every checked strategy's divergence from one-device training, and those skipped."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    nproc: int
    steps: int
    folder: str
    divergences: tuple[Divergence, ...]
    skipped: tuple[Skipped, ...] = ()

    @property
    def failed(self) -> tuple[Divergence, ...]:
        """The exact-by-design strategies whose runs left one device's results."""
        return tuple(d for d in self.divergences if d.exact is False)


def requested_strategies(spec: str) -> tuple[list[str], bool]:
    """The names in `spec` (comma-separated, or `all`) and whether `all` asked for them."""
    if spec.strip() == ALL:
        return list(STRATEGY_NAMES), True
    # each once: two runs of one name would claim one folder
    names = list(dict.fromkeys(name.strip() for name in spec.split(",") if name.strip()))
    if not names:
        raise LayerwiseError(f"--strategy: name one or more of {', '.join(STRATEGY_NAMES)} "
                             f"(comma-separated), a strategy file, or {ALL}")
    return names, False


def verify_strategies(model: str, strategies: Sequence[str], options: TrainOptions,
                      steps: int, out: Path, *, skip_inapplicable: bool = False,
                      on_progress: Callable[[str, StepProgress], None] | None = None,
                      deadline_s: float | None = None,
                      graph: LayerGraph | None = None) -> VerifyReport:
    """Train each strategy `steps` steps in float64 on `options.nproc` processes and measure
    its distance from one device; `skip_inapplicable` reports strategies that do not fit the
    model or process count instead of failing on them; `graph` is the model's layer graph for
    these options when the caller built it already."""
    if steps < 1:
        raise LayerwiseError(f"--steps must be >= 1 (got {steps})")
    if graph is None:  # one trace for all the strategies' jobs (seconds each for AlexNet)
        graph = job_graph(model, options)
    with contextlib.ExitStack() as claims:  # each run folder is held until the runs end
        jobs, skipped = _float64_jobs(model, strategies, options, out, skip_inapplicable,
                                      claims, graph)
        if not jobs:
            raise LayerwiseError(f"no strategy applies to {model} on {options.nproc} "
                                 "processes: "
                                 + "; ".join(f"{s.strategy}: {s.reason}" for s in skipped))
        for job in jobs:
            write_run_folder(job)
        # gigabytes for VGG-16: removed after the runs, or by the folder's sweeper if killed
        reference = claims.enter_context(owned_folder(".reference-", out)) / REFERENCE_FILE
        reference_run(jobs[0].settings, steps).save(reference)
        command = torchrun_command(jobs[0], steps, None, DEFAULT_TIMEOUT_SECONDS,
                                   also=[job.out for job in jobs[1:]], reference=reference)
        names = iter([job.strategy.name for job in jobs])
        current = [next(names)]

        def progress(step: StepProgress) -> None:
            if on_progress is not None:
                on_progress(current[0], step)
            if step.step == step.steps:
                current[0] = next(names, current[0])

        unwritten: list[RankFailure] = []
        code = run_torchrun(command, jobs[0], on_progress=progress, deadline_s=deadline_s,
                            on_failure=unwritten.append)
    if code != 0:
        failed = next((job for job in jobs if (job.out / ERRORS_DIR).is_dir()), jobs[0])
        raise VerifyFailed(f"verify {failed.settings.strategy}: "
                           + failure_line(failed.out, code, failed.settings.nproc,
                                          unwritten=unwritten))
    divergences = tuple(Divergence.model_validate_json(
        (job.out / DIVERGENCE_FILE).read_text(encoding="utf-8")) for job in jobs)
    return VerifyReport(model=model, nproc=jobs[0].settings.world, steps=steps,
                        folder=str(out), divergences=divergences, skipped=tuple(skipped))


def _float64_jobs(model: str, strategies: Sequence[str], options: TrainOptions, out: Path,
                  skip_inapplicable: bool, claims: contextlib.ExitStack,
                  graph: LayerGraph | None) -> tuple[list[Job], list[Skipped]]:
    """One checked float64 job per strategy, each in its own folder under `out`, held until
    `claims` closes."""
    jobs, skipped = [], []
    for name in strategies:
        folder = out / re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(name).stem if name.endswith(
            ".json") else name)
        try:
            job = claims.enter_context(
                new_job(model, name, options, folder, analytic=options.profile is None,
                        graph=graph))
        except LayerwiseError as error:
            if not skip_inapplicable:
                raise
            skipped.append(Skipped(strategy=name, reason=str(error)))
            continue
        jobs.append(dataclasses.replace(
            job, settings=job.settings.model_copy(update={"dtype": "float64"})))
    return jobs, skipped
