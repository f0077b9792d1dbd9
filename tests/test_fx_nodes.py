"""The fx answers every engine shares: which nodes are dropouts that drop in training (module
or function, per element or per channel), call arguments by position or keyword, and average
pooling's count_include_pad."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn

from layerwise.strategies.model.fx_nodes import (
    ActiveDropout,
    active_dropout,
    argument,
    count_include_pad,
)
from layerwise.strategies.model.graph import trace


class _Dropouts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.3)
        self.drop2d = nn.Dropout2d(0.2)
        self.off = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.off(self.drop2d(self.drop(x)))
        x = F.dropout2d(F.dropout(x, 0.4), p=0.25)
        x = F.dropout(F.dropout(x, training=False), p=0.0)
        return torch.relu(F.dropout(x))


def test_every_active_dropout_is_found_with_its_p_and_mask_kind():
    traced = fx.symbolic_trace(_Dropouts())
    found = [(node.name, active_dropout(node, traced)) for node in traced.graph.nodes]
    assert [(name, dropout) for name, dropout in found if dropout is not None] == [
        ("drop", ActiveDropout(0.3, per_channel=False)),
        ("drop2d", ActiveDropout(0.2, per_channel=True)),
        ("dropout", ActiveDropout(0.4, per_channel=False)),
        ("dropout2d", ActiveDropout(0.25, per_channel=True)),
        ("dropout_3", ActiveDropout(0.5, per_channel=False)),  # torch's default p
    ]
    inactive = {name for name, dropout in found if dropout is None}
    assert {"off", "dropout_1", "dropout_2", "relu"} <= inactive  # p=0, training=False


def test_an_argument_is_read_by_position_or_keyword_or_defaults():
    traced = fx.symbolic_trace(_Dropouts())
    nodes = {node.name: node for node in traced.graph.nodes}
    assert argument(nodes["dropout"], 1, "p", 0.5) == 0.4  # positional
    assert argument(nodes["dropout2d"], 1, "p", 0.5) == 0.25  # keyword
    assert argument(nodes["dropout"], 2, "training", True) is True  # default


class _Pools(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.exclusive = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.inclusive = nn.AvgPool2d(3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inclusive(self.exclusive(x))
        return F.avg_pool2d(F.avg_pool2d(x, 3, 1, 1, False, False), 3, 1, 1)


def test_count_include_pad_of_modules_and_functions():
    module = _Pools()
    graph = trace(module, (2, 3, 6, 6), name="pools")
    nodes = {node.name: node for node in fx.symbolic_trace(module).graph.nodes}
    included = {layer.name: count_include_pad(layer.op, nodes[layer.name])
                for layer in graph.layers if layer.kind == "pool"}
    assert included == {"exclusive": False, "inclusive": True, "avg_pool2d": False,
                        "avg_pool2d_1": True}
    by_op = {layer.name: count_include_pad(layer.op, None) for layer in graph.layers
             if layer.kind == "pool" and layer.name in ("exclusive", "inclusive")}
    assert by_op == {"exclusive": False, "inclusive": True}
