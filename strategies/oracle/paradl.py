"""ParaDL: the analytic oracle of Kahira et al., HPDC 2021 (docs/research.md: ParaDL).

    layerwise oracle resnet50 --platform abci --gpus 1..1024

For each strategy (serial, data, spatial, filter, channel, pipeline, data+filter, data+spatial) and
number of PEs p, closed-form per-epoch compute, communication and memory per PE, computed from a
per-layer `ModelSummary` (x_l, y_l, |w_l|, FW_l, BW_l, WU_l) and the platform's links. Where
cost/cost_model.py costs one layer-wise configuration exactly (Jia et al., Eq. 1), the oracle is
coarse and whole-network: one strategy for every layer, ring collectives on an alpha-beta link,
compute and communication added without overlap. That is what lets it sweep a model to 1024 GPUs in
milliseconds, rank the strategies at each scale and name what limits each one.

Notation (the paper's): D dataset size, B mini-batch, p PEs, G layers, delta = 4 bytes (fp32),
alpha latency and beta seconds per byte of the link a collective runs over. An epoch is
ceil(D/B) whole iterations, as ParaDL counts them; every term is its per-iteration cost times
that count.

Samples per PE, s (given, or the largest power of two that fits the device's memory), is the
batch of one model replica: weak scaling grows B with the replicas only. Data parallelism has
p replicas of one PE, B = s * p; filter, channel and spatial split one replica over all p PEs,
B = s whatever p (every PE works on all s samples, whole or a tile of each); the hybrids have
one replica per node, B = s * p1; pipeline keeps p micro-batches of s in flight, B = s * p.

Choices the equations leave open, made here:
- link: a collective over p PEs runs at the alpha and beta of the platform's tier the p PEs
  span when packed densely from PE 0 (inside a node, between the nodes of a rack, across racks;
  layerwise.strategies.oracle.platform). The hybrids run their inner group inside a node and their
  outer group over one PE per node. Halo exchanges inside a node run over the platform's halo link
  (ABCI: PCIe, as ParaDL's spatial layers exchange halos), beyond a node over the slower of it and
  the tier's link.
- WU_l, when not given: a memory-bound SGD-with-momentum step reads weight, gradient and
  momentum and writes weight and momentum, 4 bytes each: 5 * delta * |w_l| / memory bandwidth.
  `weight_update="paper"` (the default) prices WU as the paper's equations do; "none" leaves it
  out of every strategy, as the authors' released analysis tool does (use it when FW/BW
  already hold the update).
- halo(x_l): the tile an interior PE owns of a (rows x columns) grid over H x W receives
  (k - 1) // 2 rows of its input tile's width per cut along H and (k - 1) // 2 columns of its
  height per cut along W (ParaDL's (K-1)/2: a 2x2 stride-2 pool needs none), at most two cuts
  per axis, corners left out; halo(dL/dy_l) likewise on the output. Layers with a 1x1 or 2x2
  kernel, or a 1x1 output (fully connected, global pooling), exchange no halo.
- filter and channel: the sum over l < G runs over the layers that mix channels (conv, fully
  connected); a per-channel layer (pooling, BatchNorm) works on its channel shard and exchanges
  nothing, as in ParaDL's analysis, which splits the conv layers only.
- pipeline: S = p segments (micro-batches of B/p = samples_per_pe samples: enough to keep every
  stage busy in the steady state); stages are contiguous layer ranges balanced on FW + BW; the
  data crossing a stage boundary is the output of the stage's last layer.
- pipeline memory (the paper gives none): the largest stage's share of serial memory.
- hybrids: p2 = the PEs of a node (all p below one node), p1 = nodes. data+filter's data term
  all-reduces each PE's weight shard |w|/p2 across nodes; data+spatial reduces gradients in
  two levels, inside the node (the spatial term) and then across nodes (the data term).
- p limits: serial p = 1; spatial p <= min H*W over layers with a spatial output; filter
  p <= min F_l over all layers, channel p <= min C_l from the second layer on (ParaDL's: the
  input's 3 channels do not bound it; the first layer's split leaves PEs idle, priced as the
  equations do); pipeline p <= G; hybrids need a whole number of nodes and apply the limit to
  p2. Data's p <= B always holds under weak scaling.
- bottleneck: "infeasible" (a p limit, or memory over the device's), else "memory" above 90%
  of the device's memory, else "communication" when it takes longer than compute, else
  "compute".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, NamedTuple, get_args

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from layerwise.strategies.cost.compute_time import ComputeSource, weight_update_seconds
from layerwise.strategies.errors import ConfigError, LayerwiseError
from layerwise.strategies.files.atomic import first_error, write_atomic
from layerwise.strategies.files.documents import YAML_SUFFIXES, read_document
from layerwise.strategies.hardware.cluster import Cluster, Link
from layerwise.strategies.model.graph import BYTES_PER_ELEMENT, Layer, LayerGraph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.tiles import as_view, largest_tile
from layerwise.strategies.oracle.platform import Platform

__all__ = [
    "DEFAULT_SAMPLES_PER_PE",
    "IMAGENET_TRAIN_SAMPLES",
    "MEMORY_WARNING_FRACTION",
    "SCHEMA_VERSION",
    "STRATEGIES",
    "LayerSummary",
    "ModelSummary",
    "OracleCase",
    "OracleReport",
    "StrategyName",
    "WeightUpdate",
    "halo_link",
    "ranks",
    "allgather_seconds",
    "allreduce_seconds",
    "collective_link",
    "EXECUTED_EQUIVALENT",
    "evaluate",
    "halo_elements",
    "oracle",
    "p2p_seconds",
    "pipeline_stages",
    "spatial_grid",
    "step_case",
    "step_cases",
    "split_forward_backward",
    "summary_from_graph",
    "weight_update_seconds",
]

SCHEMA_VERSION = 1
DELTA = BYTES_PER_ELEMENT  # the paper's delta: bytes per element, fp32
IMAGENET_TRAIN_SAMPLES = 1_281_167
DEFAULT_SAMPLES_PER_PE = 32
# A feasible case above this share of the device's memory is labelled "memory": it runs, but
# at the edge, so memory is what to relieve first.
MEMORY_WARNING_FRACTION = 0.9

StrategyName = Literal[
    "serial", "data", "spatial", "filter", "channel", "pipeline", "data+filter", "data+spatial"
]
STRATEGIES: tuple[StrategyName, ...] = get_args(StrategyName)
WeightUpdate = Literal["paper", "none"]
Bottleneck = Literal["compute", "communication", "memory", "infeasible"]

# Layers a summary keeps, as the paper's per-layer model counts them: conv, fc, pooling and
# BatchNorm-like ops left unfused; the input, residual adds, concatenations and flatten views
# are left out.
_SUMMARISED_KINDS = frozenset({"conv", "linear", "pool", "adaptive_pool", "resize",
                               "elementwise"})
_CHANNEL_MIXING_KINDS = frozenset({"conv", "linear"})


# ---------------------------------------------------------------------------------------------
# The model summary: what the oracle knows of a network
# ---------------------------------------------------------------------------------------------


class LayerSummary(BaseModel):
    """One layer as the oracle sees it; element counts are per sample, weights in total.

    `fw_seconds`/`bw_seconds` are per sample; `wu_seconds` per iteration (None: estimated
    from |w| and the device's memory bandwidth); `flops` per sample, forward, used to spread
    a summary's `sample_seconds`. Sizes are (H, W); 2-d tensors are 1x1. `mixes_channels`:
    every output channel reads every input channel (conv, fully connected), so filter and
    channel parallelism exchange activations at this layer; a per-channel layer (pooling,
    BatchNorm, activations) runs on its channel shard without (ParaDL splits only the former).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    x: int = Field(ge=0)
    y: int = Field(ge=0)
    w: int = Field(default=0, ge=0)
    fw_seconds: float | None = Field(default=None, ge=0)
    bw_seconds: float | None = Field(default=None, ge=0)
    wu_seconds: float | None = Field(default=None, ge=0)
    flops: float | None = Field(default=None, ge=0)
    in_channels: PositiveInt
    out_channels: PositiveInt
    input_size: tuple[PositiveInt, PositiveInt] = (1, 1)
    output_size: tuple[PositiveInt, PositiveInt] = (1, 1)
    kernel: tuple[PositiveInt, PositiveInt] = (1, 1)
    mixes_channels: bool = True

    @model_validator(mode="after")
    def _forward_with_backward(self) -> LayerSummary:
        if (self.fw_seconds is None) != (self.bw_seconds is None):
            raise ValueError("give fw_seconds and bw_seconds together, or neither")
        return self

    @property
    def output_hw(self) -> int:
        """H*W of the output: how many ways a spatial split can cut it."""
        return self.output_size[0] * self.output_size[1]


class ModelSummary(BaseModel):
    """A network as the oracle sees it: its layers in order.

    Per-sample compute comes either from every layer's fw_seconds/bw_seconds, or from
    `sample_seconds` (forward + backward of one sample through the whole network) spread over
    the layers in proportion to their `flops`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    name: str = Field(min_length=1)
    layers: tuple[LayerSummary, ...] = Field(min_length=1)
    sample_seconds: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _compute_is_known(self) -> ModelSummary:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema_version: this layerwise reads {SCHEMA_VERSION} "
                             f"(got {self.schema_version})")
        timed = [layer.fw_seconds is not None for layer in self.layers]
        if self.sample_seconds is None:
            if not all(timed):
                index = timed.index(False)
                raise ValueError(f"layers.{index}.fw_seconds: required (with bw_seconds) "
                                 "unless the summary gives sample_seconds")
            return self
        if any(timed):
            index = timed.index(True)
            raise ValueError(f"layers.{index}.fw_seconds: give per-layer times or "
                             "sample_seconds, not both")
        missing = [layer.flops is None for layer in self.layers]
        if any(missing):
            raise ValueError(f"layers.{missing.index(True)}.flops: required to spread "
                             "sample_seconds over the layers")
        if not sum(layer.flops or 0.0 for layer in self.layers):
            raise ValueError("layers: flops add up to 0, so sample_seconds cannot be spread")
        return self

    @property
    def weights(self) -> int:
        return sum(layer.w for layer in self.layers)

    def layer_seconds(self) -> list[tuple[float, float]]:
        """(FW_l, BW_l) per sample of every layer: given, or `sample_seconds` split by FLOPs."""
        if self.sample_seconds is None:
            return [(layer.fw_seconds or 0.0, layer.bw_seconds or 0.0) for layer in self.layers]
        flops = [layer.flops or 0.0 for layer in self.layers]
        total = sum(flops)
        return [split_forward_backward(self.sample_seconds * share / total, layer.w)
                for share, layer in zip(flops, self.layers, strict=True)]

    def save(self, path: str | Path) -> Path:
        """Write as YAML (.yaml/.yml) or JSON (anything else), atomically."""
        if Path(path).suffix.lower() in YAML_SUFFIXES:
            document = self.model_dump(mode="json", exclude_none=True)
            return write_atomic(path, yaml.safe_dump(document, sort_keys=False))
        return write_atomic(path, self.model_dump_json(indent=1, exclude_none=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ModelSummary:
        """Read a summary from YAML (.yaml/.yml) or JSON; LayerwiseError (one line) naming the
        file and the field on any problem."""
        source = Path(path)
        what = f"model summary {source}"
        data = read_document(source, what)
        if not isinstance(data, dict):
            raise LayerwiseError(f"{what}: the top level must be a mapping with name and "
                                 f"layers (got {type(data).__name__})")
        try:
            return cls.model_validate(data)
        except ValidationError as problem:
            raise LayerwiseError(f"{what}: {first_error(problem)}") from None


def split_forward_backward(seconds: float, weights: int) -> tuple[float, float]:
    """(FW, BW) of a forward + backward time: backward costs about twice the forward in a layer
    with weights (input and weight gradients) and about the forward otherwise, the rule
    compute.AnalyticCompute uses."""
    forward_share = 1 / 3 if weights else 1 / 2
    return seconds * forward_share, seconds * (1 - forward_share)


def summary_from_graph(graph: LayerGraph, compute: ComputeSource) -> ModelSummary:
    """The oracle's view of a layer graph, FW/BW per sample and WU per iteration from
    `compute`.

    `compute` is a ProfiledCompute (a profile measured at the graph's batch B) or an
    AnalyticCompute (the roofline on a cluster's device): the whole layer, the tile of the
    all-ones configuration, at batch B gives t, and t / B per sample, split by
    `split_forward_backward`. Only layers that compute on tensors count (conv, fc, pooling,
    unfused BatchNorm-like ops); the input, adds, concatenations and flatten views do not.
    """
    layers = [_layer_summary(layer, compute, graph.batch)
              for layer in graph.layers if layer.kind in _SUMMARISED_KINDS]
    return ModelSummary(name=graph.model, layers=tuple(layers))


def _layer_summary(layer: Layer, compute: ComputeSource, batch: int) -> LayerSummary:
    whole_layer = largest_tile(layer, ParallelConfig(devices=(0,)))
    fw, bw = split_forward_backward(compute.tile_seconds(layer, whole_layer) / batch,
                                    layer.param_count)
    # ParaDL models 2-d layers: a 3-d layer's depth is folded into its height
    _, in_channels, in_d, in_h, in_w = as_view(layer.input_shapes[0])
    _, out_channels, out_d, out_h, out_w = as_view(layer.output_shape)
    in_h, out_h = in_d * in_h, out_d * out_h
    return LayerSummary(
        name=layer.name,
        x=sum(math.prod(shape[1:]) for shape in layer.input_shapes),
        y=math.prod(layer.output_shape[1:]),
        w=layer.param_count,
        fw_seconds=fw,
        bw_seconds=bw,
        wu_seconds=compute.update_seconds(layer, whole_layer),
        flops=layer.flops / batch,
        in_channels=in_channels,
        out_channels=out_channels,
        input_size=(in_h, in_w),
        output_size=(out_h, out_w),
        kernel=_kernel(layer, (in_h, in_w), (out_h, out_w)),
        mixes_channels=layer.kind in _CHANNEL_MIXING_KINDS,
    )


def _kernel(layer: Layer, input_size: tuple[int, int],
            output_size: tuple[int, int]) -> tuple[int, int]:
    """The sliding window of a conv/pool layer; an adaptive pool's widest window; else 1x1."""
    if layer.geometry is not None:
        _, height, width = (1, 1, *layer.geometry.kernel)[-3:]
        return (height, width)
    if layer.kind == "adaptive_pool":
        return (-(-input_size[0] // output_size[0]), -(-input_size[1] // output_size[1]))
    return (1, 1)


# ---------------------------------------------------------------------------------------------
# The platform: links and collectives
# ---------------------------------------------------------------------------------------------


def collective_link(cluster: Cluster, pes: int, stride: int = 1) -> Link | None:
    """Alpha and beta of a collective over `pes` PEs `stride` apart from PE 0: the slowest link
    they span (inside a node, across nodes of a rack, across racks). None for one PE."""
    return cluster.slowest_link(range(0, pes * stride, stride))


def halo_link(platform: Platform, pes: int) -> Link | None:
    """The link a halo exchange over `pes` PEs packed from PE 0 runs over: the platform's
    halo link inside a node, beyond it the slower of that and the tier's link (min bandwidth,
    max latency); the tier's link alone where the platform names no halo link."""
    link = collective_link(platform.cluster, pes)
    if link is None or platform.halo is None:
        return link
    if pes <= platform.cluster.devices_per_node:
        return platform.halo
    return Link(bandwidth=min(link.bandwidth, platform.halo.bandwidth),
                latency=max(link.latency, platform.halo.latency))


def p2p_seconds(nbytes: float, link: Link | None) -> float:
    """T_p2p(m) = alpha + m * beta (docs/research.md: ParaDL); no link (one PE) moves nothing."""
    return 0.0 if link is None else link.time(nbytes)


def allreduce_seconds(pes: int, nbytes: float, link: Link | None) -> float:
    """Ring all-reduce of m bytes: T_allreduce(p, m) = 2(p-1)(alpha + m * beta / p), with
    the link's measured all-reduce figures where it has them (`layerwise calibrate`)."""
    if link is None:
        return 0.0
    return 2 * (pes - 1) * (link.allreduce_latency + nbytes / (pes * link.allreduce_bandwidth))


def allgather_seconds(pes: int, piece_bytes: float, link: Link | None) -> float:
    """Ring all-gather of an m-byte piece per PE: T_allgather(p, m) = (p-1)(alpha + m * beta)."""
    if link is None:
        return 0.0
    return (pes - 1) * link.time(piece_bytes)


# ---------------------------------------------------------------------------------------------
# Spatial halos and pipeline stages
# ---------------------------------------------------------------------------------------------


def _prime_factors(number: int) -> list[int]:
    factors, divisor = [], 2
    while divisor * divisor <= number:
        while number % divisor == 0:
            factors.append(divisor)
            number //= divisor
        divisor += 1
    return factors + ([number] if number > 1 else [])


def spatial_grid(pes: int, size: tuple[int, int]) -> tuple[int, int]:
    """(rows, columns) of PEs with rows * columns = p over an H x W map, tiles as square as can
    be: each prime factor of p, largest first, cuts the axis whose tiles are longer."""
    rows = columns = 1
    for factor in sorted(_prime_factors(pes), reverse=True):
        if size[0] / rows >= size[1] / columns:
            rows *= factor
        else:
            columns *= factor
    return rows, columns


def halo_elements(channels: int, size: tuple[int, int], kernel: tuple[int, int],
                  grid: tuple[int, int]) -> float:
    """halo(x_l) per sample: what an interior PE of the grid receives of an H x W map.

    The paper's approximation: (k - 1) // 2 rows of the tile's width per cut along H and as
    many columns of its height per cut along W, from its at most two neighbours per axis
    (corners left out), for every channel.
    """
    (height, width), (kernel_h, kernel_w), (rows, columns) = size, kernel, grid
    across_rows = min(rows - 1, 2) * ((kernel_h - 1) // 2) * width / columns
    across_columns = min(columns - 1, 2) * ((kernel_w - 1) // 2) * height / rows
    return channels * (across_rows + across_columns)


def pipeline_stages(costs: Sequence[float], stages: int) -> list[range]:
    """Cut layers into `stages` contiguous non-empty ranges minimising the largest sum of
    `costs` (exact: a binary search over every contiguous sum with a greedy check)."""
    if not 1 <= stages <= len(costs):
        raise ConfigError(f"cannot cut {len(costs)} layers into {stages} pipeline stages")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    sums = np.unique((prefix[None, :] - prefix[:, None])[np.triu_indices(len(prefix), 1)])
    # no stage costs less than its costliest layer; from there on the greedy check is exact
    candidates = sums[sums >= max(costs)]
    low, high = 0, len(candidates) - 1
    while low < high:
        middle = (low + high) // 2
        if len(_greedy_stage_starts(prefix, candidates[middle], 1)) <= stages:
            high = middle
        else:
            low = middle + 1
    starts = _greedy_stage_starts(prefix, candidates[low], stages)
    return [range(start, stop) for start, stop in zip(starts, [*starts[1:], len(costs)],
                                                      strict=True)]


def _greedy_stage_starts(prefix: np.ndarray, bound: float, stages: int) -> list[int]:
    """First layer of each stage when stages are filled up to `bound`, closing a stage early
    where the layers left are only just enough to give each of `stages` stages one."""
    layers = len(prefix) - 1
    starts = [0]
    for index in range(1, layers):
        over = prefix[index + 1] - prefix[starts[-1]] > bound
        if over or layers - index <= stages - len(starts):
            starts.append(index)
    return starts


# ---------------------------------------------------------------------------------------------
# The equations, per strategy (docs/research.md: ParaDL)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Network:
    """A summary's per-layer quantities as arrays (elements per sample; seconds per sample,
    WU per iteration)."""

    layers: tuple[LayerSummary, ...]
    x: np.ndarray
    y: np.ndarray
    w: np.ndarray
    fw: np.ndarray
    bw: np.ndarray
    wu: np.ndarray

    @classmethod
    def of(cls, summary: ModelSummary, memory_bandwidth: float,
           weight_update: WeightUpdate = "paper") -> _Network:
        seconds = np.array(summary.layer_seconds(), dtype=float)
        updates = [0.0 if weight_update == "none"
                   else layer.wu_seconds if layer.wu_seconds is not None
                   else weight_update_seconds(layer.w, memory_bandwidth)
                   for layer in summary.layers]
        return cls(layers=summary.layers,
                   x=np.array([layer.x for layer in summary.layers], dtype=float),
                   y=np.array([layer.y for layer in summary.layers], dtype=float),
                   w=np.array([layer.w for layer in summary.layers], dtype=float),
                   fw=seconds[:, 0], bw=seconds[:, 1], wu=np.array(updates, dtype=float))

    @property
    def activations(self) -> float:
        """sum(|x_l| + |y_l|): elements per sample a PE keeps for the backward pass."""
        return float((self.x + self.y).sum())

    @property
    def weights(self) -> float:
        return float(self.w.sum())

    @property
    def sample_seconds(self) -> float:
        """sum(FW_l + BW_l)."""
        return float((self.fw + self.bw).sum())


@dataclass(frozen=True)
class _Run:
    """One strategy at one scale: p PEs as outer x inner (hybrids: nodes x PEs per node; the
    others: inner = p), batch B, dataset size D and the links their collectives run over."""

    pes: int
    outer: int
    inner: int
    batch: int
    dataset_size: int
    link: Link | None  # over all p PEs
    inner_link: Link | None  # over the inner PEs (one node)
    outer_link: Link | None  # over the outer PEs, one per node
    halo_link: Link | None  # halo exchanges over the spatial PEs (all p, or one node's)

    @property
    def iterations(self) -> int:
        """ceil(D / B): iterations per epoch, whole ones (the last batch is not cut short)."""
        return -(-self.dataset_size // self.batch)


class _Terms(NamedTuple):
    compute: float
    communication: float


def _serial(net: _Network, run: _Run) -> _Terms:
    """T_comp = ceil(D/B) (B sum(FW + BW) + sum(WU)); no communication."""
    compute = run.iterations * (run.batch * net.sample_seconds + net.wu.sum())
    return _Terms(compute, 0.0)


def _data_compute(net: _Network, run: _Run) -> float:
    """T_comp = ceil(D/B) ((B/p) sum(FW + BW) + sum(WU)): every PE updates all weights."""
    return run.iterations * (run.batch / run.pes * net.sample_seconds + net.wu.sum())


def _data(net: _Network, run: _Run) -> _Terms:
    """T_comm = 2 ceil(D/B)(p-1)(alpha + sum|w| * delta * beta / p): one gradient all-reduce
    per iteration."""
    communication = run.iterations * allreduce_seconds(run.pes, net.weights * DELTA, run.link)
    return _Terms(_data_compute(net, run), communication)


def _halo_seconds(net: _Network, pes: int, samples: float, link: Link | None) -> float:
    """Per iteration, sum over layers of 2(2 alpha + B (halo(x_l) + halo(dL/dy_l)) delta beta)
    on a p-way grid with B = `samples`; layers without a halo exchange nothing."""
    if link is None:
        return 0.0
    total = 0.0
    for layer in net.layers:
        if layer.output_hw == 1:
            continue
        grid = spatial_grid(pes, layer.output_size)
        halo = (halo_elements(layer.in_channels, layer.input_size, layer.kernel, grid)
                + halo_elements(layer.out_channels, layer.output_size, layer.kernel, grid))
        if halo:
            total += 2 * (2 * link.latency + samples * halo * DELTA / link.bandwidth)
    return total


def _spatial(net: _Network, run: _Run) -> _Terms:
    """Compute as data; T_comm = data's all-reduce + per layer
    2 ceil(D/B)(2 alpha + B (halo(x_l) + halo(dL/dy_l)) delta beta) over the halo link."""
    per_iteration = (allreduce_seconds(run.pes, net.weights * DELTA, run.link)
                     + _halo_seconds(net, run.pes, run.batch, run.halo_link))
    return _Terms(_data_compute(net, run), run.iterations * per_iteration)


def _model_compute(net: _Network, run: _Run, shards: int) -> float:
    """T_comp = ceil(D/B) ((B/p) sum(FW + BW) + sum(WU) / shards): a PE updates its weight
    shard."""
    return run.iterations * (run.batch / run.pes * net.sample_seconds
                             + net.wu.sum() / shards)


def _activation_exchange_seconds(net: _Network, pes: int, samples: float,
                                 link: Link | None) -> float:
    """Per iteration, sum over the channel-mixing layers l < G of an all-gather of the y_l
    pieces forward and an all-reduce of dL/dx backward (or the reverse):
    3(p-1) sum(alpha + B |y_l| delta beta / p) with B = `samples`. Per-channel layers work on
    their shard and exchange nothing, as in ParaDL's analysis, which splits conv layers only."""
    total = 0.0
    for layer, elements in zip(net.layers[:-1], net.y[:-1], strict=True):
        if not layer.mixes_channels:
            continue
        nbytes = samples * elements * DELTA
        total += allgather_seconds(pes, nbytes / pes, link) + allreduce_seconds(pes, nbytes, link)
    return total


def _filter_or_channel(net: _Network, run: _Run) -> _Terms:
    """T_comp = ceil(D/B) ((B/p) sum(FW + BW) + sum(WU) / p);
    T_comm = 3 ceil(D/B)(p-1) sum over l < G of (alpha + B |y_l| delta beta / p)."""
    communication = run.iterations * _activation_exchange_seconds(net, run.pes, run.batch,
                                                                  run.link)
    return _Terms(_model_compute(net, run, run.pes), communication)


def _pipeline(net: _Network, run: _Run) -> _Terms:
    """S = p segments of B/S samples over stages G_i, per iteration:
    T_comp = B (p+S-1)/S (max_i FW_Gi + max_i BW_Gi) (the paper leaves WU out);
    T_comm = 2 (p+S-2) max_i (alpha + (B/S) |y_Gi| delta beta) over the stages that send."""
    segments = run.pes
    stages = pipeline_stages(net.fw + net.bw, run.pes)
    forward = max(float(net.fw[stage].sum()) for stage in stages)
    backward = max(float(net.bw[stage].sum()) for stage in stages)
    compute = (run.iterations * run.batch * (run.pes + segments - 1) / segments
               * (forward + backward))
    sends = [p2p_seconds(run.batch / segments * net.y[stage[-1]] * DELTA, run.link)
             for stage in stages[:-1]]
    communication = 2 * run.iterations * (run.pes + segments - 2) * max(sends, default=0.0)
    return _Terms(compute, communication)


def _data_filter(net: _Network, run: _Run) -> _Terms:
    """p = p1 * p2, filter inside a node, data across nodes. T_comp:
    ceil(D/B) ((B/p) sum(FW + BW) + sum(WU) / p2). T_comm: the filter term with (p2-1) on a
    node's B/p1 samples, 3 ceil(D/B)(p2-1) sum over l < G of (alpha + B |y_l| delta beta / p),
    plus the data term with (p1-1) on each PE's weight shard,
    2 ceil(D/B)(p1-1)(alpha + sum|w| delta beta / p)."""
    filter_term = _activation_exchange_seconds(net, run.inner, run.batch / run.outer,
                                               run.inner_link)
    data_term = allreduce_seconds(run.outer, net.weights * DELTA / run.inner, run.outer_link)
    return _Terms(_model_compute(net, run, run.inner),
                  run.iterations * (filter_term + data_term))


def _data_spatial(net: _Network, run: _Run) -> _Terms:
    """p = p1 * p2, spatial inside a node, data across nodes. Compute as data. T_comm: the
    spatial term with p2 and B/p1 samples per node (its all-reduce over the node's p2 PEs and
    the halos over the halo link) plus the data term with (p1-1),
    2 ceil(D/B)(p1-1)(alpha + sum|w| delta beta / p1): a two-level gradient all-reduce."""
    weight_bytes = net.weights * DELTA
    spatial_term = (allreduce_seconds(run.inner, weight_bytes, run.inner_link)
                    + _halo_seconds(net, run.inner, run.batch / run.outer, run.halo_link))
    data_term = allreduce_seconds(run.outer, weight_bytes, run.outer_link)
    return _Terms(_data_compute(net, run), run.iterations * (spatial_term + data_term))


# -- memory per PE: 2 * delta * (activations and their gradients + weights and gradients) -----


def _model_memory(net: _Network, run: _Run) -> float:
    """Filter and channel: 2 delta sum(B (|x_l| + |y_l|) + |w_l| / p); serial is its p = 1,
    2 delta sum(B (|x_l| + |y_l|) + |w_l|)."""
    return 2 * DELTA * (run.batch * net.activations + net.weights / run.pes)


def _data_memory(net: _Network, run: _Run) -> float:
    """2 delta sum((B/p)(|x_l| + |y_l|) + |w_l|); spatial and data+spatial alike."""
    return 2 * DELTA * (run.batch / run.pes * net.activations + net.weights)


def _pipeline_memory(net: _Network, run: _Run) -> float:
    """Ours (the paper gives none): the largest stage's share of serial memory,
    2 delta max_i sum over l in G_i of (B (|x_l| + |y_l|) + |w_l|); S segments of B/S samples
    in flight hold B samples' activations."""
    per_layer = run.batch * (net.x + net.y) + net.w
    return 2 * DELTA * max(float(per_layer[stage].sum())
                           for stage in pipeline_stages(net.fw + net.bw, run.pes))


def _data_filter_memory(net: _Network, run: _Run) -> float:
    """2 delta sum(B (|x_l| + |y_l|) / p1 + |w_l| / p2)."""
    return 2 * DELTA * (run.batch / run.outer * net.activations + net.weights / run.inner)


# -- p limits: the most PEs a strategy's split can use (hybrids: in a node's group, p2) -----


class _Limit(NamedTuple):
    most: int
    what: str  # why, as "p=... > {what}" reads it


def _serial_limit(net: _Network) -> _Limit | None:
    return _Limit(1, "1: serial runs on one PE")


def _data_limit(net: _Network) -> _Limit | None:
    """None: p <= B holds by construction under weak scaling, B = samples_per_pe * p."""
    return None


def _spatial_limit(net: _Network) -> _Limit | None:
    """p <= min H*W over the layers with a spatial output (a 1x1 output is not split)."""
    spatial = [layer.output_hw for layer in net.layers if layer.output_hw > 1]
    if not spatial:
        return _Limit(1, "1: no layer has a spatial output to split")
    return _Limit(min(spatial), f"min output H*W {min(spatial)}")


def _filter_limit(net: _Network) -> _Limit | None:
    smallest = min(layer.out_channels for layer in net.layers)
    return _Limit(smallest, f"min filters {smallest}")


def _channel_limit(net: _Network) -> _Limit | None:
    """p <= min C_l from the second layer on: the input's channels (3 for an image) do not
    bound it, as in ParaDL."""
    split = net.layers[1:] or net.layers
    smallest = min(layer.in_channels for layer in split)
    return _Limit(smallest, f"min input channels {smallest} (from the second layer)")


def _pipeline_limit(net: _Network) -> _Limit | None:
    return _Limit(len(net.layers), f"{len(net.layers)} layers")


# How many model replicas weak scaling multiplies the batch by, given (p, p1): B = s * replicas.
_Replicas = Callable[[int, int], int]


def _every_pe(pes: int, outer: int) -> int:
    return pes


def _one(pes: int, outer: int) -> int:
    return 1


def _every_node(pes: int, outer: int) -> int:
    return outer


class _Formulas(NamedTuple):
    terms: Callable[[_Network, _Run], _Terms]
    memory: Callable[[_Network, _Run], float]
    limit: Callable[[_Network], _Limit | None]
    hybrid: bool
    replicas: _Replicas


_FORMULAS: dict[StrategyName, _Formulas] = {
    "serial": _Formulas(_serial, _model_memory, _serial_limit, False, _one),
    "data": _Formulas(_data, _data_memory, _data_limit, False, _every_pe),
    "spatial": _Formulas(_spatial, _data_memory, _spatial_limit, False, _one),
    "filter": _Formulas(_filter_or_channel, _model_memory, _filter_limit, False, _one),
    "channel": _Formulas(_filter_or_channel, _model_memory, _channel_limit, False, _one),
    "pipeline": _Formulas(_pipeline, _pipeline_memory, _pipeline_limit, False, _every_pe),
    "data+filter": _Formulas(_data_filter, _data_filter_memory, _filter_limit, True,
                             _every_node),
    "data+spatial": _Formulas(_data_spatial, _data_memory, _spatial_limit, True, _every_node),
}


# ---------------------------------------------------------------------------------------------
# Cases and the report
# ---------------------------------------------------------------------------------------------


class OracleCase(BaseModel):
    """One strategy on p PEs: per-epoch seconds, memory per PE, and what limits it.

    The numbers are None where a p limit is broken (the equations do not apply); a case that
    only runs out of memory keeps them. `bottleneck`: "infeasible" (a p limit, or memory over
    the device's), else "memory" above MEMORY_WARNING_FRACTION of the device, else
    "communication" when it takes longer than compute, else "compute".
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: StrategyName
    pes: int
    samples_per_pe: int | None
    batch: int | None
    compute_seconds: float | None
    communication_seconds: float | None
    epoch_seconds: float | None
    memory_bytes_per_pe: float | None
    feasible: bool
    bottleneck: Bottleneck
    reason: str | None = None


class OracleReport(BaseModel):
    """Every (strategy, p) case of one model on one platform, and per p the feasible
    strategies fastest first. `samples_per_pe` None: the largest power of two that fits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    model: str
    platform: str
    dataset_size: int
    samples_per_pe: int | None
    cases: tuple[OracleCase, ...]
    ranking: dict[int, tuple[StrategyName, ...]]

    def case(self, strategy: StrategyName, pes: int) -> OracleCase:
        """The case of `strategy` on `pes` PEs (KeyError when it was not evaluated)."""
        for case in self.cases:
            if case.strategy == strategy and case.pes == pes:
                return case
        raise KeyError((strategy, pes))

    def save(self, path: str | Path) -> Path:
        """Write as JSON, atomically."""
        return write_atomic(path, self.model_dump_json(indent=1) + "\n")


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f}".removesuffix(".0") + " GiB"


def _split_pes(pes: int, devices_per_node: int, hybrid: bool) -> tuple[int, int] | None:
    """(outer, inner): a hybrid's p1 nodes x p2 PEs per node (p below a node: 1 x p); None when
    p is not a whole number of nodes. The other strategies: 1 x p."""
    if not hybrid or pes <= devices_per_node:
        return 1, pes
    if pes % devices_per_node:
        return None
    return pes // devices_per_node, devices_per_node


def _run(platform: Platform, pes: int, split: tuple[int, int], batch: int,
         dataset_size: int, hybrid: bool) -> _Run:
    outer, inner = split
    cluster = platform.cluster
    return _Run(pes=pes, outer=outer, inner=inner, batch=batch, dataset_size=dataset_size,
                link=collective_link(cluster, pes),
                inner_link=collective_link(cluster, inner),
                outer_link=collective_link(cluster, outer, stride=inner),
                halo_link=halo_link(platform, inner if hybrid else pes))


def _fitted_samples_per_pe(memory_at: Callable[[int], float], capacity: float,
                           most: int) -> int | None:
    """The largest power of two s <= `most` with memory_at(s) <= capacity; None if 1 does not
    fit. Memory grows with s, so the doubling stops at the first that does not fit."""
    fitted, samples = None, 1
    while samples <= most and memory_at(samples) <= capacity:
        fitted, samples = samples, samples * 2
    return fitted


def _bottleneck(compute: float, communication: float, memory: float,
                capacity: float) -> Bottleneck:
    if memory > MEMORY_WARNING_FRACTION * capacity:
        return "memory"
    return "communication" if communication > compute else "compute"


def _broken_limit(formulas: _Formulas, net: _Network, pes: int,
                  split: tuple[int, int] | None, devices_per_node: int) -> str | None:
    """Why the strategy cannot use `pes` PEs, or None when it can."""
    if split is None:
        return f"p={pes} is not a whole number of {devices_per_node}-PE nodes"
    limit = formulas.limit(net)
    if limit is None or split[1] <= limit.most:
        return None
    return f"{'p2' if formulas.hybrid else 'p'}={split[1]} > {limit.what}"


def _evaluate(net: _Network, platform: Platform, strategy: StrategyName, pes: int,
              samples_per_pe: int | None, dataset_size: int) -> OracleCase:
    formulas = _FORMULAS[strategy]
    cluster = platform.cluster
    split = _split_pes(pes, cluster.devices_per_node, formulas.hybrid)
    reason = _broken_limit(formulas, net, pes, split, cluster.devices_per_node)
    if split is None or reason is not None:
        return OracleCase(
            strategy=strategy, pes=pes, samples_per_pe=samples_per_pe,
            batch=None if samples_per_pe is None or split is None
            else samples_per_pe * formulas.replicas(pes, split[0]),
            compute_seconds=None, communication_seconds=None, epoch_seconds=None,
            memory_bytes_per_pe=None, feasible=False, bottleneck="infeasible", reason=reason)
    replicas = formulas.replicas(pes, split[0])
    capacity = cluster.device.memory_bytes
    run = _run(platform, pes, split, (samples_per_pe or 1) * replicas, dataset_size,
               formulas.hybrid)
    if samples_per_pe is None:
        fitted = _fitted_samples_per_pe(
            lambda samples: formulas.memory(net, replace(run, batch=samples * replicas)),
            capacity, max(1, dataset_size // replicas))
        run = replace(run, batch=(fitted or 1) * replicas)
    memory = formulas.memory(net, run)
    compute, communication = formulas.terms(net, run)
    fits = memory <= capacity
    return OracleCase(
        strategy=strategy, pes=pes, samples_per_pe=run.batch // replicas, batch=run.batch,
        compute_seconds=compute, communication_seconds=communication,
        epoch_seconds=compute + communication, memory_bytes_per_pe=memory, feasible=fits,
        bottleneck=_bottleneck(compute, communication, memory, capacity) if fits
        else "infeasible",
        reason=None if fits else (f"needs {_gib(memory)} per PE"
                                  + (" at 1 sample per PE" if samples_per_pe is None else "")
                                  + f", device has {_gib(capacity)}"))


def _platform(platform: Platform | Cluster) -> Platform:
    """A cluster is the platform whose tiers and halos are its own links."""
    if isinstance(platform, Cluster):
        return Platform(name=platform.name, cluster=platform)
    return platform


def _check_scale(cluster: Cluster, pes: int, samples_per_pe: int | None,
                 dataset_size: int) -> None:
    if pes < 1 or pes > cluster.num_devices:
        raise ConfigError(f"p={pes}: platform '{cluster.name}' has 1..{cluster.num_devices} PEs")
    if samples_per_pe is not None and samples_per_pe < 1:
        raise ConfigError(f"samples per PE must be >= 1 (got {samples_per_pe})")
    if dataset_size < 1:
        raise ConfigError(f"the dataset size must be >= 1 (got {dataset_size})")


def _check_weight_update(weight_update: str) -> None:
    if weight_update not in get_args(WeightUpdate):
        raise ConfigError(f"unknown weight update '{weight_update}'; choose from "
                          f"{', '.join(get_args(WeightUpdate))}")


def evaluate(summary: ModelSummary, platform: Platform | Cluster, strategy: StrategyName,
             pes: int, *, samples_per_pe: int | None = DEFAULT_SAMPLES_PER_PE,
             dataset_size: int = IMAGENET_TRAIN_SAMPLES,
             weight_update: WeightUpdate = "paper") -> OracleCase:
    """One strategy on `pes` PEs of `platform` (or a cluster) for one epoch of `dataset_size`
    samples.

    `samples_per_pe` is the batch of one replica (the module's note); None fits the largest
    power of two into the device's memory. ConfigError for an unknown strategy or weight
    update, or a scale the platform cannot hold.
    """
    if strategy not in _FORMULAS:
        raise ConfigError(f"unknown strategy '{strategy}'; choose from {', '.join(STRATEGIES)}")
    _check_weight_update(weight_update)
    where = _platform(platform)
    _check_scale(where.cluster, pes, samples_per_pe, dataset_size)
    net = _Network.of(summary, where.cluster.device.memory_bandwidth, weight_update)
    return _evaluate(net, where, strategy, pes, samples_per_pe, dataset_size)


def _ranking(cases: Iterable[OracleCase]) -> tuple[StrategyName, ...]:
    """Feasible strategies, fastest epoch first (ties keep the order they were asked in)."""
    timed = [(case.epoch_seconds, case.strategy) for case in cases
             if case.feasible and case.epoch_seconds is not None]
    return tuple(strategy for _, strategy in sorted(timed, key=lambda pair: pair[0]))


def ranks(cases: Iterable[OracleCase]) -> dict[StrategyName, int]:
    """Each feasible case's rank by epoch time, 1 the fastest; equal times (within 1e-9
    relative) share a rank and the next rank skips past them (1, 2, 3, 3)."""
    timed = sorted((case.epoch_seconds, case.strategy) for case in cases
                   if case.feasible and case.epoch_seconds is not None)
    ranked: dict[StrategyName, int] = {}
    for position, (seconds, strategy) in enumerate(timed, start=1):
        tied = [ranked[other] for other_seconds, other in timed[:position - 1]
                if math.isclose(seconds, other_seconds, rel_tol=1e-9)]
        ranked[strategy] = tied[0] if tied else position
    return ranked


def oracle(summary: ModelSummary, platform: Platform | Cluster, pes_counts: Sequence[int],
           strategies: Sequence[StrategyName] = STRATEGIES, *,
           samples_per_pe: int | None = DEFAULT_SAMPLES_PER_PE,
           dataset_size: int = IMAGENET_TRAIN_SAMPLES,
           weight_update: WeightUpdate = "paper") -> OracleReport:
    """Every strategy at every PE count, ranked per count by epoch time (feasible ones only)."""
    unknown = [name for name in strategies if name not in _FORMULAS]
    if unknown:
        raise ConfigError(f"unknown strategy '{unknown[0]}'; choose from {', '.join(STRATEGIES)}")
    _check_weight_update(weight_update)
    where = _platform(platform)
    for pes in pes_counts:
        _check_scale(where.cluster, pes, samples_per_pe, dataset_size)
    net = _Network.of(summary, where.cluster.device.memory_bandwidth, weight_update)
    cases = [_evaluate(net, where, strategy, pes, samples_per_pe, dataset_size)
             for pes in pes_counts for strategy in strategies]
    ranking = {pes: _ranking(case for case in cases if case.pes == pes) for pes in pes_counts}
    return OracleReport(model=summary.name, platform=where.name, dataset_size=dataset_size,
                        samples_per_pe=samples_per_pe, cases=tuple(cases), ranking=ranking)


# The ParaDL strategy that splits like each executed strategy, for predicting its measured runs:
# model parallelism splits every layer's output channels (filters); the others have none.
EXECUTED_EQUIVALENT: dict[str, StrategyName] = {
    "data": "data", "model": "filter", "spatial_h": "spatial", "spatial_w": "spatial",
    "spatial": "spatial",
    "pipeline": "pipeline",
}


def step_cases(summary: ModelSummary, platform: Platform | Cluster, pes: int,
               samples_per_pe: int, strategies: Sequence[StrategyName] = STRATEGIES,
               ) -> tuple[OracleCase, ...]:
    """Each strategy's case for ONE training step of the global batch `samples_per_pe * pes`
    on `pes` PEs: every strategy gets that batch (its samples per replica are the batch over
    its replicas), and an epoch of D = B samples is one step."""
    where = _platform(platform)
    batch = samples_per_pe * pes
    cases = []
    for strategy in strategies:
        formulas = _FORMULAS[strategy]
        split = _split_pes(pes, where.cluster.devices_per_node, formulas.hybrid)
        replicas = 1 if split is None else formulas.replicas(pes, split[0])
        cases.append(evaluate(summary, where, strategy, pes,
                              samples_per_pe=max(1, batch // replicas), dataset_size=batch))
    return tuple(cases)


def step_case(summary: ModelSummary, cluster: Cluster, executed: str, pes: int,
              samples_per_pe: int) -> OracleCase | None:
    """The oracle's case for ONE training step of an executed strategy on `pes` PEs at the
    executed run's global batch (`step_cases`): its epoch time is the step time the benchmark
    flow logs beside the measured one. None when ParaDL has no such strategy."""
    equivalent = EXECUTED_EQUIVALENT.get(executed)
    if equivalent is None:
        return None
    return step_cases(summary, cluster, pes, samples_per_pe, [equivalent])[0]
