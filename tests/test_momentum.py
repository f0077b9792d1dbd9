"""SGD's momentum buffers offered for a checkpoint: SGD's own where it has one, zeros where it
has none yet, keyed as the caller names its weights."""

from __future__ import annotations

import torch
from torch import nn

from layerwise.strategies.runtime.momentum import momentum_buffers


def test_momentum_buffers_are_sgds_or_zeros():
    weights = {"fc.weight": nn.Parameter(torch.ones(3, 2)), "fc.bias": nn.Parameter(torch.ones(3))}
    for optimizer in (None, torch.optim.SGD(weights.values(), lr=0.1, momentum=0.9)):
        buffers = momentum_buffers(optimizer, weights.items())
        assert list(buffers) == ["fc.weight", "fc.bias"]
        assert all(not buffer.any() and buffer.shape == weights[key].shape
                   for key, buffer in buffers.items())
    sgd = torch.optim.SGD(weights.values(), lr=0.1, momentum=0.9)
    weights["fc.weight"].grad = torch.full((3, 2), 2.0)  # the bias gets no gradient
    sgd.step()
    buffers = momentum_buffers(sgd, weights.items())
    assert buffers["fc.weight"] is sgd.state[weights["fc.weight"]]["momentum_buffer"]
    assert torch.equal(buffers["fc.weight"], torch.full((3, 2), 2.0))
    assert torch.equal(buffers["fc.bias"], torch.zeros(3))
