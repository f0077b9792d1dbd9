"""OWT's schedule (Krizhevsky 2014, docs/research.md: OWT) as the Strategy contract states it."""

from __future__ import annotations

from typing import Literal

from layerwise.strategies.execution import ExecutionBase


class OwtExecution(ExecutionBase):
    """OWT's hand-off between the sample-parallel convs and the channel-parallel FC layers.

    scheme a: all-gather of the last conv activations; b: workers broadcast their batch in
    turn, one FC pass per turn; c: every worker sends 1/K of its batch to all, K rounds.
    variable_batch: the FC weights update after each of the K partial passes.
    """

    kind: Literal["owt"] = "owt"
    scheme: Literal["a", "b", "c"]
    variable_batch: bool = False

    def describe(self) -> str:
        handoff = {"a": "all-gather", "b": "round-robin broadcast", "c": "1/K per round"}
        batch = "variable batch" if self.variable_batch else "fixed batch"
        return f"OWT scheme {self.scheme} ({handoff[self.scheme]}), {batch}"
