"""Strategies from the literature that run with their own schedule, by the name users give.

Each name belongs to a module that builds its Strategy (per-layer configs, its Execution and
its own predicted cost) with `build_strategy(name, cost)`; the module is imported only when
asked for. `layerwise train --strategy NAME`, `layerwise search --baselines NAME` and the
benchmark flow take these names next to `layerwise` and the baselines.
"""

from __future__ import annotations

import importlib

from strategies.cost import CostModel
from strategies.errors import ConfigError
from strategies.graph import LayerGraph
from strategies.strategy import Strategy

SCHEDULED: dict[str, str] = {
    "owt_a": "strategies.owt",  # Krizhevsky 2014, all-gather hand-off
    "owt_b": "strategies.owt",  # broadcast of one worker's batch per turn
    "owt_c": "strategies.owt",  # 1/K of every batch to all, K rounds
    "owt_a_vb": "strategies.owt",  # the same with the variable batch size
    "owt_b_vb": "strategies.owt",
    "owt_c_vb": "strategies.owt",
    "pipeline": "strategies.partition",  # Akintoye et al.: stages, 1F1B micro-batches
    "local": "strategies.local",  # Laskin et al.: greedy local updates
    "local_overlap": "strategies.local",  # blocks also learn from the next block's loss
}


# Not plain SGD on the global batch, so not equal to one-device training by design: local
# updates (Laskin et al.) and OWT's variable batch size (FC weights step K times per step).
INEXACT: frozenset[str] = frozenset({"local", "local_overlap", "owt_b_vb", "owt_c_vb"})


def is_exact(strategy: Strategy, graph: LayerGraph) -> bool:
    """Whether a step under `strategy` equals one device's SGD step (up to rounding).

    Not: the INEXACT ones by design; a pipeline of a model with BatchNorm unless its one
    micro-batch runs on one device per stage (BatchNorm normalises each device's rows of each
    micro-batch, as GPipe does, strategies/runtime/pipeline.py).
    """
    if strategy.name in INEXACT:
        return False
    execution = strategy.execution
    if execution.kind != "pipeline" or execution.micro_batches == 1 and all(
            len(stage.devices) == 1 for stage in execution.stages):
        return True
    return not any("BatchNorm" in layer.label for layer in graph.layers)


def scheduled_strategy(name: str, cost: CostModel) -> Strategy:
    """The named strategy for `cost`'s graph and devices, with its predicted cost."""
    if name not in SCHEDULED:
        raise ConfigError(f"unknown strategy '{name}'; choose from {', '.join(SCHEDULED)}")
    return importlib.import_module(SCHEDULED[name]).build_strategy(name, cost)
