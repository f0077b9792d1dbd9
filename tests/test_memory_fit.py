"""The search within each device's memory (strategies/search/memory_fit.py): plans it returns
fit by the whole memory model, its lower bound is sound, and what cannot fit says so."""

from __future__ import annotations

import numpy as np
import pytest

import layerwise
from layerwise.strategies.cost.memory import (
    FLOAT32_BYTES,
    any_plan_bound,
    predicted_memory,
    step_input_bytes,
)
from layerwise.strategies.jobs.pricing import cost_model
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.search.baselines import BASELINES, baseline
from layerwise.strategies.search.elimination import optimal_strategy
from layerwise.strategies.search.memory_fit import (
    DoesNotFit,
    fastest_within,
    floor_rows,
    layer_floors,
    optimal_within,
)


def _peak(cost, assignment, recompute=frozenset()) -> int:
    return max(device.peak for device in predicted_memory(
        cost.graph, assignment, cost.devices, FLOAT32_BYTES, recompute=recompute))


@pytest.fixture(scope="module")
def tiny():
    return cost_model(build_graph("tiny_cnn", batch=16), "p100x16-2018", 4, None, True)


def test_a_plan_held_to_a_budget_fits_it_and_its_bound_is_sound(tiny):
    fastest = optimal_strategy(tiny)
    budget = 2_000_000
    assert _peak(tiny, fastest.assignment) > budget
    fit = fastest_within(tiny, budget)
    assignment = {name: tiny.configs[name][index] for name, index in fit.choice.items()}
    assert _peak(tiny, assignment, fit.recompute) == fit.peak <= budget
    assert fit.step_seconds == pytest.approx(
        tiny.evaluate(assignment, fit.recompute).step_seconds)
    # the bound: never under the unconstrained optimum, never over the plan found
    assert fastest.predicted.step_seconds * (1 - 1e-9) <= fit.lower_bound <= fit.step_seconds
    # at least as fast as every baseline that fits
    for name in BASELINES:
        plan = baseline(name, tiny.graph, 4)
        if _peak(tiny, plan) <= budget:
            assert fit.step_seconds <= tiny.evaluate(plan).step_seconds * (1 + 1e-9)


@pytest.mark.parametrize(("model", "size", "devices"), [
    ("tiny_cnn", None, 4), ("lenet5", None, 2), ("unet3d", 8, 2),
    ("tests.idiom_models:LibraryBlocks", 8, 2)])
def test_the_relaxations_rows_never_exceed_the_whole_memory_model(model, size, devices):
    """The rows the multipliers and the integer program bound a plan's memory by are each at
    most the device's peak by the whole model, under any plan (random configs, random layers
    recomputed): else the proven bound would not be one."""
    graph = build_graph(model, batch=2 * devices, image_size=size, num_classes=4)
    cost = cost_model(graph, "h200x16", devices, None, True)
    floors = layer_floors(graph, cost.configs, devices, FLOAT32_BYTES)
    inputs = step_input_bytes(graph, FLOAT32_BYTES)
    generator = np.random.default_rng(0)
    for _ in range(25):
        choice = {name: int(generator.integers(len(configs)))
                  for name, configs in cost.configs.items()}
        recompute = frozenset(name for name in floors if generator.random() < 0.3
                              and name not in graph.outputs)
        assignment = {name: cost.configs[name][index] for name, index in choice.items()}
        peaks = np.array([device.peak for device in predicted_memory(
            graph, assignment, devices, FLOAT32_BYTES, recompute=recompute)])
        rows = floor_rows(floors, (choice, recompute), devices) + inputs
        assert (rows <= peaks[None, :]).all(), (rows.max(axis=0), peaks)
        assert (rows.max(axis=0) >= 0.5 * peaks).all()  # and they hold most of it


def test_the_integer_program_proves_what_the_multipliers_cannot(tiny):
    """At 60% of the fastest plan's peak the multipliers alone prove nothing beyond the
    unconstrained optimum (their relaxation can spread a plan over the devices: a gap of
    54% before the program); the integer program over the same rows proves a bound 20%
    higher and finds a plan within a few percent of it (0.7-2.5% here, as HiGHS' time
    allows)."""
    fastest = optimal_strategy(tiny)
    fit = fastest_within(tiny, int(0.6 * _peak(tiny, fastest.assignment)))
    assert fit.closed and fit.gap <= 0.05
    assert fit.lower_bound > fastest.predicted.step_seconds * 1.1


def test_a_budget_the_program_proves_nothing_meets_says_so(tiny):
    """Above the least any one layer needs (0.8 MB) but under what every whole plan needs:
    the integer program proves no plan meets its rows, and the search says that, not that it
    merely found none."""
    with pytest.raises(DoesNotFit, match=r"no plan fits 0\.9 MB per device: the integer "
                                         r"program .* proves each plan needs more"):
        fastest_within(tiny, 880_000)


def test_a_budget_the_optimum_fits_leaves_the_search_as_it_was(tiny):
    fastest = optimal_strategy(tiny)
    held = optimal_within(tiny, _peak(tiny, fastest.assignment))
    assert held.assignment == fastest.assignment and held.memory_rounds == 0
    assert held.optimality_gap == 0


def test_a_budget_under_every_plans_need_names_the_least_and_its_layer(tiny):
    with pytest.raises(DoesNotFit, match=r"every plan needs at least 0\.\d MB on some device "
                                         r"\((conv1|conv2)"):
        fastest_within(tiny, 100_000)


@pytest.mark.parametrize(("model", "devices"), [("tiny_cnn", 4), ("alexnet", 4),
                                                 ("resnet18", 8)])
def test_no_plan_needs_more_than_the_whole_model_bound(model, devices):
    graph = build_graph(model, batch=4 * devices)
    bound = any_plan_bound(graph, FLOAT32_BYTES)
    for name in BASELINES:
        peaks = predicted_memory(graph, baseline(name, graph, devices), devices, FLOAT32_BYTES)
        assert max(device.peak for device in peaks) <= bound


@pytest.mark.slow
def test_a_plan_searched_within_a_limit_stays_within_it_when_trained(tmp_path):
    """tiny_cnn on 2 processes: its fastest plan needs 3.4 MB per device, over a 2.5 MB limit;
    the plan searched within the limit, trained, measures at most the limit on every rank,
    where the fastest plan, trained the same way, measures over it."""
    limit = 2_500_000
    shape = {"image_size": 32, "batch_per_device": 8}
    measured = {}
    for name, memory_limit in (("fastest", None), ("held", limit)):
        plan = layerwise.search("tiny_cnn", devices=2, cluster="local", baselines=(),
                                memory_limit=memory_limit, **shape)
        path = tmp_path / f"{name}.json"
        plan.strategies["layerwise"].save(path)
        result = layerwise.train("tiny_cnn", str(path), nproc=2, steps=2,
                                 out=tmp_path / name, **shape)
        measured[name] = max(result.peak_memory_bytes_per_rank)
    assert measured["held"] <= limit < measured["fastest"]
