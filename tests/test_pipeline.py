"""The pipeline of Akintoye et al. (docs/research.md: pipeline): its search is exact, its 1F1B step
equals one device's step, and it sends exactly the bytes it predicts.

The search is checked against brute force over every legal cut set, device split and M (pure
Python). The engine runs on real gloo processes: one launch at world 2 runs every 2-stage case,
one at world 4 the case with two devices per stage; rank 0 compares each case with the plain
module trained on one process, as tests/distributed.py does. The equivalence cases run in fp64
(see tests/test_runtime.py); there the engine sends 8-byte elements where the cost model
counts 4.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from functools import cache

import pytest
import torch
import torch.distributed as dist
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.strategies.cost.compute_time import AnalyticCompute
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.errors import ConfigError
from layerwise.strategies.hardware.cluster import cluster_from_mapping, load_cluster
from layerwise.strategies.model.graph import BYTES_PER_ELEMENT, LayerGraph, build_graph
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.runtime.engine_protocol import MODEL_STATE_KEY, EngineContext
from layerwise.strategies.schedules.pipeline.engine import PipelineEngine
from layerwise.strategies.schedules.pipeline.execution import PipelineExecution, PipelineStage
from layerwise.strategies.schedules.pipeline.planner import (
    MICRO_BATCHES_PER_STAGE,
    PipelineCosts,
    check_execution,
    crossing,
    evaluate,
    legal_cuts,
    optimal_pipeline,
    plan_strategy,
    row_pieces,
)
from layerwise.strategies.strategy import Strategy
from layerwise.strategies.training_run import RunResult, TrainSettings
from tests import distributed
from tests.distributed import spawn_cases

FP64 = {"rtol": 1e-5, "atol": 1e-7}
FP32 = {"rtol": 1e-4, "atol": 1e-5}

# two nodes of two devices, the link between them ten times slower: placement matters
TWO_NODES = cluster_from_mapping({
    "name": "two-nodes", "nodes": 2, "devices_per_node": 2,
    "device": {"name": "cpu", "peak_flops_fp32": "100 GFLOP/s", "memory_bytes": "16 GiB",
               "memory_bandwidth": "20 GB/s"},
    "links": {"intra_node": {"bandwidth": "2 GB/s", "latency": "50 us"},
              "inter_node": {"bandwidth": "200 MB/s", "latency": "500 us"}},
})


@cache  # tracing under fake tensors costs a second a model; every case and rank reuses it
def _graph(model: str, batch: int, image_size: int = 32) -> LayerGraph:
    return build_graph(model, batch, image_size, 10)


def _cost(graph: LayerGraph, devices: int, cluster_name: str = "local") -> CostModel:
    cluster = TWO_NODES if cluster_name == TWO_NODES.name else load_cluster(cluster_name)
    return CostModel(graph, cluster, devices, AnalyticCompute(cluster))


# ---- the search ---------------------------------------------------------------------------


def _compositions(total: int, parts: int) -> list[list[int]]:
    """Every sequence of `parts` powers of two that adds up to `total`."""
    powers = [1 << e for e in range(total.bit_length())]
    return [list(seq) for seq in itertools.product(powers, repeat=parts) if sum(seq) == total]


def brute_force(costs: PipelineCosts, stages: int | None = None) -> float:
    """The least predicted step time over every legal cut set, device split and M."""
    graph, batch = costs.graph, costs.batch
    best = float("inf")
    for count in range(1, costs.devices + 1) if stages is None else (stages,):
        for cut_set in itertools.combinations(costs.cuts, count - 1):
            boundaries = [0, *cut_set, len(graph.layers)]
            stages_at = list(zip(boundaries[:-1], boundaries[1:], strict=True))
            for widths in _compositions(costs.devices, count):
                for micro in range(1, MICRO_BATCHES_PER_STAGE * count + 1):
                    if batch % micro or any((batch // micro) % width for width in widths):
                        continue
                    if all(costs.fits(start, stop, batch // micro // width)
                           for (start, stop), width in zip(stages_at, widths, strict=True)):
                        plan = evaluate(costs, boundaries, widths, micro)
                        best = min(best, plan.step_seconds)
    return best


SMALL_IMAGE = {"lenet5": 16, "tiny_cnn": 8, "alexnet": 24, "resnet18": 32}


@pytest.mark.parametrize(("model", "batch", "devices", "cluster"), [
    ("lenet5", 8, 2, "local"), ("lenet5", 8, 3, "local"), ("lenet5", 16, 4, "two-nodes"),
    ("tiny_cnn", 8, 4, "local"), ("tiny_cnn", 4, 4, "two-nodes"), ("alexnet", 4, 4, "local"),
    ("resnet18", 4, 2, "local"),  # BatchNorm at 1x1 needs two samples per device
])
def test_the_dp_finds_the_brute_force_optimum(model, batch, devices, cluster):
    cost = _cost(_graph(model, batch, SMALL_IMAGE[model]), devices, cluster)
    plan = optimal_pipeline(cost)
    costs = PipelineCosts(cost)
    assert plan.step_seconds == pytest.approx(brute_force(costs), rel=1e-12)
    assert sum(len(stage.devices) for stage in plan.stages) == devices
    two = optimal_pipeline(cost, stages=2)
    assert len(two.stages) == 2
    assert two.step_seconds == pytest.approx(brute_force(costs, stages=2), rel=1e-12)


def test_the_plan_reports_its_model():
    cost = _cost(_graph("alexnet", 16), 2)
    plan = optimal_pipeline(cost, stages=2, micro_batches=4)
    assert plan.bubble_fraction == pytest.approx(1 / 5)
    slowest = max(s.compute_seconds + s.transfer_seconds for s in plan.stages)
    tail = max(s.update_seconds for s in plan.stages)  # one device per stage: no sync
    assert tail > 0
    assert plan.step_seconds == pytest.approx(5 * slowest + tail)
    assert plan.speedup == pytest.approx(plan.one_device_step_seconds / plan.step_seconds)
    one = optimal_pipeline(_cost(_graph("alexnet", 16), 1))
    assert one.step_seconds == pytest.approx(plan.one_device_step_seconds)
    first = plan.stages[0]
    per_sample = math.prod(cost.graph.by_name[first.layers[-1]].output_shape[1:])
    assert first.transfer_bytes == 2 * 16 * per_sample * BYTES_PER_ELEMENT
    assert plan.predicted.transfer_bytes == first.transfer_bytes
    assert plan.predicted.step_seconds == pytest.approx(
        plan.predicted.compute_seconds + plan.predicted.transfer_seconds
        + plan.predicted.sync_seconds)


BLOCK_EXITS = {"conv1", "maxpool", "avgpool", "flatten",
               *(f"add_{i}" if i else "add" for i in range(8))}


def test_a_residual_network_is_cut_only_between_blocks():
    graph = _graph("resnet18", 8)
    assert {graph.layers[p - 1].name for p in legal_cuts(graph)} == BLOCK_EXITS
    plan = optimal_pipeline(_cost(graph, 4), stages=4)
    assert all(stage.layers[-1] in BLOCK_EXITS for stage in plan.stages[:-1])
    inside = PipelineExecution(stages=(
        PipelineStage(layers=tuple(layer.name for layer in graph.layers[:5]), devices=(0,)),
        PipelineStage(layers=tuple(layer.name for layer in graph.layers[5:]), devices=(1,)),
    ), micro_batches=2)
    with pytest.raises(ConfigError, match="before layer 'add', where 2 tensors cross"):
        check_execution(graph, inside, 2)


def test_impossible_pipelines_are_one_clear_error():
    graph = _graph("lenet5", 8)
    names = [layer.name for layer in graph.layers]
    three = PipelineExecution(stages=tuple(
        PipelineStage(layers=tuple(part), devices=(index,))
        for index, part in enumerate((names[:3], names[3:6], names[6:]))), micro_batches=2)
    with pytest.raises(ConfigError, match="3 stages on 2 devices: every stage needs"):
        check_execution(graph, three, 2)
    odd = three.model_copy(update={"micro_batches": 3})
    with pytest.raises(ConfigError, match="3 micro-batches do not divide the global batch of 8"):
        check_execution(graph, odd, 3)
    with pytest.raises(ConfigError, match="3 stages on 2 devices: every stage needs"):
        optimal_pipeline(_cost(graph, 2), stages=3)
    with pytest.raises(ConfigError, match="3 micro-batches do not divide"):
        optimal_pipeline(_cost(graph, 2), micro_batches=3)
    resnet = _graph("resnet18", 4)
    after_stem = [layer.name for layer in resnet.layers].index("maxpool") + 1
    one_sample = PipelineExecution(stages=(
        PipelineStage(layers=tuple(layer.name for layer in resnet.layers[:after_stem]),
                      devices=(0,)),
        PipelineStage(layers=tuple(layer.name for layer in resnet.layers[after_stem:]),
                      devices=(1,)),
    ), micro_batches=4)
    with pytest.raises(ConfigError, match="'layer4_0_conv1' runs BatchNorm on one value"):
        check_execution(resnet, one_sample, 2)


def test_each_row_crosses_its_own_link_between_stages():
    """On p100x16-2018 (4 GPUs per node) a stage on devices 2-5 hands 8 rows to one device, 6: the
    rows of devices 4 and 5 come over NVLink, those of 2 and 3 over InfiniBand, one message
    after another; backward each sender takes its 2 rows back over its own link."""
    graph = _graph("tiny_cnn", batch=8, image_size=8)
    costs = PipelineCosts(_cost(graph, 16, "p100x16-2018"))
    cut = costs.cuts[0]
    (name,) = crossing(graph, cut)
    piece = 2 * math.prod(graph.by_name[name].output_shape[1:]) * BYTES_PER_ELEMENT
    cluster = load_cluster("p100x16-2018")
    nvlink, infiniband = cluster.link(4, 6), cluster.link(2, 6)
    assert nvlink is not None and infiniband is not None
    assert nvlink.bandwidth > infiniband.bandwidth
    forward = sum(2 * (piece / link.bandwidth + link.latency) for link in (nvlink, infiniband))
    backward = piece / infiniband.bandwidth + infiniband.latency
    transfer = costs.stage(0, cut, first=2, width=4, next_width=1, micro_batches=1).transfer
    assert transfer == pytest.approx(forward + backward, rel=1e-12)


def test_rows_move_between_stages_of_different_widths():
    assert row_pieces(8, 2, 4) == [(0, 0, 0, 2), (0, 1, 2, 4), (1, 2, 4, 6), (1, 3, 6, 8)]
    assert row_pieces(8, 4, 1) == [(0, 0, 0, 2), (1, 0, 2, 4), (2, 0, 4, 6), (3, 0, 6, 8)]


# ---- the engine against one device ---------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A model trained a few SGD steps on seeded random batches, under a pipeline."""

    model: str
    batch: int
    image_size: int
    micro_batches: int
    steps: int = 2
    double: bool = True  # fp64: rounding too small to flip a max-pool tie or a ReLU
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0

    def strategy(self, devices: int, stages: int = 2) -> Strategy:
        graph = _graph(self.model, self.batch, self.image_size)
        return plan_strategy(optimal_pipeline(_cost(graph, devices), stages=stages,
                                              micro_batches=self.micro_batches), graph)

    def plain(self) -> distributed.Case:
        """The same training problem as the layer-wise equivalence tests state it."""
        return distributed.Case(model=self.model, strategy={}, batch=self.batch,
                                image_size=self.image_size, steps=self.steps, lr=self.lr,
                                momentum=self.momentum, weight_decay=self.weight_decay,
                                seed=self.seed, double=self.double)

    def batches(self, in_channels: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every step's global batch, from a generator of its own (not the global one)."""
        return distributed.batches(self.plain(), in_channels)

    def module(self) -> torch.nn.Module:
        """The plain module from the case's seed (the global generator then draws dropout)."""
        torch.manual_seed(self.seed)
        return build_model(self.model, num_classes=10, image_size=self.image_size)


@dataclass
class Outcome:
    """What rank 0 reports of one case: losses, differences from one device, bytes."""

    losses: list[float]
    expected_losses: list[float]
    differences: list[str]  # one line per state entry that differs from one device's
    bytes_by_rank: list[dict[tuple[str, str], int]]


@cache  # the same for every M: AlexNet trains once
def one_device(case: Case) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The plain module on one process: mean cross-entropy over the global batch, SGD."""
    outcome = distributed.reference(case.plain())
    return outcome.losses, outcome.state


def _close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> bool:
    """assert_close's test in cache-sized chunks (torch.isclose on AlexNet's fp64 weights at
    once takes 3 s here, mostly page faults of its temporaries)."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    return all(bool(((a - b).abs() <= atol + rtol * b.abs()).all()) for a, b in zip(
        actual.reshape(-1).split(1 << 16), expected.reshape(-1).split(1 << 16), strict=True))


def differences(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                tolerance: dict[str, float]) -> list[str]:
    found = [] if state.keys() == expected.keys() else [f"keys {sorted(state)}"]
    for key, value in expected.items():
        exact = {"rtol": 0, "atol": 0} if not value.is_floating_point() else tolerance
        if key in state and _close(state[key], value, **exact):
            continue
        try:
            torch.testing.assert_close(state.get(key), value, **exact)
        except AssertionError as error:
            found.append(f"{key}: {str(error).splitlines()[0]}")
    return found


def _settings(case: Case, in_channels: int, world: int) -> TrainSettings:
    return TrainSettings(
        model=case.model, strategy="pipeline", nproc=world, nnodes=1, cluster="local",
        profile=None, dataset="synthetic", data_root=".", batch_per_device=case.batch // world,
        image_size=case.image_size, classes=10, in_channels=in_channels, lr=case.lr,
        momentum=case.momentum, weight_decay=case.weight_decay, seed=case.seed)


def _run_case(case: Case, strategy: Strategy, graph: LayerGraph, rank: int,
              world: int) -> Outcome | None:
    """Train the case under the pipeline engine; rank 0 compares with one device itself (the
    states stay in the process: AlexNet's are 460 MB in fp64)."""
    in_channels = graph.input_shape[1]
    torch.set_default_dtype(torch.float64 if case.double else torch.float32)
    try:
        engine = PipelineEngine(EngineContext(
            settings=_settings(case, in_channels, world), strategy=strategy, graph=graph,
            module=case.module(), rank=rank, world=world, device=torch.device("cpu")))
        losses, step_bytes = [], {}
        for inputs, targets in case.batches(in_channels):
            engine.counter.reset()
            losses.append(engine.step(inputs, targets))
            step_bytes = engine.counter.reset()
        state = engine.training_state()
        gathered: list[dict | None] = [None] * world
        dist.all_gather_object(gathered, step_bytes)
        if state is None:
            return None
        expected_losses, expected = one_device(dataclasses.replace(case, micro_batches=1))
    finally:
        torch.set_default_dtype(torch.float32)
    tolerance = FP64 if case.double else FP32
    return Outcome(losses=losses, expected_losses=expected_losses,
                   differences=differences(state[MODEL_STATE_KEY], expected, tolerance),
                   bytes_by_rank=[counts or {} for counts in gathered])


def _run_job(job: tuple[Case, Strategy, LayerGraph], rank: int, world: int) -> Outcome | None:
    return _run_case(*job, rank, world)


def run_pipelines(cases: list[tuple[Case, Strategy]], world: int) -> list[Outcome]:
    """Every case on `world` gloo processes (one launch), as rank 0 reported them; the graphs
    go with the cases (tracing one costs each process a second)."""
    with_graphs = [(case, strategy, _graph(case.model, case.batch, case.image_size))
                   for case, strategy in cases]
    return spawn_cases(_run_job, with_graphs, world, __name__)


def assert_equal(case: Case, outcome: Outcome) -> None:
    tolerance = FP64 if case.double else FP32
    torch.testing.assert_close(torch.tensor(outcome.losses, dtype=torch.float64),
                               torch.tensor(outcome.expected_losses, dtype=torch.float64),
                               **tolerance)
    assert not outcome.differences, (case, outcome.differences)


def measured(outcome: Outcome, category: str) -> int:
    return sum(count for counts in outcome.bytes_by_rank
               for (_, kind), count in counts.items() if kind == category)


WORLD_TWO = [
    *(Case("lenet5", batch=8, image_size=32, micro_batches=m) for m in (1, 2, 4)),
    *(Case("alexnet", batch=4, image_size=24, micro_batches=m, steps=1) for m in (1, 4)),
    # one device per stage and one micro-batch: BatchNorm sees the whole batch, as on one
    Case("tiny_cnn", batch=4, image_size=8, micro_batches=1),
    Case("lenet5", batch=8, image_size=32, micro_batches=2, steps=1, double=False),  # bytes
]


@pytest.fixture(scope="module")
def world_two() -> list[tuple[Case, Strategy, Outcome]]:
    cases = [(case, case.strategy(devices=2)) for case in WORLD_TWO]
    return [(*pair, outcome) for pair, outcome in zip(cases, run_pipelines(cases, 2),
                                                       strict=True)]


@pytest.mark.slow
def test_two_stages_equal_one_device_for_every_number_of_micro_batches(world_two):
    for case, strategy, outcome in world_two:
        assert len(strategy.execution.stages) == 2
        assert strategy.execution.micro_batches == case.micro_batches
        assert_equal(case, outcome)


@pytest.mark.slow
def test_the_bytes_sent_are_the_predicted_bytes(world_two):
    for case, strategy, outcome in world_two:
        element_size = 8 if case.double else BYTES_PER_ELEMENT
        assert strategy.predicted.transfer_bytes > 0
        assert measured(outcome, "transfer") * BYTES_PER_ELEMENT == (
            strategy.predicted.transfer_bytes * element_size)
        assert measured(outcome, "sync") == strategy.predicted.sync_bytes == 0


@pytest.mark.slow
def test_two_devices_per_stage_equal_one_device_and_sync_what_is_predicted():
    case = Case("lenet5", batch=8, image_size=32, micro_batches=2)
    strategy = case.strategy(devices=4)
    assert [len(stage.devices) for stage in strategy.execution.stages] == [2, 2]
    (outcome,) = run_pipelines([(case, strategy)], 4)
    assert_equal(case, outcome)
    predicted = strategy.predicted
    assert predicted.sync_bytes > 0
    assert measured(outcome, "transfer") * BYTES_PER_ELEMENT == predicted.transfer_bytes * 8
    assert measured(outcome, "sync") * BYTES_PER_ELEMENT == predicted.sync_bytes * 8


# ---- the real CLI: resume ------------------------------------------------------------------

runner = CliRunner()
LENET_RUN = ("lenet5", "--strategy", "pipeline", "--nproc", "2", "--image-size", "16",
             "--batch-per-device", "4", "--checkpoint-every", "2")


@pytest.mark.slow
def test_a_resumed_pipeline_run_equals_an_uninterrupted_one(tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    done = runner.invoke(app, ["train", *LENET_RUN, "--steps", "6", "--out", str(whole)])
    assert done.exit_code == 0, done.output
    first = runner.invoke(app, ["train", *LENET_RUN, "--steps", "4", "--out", str(split)])
    assert first.exit_code == 0, first.output
    resumed = runner.invoke(app, ["train", "lenet5", "--resume", str(split), "--steps", "6"])
    assert resumed.exit_code == 0, resumed.output

    run = RunResult.load(whole / "result.json")
    assert run.strategy.execution.kind == "pipeline"
    assert len(run.strategy.execution.stages) == 2  # the search's pick for this setting
    assert run.bytes_per_step == run.predicted_bytes_per_step
    assert run.bytes_per_step.transfer > 0
    continued = RunResult.load(split / "result.json")
    assert [s.loss for s in continued.steps] == [s.loss for s in run.steps]
    final = torch.load(split / "model.pt", weights_only=True)
    expected = torch.load(whole / "model.pt", weights_only=True)
    assert final.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(final[key], tensor), key
