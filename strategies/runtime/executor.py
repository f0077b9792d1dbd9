"""Train one model under a Strategy: each rank computes exactly its tiles of every layer.

The step runs the layers in the graph's topological order on every rank, in phases all ranks
share: for each layer, one redistribution phase per input (point-to-point pieces of producer
tiles into each consumer tile's needed box, `plan.py`), then the tile computation (with
BatchNorm statistics reduced in the layer's replica group). The backward walks the same phases
in reverse: each layer's local autograd graph (needed boxes as leaves) is differentiated on its
own, and the gradients of the needed boxes go back to the producers' devices, where
overlapping halos add up (the gradient of a gather is a scatter-add). Because every rank meets
the phases in one global order and a phase waits only on ranks that reach it, nothing can
deadlock. Weight gradients replicated by n/h/w splits are summed in each replica group by
bucketed all-reduces that start as soon as their layers' backward is done (buckets.py), and
the optimizer steps on each rank's own shards.

Why our own engine: DTensor computes conv correctly only with the batch sharded (DESIGN 3.6,
3.7), and no library moves arbitrary receptive-field boxes between arbitrary tilings.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import fx, nn

from strategies import ops
from strategies.errors import ConfigError
from strategies.fx_nodes import active_dropout, count_include_pad
from strategies.graph import Layer
from strategies.runtime.buckets import GradientBuckets
from strategies.runtime.comm import Communicator
from strategies.runtime.functions import sharded_cross_entropy
from strategies.runtime.plan import (
    Box,
    InputPlan,
    LayerPlan,
    StrategyPlan,
    local_slices,
    shape_of,
)
from strategies.tiles import as_4d

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)


@dataclass
class _Shard:
    """One state-dict entry held by this rank: rows [start, stop) of the full tensor's dim 0."""

    key: str
    tensor: torch.Tensor  # nn.Parameter for weights, plain tensor for buffers
    start: int
    stop: int
    sliced: bool  # False for scalars (num_batches_tracked), held whole


@dataclass
class _LayerState:
    """This rank's part of one layer: its tile, its shards, and the autograd of the step."""

    plan: LayerPlan
    box: Box
    modules: dict[str, dict[str, _Shard]] = field(default_factory=dict)  # target -> shards
    leaves: list[torch.Tensor | None] = field(default_factory=list)
    output: torch.Tensor | None = None


def _weights(state: _LayerState) -> list[nn.Parameter]:
    return [shard.tensor for shards in state.modules.values() for shard in shards.values()
            if isinstance(shard.tensor, nn.Parameter)]


def _part(tensor: torch.Tensor, box: Box, within: Box) -> torch.Tensor:
    """The part of a tile (or its gradient) covering `box`, the tile covering `within`.

    Tiles keep their layer's own rank, (N, F) after a linear layer or a flatten, so that
    no step pays a reshape in and out of 4-d per layer (each is an autograd node forward and
    backward); a 2-d tile's box ranges over h and w are (0, 1), and its first two slices
    index it.
    """
    return tensor[local_slices(box, within)[: tensor.dim()]]


class LayerwiseModel:
    """One rank's share of a model under a StrategyPlan.

    Build it on every rank from the same full module (same seed, same weights): each rank
    keeps only the shards of the layers it holds tiles of. It consumes `module`: the traced
    graph shares its submodules, and their full weights move to the meta device (a copy would
    double the peak memory of building the model); `full_state_dict` gives them back.
    """

    def __init__(self, module: nn.Module, plan: StrategyPlan, comm: Communicator) -> None:
        self.plan = plan
        self.comm = comm
        self.rank = comm.rank
        self.graph_module = fx.symbolic_trace(module)
        self.nodes = {node.name: node for node in self.graph_module.graph.nodes}
        # resolved once: get_submodule per op and step cost ~0.3 ms of a 7 ms LeNet-5 step
        self._submodules = {node.name: self.graph_module.get_submodule(str(node.target))
                            for node in self.nodes.values() if node.op == "call_module"}
        self.batch = plan.graph.batch
        first = next(module.parameters(), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.dtype = first.dtype if first is not None else torch.get_default_dtype()
        self._check_modules()
        full_state = module.state_dict()
        self.states: dict[str, _LayerState] = {}
        for layer_plan in plan.layers:
            tile = layer_plan.tiles.get(self.rank)
            if tile is None:
                continue
            state = _LayerState(plan=layer_plan, box=tile.box)
            for target in self._module_targets(layer_plan.layer):
                state.modules[target] = self._shards(target, tile.box[1], full_state)
            self.states[layer_plan.layer.name] = state
        self._plan_of_target = {target: layer_plan for layer_plan in plan.layers
                                for target in self._module_targets(layer_plan.layer)}
        self.graph_module.to("meta")  # the full weights: each rank keeps its shards only
        holders = {name: layer for layer in plan.graph.layers
                   for name in (layer.name, *(fused.name for fused in layer.fused))}
        # (node, output shape, p, per-channel) of every active dropout, in forward order
        self._dropouts = [
            (node.name, holders[node.name].output_shape, *found)
            for node in self.graph_module.graph.nodes
            if (found := active_dropout(node, self.graph_module)) is not None
        ]
        # active dropout node -> whether its mask is per channel (dropout2d)
        self._active_dropouts = {name: per_channel for name, _, _, per_channel in self._dropouts}
        self._in_place = {name for name, node in self.nodes.items() if self._writes_input(node)}
        self._masks: dict[str, torch.Tensor] = {}
        self._buckets = GradientBuckets(comm, plan.groups())
        # consumer -> producer of every chained edge (see _chained_edges); and its producers
        self._chained = _chained_edges(plan)
        self._feeds_chain = set(self._chained.values())

    # ---- parameters ----------------------------------------------------------------------

    def _check_modules(self) -> None:
        users: dict[str, str] = {}
        for layer in self.plan.graph.layers:
            for target in self._module_targets(layer):
                if target in users:
                    raise ConfigError(
                        f"module '{target}' is used by layers '{users[target]}' and "
                        f"'{layer.name}' (shared weights); layerwise needs one layer per module"
                    )
                users[target] = layer.name

    def _module_targets(self, layer: Layer) -> list[str]:
        """Modules with parameters or buffers that a layer runs (main op, then fused ops)."""
        names = [layer.name, *(fused.name for fused in layer.fused)]
        targets = []
        for name in names:
            node = self.nodes[name]
            if node.op != "call_module":
                continue
            module = self.graph_module.get_submodule(str(node.target))
            if any(True for _ in module.parameters(recurse=False)) or any(
                    True for _ in module.buffers(recurse=False)):
                targets.append(str(node.target))
        return targets

    def _shards(self, target: str, channels: tuple[int, int],
                full_state: dict[str, torch.Tensor]) -> dict[str, _Shard]:
        module = self.graph_module.get_submodule(target)
        shards: dict[str, _Shard] = {}
        parameters = dict(module.named_parameters(recurse=False))
        buffers = dict(module.named_buffers(recurse=False))
        for name in [*parameters, *buffers]:
            key = f"{target}.{name}"
            full = full_state[key]
            sliced = full.dim() > 0
            start, stop = channels if sliced else (0, 1)
            data = full[start:stop].detach().clone() if sliced else full.detach().clone()
            tensor = nn.Parameter(data) if name in parameters else data
            shards[name] = _Shard(key=key, tensor=tensor, start=start, stop=stop, sliced=sliced)
        return shards

    def parameters(self) -> Iterator[nn.Parameter]:
        for _, parameter in self.named_parameters():
            yield parameter

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's weight shards, named by the plain module's state-dict keys."""
        for shard in self.shards():
            if isinstance(shard.tensor, nn.Parameter):
                yield shard.key, shard.tensor

    def parameter_keys(self) -> list[str]:
        """State-dict keys of every weight of the model (held by some rank), in order."""
        return [key for key, _ in self.graph_module.named_parameters()]

    def shards(self) -> Iterator[_Shard]:
        for state in self.states.values():
            for shards in state.modules.values():
                yield from shards.values()

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
        # the global loss is summed in the last gradient bucket of all ranks where there is one
        everyone = tuple(range(self.comm.world))
        self._buckets.finish(riders={everyone: loss})
        self.comm.count_ring("loss", "loss", loss.numel(), loss.element_size(), everyone)
        for state in self.states.values():
            state.leaves, state.output = [], None
        return loss[0]

    def _draw_dropout_masks(self) -> None:
        """Draw every dropout mask of the step, in the forward order of the plain module."""
        self._masks = {
            name: ops.dropout_mask(shape, probability, per_channel, self.device, self.dtype)
            for name, shape, probability, per_channel in self._dropouts
        }

    # ---- forward -------------------------------------------------------------------------

    def _forward_layer(self, index: int, layer_plan: LayerPlan, inputs: torch.Tensor) -> None:
        layer = layer_plan.layer
        state = self.states.get(layer.name)
        if layer.kind == "input":
            if state is not None:
                state.output = _part(inputs, state.box, _full_box(layer))
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
        state.output = self._finish(layer, state, leaves)

    def _finish(self, layer: Layer, state: _LayerState,
                inputs: list[torch.Tensor | None]) -> torch.Tensor:
        """The layer's op and the elementwise ops fused into it, on its input boxes."""
        out = self._compute(layer, state, inputs)
        for fused in layer.fused:
            out = self._elementwise(self.nodes[fused.name], out, layer, state)
        return out

    def _redistribute(self, index: int, input_plan: InputPlan) -> torch.Tensor | None:
        """Assemble this rank's needed box of one input from the producer tiles (forward)."""
        producer = self.states.get(input_plan.producer)
        sends = []
        for piece in input_plan.sends_from(self.rank):
            assert producer is not None and producer.output is not None
            part = _part(producer.output.detach(), piece.box, producer.box)
            sends.append((piece.target, part.reshape(shape_of(piece.box)).contiguous()))
        needed = input_plan.needed.get(self.rank)
        pieces = input_plan.received_by(self.rank) if needed is not None else []
        if (needed is not None and producer is not None and len(pieces) == 1
                and pieces[0].box == producer.box == needed):
            assert producer.output is not None
            self.comm.exchange(sends, [], tag=_tag(index, input_plan.index, 0),
                               layer=self.plan.layers[index].layer.name)
            return producer.output  # the tile itself: no copy
        receives = [(p.source, self._empty(shape_of(p.box))) for p in pieces if p.remote]
        self.comm.exchange(sends, receives, tag=_tag(index, input_plan.index, 0),
                           layer=self.plan.layers[index].layer.name)
        if needed is None:
            return None
        box = self._empty(shape_of(needed))
        received = iter(buffer for _, buffer in receives)
        for piece in pieces:
            if piece.remote:
                box[local_slices(piece.box, needed)] = next(received)
            else:
                assert producer is not None and producer.output is not None
                part = _part(producer.output.detach(), piece.box, producer.box)
                box[local_slices(piece.box, needed)] = part.reshape(shape_of(piece.box))
        rank = len(self.plan.by_name[input_plan.producer].layer.output_shape)
        return box.reshape(box.shape[:rank]) if rank < 4 else box  # the producer's rank

    def _compute(self, layer: Layer, state: _LayerState,
                 leaves: list[torch.Tensor | None]) -> torch.Tensor:
        """The layer's main op on this rank's needed boxes: its output tile, in the layer's
        own rank."""
        node = self.nodes[layer.name]
        if layer.kind == "elementwise":
            first = leaves[0]
            assert first is not None
            return self._elementwise(node, first, layer, state)
        shards = state.modules.get(layer.target, {})
        weight, bias = shards.get("weight"), shards.get("bias")
        return ops.layer_op(layer, leaves, weight.tensor if weight is not None else None,
                            bias.tensor if bias is not None else None, state.box,
                            count_include_pad(layer.op, node))

    def _elementwise(self, node: fx.Node, tile: torch.Tensor, layer: Layer,
                     state: _LayerState) -> torch.Tensor:
        """A one-input elementwise op on a tile (BatchNorm and dropout made split-exact)."""
        if node.name in self._active_dropouts:
            return ops.dropout(tile, self._masks[node.name], state.box,
                               self._active_dropouts[node.name])
        module = self._submodules.get(node.name)
        if isinstance(module, _BATCH_NORMS):
            return self._batch_norm(module, tile, layer, state, str(node.target))
        return ops.activation(tile, lambda x: self._call(node, module, x),
                              node.name in self._in_place)

    @staticmethod
    def _call(node: fx.Node, module: nn.Module | None, tile: torch.Tensor) -> torch.Tensor:
        """The node's own operation with `tile` for its one tensor argument."""
        args = fx.node.map_arg(node.args, lambda _: tile)
        kwargs = fx.node.map_arg(node.kwargs, lambda _: tile)
        if module is not None:
            return module(*args, **kwargs)
        if node.op == "call_function":
            return node.target(*args, **kwargs)  # type: ignore[operator]
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)

    def _batch_norm(self, module: nn.Module, x: torch.Tensor, layer: Layer,
                    state: _LayerState, target: str) -> torch.Tensor:
        assert isinstance(module, _BATCH_NORMS)
        shards = state.modules.get(target, {})

        def tensor(name: str) -> torch.Tensor | None:
            shard = shards.get(name)
            return shard.tensor if shard is not None else None

        tracked = shards.get("num_batches_tracked")
        if tracked is not None:
            tracked.tensor.add_(1)
        if module.momentum is None:
            raise ConfigError(f"layer '{layer.name}': BatchNorm with momentum=None (cumulative "
                              "average) is not supported; set a momentum")
        group = state.plan.replica_group(self.rank)
        sizes = as_4d(layer.output_shape)

        def reduce(values: torch.Tensor) -> torch.Tensor:
            return self.comm.all_reduce(values, group, (layer.name, "sync"))

        return ops.batch_norm(x, tensor("weight"), tensor("bias"), tensor("running_mean"),
                              tensor("running_var"), module.momentum, module.eps,
                              sizes[0] * sizes[2] * sizes[3], reduce if len(group) > 1 else None)

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
        (n0, n1), (c0, _), _, _ = state.box
        scores = state.output
        group = output.channel_group(self.rank)

        def group_reduce(op: dist.ReduceOp.RedOpType):  # noqa: ANN202
            def reduce(values: torch.Tensor) -> torch.Tensor:
                return self.comm.all_reduce(values, group, ("loss", "loss"), op=op)
            return reduce

        return sharded_cross_entropy(scores, targets[n0:n1], c0, len(group), self.batch,
                                     group_reduce(dist.ReduceOp.MAX),
                                     group_reduce(dist.ReduceOp.SUM))

    def _backward_layer(self, index: int, layer_plan: LayerPlan,
                        gradients: dict[str, torch.Tensor], loss_share: torch.Tensor) -> None:
        layer = layer_plan.layer
        if layer.kind == "input":
            return
        state = self.states.get(layer.name)
        if layer.name in self._feeds_chain:  # its consumer's backward ran through it
            if state is not None:
                self._buckets.add(layer.name, layer_plan.replica_group(self.rank),
                                  _weights(state))
        elif state is not None and state.output is not None and state.output.requires_grad:
            roots, root_gradients = [], []
            gradient = gradients.pop(layer.name, None)
            if gradient is not None:  # from its consumers
                roots.append(state.output)
                root_gradients.append(gradient.view(state.output.shape))
            if layer.name == self.plan.output.layer.name and loss_share.requires_grad:
                # the loss's backward runs on through this layer's tile in the same call (one
                # autograd call fewer per step: the loss's gradient by the tile and then the
                # tile's backward cost two)
                roots.append(loss_share)
                root_gradients.append(torch.ones_like(loss_share))
            if not roots:  # nothing reached this tile: its weights' gradients are zero
                roots, root_gradients = [state.output], [torch.zeros_like(state.output)]
            torch.autograd.backward(roots, root_gradients)
            self._buckets.add(layer.name, layer_plan.replica_group(self.rank),
                              _weights(state))
        if layer.name in self._chained:
            return
        for input_plan in layer_plan.inputs:
            if self.plan.by_name[input_plan.producer].layer.kind == "input":
                continue
            self._redistribute_gradient(index, input_plan, state, gradients)

    def _redistribute_gradient(self, index: int, input_plan: InputPlan,
                               state: _LayerState | None,
                               gradients: dict[str, torch.Tensor]) -> None:
        """Send the needed box's gradient back to the producer tiles; add what arrives."""
        sends = []
        local = []
        if state is not None and self.rank in input_plan.needed:
            leaf = state.leaves[input_plan.index]
            assert leaf is not None
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            needed = input_plan.needed[self.rank]
            for piece in input_plan.received_by(self.rank):
                part = _part(grad, piece.box, needed).reshape(shape_of(piece.box))
                if piece.remote:
                    sends.append((piece.source, part.contiguous()))
                else:
                    local.append((piece, part))
        producer = self.states.get(input_plan.producer)
        incoming = input_plan.sends_from(self.rank)
        receives = [(p.target, self._empty(shape_of(p.box))) for p in incoming]
        self.comm.exchange(sends, receives, tag=_tag(index, input_plan.index, 1),
                           layer=self.plan.layers[index].layer.name)
        if producer is None:
            return
        assert producer.output is not None
        total = gradients.get(input_plan.producer)
        for piece, part in [*local, *((p, b) for p, (_, b) in zip(incoming, receives,
                                                                   strict=True))]:
            if total is None:
                total = self._empty(shape_of(producer.box)).zero_()
                gradients[input_plan.producer] = total
            total[local_slices(piece.box, producer.box)] += part

    # ---- whole state ---------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The plain module's state_dict assembled on rank 0, on the CPU (None elsewhere)."""
        return self.gather({shard.key: shard.tensor.detach() for shard in self.shards()})

    def gather(self, shards: dict[str, torch.Tensor],
               keys: list[str] | None = None) -> dict[str, torch.Tensor] | None:
        """Full tensors on rank 0 (CPU) from each rank's shards, keyed by state-dict key.

        `shards` holds this rank's part of each of `keys` it holds (its weights and buffers,
        or the optimizer's momentum of its weights); `keys` (all state-dict keys by default)
        must be the same on every rank. Returns None on the other ranks.
        """
        empty = self.graph_module.state_dict()  # meta tensors: shapes and dtypes
        if keys is not None:
            empty = {key: empty[key] for key in keys}
        shapes = {key: tensor.shape for key, tensor in empty.items()}
        result = {key: torch.empty(tensor.shape, dtype=tensor.dtype)
                  for key, tensor in empty.items()}
        sends, receives, arrivals = [], [], []
        for tag, (key, owner, start, stop) in enumerate(self._shard_table(shapes)):
            if self.rank == 0 and owner == 0:
                _place(result[key], start, stop, shards[key].cpu())
            elif self.rank == 0:
                shape = (stop - start, *shapes[key][1:]) if shapes[key] else ()
                buffer = torch.empty(shape, dtype=empty[key].dtype, device=self.device)
                receives.append((owner, buffer, tag))
                arrivals.append((key, start, stop, buffer))
            elif owner == self.rank:
                sends.append((0, shards[key].contiguous(), tag))
        _exchange_tagged(sends, receives)
        if self.rank != 0:
            return None
        for key, start, stop, buffer in arrivals:
            _place(result[key], start, stop, buffer.cpu())
        return result

    def _shard_table(self, shapes: dict[str, torch.Size]) -> list[tuple[str, int, int, int]]:
        """(key, owner device, start, stop) of every shard of every state-dict entry.

        The owner of a channel shard is its tile with n, h, w index 0 (its replicas are
        equal); a scalar is owned by the tile with index 0. Every rank builds the same table.
        """
        table = []
        for key, shape in shapes.items():
            layer_plan = self._plan_of_target[key.rsplit(".", 1)[0]]
            for tile in layer_plan.tiles.values():
                if tile.index[0] or tile.index[2] or tile.index[3] or (
                        not shape and tile.index[1]):
                    continue
                start, stop = tile.box[1] if shape else (0, 1)
                table.append((key, tile.device, start, stop))
        return table

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Overwrite this rank's shards with their part of a full state_dict."""
        with torch.no_grad():
            for shard, part in zip(self.shards(), self.scatter(state).values(), strict=True):
                shard.tensor.copy_(part)

    def scatter(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's part of each full tensor (of the keys in `full`), on its device."""
        return {shard.key: (full[shard.key][shard.start:shard.stop] if shard.sliced
                            else full[shard.key]).to(self.device, shard.tensor.dtype)
                for shard in self.shards() if shard.key in full}


def _chained_edges(plan: StrategyPlan) -> dict[str, str]:
    """Consumer -> producer of every chained edge.

    An edge is chained when its producer feeds only this consumer, the consumer reads only it,
    and on every device the consumer needs exactly the producer's tile there: nothing moves.
    The consumer then computes on the producer's output tensor itself, so one autograd graph
    spans the chain and one backward call runs it (no leaf, no copied gradient, no empty
    exchange phase per layer). Every rank derives the same chains from the same plan.
    """
    consumers = plan.graph.consumers
    chained: dict[str, str] = {}
    for layer_plan in plan.layers:
        if len(layer_plan.inputs) != 1:
            continue
        input_plan = layer_plan.inputs[0]
        producer = plan.by_name[input_plan.producer]
        if (producer.layer.kind == "input" or consumers[producer.layer.name] != (
                layer_plan.layer.name,) or producer.layer.name in plan.graph.outputs):
            continue
        devices = set(producer.tiles)
        if set(input_plan.needed) != devices or set(layer_plan.tiles) != devices or any(
                piece.remote for piece in input_plan.pieces):
            continue
        if all(input_plan.needed[device] == tile.box
               for device, tile in producer.tiles.items()):
            chained[layer_plan.layer.name] = producer.layer.name
    return chained


def _place(full: torch.Tensor, start: int, stop: int, part: torch.Tensor) -> None:
    if full.dim() == 0:
        full.copy_(part.reshape(()))
    else:
        full[start:stop] = part


def _exchange_tagged(sends: list[tuple[int, torch.Tensor, int]],
                     receives: list[tuple[int, torch.Tensor, int]]) -> None:
    operations = [dist.P2POp(dist.isend, tensor, peer, tag=tag) for peer, tensor, tag in sends]
    operations += [dist.P2POp(dist.irecv, tensor, peer, tag=tag)
                   for peer, tensor, tag in receives]
    if operations:
        for work in dist.batch_isend_irecv(operations):
            work.wait()


def _full_box(layer: Layer) -> Box:
    n, c, h, w = ((0, size) for size in as_4d(layer.output_shape))
    return (n, c, h, w)


def _tag(layer_index: int, input_index: int, direction: int) -> int:
    """A message tag unique to one redistribution phase (gloo matches messages by tag)."""
    return (layer_index * 64 + input_index) * 2 + direction
