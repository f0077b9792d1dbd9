"""The strategies layer-wise parallelism is compared with, in the same representation.

Each names a preferred split dimension per kind of layer and gives it as many devices as the
dimension allows (a power of two, at most the device count), starting at device 0:
- data: every layer split along samples;
- model: every layer split along channels (its parameters sharded over all devices); layers
  without channels (flatten) and the network input stay sample-split;
- owt (Krizhevsky 2014): conv/pool layers split along samples, fully connected layers along
  channels;
- spatial_h / spatial_w: layers with spatial dims split along height / width (a 1-d layer's
  length is its w), 2-d layers along samples;
- spatial: layers with spatial dims split along all of them at once, each doubling going to the
  dim whose tiles are then the longest (a 3-d layer's depth, height and width; a 2-d layer's
  height and width), 2-d layers along samples.
"""

from __future__ import annotations

import math

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.graph import Layer, LayerGraph
from layerwise.strategies.model.space import (
    DIMS,
    ParallelConfig,
    dim_sizes,
    max_degree,
    parallel_dims,
)

BASELINES: tuple[str, ...] = ("data", "model", "owt", "spatial_h", "spatial_w", "spatial")
_SPATIAL = ("d", "h", "w")


def _preferred_dim(strategy: str, layer: Layer) -> str:
    dims = parallel_dims(layer)
    two_d = len(layer.output_shape) == 2
    if strategy == "data" or layer.kind == "input" and strategy == "model":
        wanted = "n"
    elif strategy == "model":
        wanted = "c"
    elif strategy == "owt":
        wanted = "c" if two_d else "n"
    elif strategy in ("spatial_h", "spatial_w", "spatial"):
        wanted = strategy[-1] if not two_d else "n"
    else:
        raise ConfigError(f"unknown baseline '{strategy}'; choose from {', '.join(BASELINES)}")
    return wanted if wanted in dims else "n"


def baseline(strategy: str, graph: LayerGraph, devices: int) -> dict[str, ParallelConfig]:
    """One config per layer for the named baseline on `devices` devices."""
    assignment = {}
    for layer in graph.layers:
        spread = [dim for dim in _SPATIAL if dim in parallel_dims(layer)]
        if strategy == "spatial" and spread:
            degrees = _spread(layer, spread, devices)
        else:
            dim = _preferred_dim(strategy, layer)
            limit = min(devices, max_degree(layer, dim))
            degree = 1 << (limit.bit_length() - 1)
            degrees = {name: degree if name == dim else 1 for name in DIMS}
        size = math.prod(degrees.values())
        assignment[layer.name] = ParallelConfig(**degrees, devices=tuple(range(size)))
    return assignment


def _spread(layer: Layer, dims: list[str], devices: int) -> dict[str, int]:
    """Degrees along `dims` multiplying to the most devices a power of two allows, each
    doubling given to the dim whose tiles are longest (first in d, h, w order on ties)."""
    degrees = dict.fromkeys(DIMS, 1)
    sizes = dim_sizes(layer)
    while math.prod(degrees.values()) * 2 <= devices:
        open_dims = [dim for dim in dims if degrees[dim] * 2 <= max_degree(layer, dim)]
        if not open_dims:
            break
        longest = max(open_dims, key=lambda dim: sizes[dim] / degrees[dim])
        degrees[longest] *= 2
    return degrees
