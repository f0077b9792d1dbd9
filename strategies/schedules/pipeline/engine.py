"""The 1F1B pipeline of Akintoye et al. (docs/research.md: pipeline) on torch.distributed: one
rank's stage.

    layerwise train lenet5 --strategy pipeline --nproc 2 --steps 100

Every rank belongs to one stage of the strategy's `PipelineExecution` (planner.py
chose the cuts, each stage's devices and M). A stage's module is the fx subgraph of its layers
(torch.fx.symbolic_trace of the plain module, then split_module). A step cuts the global batch
into M micro-batches and runs them one-forward-one-backward: stage s of S runs min(S-1-s, M)
warm-up forwards, then alternates one forward and one backward, then drains the backwards.
Activations go to the next stage and their gradients come back point to point ("transfer"
bytes). Inside a stage of d_s devices each device takes 1/d_s of every micro-batch's rows, and
rows move between the devices of adjacent stages whose shares overlap. Weight gradients
accumulate over the micro-batches; after the last backward the stage's devices all-reduce them
in one buffer ("sync" bytes) and SGD steps once. The last stage sends the loss to rank 0.

Exact without BatchNorm: a micro-batch's loss is its summed cross-entropy over the global batch
size, so the accumulated gradient is the global batch's mean gradient; dropout masks are drawn
over the global batch for every dropout in the plain forward's order at the start of the step,
on every rank (as one device draws them), and each device applies its rows. BatchNorm runs on
each device's rows of each micro-batch (GPipe's choice: statistics over the global batch would
wait for every micro-batch, which is what a pipeline avoids), so models with BatchNorm train
but not exactly as on one device (exactly only with M = 1 and one device per stage): running
statistics update once per micro-batch and the state keeps the stage's first device's.

Why not torch.distributed.pipelining: its Schedule1F1B runs our models on gloo with exact
gradients, but it pairs one rank per stage (a stage on two devices cannot feed a stage on one),
its sends bypass our byte counter and its dropout draws follow the schedule, not the forward.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.split_module import split_module

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.model.sized_trace import trace_module
from layerwise.strategies.runtime.buckets import flatten_into
from layerwise.strategies.runtime.comm import ByteCounter, Communicator
from layerwise.strategies.runtime.engine_protocol import MODEL_STATE_KEY, EngineContext
from layerwise.strategies.runtime.momentum import momentum_buffers
from layerwise.strategies.runtime.replay import Dropout, draw_masks, model_dropouts
from layerwise.strategies.schedules.pipeline.execution import PipelineExecution
from layerwise.strategies.schedules.pipeline.planner import (
    check_execution,
    crossing,
    row_pieces,
    stage_assignment,
)

_FORWARD, _BACKWARD = 0, 1
_Sent = tuple[dist.Work, torch.Tensor]  # a send in progress and the piece it sends
_LOSS_TAG = 1 << 24  # above every micro-batch's tags


class _MaskedDropout(nn.Module):
    """A dropout whose mask (this device's rows of one micro-batch) is set before each forward."""

    def __init__(self) -> None:
        super().__init__()
        self.mask: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.mask is not None
        return x * self.mask


@dataclass
class _InFlight:
    """A micro-batch between its forward and its backward on this stage."""

    index: int
    inputs: torch.Tensor | None  # the received activation (a leaf); None on the first stage
    outputs: torch.Tensor  # the activation sent on, or the loss share on the last stage


class PipelineEngine:
    """One rank's stage of a 1F1B pipeline, its optimizer and its transfers."""

    def __init__(self, context: EngineContext) -> None:
        execution = context.strategy.execution
        if not isinstance(execution, PipelineExecution):
            raise ConfigError(f"strategy '{context.strategy.name}' is not a pipeline")
        check_execution(context.graph, execution, context.world)
        _check_configs(context, execution)
        self.rank = context.rank
        self.device = context.device
        self.graph = context.graph
        # the loss averages over every prediction: a sample's, or each position's of a dense
        # output
        self.predictions = context.graph.batch * math.prod(
            context.graph.by_name[context.graph.outputs[0]].output_shape[2:])
        self.stages = execution.stages
        self.micro_batches = execution.micro_batches
        self.comm = Communicator(context.rank, context.world,
                                 [stage.devices for stage in self.stages])
        self.stage = next((index for index, stage in enumerate(self.stages)
                           if self.rank in stage.devices), None)
        self._cuts = _neighbour_cuts(context.graph, execution, self.stage)
        traced = trace_module(context.module, context.graph.input_shape)
        self._dropouts = _mask_dropouts(traced, context.graph)
        held = _hold_parameters(traced)
        modules, keys = _split(traced, context.module, context.graph, execution, held)
        self.module = modules[self.stage] if self.stage is not None else None
        self._keys = keys[self.stage] if self.stage is not None else {}
        plain_state = context.module.state_dict()
        self._shapes = {key: (tensor.shape, tensor.dtype) for key, tensor in plain_state.items()}
        self._parameter_keys = [key for key, _ in context.module.named_parameters()]
        self._owners = {key: self.stages[index].devices[0]
                        for index, stage_keys in enumerate(keys) for key in stage_keys.values()}
        # weights and buffers no stage runs never change: rank 0 keeps them for the state
        self._unused = {key: tensor.detach().cpu().clone() for key, tensor in plain_state.items()
                        if key not in self._owners and self.rank == 0}
        parameters = list(self.module.parameters()) if self.module is not None else []
        self.optimizer = context.sgd(parameters)
        self._flat: torch.Tensor | None = None  # the stage gradient all-reduce's buffer
        first = next(context.module.parameters(), None)
        self.dtype = first.dtype if first is not None else torch.get_default_dtype()

    @property
    def counter(self) -> ByteCounter:
        return self.comm.counter

    @property
    def clock(self) -> None:
        """Not clocked: this engine waits on its own sends and receives, outside a
        Communicator's clock."""
        return None

    # ---- one step ---------------------------------------------------------------------------

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        masks = list(draw_masks(self._dropouts, self.device, self.dtype).values())  # in order
        loss = torch.zeros((), dtype=self.dtype, device=self.device)
        if self.stage is not None:
            loss = self._one_f_one_b(inputs, targets, masks)
            self._sync_gradients()
            if self.optimizer is not None:
                self.optimizer.step()
        return self._loss_on_rank0(loss)

    def _one_f_one_b(self, inputs: torch.Tensor, targets: torch.Tensor,
                     masks: list[torch.Tensor]) -> torch.Tensor:
        """Warm-up forwards, one forward and one backward at a time, cool-down backwards.

        Returns this device's share of the loss (nonzero on the last stage only).
        """
        assert self.stage is not None
        warm_up = min(len(self.stages) - 1 - self.stage, self.micro_batches)
        in_flight: deque[_InFlight] = deque()
        sends: list[_Sent] = []
        loss = torch.zeros((), dtype=self.dtype, device=self.device)
        for index in range(self.micro_batches):
            flight = self._forward(index, inputs, targets, masks, sends)
            if self.stage == len(self.stages) - 1:
                loss = loss + flight.outputs.detach()
            in_flight.append(flight)
            if index >= warm_up:
                self._backward(in_flight.popleft(), sends)
        while in_flight:
            self._backward(in_flight.popleft(), sends)
        for work, _ in sends:
            work.wait()
        return loss

    def _rows(self, index: int) -> slice:
        """This device's rows of micro-batch `index` in the global batch."""
        assert self.stage is not None
        devices = self.stages[self.stage].devices
        size = self.graph.batch // self.micro_batches
        start = index * size + devices.index(self.rank) * size // len(devices)
        return slice(start, start + size // len(devices))

    def _forward(self, index: int, inputs: torch.Tensor, targets: torch.Tensor,
                 masks: list[torch.Tensor], sends: list[_Sent]) -> _InFlight:
        assert self.module is not None and self.stage is not None
        rows = self._rows(index)
        for dropout, mask in zip(self._dropouts, masks, strict=True):
            module = getattr(self.module, f"pipeline_mask_{dropout.name}", None)
            if module is not None:
                module.mask = mask[rows]
        received = None
        if self.stage == 0:
            activation = inputs[rows]
        else:
            received = self._receive(index, self.stage - 1, _FORWARD).requires_grad_()
            activation = received
        outputs = self.module(activation)
        if self.stage == len(self.stages) - 1:
            share = F.cross_entropy(outputs, targets[rows], reduction="sum") / self.predictions
            return _InFlight(index, received, share)
        sends += self._send(outputs.detach(), index, self.stage + 1, _FORWARD)
        return _InFlight(index, received, outputs)

    def _backward(self, flight: _InFlight, sends: list[_Sent]) -> None:
        assert self.stage is not None
        if self.stage == len(self.stages) - 1:
            flight.outputs.backward()
        else:
            gradient = self._receive(flight.index, self.stage + 1, _BACKWARD)
            torch.autograd.backward(flight.outputs, gradient)
        if flight.inputs is not None:
            assert flight.inputs.grad is not None
            sends += self._send(flight.inputs.grad, flight.index, self.stage - 1, _BACKWARD)

    # ---- transfers between stages -----------------------------------------------------------

    def _send(self, tensor: torch.Tensor, index: int, peer: int,
              direction: int) -> list[_Sent]:
        """Send this device's rows of `tensor` to the devices of stage `peer` that need them
        (each piece stays referenced until its send is done)."""
        assert self.stage is not None
        mine, theirs = self.stages[self.stage].devices, self.stages[peer].devices
        size = self.graph.batch // self.micro_batches
        offset = mine.index(self.rank) * size // len(mine)
        works = []
        for sender, receiver, start, stop in row_pieces(size, len(mine), len(theirs)):
            if mine[sender] != self.rank:
                continue
            piece = tensor[start - offset:stop - offset].contiguous()
            works.append((dist.isend(piece, theirs[receiver], tag=_tag(index, direction)), piece))
            self.counter.add(self._cuts[peer], "transfer", piece.numel() * piece.element_size())
        return works

    def _receive(self, index: int, peer: int, direction: int) -> torch.Tensor:
        """This device's rows of the tensor stage `peer` sends for micro-batch `index`."""
        assert self.stage is not None
        mine, theirs = self.stages[self.stage].devices, self.stages[peer].devices
        size = self.graph.batch // self.micro_batches
        sample = self.graph.by_name[self._cuts[peer]].output_shape[1:]
        buffers, works = [], []
        for sender, receiver, start, stop in row_pieces(size, len(theirs), len(mine)):
            if mine[receiver] != self.rank:
                continue
            buffer = torch.empty((stop - start, *sample), dtype=self.dtype, device=self.device)
            works.append(dist.irecv(buffer, theirs[sender], tag=_tag(index, direction)))
            buffers.append(buffer)
        for work in works:
            work.wait()
        return buffers[0] if len(buffers) == 1 else torch.cat(buffers)

    # ---- gradients and loss -----------------------------------------------------------------

    def _sync_gradients(self) -> None:
        """Sum the stage's accumulated weight gradients over its devices: one all-reduce.

        The flat buffer is kept from step to step (a fresh one page-faults every step).
        """
        assert self.stage is not None
        group = self.stages[self.stage].devices
        if len(group) == 1 or self.module is None:
            return
        parameters = list(self.module.parameters())
        if not parameters:
            return
        self._flat = flat = flatten_into(
            self._flat, [p.grad if p.grad is not None else torch.zeros_like(p)
                         for p in parameters])
        self.comm.all_reduce(flat, group, None)
        for name in self.stages[self.stage].layers:
            self.comm.count_ring(name, "sync", self.graph.by_name[name].param_count,
                                 flat.element_size(), group)
        offset = 0
        for parameter in parameters:
            parameter.grad = flat[offset:offset + parameter.numel()].view_as(parameter)
            offset += parameter.numel()

    def _loss_on_rank0(self, share: torch.Tensor) -> float:
        """The last stage's devices send their loss shares to rank 0, which adds them up."""
        last = self.stages[-1].devices
        if self.rank in last and self.rank != 0:
            payload = share.detach().reshape(1)
            dist.isend(payload, 0, tag=_LOSS_TAG).wait()
            self.counter.add("loss", "loss", payload.numel() * payload.element_size())
        if self.rank != 0:
            return float(share)
        total = share.detach().clone() if 0 in last else torch.zeros_like(share)
        for device in last:
            if device != 0:
                received = torch.empty(1, dtype=self.dtype, device=self.device)
                dist.irecv(received, device, tag=_LOSS_TAG).wait()
                total += received[0]
        return float(total)

    # ---- whole state ------------------------------------------------------------------------

    def training_state(self) -> dict[str, Any] | None:
        """The full state_dict and SGD's momentum keyed like it, on rank 0 (collective)."""
        owned = self._owned_tensors()
        state = self._gather(owned, list(self._shapes), self._unused)
        still = {key: torch.zeros_like(self._unused[key]) for key in self._parameter_keys
                 if key in self._unused}
        weights = ((key, tensor) for key, tensor in owned.items()
                   if isinstance(tensor, nn.Parameter))
        momentum = self._gather(momentum_buffers(self.optimizer, weights), self._parameter_keys,
                                still)
        if state is None or momentum is None:
            return None
        return {MODEL_STATE_KEY: state, "momentum": momentum}

    def _owned_tensors(self) -> dict[str, torch.Tensor]:
        """The plain state_dict's entries this rank's stage holds, by plain key."""
        if self.module is None:
            return {}
        local = self.module.state_dict(keep_vars=True)
        return {plain: local[key] for key, plain in self._keys.items()}

    def _gather(self, owned: dict[str, torch.Tensor], keys: list[str],
                unused: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """Full tensors of `keys` on rank 0 (CPU), each sent by its stage's first device;
        `unused` holds rank 0's values of the keys no stage owns."""
        result: dict[str, torch.Tensor] = {}
        works, arrivals = [], []
        for tag, key in enumerate(keys):
            owner = self._owners.get(key)
            if self.rank == 0 and owner in (0, None):
                tensor = owned[key] if owner == 0 else unused[key]
                result[key] = tensor.detach().cpu().clone()
            elif self.rank == 0:
                shape, dtype = self._shapes[key]
                buffer = torch.empty(shape, dtype=dtype, device=self.device)
                works.append(dist.irecv(buffer, owner, tag=tag))
                arrivals.append((key, buffer))
            elif owner == self.rank:
                works.append(dist.isend(owned[key].detach().contiguous(), 0, tag=tag))
        for work in works:
            work.wait()
        if self.rank != 0:
            return None
        result.update({key: buffer.cpu() for key, buffer in arrivals})
        return {key: result[key] for key in keys}

    def load_training_state(self, state: dict[str, Any]) -> None:
        weights, momentum = state[MODEL_STATE_KEY], state["momentum"]
        self._unused.update({key: weights[key].clone() for key in self._unused})
        with torch.no_grad():
            for key, tensor in self._owned_tensors().items():
                tensor.copy_(weights[key])
                if isinstance(tensor, nn.Parameter) and self.optimizer is not None:
                    self.optimizer.state[tensor]["momentum_buffer"] = (
                        momentum[key].to(self.device, tensor.dtype).clone())

    def barrier(self) -> None:
        self.comm.barrier()


def _neighbour_cuts(graph: LayerGraph, execution: PipelineExecution,
                    stage: int | None) -> dict[int, str]:
    """For each adjacent stage, the layer whose tensor crosses the cut between them."""
    if stage is None:
        return {}
    cuts = {}
    for peer in (stage - 1, stage + 1):
        if 0 <= peer < len(execution.stages):
            position = sum(len(s.layers) for s in execution.stages[:max(peer, stage)])
            (cuts[peer],) = crossing(graph, position)
    return cuts


def _tag(index: int, direction: int) -> int:
    """A message tag unique to one micro-batch and direction within a step."""
    return 2 * index + direction


def _check_configs(context: EngineContext, execution: PipelineExecution) -> None:
    """Each layer's config must be its stage's n{d_s} on the stage's devices."""
    expected = stage_assignment(context.graph, execution)
    for name, config in context.strategy.check_against(context.graph, context.world).items():
        if config != expected[name]:
            raise ConfigError(f"layer '{name}' has config {config.text}, but its pipeline "
                              f"stage runs {expected[name].text}")


def _mask_dropouts(traced: fx.GraphModule, graph: LayerGraph) -> list[Dropout]:
    """Replace every active dropout with a `_MaskedDropout` (submodule
    `pipeline_mask_<node>`), in forward order; returns the dropouts it replaced."""
    dropouts = model_dropouts(traced, graph)
    nodes = {node.name: node for node in traced.graph.nodes}
    for dropout in dropouts:
        node = nodes[dropout.name]
        target = f"pipeline_mask_{node.name}"
        traced.add_submodule(target, _MaskedDropout())
        node.op, node.target = "call_module", target
        node.args, node.kwargs = (node.args[0],), {}
    traced.recompile()
    return dropouts


class _Held(nn.Module):
    """A parameter or buffer the model reads directly (fx's get_attr: a layer scale) as a
    module returning it: split_module hands a get_attr's tensor to the stage as an input, a
    module it places in the stage, so the stage owns and trains the parameter."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        if isinstance(value, nn.Parameter):
            self.value = value
        else:
            self.register_buffer("value", value)

    def forward(self) -> torch.Tensor:
        return self.value


def _hold_parameters(traced: fx.GraphModule) -> dict[str, str]:
    """Replace every get_attr of a tensor with a call of a `_Held` module sharing it
    (submodule `pipeline_held_<node>`); returns each held module's target -> the tensor's
    state-dict key."""
    held = {}
    for node in traced.graph.nodes:
        if node.op != "get_attr":
            continue
        owner, _, name = str(node.target).rpartition(".")
        target = f"pipeline_held_{node.name}"
        traced.add_submodule(target, _Held(getattr(traced.get_submodule(owner), name)))
        held[target] = str(node.target)
        node.op, node.target = "call_module", target
    traced.recompile()
    return held


def _split(traced: fx.GraphModule, root: nn.Module, graph: LayerGraph,
           execution: PipelineExecution, held: dict[str, str]
           ) -> tuple[list[fx.GraphModule], list[dict[str, str]]]:
    """Each stage's module (split_module) and its state_dict keys mapped to the plain keys
    (a held parameter's to its own)."""
    stage_of = {name: index for index, stage in enumerate(execution.stages)
                for layer in stage.layers
                for name in graph.by_name[layer].fx_nodes}
    qualified: dict[str, str] = {}
    split = split_module(traced, root, lambda node: stage_of[node.name],
                         qualname_map=qualified)
    modules, keys = [], []
    for index in range(len(execution.stages)):
        module = getattr(split, f"submod_{index}")
        plain = {key: _plain_key(index, key, qualified) for key in module.state_dict()}
        keys.append({key: held.get(name.rpartition(".")[0], name)
                     for key, name in plain.items()})
        modules.append(module)
    return modules, keys


def _plain_key(index: int, key: str, qualified: dict[str, str]) -> str:
    owner, _, attribute = key.rpartition(".")
    return f"{qualified[f'submod_{index}.{owner}']}.{attribute}"
