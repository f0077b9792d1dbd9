"""Re-derive the device model's per-op-kind shares (strategies/device_model.py) from a DeepBench
training results workbook.

    git clone https://github.com/baidu-research/DeepBench
    .venv/bin/python benchmarks/deepbench_shares.py DeepBench/results/train/DeepBench_NV_P100.xlsx

Reads the sheet "Results FP32" (stdlib only: an .xlsx is zipped XML) and prints the reference,
the median TFLOP/s of the large GEMMs (>= 5e10 multiply-adds, M and N >= 512), then each
convolution share: the median, over the rows that fill at least one wave of the model's
128 x 128 tiles on `--slots` blocks at once (112 on a P100) and read more than 3 channels, of the
column's TERAFLOPS over the reference; rows run by Winograd or FFT per real multiply (over
WINOGRAD_MULTIPLY_REDUCTION).
"""

from __future__ import annotations

import argparse
import statistics
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

from strategies.device_model import TILE_EDGE, WINOGRAD_MULTIPLY_REDUCTION

SHEET = "Results FP32"
NAMESPACE = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
LARGE_GEMM_MULTIPLY_ADDS = 5e10
LARGE_GEMM_EDGE = 512


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


def shares(path: Path, slots: int) -> dict[str, tuple[float, int]]:
    """Each share's (median, rows), and the reference TFLOP/s under "reference"."""
    gemms: list[float] = []
    kinds: dict[str, list[float]] = {name: [] for name in (
        "conv forward, implicit GEMM", "conv backward data, stride 1",
        "conv backward data, strided", "conv backward weights", "Winograd forward",
        "Winograd backward weights")}
    section = "gemm"
    convolutions = []
    for _, cells in sheet_rows(path, SHEET):
        text = " ".join(cells)
        if text.startswith("Convolution"):
            section = "conv"
            continue
        if text.startswith("Recurrent"):
            break
        values = numbers(cells)
        if section == "gemm" and len(values) >= 4:
            m, n, k = values[:3]
            if m * n * k >= LARGE_GEMM_MULTIPLY_ADDS and min(m, n) >= LARGE_GEMM_EDGE:
                gemms.append(values[-1])
        elif section == "conv" and len(values) >= 20 and cells:
            convolutions.append((values[:20], cells[-1]))
    reference = statistics.median(gemms)
    for values, algorithm in convolutions:
        (_, _, channels, batch, filters, _, _, _, _, stride, _, _, _, _, p, q, _,
         forward, backward_data, backward_weights) = values
        blocks = -(-batch * p * q // TILE_EDGE) * -(-filters // TILE_EDGE)
        if blocks < slots or channels <= 3:
            continue
        if algorithm.startswith("WINOGRAD") or algorithm == "FFT":
            kinds["Winograd forward"].append(forward / reference / WINOGRAD_MULTIPLY_REDUCTION)
            kinds["Winograd backward weights"].append(
                backward_weights / reference / WINOGRAD_MULTIPLY_REDUCTION)
            continue
        kinds["conv forward, implicit GEMM"].append(forward / reference)
        kinds["conv backward weights"].append(backward_weights / reference)
        kinds["conv backward data, stride 1" if stride == 1
              else "conv backward data, strided"].append(backward_data / reference)
    return {"reference": (reference, len(gemms)),
            **{name: (statistics.median(found), len(found)) for name, found in kinds.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workbook", type=Path)
    parser.add_argument("--slots", type=int, default=112,
                        help="thread blocks resident at once (the P100: 56 SMs x 2)")
    args = parser.parse_args()
    for name, (median, rows) in shares(args.workbook, args.slots).items():
        unit = " TFLOP/s" if name == "reference" else ""
        print(f"{name}: {median:.2f}{unit} ({rows} rows)")


if __name__ == "__main__":
    main()
