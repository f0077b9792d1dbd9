"""The strategies from the literature, one folder each, and the registry that names them.

A strategy from a paper is a planner (its per-layer configs, its schedule and its predicted
cost, for a CostModel), an engine (one rank's share of a training step under that schedule) and
an execution type (the schedule as the Strategy JSON states it). Each lives in its folder here;
`SCHEDULES` holds one entry per folder, and everything else reads it: the names
`layerwise train --strategy` and `layerwise search --baselines` accept (`SCHEDULED`,
`scheduled_strategy`), their help (`schedule_help`), which runs equal one device's SGD
(`INEXACT`, `is_exact`), the `Execution` union `Strategy.execution` holds, and the engine the
torchrun worker builds (strategies/runtime/engine.py). Planners and engines are imported by
path when asked for, so the worker imports no planner it does not run and a planner no engine;
execution types are imported here, as the Strategy contract needs them all.

Add a strategy
--------------
1. A folder `strategies/schedules/<name>/` with an `__init__.py` citing the paper and
   - `planner.py`: `build_strategy(name, cost) -> Strategy` (per-layer configs via
     `Strategy.from_assignment`, the execution, the predicted cost); it rejects other names;
   - if the per-layer configs alone do not say how it runs: `execution.py`, an
     `ExecutionBase` subclass (strategies/execution.py) with `kind: Literal["<name>"]` and the
     schedule's options, pure pydantic; and `engine.py`, a class built from an
     `EngineContext` that meets the `Engine` protocol (strategies/runtime/engine_base.py);
     and in `planner.py`, `reprice(strategy, cost) -> Strategy`: a strategy read from a file,
     checked as the engine will check it and priced for the run (`repriced`).
     Without them the layer-wise executor runs its configs (`LayerwiseExecution`), priced
     by Eq. 1. If its pricer reads tiles of configs outside the search space (OWT's passes
     of B/K rows), `profiled_configs(graph, devices)` in `planner.py` names them per layer,
     so that every profile times them.
2. One entry in `SCHEDULES`: its names, the names inexact by design, and the paths above.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import reduce
from operator import or_
from typing import TYPE_CHECKING, Annotated, Any

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.execution import ExecutionBase, LayerwiseExecution
from layerwise.strategies.schedules.local.execution import LocalExecution
from layerwise.strategies.schedules.owt.execution import OwtExecution
from layerwise.strategies.schedules.pipeline.execution import PipelineExecution
from pydantic import Field

if TYPE_CHECKING:
    from layerwise.strategies.cost import CostModel
    from layerwise.strategies.graph import LayerGraph
    from layerwise.strategies.runtime.engine_base import Engine, EngineContext
    from layerwise.strategies.space import ParallelConfig
    from layerwise.strategies.strategy import Strategy

LAYERWISE_ENGINE = "layerwise.strategies.runtime.engine:LayerwiseEngine"
LAYERWISE_PRICE = "layerwise.strategies.schedules:price_layerwise"


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """One strategy family: the names users give it, how it is planned, run and judged.

    `builder` and `engine` are "module:attribute" paths, imported only when used.
    """

    help: str  # one phrase for the CLI, citing the paper
    names: tuple[str, ...] = ()  # what --strategy / --baselines accept; none: not built by name
    builder: str | None = None  # (name, cost) -> Strategy
    execution: type[ExecutionBase] = LayerwiseExecution
    engine: str = LAYERWISE_ENGINE  # built from an EngineContext on every rank
    # (saved strategy, cost) -> the strategy checked and priced on cost's graph and devices
    reprice: str = LAYERWISE_PRICE
    inexact: tuple[str, ...] = ()  # names whose step is not one device's SGD step by design
    # (graph, devices) -> per layer, configs beyond the search space whose tiles `builder` reads
    profiled: str | None = None

    def __post_init__(self) -> None:
        if self.names and self.builder is None:
            raise ValueError(f"schedule {self.names} names no builder")
        if not set(self.inexact) <= set(self.names):
            raise ValueError(f"inexact names {self.inexact} are not among {self.names}")

    def build(self, name: str, cost: CostModel) -> Strategy:
        """The strategy `name` for `cost`'s graph and devices, with its predicted cost."""
        assert self.builder is not None  # `SCHEDULED` holds only schedules with a builder
        return _load(self.builder)(name, cost)

    def build_engine(self, context: EngineContext) -> Engine:
        """This rank's engine for `context.strategy`."""
        return _load(self.engine)(context)


SCHEDULES: tuple[Schedule, ...] = (
    Schedule(help="Jia et al. 2018: every layer's tiles as its config says"),
    Schedule(
        names=("owt_a", "owt_b", "owt_c", "owt_a_vb", "owt_b_vb", "owt_c_vb"),
        inexact=("owt_b_vb", "owt_c_vb"),  # FC weights step K times per step
        execution=OwtExecution,
        builder="layerwise.strategies.schedules.owt.planner:build_strategy",
        reprice="layerwise.strategies.schedules.owt.planner:reprice",
        engine="layerwise.strategies.schedules.owt.engine:OwtEngine",
        profiled="layerwise.strategies.schedules.owt.planner:profiled_configs",
        help="Krizhevsky 2014's one weird trick: sample-parallel convs, channel-parallel FC, "
             "hand-off a all-gather, b broadcast per turn, c 1/K per round; _vb variable batch"),
    Schedule(
        names=("pipeline",),
        execution=PipelineExecution,
        builder="layerwise.strategies.schedules.pipeline.planner:build_strategy",
        reprice="layerwise.strategies.schedules.pipeline.planner:reprice",
        engine="layerwise.strategies.schedules.pipeline.engine:PipelineEngine",
        help="Akintoye et al. 2023: contiguous stages, 1F1B micro-batches"),
    Schedule(
        names=("local", "local_overlap"),
        inexact=("local", "local_overlap"),  # local losses, not global backprop
        execution=LocalExecution,
        builder="layerwise.strategies.schedules.local.planner:build_strategy",
        reprice="layerwise.strategies.schedules.local.planner:reprice",
        engine="layerwise.strategies.schedules.local.engine:LocalEngine",
        help="Laskin et al. 2020: blocks with local losses, greedy or overlapping"),
)

SCHEDULED: dict[str, Schedule] = {name: schedule for schedule in SCHEDULES
                                  for name in schedule.names}

INEXACT: frozenset[str] = frozenset(name for schedule in SCHEDULES for name in schedule.inexact)

Execution = Annotated[
    reduce(or_, dict.fromkeys(schedule.execution for schedule in SCHEDULES)),
    Field(discriminator="kind"),
]


def _load(path: str) -> Any:
    """The attribute a "module:attribute" path names, importing its module."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def schedule_of(execution: ExecutionBase) -> Schedule:
    """The first entry whose execution type `execution` is: the one whose engine runs it."""
    return next(schedule for schedule in SCHEDULES if type(execution) is schedule.execution)


def is_exact(strategy: Strategy, graph: LayerGraph) -> bool:
    """Whether a step under `strategy` equals one device's SGD step (up to rounding).

    Not: the INEXACT ones by design, nor an execution that is not on this graph
    (`ExecutionBase.exact_on`: a pipeline with BatchNorm across devices or micro-batches).
    """
    return strategy.name not in INEXACT and strategy.execution.exact_on(graph)


def price_layerwise(strategy: Strategy, cost: CostModel) -> Strategy:
    """A layer-wise strategy (its configs already checked against the graph) priced by Eq. 1
    on `cost`'s cluster and t_c."""
    return strategy.model_copy(update={"cluster": cost.cluster.name,
                                       "cost_source": cost.compute.name,
                                       "predicted": cost.evaluate(strategy.assignment())})


def repriced(strategy: Strategy, cost: CostModel) -> Strategy:
    """A strategy read from a file, checked for `cost`'s graph and devices and priced there by
    its schedule's pricer: the prediction a file holds is of the batch, cluster and device
    count it was made for, and a schedule's rules (OWT's workers, a pipeline's micro-batches,
    one local block per process) would otherwise first fail inside the workers.

    The per-layer configs must be those its schedule implies; ConfigError (one line) if not.
    """
    schedule = schedule_of(strategy.execution)
    if schedule.names and strategy.devices != cost.devices:
        raise ConfigError(
            f"strategy '{strategy.name}' ({strategy.execution.describe()}) was planned for "
            f"{strategy.devices} processes, not {cost.devices}; pass --strategy "
            f"{strategy.name} to plan it for {cost.devices}, or train on {strategy.devices}")
    fresh: Strategy = _load(schedule.reprice)(strategy, cost)
    saved, expected = strategy.assignment(), fresh.assignment()
    for name, config in expected.items():
        if saved[name] != config:
            raise ConfigError(
                f"strategy '{strategy.name}' gives layer '{name}' {saved[name].text}, but its "
                f"schedule runs it as {config.text}; pass --strategy {fresh.name} to plan it "
                "again rather than edit its layers")
    return fresh


def scheduled_strategy(name: str, cost: CostModel) -> Strategy:
    """The named strategy for `cost`'s graph and devices, with its predicted cost."""
    if name not in SCHEDULED:
        raise ConfigError(f"unknown strategy '{name}'; choose from {', '.join(SCHEDULED)}")
    return SCHEDULED[name].build(name, cost)


def profiled_configs(graph: LayerGraph, devices: int) -> dict[str, list[ParallelConfig]]:
    """Per layer, the configs beyond its search space on `devices` devices whose tiles some
    schedule's pricer reads: a profile times them too."""
    configs: dict[str, list[ParallelConfig]] = {}
    for schedule in SCHEDULES:
        if schedule.profiled is not None:
            for name, extra in _load(schedule.profiled)(graph, devices).items():
                configs.setdefault(name, []).extend(extra)
    return configs


def schedule_help() -> str:
    """The scheduled strategies for a CLI help text: each family's names, then its phrase."""
    return "; ".join(f"{'|'.join(schedule.names)} ({schedule.help})"
                     for schedule in SCHEDULES if schedule.names)
