"""The cost model (Eq. 1) against measured steps over many plans, side by side in one run.

    .venv/bin/python benchmarks/bench_cost_model.py                 # 4 models, 24 plans each
    .venv/bin/python benchmarks/bench_cost_model.py --models lenet5 --plans 12 --steps 6
    .venv/bin/python benchmarks/bench_cost_model.py --mlflow        # and log the sweep
    .venv/bin/python benchmarks/bench_cost_model.py --remeasure    # and the machine's own error

For each model, plans drawn from the whole search space on --nproc processes: the data, OWT
and spatial baselines, the plan searched with this machine's profile and calibration, and random
plans of three kinds (each layer's config drawn on its own; runs of consecutive layers sharing a
config; one config, changed at a random cut), so that sample, channel, height and width splits,
mixed ones, uneven tiles and plans on fewer devices than there are all appear. Every plan is
priced by one calibration of the links and one concurrent profile of the tiles it uses (t_c as a
run of --nproc ranks meets it), taken just before, and measured in one set of processes that
build every plan and give each a step on every batch in turn, in a new order per batch
(bench_runtime.py's interleaving: each plan meets the same state of the machine).

Every process runs as layerwise's own do, with huge pages for large CPU tensors
(strategies/processes/huge_pages.py; `THP_MEM_ALLOC_ENABLE=0` turns them off), the profile's
included. Where the machine has at least --nproc GPUs, the ranks run one per GPU over NCCL, as
bench_runtime.py's do: the links are calibrated with NCCL, t_c is profiled on one GPU with CUDA
events (each rank has a device of its own), and the steps are timed after a device synchronise;
the waits the runtime's clock reads there are the host's (a GPU's collective returns before it
ends), so the transfer and sync columns say less than on CPUs.

Printed per model: mean and worst |measured / predicted - 1|, the median ratio, Kendall's tau
between the measured and predicted orders (1: the model ranks every pair of plans as measured),
the mean error and tau again over the plans that split depth, height or width somewhere,
the measurement's own spread (the slowest over the fastest of plans that are the same configs
under different names, a baseline the search or a draw also found: no model can be closer than
that), and the plans it misprices most with their predicted terms (compute, transfer, sync).
With --remeasure, a second set of processes measures the same plans again, just after the first:
the mean |second / first - 1| and Kendall's tau between the two are what this machine repeats
itself to: the floor under any model's error here, and the ceiling over its tau; and the model's
tau again over the pairs of plans both measurements order alike (the pairs this machine can
rank), which tells a misordering the machine also makes from one it does not. With
--mlflow, one MLflow run per sweep (the tracking URI from MLFLOW_TRACKING_URI, else ./mlflow.db):
per plan the predicted and measured step as a table artifact, the scatter as a figure, the
summary numbers as metrics.

The runtime times its own waits (`Communicator.clock`: the seconds a rank is blocked in its
exchanges and all-reduces), so each plan's measured step splits into transfer, sync and the rest
(compute and the runtime's own work) beside the predicted t_x, t_s and t_c; a second table gives
per model the median measured/predicted of each term, which says which term a misprice comes
from.

The same measured steps are also priced by variants of the model (`VARIANTS`: exchanges at
rank 0's wait, as calibrations before method 4 took them, there on a bare exchange; exchanges
without the slowing of the layer after each; no bucket copy; one-device layers at their tiles'
time profiled alone), so that what a term does is read off one sweep, not across sweeps the
machine drifts between. The plans fall into two halves drawn at random (seeded): a change is
chosen on one half and read on the other, never fitted to the plans it is judged by.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table
from scipy.stats import kendalltau

from layerwise.strategies.processes.huge_pages import huge_pages_in_use, use_huge_pages

# as every layerwise process runs (its CLI, the launcher's workers, the profile they plan with),
# before anything imports torch: on 4 KB pages each ResNet-18 step page-faults ~64 MB of fresh
# memory per rank (16,000 faults) that a profiled tile, repeated, does not (docs/performance.md)
use_huge_pages()

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runtime import Job, Run, on_gpus, run  # noqa: E402  (the interleaved runs, shared)

from layerwise.strategies.breakdown import Breakdown  # noqa: E402
from layerwise.strategies.cost.compute_time import ProfiledCompute  # noqa: E402
from layerwise.strategies.cost.cost_model import CostModel  # noqa: E402
from layerwise.strategies.cost.profile import (  # noqa: E402
    Profile,
    concurrent_threads,
    profile_graph,
    profile_graph_concurrently,
)
from layerwise.strategies.cost.tables import LayerTiles  # noqa: E402
from layerwise.strategies.hardware.calibrate import (  # noqa: E402
    Calibration,
    calibrate,
    calibrated_cluster,
    fit_alpha_beta,
)
from layerwise.strategies.hardware.cluster import Cluster  # noqa: E402
from layerwise.strategies.model.graph import Layer, LayerGraph, build_graph  # noqa: E402
from layerwise.strategies.model.space import ParallelConfig  # noqa: E402
from layerwise.strategies.runtime.comm import Waits, least_waiting  # noqa: E402
from layerwise.strategies.search.baselines import baseline  # noqa: E402
from layerwise.strategies.search.elimination import optimal_strategy  # noqa: E402

# a model of each shape: plain conv stack, one wide FC layer, residual adds, concatenations
MODELS = ("lenet5", "wide_fc", "resnet18", "tiny_cnn")
IMAGE_SIZE = {"lenet5": 32, "wide_fc": 16, "resnet18": 32, "tiny_cnn": 32}
BASELINES = ("data", "owt", "spatial_h", "spatial_w", "model")
Assignment = dict[str, ParallelConfig]


@dataclass(frozen=True)
class Repeatability:
    """The same plans measured by two sets of processes, one just after the other: the mean
    |second / first - 1| of their median steps and Kendall's tau between the two orders; the
    pairs of plans both order alike (`repeated_pairs` of `pairs`: the pairs this machine can
    rank at all) and the model's Kendall tau over those pairs alone (`model_tau_repeated`:
    concordant less discordant over them), which says whether its misorderings are ones the
    machine itself makes."""

    mean_error: float
    kendall_tau: float
    repeated_pairs: int
    pairs: int
    model_tau_repeated: float


def repeatability(predicted: Mapping[str, float], first: Mapping[str, Sequence[float]],
                  second: Mapping[str, Sequence[float]]) -> Repeatability:
    """`Repeatability` of two measurements of the same plans (plan -> step seconds), with the
    model's tau over the pairs both measurements order alike (`predicted`: plan -> step)."""
    names = sorted(first)
    once = [statistics.median(first[name]) for name in names]
    again = [statistics.median(second[name]) for name in names]
    model = [predicted[name] for name in names]
    pairs = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))]
    agreed = [(i, j) for i, j in pairs
              if once[i] != once[j] and (once[i] < once[j]) == (again[i] < again[j])
              and again[i] != again[j]]
    score = sum(0 if model[i] == model[j] else 1 if (model[i] < model[j]) == (once[i] < once[j])
                else -1 for i, j in agreed)
    return Repeatability(
        mean_error=statistics.fmean(abs(b / a - 1) for a, b in zip(once, again, strict=True)),
        kendall_tau=float(kendalltau(once, again).statistic), repeated_pairs=len(agreed),
        pairs=len(pairs), model_tau_repeated=score / len(agreed) if agreed else float("nan"))


@dataclass(frozen=True)
class PlanResult:
    """One plan's prediction and its measured step, medians over the timed steps; transfer
    and sync are the waits of each step's busiest rank (`measured_terms`), `rest` the step
    less both (compute and the runtime's own work)."""

    name: str
    predicted: Breakdown
    step: float
    transfer: float
    sync: float
    exchanges: float  # the busiest rank's point-to-point exchanges per step
    spatial: bool = False  # some layer split along d, h or w (a 1-d layer's length is w)
    # the step as each of VARIANTS prices it, by the variant's name
    variants: Mapping[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.step / self.predicted.step_seconds

    @property
    def rest(self) -> float:
        return self.step - self.transfer - self.sync


def measured_terms(seconds: Sequence[float],
                   waits: Sequence[Sequence[tuple[Mapping[str, float], Mapping[str, int]]]]
                   ) -> tuple[float, float, float, float]:
    """Median step, transfer, sync (the loss's all-reduces included) and exchanges over the
    timed steps, per step those of the rank that waited least (`comm.least_waiting`).
    `waits`: per rank, per step, (seconds, calls) per category (`comm.Waits`)."""
    terms = []
    for step in range(len(seconds)):
        waited, calls = least_waiting([Waits(*rank[step]) for rank in waits])
        # the loss's all-reduces are priced in the output layer's t_s
        terms.append((waited.get("transfer", 0.0),
                      waited.get("sync", 0.0) + waited.get("loss", 0.0),
                      calls.get("transfer", 0)))
    return (statistics.median(seconds), statistics.median(t[0] for t in terms),
            statistics.median(t[1] for t in terms), statistics.median(t[2] for t in terms))


@dataclass(frozen=True)
class Pricing:
    """What a sweep prices its plans with: the calibration and its cluster, the concurrent
    profile, and `alone`, the one-device configs' tiles profiled in one process (each GPU
    rank's profile is its own already: the concurrent one)."""

    graph: LayerGraph
    world: int
    calibration: Calibration
    cluster: Cluster
    profile: Profile
    alone: Profile


class AloneOnOneDevice(ProfiledCompute):
    """t_c from the concurrent profile, but a config on one device from its tile profiled
    alone: while one rank computes such a layer the others wait for its output, so it has the
    machine's cores' caches and memory bandwidth to itself."""

    def __init__(self, concurrent: Profile, alone: Profile) -> None:
        super().__init__(concurrent)
        self.alone = ProfiledCompute(alone)

    def configs_seconds(self, layer: Layer, tiles: LayerTiles,
                        configs: Sequence[ParallelConfig]) -> np.ndarray:
        return self._read_alone(super().configs_seconds(layer, tiles, configs),
                                self.alone.configs_seconds, layer, tiles, configs)

    def configs_update_seconds(self, layer: Layer, tiles: LayerTiles,
                               configs: Sequence[ParallelConfig]) -> np.ndarray:
        return self._read_alone(super().configs_update_seconds(layer, tiles, configs),
                                self.alone.configs_update_seconds, layer, tiles, configs)

    @staticmethod
    def _read_alone(together: np.ndarray, alone: Callable[..., np.ndarray], layer: Layer,
                    tiles: LayerTiles, configs: Sequence[ParallelConfig]) -> np.ndarray:
        """`together`, with the one-device configs' entries read by `alone` instead."""
        one_device = [index for index, config in enumerate(configs) if config.size == 1]
        if one_device:
            together[one_device] = alone(layer, tiles, [configs[i] for i in one_device])
        return together


def _exchanges_fitted(pricing: Pricing, nbytes: Sequence[int],
                      seconds: Sequence[float]) -> CostModel:
    """The model with its exchanges fitted to these times instead of the calibration's."""
    latency, bandwidth = fit_alpha_beta(nbytes, seconds)
    links = pricing.cluster.links
    link = links.intra_node.model_copy(update={"latency": latency, "bandwidth": bandwidth})
    cluster = pricing.cluster.model_copy(update={"links": links.model_copy(
        update={"intra_node": link})})
    return CostModel(pricing.graph, cluster, pricing.world, ProfiledCompute(pricing.profile))


def _one_rank_exchanges(pricing: Pricing) -> CostModel:
    """Exchanges priced as rank 0 waited for them (the calibration's `p2p_one_rank` points:
    the other rank's late layer included, the next layer's slowing not), as calibrations
    before method 4 took them (on a bare exchange, without the runtime's packing)."""
    points = pricing.calibration.measured("p2p_one_rank")
    return _exchanges_fitted(pricing, [point.bytes for point in points],
                             [point.seconds for point in points])


def _nothing_after_exchanges(pricing: Pricing) -> CostModel:
    """Exchanges priced at the later rank's wait alone, without what the layer after each
    loses (`p2p` less `p2p_after`)."""
    points = pricing.calibration.measured("p2p")
    after = pricing.calibration.measured("p2p_after")
    return _exchanges_fitted(pricing, [point.bytes for point in points],
                             [point.seconds - slower.seconds
                              for point, slower in zip(points, after, strict=True)])


def _no_bucket_copy(pricing: Pricing) -> CostModel:
    """Gradient sync without the runtime's copy of each bucket into its flat buffer."""
    cluster = pricing.cluster.model_copy(update={"bucket_copy_bandwidth": None})
    return CostModel(pricing.graph, cluster, pricing.world, ProfiledCompute(pricing.profile))


def _one_device_alone(pricing: Pricing) -> CostModel:
    """One-device layers at their tiles' time profiled alone (`AloneOnOneDevice`)."""
    return CostModel(pricing.graph, pricing.cluster, pricing.world,
                     AloneOnOneDevice(pricing.profile, pricing.alone))


# The model priced another way, each beside the model as it is: what one term does to the
# error and the order, on the same measured steps
VARIANTS: dict[str, Callable[[Pricing], CostModel]] = {
    "exchanges as one rank waits": _one_rank_exchanges,
    "nothing after an exchange": _nothing_after_exchanges,
    "no bucket copy": _no_bucket_copy,
    "one-device layers as profiled alone": _one_device_alone,
}


def halves(names: Sequence[str], seed: int) -> tuple[list[str], list[str]]:
    """The plans in two halves drawn at random (seeded): a variant is chosen on the first
    and read on the second."""
    shuffled = random.Random(seed).sample(list(names), len(names))
    return sorted(shuffled[:len(names) // 2]), sorted(shuffled[len(names) // 2:])


def _one_device_configs(cost: CostModel) -> dict[str, list[ParallelConfig]]:
    """Per layer, one config of its space on a single device (none where it has none): the
    tiles `AloneOnOneDevice` reads alone."""
    return {name: [config for config in configs if config.size == 1][:1]
            for name, configs in cost.configs.items()}


def random_plans(graph: LayerGraph, space: Mapping[str, Sequence[ParallelConfig]], count: int,
                 rng: random.Random) -> dict[str, Assignment]:
    """`count` distinct plans drawn from `space` in turn by three rules: each layer's config on
    its own; runs of 1-4 consecutive layers sharing one config (where each allows it); one
    config for every layer that has it, another after a random cut."""
    names = [layer.name for layer in graph.layers]
    plans: dict[str, Assignment] = {}
    tries = 0
    while len(plans) < count and tries < 50 * count:
        tries += 1
        rule = len(plans) % 3
        plan: Assignment = {}
        if rule == 0:
            plan = {name: rng.choice(space[name]) for name in names}
        elif rule == 1:
            index = 0
            while index < len(names):
                run_length = rng.randint(1, 4)
                wanted = rng.choice(space[names[index]])
                for name in names[index:index + run_length]:
                    plan[name] = wanted if wanted in space[name] else rng.choice(space[name])
                index += run_length
        else:
            cut = rng.randint(1, len(names) - 1)
            first, second = rng.choice(space[names[1]]), rng.choice(space[names[-1]])
            for position, name in enumerate(names):
                wanted = first if position < cut else second
                plan[name] = wanted if wanted in space[name] else rng.choice(space[name])
        key = "|".join(plan[name].text for name in names)
        if key not in {"|".join(p[name].text for name in names) for p in plans.values()}:
            plans[f"random-{len(plans) + 1:02d}"] = plan
    return plans


def sweep(model: str, args: argparse.Namespace, console: Console, rng: random.Random
          ) -> tuple[list[PlanResult], float | None, float, Repeatability | None]:
    """Every plan of one model, predicted and measured, the largest ratio of the slowest to
    the fastest measured step among plans of identical configs (None when no two are
    identical), the calibrated latency of an exchange, and with --remeasure the plans'
    repeatability (else None)."""
    world = args.nproc
    batch = args.batch_per_device * world
    graph = build_graph(model, batch, IMAGE_SIZE[model], 10)
    threads = concurrent_threads(world)
    cuda = on_gpus(world)
    backend = "nccl" if cuda else "gloo"
    console.print(f"{model}: calibrating {world} {backend} processes and profiling every "
                  "config ...")
    calibration = calibrate(world, backend)
    cluster = calibrated_cluster(calibration)
    # CPU ranks share one machine's cores, so their tiles are profiled side by side; each GPU
    # rank has a device of its own, profiled alone with CUDA events
    profile = (profile_graph(graph, world, device="cuda", threads=threads) if cuda else
               profile_graph_concurrently(graph, world, world, device="cpu", threads=threads))
    cost = CostModel(graph, cluster, world, ProfiledCompute(profile))
    alone = profile if cuda else profile_graph(graph, world, device="cpu", threads=threads,
                                               configs=_one_device_configs(cost))
    plans: dict[str, Assignment] = {name: dict(baseline(name, graph, world))
                                    for name in BASELINES}
    plans["searched"] = dict(optimal_strategy(cost).assignment)
    plans |= random_plans(graph, cost.configs, args.plans - len(plans), rng)
    predicted = {name: cost.evaluate(plan) for name, plan in plans.items()}
    pricing = Pricing(graph, world, calibration, cluster, profile, alone)
    priced = {variant: change(pricing) for variant, change in VARIANTS.items()}
    alternatives = {name: {variant: model.evaluate(plan).step_seconds
                           for variant, model in priced.items()}
                    for name, plan in plans.items()}
    runs = tuple(Run(name, "layerwise", {layer: config.text for layer, config in plan.items()})
                 for name, plan in plans.items())
    console.print(f"{model}: {len(runs)} plans side by side, {args.warmup} + {args.steps} "
                  "steps each, interleaved ...")
    job = Job(model=model, image_size=IMAGE_SIZE[model], batch=batch, steps=args.steps,
              warmup=args.warmup, runs=runs, threads=threads, cuda=cuda)
    measured = run(job, world)
    repeated = None
    if args.remeasure:
        console.print(f"{model}: the same plans again, in a second set of processes ...")
        repeated = repeatability({name: step.step_seconds for name, step in predicted.items()},
                                 measured["seconds"], run(job, world)["seconds"])
    results = [PlanResult(name, predicted[name],
                          *measured_terms(measured["seconds"][name], measured["waits"][name]),
                          spatial=any(config.d * config.h * config.w > 1
                                      for config in plans[name].values()),
                          variants=alternatives[name])
               for name in plans]
    same: dict[str, list[float]] = {}
    for result in results:
        same.setdefault("|".join(plans[result.name][layer.name].text
                                 for layer in graph.layers), []).append(result.step)
    spreads = [max(steps) / min(steps) for steps in same.values() if len(steps) > 1]
    return (results, max(spreads) if spreads else None, cluster.links.intra_node.latency,
            repeated)


def ranks_text(world: int) -> str:
    return f"{world} GPUs (nccl)" if on_gpus(world) else f"{world} CPU processes (gloo)"


def summary(rows: list[PlanResult]) -> dict[str, float]:
    """Mean and worst |measured/predicted - 1|, the median ratio, Kendall's tau, and each
    term's median measured/predicted over the plans that predict some of it (NaN: none)."""
    errors = [abs(row.ratio - 1) for row in rows]
    tau = kendalltau([row.predicted.step_seconds for row in rows],
                     [row.step for row in rows]).statistic

    def term_ratio(measured: str, predicted: str) -> float:
        ratios = [getattr(row, measured) / getattr(row.predicted, predicted) for row in rows
                  if getattr(row.predicted, predicted) > 0]
        return statistics.median(ratios) if ratios else float("nan")
    return {"mean_error": statistics.fmean(errors), "worst_error": max(errors),
            "median_ratio": statistics.median(row.ratio for row in rows),
            "kendall_tau": float(tau), "plans": float(len(rows)),
            "transfer_ratio": term_ratio("transfer", "transfer_seconds"),
            "sync_ratio": term_ratio("sync", "sync_seconds"),
            "rest_over_compute": term_ratio("rest", "compute_seconds"),
            "seconds_per_exchange": statistics.median(
                [row.transfer / row.exchanges for row in rows if row.exchanges]
                or [float("nan")])}


AS_PRICED = "as priced"


def variant_summary(rows: list[PlanResult], seed: int) -> dict[str, dict[str, float]]:
    """Per variant (and the model as priced), the mean |measured/predicted - 1| and Kendall's
    tau over each half of the plans (`halves`): `mean_a`, `tau_a`, `mean_b`, `tau_b`."""
    first, _ = halves([row.name for row in rows], seed)
    numbers: dict[str, dict[str, float]] = {}
    for variant in (AS_PRICED, *VARIANTS):
        def price(row: PlanResult, variant: str = variant) -> float:
            return (row.predicted.step_seconds if variant == AS_PRICED
                    else row.variants[variant])
        numbers[variant] = {}
        for half, chosen in (("a", [row for row in rows if row.name in first]),
                             ("b", [row for row in rows if row.name not in first])):
            numbers[variant][f"mean_{half}"] = statistics.fmean(
                abs(row.step / price(row) - 1) for row in chosen)
            numbers[variant][f"tau_{half}"] = float(kendalltau(
                [price(row) for row in chosen], [row.step for row in chosen]).statistic)
    return numbers


def log_to_mlflow(results: dict[str, list[PlanResult]],
                  summaries: dict[str, dict[str, float]],
                  variants: dict[str, dict[str, dict[str, float]]],
                  args: argparse.Namespace) -> str:
    """One MLflow run for the sweep: the per-plan table, the scatter, the summary metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow

    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI",
                                           f"sqlite:///{Path('mlflow.db').resolve()}"))
    mlflow.set_experiment("layerwise-cost-model")
    with mlflow.start_run(run_name=f"cost model over {args.plans} plans x "
                                   f"{len(results)} models") as active:
        mlflow.log_params({"nproc": args.nproc, "plans": args.plans, "steps": args.steps,
                           "models": ",".join(results), "huge_pages": huge_pages_in_use(),
                           "ranks": ranks_text(args.nproc)})
        for model, numbers in summaries.items():
            mlflow.log_metrics({f"{model}.{key}": value for key, value in numbers.items()})
        for model, by_variant in variants.items():
            mlflow.log_metrics({f"{model}.{variant}.{key}": value
                                for variant, numbers in by_variant.items()
                                for key, value in numbers.items()})
        table: dict[str, list[object]] = {key: [] for key in (
            "model", "plan", "predicted_s", "measured_s", "ratio", "compute_s", "transfer_s",
            "sync_s", "measured_transfer_s", "measured_sync_s", "measured_rest_s",
            *(f"{variant}_s" for variant in VARIANTS))}
        for model, rows in results.items():
            for row in rows:
                prediction = row.predicted
                for key, value in zip(table, (
                        model, row.name, prediction.step_seconds, row.step, row.ratio,
                        prediction.compute_seconds, prediction.transfer_seconds,
                        prediction.sync_seconds, row.transfer, row.sync, row.rest,
                        *(row.variants[variant] for variant in VARIANTS)), strict=True):
                    table[key].append(value)
        figure = scatter_figure(table, f"Eq. 1 against {ranks_text(args.nproc)}")
        mlflow.log_table(table, "cost_model_plans.json")
        mlflow.log_figure(figure, "cost_model_scatter.png")
        plt.close(figure)
        return active.info.run_id


def scatter_figure(table: Mapping[str, Sequence[object]], title: str) -> Figure:
    """Measured against predicted step per plan, a colour per model, on log axes (the models'
    steps span two decades), with the diagonal and the +-25% band around it."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.5, 6))
    models = list(dict.fromkeys(table["model"]))
    for model in models:
        rows = [index for index, name in enumerate(table["model"]) if name == model]
        axes.scatter([float(table["predicted_s"][i]) * 1e3 for i in rows],  # type: ignore[arg-type]
                     [float(table["measured_s"][i]) * 1e3 for i in rows],  # type: ignore[arg-type]
                     label=model, s=18)
    values = [float(v) * 1e3 for key in ("predicted_s", "measured_s")  # type: ignore[arg-type]
              for v in table[key]]
    low, high = min(values) / 1.3, max(values) * 1.3
    axes.plot([low, high], [low, high], color="grey", linewidth=1, label="measured = predicted")
    for factor in (0.75, 1.25):
        axes.plot([low, high], [low * factor, high * factor], color="grey", linewidth=0.6,
                  linestyle="--")
    axes.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), title=title,
             xlabel="predicted step (ms)", ylabel="measured step (ms; dashed: +-25%)")
    axes.legend()
    return figure


def _terms_text(row: PlanResult) -> str:
    p = row.predicted
    return (f"{row.name} {row.ratio:.2f}: {p.compute_seconds * 1e3:.1f} -> {row.rest * 1e3:.1f}, "
            f"{p.transfer_seconds * 1e3:.1f} -> {row.transfer * 1e3:.1f}, "
            f"{p.sync_seconds * 1e3:.1f} -> {row.sync * 1e3:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=sorted(IMAGE_SIZE))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--batch-per-device", type=int, default=16)
    parser.add_argument("--plans", type=int, default=24, help="plans per model, baselines and "
                        "the searched one among them")
    # 24: gloo's collectives here stall a scheduler tick now and then, so a step varies by up to
    # 2x; over 6 steps the same plans measured twice ordered alike 0.59-0.78 (Kendall's tau),
    # over 24 0.78-0.93 (docs/performance.md)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mlflow", action="store_true", help="log the sweep as one MLflow run")
    parser.add_argument("--remeasure", action="store_true", help="measure the plans again in a "
                        "second set of processes: the machine's own repeatability")
    args = parser.parse_args()
    if args.plans < len(BASELINES) + 2:
        parser.error(f"--plans must be at least {len(BASELINES) + 2} (the baselines, the "
                     "searched plan and a random one)")
    console = Console(width=150)
    rng = random.Random(args.seed)
    swept = {model: sweep(model, args, console, rng) for model in args.models}
    results = {model: rows for model, (rows, _, _, _) in swept.items()}
    summaries = {model: summary(rows) for model, rows in results.items()}
    for model, (_, spread, latency, repeated) in swept.items():
        summaries[model]["latency"] = latency
        if spread is not None:
            summaries[model]["identical_spread"] = spread
        if repeated is not None:
            summaries[model]["remeasured_mean_error"] = repeated.mean_error
            summaries[model]["remeasured_kendall_tau"] = repeated.kendall_tau
            summaries[model]["repeated_pairs"] = repeated.repeated_pairs
            summaries[model]["pairs"] = repeated.pairs
            summaries[model]["kendall_tau_repeated_pairs"] = repeated.model_tau_repeated
        spatial = [row for row in results[model] if row.spatial]
        if len(spatial) > 1:  # the plans that split d, h or w somewhere, stated apart
            numbers = summary(spatial)
            summaries[model] |= {"spatial_plans": numbers["plans"],
                                 "spatial_mean_error": numbers["mean_error"],
                                 "spatial_kendall_tau": numbers["kendall_tau"]}
    table = Table(title=f"Eq. 1 against measured steps, {ranks_text(args.nproc)}, "
                        f"{args.plans} plans per model")
    for column in ("model", "plans", "mean |m/p - 1|", "worst", "median m/p", "Kendall tau",
                   "identical plans' spread", "remeasured mean / tau",
                   "tau on repeated pairs (n of N)", "d/h/w plans: count, mean / tau"):
        table.add_column(column, justify="left" if column == "model" else "right")
    mispriced = Table(title="the plans it misprices most (m/p: compute, transfer, sync ms, "
                            "predicted -> measured; compute measured as the rest)")
    mispriced.add_column("model")
    mispriced.add_column("plan")
    for model, rows in results.items():
        numbers = summaries[model]
        table.add_row(model, f"{int(numbers['plans'])}", f"{numbers['mean_error']:.2f}",
                      f"{numbers['worst_error']:.2f}", f"{numbers['median_ratio']:.2f}",
                      f"{numbers['kendall_tau']:.2f}",
                      f"{numbers['identical_spread']:.2f}" if "identical_spread" in numbers
                      else "-",
                      f"{numbers['remeasured_mean_error']:.2f} / "
                      f"{numbers['remeasured_kendall_tau']:.2f}"
                      if "remeasured_mean_error" in numbers else "-",
                      f"{numbers['kendall_tau_repeated_pairs']:.2f} "
                      f"({int(numbers['repeated_pairs'])} of {int(numbers['pairs'])})"
                      if "repeated_pairs" in numbers else "-",
                      f"{int(numbers['spatial_plans'])}, {numbers['spatial_mean_error']:.2f} / "
                      f"{numbers['spatial_kendall_tau']:.2f}" if "spatial_plans" in numbers
                      else "-")
        for row in sorted(rows, key=lambda row: -abs(row.ratio - 1))[:3]:
            mispriced.add_row(model, _terms_text(row))
    console.print(table)
    console.print(mispriced)
    terms = Table(title="each term measured / predicted, median over the plans that predict "
                        "some of it (rest: the step less the measured waits, against t_c)")
    for column in ("model", "transfer", "sync", "rest / compute", "ms per exchange",
                   "calibrated latency ms"):
        terms.add_column(column, justify="left" if column == "model" else "right")
    for model, numbers in summaries.items():
        terms.add_row(model, *(f"{numbers[key]:.2f}" for key in (
            "transfer_ratio", "sync_ratio", "rest_over_compute")),
            f"{numbers['seconds_per_exchange'] * 1e3:.2f}", f"{numbers['latency'] * 1e3:.2f}")
    console.print(terms)
    variants = {model: variant_summary(rows, args.seed) for model, rows in results.items()}
    compared = Table(title="the same steps priced by each variant, on two halves of the plans "
                           "drawn at random: choose on A, read on B")
    for column in ("model", "variant", "A: mean |m/p - 1|", "A: tau", "B: mean |m/p - 1|",
                   "B: tau"):
        compared.add_column(column, justify="left" if column in ("model", "variant")
                            else "right")
    for model, by_variant in variants.items():
        for variant, numbers in by_variant.items():
            compared.add_row(model, variant, *(f"{numbers[key]:.2f}" for key in (
                "mean_a", "tau_a", "mean_b", "tau_b")))
    console.print(compared)
    if args.mlflow:
        console.print(f"logged MLflow run {log_to_mlflow(results, summaries, variants, args)}")


if __name__ == "__main__":
    main()
