"""Every strategy layerwise can name, one registry line per family: the vocabulary.

A family is a planner (its per-layer configs, its schedule and its predicted cost, for a
CostModel), an engine (one rank's share of a training step under that schedule) and an
execution type (the schedule as the Strategy JSON states it). The layer-wise family (the
searched strategy and the baselines, Jia et al. 2018) is planned in strategies/search/ and run
by the layer-wise engine; each strategy from the literature lives in its folder here.

This module is the vocabulary everything else reads: the names `--strategy`, `--baselines` and
the benchmark config accept (`STRATEGY_NAMES`), their help (`schedule_help`), which runs equal
one device's SGD (`INEXACT`, `is_exact`), and the `Execution` union `Strategy.execution` holds.
It names planners and engines by "module:attribute" paths and imports none of them: the loader
(strategies/schedules/loader.py), on the floor of the jobs and the worker, imports them when
asked for, so the worker imports no planner it does not run and a planner no engine.

Add a strategy
--------------
1. A folder `strategies/schedules/<name>/` with an `__init__.py` citing the paper and
   - `planner.py`: `build_strategy(name, cost) -> Strategy` (per-layer configs via
     `Strategy.from_assignment`, the execution, the predicted cost); it rejects other names;
   - if the per-layer configs alone do not say how it runs: `execution.py`, an
     `ExecutionBase` subclass (strategies/execution.py) with `kind: Literal["<name>"]` and the
     schedule's options, pure pydantic; and `engine.py`, a class built from an
     `EngineContext` that meets the `Engine` protocol (strategies/runtime/engine_protocol.py);
     and in `planner.py`, `reprice(strategy, cost) -> Strategy`: a strategy read from a file,
     checked as the engine will check it and priced for the run.
     Without them the layer-wise executor runs its configs (`LayerwiseExecution`), priced
     by Eq. 1. If its pricer reads tiles of configs outside the search space (OWT's passes
     of B/K rows), `profiled_configs(graph, devices)` in `planner.py` names them per layer,
     so that every profile times them. A schedule with more to say than its step's cost
     (a pipeline's stages and bubble) names `report(strategy, cost)` returning a pydantic model.
2. One entry in `SCHEDULES`: its names, the names inexact by design, and the paths above.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from operator import or_
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from layerwise.strategies.execution import ExecutionBase, LayerwiseExecution
from layerwise.strategies.schedules.local.execution import LocalExecution
from layerwise.strategies.schedules.owt.execution import OwtExecution
from layerwise.strategies.schedules.pipeline.execution import PipelineExecution

if TYPE_CHECKING:
    from layerwise.strategies.model.graph import LayerGraph
    from layerwise.strategies.strategy import Strategy

SEARCHED = "layerwise"  # the optimal layer-wise strategy (Algorithm 1)
LAYERWISE_ENGINE = "layerwise.strategies.runtime.layerwise_engine:LayerwiseEngine"
LAYERWISE_PRICE = "layerwise.strategies.schedules.loader:price_layerwise"


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """One strategy family: the names users give it, how it is planned, run and judged.

    `builder`, `engine`, `reprice` and `profiled` are "module:attribute" paths, imported only
    by the loader when used.
    """

    help: str  # one phrase for the CLI, citing the paper
    names: tuple[str, ...]  # what --strategy / --baselines accept
    builder: str  # (name, cost) -> Strategy
    execution: type[ExecutionBase] = LayerwiseExecution
    engine: str = LAYERWISE_ENGINE  # built from an EngineContext on every rank
    # (saved strategy, cost) -> the strategy checked and priced on cost's graph and devices
    reprice: str = LAYERWISE_PRICE
    inexact: tuple[str, ...] = ()  # names whose step is not one device's SGD step by design
    # (graph, devices) -> per layer, configs beyond the search space whose tiles `builder` reads
    profiled: str | None = None
    # (strategy, cost) -> a pydantic report of the schedule that `layerwise search` prints
    report: str | None = None

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError(f"schedule '{self.help}' names no strategy")
        if not set(self.inexact) <= set(self.names):
            raise ValueError(f"inexact names {self.inexact} are not among {self.names}")


SCHEDULES: tuple[Schedule, ...] = (
    Schedule(
        names=(SEARCHED, "data", "model", "owt", "spatial_h", "spatial_w", "spatial"),
        builder="layerwise.strategies.search.named:build_strategy",
        help="Jia et al. 2018: the searched optimum, and the baselines as one config per "
             "layer (owt: data-parallel convs, channel-parallel FC; spatial_h|w: height or "
             "width (a signal's length) splits; spatial: every spatial dim split)"),
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
        report="layerwise.strategies.schedules.pipeline.planner:pipeline_report",
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

STRATEGY_NAMES: tuple[str, ...] = tuple(SCHEDULED)  # every name, in the registry's order

INEXACT: frozenset[str] = frozenset(name for schedule in SCHEDULES for name in schedule.inexact)

Execution = Annotated[
    reduce(or_, dict.fromkeys(schedule.execution for schedule in SCHEDULES)),
    Field(discriminator="kind"),
]


def schedule_of(execution: ExecutionBase) -> Schedule:
    """The first entry whose execution type `execution` is: the one whose engine runs it."""
    return next(schedule for schedule in SCHEDULES if type(execution) is schedule.execution)


def is_exact(strategy: Strategy, graph: LayerGraph) -> bool:
    """Whether a step under `strategy` equals one device's SGD step (up to rounding).

    Not: the INEXACT ones by design, nor an execution that is not on this graph
    (`ExecutionBase.exact_on`: a pipeline with BatchNorm across devices or micro-batches).
    """
    return strategy.name not in INEXACT and strategy.execution.exact_on(graph)


def schedule_help() -> str:
    """Every strategy name for a CLI help text: each family's names, then its phrase."""
    return "; ".join(f"{'|'.join(schedule.names)} ({schedule.help})" for schedule in SCHEDULES)
