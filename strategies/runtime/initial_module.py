"""The module every run of one launch starts from, built once per process.

`layerwise verify` trains every strategy of a model in one torchrun launch, each from the same
seed: building the float64 module again for each one drew the same random numbers again (AlexNet's
58M classifier weights: a third of each rank's time). Its first build is kept with the random
generator's state after it, and each later run of the same settings gets a copy and that state,
so what follows (dropout masks, batches) draws exactly what a fresh build would leave.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.training_run import TrainSettings


def build_seeded(settings: TrainSettings) -> nn.Module:
    """The module of `settings`, its weights drawn from its seed in its dtype (same on every
    rank)."""
    torch.set_default_dtype(getattr(torch, settings.dtype))  # weights, buffers, activations
    torch.manual_seed(settings.seed)  # same weights on every rank; dropout draws follow
    return build_model(
        settings.model,
        num_classes=settings.classes,
        image_size=settings.image_size,
        in_channels=settings.in_channels,
    )


@dataclass
class InitialModules:
    """Seeded modules already built in this process, by the settings that decide them."""

    built: dict[tuple[object, ...], tuple[nn.Module, torch.Tensor]] = field(default_factory=dict)

    def build(self, settings: TrainSettings) -> nn.Module:
        """What `build_seeded(settings)` returns, and the generator state it leaves."""
        key = (
            settings.model,
            settings.classes,
            settings.image_size,
            settings.in_channels,
            settings.dtype,
            settings.seed,
        )
        if key not in self.built:
            module = build_seeded(settings)
            self.built.clear()  # one model per launch: keep one, not every one seen
            self.built[key] = (copy.deepcopy(module), torch.get_rng_state())
            return module
        module, rng = self.built[key]
        torch.set_default_dtype(getattr(torch, settings.dtype))
        torch.manual_seed(settings.seed)  # the CUDA generators, as a fresh build seeds them
        torch.set_rng_state(rng)
        return copy.deepcopy(module)
