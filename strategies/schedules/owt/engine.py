"""OWT (Krizhevsky 2014, docs/research.md: OWT) on torch.distributed: one worker per rank.

Every worker keeps a full replica of the sample-parallel part (every layer up to the flatten,
planner.py) and runs it on its own b = B/K rows of the global batch; it keeps rows
[start, stop) of every FC layer's weight and bias (its 1/K of the neurons). One step:
1. draw every dropout mask over the whole global batch, in the plain module's forward order
   (as the layer-wise executor does), so that each worker's rows and columns of a mask are the
   plain module's;
2. forward of the conv part on the worker's rows; BatchNorm statistics over the global batch
   (`sync_batch_norm`), as one device would compute them;
3. the FC passes of the scheme (a: one pass over all B rows; b: K turns of one worker's b rows;
   c: K rounds of b/K rows from every worker). Each pass assembles its rows on every worker
   (the hand-off), runs the worker's FC slices forward and backward, with an all-gather of the
   columns between consecutive FC layers (and the sum of the partial input gradients back) and
   the cross-entropy over class-split scores (`sharded_cross_entropy`), then sends the partial
   gradient of the pass's rows back to their owners. The next pass's hand-off is started
   before this pass computes, and the gradients' routes run while the next passes compute;
4. backward of the conv part from the gradient of the worker's rows; conv gradients summed
   with every worker owning 1/K of the flat gradient (reduce-scatter, then all-gather);
5. SGD on the conv replica and on the FC shards.

Without the variable batch the pass losses are scaled by 1/B, so the FC weight gradients
accumulated over the passes and the conv gradient are exactly the gradient of the global
batch's mean cross-entropy: one step equals one-process SGD. With `variable_batch` the rule is:
pass j (rows R_j, |R_j| = B/P for P passes) has loss L_j = mean cross-entropy over R_j with the
FC weights as the previous passes left them; the FC weights take one SGD step on grad L_j right
after pass j; the conv weights take one SGD step on the gradient of (1/P) sum_j L_j, whose
input gradient for R_j is (1/P) dL_j/dx, evaluated with pass j's FC weights. The step's loss
is (1/P) sum_j L_j. Scheme a has P = 1, so its variable batch is its fixed batch.

Bytes (categories of the ByteCounter): "transfer" for the hand-off and the FC column moves,
counted as the ring and direct algorithms send them (every scheme's total equals Eq. 1's for
the OWT configs); "sync" for the conv gradients (per layer, `ring_bytes` of its weights: the
padding that makes the flat buffer a multiple of K is not counted) and the BatchNorm
statistics; "loss" for the cross-entropy's reductions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import fx, nn

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.graph import Layer, LayerGraph
from layerwise.strategies.model.ops import sync_batch_norm
from layerwise.strategies.model.sized_trace import trace_module
from layerwise.strategies.model.space import tile_range
from layerwise.strategies.runtime.comm import ByteCounter, Communicator, ring_bytes
from layerwise.strategies.runtime.engine_protocol import MODEL_STATE_KEY, EngineContext
from layerwise.strategies.runtime.functions import sharded_cross_entropy
from layerwise.strategies.runtime.momentum import momentum_buffers
from layerwise.strategies.runtime.replay import (
    BATCH_NORMS,
    batch_norm_momentum,
    call_node,
    draw_masks,
    model_dropouts,
)
from layerwise.strategies.schedules.owt.execution import OwtExecution
from layerwise.strategies.schedules.owt.planner import OwtSplit, check_owt, owt_assignment
from layerwise.strategies.strategy import Strategy

# torch 2.13 names these all_gather_single / reduce_scatter_single and warns on the older
# names, which are the only ones of earlier releases
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


@dataclass
class _Pending:
    """A started collective and the tensor it fills."""

    work: dist.Work
    tensor: torch.Tensor

    def wait(self) -> torch.Tensor:
        self.work.wait()
        return self.tensor


class _Handoff(ABC):
    """How a scheme assembles each FC pass's rows and routes their gradients back.

    Collectives run asynchronously on a process group of their own, so they proceed while the
    FC passes use the default group. Bytes go to the first FC layer, the consumer of the
    hand-off (the executor counts transfers at the consumer too).
    """

    def __init__(self, rank: int, world: int, per_worker: int, device: torch.device,
                 group: dist.ProcessGroup, counter: ByteCounter, layer: str) -> None:
        self.rank = rank
        self.world = world
        self.per_worker = per_worker
        self.group = group
        self.counter = counter
        self.layer = layer
        self.rows = [index.to(device) for index in self._row_indices()]
        self.passes = len(self.rows)

    @abstractmethod
    def _row_indices(self) -> list[torch.Tensor]:
        """The global batch rows of every pass, in the order the pass's buffer holds them."""

    @abstractmethod
    def send(self, index: int, features: torch.Tensor) -> _Pending:
        """Start assembling pass `index`'s rows (every worker calls it with its own rows)."""

    @abstractmethod
    def return_gradient(self, index: int,
                        gradient: torch.Tensor) -> tuple[_Pending, slice | None]:
        """Start summing the workers' partial gradients of pass `index`'s rows into their
        owners; returns the pending result and which of this worker's rows it holds."""

    def _count(self, tensor: torch.Tensor, copies: int) -> None:
        self.counter.add(self.layer, "transfer", copies * tensor.numel() * tensor.element_size())


class _AllGather(_Handoff):
    """Scheme a: one pass over all K*b rows; backward reduce-scatter (ring: K-1 pieces each)."""

    def _row_indices(self) -> list[torch.Tensor]:
        return [torch.arange(self.world * self.per_worker)]

    def send(self, index: int, features: torch.Tensor) -> _Pending:
        rows = features.new_empty((self.world * self.per_worker, features.shape[1]))
        work = _all_gather(rows, features, group=self.group, async_op=True)
        self._count(features, self.world - 1)
        return _Pending(work, rows)

    def return_gradient(self, index: int,
                        gradient: torch.Tensor) -> tuple[_Pending, slice | None]:
        mine = gradient.new_empty((self.per_worker, gradient.shape[1]))
        work = _reduce_scatter(mine, gradient, group=self.group, async_op=True)
        self._count(mine, self.world - 1)
        return _Pending(work, mine), slice(None)


class _Broadcast(_Handoff):
    """Scheme b: in turn j worker j broadcasts its b rows; backward reduce to worker j.

    Counted as the root sending its rows to the K-1 others and every other worker sending its
    partial gradient to the root once.
    """

    def _row_indices(self) -> list[torch.Tensor]:
        return [torch.arange(turn * self.per_worker, (turn + 1) * self.per_worker)
                for turn in range(self.world)]

    def send(self, index: int, features: torch.Tensor) -> _Pending:
        rows = features.clone() if index == self.rank else torch.empty_like(features)
        work = dist.broadcast(rows, src=index, group=self.group, async_op=True)
        if index == self.rank:
            self._count(rows, self.world - 1)
        return _Pending(work, rows)

    def return_gradient(self, index: int,
                        gradient: torch.Tensor) -> tuple[_Pending, slice | None]:
        work = dist.reduce(gradient, dst=index, group=self.group, async_op=True)
        if index != self.rank:
            self._count(gradient, 1)
            return _Pending(work, gradient), None
        return _Pending(work, gradient), slice(None)


class _Rounds(_Handoff):
    """Scheme c: in round r every worker contributes its r-th b/K rows (an all-gather of b/K
    row pieces, so every round is a batch of b); backward reduce-scatter of the round's rows."""

    @property
    def piece(self) -> int:
        return self.per_worker // self.world

    def _row_indices(self) -> list[torch.Tensor]:
        return [torch.cat([torch.arange(worker * self.per_worker + round_ * self.piece,
                                        worker * self.per_worker + (round_ + 1) * self.piece)
                           for worker in range(self.world)])
                for round_ in range(self.world)]

    def _own(self, index: int) -> slice:
        return slice(index * self.piece, (index + 1) * self.piece)

    def send(self, index: int, features: torch.Tensor) -> _Pending:
        piece = features[self._own(index)]
        rows = features.new_empty((self.per_worker, features.shape[1]))
        work = _all_gather(rows, piece, group=self.group, async_op=True)
        self._count(piece, self.world - 1)
        return _Pending(work, rows)

    def return_gradient(self, index: int,
                        gradient: torch.Tensor) -> tuple[_Pending, slice | None]:
        mine = gradient.new_empty((self.piece, gradient.shape[1]))
        work = _reduce_scatter(mine, gradient, group=self.group, async_op=True)
        self._count(mine, self.world - 1)
        return _Pending(work, mine), self._own(index)


_HANDOFFS: dict[str, type[_Handoff]] = {"a": _AllGather, "b": _Broadcast, "c": _Rounds}


class _ColumnExchange:
    """Moves between consecutive channel-split FC layers over the default group.

    Forward: every worker's columns to every worker (all-to-all with uneven column counts,
    which gloo supports where all_gather does not). Backward: every worker's partial gradient
    of each worker's columns to that worker, summed there. Both hand back row-major tensors:
    an FC layer's backward follows its input's layout, and on a transposed input MKL took 85 ms
    for AlexNet's [8, 4096] input gradient that a row-major one gets in a few (the copy is of
    one pass's activations, a few hundred KB).
    """

    def __init__(self, splits: list[int], rank: int, counter: ByteCounter, layer: str) -> None:
        self.splits = splits
        self.rank = rank
        self.counter = counter
        self.layer = layer

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        mine = local.t().contiguous()
        received = local.new_empty((sum(self.splits), local.shape[0]))
        dist.all_to_all_single(received, mine.repeat(len(self.splits), 1),
                               output_split_sizes=self.splits,
                               input_split_sizes=[mine.shape[0]] * len(self.splits))
        self.counter.add(self.layer, "transfer",
                         (len(self.splits) - 1) * mine.numel() * mine.element_size())
        return received.t().contiguous()

    def reduce(self, gradient: torch.Tensor) -> torch.Tensor:
        pieces = gradient.t().contiguous()
        own = self.splits[self.rank]
        received = gradient.new_empty((len(self.splits) * own, gradient.shape[0]))
        dist.all_to_all_single(received, pieces, output_split_sizes=[own] * len(self.splits),
                               input_split_sizes=self.splits)
        self.counter.add(self.layer, "transfer",
                         (pieces.shape[0] - own) * pieces.shape[1] * pieces.element_size())
        return received.view(len(self.splits), own, -1).sum(0).t().contiguous()


class _GatherColumns(torch.autograd.Function):
    """y = the whole activation from every worker's columns; dL/dx = the sum over workers of
    their dL/dy at x's columns (each worker's next FC slice reads every column)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, exchange: _ColumnExchange) -> torch.Tensor:
        ctx.exchange = exchange
        return exchange.gather(local)

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.exchange.reduce(gradient), None


@dataclass
class _FcShard:
    """Rows [start, stop) of one FC weight or bias, keyed like the plain state_dict."""

    key: str
    tensor: nn.Parameter
    rows: int  # of the full tensor
    start: int
    stop: int


@dataclass
class _FcLayer:
    """This worker's neurons of one FC layer and what runs after its Linear."""

    columns: tuple[int, int]
    weight: _FcShard
    bias: _FcShard | None
    fused: list[fx.Node]
    exchange: _ColumnExchange | None  # gathers its input's columns (all but the first)

    @property
    def shards(self) -> list[_FcShard]:
        return [self.weight] if self.bias is None else [self.weight, self.bias]


def _check_configs(strategy: Strategy, graph: LayerGraph, workers: int) -> None:
    if strategy.check_against(graph, workers) != owt_assignment(graph, workers):
        raise ConfigError(
            f"strategy '{strategy.name}' runs OWT but does not split its layers as OWT does "
            f"(n={workers} up to the flatten, c={workers} after it); use --strategy "
            "owt_a|owt_b|owt_c[_vb]")


def _call(node: fx.Node, graph_module: fx.GraphModule, args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> torch.Tensor:
    """The node's own operation on the given arguments (its module looked up here), or the
    parameter it reads (a get_attr: the replica's own)."""
    if node.op == "get_attr":
        owner, _, name = str(node.target).rpartition(".")
        return getattr(graph_module.get_submodule(owner), name)
    module = graph_module.get_submodule(str(node.target)) if node.op == "call_module" else None
    return call_node(node, module, args, kwargs)


class OwtEngine:
    """One OWT worker: a replica of the conv part, 1/K of every FC layer (docs/research.md: OWT)."""

    def __init__(self, context: EngineContext) -> None:
        execution = context.strategy.execution
        assert isinstance(execution, OwtExecution)  # build_engine dispatches on the kind
        graph, workers = context.graph, context.world
        split = check_owt(graph, workers, execution.scheme)
        _check_configs(context.strategy, graph, workers)
        self.rank = context.rank
        self.world = workers
        self.device = context.device
        self.batch = graph.batch
        per_worker = graph.batch // workers
        self.own_rows = slice(self.rank * per_worker, (self.rank + 1) * per_worker)
        self.variable_batch = execution.variable_batch
        self.comm = Communicator(self.rank, workers, [])
        self.everyone = tuple(range(workers))
        self.module = context.module
        self.state_keys = list(self.module.state_dict())
        self.parameter_keys = [key for key, _ in self.module.named_parameters()]
        self.graph_module = trace_module(self.module, graph.input_shape)
        self._find_nodes(graph, split)
        self.fc = self._build_fc(graph, split)
        self.fc_keys = {shard.key for shard in self._fc_shards()}
        self.conv_parameters = {key: parameter for key, parameter in
                                self.module.named_parameters() if key not in self.fc_keys}
        # (layer, weights) of the replicated layers, whose gradients the sync sums
        self.conv_weights = [(name, graph.by_name[name].param_count) for name in split.samples
                             if graph.by_name[name].param_count]
        self.handoff = _HANDOFFS[execution.scheme](
            self.rank, workers, per_worker, self.device,
            dist.new_group(list(self.everyone)), self.comm.counter, split.channels[0])
        self.conv_optimizer = context.sgd(list(self.conv_parameters.values()))
        self.fc_optimizer = context.sgd([shard.tensor for shard in self._fc_shards()])
        first = next(iter(self.conv_parameters.values()), self.fc[0].weight.tensor)
        self.dtype = first.dtype
        self._masks: dict[str, torch.Tensor] = {}

    # ---- structure -------------------------------------------------------------------------

    def _find_nodes(self, graph: LayerGraph, split: OwtSplit) -> None:
        """The fx nodes of the conv part (in order), the layer holding every node, dropouts."""
        holders = {name: layer for layer in graph.layers
                   for name in layer.fx_nodes}
        samples = set(split.samples)
        nodes = [node for node in self.graph_module.graph.nodes if node.op != "output"]
        self.sample_nodes = [node for node in nodes if holders[node.name].name in samples]
        self.holders = holders
        flatten = graph.by_name[split.flatten]
        self.handoff_node = flatten.fused[-1].name if flatten.fused else flatten.name
        # (node, shape over the global batch, p, per channel), in forward order
        self.dropouts = model_dropouts(self.graph_module, graph, nodes)
        self.nodes = {node.name: node for node in nodes}

    def _build_fc(self, graph: LayerGraph, split: OwtSplit) -> list[_FcLayer]:
        """This worker's rows of every FC layer's weight and bias; the full ones are freed."""
        layers = []
        previous: list[int] | None = None  # neurons of every worker in the layer before
        for name in split.channels:
            layer = graph.by_name[name]
            linear = self.module.get_submodule(layer.target)
            assert isinstance(linear, nn.Linear)  # owt_split admits Linear layers only
            exchange = None
            if previous is not None:
                exchange = _ColumnExchange(previous, self.rank, self.comm.counter, name)
            layers.append(self._fc_layer(layer, linear, exchange))
            previous = [stop - start for start, stop in
                        (tile_range(linear.out_features, self.world, worker)
                         for worker in range(self.world))]
        return layers

    def _fc_layer(self, layer: Layer, linear: nn.Linear,
                  exchange: _ColumnExchange | None) -> _FcLayer:
        start, stop = tile_range(linear.out_features, self.world, self.rank)

        def shard(name: str) -> _FcShard:
            full = getattr(linear, name)
            return _FcShard(key=f"{layer.target}.{name}", rows=linear.out_features,
                            start=start, stop=stop,
                            tensor=nn.Parameter(full.detach()[start:stop].clone()))

        fc = _FcLayer(columns=(start, stop), weight=shard("weight"),
                      bias=shard("bias") if linear.bias is not None else None,
                      fused=[self.nodes[fused.name] for fused in layer.fused],
                      exchange=exchange)
        linear.to("meta")  # every worker keeps its rows only
        return fc

    def _fc_shards(self) -> Iterator[_FcShard]:
        for layer in self.fc:
            yield from layer.shards

    @property
    def counter(self) -> ByteCounter:
        return self.comm.counter

    @property
    def clock(self) -> None:
        """Not clocked: this engine waits on its own sends and receives, outside a
        Communicator's clock."""
        return None

    # ---- one step --------------------------------------------------------------------------

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        if inputs.shape[0] != self.batch:
            raise ConfigError(f"OWT was set up for a global batch of {self.batch}, "
                              f"got {inputs.shape[0]} samples")
        for optimizer in (self.conv_optimizer, self.fc_optimizer):
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
        self._draw_dropout_masks()
        features = self._sample_forward(inputs[self.own_rows])
        feature_grad, loss = self._fc_passes(features.detach().contiguous(), targets)
        if features.requires_grad:
            features.backward(feature_grad)
        self._sync_conv_gradients()
        if self.conv_optimizer is not None:
            self.conv_optimizer.step()
        if not self.variable_batch:
            self._fc_step()
        self.comm.all_reduce(loss, self.everyone, ("loss", "loss"))
        return float(loss[0])

    def _draw_dropout_masks(self) -> None:
        """Every dropout mask of the step over the global batch, in forward order."""
        self._masks = draw_masks(self.dropouts, self.device, self.dtype)

    def _sample_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The conv part on this worker's rows: the flatten's output (b x F)."""
        values: dict[str, torch.Tensor] = {}
        for node in self.sample_nodes:
            if node.op == "placeholder":
                values[node.name] = inputs
                continue
            args = fx.node.map_arg(node.args, lambda source: values[source.name])
            kwargs = fx.node.map_arg(node.kwargs, lambda source: values[source.name])
            values[node.name] = self._sample_op(node, args, kwargs)
        return values[self.handoff_node]

    def _sample_op(self, node: fx.Node, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> torch.Tensor:
        if node.name in self._masks:
            return args[0] * self._masks[node.name][self.own_rows]
        if node.op == "call_module":
            module = self.graph_module.get_submodule(str(node.target))
            if isinstance(module, BATCH_NORMS):
                return self._batch_norm(module, args[0], self.holders[node.name].name)
        return _call(node, self.graph_module, args, kwargs)

    def _batch_norm(self, module: nn.Module, x: torch.Tensor, layer: str) -> torch.Tensor:
        """BatchNorm over the global batch: every worker's rows (SyncBatchNorm semantics)."""
        momentum = batch_norm_momentum(module, layer)
        if module.num_batches_tracked is not None:
            module.num_batches_tracked.add_(1)

        def reduce(values: torch.Tensor) -> torch.Tensor:
            return self.comm.all_reduce(values, self.everyone, (layer, "sync"))

        count = x.numel() // x.shape[1] * self.world
        return sync_batch_norm(x, module.weight, module.bias, module.running_mean,
                               module.running_var, momentum, module.eps, count, reduce)

    def _fc_passes(self, features: torch.Tensor,
                   targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The scheme's FC passes; returns dL/d(this worker's features) and its loss share."""
        passes = self.handoff.passes
        scale = 1.0 / passes if self.variable_batch else 1.0
        loss = torch.zeros(1, device=self.device, dtype=self.dtype)
        arriving = [self.handoff.send(0, features)]
        returning = []
        for index in range(passes):
            if index + 1 < passes:
                arriving.append(self.handoff.send(index + 1, features))
            gradient, share = self._fc_pass(self.handoff.rows[index], arriving[index].wait(),
                                            targets)
            if self.variable_batch:
                self._fc_step()
            returning.append(self.handoff.return_gradient(index, gradient * scale))
            loss += share * scale
        feature_grad = torch.zeros_like(features)
        for pending, own in returning:
            received = pending.wait()
            if own is not None:
                feature_grad[own] = received
        return feature_grad, loss

    def _fc_pass(self, rows: torch.Tensor, inputs: torch.Tensor,
                 targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward of this worker's FC slices on one pass's rows.

        Returns the partial gradient of the pass's input (this worker's neurons' share) and
        the worker's share of the loss: mean over the global batch, or over the pass's rows
        with the variable batch.
        """
        inputs.requires_grad_(True)
        out = inputs
        for layer in self.fc:
            if layer.exchange is not None:
                out = _GatherColumns.apply(out, layer.exchange)
            out = F.linear(out, layer.weight.tensor,
                           layer.bias.tensor if layer.bias is not None else None)
            for node in layer.fused:
                out = self._fc_op(node, out, rows, layer.columns)
        batch = len(rows) if self.variable_batch else self.batch
        share = sharded_cross_entropy(out, targets[rows], self.fc[-1].columns[0], self.world,
                                      batch, self._loss_reduce(dist.ReduceOp.MAX),
                                      self._loss_reduce(dist.ReduceOp.SUM))
        share.backward()
        assert inputs.grad is not None
        return inputs.grad, share.detach()

    def _fc_op(self, node: fx.Node, x: torch.Tensor, rows: torch.Tensor,
               columns: tuple[int, int]) -> torch.Tensor:
        if node.name in self._masks:
            return x * self._masks[node.name][rows][:, columns[0]:columns[1]]
        args = fx.node.map_arg(node.args, lambda _: x)
        kwargs = fx.node.map_arg(node.kwargs, lambda _: x)
        return _call(node, self.graph_module, args, kwargs)

    def _loss_reduce(self, op: dist.ReduceOp.RedOpType):  # noqa: ANN202
        def reduce(values: torch.Tensor) -> torch.Tensor:
            return self.comm.all_reduce(values, self.everyone, ("loss", "loss"), op=op)
        return reduce

    def _fc_step(self) -> None:
        if self.fc_optimizer is not None:
            self.fc_optimizer.step()
            self.fc_optimizer.zero_grad(set_to_none=True)

    def _sync_conv_gradients(self) -> None:
        """Sum the conv replicas' gradients, every worker owning 1/K of the flat gradient:
        reduce-scatter, then all-gather (docs/research.md: OWT); the flat buffer is padded to K
        pieces."""
        gradients = [parameter.grad for parameter in self.conv_parameters.values()
                     if parameter.grad is not None]
        if not gradients:
            return
        flat = torch.cat([gradient.reshape(-1) for gradient in gradients])
        padded = F.pad(flat, (0, -flat.numel() % self.world))
        owned = padded.new_empty(padded.numel() // self.world)
        _reduce_scatter(owned, padded)
        _all_gather(padded, owned)
        offset = 0
        for gradient in gradients:
            gradient.copy_(padded[offset:offset + gradient.numel()].view_as(gradient))
            offset += gradient.numel()
        for layer, weights in self.conv_weights:
            self.comm.counter.add(layer, "sync", ring_bytes(weights, flat.element_size(),
                                                            self.world, self.rank))

    # ---- whole state -----------------------------------------------------------------------

    def training_state(self) -> dict[str, Any] | None:
        """The plain module's state_dict and SGD's momentum, full tensors keyed like it."""
        fc_state = self._gather_fc({shard.key: shard.tensor.detach()
                                    for shard in self._fc_shards()})
        fc_momentum = self._gather_fc(momentum_buffers(
            self.fc_optimizer, ((shard.key, shard.tensor) for shard in self._fc_shards())))
        if fc_state is None or fc_momentum is None:
            return None
        replicated = self.module.state_dict()
        model = {key: fc_state[key] if key in self.fc_keys else replicated[key].cpu().clone()
                 for key in self.state_keys}
        conv_momentum = momentum_buffers(self.conv_optimizer, self.conv_parameters.items())
        momentum = {key: fc_momentum[key] if key in self.fc_keys else conv_momentum[key].cpu()
                    for key in self.parameter_keys}
        return {MODEL_STATE_KEY: model, "momentum": momentum}

    def _gather_fc(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """Full FC tensors on rank 0 (CPU) from every worker's rows (collective)."""
        operations, arrivals = [], []
        full: dict[str, torch.Tensor] = {}
        for tag, shard in enumerate(self._fc_shards()):
            part = parts[shard.key]
            if self.rank != 0:
                operations.append(dist.P2POp(dist.isend, part.contiguous(), 0, tag=tag))
                continue
            full[shard.key] = torch.empty((shard.rows, *part.shape[1:]), dtype=part.dtype)
            full[shard.key][shard.start:shard.stop] = part.cpu()
            for worker in range(1, self.world):
                start, stop = tile_range(shard.rows, self.world, worker)
                buffer = part.new_empty((stop - start, *part.shape[1:]))
                operations.append(dist.P2POp(dist.irecv, buffer, worker, tag=tag))
                arrivals.append((shard.key, start, stop, buffer))
        if operations:
            for work in dist.batch_isend_irecv(operations):
                work.wait()
        for key, start, stop, buffer in arrivals:
            full[key][start:stop] = buffer.cpu()
        return full if self.rank == 0 else None

    def load_training_state(self, state: dict[str, Any]) -> None:
        model, momentum = state[MODEL_STATE_KEY], state["momentum"]
        with torch.no_grad():
            for key, tensor in self.module.state_dict().items():
                if key not in self.fc_keys:
                    tensor.copy_(model[key])
            for shard in self._fc_shards():
                shard.tensor.copy_(model[shard.key][shard.start:shard.stop])
        if self.conv_optimizer is not None:
            for key, parameter in self.conv_parameters.items():
                self.conv_optimizer.state[parameter]["momentum_buffer"] = (
                    momentum[key].to(self.device, parameter.dtype).clone())
        if self.fc_optimizer is not None:
            for shard in self._fc_shards():
                self.fc_optimizer.state[shard.tensor]["momentum_buffer"] = (
                    momentum[shard.key][shard.start:shard.stop]
                    .to(self.device, shard.tensor.dtype).clone())

    def barrier(self) -> None:
        self.comm.barrier()
