"""The ParaDL oracle (Kahira et al., HPDC 2021; docs/research.md: ParaDL) against numbers worked
out by hand.

The expectations are written from the paper's equations with literal numbers for a two-layer
network (a 3x3 conv on 8x16x16 and a 4096->16 fully connected layer) on the `abci` platform:
NVLink 9 us, 50 GB/s inside a node of 4 GPUs, 30.31 us, 12.5 GB/s between nodes, 30.71 us
between racks of 17 nodes, halos inside a node over PCIe at 15.11 us, 16 GB/s; 16 GiB per GPU.
An epoch is ceil(D/B) whole iterations.
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.strategies.cost.compute_time import AnalyticCompute, ProfiledCompute
from layerwise.strategies.cost.profile import Profile
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.tiles import largest_tile
from layerwise.strategies.oracle.paradl import (
    STRATEGIES,
    LayerSummary,
    ModelSummary,
    OracleReport,
    evaluate,
    oracle,
    pipeline_stages,
    ranks,
    step_case,
    step_cases,
    summary_from_graph,
)
from layerwise.strategies.oracle.platform import load_platform
from layerwise.strategies.oracle.table8 import PAPER_RANKS
from tests.cli_errors import one_line_error

PLATFORM = load_platform("abci")
ABCI = PLATFORM.cluster
GIB = 2**30
D = 1000  # samples per epoch
S = 4  # samples per PE
NVLINK = (9e-6, 1 / 50e9)  # alpha (s), beta (s/byte)
INTER_NODE = (30.31e-6, 1 / 12.5e9)
INTER_RACK = (30.71e-6, 1 / 12.5e9)
PCIE = (15.11e-6, 1 / 16e9)

CONV = LayerSummary(
    name="conv", x=8 * 16 * 16, y=16 * 16 * 16, w=16 * 8 * 3 * 3 + 16,
    fw_seconds=1e-4, bw_seconds=2e-4, wu_seconds=1e-5, in_channels=8, out_channels=16,
    input_size=(16, 16), output_size=(16, 16), kernel=(3, 3))
FC = LayerSummary(
    name="fc", x=4096, y=16, w=4096 * 16 + 16, fw_seconds=2e-5, bw_seconds=4e-5,
    wu_seconds=3e-5, in_channels=4096, out_channels=16)
TWO_LAYERS = ModelSummary(name="two-layers", layers=(CONV, FC))
# sum(FW + BW) = 3.6e-4 s, sum(WU) = 4e-5 s, sum|w| = 66720, sum(|x| + |y|) = 10256
SERIAL_MEMORY_AT_4 = 2 * 4 * (4 * 10256 + 66720)


def case(strategy, pes, samples_per_pe=S, dataset_size=D, summary=TWO_LAYERS,
         weight_update="paper"):
    return evaluate(summary, PLATFORM, strategy, pes, samples_per_pe=samples_per_pe,
                    dataset_size=dataset_size, weight_update=weight_update)


# ---------------------------------------------------------------------------------------------
# the equations, by hand
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_on_one_pe_is_serial(strategy):
    result = case(strategy, 1)
    # D * sum(FW + BW) + (D / B) * sum(WU); the pipeline equation has no WU term
    expected = 1000 * 3.6e-4 + (0 if strategy == "pipeline" else (1000 / 4) * 4e-5)
    assert result.compute_seconds == pytest.approx(expected)
    assert result.communication_seconds == 0
    assert result.memory_bytes_per_pe == pytest.approx(SERIAL_MEMORY_AT_4)
    assert result.epoch_seconds == pytest.approx(expected)
    assert (result.feasible, result.bottleneck, result.batch) == (True, "compute", 4)


def test_serial_equals_data_on_one_pe():
    serial, data = case("serial", 1), case("data", 1)
    assert serial.model_dump(exclude={"strategy"}) == data.model_dump(exclude={"strategy"})


def test_data_on_eight_pes():
    alpha, beta = INTER_NODE  # 8 PEs span two nodes
    result = case("data", 8)
    assert result.batch == 32
    # ceil(1000 / 32) = 32 whole iterations, the last one full: 1024 samples computed
    assert result.compute_seconds == pytest.approx(32 * (32 / 8 * 3.6e-4 + 4e-5))
    assert result.communication_seconds == pytest.approx(
        2 * 32 * 7 * (alpha + 66720 * 4 * beta / 8))
    assert result.memory_bytes_per_pe == pytest.approx(2 * 4 * (32 / 8 * 10256 + 66720))


def test_spatial_on_eight_pes():
    alpha, beta = INTER_NODE
    # one replica over 8 PEs: B = 4 whatever p, 250 iterations. 8 PEs over the conv's 16x16
    # map: a 4 x 2 grid; an interior tile (4 x 8 of the map) gets (k - 1) // 2 = 1 row of
    # width 8 from each of 2 neighbours along H and 1 column of height 4 from its 1 neighbour
    # along W: 20 elements per channel, input 8 and output 16 channels. Across two nodes the
    # halos take the slower of PCIe and the inter-node link: the inter-node link.
    halo_x, halo_dy = 8 * (2 * 8 + 1 * 4), 16 * (2 * 8 + 1 * 4)
    allreduce = 2 * 7 * (alpha + 66720 * 4 * beta / 8)
    halo = 2 * (2 * alpha + 4 * (halo_x + halo_dy) * 4 * beta)  # the fc layer has no halo
    result = case("spatial", 8)
    assert result.batch == 4
    assert result.compute_seconds == pytest.approx(250 * (4 / 8 * 3.6e-4 + 4e-5))
    assert result.communication_seconds == pytest.approx(250 * (allreduce + halo))
    assert result.memory_bytes_per_pe == pytest.approx(2 * 4 * (4 * 10256 / 8 + 66720))


@pytest.mark.parametrize("strategy", ["filter", "channel"])
def test_filter_and_channel_on_eight_pes(strategy):
    alpha, beta = INTER_NODE
    result = case(strategy, 8)
    # one replica over all 8 PEs: the batch stays 4, every PE works on all 4 samples
    assert (result.batch, result.samples_per_pe) == (4, 4)
    assert result.compute_seconds == pytest.approx(250 * (4 / 8 * 3.6e-4 + 4e-5 / 8))
    # sum over l < G: the conv's output only
    assert result.communication_seconds == pytest.approx(
        3 * 250 * 7 * (alpha + 4 * 4096 * 4 * beta / 8))
    assert result.memory_bytes_per_pe == pytest.approx(2 * 4 * (4 * 10256 + 66720 / 8))


@pytest.mark.parametrize("strategy", ["filter", "channel"])
def test_filter_and_channel_batch_stays_fixed_as_pes_grow(strategy):
    data = [case("data", pes) for pes in (2, 4, 8, 16)]
    model = [case(strategy, pes) for pes in (2, 4, 8, 16)]
    assert [c.batch for c in data] == [8, 16, 32, 64]  # weak scaling: B = s * p
    assert [c.batch for c in model] == [4, 4, 4, 4]  # B = s: one replica
    assert {c.memory_bytes_per_pe - 2 * 4 * 66720 / c.pes for c in model} == {2 * 4 * 4 * 10256}


def test_activations_are_exchanged_only_at_layers_that_mix_channels():
    alpha, beta = NVLINK
    pool = LayerSummary(name="pool", x=16 * 16 * 16, y=16 * 8 * 8, fw_seconds=1e-5,
                        bw_seconds=1e-5, in_channels=16, out_channels=16, input_size=(16, 16),
                        output_size=(8, 8), kernel=(2, 2), mixes_channels=False)
    pooled = ModelSummary(name="pooled", layers=(CONV, pool, FC.model_copy(update={"x": 1024})))
    # the conv's output is exchanged, the pool works on its channel shard, the fc is last
    result = case("filter", 4, summary=pooled)
    assert result.communication_seconds == pytest.approx(
        3 * 250 * 3 * (alpha + 4 * 4096 * 4 * beta / 4))


def test_pipeline_on_two_pes():
    alpha, beta = NVLINK
    # two stages, one layer each; S = p = 2 segments of B / S = 4 samples; B = 8
    result = case("pipeline", 2)
    assert result.compute_seconds == pytest.approx(1000 * (2 + 2 - 1) / 2 * (1e-4 + 2e-4))
    assert result.communication_seconds == pytest.approx(
        2 * 1000 * (2 + 2 - 2) / 8 * (alpha + 8 / 2 * 4096 * 4 * beta))
    # the larger stage: the fc layer with its weights
    assert result.memory_bytes_per_pe == pytest.approx(2 * 4 * (8 * (4096 + 16) + 65552))


def test_data_filter_on_eight_pes():
    # p1 = 2 nodes x p2 = 4 GPUs: filter over NVLink, data between the nodes; one replica per
    # node, B = 4 * 2 = 8, 125 iterations
    (alpha_2, beta_2), (alpha_1, beta_1) = NVLINK, INTER_NODE
    result = case("data+filter", 8)
    assert result.batch == 8
    assert result.compute_seconds == pytest.approx(125 * (8 / 8 * 3.6e-4 + 4e-5 / 4))
    filter_term = 3 * 125 * 3 * (alpha_2 + 8 * 4096 * 4 * beta_2 / 8)
    data_term = 2 * 125 * 1 * (alpha_1 + 66720 * 4 * beta_1 / 8)
    assert result.communication_seconds == pytest.approx(filter_term + data_term)
    assert result.memory_bytes_per_pe == pytest.approx(2 * 4 * (8 * 10256 / 2 + 66720 / 4))


def test_data_spatial_on_eight_pes():
    (alpha_2, beta_2), (alpha_1, beta_1), (alpha_h, beta_h) = NVLINK, INTER_NODE, PCIE
    # spatial over a node's 4 GPUs (a 2 x 2 grid, tiles 8 x 8: one neighbour per axis) on
    # B / p1 = 4 samples, halos over PCIe; then the gradients all-reduced inside the node over
    # NVLink and between nodes
    halo_x, halo_dy = 8 * (8 + 8), 16 * (8 + 8)
    halo = 2 * (2 * alpha_h + 4 * (halo_x + halo_dy) * 4 * beta_h)
    inside = 2 * 3 * (alpha_2 + 66720 * 4 * beta_2 / 4)
    between = 2 * 1 * (alpha_1 + 66720 * 4 * beta_1 / 2)
    result = case("data+spatial", 8)
    assert result.batch == 8
    assert result.compute_seconds == pytest.approx(125 * (8 / 8 * 3.6e-4 + 4e-5))
    assert result.communication_seconds == pytest.approx(125 * (halo + inside + between))
    assert result.memory_bytes_per_pe == pytest.approx(2 * 4 * (8 * 10256 / 8 + 66720))


def test_an_epoch_is_whole_iterations():
    # 1001 samples in batches of 4: 251 iterations, the last one a full batch (ceil, as ParaDL)
    serial = case("serial", 1, dataset_size=1001)
    assert serial.compute_seconds == pytest.approx(251 * (4 * 3.6e-4 + 4e-5))
    alpha, beta = INTER_NODE
    data = case("data", 8, dataset_size=1001)  # B = 32: ceil(1001 / 32) = 32
    assert data.communication_seconds == pytest.approx(
        32 * 2 * 7 * (alpha + 66720 * 4 * beta / 8))


def test_collectives_take_the_latency_of_the_tier_they_span(tmp_path):
    path = tmp_path / "tiers.yaml"
    path.write_text("schema_version: 1\nname: tiers\ncluster: abci\ntiers:\n"
                    "  node: {bandwidth: 10 GB/s, latency: 1 us}\n"
                    "  rack: {bandwidth: 10 GB/s, latency: 2 us}\n"
                    "  across_racks: {bandwidth: 10 GB/s, latency: 3 us}\n")
    platform = load_platform(str(path))
    assert platform.name == "tiers" and platform.halo is None

    def comm(pes):
        return evaluate(TWO_LAYERS, platform, "data", pes, samples_per_pe=S,
                        dataset_size=4 * pes).communication_seconds  # one iteration

    # 4 PEs: one node; 8: two nodes of a rack; 128 = 32 nodes: two racks of 17
    for pes, latency in ((4, 1e-6), (8, 2e-6), (128, 3e-6)):
        assert comm(pes) == pytest.approx(2 * (pes - 1) * (latency + 66720 * 4 / pes / 10e9))


def test_channel_is_bounded_from_the_second_layer_on():
    rgb = CONV.model_copy(update={"in_channels": 3, "x": 3 * 16 * 16})
    image_first = ModelSummary(name="rgb", layers=(rgb, FC))
    assert case("channel", 8, summary=image_first).feasible  # 3 input channels do not bound it
    assert case("filter", 8, summary=image_first).feasible
    narrow = ModelSummary(name="narrow", layers=(rgb, FC.model_copy(update={"in_channels": 4})))
    result = case("channel", 8, summary=narrow)
    assert (result.feasible, result.reason) == (
        False, "p=8 > min input channels 4 (from the second layer)")


def test_weight_update_switch():
    paper, none = case("data", 8), case("data", 8, weight_update="none")
    assert paper.compute_seconds == pytest.approx(32 * (32 / 8 * 3.6e-4 + 4e-5))
    assert none.compute_seconds == pytest.approx(32 * (32 / 8 * 3.6e-4))
    assert none.communication_seconds == paper.communication_seconds
    with pytest.raises(LayerwiseError, match="unknown weight update 'some'"):
        case("data", 8, weight_update="some")


def test_equal_times_share_a_rank():
    cases = [case(name, 8) for name in ("data", "filter", "channel", "data+filter")]
    # one equation prices filter and channel: they tie, and share the rank after the others
    assert cases[1].epoch_seconds == cases[2].epoch_seconds
    assert ranks(cases) == {"data": 1, "data+filter": 2, "filter": 3, "channel": 3}
    assert ranks([*cases, case("serial", 2)]) == ranks(cases)  # infeasible cases go unranked


def test_step_case_gives_the_executed_global_batch_to_every_strategy():
    # 8 PEs x 4 samples: a global batch of 32 for data and model (filter) alike, one step
    for executed in ("data", "model", "spatial_h"):
        result = step_case(TWO_LAYERS, ABCI, executed, 8, 4)
        assert result.batch == 32 and result.feasible
    model = step_case(TWO_LAYERS, ABCI, "model", 8, 4)
    assert model.compute_seconds == pytest.approx(32 / 8 * 3.6e-4 + 4e-5 / 8)
    assert step_case(TWO_LAYERS, ABCI, "owt", 8, 4) is None
    # every strategy one step of the same 32 samples; the hybrids split them over 2 nodes
    cases = {c.strategy: c for c in step_cases(TWO_LAYERS, PLATFORM, 8, 4)}
    assert {c.batch for c in cases.values() if c.feasible} == {32}
    assert cases["data+filter"].samples_per_pe == 16 and cases["filter"].samples_per_pe == 32


def test_weight_update_estimated_from_memory_bandwidth():
    untimed = ModelSummary(name="no-wu", layers=(CONV.model_copy(update={"wu_seconds": None}),
                                                 FC.model_copy(update={"wu_seconds": None})))
    # read weight, gradient, momentum; write weight, momentum: 5 x 4 bytes per weight at 900 GB/s
    update = 5 * 4 * 66720 / 900e9
    assert case("serial", 1, summary=untimed).compute_seconds == pytest.approx(
        1000 * 3.6e-4 + 1000 / 4 * update)


def test_data_communication_grows_with_pes_and_slower_links():
    def expected(pes, link):
        alpha, beta = link
        iterations = math.ceil(1000 * 8 / (4 * pes))
        return 2 * iterations * (pes - 1) * (alpha + 66720 * 4 * beta / pes)

    pes_counts = [2, 4, 8, 64, 128]
    comm = [case("data", p, dataset_size=1000 * 8).communication_seconds for p in pes_counts]
    links = [NVLINK, NVLINK, INTER_NODE, INTER_NODE, INTER_RACK]  # 128 PEs = 32 nodes > 17
    for pes, measured, link in zip(pes_counts, comm, links, strict=True):
        assert measured == pytest.approx(expected(pes, link))
    assert comm == sorted(comm)
    assert comm[2] > expected(8, NVLINK) * 2  # crossing to the inter-node link costs


# ---------------------------------------------------------------------------------------------
# limits, memory and ranking
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("strategy", "pes", "reason"), [
    ("serial", 2, "p=2 > 1: serial runs on one PE"),
    ("pipeline", 8, "p=8 > 2 layers"),
    ("filter", 32, "p=32 > min filters 16"),
    ("spatial", 512, "p=512 > min output H*W 256"),
    ("data+spatial", 6, "p=6 is not a whole number of 4-PE nodes"),
])
def test_p_limits_make_a_case_infeasible(strategy, pes, reason):
    result = case(strategy, pes)
    assert (result.feasible, result.bottleneck, result.reason) == (False, "infeasible", reason)
    assert result.epoch_seconds is None and result.memory_bytes_per_pe is None


def test_hybrid_limits_apply_to_the_group_inside_a_node():
    # 1024 PEs are far beyond 16 filters, but data+filter splits filters only 4 ways
    assert case("data+filter", 1024).feasible
    two_classes = ModelSummary(name="two-classes",
                               layers=(CONV, FC.model_copy(update={"out_channels": 2})))
    result = case("data+filter", 8, summary=two_classes)
    assert (result.feasible, result.reason) == (False, "p2=4 > min filters 2")


def test_memory_over_the_device_is_infeasible_and_near_it_is_the_bottleneck():
    too_many = case("serial", 1, samples_per_pe=2**18)
    needed = 2 * 4 * (2**18 * 10256 + 66720)  # 20.03 GiB
    assert too_many.memory_bytes_per_pe == pytest.approx(needed)
    assert (too_many.feasible, too_many.bottleneck) == (False, "infeasible")
    assert too_many.reason == "needs 20 GiB per PE, device has 16 GiB"
    near = case("serial", 1, samples_per_pe=200_000)  # 15.3 GiB: over 90% of 16 GiB
    assert 0.9 * 16 * GIB < near.memory_bytes_per_pe <= 16 * GIB
    assert (near.feasible, near.bottleneck) == (True, "memory")


def test_fit_takes_the_largest_power_of_two_per_pe_that_fits():
    def serial_memory(samples):
        return 2 * 4 * (samples * 10256 + 66720)

    fitted = case("serial", 1, samples_per_pe=None, dataset_size=10**9)
    assert serial_memory(131072) <= 16 * GIB < serial_memory(262144)
    assert (fitted.samples_per_pe, fitted.batch, fitted.feasible) == (131072, 131072, True)
    # filter keeps all B = s samples on every PE and splits the weights: as many fit as serial
    assert case("filter", 8, samples_per_pe=None, dataset_size=10**9).samples_per_pe == 131072


def test_ranking_lists_feasible_strategies_fastest_first():
    report = oracle(TWO_LAYERS, ABCI, [1, 2, 8, 64], samples_per_pe=S, dataset_size=D)
    for pes, ranked in report.ranking.items():
        feasible = {c.strategy for c in report.cases if c.pes == pes and c.feasible}
        assert set(ranked) == feasible
        times = [report.case(strategy, pes).epoch_seconds for strategy in ranked]
        assert times == sorted(times)
    assert "pipeline" not in report.ranking[8]
    assert report.ranking[1][0] == "pipeline"  # the paper's pipeline equation leaves out WU
    assert len(report.cases) == 4 * len(STRATEGIES)


def test_unknown_strategy_and_scale_beyond_the_platform_are_errors():
    with pytest.raises(LayerwiseError, match="unknown strategy 'model'"):
        oracle(TWO_LAYERS, ABCI, [1], ["data", "model"])
    with pytest.raises(LayerwiseError, match="has 1..4352 PEs"):
        oracle(TWO_LAYERS, ABCI, [8192])


def test_pipeline_stages_minimise_the_slowest_stage():
    assert pipeline_stages([1, 5, 1, 1], 2) == [range(0, 2), range(2, 4)]
    assert pipeline_stages([5, 1, 1, 1, 1, 1], 2) == [range(0, 1), range(1, 6)]
    assert pipeline_stages([1, 1, 1, 1], 3) == [range(0, 2), range(2, 3), range(3, 4)]
    assert pipeline_stages([2, 2, 2], 3) == [range(0, 1), range(1, 2), range(2, 3)]


# ---------------------------------------------------------------------------------------------
# summaries: files and layer graphs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_summary_file_round_trip(tmp_path, suffix):
    path = TWO_LAYERS.save(tmp_path / f"two{suffix}")
    assert ModelSummary.load(path) == TWO_LAYERS


def test_sample_seconds_are_spread_by_flops():
    spread = ModelSummary(name="spread", sample_seconds=0.01, layers=(
        CONV.model_copy(update={"fw_seconds": None, "bw_seconds": None, "flops": 3e6}),
        FC.model_copy(update={"fw_seconds": None, "bw_seconds": None, "flops": 1e6}),
    ))
    seconds = spread.layer_seconds()
    assert sum(fw + bw for fw, bw in seconds) == pytest.approx(0.01)
    # 3/4 and 1/4 of the time; both layers have weights: backward twice the forward
    assert seconds[0] == pytest.approx((0.0075 / 3, 0.0075 * 2 / 3))
    assert seconds[1] == pytest.approx((0.0025 / 3, 0.0025 * 2 / 3))


@pytest.mark.parametrize(("text", "fragment"), [
    ("name: x\nlayers:\n  - {name: a, x: 1, in_channels: 1, out_channels: 1}\n",
     "layers.0.y: Field required"),
    ("name: x\nlayers:\n  - {name: a, x: 1, y: 1, in_channels: 1, out_channels: 1}\n",
     "layers.0.fw_seconds: required"),
    ("name: x\nlayers: [{name: a, x: 1, y: 1, fw_seconds: 1, in_channels: 1, "
     "out_channels: 1}]\n", "layers.0: give fw_seconds and bw_seconds together"),
    ("name: x\nlayers: [a, b\n", "is not valid YAML"),
    ("- just\n- a list\n", "the top level must be a mapping"),
])
def test_malformed_summary_is_one_line_naming_file_and_field(tmp_path, text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(LayerwiseError) as error:
        ModelSummary.load(path)
    message = str(error.value)
    assert f"model summary {path}" in message and fragment in message
    assert "\n" not in message


def _whole_layer(layer):
    return largest_tile(layer, ParallelConfig(devices=(0,)))


def test_summary_from_graph_matches_the_layer_graph():
    graph = build_graph("lenet5", batch=8)
    compute = AnalyticCompute(ABCI)
    summary = summary_from_graph(graph, compute)
    kept = [layer for layer in graph.layers
            if layer.kind in ("conv", "linear", "pool", "adaptive_pool")]
    assert [layer.name for layer in summary.layers] == [layer.name for layer in kept]
    for layer, entry in zip(kept, summary.layers, strict=True):
        in_shape, out_shape = layer.input_shapes[0], layer.output_shape
        assert (entry.x, entry.y, entry.w) == (math.prod(in_shape[1:]), math.prod(out_shape[1:]),
                                               layer.param_count)
        assert (entry.in_channels, entry.out_channels) == (in_shape[1], out_shape[1])
        assert entry.fw_seconds + entry.bw_seconds == pytest.approx(
            compute.tile_seconds(layer, _whole_layer(layer)) / 8)
        backward_ratio = 2 if layer.param_count else 1
        assert entry.bw_seconds == pytest.approx(backward_ratio * entry.fw_seconds)
        # memory-bound: 5 passes over 4-byte weights, one kernel launch per weight tensor
        launches = len(layer.param_shapes) * ABCI.device.kernel_latency
        assert entry.wu_seconds == pytest.approx(
            5 * 4 * layer.param_count / ABCI.device.memory_bandwidth + launches)
    assert summary.weights == graph.param_count
    assert summary.layers[0].kernel == (5, 5) and summary.layers[0].input_size == (32, 32)


def test_summary_from_a_profile_divides_the_whole_layer_time_by_the_batch_and_keeps_its_update():
    graph = build_graph("lenet5", batch=4)
    layers = [layer for layer in graph.layers if layer.kind != "input"]
    measured = Profile(
        model="lenet5", structure_hash=graph.structure_hash, input_shape=graph.input_shape,
        device_name="test", device_type="cpu", torch_version="test", batch=4, devices=1,
        threads=1, method="by hand", warmup=0, repeats=1, created="today",
        seconds={layer.name: {_whole_layer(layer).key: 0.001 * (index + 1)}
                 for index, layer in enumerate(layers)},
        update_seconds={layer.name: {_whole_layer(layer).key: 1e-5 * layer.param_count}
                        for layer in layers})
    summary = summary_from_graph(graph, ProfiledCompute(measured))
    per_sample = {layer.name: 0.001 * (index + 1) / 4 for index, layer in enumerate(layers)}
    for entry in summary.layers:
        assert entry.fw_seconds + entry.bw_seconds == pytest.approx(per_sample[entry.name])
        assert entry.wu_seconds == pytest.approx(1e-5 * entry.w)  # per iteration, measured


# ---------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_json_is_an_oracle_report():
    result = runner.invoke(app, ["oracle", "alexnet", "--gpus", "1,8", "--json"])
    assert result.exit_code == 0, result.output
    report = OracleReport.model_validate_json(result.stdout)
    assert (report.model, report.platform, report.dataset_size) == ("alexnet", "abci", 1281167)
    assert set(report.ranking) == {1, 8}
    assert len(report.cases) == 2 * len(STRATEGIES)
    assert report.case("data", 8).batch == 8 * 32
    assert json.loads(result.stdout)["schema_version"] == 1


def test_cli_reads_a_summary_file_and_prints_tables(tmp_path):
    path = TWO_LAYERS.save(tmp_path / "two.yaml")
    saved = tmp_path / "report.json"
    result = runner.invoke(app, ["oracle", str(path), "--gpus", "1..8", "--samples-per-gpu",
                                 "4", "--dataset-size", "1000", "--strategies", "data,filter",
                                 "--save", str(saved)])
    assert result.exit_code == 0, result.output
    for title in ("1 GPU (1 node of abci)", "2 GPUs", "4 GPUs", "8 GPUs (2 nodes of abci)"):
        assert title in result.stdout
    assert "fastest per GPU count: 1: data" in result.stdout
    report = OracleReport.model_validate_json(saved.read_text())
    assert report.case("data", 8) == evaluate(TWO_LAYERS, ABCI, "data", 8, samples_per_pe=4,
                                              dataset_size=1000)


def test_table8_ranks_match_the_paper():
    result = runner.invoke(app, ["oracle", "table8", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    ours = {(row["model"], row["gpus"], row["case"]["strategy"]): row["rank"] for row in rows}
    stated = {(model, gpus, name): rank for (model, gpus), ranked in PAPER_RANKS.items()
              for name, rank in ranked.items()}
    assert ours == stated
    # the eight cases of Table VIII: two models at 32 and 64 GPUs, the four strategies each
    assert {(model, gpus) for model, gpus, _ in ours if gpus <= 64} == {
        (model, gpus) for model in ("resnet50", "vgg16") for gpus in (32, 64)}
    assert [row["case"]["batch"] for row in rows if row["gpus"] == 32] == [
        512, 512, 64, 64, 256, 256, 32, 32]


def test_table8_prints_the_paper_beside_ours():
    result = runner.invoke(app, ["oracle", "table8"])
    assert result.exit_code == 0, result.output
    assert "ranks matching the paper: 24 of 24" in result.stdout
    assert "DIFFERS" not in result.stdout


@pytest.mark.parametrize(("args", "fragment"), [
    (["--gpus", "0,8"], "'0' is not a positive whole number"),
    (["--gpus", "1..x"], "'x' is not a positive whole number"),
    (["--strategies", "data,owt"], "unknown strategy 'owt'"),
    (["--platform", "nowhere"], "unknown cluster 'nowhere'"),
    (["--samples-per-gpu", "lots"], "--samples-per-gpu must be"),
    (["--weight-update", "half"], "--weight-update must be one of paper, none"),
])
def test_cli_bad_options_are_one_line(args, fragment):
    result = runner.invoke(app, ["oracle", "lenet5", *args])
    one_line_error(result, fragment)


@pytest.mark.parametrize("args", [["--gpus", "32"], ["--samples-per-gpu", "8"],
                                  ["--profile", "p.json"]])
def test_table8_refuses_options_that_do_not_apply(args):
    result = runner.invoke(app, ["oracle", "table8", *args])
    one_line_error(result, f"{args[0]} does not apply to it")


@pytest.mark.parametrize(("text", "fragment"), [
    ("schema_version: 1\nname: x\ncluster: abci\ntiers: {rack: {bandwidth: 1 GB/s, "
     "latency: 1 us}}\n", "tiers.node: Field required"),
    ("schema_version: 1\nname: x\ncluster: nowhere\ntiers: {node: {bandwidth: 1 GB/s, "
     "latency: 1 us}, rack: {bandwidth: 1 GB/s, latency: 1 us}}\n", "unknown cluster 'nowhere'"),
    ("schema_version: 2\nname: x\ncluster: abci\ntiers: {node: {bandwidth: 1 GB/s, "
     "latency: 1 us}, rack: {bandwidth: 1 GB/s, latency: 1 us}}\n", "schema_version"),
])
def test_cli_malformed_platform_is_one_line(tmp_path, text, fragment):
    path = tmp_path / "platform.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["oracle", "lenet5", "--platform", str(path)])
    one_line_error(result, fragment)


def test_cli_malformed_summary_is_one_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"name": "bad", "layers": [{"name": "a", "x": -1}]}')
    result = runner.invoke(app, ["oracle", str(path)])
    one_line_error(result, f"model summary {path}: layers.0.x")
