"""Predicted peak memory per rank (strategies/cost/memory.py) against the peak each rank measured.

    .venv/bin/python benchmarks/bench_memory.py                       # every zoo model
    .venv/bin/python benchmarks/bench_memory.py --models lenet5 alexnet --strategies data owt
    .venv/bin/python benchmarks/bench_memory.py --models cosmoflow2d --image-size 256 --batch 1
    python3 benchmarks/bench_memory.py --nproc 1 --batch-per-device 32 --image-size 224 \
        --models alexnet vgg16 resnet18 --strategies data      # one GPU: the allocator's peak

Each row is one `layerwise train` on --nproc processes (3 steps, float32, small inputs): its
result.json holds the peak each rank measured during its second step (on the CPU the tensors'
peak from torch's profiler, on CUDA the caching allocator's; strategies/runtime/memory_peak.py;
a GPU per process when there are enough), and the run folder's
strategy.json and graph.json give the prediction. Printed: per row the largest rank's
measured and predicted MB, their ratio, and the predicted terms of that rank.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from layerwise.strategies.cost.memory import FLOAT32_BYTES, predicted_memory
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.model.zoo import ZOO
from layerwise.strategies.strategy import Strategy
from layerwise.strategies.training_run import RunResult

LAYERWISE = (sys.executable, "-m", "layerwise")  # also where no `layerwise` script is on PATH
# small inputs each zoo model takes (its pools need some size)
IMAGE_SIZE = {"tiny_cnn": 16, "lenet5": 32, "wide_fc": 16, "cosmoflow2d": 64, "alexnet": 64,
              "vgg16": 32, "resnet18": 32, "resnet50": 32, "resnet101": 32, "resnet152": 32,
              "inception_v3": 75, "cosmoflow3d": 16, "unet3d": 16, "m5": 1024}
STRATEGIES = ("data", "owt", "spatial_h", "spatial", "layerwise")


def measure(model: str, strategy: str, image_size: int, folder: Path,
            args: argparse.Namespace) -> tuple[RunResult, Path] | str:
    """One 3-step run on --nproc processes; its result and folder, or the error line."""
    out = folder / f"{model}-{strategy}-{image_size}"
    finished = subprocess.run(
        [*LAYERWISE, "train", model, "--strategy", strategy, "--nproc", str(args.nproc),
         "--image-size", str(image_size),
         *(("--batch", str(args.batch)) if args.batch is not None
           else ("--batch-per-device", str(args.batch_per_device))),
         "--steps", "3", "--out", str(out), "--json"], capture_output=True, text=True,
        check=False)
    if finished.returncode != 0:
        return finished.stderr.strip().splitlines()[-1] if finished.stderr.strip() else "failed"
    return RunResult.load(out / "result.json"), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(ZOO))
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--image-size", type=int, default=None,
                        help="one input size for every model (default: each model's small one)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--batch-per-device", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None,
                        help="a global batch instead (it may be below --nproc)")
    args = parser.parse_args()
    console = Console(width=200)
    batch = (f"a global batch of {args.batch}" if args.batch is not None
             else f"{args.batch_per_device} images each")
    table = Table(title=f"peak memory per rank, {args.nproc} processes, {batch}, float32: "
                        "measured against predicted (the largest rank)")
    for column in ("model", "strategy", "input", "measured MB", "predicted MB",
                   "measured / predicted", "weights", "grads", "momentum", "buckets", "kept",
                   "saved", "inputs", "backward at", "still held", "pending grads",
                   "workspace"):
        table.add_column(column, justify="left" if column in ("model", "strategy", "backward at")
                         else "right")
    with tempfile.TemporaryDirectory(prefix="layerwise-bench-memory-") as folder:
        for model in args.models:
            for strategy in args.strategies:
                size = args.image_size or IMAGE_SIZE[model]
                outcome = measure(model, strategy, size, Path(folder), args)
                if isinstance(outcome, str):
                    console.print(f"{model} {strategy}: {outcome}", highlight=False)
                    table.add_row(model, strategy, str(size), "-", "-", outcome)
                    continue
                result, out = outcome
                graph = LayerGraph.model_validate_json((out / "graph.json").read_text())
                plan = Strategy.load(out / "strategy.json")
                predicted = predicted_memory(graph, plan.assignment(), result.nproc,
                                             FLOAT32_BYTES,
                                             momentum=result.settings.momentum != 0,
                                             recompute=plan.recompute)
                rank = max(range(result.nproc), key=lambda r: result.peak_memory_bytes_per_rank[r])
                measured, device = result.peak_memory_bytes_per_rank[rank], predicted[rank]
                console.print(f"{model} {strategy}: measured {measured / 1e6:.1f} MB, predicted "
                              f"{device.peak / 1e6:.1f} MB", highlight=False)  # before any limit
                table.add_row(model, strategy, str(size), f"{measured / 1e6:.1f}",
                              f"{device.peak / 1e6:.1f}", f"{measured / device.peak:.2f}",
                              *(f"{getattr(device, term) / 1e6:.1f}" for term in (
                                  "weights", "gradients", "momentum", "buckets", "kept",
                                  "saved", "inputs")), device.backward_layer,
                              *(f"{getattr(device, term) / 1e6:.1f}" for term in (
                                  "backward_activations", "pending_gradients", "workspace")))
    console.print(table)


if __name__ == "__main__":
    main()
