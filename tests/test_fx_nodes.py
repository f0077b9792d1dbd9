"""The fx answers every engine shares: which nodes are dropouts that drop in training (module
or function, per element or per channel, and torchvision's stochastic depth per sample or per
batch), call arguments by position or keyword, and average pooling's count_include_pad."""

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
from tests.idiom_models import stochastic_depth

torch.fx.wrap("stochastic_depth")  # called here too: kept whole, as torchvision keeps it


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
        x = stochastic_depth(stochastic_depth(x, 0.3, "row", True), 0.2, "batch", True)
        x = stochastic_depth(x, 0.3, "row", False)
        return torch.relu(F.dropout(x))


def test_every_active_dropout_is_found_with_its_p_and_the_unit_one_draw_covers():
    traced = fx.symbolic_trace(_Dropouts())
    found = [(node.name, active_dropout(node, traced)) for node in traced.graph.nodes]
    assert [(name, dropout) for name, dropout in found if dropout is not None] == [
        ("drop", ActiveDropout(0.3, "element")),
        ("drop2d", ActiveDropout(0.2, "channel")),
        ("dropout", ActiveDropout(0.4, "element")),
        ("dropout2d", ActiveDropout(0.25, "channel")),
        ("stochastic_depth", ActiveDropout(0.3, "sample")),  # torchvision's, "row" mode
        ("stochastic_depth_1", ActiveDropout(0.2, "batch")),
        ("dropout_3", ActiveDropout(0.5, "element")),  # torch's default p
    ]
    inactive = {name for name, dropout in found if dropout is None}
    assert {"off", "dropout_1", "dropout_2", "relu",  # p=0, training=False
            "stochastic_depth_2"} <= inactive


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
