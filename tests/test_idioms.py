"""Models written the way users write them (tests/idiom_models.py): padding="same" and
"valid", reflect/replicate/circular padding, x.view(x.size(0), -1), the mean over h and w,
GroupNorm, LayerNorm. Each traces with its own parameter count and the dims its ops allow; all of
them in one network train equal to one process in float64 on 2 and 4 processes under every strategy
that applies (one torchrun launch per process count). A strategy file is priced afresh before
launch. The refusals (shared weights, an even kernel with padding="same", strategy files that do not
fit the run) are rows of tests/test_bad_input.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from strategies.graph import build_graph
from strategies.jobs.costing import cost_model
from strategies.jobs.job import new_job
from strategies.jobs.options import TrainOptions
from strategies.models import build_model
from strategies.schedules import INEXACT
from strategies.schedules.pipeline.planner import optimal_pipeline, plan_strategy
from strategies.strategy import Strategy
from strategies.verify import EXACT_TOLERANCE

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent

# model class in tests/idiom_models.py -> the dims each of its layers may split, graph order
DIMS = {
    "SamePadding": ["nchw", "nchw", "nchw", "nchw", "n", "nc"],
    "ViewFlatten": ["nchw", "nchw", "n", "nc"],
    "ReshapeFlatten": ["nchw", "nchw", "n", "nc"],
    "MeanPool": ["nchw", "nchw", "nchw", "nc", "n", "nc", "nc"],
    "GroupNormNet": ["nchw", "n", "n", "nchw", "n", "nc"],
    "LayerNormNet": ["nchw", "n", "n", "n", "nc"],
    "PaddingModes": ["nchw", "nc", "nc", "nc", "nc", "nc"],
}


@pytest.mark.parametrize("name", sorted(DIMS))
def test_each_idiom_traces_with_its_own_parameters(name: str) -> None:
    model = f"tests.idiom_models:{name}"
    result = runner.invoke(app, ["graph", model, "--image-size", "8", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    plain = build_model(model, image_size=8)
    assert document["param_count"] == sum(p.numel() for p in plain.parameters())
    assert [layer["parallel_dims"] for layer in document["layers"]] == DIMS[name]


def test_graph_says_which_layers_are_held_whole_and_why() -> None:
    result = runner.invoke(app, ["graph", "tests.idiom_models:Idioms", "--image-size", "8"])
    assert result.exit_code == 0, result.output
    held = [line for line in result.stdout.replace("\n", " ").split("held: ")[1:]]
    assert len(held) == 7
    assert "layer 'same' (Conv2d+GroupNorm+relu) splits only along n: GroupNorm(2)" in held[0]
    assert "splits only along n, c: circular padding" in " ".join(held)


def test_train_says_which_layers_are_held_before_it_starts(tmp_path) -> None:
    options = TrainOptions.given(nproc=2, image_size=8, batch_per_device=4)
    with new_job("tests.idiom_models:GroupNormNet", "spatial_h", options, tmp_path / "run",
                 analytic=True) as job:
        assert [line.split(":")[0] for line in job.warnings] == ["held", "held"]
        assert job.strategy.assignment()["conv1"].text == "n2c1h1w1@0-1"


@pytest.fixture()
def workers_import_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun workers import the test models by reference, from this checkout."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_every_idiom_trains_equal_to_one_process(tmp_path, workers_import_tests,
                                                  nproc: int) -> None:
    result = runner.invoke(app, ["verify", "tests.idiom_models:Idioms", "--strategy", "all",
                                 "--nproc", str(nproc), "--image-size", "8", "--steps", "2",
                                 "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    checked = {d["strategy"]: d for d in report["divergences"]}
    assert {"data", "model", "spatial_h", "spatial_w", "layerwise", "pipeline"} <= set(checked)
    for name, divergence in checked.items():
        largest = max(divergence["max_loss_difference"], divergence["max_parameter_difference"])
        if name in INEXACT:
            assert largest > 1e3 * EXACT_TOLERANCE, divergence
        else:
            assert divergence["exact"] is True and largest <= EXACT_TOLERANCE, divergence


def test_a_pipeline_file_is_priced_for_the_run_not_as_saved(tmp_path) -> None:
    graph = build_graph("tiny_cnn", batch=16, image_size=8)
    cost = cost_model(graph, "local", 2, None, True)
    planned = plan_strategy(optimal_pipeline(cost, stages=2, micro_batches=2), graph)
    stale = planned.model_copy(update={"predicted": planned.predicted.model_copy(
        update={"transfer_bytes": 1, "sync_bytes": 7, "step_seconds": 9.0})})
    stale.save(tmp_path / "stale.json")
    options = TrainOptions.given(nproc=2, image_size=8, batch_per_device=8)
    with new_job("tiny_cnn", str(tmp_path / "stale.json"), options, tmp_path / "run",
                 analytic=True) as job:
        assert job.strategy.predicted == planned.predicted
        assert job.strategy.execution == planned.execution
    # a larger batch moves more across the cut: the file's bytes are of its own batch
    options = TrainOptions.given(nproc=2, image_size=8, batch_per_device=16)
    with new_job("tiny_cnn", str(tmp_path / "stale.json"), options, tmp_path / "run32",
                 analytic=True) as job:
        assert job.strategy.predicted.transfer_bytes == 2 * planned.predicted.transfer_bytes
        assert Strategy.model_validate(job.strategy.model_dump()) == job.strategy


@pytest.mark.slow
def test_owt_schemes_hand_off_a_view_flatten(tmp_path, workers_import_tests) -> None:
    """OWT's engine replays the conv part node by node, x.size(0) included (Idioms has two
    flattens, which OWT does not take)."""
    result = runner.invoke(app, ["verify", "tests.idiom_models:ViewFlatten", "--strategy",
                                 "owt_a,owt_b,owt_c", "--nproc", "2", "--image-size", "8",
                                 "--steps", "2", "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    divergences = json.loads(result.stdout)["divergences"]
    assert [d["strategy"] for d in divergences] == ["owt_a", "owt_b", "owt_c"]
    assert all(d["exact"] is True for d in divergences), divergences
