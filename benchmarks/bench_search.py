"""Search time of the elimination algorithm for every zoo model (a measurement, not a test).

    .venv/bin/python benchmarks/bench_search.py                    # 4, 16, 64 devices
    .venv/bin/python benchmarks/bench_search.py --devices 16 --models inception_v3,resnet152
    .venv/bin/python benchmarks/bench_search.py --placement aligned --devices 4,8,16

Full input size, 32 images per device, analytic t_c, origin placement unless --placement
aligned (every config also at each offset aligned to its size: many more configs per layer).
The presets have 16 (p100x16) and 8 (h200x8) devices; larger counts use the same preset with
more nodes. Each row
is one fresh search in this process: building the cost vectors and matrices, eliminating, and
undoing; `cost s` and `eliminate s` split it. One search of the tiny CNN runs first so that
the first row does not carry the process's one-time warm-up. Peak memory is the process's
maximum RSS.
"""

from __future__ import annotations

import argparse
import resource
import time

from rich.console import Console
from rich.table import Table

from strategies.cluster import Cluster, load_cluster
from strategies.compute import AnalyticCompute
from strategies.cost import CostModel, Placement
from strategies.graph import build_graph
from strategies.models import ZOO
from strategies.search import solve


def scaled(cluster: Cluster, devices: int) -> Cluster:
    if devices <= cluster.num_devices:
        return cluster
    nodes = -(-devices // cluster.devices_per_node)
    return cluster.model_copy(update={"nodes": nodes, "name": f"{cluster.name}x{nodes}nodes"})


def measure(model: str, devices: int, cluster: Cluster,
            placement: Placement = "origin") -> dict[str, float | int | str]:
    graph = build_graph(model, batch=32 * devices)
    started = time.perf_counter()
    cost = CostModel(graph, cluster, devices, AnalyticCompute(cluster), placement=placement)
    nodes = {layer.name: cost.node_seconds(layer) for layer in graph.layers}
    edges = {(u, v): cost.edge(graph.by_name[u], graph.by_name[v])[0] for u, v in graph.edges}
    costed = time.perf_counter()
    solution = solve(nodes, edges, order=[layer.name for layer in graph.layers])
    finished = time.perf_counter()
    return {
        "layers": len(graph.layers), "max configs": max(len(c) for c in cost.configs.values()),
        "cost s": costed - started, "eliminate s": finished - costed,
        "search s": finished - started, "final nodes": solution.final_nodes,
        "peak MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="4,16,64")
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--clusters", default="p100x16,h200x8")
    parser.add_argument("--placement", choices=("origin", "aligned"), default="origin")
    args = parser.parse_args()
    table = Table(title=f"search time (elimination, analytic t_c, full input size, "
                        f"{args.placement} placement)",
                  title_justify="left")
    columns = ("model", "cluster", "devices", "layers", "max configs", "cost s",
               "eliminate s", "search s", "final nodes", "peak MB")
    for column in columns:
        table.add_column(column, justify="left" if column in ("model", "cluster") else "right")
    console = Console(width=150)
    measure("tiny_cnn", 4, load_cluster(args.clusters.split(",")[0]))
    for cluster_name in args.clusters.split(","):
        for devices in map(int, args.devices.split(",")):
            cluster = scaled(load_cluster(cluster_name), devices)
            for model in args.models.split(","):
                row = measure(model, devices, cluster, args.placement)
                cells = [model, cluster.name, str(devices)] + [
                    f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c])
                    for c in columns[3:]
                ]
                table.add_row(*cells)
                console.print(" ".join(cells), style="dim")
    console.print(table)


if __name__ == "__main__":
    main()
