"""Planning commands: search for the optimal layer-wise strategy, replay the paper.

    layerwise search vgg16 --devices 4 --cluster h200x16 --analytic
    layerwise search inception_v3 --devices 16 --cluster h200x16 --analytic --json
    layerwise search resnet18 --devices 4 --cluster local --image-size 32 --save s.json
    layerwise reproduce optcnn --cluster h200x8 --batch-per-device 64
    layerwise reproduce owt
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from layerwise.flows.cli.console import (
    GlobalBatch,
    InputShape,
    console,
    input_options,
    print_json,
    user_errors,
)
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.atomic import writable_file
from layerwise.strategies.jobs.defaults import DEFAULT_BATCH_PER_DEVICE
from layerwise.strategies.schedules import schedule_help

if TYPE_CHECKING:
    from layerwise.strategies.jobs.planning import Plan
    from layerwise.strategies.oracle.paradl import OracleCase
    from layerwise.strategies.schedules.pipeline.planner import PipelinePlan



def register(app: typer.Typer) -> None:
    """Add `search` and `reproduce` to the CLI."""

    @app.command()
    @user_errors
    def search(
        model: Annotated[str, typer.Argument(help="Zoo name or package.module:factory.")],
        devices: Annotated[int, typer.Option(help="Number of devices to plan for.")],
        cluster: Annotated[str, typer.Option(help="Cluster preset name or YAML path.")],
        profile: Annotated[
            Path | None, typer.Option(help="Profile JSON from `layerwise profile` (t_c).")
        ] = None,
        analytic: Annotated[
            bool, typer.Option(help="t_c from the cluster device's analytic model instead "
                               "(the device model on a GPU preset, a roofline otherwise).")
        ] = False,
        batch_per_device: Annotated[int | None, typer.Option(
            help=f"Images per device (default {DEFAULT_BATCH_PER_DEVICE}).")] = None,
        batch: GlobalBatch = None,
        image_size: Annotated[int | None, typer.Option(help="Input height and width.")] = None,
        classes: Annotated[int | None, typer.Option(help="Number of classes.")] = None,
        in_channels: Annotated[int | None, typer.Option(help="Input channels.")] = None,
        input_shape: InputShape = None,
        baselines: Annotated[
            str, typer.Option(help="Comma-separated strategy names besides the searched one: "
                                   f"{schedule_help()}; paradl (the ParaDL oracle's analytic "
                                   "cases).")
        ] = "data,model,owt",
        placement: Annotated[
            str, typer.Option(help="aligned: any block of devices aligned to its size (the "
                                   "whole space); origin: every layer's devices start at 0 "
                                   "(a smaller space, faster); auto: aligned unless its "
                                   "space would take more than seconds, then origin, said.")
        ] = "auto",
        save: Annotated[
            Path | None, typer.Option(help="Write the layer-wise strategy JSON here.")
        ] = None,
        memory_limit: Annotated[
            str | None, typer.Option(help="Memory per device a strategy may use, e.g. 12GiB "
                                          "(default: the cluster device's less a 10% reserve); "
                                          "the search keeps within it, baselines over it are "
                                          "marked.")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Find the optimal layer-wise strategy and compare it with the baselines."""
        image_size, in_channels = input_options(image_size, in_channels, input_shape)
        names = [name.strip() for name in baselines.split(",") if name.strip()]
        if batch is not None and batch_per_device is not None:
            raise LayerwiseError("give --batch (global) or --batch-per-device, not both")
        limit = None if memory_limit is None else _memory_bytes(memory_limit)
        if save:
            writable_file(save, "--save")
        from layerwise.strategies.jobs.planning import plan

        with _status("searching", as_json):
            result = plan(
                model, devices, cluster,
                batch_per_device=(batch_per_device if batch_per_device is not None
                                  else DEFAULT_BATCH_PER_DEVICE), batch=batch,
                image_size=image_size, classes=classes, in_channels=in_channels,
                profile=profile, analytic=analytic, baselines=names, placement=placement,
                memory_limit=limit)
        if save:
            result.strategies["layerwise"].save(save)
        if as_json:
            print_json(result.document())
            return
        _print_plan(result)
        if save:
            console.print(f"saved the layer-wise strategy to {save}")

    @app.command()
    @user_errors
    def reproduce(
        experiment: Annotated[str, typer.Argument(help="Which paper: optcnn or owt.")],
        cluster: Annotated[
            str | None, typer.Option(help="optcnn: cluster preset name or YAML path "
                                          "(default p100x16-2018, the paper's testbed "
                                          "as they ran it).")
        ] = None,
        profile: Annotated[
            Path | None, typer.Option(help="optcnn: t_c from this profile (its model, at the "
                                           "device count and batch it was measured for).")
        ] = None,
        batch_per_device: Annotated[
            int | None, typer.Option(help="optcnn: images per device (default "
                                          f"{DEFAULT_BATCH_PER_DEVICE}, the paper's).")
        ] = None,
        batch_norm: Annotated[
            str | None, typer.Option(help="optcnn: BatchNorm statistics, local (each tile its "
                                          "own, as the paper's systems ran them; the default) "
                                          "or synced (layerwise's SyncBatchNorm).")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Replay a paper's experiment in simulation (optcnn: Jia et al., ICML 2018, Fig. 7;
        owt: Krizhevsky 2014, epoch time and speedup of the OWT schemes on 1-8 K20s)."""
        from layerwise.strategies.errors import LayerwiseError

        if experiment == "owt":
            if any(option is not None
                   for option in (cluster, profile, batch_per_device, batch_norm)):
                raise LayerwiseError("--cluster, --profile, --batch-per-device and --batch-norm "
                                     "apply to optcnn; owt replays Krizhevsky's own k20x8 setup")
            from layerwise.flows.cli.reproduce_owt import reproduce_owt

            reproduce_owt(as_json)
            return
        if experiment != "optcnn":
            raise LayerwiseError(f"unknown experiment '{experiment}'; available: optcnn, owt")
        from layerwise.flows.cli.reproduce_optcnn import reproduce_optcnn

        reproduce_optcnn("p100x16-2018" if cluster is None else cluster, profile, batch_per_device,
                         "local" if batch_norm is None else batch_norm, as_json)


def _status(message: str, quiet: bool) -> contextlib.AbstractContextManager[Any]:
    """A spinner on the terminal; nothing when the output is JSON for a script."""
    return contextlib.nullcontext() if quiet else console.status(message, spinner="dots")


def _print_plan(result: Plan) -> None:
    from layerwise.strategies.schedules.pipeline.planner import PipelinePlan

    graph = result.graph
    document = result.document()
    console.print(
        f"{document['model']} on {document['devices']} devices of {document['cluster']}, batch "
        f"{document['batch']}, t_c from {document['cost_source']}"
    )
    table = Table(title="predicted cost per training step", title_justify="left")
    for column in ("strategy", "step ms", "compute ms", "transfer ms", "sync ms",
                   "transfer MB", "sync MB", "peak MB", "images/s", "vs data"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    data_step = document["strategies"].get("data", {}).get("step_seconds")
    for name, entry in document["strategies"].items():
        table.add_row(
            name, f"{entry['step_seconds'] * 1e3:.2f}", f"{entry['compute_seconds'] * 1e3:.2f}",
            f"{entry['transfer_seconds'] * 1e3:.2f}", f"{entry['sync_seconds'] * 1e3:.2f}",
            f"{entry['transfer_bytes'] / 1e6:.1f}", f"{entry['sync_bytes'] / 1e6:.1f}",
            _largest_megabytes(entry["peak_memory_bytes_per_device"]),
            f"{entry['samples_per_second']:,.0f}",
            f"{data_step / entry['step_seconds']:.2f}x" if data_step else "",
        )
    console.print(table)
    for name, entry in document["strategies"].items():
        if entry["fits"] is False:
            console.print(f"does not fit: {name} needs "
                          f"{_largest_megabytes(entry['peak_memory_bytes_per_device'])} MB on its "
                          f"fullest device, over the {result.memory_budget / 1e6:,.1f} MB per "
                          f"device a strategy may use", highlight=False, soft_wrap=True)
    for name, reason in result.skipped.items():
        console.print(f"skipped {name}: {reason}")
    for report in result.reports.values():
        if isinstance(report, PipelinePlan):
            console.print(_pipeline_table(report))
    if result.paradl:
        console.print(_paradl_table(result.paradl))
    searched = document["strategies"]["layerwise"]
    recompute = set(searched["recompute"])
    layers = Table(title="layer-wise strategy", title_justify="left")
    for column in ("layer", "type", "output", "config", *(("backward",) if recompute else ())):
        layers.add_column(column)
    for choice in searched["layers"]:
        layer = graph.by_name[choice["name"]]
        layers.add_row(layer.name, layer.label, "x".join(map(str, layer.output_shape)),
                       choice["config"],
                       *((("recomputes the forward" if layer.name in recompute else ""),)
                         if recompute else ()))
    console.print(layers)
    console.print(
        f"search took {document['search_seconds']:.3f} s ({document['search_method']}, "
        f"{document['configs_kept']:,} of {document['configs']:,} configs kept by the bounds, "
        f"{document['nodes_eliminated']} nodes and {document['edges_eliminated']} edges "
        f"eliminated, final graph {document['final_graph_nodes']} node(s), placement "
        f"{document['placement']})"
    )
    if document["memory_rounds"]:
        console.print(
            f"held to {result.memory_budget / 1e6:,.1f} MB per device: the fastest plan needs "
            f"more, and this one is at most {document['optimality_gap']:.1%} slower than the "
            f"best plan that fits (a lower bound from {document['memory_bound']})",
            highlight=False, soft_wrap=True)
    if recompute:
        console.print(
            f"recomputed in the backward: {len(recompute)} layer(s) hold nothing of what their "
            f"ops save for it from the forward on, for one more forward of their tiles "
            f"({', '.join(sorted(recompute))})", highlight=False, soft_wrap=True)
    for note in graph.held_notes:
        console.print(f"held: {note}")
    if document["placement_note"]:
        console.print(document["placement_note"], highlight=False, soft_wrap=True)


def _memory_bytes(text: str) -> int:
    """--memory-limit as bytes (a number with a unit, as cluster files write memory)."""
    from pydantic import TypeAdapter, ValidationError

    from layerwise.strategies.hardware.cluster import MemoryBytes

    try:
        return TypeAdapter(MemoryBytes).validate_python(text)
    except ValidationError as error:
        reason = error.errors()[0]["msg"].removeprefix("Value error, ")
        raise LayerwiseError(f"--memory-limit {text!r}: {reason}") from None


def _largest_megabytes(peaks: list[int] | None) -> str:
    """The largest device's predicted peak in MB; "-" where the memory model does not cover
    the strategy's engine."""
    return "-" if peaks is None else f"{max(peaks) / 1e6:,.1f}"


def _pipeline_table(pipeline: PipelinePlan) -> Table:
    table = Table(title=f"pipeline: {len(pipeline.stages)} stage(s), {pipeline.micro_batches} "
                        f"micro-batch(es), bubble {pipeline.bubble_fraction:.0%}, "
                        f"{pipeline.speedup:.2f}x one device", title_justify="left")
    for column in ("stage", "layers", "devices", "compute ms/mb", "transfer ms/mb",
                   "sync ms", "update ms"):
        table.add_column(column, justify="left" if column in ("layers", "devices")
                         else "right")
    for index, stage in enumerate(pipeline.stages):
        table.add_row(str(index), f"{stage.layers[0]} .. {stage.layers[-1]} "
                                  f"({len(stage.layers)})",
                      ",".join(map(str, stage.devices)), f"{stage.compute_seconds * 1e3:.2f}",
                      f"{stage.transfer_seconds * 1e3:.2f}", f"{stage.sync_seconds * 1e3:.2f}",
                      f"{stage.update_seconds * 1e3:.2f}")
    return table


def _paradl_table(cases: tuple[OracleCase, ...]) -> Table:
    table = Table(title="ParaDL oracle (Kahira et al.): analytic step, one strategy for every "
                        "layer", title_justify="left")
    for column in ("strategy", "step ms", "compute ms", "comm ms", "memory/device MB",
                   "bottleneck"):
        table.add_column(column, justify="left" if column in ("strategy", "bottleneck")
                         else "right")
    for case in sorted(cases, key=lambda case: (case.epoch_seconds is None,
                                                case.epoch_seconds or 0.0)):
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1e3:.2f}"
        memory = ("-" if case.memory_bytes_per_pe is None
                  else f"{case.memory_bytes_per_pe / 1e6:,.0f}")
        label = case.bottleneck + (f": {case.reason}" if case.reason else "")
        table.add_row(case.strategy, ms(case.epoch_seconds), ms(case.compute_seconds),
                      ms(case.communication_seconds), memory, label)
    return table
