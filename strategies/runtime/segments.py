"""segments: a generated task with a label per position, for networks that score every position
(encoder-decoders: a U-Net's voxel scores), at any size, dims, class and channel count.

Class 0 is the background; each sample holds one to three axis-aligned boxes, each of a class
drawn from 1..K-1, a quarter to a half of every side long, later boxes over earlier ones. Every
class has one fixed level per channel (standard normal draws, scaled by `_LEVEL_SCALE`), and a
position's value is its class's level plus unit Gaussian noise per position: a single position
is ambiguous, its neighbourhood is not, so a network must look around (convolutions) and keep
the resolution (a decoder) to label it. Samples are generated from (seed, split, index) when a
batch asks for them, as `synthetic`'s are: any size costs no memory, and sample i is the same in
every process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerwise.strategies.runtime.generated import GeneratedSplit

SEGMENTS_TRAIN_SAMPLES = 2048
SEGMENTS_VAL_SAMPLES = 256
_LEVEL_SCALE = 1.5  # class levels' spread against the noise's unit standard deviation
_MOST_BOXES = 3


def segment_levels(classes: int, channels: int, seed: int) -> np.ndarray:
    """Each class's level per channel, (classes, channels): the same for every split."""
    rng = np.random.default_rng([seed, 3])
    return (_LEVEL_SCALE * rng.standard_normal((classes, channels))).astype(np.float32)


@dataclass(frozen=True)
class SegmentsSplit(GeneratedSplit):
    """Samples each x (C, *sizes) with a label per position y (*sizes)."""

    levels: np.ndarray  # (classes, channels), from `segment_levels`
    sizes: tuple[int, ...]

    def _sample(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        classes = self.levels.shape[0]
        labels = np.zeros(self.sizes, dtype=np.int64)
        for _ in range(int(rng.integers(1, _MOST_BOXES + 1))):
            label = int(rng.integers(1, classes))
            box = []
            for size in self.sizes:
                length = int(rng.integers(max(1, size // 4), max(1, size // 2) + 1))
                start = int(rng.integers(0, size - length + 1))
                box.append(slice(start, start + length))
            labels[tuple(box)] = label
        values = np.moveaxis(self.levels[labels], -1, 0)  # (C, *sizes)
        noise = rng.standard_normal(values.shape, dtype=np.float32)
        return (values + noise).astype(np.float32), labels
