"""What recomputing costs and frees, measured against its prediction, side by side in one run.

    .venv/bin/python benchmarks/bench_recompute.py                      # resnet18, 2 processes
    .venv/bin/python benchmarks/bench_recompute.py --profile            # t_c measured here
    .venv/bin/python benchmarks/bench_recompute.py --model resnet50 --image-size 64
    python3 benchmarks/bench_recompute.py --nproc 1 --image-size 224 --batch 32 \\
        --cluster h200x8                                                 # one GPU

For one model it trains a plan twice on --nproc processes (--strategy, `data` by default): as it
stands, and with every layer that saves tensors for its backward (all but the output) recomputed,
the strategy file's `recompute` list. Both runs take --steps steps and report the median step and
each rank's peak memory (the allocator's peak on CUDA, the step's tensors on the CPU); the memory
model (strategies/cost/memory.py) and Eq. 1 (strategies/cost/cost_model.py, the recomputed layers'
forwards added) predict both: t_c from the cluster's device model (a share of each pass for the
forward), or with --profile from a profile measured first on --nproc profilers at once (`layerwise
profile --processes`), whose forwards are timed apart. Printed: per run the
measured and predicted peak of the fullest rank and the step, then the ratios recomputed / kept of
each.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

import layerwise
from layerwise.strategies.cost.memory import tile_terms
from layerwise.strategies.jobs.planning import predicted_peaks
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.model.tiles import config_boxes
from layerwise.strategies.strategy import Strategy


def recomputable(graph: LayerGraph, strategy: Strategy) -> list[str]:
    """Every layer but the input and the output whose ops save something for the backward."""
    assignment = strategy.assignment()
    names = []
    for layer in graph.layers:
        if layer.kind == "input" or layer.name in graph.outputs:
            continue
        config = assignment[layer.name]
        if any(tile_terms(layer, config, box, 4).saved
               for box in config_boxes(layer, config).values()):
            names.append(layer.name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--strategy", default="data")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="the global batch")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--cluster", default="local")
    parser.add_argument("--profile", action="store_true",
                        help="price t_c from a profile measured here first")
    args = parser.parse_args()
    console = Console(width=160)
    shape = {"image_size": args.image_size, "batch": args.batch, "cluster": args.cluster}
    table = Table(title=f"{args.model} under {args.strategy} on {args.nproc} process(es), a "
                        f"global batch of {args.batch} at {args.image_size}x{args.image_size}: "
                        "kept against recomputed")
    for column in ("run", "layers recomputed", "measured MB", "predicted MB",
                   "measured / predicted", "step ms", "predicted step ms"):
        table.add_column(column, justify="left" if column == "run" else "right")
    measured: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="layerwise-bench-recompute-") as folder:
        if args.profile:
            profile = Path(folder) / "profile.json"
            subprocess.run([sys.executable, "-m", "layerwise", "profile", args.model,
                            "--devices", str(args.nproc), "--processes", str(args.nproc),
                            "--image-size", str(args.image_size), "--batch", str(args.batch),
                            "--out", str(profile)], check=True, capture_output=True)
            shape["profile"] = str(profile)
        first = layerwise.train(args.model, args.strategy, nproc=args.nproc, steps=1,
                                out=Path(folder) / "plan", **shape)
        graph = LayerGraph.model_validate_json((Path(folder) / "plan" / "graph.json")
                                               .read_text())
        kept = first.strategy
        recomputed = kept.model_copy(update={"name": f"{kept.name}-recomputed",
                                             "recompute": tuple(recomputable(graph, kept))})
        for name, strategy in (("kept", kept), ("recomputed", recomputed)):
            path = Path(folder) / f"{name}.json"
            strategy.save(path)
            result = layerwise.train(args.model, str(path), nproc=args.nproc,
                                     steps=args.steps, out=Path(folder) / name, **shape)
            peak = max(result.peak_memory_bytes_per_rank)
            predicted = max(predicted_peaks(graph, result.strategy) or [0])
            step = result.step_seconds_median
            measured[name] = (peak, step)
            table.add_row(name, str(len(strategy.recompute)), f"{peak / 1e6:.1f}",
                          f"{predicted / 1e6:.1f}", f"{peak / predicted:.2f}",
                          f"{step * 1e3:.1f}",
                          f"{result.predicted_step_seconds * 1e3:.1f}")
            console.print(f"{name}: measured {peak / 1e6:.1f} MB, predicted "
                          f"{predicted / 1e6:.1f} MB; step {step * 1e3:.1f} ms",
                          highlight=False)
    console.print(table)
    (kept_peak, kept_step), (lean_peak, lean_step) = measured["kept"], measured["recomputed"]
    console.print(f"recomputed / kept: peak {lean_peak / kept_peak:.2f}, step "
                  f"{lean_step / kept_step:.2f}", highlight=False)


if __name__ == "__main__":
    main()
