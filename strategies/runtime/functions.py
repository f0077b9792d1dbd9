"""Autograd pieces whose result must not depend on how a layer is split.

- `sync_batch_norm`: BatchNorm in training mode with statistics over the whole logical batch
  (all samples and positions of the channel, wherever their tiles live): SyncBatchNorm
  semantics with one all-reduce forward and one backward.
- `sharded_cross_entropy`: the loss over scores split by class across a channel group
  (log-sum-exp over the group), each device contributing 1/r of each sample's loss so the
  group's copies add up to one loss per sample; its backward is local.
- `dropout`: one device's dropout mask is drawn over the whole tensor from the global
  generator; every rank draws the same masks in the same order and applies its tile's part.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

Reduce = Callable[[torch.Tensor], torch.Tensor]  # in-place sum over a group, returns it


class _SyncBatchNorm(torch.autograd.Function):
    """Training-mode BatchNorm over every tile of the group: one all-reduce each way.

    Forward: each device takes its tile's per-channel mean and biased variance with torch's
    BatchNorm statistics kernel and contributes n_i * mean_i and n_i * (var_i + mean_i^2);
    their sums give the whole batch's mean and biased variance, and torch's fused eval-mode
    kernel normalises with them. Backward: torch's eval-mode BatchNorm backward gives the
    tile's sums of dy and dy * x_hat in one pass; their sums over the group give
    dx = gamma * invstd * (dy - sum(dy)/N - x_hat * sum(dy x_hat)/N), written as
    a * dy + b * x + c per channel (two fused passes). Native kernels because the same
    formulas in elementwise ops cost 3x torch's BatchNorm on CPU.
    The weight and bias gradients stay local sums: the replica group's gradient all-reduce
    adds them up like any replicated weight's.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, count: int, eps: float,
                reduce: Reduce) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        local_mean, local_var = torch.batch_norm_update_stats(x, None, None, 0.0)
        local_count = x.numel() // x.shape[1]
        sums = reduce(torch.cat([local_mean * local_count,
                                 (local_var + local_mean * local_mean) * local_count]))
        mean, squares = sums.split(x.shape[1])
        mean = mean / count
        var = (squares / count - mean * mean).clamp_min(0)
        out = F.batch_norm(x, mean, var, weight, bias, False, 0.0, eps)
        ctx.save_for_backward(x, weight, mean, var)
        ctx.count, ctx.eps, ctx.reduce = count, eps, reduce
        ctx.has_bias = bias is not None
        ctx.mark_non_differentiable(mean, var)
        return out, mean, var

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: torch.Tensor,
                 ) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, var = ctx.saved_tensors
        view = [1, -1] + [1] * (grad.dim() - 2)
        _, local_dy_x_hat, local_dy = torch.ops.aten.native_batch_norm_backward(
            grad, x, weight, mean, var, None, None, False, ctx.eps, [False, True, True])
        sums = ctx.reduce(torch.cat([local_dy, local_dy_x_hat]))
        sum_dy, sum_dy_x_hat = sums.split(grad.shape[1])
        invstd = torch.rsqrt(var + ctx.eps)
        scale = invstd if weight is None else weight * invstd
        slope = -scale * invstd * sum_dy_x_hat / ctx.count  # b, the coefficient of x
        offset = -scale * sum_dy / ctx.count - slope * mean  # c
        grad_x = torch.addcmul(offset.view(view), x, slope.view(view))
        grad_x.addcmul_(grad, scale.view(view))
        grad_weight = local_dy_x_hat if weight is not None else None
        grad_bias = local_dy if ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None, None, None


def sync_batch_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                    running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                    momentum: float, eps: float, count: int, reduce: Reduce) -> torch.Tensor:
    """BatchNorm over the group's tiles of the same channels; `count` elements per channel.

    Two all-reduces of 2 x C_shard values per step (one forward, one backward), which the cost
    model counts as the layer's statistics sync. Running statistics follow torch's update
    (exponential average, unbiased variance).
    """
    out, mean, var = _SyncBatchNorm.apply(x, weight, bias, count, eps, reduce)
    if running_mean is not None and running_var is not None:
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
            running_var.mul_(1 - momentum).add_(var * (count / (count - 1)), alpha=momentum)
    return out


class _ShardedCrossEntropy(torch.autograd.Function):
    """The loss share of scores split by class: two all-reduces forward, none backward.

    Forward: the group's per-sample max score (the log-sum-exp shift), then one all-reduce of
    each sample's sum of exp(score - shift) over this device's classes together with its
    target score (zero where the target class lives elsewhere). Every device then knows each
    sample's whole loss log(sum exp) + shift - target and contributes 1/r of it.
    Backward: the gradient of the group's summed loss by this device's scores is
    (softmax - one_hot) / batch, and softmax = exp(score - shift) / sum is known here, so
    no exchange is needed (sums of the loss shares through autograd would take two more
    all-reduces, 1-3 ms each on CPUs with gloo).
    """

    @staticmethod
    def forward(ctx: Any, scores: torch.Tensor, targets: torch.Tensor, class_start: int,
                group_size: int, batch: int, max_reduce: Reduce,
                sum_reduce: Reduce) -> torch.Tensor:
        shift = max_reduce(scores.max(dim=1).values)
        exp = torch.exp(scores - shift[:, None])
        local = targets - class_start
        mine = (local >= 0) & (local < scores.shape[1])
        picked = scores.gather(1, local.clamp(0, scores.shape[1] - 1)[:, None])[:, 0]
        sums = sum_reduce(torch.cat([exp.sum(dim=1),
                                     torch.where(mine, picked, torch.zeros_like(picked))]))
        exp_sum, target_score = sums.split(scores.shape[0])
        per_sample = torch.log(exp_sum) + shift - target_score
        ctx.save_for_backward(exp, exp_sum, local, mine)
        ctx.batch = batch
        return per_sample.sum() / (batch * group_size)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        exp, exp_sum, local, mine = ctx.saved_tensors
        grad_scores = exp / exp_sum[:, None]
        rows = mine.nonzero()[:, 0]
        grad_scores[rows, local[rows]] -= 1
        return grad_scores * (grad / ctx.batch), None, None, None, None, None, None


def sharded_cross_entropy(scores: torch.Tensor, targets: torch.Tensor, class_start: int,
                          group_size: int, batch: int, max_reduce: Reduce,
                          sum_reduce: Reduce) -> torch.Tensor:
    """This device's share of the mean cross-entropy over the global `batch`.

    `scores` holds classes [class_start, class_start + C_shard) of its samples; the shares
    of a group's devices add up to the loss of their samples (`_ShardedCrossEntropy`).
    """
    if group_size == 1:
        return F.cross_entropy(scores, targets, reduction="sum") / batch
    return _ShardedCrossEntropy.apply(scores, targets, class_start, group_size, batch,
                                      max_reduce, sum_reduce)


def dropout_mask(shape: tuple[int, ...], p: float, features: bool, device: torch.device,
                 dtype: torch.dtype) -> torch.Tensor:
    """The scaled mask torch's dropout would draw next from the global generator.

    F.dropout draws bernoulli(1 - p) over the input and multiplies by mask / (1 - p);
    dropout2d draws one value per (sample, channel).
    """
    mask_shape = (*shape[:2], *([1] * (len(shape) - 2))) if features else shape
    return torch.empty(mask_shape, device=device, dtype=dtype).bernoulli_(1 - p) / (1 - p)
