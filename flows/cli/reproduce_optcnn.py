"""`layerwise reproduce optcnn`: Jia et al., ICML 2018, Fig. 7 in simulation.

    layerwise reproduce optcnn
    layerwise reproduce optcnn --cluster h200x8 --batch-per-device 64
    layerwise reproduce optcnn --profile profiles/alexnet.json --json
    layerwise reproduce optcnn --batch-norm synced

AlexNet, VGG-16 and Inception-v3 on 1, 2, 4, 8 and 16 devices (as many as the cluster has) of
the p100x16-2018 preset by default, 32 images per device, t_c from the preset's device model. Every
strategy is priced on the cluster as given, so its `sync` (the preset's: how the paper's
systems synchronised) prices the baselines and the searched strategy alike, and each tile
normalises by its own BatchNorm statistics, as those systems did (`--batch-norm synced` prices
layerwise's SyncBatchNorm instead). Where that sync is not a ring all-reduce, every strategy
is priced and searched again on the same hardware synchronising as today's systems do (NCCL's
ring all-reduce), beside the paper's (`ring_all_reduce` in the JSON). A measured profile
holds one model at one global batch: with `--profile` that model is replayed at the device
count and batch it was measured for.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, get_args

from rich.table import Table

from layerwise.flows.cli.console import console, print_json
from layerwise.strategies.errors import LayerwiseError

if TYPE_CHECKING:
    from layerwise.strategies.cost.cost_model import CostModel
    from layerwise.strategies.strategy import Strategy

PAPER_MODELS = ("alexnet", "vgg16", "inception_v3")
PAPER_STRATEGIES = ("model", "data", "owt", "layerwise")
BASELINES = ("model", "data", "owt")
PAPER_DEVICES = (1, 2, 4, 8, 16)
# What the paper's text states at 16 GPUs (Jia et al. 2018, abstract and section 7.2), as
# ranges over the three models: layer-wise's throughput over the best other strategy, and the
# bytes OWT moves per step over what layer-wise moves.
PAPER_SPEEDUP_OVER_BEST = (1.4, 2.2)
PAPER_OWT_BYTES_OVER_LAYERWISE = (1.2, 2.5)
PAPER_RATIO_DEVICES = 16
# The paper's Table 5: its layer-wise strategy for VGG-16 on 4 GPUs, by layer group.
PAPER_VGG16_4_GPUS = {
    "conv groups 1-4": "n4", "conv group 5": "n1h2w2", "FC1-2": "c4", "FC3": "c2",
}
# The same groups as torchvision's VGG-16 names its layers (each conv group with its pool), and
# the configs Table 5 gives them; the layers it does not name keep the searched configs.
VGG16_GROUPS: dict[str, tuple[tuple[str, ...], str]] = {
    "conv group 1": (("features_0", "features_2", "features_4"), "n4c1h1w1@0-3"),
    "conv group 2": (("features_5", "features_7", "features_9"), "n4c1h1w1@0-3"),
    "conv group 3": (("features_10", "features_12", "features_14", "features_16"),
                     "n4c1h1w1@0-3"),
    "conv group 4": (("features_17", "features_19", "features_21", "features_23"),
                     "n4c1h1w1@0-3"),
    "conv group 5": (("features_24", "features_26", "features_28", "features_30"),
                     "n1c1h2w2@0-3"),
    "FC1-2": (("classifier_0", "classifier_3"), "n1c4h1w1@0-3"),
    "FC3": (("classifier_6",), "n1c2h1w1@0-1"),
}


def reproduce_optcnn(cluster: str, profile: Path | None, batch_per_device: int | None,
                     batch_norm: str, as_json: bool) -> None:
    """Plan every model and device count, then print the tables (or the JSON document)."""
    from layerwise.strategies.cost.cost_model import BatchNormStatistics, CostModel
    from layerwise.strategies.cost.profile import Profile
    from layerwise.strategies.hardware.cluster import load_cluster
    from layerwise.strategies.jobs.defaults import DEFAULT_BATCH_PER_DEVICE
    from layerwise.strategies.jobs.pricing import cost_model
    from layerwise.strategies.model.graph import build_graph
    from layerwise.strategies.search.named import searched_strategy

    spec = load_cluster(cluster)
    if batch_norm not in get_args(BatchNormStatistics):
        raise LayerwiseError(f"--batch-norm must be local or synced (got {batch_norm})")
    statistics = cast("BatchNormStatistics", batch_norm)
    if batch_per_device is not None and batch_per_device < 1:
        raise LayerwiseError(f"--batch-per-device must be >= 1 (got {batch_per_device})")
    if profile is not None:
        measured = Profile.load(profile)
        per_device = measured.batch // measured.devices
        if batch_per_device not in (None, per_device):
            raise LayerwiseError(
                f"--batch-per-device {batch_per_device} differs from the profile's "
                f"{per_device} images per device; leave it out with --profile")
        grid = [(measured.model, measured.devices)]
        batch, image_size = per_device, measured.input_shape[-1]
        in_channels = measured.input_shape[1]
    else:
        batch = batch_per_device or DEFAULT_BATCH_PER_DEVICE
        counts = [n for n in PAPER_DEVICES if n <= spec.num_devices]
        grid = [(model, devices) for model in PAPER_MODELS for devices in counts]
        image_size = in_channels = None
    rows: list[dict[str, Any]] = []
    ring_rows: list[dict[str, Any]] = []
    ring_spec = None if spec.sync == "ring" else spec.model_copy(update={"sync": "ring"})
    vgg_strategy = None
    table5: list[dict[str, Any]] = []
    status = contextlib.nullcontext() if as_json else console.status("replaying",
                                                                     spinner="dots")
    with status as spinner:
        for model, devices in grid:
            if spinner is not None:
                spinner.update(f"replaying {model} on {devices} devices")
            cost = cost_model(build_graph(model, batch=batch * devices, image_size=image_size,
                                          in_channels=in_channels),
                              cluster, devices, profile, profile is None,
                              batch_norm_statistics=statistics)
            searched, _ = searched_strategy(cost)
            rows.extend(_rows(model, devices, cost, searched))
            if ring_spec is not None:
                ring = CostModel(cost.graph, ring_spec, devices, cost.compute,
                                 placement=cost.placement, batch_norm_statistics=statistics)
                ring_rows.extend(_rows(model, devices, ring, searched_strategy(ring)[0]))
            if model == "vgg16" and devices == 4:
                vgg_strategy = [choice.model_dump() for choice in searched.layers]
                table5 = paper_choices_costed(cost, vgg_strategy)
    summary = _summary(rows)
    ring_summary = _summary(ring_rows)
    if as_json:
        print_json({"schema_version": 1, "experiment": "optcnn", "cluster": spec.name,
                    "sync": spec.sync, "batch_norm_statistics": batch_norm,
                    "batch_per_device": batch,
                    "cost_source": "profile" if profile else "analytic", "rows": rows,
                    "summary": summary,
                    "paper": {"devices": PAPER_RATIO_DEVICES,
                              "speedup_over_best_other": PAPER_SPEEDUP_OVER_BEST,
                              "owt_bytes_over_layerwise": PAPER_OWT_BYTES_OVER_LAYERWISE,
                              "vgg16_4_gpus_layerwise": PAPER_VGG16_4_GPUS},
                    "vgg16_4_gpus_layerwise": vgg_strategy,
                    "vgg16_4_gpus_paper_choices": table5,
                    "ring_all_reduce": ({"rows": ring_rows, "summary": ring_summary}
                                        if ring_rows else None)})
        return
    console.print(f"Jia et al. 2018 in simulation: {spec.name} (sync: {spec.sync}, BatchNorm "
                  f"statistics: {batch_norm}), {batch} images per device, t_c from "
                  f"{'the profile' if profile else 'the device model'}")
    _print_tables(rows, summary, vgg_strategy or [], table5)
    if ring_rows:
        _print_ring(ring_rows, ring_summary)


def _rows(model: str, devices: int, cost: CostModel,
          searched: Strategy) -> list[dict[str, Any]]:
    """One row per strategy of the paper's figure on one model and device count: the searched
    strategy and the baselines, priced by `cost`."""
    from layerwise.strategies.jobs.named_strategies import strategy_by_name
    from layerwise.strategies.schedules import SEARCHED

    strategies = {SEARCHED: searched,
                  **{name: strategy_by_name(name, cost) for name in BASELINES}}
    data_step = strategies["data"].predicted.step_seconds
    rows = []
    for name in PAPER_STRATEGIES:
        predicted = strategies[name].predicted
        rows.append({
            "model": model, "devices": devices, "strategy": name,
            "images_per_second": cost.graph.batch / predicted.step_seconds,
            "gb_per_step": (predicted.transfer_bytes + predicted.sync_bytes) / 1e9,
            "step_seconds": predicted.step_seconds,
            "vs_data": data_step / predicted.step_seconds,
        })
    return rows


def paper_choices_costed(cost: CostModel, searched: list[dict[str, str]],
                         ) -> list[dict[str, Any]]:
    """What Table 5's choice for each VGG-16 group costs under this model: the searched
    strategy with that group's layers set as the paper sets them, then with every group so
    (the paper's whole plan), each as the step's extra milliseconds over the optimum."""
    from layerwise.strategies.model.space import ParallelConfig

    optimum = {choice["name"]: ParallelConfig.parse(choice["config"]) for choice in searched}
    base = cost.evaluate(optimum).step_seconds

    def with_groups(groups: list[str]) -> dict[str, Any]:
        assignment = dict(optimum)
        for group in groups:
            names, config = VGG16_GROUPS[group]
            assignment.update({name: ParallelConfig.parse(config) for name in names})
        step = cost.evaluate(assignment)
        return {"group": groups[0] if len(groups) == 1 else "the paper's whole plan",
                "paper_config": VGG16_GROUPS[groups[0]][1] if len(groups) == 1 else "",
                "searched_config": (", ".join(sorted({str(optimum[name]) for name in
                                                      VGG16_GROUPS[groups[0]][0]}))
                                    if len(groups) == 1 else ""),
                "extra_ms": (step.step_seconds - base) * 1e3,
                "extra_compute_ms": (step.compute_seconds - cost.evaluate(
                    optimum).compute_seconds) * 1e3,
                "extra_transfer_ms": (step.transfer_seconds - cost.evaluate(
                    optimum).transfer_seconds) * 1e3,
                "extra_sync_ms": (step.sync_seconds - cost.evaluate(
                    optimum).sync_seconds) * 1e3}

    return [*(with_groups([group]) for group in VGG16_GROUPS), with_groups(list(VGG16_GROUPS))]


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and device count: layer-wise over the best baseline, OWT's bytes over
    layer-wise's, and the paper's ranges where it states them."""
    cells: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault((row["model"], row["devices"]), {})[row["strategy"]] = row
    summary = []
    for (model, devices), cell in cells.items():
        best = max(BASELINES, key=lambda name: cell[name]["images_per_second"])
        layerwise_gb = cell["layerwise"]["gb_per_step"]
        stated = devices == PAPER_RATIO_DEVICES
        summary.append({
            "model": model, "devices": devices, "best_other": best,
            "speedup_over_best_other": (cell["layerwise"]["images_per_second"]
                                        / cell[best]["images_per_second"]),
            "owt_bytes_over_layerwise": (cell["owt"]["gb_per_step"] / layerwise_gb
                                         if layerwise_gb else None),
            "paper_speedup_over_best_other": PAPER_SPEEDUP_OVER_BEST if stated else None,
            "paper_owt_bytes_over_layerwise": PAPER_OWT_BYTES_OVER_LAYERWISE if stated else None,
        })
    return summary


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _paper(span: tuple[float, float] | None) -> str:
    return "" if span is None else f"{span[0]}-{span[1]}x"


def _print_tables(rows: list[dict[str, Any]], summary: list[dict[str, Any]],
                  vgg_strategy: list[dict[str, str]], table5: list[dict[str, Any]]) -> None:
    for metric, title, fmt in (
        ("images_per_second", "predicted training throughput (images/s)", "{:,.0f}"),
        ("gb_per_step", "data moved per step (GB, transfer + sync)", "{:.3f}"),
        ("vs_data", "throughput over data parallelism", "{:.2f}x"),
    ):
        console.print(_grid_table(rows, title, metric, fmt))
    table = Table(title="layer-wise against the others (paper: Jia et al. 2018, at 16 GPUs)",
                  title_justify="left")
    for column in ("model", "GPUs", "best other", "speedup", "paper", "OWT bytes / ours",
                   "paper"):
        table.add_column(column, justify="left" if column in ("model", "best other")
                         else "right")
    for entry in summary:
        table.add_row(entry["model"], str(entry["devices"]), entry["best_other"],
                      _ratio(entry["speedup_over_best_other"]),
                      _paper(entry["paper_speedup_over_best_other"]),
                      _ratio(entry["owt_bytes_over_layerwise"]),
                      _paper(entry["paper_owt_bytes_over_layerwise"]))
    console.print(table)
    if vgg_strategy:
        strategy_table = Table(title="layer-wise strategy for VGG-16 on 4 GPUs",
                               title_justify="left")
        strategy_table.add_column("layer")
        strategy_table.add_column("config")
        for choice in vgg_strategy:
            strategy_table.add_row(choice["name"], choice["config"])
        console.print(strategy_table)
        console.print("the paper's (Table 5): " + ", ".join(
            f"{group} {config}" for group, config in PAPER_VGG16_4_GPUS.items()))
    if table5:
        table = Table(title="VGG-16 on 4 GPUs: the paper's choice per group, set into the "
                            "searched strategy (ms per step over the optimum)",
                      title_justify="left")
        for column in ("group", "paper", "searched", "step +ms", "compute", "transfer",
                       "sync"):
            table.add_column(column, justify="left" if column in ("group", "paper", "searched")
                             else "right")
        for entry in table5:
            table.add_row(entry["group"], entry["paper_config"], entry["searched_config"],
                          *(f"{entry[key]:+.2f}" for key in ("extra_ms", "extra_compute_ms",
                                                             "extra_transfer_ms",
                                                             "extra_sync_ms")))
        console.print(table)


def _print_ring(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> None:
    """The same grid on the same hardware synchronising with a ring all-reduce: images/s, and
    layer-wise over the best other strategy."""
    console.print(_grid_table(
        rows, "the same hardware, synchronising with a ring all-reduce as today's systems do "
              "(images/s; layer-wise searched again)", "images_per_second", "{:,.0f}",
        summary))


def _grid_table(rows: list[dict[str, Any]], title: str, metric: str, fmt: str,
                summary: list[dict[str, Any]] | None = None) -> Table:
    """One metric per model, strategy and GPU count; with `summary`, a row per model of
    layer-wise over the best other strategy."""
    devices = sorted({row["devices"] for row in rows})
    table = Table(title=title, title_justify="left")
    table.add_column("model")
    table.add_column("strategy")
    for count in devices:
        table.add_column(f"{count} GPU" + ("s" if count > 1 else ""), justify="right")
    for model in dict.fromkeys(row["model"] for row in rows):
        for strategy in PAPER_STRATEGIES:
            table.add_row(model, strategy, *(
                fmt.format(r[metric]) for r in rows
                if r["model"] == model and r["strategy"] == strategy))
        if summary is not None:
            table.add_row(model, "layer-wise / best other", *(
                f"{entry['speedup_over_best_other']:.2f}x ({entry['best_other']})"
                for entry in summary if entry["model"] == model))
    return table
