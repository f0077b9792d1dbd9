"""Calibration task: this machine's links between the flow's ranks, as a cluster file.

With `cluster: calibrated` the flow predicts with links measured here (`layerwise calibrate`:
point-to-point exchanges and all-reduces between `nproc` processes, fitted to latency +
bytes / bandwidth) instead of a preset's figures; the `local` preset's are placeholders, and
with them the benchmark predicts a small model's steps 2-3x under the measured ones here.
The file under data/profiles/ is keyed by device, backend, process count and torch version
(`calibration_path` in strategies/hardware/calibrate.py), so it is the cache: the first run of a
project measures (~15 s), later ones reuse it.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from layerwise.strategies.hardware.calibrate import (
    calibrate,
    calibration_path,
    message_sizes,
    save_calibration,
)
from layerwise.strategies.hardware.cluster import load_cluster


@task(name="calibrate", cache_policy=NO_CACHE)
def calibrate_links(nproc: int) -> Path:
    """The cluster file of this machine's links between `nproc` processes, measuring them
    when the project has none yet."""
    logger = get_run_logger()
    path = calibration_path(nproc)
    if path.exists():
        load_cluster(path)  # a broken file is one clear error, not a failed search later
        logger.info("links between %d processes: reusing %s (delete it to measure again)",
                    nproc, path)
        return path
    logger.info("measuring the links between %d processes: exchanges and all-reduces of %d "
                "message sizes from %s B to %s B, each after a short compute (~15 s)", nproc,
                len(message_sizes(False)), min(message_sizes(False)),
                f"{max(message_sizes(False)):,}")
    started = time.perf_counter()
    calibration = calibrate(nproc)
    save_calibration(calibration, path)
    link = calibration.link
    logger.info("links between %d processes measured in %.1f s: latency %.3g ms, bandwidth "
                "%.3g GB/s point-to-point; written to %s", nproc, time.perf_counter() - started,
                link.latency * 1e3, link.bandwidth / 1e9, path)
    return path
