"""Replaying the plain module's fx nodes on one rank's share: what every engine does alike.

Exactness against one device rests on every engine running a node as the plain module does:
the same call for a node (`call_node`), the same BatchNorm rules (`batch_norm_momentum`), and
the same dropout masks drawn in the same order from the same generator (`model_dropouts`,
`draw_masks`: the mask of the whole global batch on every rank, as one device draws it, of
which each rank applies its rows). The layer-wise executor and the schedules' engines import
these instead of each keeping a copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
import torch.fx as fx
from torch import nn

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.fx_nodes import DropUnit, active_dropout
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.model.ops import dropout_mask

BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
INSTANCE_NORMS = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)


class Dropout(NamedTuple):
    """One active dropout of the plain forward: its node, its mask's full shape (the holding
    layer's output at the global batch) and how to draw it."""

    name: str
    shape: tuple[int, ...]
    probability: float
    unit: DropUnit  # what one draw covers: an element, a sample's channel, a sample, the batch


def call_node(node: fx.Node, module: nn.Module | None, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> torch.Tensor:
    """The node's own operation on the given arguments: its module (`module`, for a
    call_module node), its function, or its tensor method."""
    if node.op == "call_module":
        assert module is not None, f"node {node.name} calls a module"
        return module(*args, **kwargs)
    if node.op == "call_function":
        return node.target(*args, **kwargs)  # type: ignore[operator]
    return getattr(args[0], str(node.target))(*args[1:], **kwargs)


def batch_norm_momentum(module: nn.Module, layer: str) -> float:
    """The momentum of a BatchNorm module; ConfigError for momentum=None (a cumulative average,
    which no engine implements)."""
    assert isinstance(module, BATCH_NORMS)
    if module.momentum is None:
        raise ConfigError(f"layer '{layer}': BatchNorm with momentum=None (cumulative "
                          "average) is not supported; set a momentum")
    return float(module.momentum)


def model_dropouts(traced: fx.GraphModule, graph: LayerGraph,
                   nodes: Iterable[fx.Node] | None = None) -> list[Dropout]:
    """Every active dropout among `nodes` (default: the whole traced module), in forward
    order."""
    holders = {name: layer for layer in graph.layers for name in layer.fx_nodes}
    found = []
    for node in traced.graph.nodes if nodes is None else nodes:
        spec = active_dropout(node, traced)
        if spec is not None:
            found.append(Dropout(node.name, holders[node.name].output_shape, *spec))
    return found


def draw_masks(dropouts: Iterable[Dropout], device: torch.device,
               dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every mask of one step, drawn in the given (forward) order, by node name."""
    return {dropout.name: dropout_mask(dropout.shape, dropout.probability, dropout.unit,
                                       device, dtype)
            for dropout in dropouts}
