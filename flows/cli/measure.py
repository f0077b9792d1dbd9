"""`layerwise profile` and `layerwise calibrate`: measure this machine for the cost model.

    layerwise profile resnet18 --devices 4 --image-size 32
    layerwise profile alexnet --devices 4 --batch-per-device 32 --image-size 32 --device cpu
    layerwise profile vgg16 --devices 8 --device cuda --repeats 20 --force
    layerwise profile tiny_cnn --devices 2 --out data/profiles/tiny.json --json
    layerwise calibrate --nproc 4
    layerwise calibrate --nproc 2 --quick --out data/profiles/cluster-local.yaml
    layerwise calibrate --nproc 8 --backend nccl

`profile` measures t_c (Jia et al. 2018's time of one layer tile: forward + backward, and the
SGD update of its weight shard) for every distinct tile of every layer under every
configuration on up to N devices, and stores it under data/profiles/ (one file per model
structure, global batch, device and torch version); a second run measures only tiles the file
lacks. `calibrate` measures latency and bandwidth between N local torch.distributed processes
and writes a cluster YAML for this machine.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from layerwise.flows.cli.console import (
    GlobalBatch,
    InputShape,
    console,
    human_count,
    input_options,
    print_json,
    user_errors,
)
from layerwise.strategies.jobs.defaults import DEFAULT_BATCH_PER_DEVICE

DEFAULT_CLUSTER_OUT = Path("data") / "profiles" / "cluster-local.yaml"
# Per-call cost of a tile run in FLOP-equivalents, so the time-left estimate does not treat
# tiny tiles as free.
_TILE_OVERHEAD_FLOPS = 2e6


def register(app: typer.Typer) -> None:
    """Add the `profile` and `calibrate` commands to `app`."""
    app.command("profile")(profile)
    app.command("calibrate")(calibrate)


# ---------------------------------------------------------------------------------------------
# layerwise profile
# ---------------------------------------------------------------------------------------------


@user_errors
def profile(
    model: Annotated[str, typer.Argument(help="Zoo name or package.module:factory.")],
    devices: Annotated[int, typer.Option(
        help="Devices the strategies will use: every config on up to this many is profiled.")],
    batch_per_device: Annotated[int | None, typer.Option(
        help=f"Samples per device; the global batch is this times --devices (default "
             f"{DEFAULT_BATCH_PER_DEVICE}).")
    ] = None,
    batch: GlobalBatch = None,
    image_size: Annotated[int | None, typer.Option(help="Input height and width.")] = None,
    classes: Annotated[int | None, typer.Option(help="Number of output classes.")] = None,
    in_channels: Annotated[int | None, typer.Option(help="Input channels.")] = None,
    input_shape: InputShape = None,
    device: Annotated[str | None, typer.Option(
        help="cpu or cuda (default: cuda when available, else cpu).")] = None,
    repeats: Annotated[int | None, typer.Option(
        help="Timed runs per tile (default: 3 on cpu, 10 on cuda; big tiles stop after 0.2 s).")
    ] = None,
    warmup: Annotated[int | None, typer.Option(
        help="Untimed runs per tile first (default: 1 on cpu, 5 on cuda).")] = None,
    threads: Annotated[int | None, typer.Option(
        help="torch CPU threads per profiler (default: one per core, shared evenly among "
             "--processes, as among the ranks of a run).")] = None,
    processes: Annotated[int, typer.Option(
        help="Profilers at once, in lockstep tile by tile: the ranks a run will start on "
             "this machine, which share its cores, caches and memory bandwidth (CPU only; "
             "the file name records it).")] = 1,
    force: Annotated[bool, typer.Option(
        "--force", help="Measure every tile again instead of reusing the profile file.")
    ] = False,
    out: Annotated[Path | None, typer.Option(
        help="Profile file (default: data/profiles/<model>-<structure>-<device>-...json).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Measure the training-step time of every layer tile (t_c) on this device.

    Builds the model's layer graph at a global batch of --batch-per-device x --devices, finds
    the distinct tiles of every layer under every parallel configuration on up to --devices
    devices, runs each tile (the layer's own computation on tensors of the tile's shapes, then
    backward, then the SGD update of its weight shard) and stores the median times of the
    passes and of the update. Tiles already in the profile file are reused.
    With --processes P, P profilers measure at once and each tile keeps the slowest time: a
    CPU run of P ranks on this machine is predicted from that profile.
    """
    image_size, in_channels = input_options(image_size, in_channels, input_shape)
    from layerwise.strategies.cost.profile import concurrent_threads, total_seconds
    from layerwise.strategies.errors import ConfigError, LayerwiseError
    from layerwise.strategies.files.atomic import writable_file
    from layerwise.strategies.hardware.host_memory import (
        check_memory,
        check_processes,
        largest_layer_bytes,
    )
    from layerwise.strategies.hardware.this_machine import resolve_device
    from layerwise.strategies.jobs.profiling import (
        ProfileMismatchError,
        measure_profile,
        plan_profile,
    )
    from layerwise.strategies.model.graph import build_graph

    if devices < 1:
        raise ConfigError(f"--devices must be >= 1 (got {devices})")
    if batch is not None and batch_per_device is not None:
        raise ConfigError("give --batch (global) or --batch-per-device, not both")
    if batch is not None and batch < 1:
        raise ConfigError(f"--batch must be >= 1 (got {batch})")
    if batch_per_device is not None and batch_per_device < 1:
        raise ConfigError(f"--batch-per-device must be >= 1 (got {batch_per_device})")
    per_device = batch_per_device if batch_per_device is not None else DEFAULT_BATCH_PER_DEVICE
    split = "given" if batch is not None else f"{per_device} x {devices} devices"
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1 (got {threads})")
    if processes < 1:
        raise ConfigError(f"--processes must be >= 1 (got {processes})")
    target = resolve_device(device)
    if processes > 1 and target.type != "cpu":
        raise ConfigError(f"--processes {processes} is for CPUs, where the ranks of a run share "
                          "one machine; each GPU rank has its own device: use --processes 1")
    check_processes(processes + 1, "profiling", "--processes")  # the profilers and this one
    if processes > 1 and threads is None:
        threads = concurrent_threads(processes)
    graph = build_graph(model, batch=batch if batch is not None else per_device * devices,
                        image_size=image_size, num_classes=classes, in_channels=in_channels)
    check_memory(largest_layer_bytes(graph) * processes,
                 f"profiling {model} at a global batch of {graph.batch} ({split})",
                 "use a smaller batch, fewer --devices or a smaller --image-size")
    if out is not None:
        writable_file(out, "--out")
    try:
        plan = plan_profile(graph, devices, processes, target, out, force)
    except ProfileMismatchError as error:
        raise LayerwiseError(f"{error}; or pass --force to replace that file") from None
    path, name = plan.path, plan.device_name
    if out is None:
        writable_file(path, "--out")
    measured_count, reused_count = plan.measured_count, plan.reused_count
    weights = {layer: sum(_tile_weight(graph.by_name[layer], tile) for tile in tiles.values())
               for layer, tiles in plan.to_measure.items()}

    if not as_json:
        console.print(
            f"profiling {model} on {name} ({target.type}{_at_once(processes)}), global batch "
            f"{graph.batch} ({split}): {measured_count} tiles to "
            "measure, "
            f"reused {reused_count} tiles from {path if plan.existing else 'nothing'}"
            + (f" ({path} was measured by an older layerwise: replacing it)"
               if plan.stale else ""),
            highlight=False,
        )
    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.fields[layers]} layers"), TimeElapsedColumn(),
               TextColumn("left"), TimeRemainingColumn())
    started = time.perf_counter()
    with Progress(*columns, console=console,
                  disable=as_json or not console.is_terminal) as bar:
        task = bar.add_task(f"{model}", total=sum(weights.values()) or 1,
                            layers=f"0/{len(graph.layers)}")

        def advance(done: int, total: int, layer_name: str) -> None:
            bar.update(task, advance=weights.get(layer_name, 0.0),
                       description=f"{model}: {layer_name}", layers=f"{done}/{total}")

        result = measure_profile(plan, progress=advance, threads=threads, warmup=warmup,
                                 repeats=repeats)
    elapsed = time.perf_counter() - started

    layers = [
        {"name": layer.name, "label": layer.label, "tiles": len(plan.tiles[layer.name]),
         "measured": len(plan.to_measure.get(layer.name, {})),
         "total_ms": total_seconds(result, layer.name) * 1e3,
         "update_ms": math.fsum(result.update_seconds.get(layer.name, {}).values()) * 1e3}
        for layer in graph.layers if layer.kind != "input"
    ]
    if as_json:
        print_json({
            "schema_version": 1, "path": str(path), "model": model,
            "structure_hash": graph.structure_hash, "device_name": name,
            "device_type": result.device_type, "batch": graph.batch, "devices": devices,
            "processes": processes,
            "tiles": measured_count + reused_count, "measured": measured_count,
            "reused": reused_count, "seconds": elapsed, "layers": layers,
        })
        return
    table = Table(title=f"{model}: t_c per layer, {graph.batch} samples on {devices} devices",
                  title_justify="left")
    for column in ("layer", "type", "tiles", "new", "sum of tile ms", "of it update ms"):
        table.add_column(column, justify="left" if column in ("layer", "type") else "right")
    for row in layers:
        table.add_row(row["name"], row["label"], str(row["tiles"]), str(row["measured"]),
                      f"{row['total_ms']:.3f}", f"{row['update_ms']:.3f}")
    console.print(table)
    console.print(
        f"measured {measured_count} tiles in {elapsed:.1f} s, reused {reused_count} tiles; "
        f"profile ({result.method}, {result.threads} threads) written to {path}",
        highlight=False, soft_wrap=True,
    )


def _at_once(processes: int) -> str:
    return f", {processes} profilers at once" if processes > 1 else ""


def _tile_weight(layer: Any, tile: Any) -> float:
    """Rough cost of measuring a tile, for the time-left estimate: its share of the FLOPs."""
    fraction = math.prod(tile.output_shape) / max(math.prod(layer.output_shape), 1)
    return layer.flops * fraction + _TILE_OVERHEAD_FLOPS


# ---------------------------------------------------------------------------------------------
# layerwise calibrate
# ---------------------------------------------------------------------------------------------


@user_errors
def calibrate(
    nproc: Annotated[int, typer.Option(help="Local processes to measure between (>= 2).")],
    backend: Annotated[str | None, typer.Option(
        help="gloo or nccl (default: nccl with one GPU per process, else gloo).")] = None,
    quick: Annotated[bool, typer.Option(
        "--quick", help="4 message sizes and few repeats (seconds) instead of 12 sizes.")
    ] = False,
    out: Annotated[Path, typer.Option(
        help="Cluster YAML to write; the raw measurements go next to it as .calibration.json.")
    ] = DEFAULT_CLUSTER_OUT,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Measure latency and bandwidth between local processes and write a cluster YAML.

    Starts --nproc torch.distributed processes, times an exchange between ranks 0 and 1 (both
    send and receive at once, as the runtime's transfers do) and all_reduce over all ranks for
    messages of 4 B to 16 MiB, fits latency + bytes / bandwidth by least squares, and writes
    the `local` preset with the fitted link (the all-reduce fit as its ring figures) and
    --nproc devices: pass that file wherever a cluster is accepted.
    """
    from layerwise.strategies.files.atomic import writable_file
    from layerwise.strategies.hardware.calibrate import calibrate as measure
    from layerwise.strategies.hardware.calibrate import calibrated_cluster, save_calibration
    from layerwise.strategies.hardware.host_memory import check_processes

    writable_file(out, "--out")
    check_processes(nproc, "calibrating", "--nproc")
    waiting = (contextlib.nullcontext() if as_json else
               console.status(f"measuring links between {nproc} processes", spinner="dots"))
    with waiting:
        calibration = measure(nproc, backend=backend, quick=quick)
    raw_path = save_calibration(calibration, out)
    cluster = calibrated_cluster(calibration)
    if as_json:
        print_json({"schema_version": 1, "cluster_path": str(out),
                    "calibration_path": str(raw_path),
                    "calibration": calibration.model_dump(mode="json")})
        return
    table = Table(title=f"{calibration.backend}, {nproc} processes on {calibration.host}",
                  title_justify="left")
    for column in ("bytes", "p2p exchange", "p2p fit", "all_reduce", "ring fit"):
        table.add_column(column, justify="right")
    measured = {(point.kind, point.bytes): point.seconds for point in calibration.points}
    for nbytes in sorted({point.bytes for point in calibration.measured("p2p")}):
        table.add_row(
            _bytes_text(nbytes),
            _time_text(measured.get(("p2p", nbytes))),
            _time_text(calibration.p2p_seconds(nbytes)),
            _time_text(measured.get(("allreduce", nbytes))),
            _time_text(calibration.allreduce_seconds(nbytes)),
        )
    console.print(table)
    console.print(
        f"point-to-point: latency {_time_text(calibration.p2p_latency)}, bandwidth "
        f"{human_count(calibration.p2p_bandwidth)}B/s; all_reduce ring fit "
        f"2(p-1)(alpha + m*beta/p): alpha {_time_text(calibration.allreduce_latency)}, 1/beta "
        f"{human_count(calibration.allreduce_bandwidth)}B/s"
        + ("" if calibration.copy_bandwidth is None else
           f"; gradients copied into a bucket at {human_count(calibration.copy_bandwidth)}B/s"),
        highlight=False, soft_wrap=True,
    )
    console.print(f"wrote cluster {cluster.name} to {out} and the measurements to {raw_path}",
                  highlight=False, soft_wrap=True)
    console.print(f"use it: layerwise search MODEL --cluster {out} --devices {nproc} ...",
                  highlight=False, soft_wrap=True)


def _time_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-6:.3g} us"


def _bytes_text(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"
