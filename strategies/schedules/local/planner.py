"""Local parallelism (Laskin, Metz et al. 2020, docs/research.md: local parallelism): blocks, their
devices, their cost.

The network is cut into K = devices blocks of contiguous layers (graph order). A cut is legal
only where exactly one tensor crosses it (never inside a residual block), because a block is
fed by one activation and its auxiliary head reads one. Block k runs whole on device k (every
layer `n1c1h1w1@k`), trains on its own loss and sends its output forward; with the
overlapping variant it also sends the gradient of its loss with respect to its input back one
block (engine.py executes both).

Which cuts: an exact dynamic programme over the legal cut points minimises the largest block
cost, the quantity the prediction reports, so the partition is optimal under it.

Predicted cost (`Breakdown`): the blocks run at once in the steady state of the asynchronous
pipeline (block k works on batch t while block k+1 works on batch t-1), so a step costs the
slowest block's own work: the t_c of its layers at its config, its auxiliary head's, and the
time of what it sends (its output to k+1; overlapping: its input gradient to k-1). With the
overlapping variant every block but the last also runs the next block's gradient back through
its stashed forward, one more backward pass: priced as the backward's share of its layers'
forward + backward (`BACKWARD_SHARE`, 2 of the 3 passes; t_c also holds the weight
update, run once). `compute` and `transfer` are the slowest block's; nothing is all-reduced, so
sync is 0. Transfer bytes are every activation crossing a cut (twice for overlapping: its
gradient comes back), exactly what the engine counts. The profile measures the model's layers
only, so the heads (global average pooling and one Linear) are priced by the cluster
device's analytic t_c.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from layerwise.strategies.breakdown import Breakdown
from layerwise.strategies.cost.compute_time import AnalyticCompute
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.graph import BYTES_PER_ELEMENT, Layer, LayerGraph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.tiles import TileWork
from layerwise.strategies.schedules.local.execution import LocalBlock, LocalExecution
from layerwise.strategies.strategy import Strategy

VARIANTS: dict[str, str] = {"local": "greedy", "local_overlap": "overlapping"}
BACKWARD_SHARE = 2 / 3  # of a layer's forward + backward (backward ~ twice the forward)


@dataclass(frozen=True)
class Cut:
    """A legal cut after `graph.layers[position]`; `crossing` is the one layer whose output
    crosses it (the block's output, what its head reads and what moves to the next device)."""

    position: int
    crossing: str


def legal_cuts(graph: LayerGraph) -> list[Cut]:
    """Every place the layer order can be cut with exactly one tensor crossing.

    A layer is live after position p when it is at or before p and some consumer (or the
    model's output) comes after p. The first block holds the input and at least one layer;
    the last block at least one layer. A layer whose value the model holds channels-last (inside
    a permuted run) is no cut: its block's head and the next block read (N, C, ...) tensors.
    """
    order = {layer.name: index for index, layer in enumerate(graph.layers)}
    last_use = dict(order)
    for layer in graph.layers:
        for source in layer.inputs:
            last_use[source] = max(last_use[source], order[layer.name])
    for name in graph.outputs:
        last_use[name] = len(graph.layers)
    cuts, live = [], set()
    for position, layer in enumerate(graph.layers[:-1]):
        live = {name for name in (*live, layer.name) if last_use[name] > position}
        if position > 0 and len(live) == 1:
            crossing = next(iter(live))
            if not graph.by_name[crossing].channels_last_value:
                cuts.append(Cut(position=position, crossing=crossing))
    return cuts


def _check_single_output(graph: LayerGraph) -> None:
    if graph.outputs != (graph.layers[-1].name,):
        raise ConfigError(f"local parallelism needs one model output computed last; "
                          f"{graph.model} outputs {', '.join(graph.outputs)}")
    shape = graph.layers[-1].output_shape
    if len(shape) > 2:
        raise ConfigError(f"local parallelism trains each block through a pooled classifier "
                          f"head on (batch, classes) labels, but {graph.model} scores every "
                          f"position {tuple(shape)}; train it with --strategy "
                          "layerwise|data|model|pipeline|FILE")


def _usable_cuts(graph: LayerGraph, blocks: int) -> list[Cut]:
    """The legal cuts, after checking there are enough for `blocks` blocks (one line if not)."""
    _check_single_output(graph)
    cuts = legal_cuts(graph)
    if blocks - 1 > len(cuts):
        names = [cut.crossing for cut in cuts]
        where = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "") or "none"
        raise ConfigError(
            f"local parallelism puts one block per process, but {graph.model} has "
            f"{len(cuts)} legal cut point(s) (after: {where}; a cut may not split a "
            f"residual block or a channels-last run), so at most {len(cuts) + 1} blocks; use "
            f"--nproc {len(cuts) + 1} or fewer processes (got {blocks})")
    return cuts


class _Pricing:
    """What one block costs from its layers and its ends (see the module docstring).

    Layer times are prefix sums and each cut's head time and bytes are computed once, so the
    DP prices a block in constant time.
    """

    def __init__(self, cost: CostModel, cuts: Sequence[Cut], overlapping: bool) -> None:
        self.cost = cost
        self.overlapping = overlapping
        # prefix[i]: t_c of layers [0, i), each whole on one device; passes[i]: the forward +
        # backward part of it (without the weight update)
        self.prefix, self.passes = [0.0], [0.0]
        whole = [ParallelConfig(devices=(0,))]
        for layer in cost.graph.layers:
            self.prefix.append(self.prefix[-1] + float(cost.compute_seconds(layer, whole)[0]))
            self.passes.append(self.passes[-1] + float(cost.pass_seconds(layer, whole)[0]))
        crossing = {cut.position: cost.graph.by_name[cut.crossing] for cut in cuts}
        self.head = {position: head_seconds(cost, layer) for position, layer in crossing.items()}
        self.bytes = {position: activation_bytes(layer) for position, layer in crossing.items()}

    def block(self, index: int, start: Cut | None, end: Cut | None) -> tuple[float, float]:
        """(compute, transfer) seconds of block `index` between its cuts (None: an end)."""
        first = start.position + 1 if start is not None else 0
        last = end.position if end is not None else len(self.cost.graph.layers) - 1
        layers = self.prefix[last + 1] - self.prefix[first]
        compute, transfer = layers, 0.0
        if end is not None:
            compute += self.head[end.position]
            if self.overlapping:  # the delayed gradient's backward pass
                compute += BACKWARD_SHARE * (self.passes[last + 1] - self.passes[first])
            transfer += self._link_seconds(index, index + 1, self.bytes[end.position])
        if start is not None and self.overlapping:
            transfer += self._link_seconds(index, index - 1, self.bytes[start.position])
        return compute, transfer

    def _link_seconds(self, source: int, target: int, nbytes: int) -> float:
        link = self.cost.cluster.slowest_link([source, target])
        assert link is not None  # two distinct devices
        return link.time(nbytes)


def activation_bytes(layer: Layer) -> int:
    """Bytes of a layer's output at the global batch: what crosses a cut (fp32)."""
    return prod(layer.output_shape) * BYTES_PER_ELEMENT


def head_layers(crossing: Layer, classes: int) -> list[Layer]:
    """The auxiliary head as layers: global average pooling (4-d outputs) and one Linear."""
    batch, features = crossing.output_shape[:2]
    layers = []
    if len(crossing.output_shape) == 4:
        layers.append(Layer(name=f"{crossing.name}_head_pool", kind="adaptive_pool",
                            op="AdaptiveAvgPool2d", target="head", inputs=(crossing.name,),
                            input_shapes=(crossing.output_shape,),
                            output_shape=(batch, features, 1, 1),
                            param_shapes={}, flops=prod(crossing.output_shape)))
    layers.append(Layer(name=f"{crossing.name}_head_fc", kind="linear", op="Linear",
                        target="head", inputs=(crossing.name,),
                        input_shapes=((batch, features),), output_shape=(batch, classes),
                        param_shapes={"weight": (classes, features), "bias": (classes,)},
                        flops=2 * batch * features * classes + batch * classes))
    return layers


def head_seconds(cost: CostModel, crossing: Layer) -> float:
    """Forward + backward and weight update of a block's auxiliary head by the cluster
    device's analytic t_c."""
    analytic = AnalyticCompute(cost.cluster)
    tiles = [(layer, TileWork(output_shape=layer.output_shape, input_shapes=layer.input_shapes,
                              param_elements=layer.param_count))
             for layer in head_layers(crossing, output_classes(cost.graph))]
    return sum(analytic.tile_seconds(layer, tile) + analytic.update_seconds(layer, tile)
               for layer, tile in tiles)


def output_classes(graph: LayerGraph) -> int:
    return graph.by_name[graph.outputs[0]].output_shape[1]


def best_cuts(cost: CostModel, overlapping: bool) -> list[Cut]:
    """The K - 1 legal cuts minimising the slowest block's compute + transfer (exact DP).

    After b blocks, `best[j]` is the smallest possible slowest block among b blocks whose last
    one ends at cut j, with the cuts that reach it; each further block extends every entry by
    every later cut. O(K P^2) block prices for P legal cuts.
    """
    blocks = cost.devices
    cuts = _usable_cuts(cost.graph, blocks)
    if blocks == 1:
        return []
    pricing = _Pricing(cost, cuts, overlapping)

    def price(index: int, start: Cut | None, end: Cut | None) -> float:
        return sum(pricing.block(index, start, end))

    Reach = tuple[float, list[int]] | None  # (slowest block so far, cut indices) or unreachable
    best: list[Reach] = [(price(0, None, cut), [j]) for j, cut in enumerate(cuts)]
    for index in range(1, blocks - 1):
        best = [min(((max(reach[0], price(index, cuts[i], end)), [*reach[1], j])
                     for i, reach in enumerate(best[:j]) if reach is not None), default=None)
                for j, end in enumerate(cuts)]
    _, chosen = min((max(reach[0], price(blocks - 1, cuts[i], None)), reach[1])
                    for i, reach in enumerate(best) if reach is not None)
    return [cuts[j] for j in chosen]


def blocks_for(graph: LayerGraph, cuts: Sequence[Cut]) -> tuple[LocalBlock, ...]:
    """The blocks between `cuts` (sorted), block k on device k."""
    bounds = [-1, *(cut.position for cut in cuts), len(graph.layers) - 1]
    return tuple(
        LocalBlock(layers=tuple(layer.name for layer in graph.layers[start + 1:stop + 1]),
                   device=index)
        for index, (start, stop) in enumerate(zip(bounds, bounds[1:], strict=False)))


def block_cuts(graph: LayerGraph, blocks: Sequence[LocalBlock], world: int) -> list[Cut]:
    """The cuts between `blocks`, after checking they run here (ConfigError, one line, if not).

    The blocks must be one per process, block k on device k, and cover the layers in graph
    order, cut only at legal cut points.
    """
    cuts = {cut.position: cut for cut in _usable_cuts(graph, len(blocks))}
    if len(blocks) != world:
        raise ConfigError(f"the local strategy has {len(blocks)} blocks but the run has "
                          f"{world} processes; build it for {world} devices")
    devices = [block.device for block in blocks]
    if devices != list(range(world)):
        raise ConfigError(f"local block k must run on device k (got devices {devices})")
    names = [name for block in blocks for name in block.layers]
    if names != [layer.name for layer in graph.layers] or not all(b.layers for b in blocks):
        raise ConfigError("the local blocks must split every layer of the model, in graph "
                          "order, into non-empty blocks")
    found, position = [], -1
    for block in blocks[:-1]:
        position += len(block.layers)
        if position not in cuts:
            raise ConfigError(f"the local block ending at layer '{block.layers[-1]}' cuts "
                              "where more than one tensor crosses (inside a residual block) "
                              "or the model holds the tensor channels-last")
        found.append(cuts[position])
    return found


def predict(cost: CostModel, cuts: Sequence[Cut], overlapping: bool) -> Breakdown:
    """The Breakdown of blocks between `cuts` (see the module docstring)."""
    pricing = _Pricing(cost, cuts, overlapping)
    ends: list[Cut | None] = [None, *cuts, None]
    priced = [pricing.block(index, start, end)
              for index, (start, end) in enumerate(zip(ends, ends[1:], strict=False))]
    compute, transfer = max(priced, key=sum)
    passes = 2 if overlapping else 1  # activations forward; overlapping: gradients back
    moved = passes * sum(activation_bytes(cost.graph.by_name[cut.crossing]) for cut in cuts)
    return Breakdown(step_seconds=compute + transfer, compute_seconds=compute,
                     transfer_seconds=transfer, sync_seconds=0.0, transfer_bytes=moved,
                     sync_bytes=0)


def local_strategy(name: str, cost: CostModel, cuts: Sequence[Cut]) -> Strategy:
    """The strategy `name` with blocks between `cuts`, priced by `predict`."""
    if name not in VARIANTS:
        raise ConfigError(f"unknown local strategy '{name}'; choose from {', '.join(VARIANTS)}")
    variant = VARIANTS[name]
    blocks = blocks_for(cost.graph, cuts)
    assignment = {layer: ParallelConfig(devices=(block.device,))
                  for block in blocks for layer in block.layers}
    return Strategy.from_assignment(
        name, cost.graph, cost.devices, cost.cluster.name, cost.compute.name, assignment,
        predict(cost, cuts, variant == "overlapping"),
        LocalExecution(blocks=blocks, variant=variant))  # type: ignore[arg-type]


def build_strategy(name: str, cost: CostModel) -> Strategy:
    """`local` (greedy) or `local_overlap` (overlapping) on `cost.devices` balanced blocks."""
    if name not in VARIANTS:
        raise ConfigError(f"unknown local strategy '{name}'; choose from {', '.join(VARIANTS)}")
    return local_strategy(name, cost, best_cuts(cost, VARIANTS[name] == "overlapping"))


def reprice(strategy: Strategy, cost: CostModel) -> Strategy:
    """Saved local blocks checked against `cost`'s graph and processes (one block each, as
    the engine checks them) and priced afresh."""
    execution = strategy.execution
    assert isinstance(execution, LocalExecution)
    name = next(name for name, variant in VARIANTS.items() if variant == execution.variant)
    return local_strategy(name, cost, block_cuts(cost.graph, execution.blocks, cost.devices))
