"""The peak memory of one training step on this rank: the most bytes the step's tensors hold
at once (weights, gradients, optimizer state, activations, received tiles and buffers).

On CUDA the caching allocator keeps that peak (`torch.cuda.max_memory_allocated`, reset before
the step). The CPU allocator keeps none, and the process's resident set would count the
interpreter, torch's libraries and pages the allocator has freed but not returned. So on the
CPU the step runs under torch's profiler with memory recording on, which reports every tensor
allocation and free made while it runs, in order: their running sum is the live bytes relative
to the step's start, up to blocks allocated before it and freed during it, which it cannot
size (the last step's gradients, dropped first thing). The level is pinned at the step's end
instead, where every live tensor is reachable from Python (weights with their gradients,
optimizer state, gradient buckets): peak = live at the end + (highest running sum - running
sum at the end), exact as long as those earlier blocks are freed before the peak (at the
step's start they are). The profiler slows the step (about 1.6x for ResNet-50 on this CPU), so
one step of a run is measured. It is torch's autograd profiler, the recorder under
`torch.profiler.profile`, used directly: the wrapper's start imports torch's compiler
(torch._inductor and torch._dynamo, about 2 s of every rank's first measured step) to read a
setting of CUDA graphs that this measure does not need.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.autograd.profiler import profile


@dataclass
class PeakMemory:
    """Filled in when the measured step ends: its peak in bytes (None: not measurable here)."""

    bytes: int | None = None


@contextlib.contextmanager
def measured_peak(device: torch.device) -> Iterator[PeakMemory]:
    """Measure the peak of the tensors alive on `device` while the context runs."""
    peak = PeakMemory()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield peak
        torch.cuda.synchronize(device)
        peak.bytes = int(torch.cuda.max_memory_allocated(device))
        return
    # kineto prints each profiler start and stop at its level 5 (two lines per rank per run
    # in the user's terminal); a level above its highest keeps it quiet unless asked
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(use_cpu=True, profile_memory=True, use_kineto=True) as profiler:
        yield peak
    changes = _allocation_changes(profiler)
    if changes is not None:
        highest = running = 0
        for change in changes:
            running += change
            highest = max(highest, running)
        peak.bytes = live_tensor_bytes(device) + highest - running


def _allocation_changes(profiler: profile) -> list[int] | None:
    """Every allocation (+bytes) and free (-bytes) the profiler recorded, in time order; None
    where this torch's profiler does not expose its event tree."""
    try:
        roots = profiler.kineto_results.experimental_event_tree()
        from torch._C._profiler import _EventType
    except (AttributeError, ImportError):
        return None
    found: list[tuple[int, int]] = []
    pending = list(roots)
    while pending:
        event = pending.pop()
        if event.tag == _EventType.Allocation:
            found.append((event.start_time_ns, int(event.extra_fields.alloc_size)))
        pending.extend(event.children)
    return [size for _, size in sorted(found)]


def live_tensor_bytes(device: torch.device) -> int:
    """The bytes of the distinct storages of every tensor on `device` reachable from Python,
    each leaf's gradient included."""
    storages: dict[int, int] = {}
    for thing in gc.get_objects():
        # by its type: `isinstance` also reads `__class__`, which some objects torch keeps
        # answer with a deprecation warning (torch.distributed.reduce_op)
        if not issubclass(type(thing), torch.Tensor):
            continue
        for tensor in (thing, thing.grad if thing.is_leaf else None):
            if tensor is None or tensor.device != device or tensor.is_meta:
                continue
            storage = tensor.untyped_storage()
            try:
                pointer = storage.data_ptr()
            except RuntimeError:  # a fake tensor a trace keeps (make_fx's values): no memory
                continue
            if pointer:
                storages[pointer] = storage.nbytes()
    return sum(storages.values())
