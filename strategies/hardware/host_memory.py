"""What a request would need in memory against what this machine has, checked up front.

A huge number on the command line (a batch of 10^8, a million devices, a 100,000-pixel image)
should be one line saying how much memory it asks for, not a MemoryError deep in numpy or the
kernel killing the process. The estimates here are lower bounds (float32 values the work cannot
do without), so a refusal is certain to be right; the machine's memory is its physical memory.
"""

from __future__ import annotations

import math
import os

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.model.graph import BYTES_PER_ELEMENT, Layer, LayerGraph


class MemoryNeedError(LayerwiseError):
    """A request that needs more memory than this machine has."""


def physical_memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def human_bytes(nbytes: float) -> str:
    """1.5 GiB, 65 TiB, 512 MiB."""
    for unit, scale in (("EiB", 1 << 60), ("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30),
                        ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def check_memory(needed: int, what: str, fix: str) -> None:
    """MemoryNeedError (one line) when `what` needs more than this machine's memory."""
    have = physical_memory_bytes()
    if needed > have:
        raise MemoryNeedError(f"{what} would need at least {human_bytes(needed)} of memory, "
                              f"more than this machine's {human_bytes(have)}; {fix}")


def _elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def training_bytes(graph: LayerGraph, machines: int = 1) -> int:
    """What one training step of `graph` at its batch holds on one of `machines`: every layer's
    output (kept for the backward pass) shared among the machines, and the weights."""
    activations = sum(_elements(layer.output_shape) for layer in graph.layers)
    return (activations // machines + graph.param_count) * BYTES_PER_ELEMENT


def largest_layer_bytes(graph: LayerGraph) -> int:
    """What running the largest layer of `graph` whole on one device holds: its inputs, its
    output and its weights, and as much again for their gradients (a profile times every
    layer's one-device tile, forward and backward)."""
    def layer_bytes(layer: Layer) -> int:
        inputs = sum(_elements(shape) for shape in layer.input_shapes)
        values = inputs + _elements(layer.output_shape) + layer.param_count
        return 2 * values * BYTES_PER_ELEMENT
    return max(layer_bytes(layer) for layer in graph.layers)


# A torch process's own resident memory before it holds a tensor (torch and its libraries):
# 190-230 MB per torchrun worker measured here; the lower bound keeps a refusal certain.
PROCESS_BYTES = 150 * 2**20
# Processes per core a local run or profile may start: past this each gets under a quarter of
# a core, and what it measures is the scheduler, not the strategy.
MAX_PROCESSES_PER_CORE = 4


def check_processes(count: int, what: str, option: str) -> None:
    """LayerwiseError (one line) when `count` local processes for `what` exceed what this
    machine's cores and memory can run; `option` names the setting to lower."""
    cores = os.cpu_count() or 1
    if count > MAX_PROCESSES_PER_CORE * cores:
        raise LayerwiseError(
            f"{what} would start {count} processes on this machine's {cores} core(s), more "
            f"than {MAX_PROCESSES_PER_CORE} per core; use a smaller {option}")
    check_memory(count * PROCESS_BYTES, f"{what} ({count} processes)",
                 f"use a smaller {option}")
