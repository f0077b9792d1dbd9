"""The 1F1B pipeline's schedule (Akintoye et al. 2023, docs/research.md: pipeline) in the Strategy
contract."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from layerwise.strategies.execution import ExecutionBase, FrozenModel

if TYPE_CHECKING:
    from layerwise.strategies.model.graph import LayerGraph


class PipelineStage(FrozenModel):
    """Contiguous layers (graph order) on their own devices, sample-parallel among them."""

    layers: tuple[str, ...]
    devices: tuple[int, ...]


class PipelineExecution(ExecutionBase):
    """Contiguous stages on their own devices, micro-batches scheduled one-forward-one-backward."""

    kind: Literal["pipeline"] = "pipeline"
    stages: tuple[PipelineStage, ...]
    micro_batches: int = Field(ge=1)

    def describe(self) -> str:
        stages = "; ".join(f"{stage.layers[0]}..{stage.layers[-1]} on "
                           f"{','.join(map(str, stage.devices))}" for stage in self.stages)
        return (f"pipeline, {len(self.stages)} stage(s) x {self.micro_batches} "
                f"micro-batch(es), 1F1B: {stages}")

    def exact_on(self, graph: LayerGraph) -> bool:
        """Not with BatchNorm unless its one micro-batch runs on one device per stage.

        BatchNorm normalises each device's rows of each micro-batch, as GPipe does
        (strategies/schedules/pipeline/engine.py).
        """
        if self.micro_batches == 1 and all(len(stage.devices) == 1 for stage in self.stages):
            return True
        return not any("BatchNorm" in layer.label for layer in graph.layers)
