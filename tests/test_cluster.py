"""Cluster specs: presets, link semantics, unit parsing, one-line errors."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from layerwise.strategies.errors import ClusterError, LayerwiseError
from layerwise.strategies.hardware.cluster import (
    Cluster,
    Link,
    format_quantity,
    load_cluster,
    parse_quantity,
    preset_names,
    presets,
)
from layerwise.strategies.oracle.paradl import allreduce_seconds as oracle_allreduce

EXPECTED_DEVICES = {"p100x16": 16, "p100x16-2018": 16, "k20x8": 8, "abci": 4352, "h100x8": 8,
                    "h200x8": 8, "h200x16": 16, "local": 8}


def brute_slowest(cluster: Cluster, devices) -> Link | None:
    links = [cluster.link(a, b) for a, b in itertools.combinations(sorted(set(devices)), 2)]
    if not links:
        return None
    return Link(
        bandwidth=min(link.bandwidth for link in links),
        latency=max(link.latency for link in links),
    )


def minimal() -> dict:
    """A small valid cluster as plain YAML data."""
    return {
        "name": "tiny",
        "nodes": 2,
        "devices_per_node": 4,
        "device": {
            "name": "gpu",
            "peak_flops_fp32": "10 TFLOP/s",
            "memory_bytes": "16 GiB",
            "memory_bandwidth": "900 GB/s",
        },
        "links": {
            "intra_node": {"bandwidth": "20 GB/s", "latency": "5 us"},
            "inter_node": {"bandwidth": "100 Gb/s", "latency": "10 us"},
        },
    }


def write(tmp_path: Path, data, name: str = "my.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return path


def load_error(tmp_path: Path, data) -> str:
    with pytest.raises(ClusterError) as info:
        load_cluster(write(tmp_path, data))
    message = str(info.value)
    assert "\n" not in message
    return message


# -- presets ------------------------------------------------------------------------------------


def test_preset_names():
    assert set(EXPECTED_DEVICES) <= set(preset_names())
    assert [c.name for c in presets()] == preset_names()


@pytest.mark.parametrize("name", sorted(EXPECTED_DEVICES))
def test_preset_loads_and_round_trips(name, tmp_path):
    cluster = load_cluster(name)
    assert cluster.name == name
    assert cluster.num_devices == EXPECTED_DEVICES[name]
    path = tmp_path / f"{name}-copy.yaml"
    path.write_text(cluster.to_yaml(), encoding="utf-8")
    again = load_cluster(path)
    assert again == cluster
    assert load_cluster(str(path)) == cluster
    assert again.to_yaml() == cluster.to_yaml()


def test_preset_files_cite_sources():
    folder = Path(__file__).resolve().parents[1] / "strategies" / "hardware" / "clusters"
    for name in EXPECTED_DEVICES:
        assert (folder / f"{name}.yaml").read_text().startswith("#")


def test_preset_figures():
    p100 = load_cluster("p100x16-2018")
    assert p100.device.peak_flops_fp32 == 10.6e12
    assert p100.device.peak_flops_bf16 is None
    assert p100.device.memory_bytes == 16 * 2**30
    assert p100.device.memory_bandwidth == 732e9
    k20 = load_cluster("k20x8")
    assert k20.compute_efficiency == 0.57
    assert k20.device.memory_bytes == 5_000_000_000
    abci = load_cluster("abci")
    assert abci.links.inter_node.latency == pytest.approx(30.31e-6, rel=1e-12)
    assert abci.racks.link.latency == pytest.approx(30.71e-6, rel=1e-12)
    h200 = load_cluster("h200x8")
    assert h200.device.peak_flops_bf16 == 989e12
    assert h200.device.memory_bandwidth == 4.8e12
    assert h200.links.inter_node.bandwidth == 50e9
    h100 = load_cluster("h100x8")
    assert (h100.device.memory_bandwidth, h100.device.memory_bytes) == (3.35e12, 80e9)
    assert h100.device.multiprocessors == h200.device.multiprocessors == 132
    assert load_cluster("local").device.name == "cpu"


def test_load_returns_cluster_unchanged():
    cluster = load_cluster("local")
    assert load_cluster(cluster) is cluster


def test_models_are_frozen():
    cluster = load_cluster("local")
    with pytest.raises(ValueError):
        cluster.nodes = 3  # type: ignore[misc]


# -- links ------------------------------------------------------------------------------------


def test_p100_links():
    c = load_cluster("p100x16-2018")
    assert c.link(0, 1) == c.links.intra_node
    assert c.link(0, 1).bandwidth == 20e9
    assert c.link(0, 4) == c.links.inter_node
    assert c.link(0, 4).bandwidth == 12.5e9
    assert c.link(3, 3) is None
    assert c.node_of(0) == 0 and c.node_of(4) == 1 and c.node_of(15) == 3


def test_k20_links():
    c = load_cluster("k20x8")
    assert c.link(0, 3).bandwidth == 6e9
    assert c.link(3, 4).bandwidth == 3e9
    assert c.link(4, 7).bandwidth == 6e9


def test_abci_rack_link():
    c = load_cluster("abci")
    assert c.link(0, 4 * 17) == c.racks.link
    assert c.link(0, 4 * 17 - 1) == c.links.inter_node
    assert c.link(0, 3) == c.links.intra_node
    assert c.rack_of(4 * 17) == 1


def test_device_out_of_range():
    c = load_cluster("p100x16-2018")
    for bad in (16, -1):
        with pytest.raises(ClusterError, match="out of range"):
            c.link(0, bad)
        with pytest.raises(ClusterError, match="out of range"):
            c.node_of(bad)
        with pytest.raises(ClusterError, match="out of range"):
            c.slowest_link([0, bad])


def test_slowest_link_levels():
    p100 = load_cluster("p100x16-2018")
    assert p100.slowest_link([]) is None
    assert p100.slowest_link([5]) is None
    assert p100.slowest_link([5, 5]) is None
    assert p100.slowest_link([0, 1, 2, 3]) == p100.links.intra_node
    assert p100.slowest_link([0, 1, 4, 5]) == p100.links.inter_node
    assert p100.slowest_link([0, 4]) == p100.links.inter_node
    assert p100.slowest_link(range(16)) == p100.links.inter_node

    abci = load_cluster("abci")
    assert abci.slowest_link(range(4)) == abci.links.intra_node
    assert abci.slowest_link(range(8)) == abci.links.inter_node
    two_racks = abci.slowest_link([0, 4 * 17])
    assert two_racks == abci.racks.link
    assert abci.slowest_link(range(0, 4 * 18)) == abci.racks.link
    assert abci.slowest_link(range(abci.num_devices)) == abci.racks.link

    k20 = load_cluster("k20x8")
    assert k20.slowest_link([0, 1, 2, 3]) == k20.groups.link
    assert k20.slowest_link([0, 4]) == k20.links.intra_node
    assert k20.slowest_link(range(8)) == k20.links.intra_node


def test_link_tiers_nest_groups_nodes_and_racks():
    p100 = load_cluster("p100x16-2018")
    assert p100.link_tiers() == [(4, p100.links.intra_node), (16, p100.links.inter_node)]
    k20 = load_cluster("k20x8")
    assert k20.link_tiers() == [(4, k20.groups.link), (8, k20.links.intra_node)]
    abci = load_cluster("abci")
    assert abci.link_tiers() == [(4, abci.links.intra_node), (68, abci.links.inter_node),
                                 (abci.num_devices, abci.racks.link)]
    # each tier's link is `link` between a device of one unit and one of the tier before
    for cluster in (p100, k20, abci):
        inner = 1
        for size, link in cluster.link_tiers():
            assert all(cluster.link(a, b) == link for a in range(0, size, inner)
                       for b in range(a + inner, size, inner))
            inner = size
    lone = Cluster.model_validate({**minimal(), "nodes": 1, "devices_per_node": 1})
    assert lone.link_tiers() == []


def test_slowest_link_mixes_levels():
    """Lowest bandwidth and highest latency may come from different levels."""
    data = minimal()
    data["links"]["intra_node"] = {"bandwidth": "10 GB/s", "latency": "1 us"}
    data["links"]["inter_node"] = {"bandwidth": "50 GB/s", "latency": "20 us"}
    c = Cluster.model_validate(data)
    assert c.slowest_link([0, 1, 4]) == Link(bandwidth=10e9, latency=20e-6)
    assert c.slowest_link([0, 1, 4]) == brute_slowest(c, [0, 1, 4])


def test_slowest_link_is_fast_for_1024_devices():
    import time

    c = load_cluster("abci")
    start = time.perf_counter()
    for _ in range(20):
        c.slowest_link(range(1024))
    assert time.perf_counter() - start < 1.0


@st.composite
def device_subsets(draw, n: int, span: int):
    """Random subsets: spread over the whole cluster, or packed near one device."""
    size = draw(st.integers(0, min(40, n)))
    if draw(st.booleans()):
        return draw(st.lists(st.integers(0, n - 1), min_size=size, max_size=size))
    base = draw(st.integers(0, n - 1))
    offsets = st.integers(-span, span)
    return [min(n - 1, max(0, base + o)) for o in draw(st.lists(offsets, max_size=size))]


@pytest.mark.parametrize("name", sorted(EXPECTED_DEVICES))
def test_slowest_link_matches_brute_force(name):
    cluster = load_cluster(name)
    span = cluster.devices_per_node * (cluster.racks.nodes_per_rack if cluster.racks else 2)

    @settings(max_examples=150, deadline=None)
    @given(device_subsets(cluster.num_devices, span))
    def check(devices):
        slowest, expected = cluster.slowest_link(devices), brute_slowest(cluster, devices)
        assert (slowest is None) == (expected is None)
        if expected is not None:  # a bottleneck's figures; whose port it is does not matter
            assert (slowest.bandwidth, slowest.latency) == (expected.bandwidth, expected.latency)

    check()


# -- units ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("20 GB/s", "bandwidth", 20e9),
        ("100 Gb/s", "bandwidth", 12.5e9),
        ("6 GB/s", "bandwidth", 6e9),
        ("450 GB/s", "bandwidth", 450e9),
        ("1.5 TB/s", "bandwidth", 1.5e12),
        ("800 MB/s", "bandwidth", 800e6),
        ("10 GiB/s", "bandwidth", 10 * 2**30),
        ("9 us", "latency", 9e-6),
        ("1.5 ms", "latency", 1.5e-3),
        ("300 ns", "latency", 300e-9),
        ("30.31 us", "latency", 30.31e-6),
        ("0 s", "latency", 0.0),
        ("10.6 TFLOP/s", "flops", 10.6e12),
        ("989 TFLOP/s", "flops", 989e12),
        ("100 GFLOP/s", "flops", 100e9),
        ("16 GiB", "memory", 16 * 2**30),
        ("141 GB", "memory", 141e9),
        ("5 GB", "memory", 5e9),
        ("2.5e9", "bandwidth", 2.5e9),
        (3, "latency", 3.0),
        ("12.5GB/s", "bandwidth", 12.5e9),
    ],
)
def test_parse_units(text, kind, value):
    assert parse_quantity(text, kind) == value


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("20 parsecs", "bandwidth"),
        ("20 gb/s", "bandwidth"),
        ("GB/s", "bandwidth"),
        ("", "bandwidth"),
        ("fast", "bandwidth"),
        ("20 GB", "bandwidth"),
        ("9 GB/s", "latency"),
        ("9 mins", "latency"),
        ("10 TFLOP", "flops"),
        ("16 gib", "memory"),
        ("1.2.3 GB", "memory"),
        (True, "memory"),
        ([1], "latency"),
    ],
)
def test_bad_units(text, kind):
    with pytest.raises(ValueError, match="cannot read"):
        parse_quantity(text, kind)


def test_units_are_case_sensitive_for_bits():
    assert parse_quantity("8 Gb/s", "bandwidth") * 8 == parse_quantity("8 GB/s", "bandwidth")


@pytest.mark.parametrize(
    ("value", "kind", "text"),
    [
        (20e9, "bandwidth", "20 GB/s"),
        (12.5e9, "bandwidth", "12.5 GB/s"),
        (4.8e12, "bandwidth", "4.8 TB/s"),
        (10 * 2**30, "bandwidth", "10 GiB/s"),
        (30.31e-6, "latency", "30.31 us"),
        (5e-6, "latency", "5 us"),
        (1.5e-3, "latency", "1.5 ms"),
        (0.0, "latency", "0 s"),
        (10.6e12, "flops", "10.6 TFLOP/s"),
        (16 * 2**30, "memory", "16 GiB"),
        (141_000_000_000, "memory", "141 GB"),
    ],
)
def test_format_units(value, kind, text):
    assert format_quantity(value, kind) == text


@settings(max_examples=300, deadline=None)
@given(
    st.floats(min_value=1e-12, max_value=1e18, allow_nan=False, allow_infinity=False),
    st.sampled_from(["bandwidth", "latency", "flops", "memory"]),
)
def test_format_round_trips_exactly(value, kind):
    text = format_quantity(value, kind)
    assert parse_quantity(text, kind) == value


@settings(max_examples=100, deadline=None)
@given(
    bandwidth=st.floats(min_value=1.0, max_value=1e15),
    latency=st.floats(min_value=0.0, max_value=1.0, allow_subnormal=False),  # refused
    flops=st.floats(min_value=1.0, max_value=5e17),  # bf16 at twice it: the largest allowed
    memory=st.integers(min_value=1, max_value=2**50),
    efficiency=st.floats(min_value=1e-6, max_value=1.0),
)
def test_cluster_round_trips_exactly(
    tmp_path_factory, bandwidth, latency, flops, memory, efficiency
):
    data = minimal()
    data["links"]["inter_node"] = {"bandwidth": bandwidth, "latency": latency}
    data["device"].update(peak_flops_fp32=flops, peak_flops_bf16=flops * 2, memory_bytes=memory)
    data["compute_efficiency"] = efficiency
    cluster = Cluster.model_validate(data)
    path = tmp_path_factory.mktemp("rt") / "c.yaml"
    path.write_text(cluster.to_yaml(), encoding="utf-8")
    assert load_cluster(path) == cluster


# -- errors -----------------------------------------------------------------------------------


def test_error_is_a_layerwise_error():
    assert issubclass(ClusterError, LayerwiseError)


def test_malformed_yaml(tmp_path):
    message = load_error(tmp_path, "name: x\nnodes: [1, 2\ndevices_per_node: 4\n")
    assert "my.yaml" in message and "not valid YAML" in message and "line" in message


def test_top_level_list(tmp_path):
    message = load_error(tmp_path, "- a\n- b\n")
    assert "top level must be a mapping" in message and "list" in message


def test_empty_file(tmp_path):
    assert "empty" in load_error(tmp_path, "")


def test_unknown_field(tmp_path):
    data = minimal() | {"foo": 1}
    assert load_error(tmp_path, data).startswith(f"cluster file {tmp_path / 'my.yaml'}: foo:")
    assert "unknown field" in load_error(tmp_path, data)


def test_unknown_nested_field(tmp_path):
    data = minimal()
    data["links"]["intra_node"]["jitter"] = 1
    assert "links.intra_node.jitter: unknown field" in load_error(tmp_path, data)


def test_missing_field(tmp_path):
    data = minimal()
    del data["links"]["inter_node"]
    assert "links.inter_node: required field is missing" in load_error(tmp_path, data)


def test_nodes_zero(tmp_path):
    assert ": nodes: must be > 0 (got 0)" in load_error(tmp_path, minimal() | {"nodes": 0})


def test_devices_per_node_zero(tmp_path):
    message = load_error(tmp_path, minimal() | {"devices_per_node": 0})
    assert ": devices_per_node: must be > 0" in message


def test_negative_bandwidth(tmp_path):
    data = minimal()
    data["links"]["inter_node"]["bandwidth"] = -1
    message = load_error(tmp_path, data)
    assert message == (
        f"cluster file {tmp_path / 'my.yaml'}: links.inter_node.bandwidth: must be > 0 (got -1)"
    )


def test_zero_bandwidth(tmp_path):
    data = minimal()
    data["links"]["intra_node"]["bandwidth"] = "0 GB/s"
    assert "links.intra_node.bandwidth: must be > 0" in load_error(tmp_path, data)


def test_negative_latency(tmp_path):
    data = minimal()
    data["links"]["intra_node"]["latency"] = "-3 us"
    assert "links.intra_node.latency: must be >= 0" in load_error(tmp_path, data)


def test_bad_unit_string(tmp_path):
    data = minimal()
    data["links"]["intra_node"]["bandwidth"] = "20 parsecs"
    assert load_error(tmp_path, data).endswith(
        ": links.intra_node.bandwidth: cannot read '20 parsecs' as a bandwidth (e.g. '12.5 GB/s')"
    )


def test_bad_device_fields(tmp_path):
    data = minimal()
    data["device"]["memory_bytes"] = "16 parsecs"
    assert "device.memory_bytes: cannot read" in load_error(tmp_path, data)
    data = minimal()
    data["device"]["peak_flops_bf16"] = 0
    assert "device.peak_flops_bf16: must be > 0" in load_error(tmp_path, data)


def test_groups_size_not_dividing(tmp_path):
    data = minimal() | {"groups": {"size": 3, "link": {"bandwidth": 1e9, "latency": 0}}}
    message = load_error(tmp_path, data)
    assert "groups.size" in message and "divide devices_per_node" in message


def test_groups_size_zero(tmp_path):
    data = minimal() | {"groups": {"size": 0, "link": {"bandwidth": 1e9, "latency": 0}}}
    assert "groups.size: must be > 0" in load_error(tmp_path, data)


@pytest.mark.parametrize(("value", "expected"), [(0, "must be > 0"), (1.5, "must be <= 1")])
def test_compute_efficiency_bounds(tmp_path, value, expected):
    message = load_error(tmp_path, minimal() | {"compute_efficiency": value})
    assert f"compute_efficiency: {expected}" in message


@pytest.mark.parametrize(("device", "expected"), [
    ({"multiprocessors": 0}, "device.multiprocessors: must be > 0"),
    ({"kernel_latency": "5 parsecs"}, "device.kernel_latency: cannot read '5 parsecs'"),
])
def test_bad_device_model_figures(tmp_path, device, expected):
    data = minimal()
    data["device"] = data["device"] | device
    assert expected in load_error(tmp_path, data)


@pytest.mark.parametrize(("name", "sync"), [("p100x16-2018", "parameter_server"),
                                            ("p100x16", "ring"), ("abci", "ring"),
                                            ("h200x8", "ring"), ("h200x16", "ring"),
                                            ("k20x8", "ring")])
def test_gpu_presets_carry_their_device_model_and_their_systems_sync(name, sync):
    cluster = load_cluster(name)
    assert cluster.device.multiprocessors and cluster.device.kernel_latency == 5e-6
    assert cluster.sync == sync


def test_bad_sync(tmp_path):
    message = load_error(tmp_path, minimal() | {"sync": "allreduce"})
    assert "sync: must be 'ring', 'parameter_server' or 'bucketed'" in message


def test_missing_file(tmp_path):
    with pytest.raises(ClusterError) as info:
        load_cluster(tmp_path / "nope.yaml")
    message = str(info.value)
    assert "nope.yaml" in message and "no such file" in message and "\n" not in message
    with pytest.raises(ClusterError, match="no such file"):
        load_cluster(str(tmp_path / "nope.yaml"))


def test_unknown_preset():
    with pytest.raises(ClusterError) as info:
        load_cluster("tpu-pod")
    message = str(info.value)
    assert "'tpu-pod'" in message and "\n" not in message
    for name in preset_names():
        assert name in message
    assert "path" in message and "YAML" in message


def test_valid_custom_file(tmp_path):
    cluster = load_cluster(write(tmp_path, minimal()))
    assert cluster.num_devices == 8
    assert cluster.sync == "ring" and cluster.compute_efficiency == 0.5
    assert cluster.links.inter_node.bandwidth == 12.5e9


def test_an_all_reduce_runs_at_the_measured_ring_figures_where_the_link_has_them():
    plain = Link(bandwidth=1e9, latency=1e-5)
    measured = Link(bandwidth=1e9, latency=1e-5, ring_bandwidth=2.5e8, ring_latency=4e-5)
    nbytes, ranks = 10_000_003, 4
    chunk = -(-nbytes // ranks)  # the ring's chunk, rounded up to whole bytes
    assert plain.allreduce_seconds(nbytes, ranks) == 2 * 3 * (1e-5 + chunk / 1e9)
    assert measured.allreduce_seconds(nbytes, ranks) == 2 * 3 * (4e-5 + chunk / 2.5e8)
    assert measured.time(nbytes) == plain.time(nbytes)  # point to point is unchanged
    assert oracle_allreduce(ranks, nbytes, measured) == pytest.approx(
        2 * 3 * (4e-5 + nbytes / (ranks * 2.5e8)))


def test_a_port_shared_by_devices_of_two_nodes_is_refused(tmp_path):
    data = minimal()
    data["links"]["inter_node"]["shared_by"] = 3
    message = load_error(tmp_path, data)
    assert "links.inter_node.shared_by" in message and "divide 4 (got 3)" in message
    data["links"]["inter_node"]["shared_by"] = 4  # one card for the node's four devices
    assert load_cluster(write(tmp_path, data)).links.inter_node.shared_by == 4
    data["links"]["intra_node"]["shared_by"] = 2  # no device groups: each its own NVLink
    message = load_error(tmp_path, data)
    assert "links.intra_node.shared_by: must be 1 (got 2)" in message and "groups" in message


@pytest.mark.parametrize(("field", "value", "expected"), [
    # a denormal bandwidth priced every step as nan and a strategy was still chosen
    (("links", "intra_node", "bandwidth"), 1e-320, "is below the smallest normal number"),
    (("links", "intra_node", "latency"), "1e-320 s", "is below the smallest normal number"),
    (("device", "peak_flops_fp32"), 5e-324, "is below the smallest normal number"),
    # a latency of 1e308 s priced every step as inf
    (("links", "intra_node", "latency"), 1e308, "is above any real latency (10 s)"),
    (("links", "inter_node", "bandwidth"), "1e10 GB/s", "is above any real bandwidth"),
    (("device", "peak_flops_fp32"), 1e300, "is above any real flops"),
    # YAML booleans are not counts: `nodes: true` was one node
    (("nodes",), True, "nodes: input should be a valid integer (got True)"),
    (("devices_per_node",), False, "devices_per_node: input should be a valid integer (got False)"),
])
def test_numbers_that_would_price_nonsense_are_refused(tmp_path, field, value, expected):
    data = minimal()
    target = data
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    assert expected in load_error(tmp_path, data)
