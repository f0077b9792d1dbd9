"""`layerwise verify` end to end: real torchrun processes in float64 against the plain module.

Every strategy (`--strategy all`) of a zoo model in one launch per process count. Those exact
by design must match one device within 1e-10 (they reach 1e-16..1e-11); those inexact by design
(local updates, OWT's variable batch, a BatchNorm pipeline) must show a divergence far above it,
which is what makes the 1e-10 verdict able to fail.

The suite runs one model of each structure (`make test`): plain convs, a wide classifier, and
AlexNet's, ResNet-18's and Inception-v3's kinds of layer (dropout, overlapping pools, a strided
stem; residual blocks with BatchNorm and a strided shortcut; concatenated branches, factorized
and nested) in narrow models of their shape (tests/idiom_models.py). Every zoo model at 2 and 4
processes is the `zoo` mark (`make verify-zoo`): VGG-16's 138M float64 weights alone take
minutes on two cores, AlexNet's 58M, ResNet-18's 11M and Inception-v3's 94 BatchNorms most of
one.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.strategies.exactness.reference import EXACT_TOLERANCE
from layerwise.strategies.model.zoo import ZOO
from layerwise.strategies.schedules import INEXACT
from layerwise.strategies.training_run import RunResult

pytestmark = pytest.mark.slow

runner = CliRunner()

# input size per model: small, yet large enough that BatchNorm normalises over more than a
# handful of values (a 1x1 map over 8 samples is as ill-conditioned as float64 rounding allows)
IMAGE_SIZE = {"tiny_cnn": 8, "lenet5": 16, "wide_fc": 8, "cosmoflow2d": 16, "alexnet": 21,
              "vgg16": 32, "resnet18": 32, "resnet50": 32, "resnet101": 32, "resnet152": 32,
              "inception_v3": 20, "cosmoflow3d": 8, "unet3d": 8, "unet3d_seg": 8, "m5": 1024}
DATASET = {"unet3d_seg": "segments"}  # a label per voxel; the others: synthetic
SMALL = ("tiny_cnn", "lenet5", "wide_fc")  # three steps, so momentum and decay act twice
# One step for the deep BatchNorm networks: over a second step at these sizes float64 rounding
# grows through their 50-150 BatchNorms to within 2-10x of the tolerance (ResNet-50 `data`:
# 8.6e-11, Inception-v3 `spatial_w`: 4.2e-11), the networks' conditioning, not the strategies';
# after one step it stays at 1e-11 and below. Momentum's second step is the small models' part.
DEEP = ("resnet50", "resnet101", "resnet152", "inception_v3")
# One step for AlexNet (its float64 FC weights make each step seconds per strategy) and for
# ResNet-18 on 4 processes (its 2-process case takes the second step): what a second step
# adds, momentum and weight decay acting on every weight, is the small models' part.
ONE_STEP = {("alexnet", 2), ("alexnet", 4), ("resnet18", 4)}
# The wide classifier at 2 processes; channel-split classifiers at 4 in lenet5 and the narrow
# AlexNet, a residual BatchNorm block at 4 in tiny_cnn (cosmoflow2d's leaky ReLUs and average
# pools: tests.idiom_models:Activations in tests/test_idioms.py).
IN_THE_SUITE = {(model, nproc) for model in ("tiny_cnn", "lenet5") for nproc in (2, 4)} | {
    ("wide_fc", 2)}
# the shapes of AlexNet (at its stride-4 stem's smallest input), ResNet-18 and Inception-v3,
# narrow: input size and process counts
NARROW = {"tests.idiom_models:narrow_alexnet": (63, (2, 4)),
          "tests.idiom_models:NarrowResNet": (32, (2,)),
          "tests.idiom_models:NarrowInception": (12, (2,))}
CASES = [
    *(pytest.param(model, nproc, marks=() if (model, nproc) in IN_THE_SUITE else pytest.mark.zoo,
                   id=f"{model}-{nproc}")
      for model in ZOO for nproc in (2, 4)),
    *(pytest.param(model, nproc, id=f"{model.rpartition(':')[2]}-{nproc}")
      for model, (_, processes) in NARROW.items() for nproc in processes),
]


def test_the_grid_covers_every_zoo_model() -> None:
    assert set(IMAGE_SIZE) == set(ZOO)


@pytest.mark.parametrize(("model", "nproc"), CASES)
def test_every_exact_strategy_matches_one_device(tmp_path, model: str, nproc: int) -> None:
    steps = 3 if model in SMALL else 1 if model in DEEP or (model, nproc) in ONE_STEP else 2
    size = NARROW[model][0] if model in NARROW else IMAGE_SIZE[model]
    result = runner.invoke(app, ["verify", model, "--strategy", "all", "--nproc", str(nproc),
                                 "--image-size", str(size), "--steps", str(steps),
                                 "--dataset", DATASET.get(model, "synthetic"),
                                 "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    checked = {d["strategy"]: d for d in report["divergences"]}
    skipped = {s["strategy"] for s in report["skipped"]}
    assert "data" in checked and "layerwise" in checked and "owt" in checked
    for name, divergence in checked.items():
        largest = max(divergence["max_loss_difference"], divergence["max_parameter_difference"])
        if name in INEXACT or divergence["exact"] is None:
            assert divergence["exact"] is None and largest > 1e3 * EXACT_TOLERANCE, divergence
        else:
            assert divergence["exact"] is True and largest <= EXACT_TOLERANCE, divergence
    assert set(checked) | skipped >= {"data", "model", "owt", "pipeline", "local"}
    assert not list((tmp_path / "v").rglob("*.pt"))  # no weights, no reference left behind
    exact = [max(d["max_loss_difference"], d["max_parameter_difference"])
             for d in checked.values() if d["exact"]]
    print(f"{model} on {nproc} processes, {steps} step(s): every exact strategy within "
          f"{max(exact):.1e} of one device")  # make verify-zoo shows it (-rP)


def test_a_global_batch_below_the_processes_is_exact(tmp_path) -> None:
    """Two samples on four processes: the strategies that split one sample's rows, columns or
    channels train it exactly as one device does; OWT's fixed-batch schemes, which give every
    worker B/K samples, are refused with that reason."""
    result = runner.invoke(app, ["verify", "tiny_cnn", "--strategy",
                                 "layerwise,spatial_h,spatial_w,model,data", "--nproc", "4",
                                 "--batch", "2", "--image-size", "16", "--steps", "2",
                                 "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    checked = {d["strategy"]: d for d in report["divergences"]}
    for name in ("layerwise", "spatial_h", "spatial_w", "model", "data"):
        assert checked[name]["exact"] is True, checked[name]
    # the runs record the global batch asked for and move the halo bytes predicted (float64:
    # twice the float32 elements' bytes the prediction counts)
    run = RunResult.load(tmp_path / "v" / "spatial_h" / "result.json")
    assert run.global_batch == run.settings.batch == 2 and run.settings.batch_per_device is None
    assert run.bytes_per_step.transfer == 2 * run.predicted_bytes_per_step.transfer > 0
    owt = runner.invoke(app, ["verify", "tiny_cnn", "--strategy", "owt_a", "--nproc", "4",
                              "--batch", "2", "--out", str(tmp_path / "owt")])
    assert owt.exit_code == 2
    assert "a global batch of 2 does not split over 4 workers" in owt.stderr


def test_bad_input_is_one_line(tmp_path) -> None:
    result = runner.invoke(app, ["verify", "lenet5", "--strategy", "warp", "--nproc", "2",
                                 "--out", str(tmp_path / "v")])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--strategy warp: not a strategy name" in lines[0], lines
    assert not (tmp_path / "v").exists()
