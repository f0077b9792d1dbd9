"""When a run's loss has diverged, so that the worker stops there instead of training on.

A NaN or infinite loss has diverged at once: every weight it touched is lost. A finite loss has
diverged when, for `STEPS` steps in a row, it stays far above where the run started (`FACTOR`
times the first step's loss), or back where it started (`RETURNED` of it) after it had come
down to `LEARNED` of it: the model fell back to chance, as wide_fc did at a constant 0.05
(0.53 at step 18, a spike to 13.5, then 2.30 for good). A single spike that training recovers
from is not stopped. Every rank judges the same losses (rank 0's, shared each step), so all
stop at the same step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

FACTOR = 3.0  # the cross-entropy starts near ln(classes): 3x is 6.9 for 10 classes
LEARNED = 0.5  # a run that came down to half its first loss has learned something
RETURNED = 0.9  # and one back at 90% of it has lost it again
STEPS = 10


class LossDiverged(RuntimeError):
    """The loss diverged: the run stopped at that step."""


class LossWatch:
    """The losses of a run from step 1 on, one at a time; O(1) per step however long the run."""

    def __init__(self, losses: Iterable[float] = ()) -> None:
        self._start: float | None = None
        self._best = math.inf
        self._recent: deque[float] = deque(maxlen=STEPS)
        for loss in losses:  # a resumed run's steps so far
            self.add(loss)

    def add(self, loss: float) -> str | None:
        """Take the next step's loss; why the loss has diverged at it, or None."""
        if self._start is None:
            self._start = loss
        else:
            self._recent.append(loss)
        self._best = min(self._best, loss)
        if not math.isfinite(loss):
            return f"loss {loss}"
        if len(self._recent) < STEPS:
            return None
        lowest = min(self._recent)
        if lowest > FACTOR * self._start:
            return (f"loss {loss:.4g}, above {FACTOR:g}x its first value {self._start:.4g} for "
                    f"{STEPS} steps")
        if self._best < LEARNED * self._start and lowest >= RETURNED * self._start:
            return (f"loss {loss:.4g}, back at its first value {self._start:.4g} for {STEPS} "
                    f"steps after reaching {self._best:.4g}: the model fell back to chance")
        return None


def diverged_message(step: int, reason: str, lr: float) -> str:
    """The one line a diverged run stops with: the step, why, and what to try."""
    return (f"the loss diverged at step {step} ({reason}); the run stopped there, its steps "
            f"are in result.json: lower the learning rate (--lr {lr:g} now, try {lr / 2:g}) "
            "or warm up longer (--warmup-steps)")
