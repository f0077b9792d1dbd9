"""The ranges of a training run's hyperparameters, as pydantic types that every contract asking
for them shares: `TrainSettings`, `TrainOptions` and the benchmark's `BenchmarkConfig`; and the
one rule of the global batch they share.

Out of range, each ran without a word before: a momentum of 5 grows every step, a rate of NaN
or inf failed only inside the workers, one class has nothing to learn. Pydantic only, so that
the benchmark config is checked without importing torch.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

LearningRate = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Momentum = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]  # 1 or more never forgets
WeightDecay = Annotated[float, Field(ge=0, allow_inf_nan=False)]
WarmupSteps = Annotated[int, Field(ge=0)]
ClassCount = Annotated[int, Field(ge=2)]  # cross-entropy over one class is 0 whatever the weights


def global_batch(batch: int | None, batch_per_device: int | None, processes: int) -> int:
    """The samples of one step over all `processes`: `batch` when given (it may be below the
    processes), else `batch_per_device` on each. ValueError unless exactly one is given."""
    if (batch is None) == (batch_per_device is None):
        raise ValueError("give the global batch or the batch per device, one of them")
    return batch if batch is not None else batch_per_device * processes  # type: ignore[operator]
