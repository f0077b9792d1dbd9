"""The search within each device's memory (strategies/search/memory_fit.py): plans it returns
fit by the whole memory model, its lower bound is sound, and what cannot fit says so."""

from __future__ import annotations

import pytest

import layerwise
from layerwise.strategies.cost.memory import (
    FLOAT32_BYTES,
    any_plan_bound,
    predicted_memory,
)
from layerwise.strategies.jobs.pricing import cost_model
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.search.baselines import BASELINES, baseline
from layerwise.strategies.search.elimination import optimal_strategy
from layerwise.strategies.search.memory_fit import DoesNotFit, fastest_within, optimal_within


def _peak(cost, assignment) -> int:
    return max(device.peak for device in predicted_memory(
        cost.graph, assignment, cost.devices, FLOAT32_BYTES))


@pytest.fixture(scope="module")
def tiny():
    return cost_model(build_graph("tiny_cnn", batch=16), "p100x16-2018", 4, None, True)


def test_a_plan_held_to_a_budget_fits_it_and_its_bound_is_sound(tiny):
    fastest = optimal_strategy(tiny)
    budget = 2_000_000
    assert _peak(tiny, fastest.assignment) > budget
    fit = fastest_within(tiny, budget)
    assignment = {name: tiny.configs[name][index] for name, index in fit.choice.items()}
    assert _peak(tiny, assignment) == fit.peak <= budget
    assert fit.step_seconds == pytest.approx(tiny.evaluate(assignment).step_seconds)
    # the bound: never under the unconstrained optimum, never over the plan found
    assert fastest.predicted.step_seconds * (1 - 1e-9) <= fit.lower_bound <= fit.step_seconds
    # at least as fast as every baseline that fits
    for name in BASELINES:
        plan = baseline(name, tiny.graph, 4)
        if _peak(tiny, plan) <= budget:
            assert fit.step_seconds <= tiny.evaluate(plan).step_seconds * (1 + 1e-9)


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
