"""Local parallelism's schedule (Laskin et al. 2020, docs/research.md: local parallelism) in the
Strategy contract."""

from __future__ import annotations

from typing import Literal

from layerwise.strategies.execution import ExecutionBase, FrozenModel


class LocalBlock(FrozenModel):
    """Contiguous layers trained by their own auxiliary loss on one device."""

    layers: tuple[str, ...]
    device: int


class LocalExecution(ExecutionBase):
    """Blocks with auxiliary heads and local losses, each on its own device, updating
    asynchronously."""

    kind: Literal["local"] = "local"
    blocks: tuple[LocalBlock, ...]
    variant: Literal["greedy", "overlapping"] = "greedy"

    def describe(self) -> str:
        blocks = "; ".join(f"{block.layers[0]}..{block.layers[-1]} on {block.device}"
                           for block in self.blocks)
        return f"local updates ({self.variant}), {len(self.blocks)} block(s): {blocks}"
