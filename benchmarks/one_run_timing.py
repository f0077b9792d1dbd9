"""The median time of one run repeated, as `layerwise profile` times a run on its own: CUDA events
around it on a GPU (the device's time from the host's first issue to the last kernel's end),
perf_counter on a CPU; shared by the benchmarks that compare their measures with the profile's."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_seconds(run: Callable[[], None], device: torch.device, repeats: int,
                   prepare: Callable[[], None] = lambda: None) -> float:
    """Median seconds of `run` over `repeats` (`prepare` before each, untimed; the first fifth
    of the runs warm up and are dropped), each run timed alone: the device synchronised
    before and after it."""
    cuda = device.type == "cuda"
    times = []
    for _ in range(repeats):
        prepare()
        if cuda:
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        run()
        if cuda:
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            times.append(time.perf_counter() - began)
    return statistics.median(times[repeats // 5:])
