"""Whether an op the layer graph does not name is elementwise, found by running it.

An op whose every output element depends only on the input element at the same place splits
along every dim exactly: its tile's output is the whole output's tile, whatever the split. The
graph takes such ops by that nature rather than from a list, so Hardsigmoid, Mish, SELU,
Softplus and whatever activation a model library adds next are taken as written. The test runs
the op on a float64 probe and on the probe's elements shuffled: an elementwise op gives the same
values, shuffled alike. It must also keep the probe's shape, hold no weights or buffers (a
per-channel weight, as PReLU's, would be split with the channels, which this does not price),
and draw nothing at random (a random op's draws per tile would differ from one device's: RReLU
in training, say). Written here because nothing in torch classifies an op this way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

PROBE_SHAPE = (2, 3, 5, 7)  # a small 4-d tensor with distinct sizes, so no dim hides another
_RELATIVE_TOLERANCE = 1e-12  # vectorised and scalar paths of one function differ by an ulp


def elementwise_refusal(apply: Callable[[Tensor], Tensor],
                        module: nn.Module | None = None) -> str | None:
    """None when `apply` (one tensor in, one out) is elementwise; else why not, in words."""
    if module is not None and (any(True for _ in module.parameters())
                               or any(True for _ in module.buffers())):
        return "it holds weights or buffers"
    generator = torch.Generator().manual_seed(0)
    probe = torch.randn(PROBE_SHAPE, generator=generator, dtype=torch.float64)
    order = torch.randperm(probe.numel(), generator=generator)
    state = torch.random.get_rng_state()
    try:
        with torch.no_grad():
            first, second = apply(probe.clone()), apply(probe.clone())
            shuffled = apply(probe.flatten()[order].reshape(PROBE_SHAPE))
    except Exception as error:  # an op that cannot run on a plain tensor is not one of these
        return f"it does not run on a float64 tensor ({type(error).__name__})"
    finally:  # a draw moves torch's generator (even one that happens to repeat): put it back
        drew = not torch.equal(state, torch.random.get_rng_state())
        torch.random.set_rng_state(state)
    if not (isinstance(first, Tensor) and isinstance(shuffled, Tensor)
            and first.shape == probe.shape == shuffled.shape):
        return "its output is not one tensor of its input's shape"
    if drew or not torch.equal(first, second):
        return "it draws random numbers, which would differ per tile from one device's"
    if not torch.allclose(shuffled.flatten(), first.flatten()[order], rtol=_RELATIVE_TOLERANCE,
                          atol=0.0, equal_nan=True):
        return "an output element depends on other input elements"
    return None
