"""Training data for `layerwise train`, and the global batches every rank draws alike.

- digits: scikit-learn's handwritten digits as the DVC `prepare` stage wrote them
  (data/prepared/digits/{train,val}.npz, `tasks/stages/prepare_data.py`): 1 channel, 10
  classes, the image size params.yaml sets.
- fields: generated Gaussian random fields, the class their spectrum's slope, as the DVC
  `prepare_fields` stage wrote them (high resolution: 256x256 by default, 1 channel, 3 classes);
  fields3d and signals: the same in 3-d (32x32x32 volumes, `prepare_fields3d`) and in 1-d
  (4096-sample signals, `prepare_signals`).
- npyfolder: users' own signals and volumes, one .npy array per sample under a folder per class,
  prepared by the same stage's script (`--dataset npyfolder --source ROOT --out
  data/prepared/NAME`).
- cifar10, imagefolder: the same stage's output for a local CIFAR-10 (python version) folder or
  an ImageFolder tree (`python -m layerwise.tasks.stages.prepare_data --dataset NAME --source
  PATH`); and any other folder under data/prepared/ holding a meta.json (`--out
  data/prepared/flowers` trains as `flowers`). A prepared dataset fixes the image size, channels and
  classes (meta.json).
- segments: a generated task with a label per position (`segments.py`), for networks that score
  every position (a U-Net without a pooled head); and any prepared folder whose meta.json says
  `"targets": "positions"` (its y holds a label per position, (N, *spatial)).
- synthetic: a seeded image-classification task at any size, class count and channel count, so
  every zoo model can train anywhere without a download. Each class has one fixed smooth random
  prototype (low-resolution noise upsampled); a sample is its class's prototype shifted by a few
  pixels plus per-pixel noise. Samples are generated from (seed, split, index) when a batch asks
  for them, so a 224-px dataset costs no memory and sample i is the same in every process.

Every rank builds the same global batch (the runtime slices its own tiles), and a resumed run
must see the batches an uninterrupted one would: `GlobalBatches.batch_at(step)` depends only on
the seed and the step (a per-epoch permutation from `default_rng(seed + epoch)`, the last partial
batch dropped).
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from layerwise.strategies.errors import LayerwiseError, shown
from layerwise.strategies.files.documents import read_json
from layerwise.strategies.files.locations import PREPARED_DIR
from layerwise.strategies.hardware.host_memory import check_memory
from layerwise.strategies.model.input_size import InputSize, spatial_size
from layerwise.strategies.runtime.generated import GeneratedSplit
from layerwise.strategies.runtime.segments import (
    SEGMENTS_TRAIN_SAMPLES,
    SEGMENTS_VAL_SAMPLES,
    SegmentsSplit,
    segment_levels,
)

DATASETS: tuple[str, ...] = ("digits", "cifar10", "imagefolder", "fields", "fields3d", "signals",
                             "npyfolder", "synthetic", "segments")
# generated on demand at any input: nothing to prepare
GENERATED_DATASETS = ("synthetic", "segments")
# the datasets params.yaml's sections define, by the DVC stage that prepares each
_STAGES = {"digits": "prepare", "fields": "prepare_fields", "fields3d": "prepare_fields3d",
           "signals": "prepare_signals"}
_SOURCED = ("cifar10", "imagefolder", "npyfolder")  # prepared from a local folder
SYNTHETIC_TRAIN_SAMPLES = 4096
SYNTHETIC_VAL_SAMPLES = 1024
_PROTOTYPE_GRID = 4  # prototypes are 4x4 noise upsampled: smooth, so shifts keep them close
_NOISE = 0.8  # per-pixel noise against prototypes of unit standard deviation


@dataclass(frozen=True)
class ImageSpec:
    """What a prepared dataset fixes about the model's input and output: `image_size` the side
    of a square image, or each spatial dim's size ((L,) of a signal, (D, H, W) of a volume)."""

    image_size: InputSize
    classes: int
    channels: int
    per_position: bool = False  # a label per position (N, *spatial), not per sample (N,)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Each spatial dim's size."""
        return spatial_size(self.image_size, 2)

    @property
    def shown_size(self) -> str:
        return "x".join(map(str, self.sizes))


class Split(Protocol):
    """Samples addressed by index: x float32 (n, C, *spatial), y int64 (n,), or (n, *spatial)
    for a dataset labelled per position."""

    def __len__(self) -> int: ...

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class ArraySplit:
    """A split held in memory (as prepared: digits, cifar10, imagefolder)."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[indices], self.y[indices]


@dataclass(frozen=True)
class SyntheticSplit(GeneratedSplit):
    """Samples generated on demand from the class prototypes and their own seed."""

    prototypes: np.ndarray  # (classes, C, *spatial), zero mean and unit std each

    def _sample(self, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        classes, _, *sizes = self.prototypes.shape
        label = int(rng.integers(classes))
        if len(sizes) == 2:  # as every 2-d dataset has always drawn it
            reach = max(1, sizes[0] // 8)
            shift = tuple(rng.integers(-reach, reach + 1, size=2))
        else:
            shift = tuple(int(rng.integers(-max(1, size // 8), max(1, size // 8) + 1))
                          for size in sizes)
        image = np.roll(self.prototypes[label], shift, axis=tuple(range(1, len(sizes) + 1)))
        return image + _NOISE * rng.standard_normal(image.shape, dtype=np.float32), label


@dataclass(frozen=True)
class Dataset:
    name: str
    spec: ImageSpec
    train: Split
    val: Split


def prepared_spec(name: str, root: Path = PREPARED_DIR) -> ImageSpec | None:
    """The input a prepared dataset fixes (None for the generated ones, which fit any model)."""
    if name in GENERATED_DATASETS:
        return None
    meta_path = root / name / "meta.json"
    if not meta_path.is_file():
        if name not in DATASETS:
            raise LayerwiseError(f"unknown dataset '{name}'; choose from {', '.join(DATASETS)} "
                                 f"or a folder prepared under {root}")
        raise LayerwiseError(f"the {name} dataset is not prepared ({meta_path} is missing); "
                             f"{_prepare_fix(name)}")
    meta = read_json(meta_path, str(meta_path), fix=f"{_prepare_fix(name)} again")
    try:
        size = meta["image_size"]
        spec = ImageSpec(image_size=int(size) if not isinstance(size, list)
                         else tuple(int(side) for side in size),
                         classes=int(meta["classes"]), channels=int(meta["channels"]),
                         per_position=meta.get("targets") == "positions")
    except (ValueError, KeyError, TypeError) as error:
        raise LayerwiseError(f"cannot read {meta_path} ({type(error).__name__}: "
                             f"{shown(str(error))}); "
                             f"{_prepare_fix(name)} again") from None
    if meta.get("targets", "samples") not in ("samples", "positions"):
        raise LayerwiseError(f"{meta_path} says targets {shown(str(meta['targets']))}: write "
                             "\"samples\" (a label per sample, y (N,)) or \"positions\" (a "
                             "label per position, y (N, *spatial))")
    if spec.classes < 2:
        raise LayerwiseError(f"the {name} dataset has {spec.classes} class(es) ({meta_path}): "
                             f"a classifier needs 2 or more; {_prepare_fix(name)} from a source "
                             "with more classes")
    return spec


PREPARE_MODULE = "layerwise.tasks.stages.prepare_data"  # the DVC stage's script


def _prepare_fix(name: str, options: str = "") -> str:
    """The command that (re)builds prepared dataset `name`, with extra `options`: digits and
    fields come from params.yaml, the others from a local source folder."""
    if name in _STAGES:
        stage = _STAGES[name]
        section = "" if stage == "prepare" else f" --section {stage}"
        return (f"run `dvc repro {stage}` (or `python -m {PREPARE_MODULE}{section}`) from the "
                "project root")
    command = (f"--dataset {name} --source PATH" if name in _SOURCED
               else f"--dataset cifar10|imagefolder --source PATH --out {PREPARED_DIR / name}")
    return f"run `python -m {PREPARE_MODULE} {command}{options}` from the project root"


def _resize_fix(name: str, image_size: InputSize) -> str:
    if name in _STAGES:
        value = image_size if isinstance(image_size, int) else list(image_size)
        return f"set {_STAGES[name]}.image_size: {value} in params.yaml and {_prepare_fix(name)}"
    value = image_size if isinstance(image_size, int) else ",".join(map(str, image_size))
    return _prepare_fix(name, f" --image-size {value}")


def labels_positions(name: str, root: Path = PREPARED_DIR) -> bool:
    """Whether dataset `name` labels every position of a sample rather than the sample (the
    stages' and sourced datasets label samples: known before they are prepared)."""
    if name in GENERATED_DATASETS:
        return name == "segments"
    if name in _STAGES or name in _SOURCED:
        return False
    fixed = prepared_spec(name, root)
    return fixed is not None and fixed.per_position


def load_dataset(name: str, image_size: InputSize, num_classes: int, in_channels: int, seed: int,
                 root: Path = PREPARED_DIR) -> Dataset:
    """The train and validation splits of `name` for a model with this input and class count."""
    wanted = ImageSpec(image_size=image_size, classes=num_classes, channels=in_channels)
    fixed = prepared_spec(name, root)
    if name == "segments":
        levels = segment_levels(num_classes, in_channels, seed)
        sizes = wanted.sizes
        return Dataset(name=name, spec=ImageSpec(image_size=image_size, classes=num_classes,
                                                 channels=in_channels, per_position=True),
                       train=SegmentsSplit(SEGMENTS_TRAIN_SAMPLES, seed, 0, levels, sizes),
                       val=SegmentsSplit(SEGMENTS_VAL_SAMPLES, seed, 1, levels, sizes))
    if fixed is None:
        prototypes = synthetic_prototypes(wanted, seed)
        return Dataset(name=name, spec=wanted,
                       train=SyntheticSplit(SYNTHETIC_TRAIN_SAMPLES, seed, 0, prototypes),
                       val=SyntheticSplit(SYNTHETIC_VAL_SAMPLES, seed, 1, prototypes))
    _check_fits(name, fixed, wanted)
    folder = root / name
    return Dataset(name=name, spec=fixed, train=_load_npz(folder / "train.npz", name, fixed),
                   val=_load_npz(folder / "val.npz", name, fixed))


def _check_fits(name: str, fixed: ImageSpec, wanted: ImageSpec) -> None:
    if fixed.channels != wanted.channels:
        raise LayerwiseError(f"{name} images have {fixed.channels} channel(s) but the model takes "
                             f"{wanted.channels}; pass --in-channels {fixed.channels}")
    if fixed.sizes != wanted.sizes:
        given = (f"--image-size {fixed.image_size}" if isinstance(fixed.image_size, int)
                 else f"--input-shape {','.join(map(str, (fixed.channels, *fixed.sizes)))}")
        raise LayerwiseError(
            f"{name} was prepared at {fixed.shown_size} but the model takes "
            f"{wanted.shown_size}; pass {given}, or {_resize_fix(name, wanted.image_size)}")
    if fixed.classes != wanted.classes:
        raise LayerwiseError(f"{name} has {fixed.classes} classes but the model outputs "
                             f"{wanted.classes}; pass --classes {fixed.classes}")


def _load_npz(path: Path, name: str, spec: ImageSpec) -> ArraySplit:
    """A prepared split: images x (N, C, *spatial) and labels y (N,) of meta.json's classes
    ((N, *spatial) for one labelled per position), both numbers, checked from the arrays'
    headers (shapes, types, the memory they take) before they are read."""
    fix = f"{_prepare_fix(name)} again"
    if not path.is_file():
        raise LayerwiseError(f"{path} is missing; {_prepare_fix(name)}")
    try:
        with np.load(path) as arrays:  # never unpickles: allow_pickle is off
            x_shape, x_type = _npy_header(arrays.zip, "x.npy")
            y_shape, y_type = _npy_header(arrays.zip, "y.npy")
            expected = (spec.channels, *spec.sizes)
            labels_shape = (*x_shape[:1], *(spec.sizes if spec.per_position else ()))
            if x_type.kind not in "uif" or y_type.kind not in "ui":
                raise LayerwiseError(f"{path} holds {x_type} images and {y_type} labels, not "
                                     f"numbers; {fix}")
            if (len(x_shape) != len(expected) + 1 or tuple(x_shape[1:]) != expected
                    or tuple(y_shape) != labels_shape):
                wanted_labels = ", ".join(("N", *map(str, labels_shape[1:])))
                raise LayerwiseError(f"{path} holds images {x_shape} and labels {y_shape}, "
                                     f"not (N, {', '.join(map(str, expected))}) and "
                                     f"({wanted_labels}{',' if len(labels_shape) == 1 else ''}) "
                                     f"as meta.json says; {fix}")
            check_memory(math.prod(x_shape) * (x_type.itemsize + 4)
                         + math.prod(y_shape) * (y_type.itemsize + 8), f"loading {path}", fix)
            labels = arrays["y"].astype(np.int64)
            if labels.size and not 0 <= labels.min() <= labels.max() < spec.classes:
                raise LayerwiseError(f"{path} has labels {labels.min()}..{labels.max()}, outside "
                                     f"the {spec.classes} classes of meta.json; {fix}")
            return ArraySplit(x=arrays["x"].astype(np.float32), y=labels)
    except LayerwiseError:
        raise
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as problem:
        first = (str(problem).strip().splitlines() or [""])[0]
        raise LayerwiseError(f"{path} cannot be read ({type(problem).__name__}: "
                             f"{shown(first, 100)}); {fix}") from None


def _npy_header(archive: zipfile.ZipFile, member: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of one array of an .npz archive, from its header alone."""
    with archive.open(member) as stream:
        version = np.lib.format.read_magic(stream)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(stream)
    return tuple(shape), dtype


def synthetic_prototypes(spec: ImageSpec, seed: int) -> np.ndarray:
    """One smooth random image (signal, volume) per class, each with zero mean and unit
    standard deviation: coarse noise interpolated up (bicubic for images, linear along each
    dim of signals and volumes)."""
    rng = np.random.default_rng([seed, 2])
    sizes = spec.sizes
    grid = tuple(min(_PROTOTYPE_GRID, size) for size in sizes)
    coarse = torch.from_numpy(rng.standard_normal((spec.classes, spec.channels, *grid)))
    mode = {1: "linear", 2: "bicubic", 3: "trilinear"}[len(sizes)]
    smooth = F.interpolate(coarse, size=sizes, mode=mode, align_corners=False).numpy()
    axes = tuple(range(1, len(sizes) + 2))
    centred = smooth - smooth.mean(axis=axes, keepdims=True)
    scaled = centred / np.maximum(centred.std(axis=axes, keepdims=True), 1e-6)
    return scaled.astype(np.float32)


@dataclass(frozen=True)
class GlobalBatches:
    """The global batch of every step: the same on every rank and across a resume."""

    split: Split
    batch: int
    seed: int

    def __post_init__(self) -> None:
        if len(self.split) < self.batch:
            raise LayerwiseError(
                f"the training split has {len(self.split)} samples, fewer than the global batch "
                f"of {self.batch}; use a smaller --batch-per-device or fewer processes")

    @property
    def steps_per_epoch(self) -> int:
        return len(self.split) // self.batch

    def indices_at(self, step: int) -> np.ndarray:
        """Sample indices of step `step` (1-based, as RunResult numbers steps)."""
        epoch, position = divmod(step - 1, self.steps_per_epoch)
        order = np.random.default_rng(self.seed + epoch).permutation(len(self.split))
        return order[position * self.batch:(position + 1) * self.batch]

    def batch_at(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        return self.split.take(self.indices_at(step))
