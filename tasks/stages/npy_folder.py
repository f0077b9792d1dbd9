"""Users' own signals and volumes: ROOT/<class>/<name>.npy, as ImageFolder arranges images.

    python -m layerwise.tasks.stages.prepare_data --dataset npyfolder --source ~/data/scans \
        --out data/prepared/scans

Each file holds one sample: an array of its spatial sizes ((L,), (H, W) or (D, H, W): one
channel) or with its channels first ((C, L), (C, H, W), (C, D, H, W)); every file of the tree
has one shape. The class index follows the sorted folder names, as torchvision's ImageFolder
does. `--image-size` resizes every sample (linear along each dim) to a side for every spatial
dim, or to the sizes given as `S1,S2,...`. The arrays are read without unpickling (numpy's
allow_pickle stays off) and their headers are checked before any sample is loaded.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.hardware.host_memory import check_memory
from layerwise.strategies.model.input_size import InputSize, spatial_size

NPY_FIX = "arrange --source as ROOT/<class name>/<sample>.npy, one array per sample"
_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _files(folder: Path) -> tuple[list[str], list[Path], np.ndarray]:
    """Class names (sorted folder names), every .npy file and its class index."""
    names = sorted(entry.name for entry in folder.iterdir() if entry.is_dir())
    files, labels = [], []
    for index, name in enumerate(names):
        found = sorted(path for path in (folder / name).iterdir()
                       if path.is_file() and path.suffix.lower() == ".npy")
        files += found
        labels += [index] * len(found)
    if len(names) < 2 or not files:
        raise LayerwiseError(f"{folder} holds {len(files)} .npy file(s) in {len(names)} class "
                             f"folder(s); a classifier needs two classes or more: {NPY_FIX}")
    return names, files, np.array(labels, dtype=np.int64)


def _header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a .npy file from its header alone."""
    try:
        with path.open("rb") as stream:
            version = np.lib.format.read_magic(stream)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read(stream)
    except (OSError, ValueError) as problem:
        raise LayerwiseError(f"cannot read {path} as a .npy array ({problem}); replace or "
                             "remove it") from None
    if dtype.kind not in "uif" or not 1 <= len(shape) <= 4:
        raise LayerwiseError(f"{path} holds a {dtype} array of shape {shape}, not a signal, "
                             f"image or volume of numbers; {NPY_FIX}")
    return tuple(shape), dtype


def _sample_shape(files: list[Path], channels: int | None) -> tuple[int, tuple[int, ...]]:
    """(channels, spatial sizes) every file shares: a 4-d array, or one of 2 or 3 dims when
    `channels` says its first dim is the channels, has its channels first; else one channel."""
    shapes = {path: _header(path)[0] for path in files}
    first = files[0]
    shape = shapes[first]
    different = next((path for path in files if shapes[path] != shape), None)
    if different is not None:
        raise LayerwiseError(f"{different} has shape {shapes[different]} but {first} has "
                             f"{shape}: every sample must have one shape (resize them first)")
    if len(shape) == 4 or (channels is not None and len(shape) > 1):
        if channels is not None and channels != shape[0]:
            raise LayerwiseError(f"--channels {channels}, but the arrays' first dim is "
                                 f"{shape[0]} ({first}: {shape})")
        return shape[0], shape[1:]
    return 1, shape


def prepare_arrays(source: Path, image_size: InputSize | None, channels: int | None
                   ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Class names, float32 samples (N, C, *spatial) and labels of a .npy class tree."""
    names, files, labels = _files(source)
    count, sizes = _sample_shape(files, channels)
    target = sizes if image_size is None else spatial_size(image_size, len(sizes))
    if len(target) != len(sizes):
        raise LayerwiseError(f"--image-size {image_size} gives {len(target)} sizes for samples "
                             f"of {len(sizes)} spatial dims {sizes}")
    check_memory(len(files) * count * math.prod(target) * 4,
                 f"{len(files):,} samples of {count}x{'x'.join(map(str, target))}",
                 "use fewer samples or a smaller --image-size")
    samples = np.empty((len(files), count, *target), dtype=np.float32)
    for index, path in enumerate(files):
        array = np.load(path, allow_pickle=False).astype(np.float32).reshape(count, *sizes)
        if target != sizes:
            array = F.interpolate(torch.from_numpy(array)[None], size=target,
                                  mode=_MODES[len(sizes)], align_corners=False)[0].numpy()
        samples[index] = array
    return names, samples, labels
