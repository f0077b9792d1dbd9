"""SGD on a rank's own parameters: torch.optim.SGD's step, through torch's functional form.

torch.optim.Optimizer imports torch._dynamo the first time it is used (2.6 s of CPU on this
2-core machine, per process): more than a small model's whole training, paid by every rank of
every launch. torch.optim.sgd.sgd is the function SGD.step calls, with the same arguments and the
same choice between its loops, and needs no dynamo; this class keeps what the engines use of
the optimizer (its `state` of momentum buffers, its one param group's learning rate), as
SGD keeps them. The one-process reference of an exactness check steps torch.optim.SGD itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.sgd import sgd


class Sgd:
    """SGD with momentum and weight decay (no dampening, no Nesterov), as torch.optim.SGD."""

    def __init__(self, parameters: Iterable[torch.Tensor], lr: float, momentum: float,
                 weight_decay: float) -> None:
        self.parameters = list(parameters)
        self.param_groups: list[dict[str, Any]] = [
            {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}]
        self.state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)

    @torch.no_grad()
    def step(self) -> None:
        """One step of every parameter that has a gradient (SGD.step)."""
        group = self.param_groups[0]
        stepped = [parameter for parameter in self.parameters if parameter.grad is not None]
        buffers = [self.state[parameter].get("momentum_buffer") for parameter in stepped]
        sgd(stepped, [parameter.grad for parameter in stepped], buffers,
            weight_decay=group["weight_decay"], momentum=group["momentum"], lr=group["lr"],
            dampening=0.0, nesterov=False, maximize=False)
        if group["momentum"] != 0:
            for parameter, buffer in zip(stepped, buffers, strict=True):
                self.state[parameter]["momentum_buffer"] = buffer

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (set_to_none, SGD's default) or zero them."""
        for parameter in self.parameters:
            if parameter.grad is None:
                continue
            if set_to_none:
                parameter.grad = None
            else:
                parameter.grad.zero_()
