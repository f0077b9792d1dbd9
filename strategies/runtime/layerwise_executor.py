"""Train one model under a Strategy: each rank computes exactly its tiles of every layer.

The step runs the layers in the graph's topological order on every rank, in phases all ranks share:
for each layer, one redistribution phase per input (point-to-point pieces of producer tiles into
each consumer tile's needed box, `plan.py`), then the tile computation (with BatchNorm statistics
reduced in the layer's replica group). The backward walks the same phases in reverse: each layer's
local autograd graph (needed boxes as leaves) is differentiated on its own, and the gradients of the
needed boxes go back to the producers' devices, where overlapping halos add up (the gradient of a
gather is a scatter-add); a layer's tensors are let go as soon as its backward is done. A layer the
plan recomputes runs its forward without autograd, keeping only its input boxes and output, and runs
it again with autograd at the start of its backward; its BatchNorm statistics are the forward's,
replayed rather than reduced or tracked again, so the recomputed tile is the forward's bit for bit.
Because every rank meets the phases in one global order and a phase waits only on ranks that reach
it, nothing can deadlock. Weight gradients replicated by n/h/w splits are summed in each replica
group by bucketed all-reduces that start as soon as their layers' backward is done (buckets.py), and
the optimizer steps on each rank's own shards (which rows of which weights a rank holds, and
checkpoints of them: shards.py). Each tile runs the layer's own op from
`layerwise.strategies.model.ops`, the code the profiler times.

Why our own engine: DTensor computes conv correctly only with the batch sharded (docs/research.md:
torch.distributed), and no library moves arbitrary receptive-field boxes between arbitrary
tilings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import fx, nn

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model import ops
from layerwise.strategies.model.fx_nodes import argument, count_include_pad
from layerwise.strategies.model.graph import Layer
from layerwise.strategies.model.space import as_view, view_dims
from layerwise.strategies.model.tiles import chained_edges
from layerwise.strategies.runtime.buckets import GradientBuckets
from layerwise.strategies.runtime.comm import Communicator
from layerwise.strategies.runtime.functions import sharded_cross_entropy
from layerwise.strategies.runtime.halo_exchange import HaloExchange, tile_part
from layerwise.strategies.runtime.plan import (
    Box,
    InputPlan,
    LayerPlan,
    StrategyPlan,
)
from layerwise.strategies.runtime.replay import (
    BATCH_NORMS,
    INSTANCE_NORMS,
    batch_norm_momentum,
    call_node,
    draw_masks,
    model_dropouts,
)
from layerwise.strategies.runtime.shards import ModuleShards, ShardedModel


@dataclass
class _LayerState:
    """This rank's part of one layer: its tile, its shards, and the autograd of the step."""

    plan: LayerPlan
    box: Box
    modules: ModuleShards  # its modules' shards, by module target
    leaves: list[torch.Tensor | None] = field(default_factory=list)
    output: torch.Tensor | None = None


def _weights(state: _LayerState, shared: bool) -> list[nn.Parameter]:
    """The layer's weight shards on this rank: those of one channel range (`shared` False),
    or those every channel tile holds whole (a PReLU's one slope)."""
    return [shard.tensor for shards in state.modules.values() for shard in shards.values()
            if isinstance(shard.tensor, nn.Parameter) and shard.shared == shared]


class LayerwiseModel(ShardedModel):
    """One rank's share of a model under a StrategyPlan: its shards (shards.py) and the
    phases of a training step on its tiles.

    Build it on every rank from the same full module (same seed, same weights); it consumes
    `module` (see ShardedModel).
    """

    def __init__(self, module: nn.Module, plan: StrategyPlan, comm: Communicator) -> None:
        super().__init__(module, plan, comm.rank)
        self.comm = comm
        self.halo = HaloExchange(comm, self.device, self.dtype)
        # resolved once here: get_submodule on every op of every step costs ~0.3 ms of a 7 ms
        # LeNet-5 step
        self._submodules = {node.name: self.graph_module.get_submodule(str(node.target))
                            for node in self.nodes.values() if node.op == "call_module"}
        self.batch = plan.graph.batch
        self.states: dict[str, _LayerState] = {}
        for name, modules in self.layer_shards.items():
            layer_plan = plan.by_name[name]
            self.states[name] = _LayerState(plan=layer_plan, modules=modules,
                                            box=layer_plan.tiles[self.rank].box)
        self._dropouts = model_dropouts(self.graph_module, plan.graph)
        self._in_place = {name for name, node in self.nodes.items() if self._writes_input(node)}
        self._masks: dict[str, torch.Tensor] = {}
        self._buckets = GradientBuckets(comm, plan.groups())
        # consumer -> producer of every chained edge (tiles.chained_edges); and its producers
        self._chained = chained_edges(plan.graph, {
            layer_plan.layer.name: {device: tile.box for device, tile in layer_plan.tiles.items()}
            for layer_plan in plan.layers}, plan.recompute)
        # (layer, BatchNorm target) -> the statistics its forward reduced, for the recompute
        self._statistics: dict[tuple[str, str], list[torch.Tensor]] = {}
        self._feeds_chain = set(self._chained.values())

    def _empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty(shape, device=self.device, dtype=self.dtype)

    # ---- one training step -----------------------------------------------------------------

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Run the forward and backward of one step on the global batch; returns the loss.

        Every rank passes the same global batch (it slices its own tiles). Gradients of this
        rank's shards are complete and synchronised on return. The loss is the global batch's
        mean cross-entropy on every rank.
        """
        if inputs.shape[0] != self.batch:
            raise ConfigError(f"the plan is for a global batch of {self.batch}, "
                              f"got {inputs.shape[0]} samples")
        self._draw_dropout_masks()
        for index, layer_plan in enumerate(self.plan.layers):
            self._forward_layer(index, layer_plan, inputs)
        loss_share = self._loss_share(targets)
        loss = loss_share.detach().reshape(1).clone()
        gradients: dict[str, torch.Tensor] = {}
        for index in reversed(range(len(self.plan.layers))):
            self._backward_layer(index, self.plan.layers[index], gradients, loss_share)
            if self.plan.layers[index].layer.name == self.plan.output.layer.name:
                # its graph holds the leaves of the layers its call ran through (a chain into
                # the output layer): let them go with the layers' own tensors
                loss_share = loss_share.detach()
        # the global loss is summed in the last gradient bucket of all ranks where there is one
        everyone = tuple(range(self.comm.world))
        self._buckets.finish(riders={everyone: loss})
        self.comm.count_ring("loss", "loss", loss.numel(), loss.element_size(), everyone)
        for state in self.states.values():
            state.leaves, state.output = [], None
        self._statistics.clear()
        return loss[0]

    def _draw_dropout_masks(self) -> None:
        """Draw every dropout mask of the step, in the forward order of the plain module."""
        self._masks = draw_masks(self._dropouts, self.device, self.dtype)

    # ---- forward -------------------------------------------------------------------------

    def _forward_layer(self, index: int, layer_plan: LayerPlan, inputs: torch.Tensor) -> None:
        layer = layer_plan.layer
        state = self.states.get(layer.name)
        if layer.kind == "input":
            if state is not None:
                state.output = tile_part(inputs, state.box, _full_box(layer))
            return
        if layer.name in self._chained:  # the producer's tile, still in its autograd graph
            if state is not None:
                producer = self.states[layer_plan.inputs[0].producer]
                state.leaves = [None]
                state.output = self._finish(layer, state, [producer.output])
            return
        boxes = [self._redistribute(index, input_plan) for input_plan in layer_plan.inputs]
        if state is None:
            return
        leaves: list[torch.Tensor | None] = []
        for input_plan, box in zip(layer_plan.inputs, boxes, strict=True):
            if box is None:
                leaves.append(None)
                continue
            needs_grad = self.plan.by_name[input_plan.producer].layer.kind != "input"
            leaves.append(box.detach().requires_grad_(needs_grad))
        state.leaves = leaves
        if layer.name in self.plan.recompute:  # its backward runs the forward again
            with torch.no_grad():
                state.output = self._finish(layer, state, leaves)
            return
        state.output = self._finish(layer, state, leaves)

    def _finish(self, layer: Layer, state: _LayerState,
                inputs: list[torch.Tensor | None]) -> torch.Tensor:
        """The layer's op and the elementwise ops fused into it, on its input boxes."""
        out = self._compute(layer, state, inputs)
        for fused in layer.fused:
            out = self._elementwise(self.nodes[fused.name], fused.op, out, layer, state)
        return out

    def _redistribute(self, index: int, input_plan: InputPlan) -> torch.Tensor | None:
        """Assemble this rank's needed box of one input from the producer tiles (forward)."""
        producer = self.states.get(input_plan.producer)
        return self.halo.gather(
            index, input_plan, producer.output if producer is not None else None,
            producer.box if producer is not None else None,
            len(self.plan.by_name[input_plan.producer].layer.output_shape),
            self.plan.layers[index].layer.name)

    def _compute(self, layer: Layer, state: _LayerState,
                 leaves: list[torch.Tensor | None]) -> torch.Tensor:
        """The layer's main op on this rank's needed boxes: its output tile, in the layer's
        own rank."""
        node = self.nodes[layer.name]
        if layer.kind == "elementwise":
            first = leaves[0]
            assert first is not None
            return self._elementwise(node, layer.op, first, layer, state)
        shards = state.modules.get(layer.target, {})
        weight, bias = shards.get("weight"), shards.get("bias")
        return ops.layer_op(layer, leaves, weight.tensor if weight is not None else None,
                            bias.tensor if bias is not None else None, state.box,
                            count_include_pad(layer.op, node))

    def _elementwise(self, node: fx.Node, op: str, tile: torch.Tensor, layer: Layer,
                     state: _LayerState) -> torch.Tensor:
        """A one-input elementwise op (graph.py's `op` name) on a tile (BatchNorm, GroupNorm,
        LayerNorm and dropout made split-exact)."""
        if node.name in self._masks:  # an active dropout: its mask drawn for this step
            return ops.dropout(tile, self._masks[node.name], state.box)
        module = self._submodules.get(node.name)
        if isinstance(module, BATCH_NORMS):
            return self._batch_norm(module, tile, layer, state, str(node.target))
        if isinstance(module, INSTANCE_NORMS):  # statistics summed over the plane's tiles
            weight, bias = _affine(state, str(node.target))
            return ops.sync_instance_norm(
                tile, weight, bias, module.eps, math.prod(layer.output_shape[2:]),
                self._statistics_reduce(layer, str(node.target),
                                        state.plan.plane_group(self.rank)))
        if isinstance(module, nn.PReLU):  # its slopes: this rank's channels' (or the one)
            return F.prelu(tile, _affine(state, str(node.target))[0])
        if isinstance(module, (nn.GroupNorm, nn.LayerNorm)):  # weights: this rank's shards
            weight, bias = _affine(state, str(node.target))
            if isinstance(module, nn.GroupNorm):  # statistics summed over the plane's tiles
                return ops.group_norm(tile, module.num_groups, module.num_channels, weight,
                                      bias, module.eps, math.prod(layer.output_shape[2:]),
                                      self._statistics_reduce(
                                          layer, str(node.target),
                                          state.plan.plane_group(self.rank)))
            return ops.layer_norm(tile, weight, bias, module.eps, ops.normalizes_channels(op))
        if node.target is F.group_norm:  # weight and bias: parameters it reads, or none
            return ops.group_norm(tile, int(argument(node, 1, "num_groups", 1)),
                                  layer.output_shape[1], _read(node, 2, "weight", state),
                                  _read(node, 3, "bias", state),
                                  float(argument(node, 4, "eps", 1e-5)),
                                  math.prod(layer.output_shape[2:]),
                                  self._statistics_reduce(layer, node.name,
                                                          state.plan.plane_group(self.rank)))
        if node.target is F.layer_norm and ops.normalizes_channels(op):
            return ops.layer_norm(tile, _read(node, 2, "weight", state),
                                  _read(node, 3, "bias", state),
                                  float(argument(node, 4, "eps", 1e-5)), over_channels=True)

        def tile_or_shard(arg: fx.Node, x: torch.Tensor) -> torch.Tensor:
            """The tile for the tensor the op runs on, this rank's shard for a parameter it
            reads directly (a layer scale)."""
            return _held(arg, state) if arg.op == "get_attr" else x

        return ops.activation(tile, lambda x: call_node(
            node, module, fx.node.map_arg(node.args, lambda arg: tile_or_shard(arg, x)),
            fx.node.map_arg(node.kwargs, lambda arg: tile_or_shard(arg, x))),
            node.name in self._in_place)

    def _batch_norm(self, module: nn.Module, x: torch.Tensor, layer: Layer,
                    state: _LayerState, target: str) -> torch.Tensor:
        momentum = batch_norm_momentum(module, layer.name)
        shards = state.modules.get(target, {})

        def tensor(name: str) -> torch.Tensor | None:
            shard = shards.get(name)
            return shard.tensor if shard is not None else None

        replay = self._replaying(layer)
        tracked = shards.get("num_batches_tracked")
        if tracked is not None and not replay:
            tracked.tensor.add_(1)
        running = (None, None) if replay else (tensor("running_mean"), tensor("running_var"))
        return ops.batch_norm(x, tensor("weight"), tensor("bias"), *running, momentum,
                              module.eps, math.prod(layer.output_shape) // layer.output_shape[1],
                              self._statistics_reduce(layer, target,
                                                      state.plan.replica_group(self.rank)))

    def _replaying(self, layer: Layer) -> bool:
        """Whether the layer's forward runs again now: recomputed, in its backward."""
        return layer.name in self.plan.recompute and torch.is_grad_enabled()

    def _statistics_reduce(self, layer: Layer, target: str, group: tuple[int, ...]
                           ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The all-reduce of a normalisation's statistics over `group` (None alone). For a
        recomputed layer the forward keeps what it reduced and the backward's second forward
        takes it back instead of reducing again, so the recomputed tile is the forward's bit
        for bit and the step moves the bytes a kept layer moves."""
        if len(group) == 1:
            return None
        recomputed, replay = layer.name in self.plan.recompute, self._replaying(layer)
        statistics = self._statistics.setdefault((layer.name, target), [])

        def reduce(values: torch.Tensor) -> torch.Tensor:
            if replay and statistics:  # the forward's sums; the backward's are reduced anew
                return statistics.pop()
            summed = self.comm.all_reduce(values, group, (layer.name, "sync"))
            if recomputed and not replay:
                statistics.append(summed.clone())
            return summed

        return reduce

    def _writes_input(self, node: fx.Node) -> bool:
        """Whether an elementwise node writes into its input (inplace=True or a `method_`)."""
        if node.op == "call_module":
            return bool(getattr(self._submodules[node.name], "inplace", False))
        if node.op == "call_method":
            return str(node.target).endswith("_")
        return bool(node.kwargs.get("inplace", False))

    # ---- loss and backward ---------------------------------------------------------------

    def _loss_share(self, targets: torch.Tensor) -> torch.Tensor:
        output = self.plan.output
        state = self.states.get(output.layer.name)
        if state is None:
            return self._empty(()).zero_()
        assert state.output is not None
        (n0, n1), (c0, _) = state.box[:2]
        scores = state.output
        group = output.channel_group(self.rank)
        # a dense output's targets are per position: this tile's share of them (the box is
        # in the 5-d view, the scores' spatial dims its last ones)
        spatial = view_dims(scores.dim())[2:]
        mine = targets[(slice(n0, n1), *(slice(*state.box[dim]) for dim in spatial))]

        def group_reduce(op: dist.ReduceOp.RedOpType):  # noqa: ANN202
            def reduce(values: torch.Tensor) -> torch.Tensor:
                return self.comm.all_reduce(values, group, ("loss", "loss"), op=op)
            return reduce

        predictions = self.batch * math.prod(output.layer.output_shape[2:])
        return sharded_cross_entropy(scores, mine, c0, len(group), predictions,
                                     group_reduce(dist.ReduceOp.MAX),
                                     group_reduce(dist.ReduceOp.SUM))

    def _backward_layer(self, index: int, layer_plan: LayerPlan,
                        gradients: dict[str, torch.Tensor], loss_share: torch.Tensor) -> None:
        layer = layer_plan.layer
        if layer.kind == "input":
            return
        state = self.states.get(layer.name)
        if layer.name in self.plan.recompute and state is not None:
            state.output = self._finish(layer, state, state.leaves)
        if layer.name in self._feeds_chain:  # its consumer's backward ran through it
            if state is not None:
                self._add_gradients(layer_plan, state)
        elif state is not None and state.output is not None and state.output.requires_grad:
            roots, root_gradients = [], []
            gradient = gradients.pop(layer.name, None)
            if gradient is not None:  # from its consumers
                roots.append(state.output)
                root_gradients.append(gradient.view(state.output.shape))
            if layer.name == self.plan.output.layer.name and loss_share.requires_grad:
                # the loss's backward runs on through this layer's tile in the same call: one
                # autograd call per step, where the loss's gradient by the tile followed by the
                # tile's backward would take two
                roots.append(loss_share)
                root_gradients.append(torch.ones_like(loss_share))
            if not roots:  # nothing reached this tile: its weights' gradients are zero
                roots, root_gradients = [state.output], [torch.zeros_like(state.output)]
            torch.autograd.backward(roots, root_gradients)
            self._add_gradients(layer_plan, state)
        if layer.name not in self._chained:
            for input_plan in layer_plan.inputs:
                if self.plan.by_name[input_plan.producer].layer.kind == "input":
                    continue
                self._redistribute_gradient(index, input_plan, state, gradients)
        if state is not None:  # its consumers' backward ran before: nothing reads it again
            state.leaves, state.output = [], None

    def _add_gradients(self, layer_plan: LayerPlan, state: _LayerState) -> None:
        """The layer's final weight gradients into the buckets: a channel shard's summed over
        its replicas, a tensor every channel tile holds whole over all the layer's tiles."""
        self._buckets.add(layer_plan.layer.name, layer_plan.replica_group(self.rank),
                          _weights(state, shared=False))
        self._buckets.add(layer_plan.layer.name, layer_plan.devices,
                          _weights(state, shared=True))

    def _redistribute_gradient(self, index: int, input_plan: InputPlan,
                               state: _LayerState | None,
                               gradients: dict[str, torch.Tensor]) -> None:
        """Send the needed box's gradient back to the producer tiles; add what arrives."""
        needed_gradient = None
        if state is not None and self.rank in input_plan.needed:
            leaf = state.leaves[input_plan.index]
            assert leaf is not None
            needed_gradient = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        producer = self.states.get(input_plan.producer)
        total = self.halo.return_gradient(
            index, input_plan, needed_gradient, producer.box if producer is not None else None,
            gradients.get(input_plan.producer), self.plan.layers[index].layer.name)
        if total is not None:
            gradients[input_plan.producer] = total


def _full_box(layer: Layer) -> Box:
    return tuple((0, size) for size in as_view(layer.output_shape))


def _held(attribute: fx.Node, state: _LayerState) -> torch.Tensor:
    """This rank's shard of a parameter or buffer an op reads directly (fx's get_attr)."""
    owner, _, name = str(attribute.target).rpartition(".")
    return state.modules[owner][name].tensor


def _read(node: fx.Node, index: int, name: str, state: _LayerState) -> torch.Tensor | None:
    """This rank's shard of the parameter a function call takes as argument `name` (F.layer_norm's
    weight, bias), None where it takes none."""
    value = argument(node, index, name, None)
    return _held(value, state) if isinstance(value, fx.Node) else None


def _affine(state: _LayerState, target: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """This rank's shards of a normalisation module's weight and bias (None where it has
    none)."""
    shards = state.modules.get(target, {})
    weight, bias = (shards.get(key) for key in ("weight", "bias"))
    return (weight.tensor if weight is not None else None,
            bias.tensor if bias is not None else None)
