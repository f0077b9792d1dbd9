"""The runtime's contract: a training step under any strategy equals a step on one device, and
the bytes it sends are exactly the cost model's.

Real gloo processes (tests/distributed.py); the reference is the plain module on one process
with the same seed, weights, batches and SGD. Deep models compare in fp64: in fp32 a 1-ulp
difference in a reduction order can flip a max-pool tie or a ReLU at zero and send one gradient
element elsewhere, which is rounding, not a bug; in fp64 rounding stays below 1e-5 relative
(BatchNorm over four samples amplifies it most) while a real error is of the order of the
values. The small models and the byte counts are checked in fp32 (rtol 1e-4). Every zoo model
under every strategy is `layerwise verify`'s test (tests/test_verify.py); here: hand-made and
random strategies, fp32 steps and bytes.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerwise.strategies.cost.compute_time import AnalyticCompute
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.hardware.cluster import load_cluster
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.space import ParallelConfig, enumerate_configs
from layerwise.strategies.runtime.plan import build_plan
from layerwise.strategies.search.baselines import baseline
from layerwise.strategies.search.elimination import optimal_strategy
from tests.distributed import Case, Outcome, assert_same_training, reference, run_distributed

pytestmark = pytest.mark.slow

FP64 = {"rtol": 1e-5, "atol": 1e-7}
FP32 = {"rtol": 1e-4, "atol": 1e-5}


def _texts(assignment: dict[str, ParallelConfig]) -> dict[str, str]:
    return {name: config.text for name, config in assignment.items()}


def _graph(model: str, batch: int, image_size: int = 32):
    return build_graph(model, batch, image_size, 10)


def named(model: str, strategy: str, world: int, batch: int, image_size: int = 32,
          **case: object) -> Case:
    """A case for a baseline or for the searched layer-wise strategy on the local cluster."""
    graph = _graph(model, batch, image_size)
    if strategy == "layerwise":
        cost = CostModel(graph, load_cluster("local"), world,
                         AnalyticCompute(load_cluster("local")))
        assignment = optimal_strategy(cost).assignment
    else:
        assignment = baseline(strategy, graph, world)
    return Case(model=model, strategy=_texts(assignment), batch=batch, image_size=image_size,
                **case)  # type: ignore[arg-type]


_REFERENCES: dict[tuple[object, ...], Outcome] = {}


def cached_reference(case: Case) -> Outcome:
    """The one-device run does not depend on the strategy: train it once per setting."""
    key = tuple(value for name, value in vars(case).items() if name != "strategy")
    if key not in _REFERENCES:
        _REFERENCES[key] = reference(case)
    return _REFERENCES[key]


def check_equal(case: Case, outcome: Outcome, tolerance: dict[str, float]) -> None:
    assert_same_training(outcome, cached_reference(case), tolerance, case.model)


def predicted_bytes(case: Case, world: int) -> tuple[int, int]:
    graph = _graph(case.model, case.batch, case.image_size)
    assignment = {name: ParallelConfig.parse(text) for name, text in case.strategy.items()}
    cluster = load_cluster("local")
    predicted = CostModel(graph, cluster, world, AnalyticCompute(cluster)).evaluate(assignment)
    return predicted.transfer_bytes, predicted.sync_bytes


def measured_bytes(outcome: Outcome, category: str) -> int:
    return sum(count for counts in outcome.bytes_by_rank
               for (_, kind), count in counts.items() if kind == category)


def _strided_net_case(world: int) -> Case:
    """Height and width split at once through a stride-2 padded conv, on fewer devices."""
    graph = _graph("resnet18", 4)
    assignment = baseline("data", graph, world)
    for layer in graph.layers:
        if layer.name in ("conv1", "layer1_0_conv1", "layer2_0_conv1"):
            assignment[layer.name] = ParallelConfig(h=2, w=2, devices=tuple(range(4)))
        if layer.name in ("maxpool", "layer2_0_downsample_0"):
            assignment[layer.name] = ParallelConfig(c=2, h=2, devices=(0, 1, 2, 3))
        if layer.name == "layer1_0_conv2":
            assignment[layer.name] = ParallelConfig(n=2, w=2, devices=(0, 1, 2, 3))
        if layer.name == "layer4_1_conv2":
            assignment[layer.name] = ParallelConfig(c=2, devices=(2, 3))
        if layer.name == "fc":
            assignment[layer.name] = ParallelConfig(n=2, c=2, devices=(0, 1, 2, 3))
    return Case(model="resnet18", strategy=_texts(assignment), batch=4, double=True)


def test_hw_tiles_with_stride_and_padding_and_layers_on_fewer_devices():
    case = _strided_net_case(4)
    conv1 = case.strategy["conv1"]
    assert conv1 == "n1c1h2w2@0-3"
    (outcome,) = run_distributed([case], 4)
    check_equal(case, outcome, FP64)


def random_assignment(model: str, batch: int, world: int, seed: int) -> dict[str, str]:
    """One legal config per layer, any degrees and any aligned block of devices."""
    chooser = random.Random(seed)
    graph = _graph(model, batch)
    return {layer.name: chooser.choice(enumerate_configs(layer, world)).text
            for layer in graph.layers}


@settings(max_examples=1, deadline=None, derandomize=True,  # 6 random plans, 4 processes
          suppress_health_check=[HealthCheck.too_slow])
@given(seeds=st.lists(st.integers(0, 2**31), min_size=6, max_size=6))
def test_random_legal_strategies_equal_one_device(seeds):
    world = 4
    models = ["tiny_cnn", "lenet5", "resnet18"]
    cases = [
        Case(model=model, strategy=random_assignment(model, 8, world, seed), batch=8,
             double=True)
        for seed, model in zip(seeds, models * 2, strict=True)
    ]
    for case, outcome in zip(cases, run_distributed(cases, world), strict=True):
        check_equal(case, outcome, FP64)


def test_fp32_steps_match_and_bytes_sent_equal_the_cost_model():
    """Bytes on every model; fp32 values on the models without max-pool ties after BN+ReLU.
    The ranks' wait clocks (the measured t_x and t_s of the cost-model benchmark) run in a
    category exactly where bytes of it are sent."""
    world = 4
    cases = [named(model, strategy, world, batch=8) for model in ("tiny_cnn", "lenet5")
             for strategy in ("data", "model", "owt", "spatial_h", "layerwise")]
    cases += [named("resnet18", strategy, world, batch=8, steps=1)
              for strategy in ("data", "owt", "layerwise")]
    cases.append(dataclasses.replace(_strided_net_case(world), double=False, steps=1))
    for case, outcome in zip(cases, run_distributed(cases, world), strict=True):
        transfer, sync = predicted_bytes(case, world)
        assert measured_bytes(outcome, "transfer") == transfer, case.strategy
        assert measured_bytes(outcome, "sync") == sync, case.strategy
        for category in ("transfer", "sync"):
            waited = max(waits.get(category, 0.0) for waits in outcome.waits_by_rank)
            assert (waited > 0) == (measured_bytes(outcome, category) > 0), (category,
                                                                               case.strategy)
        if case.model != "resnet18":
            check_equal(case, outcome, FP32)


def test_plan_moves_the_cost_models_transfer_elements():
    """Without processes: the plan's cross-device pieces are t_x's elements (forward and
    backward; the input has no gradient), on random strategies."""
    cluster = load_cluster("local")
    for model in ("resnet18", "inception_v3", "alexnet"):
        graph = _graph(model, 8, 20 if model == "inception_v3" else 32)
        cost = CostModel(graph, cluster, 4, AnalyticCompute(cluster))
        for seed in range(3):
            chooser = random.Random(seed)
            assignment = {layer.name: chooser.choice(enumerate_configs(layer, 4))
                          for layer in graph.layers}
            plan = build_plan(graph, assignment, 4)
            moved = sum(
                (1 if graph.by_name[input_plan.producer].kind == "input" else 2)
                * input_plan.remote_elements
                for layer_plan in plan.layers for input_plan in layer_plan.inputs)
            assert moved * 4 == cost.evaluate(assignment).transfer_bytes
