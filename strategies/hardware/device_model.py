"""What a GPU's kernels do with a tile of work: the analytic t_c behind `--analytic`.

A roofline (FLOPs / peak, bytes / bandwidth) makes a tile's time fall in proportion to its
size, so spreading a layer over more devices always pays. Real kernels do not scale that way
once the work is small (Jia et al. 2018, Fig. 3: a layer's time stops falling as its degree
grows). Three effects cause it, and this model prices each one from published device figures:

- Wave quantization (Habitat, Yu et al., USENIX ATC 2021, section 3.2, "wave scaling"): a GEMM
  or an implicit-GEMM convolution runs as thread blocks, one output tile each, at most as many
  at once as the SMs hold; the kernel takes whole waves, so a kernel of 1.1 waves costs 2, and a
  kernel with fewer blocks than slots leaves SMs idle. Like a library's heuristic, the model
  prices each GEMM at the fastest of a small set of kernels (TILE_SHAPES x SPLIT_FACTORS): a
  smaller tile wastes less on partial tiles but reuses each loaded element less, a split of the
  reduction (split-K) multiplies the blocks to fill the SMs but pays a pass over the partial
  outputs.
- A latency floor: every kernel launch costs at least `kernel_latency`, and one training op is
  several kernels (forward, backward data, backward weights, each fused elementwise op's two
  passes, one update per weight tensor).
- Memory-bound ops (pooling, elementwise, BatchNorm, concat, the SGD update) move their tensors
  at the device's memory bandwidth.
- The host's floor: the host issues a tile's ops and enters the autograd engine once per layer
  (the runtime differentiates each layer's graph on its own); while that takes longer than the
  kernels, the device waits, so a tile takes at least `host_layer_seconds` plus
  `host_op_seconds` per op (its main op and each fused one), forward and backward. Both are
  the device's host measured apart from any model (benchmarks/host_dispatch.py, one-element
  tensors); a preset without them has no floor.

A large GEMM's share of peak is the cluster's `compute_efficiency`: PALEO's "platform percent
of peak" (Qi, Sparks, Talwalkar, ICLR 2017, section 3.1.1), one fraction per platform. The
other GEMM-like kernels run at a fixed share of a large GEMM's rate per op kind (conv forward,
conv backward data, conv backward weights, by algorithm and stride), measured by Baidu's
DeepBench on a P100 (CONV_FORWARD_EFFICIENCY and the shares beside it). Below a full wave the
efficiency falls further with the work size through the waves, the tile's loads and the split's
reduction, which is how it depends on size here. benchmarks/deepbench_shares.py prints the
model's error against every GEMM and convolution DeepBench measured on a P100 and a V100.

No constant in this module or in the presets was fitted to a result it is meant to reproduce;
each has its source beside it. None was checked against CUDA-event profiles of real tiles yet
(no GPU was available when it was written): `layerwise profile` on a GPU measures the real
ones, and a profile replaces this model wherever one is given.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from layerwise.strategies.model.graph import BYTES_PER_ELEMENT, Layer
from layerwise.strategies.model.tiles import as_view

# The thread-block output tiles (rows x columns) of the fp32 GEMM kernels a library picks from:
# CUTLASS's SGEMM set, the SIMT kernels its library instantiates for every GPU from Maxwell on
# (NVIDIA CUTLASS, tools/library/scripts/generator.py, GenerateSM50_Simt: 128x128x8, 128x64x8,
# 64x128x8, 64x64x8, 128x32x8, 32x128x8). cuBLAS and cuDNN choose among such shapes per problem
# too; the first is the large-GEMM tile the op-kind shares below were measured with.
TILE_SHAPES: tuple[tuple[int, int], ...] = ((128, 128), (128, 64), (64, 128), (64, 64),
                                            (128, 32), (32, 128))
# Every one of those kernels gives each thread 8 x 8 outputs (its warps: 128x128 by 256 threads,
# 128x64 by 128, 64x64 and 128x32 by 64; same generator.py), held in 128 registers per thread:
# 64 accumulators plus double-buffered A and B fragments and addresses, the register budget of
# Scott Gray's maxas SGEMM (github.com/NervanaSystems/maxas, wiki "SGEMM").
OUTPUTS_PER_THREAD = 64
REGISTERS_PER_THREAD = 128
# 65,536 32-bit registers per SM on every GPU here: Kepler GK110 whitepaper (2012), Tesla P100
# whitepaper (2016), Tesla V100 whitepaper (2017), H100 Tensor Core GPU architecture (2022).
REGISTERS_PER_MULTIPROCESSOR = 65_536
# So an SM holds 2 blocks of 128 x 128 at once, 4 of 128 x 64, 8 of 64 x 64 (the same outputs in
# flight whatever the tile: a smaller one only wastes less on partial tiles and waves), at most 8
# blocks per SM, within every GPU's resident-block limit (16 on Kepler, 32 from Maxwell on: CUDA
# C Programming Guide, "Compute Capabilities").
# The reduction depth of one main-loop step of those kernels (the 8 of 128x128x8): a split-K
# slice spans at least one step.
TILE_DEPTH = 8
# Split-K (CUTLASS's GemmSplitKParallel, cuBLAS's and cuDNN's split-reduction kernels): the
# reduction dimension cut into this many slices, each slice a thread block of its own, the
# partial outputs summed by a second kernel. Powers of two up to 4,096, which at the smallest
# tile is more than three waves of the largest GPU here (an H100's 132 SMs x 8 blocks).
SPLIT_FACTORS: tuple[int, ...] = tuple(2 ** power for power in range(13))

# Kernels of one op: the forward, and backward data + backward weights for layers with weights
# (one for those without); a fused elementwise op (BatchNorm, ReLU) runs as its own kernel
# each way in eager PyTorch; the SGD update runs one kernel per weight tensor (the per-tensor
# update of the frameworks the papers used).
FORWARD_KERNELS = 1
BACKWARD_KERNELS_WITH_WEIGHTS = 2
BACKWARD_KERNELS_WITHOUT_WEIGHTS = 1
KERNELS_PER_FUSED_OP = 2

# cuDNN runs 3x3 stride-1 convolutions by Winograd's minimal filtering (cuDNN 5 release notes,
# 2016: Winograd forward and backward data for 3x3 filters): F(2x2, 3x3) computes a 2x2 output
# tile with 16 multiplies instead of 36, 2.25x fewer (Lavin and Gray, "Fast Algorithms for
# Convolutional Neural Networks", CVPR 2016, section 4). cuDNN 6 filters backward weights of
# these layers by Winograd or FFT too (DeepBench, below), so all three passes use the reduction.
WINOGRAD_MULTIPLY_REDUCTION = 36 / 16

# What each kind of convolution kernel sustains as a share of a large SGEMM's rate on the same
# GPU. Source: Baidu DeepBench, results/train/DeepBench_NV_P100.xlsx, sheet "Results FP32"
# (github.com/baidu-research/DeepBench, CUDA 8.0.88, cuDNN 6.0.21, a PCIe P100). The reference
# is the median of the sheet's 52 GEMMs of >= 5e10 multiply-adds with M, N >= 512 (rows 23-166):
# 8.93 TFLOP/s. Each share is the median, over the sheet's convolution rows (175-268) that fill
# at least one wave of this model's 128 x 128 tiles on the P100's 112 slots and read more than 3
# channels (so neither the wave model's size effect nor the input layer's tiny reduction is
# counted twice), of that column's TERAFLOPS over 8.93:
# - forward, implicit GEMM (Forward Algorithm IMPLICIT_(PRECOMP_)GEMM): 23 rows, 0.48-0.90
CONV_FORWARD_EFFICIENCY = 0.73
# - forward and backward data of the rows run by WINOGRAD(_NONFUSED) or FFT, per real multiply
#   (TERAFLOPS / WINOGRAD_MULTIPLY_REDUCTION): 13 rows, 0.43-1.09
WINOGRAD_EFFICIENCY = 0.63
# - backward weights of those rows (cuDNN 6 also filters them by a fast algorithm:
#   "BWD PARMS TERAFLOPS" up to 2.49x a GEMM's rate in direct multiplies), per real multiply:
#   13 rows, 0.19-1.11
WINOGRAD_BACKWARD_WEIGHTS_EFFICIENCY = 0.81
# - backward data ("BWD INPUTS TERAFLOPS") of the implicit-GEMM rows of stride 1: 13 rows,
#   0.47-0.87; of stride 2: 10 rows, 0.19-0.72 (the sheet has no larger stride; the strided
#   share prices every stride > 1)
CONV_BACKWARD_DATA_EFFICIENCY = 0.62
STRIDED_CONV_BACKWARD_DATA_EFFICIENCY = 0.31
# - backward weights ("BWD PARMS TERAFLOPS") of the implicit-GEMM rows: 23 rows, 0.27-0.87
CONV_BACKWARD_WEIGHTS_EFFICIENCY = 0.50
# A fully connected layer's three passes are plain SGEMMs: the reference itself.
GEMM_EFFICIENCY = 1.0

# Layer kinds that run as GEMMs (implicit GEMM for convolutions); the rest are memory-bound.
GEMM_KINDS = frozenset({"conv", "linear"})
# A view: no kernel, no traffic.
FREE_KINDS = frozenset({"input", "flatten"})


class Gemm(NamedTuple):
    """One GEMM kernel's problem: an output of rows x columns, each a sum over depth products
    (arrays: one entry per tile)."""

    rows: np.ndarray
    columns: np.ndarray
    depth: np.ndarray


def layer_gemms(rows: np.ndarray, out_channels: np.ndarray, in_rows: np.ndarray,
                in_channels: int, kernel_area: int, groups: int = 1, stride_area: int = 1,
                ) -> tuple[Gemm, Gemm, Gemm]:
    """The forward, backward data and backward weights GEMMs of a convolution (implicit GEMM)
    or a fully connected layer (kernel_area 1) whose tile has `rows` output positions over
    `out_channels` channels and reads `in_rows` input positions of `in_channels` channels.
    Backward data sums, per input position, over the output positions whose windows cover it:
    out channels x kernel_area / stride_area of them (a stride of s skips all but 1/s of a
    window's taps along each dimension)."""
    per_group_out = np.maximum(np.asarray(out_channels) // groups, 1)
    reduction = max(in_channels // groups, 1) * kernel_area
    return (Gemm(rows, out_channels, np.full(np.shape(rows), reduction)),
            Gemm(in_rows, np.full(np.shape(in_rows), in_channels),
                 np.maximum(per_group_out * kernel_area // stride_area, 1)),
            Gemm(out_channels, np.full(np.shape(out_channels), reduction), rows))


def transposed_gemms(layer: Layer, out_elements: np.ndarray, out_channels: np.ndarray,
                     input_elements: np.ndarray) -> tuple[Gemm, Gemm, Gemm]:
    """A transposed convolution's forward, backward data and backward weights GEMMs: those of
    the convolution it is the adjoint of (from its output to its input), the forward and the
    backward data swapped. Its channels are whole (graph.py), one count per tile."""
    geometry = layer.geometry
    assert geometry is not None
    in_channels = as_view(layer.input_shapes[0])[1]
    channels = int(np.max(out_channels))
    adjoint = layer_gemms(np.asarray(input_elements) // in_channels,
                          np.full(np.shape(out_channels), in_channels),
                          out_elements // np.maximum(out_channels, 1), channels,
                          math.prod(geometry.kernel), geometry.groups,
                          math.prod(geometry.stride))
    return adjoint[1], adjoint[0], adjoint[2]


def winograd(layer: Layer) -> bool:
    """Whether the layer is a convolution that cuDNN runs by Winograd: 3x3, stride 1, no
    dilation, no groups."""
    geometry = layer.geometry
    return (layer.kind == "conv" and geometry is not None and not geometry.transposed
            and geometry.kernel == (3, 3) and geometry.stride == (1, 1)
            and geometry.dilation == (1, 1) and geometry.groups == 1)


def convolution_efficiencies(by_winograd: bool, strided: bool) -> tuple[float, float, float]:
    """Shares of a large GEMM's rate that a convolution's forward, backward data and backward
    weights kernels sustain (DeepBench, P100: see CONV_FORWARD_EFFICIENCY)."""
    if by_winograd:
        return WINOGRAD_EFFICIENCY, WINOGRAD_EFFICIENCY, WINOGRAD_BACKWARD_WEIGHTS_EFFICIENCY
    return (CONV_FORWARD_EFFICIENCY,
            STRIDED_CONV_BACKWARD_DATA_EFFICIENCY if strided else CONV_BACKWARD_DATA_EFFICIENCY,
            CONV_BACKWARD_WEIGHTS_EFFICIENCY)


def op_kind_efficiencies(layer: Layer) -> tuple[float, float, float]:
    """The layer's forward, backward data and backward weights shares of a large GEMM's rate."""
    if layer.kind != "conv":
        return GEMM_EFFICIENCY, GEMM_EFFICIENCY, GEMM_EFFICIENCY
    assert layer.geometry is not None  # a conv layer has its geometry
    return convolution_efficiencies(winograd(layer),
                                    any(stride != 1 for stride in layer.geometry.stride))


def blocks_per_multiprocessor(tile: tuple[int, int]) -> int:
    """Blocks of this tile one SM holds at once: its register file over each block's share."""
    threads = tile[0] * tile[1] // OUTPUTS_PER_THREAD
    return REGISTERS_PER_MULTIPROCESSOR // (threads * REGISTERS_PER_THREAD)


class DeviceModel:
    """t_c of one tile on a GPU with `multiprocessors` SMs, a peak of `flops_per_second`
    (already times the platform's percent of peak), `bytes_per_second` of memory bandwidth
    and `kernel_latency` seconds per launch, its host needing `host_layer_seconds` per layer
    and `host_op_seconds` per op to drive a tile. Every method takes numpy arrays with one entry
    per tile, so the search prices every config of a layer in one call. `tile_shapes` and
    `split_factors` are the GEMM kernels it may pick from (TILE_SHAPES, SPLIT_FACTORS);
    without `split_k` the forward and backward-data GEMMs run unsplit (the device's library
    splits only backward weights)."""

    def __init__(self, multiprocessors: int, flops_per_second: float, bytes_per_second: float,
                 kernel_latency: float,
                 tile_shapes: tuple[tuple[int, int], ...] = TILE_SHAPES,
                 split_factors: tuple[int, ...] = SPLIT_FACTORS, split_k: bool = True,
                 host_layer_seconds: float = 0.0, host_op_seconds: float = 0.0) -> None:
        self.multiprocessors = multiprocessors
        self.host_layer_seconds = host_layer_seconds
        self.host_op_seconds = host_op_seconds
        self.flops_per_second = flops_per_second
        self.bytes_per_second = bytes_per_second
        self.kernel_latency = kernel_latency
        self.tile_shapes = tile_shapes
        self.split_factors = split_factors
        self.output_split_factors = split_factors if split_k else (1,)
        # per candidate tile shape (a column): its rows, columns and the blocks all SMs hold
        self._tile_rows = np.array([tile[0] for tile in tile_shapes], dtype=np.float64)[:, None]
        self._tile_columns = np.array([tile[1] for tile in tile_shapes],
                                      dtype=np.float64)[:, None]
        self._slots = np.array([multiprocessors * blocks_per_multiprocessor(tile)
                                for tile in tile_shapes], dtype=np.float64)[:, None]

    def gemm_kernel_seconds(self, flops: np.ndarray, gemm: Gemm, share: float,
                            split_factors: tuple[int, ...] | None = None) -> np.ndarray:
        """Each candidate kernel's time for the GEMM, shape (tiles, len(tile_shapes),
        len(split_factors)), split_factors by default the model's. A kernel of tile tm x tn
        split s ways runs ceil(rows / tm) x ceil(columns / tn) x s blocks, each over a slice of
        ceil(depth / s) (at least TILE_DEPTH), in waves of the blocks the SMs hold at once (a
        kernel of 1.1 waves costs 2: Habitat's wave scaling, Yu et al., USENIX ATC 2021,
        section 3.2), each wave as long as one block's work at `share` of a large GEMM's rate.
        A block loads tm + tn elements per step of depth for tm x tn multiply-adds (arithmetic
        intensity tm tn / (tm + tn)) and never runs faster than those loads at memory
        bandwidth: the cost of a small tile's lower reuse (a bound: it counts no reuse between
        blocks through L2). A split kernel writes s partial outputs of rows x columns and a
        second kernel reads them back and sums them, at memory bandwidth, plus that kernel's
        launch."""
        rows, columns, depth = (np.maximum(np.asarray(size, dtype=np.float64), 1)[..., None, None]
                                for size in gemm)
        flops = np.asarray(flops, dtype=np.float64)[..., None, None]
        tile_rows, tile_columns, slots = self._tile_rows, self._tile_columns, self._slots
        splits = np.array(split_factors or self.split_factors, dtype=np.float64)[None, :]
        # flops per multiply-add: 2 for a direct GEMM, fewer where Winograd filters the input
        per_multiply_add = flops / (rows * columns * depth)
        slice_depth = np.maximum(np.ceil(depth / splits), TILE_DEPTH)
        output_blocks = np.ceil(rows / tile_rows) * np.ceil(columns / tile_columns)
        blocks = output_blocks * splits
        # a partial tile costs a whole one, but a dimension narrower than the tile runs at its
        # own width (as the narrow kernels libraries keep for it do)
        block_flops = (per_multiply_add * np.minimum(tile_rows, rows)
                       * np.minimum(tile_columns, columns) * slice_depth)
        # a block loads tm + tn elements per 2 tm tn flops: never faster than that at bandwidth
        seconds_per_flop = np.maximum(
            1 / (self.flops_per_second * share),
            (tile_rows + tile_columns) * BYTES_PER_ELEMENT
            / (2 * tile_rows * tile_columns * self.bytes_per_second))
        compute = np.ceil(blocks / slots) * slots * block_flops * seconds_per_flop
        reduction = np.where(splits > 1, 2 * splits * rows * columns * BYTES_PER_ELEMENT
                             / self.bytes_per_second + self.kernel_latency, 0.0)
        return compute + reduction

    def gemm_seconds(self, flops: np.ndarray, gemm: Gemm, share: float = GEMM_EFFICIENCY,
                     split_factors: tuple[int, ...] | None = None) -> np.ndarray:
        """The GEMM at its fastest candidate kernel: what a library's heuristic picks."""
        return self.gemm_kernel_seconds(flops, gemm, share, split_factors).min(axis=(-2, -1))

    def layer_gemm_seconds(self, flops: np.ndarray, gemms: tuple[Gemm, Gemm, Gemm],
                           shares: tuple[float, float, float],
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A layer's forward, backward data and backward weights GEMMs (layer_gemms), each
        at its op kind's share. Backward weights always may split its long sum over the rows
        (cuDNN's backward-filter algorithms reduce it in pieces); the other two only where the
        device's library splits GEMMs (`split_k`)."""
        forward, backward_data, backward_weights = gemms
        return (self.gemm_seconds(flops, forward, shares[0], self.output_split_factors),
                self.gemm_seconds(flops, backward_data, shares[1], self.output_split_factors),
                self.gemm_seconds(flops, backward_weights, shares[2]))

    def chosen_kernel(self, flops: float, gemm: Gemm, share: float = GEMM_EFFICIENCY,
                      ) -> tuple[tuple[int, int], int]:
        """The tile shape and split factor the model picks for one GEMM."""
        seconds = self.gemm_kernel_seconds(np.float64(flops), gemm, share).reshape(
            len(self.tile_shapes), len(self.split_factors))
        tile, split = np.unravel_index(np.argmin(seconds), seconds.shape)
        return self.tile_shapes[tile], self.split_factors[split]

    def pass_seconds(self, layer: Layer, out_elements: np.ndarray, out_channels: np.ndarray,
                     input_elements: np.ndarray, param_elements: np.ndarray) -> np.ndarray:
        """Forward + backward of tiles with `out_elements` outputs over `out_channels`
        channels, reading `input_elements` (halos included) and holding `param_elements`: the
        kernels' time, or the host's floor where that is longer."""
        out_elements = np.asarray(out_elements)
        if layer.kind == "input":
            return np.zeros(np.shape(out_elements))
        host = self.host_layer_seconds + self.host_op_seconds * (1 + len(layer.fused))
        return np.maximum(self._kernel_seconds(layer, out_elements, out_channels,
                                               input_elements, param_elements), host)

    def _kernel_seconds(self, layer: Layer, out_elements: np.ndarray, out_channels: np.ndarray,
                        input_elements: np.ndarray, param_elements: np.ndarray) -> np.ndarray:
        if layer.kind in FREE_KINDS:
            return np.zeros(np.shape(out_elements))
        fraction = out_elements / np.prod(layer.output_shape)
        forward_flops = layer.flops * fraction
        fused = len(layer.fused)
        # each fused op reads and writes the output once per pass
        fused_bytes = fused * 2 * 2 * out_elements * BYTES_PER_ELEMENT
        if layer.kind in GEMM_KINDS:
            out_channels = np.asarray(out_channels)
            in_channels = as_view(layer.input_shapes[0])[1]
            geometry = layer.geometry
            gemms = layer_gemms(
                out_elements // np.maximum(out_channels, 1), out_channels,
                np.asarray(input_elements) // in_channels, in_channels,
                math.prod(geometry.kernel) if geometry else 1,
                geometry.groups if geometry else 1,
                math.prod(geometry.stride) if geometry else 1)
            if geometry is not None and geometry.transposed:
                gemms = transposed_gemms(layer, out_elements, out_channels, input_elements)
            filtered = forward_flops / (WINOGRAD_MULTIPLY_REDUCTION if winograd(layer) else 1)
            compute = sum(self.layer_gemm_seconds(filtered, gemms, op_kind_efficiencies(layer)))
            passes = 3
            kernels = FORWARD_KERNELS + BACKWARD_KERNELS_WITH_WEIGHTS
        else:
            passes = 3 if layer.param_count else 2
            compute = forward_flops * passes / self.flops_per_second
            kernels = FORWARD_KERNELS + (BACKWARD_KERNELS_WITH_WEIGHTS if layer.param_count
                                         else BACKWARD_KERNELS_WITHOUT_WEIGHTS)
        memory = ((out_elements + np.asarray(input_elements) + np.asarray(param_elements))
                  * BYTES_PER_ELEMENT * passes / self.bytes_per_second)
        kernels += KERNELS_PER_FUSED_OP * fused
        return (np.maximum(compute, memory) + fused_bytes / self.bytes_per_second
                + kernels * self.kernel_latency)

    def update_seconds(self, layer: Layer, update_bytes: np.ndarray,
                       param_elements: np.ndarray) -> np.ndarray:
        """The SGD update: `update_bytes` at memory bandwidth plus one launch per weight
        tensor where the tile holds weights."""
        launches = np.where(np.asarray(param_elements) > 0, len(layer.param_shapes), 0)
        return update_bytes / self.bytes_per_second + launches * self.kernel_latency
