"""What there is to plan for: the model zoo, a model's layer graph, the cluster presets.

    layerwise models
    layerwise graph vgg16 --cluster h200x16
    layerwise graph resnet50 --devices 8 --batch 256 --json
    layerwise graph mypkg.nets:make_net --image-size 64 --classes 10
    layerwise clusters
    layerwise clusters show k20x8
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from layerwise.flows.cli.console import (
    InputShape,
    console,
    human_count,
    input_options,
    print_json,
    user_errors,
)
from layerwise.strategies.jobs.defaults import DEFAULT_BATCH_PER_DEVICE


def register(app: typer.Typer) -> None:
    """Add `models`, `graph` and the `clusters` group to the CLI."""
    app.command("models")(models)
    app.command("graph")(graph)
    clusters_app = typer.Typer(
        help="List cluster presets, or show one as YAML.", invoke_without_command=True
    )
    clusters_app.callback()(clusters)
    clusters_app.command("show")(clusters_show)
    app.add_typer(clusters_app, name="clusters")


@user_errors
def models(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the model zoo: parameters, layers and default input of each network."""
    from layerwise.strategies.model.zoo import summarize_zoo

    summaries = summarize_zoo()
    if as_json:
        print_json({"schema_version": 1, "models": [s.model_dump() for s in summaries]})
        return
    table = Table(title="layerwise model zoo", title_justify="left")
    for column in ("name", "parameters", "layers", "conv", "fc", "input", "classes",
                   "description"):
        right = column in ("parameters", "layers", "conv", "fc")
        table.add_column(column, justify="right" if right else "left")
    for s in summaries:
        table.add_row(
            s.name, f"{s.parameters:,}", str(s.conv_layers + s.fc_layers), str(s.conv_layers),
            str(s.fc_layers),
            "x".join(map(str, s.input_shape)), str(s.num_classes), s.description,
        )
    console.print(table)
    console.print(
        "Parameters at the default classes; layers are weight layers (conv + fc). "
        "`layerwise graph NAME` shows the full layer graph. Your own fx-traceable model works "
        "everywhere as package.module:factory"
    )


@user_errors
def graph(
    model: Annotated[str, typer.Argument(help="Zoo name or package.module:factory.")],
    batch: Annotated[
        int | None,
        typer.Option(help="Global batch (default: 32 per device, the paper's setting)."),
    ] = None,
    image_size: Annotated[int | None, typer.Option(help="Input height and width.")] = None,
    classes: Annotated[int | None, typer.Option(help="Number of output classes.")] = None,
    in_channels: Annotated[int | None, typer.Option(help="Input channels.")] = None,
    input_shape: InputShape = None,
    devices: Annotated[
        int | None,
        typer.Option(help="Devices to count configurations for (default: the cluster's, else 4)."),
    ] = None,
    cluster: Annotated[
        str | None, typer.Option(help="Cluster preset name or YAML path.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Print a model's layer graph and each layer's number of parallel configurations."""
    image_size, in_channels = input_options(image_size, in_channels, input_shape)
    from layerwise.strategies.errors import ConfigError
    from layerwise.strategies.hardware.cluster import load_cluster
    from layerwise.strategies.model.graph import build_graph
    from layerwise.strategies.model.space import count_configs, dim_name, parallel_dims

    spec = load_cluster(cluster) if cluster else None
    if devices is not None and devices < 1:
        raise ConfigError(f"--devices must be >= 1 (got {devices})")
    if batch is not None and batch < 1:
        raise ConfigError(f"--batch must be >= 1 (got {batch})")
    device_count = devices if devices is not None else (spec.num_devices if spec else 4)
    if spec and device_count > spec.num_devices:
        raise ConfigError(
            f"cluster '{spec.name}' has {spec.num_devices} devices but --devices is "
            f"{device_count}; pass --devices {spec.num_devices} or less, or a larger cluster"
        )
    global_batch = batch if batch is not None else DEFAULT_BATCH_PER_DEVICE * device_count
    layer_graph = build_graph(
        model, batch=global_batch, image_size=image_size, num_classes=classes,
        in_channels=in_channels,
    )
    counts = {layer.name: count_configs(layer, device_count) for layer in layer_graph.layers}
    if as_json:
        print_json({
            "schema_version": 1,
            "model": model,
            "structure_hash": layer_graph.structure_hash,
            "input_shape": list(layer_graph.input_shape),
            "devices": device_count,
            "cluster": spec.name if spec else None,
            "param_count": layer_graph.param_count,
            "flops": layer_graph.flops,
            "layers": [
                {
                    **layer.model_dump(mode="json"),
                    "label": layer.label,
                    "param_count": layer.param_count,
                    "parallel_dims": "".join(dim_name(layer, dim) for dim in parallel_dims(layer)),
                    "configs": counts[layer.name],
                }
                for layer in layer_graph.layers
            ],
            "outputs": list(layer_graph.outputs),
        })
        return
    table = Table(
        title=f"{model}: input {tuple(layer_graph.input_shape)}, {device_count} devices"
        + (f" of {spec.name}" if spec else ""),
        title_justify="left",
    )
    for column in ("#", "layer", "type", "output", "params", "fwd FLOPs", "inputs", "dims",
                   "configs"):
        right = column in ("#", "params", "fwd FLOPs", "configs")
        table.add_column(column, justify="right" if right else "left")
    for index, layer in enumerate(layer_graph.layers):
        table.add_row(
            str(index), layer.name, layer.label, "x".join(map(str, layer.output_shape)),
            f"{layer.param_count:,}" if layer.param_count else "",
            human_count(layer.flops) if layer.flops else "",
            ", ".join(layer.inputs), "".join(dim_name(layer, dim) for dim in parallel_dims(layer)),
            f"{counts[layer.name]:,}",
        )
    console.print(table)
    total_configs = sum(counts.values())
    console.print(
        f"{len(layer_graph.layers)} layers, {len(layer_graph.edges)} edges, "
        f"{layer_graph.param_count:,} parameters, {human_count(layer_graph.flops)} forward "
        f"FLOPs per step; {total_configs:,} configurations in all "
        f"(max {max(counts.values()):,} per layer); structure {layer_graph.structure_hash}"
    )
    for note in layer_graph.held_notes:
        console.print(f"held: {note}")


@user_errors
def clusters(ctx: typer.Context) -> None:
    """List the cluster presets (any command taking a cluster also takes a YAML path)."""
    if ctx.invoked_subcommand is not None:
        return
    from layerwise.strategies.hardware.cluster import presets

    table = Table(title="cluster presets", title_justify="left")
    for column in ("name", "devices", "device", "fp32 peak", "intra-node", "inter-node",
                   "description"):
        table.add_column(column)
    for spec in presets():
        table.add_row(
            spec.name,
            f"{spec.nodes} x {spec.devices_per_node}",
            spec.device.name,
            f"{human_count(spec.device.peak_flops_fp32)}FLOP/s",
            _link_text(spec.links.intra_node),
            _link_text(spec.links.inter_node) if spec.nodes > 1 else "-",
            spec.description,
        )
    console.print(table)
    console.print("Show one as YAML: layerwise clusters show NAME")


def _link_text(link: Any) -> str:
    shared = f", a port per {link.shared_by} devices" if link.shared_by > 1 else ""
    return f"{human_count(link.bandwidth)}B/s, {link.latency * 1e6:g} us{shared}"


@user_errors
def clusters_show(
    name: Annotated[str, typer.Argument(help="Preset name or path to a cluster YAML file.")],
) -> None:
    """Print one cluster as YAML (a starting point for your own cluster file)."""
    from layerwise.strategies.hardware.cluster import load_cluster

    sys.stdout.write(load_cluster(name).to_yaml())
