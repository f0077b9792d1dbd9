"""The layer-wise executor's engine: the per-layer configs as they stand.

The registry (strategies/schedules/) names an engine per execution type and the loader builds
it: `LayerwiseEngine` here, or one of the schedules from the literature (OWT's hand-offs, the
1F1B pipeline, local parallelism), which update their weights on their own timetable inside
`step`.
"""

from __future__ import annotations

from typing import Any

import torch

from layerwise.strategies.runtime.comm import ByteCounter, Communicator, WaitClock
from layerwise.strategies.runtime.engine_protocol import MODEL_STATE_KEY, EngineContext
from layerwise.strategies.runtime.layerwise_executor import LayerwiseModel
from layerwise.strategies.runtime.momentum import momentum_buffers
from layerwise.strategies.runtime.plan import build_plan


class LayerwiseEngine:
    """The layer-wise executor (layerwise_executor.py) with plain SGD on this rank's shards."""

    def __init__(self, context: EngineContext) -> None:
        assignment = context.strategy.check_against(context.graph, context.world)
        plan = build_plan(context.graph, assignment, context.world, context.strategy.recompute)
        self.model = LayerwiseModel(context.module, plan,
                                    Communicator(context.rank, context.world, plan.groups()))
        self.rank = context.rank
        self.device = context.device
        self.optimizer = context.sgd(list(self.model.parameters()))

    @property
    def counter(self) -> ByteCounter:
        return self.model.comm.counter

    @property
    def clock(self) -> WaitClock:
        return self.model.comm.clock

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
