"""`layerwise train` end to end: real torchrun processes with gloo on CPU, nothing mocked.

Each run is tiny_cnn at 8x8 on the synthetic data, 2 processes, a few steps: starting torchrun
and importing torch in each process costs seconds, the steps milliseconds.
"""

from __future__ import annotations

import math
import os
import signal
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.strategies.cost.memory import predicted_memory
from layerwise.strategies.cost.profile import SGD_MOMENTUM, SGD_WEIGHT_DECAY
from layerwise.strategies.files.locations import CHECKPOINT_FILE, LOG_FILE
from layerwise.strategies.jobs.failure import failure_line
from layerwise.strategies.jobs.named_strategies import strategy_by_name
from layerwise.strategies.jobs.options import TrainOptions
from layerwise.strategies.jobs.pricing import cost_model
from layerwise.strategies.model.graph import LayerGraph, build_graph
from layerwise.strategies.model.zoo import build_model
from layerwise.strategies.runtime.checkpoint import read_checkpoint
from layerwise.strategies.training_run import RunResult
from tests.cli_errors import one_line_error

pytestmark = pytest.mark.slow

runner = CliRunner()
TINY = ("tiny_cnn", "--nproc", "2", "--image-size", "8", "--batch-per-device", "4")
LAYERWISE = Path(sys.executable).parent / "layerwise"
RUN_LIMIT_SECONDS = 240  # far above a run's ~15 s: reached only if something hangs


def train(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, ["train", *args], env=env)


def strategy_file(path: Path, model: str, devices: int, image_size: int = 8) -> Path:
    """Data parallelism saved as a strategy file, as `layerwise search --save` writes one."""
    graph = build_graph(model, batch=4 * devices, image_size=image_size, num_classes=10)
    strategy_by_name("data", cost_model(graph, "local", devices, None, True)).save(path)
    return path


def test_the_profile_times_the_update_that_train_runs_by_default():
    """The cost model's t_c holds the SGD update the profile timed: the one a run takes."""
    defaults = TrainOptions()
    assert (defaults.momentum, defaults.weight_decay) == (SGD_MOMENTUM, SGD_WEIGHT_DECAY)


def test_train_measures_the_bytes_the_cost_model_predicts(tmp_path):
    out = tmp_path / "run"
    result = train(*TINY, "--strategy", "data", "--steps", "4", "--out", str(out))
    assert result.exit_code == 0, result.output
    run = RunResult.load(out / "result.json")
    assert [step.step for step in run.steps] == [1, 2, 3, 4]
    assert run.nproc == 2 and run.global_batch == 8 and run.strategy.name == "data"
    assert run.bytes_per_step == run.predicted_bytes_per_step  # exact, transfer and sync
    assert run.bytes_per_step.sync > 0
    assert sum(layer.get("sync", 0) for layer in run.bytes_per_step_by_layer.values()) == (
        run.bytes_per_step.sync)
    # the all-reduces' waits are clocked; data parallelism moves no activation, so none waits
    waited = run.wait_seconds_per_step
    assert waited is not None and waited.sync > 0 and waited.transfer == 0
    assert len(run.peak_memory_bytes_per_rank) == 2 and min(run.peak_memory_bytes_per_rank) > 0
    assert run.throughput_samples_per_s == pytest.approx(8 / run.step_seconds_median)
    module = build_model("tiny_cnn", num_classes=10, image_size=8)
    module.load_state_dict(torch.load(out / "model.pt", weights_only=True), strict=True)
    assert "sync bytes" in result.stdout and str(out / "model.pt") in result.stdout


def flip_a_bit_in_the_largest_tensor(checkpoint: Path) -> None:
    """What a damaged disk or copy does: one bit of tensor data changes, the file still loads
    (torch.load checks no zip CRC)."""
    with zipfile.ZipFile(checkpoint) as archive:
        largest = max((info for info in archive.infolist() if "/data/" in info.filename),
                      key=lambda info: info.file_size)
    with open(checkpoint, "r+b") as stream:
        stream.seek(largest.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", stream.read(4))
        where = largest.header_offset + 30 + name_length + extra_length + largest.file_size // 2
        stream.seek(where)
        byte = stream.read(1)[0]
        stream.seek(where)
        stream.write(bytes([byte ^ 0x10]))
    assert torch.load(checkpoint, weights_only=True)["step"] == 4  # loads as if sound


def test_the_peak_memory_per_rank_counts_the_tensors_of_its_shard(tmp_path):
    """wide_fc's 8.4M weights split over 2 ranks by channel (`model`): during the measured
    second step each rank holds half the weights, their gradients and momentum, so its peak
    is above 3 half-shards and below 3 whole copies (which the process's resident set, with
    the interpreter and torch in it, would exceed many times over), and within 10% of what
    the memory model predicts for it."""
    out = tmp_path / "run"
    result = train("wide_fc", "--nproc", "2", "--image-size", "8", "--batch-per-device", "4",
                   "--strategy", "model", "--steps", "3", "--out", str(out))
    assert result.exit_code == 0, result.output
    run = RunResult.load(out / "result.json")
    weights = sum(parameter.numel() for parameter in
                  build_model("wide_fc", num_classes=10, image_size=8).parameters()) * 4
    graph = LayerGraph.model_validate_json((out / "graph.json").read_text(encoding="utf-8"))
    predicted = predicted_memory(graph, run.strategy.assignment(), 2, 4)
    assert len(run.peak_memory_bytes_per_rank) == 2
    for peak, device in zip(run.peak_memory_bytes_per_rank, predicted, strict=True):
        assert 3 * weights / 2 < peak < 3 * weights, (peak, weights)
        assert abs(peak / device.peak - 1) < 0.1, (peak, device)
    assert [step.memory_measured for step in run.steps] == [False, True, False]
    assert run.step_seconds_median == run.steps[2].seconds  # the profiled step is left out


def test_a_killed_run_resumes_to_the_parameters_of_an_uninterrupted_one(tmp_path):
    """Also: a checkpoint whose tensor data changed is caught by its checksum, and the run
    resumes from the one before it, still bit for bit."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    common = (*TINY, "--strategy", "owt", "--steps", "6", "--checkpoint-every", "2")
    assert train(*common, "--out", str(whole)).exit_code == 0
    crash = train(*common, "--out", str(killed), env={"LAYERWISE_FAULT": "1:4:exit"})
    one_line_error(crash, "rank 1 stopped without an error", code=1)
    assert read_checkpoint(killed / CHECKPOINT_FILE)["step"] == 4
    assert read_checkpoint(killed / f"{CHECKPOINT_FILE}.prev")["step"] == 2
    assert not (killed / "result.json").exists()
    flip_a_bit_in_the_largest_tensor(killed / CHECKPOINT_FILE)

    resumed = train("tiny_cnn", "--resume", str(killed), "--steps", "6", "--json")
    assert resumed.exit_code == 0, resumed.output
    warnings = [line for line in resumed.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "fails its sha256 check" in warnings[0], resumed.stderr
    assert "resuming from checkpoint.pt.prev (step 2)" in warnings[0]
    assert (killed / f"{CHECKPOINT_FILE}.corrupt").is_file()
    continued = RunResult.model_validate_json(resumed.stdout)
    uninterrupted = RunResult.load(whole / "result.json")
    assert continued.resumed_from_step == 2
    assert [s.step for s in continued.steps] == [1, 2, 3, 4, 5, 6]
    assert [s.loss for s in continued.steps] == [s.loss for s in uninterrupted.steps]
    assert uninterrupted.bytes_per_step == uninterrupted.predicted_bytes_per_step
    assert uninterrupted.bytes_per_step.transfer > 0  # OWT moves the FC input between ranks
    final = torch.load(killed / "model.pt", weights_only=True)
    expected = torch.load(whole / "model.pt", weights_only=True)
    assert final.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(final[key], tensor), key

    changed = train("tiny_cnn", "--resume", str(killed), "--steps", "8", "--lr", "0.5")
    one_line_error(changed, "lr")


def test_a_rank_that_raises_ends_the_run_with_one_line_naming_it(tmp_path):
    """Also: a strategy on fewer devices than processes trains (rank 1 holds nothing)."""
    out = tmp_path / "run"
    one_device = strategy_file(tmp_path / "one.json", "tiny_cnn", devices=1)
    command = [str(LAYERWISE), "train", *TINY, "--strategy", str(one_device), "--steps", "5",
               "--timeout", "30", "--out", str(out)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "LAYERWISE_FAULT": "1:2"},
                          start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=RUN_LIMIT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    assert process.returncode == 1, stdout + stderr
    warning, *lines = [line for line in stderr.splitlines() if line.strip()]
    assert warning.startswith("warning: strategy 'data' gives layers to 1 of the 2 processes: "
                              "rank 1 holds none"), stderr
    assert len(lines) == 1, stderr
    assert "rank 1 failed first" in lines[0] and "injected fault after step 2" in lines[0]
    assert "Traceback" not in stdout + stderr


# torchrun's report when rank 1 died silently and torchrun stopped rank 0 before rank 0 saw
# the lost connection (so no rank wrote an error file); the format of ChildFailedError.
TORCHRUN_REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
layerwise.strategies.runtime.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-21_11:35:55
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 13681)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 13681
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_11:35:55
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 13 (pid: 13682)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_a_diverged_loss_stops_the_run_with_one_line_and_keeps_what_it_measured(tmp_path):
    out = tmp_path / "run"
    result = train(*TINY, "--strategy", "data", "--steps", "40", "--lr", "1e4",
                   "--warmup-steps", "0", "--checkpoint-every", "1", "--out", str(out))
    line = one_line_error(result, "training stopped: the loss diverged at step",
                          "--lr 10000 now, try 5000", code=1)
    run = RunResult.load(out / "result.json")  # NaN and inf losses read back
    assert run.diverged_at_step == run.steps[-1].step < 40
    assert f"step {run.diverged_at_step} " in line
    assert not math.isfinite(run.steps[-1].loss) or run.steps[-1].loss > 3 * run.steps[0].loss
    assert not (out / "model.pt").exists()  # no weights of a diverged run
    if run.diverged_at_step > 1:  # the last checkpoint holds the last sound step
        assert read_checkpoint(out / CHECKPOINT_FILE)["step"] == run.diverged_at_step - 1


def test_a_silent_death_is_named_from_torchruns_report_when_no_rank_recorded_one(tmp_path):
    (tmp_path / "errors").mkdir()
    assert "no rank recorded an error" in failure_line(tmp_path, 1, 2)
    (tmp_path / LOG_FILE).write_text("step logs of an earlier launch\n" + TORCHRUN_REPORT)
    line = failure_line(tmp_path, 1, 2)
    assert "rank 1 stopped without an error (exit code 13" in line
    assert str(tmp_path / LOG_FILE) in line


def test_a_strategy_for_another_model_stops_before_anything_starts(tmp_path):
    out = tmp_path / "run"
    other = strategy_file(tmp_path / "lenet.json", "lenet5", devices=2, image_size=16)
    result = train(*TINY, "--strategy", str(other), "--steps", "2", "--out", str(out))
    one_line_error(result, "made for lenet5")
    assert not out.exists()  # no run folder: nothing written, no torchrun started


def test_a_strategy_using_more_devices_than_processes_is_refused(tmp_path):
    out = tmp_path / "run"
    four = strategy_file(tmp_path / "four.json", "tiny_cnn", devices=4)
    result = train(*TINY, "--strategy", str(four), "--steps", "2", "--out", str(out))
    one_line_error(result, "uses device 3")
    assert not out.exists()


def test_launch_mistakes_are_one_line_before_anything_starts(tmp_path):
    out = tmp_path / "run"
    one_line_error(train(*TINY, "--strategy", "data", "--out", str(out),
                         env={"LAYERWISE_FAULT": "rank one"}), "LAYERWISE_FAULT")
    one_line_error(train(*TINY, "--strategy", "fastest", "--out", str(out)), "fastest")
    one_line_error(train(*TINY, "--strategy", "data", "--steps", "2", "--epochs", "1"),
                   "--steps or --epochs")
    assert not out.exists()
    out.mkdir()
    (out / "result.json").write_text("{}")
    one_line_error(train(*TINY, "--strategy", "data", "--out", str(out)), "--resume")
