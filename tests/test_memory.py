"""The memory model's terms on plans whose holdings can be counted by hand (no launch; the
runs that check it against the measured peak are in test_train.py and bench_memory.py), and the
measured peak on a step whose tensors are counted by hand."""

from __future__ import annotations

import warnings

import torch
import torch.distributed  # noqa: F401  (its deprecated `reduce_op` lives among gc's objects)
from torch.fx.experimental.proxy_tensor import make_fx

from layerwise.strategies.cost.memory import predicted_memory
from layerwise.strategies.jobs.named_strategies import strategy_by_name
from layerwise.strategies.jobs.pricing import cost_model
from layerwise.strategies.model.graph import LayerGraph, build_graph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.runtime.memory_peak import measured_peak

WEIGHTS = sum(p.numel() for p in build_model("wide_fc", num_classes=10, image_size=8).parameters())


def _named(graph: LayerGraph, name: str) -> dict[str, ParallelConfig]:
    """The per-layer configs of the named strategy on 2 devices."""
    return strategy_by_name(name, cost_model(graph, "local", 2, None, True)).assignment()


def test_sample_split_replicates_the_weights_and_buckets_their_gradients():
    graph = build_graph("wide_fc", batch=8, image_size=8, num_classes=10)
    devices = predicted_memory(graph, _named(graph, "data"), 2, 4)
    for device in devices:
        assert device.weights == device.gradients == device.momentum == device.buckets == (
            4 * WEIGHTS)
        # every edge is chained (same tiles on each device): one backward call, nothing waits
        assert device.pending_gradients == 0
        # the update: weights, gradients (now views into the buckets) and momentum, and the
        # weight-decay temporary of the largest weight shard
        assert device.update == 3 * 4 * WEIGHTS + device.inputs + 4 * 2048 * 2049


def test_channel_split_shards_the_weights_and_needs_no_buckets():
    graph = build_graph("wide_fc", batch=8, image_size=8, num_classes=10)
    data = predicted_memory(graph, _named(graph, "data"), 2, 4)
    model = predicted_memory(graph, _named(graph, "model"), 2, 4)
    for whole, shard in zip(data, model, strict=True):
        assert shard.buckets == 0 and abs(shard.weights - whole.weights / 2) < 0.01 * whole.weights
        assert shard.kept > whole.kept  # every layer needs its whole input: copies
        assert shard.peak < whole.peak


def test_float64_doubles_every_tensor_term():
    graph = build_graph("tiny_cnn", batch=8, image_size=16, num_classes=10)
    plan = _named(graph, "spatial_h")
    single, double = (predicted_memory(graph, plan, 2, size)[1] for size in (4, 8))
    for term in ("weights", "gradients", "momentum", "buckets", "kept", "workspace"):
        assert getattr(double, term) == 2 * getattr(single, term), term
    assert double.kept > 0 and double.workspace > 0  # halos: copies and their gradients


def test_a_measured_peak_counts_what_the_step_freed_and_prints_nothing(capfd):
    """A CPU step that keeps 4 MiB and frees 8 MiB it made after them peaks at least 12 MiB
    above what was alive before, with a traced graph's fake tensors alive (their storage has
    no data pointer to read); measuring it warns of nothing deprecated and prints nothing
    (every rank of a run measures its peak so, into the user's terminal)."""
    mebibyte = 1 << 20
    # alive through the step: its nodes keep their values as fake tensors
    traced = make_fx(lambda x: x * 2, tracing_mode="fake")(torch.ones(mebibyte))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with measured_peak(torch.device("cpu")) as peak:
            kept = torch.ones(mebibyte)  # float32: 4 MiB, alive at the end
            scratch = torch.ones(2 * mebibyte)  # 8 MiB, freed before the end
            del scratch
    del kept, traced
    assert peak.bytes is not None and peak.bytes >= 12 * mebibyte
    assert capfd.readouterr() == ("", "")
