"""Layer ops: every output tile, computed from its needed input box, equals the full op's slice.

The needed boxes are derived here independently (by listing each output's window elements) and
checked against `layerwise.strategies.model.tiles.needed_range`, so the tests also catch a wrong box
there. Backward: input-box gradients scatter-added into the full input, and weight-shard gradients
summed over the tiles sharing a channel shard, equal the full op's gradients.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.testing import assert_close

from layerwise.strategies.model.graph import Geometry, Layer, LayerKind
from layerwise.strategies.model.ops import (
    PoolMode,
    activation,
    adaptive_pool,
    batch_norm,
    conv,
    dropout,
    dropout_mask,
    global_padding,
    layer_op,
    pool,
)
from layerwise.strategies.model.space import tile_range
from layerwise.strategies.model.tiles import Box, Range, needed_box, view_box

EXAMPLES = settings(max_examples=25, deadline=None)
MODES: tuple[PoolMode, ...] = ("max", "avg")

# (x, out_box, weight shard, bias shard) -> the tile's output
TileOp = Callable[[Tensor, Box, Tensor | None, Tensor | None], Tensor]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tensors are tiny: intra-op threads only add overhead (and contend on a busy host)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _span(indices: list[int], size: int) -> Range:
    """[min, max + 1) of the indices, clipped to [0, size)."""
    return (max(min(indices), 0), min(max(indices) + 1, size))


def _window_span(out: Range, kernel: int, stride: int, padding: int, dilation: int,
                 size: int) -> Range:
    """Input rows that output rows `out` read, by listing every element of every window.

    The span, not the set: a dilated window skips rows, and a window may read only padding.
    """
    rows = [i * stride - padding + dilation * j for i in range(*out) for j in range(kernel)]
    return _span(rows, size)


def _adaptive_span(out: Range, in_size: int, out_size: int) -> Range:
    rows = [r for i in range(*out)
            for r in range(i * in_size // out_size, -(-(i + 1) * in_size // out_size))]
    return _span(rows, in_size)


def _layer(kind: LayerKind, x: Tensor, y: Tensor, geometry: Geometry | None = None) -> Layer:
    return Layer(name="layer", kind=kind, op=kind, target=kind, inputs=("x",),
                 input_shapes=(tuple(x.shape),), output_shape=tuple(y.shape), param_shapes={},
                 flops=0, geometry=geometry)


def _sliding_box(layer: Layer, out_box: Box, channels: Range) -> Box:
    """The needed box of a conv/pool tile, checked against tiles.needed_range."""
    geometry = layer.geometry
    assert geometry is not None
    h, w = (
        _window_span(out_box[2 + axis], geometry.kernel[axis], geometry.stride[axis],
                     geometry.padding[axis], geometry.dilation[axis],
                     layer.input_shapes[0][2 + axis])
        for axis in (0, 1)
    )
    box = (out_box[0], channels, h, w)
    assert view_box(box) == needed_box(layer, 0, view_box(out_box))
    return box


def _slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(start, stop) for start, stop in box)


def _check_tiles(x: Tensor, y: Tensor, full_grads: list[Tensor], grad: Tensor,
                 degrees: tuple[int, int, int, int], needed: Callable[[Box], Box],
                 tile_op: TileOp, params: list[Tensor]) -> None:
    """Every tile's forward, and the tiles' gradients put together, match the full op's."""
    x_grad = torch.zeros_like(x)
    param_grads = [torch.zeros_like(p) for p in params]
    per_dim = [[tile_range(size, degree, index) for index in range(degree)]
               for size, degree in zip(y.shape, degrees, strict=True)]
    for out_box in itertools.product(*per_dim):
        in_box = needed(out_box)
        box_x = x[_slices(in_box)].detach().requires_grad_()
        c0, c1 = out_box[1]
        shards = [p[c0:c1].detach().requires_grad_() for p in params]
        weight, bias = (*shards, None, None)[:2]
        out = tile_op(box_x, out_box, weight, bias)
        assert_close(out, y[_slices(out_box)])
        grads = torch.autograd.grad((out * grad[_slices(out_box)]).sum(), [box_x, *shards])
        x_grad[_slices(in_box)] += grads[0]
        for total, shard_grad in zip(param_grads, grads[1:], strict=True):
            total[c0:c1] += shard_grad
    for total, expected in zip([x_grad, *param_grads], full_grads, strict=True):
        assert_close(total, expected)


def _run_full(op: Callable[..., Tensor], x: Tensor, params: list[Tensor]
              ) -> tuple[Tensor, list[Tensor], Tensor]:
    """The full op's output, its gradients w.r.t. x and params for a random output grad."""
    leaves = [t.detach().requires_grad_() for t in (x, *params)]
    y = op(*leaves)
    grad = torch.randn_like(y)
    full_grads = list(torch.autograd.grad((y * grad).sum(), leaves))
    return y.detach(), full_grads, grad


def _degrees(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """1-2 tiles along n, 1-4 (mostly uneven) along c, h and w."""
    n, c, h, w = shape
    return (draw(st.integers(1, min(2, n))), draw(st.integers(1, min(4, c))),
            draw(st.integers(1, min(4, h))), draw(st.integers(1, min(4, w))))


def _axis(draw: st.DrawFn, dilated: bool) -> tuple[int, int, int, int, int]:
    """kernel, stride, padding, dilation and an input size giving at least one output."""
    kernel = draw(st.integers(1, 5))
    stride = draw(st.integers(1, 3))
    padding = draw(st.integers(0, kernel // 2))
    dilation = draw(st.integers(1, 2)) if dilated else 1
    smallest = max(1, dilation * (kernel - 1) + 1 - 2 * padding)
    return kernel, stride, padding, dilation, draw(st.integers(smallest, smallest + 9))


def _check_conv(x: Tensor, weight: Tensor, bias: Tensor | None, geometry: Geometry,
                degrees: tuple[int, int, int, int]) -> None:
    params = [weight] if bias is None else [weight, bias]

    def full(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        return F.conv2d(x, weight, bias, geometry.stride, geometry.padding, geometry.dilation,
                        geometry.groups)

    y, full_grads, grad = _run_full(full, x, params)
    layer = _layer("conv", x, y, geometry)
    out_channels, in_per_group = weight.shape[0], weight.shape[1]
    out_per_group = out_channels // geometry.groups

    def needed(out_box: Box) -> Box:
        groups = [c // out_per_group for c in range(*out_box[1])]
        channels = [g * in_per_group + i for g in groups for i in range(in_per_group)]
        return _sliding_box(layer, out_box, _span(channels, x.shape[1]))

    def tile_op(box_x: Tensor, out_box: Box, weight: Tensor | None, bias: Tensor | None
                ) -> Tensor:
        assert weight is not None
        return conv(box_x, out_box, (x.shape[2], x.shape[3]), weight, bias, geometry,
                         out_channels, needed(out_box)[1][0])

    _check_tiles(x, y, full_grads, grad, degrees, needed, tile_op, params)


@st.composite
def conv_cases(draw: st.DrawFn) -> tuple[Tensor, Tensor, Tensor | None, Geometry,
                                         tuple[int, int, int, int]]:
    torch.manual_seed(draw(st.integers(0, 2**16)))
    kh, sh, ph, dh, height = _axis(draw, dilated=True)
    kw, sw, pw, dw, width = _axis(draw, dilated=True)
    groups = draw(st.sampled_from([1, 2, 4]))
    in_per_group, out_per_group = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    geometry = Geometry(kernel=(kh, kw), stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw),
                        groups=groups)
    x = torch.randn(draw(st.integers(1, 2)), groups * in_per_group, height, width)
    weight = torch.randn(groups * out_per_group, in_per_group, kh, kw)
    bias = torch.randn(groups * out_per_group) if draw(st.booleans()) else None
    y_shape = F.conv2d(x, weight, None, geometry.stride, geometry.padding, geometry.dilation,
                       groups).shape
    return x, weight, bias, geometry, _degrees(draw, tuple(y_shape))


@EXAMPLES
@given(conv_cases())
def test_conv_tiles_match_full_conv(case) -> None:
    _check_conv(*case)


def test_conv_3x3_stride_2_split_2x2_odd_input() -> None:
    torch.manual_seed(0)
    geometry = Geometry(kernel=(3, 3), stride=(2, 2), padding=(1, 1))
    x, weight, bias = torch.randn(2, 3, 15, 15), torch.randn(4, 3, 3, 3), torch.randn(4)
    _check_conv(x, weight, bias, geometry, (1, 1, 2, 2))
    _check_conv(x, weight, bias, geometry, (2, 2, 2, 2))


@pytest.mark.parametrize(("groups", "in_channels", "out_channels", "c_degree"), [
    (2, 4, 6, 3),  # shards [0,2) [2,4) [4,6): the middle one cuts both groups
    (4, 4, 8, 3),  # depthwise x2: shard [2,5) holds all of group 1 and part of group 2
    (4, 4, 4, 3),  # depthwise: every shard is whole groups
])
def test_grouped_conv_shards_across_groups(groups: int, in_channels: int, out_channels: int,
                                           c_degree: int) -> None:
    torch.manual_seed(1)
    geometry = Geometry(kernel=(3, 3), stride=(1, 1), padding=(1, 1), groups=groups)
    x = torch.randn(1, in_channels, 7, 6)
    weight = torch.randn(out_channels, in_channels // groups, 3, 3)
    _check_conv(x, weight, torch.randn(out_channels), geometry, (1, c_degree, 2, 1))


def test_conv_tile_finds_its_groups_in_a_wider_box() -> None:
    # the box may start before the shard's first group: in_channel_start says where it starts
    torch.manual_seed(4)
    geometry = Geometry(kernel=(3, 3), stride=(1, 1), padding=(1, 1), groups=2)
    x, weight, bias = torch.randn(1, 4, 7, 6), torch.randn(6, 2, 3, 3), torch.randn(6)
    y = F.conv2d(x, weight, bias, padding=1, groups=2)
    for c0, c1 in [(2, 5), (3, 6), (4, 6)]:
        box: Box = ((0, 1), (c0, c1), (0, 7), (0, 6))
        out = conv(x, box, (7, 6), weight[c0:c1], bias[c0:c1], geometry, 6, 0)
        assert_close(out, y[:, c0:c1])


def _check_pool(x: Tensor, geometry: Geometry, mode: PoolMode, count_include_pad: bool,
                degrees: tuple[int, int, int, int]) -> None:
    def full(x: Tensor) -> Tensor:
        if mode == "max":
            return F.max_pool2d(x, geometry.kernel, geometry.stride, geometry.padding,
                                geometry.dilation, geometry.ceil_mode)
        return F.avg_pool2d(x, geometry.kernel, geometry.stride, geometry.padding,
                            geometry.ceil_mode, count_include_pad)

    y, full_grads, grad = _run_full(full, x, [])
    layer = _layer("pool", x, y, geometry)

    def needed(out_box: Box) -> Box:
        return _sliding_box(layer, out_box, out_box[1])

    def tile_op(box_x: Tensor, out_box: Box, *_: Tensor | None) -> Tensor:
        return pool(box_x, out_box, (x.shape[2], x.shape[3]), geometry, mode,
                         count_include_pad)

    _check_tiles(x, y, full_grads, grad, degrees, needed, tile_op, [])


def _for_mode(x: Tensor, mode: PoolMode) -> Tensor:
    """For max pooling, small integers: maxima tie across rows and cols, so the element the
    gradient goes to (torch: the first maximum in row-major order) is checked too."""
    return x.mul(2).round() if mode == "max" else x


def _pool_input(draw: st.DrawFn, mode: PoolMode, height: int, width: int) -> Tensor:
    torch.manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(draw(st.integers(1, 2)), draw(st.integers(1, 3)), height, width)
    return _for_mode(x, mode)


@st.composite
def pool_cases(draw: st.DrawFn) -> tuple[Tensor, Geometry, PoolMode, bool,
                                         tuple[int, int, int, int]]:
    mode = draw(st.sampled_from(MODES))
    kh, sh, ph, dh, height = _axis(draw, dilated=mode == "max")
    kw, sw, pw, dw, width = _axis(draw, dilated=mode == "max")
    geometry = Geometry(kernel=(kh, kw), stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw),
                        ceil_mode=draw(st.booleans()))
    count_include_pad = draw(st.booleans())
    x = _pool_input(draw, mode, height, width)
    if mode == "max":
        y = F.max_pool2d(x, geometry.kernel, geometry.stride, geometry.padding,
                         geometry.dilation, geometry.ceil_mode)
        # a dilated window can read only padding: its -inf has no gradient worth comparing
        assume(bool(y.isfinite().all()))
    else:
        y = F.avg_pool2d(x, geometry.kernel, geometry.stride, geometry.padding,
                         geometry.ceil_mode, count_include_pad)
    return x, geometry, mode, count_include_pad, _degrees(draw, tuple(y.shape))


@EXAMPLES
@given(pool_cases())
def test_pool_tiles_match_full_pool(case) -> None:
    _check_pool(*case)


@pytest.mark.parametrize(("mode", "count_include_pad"),
                         [("max", True), ("avg", True), ("avg", False)])
def test_ceil_mode_window_past_the_padding(mode: PoolMode, count_include_pad: bool) -> None:
    # 8 rows, kernel 3, stride 2, padding 1, ceil_mode: 5 outputs; the last window starts at
    # row 7 and covers 7, 8 (padding) and 9 (past it), so torch divides its sum by 2 (with
    # count_include_pad) or 1, not by 3
    torch.manual_seed(2)
    geometry = Geometry(kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True)
    x = torch.randn(1, 2, 8, 8)
    _check_pool(_for_mode(x, mode), geometry, mode, count_include_pad, (1, 1, 2, 3))


def test_global_padding_only_at_the_borders() -> None:
    # 15 rows, kernel 3, stride 2, padding 1: 8 output rows; rows [0, 4) read [-1, 7]
    assert global_padding(0, 4, 3, 2, 1, 1, 15) == (1, 0)
    assert global_padding(4, 8, 3, 2, 1, 1, 15) == (0, 1)
    assert global_padding(2, 6, 3, 2, 1, 1, 15) == (0, 0)


def _check_adaptive(x: Tensor, out_size: tuple[int, int], mode: PoolMode,
                    degrees: tuple[int, int, int, int]) -> None:
    def full(x: Tensor) -> Tensor:
        if mode == "max":
            return F.adaptive_max_pool2d(x, out_size)
        return F.adaptive_avg_pool2d(x, out_size)

    y, full_grads, grad = _run_full(full, x, [])
    layer = _layer("adaptive_pool", x, y)
    in_size = (x.shape[2], x.shape[3])

    def needed(out_box: Box) -> Box:
        h, w = (_adaptive_span(out_box[2 + axis], in_size[axis], out_size[axis])
                for axis in (0, 1))
        box = (out_box[0], out_box[1], h, w)
        assert view_box(box) == needed_box(layer, 0, view_box(out_box))
        return box

    def tile_op(box_x: Tensor, out_box: Box, *_: Tensor | None) -> Tensor:
        return adaptive_pool(box_x, out_box, in_size, out_size, mode)

    _check_tiles(x, y, full_grads, grad, degrees, needed, tile_op, [])


@st.composite
def adaptive_cases(draw: st.DrawFn) -> tuple[Tensor, tuple[int, int], PoolMode,
                                             tuple[int, int, int, int]]:
    mode = draw(st.sampled_from(MODES))
    height, width = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    out_size = (draw(st.integers(1, 8)), draw(st.integers(1, 8)))
    x = _pool_input(draw, mode, height, width)
    return x, out_size, mode, _degrees(draw, (x.shape[0], x.shape[1], *out_size))


@EXAMPLES
@given(adaptive_cases())
def test_adaptive_pool_tiles_match_full_pool(case) -> None:
    _check_adaptive(*case)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("in_size", "out_size"), [((14, 12), (7, 4)), ((13, 5), (5, 7))])
def test_adaptive_regular_and_overlapping_windows(mode: PoolMode, in_size: tuple[int, int],
                                                  out_size: tuple[int, int]) -> None:
    torch.manual_seed(3)
    x = torch.randn(2, 3, *in_size)
    _check_adaptive(_for_mode(x, mode), out_size, mode, (2, 2, 3, 2))


@pytest.mark.parametrize(("unit", "shape"), [("element", (4, 6, 5, 3)),
                                             ("channel", (4, 6, 1, 1)),
                                             ("sample", (4, 1, 1, 1)), ("batch", (1, 1, 1, 1))])
def test_dropout_tiles_apply_their_part_of_the_whole_mask(unit: str, shape) -> None:
    torch.manual_seed(4)
    x = torch.randn(4, 6, 5, 3, dtype=torch.float64)
    mask = dropout_mask(tuple(x.shape), 0.4, unit, x.device, x.dtype)
    assert mask.shape == shape
    assert set(mask.unique().tolist()) <= {0.0, 1 / 0.6}
    whole = x * mask
    _check_tiles(x, whole, [mask.expand_as(x)], torch.ones_like(x), (2, 3, 2, 1),
                 lambda box: box,
                 lambda box_x, box, *_: dropout(box_x, mask, view_box(box)), [])


def test_layer_ops_without_geometry_are_the_full_ops_slices() -> None:
    torch.manual_seed(5)
    x, y = torch.randn(4, 3, 2, 2), torch.randn(4, 3, 2, 2)
    weight, bias = torch.randn(5, 12), torch.randn(5)
    box: Box = ((1, 3), (2, 5), (0, 1), (0, 1))
    fc = Layer(name="fc", kind="linear", op="Linear", target="fc", inputs=("x",),
               input_shapes=((4, 3, 2, 2),), output_shape=(4, 5), param_shapes={}, flops=0)
    assert_close(layer_op(fc, [x[1:3]], weight[2:5], bias[2:5], box),
                 F.linear(x.flatten(1), weight, bias)[1:3, 2:5])
    flat = fc.model_copy(update={"kind": "flatten", "output_shape": (4, 12)})
    assert_close(layer_op(flat, [x[1:3]], None, None, box), x.flatten(1)[1:3])
    for op, expected in (("add", x + y), ("sub", x - y), ("mul", x * y)):
        binary_layer = fc.model_copy(update={"kind": "add", "op": op})
        assert_close(layer_op(binary_layer, [x[1:3], y[1:3]], None, None, box), expected[1:3])
    cat = fc.model_copy(update={"kind": "concat", "concat_dim": 1})
    assert_close(layer_op(cat, [None, y[:, 1:]], None, None, box),
                 torch.cat([x, y], 1)[:, 4:])  # a tile of channels [4, 6) needs nothing of x


def test_batch_norm_of_a_whole_batch_is_torchs_and_activations_keep_their_input() -> None:
    torch.manual_seed(6)
    x = torch.randn(4, 3, 5, 5)
    weight, bias = torch.rand(3) + 0.5, torch.randn(3)
    running = (torch.zeros(3), torch.ones(3))
    expected_running = (torch.zeros(3), torch.ones(3))
    out = batch_norm(x, weight, bias, *running, 0.1, 1e-5, 100, None)
    assert_close(out, F.batch_norm(x, *expected_running, weight, bias, True, 0.1, 1e-5))
    assert_close(running, expected_running)
    before = x.clone()
    assert_close(activation(x, lambda t: t.relu_(), writes_input=True), before.relu())
    assert torch.equal(x, before)
