"""A launch's later runs start from the module its first run built, and draw what follows from
the same generator state a fresh build leaves (verify's strategies share one launch)."""

from __future__ import annotations

import torch

from layerwise.strategies.runtime.initial_module import InitialModules, build_seeded
from layerwise.strategies.training_run import TrainSettings


def _settings(model: str, seed: int) -> TrainSettings:
    return TrainSettings(model=model, strategy="data", nproc=2, nnodes=1, cluster="local",
                         profile=None, dataset="synthetic", data_root="data/prepared",
                         batch_per_device=2, image_size=16, classes=10, in_channels=1,
                         lr=0.01, momentum=0.9, weight_decay=0.0, seed=seed, dtype="float64")


def _fresh(settings: TrainSettings) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    module = build_seeded(settings)
    return module.state_dict(), torch.rand(4)  # what the run draws next (dropout masks)


def test_a_later_run_starts_where_a_fresh_build_would() -> None:
    try:
        _check_builds()
    finally:
        torch.set_default_dtype(torch.float32)  # build_seeded sets the run's dtype


def _check_builds() -> None:
    modules = InitialModules()
    first = modules.build(_settings("lenet5", 3))
    first_draw = torch.rand(4)
    with torch.no_grad():
        for parameter in first.parameters():  # the first run trains its module
            parameter.add_(1.0)
    for settings in (_settings("lenet5", 3), _settings("lenet5", 4), _settings("tiny_cnn", 3)):
        expected_state, expected_draw = _fresh(settings)
        state = modules.build(settings).state_dict()
        draw = torch.rand(4)
        assert state.keys() == expected_state.keys()
        assert all(torch.equal(state[key], expected_state[key]) for key in state)
        assert torch.equal(draw, expected_draw)
        if settings == _settings("lenet5", 3):
            assert torch.equal(draw, first_draw)
