"""Tile geometry: what each tile of a layer owns and what it needs from each input.

Every tensor is seen through the 5-d view (n, c, d, h, w) of `space.as_view`: an (N, F) tensor
is (N, F, 1, 1, 1), an (N, C, L) one (N, C, 1, 1, L), an (N, C, H, W) one (N, C, 1, H, W). A
layer's output tile owns a box, one range per dimension of the view (`space.tile_range`). To
compute it, the tile needs a box of each input tensor (Jia et al. 2018, section 4: t_x counts
exactly these regions):
- n: the same samples (every layer is per-sample);
- conv/pool d, h, w (l): the receptive field of its rows (kernel, stride, padding, dilation
  along that dim), clipped at the borders; adaptive pooling: the union of its adaptive windows;
- conv c: all input channels, or only its groups' channels for a grouped/depthwise conv;
  pooling, elementwise and add: the same channels; concat: its channels shifted into each
  input (possibly none of an input);
- linear and flatten: every feature of the input (a channel split of an FC layer needs the
  whole input).
Along each dimension the needed range depends only on the tile's index along that dimension,
so box volumes and overlaps factor into per-dimension terms; cost/cost_model.py relies on this.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.graph import SPLIT_RESIZE_MODES, Layer, LayerGraph
from layerwise.strategies.model.padding import source_reach
from layerwise.strategies.model.resize import resize_taps
from layerwise.strategies.model.space import (
    DIMS,
    Degrees,
    ParallelConfig,
    as_view,
    tile_range,
    view_dims,
)

Range = tuple[int, int]
Rows = int | np.ndarray  # one row index, or one per range
Box = tuple[Range, ...]  # one range per dimension of the 5-d view (n, c, d, h, w)
VIEW = len(DIMS)


def real_box(box: Box, rank: int) -> Box:
    """The ranges of a view box along the dims a tensor of `rank` dims has, in its order."""
    return tuple(box[position] for position in view_dims(rank))


def view_box(box: Box) -> Box:
    """A tensor's box (one range per its dim) in the 5-d view: (0, 1) where it lacks a dim."""
    view = [(0, 1)] * VIEW
    for position, extent in zip(view_dims(len(box)), box, strict=True):
        view[position] = extent
    return tuple(view)


def output_ranges(layer: Layer, dim: int, degree: int) -> list[Range]:
    """The output range of each tile index along view dimension `dim` (0..4: n, c, d, h, w)."""
    size = as_view(layer.output_shape)[dim]
    return [tile_range(size, degree, index) for index in range(degree)]


def _window_reach(start: Rows, stop: Rows, kernel: int, stride: int, padding: int,
                  dilation: int) -> tuple[Rows, Rows]:
    """The first and one past the last input row output rows [start, stop) of a sliding
    window read, unclipped (ints, or arrays of many ranges)."""
    return (start * stride - padding,
            (stop - 1) * stride - padding + dilation * (kernel - 1) + 1)


def _transposed_reach(start: Rows, stop: Rows, kernel: int, stride: int, padding: int,
                      dilation: int) -> tuple[Rows, Rows]:
    """The first and one past the last input row whose windows reach output rows [start,
    stop) of a transposed convolution (input row i adds into output rows
    i * stride - padding + j * dilation, j < kernel), unclipped."""
    return (-(-(start + padding - dilation * (kernel - 1)) // stride),
            (stop - 1 + padding) // stride + 1)


def _window(start: int, stop: int, kernel: int, stride: int, padding: int, dilation: int,
            size: int) -> Range:
    """Input rows read by output rows [start, stop) of a sliding window, clipped to [0, size)."""
    first, end = _window_reach(start, stop, kernel, stride, padding, dilation)
    return (max(first, 0), min(end, size))


def _transposed_window(start: int, stop: int, kernel: int, stride: int, padding: int,
                       dilation: int, size: int) -> Range:
    """`_transposed_reach` clipped to [0, size)."""
    first, end = _transposed_reach(start, stop, kernel, stride, padding, dilation)
    return (max(first, 0), min(end, size))


def resize_reach(layer: Layer, dim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """For each output row along view dim `dim` (2, 3, 4) of an upsampling layer, the first
    and last input row its interpolation weights reach (torch's own weights: resize.py)."""
    resize = layer.resize
    assert resize is not None
    axis = dim - VIEW + len(resize.scales)
    return resize_taps(as_view(layer.input_shapes[0])[dim], as_view(layer.output_shape)[dim],
                       resize.mode, resize.align_corners, resize.scales[axis]).reach


def passes_through(layer: Layer, input_index: int, dim: int) -> bool:
    """Whether every output range along `dim` needs that same range of input `input_index`:
    the batch, or a spatial dim neither tensor has."""
    return dim == 0 or (dim >= 2 and as_view(layer.input_shapes[input_index])[dim] == 1
                        and as_view(layer.output_shape)[dim] == 1)


def needed_range(layer: Layer, input_index: int, dim: int, out: Range) -> Range:
    """The range along `dim` of input `input_index` that output range `out` needs.

    An empty range (start >= stop) means the tile needs nothing of that input (concat).
    """
    if passes_through(layer, input_index, dim):
        return out
    in_size = as_view(layer.input_shapes[input_index])[dim]
    start, stop = out
    kind = layer.kind
    if kind in ("linear", "flatten"):
        return (0, in_size)
    if kind == "concat":
        if dim != view_dims(len(layer.output_shape))[layer.concat_dim or 0]:
            return out
        offset = sum(as_view(shape)[dim] for shape in layer.input_shapes[:input_index])
        return (max(start - offset, 0), min(stop - offset, in_size))
    if kind == "add" and in_size == 1 and as_view(layer.output_shape)[dim] > 1:
        return (0, 1)  # a broadcast input (graph.py's _broadcasts): every tile needs all of it
    geometry = layer.geometry
    if kind == "channels" and dim == 1:  # the input channels its own channels come from
        sources = layer.channels[start:stop]
        return (min(sources), max(sources) + 1)
    if dim == 1:
        if kind == "conv" and geometry is not None:
            if geometry.groups == 1:
                return (0, in_size)
            out_per_group = as_view(layer.output_shape)[1] // geometry.groups
            in_per_group = in_size // geometry.groups
            return (start // out_per_group * in_per_group,
                    ((stop - 1) // out_per_group + 1) * in_per_group)
        return out
    if kind in ("conv", "pool") and geometry is not None:
        window = _transposed_window if geometry.transposed else _window
        return window(start, stop, *geometry.along(dim), in_size)
    if kind == "resize" and layer.resize is not None:
        if layer.resize.mode not in SPLIT_RESIZE_MODES:  # held whole (graph.py)
            return (0, in_size)
        first, last = resize_reach(layer, dim)
        return (first[start], last[stop - 1] + 1)
    if kind == "pad" and layer.padding is not None:
        axis = dim - VIEW + len(layer.padding.sides)
        before, after = layer.padding.sides[axis]
        if before == after == 0:
            return out
        return source_reach(layer.padding.mode, before, after, in_size, start, stop)
    if kind == "adaptive_pool":
        out_size = as_view(layer.output_shape)[dim]
        return (start * in_size // out_size, -(-stop * in_size // out_size))
    return out


def needed_ranges(layer: Layer, input_index: int, dim: int,
                  outs: Sequence[Range]) -> tuple[np.ndarray, np.ndarray]:
    """`needed_range` of each output range of `outs`, as (starts, stops) arrays: a
    convolution's or pooling's windows along a spatial dim, a concatenation's shift and the
    cases that need the range itself or the whole input all at once (the cost tables ask for
    every tile of every power-of-two degree: 511 ranges per dim on 256 devices), each
    distinct range of any other in turn."""
    geometry = layer.geometry
    kind = layer.kind
    starts, stops = np.array(outs, dtype=np.int64).reshape(-1, 2).T
    in_size = as_view(layer.input_shapes[input_index])[dim]
    # `needed_range`'s cases that need no loop, in its order: a range itself, the whole
    # input, a concatenation's shifted range, a window op's windows
    if passes_through(layer, input_index, dim):
        return starts, stops
    if kind in ("linear", "flatten"):
        return np.zeros_like(starts), np.full_like(stops, in_size)
    if kind == "concat":
        if dim != view_dims(len(layer.output_shape))[layer.concat_dim or 0]:
            return starts, stops
        offset = sum(as_view(shape)[dim] for shape in layer.input_shapes[:input_index])
        return np.maximum(starts - offset, 0), np.minimum(stops - offset, in_size)
    if dim == 1 and kind not in ("add", "channels", "conv"):
        return starts, stops
    if dim == 1 and kind == "conv" and geometry is not None and geometry.groups == 1:
        return np.zeros_like(starts), np.full_like(stops, in_size)
    if kind in ("conv", "pool") and geometry is not None and dim >= 2:
        reach = _transposed_reach if geometry.transposed else _window_reach
        first, end = reach(starts, stops, *geometry.along(dim))
        return np.maximum(first, 0), np.minimum(end, in_size)
    needed = {out: needed_range(layer, input_index, dim, out) for out in dict.fromkeys(outs)}
    starts, stops = np.array([needed[out] for out in outs], dtype=np.int64).reshape(-1, 2).T
    return starts, stops


class TileWork(BaseModel):
    """The work of a layer's largest tile under a config: what one device computes.

    Devices run their tiles at once, so the largest tile sets the layer's compute time.
    `input_shapes` are the needed boxes (halos included); `param_elements` the weights the
    tile's device holds (a channel split shards them).
    """

    model_config = ConfigDict(frozen=True)

    output_shape: tuple[int, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    param_elements: int

    @property
    def key(self) -> str:
        """Identity of the measurement: tiles with equal keys take equal time."""
        inputs = ";".join("x".join(map(str, shape)) for shape in self.input_shapes)
        return f"{'x'.join(map(str, self.output_shape))}<{inputs}"


def largest_tile(layer: Layer, config: ParallelConfig) -> TileWork:
    """Shapes of the tile with the most output elements (the first such tile along each dim)."""
    per_dim = []
    for dim, degree in enumerate(config.degrees):
        ranges = output_ranges(layer, dim, degree)
        per_dim.append(max(ranges, key=lambda r: r[1] - r[0]))
    output_shape = tuple(stop - start for start, stop in real_box(tuple(per_dim),
                                                                   len(layer.output_shape)))
    input_shapes = []
    for index, shape in enumerate(layer.input_shapes):
        needed = tuple(needed_range(layer, index, dim, per_dim[dim]) for dim in range(VIEW))
        input_shapes.append(tuple(max(stop - start, 0)
                                  for start, stop in real_box(needed, len(shape))))
    out_channels = as_view(layer.output_shape)[1]
    c_start, c_stop = per_dim[DIMS.index("c")]
    param_elements = layer.param_count * (c_stop - c_start) // out_channels
    return TileWork(output_shape=output_shape, input_shapes=tuple(input_shapes),
                    param_elements=param_elements)


def tile_box(layer: Layer, tile: TileWork) -> Box:
    """An output box of `layer` with `tile`'s shapes: along each dimension, the first place
    where the output range has the tile's length and its needed input ranges the tile's.

    A TileWork keeps shapes only (tiles of equal shapes take equal time, `TileWork.key`), but
    a tile op also reads where its box lies: which borders it pads, which groups of a grouped
    conv it spans. Any place with these shapes pads as much and spans as many groups, so the
    profiler times the tile at this one.
    """
    out = as_view(tile.output_shape)
    sizes = as_view(layer.output_shape)
    inputs = [as_view(shape) for shape in tile.input_shapes]
    box: list[Range] = []
    for dim in range(VIEW):
        length = out[dim]
        for start in range(sizes[dim] - length + 1):
            needed = [needed_range(layer, index, dim, (start, start + length))
                      for index in range(len(inputs))]
            if all(max(stop - first, 0) == shape[dim]
                   for (first, stop), shape in zip(needed, inputs, strict=True)):
                box.append((start, start + length))
                break
        else:
            raise ConfigError(f"layer '{layer.name}' has no tile of shape {tile.output_shape} "
                              f"needing {tile.input_shapes}")
    return tuple(box)


def indexed_box(layer: Layer, index: Degrees, degrees: Degrees) -> Box:
    """The output box of tile `index` when `layer`'s output is cut by `degrees`."""
    sizes = as_view(layer.output_shape)
    return tuple(tile_range(sizes[d], degrees[d], index[d]) for d in range(VIEW))


def config_boxes(layer: Layer, config: ParallelConfig) -> dict[int, Box]:
    """Each device's output box of `layer` under `config`."""
    return {device: indexed_box(layer, index, config.degrees)
            for index, device in config.tiles()}


def needed_box(layer: Layer, input_index: int, out_box: Box) -> Box:
    """The box of input `input_index` that output box `out_box` needs (empty ranges possible)."""
    return tuple(needed_range(layer, input_index, d, out_box[d]) for d in range(VIEW))


def box_volume(box: Box) -> int:
    total = 1
    for start, stop in box:
        total *= max(stop - start, 0)
    return total


def chained_edges(graph: LayerGraph, boxes: Mapping[str, Mapping[int, Box]],
                  recompute: Collection[str] = ()) -> dict[str, str]:
    """Consumer -> producer of every chained edge, given each layer's output box per device.

    An edge is chained when its producer (not the network input, not an output) feeds only
    this consumer, the consumer reads only it, neither is recomputed in the backward (a
    recomputed layer's forward keeps no autograd graph to chain onto, and its backward
    starts from its own inputs), and on every device the consumer needs exactly the
    producer's box there: nothing moves. The runtime then computes the consumer on the
    producer's output tensor itself, so one autograd graph spans the chain and one backward
    call runs it (no leaf, no copied gradient); the memory model counts what that keeps.
    """
    consumers = graph.consumers
    by_name = graph.by_name
    chained: dict[str, str] = {}
    for layer in graph.layers:
        if len(layer.inputs) != 1:
            continue
        producer = by_name[layer.inputs[0]]
        if (producer.kind == "input" or consumers[producer.name] != (layer.name,)
                or producer.name in graph.outputs or layer.name in recompute
                or producer.name in recompute):
            continue
        own, theirs = boxes[layer.name], boxes[producer.name]
        if own.keys() == theirs.keys() and all(
                needed_box(layer, 0, box) == theirs[device] for device, box in own.items()):
            chained[layer.name] = producer.name
    return chained

