"""The memory a strategy needs on each device: what the layer-wise runtime holds, term by term.

A rank's tensors during a step (docs/cost-model.md, "Memory"), for every layer it holds a tile
of, with the tile's exact box (`space.tile_range`):
- weights: its shard of the layer's parameters (a channel split shards them; n, h and w splits
  replicate them), and BatchNorm's running statistics for its channels;
- gradients of those weights, from the backward until the next step's start;
- momentum: SGD's buffer per weight, from the first update on;
- buckets: the flat buffer each replicated weight's gradient is copied into for its
  all-reduce, kept from step to step (runtime/buckets.py);
- kept activations: the output tile and each needed input box (halos included) that is not
  simply the rank's own producer tile, held until the layer's own backward is done;
- saved: what the tile's ops save for their backward beyond those: the intermediate tensors
  of its fused ops that a backward reads (a normalisation's input; a leaky ReLU's, GELU's or
  SiLU's input; a ReLU's output when a dropout follows it), max pooling's indices (int64);
  the padded copy a conv or pool tile whose rows or columns are not whole makes of its needed
  box (it pads the tensor's border itself) and its op saves; freed as the layer's backward
  runs; nothing for a layer the plan recomputes, whose forward keeps no autograd graph and
  whose backward makes them again as its workspace;
- pending gradients: the gradient of a layer's output tile, from the backward of its first
  consumer (in the backward's order) that sends it back until its own backward; none on a
  chained edge, where the layer computes on its sole producer's tile itself (the runtime's
  rule: that producer feeds it alone and every device needs exactly its own producer tile),
  so one autograd call runs both;
- the step's inputs: the global batch and its labels (every rank reads the whole batch and
  slices its tiles) and every dropout mask, drawn at the layer's full shape;
- workspace: the most one layer's part of a backward call holds at once: the gradient of its
  output tile, of each fused op's input on the way back and of its input boxes, with what its
  ops saved; or, in its main op's own backward, the gradient of that op's output and what the
  op allocates (a convolution's oneDNN buffers, measured: `_conv_backward`; an upsampling
  tile's gathered gradients; else the input boxes' gradients); or the return of its input
  gradients to their producers (copies of the parts sent, buffers of the parts received, the
  producer tile's gradient begun there); and the update's weight-decay temporary (the largest
  weight shard). An upsampling tile's forward also holds its gathered rows for a moment.
The peak is the largest of three moments: the forward's fullest (kept + saved at its end, or a
tile's forward transient before it; no gradients yet);
the backward's fullest moment, found by walking the layers in the backward's order: at a layer,
the kept tensors of the layers up to its call's, the saved ones of those before it, the weight
gradients made so far, the pending gradients and its workspace; and the update (gradients, the
replicated ones now views into their buckets, and the temporary; activations gone).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict

from layerwise.strategies.model.fx_nodes import STOCHASTIC_DEPTH
from layerwise.strategies.model.graph import Layer, LayerGraph
from layerwise.strategies.model.ops import border_padding, pads_a_copy
from layerwise.strategies.model.resize import resize_taps
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.tiles import (
    Box,
    as_view,
    box_volume,
    chained_edges,
    config_boxes,
    needed_box,
    real_box,
)

INDEX_BYTES = 8  # max pooling's int64 indices
FLOAT32_BYTES = 4  # training's element type unless verify's float64
# The share of a device's memory a plan may not count on: the CUDA context, cuDNN's and NCCL's
# workspaces and the allocator's fragmentation, none of which the model counts.
MEMORY_RESERVE = 0.1
NORMALIZATIONS = ("BatchNorm", "GroupNorm", "LayerNorm", "batch_norm", "group_norm",
                  "layer_norm")
# fused ops (module or function names) whose backward reads their result; every other fused
# op but these that save nothing is differentiated at its input and keeps it (normalisations,
# leaky ReLU, ELU, GELU, SiLU, Hardswish, Mish, ReLU6 as hardtanh, ...)
SAVES_RESULT = frozenset({"ReLU", "relu", "relu_", "Sigmoid", "sigmoid", "Tanh", "tanh"})
SAVES_NOTHING = frozenset({"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "dropout",
                           "dropout1d", "dropout2d", "dropout3d", "Identity", "contiguous",
                           "add_scalar", "sub_scalar", "mul_scalar", "stochastic_depth",
                           "stochastic_depth(batch)"})


class DeviceMemory(BaseModel):
    """One device's predicted bytes, by what holds them, and its peak."""

    model_config = ConfigDict(frozen=True)

    device: int
    weights: int
    gradients: int
    momentum: int
    buckets: int
    kept: int  # at the forward's end
    saved: int  # at the forward's end
    inputs: int
    update_workspace: int
    # the backward's fullest moment: in whose call, and what it holds beyond the weights
    backward_layer: str
    backward_activations: int  # kept and saved tensors of the layers still to run
    backward_gradients: int  # the weight gradients made so far
    pending_gradients: int  # output gradients waiting for their layer's backward
    workspace: int  # the call's own tensors
    # what a layer's forward holds for a moment beyond the forward's end (an upsampling tile's
    # gathered rows), where that moment is fuller than the end
    forward_workspace: int = 0

    @property
    def forward_end(self) -> int:
        """The forward's fullest moment: its end, or a tile's forward transient before it."""
        return (self.weights + self.momentum + self.buckets + self.inputs + self.kept
                + self.saved + self.forward_workspace)

    @property
    def backward_end(self) -> int:
        """The backward's fullest moment (not its end, by which every activation is gone)."""
        return (self.weights + self.momentum + self.buckets + self.inputs
                + self.backward_activations + self.backward_gradients + self.pending_gradients
                + self.workspace)

    @property
    def update(self) -> int:
        """The replicated weights' gradients are views into their buckets by then."""
        return (self.weights + self.momentum + self.inputs + self.gradients
                + self.update_workspace)

    @property
    def peak(self) -> int:
        return max(self.forward_end, self.backward_end, self.update)


def memory_budget(device_memory: int) -> int:
    """What a plan may use of a device's `device_memory` bytes: all but MEMORY_RESERVE."""
    return int(device_memory * (1 - MEMORY_RESERVE))


def _weight_elements(layer: Layer, box: Box) -> int:
    """The tile's shard of the layer's weights: its share of the output channels, and whole
    what no channel dim runs through (a PReLU's one slope)."""
    channels = as_view(layer.output_shape)[1]
    shared = layer.shared_param_count
    return (layer.param_count - shared) * (box[1][1] - box[1][0]) // channels + shared


def _running_statistics(layer: Layer, box: Box) -> int:
    """BatchNorm's running mean and variance for the tile's channels."""
    norms = sum(1 for fused in layer.fused if fused.op.startswith("BatchNorm"))
    return 2 * norms * (box[1][1] - box[1][0])


def _saved_intermediates(layer: Layer) -> int:
    """How many of the layer's intermediate tensors (the main op's output, each fused op's but
    the last, which is the kept output) its fused ops save for their backward: a normalisation
    or an activation whose derivative reads its input saves that input, one whose derivative
    reads its result saves that (PyTorch's derivatives.yaml); a tensor saved twice is held
    once. Position i is fused op i's input, i + 1 its output."""
    saved = set()
    for index, fused in enumerate(layer.fused):
        if fused.op in SAVES_RESULT:
            saved.add(index + 1)
        elif fused.op not in SAVES_NOTHING:
            saved.add(index)
    return len(saved - {len(layer.fused)})


def _saved_elements(layer: Layer, box: Box) -> tuple[int, int]:
    """(elements in the layer's element type, int64 elements) its ops save beyond the kept
    tensors: the intermediate tensors its fused ops save, max pooling's indices."""
    out = box_volume(box)
    indices = out if layer.kind == "pool" and "Max" in layer.op else 0
    return _saved_intermediates(layer) * out, indices


class TileTerms(BaseModel):
    """The bytes one tile puts on its device whatever its producers' configs: its weight
    shard's four copies, its output, what its ops save."""

    model_config = ConfigDict(frozen=True)

    weights: int  # the shard and BatchNorm's running statistics
    gradients: int
    momentum: int
    buckets: int
    output: int  # the kept output tile
    saved: int

    @property
    def forward_end(self) -> int:
        """Its part of DeviceMemory.forward_end, input copies aside."""
        return self.weights + self.momentum + self.buckets + self.output + self.saved

    @property
    def backward_end(self) -> int:
        """Its part of every moment of the backward's last call (the first layer's, when
        every weight gradient is made): its weight shard's copies; its activations are gone by
        then, and a fuller moment holds no less of it."""
        return self.weights + self.momentum + self.buckets + self.gradients


def tile_terms(layer: Layer, config: ParallelConfig, box: Box, element_bytes: int,
               momentum: bool = True) -> TileTerms:
    """What the tile `box` of `layer` under `config` holds on its device by itself."""
    weights = _weight_elements(layer, box) * element_bytes
    saved, indices = _saved_elements(layer, box)
    return TileTerms(
        weights=weights + _running_statistics(layer, box) * element_bytes,
        gradients=weights, momentum=weights if momentum else 0,
        buckets=weights if config.size // config.c > 1 else 0,
        output=box_volume(box) * element_bytes,
        saved=saved * element_bytes + indices * INDEX_BYTES)


def step_input_bytes(graph: LayerGraph, element_bytes: int) -> int:
    """The step's inputs every rank holds: the global batch, its labels, every dropout mask."""
    batch = graph.layers[0].output_shape
    return ((math.prod(batch) + _dropout_masks(graph)) * element_bytes
            + batch[0] * INDEX_BYTES)


def any_plan_bound(graph: LayerGraph, element_bytes: int) -> int:
    """Bytes no device exceeds under any plan: every term of every layer at its whole size
    (no tile, copy or gradient exceeds the tensor it is part of), the workspace as the sum of
    all a backward could hold. A plan search skips the memory check under budgets above it."""
    whole = step_input_bytes(graph, element_bytes)
    for layer in graph.layers:
        if layer.kind == "input":
            continue
        box = tuple((0, size) for size in as_view(layer.output_shape))
        out = box_volume(box)
        inputs = sum(math.prod(graph.by_name[name].output_shape) for name in layer.inputs)
        saved, indices = _saved_elements(layer, box)
        padded = _whole_padded(layer)
        elements = (5 * layer.param_count  # weights, gradients, momentum, bucket, update's
                    + _running_statistics(layer, box)
                    + out + inputs  # kept: the output and copies of the inputs
                    + inputs  # input gradients
                    + 2 * (saved + padded)  # saved, and again while a chained backward holds it
                    + (1 + len(layer.fused)) * out + inputs)  # the backward's gradients
        if layer.kind == "resize":  # a tile's gathered rows and their gradients, at most
            elements += 4 * out + 2 * inputs
        if layer.kind == "conv":  # its own backward, its tiles' channels blocked at worst
            channels = as_view(layer.input_shapes[0])[1]
            elements += (out * max(16, -(-box[1][1] // 16) * 16) // box[1][1]
                         + max(padded * (-(-channels // 16) * 16) // channels, 3 * padded))
        whole += elements * element_bytes + 2 * indices * INDEX_BYTES
    return whole


def predicted_memory(graph: LayerGraph, assignment: Mapping[str, ParallelConfig],
                     devices: int, element_bytes: int, momentum: bool = True,
                     recompute: Collection[str] = ()) -> tuple[DeviceMemory, ...]:
    """Each device's predicted bytes under `assignment` (one config per layer) with the
    layers in `recompute` recomputed in the backward, with weights and activations of
    `element_bytes` each (4 for float32, 8 for float64)."""
    tiles = {layer.name: config_boxes(layer, assignment[layer.name]) for layer in graph.layers}
    by_name = graph.by_name
    position = {layer.name: index for index, layer in enumerate(graph.layers)}
    chains = chained_edges(graph, tiles, recompute)
    chain_producers = set(chains.values())
    # the layer whose backward call runs each layer's part: a chain's last consumer
    call: dict[str, str] = {}
    for layer in reversed(graph.layers):
        call[layer.name] = call.get(layer.name, layer.name)
        if layer.name in chains:
            call[chains[layer.name]] = call[layer.name]
    static = {device: dict.fromkeys(("weights", "gradients", "momentum", "buckets", "kept",
                                     "saved", "update_workspace"), 0)
              for device in range(devices)}
    records: dict[int, list[_TileRecord]] = {device: [] for device in range(devices)}
    for layer in graph.layers:
        if layer.kind == "input":
            continue
        config = assignment[layer.name]
        # the network input needs no gradient: no leaf on its edges either
        chained = {producer for producer in layer.inputs
                   if by_name[producer].kind == "input" or chains.get(layer.name) == producer}
        for device, box in tiles[layer.name].items():
            held = static[device]
            own = tile_terms(layer, config, box, element_bytes, momentum)
            for term in ("weights", "gradients", "momentum", "buckets"):
                held[term] += getattr(own, term)
            work = _own_work(layer, box, element_bytes,
                             by_name[layer.inputs[0]].kind != "input",
                             layer.name in chain_producers)
            needed = work.needed
            saved = 0 if layer.name in recompute else own.saved + work.padded
            held["saved"] += saved
            held["update_workspace"] = max(held["update_workspace"], own.gradients)
            leaves = [producer for producer in layer.inputs if producer not in chained]
            copies = sum(box_volume(needed[producer]) for producer in leaves
                         if tiles[producer].get(device) != needed[producer])
            kept = own.output + copies * element_bytes
            held["kept"] += kept
            returned = _returned_gradients(layer, device, needed, leaves, tiles, position,
                                           graph.consumers, chains)
            records[device].append(_TileRecord(
                layer=layer.name, kept=kept, saved=saved, gradients=own.gradients,
                workspace=max(own.saved + work.padded + work.gradients, work.main_op,
                              (work.inputs + returned) * element_bytes),
                # where its output's gradient waits for its backward: from the first consumer
                # (in the backward's order) that sends one back, on an edge that is a leaf
                waits_from=max((position[consumer] for consumer in graph.consumers[layer.name]
                                if chains.get(consumer) != layer.name), default=-1),
                output=own.output, forward_extra=work.forward_extra))
    return tuple(_device_memory(device, static[device], records[device], position, call,
                                step_input_bytes(graph, element_bytes))
                 for device in range(devices))


@dataclass(frozen=True)
class _OwnWork:
    """What a tile's own backward call holds whatever its neighbours' tiles (bytes, but
    `inputs`, in elements): the input boxes it needs, its padded copy, the gradients on the
    way back through its ops, and its main op's transients."""

    needed: dict[str, Box]
    inputs: int  # elements of the needed boxes
    padded: int
    gradients: int
    forward_extra: int
    main_op: int


def _own_work(layer: Layer, box: Box, element_bytes: int, input_gradient: bool,
              chain_producer: bool) -> _OwnWork:
    """_OwnWork of tile `box`; `chain_producer`: a consumer computes on this tile (the edge is
    chained), so its output's gradient lives inside one autograd call."""
    needed = {producer: needed_box(layer, index, box)
              for index, producer in enumerate(layer.inputs)}
    padded = _padded_copy(layer, box, needed[layer.inputs[0]])
    inputs = sum(box_volume(box) for box in needed.values())
    # the output's gradient and each fused op's input's, then the inputs'; inside a chained
    # call autograd frees the output's own once its first fused op's backward has read it
    output_gradients = 1 + len(layer.fused) - (bool(layer.fused) and chain_producer)
    forward_extra, main_op = _main_op_workspaces(layer, box, needed[layer.inputs[0]], inputs,
                                                 padded, input_gradient)
    return _OwnWork(needed=needed, inputs=inputs, padded=padded * element_bytes,
                    gradients=(output_gradients * box_volume(box) + inputs) * element_bytes,
                    forward_extra=forward_extra * element_bytes,
                    main_op=main_op * element_bytes)


class TileFloor(BaseModel):
    """What one tile puts on its device at the forward's end and at each moment of the
    backward whatever the other layers' configs: each term's own part (input copies, pending
    and returned gradients depend on the neighbours' tiles and are left out, and the output's
    gradient is counted as inside a chained call), so a sum of floors over a plan's layers is
    at most the moment it stands for (the rows of search/memory_fit.py)."""

    model_config = ConfigDict(frozen=True)

    base: int  # weights with running statistics, momentum and bucket: held throughout
    output: int  # the kept output tile, until its own backward is done
    saved: int  # what its ops save and its padded copy (none when recomputed)
    gradients: int  # its weight shard's gradient, from its backward on
    workspace: int  # the least its own backward call holds


def tile_floor(layer: Layer, config: ParallelConfig, box: Box, element_bytes: int,
               input_gradient: bool) -> TileFloor:
    """TileFloor of tile `box` of `layer` under `config`; `input_gradient`: its first input
    is not the network's (whose gradient no call makes)."""
    own = tile_terms(layer, config, box, element_bytes)
    work = _own_work(layer, box, element_bytes, input_gradient, chain_producer=True)
    return TileFloor(base=own.weights + own.momentum + own.buckets, output=own.output,
                     saved=own.saved + work.padded, gradients=own.gradients,
                     workspace=max(own.saved + work.padded + work.gradients, work.main_op,
                                   work.inputs * element_bytes))


class _TileRecord(BaseModel):
    """What one tile holds on its device, for the scan over the backward's moments."""

    model_config = ConfigDict(frozen=True)

    layer: str
    kept: int  # output and input copies, from the forward until its own backward is done
    saved: int  # what its ops save for the backward (0 when recomputed)
    gradients: int  # its weight shard's gradient, from its backward on
    workspace: int  # the most its own backward call holds
    waits_from: int  # position of the consumer whose backward first sends its output gradient
    output: int  # its output tile, the size of that gradient
    forward_extra: int = 0  # what its forward holds for a moment beyond its kept and saved


def _device_memory(device: int, static: dict[str, int], records: list[_TileRecord],
                   position: Mapping[str, int], call: Mapping[str, str], inputs: int
                   ) -> DeviceMemory:
    """The device's terms, with the backward's fullest moment found by walking its layers in
    the backward's order: at layer L's part of a backward call, the weight gradients of the
    layers done and its own, the kept tensors of every layer up to the call's (each layer's
    are freed once its backward has run), the saved tensors of the layers before it, the
    output gradients that wait for a layer still to run, and the call's own workspace."""
    fullest = {"backward_activations": 0, "backward_gradients": 0, "pending_gradients": 0,
               "workspace": 0}
    fullest_layer, fullest_total = "", -1
    kept_before = [0]
    saved_before = [0]
    for record in records:
        kept_before.append(kept_before[-1] + record.kept)
        saved_before.append(saved_before[-1] + record.saved)
    upto = {record.layer: index for index, record in enumerate(records)}
    forward_fullest = max((kept_before[index + 1] + saved_before[index + 1] + record.forward_extra
                           for index, record in enumerate(records)), default=0)
    gradients_done = 0
    for index in reversed(range(len(records))):
        record = records[index]
        gradients_done += record.gradients
        here = position[record.layer]
        head = upto.get(call[record.layer], index)
        pending = sum(earlier.output for earlier in records[:index]
                      if earlier.waits_from > here)
        moment = {"backward_activations": kept_before[head + 1] + saved_before[index],
                  "backward_gradients": gradients_done, "pending_gradients": pending,
                  "workspace": record.workspace}
        total = sum(moment.values())
        if total > fullest_total:
            fullest, fullest_layer, fullest_total = moment, record.layer, total
    return DeviceMemory(device=device, inputs=inputs, backward_layer=fullest_layer,
                        forward_workspace=max(0, forward_fullest - kept_before[-1]
                                              - saved_before[-1]),
                        **static, **fullest)


@functools.cache  # asked per tile of every plan the memory search checks
def conv_channel_block() -> int:
    """The channel block of oneDNN's layouts on this CPU: 16 with AVX-512, else 8."""
    return 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


def _blocked(elements: int, channels: int) -> int:
    """Elements of a tensor of `elements` over `channels` in oneDNN's channel-blocked layout,
    the channels rounded up to a block (conv_channel_block)."""
    block = conv_channel_block()
    return elements * (-(-channels // block) * block) // channels


# oneDNN's direct (jit) convolutions take kernels up to 14 wide along the last dim; a wider
# one runs its GEMM convolution, which unfolds one sample's input at a time (measured on this
# CPU's AVX-512 oneDNN: 14 wide direct, 15 and more GEMM, for 1-d and 2-d kernels)
GEMM_KERNEL_WIDTH = 15


def _conv_backward(layer: Layer, box: Box, input_elements: int, input_channels: int,
                   input_gradient: bool) -> int:
    """Elements a convolution's own backward allocates at its fullest (its input gradient
    included), with `input_elements` the input it convolved (the padded copy where the tile
    pads one). Measured with torch's profiler on oneDNN (CPUs), 3 to 256 channels, kernels 1
    to 7, strides 1 to 3: a stride-1 convolution copies the output gradient into the blocked
    layout (out_b) and, for the input gradient, holds either a blocked input gradient or the
    input gradient and a reordered input: out_b + max(in_b, 2 in); a strided one holds the
    input gradient, a reordered input and a contiguous copy: max(3 in, out_b + 2 in); without
    an input gradient (the network's input) only out_b and, from 8 input channels on, the
    reordered input. Within 4% of every measured stride-1 case and 0-20% above the strided
    ones. A kernel GEMM_KERNEL_WIDTH or more wide runs oneDNN's GEMM convolution instead
    (`_gemm_conv_backward`). A GPU's cuDNN makes no blocked copies, so there it over-counts."""
    out = box_volume(box)
    out_blocked = _blocked(out, box[1][1] - box[1][0])
    gemm = _gemm_conv_backward(layer, box, input_channels)
    if not input_gradient:
        return gemm or out_blocked + (input_elements if input_channels >= 8 else 0)
    if layer.geometry is not None and all(stride == 1 for stride in layer.geometry.stride):
        direct = out_blocked + max(_blocked(input_elements, input_channels), 2 * input_elements)
    else:
        direct = max(3 * input_elements, out_blocked + 2 * input_elements)
    return max(direct, gemm + input_elements) if gemm else direct


def _gemm_conv_backward(layer: Layer, box: Box, input_channels: int) -> int:
    """Elements oneDNN's GEMM convolution (a kernel GEMM_KERNEL_WIDTH or more wide, ungrouped)
    allocates in its backward beside the gradients (0 for any other convolution): one
    sample's unfolded input, input channels x kernel taps x output positions, and four
    buffers the size of the tile's weights. Measured with torch's profiler on one thread,
    without an input gradient (the network's input, as M5's 80-tap first layer): within 1%
    over 1 to 16 input channels, kernels 15 to 80 wide, strides 1 to 4, 1-d and 2-d. With an
    input gradient the call also holds it and more (0.72-1.0 of the larger of this plus the
    input and the direct rule, over four cases), which `_conv_backward` takes as the
    lower bound."""
    geometry = layer.geometry
    if (geometry is None or geometry.transposed or geometry.groups > 1
            or geometry.kernel[-1] < GEMM_KERNEL_WIDTH):
        return 0
    taps = math.prod(geometry.kernel)
    positions = math.prod(stop - start for start, stop in box[2:])
    return taps * input_channels * (positions + 4 * (box[1][1] - box[1][0]))


def _main_op_workspaces(layer: Layer, box: Box, first: Box, inputs: int, padded: int,
                        input_gradient: bool) -> tuple[int, int]:
    """(forward, backward) elements of the layer's main op beyond its kept and saved tensors:
    what its forward holds for a moment (an upsampling tile's gathered rows), and what its own
    backward holds (the gradient of its output, then, by kind: a convolution's oneDNN buffers,
    an upsampling tile's gathered gradients, or the input boxes' gradients), the padded copy it
    saved included, its fused ops' saved tensors freed by then."""
    out = box_volume(box)
    if layer.kind == "resize":
        forward, backward = _resize_workspaces(layer, box, first)
        return forward, out + backward
    if layer.kind == "conv":
        columns = native_conv_columns(layer, box, first)
        if columns:  # torch's own unfolded GEMM: its columns, then the input's gradient
            return columns, padded + out + columns + (
                (padded or box_volume(first)) if input_gradient else 0)
        return 0, padded + out + _conv_backward(layer, box, padded or box_volume(first),
                                                first[1][1] - first[1][0], input_gradient)
    return 0, padded + out + inputs


# aten's use_mkldnn: an ungrouped float convolution on the CPU runs torch's own unfolded GEMM
# (slow_conv2d / slow_conv3d) instead of oneDNN when it convolves one sample whose input's
# first four dims (a 1-d convolution's input seen as (N, C, 1, L)) hold at most this many
# values, unless the kernel's last two dims both exceed 3
NATIVE_CONV_VALUES = 20480


def native_conv_columns(layer: Layer, box: Box, needed: Box) -> int:
    """Elements of the unfolded input (im2col/vol2col: input channels x kernel taps x output
    positions) that a conv tile `box` reading the input box `needed` holds when torch's CPU
    dispatch runs it natively (NATIVE_CONV_VALUES); 0 where oneDNN runs it, and for a 1x1
    convolution of stride 1, which the native GEMM reads in place. Measured with torch's
    profiler on Conv3d tiles of one sample: the forward peaks at the columns plus its output,
    the backward at the columns plus the input's gradient (1.02-1.11x, 1.30x strided)."""
    geometry = layer.geometry
    if geometry is None or geometry.transposed or geometry.groups > 1:
        return 0
    rank = len(layer.input_shapes[0])
    lengths = [stop - start for start, stop in real_box(needed, rank)]
    own = real_box(box, len(layer.output_shape))
    if pads_a_copy(own, layer.input_shapes[0][2:], geometry):
        sides = border_padding(own, layer.input_shapes[0][2:], geometry)
        lengths = [*lengths[:2], *(length + before + after for length, (before, after)
                                   in zip(lengths[2:], sides, strict=True))]
    shape = [*lengths[:2], 1, *lengths[2:]] if rank == 3 else lengths
    kernel = (1, *geometry.kernel)[-2:]
    if (shape[0] > 1 or min(kernel) > 3 or math.prod(shape[:4]) > NATIVE_CONV_VALUES
            or all(size == 1 for size in (*geometry.kernel, *geometry.stride))):
        return 0
    out_positions = math.prod(stop - start for start, stop in own[2:])
    return shape[1] * math.prod(geometry.kernel) * out_positions


def _returned_gradients(layer: Layer, device: int, needed: Mapping[str, Box],
                        leaves: Collection[str], tiles: Mapping[str, Mapping[int, Box]],
                        position: Mapping[str, int], consumers: Mapping[str, Collection[str]],
                        chains: Mapping[str, str]) -> int:
    """Elements the return of a layer's input gradients to their producers' tiles holds beside
    those gradients (halo_exchange.return_gradient): the parts of each needed box held by
    other devices, copied to be sent; the parts of this device's producer tile coming back
    from others (at most the tile less what this device needs of it); and the producer tile's
    gradient, begun here when this layer is the first of the producer's consumers to send one
    back (later ones add into it, already counted as pending)."""
    total = 0
    for producer in leaves:
        box = needed[producer]
        mine = tiles[producer].get(device)
        local = _overlap(box, mine) if mine is not None else 0
        total += box_volume(box) - local
        if mine is None:
            continue
        total += box_volume(mine) - local
        first = max(position[consumer] for consumer in consumers[producer]
                    if chains.get(consumer) != producer)
        if first == position[layer.name]:
            total += box_volume(mine)
    return total


def _overlap(first: Box, second: Box) -> int:
    """Elements two boxes share."""
    return math.prod(max(0, min(a[1], b[1]) - max(a[0], b[0]))
                     for a, b in zip(first, second, strict=True))


def _resize_workspaces(layer: Layer, box: Box, needed: Box) -> tuple[int, int]:
    """(forward, backward) elements an upsampling tile's op holds beyond its output and its
    output's gradient (ops.resize), measured with torch's profiler on 2-d layers. A tile of
    whole rows along every spatial dim is torch's own call: nothing in the forward, its
    input's gradient in the backward. Any other gathers one dim after the other: the forward
    holds the stage before the last dim's (T0: the tile's rows along the dims done, the box's
    along the rest; the largest such stage for a 3-d layer, none for a 1-d one) and, with two
    taps, one gathered tap of the output's size; the backward holds the weighted gradient and
    two T0-sized gathers' gradients with two taps, the T0 gradient and the input's with one."""
    out = box_volume(box)
    resize = layer.resize
    assert resize is not None
    rank = len(layer.output_shape)
    own, box_in = real_box(box, rank), real_box(needed, rank)
    sizes, in_sizes = layer.output_shape, layer.input_shapes[0]
    if all(own[dim] == (0, sizes[dim]) for dim in range(2, rank)):
        return 0, box_volume(needed)
    lengths = [stop - start for start, stop in own]
    stage = max((math.prod(lengths[:dim + 1]) * math.prod(
        stop - start for start, stop in box_in[dim + 1:]) for dim in range(2, rank - 1)),
        default=0)
    taps = len(resize_taps(in_sizes[-1], sizes[-1], resize.mode, resize.align_corners,
                           resize.scales[-1]).indices)
    if taps > 1:
        return stage + out, out + 2 * stage
    return stage, stage + box_volume(needed)


def _whole_padded(layer: Layer) -> int:
    """Elements of the layer's input padded on every side: no tile's padded copy is larger."""
    if layer.kind not in ("conv", "pool") or layer.geometry is None or layer.geometry.transposed:
        return 0
    shape = layer.input_shapes[0]
    padding = layer.geometry.padding
    return math.prod(shape[:2]) * math.prod(
        size + 2 * pad for size, pad in zip(shape[2:], padding, strict=True))


def _padded_copy(layer: Layer, box: Box, needed: Box) -> int:
    """Elements of the padded copy a conv or pool tile makes of its needed box (ops.py's
    `_pad_borders`): one whose rows or columns are not whole pads the tensor's border itself,
    and the op saves that copy for its backward. 0 where the op pads or needs no padding, and
    for a transposed convolution, whose tile crops its output instead."""
    if layer.kind not in ("conv", "pool") or layer.geometry is None or layer.geometry.transposed:
        return 0
    rank = len(layer.input_shapes[0])
    own, in_size = real_box(box, len(layer.output_shape)), layer.input_shapes[0][2:]
    if not pads_a_copy(own, in_size, layer.geometry):
        return 0
    lengths = [stop - start for start, stop in real_box(needed, rank)]
    sides = border_padding(own, in_size, layer.geometry)
    return math.prod(lengths[:2]) * math.prod(
        length + before + after for length, (before, after) in zip(lengths[2:], sides,
                                                                    strict=True))


def _dropout_masks(graph: LayerGraph) -> int:
    """Elements of every dropout mask of a step (each at its layer's full output shape)."""
    total = 0
    for layer in graph.layers:
        for fused in layer.fused:
            if fused.op.startswith("Dropout") or fused.op == "dropout":
                size = 1
                for extent in layer.output_shape:
                    size *= extent
                total += size
            elif fused.op.startswith(STOCHASTIC_DEPTH):  # one draw per sample, or per batch
                total += layer.output_shape[0] if fused.op == STOCHASTIC_DEPTH else 1
    return total
