"""How a Strategy runs: which engine executes its per-layer configs, with which options.

Every strategy names one ParallelConfig per layer (that is what the cost model prices and the
runtime's checks validate). Most are executed by the layer-wise engine as they stand. The
strategies from the literature that layerwise carries add a schedule the configs alone cannot
say, and name it here:
- `owt` (Krizhevsky 2014, DESIGN 3.2): conv/pool sample-parallel, FC channel-parallel, with one
  of the three hand-offs between them and optionally the variable batch size;
- `pipeline` (Akintoye et al., DESIGN 3.5): contiguous stages on their own devices, micro-batches
  scheduled one-forward-one-backward;
- `local` (Laskin et al., DESIGN 3.4): blocks with auxiliary heads and local losses, each on its
  own device, updating asynchronously (not exact by design).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LayerwiseExecution(_Frozen):
    """Every layer's tiles as its config says (strategies/runtime/executor.py)."""

    kind: Literal["layerwise"] = "layerwise"

    def describe(self) -> str:
        return "layer-wise: every layer's tiles as its config says"


class OwtExecution(_Frozen):
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


class PipelineStage(_Frozen):
    """Contiguous layers (graph order) on their own devices, sample-parallel among them."""

    layers: tuple[str, ...]
    devices: tuple[int, ...]


class PipelineExecution(_Frozen):
    kind: Literal["pipeline"] = "pipeline"
    stages: tuple[PipelineStage, ...]
    micro_batches: int = Field(ge=1)

    def describe(self) -> str:
        stages = "; ".join(f"{stage.layers[0]}..{stage.layers[-1]} on "
                           f"{','.join(map(str, stage.devices))}" for stage in self.stages)
        return (f"pipeline, {len(self.stages)} stage(s) x {self.micro_batches} "
                f"micro-batch(es), 1F1B: {stages}")


class LocalBlock(_Frozen):
    """Contiguous layers trained by their own auxiliary loss on one device."""

    layers: tuple[str, ...]
    device: int


class LocalExecution(_Frozen):
    kind: Literal["local"] = "local"
    blocks: tuple[LocalBlock, ...]
    variant: Literal["greedy", "overlapping"] = "greedy"

    def describe(self) -> str:
        blocks = "; ".join(f"{block.layers[0]}..{block.layers[-1]} on {block.device}"
                           for block in self.blocks)
        return f"local updates ({self.variant}), {len(self.blocks)} block(s): {blocks}"


Execution = Annotated[
    LayerwiseExecution | OwtExecution | PipelineExecution | LocalExecution,
    Field(discriminator="kind"),
]
