"""The workload of configs/volumes.yaml: high-resolution fields at one sample for two devices,
where data parallelism does not fit the declared memory and the searched plan does, by
splitting each field's height or width; predicted by the memory model and measured when
trained."""

from __future__ import annotations

from pathlib import Path

import pytest

import layerwise
from layerwise.flows.benchmark_config import load_config
from layerwise.strategies.model.space import ParallelConfig

VOLUMES = Path(__file__).resolve().parents[1] / "configs" / "volumes.yaml"


@pytest.fixture(scope="module")
def volumes():
    config = load_config(VOLUMES)
    model = config.models[0].name
    shape = {"image_size": config.image_size, "classes": config.classes, "in_channels": 1,
             "batch": config.global_batch}
    plan = layerwise.search(model, devices=config.nproc, cluster="local", baselines=("data",),
                            memory_limit=config.memory_limit, **shape)
    return config, model, shape, plan


def test_data_parallelism_does_not_fit_and_the_searched_plan_splits_the_field(volumes):
    config, _, _, plan = volumes
    assert config.global_batch < config.nproc  # below a sample per device
    data, searched = plan.strategies["data"], plan.strategies["layerwise"]
    assert plan.memory_budget == config.memory_limit
    assert plan.fits(data) is False and plan.fits(searched) is True
    splits = [ParallelConfig.parse(choice.config)
              for choice in plan.strategies["layerwise"].layers]
    assert any(split.h > 1 or split.w > 1 for split in splits)
    assert all(split.n == 1 for split in splits)  # one sample: nothing to split over samples


@pytest.mark.slow
def test_the_searched_plan_trains_within_the_declared_memory_and_data_does_not(volumes,
                                                                              tmp_path):
    """Both trained 2 steps on 2 processes at the config's size (synthetic fields of the same
    shape): every rank of the searched plan measures within the limit, data parallelism's
    fullest rank over it, each within 10% of its prediction."""
    config, model, shape, plan = volumes
    for name in ("layerwise", "data"):
        path = tmp_path / f"{name}.json"
        plan.strategies[name].save(path)
        result = layerwise.train(model, str(path), nproc=config.nproc, steps=2,
                                 out=tmp_path / name, dataset="synthetic", **shape)
        measured = max(result.peak_memory_bytes_per_rank)
        predicted = max(plan.peak_memory(plan.strategies[name]) or [0])
        assert abs(measured / predicted - 1) < 0.1, (name, measured, predicted)
        if name == "layerwise":
            assert measured <= config.memory_limit
        else:
            assert measured > config.memory_limit
