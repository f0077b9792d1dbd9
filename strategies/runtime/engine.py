"""What the torchrun worker needs from one rank's share of a run, whatever executes it.

The worker (worker.py) owns the loop, the data, checkpoints and the result; an `Engine` owns
the model's parts on this rank, their optimizer and the communication of one step. The
strategy's `execution` (strategies/execution.py) picks the engine: the layer-wise executor, or
one of the schedules from the literature (OWT's hand-offs, the 1F1B pipeline, local
parallelism), which update their weights on their own timetable inside `step`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from strategies.graph import LayerGraph
from strategies.runtime.comm import ByteCounter, Communicator
from strategies.runtime.executor import LayerwiseModel
from strategies.runtime.momentum import momentum_buffers
from strategies.runtime.plan import build_plan
from strategies.runtime.result import TrainSettings
from strategies.strategy import Strategy

MODEL_STATE_KEY = "model"  # training_state()'s entry that model.pt holds


class Engine(Protocol):
    """One rank's part of a training run."""

    rank: int
    device: torch.device

    @property
    def counter(self) -> ByteCounter:
        """Bytes this rank sent, per (layer, category): transfer, sync or loss."""

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Forward, backward and weight update on one global batch (every rank gets all of it).

        Returns the step's training loss, the global batch's mean cross-entropy, on rank 0.
        """

    def training_state(self) -> dict[str, Any] | None:
        """Everything a resumed run needs, on rank 0 (CPU tensors); None elsewhere. Collective.

        Its `MODEL_STATE_KEY` entry is the plain module's state_dict (it loads strictly into
        `build_model(...)`); other entries (optimizer state, auxiliary weights) are the
        engine's own.
        """

    def load_training_state(self, state: dict[str, Any]) -> None:
        """Restore this rank's part from a `training_state()` (called on every rank)."""

    def barrier(self) -> None: ...


@dataclass(frozen=True)
class EngineContext:
    """What every engine is built from; the same on every rank."""

    settings: TrainSettings
    strategy: Strategy
    graph: LayerGraph  # at the global batch
    module: nn.Module  # the plain module, same seed and weights on every rank, on `device`
    rank: int
    world: int
    device: torch.device

    def sgd(self, parameters: list[nn.Parameter]) -> torch.optim.SGD | None:
        """The run's optimizer over `parameters` (None when this rank holds none)."""
        if not parameters:
            return None
        return torch.optim.SGD(parameters, lr=self.settings.lr, momentum=self.settings.momentum,
                               weight_decay=self.settings.weight_decay)


class LayerwiseEngine:
    """The layer-wise executor (executor.py) with plain SGD on this rank's shards."""

    def __init__(self, context: EngineContext) -> None:
        assignment = context.strategy.check_against(context.graph, context.world)
        plan = build_plan(context.graph, assignment, context.world)
        self.model = LayerwiseModel(context.module, plan,
                                    Communicator(context.rank, context.world, plan.groups()))
        self.rank = context.rank
        self.device = context.device
        self.optimizer = context.sgd(list(self.model.parameters()))

    @property
    def counter(self) -> ByteCounter:
        return self.model.comm.counter

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        loss = self.model.forward_backward(inputs, targets)
        if self.optimizer is not None:
            self.optimizer.step()
        return float(loss)

    def training_state(self) -> dict[str, Any] | None:
        """The full state_dict and SGD's momentum as full tensors keyed like it."""
        state = self.model.full_state_dict()
        buffers = momentum_buffers(self.optimizer, self.model.named_parameters())
        momentum = self.model.gather(buffers, keys=self.model.parameter_keys())
        if state is None:
            return None
        return {MODEL_STATE_KEY: state, "momentum": momentum}

    def load_training_state(self, state: dict[str, Any]) -> None:
        self.model.load_full_state_dict(state[MODEL_STATE_KEY])
        if self.optimizer is not None:
            parts = self.model.scatter(state["momentum"])
            for key, parameter in self.model.named_parameters():
                self.optimizer.state[parameter]["momentum_buffer"] = parts[key].clone()

    def barrier(self) -> None:
        self.model.comm.barrier()


def build_engine(context: EngineContext) -> Engine:
    """The engine the strategy's execution names (imported here: each pulls its own code)."""
    kind = context.strategy.execution.kind
    if kind == "owt":
        from strategies.runtime.owt import OwtEngine
        return OwtEngine(context)
    if kind == "pipeline":
        from strategies.runtime.pipeline import PipelineEngine
        return PipelineEngine(context)
    if kind == "local":
        from strategies.runtime.local import LocalEngine
        return LocalEngine(context)
    return LayerwiseEngine(context)
