"""Values that once ran silently wrong: each is now refused with one line and exit code 2 before
anything is written, or handled right. In process (typer's CliRunner on the real app); the
cases that need training processes are in test_train.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.strategies.cost.profile import Profile
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.jobs.job import new_job
from layerwise.strategies.jobs.launch import write_run_folder
from layerwise.strategies.jobs.named_strategies import strategy_by_name
from layerwise.strategies.jobs.options import TrainOptions
from layerwise.strategies.jobs.pricing import cost_model
from layerwise.strategies.learning_rate import learning_rate
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.runtime.datasets import prepared_spec
from layerwise.strategies.runtime.divergence import FACTOR, STEPS, LossWatch
from layerwise.strategies.strategy import Strategy
from layerwise.strategies.training_run import StepRecord

runner = CliRunner()
TINY = ("tiny_cnn", "--nproc", "2", "--image-size", "8", "--batch-per-device", "4")


def _profile_file(path: Path, seconds: float) -> Path:
    """A well-formed profile of tiny_cnn but for one time, as a hand edit could leave it."""
    graph = build_graph("tiny_cnn", batch=8, image_size=8)
    profile = Profile(
        model="tiny_cnn", structure_hash=graph.structure_hash, input_shape=graph.input_shape,
        device_name="cpu", device_type="cpu", torch_version=torch.__version__, batch=8,
        devices=2, threads=1, method="test", warmup=1, repeats=1,
        seconds={"conv1": {"1x1x1x1": 1e-3}}, update_seconds={"conv1": {"1x1x1x1": 0.0}},
        created="2026-01-01T00:00:00")
    document = json.loads(profile.model_dump_json())
    document["seconds"]["conv1"]["1x1x1x1"] = seconds
    path.write_text(json.dumps(document))  # json writes NaN as NaN, as a damaged file holds it
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """The files the command lines below name."""
    root = tmp_path_factory.mktemp("bad-values")
    graph = build_graph("tiny_cnn", batch=8, image_size=8)
    data = strategy_by_name("data", cost_model(graph, "local", 2, None, True))
    document = json.loads(data.model_dump_json())
    document["layers"].append({**document["layers"][0], "config": "n1c1h1w1@0"})
    (root / "twice.json").write_text(json.dumps(document))
    # run folders as the launcher leaves them just before torchrun starts: no checkpoint yet;
    # and one whose only checkpoint is garbage
    for name in ("started", "garbage"):
        with new_job("tiny_cnn", "data", TrainOptions(nproc=2, image_size=8,
                                                      batch_per_device=4),
                     root / name, analytic=True) as job:
            write_run_folder(job)
    (root / "garbage" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    return {"root": str(root), "twice": str(root / "twice.json"),
            "started": str(root / "started"), "garbage": str(root / "garbage"),
            "negative": str(_profile_file(root / "negative.json", -0.99866)),
            "nan": str(_profile_file(root / "nan.json", math.nan))}


REFUSED = [
    (("graph", "tiny_cnn", "--devices", "0"), "--devices must be >= 1 (got 0)"),
    (("graph", "tiny_cnn", "--batch", "0"), "--batch must be >= 1 (got 0)"),
    (("graph", "a:b:c"), "model 'a:b:c'"),  # as written, not with an emoji for :b:
    (("train", *TINY, "--strategy", "data", "--momentum", "5"), "--momentum must be < 1"),
    (("train", *TINY, "--strategy", "data", "--momentum", "1"), "--momentum must be < 1"),
    (("train", *TINY, "--strategy", "data", "--classes", "1"), "--classes must be >= 2"),
    (("train", *TINY, "--strategy", "data", "--lr", "nan"), "--lr must be a finite number"),
    (("train", *TINY, "--strategy", "data", "--lr", "inf"), "--lr must be a finite number"),
    (("train", *TINY, "--strategy", "data", "--lr", "0"), "--lr must be > 0"),
    (("train", *TINY, "--strategy", "data", "--weight-decay", "inf"),
     "--weight-decay must be a finite number"),
    (("train", *TINY, "--strategy", "data", "--warmup-steps", "-1"),
     "--warmup-steps must be >= 0"),
    (("train", *TINY, "--strategy", "data", "--lr-decay", "cosine"), "--lr-decay"),
    # values that passed the checks and failed only inside the workers, leaving a run folder
    (("train", *TINY, "--strategy", "data", "--timeout", "nan"),
     "--timeout must be a finite number > 0 (got nan)"),
    (("train", *TINY, "--strategy", "data", "--timeout", "inf"),
     "--timeout must be a finite number > 0 (got inf)"),
    (("train", *TINY, "--strategy", "data", "--seed", "12345678901234567890123"),
     "--seed must be < 9.22337e+18"),
    (("train", *TINY, "--strategy", "{twice}"), "layer 'x' is listed more than once"),
    (("train", "tiny_cnn", "--resume", "{started}", "--steps", "4"),
     "holds no checkpoint.pt"),
    (("train", "tiny_cnn", "--resume", "{garbage}", "--steps", "4"),
     "not a torch checkpoint"),
    (("search", "tiny_cnn", "--devices", "2", "--cluster", "local", "--image-size", "8",
      "--batch-per-device", "4", "--profile", "{negative}"), "greater than or equal to 0"),
    (("search", "tiny_cnn", "--devices", "2", "--cluster", "local", "--image-size", "8",
      "--batch-per-device", "4", "--profile", "{nan}"), "finite number"),
    (("run", "--set", "momentum=5"), "momentum: Input should be less than 1"),
    (("run", "--set", "lr=.nan"), "lr: Input should be a finite number"),
    (("run", "--set", "classes=1"), "classes: Input should be greater than or equal to 2"),
    # a boolean is not a count; infinities trained and then failed, or overflowed a timer
    (("run", "--set", "steps=true"), "steps: Input should be a valid integer"),
    (("run", "--set", "models.\u00b2.name=x"), "'models.\u00b2': no such field to set"),
    (("run", "--set", f"models.{'1' * 5000}.name=x"), "no such field to set"),
    (("run", "--set", "tolerance=inf"), "tolerance: Input should be a finite number"),
    # a share of the champion's step: 1 would ask a challenger for a step of no time at all
    (("run", "--set", "champion_margin=1"), "champion_margin: Input should be less than 1"),
    (("run", "--set", "champion_margin=yes"), "champion_margin: Input should be a valid number"),
    (("run", "--set", "train_deadline_s=.inf"), "train_deadline_s: Input should be a finite"),
    # finite, yet past what a timer or gloo's C int of milliseconds holds
    (("run", "--set", "train_deadline_s=1e300"),
     "train_deadline_s: Input should be less than or equal to 604800"),
    (("train", *TINY, "--strategy", "data", "--timeout", "1e300"),
     "--timeout must be at most 604800 s"),
]


@pytest.mark.parametrize(("command", "message"), REFUSED,
                         ids=[" ".join(command) for command, _ in REFUSED])
def test_a_bad_value_is_one_line_and_writes_nothing(files, command, message):
    before = sorted(Path(files["root"]).rglob("*"))
    out = Path(files["root"]) / "out"
    arguments = [part.format(**files) for part in command]
    if arguments[0] == "train" and "--resume" not in arguments:
        arguments += ["--out", str(out)]
    result = runner.invoke(app, arguments)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert sorted(Path(files["root"]).rglob("*")) == before  # no run folder, no stray file


def test_the_learning_rate_warms_up_then_decays_with_the_step_alone():
    assert [learning_rate(0.1, 4, "inverse_sqrt", step) for step in (1, 2, 4)] == pytest.approx(
        [0.025, 0.05, 0.1])
    assert learning_rate(0.1, 4, "inverse_sqrt", 16) == pytest.approx(0.05)
    assert learning_rate(0.1, 4, "constant", 1000) == 0.1
    assert learning_rate(0.1, 0, "constant", 1) == 0.1
    assert learning_rate(0.1, 0, "inverse_sqrt", 4) == pytest.approx(0.05)


@pytest.mark.parametrize(("losses", "diverged"), [
    ([2.3, 1.0, math.nan], True),
    ([2.3, math.inf], True),
    ([2.3, *[FACTOR * 2.3 + 1] * STEPS], True),  # stays far above the start
    ([2.3, *[FACTOR * 2.3 + 1] * (STEPS - 1)], False),  # not for long enough yet
    ([2.3, 13.5, 2.3, 0.5], False),  # a spike that training recovers from
    ([2.3, *[0.01] * 50], False),
    ([2.3, *[2.3] * 40, 0.5], False),  # slow to start, then learning
    ([2.3, 1.0, 0.5, 13.5, *[2.3] * STEPS], True),  # learned, then fell back to chance
    ([2.3, 1.0, 0.5, 13.5, *[2.3] * (STEPS - 2), 1.5], False),  # and is climbing out again
])
def test_a_loss_has_diverged_when_it_is_not_finite_or_stays_far_above_its_start(losses,
                                                                                   diverged):
    watch = LossWatch(losses[:-1])  # as a resumed run takes its steps so far
    assert (watch.add(losses[-1]) is not None) is diverged


def test_a_diverged_loss_survives_the_result_files_round_trip():
    records = (StepRecord(step=1, loss=2.3, seconds=0.1), StepRecord(step=2, loss=math.nan,
                                                                     seconds=0.1),
               StepRecord(step=3, loss=math.inf, seconds=0.1))
    for record in records:
        again = StepRecord.model_validate_json(record.model_dump_json())
        assert again.loss == record.loss or math.isnan(again.loss) and math.isnan(record.loss)


def test_a_strategy_file_listing_a_layer_twice_is_refused(files):
    with pytest.raises(LayerwiseError, match="layers: layer 'x' is listed more than once"):
        Strategy.load(files["twice"])


def test_a_prepared_dataset_of_one_class_is_refused(tmp_path):
    (tmp_path / "mono").mkdir()
    (tmp_path / "mono" / "meta.json").write_text(json.dumps(
        {"image_size": 8, "classes": 1, "channels": 1}))
    with pytest.raises(LayerwiseError, match="has 1 class"):
        prepared_spec("mono", tmp_path)
