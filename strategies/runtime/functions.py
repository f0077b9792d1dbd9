"""The cross-entropy over scores split by class: the same loss however the classes are split.

`sharded_cross_entropy`: the loss over scores split by class across a channel group (log-sum-exp
over the group), each device contributing 1/r of each prediction's loss so the group's copies add
up to one loss per prediction (a sample, or a sample's position of a dense output); its backward
is local. (The layer ops' own split-exact pieces, BatchNorm over a
group and dropout masks, are in `layerwise.strategies.model.ops`.)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from layerwise.strategies.model.ops import Reduce


class _ShardedCrossEntropy(torch.autograd.Function):
    """The loss share of scores split by class: two all-reduces forward, none backward.

    Scores are (samples, classes) or dense (samples, classes, *positions), targets (samples,)
    or (samples, *positions); a prediction is one (sample, position).
    Forward: the group's per-prediction max score (the log-sum-exp shift), then one all-reduce
    of each prediction's sum of exp(score - shift) over this device's classes together with its
    target score (zero where the target class lives elsewhere). Every device then knows each
    prediction's whole loss log(sum exp) + shift - target and contributes 1/r of it.
    Backward: the gradient of the group's summed loss by this device's scores is
    (softmax - one_hot) / predictions, and softmax = exp(score - shift) / sum is known here, so
    no exchange is needed (sums of the loss shares through autograd would take two more
    all-reduces, 1-3 ms each on CPUs with gloo).
    """

    @staticmethod
    def forward(ctx: Any, scores: torch.Tensor, targets: torch.Tensor, class_start: int,
                group_size: int, predictions: int, max_reduce: Reduce,
                sum_reduce: Reduce) -> torch.Tensor:
        shift = max_reduce(scores.max(dim=1).values)
        exp = torch.exp(scores - shift.unsqueeze(1))
        local = targets - class_start
        mine = (local >= 0) & (local < scores.shape[1])
        index = local.clamp(0, scores.shape[1] - 1).unsqueeze(1)
        picked = scores.gather(1, index).squeeze(1)
        sums = sum_reduce(torch.stack([exp.sum(dim=1),
                                       torch.where(mine, picked, torch.zeros_like(picked))]))
        exp_sum, target_score = sums.unbind(0)
        per_prediction = torch.log(exp_sum) + shift - target_score
        ctx.save_for_backward(exp, exp_sum, index, mine)
        ctx.predictions = predictions
        return per_prediction.sum() / (predictions * group_size)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        exp, exp_sum, index, mine = ctx.saved_tensors
        grad_scores = exp / exp_sum.unsqueeze(1)
        grad_scores.scatter_add_(1, index, -mine.unsqueeze(1).to(grad_scores.dtype))
        return grad_scores * (grad / ctx.predictions), None, None, None, None, None, None


def sharded_cross_entropy(scores: torch.Tensor, targets: torch.Tensor, class_start: int,
                          group_size: int, predictions: int, max_reduce: Reduce,
                          sum_reduce: Reduce) -> torch.Tensor:
    """This device's share of the mean cross-entropy over the global batch's `predictions`
    (its samples, times the positions of a dense output: per-position scores are each a
    prediction, as `F.cross_entropy` averages them).

    `scores` holds classes [class_start, class_start + C_shard) of its samples (and positions);
    the shares of a group's devices add up to the loss of their predictions
    (`_ShardedCrossEntropy`).
    """
    if group_size == 1:
        return F.cross_entropy(scores, targets, reduction="sum") / predictions
    return _ShardedCrossEntropy.apply(scores, targets, class_start, group_size, predictions,
                                      max_reduce, sum_reduce)
