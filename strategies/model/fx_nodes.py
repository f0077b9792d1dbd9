"""What the engines read off a traced model's fx nodes: call arguments and active dropouts.

Every engine replays the plain module's forward from its torch.fx graph and must draw the
same dropout masks in the same order as the plain forward (and as each other), so they all
ask this module which nodes are dropouts that drop in training, with which p and over what
unit: one answer for nn.Dropout, nn.Dropout1d/2d/3d, their functions, and stochastic depth
(torchvision's `stochastic_depth(input, p, mode, training)`, which drops a residual branch per
sample in "row" mode, for the whole batch in "batch" mode).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import torch.nn.functional as F
from torch import fx, nn

_CHANNEL_DROPOUTS = (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
_DROPOUT_MODULES = (nn.Dropout, *_CHANNEL_DROPOUTS)
# dropout function -> whether it draws one value per (sample, channel)
_DROPOUT_FUNCTIONS: dict[Any, bool] = {F.dropout: False, F.dropout1d: True, F.dropout2d: True,
                                       F.dropout3d: True}


# what one draw of a dropout mask covers: an element (dropout), a sample's channel
# (dropout1d/2d/3d), a sample (stochastic depth, "row") or the whole batch ("batch")
DropUnit = Literal["element", "channel", "sample", "batch"]
STOCHASTIC_DEPTH = "stochastic_depth"  # the function's name, as torchvision.ops calls it


class ActiveDropout(NamedTuple):
    """A dropout that drops in training: its probability and the unit one draw covers."""

    probability: float
    unit: DropUnit


def argument(node: fx.Node, index: int, name: str, default: Any) -> Any:
    """Argument `name` of a call node, given at position `index` or by keyword, or `default`."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def active_dropout(node: fx.Node, graph_module: fx.GraphModule) -> ActiveDropout | None:
    """The dropout `node` runs when it drops in training (p > 0); None for any other node.

    A module's p is its own; a function's p and `training` are its call's (torch's defaults
    p=0.5, training=True), and F.dropout(..., training=False) never drops.
    """
    if node.op == "call_module":
        module = graph_module.get_submodule(str(node.target))
        if isinstance(module, _DROPOUT_MODULES) and module.p > 0:
            return ActiveDropout(float(module.p), "channel" if isinstance(
                module, _CHANNEL_DROPOUTS) else "element")
    elif node.op == "call_function" and node.target in _DROPOUT_FUNCTIONS:
        probability = float(argument(node, 1, "p", 0.5))
        if argument(node, 2, "training", True) and probability > 0:
            return ActiveDropout(probability, "channel" if _DROPOUT_FUNCTIONS[node.target]
                                 else "element")
    elif is_stochastic_depth(node):
        probability = float(argument(node, 1, "p", 0.0))
        if argument(node, 3, "training", True) and probability > 0:
            return ActiveDropout(probability, "sample" if argument(node, 2, "mode", "row")
                                 == "row" else "batch")
    return None


def is_stochastic_depth(node: fx.Node) -> bool:
    """Whether `node` calls stochastic depth (torchvision.ops.stochastic_depth, which fx keeps
    whole: a function of that name taking input, p, mode and training)."""
    return node.op == "call_function" and getattr(node.target, "__name__", "") == (
        STOCHASTIC_DEPTH)


def count_include_pad(op: str, node: fx.Node | None) -> bool:
    """avg pooling's count_include_pad: graph.py writes a module's into its op name, a
    function's is its call's (default True). Without the node (the profiler times shapes, and
    the divisors' values do not change the time), the op name's."""
    if node is not None and node.op == "call_function":
        return bool(argument(node, 5, "count_include_pad", True))
    return "count_include_pad=False" not in op
