"""Local parallelism executed (Laskin, Metz et al. 2020, docs/research.md: local parallelism): one
block per rank.

Rank k holds block k (contiguous layers, planner.py cuts them) and, except the last,
an auxiliary head: global average pooling and one Linear to the classes. Each block learns
from its own loss, the cross-entropy of its head (the last block: the model's classifier), so
no gradient has to wait for the blocks after it: a rank updates (its own SGD over block and
head) as soon as its local backward is done. Not exact by design: this is not global backprop.

One `step(inputs, targets)` processes the global batch once on every rank: rank 0 runs block 0
on it, rank k > 0 receives block k-1's output; each sends its output on with `isend`, so it
starts its head's loss, backward and update (and then the next step) without waiting for the
blocks after it. A step starts by waiting for the sends of the step before the previous one
(`training_state` for all), so the sends of step t overlap the compute of step t+1.

Variants:
- greedy: a block's input is a detached leaf; no gradient crosses a block boundary.
- overlapping: block k also learns from block k+1's loss, one block back. In its step t,
  block k+1 computes g_t = dL_{k+1}(batch t) / d(block k's output of batch t) in the same
  backward as its own weight gradients (L_{k+1} is its head's loss, the model's for the last
  block, so g_t carries nothing from further blocks) and sends it back. The rule: g_t arrives
  one step late, in block k's step t+1, after block k's forward and head backward of batch
  t+1, so block k never waits for the blocks after it. Block k's update of step t+1 then
  applies the gradient of its head's loss on batch t+1 at its current weights W_{t+1} plus
  the vector-Jacobian product of g_t through block k's forward of batch t at the weights that
  forward ran with, W_t. To have that forward, block k runs it on a copy of its weights and
  keeps its graph for one step (weight stashing, as PipeDream): one more batch of activations
  and one copy of the weights held, one more backward pass through the block per step. Step 1
  has no delayed part; the last step's g_T is received by `training_state` (the end of every
  run and every checkpoint), checkpointed as a pending gradient and applied by the next step
  of a resumed run, so a resumed run equals an uninterrupted one.

The loss `step` returns on rank 0 is the last block's loss of the same batch (the model's
real classifier loss): the last rank sends it right after its forward and rank 0 waits for
it at the end of its step. Other ranks return their own block's loss.

BatchNorm: each block runs on one device over the whole batch, so its statistics are the
batch's (exact per block). Dropout: every rank draws every mask of the model from the global
generator in the plain module's forward order (ops.dropout_mask, as the layer-wise
executor) and applies its block's. Drawing only its own block's masks would be cheaper, but
then each rank's generator would drift apart, and a checkpoint holds rank 0's generator state
only (restored on every rank): a resumed run would draw other masks. So masks equal one
device's (the training is still not global backprop's).

State: the worker builds the whole plain module on every rank; block k's modules are shared
with it, and rank 0 gathers every block's parameters and buffers into the plain state_dict
(model.pt loads strictly into `build_model`, so validation evaluates the plain network).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import fx, nn
from torch.func import functional_call

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.model.sized_trace import trace_module
from layerwise.strategies.runtime.comm import ByteCounter, gather_tensor_trees
from layerwise.strategies.runtime.engine_protocol import MODEL_STATE_KEY, EngineContext
from layerwise.strategies.runtime.momentum import momentum_buffers
from layerwise.strategies.runtime.replay import draw_masks, model_dropouts
from layerwise.strategies.schedules.local.execution import LocalExecution
from layerwise.strategies.schedules.local.planner import Cut, block_cuts, output_classes

ACTIVATION_TAG = 1  # block k -> k+1: block k's output
GRADIENT_TAG = 2  # block k+1 -> k (overlapping): dL_{k+1} / d(block k's output)
LOSS_TAG = 3  # last block -> rank 0: the model's loss
AUX_KEY = "aux."  # prefix of auxiliary-head entries in "momentum" and "pending"



class AuxiliaryHead(nn.Module):
    """Block k's own classifier: global average pooling over its spatial dims and one Linear.

    Initialised from `generator` only (uniform in +-1/sqrt(features), as nn.Linear), so the
    global generator, and with it the dropout masks, are untouched.
    """

    def __init__(self, features: int, classes: int, generator: torch.Generator) -> None:
        super().__init__()
        bound = features ** -0.5
        self.weight = nn.Parameter(
            torch.empty(classes, features).uniform_(-bound, bound, generator=generator))
        self.bias = nn.Parameter(torch.empty(classes).uniform_(-bound, bound, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = x.mean(dim=tuple(range(2, x.dim()))) if x.dim() > 2 else x  # every spatial dim
        return F.linear(features, self.weight, self.bias)


def auxiliary_heads(graph: LayerGraph, cuts: list[Cut], seed: int) -> list[AuxiliaryHead]:
    """The heads of blocks 0..K-2, drawn in block order from one generator seeded by `seed`."""
    generator = torch.Generator().manual_seed(seed)
    classes = output_classes(graph)
    return [AuxiliaryHead(graph.by_name[cut.crossing].output_shape[1], classes, generator)
            for cut in cuts]


def block_module(traced: fx.GraphModule, graph: LayerGraph, layers: tuple[str, ...],
                 source: str, result: str, dropouts: set[str]) -> tuple[fx.GraphModule,
                                                                         list[str]]:
    """Block `layers` as a GraphModule (block_input, *dropout masks) -> value of `result`.

    `source` is the fx node whose value enters the block; the block's dropouts multiply by
    masks passed in (names returned in order), drawn once per step by every rank. Submodules
    are the plain module's own objects, so the block trains the plain module's weights.
    """
    members = {name for layer_name in layers
               for name in graph.by_name[layer_name].fx_nodes}
    block = fx.Graph()
    values: dict[str, fx.Node] = {source: block.placeholder("block_input")}
    masked = [node.name for node in traced.graph.nodes
              if node.name in members and node.name in dropouts]
    masks = {name: block.placeholder(f"{name}_mask") for name in masked}
    for node in traced.graph.nodes:
        if node.name not in members or node.name in values:
            continue
        if node.name in masks:
            producer = node.args[0]
            assert isinstance(producer, fx.Node)
            values[node.name] = block.call_function(
                operator.mul, (values[producer.name], masks[node.name]))
        else:
            values[node.name] = block.node_copy(node, lambda arg: values[arg.name])
    block.output(values[result])
    return fx.GraphModule(traced, block), masked


class LocalEngine:
    """Rank k's block of a local-parallel run (see the module docstring)."""

    def __init__(self, context: EngineContext) -> None:
        execution = context.strategy.execution
        assert isinstance(execution, LocalExecution)
        context.strategy.check_against(context.graph, context.world)
        graph = context.graph
        self.cuts = block_cuts(graph, execution.blocks, context.world)
        self.rank, self.world, self.device = context.rank, context.world, context.device
        self.graph = graph
        self.module = context.module
        self.overlapping = execution.variant == "overlapping"
        self.is_last = self.rank == self.world - 1
        traced = trace_module(context.module, graph.input_shape)
        self.dropouts = model_dropouts(traced, graph)
        source = graph.layers[0] if self.rank == 0 else graph.by_name[
            self.cuts[self.rank - 1].crossing]
        result = graph.by_name[graph.outputs[0] if self.is_last
                               else self.cuts[self.rank].crossing]
        self.block, self.mask_names = block_module(
            traced, graph, execution.blocks[self.rank].layers, source.value_node,
            result.value_node, {dropout.name for dropout in self.dropouts})
        heads = auxiliary_heads(graph, self.cuts, context.settings.seed)
        self.head = None if self.is_last else heads[self.rank].to(context.device)
        self.weights = dict(self.block.named_parameters())  # plain state-dict keys
        self.head_weights = ({} if self.head is None else
                             {f"{AUX_KEY}{self.rank}.{name}": parameter
                              for name, parameter in self.head.named_parameters()})
        self.optimizer = context.sgd([*self.weights.values(), *self.head_weights.values()])
        # the module's, also on a rank whose block holds no weights (a pooling-only block)
        self.dtype = next(context.module.parameters()).dtype
        self._counter = ByteCounter()
        # sends in flight (work, payload kept alive), the previous step's last
        self._sends: list[list[tuple[dist.Work, torch.Tensor]]] = []
        # overlapping, not last: block output and weight copy of the previous step's forward
        self._stash: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        self._pending: list[torch.Tensor] | None = None  # its delayed gradient, once received

    @property
    def counter(self) -> ByteCounter:
        return self._counter

    @property
    def clock(self) -> None:
        """Not clocked: this engine waits on its own sends and receives, outside a
        Communicator's clock."""
        return None

    @property
    def _stashing(self) -> bool:
        """Whether this block waits for the next block's gradient (overlapping, not last)."""
        return self.overlapping and not self.is_last

    # ---- one step --------------------------------------------------------------------------

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Block k on the global batch: forward, send on, local loss, backward, update."""
        if inputs.shape[0] != self.graph.batch:
            raise ConfigError(f"the local blocks are for a global batch of {self.graph.batch}, "
                              f"got {inputs.shape[0]} samples")
        self._finish_sends(keep_last=True)
        masks = self._draw_masks()
        block_input = self._block_input(inputs)
        weights = self._forward_weights()
        output = functional_call(self.block, dict(zip(self.weights, weights, strict=True)),
                                 (block_input, *masks))
        if not self.is_last:
            self._send(output.detach(), self.rank + 1, ACTIVATION_TAG,
                       self.cuts[self.rank].crossing)
        scores = output if self.head is None else self.head(output)
        loss = F.cross_entropy(scores, targets)
        if self.is_last and self.rank != 0:
            self._send(loss.detach().reshape(1), 0, LOSS_TAG, "loss", category="loss")
        self._update(loss, output, weights, block_input)
        return self._model_loss(loss)

    def _draw_masks(self) -> list[torch.Tensor]:
        """Every dropout mask of the model, drawn in forward order; this block's, in order."""
        drawn = draw_masks(self.dropouts, self.device, self.dtype)
        return [drawn[name] for name in self.mask_names]

    def _block_input(self, inputs: torch.Tensor) -> torch.Tensor:
        """The batch (block 0) or the previous block's output, as a leaf of this block."""
        if self.rank == 0:
            return inputs
        crossing = self.graph.by_name[self.cuts[self.rank - 1].crossing]
        received = torch.empty(crossing.output_shape, device=self.device, dtype=self.dtype)
        dist.recv(received, self.rank - 1, tag=ACTIVATION_TAG)
        return received.requires_grad_(self.overlapping)

    def _forward_weights(self) -> list[torch.Tensor]:
        """The block's weights for this forward: a copy when the graph must outlive the
        update (overlapping: the delayed gradient of step t+1 runs through it)."""
        if not self._stashing:
            return list(self.weights.values())
        return [weight.detach().clone().requires_grad_() for weight in self.weights.values()]

    def _update(self, loss: torch.Tensor, output: torch.Tensor, weights: list[torch.Tensor],
                block_input: torch.Tensor) -> None:
        """Local backward, the input gradient back (overlapping), then SGD on block + head."""
        sends_gradient = self.overlapping and self.rank > 0
        wanted = [*weights, *self.head_weights.values(), *([block_input] if sends_gradient
                                                             else [])]
        if not wanted:  # a last block without weights: nothing to learn
            return
        gradients = list(torch.autograd.grad(loss, wanted, retain_graph=self._stashing,
                                             allow_unused=True, materialize_grads=True))
        if sends_gradient:
            self._send(gradients.pop(), self.rank - 1, GRADIENT_TAG,
                       self.cuts[self.rank - 1].crossing)
        if self._stashing:
            delayed = self._delayed_gradients()
            for index, extra in enumerate(delayed or []):
                gradients[index] = gradients[index] + extra
            self._stash = (output, weights)
        parameters = [*self.weights.values(), *self.head_weights.values()]
        for parameter, gradient in zip(parameters, gradients, strict=True):
            parameter.grad = gradient
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def _delayed_gradients(self) -> list[torch.Tensor] | None:
        """Block k+1's gradient of the previous batch through this block's previous forward
        (None at the first step)."""
        self._receive_delayed()
        pending, self._pending = self._pending, None
        return pending

    def _receive_delayed(self) -> None:
        """Receive g_{t-1} from block k+1 and turn it into weight gradients (stash freed)."""
        if self._stash is None:
            return
        output, weights = self._stash
        self._stash = None
        incoming = torch.empty_like(output, memory_format=torch.contiguous_format)
        dist.recv(incoming, self.rank + 1, tag=GRADIENT_TAG)
        self._pending = list(torch.autograd.grad(output, weights, incoming, allow_unused=True,
                                                 materialize_grads=True)) if weights else []

    def _model_loss(self, loss: torch.Tensor) -> float:
        """Rank 0: the last block's loss of this batch (waits for it); others: their own."""
        if self.rank != 0 or self.is_last:
            return float(loss.detach())
        received = torch.empty(1, device=self.device, dtype=self.dtype)
        dist.recv(received, self.world - 1, tag=LOSS_TAG)
        return float(received[0])

    def _send(self, tensor: torch.Tensor, peer: int, tag: int, layer: str,
              category: str = "transfer") -> None:
        """Start sending `tensor` (kept alive until `_finish_sends`), counting its bytes."""
        payload = tensor.contiguous()
        self._sends[-1].append((dist.isend(payload, peer, tag=tag), payload))
        self._counter.add(layer, category, payload.numel() * payload.element_size())

    def _finish_sends(self, keep_last: bool) -> None:
        """Wait for the sends in flight; `keep_last` (at a step's start) leaves the previous
        step's running and opens this step's: block k+1's gradient of step t is received
        only in block k's step t+1, after its forward, and block k+1 must not wait for that
        before its own step t+1."""
        kept = self._sends[-1:] if keep_last else []
        for generation in self._sends[:len(self._sends) - len(kept)]:
            for work, _ in generation:
                work.wait()
        self._sends = [*kept, []] if keep_last else []

    # ---- whole state -----------------------------------------------------------------------

    def training_state(self) -> dict[str, Any] | None:
        """The plain state_dict, heads, momentum and pending delayed gradients on rank 0.

        Collective. Receives the delayed gradient in flight first (overlapping), so nothing
        is lost and every send is complete.
        """
        if self._stashing:
            self._receive_delayed()
        self._finish_sends(keep_last=False)
        part = {
            MODEL_STATE_KEY: dict(self.block.state_dict()),
            "aux": {key.removeprefix(AUX_KEY): value
                    for key, value in self.head_weights.items()},
            "momentum": momentum_buffers(self.optimizer,
                                         {**self.weights, **self.head_weights}.items()),
            "pending": ({} if self._pending is None else
                        dict(zip(self.weights, self._pending, strict=True))),
        }
        parts = gather_tensor_trees(part, self.rank, self.world, self.device)
        if parts is None:
            return None
        state = {key: value.detach().cpu().clone()
                 for key, value in self.module.state_dict().items()}
        merged: dict[str, Any] = {MODEL_STATE_KEY: state, "aux": {}, "momentum": {},
                                  "pending": {}}
        for gathered in parts:
            for entry, values in gathered.items():
                merged[entry].update(values)
        return merged

    def load_training_state(self, state: dict[str, Any]) -> None:
        """This rank's block, head, momentum and pending gradient from `training_state()`."""
        self.module.load_state_dict(state[MODEL_STATE_KEY])
        with torch.no_grad():
            for key, parameter in self.head_weights.items():
                parameter.copy_(state["aux"][key.removeprefix(AUX_KEY)])
        if self.optimizer is not None:
            for key, parameter in {**self.weights, **self.head_weights}.items():
                self.optimizer.state[parameter]["momentum_buffer"] = (
                    state["momentum"][key].to(self.device, parameter.dtype).clone())
        pending = [state["pending"][key] for key in self.weights if key in state["pending"]]
        self._pending = [gradient.to(self.device) for gradient in pending] if pending else None
        self._stash = None

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()
