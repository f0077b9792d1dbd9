"""How a Strategy runs: the base of every execution type, and the layer-wise executor's own.

Every strategy names one ParallelConfig per layer (that is what the cost model prices and the
runtime's checks validate). Most are executed by the layer-wise engine as they stand
(`LayerwiseExecution`, Jia et al. 2018, docs/research.md: layer-wise parallelism). The strategies
from the literature add a schedule the configs alone cannot say; each names it with its own
execution type in its folder under strategies/schedules/, and the registry there joins them into the
`Execution` union that `Strategy.execution` holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from layerwise.strategies.model.graph import LayerGraph


class FrozenModel(BaseModel):
    """A frozen part of the Strategy contract: a typo in a JSON key is an error, not a default."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ExecutionBase(FrozenModel):
    """An execution type: its `kind` literal names its registry entry and its engine."""

    def describe(self) -> str:
        """One line for the CLI: the schedule and its options."""
        raise NotImplementedError

    def exact_on(self, graph: LayerGraph) -> bool:
        """Whether this schedule's step on `graph` is one device's SGD step (up to rounding).

        Names inexact by design are the registry's (`INEXACT`); this is what depends on the run.
        """
        return True


class LayerwiseExecution(ExecutionBase):
    """Every layer's tiles as its config says (strategies/runtime/layerwise_executor.py)."""

    kind: Literal["layerwise"] = "layerwise"

    def describe(self) -> str:
        return "layer-wise: every layer's tiles as its config says"
