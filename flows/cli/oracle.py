"""`layerwise oracle`: rank parallelization strategies at scale with ParaDL's analytic model.

    layerwise oracle resnet50 --platform abci --gpus 4,64,1024
    layerwise oracle vgg16 --gpus 1..1024 --strategies data,filter,data+filter
    layerwise oracle alexnet --samples-per-gpu fit --json > alexnet-oracle.json
    layerwise oracle mysummary.yaml --platform mycluster.yaml --save oracle.json
    layerwise oracle resnet18 --image-size 32 --profile data/profiles/<file>.json
    layerwise oracle table8

Kahira et al., HPDC 2021 (docs/research.md: ParaDL; strategies/oracle/paradl.py): per strategy and
GPU count, the per-epoch compute and communication time, memory per GPU and what limits it. FW/BW
per sample come from a profile (`--profile`), a model summary file, or the analytic t_c of the
platform's device (its device model; a roofline where it has no SM figures). `table8` replays the
paper's Table VIII (strategies/oracle/table8.py) and prints our ranks beside the paper's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast, get_args

import typer
from rich.table import Table

from layerwise.flows.cli.console import console, print_json, user_errors
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.atomic import write_atomic

if TYPE_CHECKING:
    from layerwise.strategies.hardware.cluster import Cluster
    from layerwise.strategies.oracle.paradl import (
        ModelSummary,
        OracleCase,
        OracleReport,
        StrategyName,
        WeightUpdate,
    )
    from layerwise.strategies.oracle.platform import Platform
    from layerwise.strategies.oracle.table8 import Table8

SUMMARY_SUFFIXES = (".json", ".yaml", ".yml")
DEFAULT_GPUS = "1..1024"
DEFAULT_SAMPLES_PER_GPU = "32"
FIT_MEMORY = "fit"
TABLE8 = "table8"


def register(app: typer.Typer) -> None:
    """Add `oracle` to the CLI."""
    app.command("oracle")(oracle)


@user_errors
def oracle(
    model: Annotated[str, typer.Argument(
        help="Zoo name, package.module:factory, a model summary file (.json/.yaml), or "
             f"{TABLE8!r} for the paper's Table VIII.")],
    platform: Annotated[str, typer.Option(
        help="Oracle platform preset or file (strategies/oracle/platforms/), or a cluster "
             "preset name or YAML path.")] = "abci",
    gpus: Annotated[str, typer.Option(
        help='GPU counts: a comma list, "A..B" for the powers of two from A to B, or both.')
    ] = DEFAULT_GPUS,
    strategies: Annotated[str | None, typer.Option(
        help="Comma list of serial, data, spatial, filter, channel, pipeline, data+filter, "
             "data+spatial (default: all).")] = None,
    samples_per_gpu: Annotated[str, typer.Option(
        help="Samples per model replica: data parallelism's batch is this x GPUs, filter, "
             "channel and spatial keep this batch on any number of GPUs, the hybrids take "
             'this per node; or "fit" for the largest power of two that fits the GPU\'s '
             "memory.")] = DEFAULT_SAMPLES_PER_GPU,
    dataset_size: Annotated[int | None, typer.Option(
        help="Samples per epoch (default: ImageNet's 1,281,167 training images).")] = None,
    profile: Annotated[Path | None, typer.Option(
        help="Profile JSON from `layerwise profile` for FW/BW (default: the platform device's "
             "analytic t_c).")
    ] = None,
    image_size: Annotated[int | None, typer.Option(help="Input height and width.")] = None,
    weight_update: Annotated[str, typer.Option(
        help='"paper": the weight update priced as the paper\'s equations do; "none": left '
             "out, as the authors' analysis tool does.")] = "paper",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    save: Annotated[Path | None, typer.Option(help="Also write the report JSON here.")] = None,
) -> None:
    """Predict epoch time, communication and memory of each strategy per GPU count (ParaDL).

        layerwise oracle resnet50 --platform abci --gpus 4,64,1024
    """
    from layerwise.strategies.files.atomic import writable_file
    from layerwise.strategies.oracle.paradl import IMAGENET_TRAIN_SAMPLES
    from layerwise.strategies.oracle.paradl import oracle as run_oracle
    from layerwise.strategies.oracle.platform import load_platform

    if save is not None:
        writable_file(save, "--save")
    update = parse_weight_update(weight_update)
    where = load_platform(platform)
    if model == TABLE8:
        given = {"--gpus": gpus != DEFAULT_GPUS, "--strategies": strategies is not None,
                 "--samples-per-gpu": samples_per_gpu != DEFAULT_SAMPLES_PER_GPU,
                 "--dataset-size": dataset_size is not None, "--profile": profile is not None,
                 "--image-size": image_size is not None}
        _table8(where, update, as_json, save, [name for name, set_ in given.items() if set_])
        return
    cluster = where.cluster
    pes_counts = parse_gpus(gpus)
    chosen = parse_strategies(strategies)
    samples = parse_samples_per_gpu(samples_per_gpu)
    summary, source = model_summary(model, cluster, profile, image_size, samples)
    report = run_oracle(summary, where, pes_counts, chosen, samples_per_pe=samples,
                        dataset_size=IMAGENET_TRAIN_SAMPLES if dataset_size is None
                        else dataset_size, weight_update=update)
    if save is not None:
        report.save(save)
    if as_json:
        print_json(report.model_dump(mode="json"))
        return
    _print(report, summary, cluster, source)
    if save is not None:
        console.print(f"saved the report to {save}")


def parse_weight_update(text: str) -> WeightUpdate:
    """"paper" or "none"."""
    from layerwise.strategies.oracle.paradl import WeightUpdate

    choices = get_args(WeightUpdate)
    if text not in choices:
        raise LayerwiseError(f"--weight-update must be one of {', '.join(choices)} "
                             f"(got {text!r})")
    return cast("WeightUpdate", text)


def _table8(platform: Platform, update: WeightUpdate, as_json: bool, save: Path | None,
            given: list[str]) -> None:
    from layerwise.strategies.oracle.table8 import table8

    if given:
        raise LayerwiseError(f"{TABLE8} runs the paper's models, GPU counts and batches; "
                             f"{given[0]} does not apply to it (leave it out)")
    result = table8(platform, weight_update=update)
    if save is not None:
        write_atomic(save, result.model_dump_json(indent=1) + "\n")
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    _print_table8(result, _analytic_source(platform.cluster))
    if save is not None:
        console.print(f"saved the table to {save}")


def _print_table8(result: Table8, timed_by: str) -> None:
    console.print(
        f"Kahira et al. (HPDC 2021), Table VIII on {result.platform}: one epoch of "
        f"{result.dataset_size:,} ImageNet images, FW/BW from the {timed_by}, weight update "
        f"'{result.weight_update}'\nsamples per model replica (the authors' runs): "
        + ", ".join(f"{model} {samples}"
                    for model, samples in result.samples_per_replica.items()),
        highlight=False)
    table = Table(title_justify="left")
    for column in ("model", "GPUs", "strategy", "batch", "epoch", "compute", "comm",
                   "memory/GPU", "rank", "paper", ""):
        table.add_column(column, justify="left" if column in ("model", "strategy")
                         else "right")
    for row in result.rows:
        case = row.case
        table.add_row(row.model, str(row.gpus), case.strategy,
                      "-" if case.batch is None else str(case.batch),
                      _duration(case.epoch_seconds), _duration(case.compute_seconds),
                      _duration(case.communication_seconds),
                      _memory(case.memory_bytes_per_pe),
                      "-" if row.rank is None else str(row.rank),
                      "-" if row.paper_rank is None else str(row.paper_rank),
                      "ok" if row.matches else "DIFFERS")
    console.print(table)
    matched = sum(row.paper_rank is not None and row.matches for row in result.rows)
    stated = sum(row.paper_rank is not None for row in result.rows)
    console.print(f"ranks matching the paper: {matched} of {stated}", highlight=False)


def parse_gpus(text: str) -> list[int]:
    """GPU counts from "1,8,64", "1..1024" (powers of two between the ends) or a mix."""
    counts: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        low, dots, high = item.partition("..")
        ends = [_positive_count(end, text) for end in ((low, high) if dots else (item,))]
        if dots:
            counts.extend(1 << e for e in range(ends[1].bit_length())
                          if ends[0] <= 1 << e <= ends[1])
        else:
            counts.append(ends[0])
    if not counts:
        raise LayerwiseError(f"--gpus {text!r} holds no power of two; try 1..1024")
    return sorted(set(counts))


def _positive_count(text: str, whole: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise LayerwiseError(f"--gpus {whole!r}: {text.strip()!r} is not a positive whole number "
                             "(write e.g. 1,8,64 or 1..1024)")
    return int(text)


def parse_strategies(text: str | None) -> list[StrategyName]:
    """The strategies named in a comma list, in the order given; all of them for None."""
    from layerwise.strategies.oracle.paradl import STRATEGIES

    if text is None:
        return list(STRATEGIES)
    chosen: list[StrategyName] = []
    for name in (part.strip() for part in text.split(",")):
        if name not in STRATEGIES:
            raise LayerwiseError(f"unknown strategy {name!r}; choose from "
                                 f"{', '.join(STRATEGIES)}")
        if name not in chosen:
            chosen.append(cast("StrategyName", name))
    return chosen


def parse_samples_per_gpu(text: str) -> int | None:
    """A positive whole number, or None for "fit"."""
    if text.strip().lower() == FIT_MEMORY:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise LayerwiseError(f"--samples-per-gpu must be a positive whole number or "
                             f"{FIT_MEMORY!r} (got {text!r})")
    return int(text)


def model_summary(model: str, cluster: Cluster, profile: Path | None, image_size: int | None,
                  samples_per_gpu: int | None) -> tuple[ModelSummary, str]:
    """The oracle's view of MODEL and where its FW/BW come from: a summary file as written; a
    model's layer graph timed by a profile (at the profile's batch) or by the analytic t_c of
    the platform's device (at `samples_per_gpu`, 32 when fitting memory)."""
    from layerwise.strategies.cost.compute_time import AnalyticCompute, ProfiledCompute
    from layerwise.strategies.cost.profile import Profile
    from layerwise.strategies.model.graph import build_graph
    from layerwise.strategies.oracle.paradl import (
        DEFAULT_SAMPLES_PER_PE,
        ModelSummary,
        summary_from_graph,
    )

    if Path(model).suffix.lower() in SUMMARY_SUFFIXES:
        if profile is not None or image_size is not None:
            raise LayerwiseError("--profile and --image-size describe a model; a summary file "
                                 "already holds its layers and times")
        return ModelSummary.load(model), f"summary {model}"
    if profile is None:
        graph = build_graph(model, batch=samples_per_gpu or DEFAULT_SAMPLES_PER_PE,
                            image_size=image_size)
        return summary_from_graph(graph, AnalyticCompute(cluster)), _analytic_source(cluster)
    measured = Profile.load(profile)
    graph = build_graph(model, batch=measured.batch,
                        image_size=(image_size if image_size is not None
                                    else measured.input_shape[-1]),
                        in_channels=measured.input_shape[1])
    measured.check_matches(graph, source=profile)
    return (summary_from_graph(graph, ProfiledCompute(measured)),
            f"profile {profile} ({measured.device_name})")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _memory(nbytes: float | None) -> str:
    if nbytes is None:
        return "-"
    if nbytes < 2**30:
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{nbytes / 2**30:.2f} GiB"


def _row(rank: str, case: OracleCase) -> tuple[str, ...]:
    bottleneck = case.bottleneck if case.reason is None else f"{case.bottleneck}: {case.reason}"
    return (rank, case.strategy, _duration(case.epoch_seconds), _duration(case.compute_seconds),
            _duration(case.communication_seconds), _memory(case.memory_bytes_per_pe),
            "-" if case.batch is None else str(case.batch), bottleneck)


def _table(report: OracleReport, pes: int, cluster: Cluster) -> Table:
    nodes = -(-pes // cluster.devices_per_node)
    table = Table(title=f"{pes} GPU{'s' if pes > 1 else ''} ({nodes} node"
                        f"{'s' if nodes > 1 else ''} of {cluster.name})", title_justify="left")
    for column in ("#", "strategy", "epoch", "compute", "comm", "memory/GPU", "batch",
                   "bottleneck"):
        table.add_column(column, justify="left" if column in ("strategy", "bottleneck")
                         else "right")
    ranked = report.ranking[pes]
    for position, strategy in enumerate(ranked, start=1):
        table.add_row(*_row(str(position), report.case(strategy, pes)))
    for case in report.cases:
        if case.pes == pes and case.strategy not in ranked:
            table.add_row(*_row("-", case))
    return table


def _print(report: OracleReport, summary: ModelSummary, cluster: Cluster, source: str) -> None:
    sample_ms = sum(fw + bw for fw, bw in summary.layer_seconds()) * 1e3
    batch = ("the largest power of two per model replica that fits"
             if report.samples_per_pe is None
             else f"{report.samples_per_pe} samples per model replica")
    console.print(
        f"{summary.name}: {len(summary.layers)} layers, {summary.weights:,} weights, "
        f"{sample_ms:.3g} ms forward + backward per sample ({source})\n"
        f"{cluster.name}: {cluster.device.name}, {_memory(cluster.device.memory_bytes)}; "
        f"one epoch of {report.dataset_size:,} samples, {batch}", highlight=False)
    for pes in report.ranking:
        console.print(_table(report, pes, cluster))
    best = [f"{pes}: {ranked[0]}" if ranked else f"{pes}: none feasible"
            for pes, ranked in report.ranking.items()]
    console.print("fastest per GPU count: " + ", ".join(best), highlight=False)


def _analytic_source(cluster: Cluster) -> str:
    """What times FW/BW without a profile: the device model on a GPU with SM figures, else the
    roofline (strategies/cost/compute_time.py's AnalyticCompute)."""
    from layerwise.strategies.cost.compute_time import AnalyticCompute

    kind = "device model" if AnalyticCompute(cluster).device_model is not None else "roofline"
    return f"{kind} on {cluster.device.name}"
