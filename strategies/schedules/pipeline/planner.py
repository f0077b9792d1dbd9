"""Layer-wise partitioning and merging with forward/backward pass parallelism (Akintoye, Han,
Lloyd et al., FGCS 2023; docs/research.md: pipeline): the network is cut layer-wise into S
contiguous stages, stage s on its own d_s devices (sample-parallel inside the stage: every layer of
it runs n{d_s}), and M micro-batches of the global batch flow through the stages
one-forward-one-backward (1F1B), so different stages work on different micro-batches at once and no
stage waits for the whole batch's backward before starting the next forward.

Where a stage may end (`legal_cuts`): only between two layers of the graph's topological order
that exactly one tensor crosses, so a residual block or an Inception module is never split and a
stage hands one tensor to the next.

The step time the search minimises (1F1B with a flush, as GPipe and PipeDream-flush):

    T = (M + S - 1) * max_s a_s + max_s (sync_s + u_s),  bubble = (S - 1) / (M + S - 1) of
    the first term
    a_s = t_c(stage s, n{d_s}) / M + t_x(cut after s, one micro-batch: activation + its gradient)
    sync_s = ring all-reduce of stage s's weight gradients over its d_s devices, once per step
    u_s = the SGD update of stage s's weights on each of its devices, once per step

t_c is the cost model's forward + backward time of each layer's largest tile under n{d_s} at the
global batch (`CostModel.pass_seconds`, profiled or analytic; u_s sums its `update_seconds`); a
micro-batch takes 1/M of it (linear in the samples: the efficiency real devices lose on small
micro-batches is not modelled, which is why M is searched only up to 4S, GPipe's point of a
negligible bubble). t_x follows cost/cost_model.py: every device receives its rows of the crossing
tensor from each sender over the link between them, one message after another, paying that link's
latency per message; forward the activation, backward its gradient. The network input is not sent
(every rank holds the global batch). Stages take consecutive device blocks in stage order (stage 0
from device 0).

Merging: the search is an exact DP over the legal cuts, every S from 1 to min(devices, legal
cuts + 1) and every power-of-two d_s (summing to the devices, dividing the micro-batch), for
every M. Merging two adjacent stages (pooling their devices, data-parallel inside) gives a
partition with one stage fewer, which the DP compares with all others; so the partition it
returns is already merged wherever merging lowers T, and the report says which S won.

The DP runs from the last layer back: per state (a boundary, the devices the stages after it
use, the device count of the stage after it) it keeps the Pareto front of (max a_s, max
sync_s + u_s, S) over the stages chosen so far; T grows with each of them, so a dominated suffix
cannot lead to the optimum. A suffix that cannot beat the best pipeline found so far (data
parallelism to start with) is dropped (branch and bound; still exact).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
from pydantic import BaseModel, ConfigDict

from layerwise.strategies.breakdown import Breakdown
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.errors import ConfigError
from layerwise.strategies.hardware.cluster import Link
from layerwise.strategies.model.graph import BYTES_PER_ELEMENT, Layer, LayerGraph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.schedules.pipeline.execution import PipelineExecution, PipelineStage
from layerwise.strategies.strategy import Strategy

MICRO_BATCHES_PER_STAGE = 4  # M <= 4 S: beyond it the bubble is already below 1/5 of a step


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StageReport(_Frozen):
    """One stage of a pipeline plan; seconds per micro-batch, bytes per step (all devices)."""

    layers: tuple[str, ...]
    devices: tuple[int, ...]
    compute_seconds: float  # forward + backward of one micro-batch
    transfer_seconds: float  # the outgoing activation and its gradient, one micro-batch
    transfer_bytes: int  # the outgoing activations and their gradients, every micro-batch
    sync_seconds: float
    sync_bytes: int
    update_seconds: float  # the SGD update of the stage's weights, once per step


class PipelinePlan(_Frozen):
    """What `layerwise search` prints for the pipeline: stages, M, bubble, time, speedup."""

    model: str
    devices: int
    cluster: str
    cost_source: str
    global_batch: int
    micro_batches: int
    stages: tuple[StageReport, ...]
    bubble_fraction: float
    step_seconds: float
    one_device_step_seconds: float  # S = 1, d = 1: the sum of every layer's t_c
    speedup: float
    predicted: Breakdown

    @property
    def execution(self) -> PipelineExecution:
        return PipelineExecution(
            stages=tuple(PipelineStage(layers=stage.layers, devices=stage.devices)
                         for stage in self.stages),
            micro_batches=self.micro_batches)


# ---- the graph: where it may be cut ------------------------------------------------------


def crossing(graph: LayerGraph, position: int) -> list[str]:
    """Layers before `position` (topological order) whose tensor a layer from it on reads."""
    before = {layer.name for layer in graph.layers[:position]}
    return list(dict.fromkeys(
        source for layer in graph.layers[position:] for source in layer.inputs
        if source in before))


def legal_cuts(graph: LayerGraph) -> list[int]:
    """Positions p (a stage boundary between layers p-1 and p) that exactly one tensor crosses.

    The first stage holds the input and at least one layer after it, so p >= 2.
    """
    _check_single_output(graph)
    return [position for position in range(2, len(graph.layers))
            if len(crossing(graph, position)) == 1]


def _check_single_output(graph: LayerGraph) -> None:
    if graph.outputs != (graph.layers[-1].name,):
        raise ConfigError(f"the pipeline needs one output, the last layer; {graph.model} has "
                          f"outputs {list(graph.outputs)}")


def row_pieces(rows: int, senders: int, receivers: int) -> list[tuple[int, int, int, int]]:
    """(sender, receiver, start, stop) of the rows of a micro-batch of `rows` rows that
    sender i of `senders` (holding rows [i*rows/senders, ...)) sends to each receiver."""
    pieces = []
    for sender in range(senders):
        start, stop = sender * rows // senders, (sender + 1) * rows // senders
        for receiver in range(receivers):
            low = max(start, receiver * rows // receivers)
            high = min(stop, (receiver + 1) * rows // receivers)
            if low < high:
                pieces.append((sender, receiver, low, high))
    return pieces


def _elements_per_sample(graph: LayerGraph, position: int) -> int:
    """Elements per sample of the one tensor crossing the boundary at `position`."""
    (name,) = crossing(graph, position)
    return math.prod(graph.by_name[name].output_shape[1:])


def _needs_two_rows(layer: Layer) -> bool:
    """Whether the layer runs BatchNorm on one position per sample (1x1 or 2-d): training
    BatchNorm needs more than one value per channel, so two samples per device."""
    norms = any(op.startswith("BatchNorm") for op in (layer.op, *(f.op for f in layer.fused)))
    return norms and math.prod(layer.output_shape[2:]) == 1


def _powers_of_two(limit: int) -> list[int]:
    return [1 << exponent for exponent in range(limit.bit_length()) if 1 << exponent <= limit]


def stage_assignment(graph: LayerGraph,
                     execution: PipelineExecution) -> dict[str, ParallelConfig]:
    """Every layer's config: n{d_s} on its stage's devices (the input with the first stage)."""
    return {name: ParallelConfig(n=len(stage.devices), devices=stage.devices)
            for stage in execution.stages for name in stage.layers}


def check_execution(graph: LayerGraph, execution: PipelineExecution, devices: int) -> None:
    """Raise ConfigError (one line) unless `execution` is a pipeline the engine can run."""
    stages, batch, micro = execution.stages, graph.batch, execution.micro_batches
    _check_counts(len(stages), micro, batch, devices)
    used = [device for stage in stages for device in stage.devices]
    if len(set(used)) != len(used) or not all(0 <= device < devices for device in used):
        raise ConfigError(f"pipeline stages must use distinct devices among 0-{devices - 1} "
                          f"(got {[list(stage.devices) for stage in stages]})")
    names = [name for stage in stages for name in stage.layers]
    if names != [layer.name for layer in graph.layers]:
        raise ConfigError("pipeline stages must hold every layer once, in the graph's "
                          "topological order (see `layerwise graph`)")
    _check_boundaries(graph, stages)
    for stage in stages:
        width = len(stage.devices)
        if width & (width - 1) or (batch // micro) % width:
            raise ConfigError(f"a stage on {width} devices cannot split micro-batches of "
                              f"{batch // micro} samples: use a power of two dividing them")
        rows = batch // micro // width
        for name in stage.layers:
            if rows < 2 and _needs_two_rows(graph.by_name[name]):
                raise ConfigError(f"layer '{name}' runs BatchNorm on one value per channel "
                                  f"with {rows} sample per device and micro-batch; use fewer "
                                  "micro-batches or fewer devices in its stage")


def _check_counts(stages: int, micro_batches: int, batch: int, devices: int) -> None:
    if not 1 <= stages <= devices:
        raise ConfigError(f"a pipeline of {stages} stages on {devices} devices: every stage "
                          f"needs at least one device of its own (use 1 to {devices} stages)")
    if batch % micro_batches:
        raise ConfigError(f"{micro_batches} micro-batches do not divide the global batch of "
                          f"{batch}; choose a divisor of it")


def _check_boundaries(graph: LayerGraph, stages: tuple[PipelineStage, ...]) -> None:
    legal = set(legal_cuts(graph))
    position = 0
    for stage in stages[:-1]:
        if not stage.layers:
            raise ConfigError("a pipeline stage holds no layers")
        position += len(stage.layers)
        if position not in legal:
            raise ConfigError(
                f"a pipeline stage ends before layer '{graph.layers[position].name}', where "
                f"{len(crossing(graph, position))} tensors cross; cut where exactly one does")


# ---- the cost of one stage ----------------------------------------------------------------


@dataclass(frozen=True)
class StageCost:
    """a_s's parts (seconds per micro-batch), sync_s and u_s (per step) of one stage."""

    compute: float
    transfer: float
    transfer_bytes: int
    sync: float
    sync_bytes: int
    update: float

    @property
    def busy(self) -> float:
        return self.compute + self.transfer

    @property
    def tail(self) -> float:
        """What the stage does once per step after its last backward: sync, then update."""
        return self.sync + self.update


class PipelineCosts:
    """Per-layer t_c under n{d}, prefix sums and link lookups for one CostModel."""

    def __init__(self, cost: CostModel) -> None:
        graph = cost.graph
        self.cost = cost
        self.graph = graph
        self.devices = cost.devices
        self.batch = cost.graph.batch
        self.cuts = legal_cuts(self.graph)
        self.widths = [d for d in _powers_of_two(self.devices) if d <= self.batch]
        # prefix sums over the layers: a stage's total is one subtraction
        self._compute = {width: self._prefix(self.cost.pass_seconds, width)
                         for width in self.widths}
        self._update = {width: self._prefix(self.cost.update_seconds, width)
                        for width in self.widths}
        self._params = list(accumulate((layer.param_count for layer in graph.layers),
                                       initial=0))
        self._two_rows = list(accumulate((_needs_two_rows(layer) for layer in graph.layers),
                                         initial=0))
        self._elements = {position: _elements_per_sample(graph, position)
                          for position in self.cuts}
        self._links: dict[tuple[int, ...], Link] = {}
        self._cut_cache: dict[tuple[int, ...], float] = {}

    def _prefix(self, seconds: Callable[[Layer, list[ParallelConfig]], np.ndarray],
                width: int) -> list[float]:
        """Prefix sums over the layers of `seconds` under n{width}."""
        config = ParallelConfig(n=width, devices=tuple(range(width)))
        return list(accumulate((float(seconds(layer, [config])[0])
                                for layer in self.graph.layers), initial=0.0))

    @property
    def one_device_seconds(self) -> float:
        """t_c of the whole network on one device (S = 1, d = 1, M = 1), update included."""
        return self._compute[1][-1] + self._update[1][-1]

    def fits(self, start: int, stop: int, rows_per_device: int) -> bool:
        """Whether layers[start:stop] can train on `rows_per_device` samples (BatchNorm)."""
        return rows_per_device >= 2 or self._two_rows[stop] == self._two_rows[start]

    def stage(self, start: int, stop: int, first: int, width: int, next_width: int,
              micro_batches: int) -> StageCost:
        """Stage layers[start:stop] on devices first..first+width-1, the next on next_width."""
        compute = (self._compute[width][stop] - self._compute[width][start]) / micro_batches
        params = self._params[stop] - self._params[start]
        sync, sync_bytes = self._sync(first, width, params)
        update = self._update[width][stop] - self._update[width][start]
        if stop == len(self.graph.layers):
            return StageCost(compute, 0.0, 0, sync, sync_bytes, update)
        elements = self._elements[stop]
        rows = self.batch // micro_batches
        transfer = self._cut_seconds(stop, rows, first, width, next_width)
        transfer_bytes = 2 * self.batch * elements * BYTES_PER_ELEMENT
        return StageCost(compute, transfer, transfer_bytes, sync, sync_bytes, update)

    def _sync(self, first: int, width: int, params: int) -> tuple[float, int]:
        """Ring all-reduce of the stage's gradients as one buffer (the engine's one call)."""
        if width == 1 or not params:
            return 0.0, 0
        link = self._slowest_link(tuple(range(first, first + width)))
        buffer = params * BYTES_PER_ELEMENT
        return link.allreduce_seconds(buffer, width), 2 * (width - 1) * buffer

    def _slowest_link(self, devices: tuple[int, ...]) -> Link:
        if devices not in self._links:
            link = self.cost.cluster.slowest_link(devices)
            assert link is not None  # two devices or more
            self._links[devices] = link
        return self._links[devices]

    def _cut_seconds(self, position: int, rows: int, first: int, width: int,
                     next_width: int) -> float:
        """t_x of one micro-batch across the cut: activations forward, gradients back."""
        key = (position, rows, first, width, next_width)
        if key not in self._cut_cache:
            row_bytes = self._elements[position] * BYTES_PER_ELEMENT
            senders = list(range(first, first + width))
            receivers = list(range(first + width, first + width + next_width))
            pieces = row_pieces(rows, width, next_width)
            forward = self._receive_seconds(
                [(receivers[r], senders[s], stop - start) for s, r, start, stop in pieces],
                row_bytes)
            backward = self._receive_seconds(
                [(senders[s], receivers[r], stop - start) for s, r, start, stop in pieces],
                row_bytes)
            self._cut_cache[key] = forward + backward
        return self._cut_cache[key]

    def _receive_seconds(self, messages: list[tuple[int, int, int]], row_bytes: int) -> float:
        """The slowest receiver: each of its messages over the link it crosses, one after
        another, plus that link's latency (as t_x prices a device's ingress, cost/tables.py)."""
        received = dict.fromkeys((receiver for receiver, _, _ in messages), 0.0)
        for receiver, sender, rows in messages:
            link = self.cost.cluster.link(sender, receiver)
            assert link is not None  # consecutive stages hold disjoint devices
            received[receiver] += rows * row_bytes / link.bandwidth + link.latency
        return max(received.values(), default=0.0)


# ---- a plan: evaluation and search ---------------------------------------------------------


def evaluate(costs: PipelineCosts, boundaries: list[int], widths: list[int],
             micro_batches: int) -> PipelinePlan:
    """The 1F1B model for one partition: stage s is layers[boundaries[s]:boundaries[s+1]] on
    widths[s] devices (consecutive blocks from device 0); no legality checks."""
    firsts = [sum(widths[:index]) for index in range(len(widths))]
    graph = costs.graph
    stage_costs = [
        costs.stage(boundaries[s], boundaries[s + 1], firsts[s], widths[s],
                    widths[s + 1] if s + 1 < len(widths) else 0, micro_batches)
        for s in range(len(widths))
    ]
    count = len(widths)
    rounds = micro_batches + count - 1
    bottleneck = max(stage_costs, key=lambda stage: stage.busy)
    last = max(stage_costs, key=lambda stage: stage.tail)
    predicted = Breakdown(
        step_seconds=rounds * bottleneck.busy + last.tail,
        compute_seconds=rounds * bottleneck.compute + last.update,
        transfer_seconds=rounds * bottleneck.transfer, sync_seconds=last.sync,
        transfer_bytes=sum(stage.transfer_bytes for stage in stage_costs),
        sync_bytes=sum(stage.sync_bytes for stage in stage_costs))
    stages = tuple(
        StageReport(
            layers=tuple(layer.name for layer in graph.layers[boundaries[s]:boundaries[s + 1]]),
            devices=tuple(range(firsts[s], firsts[s] + widths[s])),
            compute_seconds=stage.compute, transfer_seconds=stage.transfer,
            transfer_bytes=stage.transfer_bytes, sync_seconds=stage.sync,
            sync_bytes=stage.sync_bytes, update_seconds=stage.update)
        for s, stage in enumerate(stage_costs))
    return PipelinePlan(
        model=graph.model, devices=costs.devices, cluster=costs.cost.cluster.name,
        cost_source=costs.cost.compute.name, global_batch=costs.batch,
        micro_batches=micro_batches, stages=stages,
        bubble_fraction=(count - 1) / rounds, step_seconds=predicted.step_seconds,
        one_device_step_seconds=costs.one_device_seconds,
        speedup=costs.one_device_seconds / predicted.step_seconds, predicted=predicted)


@dataclass(frozen=True)
class _Point:
    """A suffix of stages: max busy and max tail over them, how many, and the chain."""

    busy: float
    tail: float
    count: int
    start: int  # boundary index of the suffix's first stage
    width: int
    rest: _Point | None


@dataclass(frozen=True)
class _Target:
    """Which pipelines one search pass accepts: M, and S >= fewest (or S == fewest)."""

    micro_batches: int
    fewest: int
    exact: bool

    def seconds(self, point: _Point, stages: int) -> float:
        """T of a pipeline of `stages` stages that ends with the suffix `point`, at least."""
        return (self.micro_batches + max(stages, self.fewest) - 1) * point.busy + point.tail

    def beats(self, kept: _Point, point: _Point) -> bool:
        """Whether `kept` (no slower, sorted before) makes `point` useless: any stages put
        before both give `kept` a T no higher, and an acceptable pipeline whenever `point`
        gets one (fewer stages may fall below `fewest`; with `exact` no count serves twice)."""
        if kept.tail > point.tail:
            return False
        if self.exact:
            return kept.count == point.count
        return kept.count == point.count or self.fewest <= kept.count <= point.count

    def accepts(self, stages: int) -> bool:
        return stages == self.fewest if self.exact else stages >= self.fewest


def _pareto(points: list[_Point], target: _Target) -> list[_Point]:
    """The points no other point beats."""
    front: list[_Point] = []
    for point in sorted(points, key=lambda p: (p.busy, p.tail, p.count)):
        if not any(target.beats(kept, point) for kept in front):
            front.append(point)
    return front


def _search(costs: PipelineCosts, target: _Target,
            bound: float) -> tuple[float, int, _Point] | None:
    """The best (T, S, chain of stages) for one M if it takes at most `bound` seconds.

    Boundaries are processed from the end: a state is (boundary index i, devices used by the
    stages from i on, the device count of the stage starting at i), holding the Pareto front
    of the suffixes that reach it (see the module docstring).
    """
    micro_batches, rows = target.micro_batches, costs.batch // target.micro_batches
    widths = [width for width in costs.widths if rows % width == 0]
    positions = [0, *costs.cuts, len(costs.graph.layers)]
    last = len(positions) - 1
    states: list[dict[tuple[int, int], list[_Point]]] = [{} for _ in positions]
    states[last][(0, 0)] = [_Point(0.0, 0.0, 0, last, 0, None)]
    best: tuple[float, int, _Point] | None = None
    for index in range(last, -1, -1):
        for (used, next_width), points in states[index].items():
            more = int(index > 0)  # a suffix from a later boundary needs one more stage
            front = [point for point in _pareto(points, target)
                     if target.seconds(point, point.count + more) <= bound]
            if index == 0:
                best = _better(best, front, target)
                continue
            for width in widths:
                left = costs.devices - used - width
                for start in range(index - 1, -1, -1) if left >= 0 else ():
                    if not costs.fits(positions[start], positions[index], rows // width):
                        break  # a longer stage holds the same BatchNorm
                    if (start == 0) != (left == 0):
                        continue
                    stage = costs.stage(positions[start], positions[index], left, width,
                                        next_width, micro_batches)
                    if micro_batches * stage.busy + stage.tail > bound:
                        break  # a longer stage is no faster
                    successor = states[start].setdefault((used + width, width), [])
                    successor.extend(_Point(max(p.busy, stage.busy), max(p.tail, stage.tail),
                                            p.count + 1, start, width, p) for p in front)
    return best


def _better(best: tuple[float, int, _Point] | None, front: list[_Point],
            target: _Target) -> tuple[float, int, _Point] | None:
    """`best` or a whole pipeline of `front` if it is faster; ties keep fewer stages."""
    for point in front:
        if not target.accepts(point.count):
            continue
        seconds = target.seconds(point, point.count)
        if best is None or (seconds, point.count) < (best[0], best[1]):
            best = (seconds, point.count, point)
    return best


def _chain(costs: PipelineCosts, point: _Point) -> tuple[list[int], list[int]]:
    """Boundaries and device counts of the stages of a complete chain."""
    positions = [0, *costs.cuts, len(costs.graph.layers)]
    boundaries, widths = [positions[point.start]], []
    node = point
    while node.rest is not None:
        widths.append(node.width)
        boundaries.append(positions[node.rest.start])
        node = node.rest
    return boundaries, widths


def _targets(costs: PipelineCosts, stages: int | None,
             micro_batches: int | None) -> list[_Target]:
    """The search passes: every M (divisors of the batch up to 4 S) unless M is given."""
    if stages is not None or micro_batches is not None:
        _check_counts(stages or 1, micro_batches or 1, costs.batch, costs.devices)
    if micro_batches is not None:
        return [_Target(micro_batches, stages or 1, stages is not None)]
    most = MICRO_BATCHES_PER_STAGE * (stages or costs.devices)
    return [_Target(m, stages or -(-m // MICRO_BATCHES_PER_STAGE), stages is not None)
            for m in range(1, min(costs.batch, most) + 1) if costs.batch % m == 0]


def optimal_pipeline(cost: CostModel, stages: int | None = None,
                     micro_batches: int | None = None) -> PipelinePlan:
    """The partition, device counts and M with the least predicted 1F1B step time (exact);
    `stages` and `micro_batches` fix S and M instead of searching them. Ties go to fewer
    stages, then to fewer micro-batches."""
    costs = PipelineCosts(cost)
    best: tuple[float, int, int, _Point] | None = None
    bound = math.inf
    if stages in (None, 1) and micro_batches in (None, 1) and costs.devices in costs.widths:
        # data parallelism (S = 1, M = 1) is a candidate: a first bound to prune with
        bound = evaluate(costs, [0, len(costs.graph.layers)], [costs.devices], 1).step_seconds
    for target in _targets(costs, stages, micro_batches):
        found = _search(costs, target, best[0] if best else bound)
        if found is not None and (best is None or found[:2] < best[:2]):
            best = (*found[:2], target.micro_batches, found[2])
    if best is None:
        raise ConfigError(f"no pipeline of {cost.graph.model} with these stages and "
                          f"micro-batches fits {cost.devices} devices at a global batch of "
                          f"{costs.batch} (a stage's devices must divide its micro-batch)")
    boundaries, widths = _chain(costs, best[3])
    return evaluate(costs, boundaries, widths, best[2])


def build_strategy(name: str, cost: CostModel) -> Strategy:
    """The `pipeline` strategy: per-layer n{d_s} on each stage's devices, 1F1B execution."""
    if name != "pipeline":
        raise ConfigError(f"the pipeline planner builds 'pipeline', not '{name}'")
    return plan_strategy(optimal_pipeline(cost), cost.graph)


def plan_strategy(plan: PipelinePlan, graph: LayerGraph) -> Strategy:
    """A plan as a Strategy: its execution, every layer's config and the predicted cost."""
    execution = plan.execution
    return Strategy.from_assignment(
        "pipeline", graph, plan.devices, plan.cluster, plan.cost_source,
        stage_assignment(graph, execution), plan.predicted, execution)


def pipeline_report(strategy: Strategy, cost: CostModel) -> PipelinePlan:
    """A pipeline strategy's stages, micro-batches and bubble priced by the 1F1B model on
    `cost`, checked as the engine will check them. The model prices stages on consecutive
    device blocks from device 0, which is how the planner lays them out."""
    execution = strategy.execution
    assert isinstance(execution, PipelineExecution)
    check_execution(cost.graph, execution, cost.devices)
    first = 0
    for stage in execution.stages:
        if stage.devices != tuple(range(first, first + len(stage.devices))):
            raise ConfigError(
                f"pipeline stage devices {[list(s.devices) for s in execution.stages]} are not "
                "consecutive blocks from device 0, the layout `layerwise search` writes and "
                "the 1F1B cost model prices; renumber them in order")
        first += len(stage.devices)
    boundaries = list(accumulate((len(stage.layers) for stage in execution.stages),
                                 initial=0))
    widths = [len(stage.devices) for stage in execution.stages]
    return evaluate(PipelineCosts(cost), boundaries, widths, execution.micro_batches)


def reprice(strategy: Strategy, cost: CostModel) -> Strategy:
    """A saved pipeline checked against `cost`'s graph and devices and priced afresh by the
    1F1B model (a file keeps the prediction of the batch and cluster it was planned for)."""
    return plan_strategy(pipeline_report(strategy, cost), cost.graph)
