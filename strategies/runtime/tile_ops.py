"""Forward of one output tile of a conv or pooling layer, computed from its needed input box.

The rank that computes an output tile receives only the input box the tile's receptive field
covers, clipped at the tensor borders (`strategies.tiles.needed_range`). Each op here re-creates
the global padding where that box touches a border (zeros for conv and average pooling, -inf
for max pooling) and then runs the torch op unpadded, so the tile equals the matching slice of
the full-tensor op and autograd gives the matching slices of its gradients. Nothing is padded
between tiles: there the box already holds the neighbours' rows (the halo).

Boxes are (start, stop) ranges over (n, c, h, w), as in `strategies.tiles`.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from strategies.graph import Geometry

Range = tuple[int, int]
Box = tuple[Range, Range, Range, Range]
PoolMode = Literal["max", "avg"]


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


def _pad_borders(x: Tensor, out_box: Box, in_size_hw: tuple[int, int], geometry: Geometry,
                 value: float) -> Tensor:
    """The box's h/w extended with `value` to the tile's whole receptive field."""
    top, bottom, left, right = (
        side
        for axis in (0, 1)
        for side in global_padding(*out_box[2 + axis], geometry.kernel[axis],
                                   geometry.stride[axis], geometry.padding[axis],
                                   geometry.dilation[axis], in_size_hw[axis])
    )
    return F.pad(x, (left, right, top, bottom), value=value)


def whole_rows_and_cols(out_box: Box, in_size_hw: tuple[int, int], geometry: Geometry) -> bool:
    """Whether the tile holds every output row and column (a sample or channel split).

    Then conv2d's own padding is the global padding, and rows past the last window that the
    needed box leaves out (a strided 1x1 conv) would produce no output anyway: one call, no
    padded copy of the input.
    """
    for axis in (0, 1):
        size = in_size_hw[axis] + 2 * geometry.padding[axis]
        reach = geometry.dilation[axis] * (geometry.kernel[axis] - 1) + 1
        if out_box[2 + axis] != (0, (size - reach) // geometry.stride[axis] + 1):
            return False
    return True


def conv_tile(x: Tensor, out_box: Box, in_size_hw: tuple[int, int], weight: Tensor,
              bias: Tensor | None, geometry: Geometry, out_channels_total: int,
              in_channel_start: int) -> Tensor:
    """Output channels out_box[1] = [c0, c1) over out_box's rows/cols of a zero-padded conv2d.

    x is the needed input box; its first channel is global input channel `in_channel_start`
    (0 for groups == 1, where it holds every input channel). weight and bias are the shard of
    output channels [c0, c1). A shard whose ends fall on group boundaries is one grouped conv;
    one that cuts a group is convolved group by group, each part with its group's input
    channels, because conv2d's `groups` assumes every group is whole.
    """
    per_group_out = out_channels_total // geometry.groups
    per_group_in = weight.shape[1]
    c0, c1 = out_box[1]
    first_group, last_group = c0 // per_group_out, (c1 - 1) // per_group_out
    offset = first_group * per_group_in - in_channel_start
    width = (last_group - first_group + 1) * per_group_in
    if offset or width != x.shape[1]:  # a slice is an autograd node: only when it cuts
        x = x[:, offset:offset + width]
    if whole_rows_and_cols(out_box, in_size_hw, geometry):
        padded, padding = x, geometry.padding  # conv2d pads the global border itself
    else:
        padded, padding = _pad_borders(x, out_box, in_size_hw, geometry, 0.0), (0, 0)
    conv = partial(F.conv2d, stride=geometry.stride, padding=padding,
                   dilation=geometry.dilation)
    if first_group == last_group or (c0 % per_group_out == 0 and c1 % per_group_out == 0):
        return conv(padded, weight, bias, groups=last_group - first_group + 1)
    pieces = []
    for group in range(first_group, last_group + 1):
        lo = max(c0, group * per_group_out) - c0
        hi = min(c1, (group + 1) * per_group_out) - c0
        channel = (group - first_group) * per_group_in
        pieces.append(conv(padded[:, channel:channel + per_group_in], weight[lo:hi],
                           None if bias is None else bias[lo:hi]))
    return torch.cat(pieces, dim=1)


def _avg_divisors(out: Range, kernel: int, stride: int, padding: int, in_size: int,
                  count_include_pad: bool, like: Tensor) -> Tensor:
    """torch's avg_pool2d divisor along one axis for output positions [start, stop).

    As in aten's AvgPool2d: a window's size counts padding but stops at in_size + padding (only
    a ceil_mode window runs past it); count_include_pad=False counts only in-bounds elements.
    The 2-d divisor is the product of the two axes' divisors.
    """
    counts = []
    for index in range(*out):
        first = index * stride - padding
        last = min(first + kernel, in_size + padding)
        inside = min(last, in_size) - max(first, 0)
        counts.append(last - first if count_include_pad else inside)
    return torch.tensor(counts, dtype=like.dtype, device=like.device)


def pool_tile(x: Tensor, out_box: Box, in_size_hw: tuple[int, int], geometry: Geometry,
              mode: PoolMode, count_include_pad: bool = True) -> Tensor:
    """Rows/cols out_box of max_pool2d or avg_pool2d (any ceil_mode) over the needed box x.

    Max pooling pads with -inf, which never wins, so even a ceil_mode window that runs past the
    padding takes the full op's maximum (and, on ties, the same first element). Average pooling
    sums the zero-padded windows and divides by torch's own divisor for each output position,
    which a plain avg_pool2d of the tile cannot know: it depends on where the window sits in the
    whole tensor, not in the tile. A tile of whole rows and columns is the full op's own call.
    """
    if whole_rows_and_cols(out_box, in_size_hw, geometry):  # the full op's own call
        if mode == "max":
            return F.max_pool2d(x, geometry.kernel, geometry.stride, geometry.padding,
                                geometry.dilation)
        return F.avg_pool2d(x, geometry.kernel, geometry.stride, geometry.padding,
                            count_include_pad=count_include_pad)
    if mode == "max":
        padded = _pad_borders(x, out_box, in_size_hw, geometry, float("-inf"))
        return F.max_pool2d(padded, geometry.kernel, geometry.stride, 0, geometry.dilation)
    padded = _pad_borders(x, out_box, in_size_hw, geometry, 0.0)
    sums = F.avg_pool2d(padded, geometry.kernel, geometry.stride, divisor_override=1)
    rows, cols = (
        _avg_divisors(out_box[2 + axis], geometry.kernel[axis], geometry.stride[axis],
                      geometry.padding[axis], in_size_hw[axis], count_include_pad, sums)
        for axis in (0, 1)
    )
    return sums / (rows[:, None] * cols[None, :])


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


def adaptive_pool_tile(x: Tensor, out_box: Box, in_size_hw: tuple[int, int],
                       out_size_hw: tuple[int, int], mode: PoolMode) -> Tensor:
    """Rows/cols out_box of adaptive_max_pool2d or adaptive_avg_pool2d over the needed box x.

    An adaptive window is a rectangle, so pooling cols then rows equals pooling it at once: the
    mean of row means of equal-width rows, and the max of row maxima. Cols go first so that the
    element a max picks on ties is the full op's first one in row-major order. A tile of every
    output row and column is torch's own adaptive pool.
    """
    if (out_box[2], out_box[3]) == ((0, out_size_hw[0]), (0, out_size_hw[1])):
        pool = F.adaptive_max_pool2d if mode == "max" else F.adaptive_avg_pool2d
        return pool(x, out_size_hw)
    cols = _adaptive_axis(x, 3, out_box[3], in_size_hw[1], out_size_hw[1], mode)
    return _adaptive_axis(cols, 2, out_box[2], in_size_hw[0], out_size_hw[0], mode)
