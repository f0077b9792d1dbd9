"""A profile's tiles timed alone against the same tiles run back to back, as a step runs them.

    .venv/bin/python benchmarks/tile_overlap.py --device cpu --models tiny_cnn --image-size 32
    python3 benchmarks/tile_overlap.py --device cuda --models resnet18 --image-size 224 \\
        --batch 64                                                    # on a lent GPU

`layerwise profile` times each tile alone between two CUDA events: its forward and backward,
the host's issuing of them included. A step issues one layer after another, and on a GPU the host
queues the next layer's kernels while the device still runs the last, so the host's part of a
small tile can hide behind a large one. This measures that apart from the runtime: every layer
of the model on one device (its whole tile), each tile built as the profile builds it, timed
alone as the profile times it (the sum of their medians), and all of them run in one sequence
(every forward in layer order, then every backward in reverse, no synchronisation between),
timed as a whole (median of --repeats). On a CPU both are the same work done in order; on a
GPU alone / chained is how much the profile's per-tile timing over-counts a step's compute.
"""

from __future__ import annotations

import argparse
import sys

import torch
from one_run_timing import median_seconds

from layerwise.strategies.cost.profile import build_tile, measure_tile
from layerwise.strategies.hardware.this_machine import device_name, resolve_device
from layerwise.strategies.model.graph import LayerGraph, build_graph
from layerwise.strategies.model.space import enumerate_configs
from layerwise.strategies.model.tiles import largest_tile


def _tiles(graph: LayerGraph) -> list[tuple[object, object]]:
    """(layer, its one tile on one device) for every layer but the input."""
    return [(layer, largest_tile(layer, enumerate_configs(layer, 1)[0]))
            for layer in graph.layers if layer.kind != "input"]


def alone_seconds(graph: LayerGraph, device: torch.device) -> float:
    """The profile's t_c of a step on one device: each tile's forward + backward timed alone."""
    return sum(measure_tile(layer, tile, device).passes for layer, tile in _tiles(graph))


def chained_seconds(graph: LayerGraph, device: torch.device, repeats: int) -> float:
    """The same tiles' forwards in layer order, then their backwards in reverse, timed as one
    sequence (median of `repeats`, the first fifth as warm-up)."""
    programs = [build_tile(layer, tile, device) for layer, tile in _tiles(graph)]
    generator = torch.Generator().manual_seed(1)
    grads = [torch.randn(tuple(tile.output_shape), generator=generator).to(device)
             for _, tile in _tiles(graph)]

    def clear() -> None:
        for program in programs:
            for leaf in program.leaves:
                leaf.grad = None

    def in_sequence() -> None:
        outputs = [program.forward() for program in programs]
        for output, grad in zip(reversed(outputs), reversed(grads), strict=True):
            if output.requires_grad:
                output.backward(grad)

    return median_seconds(in_sequence, device, repeats, prepare=clear)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny_cnn", help="zoo names or package.module:"
                        "factory references, separated by ';'")
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--classes", type=int, default=None)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    args = parser.parse_args(argv)
    device = torch.device(resolve_device(args.device))
    print(f"tiles alone against back to back on {device_name(str(device))} "
          f"(torch {torch.__version__}), batch {args.batch}")
    print(f"{'model':<40} {'layers':>6} {'alone ms':>9} {'chained ms':>11} {'alone/chained':>14}")
    for model in args.models.split(";"):
        graph = build_graph(model.strip(), batch=args.batch, image_size=args.image_size,
                            num_classes=args.classes)
        alone = alone_seconds(graph, device)
        chained = chained_seconds(graph, device, args.repeats)
        print(f"{model.strip()[:40]:<40} {len(graph.layers) - 1:>6} {alone * 1e3:>9.2f} "
              f"{chained * 1e3:>11.2f} {alone / chained:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
