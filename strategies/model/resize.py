"""torch's own interpolation weights along one axis of an upsampling layer (nn.Upsample,
F.interpolate): which input rows each output row reads, with what weight, and the first and
last it reaches. The tile geometry (tiles.needed_range) reads the reach, the tile op
(ops.resize) the taps; both from the weights torch itself computes, so a tile's rows are the
full op's."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F


class ResizeTaps(NamedTuple):
    """Per output row of one axis of an interpolation: the input rows it reads (one list per
    tap) with their weights, and the first and last row it reaches."""

    indices: tuple[tuple[int, ...], ...]
    weights: tuple[tuple[float, ...], ...]
    reach: tuple[tuple[int, ...], tuple[int, ...]]


@functools.lru_cache(maxsize=512)
def resize_taps(in_size: int, out_size: int, mode: str, align_corners: bool | None,
                scale: float | None) -> ResizeTaps:
    """torch's own interpolation weights along one axis: F.interpolate (1-d, the same source
    index rule as 2-d) of the identity's rows, in float64; row o of the result holds the
    weight of every input row for output row o (bilinear and trilinear interpolation are
    linear along each axis in turn). Its nonzero entries are the taps."""
    one_d = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
    basis = torch.eye(in_size, dtype=torch.float64).unsqueeze(0)
    weights = F.interpolate(basis, size=None if scale is not None else out_size,
                            scale_factor=scale, mode=one_d,
                            align_corners=align_corners if one_d == "linear" else None)[0].T
    assert weights.shape[0] == out_size, (weights.shape, out_size)
    nonzero = [torch.nonzero(row).flatten().tolist() for row in weights]
    count = max(len(columns) for columns in nonzero)
    indices = tuple(tuple(columns[min(tap, len(columns) - 1)] for columns in nonzero)
                    for tap in range(count))
    values = tuple(tuple(float(weights[row, columns[tap]]) if tap < len(columns) else 0.0
                         for row, columns in enumerate(nonzero)) for tap in range(count))
    reach = (tuple(columns[0] for columns in nonzero), tuple(columns[-1] for columns in nonzero))
    return ResizeTaps(indices, values, reach)
