"""The device model (analytic t_c) against tiles measured on this machine: its error per op kind.

    .venv/bin/python benchmarks/device_model_check.py --device cpu --cluster local --models tiny_cnn
    python3 benchmarks/device_model_check.py --cluster h100x8 --models alexnet,vgg16,resnet50 \
        --devices 4 --out $OUT/device_model_check.json           # on a lent GPU (see below)

For each model it builds the layer graph at a global batch of --batch-per-device x --devices,
measures every distinct tile of every layer under every config on up to --devices devices the way
`layerwise profile` does (CUDA events on a GPU: `layerwise.strategies.cost.profile.profile_graph`),
and prices the same tiles with the device model of --cluster's device
(`layerwise.strategies.cost.compute_time.AnalyticCompute`). Printed per op kind (the layer's main
op, with `+bn` where a BatchNorm is fused into it; the SGD update of the weight shards apart): how
many tiles, the median and the 10th/90th percentiles of modelled / measured time, and the ratio of
the summed times (what a step's t_c sees, large tiles weighing most). `--out FILE` writes every
tile's pair as JSON.

This is the check a lent GPU is for: the presets' constants come from datasheets and published
measurements (strategies/hardware/clusters/), never from these tiles, so the table is the model's
error on this device, not a fit. On the device machine (torch, numpy, scipy, PyYAML and Rich there;
carry the wheels of pydantic, pydantic-core, annotated-types and typing-inspection for its Python,
as the device tool's README says):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:. python3 benchmarks/device_model_check.py --cluster h100x8 ...

Measure on the GPU the preset describes (h100x8 on an H100, h200x8 on an H200): the device's name
is printed beside the preset's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from layerwise.strategies.cost.compute_time import AnalyticCompute
from layerwise.strategies.cost.profile import profile_graph, tile_plan
from layerwise.strategies.hardware.cluster import load_cluster
from layerwise.strategies.hardware.this_machine import device_name, resolve_device
from layerwise.strategies.model.graph import Layer, build_graph


def op_kind(layer: Layer) -> str:
    """The layer's main op, with `+bn` when a BatchNorm is fused into it."""
    fused_norm = any(fused.op.startswith("BatchNorm") for fused in layer.fused)
    return layer.kind + ("+bn" if fused_norm else "")


def check_model(model: str, args: argparse.Namespace, compute: AnalyticCompute,
                console: Console) -> list[dict[str, object]]:
    """Every tile of `model`: kind, layer, tile key, measured and modelled seconds."""
    graph = build_graph(model, batch=args.batch_per_device * args.devices,
                        image_size=args.image_size)

    def progress(done: int, total: int, name: str) -> None:
        if done % 10 == 0 or done == total:
            console.print(f"  {model}: {done}/{total} layers ({name})", highlight=False)

    started = time.perf_counter()
    profile = profile_graph(graph, args.devices, device=args.device, progress=progress)
    console.print(f"{model}: {profile.tile_count} tiles measured in "
                  f"{time.perf_counter() - started:.1f} s", highlight=False)
    plan = tile_plan(graph, args.devices)  # the tiles profile_graph measured
    rows: list[dict[str, object]] = []
    for layer in graph.layers:
        if layer.kind == "input":
            continue
        for key, tile in plan[layer.name].items():
            rows.append({"model": model, "kind": op_kind(layer), "layer": layer.name,
                         "tile": key, "measured": profile.seconds[layer.name][key],
                         "modelled": compute.tile_seconds(layer, tile)})
            if layer.param_count:
                rows.append({"model": model, "kind": "update", "layer": layer.name,
                             "tile": key, "measured": profile.update_seconds[layer.name][key],
                             "modelled": compute.update_seconds(layer, tile)})
    return rows


def summary(rows: list[dict[str, object]]) -> Table:
    """Modelled / measured per op kind."""
    by_kind: dict[str, list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        by_kind[str(row["kind"])].append(row)
    table = Table(title="device model / measured, per op kind")
    for column in ("op kind", "tiles", "median", "p10", "p90", "sum ratio", "measured ms"):
        table.add_column(column, justify="left" if column == "op kind" else "right")
    for kind, kind_rows in sorted(by_kind.items()):
        ratios = [float(r["modelled"]) / float(r["measured"]) for r in kind_rows
                  if float(r["measured"]) > 0]
        if not ratios:
            continue
        median, low, high = np.percentile(ratios, [50, 10, 90])
        measured = sum(float(r["measured"]) for r in kind_rows)
        modelled = sum(float(r["modelled"]) for r in kind_rows)
        table.add_row(kind, str(len(ratios)), f"{median:.2f}", f"{low:.2f}", f"{high:.2f}",
                      f"{modelled / measured:.2f}", f"{measured * 1e3:.1f}")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", required=True, help="preset name or YAML file")
    parser.add_argument("--models", default="alexnet,vgg16,resnet50")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--batch-per-device", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--out", type=Path, default=None, help="every tile's pair as JSON")
    args = parser.parse_args(argv)
    console = Console()
    cluster = load_cluster(args.cluster)
    args.device = resolve_device(args.device)
    console.print(f"measuring on {device_name(args.device)}; modelling {cluster.device.name} "
                  f"({cluster.name}, compute_efficiency {cluster.compute_efficiency})",
                  highlight=False)
    compute = AnalyticCompute(cluster)
    rows = [row for model in args.models.split(",")
            for row in check_model(model.strip(), args, compute, console)]
    console.print(summary(rows))
    if args.out is not None:
        args.out.write_text(json.dumps({"device": device_name(args.device),
                                        "cluster": cluster.name, "tiles": rows}, indent=1))
        console.print(f"wrote {len(rows)} tiles to {args.out}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
