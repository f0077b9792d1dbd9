"""A plan chosen layer by layer, proven as users would: in a strategy file, `verify` on 4
processes in float64, then one step of training moving the bytes the cost model prices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

import layerwise
from layerwise.flows.cli import app
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.strategy import LayerChoice
from layerwise.strategies.training_run import RunResult

runner = CliRunner()


def exact_on_4_processes_with_the_predicted_bytes(
        reference: str, chosen: dict[str, ParallelConfig], tmp_path: Path, image_size: int,
        batch_per_device: int, **options: Any) -> RunResult:
    """The plan `chosen` (layer -> config) of model `reference`: verify on 4 processes, float64,
    2 steps, exact; then one step of training (the run in tmp_path/run) moving the bytes the
    cost model prices. `options` are further TrainOptions (dataset, in_channels)."""
    shape = {"image_size": image_size, "batch_per_device": batch_per_device}
    searched = layerwise.search(reference, devices=4, cluster="local", baselines=("data",),
                                in_channels=options.get("in_channels"),
                                **shape).strategies["data"]
    plan = searched.model_copy(update={"name": "chosen", "layers": tuple(
        LayerChoice(name=name, config=config.text) for name, config in chosen.items())})
    plan.save(tmp_path / "chosen.json")
    given = [item for name, value in options.items()
             for item in (f"--{name.replace('_', '-')}", str(value))]
    result = runner.invoke(app, ["verify", reference, "--strategy", str(tmp_path / "chosen.json"),
                                 "--nproc", "4", "--steps", "2", "--image-size", str(image_size),
                                 "--batch-per-device", str(batch_per_device), *given,
                                 "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    [divergence] = json.loads(result.stdout)["divergences"]
    assert divergence["exact"] is True, divergence
    run = layerwise.train(reference, str(tmp_path / "chosen.json"), nproc=4, steps=1,
                          out=tmp_path / "run", **shape, **options)
    assert run.bytes_per_step == run.predicted_bytes_per_step
    return run
