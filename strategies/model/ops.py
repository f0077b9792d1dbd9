"""One implementation of every layer op on one tile, run by the runtime and timed by the profiler.

Jia et al. 2018 measure t_c (Eq. 1's compute term) by running each layer in each configuration;
the runtime then runs the same layer on the same tiles. Both call the functions here, so the
time the cost model is given is the time of the code that executes, not of a copy of it. Every
function takes one device's tile and its geometry: the tile's output box, global sizes, and the
needed input boxes (`layerwise.strategies.model.tiles.needed_range`) as tensors.

Window ops (conv, pooling) receive only the input box the tile's receptive field covers,
clipped at the tensor borders. Each re-creates the global padding where that box touches a
border (zeros for conv and average pooling, or the conv's reflection or replication of the
box, which starts at that border; -inf for max pooling) and then runs the torch op
unpadded, so the tile equals the matching slice of the full-tensor op and autograd gives the
matching slices of its gradients. Nothing is padded between tiles: there the box already holds
the neighbours' rows (the halo). BatchNorm over a tile that holds part of its channels' batch
takes its statistics over the whole group of such tiles (`sync_batch_norm`), and dropout
multiplies by the tile's part of a mask drawn over the whole tensor, so no op's result depends
on how its layer is split.

The ops take boxes over their tensor's own dims ((n, c, h, w) of a 2-d layer, (n, c, l) of a
1-d one); `layer_op` cuts the runtime's 5-d view boxes (`tiles.real_box`) down to those.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.graph import OVER_CHANNELS, Geometry, Layer, Padding, Resize
from layerwise.strategies.model.padding import source_rows
from layerwise.strategies.model.resize import resize_taps
from layerwise.strategies.model.tiles import Box, Range, needed_range, real_box

PoolMode = Literal["max", "avg"]
Sizes = tuple[int, ...]  # one per spatial dim of the tensor: (l,), (h, w) or (d, h, w)
Reduce = Callable[[Tensor], Tensor]  # in-place sum over a group of tiles, returns it

_BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul}


def global_padding(start: int, stop: int, kernel: int, stride: int, padding: int,
                   dilation: int, in_size: int) -> tuple[int, int]:
    """Rows to add before and after the clipped needed range of output rows [start, stop).

    The receptive field of those rows is [first, last]; the needed range clips it to
    [0, in_size). What was clipped lies in the global padding (or, for the last window of a
    ceil_mode pool, past it), so adding it back lets an unpadded sliding window yield exactly
    stop - start rows, each equal to the full op's.
    """
    first = start * stride - padding
    last = (stop - 1) * stride - padding + dilation * (kernel - 1)
    return max(0, -first), max(0, last + 1 - in_size)


def border_padding(out_box: Box, in_size: Sizes, geometry: Geometry) -> list[tuple[int, int]]:
    """(before, after) per spatial dim: what the tile `out_box` (its tensor's own dims) of a
    sliding window adds to its needed box (`global_padding` per dim)."""
    return [global_padding(*out_box[2 + axis], geometry.kernel[axis], geometry.stride[axis],
                           geometry.padding[axis], geometry.dilation[axis], in_size[axis])
            for axis in range(len(in_size))]


def _pad_argument(sides: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """F.pad's argument: the last dim's (before, after) first."""
    return tuple(side for pair in reversed(sides) for side in pair)


def pads_a_copy(out_box: Box, in_size: Sizes, geometry: Geometry) -> bool:
    """Whether a zero-padded conv or a pool tile pads a copy of its needed box
    (`_pad_borders`) rather than letting the op pad the whole tensor's border itself."""
    return (not whole_rows_and_cols(out_box, in_size, geometry)
            and any(any(pair) for pair in border_padding(out_box, in_size, geometry)))


def _pad_borders(x: Tensor, out_box: Box, in_size: Sizes, geometry: Geometry,
                 value: float = 0.0, mode: str = "zeros") -> Tensor:
    """The box extended along its spatial dims to the tile's whole receptive field: with
    `value`, or by a reflect, replicate or circular `mode`.

    Only sides on the tensor's border are padded, and the box starts (ends) there, so a
    reflection or replication of the box is that of the whole tensor wherever the box holds
    the rows it mirrors (graph.py limits the degrees to those); circular padding pads a box
    of the whole plane (its spatial dims stay whole).
    """
    sides = border_padding(out_box, in_size, geometry)
    if not any(any(pair) for pair in sides):
        return x  # F.pad would copy the box for nothing (and the op would save the copy)
    if mode != "zeros":
        return F.pad(x, _pad_argument(sides), mode=mode)
    return F.pad(x, _pad_argument(sides), value=value)


def whole_rows_and_cols(out_box: Box, in_size: Sizes, geometry: Geometry) -> bool:
    """Whether the tile holds every output row along every spatial dim (a sample or channel
    split).

    Then the torch op's own padding is the global padding, and rows past the last window that
    the needed box leaves out (a strided 1x1 conv) would produce no output anyway: one call,
    no padded copy of the input.
    """
    for axis in range(len(in_size)):
        size = in_size[axis] + 2 * geometry.padding[axis]
        reach = geometry.dilation[axis] * (geometry.kernel[axis] - 1) + 1
        if out_box[2 + axis] != (0, (size - reach) // geometry.stride[axis] + 1):
            return False
    return True


def _by_rank(functions: Sequence[Callable[..., Tensor]], spatial: int) -> Callable[..., Tensor]:
    """The torch op of a layer with `spatial` spatial dims, from its 1-d, 2-d, 3-d variants."""
    return functions[spatial - 1]


_CONV = (F.conv1d, F.conv2d, F.conv3d)
_CONV_TRANSPOSE = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)
_MAX_POOL = (F.max_pool1d, F.max_pool2d, F.max_pool3d)
_AVG_POOL = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)
_ADAPTIVE = {"max": (F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d),
             "avg": (F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d)}


def conv(x: Tensor, out_box: Box, in_size: Sizes, weight: Tensor,
         bias: Tensor | None, geometry: Geometry, out_channels_total: int,
         in_channel_start: int, padding_mode: str = "zeros") -> Tensor:
    """Output channels out_box[1] = [c0, c1) over out_box's rows of a zero-padded conv1d,
    conv2d or conv3d (by the number of spatial sizes in `in_size`).

    x is the needed input box; its first channel is global input channel `in_channel_start`
    (0 for groups == 1, where it holds every input channel). weight and bias are the shard of
    output channels [c0, c1). A shard whose ends fall on group boundaries is one grouped conv;
    one that cuts a group is convolved group by group, each part with its group's input
    channels, because the conv's `groups` assumes every group is whole. A reflect or
    replicate padding is applied by the tiles on the tensor's border to their own box
    (`_pad_borders`); a circular one keeps the spatial dims whole (graph.py), so its tile pads
    the whole tensor as nn.Conv2d does.
    """
    per_group_out = out_channels_total // geometry.groups
    per_group_in = weight.shape[1]
    c0, c1 = out_box[1]
    first_group, last_group = c0 // per_group_out, (c1 - 1) // per_group_out
    offset = first_group * per_group_in - in_channel_start
    width = (last_group - first_group + 1) * per_group_in
    if offset or width != x.shape[1]:  # a slice is an autograd node: only when it cuts
        x = x[:, offset:offset + width]
    unpadded = (0,) * len(in_size)
    if padding_mode != "zeros":
        padded = _pad_borders(x, out_box, in_size, geometry, mode=padding_mode)
        padding = unpadded
    elif whole_rows_and_cols(out_box, in_size, geometry):
        padded, padding = x, geometry.padding  # the op pads the global border itself
    else:
        padded, padding = _pad_borders(x, out_box, in_size, geometry, 0.0), unpadded
    convolve = partial(_by_rank(_CONV, len(in_size)), stride=geometry.stride, padding=padding,
                       dilation=geometry.dilation)
    if first_group == last_group or (c0 % per_group_out == 0 and c1 % per_group_out == 0):
        return convolve(padded, weight, bias, groups=last_group - first_group + 1)
    pieces = []
    for group in range(first_group, last_group + 1):
        lo = max(c0, group * per_group_out) - c0
        hi = min(c1, (group + 1) * per_group_out) - c0
        channel = (group - first_group) * per_group_in
        pieces.append(convolve(padded[:, channel:channel + per_group_in], weight[lo:hi],
                               None if bias is None else bias[lo:hi]))
    return torch.cat(pieces, dim=1)


def conv_transpose(x: Tensor, out_box: Box, in_start: Sizes, weight: Tensor,
                   bias: Tensor | None, geometry: Geometry) -> Tensor:
    """The rows out_box of a transposed convolution (every channel: graph.py holds c whole)
    from the needed input box x, whose first row along each spatial dim is global
    `in_start`.

    The box's whole transposed convolution, unpadded, puts input row i0 + u's window at output
    rows (i0 + u) * stride - padding + j * dilation, so global output row o sits at local row
    o - i0 * stride + padding: the tile is that crop. Rows past the box's reach (the output
    padding at the end, or a tile no input reaches) get no contribution, as in the full
    op: zeros, then the bias.
    """
    spatial = len(in_start)
    shape = [x.shape[0], weight.shape[1] * geometry.groups]
    if all(x.shape[2:]):
        full = _by_rank(_CONV_TRANSPOSE, spatial)(x, weight, None, geometry.stride, 0, 0,
                                                  geometry.groups, geometry.dilation)
    else:
        full = x.new_zeros((*shape, *([0] * spatial)))
    starts, pads = [], []
    for axis in range(spatial):
        first = (out_box[2 + axis][0] - in_start[axis] * geometry.stride[axis]
                 + geometry.padding[axis])
        length = out_box[2 + axis][1] - out_box[2 + axis][0]
        # a stride past the dilated kernel leaves rows no window reaches, before or after
        before, after = max(-first, 0), max(first + length - full.shape[2 + axis], 0)
        starts.append(first + before)
        pads.append((before, after))
    if any(any(pad) for pad in pads):
        full = F.pad(full, _pad_argument(pads))
    crop = tuple(slice(start, start + out_box[2 + axis][1] - out_box[2 + axis][0])
                 for axis, start in enumerate(starts))
    tile = full[(slice(None), slice(None), *crop)]
    return tile if bias is None else tile + bias.view(1, -1, *([1] * spatial))


def resize(x: Tensor, out_box: Box, in_start: Sizes, layer_resize: Resize,
           in_size: Sizes, out_size: Sizes) -> Tensor:
    """The rows out_box of an upsampling (graph.py's kind "resize") from the needed input box
    x, whose first row along each spatial dim is global `in_start`.

    A tile of whole rows along every spatial dim is the full op's own call. Any other
    gathers, per dim, each output row's input rows and weighs them with torch's own
    interpolation weights (`resize_taps`), one dim after the other: the same products torch
    sums, in float64 equal to the full op's to rounding. Each tap is added into the dim's
    result in place, so a dim holds its result and one gathered tap at a time (a nearest tap,
    of weight 1, is the result itself); memory.py counts that.
    """
    spatial = len(in_size)
    whole = all(out_box[2 + axis] == (0, out_size[axis]) for axis in range(spatial))
    scales = layer_resize.scales
    if whole:
        sized = any(scale is None for scale in scales)
        return F.interpolate(x, size=out_size if sized else None,
                             scale_factor=None if sized else scales,
                             mode=layer_resize.mode, align_corners=layer_resize.align_corners)
    for axis in range(spatial):
        taps = resize_taps(in_size[axis], out_size[axis], layer_resize.mode,
                           layer_resize.align_corners, scales[axis])
        start, stop = out_box[2 + axis]
        dim = 2 + axis
        shape = [1] * x.dim()
        shape[dim] = stop - start
        total: Tensor | None = None
        for index, weight in zip(taps.indices, taps.weights, strict=True):
            rows = torch.tensor(index[start:stop], device=x.device) - in_start[axis]
            gathered = x.index_select(dim, rows)
            if len(taps.indices) == 1 and all(value == 1.0 for value in weight[start:stop]):
                total = gathered  # nearest: every weight is 1
                continue
            scale = torch.tensor(weight[start:stop], dtype=x.dtype, device=x.device).view(shape)
            total = gathered.mul_(scale) if total is None else total.addcmul_(gathered, scale)
            del gathered  # the next tap's gather takes its place
        assert total is not None
        x = total
    return x


def _avg_divisors(out: Range, kernel: int, stride: int, padding: int, in_size: int,
                  count_include_pad: bool, like: Tensor) -> Tensor:
    """torch's average pooling divisor along one dim for output positions [start, stop).

    As in aten's AvgPool2d/3d: a window's size counts padding but stops at in_size + padding
    (only a ceil_mode window runs past it); count_include_pad=False counts only in-bounds
    elements. The N-d divisor is the product of the dims' divisors.
    """
    counts = []
    for index in range(*out):
        first = index * stride - padding
        last = min(first + kernel, in_size + padding)
        inside = min(last, in_size) - max(first, 0)
        counts.append(last - first if count_include_pad else inside)
    return torch.tensor(counts, dtype=like.dtype, device=like.device)


def pool(x: Tensor, out_box: Box, in_size: Sizes, geometry: Geometry,
         mode: PoolMode, count_include_pad: bool = True) -> Tensor:
    """The rows out_box of max or average pooling (1-d to 3-d, any ceil_mode) over the needed
    box x.

    Max pooling pads with -inf, which never wins, so even a ceil_mode window that runs past the
    padding takes the full op's maximum (and, on ties, the same first element). Average pooling
    sums the zero-padded windows and divides by torch's own divisor for each output position,
    which a plain average pool of the tile cannot know: it depends on where the window sits in
    the whole tensor, not in the tile. A tile of whole rows is the full op's own call.
    """
    spatial = len(in_size)
    if whole_rows_and_cols(out_box, in_size, geometry):  # the full op's own call
        if mode == "max":
            return _by_rank(_MAX_POOL, spatial)(x, geometry.kernel, geometry.stride,
                                                geometry.padding, geometry.dilation)
        return _by_rank(_AVG_POOL, spatial)(x, geometry.kernel, geometry.stride,
                                            geometry.padding,
                                            count_include_pad=count_include_pad)
    if mode == "max":
        padded = _pad_borders(x, out_box, in_size, geometry, float("-inf"))
        return _by_rank(_MAX_POOL, spatial)(padded, geometry.kernel, geometry.stride, 0,
                                            geometry.dilation)
    padded = _pad_borders(x, out_box, in_size, geometry, 0.0)
    if spatial == 1:  # avg_pool1d takes no divisor_override: the 2-d op on a row of one
        sums = F.avg_pool2d(padded.unsqueeze(2), (1, geometry.kernel[0]),
                            (1, geometry.stride[0]), divisor_override=1).squeeze(2)
    else:
        sums = _by_rank(_AVG_POOL, spatial)(padded, geometry.kernel, geometry.stride,
                                            divisor_override=1)
    divisor: Tensor | None = None
    for axis in range(spatial):
        along = _avg_divisors(out_box[2 + axis], geometry.kernel[axis], geometry.stride[axis],
                              geometry.padding[axis], in_size[axis], count_include_pad, sums)
        along = along.view(*([1] * axis), -1, *([1] * (spatial - axis - 1)))
        divisor = along if divisor is None else divisor * along
    assert divisor is not None
    return sums / divisor


def _reduce(x: Tensor, dim: int, mode: PoolMode) -> Tensor:
    """Max or mean over `dim`; max backpropagates to the first maximum only, as torch's pools."""
    return x.max(dim=dim).values if mode == "max" else x.mean(dim=dim)


def _adaptive_axis(x: Tensor, dim: int, out: Range, in_size: int, out_size: int,
                   mode: PoolMode) -> Tensor:
    """Pool dimension `dim` of the box down to adaptive output positions [start, stop).

    Output i pools input [floor(i*S/O), ceil((i+1)*S/O)); the box starts at the tile's first
    window, floor(start*S/O). Equal windows (S % O == 0) are one reshape.
    """
    start, stop = out
    if in_size % out_size == 0:
        return _reduce(x.unflatten(dim, (stop - start, in_size // out_size)), dim + 1, mode)
    offset = start * in_size // out_size
    windows = []
    for index in range(start, stop):
        first = index * in_size // out_size
        last = -(-(index + 1) * in_size // out_size)
        windows.append(_reduce(x.narrow(dim, first - offset, last - first), dim, mode))
    return torch.stack(windows, dim=dim)


def adaptive_pool(x: Tensor, out_box: Box, in_size: Sizes, out_size: Sizes,
                  mode: PoolMode) -> Tensor:
    """The rows out_box of adaptive max or average pooling (1-d to 3-d) over the needed box x.

    An adaptive window is a box, so pooling one dim after the other equals pooling it at once:
    the mean of means of equal-length rows, and the max of maxima. The last dim goes first so
    that the element a max picks on ties is the full op's first one in row-major order. A tile
    of every output row is torch's own adaptive pool.
    """
    spatial = len(in_size)
    if all(out_box[2 + axis] == (0, out_size[axis]) for axis in range(spatial)):
        return _by_rank(_ADAPTIVE[mode], spatial)(x, out_size)
    for axis in reversed(range(spatial)):
        x = _adaptive_axis(x, 2 + axis, out_box[2 + axis], in_size[axis], out_size[axis], mode)
    return x


def conv_padding_mode(op: str) -> str:
    """A conv layer's padding mode, which graph.py writes into its op name unless zeros."""
    for mode in ("reflect", "replicate", "circular"):
        if f"padding_mode={mode}" in op:
            return mode
    return "zeros"


def pool_mode(op: str) -> PoolMode:
    """Whether a pooling layer's op (graph.py's name for it) takes the max or the mean."""
    return "max" if "max" in op.lower() else "avg"


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Output features [c0, c1) of a linear layer: `weight` and `bias` hold those rows.

    A 4-d input (a linear layer right after a conv) is flattened first, as a flatten between
    them would do; the input holds every feature (`needed_range`), whatever the split.
    """
    flat = x if x.dim() == 2 else x.reshape(x.shape[0], -1)
    return F.linear(flat, weight, bias)


def flatten(x: Tensor) -> Tensor:
    """(N, C, H, W) -> (N, C*H*W) of whole samples (a flatten splits only along n)."""
    return x if x.dim() == 2 else x.reshape(x.shape[0], -1)


def binary(op: str, first: Tensor, second: Tensor) -> Tensor:
    """add, sub or mul of two tiles (graph.py's kind "add"): of one shape, or one of them a
    broadcast gate's tile of size 1 along the dims it broadcasts."""
    combine = _BINARY.get(op)
    if combine is None:
        raise ConfigError(f"binary op '{op}' is not one of {sorted(_BINARY)}")
    return combine(first, second)


def concat(inputs: Sequence[Tensor | None], dim: int) -> Tensor:
    """The tile's part of a concatenation; None for an input the tile needs nothing of."""
    return torch.cat([x for x in inputs if x is not None], dim=dim)


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
    def forward(ctx: Any, x: Tensor, weight: Tensor | None, bias: Tensor | None, count: int,
                eps: float, reduce: Reduce) -> tuple[Tensor, Tensor, Tensor]:
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
    def backward(ctx: Any, grad: Tensor, *_: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, mean, var = ctx.saved_tensors
        view = [1, -1] + [1] * (grad.dim() - 2)
        invstd = torch.rsqrt(var + ctx.eps)
        # the statistics go in both as running and as saved ones: the CPU kernel reads the
        # running ones in eval mode, the CUDA kernel asserts the saved ones are given
        _, local_dy_x_hat, local_dy = torch.ops.aten.native_batch_norm_backward(
            grad, x, weight, mean, var, mean, invstd, False, ctx.eps, [False, True, True])
        sums = ctx.reduce(torch.cat([local_dy, local_dy_x_hat]))
        sum_dy, sum_dy_x_hat = sums.split(grad.shape[1])
        scale = invstd if weight is None else weight * invstd
        slope = -scale * invstd * sum_dy_x_hat / ctx.count  # b, the coefficient of x
        offset = -scale * sum_dy / ctx.count - slope * mean  # c
        grad_x = torch.addcmul(offset.view(view), x, slope.view(view))
        grad_x.addcmul_(grad, scale.view(view))
        grad_weight = local_dy_x_hat if weight is not None else None
        grad_bias = local_dy if ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None, None, None


def sync_instance_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                       plane: int, reduce: Reduce | None) -> Tensor:
    """InstanceNorm (statistics per sample and channel over the whole h/w plane of `plane`
    values) of a tile holding part of each plane: a BatchNorm of the tile viewed as one sample
    of n * c channels, its statistics summed over the plane's tiles by `reduce` (_SyncBatchNorm:
    one all-reduce forward, one backward), or the tile's own when it holds the whole plane.
    The affine weight and bias, per channel, are repeated for each sample."""
    samples, channels = x.shape[:2]
    flat = x.reshape(1, samples * channels, *x.shape[2:])
    scale = None if weight is None else weight.repeat(samples)
    shift = None if bias is None else bias.repeat(samples)
    if reduce is None:
        out = F.batch_norm(flat, None, None, scale, shift, True, 0.0, eps)
    else:
        out = _SyncBatchNorm.apply(flat, scale, shift, plane, eps, reduce)[0]
    return out.reshape(x.shape)


def sync_batch_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None,
                    running_mean: Tensor | None, running_var: Tensor | None,
                    momentum: float, eps: float, count: int, reduce: Reduce) -> Tensor:
    """BatchNorm over the group's tiles of the same channels; `count` elements per channel.

    SyncBatchNorm semantics: two all-reduces of 2 x C_shard values per step (one forward, one
    backward), which the cost model counts as the layer's statistics sync. Running statistics
    follow torch's update (exponential average, unbiased variance).
    """
    out, mean, var = _SyncBatchNorm.apply(x, weight, bias, count, eps, reduce)
    if running_mean is not None and running_var is not None:
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
            running_var.mul_(1 - momentum).add_(var * (count / (count - 1)), alpha=momentum)
    return out


def batch_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None,
               running_mean: Tensor | None, running_var: Tensor | None, momentum: float,
               eps: float, count: int, reduce: Reduce | None) -> Tensor:
    """Training-mode BatchNorm of a tile of channels [c0, c1) (the parameters' and running
    statistics' shards), over the `count` elements per channel of the whole layer.

    `reduce` sums over the tiles holding the same channels (the replica group); None when
    this tile holds every sample and position of its channels, where torch's own BatchNorm is
    the whole story.
    """
    if reduce is None:
        return F.batch_norm(x, running_mean, running_var, weight, bias, True, momentum, eps)
    return sync_batch_norm(x, weight, bias, running_mean, running_var, momentum, eps, count,
                           reduce)


def group_norm(x: Tensor, groups: int, channels: int, weight: Tensor | None,
               bias: Tensor | None, eps: float, plane: int = 1,
               reduce: Reduce | None = None) -> Tensor:
    """GroupNorm(`groups`) of a layer of `channels` channels on a tile of whole groups (graph.py
    limits a channel split to degrees dividing `groups`): the tile's groups * x.shape[1] /
    channels groups, each a "channel" of one sample of n * groups (sync_instance_norm's view)
    whose statistics the plane's tiles sum by `reduce` over the group's channels times `plane`
    positions, or the tile's own when it holds the whole plane (None); `weight` and `bias`
    are the tile's channels' shards, applied per channel after."""
    tile_groups = groups * x.shape[1] // channels
    if reduce is None:
        return F.group_norm(x, tile_groups, weight, bias, eps)
    samples = x.shape[0]
    flat = x.reshape(1, samples * tile_groups, -1)
    normal = _SyncBatchNorm.apply(flat, None, None, channels // groups * plane, eps,
                                  reduce)[0].reshape(x.shape)
    per_channel = (1, x.shape[1], *(1,) * (x.dim() - 2))
    if weight is not None:
        normal = normal * weight.reshape(per_channel)
    return normal if bias is None else normal + bias.reshape(per_channel)


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
               over_channels: bool = False) -> Tensor:
    """LayerNorm over every value of each sample of a tile of whole samples, or, for a
    LayerNorm over the channels alone, over every channel of each position of a tile of
    whole channels (graph.py limits the splits to those): the permute into channels-last and
    back that the model writes around it. Its result is copied back to the channels-first
    layout: left channels-last (the permute's strides), the convolutions after it run on
    channels-last tensors, and oneDNN's backward of a 7x7 depthwise one then holds about
    50x its output (measured: 4 x 16 x 8 x 8, 50.4x channels-last against 4.3x
    channels-first), ConvNeXt's blocks 1.6 MB per rank against 1.0 predicted."""
    if over_channels:  # channels-first again in memory too: see below
        moved = F.layer_norm(x.movedim(1, -1), x.shape[1:2], weight, bias, eps)
        return moved.movedim(-1, 1).contiguous()
    return F.layer_norm(x, x.shape[1:], weight, bias, eps)


def normalizes_channels(op: str) -> bool:
    """Whether a LayerNorm layer's op (graph.py's name for it) is over the channels alone."""
    return op.endswith(OVER_CHANNELS)


def dropout_mask(shape: tuple[int, ...], p: float, unit: str, device: torch.device,
                 dtype: torch.dtype) -> Tensor:
    """The scaled mask torch's dropout (or torchvision's stochastic depth) would draw next from
    the global generator.

    F.dropout draws bernoulli(1 - p) over the input and multiplies by mask / (1 - p);
    dropout2d draws one value per (sample, channel); stochastic depth one per sample ("row")
    or one for the batch, the same way.
    """
    kept = {"element": len(shape), "channel": 2, "sample": 1, "batch": 0}[unit]
    mask_shape = (*shape[:kept], *([1] * (len(shape) - kept)))
    return torch.empty(mask_shape, device=device, dtype=dtype).bernoulli_(1 - p) / (1 - p)


def dropout(x: Tensor, mask: Tensor, box: Box) -> Tensor:
    """The tile `box` (of the 5-d view) of dropout: x times its part of `mask`, drawn over the
    whole tensor (of size 1 along the dims one draw covers).

    Every rank draws the same masks in the same order (`dropout_mask`) and applies its tile's
    part, so a split layer drops what the unsplit one drops.
    """
    slices = tuple(slice(start, stop) if size > 1 else slice(None)
                   for (start, stop), size in zip(real_box(box, x.dim()), mask.shape,
                                                  strict=True))
    return x * mask[slices]


def activation(x: Tensor, function: Callable[[Tensor], Tensor], writes_input: bool) -> Tensor:
    """A one-input elementwise function on a tile (ReLU, sigmoid, ...): the same on any split.

    A function that writes into its input (inplace=True, `relu_`) runs on a copy: the input is
    a producer's tile or an autograd leaf, which must keep its values.
    """
    return function(x.clone() if writes_input else x)


def pad(x: Tensor, out_box: Box, in_start: Sizes, padding: Padding, in_size: Sizes) -> Tensor:
    """The rows out_box of a padding (graph.py's kind "pad") from the needed input box x, whose
    first row along each spatial dim is global `in_start`: along each padded dim, a gather of
    the input row each output row copies (padding.source_rows), the constant where it copies
    none. The same values torch's pad writes; its backward sums each row's gradients as
    torch's does, in another order."""
    for axis, (before, after) in enumerate(padding.sides):
        if before == after == 0:
            continue
        dim = 2 + axis
        start, stop = out_box[dim]
        rows = source_rows(padding.mode, before, after, in_size[axis], start, stop)
        inside = torch.from_numpy(rows >= 0).to(x.device)
        local = torch.from_numpy(np.where(rows >= 0, rows - in_start[axis], 0)).to(x.device)
        gathered = x.index_select(dim, local)
        if not bool(inside.all()):
            shape = [1] * x.dim()
            shape[dim] = stop - start
            gathered = torch.where(inside.view(shape), gathered,
                                   torch.tensor(padding.value, dtype=x.dtype, device=x.device))
        x = gathered
    return x


def channel_map(x: Tensor, sources: Sequence[int], first_channel: int) -> Tensor:
    """A tile of a channel map (a chunk, slice or shuffle of the channels): output channel j
    is channel `sources[j]` of the input, whose box `x` starts at channel `first_channel`."""
    index = torch.tensor(sources, device=x.device) - first_channel
    return x.index_select(1, index)


def layer_op(layer: Layer, inputs: Sequence[Tensor | None], weight: Tensor | None,
             bias: Tensor | None, box: Box, count_include_pad: bool = True) -> Tensor:
    """The main op of `layer` (any kind but input and elementwise) on the tile `box` (a box
    of the 5-d view, `tiles.as_view`).

    `inputs` are the tile's needed boxes of the layer's inputs (None where it needs nothing of
    one, a concat's), `weight` and `bias` its shards of the layer's own parameters.
    """
    kind = layer.kind
    first = inputs[0]
    if kind == "concat":
        return concat(inputs, layer.concat_dim or 0)
    assert first is not None
    rank = len(layer.input_shapes[0])
    own = real_box(box, len(layer.output_shape))
    in_size = layer.input_shapes[0][2:]
    if kind == "conv" and layer.geometry is not None and layer.geometry.transposed:
        assert weight is not None
        return conv_transpose(first, own, _needed_starts(layer, box, rank), weight, bias,
                              layer.geometry)
    if kind == "conv":
        assert weight is not None and layer.geometry is not None
        if weight.dim() == 2:  # a Linear over the channels (graph.py): a 1x1 convolution
            weight = weight.reshape(*weight.shape, *(1,) * len(in_size))
        in_channel_start = needed_range(layer, 0, 1, box[1])[0]
        return conv(first, own, in_size, weight, bias, layer.geometry,
                    layer.output_shape[1], in_channel_start, conv_padding_mode(layer.op))
    if kind == "linear":
        assert weight is not None
        return linear(first, weight, bias)
    if kind == "pool":
        assert layer.geometry is not None
        return pool(first, own, in_size, layer.geometry, pool_mode(layer.op), count_include_pad)
    if kind == "adaptive_pool":
        if len(layer.output_shape) == 2:  # x.mean((2, 3)) without keepdim: the (N, C) of 1x1
            pooled = adaptive_pool(first, real_box(box, rank), in_size,
                                   (1,) * len(in_size), pool_mode(layer.op))
            return pooled.flatten(1)
        return adaptive_pool(first, own, in_size, layer.output_shape[2:], pool_mode(layer.op))
    if kind == "flatten":
        return flatten(first)
    if kind == "resize":
        assert layer.resize is not None
        return resize(first, own, _needed_starts(layer, box, rank), layer.resize, in_size,
                      layer.output_shape[2:])
    if kind == "pad":
        assert layer.padding is not None
        return pad(first, own, _needed_starts(layer, box, rank), layer.padding, in_size)
    if kind == "channels":
        return channel_map(first, layer.channels[box[1][0]:box[1][1]],
                           needed_range(layer, 0, 1, box[1])[0])
    if kind == "add":
        second = inputs[1]
        assert second is not None
        return binary(layer.op, first, second)
    raise ConfigError(f"layer '{layer.name}': no tile op for kind '{kind}'")


def _needed_starts(layer: Layer, box: Box, rank: int) -> Sizes:
    """The first global row along each spatial dim of the input box the tile `box` needs."""
    needed = tuple(needed_range(layer, 0, dim, box[dim]) for dim in range(len(box)))
    return tuple(start for start, _ in real_box(needed, rank)[2:])
