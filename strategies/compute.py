"""Where t_c of Jia et al. 2018, Eq. 1 comes from: a roofline on the cluster's device or a
measured profile.

t_c(l, c) is the compute one training step spends on the layer's largest tile (devices run
their tiles at once): its forward + backward and the SGD update of its weight shard (the
paper's t_c leaves the update out; ParaDL counts it as WU_l, and a data-parallel device
updates every weight: ~30% of AlexNet's step on a CPU).

A source answers for one tile (the oracle asks for whole layers) and for every config of a
layer's search space at once (the cost model's node vectors). Each answers the second in its
own way: the roofline needs only the tiles' element counts, which come vectorised from
per-dimension lengths; a profile is looked up tile by tile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from strategies.cluster import Cluster
from strategies.graph import BYTES_PER_ELEMENT, Layer
from strategies.space import ParallelConfig
from strategies.tiles import TileWork

if TYPE_CHECKING:
    from strategies.cost_tables import LayerTiles
    from strategies.profile import Profile


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


# A memory-bound SGD-with-momentum update reads weight, gradient and momentum and writes weight
# and momentum (weight decay reuses the weight it reads).
WEIGHT_UPDATE_ACCESSES = 5


def weight_update_seconds(weights: int | np.ndarray, memory_bandwidth: float,
                          ) -> float | np.ndarray:
    """The update of `weights` elements on the roofline: memory-bound,
    WEIGHT_UPDATE_ACCESSES * 4 bytes per weight / memory bandwidth (ParaDL's WU_l)."""
    return WEIGHT_UPDATE_ACCESSES * BYTES_PER_ELEMENT * weights / memory_bandwidth


class AnalyticCompute:
    """Roofline t_c on the cluster's device: max(FLOPs / (peak * efficiency), bytes / memory BW).

    Backward costs about twice the forward for layers with weights (input and weight
    gradients) and about the forward for the others; every tensor is read or written once
    per pass.
    """

    name = "analytic"
    by_layer_name = False

    def __init__(self, cluster: Cluster) -> None:
        self.flops_per_second = cluster.device.peak_flops_fp32 * cluster.compute_efficiency
        self.bytes_per_second = cluster.device.memory_bandwidth

    def tile_seconds(self, layer: Layer, tile: TileWork) -> float:
        return float(self.volume_seconds(
            layer, np.int64(math.prod(tile.output_shape)),
            np.int64(sum(math.prod(s) for s in tile.input_shapes)),
            np.int64(tile.param_elements)))

    def update_seconds(self, layer: Layer, tile: TileWork) -> float:
        return float(weight_update_seconds(tile.param_elements, self.bytes_per_second))

    def configs_seconds(self, layer: Layer, tiles: LayerTiles,
                        configs: Sequence[ParallelConfig]) -> np.ndarray:
        volumes = tiles.volumes(configs)
        return self.volume_seconds(layer, volumes.output, volumes.inputs, volumes.params)

    def configs_update_seconds(self, layer: Layer, tiles: LayerTiles,
                               configs: Sequence[ParallelConfig]) -> np.ndarray:
        return np.asarray(weight_update_seconds(tiles.volumes(configs).params,
                                                self.bytes_per_second), dtype=float)

    def volume_seconds(self, layer: Layer, out_elements: np.ndarray, input_elements: np.ndarray,
                       param_elements: np.ndarray) -> np.ndarray:
        """The roofline from element counts alone (arrays: one entry per tile)."""
        if layer.kind == "input":
            return np.zeros(np.shape(out_elements))
        fraction = out_elements / math.prod(layer.output_shape)
        passes = 3.0 if layer.param_count else 2.0
        flops = layer.flops * fraction * passes
        memory = (out_elements + input_elements + param_elements) * BYTES_PER_ELEMENT * passes
        return np.maximum(flops / self.flops_per_second, memory / self.bytes_per_second)


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
