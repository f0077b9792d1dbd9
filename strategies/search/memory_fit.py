"""The optimal strategy within each device's memory: Lagrangian relaxation over the elimination,
closed by an integer program.

The unconstrained optimum comes first; when its predicted peak (cost/memory.py) fits every
device's budget B it is the answer. Otherwise the search minimises Eq. 1's step time T(s)
subject to every moment of every device being at most B. It bounds those moments by rows of
sums over the layers of each tile's own bytes (`TileFloor`; _Floors says which terms each row
takes): per device, the forward's end and the moment of each layer's backward. Every row is at
most the device's peak under any plan, so for multipliers lambda >= 0

    L(lambda) = min_s T(s) + sum_{row, d} lambda_{row,d} (row_d(s) + inputs - B)

is a lower bound of the constrained optimum (Lagrangian duality: every plan that fits makes the
bracket non-positive). Each L(lambda) is one run of the exact elimination with the weighted
rows added to the node vectors. A layer may also recompute its forward in the backward: its
tile then holds nothing of what its ops save (its saved bytes off every row) for the tile's
forward more (cost_model.recompute_seconds). The choice is the layer's own, touching no edge,
so each node's entry is the cheaper of keeping and recomputing under the multipliers, and the
elimination stays exact over the doubled space. The multipliers follow the rows' subgradient
(Polyak's step towards the best plan that fits so far).

Where balance decides, no multiplier proves more than the unconstrained optimum: the
relaxation may spread one plan over the devices, which no plan does. Where the multipliers
leave a gap, the same choice with the same rows is an integer program for HiGHS, whose proven
bound closes it. Every plan met is checked with the whole memory model, repaired where it does
not fit; the answer is the fastest that fits, with its proven gap to the best lower bound. Our
own code: the multipliers ride on the elimination, which no library provides.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.cost.memory import (
    FLOAT32_BYTES,
    DeviceMemory,
    any_plan_bound,
    predicted_memory,
    step_input_bytes,
    tile_floor,
)
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.tiles import config_boxes
from layerwise.strategies.search.baselines import BASELINES, baseline
from layerwise.strategies.search.elimination import (
    SearchResult,
    graph_costs,
    optimal_strategy,
    solve,
)

if TYPE_CHECKING:
    from layerwise.strategies.search.integer_program import Program

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
# the integer program that closes a gap the multipliers leave: at most this many coefficients
# (its memory rows and pair columns) and this many seconds of HiGHS
PROGRAM_ENTRIES = 2_000_000
PROGRAM_SECONDS = 5.0  # per solve
PROGRAM_SOLVES = 3  # the first proves the bound; the others aim its plan under the budget
REPAIR_SECONDS = 5.0  # for the integer program's plan, when it does not fit
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
    closed: bool = False  # HiGHS' integer program ran after the multipliers

    @property
    def gap(self) -> float:
        return max(0.0, (self.step_seconds - self.lower_bound) / self.step_seconds)


@dataclass(frozen=True)
class _TileBytes:
    """A layer's per-tile bytes over its search space, as the repair weighs its changes: per
    (moment, config, device) its share of the forward's end and of the backward's last call,
    and the part of the forward's that recomputing the layer frees (zero where it may not)."""

    rows: np.ndarray
    freed: np.ndarray  # (moment, config, device): what its ops save, on the forward-end row

    def held(self, index: int, recomputed: bool) -> np.ndarray:
        """(moment, device) bytes of config `index`, kept or recomputed."""
        return self.rows[:, index, :] - (self.freed[:, index, :] if recomputed else 0.0)


def _tile_bytes(floor: _Floors | None, configs: int, devices: int,
                may_recompute: bool) -> _TileBytes:
    """_TileBytes from a layer's floors (None: the network input, which holds nothing)."""
    rows = np.zeros((len(MOMENTS), configs, devices))
    freed = np.zeros_like(rows)
    if floor is not None:
        rows[0] = floor.base + floor.output + floor.saved
        rows[1] = floor.base + floor.gradients
        if may_recompute:
            freed[0] = floor.saved
    return _TileBytes(rows, freed)


@dataclass(frozen=True)
class _Floors:
    """A layer's TileFloor terms over its search space, each a (config, device) array of bytes,
    and its position p among the layers with tiles (the backward row it owns).

    The relaxation's rows, per device d: the forward's end, sum over layers of base + output +
    saved; and the moment of layer L's backward, sum of base over every layer, output over
    those at or before L, saved over those before L, gradients over those at or after L, and
    L's own workspace. Each sum is at most the device's peak under any plan (on a device L has
    no tile on, the next layer's moment that has one holds at least as much; with none, the
    forward's end does)."""

    position: int
    base: np.ndarray
    output: np.ndarray
    saved: np.ndarray
    gradients: np.ndarray
    workspace: np.ndarray

    def weighted(self, multipliers: np.ndarray, recomputed: bool) -> np.ndarray:
        """Per config, the rows' multipliers times the bytes the config adds to them:
        `multipliers` is (1 + layers, device), the forward's row first."""
        forward, backward = multipliers[0], multipliers[1:]
        at_or_after = backward[self.position:].sum(axis=0)  # rows where it is at or before L
        total = backward.sum(axis=0)
        rows = (self.base * (forward + total) + self.output * (forward + at_or_after)
                + self.gradients * (total - at_or_after + backward[self.position])
                + self.workspace * backward[self.position])
        if not recomputed:
            rows = rows + self.saved * (forward + at_or_after - backward[self.position])
        return rows.sum(axis=1)


def layer_floors(graph: LayerGraph, configs: dict[str, list[ParallelConfig]], devices: int,
            element_bytes: int) -> dict[str, _Floors]:
    """Every layer's floors under each of its configs (the network input holds none)."""
    floors: dict[str, _Floors] = {}
    for position, layer in enumerate(layer for layer in graph.layers if layer.kind != "input"):
        terms = np.zeros((5, len(configs[layer.name]), devices))
        input_gradient = graph.by_name[layer.inputs[0]].kind != "input"
        for index, config in enumerate(configs[layer.name]):
            for device, box in config_boxes(layer, config).items():
                floor = tile_floor(layer, config, box, element_bytes, input_gradient)
                terms[:, index, device] = (floor.base, floor.output, floor.saved,
                                           floor.gradients, floor.workspace)
        floors[layer.name] = _Floors(position, *terms)
    return floors


def floor_rows(floors: dict[str, _Floors], plan: _Plan, devices: int) -> np.ndarray:
    """(1 + layers, device) bytes of the relaxation's rows under `plan` (see _Floors)."""
    choice, recompute = plan
    count = len(floors)
    output, saved, gradients, workspace = (np.zeros((count, devices)) for _ in range(4))
    base = np.zeros(devices)
    for name, floor in floors.items():
        index, position = choice[name], floor.position
        base += floor.base[index]
        output[position] = floor.output[index]
        saved[position] = 0.0 if name in recompute else floor.saved[index]
        gradients[position] = floor.gradients[index]
        workspace[position] = floor.workspace[index]
    outputs_upto = np.cumsum(output, axis=0)
    saved_before = np.cumsum(saved, axis=0) - saved
    gradients_from = np.cumsum(gradients[::-1], axis=0)[::-1]
    backward = base + outputs_upto + saved_before + gradients_from + workspace
    forward = base + outputs_upto[-1] + saved.sum(axis=0)
    return np.vstack([forward, backward])


def _least_need(graph: LayerGraph, floors: dict[str, _Floors], inputs: int
                ) -> tuple[int, str]:
    """A lower bound of any plan's fullest device, and the layer that sets it: every plan puts
    each layer under some config whose fullest device holds at least its tile's share of its
    own backward's moment, and the step's inputs."""
    need, layer_name = inputs, graph.layers[0].name
    for name, floor in floors.items():
        own = floor.base + floor.output + floor.gradients + floor.workspace
        layer_need = int(own.max(axis=1).min()) + inputs
        if layer_need > need:
            need, layer_name = layer_need, name
    return need, layer_name


def fastest_within(cost_model: CostModel, budget: int, element_bytes: int = FLOAT32_BYTES,
                   progress: Callable[[str], None] | None = None) -> Fit:
    """The fastest plan whose every device's predicted peak is at most `budget` bytes.

    DoesNotFit when none is found: with the least memory any plan needs (and its layer)
    when that is over the budget, else with the least the search found."""
    graph = cost_model.graph
    devices = cost_model.devices
    floors = layer_floors(graph, cost_model.configs, devices, element_bytes)
    tile_bytes = {layer.name: _tile_bytes(floors.get(layer.name),
                                          len(cost_model.configs[layer.name]), devices,
                                          layer.name not in graph.outputs)
                  for layer in graph.layers}
    inputs = step_input_bytes(graph, element_bytes)
    need, needing_layer = _least_need(graph, floors, inputs)
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
    multipliers = np.zeros((1 + len(floors), devices))
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
        kept = {name: nodes[name] + (floors[name].weighted(multipliers, False) / budget
                                     if name in floors else 0.0) for name in nodes}
        recomputed = {name: nodes[name] + extra[name]
                      + (floors[name].weighted(multipliers, True) / budget
                         if name in floors else 0.0) for name in nodes}
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
        # the dual's subgradient: each row's bytes under this plan, over what it may hold
        violation = floor_rows(floors, plan, devices) / budget - capacity
        norm = float((violation ** 2).sum())
        if norm == 0.0:
            break
        # towards the best plan that fits; without one, towards twice this plan's time
        target = best[1] if best is not None else 2.0 * step
        multipliers = np.maximum(
            0.0, multipliers + scale * max(target - bound, 0.0) / norm * violation)
    closed = False
    if (time.monotonic() < deadline
            and (best is None or best[1] - lower > GAP_TOLERANCE * best[1])):
        program = _program(nodes, edges, extra, floors, devices, budget, inputs)
        if program is not None:
            if progress:
                progress("fitting memory: the integer program")
            closed = True
            program_lower, met = _program_plans(program, floors, devices, budget, checked,
                                                deadline)
            lower = max(lower, program_lower)
            for plan, step, peak in met:  # each, or the fitting plan repaired from it
                least_found = peak if least_found is None else min(least_found, peak)
                if peak > budget:
                    found = _repair(plan, nodes, edges, extra, scaled, budget, checked,
                                    time.monotonic() + REPAIR_SECONDS)
                    if found is None:
                        continue
                    plan, step, peak = found
                if best is None or step < best[1]:
                    best = (plan, step, peak)
    if best is None and np.isinf(lower):
        raise DoesNotFit(
            f"no plan fits {_mb(budget)} per device: the integer program over every layer's "
            f"configs proves each plan needs more on some device (the leanest the search met "
            f"needs {_mb(least_found or 0)}); use more devices, a smaller batch or input, or a "
            f"larger --memory-limit")
    if best is None:
        raise DoesNotFit(
            f"no plan found that fits {_mb(budget)} per device in {rounds} rounds: the leanest "
            f"the search met needs {_mb(least_found or 0)} on its fullest device, and no plan "
            f"needs less than {_mb(need)} ({needing_layer}); use more devices, a smaller batch "
            f"or input, or a larger --memory-limit")
    (choice, recompute), step, peak = best
    return Fit(choice=choice, recompute=recompute, step_seconds=step,
               lower_bound=min(lower, step), rounds=rounds, peak=peak, closed=closed)


def _program(nodes: dict[str, np.ndarray], edges: dict[tuple[str, str], np.ndarray],
             extra: dict[str, np.ndarray], floors: dict[str, _Floors], devices: int,
             budget: int, inputs: int) -> Program | None:
    """The constrained choice as an integer program: each layer kept or recomputed under each
    config, with the relaxation's rows (_Floors) per device as linear constraints, in units
    of the budget; None where it would exceed PROGRAM_ENTRIES."""
    from layerwise.strategies.search.integer_program import Program  # scipy loads only here

    count = len(floors)
    entries = (sum(2 * (1 + count) * devices * cost.size for cost in nodes.values())
               + sum(matrix.size for matrix in edges.values()))
    if entries > PROGRAM_ENTRIES:
        return None
    rows = {}
    for name, floor in floors.items():
        # (moment, device, config): the forward's end, then each layer's backward
        before = np.arange(count)[:, None, None]  # row L
        at_or_before = floor.position <= before
        kept = np.concatenate([
            (floor.base + floor.output + floor.saved).T[None],
            (floor.base.T + floor.output.T * at_or_before
             + floor.saved.T * (floor.position < before)
             + floor.gradients.T * (floor.position >= before)
             + floor.workspace.T * (floor.position == before))])
        recomputed = kept - np.concatenate([
            floor.saved.T[None], floor.saved.T * (floor.position < before)])
        rows[name] = np.stack([kept, recomputed]).reshape(2, (1 + count) * devices, -1) / budget
    return Program(nodes={name: np.vstack([cost, cost + extra[name]])
                          for name, cost in nodes.items()},
                   edges=edges, rows=rows,
                   row_limits=np.full((1 + count) * devices, 1.0 - inputs / budget))


def _program_plans(program: Program, floors: dict[str, _Floors], devices: int, budget: int,
                   checked: Callable[[_Plan], Checked], deadline: float
                   ) -> tuple[float, list[tuple[_Plan, float, int]]]:
    """HiGHS' proven lower bound over the relaxation's rows (inf: no plan meets them, so none
    fits) and the plans it chose with their step and peak: the first under the rows as they
    are, then (PROGRAM_SOLVES in all, until one fits) under rows tightened on every device by
    the most that the last plan's input copies and gradients in flight put beyond its rows on
    a device over the budget. A tightened program's bound proves nothing; only its plans
    count."""
    assert program.row_limits is not None
    limits = program.row_limits.copy()
    lower, met = -np.inf, []
    for attempt in range(PROGRAM_SOLVES):
        if time.monotonic() > deadline:
            break
        plan, bound = _solve_program(replace(program, row_limits=limits), deadline)
        if attempt == 0:
            lower = bound
        if plan is None:
            break
        step, memory = checked(plan)
        peaks = np.array([device.peak for device in memory])
        met.append((plan, step, int(peaks.max())))
        if peaks.max() <= budget:
            break
        beyond = peaks - floor_rows(floors, plan, devices).max(axis=0) - (
            1.0 - program.row_limits[0]) * budget
        # on every device: a plan moved to an idle device would carry the same beyond
        limits = limits - max(float(beyond[peaks > budget].max()), 0.0) / budget
    return lower, met


def _solve_program(program: Program, deadline: float) -> tuple[_Plan | None, float]:
    """HiGHS' plan for `program` (None when it found none by the deadline, or at most
    PROGRAM_SECONDS) and its proven lower bound (inf: no plan meets the rows, so none fits)."""
    from layerwise.strategies.search.integer_program import (  # scipy loads only here
        solve_program,
    )

    found, lower = solve_program(
        program, max(0.1, min(PROGRAM_SECONDS, deadline - time.monotonic())),
        relative_gap=GAP_TOLERANCE / 2)
    if found is None:
        return None, lower
    return ({name: index for name, (_, index) in found.items()},
            frozenset(name for name, (variant, _) in found.items() if variant == 1)), lower


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
    bound = f"{fit.rounds} rounds of Lagrangian multipliers" + (
        " and HiGHS' integer program" if fit.closed else "")
    assignment = {name: cost_model.configs[name][index] for name, index in fit.choice.items()}
    return result.model_copy(update={
        "assignment": assignment, "recompute": fit.recompute,
        "predicted": cost_model.evaluate(assignment, fit.recompute),
        "search_seconds": time.perf_counter() - started,
        "search_method": f"{result.search_method}, then {bound} for the memory budget",
        "optimality_gap": fit.gap, "memory_budget_bytes": budget, "memory_rounds": fit.rounds,
        "memory_bound": bound})
