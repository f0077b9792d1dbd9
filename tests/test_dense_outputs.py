"""Networks that score every position (a U-Net's head without a pooled classifier) train on a
label per position: the mean cross-entropy over every (sample, position), as F.cross_entropy
takes dense scores, over output tiles split along any dim, class-split scores included.

Proven as the rest is: equal to one process in float64, with the bytes the cost model prices; on
the generated `segments` dataset (a label per position, any dims) and on a prepared folder whose
meta.json says its labels are per position. The validation counts positions, and the fp32
accuracy check's binomial bound is taken over images. The refusals (a dense network on a dataset
labelled per sample, the reverse, scores at another resolution) are rows of
tests/test_bad_input.py; the engines that cannot train it (local) say so in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from layerwise.flows.benchmark_config import load_config
from layerwise.flows.cli import app
from layerwise.flows.cli.run import check_before_start
from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.exactness.accuracy import binomial_tolerance_images, check_accuracy
from layerwise.strategies.jobs.job import new_job
from layerwise.strategies.jobs.options import TrainOptions
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.model.space import enumerate_configs
from layerwise.strategies.runtime.datasets import labels_positions, load_dataset
from layerwise.tasks.validate import validation_counts
from tests.chosen_plans import exact_on_4_processes_with_the_predicted_bytes
from tests.idiom_models import SizedDecoder

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_segments_are_the_same_samples_everywhere_with_a_label_per_position():
    """Generated from (seed, split, index): the same batch in every process, boxes of the
    object classes over a background, values whose class a neighbourhood tells."""
    data = load_dataset("segments", (8, 12), 4, 2, seed=3)
    x, y = data.train.take(np.array([5, 0, 5]))
    assert x.shape == (3, 2, 8, 12) and x.dtype == np.float32
    assert y.shape == (3, 8, 12) and y.dtype == np.int64
    assert np.array_equal(x[0], x[2]) and np.array_equal(y[0], y[2])
    again_x, again_y = load_dataset("segments", (8, 12), 4, 2, seed=3).train.take(np.array([5]))
    assert np.array_equal(again_x[0], x[0]) and np.array_equal(again_y[0], y[0])
    labels = data.val.take(np.arange(64))[1]
    assert set(np.unique(labels)) == {0, 1, 2, 3}  # the background and every object class
    # the class means stand apart from the noise: averaging a class's positions finds them
    means = [x[:, :, y[0] == label].mean() for label in np.unique(y[0])]
    assert len(set(np.round(means, 1))) == len(means)
    assert labels_positions("segments") and not labels_positions("synthetic")
    assert load_dataset("segments", (16,), 3, 1, seed=0).val.take(np.arange(2))[1].shape == (2, 16)


def test_a_prepared_folder_labelled_per_position_loads_and_a_wrong_label_shape_is_one_line(
        tmp_path):
    """A user's own segmentation data: x (N, C, *spatial) and y (N, *spatial) in train.npz and
    val.npz, with meta.json's `"targets": "positions"`."""
    folder = tmp_path / "masks"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps(
        {"image_size": [4, 6], "classes": 3, "channels": 1, "targets": "positions"}))
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        np.savez(folder / f"{split}.npz", x=rng.standard_normal((5, 1, 4, 6)),
                 y=rng.integers(0, 3, (5, 4, 6)))
    data = load_dataset("masks", (4, 6), 3, 1, seed=0, root=tmp_path)
    assert data.spec.per_position and labels_positions("masks", tmp_path)
    assert data.train.take(np.array([1]))[1].shape == (1, 4, 6)
    np.savez(folder / "val.npz", x=rng.standard_normal((5, 1, 4, 6)), y=rng.integers(0, 3, 5))
    with pytest.raises(LayerwiseError, match=r"labels \(5,\), not \(N, 1, 4, 6\) and "
                                             r"\(N, 4, 6\) as meta.json says"):
        load_dataset("masks", (4, 6), 3, 1, seed=0, root=tmp_path)
    (folder / "meta.json").write_text(json.dumps(
        {"image_size": [4, 6], "classes": 3, "channels": 1, "targets": "pixels"}))
    with pytest.raises(LayerwiseError, match="says targets 'pixels': write \"samples\""):
        load_dataset("masks", (4, 6), 3, 1, seed=0, root=tmp_path)


def test_a_monai_style_unet_scoring_every_pixel_is_exact_split_over_classes_and_height(
        tmp_path, workers_import_tests):
    """Every layer split 4 ways over h and w where it can, the scores over classes and height:
    each tile's loss reads its own positions' labels, the class-split scores reduce their
    log-sum-exp over the group per position; float64 equal to one process, the bytes priced,
    and the trained model's validation counted per position."""
    reference = "tests.idiom_models:monai_unet_scores"
    graph = build_graph(reference, batch=4, image_size=16, in_channels=1)
    output = graph.outputs[0]

    def chosen(layer):
        configs = enumerate_configs(layer, 4)
        if layer.name == output:
            return next(c for c in configs if (c.n, c.c, c.h, c.w) == (1, 2, 2, 1))
        return next((c for c in configs if c.n == 1 and c.c == 1 and c.h * c.w == 4),
                    configs[0])

    exact_on_4_processes_with_the_predicted_bytes(
        reference, {layer.name: chosen(layer) for layer in graph.layers}, tmp_path,
        image_size=16, batch_per_device=1, dataset="segments", in_channels=1)
    correct, predictions, per_sample = validation_counts(tmp_path / "run")
    assert (predictions, per_sample) == (256 * 16 * 16, 16 * 16)
    assert 0 < correct < predictions


def test_a_3d_unet_scoring_every_voxel_trains_equal_to_one_process_under_every_engine(
        tmp_path):
    """unet3d_seg on 2 processes, float64: data parallelism, the search's plan, depth-height-
    width splits, class-split scores (model) and the pipeline all match one process; local
    parallelism, whose blocks train through pooled heads, is skipped with its reason."""
    result = runner.invoke(app, ["verify", "unet3d_seg", "--strategy", "all", "--nproc", "2",
                                 "--input-shape", "1,8,8,8", "--batch", "2", "--steps", "2",
                                 "--dataset", "segments", "--out", str(tmp_path / "v"),
                                 "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    verdicts = {d["strategy"]: d["exact"] for d in report["divergences"]}
    assert {"data", "layerwise", "spatial", "model", "pipeline"} <= verdicts.keys()
    assert all(verdicts.values()), report["divergences"]
    assert "local parallelism trains each block through a pooled classifier head" in json.dumps(
        report)


def test_the_accuracy_bound_of_positions_is_taken_over_images():
    """Positions of one image are right or wrong together: the bound is the images' binomial
    bound, in positions; a share tolerance stays a share of the predictions."""
    per_image = binomial_tolerance_images(100, 80)
    assert binomial_tolerance_images(100 * 64, 80 * 64, per_sample=64) >= per_image * 64 - 64
    check = check_accuracy(80 * 64 + 10, 80 * 64, 100 * 64, None, per_sample=64)
    assert check.passed and check.unit == "position(s)" and "100 images" in check.rule
    assert not check_accuracy(40 * 64, 80 * 64, 100 * 64, None, per_sample=64).passed
    assert check_accuracy(0, 0, 6400, 0.5, per_sample=64).tolerance_images == 3200


def test_the_segmentation_config_trains_a_voxel_scoring_network_on_segments():
    """`layerwise run --config configs/segments3d.yaml`: its model scores every voxel of the
    config's volumes, on a dataset labelled per voxel, and passes the checks made before the
    flow starts."""
    config = load_config(ROOT / "configs" / "segments3d.yaml")
    assert config.dataset == "segments" and "spatial" in config.strategies
    graph = build_graph(config.models[0].name, batch=config.global_batch,
                        image_size=config.image_size, num_classes=config.classes)
    assert graph.by_name[graph.outputs[0]].output_shape == (
        config.global_batch, config.classes, *graph.input_shape[2:])
    check_before_start(config)


def test_a_decoder_reading_sizes_in_python_traces_with_its_sizes_and_trains_exactly(
        tmp_path, workers_import_tests):
    """MONAI's UpCat pads each upsampled map to its skip's size by `len(x.shape)` and a
    comparison of sizes, which fx cannot trace: traced again with this input's sizes known,
    the pad of even sides is zero and leaves the graph, an odd side's is a padding layer, and
    the network trains equal to one process split over height and width. A graph that would
    hold its batch as a constant is not kept (the tracing error stands)."""
    reference = "tests.idiom_models:SizedDecoder"
    even = build_graph(reference, batch=2, image_size=16, in_channels=1, num_classes=3)
    assert [layer.kind for layer in even.layers].count("pad") == 0
    assert even.param_count == sum(p.numel() for p in SizedDecoder().parameters())
    odd = build_graph(reference, batch=2, image_size=17, in_channels=1, num_classes=3)
    [pad] = [layer for layer in odd.layers if layer.kind == "pad"]
    assert pad.padding is not None and pad.padding.sides == ((0, 1), (0, 1))
    result = runner.invoke(app, ["verify", reference, "--strategy", "data,spatial",
                                 "--nproc", "2", "--input-shape", "1,17,17", "--batch", "2",
                                 "--classes", "3", "--steps", "2", "--dataset", "segments",
                                 "--out", str(tmp_path / "v"), "--json"])
    assert result.exit_code == 0, result.output
    assert all(d["exact"] for d in json.loads(result.stdout)["divergences"])
    with pytest.raises(LayerwiseError, match=r"torch.fx cannot trace .*`flat = x.reshape"):
        build_graph("tests.idiom_models:BatchSizedView", batch=2, image_size=8)


def test_a_network_scoring_every_position_trains_on_segments_unless_told(tmp_path):
    """Without --dataset, a network that scores every position gets the generated dataset
    labelled per position, and says so; a dataset given is kept (and checked)."""
    options = TrainOptions.given(nproc=1, batch=1, image_size=8)
    with new_job("unet3d_seg", "data", options, tmp_path / "run", analytic=True) as job:
        assert job.settings.dataset == "segments"
        assert any("dataset: segments" in warning for warning in job.warnings)
    with new_job("tiny_cnn", "data", options, tmp_path / "cls", analytic=True) as job:
        assert job.settings.dataset == "synthetic"
        assert not any("dataset:" in warning for warning in job.warnings)
    given = TrainOptions.given(nproc=1, batch=1, image_size=8, dataset="synthetic")
    with pytest.raises(LayerwiseError, match="labels each sample once"):
        new_job("unet3d_seg", "data", given, tmp_path / "given", analytic=True)
