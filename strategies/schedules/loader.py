"""The registry's planners, pricers and engines, imported when a name is planned or run.

The registry (strategies/schedules/__init__.py) names them by "module:attribute" paths; this
module, on the top floor of the core with the jobs and the torchrun worker, is the one place
those paths are imported, so nothing below it reaches a planner or an engine at run time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.execution import LayerwiseExecution
from layerwise.strategies.model.space import ParallelConfig, enumerate_configs
from layerwise.strategies.schedules import SCHEDULED, SCHEDULES, STRATEGY_NAMES, schedule_of

if TYPE_CHECKING:
    from layerwise.strategies.cost.cost_model import CostModel
    from layerwise.strategies.model.graph import LayerGraph
    from layerwise.strategies.runtime.engine_protocol import Engine, EngineContext
    from layerwise.strategies.strategy import Strategy


def load(path: str) -> Any:
    """The attribute a "module:attribute" path names, importing its module."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def build_strategy(name: str, cost: CostModel) -> Strategy:
    """The named strategy for `cost`'s graph and devices, with its predicted cost."""
    if name not in SCHEDULED:
        raise ConfigError(f"unknown strategy '{name}'; choose from {', '.join(STRATEGY_NAMES)}")
    return load(SCHEDULED[name].builder)(name, cost)


def build_engine(context: EngineContext) -> Engine:
    """This rank's engine for `context.strategy`: the one its execution type names."""
    return load(schedule_of(context.strategy.execution).engine)(context)


def price_layerwise(strategy: Strategy, cost: CostModel) -> Strategy:
    """A layer-wise strategy (its configs already checked against the graph) priced by Eq. 1
    on `cost`'s cluster and t_c, its recomputed layers' forwards included."""
    return strategy.model_copy(update={"cluster": cost.cluster.name,
                                       "cost_source": cost.compute.name,
                                       "predicted": cost.evaluate(strategy.assignment(),
                                                                  strategy.recompute)})


def repriced(strategy: Strategy, cost: CostModel) -> Strategy:
    """A strategy read from a file, checked for `cost`'s graph and devices and priced there by
    its schedule's pricer: the prediction a file holds is of the batch, cluster and device
    count it was made for, and a schedule's rules (OWT's workers, a pipeline's micro-batches,
    one local block per process) would otherwise first fail inside the workers.

    The per-layer configs must be those its schedule implies; ConfigError (one line) if not.
    """
    schedule = schedule_of(strategy.execution)
    if schedule.execution is not LayerwiseExecution and strategy.devices != cost.devices:
        raise ConfigError(
            f"strategy '{strategy.name}' ({strategy.execution.describe()}) was planned for "
            f"{strategy.devices} processes, not {cost.devices}; pass --strategy "
            f"{strategy.name} to plan it for {cost.devices}, or train on {strategy.devices}")
    fresh: Strategy = load(schedule.reprice)(strategy, cost)
    saved, expected = strategy.assignment(), fresh.assignment()
    for name, config in expected.items():
        if saved[name] != config:
            raise ConfigError(
                f"strategy '{strategy.name}' gives layer '{name}' {saved[name].text}, but its "
                f"schedule runs it as {config.text}; pass --strategy {fresh.name} to plan it "
                "again rather than edit its layers")
    return fresh


def profiled_configs(graph: LayerGraph, devices: int) -> dict[str, list[ParallelConfig]]:
    """Per layer, every config a profile on `devices` devices times: the layer's search space,
    and the configs beyond it whose tiles some schedule's pricer reads."""
    configs = {layer.name: enumerate_configs(layer, devices) for layer in graph.layers}
    for schedule in SCHEDULES:
        if schedule.profiled is not None:
            for name, extra in load(schedule.profiled)(graph, devices).items():
                configs[name].extend(extra)
    return configs


def schedule_report(strategy: Strategy, cost: CostModel) -> BaseModel | None:
    """The report of `strategy`'s schedule on `cost` where its registry entry names one."""
    schedule = schedule_of(strategy.execution)
    return None if schedule.report is None else load(schedule.report)(strategy, cost)
