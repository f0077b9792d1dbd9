"""Recompute as a per-layer choice: what it frees in the memory model, what it costs in Eq. 1,
what a strategy may not recompute, and that a recomputed plan equals one-device training."""

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

DARKNET = "tests.idiom_models:DarknetBlocks"
BLOCKS = ("features_0", "features_3", "features_6", "features_9")  # conv + BN + leaky ReLU


@pytest.fixture(scope="module")
def darknet():
    return cost_model(build_graph(DARKNET, batch=4, image_size=64), "local", 2, None, True)


def test_recomputing_frees_what_the_forward_saves_for_one_more_forward(darknet):
    data = baseline("data", darknet.graph, 2)
    kept = predicted_memory(darknet.graph, data, 2, FLOAT32_BYTES)
    recomputed = predicted_memory(darknet.graph, data, 2, FLOAT32_BYTES, recompute=BLOCKS)
    for before, after in zip(kept, recomputed, strict=True):
        # each block's BatchNorm and leaky ReLU save a tensor of its output tile's size
        assert before.saved == 2 * (4 // 2) * 8 * 64 * 64 * FLOAT32_BYTES * len(BLOCKS)
        assert after.saved == 0
        assert after.forward_end == before.forward_end - before.saved
    extra = sum(darknet.pass_seconds(darknet.graph.by_name[name], [data[name]])[0] / 3
                for name in BLOCKS)  # a forward of a layer with weights: a third of its pass
    assert (darknet.evaluate(data, BLOCKS).compute_seconds
            == pytest.approx(darknet.evaluate(data).compute_seconds + extra))


@pytest.mark.parametrize(("names", "message"), [
    (("features_99",), "recompute names layer(s) the model does not have: features_99"),
    (("x",), "recompute names the input 'x', which has no forward"),
    (("fc",), "recompute names the output layer 'fc', whose scores the loss reads"),
])
def test_a_layer_that_cannot_be_recomputed_is_refused(darknet, names, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_plan(darknet.graph, baseline("data", darknet.graph, 2), 2, names)


@pytest.mark.slow
def test_a_recomputed_plan_equals_one_device_and_is_priced_with_its_forwards(tmp_path):
    """Darknet's blocks recomputed under the searched plan and under a height split (its
    BatchNorms synchronised over the two halves), in float64 on 2 processes: every loss and
    weight equals the plain module's on one process, the running variances too (the replayed
    statistics are not tracked twice); a run of the file prices the recomputed forwards."""
    shape = {"image_size": 32, "batch_per_device": 2}
    plan = layerwise.search(DARKNET, devices=2, cluster="local", baselines=(), **shape)
    files = []
    for name, config in (("searched", None), ("height", "n1c1h2w1@0-1")):
        document = json.loads(plan.strategies["layerwise"].model_dump_json())
        document["name"], document["recompute"] = f"recomputed-{name}", list(BLOCKS)
        for layer in document["layers"]:
            if config and layer["name"] in BLOCKS:
                layer["config"] = config
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(document))
        files.append(str(path))
    report = layerwise.verify(DARKNET, files, nproc=2, out=tmp_path / "verify", **shape)
    assert not report.failed and all(divergence.exact for divergence in report.divergences)
    run = layerwise.train(DARKNET, files[0], nproc=2, steps=1, out=tmp_path / "run", **shape)
    kept = plan.strategies["layerwise"].predicted.compute_seconds
    assert run.strategy.recompute == BLOCKS
    assert run.strategy.predicted.compute_seconds > kept
