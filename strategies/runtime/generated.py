"""Splits generated on demand: each sample from (seed, split, index) alone, so any input size
costs no memory and sample i is the same in every process (synthetic, segments)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GeneratedSplit:
    """`count` samples, sample i drawn by `_sample` from its own generator."""

    count: int
    seed: int
    stream: int  # 0 train, 1 validation: disjoint sample seeds

    def __len__(self) -> int:
        return self.count

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x (n, C, *spatial) float32 and y int64: (n,), or (n, *spatial) per position."""
        samples = [self._sample(np.random.default_rng([self.seed, self.stream, int(index)]))
                   for index in indices]
        return (np.stack([x for x, _ in samples]),
                np.stack([np.asarray(y, dtype=np.int64) for _, y in samples]))

    def _sample(self, rng: np.random.Generator) -> tuple[np.ndarray, int | np.ndarray]:
        raise NotImplementedError
