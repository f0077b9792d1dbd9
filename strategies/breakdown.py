"""The `Breakdown` contract: a strategy's predicted cost of one training step (Jia et al. 2018,
Eq. 1), split into its terms, times and exact bytes apart.

A contract between stages (the search writes it into a Strategy, a run's result reports it
next to what was measured), so it imports no behaviour: a torchrun worker that reads a
strategy does not load the cost model that priced it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Breakdown(BaseModel):
    """Predicted cost of one training step under a strategy: t_o = compute + transfer + sync."""

    model_config = ConfigDict(frozen=True)

    step_seconds: float
    compute_seconds: float  # sum over layers of t_c
    transfer_seconds: float  # sum over edges of t_x
    sync_seconds: float  # sum over layers of t_s
    transfer_bytes: int
    sync_bytes: int
