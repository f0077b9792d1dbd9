"""When a run's loss has diverged, so that the worker stops there instead of training on.

A NaN or infinite loss has diverged at once: every weight it touched is lost. A finite loss has
diverged when it stays far above where the run started (`FACTOR` times the first step's loss,
for `STEPS` steps in a row): a single spike that training recovers from is not stopped. Every
rank judges the same losses (rank 0's, shared each step), so all stop at the same step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

FACTOR = 3.0  # the cross-entropy starts near ln(classes): 3x is 6.9 for 10 classes
STEPS = 10


class LossDiverged(RuntimeError):
    """The loss diverged: the run stopped at that step."""


class LossWatch:
    """The losses of a run from step 1 on, one at a time; O(1) per step however long the run."""

    def __init__(self, losses: Iterable[float] = ()) -> None:
        self._start: float | None = None
        self._recent: deque[float] = deque(maxlen=STEPS)
        for loss in losses:  # a resumed run's steps so far
            self.add(loss)

    def add(self, loss: float) -> str | None:
        """Take the next step's loss; why the loss has diverged at it, or None."""
        if self._start is None:
            self._start = loss
        else:
            self._recent.append(loss)
        if not math.isfinite(loss):
            return f"loss {loss}"
        if len(self._recent) == STEPS and min(self._recent) > FACTOR * self._start:
            return (f"loss {loss:.4g}, above {FACTOR:g}x its first value {self._start:.4g} for "
                    f"{STEPS} steps")
        return None


def diverged_message(step: int, reason: str, lr: float) -> str:
    """The one line a diverged run stops with: the step, why, and what to try."""
    return (f"the loss diverged at step {step} ({reason}); the run stopped there, its steps "
            f"are in result.json: lower the learning rate (--lr {lr:g} now, try {lr / 2:g}) "
            "or warm up longer (--warmup-steps)")
