"""The optimal strategy within each device's memory: Lagrangian relaxation over the elimination.

The unconstrained optimum comes first; when its predicted peak (cost/memory.py) fits every
device's budget B it is the answer. Otherwise the search minimises Eq. 1's step time T(s)
subject to each device's forward-end and backward-end bytes being at most B (the peak is the
largest moment, so both must fit). Those moments are sums over the layers of what each tile puts
on its device, plus terms the producers' configs decide (input copies, input gradients) and the
backward's workspace. Per (layer, config, device) the tile's own part a_r(c, d) is a lower bound
of its share of moment r (`TileTerms`), so for multipliers lambda >= 0

    L(lambda) = min_s T(s) + sum_{r, d} lambda_{r,d} (sum_layers a_r(c_layer, d) + inputs - B)

is a lower bound of the constrained optimum (Lagrangian duality: every plan that fits makes the
bracket non-positive). Each L(lambda) is one run of the exact elimination with the multiplied bytes
added to the node vectors. A layer may also recompute its forward in the backward: its tile then
holds nothing of what its ops save for the backward (a_forward_end less those bytes) for the
tile's forward more (cost_model.recompute_seconds). The choice is the layer's own, touching
no edge, so each node's entry is the cheaper of keeping and recomputing under the multipliers, and
the elimination stays exact over the doubled space. The multipliers follow the subgradient of the
exact predicted moments (Polyak's step towards the best plan that fits so far), so that a plan whose
copies and workspace the per-tile bytes miss is still pushed under B. Every plan met is checked with
the whole memory model; the answer is the fastest that fits, with its proven gap to the best lower
bound. Our own code: the multipliers ride on the elimination, which no library provides.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.cost.memory import (
    FLOAT32_BYTES,
    DeviceMemory,
    any_plan_bound,
    predicted_memory,
    step_input_bytes,
    tile_terms,
)
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.model.graph import Layer, LayerGraph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.tiles import config_boxes
from layerwise.strategies.search.baselines import BASELINES, baseline
from layerwise.strategies.search.elimination import (
    SearchResult,
    graph_costs,
    optimal_strategy,
    solve,
)

ROUNDS = 40  # subgradient steps at most; the search stops earlier at GAP_TOLERANCE
REPAIR_MOVES = 200  # config changes one repair may make
EXACT_CANDIDATES = 3  # changes per repair move checked with the whole memory model
REST_CHECKS = 64  # changes no better by per-tile bytes one repair move checks, at most
REPAIRS = 3  # plans repaired at most (the rounds' distinct plans that do not fit)
# The fit's share of a search: rounds and repairs stop here, keeping the best plan found and
# its proven gap (ResNet-50 on 16 devices: the whole memory model of one plan takes 0.2 s)
FIT_SECONDS = 30.0
POTENTIAL_POWER = 8  # how much more the fullest devices weigh in a repair's choice of change
GAP_TOLERANCE = 0.01  # a plan within 1% of the lower bound is taken as optimal
MOMENTS = ("forward_end", "backward_end")


Checked = tuple[float, tuple[DeviceMemory, ...]]  # a plan's step seconds and devices' bytes
_Plan = tuple[dict[str, int], frozenset[str]]  # config index per layer, the layers recomputed


class DoesNotFit(LayerwiseError):
    """No plan the search found fits the budget; says what the least need is."""


@dataclass(frozen=True)
class Fit:
    """The fastest plan found within the budget and how far from optimal it is proven."""

    choice: dict[str, int]  # config index per layer
    recompute: frozenset[str]  # layers whose forward the backward runs again
    step_seconds: float
    lower_bound: float  # no plan within the budget is faster
    rounds: int
    peak: int  # its fullest device's predicted bytes

    @property
    def gap(self) -> float:
        return max(0.0, (self.step_seconds - self.lower_bound) / self.step_seconds)


@dataclass(frozen=True)
class _TileBytes:
    """A layer's per-tile bytes over its search space: a_r(c, d) per (moment, config, device),
    and the part of a_forward_end that recomputing the layer frees (zero where it may not)."""

    rows: np.ndarray
    freed: np.ndarray  # (moment, config, device): what its ops save, on the forward-end row

    def held(self, index: int, recomputed: bool) -> np.ndarray:
        """(moment, device) bytes of config `index`, kept or recomputed."""
        return self.rows[:, index, :] - (self.freed[:, index, :] if recomputed else 0.0)

    def least(self) -> np.ndarray:
        """(moment, config, device) bytes with each config's leaner choice."""
        return self.rows - self.freed


def _tile_bytes(graph: LayerGraph, layer: Layer, configs: list[ParallelConfig], devices: int,
                element_bytes: int) -> _TileBytes:
    """Each config's tile bytes on each device, and what recomputing the layer frees."""
    rows = np.zeros((len(MOMENTS), len(configs), devices))
    freed = np.zeros_like(rows)
    if layer.kind == "input":
        return _TileBytes(rows, freed)
    may_recompute = layer.name not in graph.outputs
    for index, config in enumerate(configs):
        for device, box in config_boxes(layer, config).items():
            own = tile_terms(layer, config, box, element_bytes)
            rows[0, index, device] = own.forward_end
            rows[1, index, device] = own.backward_end
            if may_recompute:
                freed[0, index, device] = own.saved
    return _TileBytes(rows, freed)


def _least_need(graph: LayerGraph, tiles: dict[str, _TileBytes], inputs: int
                ) -> tuple[int, str]:
    """A lower bound of any plan's fullest device, and the layer that sets it: every plan puts
    each layer under some config, kept or recomputed, whose fullest device holds at least its
    tile's own bytes and the step's inputs."""
    need, layer_name = inputs, graph.layers[0].name
    for layer in graph.layers:
        layer_need = int(tiles[layer.name].least().max(axis=(0, 2)).min()) + inputs
        if layer_need > need:
            need, layer_name = layer_need, layer.name
    return need, layer_name


def fastest_within(cost_model: CostModel, budget: int, element_bytes: int = FLOAT32_BYTES,
                   progress: Callable[[str], None] | None = None) -> Fit:
    """The fastest plan whose every device's predicted peak is at most `budget` bytes.

    DoesNotFit when none is found: with the least memory any plan needs (and its layer)
    when that is over the budget, else with the least the search found."""
    graph = cost_model.graph
    devices = cost_model.devices
    tile_bytes = {layer.name: _tile_bytes(graph, layer, cost_model.configs[layer.name], devices,
                                          element_bytes) for layer in graph.layers}
    inputs = step_input_bytes(graph, element_bytes)
    need, needing_layer = _least_need(graph, tile_bytes, inputs)
    if need > budget:
        raise DoesNotFit(
            f"no plan fits {_mb(budget)} per device: every plan needs at least {_mb(need)} "
            f"on some device ({needing_layer} alone); use more devices, a smaller batch or "
            f"input, or a larger --memory-limit")
    nodes, edges = graph_costs(cost_model, progress)
    # what recomputing adds to each config's t_c (inf where it frees nothing or may not)
    extra = {layer.name: np.where(
                 tile_bytes[layer.name].freed[0].any(axis=1),
                 cost_model.recompute_seconds(layer, cost_model.configs[layer.name]), np.inf)
             for layer in graph.layers}
    order = [layer.name for layer in graph.layers]
    scaled = {name: _TileBytes(bytes_.rows / budget, bytes_.freed / budget)
              for name, bytes_ in tile_bytes.items()}
    capacity = 1.0 - inputs / budget

    def checked(plan: _Plan) -> Checked:
        choice, recompute = plan
        assignment = {name: cost_model.configs[name][index] for name, index in choice.items()}
        return (_step_seconds(nodes, edges, choice)
                + sum(float(extra[name][choice[name]]) for name in recompute),
                predicted_memory(graph, assignment, devices, element_bytes,
                                 recompute=recompute))

    best: tuple[_Plan, float, int] | None = None  # plan, step, peak
    least_found: int | None = None
    for choice in _baseline_choices(cost_model):  # plans that may fit, to aim the steps at
        step, memory = checked((choice, frozenset()))
        peak = max(device.peak for device in memory)
        least_found = peak if least_found is None else min(least_found, peak)
        if peak <= budget and (best is None or step < best[1]):
            best = ((choice, frozenset()), step, peak)
    multipliers = np.zeros((len(MOMENTS), devices))
    repaired: set[tuple[int, ...]] = set()
    lower = -np.inf
    scale = 2.0  # Polyak's step factor, halved when the bound stalls
    stalled = 0
    rounds = 0
    deadline = time.monotonic() + FIT_SECONDS
    for rounds in range(1, ROUNDS + 1):
        if time.monotonic() > deadline:
            break
        if progress:
            progress(f"fitting memory: round {rounds}")
        kept = {name: nodes[name] + np.einsum("rcd,rd->c", scaled[name].rows, multipliers)
                for name in nodes}
        recomputed = {name: kept[name] + extra[name]
                      - np.einsum("rcd,rd->c", scaled[name].freed, multipliers)
                      for name in nodes}
        weighted = {name: np.minimum(kept[name], recomputed[name]) for name in nodes}
        solution = solve(weighted, edges, order=order)
        bound = solution.cost - capacity * float(multipliers.sum())
        stalled = 0 if bound > lower else stalled + 1
        lower = max(lower, bound)
        plan = (dict(solution.choice), frozenset(
            name for name, index in solution.choice.items()
            if recomputed[name][index] < kept[name][index]))
        step, memory = checked(plan)
        peak = max(device.peak for device in memory)
        least_found = peak if least_found is None else min(least_found, peak)
        if peak <= budget and (best is None or step < best[1]):
            best = (plan, step, peak)
        elif (peak > budget and len(repaired) < REPAIRS
              and tuple(solution.choice.values()) not in repaired):
            repaired.add(tuple(solution.choice.values()))
            fixed = _repair(plan, nodes, edges, extra, scaled, budget, checked, deadline)
            if fixed is not None and (best is None or fixed[1] < best[1]):
                best = fixed
        if best is not None and best[1] - lower <= GAP_TOLERANCE * best[1]:
            break
        if stalled >= 5:
            scale, stalled = scale / 2, 0
        violation = np.array([[getattr(device, moment) / budget - 1.0 for device in memory]
                              for moment in MOMENTS])
        norm = float((violation ** 2).sum())
        if norm == 0.0:
            break
        # towards the best plan that fits; without one, towards twice this plan's time
        target = best[1] if best is not None else 2.0 * step
        multipliers = np.maximum(
            0.0, multipliers + scale * max(target - bound, 0.0) / norm * violation)
    if best is None:
        raise DoesNotFit(
            f"no plan found that fits {_mb(budget)} per device in {rounds} rounds: the leanest "
            f"the search met needs {_mb(least_found or 0)} on its fullest device, and no plan "
            f"needs less than {_mb(need)} ({needing_layer}); use more devices, a smaller batch "
            f"or input, or a larger --memory-limit")
    (choice, recompute), step, peak = best
    return Fit(choice=choice, recompute=recompute, step_seconds=step,
               lower_bound=min(lower, step), rounds=rounds, peak=peak)


def _repair(plan: _Plan, nodes: dict[str, np.ndarray],
            edges: dict[tuple[str, str], np.ndarray], extra: dict[str, np.ndarray],
            tiles: dict[str, _TileBytes], budget: int, checked: Callable[[_Plan], Checked],
            deadline: float) -> tuple[_Plan, float, int] | None:
    """A plan that fits, from one that does not: one change at a time (a layer's config, its
    recompute flag kept, or recomputing a layer), the change that lowers the devices' per-tile
    bytes most for the step time it adds (measured by sum(bytes^POTENTIAL_POWER) over devices
    and moments, which the fullest devices dominate and which two equally full devices both
    count in), until the whole memory model says it fits (None when no change lowers it any
    more). The multipliers of a symmetric cost model cannot spread work over devices by
    themselves (moving every layer from devices 0-1 to 2-3 costs the same), which this does."""
    choice, recompute = dict(plan[0]), plan[1]
    incident: dict[str, list[tuple[str, str]]] = {name: [] for name in nodes}
    for u, v in edges:
        incident[u].append((u, v))
        incident[v].append((u, v))
    usage = sum(tiles[name].held(index, name in recompute) for name, index in choice.items())
    step, memory = checked((choice, recompute))
    peak = max(device.peak for device in memory)
    for _ in range(REPAIR_MOVES):
        if peak <= budget:
            return (choice, recompute), step, peak
        if time.monotonic() > deadline:
            return None
        potential = float((usage ** POTENTIAL_POWER).sum())
        # (seconds per potential freed, layer, config index, recomputed)
        candidates: list[tuple[float, str, int, bool]] = []
        # changes the per-tile bytes count as no better, though the copies and the backward
        # they miss may say otherwise (a channel split's input copies against a sample split's
        # none): the quickest are checked with the whole model when nothing else is left
        rest: list[tuple[float, str, int, bool]] = []
        for name, cost in nodes.items():
            current, flagged = choice[name], name in recompute
            seconds = cost - cost[current]
            if flagged:
                seconds = seconds + extra[name] - extra[name][current]
            for u, v in incident[name]:
                matrix = edges[u, v]
                if u == name:
                    seconds = seconds + matrix[:, choice[v]] - matrix[current, choice[v]]
                else:
                    seconds = seconds + matrix[choice[u], :] - matrix[choice[u], current]
            held = tiles[name].held(current, flagged)
            rows = tiles[name].rows - (tiles[name].freed if flagged else 0.0)
            after = ((usage[None] - held[None] + rows.transpose(1, 0, 2)) ** POTENTIAL_POWER
                     ).sum(axis=(1, 2))
            freed = potential - after
            useful = np.flatnonzero(freed > 1e-12)
            ratio = np.maximum(seconds[useful], 0.0) / freed[useful]
            candidates.extend((float(r), name, int(i), flagged)
                              for r, i in zip(ratio, useful, strict=True))
            rest.extend((float(seconds[i]), name, int(i), flagged)
                        for i in np.flatnonzero(freed <= 1e-12) if i != current)
            if not flagged and np.isfinite(extra[name][current]):
                lean = tiles[name].held(current, True)
                gain = potential - float(((usage - held + lean) ** POTENTIAL_POWER).sum())
                if gain > 1e-12:
                    candidates.append((float(extra[name][current]) / gain, name, current, True))

        # the per-tile bytes miss the copies and the backward's moments: the few best changes
        # by them are checked with the whole model, the one freeing most per second wins; when
        # none frees any, the quickest of the others
        best_move = _best_exact(sorted(candidates)[:EXACT_CANDIDATES], (choice, recompute),
                                step, peak, checked)
        if not np.isfinite(best_move[0]):
            best_move = _best_exact(sorted(rest)[:REST_CHECKS], (choice, recompute), step, peak,
                                    checked)
        if not np.isfinite(best_move[0]):
            return None
        _, name, index, flagged, trial_step, trial_peak = best_move
        usage = (usage - tiles[name].held(choice[name], name in recompute)
                 + tiles[name].held(index, flagged))
        (choice, recompute), step, peak = (_changed(choice, recompute, name, index, flagged),
                                            trial_step, trial_peak)
    return None


def _best_exact(moves: list[tuple[float, str, int, bool]], plan: _Plan, step: float, peak: int,
                checked: Callable[[_Plan], Checked]
                ) -> tuple[float, str, int, bool, float, int]:
    """Of `moves` (layer, config index, recomputed) from `plan`, the one that lowers the whole
    model's peak most per second it adds, with its step and peak (score inf when none
    lowers it)."""
    scored: list[tuple[float, str, int, bool, float, int]] = [(np.inf, "", 0, False, step,
                                                                peak)]
    for _, name, index, flagged in moves:
        trial_step, trial_memory = checked(_changed(*plan, name, index, flagged))
        trial_peak = max(device.peak for device in trial_memory)
        gain = peak - trial_peak
        score = max(trial_step - step, 0.0) / gain if gain > 0 else np.inf
        scored.append((score, name, index, flagged, trial_step, trial_peak))
    return min(scored, key=lambda item: item[0])


def _changed(choice: dict[str, int], recompute: frozenset[str], name: str, index: int,
             recomputed: bool) -> _Plan:
    """The plan with layer `name` under config `index`, recomputed or kept."""
    return ({**choice, name: index}, recompute | {name} if recomputed else recompute - {name})


def _baseline_choices(cost_model: CostModel) -> list[dict[str, int]]:
    """The baselines' configs as indexes into the search spaces (those the spaces hold)."""
    choices = []
    for name in BASELINES:
        assignment = baseline(name, cost_model.graph, cost_model.devices)
        try:
            choices.append({layer: cost_model.configs[layer].index(config)
                            for layer, config in assignment.items()})
        except ValueError:  # a baseline config outside this placement's space
            continue
    return choices


def _step_seconds(nodes: dict[str, np.ndarray], edges: dict[tuple[str, str], np.ndarray],
                  choice: dict[str, int]) -> float:
    """Eq. 1's step time of `choice` from the node vectors and edge matrices."""
    return (sum(float(cost[choice[name]]) for name, cost in nodes.items())
            + sum(float(cost[choice[u], choice[v]]) for (u, v), cost in edges.items()))


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def optimal_within(cost_model: CostModel, budget: int,
                   progress: Callable[[str], None] | None = None) -> SearchResult:
    """The optimal strategy (`optimal_strategy`) when its predicted peak fits `budget` bytes
    on every device, else the fastest plan `fastest_within` finds, with its proven gap."""
    started = time.perf_counter()
    result = optimal_strategy(cost_model, progress)
    if any_plan_bound(cost_model.graph, FLOAT32_BYTES) <= budget or max(
            device.peak for device in predicted_memory(
                cost_model.graph, result.assignment, cost_model.devices, FLOAT32_BYTES)
            ) <= budget:
        return result.model_copy(update={"memory_budget_bytes": budget})
    fit = fastest_within(cost_model, budget, FLOAT32_BYTES, progress)
    assignment = {name: cost_model.configs[name][index] for name, index in fit.choice.items()}
    return result.model_copy(update={
        "assignment": assignment, "recompute": fit.recompute,
        "predicted": cost_model.evaluate(assignment, fit.recompute),
        "search_seconds": time.perf_counter() - started,
        "search_method": f"{result.search_method}, then Lagrangian multipliers for the "
                         f"memory budget ({fit.rounds} rounds)",
        "optimality_gap": fit.gap, "memory_budget_bytes": budget, "memory_rounds": fit.rounds})
