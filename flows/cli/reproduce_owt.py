"""`layerwise reproduce owt`: Krizhevsky 2014's scaling experiment in simulation.

    layerwise reproduce owt
    layerwise reproduce owt --json

AlexNet (224 px, 1000 classes), 128 images per GPU, one ImageNet epoch (1,281,167 images) on
1, 2, 4 and 8 GPUs of the k20x8 preset (two PCIe groups of 4; traffic across the groups at
half the throughput), t_c from the device model of the K20; every OWT scheme with the fixed and
the variable batch (scheme a has one FC pass, so only its fixed batch is listed). The step
model is strategies/schedules/owt/planner.py's `predict`. Beside scheme b, Krizhevsky's
measured speedups (Table 1).
"""

from __future__ import annotations

import contextlib

from rich.table import Table

from layerwise.flows.cli.console import console, print_json

# Krizhevsky 2014, Table 1: the speedup of scheme (b) at batch 128 on 2, 4 and 8 GPUs.
PAPER_SPEEDUP_SCHEME_B = {1: 1.0, 2: 1.95, 4: 3.74, 8: 6.25}


def reproduce_owt(as_json: bool) -> None:
    """Print the predicted epoch time and speedup of every scheme, batch mode and GPU count."""
    from layerwise.strategies.schedules.owt.planner import (
        IMAGENET_TRAIN_IMAGES,
        REPRODUCE_BATCH_PER_GPU,
        REPRODUCE_CLUSTER,
        REPRODUCE_MODEL,
        epoch_estimates,
    )

    status = contextlib.nullcontext() if as_json else console.status("replaying", spinner="dots")
    with status:
        estimates = epoch_estimates()
    if as_json:
        print_json({
            "schema_version": 1, "experiment": "owt", "model": REPRODUCE_MODEL,
            "cluster": REPRODUCE_CLUSTER, "batch_per_gpu": REPRODUCE_BATCH_PER_GPU,
            "epoch_images": IMAGENET_TRAIN_IMAGES, "cost_source": "analytic",
            "rows": [row.model_dump() for row in estimates],
            "paper_speedup_scheme_b": PAPER_SPEEDUP_SCHEME_B,
        })
        return
    console.print(f"Krizhevsky 2014 in simulation: {REPRODUCE_MODEL} on {REPRODUCE_CLUSTER}, "
                  f"{REPRODUCE_BATCH_PER_GPU} images per GPU, one epoch of "
                  f"{IMAGENET_TRAIN_IMAGES:,} images, analytic t_c")
    table = Table(title="predicted ImageNet epoch", title_justify="left")
    for column in ("GPUs", "scheme", "batch mode", "epoch hours", "speedup", "paper", "step ms",
                   "transfer ms", "sync ms"):
        table.add_column(column, justify="left" if column in ("scheme", "batch mode") else
                         "right")
    for row in estimates:
        table.add_row(
            str(row.gpus), row.scheme, "variable" if row.variable_batch else "fixed",
            f"{row.epoch_hours:.2f}", f"{row.speedup:.2f}x",
            f"{PAPER_SPEEDUP_SCHEME_B[row.gpus]:.2f}x" if row.scheme == "b" else "",
            f"{row.step.step_seconds * 1e3:.1f}",
            f"{row.step.transfer_seconds * 1e3:.1f}", f"{row.step.sync_seconds * 1e3:.1f}")
    console.print(table)

