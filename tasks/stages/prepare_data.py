"""Dataset preparation: the `prepare` stage of dvc.yaml.

    python -m layerwise.tasks.stages.prepare_data    # params.yaml -> data/prepared/digits
    dvc repro prepare                                # the same, tracked by DVC
    python -m layerwise.tasks.stages.prepare_data --dataset cifar10 \
        --source ~/data/cifar-10-batches-py
    python -m layerwise.tasks.stages.prepare_data --dataset imagefolder \
        --source ~/data/flowers --out data/prepared/flowers
    python -m layerwise.tasks.stages.prepare_data --section prepare_fields
    dvc repro prepare_fields                         # the same, tracked by DVC
    dvc repro prepare_fields3d prepare_signals       # the generated volumes and signals
    python -m layerwise.tasks.stages.prepare_data --dataset npyfolder \
        --source ~/data/scans --out data/prepared/scans

`prepare.dataset` names the source (`--section NAME` reads another section of params.yaml:
`prepare_fields` is the `fields` dataset's, its own DVC stage):

- digits (default): scikit-learn ships the UCI handwritten digits (1,797 8x8 grayscale images,
  10 classes), so the default needs no download.
- cifar10: the python version of CIFAR-10 in a local folder (`data_batch_1..5`, `test_batch`,
  `batches.meta`, as `cifar-10-batches-py` unpacks; `fine_labels` as CIFAR-100 has them work
  too). Its official split: the data batches train, the test batch validates.
- imagefolder: ROOT/<class>/<images> (png, jpg, jpeg, bmp, ppm); the class index follows the
  sorted folder names, as torchvision's ImageFolder does.
- fields, fields3d, signals: generated, nothing to download: `images` Gaussian random fields in
  2-d (high-resolution images), 3-d (volumes) or 1-d (signals), one channel, whose power
  spectrum falls as P(k) ~ k^-alpha, the class being alpha (tasks/stages/generated_fields.py
  says why they are learnable); `image_size` is a side for every dim, or a list of sizes.
- npyfolder: users' own signals and volumes, ROOT/<class>/<sample>.npy
  (tasks/stages/npy_folder.py).

Every image source is scaled to [0, 1] and resized to the model's input size; digits,
imagefolder and npyfolder are split into train and validation per class with a seeded
permutation (so every class keeps its share). The training split's per-channel mean and standard
deviation normalise both splits, written as `train.npz` / `val.npz` (x: float32 N x C x
*spatial, y: int64) plus `meta.json`. Nothing is written before the whole source has been read,
so a bad file leaves the folder as it was.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from sklearn.datasets import load_digits

from layerwise.strategies.errors import FailedError, LayerwiseError, shown
from layerwise.strategies.files.atomic import atomic_path, creatable_folder, write_atomic
from layerwise.strategies.files.documents import read_yaml
from layerwise.strategies.files.locations import PREPARED_DIR
from layerwise.strategies.hardware.host_memory import check_memory
from layerwise.strategies.model.input_size import InputSize, compact_size, spatial_size
from layerwise.strategies.text import printable
from layerwise.tasks.stages.generated_fields import FIELD_SLOPES, class_names, gaussian_fields
from layerwise.tasks.stages.npy_folder import NPY_FIX, prepare_arrays

PARAMS_FILE = Path("params.yaml")  # the DVC project's parameters, at its root

SOURCES = ("digits", "cifar10", "imagefolder", "fields", "fields3d", "signals", "npyfolder")
GENERATED = {"fields": 2, "fields3d": 3, "signals": 1}  # the generated fields, by their dims
PARAMETERS = ("dataset", "source", "image_size", "channels", "val_fraction", "seed", "out",
              "images")
SECTION = "prepare"  # params.yaml's section of the default stage
DEFAULT_FIELD_IMAGES = 480
SCHEMA_VERSION = 2  # 2: mean and std per channel, class_names
DIGITS_MAX_VALUE = 16.0  # pixel values of the UCI digits run from 0 to 16
PIXEL_MAX_VALUE = 255.0  # 8-bit images
FIXED_CHANNELS = {"digits": 1, "cifar10": 3, "fields": 1, "fields3d": 1, "signals": 1}
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".ppm"})
_RESIZE_CHUNK = 1024  # images resized at once: bounds the float copy of a large uint8 source
_CIFAR_SHAPE = (3, 32, 32)  # each row of b"data": the R, G and B planes of a 32x32 image
_CIFAR_TRAIN = re.compile(r"data_batch_(\d+)")
_CIFAR_TRAIN_BATCHES = 5
_CIFAR_FIX = ("point prepare.source (--source) at the folder the python version of CIFAR-10 "
              "unpacks to (cifar-10-batches-py)")
_FOLDER_FIX = "arrange --source as ROOT/<class name>/<images> (png, jpg, jpeg, bmp or ppm)"
# What a CIFAR batch may reference: numpy's array reconstruction (numpy 1 and 2 module names)
# and Python 3's bytes decoding. Anything else could run code while unpickling.
_CIFAR_GLOBALS = frozenset({
    *((module, name) for module in ("numpy.core.multiarray", "numpy._core.multiarray")
      for name in ("_reconstruct", "scalar")),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
})

Split = tuple[np.ndarray, np.ndarray]  # samples (float32 N x C x *spatial), labels (int64 N)


@dataclass(frozen=True)
class PrepareSettings:
    """The `prepare` parameters, typed and checked before any file is read or written."""

    dataset: str
    source: Path | None
    image_size: InputSize | None  # None: npyfolder's samples as they are
    channels: int | None
    val_fraction: float
    seed: int
    out: Path
    images: int = DEFAULT_FIELD_IMAGES  # fields: how many are generated


def split_indices(labels: np.ndarray, val_fraction: float,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-class seeded split: the same seed always gives the same train/validation sets."""
    if not 0.0 < val_fraction < 1.0:
        raise LayerwiseError(f"val_fraction must be between 0 and 1 (got {val_fraction})")
    rng = np.random.default_rng(seed)
    train, val = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        cut = max(1, round(len(members) * val_fraction))
        val.append(members[:cut])
        train.append(members[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def _check_image_size(image_size: InputSize) -> None:
    if min(spatial_size(image_size, 1)) < 1:
        raise LayerwiseError(f"image_size must be >= 1 (got {image_size})")


def _check_memory(count: int, channels: int, image_size: InputSize, dims: int = 2) -> None:
    """MemoryNeedError (one line) before `count` float32 samples of this size are allocated."""
    sizes = spatial_size(image_size, dims)
    kind = {1: "signals", 2: "images", 3: "volumes"}[len(sizes)]
    check_memory(count * channels * math.prod(sizes) * 4,
                 f"{count:,} {kind} at {'x'.join(map(str, sizes))}",
                 "set a smaller prepare.image_size (or --image-size)")


def resize(images: np.ndarray, image_size: int, max_value: float = 1.0) -> np.ndarray:
    """N x C x H x W images divided by `max_value` to float32 N x C x S x S (bilinear).

    A chunk at a time: a 50,000-image uint8 source never exists as floats at full size twice.
    """
    _check_image_size(image_size)
    _check_memory(len(images), images.shape[1], image_size)
    resized = np.empty((len(images), images.shape[1], image_size, image_size), dtype=np.float32)
    for start in range(0, len(images), _RESIZE_CHUNK):
        chunk = images[start:start + _RESIZE_CHUNK].astype(np.float32) / max_value
        resized[start:start + len(chunk)] = F.interpolate(
            torch.from_numpy(chunk), size=(image_size, image_size), mode="bilinear",
            align_corners=False).numpy()
    return resized


def channel_stats(images: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and standard deviation of N x C x S x S images, summed in float64 (a
    float32 sum over millions of pixels drifts). A constant channel gets std 1, so it
    normalises to zeros rather than NaNs."""
    channels = range(images.shape[1])
    mean = [float(images[:, c].mean(dtype=np.float64)) for c in channels]
    std = [float(images[:, c].std(dtype=np.float64)) or 1.0 for c in channels]
    return mean, std


def _normalise(images: np.ndarray, mean: list[float], std: list[float]) -> None:
    """In place, so the largest array is never copied."""
    per_channel = (slice(None), *([None] * (images.ndim - 2)))
    images -= np.asarray(mean, dtype=np.float32)[per_channel]
    images /= np.asarray(std, dtype=np.float32)[per_channel]


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    with atomic_path(path) as temporary:
        try:
            np.savez(temporary, **arrays)
        except OSError as problem:  # a full disk
            raise FailedError(f"cannot write {path}: {problem.strerror or problem}") from None


def _write_prepared(out_dir: Path, train: Split, val: Split, meta: dict[str, Any]) -> dict:
    """Normalise both splits with the training split's statistics and write them, meta.json
    last (readers start from it). `meta` names the dataset, its source, classes and split."""
    mean, std = channel_stats(train[0])
    for images, _ in (train, val):
        _normalise(images, mean, std)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as problem:  # a read-only file system
        raise FailedError(f"cannot make {out_dir}: {problem.strerror or problem}") from None
    _save_npz(out_dir / "train.npz", x=train[0], y=train[1])
    _save_npz(out_dir / "val.npz", x=val[0], y=val[1])
    channels, sizes = train[0].shape[1], tuple(train[0].shape[2:])
    compact = compact_size(sizes)
    full = {"schema_version": SCHEMA_VERSION, **meta,
            "image_size": compact if isinstance(compact, int) else list(compact),
            "channels": channels, "classes": len(meta["class_names"]), "train": len(train[1]),
            "val": len(val[1]), "mean": mean, "std": std}
    write_atomic(out_dir / "meta.json", json.dumps(full, indent=2) + "\n")
    return full


def prepare_digits(out_dir: Path, image_size: int, val_fraction: float, seed: int) -> dict:
    """Write the prepared digits to `out_dir`; returns the metadata written to meta.json."""
    digits = load_digits()
    images = resize(digits.images[:, None], image_size, DIGITS_MAX_VALUE)
    labels = digits.target.astype(np.int64)
    train, val = split_indices(labels, val_fraction, seed)
    return _write_prepared(out_dir, (images[train], labels[train]), (images[val], labels[val]), {
        "dataset": "digits", "source": "sklearn.datasets.load_digits",
        "class_names": [str(digit) for digit in range(10)], "seed": seed,
        "val_fraction": val_fraction})


def prepare_fields(out_dir: Path, dataset: str, image_size: InputSize, images: int,
                   val_fraction: float, seed: int) -> dict:
    """Write `images` generated fields of `dataset` (fields, fields3d or signals:
    generated_fields.py), split per class."""
    classes = len(FIELD_SLOPES)
    if images < 2 * classes:
        raise LayerwiseError(f"prepare.images: {images} fields cannot give each of the "
                             f"{classes} classes a training and a validation field; set at "
                             f"least {2 * classes}")
    dims = GENERATED[dataset]
    sizes = spatial_size(image_size, dims)
    if len(sizes) != dims:
        raise LayerwiseError(f"prepare.image_size: {dataset} has {dims} spatial dim(s), not "
                             f"the {len(sizes)} of {list(sizes)}")
    _check_image_size(sizes)
    _check_memory(images, 1, sizes, dims)
    fields, labels = gaussian_fields(images, sizes, seed)
    train, val = split_indices(labels, val_fraction, seed)
    kind = {1: "signals", 2: "fields", 3: "volumes"}[dims]
    return _write_prepared(out_dir, (fields[train], labels[train]), (fields[val], labels[val]), {
        "dataset": dataset, "source": f"generated: Gaussian random {kind}, seed {seed}",
        "class_names": class_names(), "seed": seed, "val_fraction": val_fraction})


def prepare_npyfolder(source: Path, out_dir: Path, image_size: InputSize | None,
                      channels: int | None, val_fraction: float, seed: int) -> dict:
    """Write a .npy class tree (npy_folder.py) to `out_dir`, split per class with the seeded
    permutation."""
    folder = _source_folder(source, NPY_FIX)
    names, samples, labels = prepare_arrays(folder, image_size, channels)
    train, val = split_indices(labels, val_fraction, seed)
    return _write_prepared(out_dir, (samples[train], labels[train]),
                           (samples[val], labels[val]), {
        "dataset": "npyfolder", "source": str(folder), "class_names": names, "seed": seed,
        "val_fraction": val_fraction})


def _source_folder(source: Path, fix: str) -> Path:
    if not source.is_dir():
        state = "is not a folder" if source.exists() else "does not exist"
        raise LayerwiseError(f"{source} {state}; {fix}")
    return source.resolve()  # meta.json records where the data came from, wherever it ran


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles arrays, lists and dicts only: a file that names any other global is refused
    before it can run code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _CIFAR_GLOBALS:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}")
        return super().find_class(module, name)


def _cifar_values(path: Path, keys: tuple[tuple[bytes, ...], ...]) -> list[Any]:
    """The values of the pickled dict in `path`, one per entry of `keys`: the first key of each
    entry's alternatives that the dict has (b"fine_labels" before b"labels")."""
    if not path.is_file():
        raise LayerwiseError(f"{path} is missing; {_CIFAR_FIX}")
    expected = " and ".join(" or ".join(map(repr, choice)) for choice in keys)
    try:
        with path.open("rb") as stream:
            content = _CifarUnpickler(stream, encoding="bytes").load()
    except Exception as error:  # a damaged pickle fails in many ways; each means the same here
        raise LayerwiseError(f"{path} is not a CIFAR python file (a pickled dict with "
                             f"{expected}): {error}; {_CIFAR_FIX}") from None
    present = content if isinstance(content, dict) else {}
    found = [next((key for key in choice if key in present), None) for choice in keys]
    if None in found:
        raise LayerwiseError(f"{path} is not a CIFAR python file (a pickled dict with "
                             f"{expected}); {_CIFAR_FIX}")
    return [present[key] for key in found]


def _cifar_class_names(path: Path) -> list[str]:
    (names,) = _cifar_values(path, ((b"fine_label_names", b"label_names"),))
    if not isinstance(names, list | tuple) or not names:
        raise LayerwiseError(f"{path}: the label names are not a non-empty list; {_CIFAR_FIX}")
    return [name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            for name in names]


def _array(value: Any) -> np.ndarray:
    """`value` as an array for the shape checks; a ragged list becomes an object scalar, which
    they reject like any other wrong shape."""
    try:
        return np.asarray(value)
    except ValueError:
        return np.array(None, dtype=object)


def _cifar_batch(path: Path, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 N x 3 x 32 x 32 images and int64 labels of one batch file, shape-checked."""
    data, labels = (_array(value) for value in
                    _cifar_values(path, ((b"data",), (b"fine_labels", b"labels"))))
    pixels = int(np.prod(_CIFAR_SHAPE))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != pixels or not len(data):
        raise LayerwiseError(f"{path}: b'data' is {data.dtype} {data.shape}, not N x {pixels} "
                             f"uint8 (32x32 RGB images, channel-major); {_CIFAR_FIX}")
    if (labels.shape != (len(data),) or labels.dtype.kind not in "iu"
            or labels.min() < 0 or labels.max() >= classes):
        raise LayerwiseError(f"{path}: expected {len(data)} integer labels in 0..{classes - 1} "
                             f"(one per image, {classes} classes in batches.meta); {_CIFAR_FIX}")
    return data.reshape(-1, *_CIFAR_SHAPE), labels.astype(np.int64)


def _cifar_split(files: list[Path], classes: int, image_size: int) -> Split:
    batches = [_cifar_batch(path, classes) for path in files]
    images = np.concatenate([images for images, _ in batches])
    return (resize(images, image_size, PIXEL_MAX_VALUE),
            np.concatenate([labels for _, labels in batches]))


def _cifar_train_files(folder: Path) -> list[Path]:
    """data_batch_1..5, every one: a partial download would train on part of CIFAR-10 and
    call it CIFAR-10."""
    numbered = {int(match[1]): path for path in folder.iterdir()
                if (match := _CIFAR_TRAIN.fullmatch(path.name))}
    if not numbered:
        raise LayerwiseError(f"{folder} has no data_batch_1..5 files; {_CIFAR_FIX}")
    missing = [f"data_batch_{number}" for number in range(1, _CIFAR_TRAIN_BATCHES + 1)
               if number not in numbered]
    if missing:
        raise LayerwiseError(f"{folder} lacks {', '.join(missing)} of CIFAR-10's "
                             f"{_CIFAR_TRAIN_BATCHES} training batches (an interrupted "
                             f"download or copy?); {_CIFAR_FIX}")
    return [numbered[number] for number in sorted(numbered)]


def prepare_cifar(source: Path, out_dir: Path, image_size: int) -> dict:
    """Write CIFAR-10 (python version) from `source` to `out_dir` with the official split:
    data_batch_* train, test_batch validation. Only those files and batches.meta are read."""
    _check_image_size(image_size)
    folder = _source_folder(source, _CIFAR_FIX)
    names = _cifar_class_names(folder / "batches.meta")
    train = _cifar_split(_cifar_train_files(folder), len(names), image_size)
    val = _cifar_split([folder / "test_batch"], len(names), image_size)
    return _write_prepared(out_dir, train, val, {
        "dataset": "cifar10", "source": str(folder), "class_names": names,
        "split": "official: data_batch_* train, test_batch validation"})


def _class_files(folder: Path) -> list[Path]:
    """The images of one class folder (any depth), hidden files left out, in a stable order."""
    return sorted(path for path in folder.rglob("*")
                  if path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")
                  and path.is_file())


def _image_files(root: Path) -> tuple[list[str], list[Path], np.ndarray]:
    """Class names (sorted folder names: their order is the class index), files, labels."""
    names = sorted(path.name for path in root.iterdir()
                   if path.is_dir() and not path.name.startswith("."))
    if len(names) < 2:
        found = f"only one class folder ({names[0]})" if names else "no class folders"
        raise LayerwiseError(f"{root} has {found}; a classifier needs 2 or more classes; "
                             f"{_FOLDER_FIX}")
    files: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(names):
        found = _class_files(root / name)
        if len(found) < 2:
            raise LayerwiseError(f"{root / name} holds {len(found)} image(s); every class needs "
                                 f"2 or more (training and validation); {_FOLDER_FIX}")
        files += found
        labels += [label] * len(found)
    return names, files, np.array(labels, dtype=np.int64)


def _read_image(path: Path, mode: str, image_size: int) -> np.ndarray:
    """One image as float32 C x S x S in [0, 1]. Pillow's bilinear filter widens when it
    shrinks, so a large photo is averaged down rather than sampled."""
    try:
        with Image.open(path) as image:
            small = image.convert(mode).resize((image_size, image_size),
                                               Image.Resampling.BILINEAR)
    except (OSError, ValueError, EOFError, Image.DecompressionBombError) as error:
        raise LayerwiseError(f"cannot read image {path} ({error}); replace or remove it, or "
                             "move it out of the class folders") from None
    pixels = np.asarray(small, dtype=np.float32) / PIXEL_MAX_VALUE
    return pixels.reshape(image_size, image_size, -1).transpose(2, 0, 1)


def prepare_imagefolder(source: Path, out_dir: Path, image_size: int, channels: int,
                        val_fraction: float, seed: int) -> dict:
    """Write an ImageFolder tree (ROOT/<class>/<images>) to `out_dir`, converted to RGB
    (channels 3) or grayscale (1), split per class with the seeded permutation."""
    _check_image_size(image_size)
    if channels not in (1, 3):
        raise LayerwiseError(f"channels must be 1 (grayscale) or 3 (RGB) (got {channels})")
    folder = _source_folder(source, _FOLDER_FIX)
    names, files, labels = _image_files(folder)
    train, val = split_indices(labels, val_fraction, seed)  # checked before the slow part
    _check_memory(len(files), channels, image_size)
    images = np.empty((len(files), channels, image_size, image_size), dtype=np.float32)
    for index, path in enumerate(files):
        images[index] = _read_image(path, "RGB" if channels == 3 else "L", image_size)
    return _write_prepared(out_dir, (images[train], labels[train]), (images[val], labels[val]), {
        "dataset": "imagefolder", "source": str(folder), "class_names": names, "seed": seed,
        "val_fraction": val_fraction})


def _size(params: dict) -> InputSize | None:
    """`image_size`: a side for every spatial dim, or a list of sizes (None: npyfolder's
    samples as they are)."""
    value = params.get("image_size", None if params.get("dataset") == "npyfolder" else 32)
    if value is None:
        return None
    if isinstance(value, str) and "," in value:
        value = value.split(",")
    if isinstance(value, list | tuple):
        try:
            return tuple(int(side) for side in value)
        except (TypeError, ValueError):
            raise LayerwiseError(f"prepare.image_size: {shown(value)} is not a list of "
                                 "numbers") from None
    return _number(params, "image_size", int, 32)


def _number(params: dict, key: str, kind: type[int] | type[float], default: float) -> Any:
    value = params.get(key, default)
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise LayerwiseError(f"prepare.{key}: {shown(value)} is not a number") from None


def settings_from(params: dict) -> PrepareSettings:
    """Typed settings from a `prepare` section; the output defaults to data/prepared/DATASET."""
    dataset = params.get("dataset", "digits")
    if dataset not in SOURCES:
        raise LayerwiseError(f"prepare.dataset: unknown dataset {shown(dataset)}; "
                             f"available: {', '.join(SOURCES)}")
    source, channels = params.get("source"), params.get("channels")
    settings = PrepareSettings(
        dataset=dataset, source=None if source is None else Path(str(source)).expanduser(),
        image_size=_size(params),
        channels=None if channels is None else _number(params, "channels", int, 3),
        val_fraction=_number(params, "val_fraction", float, 0.2),
        seed=_number(params, "seed", int, 0),
        out=Path(str(params.get("out") or PREPARED_DIR / dataset)),
        images=_number(params, "images", int, DEFAULT_FIELD_IMAGES))
    _check_settings(settings)
    return settings


def _check_settings(settings: PrepareSettings) -> None:
    """What is wrong before anything is read: channels a source cannot give, an output folder
    that training would read as another built-in dataset."""
    if not 0 <= settings.seed < 2**63:
        raise LayerwiseError(f"prepare.seed: numpy's generator takes 0 <= seed < 2^63 (got "
                             f"{settings.seed})")
    creatable_folder(settings.out, "prepare.out")
    fixed = FIXED_CHANNELS.get(settings.dataset)
    if settings.channels is not None and fixed is not None and settings.channels != fixed:
        raise LayerwiseError(f"prepare.channels: {settings.dataset} has {fixed} channel(s); "
                             "channels applies to imagefolder")
    if settings.out.name in SOURCES and settings.out.name != settings.dataset:
        raise LayerwiseError(f"prepare.out: training reads {settings.out} as the "
                             f"{settings.out.name} dataset; write {settings.dataset} to "
                             f"{settings.out.parent / settings.dataset}")


def prepare(settings: PrepareSettings) -> dict:
    """Prepare the dataset `settings` names; returns the metadata written to meta.json."""
    if settings.dataset == "digits":
        return prepare_digits(settings.out, _square(settings.image_size),
                              settings.val_fraction, settings.seed)
    if settings.dataset in GENERATED:
        return prepare_fields(settings.out, settings.dataset, settings.image_size or 32,
                              settings.images, settings.val_fraction, settings.seed)
    if settings.source is None:
        raise LayerwiseError(f"{settings.dataset} is read from a local folder; set "
                             "prepare.source in params.yaml or pass --source PATH")
    if settings.dataset == "npyfolder":
        return prepare_npyfolder(settings.source, settings.out, settings.image_size,
                                 settings.channels, settings.val_fraction, settings.seed)
    side = _square(settings.image_size)
    if settings.dataset == "cifar10":
        return prepare_cifar(settings.source, settings.out, side)
    return prepare_imagefolder(settings.source, settings.out, side,
                               settings.channels or 3, settings.val_fraction, settings.seed)


def _square(image_size: InputSize | None) -> int:
    """An image source's side: one number."""
    if isinstance(image_size, int):
        return image_size
    if image_size is None:
        return 32
    raise LayerwiseError(f"prepare.image_size: images are resized to squares, give one side "
                         f"(not {list(image_size)})")


def load_params(path: Path, section: str = SECTION) -> dict:
    """params.yaml's `section` (a data stage's parameters), its keys checked."""
    return stage_sections(path, (section,))[section]


def stage_sections(path: Path, names: tuple[str, ...] | None = None) -> dict[str, dict]:
    """The data stages' sections of params.yaml by name: `names`, else every top-level
    section starting with `prepare`."""
    if not path.exists():
        raise LayerwiseError(f"{path} does not exist; run from the project root")
    params = read_yaml(path, str(path))
    if not isinstance(params, dict):
        raise LayerwiseError(f"{path}: the top level must be a mapping with a 'prepare' "
                             f"section (got {type(params).__name__})")
    wanted = names if names is not None else tuple(
        name for name in params if isinstance(name, str) and name.startswith(SECTION))
    sections = {}
    for name in wanted:
        section = params.get(name)
        if not isinstance(section, dict):
            raise LayerwiseError(f"{path} has no '{printable(name)}' section")
        unknown = sorted(set(section) - set(PARAMETERS))
        if unknown:
            raise LayerwiseError(f"{path}: {printable(name)}.{unknown[0]}: unknown parameter")
        sections[name] = section
    return sections


def _with_overrides(params: dict, args: argparse.Namespace) -> dict:
    """params.yaml's section with the options given on the command line. Another --dataset
    than params.yaml's also moves the default output to data/prepared/DATASET: params.yaml's
    `out` belongs to its own dataset (and so does its image size, which npyfolder, keeping its
    samples' sizes unless --image-size is given, does not take)."""
    given = {key: value for key, value in vars(args).items()
             if key in PARAMETERS and value is not None}
    default = params.get("dataset", "digits")
    if given.get("dataset", default) != default and "out" not in given:
        given["out"] = PREPARED_DIR / given["dataset"]
    if given.get("dataset", default) != default and given["dataset"] == "npyfolder":
        # params.yaml's image size is its own dataset's: npyfolder keeps its samples' sizes
        params = {key: value for key, value in params.items() if key != "image_size"}
    return {**params, **given}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Prepare the dataset params.yaml's `prepare` section names; the options "
                    "override its fields.")
    parser.add_argument("--params", type=Path, default=PARAMS_FILE)
    parser.add_argument("--section", default=SECTION,
                        help="params.yaml's section to read (default prepare; prepare_fields "
                             "for the generated fields)")
    parser.add_argument("--dataset", choices=SOURCES)
    parser.add_argument("--source", help="cifar10: the cifar-10-batches-py folder; "
                                         "imagefolder, npyfolder: ROOT holding one folder "
                                         "per class")
    parser.add_argument("--image-size", help="a side for every spatial dim, or sizes S1,S2,...")
    parser.add_argument("--channels", type=int, help="imagefolder: 3 (RGB, default) or 1; "
                                                     "npyfolder: the arrays' first dim")
    parser.add_argument("--val-fraction", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--images", type=int, help="fields, fields3d, signals: how many to "
                                                   "generate")
    parser.add_argument("--out", help="default: params.yaml's out, data/prepared/DATASET for "
                                      "another --dataset")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = settings_from(_with_overrides(load_params(args.params, args.section), args))
        meta = prepare(settings)
    except LayerwiseError as error:
        print(f"error: {printable(str(error))}", file=sys.stderr)
        return error.exit_code
    size = meta["image_size"]
    shown_size = "x".join(map(str, size)) if isinstance(size, list) else f"{size}x{size}"
    print(f"prepared {meta['dataset']}: {meta['train']} train / {meta['val']} validation "
          f"samples at {shown_size}, {meta['channels']} channel(s), {meta['classes']} classes "
          f"in {settings.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
