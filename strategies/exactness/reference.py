"""Exactness of a strategy, proven in float64 against plain one-device training.

The runtime's contract is that a step under an exact strategy computes what one device's SGD step on
the same global batch computes (docs/research.md: measured behaviour). Float32 cannot show it:
training is chaotic and a reduction in another order moves the loss by 1e-4 within a few steps
(docs/research.md: measured behaviour). In float64 that rounding is ~1e-16 per operation, too small
to flip a ReLU or a max-pool tie, so after K steps every weight of an exact strategy equals the
plain module's to ~1e-13 while a real error (a missing halo row, a gradient summed twice) shows at
1e-3 or more.

`reference_run` trains the plain module (no parallelism, torch's own SGD at the run's
learning-rate schedule) on the run's own settings, seed, global batches and dtype (float64
here); `compare` takes a run's result and final state_dict and measures the largest
difference of every loss and every parameter. `layerwise verify` saves the reference once
(`ReferenceRun.save`) and each run's rank 0 compares against it in the worker, writing
divergence.json instead of its weights: AlexNet's 488 MB of float64 weights, written and read
back once per strategy, took a third of checking it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict

from layerwise.strategies.files.atomic import atomic_path, save_tensors
from layerwise.strategies.runtime.datasets import GlobalBatches, load_dataset
from layerwise.strategies.runtime.initial_module import build_seeded
from layerwise.strategies.training_run import RunResult, TrainSettings

# Relative difference an exact strategy stays under. float64 rounding over a few steps gives
# 1e-16..1e-11 (measured on the zoo at 2 and 4 processes, docs/performance.md); a wrong tile or
# gradient gives 1e-3 or more: 1e-10 separates them by an order of magnitude and more.
EXACT_TOLERANCE = 1e-10


@dataclass(frozen=True)
class ReferenceRun:
    """The plain module's losses per step and its final state_dict."""

    losses: tuple[float, ...]
    state: dict[str, torch.Tensor]

    def save(self, path: Path) -> None:
        """Written atomically: the workers read it while the launcher waits on them."""
        with atomic_path(path) as temporary:
            save_tensors({"losses": list(self.losses), "state": self.state}, temporary, path)

    @classmethod
    def load(cls, path: Path) -> ReferenceRun:
        saved = torch.load(path, weights_only=True)
        return cls(losses=tuple(saved["losses"]), state=saved["state"])

    @functools.cached_property
    def module_scales(self) -> dict[str, float]:
        """The largest magnitude of each module's floating-point tensors (its weight, bias and
        running statistics together): once for every run a launch compares (a pass over
        AlexNet's 58M weights each time otherwise)."""
        scales: dict[str, float] = {}
        for key, value in self.state.items():
            if value.is_floating_point() and value.numel():
                module = _module_of(key)
                scales[module] = max(scales.get(module, 0.0), float(value.abs().max()))
        return scales


class Divergence(BaseModel):
    """How far a run's losses and weights are from one device's, after `steps` steps.

    Differences are relative: a loss's to the reference loss, a tensor's largest absolute
    difference to the largest magnitude in the reference module it belongs to (so a bias
    near zero does not inflate it; `_difference`). `exact` is None for strategies that are
    not exact by design (local updates, OWT's variable batch, pipelines that normalise
    BatchNorm per micro-batch): their divergence is reported, not judged.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: str
    nproc: int
    steps: int
    max_loss_difference: float
    max_parameter_difference: float
    worst_parameter: str
    tolerance: float
    exact: bool | None

    @property
    def largest(self) -> float:
        return max(self.max_loss_difference, self.max_parameter_difference)


def reference_run(settings: TrainSettings, steps: int) -> ReferenceRun:
    """`steps` SGD steps of the plain module on the run's settings and batches, in its dtype
    (float64 for an exactness check).

    Seeding, building the module and loading the data happen as in the torchrun worker (the
    same `build_seeded`), so the weights and the dropout masks the runtime replays are the same
    draws.
    """
    dtype = getattr(torch, settings.dtype)
    previous = torch.get_default_dtype()
    try:
        module = build_seeded(settings)
        data = load_dataset(settings.dataset, settings.image_size, settings.classes,
                            settings.in_channels, settings.seed, Path(settings.data_root))
        batches = GlobalBatches(data.train, settings.global_batch, settings.seed)
        optimizer = torch.optim.SGD(module.parameters(), lr=settings.lr,
                                    momentum=settings.momentum,
                                    weight_decay=settings.weight_decay)
        losses = []
        for step in range(1, steps + 1):
            x, y = batches.batch_at(step)
            for group in optimizer.param_groups:
                group["lr"] = settings.lr_at(step)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(module(torch.from_numpy(x).to(dtype)),
                                   torch.from_numpy(y))
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    finally:
        torch.set_default_dtype(previous)
    return ReferenceRun(losses=tuple(losses),
                        state={key: value.detach().clone()
                               for key, value in module.state_dict().items()})


def compare(result: RunResult, state: dict[str, torch.Tensor], reference: ReferenceRun,
            exact: bool) -> Divergence:
    """The run's divergence from `reference` (its losses per step and its final weights)."""
    losses = [record.loss for record in result.steps]
    if len(losses) != len(reference.losses):
        raise ValueError(f"the run has {len(losses)} steps, the reference "
                         f"{len(reference.losses)}")
    loss_difference = max(abs(a - b) / max(abs(b), 1e-300)
                          for a, b in zip(losses, reference.losses, strict=True))
    if state.keys() != reference.state.keys():
        raise ValueError("the run's model.pt does not hold the module's state_dict keys: "
                         f"{sorted(state.keys() ^ reference.state.keys())[:5]}")
    scales = reference.module_scales
    worst, worst_difference = "", 0.0
    for key, expected in reference.state.items():
        difference = _difference(state[key], expected, scales[_module_of(key)])
        if difference >= worst_difference:
            worst, worst_difference = key, difference
    return Divergence(strategy=result.strategy.name, nproc=result.nproc, steps=len(losses),
                      max_loss_difference=loss_difference,
                      max_parameter_difference=worst_difference, worst_parameter=worst,
                      tolerance=EXACT_TOLERANCE,
                      exact=(max(loss_difference, worst_difference) <= EXACT_TOLERANCE
                             if exact else None))


def _module_of(key: str) -> str:
    return key.rpartition(".")[0]


def _difference(actual: torch.Tensor, expected: torch.Tensor, scale: float) -> float:
    """Largest |actual - expected| over the largest magnitude in the tensor's module.

    The module's scale, not the tensor's own: a BatchNorm's bias gradient sums values that
    nearly cancel (the next BatchNorm makes its input's gradient zero-mean per channel), so a
    bias can sit far below the scale its rounding has, and against its own size two summation
    orders of Inception-v3 at 20 px differed by 1e-10. Against its module (the BatchNorm's
    weight, ~1) they differ by ~1e-15, and a real error (a missing all-reduce halves a
    gradient) still shows at the size of a step, 1e-4 and more. Integer buffers (BatchNorm's
    batch count) are compared as they are: equal counts give 0.
    """
    if actual.shape != expected.shape:
        raise ValueError(f"a saved tensor has shape {tuple(actual.shape)}, the module's "
                         f"{tuple(expected.shape)}")
    if not expected.numel():
        return 0.0
    difference = float((actual.double() - expected.double()).abs_().max())
    if not expected.is_floating_point():
        return difference
    return difference / scale if scale > 0 else difference
