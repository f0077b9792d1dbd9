"""What the torchrun worker needs from one rank's share of a run, whatever executes it.

The worker (worker.py) owns the loop, the data, checkpoints and the result; an `Engine` owns
the model's parts on this rank, their optimizer and the communication of one step. Every engine
(the layer-wise executor's in engine.py, the schedules' in strategies/schedules/) is built from
an `EngineContext`; this module imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.runtime.comm import ByteCounter, WaitClock
from layerwise.strategies.sgd import Sgd
from layerwise.strategies.strategy import Strategy
from layerwise.strategies.training_run import TrainSettings

MODEL_STATE_KEY = "model"  # training_state()'s entry that model.pt holds


class Engine(Protocol):
    """One rank's part of a training run."""

    rank: int
    device: torch.device

    @property
    def counter(self) -> ByteCounter:
        """Bytes this rank sent, per (layer, category): transfer, sync or loss."""

    @property
    def clock(self) -> WaitClock | None:
        """Seconds this rank was blocked in communication, per category (None: not clocked)."""

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
    # every optimizer `sgd` built, so that the worker sets each step's learning rate on all
    optimizers: list[Sgd] = field(default_factory=list, compare=False)

    def sgd(self, parameters: list[nn.Parameter]) -> Sgd | None:
        """The run's optimizer over `parameters` (None when this rank holds none), at the
        schedule's peak rate until `start_step` sets a step's."""
        if not parameters:
            return None
        optimizer = Sgd(parameters, lr=self.settings.lr, momentum=self.settings.momentum,
                        weight_decay=self.settings.weight_decay)
        self.optimizers.append(optimizer)
        return optimizer

    def start_step(self, step: int) -> None:
        """Set the schedule's learning rate of `step` on every optimizer of this rank. The
        rate is a function of the step, so every rank and engine, and a resumed run, apply
        the same one without any state to save."""
        rate = self.settings.lr_at(step)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = rate
