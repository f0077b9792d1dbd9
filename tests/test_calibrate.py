"""Link calibration with real gloo processes on this machine: the alpha-beta fit, the cluster
file it produces, worker failures as one-line errors, and `layerwise calibrate`."""

from __future__ import annotations

import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from layerwise.flows.cli.measure import register
from layerwise.strategies.cost.compute_time import AnalyticCompute
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.hardware.calibrate import (
    Calibration,
    _run_workers,
    calibrate,
    calibrated_cluster,
    fit_alpha_beta,
    message_sizes,
)
from layerwise.strategies.hardware.cluster import load_cluster
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.space import ParallelConfig


@pytest.fixture(scope="module")
def calibration():
    return calibrate(2, backend="gloo", quick=True)


def test_fit_recovers_latency_and_bandwidth_of_exact_times():
    sizes = message_sizes()
    assert sizes[0] == 4 and sizes[-1] == 16 << 20 and len(sizes) == 12
    alpha, bandwidth = 20e-6, 5e9
    latency, fitted = fit_alpha_beta(sizes, [alpha + size / bandwidth for size in sizes])
    assert latency == pytest.approx(alpha, rel=1e-6)
    assert fitted == pytest.approx(bandwidth, rel=1e-6)
    p = 4  # the ring all-reduce model 2(p-1)(alpha + m*beta/p)
    ring = [2 * (p - 1) * (alpha + size / (bandwidth * p)) for size in sizes]
    latency, fitted = fit_alpha_beta(sizes, ring, latency_factor=2 * (p - 1),
                                     bytes_factor=2 * (p - 1) / p)
    assert latency == pytest.approx(alpha, rel=1e-6)
    assert fitted == pytest.approx(bandwidth, rel=1e-6)


def test_fit_keeps_latency_and_bandwidth_positive_on_noise():
    latency, bandwidth = fit_alpha_beta([4, 1024, 1 << 20], [3e-4, 1e-4, 2e-4])
    assert latency > 0 and bandwidth > 0


def test_gloo_calibration_measures_every_kind(calibration):
    """Exchanges, all-reduces, and the copy of a bucket's gradients into its flat buffer."""
    assert calibration.backend == "gloo" and calibration.nproc == 2
    assert calibration.p2p_latency > 0 and calibration.p2p_bandwidth > 0
    assert calibration.allreduce_latency > 0 and calibration.allreduce_bandwidth > 0
    assert calibration.copy_bandwidth is not None and calibration.copy_bandwidth > 0
    for kind in ("p2p", "p2p_one_rank", "allreduce"):
        points = calibration.measured(kind)
        assert [point.bytes for point in points] == message_sizes(quick=True)
        assert all(point.seconds > 0 for point in points)
    # an exchange costs what the rank that reached it last waited (never more than rank 0's
    # wait, and less wherever rank 0 reached one first) and what the layer after it lost
    after = [point.seconds for point in calibration.measured("p2p_after")]
    assert len(after) == len(message_sizes(quick=True))
    waited = [point.seconds - slower
              for point, slower in zip(calibration.measured("p2p"), after, strict=True)]
    one_rank = [point.seconds for point in calibration.measured("p2p_one_rank")]
    assert all(a <= b * (1 + 1e-9) for a, b in zip(waited, one_rank, strict=True))
    assert any(a < b for a, b in zip(waited, one_rank, strict=True))
    copies = calibration.measured("copy")  # 4 tensors of a quarter each, one element at least
    assert [point.bytes for point in copies] == [max(size, 16) for size in message_sizes(
        quick=True)]
    assert all(point.seconds > 0 for point in copies)
    assert calibration.torch_version == torch.__version__
    assert Calibration.model_validate_json(calibration.to_json()) == calibration


def test_calibrated_cluster_is_the_local_preset_with_the_measured_link(calibration):
    cluster = calibrated_cluster(calibration)
    local = load_cluster("local")
    assert cluster.name == "local-calibrated"
    assert cluster.devices_per_node == 2 and cluster.nodes == 1 and cluster.num_devices == 2
    assert cluster.links.intra_node == calibration.link
    assert cluster.links.intra_node.latency == pytest.approx(calibration.p2p_latency, rel=1e-3)
    assert cluster.links.intra_node.bandwidth == pytest.approx(calibration.p2p_bandwidth,
                                                               rel=1e-3)
    assert cluster.links.inter_node == local.links.inter_node
    assert cluster.device == local.device and cluster.sync == "bucketed"  # the runtime's
    assert "gloo" in cluster.description and calibration.created in cluster.description
    assert cluster.link(0, 1) == calibration.link


def test_gradient_sync_is_priced_at_the_measured_all_reduce(calibration, tmp_path):
    """The cost model's ring for two replicas is the all-reduce fit, not two p2p messages,
    plus each device's copy of its gradients into the buckets at the measured rate; the
    figures survive the cluster file `layerwise calibrate` writes."""
    cluster = calibrated_cluster(calibration)
    link = cluster.links.intra_node
    assert link.ring_latency == pytest.approx(calibration.allreduce_latency, rel=1e-3)
    assert link.ring_bandwidth == pytest.approx(calibration.allreduce_bandwidth, rel=1e-3)
    assert cluster.bucket_copy_bandwidth == pytest.approx(calibration.copy_bandwidth, rel=1e-3)
    path = tmp_path / "calibrated.yaml"
    path.write_text(cluster.to_yaml(), encoding="utf-8")
    assert load_cluster(path) == cluster
    graph = build_graph("lenet5", batch=8, image_size=32)
    cost = CostModel(graph, cluster, 2, AnalyticCompute(cluster))
    fc = graph.by_name["classifier_0"]
    data = {layer.name: ParallelConfig.parse("n2c1h1w1@0-1") for layer in graph.layers}
    _, moved = cost.sync(fc, [data[fc.name]])
    weight_bytes = fc.param_count * 4
    assert moved[0] == 2 * weight_bytes  # 2(p-1) chunks of 1/p of the weights each way
    # LeNet-5's 0.25 MB of gradients are one bucket: one measured all-reduce a step, after
    # each device copied them all into it
    all_weights = sum(layer.param_count for layer in graph.layers) * 4
    assert cost.evaluate(data).sync_seconds == pytest.approx(
        calibration.allreduce_seconds(all_weights) + all_weights / calibration.copy_bandwidth,
        rel=1e-3)


def test_fewer_than_two_processes_is_an_error():
    with pytest.raises(LayerwiseError, match="at least 2 processes"):
        calibrate(1)


def test_a_failing_worker_names_its_rank():
    with pytest.raises(LayerwiseError) as error:  # no timed rounds: rank 0's median fails
        _run_workers(2, "gloo", [4], warmup=0, repeats=0)
    message = str(error.value)
    assert "rank 0" in message and "StatisticsError" in message and "\n" not in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_nccl_without_gpus_is_an_error():
    with pytest.raises(LayerwiseError, match="--backend gloo"):
        calibrate(2, backend="nccl", quick=True)
    with pytest.raises(LayerwiseError, match="unknown backend"):
        calibrate(2, backend="mpi", quick=True)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_calibration_between_two_gpus():
    result = calibrate(2, backend="nccl", quick=True)
    assert result.backend == "nccl" and result.p2p_bandwidth > 0


# ---------------------------------------------------------------------------------------------
# layerwise calibrate
# ---------------------------------------------------------------------------------------------


def _invoke(*args: str):
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def main() -> None:
        """Test harness: a fresh app with only the measurement commands."""

    register(app)
    return CliRunner().invoke(app, list(args))


def test_cli_calibrate_writes_a_cluster_the_search_can_load(tmp_path):
    out = tmp_path / "profiles" / "cluster-local.yaml"
    result = _invoke("calibrate", "--nproc", "2", "--quick", "--backend", "gloo",
                     "--out", str(out))
    assert result.exit_code == 0, result.output
    cluster = load_cluster(out)
    assert cluster.name == "local-calibrated" and cluster.num_devices == 2
    raw = Calibration.model_validate_json(
        (tmp_path / "profiles" / "cluster-local.calibration.json").read_text())
    assert cluster.links.intra_node == raw.link
    assert f"layerwise search MODEL --cluster {out}" in result.stdout
    assert "1 MiB" in result.stdout and "point-to-point: latency" in result.stdout


def test_cli_calibrate_json(tmp_path):
    out = tmp_path / "c.yaml"
    result = _invoke("calibrate", "--nproc", "2", "--quick", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["cluster_path"] == str(out)
    assert document["calibration"]["nproc"] == 2
    assert load_cluster(out).devices_per_node == 2


def test_cli_calibrate_one_process_is_a_one_line_error(tmp_path):
    result = _invoke("calibrate", "--nproc", "1", "--out", str(tmp_path / "c.yaml"))
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "--nproc 1" in lines[0]
    assert not (tmp_path / "c.yaml").exists()
