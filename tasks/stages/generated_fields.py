"""Generated datasets of the DVC data stages: Gaussian random fields in one, two or three
dimensions, the class being the slope of their power spectrum.

- fields (2-d, `prepare_fields`): high-resolution images, standing in for the density maps
  CosmoFlow reads cosmological parameters from (Mathuriya et al. 2018).
- fields3d (3-d, `prepare_fields3d`): volumes, CosmoFlow's own setting (it reads them from
  128^3 dark-matter volumes), the workload where one sample fills a device.
- signals (1-d, `prepare_signals`): coloured noise, the power falling as f^-alpha (alpha 1:
  pink, 2.5 and 4: ever browner), a raw-waveform classification task as M5 takes one.

Every field is white noise coloured in Fourier space by amplitude k^(-alpha/2), the mean (k = 0)
removed, and scaled to zero mean and unit variance, so the class lives only in the field's
spatial correlation (a steep spectrum is smooth, a flat one rough), which a convolution measures
in any window: that is why it is learnable, and learnable from a split field too. The same seed
gives the same bytes.
"""

from __future__ import annotations

import numpy as np

FIELD_SLOPES = (1.0, 2.5, 4.0)  # the spectral indices alpha, one class each


def gaussian_fields(count: int, sizes: tuple[int, ...], seed: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """`count` fields of shape `sizes` (one channel) with balanced classes, and their labels.

    The frequency grid is numpy's rfftn layout: full frequencies along every dim but the last,
    the non-negative ones along it; its magnitude |k| colours the noise."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count, dtype=np.int64) % len(FIELD_SLOPES)
    rng.shuffle(labels)
    axes = [np.fft.fftfreq(size) for size in sizes[:-1]] + [np.fft.rfftfreq(sizes[-1])]
    grids = np.meshgrid(*axes, indexing="ij")
    squares = grids[0] ** 2
    for grid in grids[1:]:
        squares = squares + grid ** 2
    frequency = np.sqrt(squares)
    frequency[(0,) * len(sizes)] = np.inf  # amplitude 0: no mean
    fields = np.empty((count, 1, *sizes), dtype=np.float32)
    shape = frequency.shape
    for index, label in enumerate(labels):
        noise = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        field = np.fft.irfftn(noise * frequency ** (-FIELD_SLOPES[label] / 2), s=sizes,
                              axes=tuple(range(len(sizes))))
        fields[index, 0] = (field - field.mean()) / field.std()
    return fields, labels


def class_names() -> list[str]:
    return [f"alpha={slope:g}" for slope in FIELD_SLOPES]
