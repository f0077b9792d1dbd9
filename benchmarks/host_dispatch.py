"""What the host costs per layer and per op when it drives the device: the floor under a tile.

    .venv/bin/python benchmarks/host_dispatch.py --device cpu            # here
    python3 benchmarks/host_dispatch.py --device cuda --out $OUT/host.json  # on a lent GPU

A small tile's time on a GPU is not its kernels' time: the host issues the forward's ops, enters
the autograd engine once per layer (the runtime differentiates each layer's graph on its own, as
`layerwise profile` times it), and issues the backward's ops; while that takes longer than the
kernels, the device waits. This measures the host's part apart from any model's tiles, on
tensors of one element (no arithmetic to speak of), timed as `layerwise profile` times a tile
(CUDA events around forward and backward; perf_counter on a CPU):

- a chain of k elementwise ops forward and backward through one `backward()` call, for k in
  --ops: the median time per k, and the least-squares line through them, whose intercept is the
  per-layer cost (the engine's entry and exit, the leaf's gradient) and whose slope the cost of
  one op forward and backward;
- one op launched --launches times in a loop with no synchronisation: the host's issue rate
  alone (the kernel-launch floor a preset's `kernel_latency` stands for).

It prints a small table and, with --out, writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from one_run_timing import median_seconds

from layerwise.strategies.hardware.this_machine import device_name, resolve_device


def _chain_seconds(ops: int, device: torch.device, repeats: int) -> float:
    """Median seconds of a forward of `ops` multiplications of a one-element leaf and its
    backward through one `backward()` call."""
    leaf = torch.ones(1, device=device, requires_grad=True)
    grad = torch.ones(1, device=device)

    def clear() -> None:
        leaf.grad = None

    def chain() -> None:
        value = leaf
        for _ in range(ops):
            value = value * 1.0001
        value.backward(grad)

    return median_seconds(chain, device, repeats, prepare=clear)


def _launch_seconds(launches: int, device: torch.device) -> float:
    """Host seconds per launch of an in-place add on one element, no synchronisation between."""
    value = torch.zeros(1, device=device)
    for _ in range(100):
        value.add_(1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    for _ in range(launches):
        value.add_(1)
    issued = time.perf_counter() - began
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return issued / launches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--ops", default="1,2,4,8,16", help="chain lengths, comma-separated")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--launches", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = torch.device(resolve_device(args.device))
    lengths = [int(k) for k in args.ops.split(",")]
    chains = {k: _chain_seconds(k, device, args.repeats) for k in lengths}
    slope, intercept = np.polyfit(lengths, [chains[k] for k in lengths], 1)
    launch = _launch_seconds(args.launches, device)
    print(f"host dispatch on {device_name(str(device))} (torch {torch.__version__})")
    print(f"{'ops':>4} {'forward+backward us':>20}")
    for k in lengths:
        print(f"{k:>4} {chains[k] * 1e6:>20.1f}")
    print(f"per layer (intercept) {intercept * 1e6:.1f} us; per op forward+backward (slope) "
          f"{slope * 1e6:.1f} us; one launch issued {launch * 1e6:.2f} us")
    if args.out is not None:
        args.out.write_text(json.dumps({
            "device": device_name(str(device)), "torch": torch.__version__,
            "chain_seconds": {str(k): v for k, v in chains.items()},
            "per_layer_seconds": float(intercept), "per_op_seconds": float(slope),
            "launch_seconds": launch}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
