"""nn.Module -> LayerGraph: the DAG of layers that search, cost model and runtime work on.

torch.fx traces the module; shapes are propagated under FakeTensorMode (docs/research.md: measured
behaviour: a real ShapeProp would run the forward and move BatchNorm's running stats). Each fx node
becomes a layer with its kind, output shape, parameter shapes, forward FLOPs and, for conv/pool, the
geometry the cost model and the halo exchange need.

Fusion (Jia et al. 2018 treat these as part of the layer that produces their input): an
elementwise op with one input (BatchNorm, GroupNorm, InstanceNorm, LayerNorm, ReLU and other
activations, Dropout, Identity, scalar arithmetic, and any other module or function found
elementwise by running it: strategies/model/elementwise.py) is fused into its producer when that
producer has no other consumer and is not the network input. Fused ops keep their names and
order in `Layer.fused`; the producer's output shape does not change. Everything else (conv and
transposed conv, linear, pool, the mean over h and w, add and broadcast gates, concat, flatten)
is a layer; a size query (`x.size(0)` of `x.view(x.size(0), -1)`, and arithmetic on sizes) is
none, but runs with the layer that reads it (`Layer.reads`). A chunk, slice or shuffle of the
channels (ShuffleNet's) is one layer of kind "channels" (channel_maps.py). A parameter an op
reads directly (fx's get_attr: ConvNeXt's layer scale, a LayerNorm2d's weight handed to
F.layer_norm) is held by that op, as a module holds its weights.

Ops on the channels-last tensor, written as ConvNeXt does (`x.permute(0, 2, 3, 1)`, then
`nn.LayerNorm(C)`, `nn.Linear` and elementwise ops, then `.permute(0, 3, 1, 2)`), are layers of
the (N, C, H, W) tensor: a LayerNorm over the channels alone, a Linear over them a 1x1
convolution; the two permutes run with the first and last op (`Layer.before`, `Layer.after`),
never layers of their own; any other permute is refused.

Some ops limit the degree of their layer along some dims (`Layer.max_degrees`, 1: held whole,
with the reason): GroupNorm's statistics span a group's channels (a channel split keeps whole
groups), LayerNorm's span every value of a sample or, over the channels alone,
every channel of a position; a reflect or replicate padding is applied by the tiles on the border,
which must hold the rows it mirrors, and a circular one reads the opposite border (h, w whole);
a grouped transposed convolution keeps c whole (its weight's output channels are dim 1 within
each group's rows). InstanceNorm and GroupNorm split along every spatial dim: the tiles of one
plane sum their statistics (ops.sync_instance_norm, ops.group_norm).
A module with weights called twice (shared weights) is refused here, so that every command
refuses it before anything is priced or launched.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import operator
import traceback
from collections.abc import Callable
from copy import deepcopy as copy_module
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from layerwise.strategies.errors import GraphError
from layerwise.strategies.model.channel_maps import channel_maps
from layerwise.strategies.model.elementwise import elementwise_refusal
from layerwise.strategies.model.fx_nodes import STOCHASTIC_DEPTH, is_stochastic_depth
from layerwise.strategies.model.op_call import OpCall, function_call, module_call
from layerwise.strategies.model.padding import PAD_FUNCTIONS, PAD_MODES
from layerwise.strategies.model.sized_trace import trace_module

LayerKind = Literal[
    "input", "conv", "linear", "pool", "adaptive_pool", "add", "concat", "elementwise", "flatten",
    "resize", "channels", "pad",
]

BYTES_PER_ELEMENT = 4  # fp32 training, the setting of every paper layerwise implements
OVER_CHANNELS = "(channels)"  # the op name's suffix of a LayerNorm over the channels alone

# padding modules, by the F.pad mode each runs
_PAD_MODULES: dict[type[nn.Module], str] = {
    **dict.fromkeys((nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d, nn.ConstantPad1d,
                     nn.ConstantPad2d, nn.ConstantPad3d), "constant"),
    **dict.fromkeys((nn.ReplicationPad1d, nn.ReplicationPad2d, nn.ReplicationPad3d), "replicate"),
    **dict.fromkeys((nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d), "reflect"),
    **dict.fromkeys((nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d), "circular"),
}

_ELEMENTWISE_MODULES: dict[type[nn.Module], float] = {
    # module type -> forward FLOPs per output element (BatchNorm: normalise + affine)
    nn.BatchNorm1d: 4.0,
    nn.BatchNorm2d: 4.0,
    nn.BatchNorm3d: 4.0,
    nn.ReLU: 1.0,
    nn.ReLU6: 1.0,
    nn.LeakyReLU: 1.0,
    nn.ELU: 1.0,
    nn.GELU: 1.0,
    nn.SiLU: 1.0,
    nn.Sigmoid: 1.0,
    nn.Tanh: 1.0,
    nn.Hardswish: 1.0,
    nn.Dropout: 1.0,
    nn.Dropout1d: 1.0,
    nn.Dropout2d: 1.0,
    nn.Dropout3d: 1.0,
    nn.Identity: 0.0,
}
_ELEMENTWISE_FUNCTIONS: dict[Any, str] = {
    F.relu: "relu",
    torch.relu: "relu",
    F.relu6: "relu6",
    F.leaky_relu: "leaky_relu",
    F.gelu: "gelu",
    F.silu: "silu",
    torch.sigmoid: "sigmoid",
    F.sigmoid: "sigmoid",
    torch.tanh: "tanh",
    F.dropout: "dropout",
    F.dropout1d: "dropout1d",
    F.dropout2d: "dropout2d",
    F.dropout3d: "dropout3d",
}
_ELEMENTWISE_METHODS = {"relu", "relu_", "sigmoid", "tanh", "contiguous"}
_BINARY_FUNCTIONS: dict[Any, str] = {
    operator.add: "add",
    operator.iadd: "add",
    torch.add: "add",
    operator.sub: "sub",
    torch.sub: "sub",
    operator.mul: "mul",
    operator.imul: "mul",
    torch.mul: "mul",
}
_BINARY_METHODS = {"add": "add", "add_": "add", "sub": "sub", "mul": "mul", "mul_": "mul"}
_MAX_POOL_FUNCTIONS = (F.max_pool1d, F.max_pool2d, F.max_pool3d)
_POOL_FUNCTIONS: dict[Any, str] = {
    fn: fn.__name__ for fn in (*_MAX_POOL_FUNCTIONS, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)}
_ADAPTIVE_POOL_FUNCTIONS: dict[Any, str] = {
    fn: fn.__name__ for fn in (F.adaptive_avg_pool1d, F.adaptive_avg_pool2d,
                               F.adaptive_avg_pool3d, F.adaptive_max_pool1d,
                               F.adaptive_max_pool2d, F.adaptive_max_pool3d)}
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONV_TRANSPOSES = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_POOLS = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)
_ADAPTIVE_POOLS = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
                   nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)
_INSTANCE_NORMS = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
SPATIAL_DIMS = {1: ("w",), 2: ("h", "w"), 3: ("d", "h", "w")}  # view dims of the spatial axes


class Geometry(BaseModel):
    """Sliding-window geometry of a conv or pool layer: what an output tile needs of its input.

    One entry per spatial dim of the layer, in order: (l,) of a 1-d layer, (h, w) of a 2-d one,
    (d, h, w) of a 3-d one."""

    model_config = ConfigDict(frozen=True)

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...] = (1, 1)
    groups: int = 1
    ceil_mode: bool = False
    # a transposed convolution (ConvTranspose2d): each input position spreads over a window of
    # the output, so an output tile needs the input rows whose windows reach it
    transposed: bool = False

    def along(self, dim: int) -> tuple[int, int, int, int]:
        """(kernel, stride, padding, dilation) along position `dim` of the 5-d view (2, 3, 4:
        d, h, w; the layer's spatial dims are its last ones); a position the layer lacks is a
        window of one row."""
        axis = dim - 5 + len(self.kernel)
        if axis < 0:
            return (1, 1, 0, 1)
        return (self.kernel[axis], self.stride[axis], self.padding[axis], self.dilation[axis])


class Resize(BaseModel):
    """How an upsampling layer (nn.Upsample, F.interpolate) maps output rows and columns to
    input ones: torch's interpolate mode, its align_corners, and the scale factor per axis the
    call was given (None: the ratio of the sizes, as torch takes it then)."""

    model_config = ConfigDict(frozen=True)

    mode: str
    align_corners: bool | None = None
    scales: tuple[float | None, ...] = (None, None)  # one per spatial dim


class Padding(BaseModel):
    """A padding's mode, its constant value, and the rows it adds before and after along each
    spatial dim, the first spatial dim first (negative: cropped)."""

    model_config = ConfigDict(frozen=True)

    mode: str
    value: float = 0.0
    sides: tuple[tuple[int, int], ...]


# interpolate modes whose tiles are exact along every spatial dim (ops.resize); the others hold
# them whole
SPLIT_RESIZE_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear")


class FusedOp(BaseModel):
    """An elementwise op executed as part of the layer it follows."""

    model_config = ConfigDict(frozen=True)

    name: str
    op: str
    target: str
    flops_per_element: float
    function: OpCall | None = None  # `Layer.function`
    before: tuple[str, ...] = ()  # fx nodes run just before its own (`Layer.before`)
    after: tuple[str, ...] = ()  # the permute back to channels-first after it

    @property
    def fx_nodes(self) -> tuple[str, ...]:
        return (*self.before, self.name, *self.after)


class Layer(BaseModel):
    """One node of the layer graph; shapes include the batch dimension."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: LayerKind
    op: str
    target: str
    inputs: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    output_shape: tuple[int, ...]
    param_shapes: dict[str, tuple[int, ...]]
    flops: int
    geometry: Geometry | None = None
    concat_dim: int | None = None
    resize: Resize | None = None
    padding: Padding | None = None
    fused: tuple[FusedOp, ...] = ()
    # an elementwise op taken by its nature, as the profiler (which times shapes without the
    # model) runs it; None for every op the layer graph names
    function: OpCall | None = None
    # dim -> the largest degree its ops allow along it (1: held whole); a dim not named is
    # bounded by its size alone (space.py)
    max_degrees: dict[str, int] = {}
    held_reason: str = ""  # why its ops limit max_degrees
    reads: tuple[str, ...] = ()  # fx nodes of the size queries its op reads
    # fx nodes run just before its own and part of it: the permute into channels-last, the
    # parameters its op reads directly (get_attr), a channel map's chunk, views and transposes
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()  # the permute back to channels-first after its op
    # a channel map's source: output channel j is input channel channels[j] (kind "channels")
    channels: tuple[int, ...] = ()
    # its value in the model's own forward is channels-last (an op inside a permuted run but
    # its last): the tiles are of the (N, C, ...) tensor, the model's fx code is not
    channels_last_value: bool = False

    @property
    def param_count(self) -> int:
        return sum(_numel(shape) for shape in self.param_shapes.values())

    @property
    def shared_param_count(self) -> int:
        """Elements of the parameters no channel dim runs through (`channel_dim` None): held
        whole by every tile of a channel split, so their gradient sums over all its tiles."""
        return sum(_numel(shape) for key, shape in self.param_shapes.items()
                   if self.channel_dim(key, shape) is None)

    @property
    def plane_norms(self) -> tuple[int, ...]:
        """The normalisations the layer runs (fused into it, or the layer itself) whose
        statistics span each sample's whole plane, so that the tiles of a plane sum them: per
        norm, its statistics per sample (an InstanceNorm's one per channel, a GroupNorm's one
        per group)."""
        found = []
        for op in (self.op, *(fused.op for fused in self.fused)):
            name, _, groups = op.partition("(")
            if name.startswith("InstanceNorm"):
                found.append(self.output_shape[1])
            elif name in ("GroupNorm", "group_norm"):
                found.append(int(groups.rstrip(")")))
        return tuple(found)

    def channel_dim(self, key: str, shape: tuple[int, ...]) -> int | None:
        """The dim of a tensor the layer holds (`key`: the main op's parameter name, a fused
        op's `param_key`) that runs along its output channels, which a channel split cuts
        (Jia et al. 2018, Table 1); None where no dim does (a PReLU's one shared slope, a
        scalar): every channel tile holds it whole and its gradient is summed over all of the
        layer's tiles (`shared_param_count`). A transposed convolution's weight is (in,
        out / groups, *kernel), so dim 1, and None when grouped (its c is held whole: a tile's
        channels would cut dim 1 within each group's rows); everything else (conv and linear
        weights, biases, norms' affine vectors and running statistics) dim 0."""
        if key == "weight" and self.geometry is not None and self.geometry.transposed:
            return 1 if self.geometry.groups == 1 else None
        return 0 if shape and shape[0] == self.output_shape[1] else None

    @property
    def fx_nodes(self) -> tuple[str, ...]:
        """Every fx node this layer runs, in order: the size queries its op reads (`x.size(0)`
        of `x.view(x.size(0), -1)`), the nodes before its own, its own, the permute back, then
        its fused ops'."""
        return (*self.reads, *self.before, self.name, *self.after,
                *(node for fused in self.fused for node in fused.fx_nodes))

    @property
    def value_node(self) -> str:
        """The fx node whose value is the layer's output (what its consumers read)."""
        return self.fx_nodes[-1]

    @property
    def label(self) -> str:
        """Op name with fused ops, e.g. `Conv2d+BatchNorm2d+ReLU`."""
        return "+".join([self.op, *(f.op for f in self.fused)])


class LayerGraph(BaseModel):
    """A CNN as a DAG of layers in topological order (inputs before consumers)."""

    model_config = ConfigDict(frozen=True)

    model: str
    input_shape: tuple[int, ...]
    layers: tuple[Layer, ...]
    outputs: tuple[str, ...]

    @cached_property
    def by_name(self) -> dict[str, Layer]:
        return {layer.name: layer for layer in self.layers}

    @cached_property
    def consumers(self) -> dict[str, tuple[str, ...]]:
        users: dict[str, list[str]] = {layer.name: [] for layer in self.layers}
        for layer in self.layers:
            for source in layer.inputs:
                users[source].append(layer.name)
        return {name: tuple(names) for name, names in users.items()}

    @property
    def edges(self) -> list[tuple[str, str]]:
        """(producer, consumer) pairs; a layer reading the same tensor twice gives one edge."""
        return [(src, layer.name) for layer in self.layers for src in dict.fromkeys(layer.inputs)]

    @property
    def param_count(self) -> int:
        return sum(layer.param_count for layer in self.layers)

    @property
    def held_notes(self) -> list[str]:
        """One line per layer whose ops limit its split, saying how and why."""
        return [f"layer '{layer.name}' ({layer.label}) {_limits(layer)}: {layer.held_reason}"
                for layer in self.layers if layer.held_reason]

    @property
    def flops(self) -> int:
        return sum(layer.flops for layer in self.layers)

    @property
    def batch(self) -> int:
        return self.input_shape[0]

    @cached_property
    def structure_hash(self) -> str:
        """Identity of the network's structure, independent of batch size and weights.

        Two models with the same hash have the same layers, shapes (per sample), geometry and
        edges, so a profile or a strategy made for one applies to the other.
        """
        canonical = [
            [
                layer.name,
                layer.kind,
                layer.label,
                list(layer.inputs),
                [list(shape[1:]) for shape in layer.input_shapes],
                list(layer.output_shape[1:]),
                sorted((key, list(shape)) for key, shape in layer.param_shapes.items()),
                layer.geometry.model_dump(exclude=None if layer.geometry.transposed
                                          else {"transposed"}) if layer.geometry else None,
                layer.concat_dim,
                *([layer.resize.model_dump()] if layer.resize else []),
                *([layer.padding.model_dump()] if layer.padding else []),
                *([list(layer.channels)] if layer.channels else []),
            ]
            for layer in self.layers
        ]
        text = json.dumps([canonical, list(self.outputs)], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def param_key(target: str, name: str) -> str:
    """The state-dict key of parameter `name` of the module at `target` ("" is the root)."""
    return f"{target}.{name}" if target else name


def _limits(layer: Layer) -> str:
    """'splits only along n, c (c at most 2 ways)': the dims its ops let it split and the
    largest degree of those they limit."""
    dims = _view_names(len(layer.output_shape))
    free = [dim for dim in dims if layer.max_degrees.get(dim, 2) > 1]
    named = {"w": "l"} if len(layer.output_shape) == 3 else {}
    capped = [f"{named.get(dim, dim)} at most {layer.max_degrees[dim]} ways" for dim in free
              if dim in layer.max_degrees]
    text = (f"splits {'only ' if len(free) < len(dims) else ''}along "
            f"{', '.join(named.get(dim, dim) for dim in free)}")
    return text + (f" ({', '.join(capped)})" if capped else "")


def _channels_first(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The (N, C, ...) shape of a channels-last (N, ..., C) tensor."""
    return (shape[0], shape[-1], *shape[1:-1])


def _view_names(rank: int) -> tuple[str, ...]:
    """The view dims (space.DIMS) a tensor of `rank` dims has: n, c, then its spatial ones."""
    return ("n", "c", *SPATIAL_DIMS.get(rank - 2, ()))


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _per_dim(value: int | tuple[int, ...], spatial: int) -> tuple[int, ...]:
    """A window argument (kernel, stride, padding, dilation) as one entry per spatial dim."""
    if isinstance(value, int):
        return (value,) * spatial
    if len(value) == 1:
        return (int(value[0]),) * spatial
    return tuple(int(entry) for entry in value)


def _norm(common: dict[str, Any], op: str, target: str, params: dict[str, tuple[int, ...]],
          max_degrees: dict[str, int], reason: str) -> _Raw:
    """A normalisation with statistics per sample over several values (GroupNorm, LayerNorm):
    an elementwise layer of ~5 flops per value, limited to the splits that keep each statistic
    on one device."""
    raw = _Raw(kind="elementwise", op=op, target=target, param_shapes=params,
               flops=5 * _numel(common["output_shape"]), elementwise_flops_per_element=5.0,
               **common)
    raw.limit(max_degrees, reason)
    return raw


def _mirrored_degree(geometry: Geometry, axis: int, in_size: int, out_size: int,
                     mode: str) -> int:
    """The largest power-of-two degree along spatial axis `axis` at which every tile of a
    reflect- or replicate-padded conv can pad its own border.

    A tile whose receptive field reaches past the border pads its needed input box as the whole
    tensor is padded: reflect padding of t rows mirrors rows 1..t, which the box (it starts at
    the border) holds when it has more than t rows; replicate repeats the border row, which any
    box holds. Tile i covers output rows [i*O//d, (i+1)*O//d) (space.tile_range).
    """
    kernel, stride = geometry.kernel[axis], geometry.stride[axis]
    padding, dilation = geometry.padding[axis], geometry.dilation[axis]

    def pads_itself(degree: int) -> bool:
        for index in range(degree):
            start, stop = index * out_size // degree, (index + 1) * out_size // degree
            first = start * stride - padding
            last = (stop - 1) * stride - padding + dilation * (kernel - 1)
            rows = min(last + 1, in_size) - max(first, 0)
            for pad in (-first, last + 1 - in_size):
                if pad > 0 and rows < (pad + 1 if mode == "reflect" else 1):
                    return False
        return True

    degree = 1
    while degree * 2 <= out_size:
        if not pads_itself(degree * 2):
            return degree
        degree *= 2
    return out_size  # every degree the size allows


def _padding_limits(geometry: Geometry, mode: str, in_shape: tuple[int, ...],
                    out_shape: tuple[int, ...]) -> tuple[dict[str, int], str]:
    """The spatial degrees a conv padded by `mode` allows, and why: circular padding reads
    the opposite border (spatial dims whole); reflect and replicate are padded by the border
    tiles."""
    dims = SPATIAL_DIMS[len(geometry.kernel)]
    if mode == "circular":
        return dict.fromkeys(dims, 1), ("circular padding wraps around to the opposite "
                                        "border, so the spatial dims stay whole")
    limits = {dim: _mirrored_degree(geometry, axis, in_shape[2 + axis], out_shape[2 + axis],
                                    mode)
              for axis, dim in enumerate(dims)}
    copies = "mirrors" if mode == "reflect" else "repeats"
    return limits, (f"{mode} padding {geometry.padding} is applied by the border tiles, which "
                    f"must hold the rows and columns it {copies}")


def _conv_padding(node: fx.Node, module: nn.Conv1d | nn.Conv2d | nn.Conv3d
                  ) -> tuple[int, ...]:
    """A convolution's padding per spatial dim: numbers as given, "valid" none, "same" half
    the dilated kernel on each side (torch pads the odd extra row of an even kernel on one
    side only, which a symmetric window cannot express)."""
    spatial = len(module.kernel_size)
    if module.padding == "valid":
        return (0,) * spatial
    if module.padding == "same":
        reach = [d * (k - 1) for d, k in zip(_per_dim(module.dilation, spatial),
                                              _per_dim(module.kernel_size, spatial),
                                              strict=True)]
        if any(total % 2 for total in reach):
            raise GraphError(
                f"layer '{node.name}' ({node.target}): padding='same' with kernel "
                f"{module.kernel_size} and dilation {module.dilation} pads one side more than "
                "the other; use an odd kernel or give the padding as numbers"
            )
        return tuple(total // 2 for total in reach)
    return _per_dim(module.padding, spatial)  # type: ignore[arg-type]


def _call_arg(node: fx.Node, index: int, name: str, default: Any) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _tensor_inputs(node: fx.Node) -> list[fx.Node]:
    """The fx nodes whose tensors feed this node, in argument order, flattening lists (cat)."""
    found: list[fx.Node] = []

    def visit(value: Any) -> None:
        if isinstance(value, fx.Node):
            if "tensor_meta" in value.meta:
                found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    for arg in node.args:
        visit(arg)
    for arg in node.kwargs.values():
        visit(arg)
    return found


def _shape(node: fx.Node) -> tuple[int, ...]:
    meta = node.meta.get("tensor_meta")
    if meta is None or not hasattr(meta, "shape"):
        raise GraphError(
            f"fx node '{node.name}' ({node.format_node()}) does not produce one tensor; "
            "layerwise supports modules whose layers each return a single tensor"
        )
    return tuple(int(size) for size in meta.shape)


def _param_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in module.named_parameters(recurse=False)}


class _Raw(BaseModel):
    """A layer before fusion: mutable while the builder merges elementwise ops into it."""

    name: str
    kind: LayerKind
    op: str
    target: str
    inputs: list[str]
    input_shapes: list[tuple[int, ...]]
    output_shape: tuple[int, ...]
    param_shapes: dict[str, tuple[int, ...]]
    flops: int
    geometry: Geometry | None = None
    concat_dim: int | None = None
    resize: Resize | None = None
    padding: Padding | None = None
    fused: list[FusedOp] = []
    function: OpCall | None = None
    elementwise_flops_per_element: float = 0.0
    max_degrees: dict[str, int] = {}
    held_reason: str = ""
    reads: list[str] = []
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    channels: tuple[int, ...] = ()

    def limit(self, max_degrees: dict[str, int], reason: str) -> None:
        """Limit the degree along each dim of `max_degrees` (to less where a fused op already
        limits it to less); a limit the dim's size already sets is no limit and no note."""
        sizes = dict(zip(_view_names(len(self.output_shape)), self.output_shape, strict=False))
        tighter = {dim: degree for dim, degree in max_degrees.items()
                   if dim in sizes
                   and degree < min(sizes[dim], self.max_degrees.get(dim, sizes[dim]))}
        if not tighter:
            return
        self.max_degrees = {**self.max_degrees, **tighter}
        self.held_reason = "; ".join(filter(None, (self.held_reason, reason)))


_PERMUTE_REFUSAL = ("a permute other than a pair around ops per position (x.permute(0, 2, 3, "
                    "1), LayerNorm(C), Linear, elementwise ops, .permute(0, 3, 1, 2), each "
                    "read by the next alone)")


def _permutation(node: fx.Node) -> tuple[int, ...] | None:
    """The dims of a `x.permute(...)` or `torch.permute(x, dims)` node; None for other nodes."""
    if node.op == "call_method" and node.target == "permute":
        dims: Any = node.args[1:] or node.kwargs.get("dims", ())
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = dims[0]
    elif node.op == "call_function" and node.target is torch.permute:
        dims = _call_arg(node, 1, "dims", ())
    else:
        return None
    if not all(isinstance(dim, int) for dim in dims):
        return None
    return tuple(dim % len(dims) for dim in dims) if dims else ()


def _training_copy(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The module as training runs it, on a copy (the probe must not touch the model)."""
    copy = copy_module(module).train()
    return lambda x: copy(x)


def _on_probe(node: fx.Node, fn: Callable[..., Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function call of `node` with its one tensor argument replaced by the probe."""
    return lambda x: fn(*fx.node.map_arg(node.args, lambda _: x),
                        **fx.node.map_arg(node.kwargs, lambda _: x))


class _ChannelsLast(NamedTuple):
    """A run of ops on the channels-last tensor between two permutes (ConvNeXt's block:
    permute(0, 2, 3, 1), LayerNorm(C), Linear(C, 4C), GELU, Linear(4C, C), permute(0, 3, 1, 2)):
    the permutes' fx nodes and the ops' between them, in order."""

    into: str
    back: str
    ops: tuple[str, ...]


def _channels_last(gm: fx.GraphModule) -> dict[str, _ChannelsLast]:
    """Each op's fx node -> the channels-last run it belongs to: the nodes from a permute
    moving the channels last (0, 2, 3, 1 of a 4-d tensor; 0, 2, 1 of a 3-d one) to the
    permute moving them back, each node read by the next alone, every op between a LayerNorm
    over the channels, a Linear over them, or an op of one tensor (elementwise by the
    builder's own test)."""
    found: dict[str, _ChannelsLast] = {}
    for node in gm.graph.nodes:
        rank = len(node.meta["tensor_meta"].shape) if isinstance(
            node.meta.get("tensor_meta"), TensorMetadata) else 0
        if rank < 3 or _permutation(node) != (0, *range(2, rank), 1):
            continue
        ops: list[fx.Node] = []
        current = node
        while len(current.users) == 1:
            (current,) = current.users
            if _permutation(current) == (0, rank - 1, *range(1, rank - 1)):
                if ops:
                    run = _ChannelsLast(node.name, current.name, tuple(op.name for op in ops))
                    found.update(dict.fromkeys(run.ops, run))
                break
            if not _runs_channels_last(gm, current):
                break
            ops.append(current)
    return found


def _runs_channels_last(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether an op may run between the permutes: F.layer_norm (with or without weights it
    reads directly), or an op of one tensor and nothing else that is neither a reshape nor a
    dropout (its mask is drawn per channels-first element) nor a module working along
    positions or channels-first dims."""
    inputs = node.all_input_nodes
    if len([arg for arg in inputs if arg.op != "get_attr"]) != 1:
        return False
    if node.op == "call_function" and node.target is F.layer_norm:
        return True
    if len(inputs) != 1:
        return False
    if node.op == "call_module":
        return not isinstance(gm.get_submodule(str(node.target)), _NOT_CHANNELS_LAST)
    if node.target in _DROPOUT_FUNCTIONS or _permutation(node) is not None:
        return False
    return node.op == "call_function" or (
        node.op == "call_method" and node.target not in ("view", "reshape", "flatten"))


# modules whose op is not per position along the channels-last tensor's last dim
_NOT_CHANNELS_LAST = (*_CONVS, *_CONV_TRANSPOSES, *_POOLS, *_ADAPTIVE_POOLS, nn.Flatten,
                      nn.Upsample, nn.GroupNorm, *_INSTANCE_NORMS, nn.BatchNorm1d,
                      nn.BatchNorm2d, nn.BatchNorm3d, nn.PReLU, nn.Softmax2d, nn.Dropout,
                      nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
_DROPOUT_FUNCTIONS = (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d)


class _Builder:
    """Classifies traced fx nodes into layers and fuses elementwise ops into their producers."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.modules = dict(gm.named_modules())
        self.nodes = {node.name: node for node in gm.graph.nodes}
        self.channels_last = _channels_last(gm)
        self.channel_maps = channel_maps(gm)

    def layer_for(self, node: fx.Node) -> _Raw:
        shape = _shape(node)
        found = self.channel_maps.get(node.name)
        if found is not None:  # a chunk, slice or shuffle of the channels (channel_maps.py)
            source = self.nodes[found.source]
            return _Raw(kind="channels", op=found.label, target=found.label, param_shapes={},
                        flops=0, name=node.name, inputs=[source.name],
                        input_shapes=[_shape(source)], output_shape=shape, before=found.steps,
                        channels=found.channels)
        sources = _tensor_inputs(node)
        attributes = [s for s in sources if s.op == "get_attr"]
        if attributes:
            sources = [s for s in sources if s.op != "get_attr"]
        inputs = [s.name for s in sources]
        input_shapes = [_shape(s) for s in sources]
        common = {
            "name": node.name,
            "inputs": inputs,
            "input_shapes": input_shapes,
            "output_shape": shape,
        }
        if node.op == "placeholder":
            return _Raw(kind="input", op="input", target=str(node.target), param_shapes={},
                        flops=0, **common)
        run = self.channels_last.get(node.name)
        if run is None:
            return self._classify(node, common, attributes)
        # between the permutes: the layer of the (N, C, ...) tensor, run with its permutes
        first, last = run.ops[0] == node.name, run.ops[-1] == node.name
        into = self.nodes[run.into]
        source = into.args[0]
        assert isinstance(source, fx.Node)
        raw = self._classify(node, {
            **common,
            "inputs": [source.name] if first else common["inputs"],
            "input_shapes": ([_shape(source)] if first
                             else [_channels_first(shape) for shape in input_shapes]),
            "output_shape": _channels_first(shape)}, attributes)
        raw.before = (*raw.before, run.into) if first else raw.before
        raw.after = (run.back,) if last else ()
        return raw

    def _classify(self, node: fx.Node, common: dict[str, Any],
                  attributes: list[fx.Node]) -> _Raw:
        if attributes:
            return self._reading_parameters(node, common, attributes)
        if node.op == "call_module":
            return self._module_layer(node, common)
        if node.op == "call_function":
            return self._function_layer(node, common)
        if node.op == "call_method":
            return self._method_layer(node, common)
        raise self._unsupported(node)

    def _module_layer(self, node: fx.Node, common: dict[str, Any]) -> _Raw:
        module = self.modules[str(node.target)]
        target = str(node.target)
        op = type(module).__name__
        params = _param_shapes(module)
        out = _numel(common["output_shape"])
        spatial = len(common["output_shape"]) - 2
        if isinstance(module, _CONVS):
            geometry = Geometry(
                kernel=_per_dim(module.kernel_size, spatial),
                stride=_per_dim(module.stride, spatial),
                padding=_conv_padding(node, module),
                dilation=_per_dim(module.dilation, spatial),
                groups=module.groups,
            )
            macs_per_output = (module.in_channels // module.groups) * _numel(geometry.kernel)
            flops = 2 * out * macs_per_output + (out if module.bias is not None else 0)
            if module.padding_mode != "zeros":
                op = f"{op}(padding_mode={module.padding_mode})"
            raw = _Raw(kind="conv", op=op, target=target, param_shapes=params, flops=flops,
                       geometry=geometry, **common)
            if module.padding_mode != "zeros" and any(geometry.padding):
                raw.limit(*_padding_limits(geometry, module.padding_mode,
                                           common["input_shapes"][0], common["output_shape"]))
            return raw
        if isinstance(module, _CONV_TRANSPOSES):
            return self._conv_transpose(node, common, module, op, target, params)
        if isinstance(module, nn.GroupNorm):
            return self._group_norm(common, op, target, params, module.num_groups)
        if isinstance(module, _INSTANCE_NORMS):
            if module.track_running_stats:
                raise self._unsupported(node, f"{op}(track_running_stats=True) (running "
                                        "statistics of an instance norm; the default False "
                                        "normalises every sample by its own)")
            # per (sample, channel) statistics over the plane: the tiles of one plane sum
            # theirs (ops.sync_instance_norm), so it splits along every dim
            return _norm(common, op, target, params, {}, "")
        if isinstance(module, nn.LayerNorm):
            return self._layer_norm(node, common, op, target, params,
                                    tuple(module.normalized_shape))
        if isinstance(module, nn.Linear):
            flops = 2 * out * module.in_features + (out if module.bias is not None else 0)
            if node.name in self.channels_last:  # per position over the channels: a 1x1 conv
                ones = (1,) * spatial
                return _Raw(kind="conv", op=f"{op}{OVER_CHANNELS}", target=target,
                            param_shapes=params, flops=flops,
                            geometry=Geometry(kernel=ones, stride=ones, padding=(0,) * spatial,
                                              dilation=ones), **common)
            return _Raw(kind="linear", op=op, target=target, param_shapes=params, flops=flops,
                        **common)
        if isinstance(module, _POOLS):
            average = not isinstance(module, (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d))
            dilation = 1 if average else module.dilation
            if average and not module.count_include_pad:
                op = f"{op}(count_include_pad=False)"
            if average and getattr(module, "divisor_override", None):
                raise self._unsupported(node, f"{op}(divisor_override=...)")
            geometry = Geometry(
                kernel=_per_dim(module.kernel_size, spatial),
                stride=_per_dim(module.stride or module.kernel_size, spatial),
                padding=_per_dim(module.padding, spatial),
                dilation=_per_dim(dilation, spatial),
                ceil_mode=module.ceil_mode,
            )
            return _Raw(kind="pool", op=op, target=target, param_shapes={},
                        flops=out * _numel(geometry.kernel), geometry=geometry, **common)
        if isinstance(module, _ADAPTIVE_POOLS):
            return _Raw(kind="adaptive_pool", op=op, target=target, param_shapes={},
                        flops=_numel(common["input_shapes"][0]), **common)
        if isinstance(module, nn.Flatten):
            return self._flatten(node, common, op, target, module.start_dim, module.end_dim)
        if isinstance(module, nn.Upsample):
            return self._resize(node, common, op, target, module.scale_factor, module.mode,
                                module.align_corners, module.recompute_scale_factor, False)
        for pad_type, mode in _PAD_MODULES.items():
            if isinstance(module, pad_type):
                return self._pad(node, common, op, target, tuple(module.padding), mode,
                                 float(getattr(module, "value", 0.0)))
        if isinstance(module, nn.PReLU):  # a slope per channel, sharded along c, or one that
            # every channel tile holds (Layer.channel_dim)
            return _Raw(kind="elementwise", op=op, target=target, param_shapes=params,
                        flops=3 * out, elementwise_flops_per_element=3.0, **common)
        for module_type, per_element in _ELEMENTWISE_MODULES.items():
            if type(module) is module_type:
                return _Raw(kind="elementwise", op=op, target=target, param_shapes=params,
                            flops=int(per_element * out),
                            elementwise_flops_per_element=per_element, **common)
        refusal = elementwise_refusal(_training_copy(module), module)
        if refusal is None:  # an activation by its nature: one FLOP per element, priced
            return _Raw(kind="elementwise", op=op, target=target, param_shapes=params,
                        flops=out, elementwise_flops_per_element=1.0,
                        function=module_call(module), **common)
        raise self._unsupported(node, f"module type {op} (not elementwise: {refusal})")

    def _function_layer(self, node: fx.Node, common: dict[str, Any]) -> _Raw:
        fn = node.target
        name = getattr(fn, "__name__", str(fn))
        out = _numel(common["output_shape"])
        if fn in _POOL_FUNCTIONS:
            spatial = len(common["output_shape"]) - 2
            kernel = _per_dim(_call_arg(node, 1, "kernel_size", None), spatial)
            stride = _call_arg(node, 2, "stride", None)
            is_max = fn in _MAX_POOL_FUNCTIONS
            geometry = Geometry(
                kernel=kernel,
                stride=_per_dim(stride, spatial) if stride else kernel,
                padding=_per_dim(_call_arg(node, 3, "padding", 0), spatial),
                dilation=_per_dim(_call_arg(node, 4, "dilation", 1) if is_max else 1, spatial),
                ceil_mode=bool(_call_arg(node, 5 if is_max else 4, "ceil_mode", False)),
            )
            return _Raw(kind="pool", op=_POOL_FUNCTIONS[fn], target=name, param_shapes={},
                        flops=out * _numel(kernel), geometry=geometry, **common)
        if fn in PAD_FUNCTIONS:
            return self._pad(node, common, "pad", name, tuple(_call_arg(node, 1, "pad", ())),
                             _call_arg(node, 2, "mode", "constant"),
                             float(_call_arg(node, 3, "value", None) or 0.0))
        if fn is F.interpolate:
            return self._resize(node, common, "interpolate", name,
                                _call_arg(node, 2, "scale_factor", None),
                                _call_arg(node, 3, "mode", "nearest"),
                                _call_arg(node, 4, "align_corners", None),
                                _call_arg(node, 5, "recompute_scale_factor", None),
                                _call_arg(node, 6, "antialias", False))
        if fn in _ADAPTIVE_POOL_FUNCTIONS:
            return _Raw(kind="adaptive_pool", op=_ADAPTIVE_POOL_FUNCTIONS[fn], target=name,
                        param_shapes={}, flops=_numel(common["input_shapes"][0]), **common)
        if fn is torch.mean:
            return self._mean(node, common, name)
        if fn is F.group_norm:
            if len(common["inputs"]) != 1:
                raise self._unsupported(node, "group_norm with weight or bias tensors (use "
                                        "nn.GroupNorm)")
            return self._group_norm(common, "group_norm", name, {},
                                    int(_call_arg(node, 1, "num_groups", 1)))
        if fn is F.layer_norm:
            normalized = _call_arg(node, 1, "normalized_shape", ())
            return self._layer_norm(node, common, "layer_norm", name, {},
                                    (normalized,) if isinstance(normalized, int)
                                    else tuple(normalized))
        if fn is torch.permute:
            raise self._unsupported(node, _PERMUTE_REFUSAL)
        if fn is torch.flatten:
            start = _call_arg(node, 1, "start_dim", 0)
            end = _call_arg(node, 2, "end_dim", -1)
            return self._flatten(node, common, "flatten", name, start, end)
        if fn is torch.cat:
            dim = _call_arg(node, 1, "dim", 0)
            rank = len(common["output_shape"])
            return _Raw(kind="concat", op="cat", target=name, param_shapes={}, flops=0,
                        concat_dim=dim % rank, **common)
        if fn in _BINARY_FUNCTIONS:
            return self._binary_or_scalar(node, common, _BINARY_FUNCTIONS[fn], name)
        if fn in _ELEMENTWISE_FUNCTIONS:
            return _Raw(kind="elementwise", op=_ELEMENTWISE_FUNCTIONS[fn], target=name,
                        param_shapes={}, flops=out, elementwise_flops_per_element=1.0, **common)
        if is_stochastic_depth(node):  # a dropout of whole samples: its masks are drawn alike
            batch_mode = _call_arg(node, 2, "mode", "row") != "row"
            return _Raw(kind="elementwise",
                        op=STOCHASTIC_DEPTH + ("(batch)" if batch_mode else ""), target=name,
                        param_shapes={}, flops=out, elementwise_flops_per_element=1.0, **common)
        if len(common["inputs"]) == 1 and callable(fn):
            refusal = elementwise_refusal(_on_probe(node, fn))
            if refusal is None:
                return _Raw(kind="elementwise", op=name, target=name, param_shapes={},
                            flops=out, elementwise_flops_per_element=1.0,
                            function=function_call(node, fn), **common)
            raise self._unsupported(node, f"function {name} (not elementwise: {refusal})")
        raise self._unsupported(node, f"function {name}")

    def _method_layer(self, node: fx.Node, common: dict[str, Any]) -> _Raw:
        method = str(node.target)
        out = _numel(common["output_shape"])
        if method == "flatten":
            start = _call_arg(node, 1, "start_dim", 0)
            end = _call_arg(node, 2, "end_dim", -1)
            return self._flatten(node, common, "flatten", method, start, end)
        if method == "mean":
            return self._mean(node, common, method)
        if method in ("view", "reshape"):
            in_shape = common["input_shapes"][0]
            out_shape = common["output_shape"]
            if len(out_shape) == 2 and out_shape[0] == in_shape[0]:
                return self._flatten(node, common, method, method, 1, -1)
            raise self._unsupported(node, f"{method} to {out_shape} (only (N, -1) flattening, "
                                    "or views and transposes moving whole channels, as a "
                                    "channel shuffle does)")
        if method in _BINARY_METHODS:
            return self._binary_or_scalar(node, common, _BINARY_METHODS[method], method)
        if method in _ELEMENTWISE_METHODS:
            return _Raw(kind="elementwise", op=method.rstrip("_"), target=method,
                        param_shapes={}, flops=out, elementwise_flops_per_element=1.0, **common)
        if method == "permute":
            raise self._unsupported(node, _PERMUTE_REFUSAL)
        raise self._unsupported(node, f"method .{method}()")

    def _flatten(self, node: fx.Node, common: dict[str, Any], op: str, target: str,
                 start: int, end: int) -> _Raw:
        in_rank = len(common["input_shapes"][0])
        if start % in_rank != 1 or end % in_rank != in_rank - 1:
            raise self._unsupported(node, f"{op}(start_dim={start}, end_dim={end}); only "
                                    "flattening every dim after the batch is supported")
        return _Raw(kind="flatten", op=op, target=target, param_shapes={}, flops=0, **common)

    def _mean(self, node: fx.Node, common: dict[str, Any], target: str) -> _Raw:
        """A mean over every spatial dim (global average pooling written as `x.mean((2, 3))`,
        or `x.mean(-1)` of a 1-d signal): an adaptive average pool to one position, keeping
        its (N, C, 1, ...) or (N, C) shape."""
        dims = _call_arg(node, 1, "dim", None)
        rank = len(common["input_shapes"][0])
        chosen = (dims,) if isinstance(dims, int) else tuple(dims or ())
        if rank < 3 or sorted(dim % rank for dim in chosen) != list(range(2, rank)):
            raise self._unsupported(node, f"mean over dims {dims} (only the mean over every "
                                    "spatial dim, x.mean((2, 3)), is a layer)")
        return _Raw(kind="adaptive_pool", op="mean", target=target, param_shapes={},
                    flops=_numel(common["input_shapes"][0]), **common)

    def _conv_transpose(self, node: fx.Node, common: dict[str, Any],
                        module: nn.ConvTranspose1d | nn.ConvTranspose2d | nn.ConvTranspose3d,
                        op: str, target: str, params: dict[str, tuple[int, ...]]) -> _Raw:
        """ConvTranspose1d/2d/3d: every input position adds its kernel window into the output,
        so an
        output tile needs the input rows whose windows reach it, a halo on the input side
        (tiles.needed_range); its output padding (or an output_size given to the call) is read
        off the traced output shape. A channel split cuts its weight along dim 1, where it keeps
        the output channels (`Layer.channel_dim`); grouped, c is held: a tile's channels would
        cut dim 1 within each group's rows of dim 0."""
        spatial = len(module.kernel_size)
        geometry = Geometry(kernel=_per_dim(module.kernel_size, spatial),
                            stride=_per_dim(module.stride, spatial),
                            padding=_per_dim(module.padding, spatial),
                            dilation=_per_dim(module.dilation, spatial),
                            groups=module.groups, transposed=True)
        per_input = 2 * (module.out_channels // module.groups) * _numel(geometry.kernel)
        flops = (per_input * _numel(common["input_shapes"][0])
                 + (_numel(common["output_shape"]) if module.bias is not None else 0))
        raw = _Raw(kind="conv", op=op, target=target, param_shapes=params, flops=flops,
                   geometry=geometry, **common)
        if module.groups > 1:
            raw.limit({"c": 1}, f"a grouped {op} keeps each group's output channels in dim 1 "
                      "of that group's rows, which a channel shard cannot cut, so c stays whole")
        return raw

    def _resize(self, node: fx.Node, common: dict[str, Any], op: str, target: str,
                scale_factor: Any, mode: str, align_corners: bool | None,
                recompute_scale_factor: bool | None, antialias: bool) -> _Raw:
        """Upsampling (nn.Upsample, F.interpolate) of an (N, C, L), (N, C, H, W) or
        (N, C, D, H, W) tensor: each output row reads the input rows its interpolation weights
        reach (one for nearest, two per dim for (bi/tri)linear), so a tile of rows needs a box
        of input rows (tiles.needed_range) and computes with torch's own weights (ops.resize).
        Other modes keep the spatial dims whole."""
        spatial = len(common["input_shapes"][0]) - 2
        if spatial not in SPATIAL_DIMS or antialias:
            raise self._unsupported(node, f"{op} of a {len(common['input_shapes'][0])}-d "
                                    "tensor" if not antialias else f"{op} with antialias")
        scales: tuple[float | None, ...] = (None,) * spatial  # one per spatial dim
        if scale_factor is not None and not recompute_scale_factor:
            given = ((scale_factor,) * spatial if isinstance(scale_factor, (int, float))
                     else tuple(scale_factor))
            scales = tuple(float(value) for value in given)
        linear = {"linear": 1, "bilinear": 2, "trilinear": 3}
        taps = ({"nearest": 1, "nearest-exact": 1, "bicubic": 4}.get(mode, 1)
                if mode not in linear else 2 ** linear[mode])
        label = f"{op}({mode}" + (f", align_corners={align_corners}"
                                  if align_corners is not None else "") + ")"
        raw = _Raw(kind="resize", op=label, target=target, param_shapes={},
                   flops=taps * _numel(common["output_shape"]),
                   resize=Resize(mode=mode, align_corners=align_corners, scales=scales),
                   **common)
        if mode not in SPLIT_RESIZE_MODES:
            raw.limit(dict.fromkeys(SPATIAL_DIMS[spatial], 1), f"{mode} interpolation is "
                      "computed by the full op only, so the spatial dims stay whole")
        return raw

    def _pad(self, node: fx.Node, common: dict[str, Any], op: str, target: str,
             pad: tuple[int, ...], mode: str, value: float) -> _Raw:
        """A padding of the spatial dims (F.pad, nn.ZeroPad2d, nn.ReplicationPad3d, ...): each
        output row copies one input row or is the constant (padding.py), so a tile is a gather
        of its needed input box, split along every dim. Padding the channels or the batch is
        refused."""
        spatial = len(common["input_shapes"][0]) - 2
        if mode not in PAD_MODES or spatial not in SPATIAL_DIMS or len(pad) % 2:
            raise self._unsupported(node, f"{op} in mode {mode} of a "
                                    f"{len(common['input_shapes'][0])}-d tensor")
        if len(pad) // 2 > spatial:
            raise self._unsupported(node, f"{op} of the channels or the batch ({list(pad)}): "
                                    "layerwise pads spatial dims only")
        sides = [(0, 0)] * spatial  # F.pad's list runs from the last dim backwards
        for index in range(len(pad) // 2):
            sides[spatial - 1 - index] = (int(pad[2 * index]), int(pad[2 * index + 1]))
        label = op if op != "pad" else f"pad({mode})"
        return _Raw(kind="pad", op=label, target=target, param_shapes={}, flops=0,
                    padding=Padding(mode=mode, value=value, sides=tuple(sides)), **common)

    def _group_norm(self, common: dict[str, Any], op: str, target: str,
                    params: dict[str, tuple[int, ...]], groups: int) -> _Raw:
        """GroupNorm: per-sample statistics over each group's channels and the whole plane
        (its group count kept in the op name, `Layer.plane_norms`), so a channel split keeps
        whole groups, and the spatial tiles of a plane sum their statistics
        (ops.group_norm), as InstanceNorm's do."""
        # degrees are powers of two: those dividing `groups` are those up to its largest
        # power-of-two factor, and with C = groups * per_group they cut C on group boundaries
        whole_groups = groups & -groups
        channels = (f"a channel split keeps whole groups (a degree dividing {groups})"
                    if whole_groups > 1 else "c stays whole" + (
                        f" (no power-of-two degree divides {groups})" if groups > 1 else ""))
        return _norm(common, f"{op}({groups})", target, params, {"c": whole_groups},
                     f"GroupNorm({groups}) takes its statistics over each group's channels, "
                     f"so {channels}")

    def _layer_norm(self, node: fx.Node, common: dict[str, Any], op: str, target: str,
                    params: dict[str, tuple[int, ...]], normalized: tuple[int, ...]) -> _Raw:
        """LayerNorm over every value of a sample (after a conv, normalized_shape = (C, H, W);
        after a linear layer, (F,)): like GroupNorm(1, C), only a sample split. Over the
        channels alone (between the permutes of `_channels_last`): one statistic per
        position, so any split but along c."""
        if len(common["inputs"]) != 1:
            raise self._unsupported(node, f"{op} with weight or bias tensors (use nn.LayerNorm)")
        if node.name in self.channels_last:  # between the permutes: shapes channels-first
            if normalized != (common["output_shape"][1],):
                raise self._unsupported(node, _PERMUTE_REFUSAL)
            return _norm(common, f"{op}{OVER_CHANNELS}", target, params, {"c": 1},
                         "LayerNorm over the channels takes one statistic per position over "
                         "every channel, so c stays whole")
        if normalized != tuple(common["output_shape"][1:]):
            raise self._unsupported(node, f"LayerNorm over {list(normalized)} of "
                                    f"{common['output_shape']} (only over every dim after "
                                    "the batch, or over the channels between permutes)")
        spatial = SPATIAL_DIMS.get(len(common["output_shape"]) - 2, ())
        return _norm(common, op, target, params, {"c": 1, **dict.fromkeys(spatial, 1)},
                     "LayerNorm takes its statistics over every value of a sample, so only n "
                     "splits")

    def _binary_or_scalar(self, node: fx.Node, common: dict[str, Any], op: str,
                          target: str) -> _Raw:
        out = _numel(common["output_shape"])
        if len(common["inputs"]) == 2:
            output = common["output_shape"]
            for shape in common["input_shapes"]:
                if not _broadcasts(shape, output):
                    raise self._unsupported(node, (
                        f"{op} with broadcasting {common['input_shapes']} -> {output} (an "
                        "input may broadcast along channels, height or width, as a gate "
                        "[N, C, 1, 1] or [N, 1, H, W] does, not along the batch or from fewer "
                        "dims)"))
            return _Raw(kind="add", op=op, target=target, param_shapes={}, flops=out, **common)
        if len(common["inputs"]) == 1:
            return _Raw(kind="elementwise", op=f"{op}_scalar", target=target, param_shapes={},
                        flops=out, elementwise_flops_per_element=1.0, **common)
        raise self._unsupported(node, f"{op} of {len(common['inputs'])} tensors")

    def _reading_parameters(self, node: fx.Node, common: dict[str, Any],
                            attributes: list[fx.Node]) -> _Raw:
        """An op that reads a module's parameters or buffers directly (fx's get_attr): a
        tensor scaled, shifted or gated by one (ConvNeXt's layer scale, `gamma * x`), or
        F.layer_norm / F.group_norm given them as weight and bias (a LayerNorm subclass that
        permutes in its own forward). The op holds them as a module holds its weights: a
        shard per channel tile where they run along the channels in their dim 0, whole
        otherwise; a dim along which they vary in any other way is held whole."""
        owners = {str(attribute.target).rpartition(".")[0] for attribute in attributes}
        names = ", ".join(str(attribute.target) for attribute in attributes)
        binary = (_BINARY_FUNCTIONS.get(node.target) if node.op == "call_function"
                  else _BINARY_METHODS.get(str(node.target)) if node.op == "call_method"
                  else None)
        norms = node.op == "call_function" and node.target in (F.layer_norm, F.group_norm)
        if len(owners) > 1 or len(common["inputs"]) != 1 or not (binary or norms):
            raise self._unsupported(node, f"{node.target} reading parameter {names} directly "
                                    "(a parameter may scale, shift or gate one tensor, or be "
                                    "the weight and bias of F.layer_norm / F.group_norm)")
        params = {str(attribute.target).rpartition(".")[2]: _shape(attribute)
                  for attribute in attributes}
        if norms:
            raw = self._function_layer(node, common)
        else:
            out = _numel(common["output_shape"])
            raw = _Raw(kind="elementwise", op=f"{binary}_param", target="", param_shapes={},
                       flops=out, elementwise_flops_per_element=1.0, **common)
            [attribute] = attributes
            self._limit_by_parameter(node, raw, str(attribute.target), _shape(attribute))
        raw.target = owners.pop()
        raw.param_shapes = params
        raw.before = (*(attribute.name for attribute in attributes), *raw.before)
        return raw

    def _limit_by_parameter(self, node: fx.Node, raw: _Raw, name: str,
                            shape: tuple[int, ...]) -> None:
        """The dims a tensor combined with parameter `name` of `shape` may split along: a
        parameter running along the channels in its dim 0 is cut into channel shards; one
        shared by every channel, or running along them in another dim, holds c whole (its
        shards could not be cut, or its gradient sums over every channel); one that varies
        along a spatial dim holds that dim whole."""
        output = raw.output_shape
        if len(shape) > len(output) or any(
                size not in (1, whole) for size, whole in zip(
                    shape, output[len(output) - len(shape):], strict=True)):
            raise self._unsupported(node, f"parameter {name} of shape {list(shape)} "
                                    f"broadcast to {list(output)}")
        dims = _view_names(len(output))
        aligned = dict(zip(dims[len(output) - len(shape):], shape, strict=True))
        if aligned.get("n", 1) > 1:
            raise self._unsupported(node, f"parameter {name} with one value per sample")
        channel_axis = len(shape) - len(output) + 1
        if aligned.get("c", 1) == 1 or output[1] == 1:
            raw.limit({"c": 1}, f"{name} is shared by every channel, its gradient a sum over "
                      "all of them, so c stays whole")
        elif channel_axis != 0:
            raw.limit({"c": 1}, f"{name} runs along the channels in its dim {channel_axis}, "
                      "which the weight shards (rows of dim 0) do not cut, so c stays whole")
        varying = [dim for dim in dims[2:] if aligned.get(dim, 1) > 1]
        if varying:
            raw.limit(dict.fromkeys(varying, 1), f"{name} holds a value per position along "
                      f"{', '.join(varying)}, so {'they stay' if len(varying) > 1 else 'it stays'}"
                      " whole")

    def _unsupported(self, node: fx.Node, what: str | None = None) -> GraphError:
        described = what or f"{node.op} {node.target}"
        return GraphError(
            f"unsupported operation at fx node '{node.name}': {described}; layerwise handles "
            "convolutions (1-3d, transposed), Linear, pooling, upsampling, padding, norms, "
            "activations, dropout, add, cat, channel maps, flatten, spatial means"
        )


def _broadcasts(shape: tuple[int, ...], output: tuple[int, ...]) -> bool:
    """Whether a binary op's input of `shape` reaches its output's shape by broadcasting only
    along dims after the batch where it has size 1 (a squeeze-and-excitation gate's
    [N, C, 1, 1], a spatial gate's [N, 1, H, W]): each tile then needs that input's whole
    extent, 1, along those dims (tiles.needed_range)."""
    return (len(shape) == len(output) and shape[0] == output[0]
            and all(size in (1, whole) for size, whole in zip(shape[1:], output[1:], strict=True)))


def _fuse(raw_layers: list[_Raw], users: dict[str, int]) -> tuple[list[_Raw], dict[str, str]]:
    """Merge single-input elementwise layers into a producer they alone consume.

    Returns the kept layers and the map from each fused layer's name to the layer that holds it.
    """
    by_name = {layer.name: layer for layer in raw_layers}
    holder: dict[str, str] = {}
    kept: list[_Raw] = []
    for layer in raw_layers:
        inputs = [holder.get(name, name) for name in layer.inputs]
        layer.inputs = inputs
        if layer.kind == "elementwise" and len(inputs) == 1:
            producer = by_name[inputs[0]]
            original_input = layer.name
            if producer.kind != "input" and users[producer.name] == 1:
                producer.fused.append(
                    FusedOp(name=layer.name, op=layer.op, target=layer.target,
                            flops_per_element=layer.elementwise_flops_per_element,
                            function=layer.function,
                            before=layer.before, after=layer.after)
                )
                producer.flops += layer.flops
                producer.reads.extend(layer.reads)
                producer.limit(layer.max_degrees, layer.held_reason)
                producer.param_shapes.update(
                    {param_key(layer.target, key): shape
                     for key, shape in layer.param_shapes.items()})
                users[producer.name] = users[original_input]
                holder[original_input] = producer.name
                continue
        kept.append(layer)
    return kept, holder


def _failing_call(error: BaseException) -> str:
    """The innermost frame of the user's own code in a traceback (not torch's)."""
    torch_dir = str(Path(torch.__file__).parent)
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith(torch_dir) and f.filename != __file__]
    if not frames:
        return ""
    frame = frames[-1]
    return f" at {Path(frame.filename).name}:{frame.lineno} in {frame.name}: `{frame.line}`"


def trace(model: nn.Module, input_shape: tuple[int, ...], name: str | None = None) -> LayerGraph:
    """Trace `model` in training mode and build its LayerGraph for one input of `input_shape`.

    Works on modules whose parameters live on the meta device (planning big models without
    allocating them) as well as on real ones; neither parameters nor buffers are changed.
    """
    label = name or type(model).__name__
    was_training = model.training
    model.train()
    try:
        gm = trace_module(model, tuple(input_shape))
    except Exception as error:  # fx raises many types; all mean "not traceable"
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise GraphError(
            f"torch.fx cannot trace model '{label}'{_failing_call(error)}: "
            f"{type(error).__name__}: {first_line}; rewrite data-dependent Python control flow "
            "or wrap that call with torch.fx.wrap"
        ) from error
    finally:
        model.train(was_training)

    _refuse_shared_modules(gm)
    for node in gm.graph.nodes:  # before shapes: torch would warn of what is refused here
        if node.op == "call_module" and isinstance(
                conv := gm.get_submodule(str(node.target)), _CONVS):
            _conv_padding(node, conv)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    # Meta tensors carry shapes only, so a meta module propagates as is (about 3x faster);
    # a real module runs on fake copies so its BatchNorm statistics stay untouched.
    fake_mode = None if device.type == "meta" else FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # ShapeProp prints its own traceback
            ShapeProp(gm, fake_mode=fake_mode).propagate(torch.empty(input_shape, device=device))
    except Exception as error:
        cause = error.__cause__ or error
        what = f"{type(cause).__name__}: " + (str(cause).strip().splitlines() or [""])[0]
        if _runs(model, input_shape, device, fake_mode):
            raise GraphError(
                f"torch.fx traced model '{label}' into a graph that fails on input "
                f"{tuple(input_shape)} ({what}) while the model itself runs on it: a branch fx "
                "cannot follow (a Python if or isinstance on a traced value) went another way "
                "while tracing; make the branch a function wrapped with torch.fx.wrap"
            ) from error
        raise GraphError(
            f"model '{label}' fails on input {tuple(input_shape)}: {what}; check the "
            "image size and channel count"
        ) from error
    return _build(gm, tuple(input_shape), label)


def _runs(model: nn.Module, input_shape: tuple[int, ...], device: torch.device,
          fake_mode: FakeTensorMode | None) -> bool:
    """Whether the model itself runs on an input of `input_shape` (on fake or meta tensors:
    nothing of it changes)."""
    try:
        with fake_mode or contextlib.nullcontext(), contextlib.redirect_stderr(io.StringIO()):
            model(torch.empty(input_shape, device=device))
    except Exception:  # any failure: the model does not run on it, whatever the graph does
        return False
    return True


def _is_shape_query(node: fx.Node, shape_queries: set[str]) -> bool:
    """Whether `node` reads a tensor's sizes (`x.size(0)`, `x.shape[0]`, `x.dim()`, or
    arithmetic on them) rather than computing a tensor: such a node is an argument of a
    reshape, not a layer."""
    if node.op == "call_method" and node.target in ("size", "dim"):
        return True
    if node.op == "call_function" and node.target is getattr:
        return node.args[1] == "shape"
    if node.op == "call_function" and node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, fx.Node) and source.name in shape_queries
    if node.op == "call_function" and node.target in _SIZE_ARITHMETIC:  # channels // groups
        return bool(node.all_input_nodes) and all(
            source.name in shape_queries for source in node.all_input_nodes)
    return False


_SIZE_ARITHMETIC = (operator.add, operator.sub, operator.mul, operator.floordiv,
                    operator.truediv, operator.mod)


def _shape_reads(node: fx.Node, shape_queries: set[str]) -> list[str]:
    """The size queries `node` reads, directly or through others (x.size(0), then [0])."""
    found: list[str] = []
    pending = list(node.all_input_nodes)
    while pending:
        source = pending.pop()
        if source.name in shape_queries and source.name not in found:
            found.insert(0, source.name)
            pending.extend(source.all_input_nodes)
    return found


def _refuse_shared_modules(gm: fx.GraphModule) -> None:
    """A module with weights called twice shares them between two layers, which per-layer
    splits and per-layer weight shards cannot express: refuse it before anything is priced."""
    calls: dict[str, list[str]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls.setdefault(str(node.target), []).append(node.name)
    for target, names in calls.items():
        module = gm.get_submodule(target)
        stateful = next(module.parameters(recurse=False), None) is not None or next(
            module.buffers(recurse=False), None) is not None
        if len(names) > 1 and stateful:
            raise GraphError(
                f"module '{target}' ({type(module).__name__}) is called {len(names)} times "
                f"(fx nodes {', '.join(names)}): shared weights are not supported, since each "
                "layer is split and holds its weights on its own; give each call its own module"
            )


# why a network that returns several outputs while it trains is refused, and what to do
SEVERAL_OUTPUTS = ("networks with auxiliary classifiers (GoogLeNet, Inception-v3 with "
                   "aux_logits=True) return their main and auxiliary scores in training mode, "
                   "and layerwise trains one (batch, classes) output; build the network "
                   "without its auxiliary heads (aux_logits=False) or return the main output "
                   "alone")


def _build(gm: fx.GraphModule, input_shape: tuple[int, ...], label: str) -> LayerGraph:
    builder = _Builder(gm)
    raw_layers: list[_Raw] = []
    output_nodes: list[str] = []
    shape_queries: set[str] = set()
    # the permutes around a LayerNorm over the channels run with it; its consumers read it
    layout_nodes = {name for run in builder.channels_last.values()
                    for name in (run.into, run.back)}
    read_as = {run.back: run.ops[-1] for run in builder.channels_last.values()}
    # a channel map's chunk, views and transposes run with its last node (channel_maps.py)
    step_nodes = {step for found in builder.channel_maps.values() for step in found.steps}
    order = {node.name: index for index, node in enumerate(gm.graph.nodes)}
    for node in gm.graph.nodes:
        if node.op == "output":
            output_nodes = [read_as.get(s.name, s.name) for s in _tensor_inputs(node)]
            continue
        if node.name in layout_nodes or node.name in step_nodes:
            continue
        if node.op == "get_attr":
            if len(node.users) > 1:
                raise GraphError(
                    f"parameter '{node.target}' is read by {len(node.users)} ops (fx nodes "
                    f"{', '.join(user.name for user in node.users)}): shared weights are not "
                    "supported, since each layer is split and holds its weights on its own")
            continue  # held by the op that reads it (_Builder._reading_parameters)
        packed = node.meta.get("tensor_meta")
        if (isinstance(packed, (tuple, list)) and not isinstance(packed, TensorMetadata)
                and all(user.op == "output" for user in node.users)):
            raise GraphError(f"{label} returns {len(packed)} tensors packed in "
                             f"{getattr(node.target, '__name__', node.target)} while it "
                             f"trains: {SEVERAL_OUTPUTS}")
        if "tensor_meta" not in node.meta:
            if _is_shape_query(node, shape_queries):
                shape_queries.add(node.name)  # x.size(0) in x.view(x.size(0), -1): no layer
                continue
            raise builder._unsupported(node)
        raw = builder.layer_for(node)
        raw.inputs = [read_as.get(name, name) for name in raw.inputs]
        raw.reads = sorted({read for name in (*raw.before, node.name)
                            for read in _shape_reads(builder.nodes[name], shape_queries)},
                           key=order.__getitem__)
        raw_layers.append(raw)
    users = {layer.name: 0 for layer in raw_layers}
    for layer in raw_layers:
        for source in dict.fromkeys(layer.inputs):
            users[source] += 1
    for name in output_nodes:
        users[name] += 1
    kept, holder = _fuse(raw_layers, users)
    layers = tuple(
        Layer(
            name=raw.name, kind=raw.kind, op=raw.op, target=raw.target,
            inputs=tuple(raw.inputs), input_shapes=tuple(raw.input_shapes),
            output_shape=raw.output_shape, param_shapes=raw.param_shapes, flops=raw.flops,
            geometry=raw.geometry, concat_dim=raw.concat_dim, resize=raw.resize,
            padding=raw.padding, fused=tuple(raw.fused), function=raw.function,
            max_degrees=raw.max_degrees, held_reason=raw.held_reason, reads=tuple(raw.reads),
            before=raw.before, after=raw.after, channels=raw.channels,
        )
        for raw in kept
    )
    inside_runs = {op for run in builder.channels_last.values() for op in run.ops[:-1]}
    layers = tuple(layer.model_copy(update={"channels_last_value": True})
                   if layer.value_node in inside_runs else layer for layer in layers)
    outputs = tuple(dict.fromkeys(holder.get(name, name) for name in output_nodes))
    return LayerGraph(model=label, input_shape=input_shape, layers=layers, outputs=outputs)


def build_graph(
    model: str,
    batch: int = 1,
    image_size: int | tuple[int, ...] | None = None,
    num_classes: int | None = None,
    in_channels: int | None = None,
) -> LayerGraph:
    """Build a zoo model (or `package.module:factory`) on the meta device and trace it."""
    from layerwise.strategies.model.zoo import build_model, input_shape

    if batch < 1:
        raise GraphError(f"batch must be >= 1 (got {batch})")
    module = build_model(
        model, num_classes=num_classes, image_size=image_size, in_channels=in_channels,
        device="meta",
    )
    shape = input_shape(model, batch, image_size, in_channels)
    return trace(module, shape, name=model)

