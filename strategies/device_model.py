"""What a GPU's kernels do with a tile of work: the analytic t_c behind `--analytic`.

A roofline (FLOPs / peak, bytes / bandwidth) makes a tile's time fall in proportion to its
size, so spreading a layer over more devices always pays. Real kernels do not scale that way
once the work is small (Jia et al. 2018, Fig. 3: a layer's time stops falling as its degree
grows). Three effects cause it, and this model prices each one from published device figures:

- Wave quantization (Habitat, Yu et al., USENIX ATC 2021, section 3.2, "wave scaling"): a GEMM
  or an implicit-GEMM convolution runs as thread blocks, one output tile of TILE_EDGE x
  TILE_EDGE each, at most `slots` of them at once (SMs x blocks per SM); the kernel takes
  ceil(blocks / slots) waves, so a kernel of 1.1 waves costs 2, and a kernel with fewer blocks
  than slots leaves SMs idle.
- A latency floor: every kernel launch costs at least `kernel_latency`, and one training op is
  several kernels (forward, backward data, backward weights, each fused elementwise op's two
  passes, one update per weight tensor).
- Memory-bound ops (pooling, elementwise, BatchNorm, concat, the SGD update) move their tensors
  at the device's memory bandwidth.

A large GEMM's share of peak is the cluster's `compute_efficiency`: PALEO's "platform percent
of peak" (Qi, Sparks, Talwalkar, ICLR 2017, section 3.1.1), one fraction per platform. The
other GEMM-like kernels run at a fixed share of a large GEMM's rate per op kind (conv forward,
conv backward data, conv backward weights, by algorithm and stride), measured by Baidu's
DeepBench on a P100 (CONV_FORWARD_EFFICIENCY and the shares beside it). Below a full wave the
efficiency falls further with the work size through the wave count, which is how it depends on
size here.

No constant in this module or in the presets was fitted to a result it is meant to reproduce;
each has its source beside it. None was checked against CUDA-event profiles of real tiles yet
(no GPU was available when it was written): `layerwise profile` on a GPU measures the real
ones, and a profile replaces this model wherever one is given.
"""

from __future__ import annotations

import numpy as np

from strategies.graph import BYTES_PER_ELEMENT, Layer
from strategies.tiles import as_4d

# The output tile of one thread block of an fp32 GEMM: 128 x 128, computed by 256 threads of
# 8 x 8 outputs each (CUTLASS's default SGEMM threadblock shape, NVIDIA CUTLASS documentation,
# "Efficient GEMM in CUDA"; cuDNN's implicit-GEMM convolutions use the same tiling).
TILE_EDGE = 128
THREADS_PER_TILE = 256
# 64 accumulators per thread plus double-buffered A and B fragments and addresses: the 128
# registers per thread of Scott Gray's maxas SGEMM (github.com/NervanaSystems/maxas, wiki
# "SGEMM"), the register budget of the fastest published fp32 SGEMM of the period.
REGISTERS_PER_THREAD = 128
# 65,536 32-bit registers per SM on every GPU here: Kepler GK110 whitepaper (2012), Tesla P100
# whitepaper (2016), Tesla V100 whitepaper (2017), H100 Tensor Core GPU architecture (2022).
REGISTERS_PER_MULTIPROCESSOR = 65_536
# Two 128 x 128 tiles resident per SM at once.
BLOCKS_PER_MULTIPROCESSOR = REGISTERS_PER_MULTIPROCESSOR // (THREADS_PER_TILE
                                                             * REGISTERS_PER_THREAD)

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


def waves(blocks: np.ndarray, slots: int) -> np.ndarray:
    """ceil(blocks / slots): the waves a kernel of `blocks` thread blocks takes."""
    return -(-blocks // slots)


def tiles(rows: np.ndarray, columns: np.ndarray | int) -> np.ndarray:
    """Thread blocks of a GEMM whose output is rows x columns."""
    return -(-np.asarray(rows) // TILE_EDGE) * -(-np.asarray(columns) // TILE_EDGE)


def winograd(layer: Layer) -> bool:
    """Whether the layer is a convolution that cuDNN runs by Winograd: 3x3, stride 1, no
    dilation, no groups."""
    geometry = layer.geometry
    return (layer.kind == "conv" and geometry is not None and geometry.kernel == (3, 3)
            and geometry.stride == (1, 1) and geometry.dilation == (1, 1) and geometry.groups == 1)


def op_kind_efficiencies(layer: Layer) -> tuple[float, float, float]:
    """Shares of a large GEMM's rate that the layer's forward, backward data and backward
    weights kernels sustain (DeepBench, P100: see CONV_FORWARD_EFFICIENCY)."""
    if layer.kind != "conv":
        return GEMM_EFFICIENCY, GEMM_EFFICIENCY, GEMM_EFFICIENCY
    if winograd(layer):
        return WINOGRAD_EFFICIENCY, WINOGRAD_EFFICIENCY, WINOGRAD_BACKWARD_WEIGHTS_EFFICIENCY
    assert layer.geometry is not None  # a conv layer has its geometry
    strided = layer.geometry.stride != (1, 1)
    return (CONV_FORWARD_EFFICIENCY,
            STRIDED_CONV_BACKWARD_DATA_EFFICIENCY if strided else CONV_BACKWARD_DATA_EFFICIENCY,
            CONV_BACKWARD_WEIGHTS_EFFICIENCY)


class DeviceModel:
    """t_c of one tile on a GPU with `multiprocessors` SMs, a peak of `flops_per_second`
    (already times the platform's percent of peak), `bytes_per_second` of memory bandwidth
    and `kernel_latency` seconds per launch. Every method takes numpy arrays with one entry
    per tile, so the search prices every config of a layer in one call."""

    def __init__(self, multiprocessors: int, flops_per_second: float, bytes_per_second: float,
                 kernel_latency: float) -> None:
        self.slots = multiprocessors * BLOCKS_PER_MULTIPROCESSOR
        self.flops_per_second = flops_per_second
        self.bytes_per_second = bytes_per_second
        self.kernel_latency = kernel_latency

    def gemm_seconds(self, flops: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """A kernel of `flops` spread evenly over `blocks` thread blocks: whole waves of
        `slots` blocks, each wave as long as one block's share of the work at full rate."""
        blocks = np.maximum(blocks, 1)
        return flops * (waves(blocks, self.slots) * self.slots / blocks) / self.flops_per_second

    def weight_gradient_seconds(self, flops: np.ndarray, out_channels: np.ndarray,
                                reduction: int, rows: np.ndarray) -> np.ndarray:
        """Backward weights is a GEMM with a small output (out channels x reduction) and a long
        sum over the tile's rows. Its kernels split the sum (split-K: CUTLASS's
        "GemmSplitKParallel", cuDNN's backward-filter algorithms) into as many pieces as fill
        whole waves, so it loses nothing to quantization unless even one split per TILE_EDGE
        rows leaves a wave part-empty."""
        blocks = tiles(out_channels, reduction) * -(-np.asarray(rows) // TILE_EDGE)
        return flops * np.maximum(1.0, self.slots / np.maximum(blocks, 1)) / self.flops_per_second

    def pass_seconds(self, layer: Layer, out_elements: np.ndarray, out_channels: np.ndarray,
                     input_elements: np.ndarray, param_elements: np.ndarray) -> np.ndarray:
        """Forward + backward of tiles with `out_elements` outputs over `out_channels`
        channels, reading `input_elements` (halos included) and holding `param_elements`."""
        out_elements = np.asarray(out_elements)
        if layer.kind in FREE_KINDS:
            return np.zeros(np.shape(out_elements))
        fraction = out_elements / np.prod(layer.output_shape)
        forward_flops = layer.flops * fraction
        fused = len(layer.fused)
        # each fused op reads and writes the output once per pass
        fused_bytes = fused * 2 * 2 * out_elements * BYTES_PER_ELEMENT
        if layer.kind in GEMM_KINDS:
            rows = out_elements // np.maximum(out_channels, 1)
            in_channels = as_4d(layer.input_shapes[0])[1]
            in_rows = np.asarray(input_elements) // in_channels
            groups = layer.geometry.groups if layer.geometry else 1
            kernel = layer.geometry.kernel if layer.geometry else (1, 1)
            reduction = in_channels // groups * kernel[0] * kernel[1]
            filtered = forward_flops / (WINOGRAD_MULTIPLY_REDUCTION if winograd(layer) else 1)
            forward, backward_data, backward_weights = op_kind_efficiencies(layer)
            compute = (self.gemm_seconds(filtered, tiles(rows, out_channels)) / forward
                       + self.gemm_seconds(filtered, tiles(in_rows, in_channels)) / backward_data
                       + self.weight_gradient_seconds(filtered, out_channels, reduction,
                                                      rows) / backward_weights)
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
