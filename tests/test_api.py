"""The public Python API (`import layerwise`): its docstring example runs as written, and a
training run through it is the same job `layerwise train` runs."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

import layerwise


def test_the_api_docstring_example_runs_as_written() -> None:
    failures, tried = doctest.testmod(layerwise, verbose=False)
    assert tried > 0 and failures == 0


@pytest.mark.slow
def test_train_through_the_api_returns_the_runs_result(tmp_path: Path) -> None:
    result = layerwise.train("tiny_cnn", "data", nproc=2, steps=2, out=tmp_path / "run",
                             image_size=8, batch_per_device=2)
    assert [step.step for step in result.steps] == [1, 2]
    assert result.nproc == 2 and result.strategy.name == "data"
    assert (tmp_path / "run" / "model.pt").is_file()
