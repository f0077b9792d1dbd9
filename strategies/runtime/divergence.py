"""When a run's loss has diverged, so that the worker stops there instead of training on.

A NaN or infinite loss has diverged at once: every weight it touched is lost. A finite loss has
diverged when it stays far above where the run started (`FACTOR` times the first step's loss,
for `STEPS` steps in a row): a single spike that training recovers from is not stopped. Every
rank judges the same losses (rank 0's, shared each step), so all stop at the same step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

FACTOR = 3.0  # the cross-entropy starts near ln(classes): 3x is 6.9 for 10 classes
STEPS = 10


class LossDiverged(RuntimeError):
    """The loss diverged: the run stopped at that step."""


def divergence(losses: Sequence[float]) -> str | None:
    """Why the loss sequence `losses` (from step 1 on) has diverged at its last step, or None."""
    last = losses[-1]
    if not math.isfinite(last):
        return f"loss {last}"
    start = losses[0]
    recent = losses[-STEPS:]
    if len(losses) > STEPS and all(loss > FACTOR * start for loss in recent):
        return (f"loss {last:.4g}, above {FACTOR:g}x its first value {start:.4g} for "
                f"{STEPS} steps")
    return None


def diverged_message(step: int, reason: str, lr: float) -> str:
    """The one line a diverged run stops with: the step, why, and what to try."""
    return (f"the loss diverged at step {step} ({reason}); the run stopped there, its steps "
            f"are in result.json: lower the learning rate (--lr {lr:g} now, try {lr / 2:g}) "
            "or warm up longer (--warmup-steps)")
