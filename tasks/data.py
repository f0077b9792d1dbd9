"""Dataset preparation: the `prepare` stage of dvc.yaml.

    python -m tasks.data                      # reads params.yaml, writes data/prepared/
    dvc repro prepare                         # the same, tracked by DVC

scikit-learn ships the UCI handwritten digits (1,797 8x8 grayscale images, 10 classes), so
the real dataset needs no download. They are scaled to [0, 1], resized to the model's input
size, split into train and validation per class with a seeded permutation (so every class keeps
its share), normalised with the training split's mean and standard deviation, and written as
`train.npz` / `val.npz` (x: float32 N x 1 x S x S, y: int64) plus `meta.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from sklearn.datasets import load_digits

from strategies.errors import LayerwiseError
from strategies.files import atomic_path, write_atomic

DIGITS_MAX_VALUE = 16.0  # pixel values of the UCI digits run from 0 to 16


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


def resize(images: np.ndarray, image_size: int) -> np.ndarray:
    """N x H x W images in [0, 1] to N x 1 x S x S with bilinear interpolation."""
    if image_size < 1:
        raise LayerwiseError(f"image_size must be >= 1 (got {image_size})")
    tensor = torch.from_numpy(images.astype(np.float32))[:, None]
    resized = F.interpolate(tensor, size=(image_size, image_size), mode="bilinear",
                            align_corners=False)
    return resized.numpy()


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    with atomic_path(path) as temporary:
        np.savez(temporary, **arrays)


def prepare_digits(out_dir: Path, image_size: int, val_fraction: float, seed: int) -> dict:
    """Write the prepared digits to `out_dir`; returns the metadata written to meta.json."""
    digits = load_digits()
    images = resize(digits.images / DIGITS_MAX_VALUE, image_size)
    labels = digits.target.astype(np.int64)
    train, val = split_indices(labels, val_fraction, seed)
    mean = float(images[train].mean())
    std = float(images[train].std())
    normalised = ((images - mean) / std).astype(np.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    _save_npz(out_dir / "train.npz", x=normalised[train], y=labels[train])
    _save_npz(out_dir / "val.npz", x=normalised[val], y=labels[val])
    meta = {
        "schema_version": 1, "dataset": "digits", "source": "sklearn.datasets.load_digits",
        "image_size": image_size, "channels": 1, "classes": 10, "train": len(train),
        "val": len(val), "seed": seed, "val_fraction": val_fraction, "mean": mean, "std": std,
    }
    write_atomic(out_dir / "meta.json", json.dumps(meta, indent=2) + "\n")
    return meta


def load_params(path: Path) -> dict:
    try:
        params = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LayerwiseError(f"{path} does not exist; run from the project root") from None
    except yaml.YAMLError as error:
        raise LayerwiseError(f"{path} is not valid YAML: {error}".splitlines()[0]) from None
    section = (params or {}).get("prepare")
    if not isinstance(section, dict):
        raise LayerwiseError(f"{path} has no 'prepare' section")
    unknown = sorted(set(section) - {"dataset", "image_size", "val_fraction", "seed", "out"})
    if unknown:
        raise LayerwiseError(f"{path}: prepare.{unknown[0]}: unknown parameter")
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Prepare the dataset named in params.yaml.")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params)
        if params.get("dataset", "digits") != "digits":
            raise LayerwiseError(f"prepare.dataset: unknown dataset {params['dataset']!r}; "
                                 "available: digits")
        meta = prepare_digits(Path(params.get("out", "data/prepared/digits")),
                              int(params.get("image_size", 32)),
                              float(params.get("val_fraction", 0.2)), int(params.get("seed", 0)))
    except LayerwiseError as error:
        print(f"error: {error}")
        return 2
    print(f"prepared digits: {meta['train']} train / {meta['val']} validation images at "
          f"{meta['image_size']}x{meta['image_size']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
