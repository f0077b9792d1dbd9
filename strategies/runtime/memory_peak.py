"""The peak memory of one training step on this rank: the most bytes the step's tensors hold
at once (weights, gradients, optimizer state, activations, received tiles and buffers).

On CUDA the caching allocator keeps that peak (`torch.cuda.max_memory_allocated`, reset before
the step). The CPU allocator keeps none, and the process's resident set would count the
interpreter, torch's libraries and pages the allocator has freed but not returned. So on the
CPU the step runs under torch's profiler with memory recording on, and its memory timeline
(each tensor allocation and free, tensors alive before the step included) gives the peak of
the live bytes. The profiler slows the step (about 1.6x for ResNet-50 on this CPU) and reading
the timeline takes seconds for a deep network, so one step of a run is measured.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


@dataclass
class PeakMemory:
    """Filled in when the measured step ends: its peak in bytes."""

    bytes: int = 0


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
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as profiler:
        yield peak
    peak.bytes = _timeline_peak(profiler)


def _timeline_peak(profiler: profile) -> int:
    """The largest total of the profiler's CPU memory timeline (bytes per category at each
    allocation or free). torch marks `export_memory_timeline` deprecated in favour of a
    CUDA-only recorder; on the CPU it is the one record of tensor allocations it keeps."""
    with tempfile.TemporaryDirectory(prefix="layerwise-memory-") as folder, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        path = Path(folder, "timeline.json")
        profiler.export_memory_timeline(str(path), device="cpu")
        _, sizes = json.loads(path.read_text(encoding="utf-8"))
    return max((sum(point) for point in sizes), default=0)
