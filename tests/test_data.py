"""Data preparation: the digits split, CIFAR batches and ImageFolder trees from a local folder,
and `dvc repro prepare` in a temporary git repo."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.runtime.datasets import load_dataset
from layerwise.tasks.stages.generated_fields import FIELD_SLOPES, gaussian_fields
from layerwise.tasks.stages.prepare_data import (
    load_params,
    main,
    prepare_cifar,
    prepare_digits,
    prepare_imagefolder,
    split_indices,
)
from tests.dvc_repo import data_repo, run

ROOT = Path(__file__).resolve().parents[1]
CLASS_NAMES = ("owl", "cat", "dog")  # drawn red, green, blue; sorted they are cat, dog, owl
IMAGE_SUFFIXES = (".png", ".PNG", ".jpg", ".bmp", ".ppm")


def _pickle(path: Path, content: Any) -> None:
    with path.open("wb") as stream:
        pickle.dump(content, stream)


def write_cifar(folder: Path, batch_sizes: tuple[int, ...] = (2, 2, 2, 2, 1), test_size: int = 4,
                classes: int = 3, fine: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A small but well-formed cifar-10-batches-py folder (CIFAR-100's keys with `fine`):
    random uint8 images, labels cycling through the classes. Returns what each file holds."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    labels_key, names_key = ((b"fine_labels", b"fine_label_names") if fine
                             else (b"labels", b"label_names"))
    _pickle(folder / "batches.meta", {names_key: [f"class{c}".encode() for c in range(classes)]})
    files = [*((f"data_batch_{number}", size) for number, size in enumerate(batch_sizes, 1)),
             ("test_batch", test_size)]
    written = {}
    for name, size in files:
        data = rng.integers(0, 256, (size, 3072), dtype=np.uint8)
        labels = [int(label) for label in rng.permutation(np.arange(size) % classes)]
        batch = {b"batch_label": name.encode(), b"data": data, labels_key: labels}
        if fine:
            batch[b"coarse_labels"] = [0] * size
        _pickle(folder / name, batch)
        written[name] = (data, np.array(labels))
    return written


def write_image_tree(root: Path, per_class: int = 5) -> None:
    """ROOT/<class>/ with noisy images of varied sizes and formats; each class's colour channel
    is its index in CLASS_NAMES, so the prepared pixels show which class they came from."""
    rng = np.random.default_rng(0)
    for colour, name in enumerate(CLASS_NAMES):
        folder = root / name
        folder.mkdir(parents=True)
        for index in range(per_class):
            pixels = rng.integers(0, 80, (9 + index, 12, 3), dtype=np.uint8)
            pixels[..., colour] += 150
            suffix = IMAGE_SUFFIXES[index % len(IMAGE_SUFFIXES)]
            Image.fromarray(pixels).save(folder / f"{index}{suffix}")
        (folder / "notes.txt").write_text("not an image: skipped")


def assert_normalised(images: np.ndarray) -> None:
    """Per channel: mean 0, standard deviation 1."""
    assert np.all(np.abs(images.mean(axis=(0, 2, 3))) < 1e-4)
    assert np.all(np.abs(images.std(axis=(0, 2, 3)) - 1) < 1e-3)


def test_digits_are_resized_split_per_class_and_normalised(tmp_path):
    meta = prepare_digits(tmp_path, image_size=16, val_fraction=0.25, seed=3)
    train, val = np.load(tmp_path / "train.npz"), np.load(tmp_path / "val.npz")
    assert train["x"].shape == (meta["train"], 1, 16, 16) and train["x"].dtype == np.float32
    assert meta["train"] + meta["val"] == 1797
    assert_normalised(train["x"])
    train_counts = np.bincount(train["y"], minlength=10)
    val_counts = np.bincount(val["y"], minlength=10)
    shares = val_counts / (train_counts + val_counts)
    assert np.all(np.abs(shares - 0.25) < 0.02)  # every class keeps its share
    assert json.loads((tmp_path / "meta.json").read_text())["seed"] == 3


def test_the_split_is_deterministic_and_disjoint():
    labels = np.repeat(np.arange(10), 37)
    first = split_indices(labels, 0.2, seed=7)
    again = split_indices(labels, 0.2, seed=7)
    other = split_indices(labels, 0.2, seed=8)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[1], other[1])
    assert not set(first[0]) & set(first[1])
    assert len(first[0]) + len(first[1]) == len(labels)
    with pytest.raises(LayerwiseError, match="between 0 and 1"):
        split_indices(labels, 1.5, seed=0)


def test_bad_params_are_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "params.yaml"
    bad.write_text("prepare:\n  image_size: 8\n  colour: blue\n")
    with pytest.raises(LayerwiseError, match="prepare.colour: unknown parameter"):
        load_params(bad)
    bad.write_text("prepare: [unclosed\n")
    assert main(["--params", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("error:")
    assert main(["--params", str(tmp_path / "missing.yaml")]) == 2


@pytest.mark.slow
def test_dvc_repro_prepare_builds_tracks_and_skips_unchanged_data(tmp_path):
    dvc = str(Path(sys.executable).parent / "dvc")
    repo = data_repo(tmp_path)
    first = run([dvc, "repro", "prepare"], repo)
    assert "prepared digits" in first.stdout
    meta = json.loads((repo / "data/prepared/digits/meta.json").read_text())
    assert meta["image_size"] == 8
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert lock["stages"]["prepare"]["params"]["params.yaml"]["prepare"]["image_size"] == 8
    unchanged = run([dvc, "repro", "prepare"], repo)
    assert "didn't change" in unchanged.stdout
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["prepare"]["image_size"] = 12
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    run([dvc, "repro", "prepare"], repo)
    assert json.loads((repo / "data/prepared/digits/meta.json").read_text())["image_size"] == 12


def _splits(folder: Path) -> tuple[dict, dict]:
    return dict(np.load(folder / "train.npz")), dict(np.load(folder / "val.npz"))


def test_cifar_keeps_the_official_split_labels_and_channel_order(tmp_path):
    source = tmp_path / "cifar-10-batches-py"
    written = write_cifar(source)
    meta = prepare_cifar(source, tmp_path / "out", image_size=32)
    train, val = _splits(tmp_path / "out")
    assert train["x"].shape == (9, 3, 32, 32) and val["x"].shape == (4, 3, 32, 32)
    assert np.array_equal(train["y"], np.concatenate([written[f"data_batch_{number}"][1]
                                                      for number in range(1, 6)]))
    assert np.array_equal(val["y"], written["test_batch"][1])
    assert meta["class_names"] == ["class0", "class1", "class2"] and meta["classes"] == 3
    assert_normalised(train["x"])
    # undoing the normalisation gives the file's pixels: R, G and B planes of 32x32 each
    mean, std = (np.array(meta[key])[:, None, None] for key in ("mean", "std"))
    expected = written["test_batch"][0].reshape(-1, 3, 32, 32) / 255
    assert np.allclose(val["x"] * std + mean, expected, atol=1e-5)
    prepare_cifar(source, tmp_path / "small", image_size=16)
    assert _splits(tmp_path / "small")[1]["x"].shape == (4, 3, 16, 16)


def test_cifar_100_fine_labels_are_read(tmp_path):
    written = write_cifar(tmp_path / "cifar", classes=5, fine=True)
    meta = prepare_cifar(tmp_path / "cifar", tmp_path / "out", image_size=8)
    assert meta["classes"] == 5
    assert np.array_equal(_splits(tmp_path / "out")[1]["y"], written["test_batch"][1])


@pytest.mark.parametrize(("content", "message"), [
    ({b"data": np.zeros((4, 100), np.uint8), b"labels": [0] * 4},
     r"test_batch: b'data' is uint8 \(4, 100\), not N x 3072"),
    ({b"data": np.zeros((4, 3072), np.uint8), b"labels": [7] * 4}, r"labels in 0\.\.2"),
    ({b"data": np.zeros((4, 3072), np.uint8)}, "test_batch is not a CIFAR python file"),
    ([1, 2, 3], "test_batch is not a CIFAR python file"),
    ({b"data": print, b"labels": []}, "refers to builtins.print"),
])
def test_a_bad_cifar_file_is_one_line_and_writes_nothing(tmp_path, content, message):
    source = tmp_path / "cifar"
    write_cifar(source)
    _pickle(source / "test_batch", content)
    with pytest.raises(LayerwiseError, match=message):
        prepare_cifar(source, tmp_path / "out", image_size=8)
    assert not (tmp_path / "out").exists()


def test_a_bad_cifar_folder_is_one_line(tmp_path):
    with pytest.raises(LayerwiseError, match="nowhere does not exist; point prepare.source"):
        prepare_cifar(tmp_path / "nowhere", tmp_path / "out", image_size=8)
    source = tmp_path / "cifar"
    write_cifar(source)
    (source / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(LayerwiseError, match="test_batch is not a CIFAR python file"):
        prepare_cifar(source, tmp_path / "out", image_size=8)
    (source / "test_batch").unlink()
    with pytest.raises(LayerwiseError, match="test_batch is missing"):
        prepare_cifar(source, tmp_path / "out", image_size=8)
    (source / "data_batch_3").unlink()
    with pytest.raises(LayerwiseError, match="lacks data_batch_3 of CIFAR-10's 5 training"):
        prepare_cifar(source, tmp_path / "out", image_size=8)
    for batch in source.glob("data_batch_*"):
        batch.unlink()
    with pytest.raises(LayerwiseError, match="has no data_batch_1..5 files"):
        prepare_cifar(source, tmp_path / "out", image_size=8)
    assert not (tmp_path / "out").exists()


def test_an_image_folder_maps_sorted_class_names_and_splits_every_class(tmp_path):
    write_image_tree(tmp_path / "tree")
    meta = prepare_imagefolder(tmp_path / "tree", tmp_path / "out", image_size=8, channels=3,
                               val_fraction=0.4, seed=1)
    assert meta["class_names"] == ["cat", "dog", "owl"]
    train, val = _splits(tmp_path / "out")
    assert train["x"].shape == (9, 3, 8, 8) and val["x"].shape == (6, 3, 8, 8)
    assert list(np.bincount(train["y"])) == [3, 3, 3]
    assert list(np.bincount(val["y"])) == [2, 2, 2]
    assert_normalised(train["x"])
    colour_of_label = np.array([CLASS_NAMES.index(name) for name in meta["class_names"]])
    for split in (train, val):
        assert np.array_equal(split["x"].mean(axis=(2, 3)).argmax(axis=1),
                              colour_of_label[split["y"]])
    gray = prepare_imagefolder(tmp_path / "tree", tmp_path / "gray", image_size=6, channels=1,
                               val_fraction=0.4, seed=1)
    assert gray["channels"] == 1 and _splits(tmp_path / "gray")[0]["x"].shape == (9, 1, 6, 6)


def test_a_bad_image_folder_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"

    def prepare(root: Path, channels: int = 3) -> dict:
        return prepare_imagefolder(root, out, image_size=8, channels=channels,
                                   val_fraction=0.4, seed=0)

    with pytest.raises(LayerwiseError, match="nowhere does not exist; arrange --source"):
        prepare(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LayerwiseError, match="empty has no class folders"):
        prepare(tmp_path / "empty")
    write_image_tree(tmp_path / "one")
    for extra in ("dog", "owl"):
        shutil.rmtree(tmp_path / "one" / extra)
    with pytest.raises(LayerwiseError, match=r"only one class folder \(cat\); a classifier "
                                             "needs 2 or more"):
        prepare(tmp_path / "one")
    tree = tmp_path / "tree"
    write_image_tree(tree, per_class=2)
    with pytest.raises(LayerwiseError, match="channels must be 1"):
        prepare(tree, channels=2)
    (tree / "cat" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(LayerwiseError, match=r"cannot read image .*cat/broken\.png"):
        prepare(tree)
    (tree / "cat" / "broken.png").unlink()
    (tree / "dog" / "0.png").unlink()
    with pytest.raises(LayerwiseError, match=r"dog holds 1 image\(s\)"):
        prepare(tree)
    assert not out.exists()


def test_the_command_line_overrides_params_yaml(tmp_path, monkeypatch, capsys):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"prepare": {"dataset": "digits", "image_size": 8,
                                                  "out": "data/prepared/digits"}}))
    write_image_tree(tmp_path / "tree")
    monkeypatch.chdir(tmp_path)
    base = ["--params", str(params)]
    assert main([*base, "--dataset", "imagefolder", "--source", "tree", "--channels", "1"]) == 0
    assert "prepared imagefolder: 12 train / 3 validation" in capsys.readouterr().out
    meta = json.loads((tmp_path / "data/prepared/imagefolder/meta.json").read_text())
    assert (meta["image_size"], meta["channels"], meta["classes"]) == (8, 1, 3)
    assert not (tmp_path / "data/prepared/digits").exists()
    for wrong, message in ((["--dataset", "cifar10"], "pass --source PATH"),
                           (["--dataset", "cifar10", "--source", "tree", "--out",
                             "data/prepared/digits"], "write cifar10 to data/prepared/cifar10"),
                           (["--channels", "3"], "digits has 1 channel"),
                           (["--image-size", "0"], "image_size must be >= 1")):
        assert main([*base, *wrong]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("stage", ["prepare", "prepare_fields", "prepare_fields3d",
                                   "prepare_signals"])
def test_the_committed_lock_matches_the_code_that_prepares_the_data(stage):
    """`make run` reproduces `prepare` (`layerwise run --config configs/volumes.yaml`
    `prepare_fields`): a dvc.lock whose recorded hash of the stage's script is stale makes
    every fresh clone's first run rewrite it and leave git dirty."""
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text(encoding="utf-8"))
    for dependency in lock["stages"][stage]["deps"]:
        code = ROOT / dependency["path"]
        assert hashlib.md5(code.read_bytes()).hexdigest() == dependency["md5"], (
            f"dvc.lock is stale for {dependency['path']}: run `dvc repro {stage}` and commit "
            "dvc.lock")


def test_the_fields_are_reproducible_balanced_and_told_apart_by_their_roughness():
    """What makes the generated fields a learnable task: the same seed gives the same bytes;
    every field has zero mean and unit variance, so intensity says nothing of the class; and
    the mean squared difference of neighbouring values, what a 3x3 convolution can measure in
    any window, falls with the spectrum's slope, far apart between the classes."""
    fields, labels = gaussian_fields(60, (64, 64), seed=3)
    again, same_labels = gaussian_fields(60, (64, 64), seed=3)
    assert np.array_equal(fields, again) and np.array_equal(labels, same_labels)
    assert not np.array_equal(fields, gaussian_fields(60, (64, 64), seed=4)[0])
    assert np.bincount(labels).tolist() == [20] * len(FIELD_SLOPES)
    assert np.allclose(fields.mean(axis=(1, 2, 3)), 0, atol=1e-5)
    assert np.allclose(fields.std(axis=(1, 2, 3)), 1, atol=1e-4)
    roughness = (np.diff(fields, axis=3) ** 2).mean(axis=(1, 2, 3))
    by_class = [roughness[labels == label] for label in range(len(FIELD_SLOPES))]
    for rougher, smoother in zip(by_class, by_class[1:], strict=False):
        assert rougher.min() > 2 * smoother.max()  # every field of a class apart from the next


def test_the_fields_stage_writes_the_section_params_yaml_names(tmp_path, monkeypatch, capsys):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "prepare": {"dataset": "digits", "out": "data/prepared/digits"},
        "prepare_fields": {"dataset": "fields", "image_size": 16, "images": 30,
                           "val_fraction": 0.2, "seed": 0, "out": "data/prepared/fields"}}))
    monkeypatch.chdir(tmp_path)
    assert main(["--params", str(params), "--section", "prepare_fields"]) == 0
    assert "prepared fields: 24 train / 6 validation samples at 16x16" in capsys.readouterr().out
    meta = json.loads((tmp_path / "data/prepared/fields/meta.json").read_text())
    assert (meta["channels"], meta["classes"], meta["class_names"][0]) == (1, 3, "alpha=1")
    assert not (tmp_path / "data/prepared/digits").exists()
    assert main(["--params", str(params), "--section", "prepare_fields", "--images", "4"]) == 2
    assert "set at least 6" in capsys.readouterr().err
    assert main(["--params", str(params), "--section", "prepare_volumes"]) == 2
    assert "has no 'prepare_volumes' section" in capsys.readouterr().err


@pytest.mark.parametrize("sizes", [(16, 16, 16), (1024,)])
def test_volumes_and_signals_are_told_apart_by_their_roughness_along_every_dim(sizes):
    """The 3-d fields (fields3d) and 1-d signals (signals) are the same task: zero mean, unit
    variance, and a roughness (mean squared difference of neighbours, along any dim, what a
    convolution measures in a window) that falls with the spectrum's slope."""
    fields, labels = gaussian_fields(30, sizes, seed=1)
    assert fields.shape == (30, 1, *sizes)
    assert np.array_equal(fields, gaussian_fields(30, sizes, seed=1)[0])
    axes = tuple(range(1, fields.ndim))
    assert np.allclose(fields.mean(axis=axes), 0, atol=1e-5)
    assert np.allclose(fields.std(axis=axes), 1, atol=1e-4)
    for axis in range(2, fields.ndim):
        roughness = (np.diff(fields, axis=axis) ** 2).mean(axis=axes)
        by_class = [roughness[labels == label] for label in range(len(FIELD_SLOPES))]
        for rougher, smoother in zip(by_class, by_class[1:], strict=False):
            assert rougher.min() > 1.3 * smoother.max()  # 3-d: 1.66 against 1.09 at least


def test_the_volume_and_signal_stages_write_what_a_3d_and_1d_model_train_on(
        tmp_path, monkeypatch, capsys):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "prepare": {"dataset": "digits", "out": "data/prepared/digits"},
        "prepare_fields3d": {"dataset": "fields3d", "image_size": [8, 12, 12], "images": 30,
                             "seed": 0, "out": "data/prepared/fields3d"},
        "prepare_signals": {"dataset": "signals", "image_size": 256, "images": 30,
                            "seed": 0, "out": "data/prepared/signals"}}))
    monkeypatch.chdir(tmp_path)
    assert main(["--params", str(params), "--section", "prepare_fields3d"]) == 0
    assert "24 train / 6 validation samples at 8x12x12" in capsys.readouterr().out
    assert main(["--params", str(params), "--section", "prepare_signals"]) == 0
    assert "samples at 256, 1 channel(s)" in capsys.readouterr().out
    root = tmp_path / "data/prepared"
    volumes = load_dataset("fields3d", (8, 12, 12), 3, 1, 0, root)
    x, y = volumes.train.take(np.arange(4))
    assert x.shape == (4, 1, 8, 12, 12) and y.shape == (4,)
    assert load_dataset("signals", (256,), 3, 1, 0, root).val.take(np.arange(2))[0].shape == (
        2, 1, 256)
    with pytest.raises(LayerwiseError, match="prepared at 8x12x12 but the model takes 8x8x8; "
                                             "pass --input-shape 1,8,12,12"):
        load_dataset("fields3d", (8, 8, 8), 3, 1, 0, root)
    assert main(["--params", str(params), "--section", "prepare_signals",
                 "--image-size", "16,16"]) == 2
    assert "signals has 1 spatial dim(s), not the 2 of [16, 16]" in capsys.readouterr().err


def _npy_tree(root: Path, shape: tuple[int, ...], per_class: int = 5) -> None:
    rng = np.random.default_rng(0)
    for name in ("ct", "mri"):
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            np.save(root / name / f"{index}.npy", rng.standard_normal(shape).astype(np.float32))


def test_a_npy_folder_of_volumes_is_prepared_like_an_image_folder(tmp_path, capsys):
    """Users' own volumes: ROOT/<class>/<sample>.npy, one channel or channels first, resized
    by --image-size along every dim; the class index follows the sorted folder names."""
    source = tmp_path / "scans"
    _npy_tree(source, (6, 10, 10))
    out = tmp_path / "prepared" / "scans"
    assert main(["--dataset", "npyfolder", "--source", str(source), "--out", str(out)]) == 0
    assert "8 train / 2 validation samples at 6x10x10, 1 channel(s), 2 classes" in (
        capsys.readouterr().out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["image_size"] == [6, 10, 10] and meta["class_names"] == ["ct", "mri"]
    x, y = load_dataset("scans", (6, 10, 10), 2, 1, 0, tmp_path / "prepared").train.take(
        np.arange(8))
    assert x.shape == (8, 1, 6, 10, 10) and sorted(set(y.tolist())) == [0, 1]
    resized = tmp_path / "prepared" / "small"
    assert main(["--dataset", "npyfolder", "--source", str(source), "--out", str(resized),
                 "--image-size", "8", "--channels", "6"]) == 0
    assert "at 8x8, 6 channel(s)" in capsys.readouterr().out  # (6, 10, 10): 6 channels of 10x10


def test_a_bad_npy_folder_is_one_line_and_writes_nothing(tmp_path, capsys):
    source, out = tmp_path / "scans", tmp_path / "prepared"
    _npy_tree(source, (4, 4, 4))
    np.save(source / "ct" / "odd.npy", np.zeros((4, 4, 5), dtype=np.float32))
    arguments = ["--dataset", "npyfolder", "--source", str(source), "--out", str(out)]
    assert main(arguments) == 2
    assert "has shape (4, 4, 5) but" in capsys.readouterr().err
    (source / "ct" / "odd.npy").unlink()
    np.save(source / "mri" / "words.npy", np.array(["a", "b"]))
    assert main(arguments) == 2
    assert "not a signal, image or volume of numbers" in capsys.readouterr().err
    (source / "mri" / "words.npy").unlink()
    np.save(source / "mri" / "objects.npy", np.array([{"a": 1}], dtype=object),
            allow_pickle=True)
    assert main(arguments) == 2
    assert "not a signal, image or volume of numbers" in capsys.readouterr().err
    shutil.rmtree(source / "mri")
    assert main(arguments) == 2
    assert "a classifier needs two classes or more" in capsys.readouterr().err
    assert not out.exists()
