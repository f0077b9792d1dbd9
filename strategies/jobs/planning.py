"""One plan: the searched strategy beside every other strategy the user names, all priced on
one cost model, as `layerwise search` prints it (the flow's search task builds the same
strategies by name, strategies/jobs/named_strategies.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.cost.memory import FLOAT32_BYTES, memory_budget, predicted_memory
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.execution import LayerwiseExecution
from layerwise.strategies.jobs.named_strategies import strategy_by_name
from layerwise.strategies.jobs.pricing import cost_model
from layerwise.strategies.model.graph import LayerGraph, build_graph
from layerwise.strategies.model.input_size import InputSize
from layerwise.strategies.oracle.paradl import OracleCase, step_cases, summary_from_graph
from layerwise.strategies.schedules import SEARCHED, STRATEGY_NAMES
from layerwise.strategies.schedules.loader import schedule_report
from layerwise.strategies.search.elimination import SearchResult
from layerwise.strategies.search.named import searched_strategy
from layerwise.strategies.strategy import Strategy

SEARCH_SCHEMA_VERSION = 1
PARADL = "paradl"  # the --baselines entry that adds the ParaDL oracle's cases
# what --baselines accepts: every strategy but the searched one, and the oracle
BASELINE_CHOICES = (*(name for name in STRATEGY_NAMES if name != SEARCHED), PARADL)


@dataclass(frozen=True)
class Plan:
    """The optimal strategy and the costed baselines for one model, cluster and device count."""

    graph: LayerGraph
    cluster: str
    devices: int
    cost_source: str
    placement: str  # the one searched (auto resolves to aligned or origin)
    placement_note: str | None  # why auto searched less than the whole space
    search: SearchResult
    strategies: dict[str, Strategy]  # "layerwise" first, then the baselines
    skipped: dict[str, str]  # baselines that cannot run this model, with the reason
    memory_budget: int  # bytes a strategy may use per device (--memory-limit or the cluster's)
    paradl: tuple[OracleCase, ...] = ()  # with baseline "paradl": the oracle's step per strategy
    # a strategy's schedule report where its registry entry has one (a pipeline's stages)
    reports: dict[str, BaseModel] = field(default_factory=dict)
    # id of a strategy asked about -> it and its peaks: the memory model walks every tile of
    # every layer (0.1-0.2 s a strategy for Inception-v3 on 16 devices), asked twice each
    _peaks: dict[int, tuple[Strategy, list[int] | None]] = field(default_factory=dict)

    def peak_memory(self, strategy: Strategy) -> list[int] | None:
        """Each device's predicted peak in float32 training (`predicted_peaks`)."""
        if id(strategy) not in self._peaks:
            self._peaks[id(strategy)] = (strategy, predicted_peaks(self.graph, strategy))
        return self._peaks[id(strategy)][1]

    def fits(self, strategy: Strategy) -> bool | None:
        """Whether every device's predicted peak is within the budget (None: not predicted)."""
        peaks = self.peak_memory(strategy)
        return None if peaks is None else max(peaks) <= self.memory_budget

    def document(self) -> dict[str, Any]:
        """The `layerwise search --json` contract."""
        return {
            "schema_version": SEARCH_SCHEMA_VERSION,
            "model": self.graph.model,
            "structure_hash": self.graph.structure_hash,
            "devices": self.devices,
            "cluster": self.cluster,
            "batch": self.graph.batch,
            "cost_source": self.cost_source,
            "placement": self.placement,
            "placement_note": self.placement_note,
            "search_seconds": self.search.search_seconds,
            "search_method": self.search.search_method,
            "optimality_gap": self.search.optimality_gap,
            "final_graph_nodes": self.search.final_graph_nodes,
            "nodes_eliminated": self.search.nodes_eliminated,
            "edges_eliminated": self.search.edges_eliminated,
            "configs": self.search.configs,
            "configs_kept": self.search.configs_kept,
            "memory_budget_bytes": self.memory_budget,
            "memory_rounds": self.search.memory_rounds,
            "memory_bound": self.search.memory_bound,
            "strategies": {
                name: {
                    **strategy.predicted.model_dump(),
                    "samples_per_second": self.graph.batch / strategy.predicted.step_seconds,
                    "peak_memory_bytes_per_device": self.peak_memory(strategy),
                    "fits": self.fits(strategy),
                    "layers": [choice.model_dump() for choice in strategy.layers],
                    "recompute": list(strategy.recompute),
                }
                for name, strategy in self.strategies.items()
            },
            **({"skipped": self.skipped} if self.skipped else {}),
            **({"paradl": [case.model_dump() for case in self.paradl]} if self.paradl else {}),
            **{name: report.model_dump() for name, report in self.reports.items()},
            "held_layers": self.graph.held_notes,
        }


def predicted_peaks(graph: LayerGraph, strategy: Strategy,
                    momentum: bool = True) -> list[int] | None:
    """Each device's predicted peak in float32 training (cost/memory.py), for strategies the
    layer-wise runtime executes; None for a schedule's own engine (pipeline, local, OWT's
    hand-offs), which the memory model does not cover yet."""
    if not isinstance(strategy.execution, LayerwiseExecution):
        return None
    return [device.peak for device in predicted_memory(
        graph, strategy.assignment(), strategy.devices, FLOAT32_BYTES, momentum=momentum,
        recompute=strategy.recompute)]


def plan(model: str, devices: int, cluster_name: str, *, batch_per_device: int,
         image_size: InputSize | None, classes: int | None, in_channels: int | None,
         profile: Path | None, analytic: bool, baselines: list[str], placement: str,
         memory_limit: int | None = None, batch: int | None = None) -> Plan:
    """Search the optimal strategy and price every other named strategy on the same cost
    model; a name that cannot run this model is skipped with its reason. The global batch is
    `batch` when given (it may be smaller than `devices`), else `batch_per_device` on each
    device. Each strategy's predicted peak memory is held against `memory_limit` bytes per
    device, or the cluster device's memory less the reserve (cost/memory.py)."""
    unknown = sorted(set(baselines) - set(BASELINE_CHOICES))
    if unknown:
        raise LayerwiseError(
            f"unknown baseline(s) {', '.join(unknown)}; choose from {', '.join(BASELINE_CHOICES)}"
        )
    if devices < 1:
        raise LayerwiseError(f"--devices must be at least 1 (got {devices})")
    if batch is not None and batch < 1:
        raise LayerwiseError(f"--batch must be at least 1 (got {batch})")
    if batch is None and batch_per_device < 1:
        raise LayerwiseError(f"--batch-per-device must be at least 1 (got {batch_per_device})")
    graph = build_graph(model, batch=batch if batch is not None else batch_per_device * devices,
                        image_size=image_size, num_classes=classes, in_channels=in_channels)
    cost = cost_model(graph, cluster_name, devices, profile, analytic, placement)
    best, result = searched_strategy(cost, memory_limit)
    strategies = {SEARCHED: best}
    reports: dict[str, BaseModel] = {}
    skipped: dict[str, str] = {}
    for name in baselines:
        if name == PARADL:
            if graph.batch % devices:
                skipped[name] = (f"its cases take the same samples on every device; the batch "
                                 f"{graph.batch} does not divide over {devices} devices")
            continue
        try:
            strategy = strategy_by_name(name, cost)
            report = schedule_report(strategy, cost)
        except LayerwiseError as error:  # one strategy that cannot run this model
            skipped[name] = str(error)
            continue
        strategies[name] = strategy
        if report is not None:
            reports[name] = report
    return Plan(graph=graph, cluster=cost.cluster.name, devices=devices,
                cost_source=cost.compute.name, placement=cost.placement,
                placement_note=cost.placement_note, search=result,
                strategies=strategies, skipped=skipped, reports=reports,
                memory_budget=(result.memory_budget_bytes
                               if result.memory_budget_bytes is not None
                               else memory_budget(cost.cluster.device.memory_bytes)),
                paradl=paradl_step_cases(cost, graph.batch // devices)
                if PARADL in baselines and graph.batch % devices == 0 else ())


def paradl_step_cases(cost: CostModel, batch_per_device: int) -> tuple[OracleCase, ...]:
    """ParaDL's analytic cases for one step of the search's global batch on the same devices,
    cluster and t_c as the search: every strategy at that batch (oracle.step_cases)."""
    return step_cases(summary_from_graph(cost.graph, cost.compute), cost.cluster,
                      cost.devices, batch_per_device)
