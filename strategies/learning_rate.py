"""The learning rate of every training step: a linear warm-up, then a decay.

SGD at a constant 0.05 with momentum 0.9 trains the zoo's small models to a low loss and then,
on some seeds and batch sizes, throws them back to chance (LeNet-5 on the digits climbed from
0.008 to 2.30 and stayed; wide_fc spiked to 13 at step 20 and never recovered). A warm-up lets
the first, largest gradients pass at a small rate; the decay with the inverse square root of
the step (Vaswani et al. 2017) calms the late steps without a horizon.

The rate depends on the step alone, not on how long the run is: a run resumed from a checkpoint,
or extended with more steps, steps exactly as an uninterrupted one. Every engine's optimizers
and `layerwise verify`'s reference take it from here. Stdlib only: the CLI reads the defaults
at start-up.
"""

from __future__ import annotations

import math
from typing import Literal

DEFAULT_LR = 0.05  # the peak rate, reached at the end of the warm-up
DEFAULT_WARMUP_STEPS = 20
LrDecay = Literal["inverse_sqrt", "constant"]
LR_DECAYS: tuple[LrDecay, ...] = ("inverse_sqrt", "constant")
DEFAULT_LR_DECAY: LrDecay = "inverse_sqrt"


def learning_rate(peak: float, warmup_steps: int, decay: LrDecay, step: int) -> float:
    """The rate of step `step` (1-based): `peak * step / warmup_steps` during the warm-up, then
    `peak` (constant) or `peak * sqrt(warmup_steps / step)` (inverse_sqrt; from step 1 when
    there is no warm-up)."""
    if step <= warmup_steps:
        return peak * step / warmup_steps
    if decay == "constant":
        return peak
    return peak * math.sqrt(max(warmup_steps, 1) / step)
