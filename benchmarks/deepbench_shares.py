"""Re-derive the device model's per-op-kind shares (strategies/hardware/device_model.py) from a
DeepBench training results workbook, and print the model's error against the workbook's measured
GEMMs and convolutions.

    git clone https://github.com/baidu-research/DeepBench
    .venv/bin/python benchmarks/deepbench_shares.py DeepBench/results/train/DeepBench_NV_P100.xlsx
    .venv/bin/python benchmarks/deepbench_shares.py DeepBench/results/train/DeepBench_NV_V100.xlsx \
        --multiprocessors 80 --bandwidth 900

Reads the sheet "Results FP32" (stdlib only: an .xlsx is zipped XML) and prints the reference,
the median TFLOP/s of the large GEMMs (>= 5e10 multiply-adds, M and N >= 512), then each
convolution share: the median, over the rows that fill at least one wave of the model's
128 x 128 tiles (2 blocks per SM) and read more than 3 channels, of the column's TERAFLOPS over
the reference; rows run by Winograd or FFT per real multiply (over WINOGRAD_MULTIPLY_REDUCTION).

Then the model's relative error, (modelled - measured) / measured time, per op kind over every
GEMM and convolution row of the sheet, for the model restricted to one 128 x 128 tile per block
and split-K in backward weights only (the fixed tile it priced before choosing kernels) and for
the model that picks each GEMM's tile shape and split-K factor. The device is the workbook's: a
large GEMM runs at the reference rate, with `--multiprocessors` SMs, `--bandwidth` GB/s and
`--latency` us per launch.
"""

from __future__ import annotations

import argparse
import statistics
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from layerwise.strategies.hardware.device_model import (
    GEMM_EFFICIENCY,
    TILE_SHAPES,
    WINOGRAD_MULTIPLY_REDUCTION,
    DeviceModel,
    Gemm,
    blocks_per_multiprocessor,
    convolution_efficiencies,
    layer_gemms,
)
from layerwise.strategies.model.graph import BYTES_PER_ELEMENT

SHEET = "Results FP32"
NAMESPACE = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
LARGE_GEMM_MULTIPLY_ADDS = 5e10
LARGE_GEMM_EDGE = 512
OP_KINDS = ("GEMM", "conv forward", "conv backward data", "conv backward weights")


class GemmRow(NamedTuple):
    m: int
    n: int
    k: int
    seconds: float
    teraflops: float


class ConvolutionRow(NamedTuple):
    width: int
    height: int
    channels: int
    batch: int
    filters: int
    filter_height: int
    filter_width: int
    pad_height: int
    pad_width: int
    stride: int
    seconds: tuple[float, float, float]  # forward, backward data, backward weights
    teraflops: tuple[float, float, float]
    algorithm: str

    @property
    def output_height(self) -> int:
        return (self.height + 2 * self.pad_height - self.filter_height) // self.stride + 1

    @property
    def output_width(self) -> int:
        return (self.width + 2 * self.pad_width - self.filter_width) // self.stride + 1


def sheet_rows(path: Path, sheet: str) -> list[tuple[int, list[str]]]:
    """(row number, non-empty cell texts) of one sheet of an .xlsx workbook."""
    with zipfile.ZipFile(path) as book:
        shared = [''.join(text.text or '' for text in item.iter(f"{NAMESPACE}t"))
                  for item in ET.fromstring(book.read("xl/sharedStrings.xml"))]
        names = [entry.get("name") for entry in
                 ET.fromstring(book.read("xl/workbook.xml")).find(f"{NAMESPACE}sheets")]
        root = ET.fromstring(book.read(f"xl/worksheets/sheet{names.index(sheet) + 1}.xml"))
    rows = []
    for row in root.iter(f"{NAMESPACE}row"):
        cells = []
        for cell in row.findall(f"{NAMESPACE}c"):
            value = cell.find(f"{NAMESPACE}v")
            if value is not None and value.text:
                cells.append(shared[int(value.text)] if cell.get("t") == "s" else value.text)
        rows.append((int(row.get("r")), cells))
    return rows


def numbers(cells: list[str]) -> list[float]:
    """The cells that read as numbers, in order."""
    found = []
    for cell in cells:
        try:
            found.append(float(cell))
        except ValueError:
            continue
    return found


def measured_rows(path: Path) -> tuple[list[GemmRow], list[ConvolutionRow]]:
    """The sheet's GEMM rows (M, N, K, time, TFLOP/s) and convolution rows."""
    gemms: list[GemmRow] = []
    convolutions: list[ConvolutionRow] = []
    section = "gemm"
    for _, cells in sheet_rows(path, SHEET):
        text = " ".join(cells)
        if text.startswith("Convolution"):
            section = "conv"
            continue
        if text.startswith("Recurrent"):
            break
        values = numbers(cells)
        if section == "gemm" and len(values) >= 5:
            m, n, k = (int(value) for value in values[:3])
            gemms.append(GemmRow(m, n, k, values[-2] / 1e3, values[-1]))
        elif section == "conv" and len(values) >= 20 and cells:
            (width, height, channels, batch, filters, filter_height, filter_width, pad_height,
             pad_width, stride, _, forward, backward_data, backward_weights) = values[:14]
            convolutions.append(ConvolutionRow(
                int(width), int(height), int(channels), int(batch), int(filters),
                int(filter_height), int(filter_width), int(pad_height), int(pad_width),
                int(stride), (forward / 1e3, backward_data / 1e3, backward_weights / 1e3),
                tuple(values[17:20]), cells[-1]))
    return gemms, convolutions


def shares(path: Path, multiprocessors: int) -> dict[str, tuple[float, int]]:
    """Each share's (median, rows), and the reference TFLOP/s under "reference"."""
    gemms, convolutions = measured_rows(path)
    kinds: dict[str, list[float]] = {name: [] for name in (
        "conv forward, implicit GEMM", "conv backward data, stride 1",
        "conv backward data, strided", "conv backward weights", "Winograd forward",
        "Winograd backward weights")}
    large_gemms = [row.teraflops for row in gemms
                   if row.m * row.n * row.k >= LARGE_GEMM_MULTIPLY_ADDS
                   and min(row.m, row.n) >= LARGE_GEMM_EDGE]
    reference = statistics.median(large_gemms)
    large = TILE_SHAPES[0]
    slots = multiprocessors * blocks_per_multiprocessor(large)
    for row in convolutions:
        forward, backward_data, backward_weights = row.teraflops
        blocks = (-(-row.batch * row.output_height * row.output_width // large[0])
                  * -(-row.filters // large[1]))
        if blocks < slots or row.channels <= 3:
            continue
        if row.algorithm.startswith("WINOGRAD") or row.algorithm == "FFT":
            kinds["Winograd forward"].append(forward / reference / WINOGRAD_MULTIPLY_REDUCTION)
            kinds["Winograd backward weights"].append(
                backward_weights / reference / WINOGRAD_MULTIPLY_REDUCTION)
            continue
        kinds["conv forward, implicit GEMM"].append(forward / reference)
        kinds["conv backward weights"].append(backward_weights / reference)
        kinds["conv backward data, stride 1" if row.stride == 1
              else "conv backward data, strided"].append(backward_data / reference)
    return {"reference": (reference, len(large_gemms)),
            **{name: (statistics.median(found), len(found)) for name, found in kinds.items()}}


def one(value: int) -> np.ndarray:
    return np.array([value])


def gemm_row_seconds(model: DeviceModel, row: GemmRow) -> float:
    """The model's time for one measured GEMM: its kernel and one launch."""
    gemm = Gemm(one(row.m), one(row.n), one(row.k))
    return float(model.gemm_seconds(one(2 * row.m * row.n * row.k), gemm, GEMM_EFFICIENCY,
                                    model.output_split_factors)[0] + model.kernel_latency)


def convolution_row_seconds(model: DeviceModel, row: ConvolutionRow) -> list[float]:
    """The model's forward, backward data and backward weights times of one measured
    convolution: each pass's GEMM (Winograd for 3x3 stride 1, as the model picks it), never
    faster than the pass's tensors at memory bandwidth, and one launch."""
    rows = row.batch * row.output_height * row.output_width
    kernel_area = row.filter_height * row.filter_width
    by_winograd = (row.filter_height, row.filter_width, row.stride) == (3, 3, 1)
    flops = 2 * rows * row.filters * row.channels * kernel_area / (
        WINOGRAD_MULTIPLY_REDUCTION if by_winograd else 1)
    gemms = layer_gemms(one(rows), one(row.filters), one(row.batch * row.height * row.width),
                        row.channels, kernel_area, 1, row.stride ** 2)
    traffic = ((rows * row.filters + row.batch * row.height * row.width * row.channels
                + row.filters * row.channels * kernel_area) * BYTES_PER_ELEMENT)
    passes = model.layer_gemm_seconds(one(flops), gemms,
                                      convolution_efficiencies(by_winograd, row.stride > 1))
    return [float(max(seconds[0], traffic / model.bytes_per_second) + model.kernel_latency)
            for seconds in passes]


def relative_errors(model: DeviceModel, gemms: list[GemmRow],
                    convolutions: list[ConvolutionRow]) -> dict[str, list[float]]:
    """(modelled - measured) / measured per op kind, one entry per measured row."""
    errors: dict[str, list[float]] = {kind: [] for kind in OP_KINDS}
    for row in gemms:
        errors["GEMM"].append(gemm_row_seconds(model, row) / row.seconds - 1)
    for row in convolutions:
        for kind, modelled, measured in zip(OP_KINDS[1:], convolution_row_seconds(model, row),
                                            row.seconds, strict=True):
            errors[kind].append(modelled / measured - 1)
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workbook", type=Path)
    parser.add_argument("--multiprocessors", type=int, default=56,
                        help="SMs of the workbook's GPU (the P100: 56)")
    parser.add_argument("--bandwidth", type=float, default=732,
                        help="its memory bandwidth in GB/s (the P100: 732)")
    parser.add_argument("--latency", type=float, default=5,
                        help="microseconds per kernel launch (the presets' 5)")
    args = parser.parse_args()
    found = shares(args.workbook, args.multiprocessors)
    for name, (median, rows) in found.items():
        unit = " TFLOP/s" if name == "reference" else ""
        print(f"{name}: {median:.2f}{unit} ({rows} rows)")
    device = (args.multiprocessors, found["reference"][0] * 1e12, args.bandwidth * 1e9,
              args.latency * 1e-6)
    gemms, convolutions = measured_rows(args.workbook)
    before = relative_errors(DeviceModel(*device, tile_shapes=TILE_SHAPES[:1], split_k=False),
                             gemms, convolutions)
    after = relative_errors(DeviceModel(*device), gemms, convolutions)
    print("\nrelative error of the modelled time, (model - measured) / measured:")
    print(f"{'op kind':<22} {'rows':>4}   {'one 128x128 tile: median |e|, worst':>36}"
          f"   {'chosen tile and split-K: median |e|, worst':>43}")
    for kind in OP_KINDS:
        columns = []
        for errors in (before[kind], after[kind]):
            worst = max(errors, key=abs)
            columns.append(f"{statistics.median(abs(e) for e in errors):.2f}, {worst:+.2f}")
        print(f"{kind:<22} {len(before[kind]):>4}   {columns[0]:>36}   {columns[1]:>43}")


if __name__ == "__main__":
    main()
