"""OWT, "One weird trick" (Krizhevsky 2014, docs/research.md: OWT), as a strategy with its own cost.

K workers. The layers up to the flatten are sample-parallel: every worker holds all their
weights and runs b = B/K samples of the global batch B. The fully connected (FC) layers after
the flatten are channel-parallel: every worker holds 1/K of each FC layer's neurons. Conv layers
hold most of the compute and few of the weights, FC layers the reverse, so each part gets the
split that moves little data. The last conv activations (b x F per worker) reach the FC part by
one of three hand-offs, and their gradients go back the same way:
- a: all-gather, one FC pass over all K*b rows (backward: reduce-scatter);
- b: K turns; in turn j worker j broadcasts its b rows and every worker runs its FC slice on
  them (backward: reduce to worker j);
- c: K rounds; in round r every worker contributes its r-th b/K rows, so each round is a batch
  of b rows from all workers (backward: reduce-scatter); needs b % K == 0.
In b and c the next pass's hand-off runs while this pass's FC layers compute.
Conv weight gradients are synchronised as every worker owning 1/K of them: a reduce-scatter
then an all-gather of the flat gradient.

With `variable_batch` the FC weights take one SGD step after each of the K partial passes, on
the gradient of that pass's mean loss (batch b), while the conv weights take one step per
global batch (batch B); scheme a has one pass, so its variable batch equals its fixed batch
(`owt_a_vb` is accepted and identical to `owt_a`). The exact rule is in
engine.py, which runs these schemes.

Bytes: every scheme moves what Eq. 1 counts for the OWT configs: each worker's b x F rows to the
K-1 others and their gradients back, and the column all-gathers between consecutive FC layers,
so `predicted.transfer_bytes` and `predicted.sync_bytes` are the cost model's and the engine
counts exactly as much. Times are this module's model of each schedule (`predict`), except
sync: Eq. 1's t_s, as for every strategy with the same configs (the cluster's `sync` mode says
how a flat gradient's all-reduce is priced: `bucketed` is closest to the engine's one buffer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from layerwise.strategies.breakdown import Breakdown
from layerwise.strategies.cost.compute_time import AnalyticCompute
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.errors import ConfigError
from layerwise.strategies.hardware.cluster import Link, load_cluster
from layerwise.strategies.model.graph import BYTES_PER_ELEMENT, Layer, LayerGraph, build_graph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.tiles import largest_tile
from layerwise.strategies.schedules.owt.execution import OwtExecution
from layerwise.strategies.search.baselines import baseline
from layerwise.strategies.strategy import Strategy

Scheme = Literal["a", "b", "c"]

SCHEMES: dict[str, tuple[Scheme, bool]] = {
    "owt_a": ("a", False),
    "owt_b": ("b", False),
    "owt_c": ("c", False),
    "owt_a_vb": ("a", True),
    "owt_b_vb": ("b", True),
    "owt_c_vb": ("c", True),
}

IMAGENET_TRAIN_IMAGES = 1_281_167
REPRODUCE_MODEL = "alexnet"
REPRODUCE_CLUSTER = "k20x8"
REPRODUCE_BATCH_PER_GPU = 128
REPRODUCE_GPUS = (1, 2, 4, 8)


@dataclass(frozen=True)
class OwtSplit:
    """The two parts of a network that OWT treats differently (layer names, graph order)."""

    samples: tuple[str, ...]  # the input, every 4-d layer and the flatten: sample-parallel
    flatten: str  # its output, b x F per worker, is what the hand-off moves
    channels: tuple[str, ...]  # the chain of Linear layers after it: channel-parallel


def _not_owt(graph: LayerGraph, reason: str) -> ConfigError:
    return ConfigError(
        f"OWT needs conv/pool layers, one flatten, then a chain of Linear layers each feeding "
        f"the next up to the output; {graph.model}: {reason}")


def owt_split(graph: LayerGraph) -> OwtSplit:
    """The sample-parallel and channel-parallel parts of `graph`, or one ConfigError."""
    flattens = [layer for layer in graph.layers if layer.kind == "flatten"]
    if len(flattens) != 1:
        raise _not_owt(graph, f"it has {len(flattens)} flatten layers")
    flatten = flattens[0]
    channels = [layer for layer in graph.layers
                if len(layer.output_shape) == 2 and layer is not flatten]
    if not channels:
        raise _not_owt(graph, f"no Linear layer follows '{flatten.name}'")
    previous = flatten.name
    for layer in channels:
        if layer.kind != "linear" or layer.inputs != (previous,):
            raise _not_owt(graph, f"layer '{layer.name}' ({layer.label}) is not a Linear "
                                  f"layer fed by '{previous}' alone")
        if graph.consumers[previous] != (layer.name,):
            raise _not_owt(graph, f"'{previous}' feeds {', '.join(graph.consumers[previous])}")
        if any(fused.op.startswith("BatchNorm") for fused in layer.fused):
            raise ConfigError(
                f"layer '{layer.name}' ({layer.label}) normalises over the batch, but OWT's FC "
                "passes see b samples at a time; OWT runs FC layers without BatchNorm")
        previous = layer.name
    if graph.consumers[previous] or graph.outputs != (previous,):
        raise _not_owt(graph, f"the output is {', '.join(graph.outputs)}, not the last Linear "
                              f"layer '{previous}' alone")
    samples = tuple(layer.name for layer in graph.layers
                    if len(layer.output_shape) != 2 or layer is flatten)
    return OwtSplit(samples=samples, flatten=flatten.name,
                    channels=tuple(layer.name for layer in channels))


def check_owt(graph: LayerGraph, workers: int, scheme: Scheme) -> OwtSplit:
    """The split, after checking that `scheme` can run `graph`'s batch on `workers` workers.

    The configs are `n=K` / `c=K` on all K workers, and configs split in powers of two.
    """
    split = owt_split(graph)
    if workers & (workers - 1):
        raise ConfigError(f"OWT splits every layer over all workers, in a power of two; "
                          f"{workers} workers is not one")
    if graph.batch % workers:
        raise ConfigError(f"OWT gives every worker B/K samples: a global batch of {graph.batch} "
                          f"does not split over {workers} workers")
    for name in split.channels:
        neurons = graph.by_name[name].output_shape[1]
        if neurons < workers:
            raise ConfigError(f"OWT splits every FC layer's neurons over all {workers} workers; "
                              f"layer '{name}' has only {neurons}")
    per_worker = graph.batch // workers
    if scheme == "c" and per_worker % workers:
        raise ConfigError(
            f"OWT scheme c sends b/K of every worker's b samples to each worker: b = "
            f"{per_worker} samples per worker is not a multiple of K = {workers} workers; use "
            f"a batch per worker that is a multiple of {workers}")
    return split


def owt_assignment(graph: LayerGraph, workers: int) -> dict[str, ParallelConfig]:
    """The per-layer configs: the `owt` baseline (n=K up to the flatten, c=K after it)."""
    return baseline("owt", graph, workers)


def _all_gather_seconds(link: Link | None, workers: int, piece_elements: int) -> float:
    """Ring all-gather (or reduce-scatter) of one piece per worker: K-1 steps of one piece."""
    if link is None:
        return 0.0
    return (workers - 1) * link.time(piece_elements * BYTES_PER_ELEMENT)


def _broadcast_seconds(link: Link | None, workers: int, elements: int) -> float:
    """Pipelined broadcast (or reduce) along a chain: the buffer once, K-1 latencies."""
    if link is None:
        return 0.0
    return (workers - 1) * link.latency + elements * BYTES_PER_ELEMENT / link.bandwidth


def _handoff_seconds(scheme: Scheme, link: Link | None, workers: int, rows: int,
                     features: int) -> float:
    """One pass's hand-off, forward plus its mirrored backward (rows = b per worker)."""
    if scheme == "a":
        return 2 * _all_gather_seconds(link, workers, rows * features)
    if scheme == "b":
        return 2 * _broadcast_seconds(link, workers, rows * features)
    return 2 * _all_gather_seconds(link, workers, rows // workers * features)


def _seconds(seconds: Callable[[Layer, list[ParallelConfig]], np.ndarray], graph: LayerGraph,
             names: Iterable[str], assignment: dict[str, ParallelConfig]) -> float:
    """The sum of `seconds` (a CostModel's pass_seconds or update_seconds) over the layers."""
    return sum(float(seconds(graph.by_name[name], [assignment[name]])[0]) for name in names)


def predict(cost: CostModel, scheme: Scheme, variable_batch: bool) -> Breakdown:
    """Predicted step of an OWT scheme on `cost`'s graph and devices.

    - compute: Eq. 1's t_c of the OWT configs, except that in b and c each FC layer runs K
      passes of its pass tile (`pass_config`: b rows, 1/K of the neurons), measured by a
      profile (`profiled_configs` puts it in every profile's plan) or priced by the device
      model. K passes are not one pass of B rows: each reads the worker's weight shard and
      accumulates its gradient again (AlexNet on 2 CPU processes: 1.4-1.8x owt_a's step), and small
      GEMMs leave a GPU's SMs idle (the device model's waves). The variable batch adds K-1 FC
      weight updates per step (the cost model's update of the worker's FC shards, measured or
      memory-bound).
    - transfer: h, one pass's hand-off forward and backward over the slowest link among the K
      devices. a: h, exposed. b, c: the next pass's hand-off runs during this pass's FC compute
      f, so only the first is exposed in full: h + (K-1) max(0, h - f), Krizhevsky's (K-1)/K
      hidden when h <= f. Plus, per pass, the column all-gathers between consecutive FC layers
      and their reduce-scatters backward, in the critical path.
    - sync: Eq. 1's t_s of the OWT configs (the conv gradients' all-reduce as the cluster's
      `sync` prices it, and the two all-reduces of 2C statistics per BatchNorm of the conv
      part), the one pricing of this traffic, so that OWT and the `owt` baseline, equal in
      configs and bytes, are equal in sync.
    - bytes: Eq. 1's for the OWT configs, which is what every scheme moves.
    """
    graph, workers = cost.graph, cost.devices
    split = check_owt(graph, workers, scheme)
    assignment = owt_assignment(graph, workers)
    equation_1 = cost.evaluate(assignment)
    link = cost.cluster.slowest_link(range(workers))
    passes = 1 if scheme == "a" else workers
    per_worker = graph.batch // workers
    features = graph.by_name[split.flatten].output_shape[1]
    fc_seconds = _seconds(cost.pass_seconds, graph, split.channels, assignment)
    fc_passes_seconds = fc_seconds
    if passes > 1:
        fc_passes_seconds = passes * sum(
            cost.compute.tile_seconds(layer, largest_tile(layer, pass_config(workers)))
            for layer in (graph.by_name[name] for name in split.channels))
    handoff = _handoff_seconds(scheme, link, workers, per_worker, features)
    rows = graph.batch // passes
    between_fc = sum(
        2 * _all_gather_seconds(link, workers,
                                rows * -(-graph.by_name[name].output_shape[1] // workers))
        for name in split.channels[:-1])
    transfer = (handoff + (passes - 1) * max(0.0, handoff - fc_passes_seconds / passes)
                + passes * between_fc)
    compute = equation_1.compute_seconds - fc_seconds + fc_passes_seconds
    if variable_batch:
        compute += (passes - 1) * _seconds(cost.update_seconds, graph, split.channels,
                                           assignment)
    sync = equation_1.sync_seconds
    return Breakdown(step_seconds=compute + transfer + sync, compute_seconds=compute,
                     transfer_seconds=transfer, sync_seconds=sync,
                     transfer_bytes=equation_1.transfer_bytes, sync_bytes=equation_1.sync_bytes)


def pass_config(workers: int) -> ParallelConfig:
    """The config whose largest tile is one worker's FC tile in one pass of schemes b and c:
    B/K rows (n=K) of 1/K of the neurons (c=K). It spans K^2 devices, beyond the K a run's
    search space holds, so profiles add it (`profiled_configs`)."""
    return ParallelConfig(n=workers, c=workers, devices=tuple(range(workers * workers)))


def profiled_configs(graph: LayerGraph, devices: int) -> dict[str, list[ParallelConfig]]:
    """Per FC layer, the pass configs of every worker count OWT can run on up to `devices`
    (a power of two from 2 that splits the batch and every FC layer's neurons): what a profile
    must time beyond the search space for `predict` to price schemes b and c. Empty for a
    graph OWT cannot run."""
    try:
        split = owt_split(graph)
    except ConfigError:
        return {}
    counts = [workers for workers in (2 ** k for k in range(1, devices.bit_length()))
              if not graph.batch % workers
              and all(graph.by_name[name].output_shape[1] >= workers for name in split.channels)]
    return {name: [pass_config(workers) for workers in counts] for name in split.channels}


def build_strategy(name: str, cost: CostModel) -> Strategy:
    """The OWT strategy `name` (owt_a, owt_b, owt_c, with _vb: variable batch) with its cost."""
    if name not in SCHEMES:
        raise ConfigError(f"unknown OWT strategy '{name}'; choose from {', '.join(SCHEMES)}")
    scheme, variable_batch = SCHEMES[name]
    predicted = predict(cost, scheme, variable_batch)
    return Strategy.from_assignment(
        name, cost.graph, cost.devices, cost.cluster.name, cost.compute.name,
        owt_assignment(cost.graph, cost.devices), predicted,
        OwtExecution(scheme=scheme, variable_batch=variable_batch))


class EpochEstimate(BaseModel):
    """Predicted ImageNet epoch of one OWT scheme and batch mode on `gpus` GPUs."""

    model_config = ConfigDict(frozen=True)

    gpus: int
    scheme: Scheme
    variable_batch: bool
    step: Breakdown
    steps_per_epoch: int
    epoch_hours: float
    speedup: float  # over the same scheme and batch mode on the fewest GPUs (one by default)


def epoch_estimates(gpus: tuple[int, ...] = REPRODUCE_GPUS) -> list[EpochEstimate]:
    """Krizhevsky 2014's experiment in simulation: AlexNet (224 px, 1000 classes), 128 images
    per GPU, on the k20x8 preset with the K20's device-model t_c; one ImageNet epoch per scheme,
    batch mode and GPU count."""
    cluster = load_cluster(REPRODUCE_CLUSTER)
    compute = AnalyticCompute(cluster)
    estimates: list[EpochEstimate] = []
    single: dict[tuple[Scheme, bool], float] = {}
    for count in sorted(gpus):
        graph = build_graph(REPRODUCE_MODEL, batch=REPRODUCE_BATCH_PER_GPU * count)
        cost = CostModel(graph, cluster, count, compute)
        steps = math.ceil(IMAGENET_TRAIN_IMAGES / graph.batch)
        for name, (scheme, variable_batch) in SCHEMES.items():
            if scheme == "a" and variable_batch:
                continue  # equal to owt_a (one FC pass)
            step = build_strategy(name, cost).predicted
            hours = steps * step.step_seconds / 3600
            single.setdefault((scheme, variable_batch), hours)
            estimates.append(EpochEstimate(
                gpus=count, scheme=scheme, variable_batch=variable_batch, step=step,
                steps_per_epoch=steps, epoch_hours=hours,
                speedup=single[(scheme, variable_batch)] / hours))
    return estimates


def reprice(strategy: Strategy, cost: CostModel) -> Strategy:
    """A saved OWT strategy checked against `cost`'s graph and workers (its scheme's batch
    rules, as the engine checks them) and priced afresh."""
    execution = strategy.execution
    assert isinstance(execution, OwtExecution)
    name = next(name for name, scheme in SCHEMES.items()
                if scheme == (execution.scheme, execution.variable_batch))
    return build_strategy(name, cost)
