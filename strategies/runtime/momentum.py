"""SGD's momentum buffers of a rank's weights, keyed like the plain module's state_dict.

A checkpoint holds every weight's momentum as a full tensor under the weight's state-dict key,
whatever engine trained it, so that a resumed run continues SGD exactly. Each engine offers
its own weights' buffers by key; a weight SGD keeps no buffer for yet (before the first step,
or without momentum) offers zeros, which SGD's next step treats as it treats a missing buffer,
so every rank offers every key it holds and collective gathers match on all ranks.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from layerwise.strategies.sgd import Sgd


def momentum_buffers(optimizer: Sgd | None,
                     weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """State-dict key -> SGD's momentum buffer of each of `weights` (key, parameter): zeros
    where `optimizer` (None: this rank holds no weights to step) has none."""
    state = optimizer.state if optimizer is not None else {}
    buffers = {}
    for key, parameter in weights:
        buffer = state.get(parameter, {}).get("momentum_buffer")
        buffers[key] = buffer if buffer is not None else torch.zeros_like(parameter)
    return buffers
