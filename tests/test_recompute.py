"""Recompute as a per-layer choice: what it frees in the memory model, what it costs in Eq. 1,
what a strategy may not recompute, that the search held to a memory limit takes it where the
forward's saved tensors bind, and that a recomputed plan trains within its limit and equals
one-device training."""

from __future__ import annotations

import json
import re

import pytest

import layerwise
from layerwise.strategies.cost.memory import FLOAT32_BYTES, predicted_memory
from layerwise.strategies.errors import ConfigError
from layerwise.strategies.jobs.pricing import cost_model
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.runtime.plan import build_plan
from layerwise.strategies.search.baselines import baseline
from layerwise.strategies.search.memory_fit import fastest_within

DARKNET = "tests.idiom_models:DarknetBlocks"
BLOCKS = ("features_0", "features_3", "features_6", "features_9")  # conv + BN + leaky ReLU
LIMIT = 3_000_000  # bytes per device: under every plan that keeps its blocks' saved tensors


@pytest.fixture(scope="module")
def darknet():
    return cost_model(build_graph(DARKNET, batch=4, image_size=64), "local", 2, None, True)


def _peak(cost, assignment, recompute=()) -> int:
    return max(device.peak for device in predicted_memory(
        cost.graph, assignment, cost.devices, FLOAT32_BYTES, recompute=recompute))


def test_recomputing_frees_what_the_forward_saves_for_one_more_forward(darknet):
    data = baseline("data", darknet.graph, 2)
    kept = predicted_memory(darknet.graph, data, 2, FLOAT32_BYTES)
    recomputed = predicted_memory(darknet.graph, data, 2, FLOAT32_BYTES, recompute=BLOCKS)
    for before, after in zip(kept, recomputed, strict=True):
        # each block's BatchNorm and leaky ReLU save a tensor of its output's size
        assert before.saved == 2 * 4 // 2 * 8 * 64 * 64 * FLOAT32_BYTES * len(BLOCKS)
        assert after.saved == 0
        assert after.forward_end == before.forward_end - before.saved
        assert after.peak < before.peak
    graph = darknet.graph
    extra = sum(darknet.pass_seconds(graph.by_name[name], [data[name]])[0] / 3
                for name in BLOCKS)  # a forward of a layer with weights: a third of its pass
    assert (darknet.evaluate(data, BLOCKS).compute_seconds
            == pytest.approx(darknet.evaluate(data).compute_seconds + extra))


def test_the_search_recomputes_where_the_forwards_saved_tensors_bind(darknet):
    unlimited = fastest_within(darknet, 10**9)
    assert unlimited.recompute == frozenset()  # memory does not bind: nothing to pay for
    fit = fastest_within(darknet, LIMIT)
    assignment = {name: darknet.configs[name][index] for name, index in fit.choice.items()}
    assert fit.recompute and fit.recompute <= set(BLOCKS)
    assert _peak(darknet, assignment, fit.recompute) == fit.peak <= LIMIT
    assert _peak(darknet, assignment) > LIMIT  # the same configs, kept, do not fit
    assert fit.step_seconds == pytest.approx(
        darknet.evaluate(assignment, fit.recompute).step_seconds)
    assert fit.lower_bound <= fit.step_seconds


@pytest.mark.parametrize(("names", "message"), [
    (("features_99",), "recompute names layer(s) the model does not have: features_99"),
    (("x",), "recompute names the input 'x', which has no forward"),
    (("fc",), "recompute names the output layer 'fc', whose scores the loss reads"),
])
def test_a_layer_that_cannot_be_recomputed_is_refused(darknet, names, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_plan(darknet.graph, baseline("data", darknet.graph, 2), 2, names)


@pytest.mark.slow
def test_a_recomputed_plan_trains_within_its_limit_and_equals_one_device(tmp_path):
    """The plan searched within LIMIT recomputes its blocks; trained on 2 processes it measures
    at most the limit on every rank, within 10% of its prediction, and is priced with its
    recomputed forwards. In float64 it, and the blocks recomputed under a height split (their
    BatchNorms synchronised over the two halves), equal the plain module trained on one process
    (the replayed statistics are not tracked twice: the running variances match too)."""
    shape = {"image_size": 64, "batch_per_device": 2}
    plan = layerwise.search(DARKNET, devices=2, cluster="local", baselines=(),
                            memory_limit=LIMIT, **shape)
    strategy = plan.strategies["layerwise"]
    assert strategy.recompute
    path = tmp_path / "recomputed.json"
    strategy.save(path)
    result = layerwise.train(DARKNET, str(path), nproc=2, steps=2, out=tmp_path / "run",
                             **shape)
    predicted = plan.peak_memory(strategy)
    assert predicted is not None
    for measured, expected in zip(result.peak_memory_bytes_per_rank, predicted, strict=True):
        assert measured <= LIMIT
        assert measured == pytest.approx(expected, rel=0.10)
    assert result.strategy.recompute == strategy.recompute
    assert result.strategy.predicted.compute_seconds == pytest.approx(
        strategy.predicted.compute_seconds)  # the run's repricing keeps the recomputed forwards
    document = json.loads(strategy.model_dump_json())
    document["name"], document["recompute"] = "recomputed-height", list(BLOCKS)
    for layer in document["layers"]:
        if layer["name"] in BLOCKS:
            layer["config"] = "n1c1h2w1@0-1"
    height = tmp_path / "height.json"
    height.write_text(json.dumps(document))
    report = layerwise.verify(DARKNET, [str(path), str(height)], nproc=2,
                              out=tmp_path / "verify", **shape)
    assert not report.failed and all(divergence.exact for divergence in report.divergences)
