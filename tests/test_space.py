"""Configuration space: counts, every enumeration constraint, and the compact text form."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.space import (
    DIMS,
    ParallelConfig,
    as_view,
    check_config,
    count_configs,
    enumerate_configs,
    format_devices,
    parallel_dims,
    parse_devices,
    tile_range,
)


@pytest.fixture(scope="module")
def vgg_graph():
    return build_graph("vgg16", batch=512)


@pytest.fixture(scope="module")
def tiny_graph():
    return build_graph("tiny_cnn", batch=8, image_size=8)


def test_table_1_dimensions(vgg_graph):
    dims = {layer.kind: parallel_dims(layer) for layer in vgg_graph.layers}
    assert dims["conv"] == ("n", "c", "h", "w")
    assert dims["pool"] == ("n", "c", "h", "w")
    assert dims["linear"] == ("n", "c")
    assert dims["flatten"] == ("n",)


def test_vgg16_counts_on_16_devices(vgg_graph):
    conv = vgg_graph.by_name["features_0"]
    # degree tuples with 2^s devices, s = 0..4, number C(s+3, 3), each on 16 / 2^s blocks
    assert count_configs(conv, 16) == sum(
        (16 // 2**s) * (s + 3) * (s + 2) * (s + 1) // 6 for s in range(5)
    ) == 163
    fc = vgg_graph.by_name["classifier_0"]
    assert count_configs(fc, 16) == sum((16 // 2**s) * (s + 1) for s in range(5)) == 57
    small = vgg_graph.by_name["features_30"]  # 7x7 output: h and w degrees stop at 4
    # lost along h (and likewise w): h8 alone on 2 blocks, h8 with one other 2 (3 tuples, 1
    # block each), h16 on 1 block
    assert count_configs(small, 16) == 163 - 2 * (2 + 3 + 1)


def _is_power_of_two(value: int) -> bool:
    return value & (value - 1) == 0


@pytest.mark.parametrize("devices", [1, 2, 3, 4, 6, 8, 16])
def test_enumeration_obeys_every_constraint_and_misses_nothing(tiny_graph, devices):
    for layer in tiny_graph.layers:
        configs = enumerate_configs(layer, devices)
        assert len(configs) == count_configs(layer, devices) == len(set(configs))
        sizes = dict(zip(DIMS, as_view(layer.output_shape), strict=True))
        for config in configs:
            assert config.size <= devices
            for dim, degree in zip(DIMS, config.degrees, strict=True):
                assert _is_power_of_two(degree)
                assert degree <= sizes[dim]
                if dim not in parallel_dims(layer):
                    assert degree == 1
            start = config.devices[0]
            assert start % config.size == 0
            assert config.devices == tuple(range(start, start + config.size))
            check_config(layer, config, devices)
        # brute force: every power-of-two tuple and every aligned block, filtered by the rules
        expected = set()
        powers = [2**k for k in range(5)]
        for degrees in itertools.product(powers, repeat=len(DIMS)):
            size = math.prod(degrees)
            legal = size <= devices and all(
                d <= sizes[dim] and (d == 1 or dim in parallel_dims(layer))
                for dim, d in zip(DIMS, degrees, strict=True)
            )
            if legal:
                for start in range(0, devices - size + 1, size):
                    expected.add((degrees, tuple(range(start, start + size))))
        assert {(c.degrees, c.devices) for c in configs} == expected


def test_layers_may_use_fewer_devices_at_any_aligned_offset(vgg_graph):
    conv = vgg_graph.by_name["features_2"]
    blocks = {c.devices for c in enumerate_configs(conv, 16) if c.degrees == (4, 1, 1, 1, 1)}
    assert blocks == {(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)}


@given(
    degrees=st.tuples(*(st.sampled_from([1, 2, 4, 8]) for _ in range(len(DIMS)))),
    data=st.data(),
)
def test_text_form_round_trips(degrees, data):
    size = math.prod(degrees)
    devices = data.draw(st.permutations(range(size + data.draw(st.integers(0, 8)))))[:size]
    config = ParallelConfig(**dict(zip(DIMS, degrees, strict=True)), devices=tuple(devices))
    parsed = ParallelConfig.parse(config.text)
    assert parsed == config and hash(parsed) == hash(config)


def test_text_form_examples():
    config = ParallelConfig.parse("n4c1h2w1@0-7")
    assert config.degrees == (4, 1, 1, 2, 1) and config.devices == tuple(range(8))
    assert str(config) == "n4c1h2w1@0-7"
    deep = ParallelConfig.parse("n1c1d2h2w1@0-3")
    assert deep.degrees == (1, 1, 2, 2, 1) and deep.text == "n1c1d2h2w1@0-3"
    assert ParallelConfig.parse("n2c1l4@0-7").degrees == (2, 1, 1, 1, 4)
    assert ParallelConfig.parse("n1c2h1w1@3,6").devices == (3, 6)
    assert format_devices((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    assert parse_devices("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    tiles = list(ParallelConfig.parse("n2c1h2w1@4-7").tiles())
    assert tiles[1] == ((0, 0, 0, 1, 0), 5) and tiles[2] == ((1, 0, 0, 0, 0), 6)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("n4c1h2@0-7", "expected e.g."),
        ("n2c1h1w1@0-2", "2 tiles need 2 devices, got 3"),
        ("n2c1h1w1@1,1", "a device holds two tiles"),
        ("n0c1h1w1@0", "greater than or equal to 1"),
        ("n2c1h1w1@3-2", "descending"),
        ("n2c1h1w1@0,,1", "empty device entry"),
    ],
)
def test_malformed_text_is_one_clear_line(text, reason):
    with pytest.raises(ConfigError, match=reason) as error:
        ParallelConfig.parse(text)
    assert "\n" not in str(error.value)


def test_check_config_rejects_what_a_layer_cannot_take(vgg_graph):
    fc = vgg_graph.by_name["classifier_0"]
    with pytest.raises(ConfigError, match="cannot be split along h"):
        check_config(fc, ParallelConfig.parse("n1c1h2w1@0-1"), 16)
    small = vgg_graph.by_name["features_30"]
    with pytest.raises(ConfigError, match="degree 8 along w exceeds its size 7"):
        check_config(small, ParallelConfig.parse("n1c1h1w8@0-7"), 16)
    with pytest.raises(ConfigError, match="uses device 17 but only 16 devices"):
        check_config(fc, ParallelConfig.parse("n2c1h1w1@16-17"), 16)
    with pytest.raises(ConfigError, match="devices must be >= 1"):
        count_configs(fc, 0)


@given(size=st.integers(1, 300), degree=st.integers(1, 64))
def test_tiles_cover_a_dimension_exactly_once(size, degree):
    ranges = [tile_range(size, degree, i) for i in range(degree)]
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(degree - 1))
    lengths = [stop - start for start, stop in ranges]
    assert max(lengths) - min(lengths) <= 1


@given(groups=st.integers(1, 64), per_group=st.integers(1, 16), power=st.integers(0, 6))
def test_a_channel_split_whose_degree_divides_the_groups_keeps_them_whole(groups, per_group,
                                                                          power):
    """GroupNorm's channel degree divides its group count (graph.py): then every tile of
    C = groups * per_group channels starts and ends on a group boundary."""
    degree = 2 ** power
    assume(groups % degree == 0)
    channels = groups * per_group
    for index in range(degree):
        start, stop = tile_range(channels, degree, index)
        assert start % per_group == 0 and stop % per_group == 0
        assert (stop - start) // per_group == groups // degree
