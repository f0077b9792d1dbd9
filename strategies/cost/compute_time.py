"""Where t_c of Jia et al. 2018, Eq. 1 comes from: the cluster's device (its device model,
device_model.py, or a roofline where the device has no SM figures) or a measured profile.

t_c(l, c) is the compute one training step spends on the layer's largest tile (devices run
their tiles at once): its forward + backward and the SGD update of its weight shard (the
paper's t_c leaves the update out; ParaDL counts it as WU_l, and a data-parallel device
updates every weight: ~30% of AlexNet's step on a CPU).

A source answers for one tile (the oracle asks for whole layers) and for every config of a
layer's search space at once (the cost model's node vectors). Each answers the second in its
own way: the device model needs only the tiles' element and channel counts, which come
vectorised from per-dimension lengths; a profile is looked up tile by tile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from layerwise.strategies.hardware.cluster import Cluster
from layerwise.strategies.hardware.device_model import DeviceModel
from layerwise.strategies.model.graph import BYTES_PER_ELEMENT, Layer
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.model.tiles import TileWork, as_view

if TYPE_CHECKING:
    from layerwise.strategies.cost.profile import Profile
    from layerwise.strategies.cost.tables import LayerTiles


class ComputeSource(Protocol):
    """What the cost model needs of a source of t_c."""

    name: str
    # True when t_c is looked up by layer name (layers of equal structure may differ); False
    # when it follows from the structure alone, so equal layers share one node vector
    by_layer_name: bool

    def tile_seconds(self, layer: Layer, tile: TileWork) -> float:
        """Forward + backward of the tile."""
        ...

    def update_seconds(self, layer: Layer, tile: TileWork) -> float:
        """The SGD update of the tile's weight shard (0 without weights)."""
        ...

    def configs_seconds(self, layer: Layer, tiles: LayerTiles,
                        configs: Sequence[ParallelConfig]) -> np.ndarray:
        """Forward + backward of each config's largest tile."""
        ...

    def configs_update_seconds(self, layer: Layer, tiles: LayerTiles,
                               configs: Sequence[ParallelConfig]) -> np.ndarray:
        """The SGD update of each config's largest weight shard."""
        ...

    def configs_forward_seconds(self, layer: Layer, tiles: LayerTiles,
                                configs: Sequence[ParallelConfig]) -> np.ndarray:
        """The forward alone of each config's largest tile (a recomputed layer's extra)."""
        ...


# A memory-bound SGD-with-momentum update reads weight, gradient and momentum and writes weight
# and momentum (weight decay reuses the weight it reads).
WEIGHT_UPDATE_ACCESSES = 5


def weight_update_seconds(weights: int | np.ndarray, memory_bandwidth: float,
                          ) -> float | np.ndarray:
    """The update of `weights` elements on the roofline: memory-bound,
    WEIGHT_UPDATE_ACCESSES * 4 bytes per weight / memory bandwidth (ParaDL's WU_l)."""
    return WEIGHT_UPDATE_ACCESSES * BYTES_PER_ELEMENT * weights / memory_bandwidth


class AnalyticCompute:
    """t_c on the cluster's device, from the layer's structure alone.

    On a GPU preset (the device has `multiprocessors` and `kernel_latency`) the device model
    of device_model.py: kernels in waves over the SMs, a launch latency per kernel,
    memory-bound ops at memory bandwidth. Without those figures (a CPU, a calibrated cluster)
    a roofline: max(FLOPs / (peak * efficiency), bytes / memory BW), backward about twice the
    forward for layers with weights (input and weight gradients) and about the forward for the
    others, every tensor read or written once per pass.
    """

    name = "analytic"
    by_layer_name = False

    def __init__(self, cluster: Cluster) -> None:
        device = cluster.device
        self.flops_per_second = device.peak_flops_fp32 * cluster.compute_efficiency
        self.bytes_per_second = device.memory_bandwidth
        self.device_model = (
            DeviceModel(device.multiprocessors, self.flops_per_second, self.bytes_per_second,
                        device.kernel_latency or 0.0, split_k=device.gemm_split_k,
                        host_layer_seconds=device.host_layer_seconds or 0.0,
                        host_op_seconds=device.host_op_seconds or 0.0)
            if device.multiprocessors is not None else None)

    def tile_seconds(self, layer: Layer, tile: TileWork) -> float:
        return float(self.volume_seconds(
            layer, np.int64(math.prod(tile.output_shape)),
            np.int64(as_view(tile.output_shape)[1]),
            np.int64(sum(math.prod(s) for s in tile.input_shapes)),
            np.int64(tile.param_elements)))

    def update_seconds(self, layer: Layer, tile: TileWork) -> float:
        return float(self.weight_update(layer, np.int64(tile.param_elements)))

    def configs_seconds(self, layer: Layer, tiles: LayerTiles,
                        configs: Sequence[ParallelConfig]) -> np.ndarray:
        volumes = tiles.volumes(configs)
        return self.volume_seconds(layer, volumes.output, tile_channels(layer, configs),
                                   volumes.inputs, volumes.params)

    def configs_update_seconds(self, layer: Layer, tiles: LayerTiles,
                               configs: Sequence[ParallelConfig]) -> np.ndarray:
        return np.asarray(self.weight_update(layer, tiles.volumes(configs).params), dtype=float)

    def configs_forward_seconds(self, layer: Layer, tiles: LayerTiles,
                                configs: Sequence[ParallelConfig]) -> np.ndarray:
        """One of the roofline's passes (`passes`)."""
        return self.configs_seconds(layer, tiles, configs) / passes(layer)

    def weight_update(self, layer: Layer, param_elements: np.ndarray) -> np.ndarray:
        """The SGD update of shards of `param_elements` weights (one entry per tile)."""
        seconds = weight_update_seconds(param_elements, self.bytes_per_second)
        if self.device_model is None:
            return np.asarray(seconds)
        return self.device_model.update_seconds(
            layer, np.asarray(seconds) * self.bytes_per_second, param_elements)

    def volume_seconds(self, layer: Layer, out_elements: np.ndarray, out_channels: np.ndarray,
                       input_elements: np.ndarray, param_elements: np.ndarray) -> np.ndarray:
        """Forward + backward from element counts alone (arrays: one entry per tile)."""
        if self.device_model is not None:
            return self.device_model.pass_seconds(layer, out_elements, out_channels,
                                                  input_elements, param_elements)
        if layer.kind == "input":
            return np.zeros(np.shape(out_elements))
        fraction = out_elements / math.prod(layer.output_shape)
        flops = layer.flops * fraction * passes(layer)
        memory = ((out_elements + input_elements + param_elements) * BYTES_PER_ELEMENT
                  * passes(layer))
        return np.maximum(flops / self.flops_per_second, memory / self.bytes_per_second)


def passes(layer: Layer) -> float:
    """A tile's forward + backward in forwards: three for a layer with weights (its backward
    takes the gradients of both the input and the weights, each about a forward's work), two
    for one without (the input's gradient alone)."""
    return 3.0 if layer.param_count else 2.0


def tile_channels(layer: Layer, configs: Sequence[ParallelConfig]) -> np.ndarray:
    """Output channels of each config's largest tile: ceil(C / c)."""
    channels = as_view(layer.output_shape)[1]
    degrees = np.fromiter((config.c for config in configs), dtype=np.int64, count=len(configs))
    return -(-channels // degrees)


class ProfiledCompute:
    """t_c measured by `layerwise profile`: the tile's median forward + backward time and
    median weight update, measured per layer by name."""

    name = "profile"
    by_layer_name = True

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    def tile_seconds(self, layer: Layer, tile: TileWork) -> float:
        if layer.kind == "input":
            return 0.0
        return self.profile.tile_seconds(layer.name, tile.key)

    def update_seconds(self, layer: Layer, tile: TileWork) -> float:
        if layer.kind == "input":
            return 0.0
        return self.profile.tile_update_seconds(layer.name, tile.key)

    def configs_seconds(self, layer: Layer, tiles: LayerTiles,
                        configs: Sequence[ParallelConfig]) -> np.ndarray:
        return np.array([self.tile_seconds(layer, tiles.largest(config)) for config in configs])

    def configs_update_seconds(self, layer: Layer, tiles: LayerTiles,
                               configs: Sequence[ParallelConfig]) -> np.ndarray:
        return np.array([self.update_seconds(layer, tiles.largest(config))
                         for config in configs])

    def configs_forward_seconds(self, layer: Layer, tiles: LayerTiles,
                                configs: Sequence[ParallelConfig]) -> np.ndarray:
        """The measured forward; a profile from before forwards were recorded gives one of
        the roofline's passes of the measured forward + backward instead."""
        forwards = []
        for config in configs:
            tile = tiles.largest(config)
            measured = (self.profile.tile_forward_seconds(layer.name, tile.key)
                        if layer.kind != "input" else 0.0)
            forwards.append(measured if measured is not None
                            else self.tile_seconds(layer, tile) / passes(layer))
        return np.array(forwards)
