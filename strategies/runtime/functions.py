"""Autograd pieces whose result must not depend on how a layer is split.

- `GroupSum`: a sum over the devices of a group that every device then uses in its own part of
  the computation; its gradient is again the sum over the group of each device's gradient.
- `sync_batch_norm`: BatchNorm in training mode with statistics over the whole logical batch
  (all samples and positions of the channel, wherever their tiles live): SyncBatchNorm
  semantics built from `GroupSum`, two-pass (mean, then the mean squared deviation) for the
  same precision as one device. Running statistics follow torch's update (unbiased variance).
- `sharded_cross_entropy`: the loss over scores split by class across a channel group
  (log-sum-exp over the group), each device contributing 1/r of each sample's loss so the
  group's copies add up to one loss per sample.
- `dropout`: one device's dropout mask is drawn over the whole tensor from the global
  generator; every rank draws the same masks in the same order and applies its tile's part.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

Reduce = Callable[[torch.Tensor], torch.Tensor]  # in-place sum over a group, returns it


class GroupSum(torch.autograd.Function):
    """y = sum over the group of x (same y on every device); dL/dx = sum over the group of dL/dy.

    Every device's loss depends on y through its own part, so the gradient reaching x is the
    sum of all devices' gradients of y.
    """

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, forward_reduce: Reduce,
                backward_reduce: Reduce) -> torch.Tensor:
        ctx.backward_reduce = backward_reduce
        return forward_reduce(tensor.clone())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return ctx.backward_reduce(grad.clone()), None, None


def group_sum(tensor: torch.Tensor, forward_reduce: Reduce, backward_reduce: Reduce,
              ) -> torch.Tensor:
    return GroupSum.apply(tensor, forward_reduce, backward_reduce)


def sync_batch_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                    running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                    momentum: float, eps: float, count: int, forward_reduce: Reduce,
                    backward_reduce: Reduce) -> torch.Tensor:
    """BatchNorm over the group's tiles of the same channels; `count` elements per channel.

    Four all-reduces of C_shard values per step (two forward, two backward), which the cost
    model counts as the layer's statistics sync.
    """
    dims = [d for d in range(x.dim()) if d != 1]
    view = [1, -1] + [1] * (x.dim() - 2)
    mean = group_sum(x.sum(dim=dims), forward_reduce, backward_reduce) / count
    centered = x - mean.view(view)
    var = group_sum((centered * centered).sum(dim=dims), forward_reduce,
                    backward_reduce) / count
    if running_mean is not None and running_var is not None:
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
            running_var.mul_(1 - momentum).add_(var.detach() * (count / (count - 1)),
                                                alpha=momentum)
    out = centered * torch.rsqrt(var + eps).view(view)
    if weight is not None:
        out = out * weight.view(view)
    if bias is not None:
        out = out + bias.view(view)
    return out


def sharded_cross_entropy(scores: torch.Tensor, targets: torch.Tensor, class_start: int,
                          group_size: int, batch: int, max_reduce: Reduce,
                          forward_reduce: Reduce, backward_reduce: Reduce) -> torch.Tensor:
    """This device's share of the mean cross-entropy over the global `batch`.

    `scores` holds classes [class_start, class_start + C_shard) of its samples; the loss of a
    sample is logsumexp over all classes minus the target's score, assembled with group sums.
    """
    if group_size == 1:
        return F.cross_entropy(scores, targets, reduction="sum") / batch
    with torch.no_grad():
        shift = max_reduce(scores.max(dim=1).values.clone())
    exp_sum = group_sum(torch.exp(scores - shift[:, None]).sum(dim=1), forward_reduce,
                        backward_reduce)
    local = targets - class_start
    mine = (local >= 0) & (local < scores.shape[1])
    picked = scores.gather(1, local.clamp(0, scores.shape[1] - 1)[:, None])[:, 0]
    target_score = group_sum(torch.where(mine, picked, torch.zeros_like(picked)),
                             forward_reduce, backward_reduce)
    per_sample = torch.log(exp_sum) + shift - target_score
    return per_sample.sum() / (batch * group_size)


def dropout_mask(shape: tuple[int, ...], p: float, features: bool, device: torch.device,
                 dtype: torch.dtype) -> torch.Tensor:
    """The scaled mask torch's dropout would draw next from the global generator.

    F.dropout draws bernoulli(1 - p) over the input and multiplies by mask / (1 - p);
    dropout2d draws one value per (sample, channel).
    """
    mask_shape = (*shape[:2], *([1] * (len(shape) - 2))) if features else shape
    return torch.empty(mask_shape, device=device, dtype=dtype).bernoulli_(1 - p) / (1 - p)
