"""Which input row each output row of a padding (F.pad, nn.*Pad*d) copies, along one dim.

A padding tile is a gather along each padded dim (ops.pad): output row r copies input row
`source_rows(...)[r]`, or is the constant where that is -1. The same map gives the input rows a
tile needs (tiles.needed_range): from the least to the greatest row it copies, so a tile of
rows at a border reads the rows next to it (replicate, reflect) and a circular one the rows at
the other end too. torch's pad semantics: reflect mirrors about the edge row without repeating
it, circular wraps, a negative pad crops.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

PAD_MODES = ("constant", "replicate", "reflect", "circular")
# how a traced graph names F.pad: the Python function, or the builtin it forwards to
PAD_FUNCTIONS = (F.pad, torch._C._nn.pad)


def source_rows(mode: str, before: int, after: int, size: int, start: int,
                stop: int) -> np.ndarray:
    """The input row of output rows start..stop of a pad by `before` rows ahead of and `after`
    rows behind an input of `size` rows (-1 where a constant pad writes its value)."""
    rows = np.arange(start, stop) - before
    if mode == "constant":
        return np.where((rows >= 0) & (rows < size), rows, -1)
    if mode == "replicate":
        return np.clip(rows, 0, size - 1)
    if mode == "reflect":
        mirrored = np.abs(rows)
        return np.where(mirrored >= size, 2 * (size - 1) - mirrored, mirrored)
    if mode == "circular":  # torch crops first, then wraps what is left
        first, kept = max(-before, 0), size - max(-before, 0) - max(-after, 0)
        return first + (np.arange(start, stop) - max(before, 0)) % kept
    raise ValueError(f"unknown padding mode '{mode}'")


def source_reach(mode: str, before: int, after: int, size: int, start: int,
                 stop: int) -> tuple[int, int]:
    """The input rows output rows start..stop read, first and past the last (at least one row:
    a tile wholly in a constant pad reads the nearest, and ignores it)."""
    rows = source_rows(mode, before, after, size, start, stop)
    inside = rows[rows >= 0]
    if not inside.size:
        nearest = 0 if start < before else size - 1
        return nearest, nearest + 1
    return int(inside.min()), int(inside.max()) + 1
