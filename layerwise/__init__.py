"""layerwise: per-layer parallelization of CNN training (Jia et al., ICML 2018).

The distribution installs this one import namespace. Its parts are the repository's top-level
folders, mapped under it by the build (setup.py): `layerwise.strategies` (the domain core:
torch, numpy, pydantic), `layerwise.tasks` (Prefect tasks) and `layerwise.flows` (Prefect flows
and the `layerwise` command). This module is the small API for notebooks and scripts: the same
jobs the command runs, without Prefect or MLflow.

    >>> import layerwise
    >>> graph = layerwise.build_graph("lenet5", batch=8, image_size=28, num_classes=10)
    >>> len(graph.layers)
    10
    >>> best = layerwise.search("lenet5", devices=2, cluster="local", batch_per_device=4)
    >>> sorted(best.strategies) == ["data", "layerwise"] and best.search.configs > 0
    True
    >>> result = layerwise.train("tiny_cnn", "data", nproc=2, steps=2,
    ...                          image_size=8, batch_per_device=2)     # doctest: +SKIP
    >>> report = layerwise.verify("tiny_cnn", ["data"], nproc=2, steps=2,
    ...                           image_size=8, batch_per_device=2)   # doctest: +SKIP
    >>> report.failed                                                  # doctest: +SKIP
    ()
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerwise.strategies.jobs.defaults import DEFAULT_BATCH_PER_DEVICE, DEFAULT_VERIFY_STEPS

if TYPE_CHECKING:
    from layerwise.strategies.jobs.exactness_check import VerifyReport
    from layerwise.strategies.jobs.planning import Plan
    from layerwise.strategies.model.graph import LayerGraph
    from layerwise.strategies.training_run import RunResult

__all__ = ["build_graph", "search", "train", "verify"]


def build_graph(model: str, batch: int, image_size: int | tuple[int, ...] | None = None,
                num_classes: int | None = None, in_channels: int | None = None) -> LayerGraph:
    """The layer graph of a zoo model or a `package.module:factory` reference at a global
    batch: its layers, edges, shapes and FLOPs (`layerwise graph`). `image_size` is a side of
    every spatial dim, or each dim's size: (L,) of a signal, (D, H, W) of a volume."""
    from layerwise.strategies.model.graph import build_graph as build

    return build(model, batch=batch, image_size=image_size, num_classes=num_classes,
                 in_channels=in_channels)


def search(model: str, devices: int, cluster: str, *,
           batch_per_device: int = DEFAULT_BATCH_PER_DEVICE,
           baselines: Sequence[str] = ("data",), profile: str | Path | None = None,
           image_size: int | tuple[int, ...] | None = None, classes: int | None = None,
           in_channels: int | None = None, placement: str = "auto",
           memory_limit: int | None = None, batch: int | None = None) -> Plan:
    """The optimal layer-wise strategy for `model` on `devices` devices of `cluster` (a preset
    or a YAML file), beside the named `baselines`, all priced by Eq. 1 with t_c from `profile`
    (a `layerwise profile` file) or the cluster device's analytic model (`layerwise search`),
    within `memory_limit` bytes per device (default: the cluster device's memory less a 10%
    reserve), at a global `batch` when given (it may be smaller than `devices`), else at
    `batch_per_device` per device. `plan.strategies["layerwise"].save(path)` writes the file
    `train` takes."""
    from layerwise.strategies.jobs.planning import plan

    return plan(model, devices, cluster, batch_per_device=batch_per_device,
                image_size=image_size, classes=classes, in_channels=in_channels,
                profile=Path(profile) if profile is not None else None,
                analytic=profile is None, baselines=list(baselines), placement=placement,
                memory_limit=memory_limit, batch=batch)


def train(model: str, strategy: str, *, nproc: int, steps: int, out: str | Path | None = None,
          **options: Any) -> RunResult:
    """Train `model` under `strategy` (a name or a strategy file) on `nproc` local torchrun
    processes for `steps` steps into the run folder `out` (default: a new one under runs/),
    and return what the run measured (`layerwise train`). `options` are TrainOptions' fields:
    dataset, batch_per_device, image_size, classes, lr, seed, cluster, profile, ...
    TrainingFailed names the rank that failed first."""
    from layerwise.strategies.jobs.defaults import (
        DEFAULT_CHECKPOINT_EVERY,
        DEFAULT_TIMEOUT_SECONDS,
    )
    from layerwise.strategies.jobs.job import new_job
    from layerwise.strategies.jobs.launch import run_job
    from layerwise.strategies.jobs.options import TrainOptions, check_launch_numbers

    check_launch_numbers(steps, None, DEFAULT_CHECKPOINT_EVERY, DEFAULT_TIMEOUT_SECONDS)
    settings = TrainOptions.given(nproc=nproc, **options)
    with new_job(model, strategy, settings, Path(out) if out is not None else None,
                 analytic=settings.profile is None) as job:
        return run_job(job, steps, None, DEFAULT_CHECKPOINT_EVERY, DEFAULT_TIMEOUT_SECONDS)


def verify(model: str, strategies: Sequence[str], *, nproc: int,
           steps: int = DEFAULT_VERIFY_STEPS,
           out: str | Path = Path("runs") / "verify", **options: Any) -> VerifyReport:
    """Prove `strategies` exact: each trains `steps` steps in float64 on `nproc` processes, the
    plain module the same steps on one, and every loss and weight is compared (`layerwise
    verify`). `report.failed` lists the exact-by-design strategies that left one device."""
    from layerwise.strategies.jobs.exactness_check import verify_strategies
    from layerwise.strategies.jobs.options import TrainOptions

    return verify_strategies(model, list(strategies), TrainOptions.given(nproc=nproc, **options),
                             steps, Path(out))
