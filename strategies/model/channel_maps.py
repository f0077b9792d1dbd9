"""Channel maps: the fx nodes that move whole channels and nothing else, found as one layer.

A channel map gives output channel j the values of input channel `channels[j]` at every sample
and position: a slice of the channels (`x.chunk(2, dim=1)` with its getitems, `x[:, a:b]`,
`x.split(sizes, 1)`) or a permutation written as views and transposes (ShuffleNet's channel
shuffle: `x.view(n, g, c // g, h, w)`, `torch.transpose(x, 1, 2)`, `.contiguous()`,
`.view(n, c, h, w)`). Such a layer splits along every dim: an output tile of channels [c0, c1)
reads the input channels `channels[c0:c1]` reach (their least to their greatest) at its own
samples and positions (tiles.needed_range) and picks its own (ops.layer_op).

What a run of views and transposes does is not read off their arguments (sizes come from
`x.size()` queries and arithmetic on them) but found by running the nodes on a probe: one
sample whose every value is its channel's index times the positions plus its position's index.
The run is a channel map when every output channel holds one input channel's values in order.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict
from torch import fx
from torch.fx.passes.shape_prop import TensorMetadata

# reshapes that may start a run of views and transposes; the nodes that may continue it
_RESHAPE_METHODS = {"view", "reshape", "unflatten"}
_LAYOUT_METHODS = {"view", "reshape", "unflatten", "flatten", "transpose", "permute",
                   "contiguous"}
_LAYOUT_FUNCTIONS = {torch.reshape, torch.transpose, torch.permute, torch.flatten,
                     torch.unflatten}
_CHUNKS = {"chunk", "split", "tensor_split"}


class ChannelMap(BaseModel):
    """One channel map found in a traced module: the fx node it reads, the nodes it runs
    before its last (the chunk, the views and transposes), and each output channel's source."""

    model_config = ConfigDict(frozen=True)

    source: str
    steps: tuple[str, ...]
    channels: tuple[int, ...]
    label: str  # the op as the graph shows it: the methods and functions it runs


def channel_maps(gm: fx.GraphModule) -> dict[str, ChannelMap]:
    """Last node -> the channel map it ends, for every chunk or slice of the channels and
    every run of views and transposes that only permutes them (shapes propagated)."""
    found: dict[str, ChannelMap] = {}
    claimed: set[str] = set()
    for node in gm.graph.nodes:
        if node.name in claimed:
            continue
        for end, steps in _candidates(node):
            source = node.args[0]
            assert isinstance(source, fx.Node)
            channels = _probe(gm, source, (*steps, end))
            if channels is None:
                continue
            names = tuple(step.name for step in steps)
            found[end.name] = ChannelMap(
                source=source.name, steps=names, channels=channels,
                label="channels(" + ",".join(_op_name(n) for n in (*steps, end)) + ")")
            claimed.update((*names, end.name))
    return found


def _candidates(node: fx.Node) -> list[tuple[fx.Node, tuple[fx.Node, ...]]]:
    """(last node, nodes before it) of each channel map that may start at `node`: a chunk's
    getitems (the chunk runs with the first), a slice, or a run of views and transposes
    whose every node is read by the next alone, ending where the tensor has its input's rank,
    batch and spatial sizes again."""
    source = node.args[0] if node.args else None
    if not (isinstance(source, fx.Node) and _is_tensor(source) and len(_sizes(source)) >= 3):
        return []
    if _is_chunk(node):
        parts = [user for user in node.users
                 if user.op == "call_function" and user.target is operator.getitem]
        if len(parts) != len(node.users):
            return []
        return [(part, (node,) if index == 0 else ()) for index, part in enumerate(parts)]
    if node.op == "call_function" and node.target is operator.getitem and _is_tensor(node):
        return [(node, ())]
    if not (_method(node) in _RESHAPE_METHODS or node.target in (torch.reshape,
                                                                  torch.unflatten)):
        return []
    wanted = _sizes(source)
    run = [node]
    while True:
        last = run[-1]
        sizes = _sizes(last) if _is_tensor(last) else ()
        if len(run) > 1 and len(sizes) == len(wanted) and sizes[0] == wanted[0] and (
                sizes[2:] == wanted[2:]):
            return [(last, tuple(run[:-1]))]
        users = list(last.users)
        if len(users) != 1 or not _is_layout(users[0]):
            return []
        run.append(users[0])


def _probe(gm: fx.GraphModule, source: fx.Node, nodes: tuple[fx.Node, ...]
           ) -> tuple[int, ...] | None:
    """Each output channel's source channel when `nodes` (run in order on `source`, with the
    size queries they read) only move whole channels; None otherwise."""
    sizes = _sizes(source)
    positions = 1
    for size in sizes[2:]:
        positions *= size
    probe = torch.arange(sizes[1] * positions, dtype=torch.float64).view(1, *sizes[1:])
    values: dict[str, Any] = {source.name: probe}
    wanted = set(_ancestors(nodes[-1], source))
    order = [node for node in gm.graph.nodes if node.name in wanted]
    try:
        for node in order:
            values[node.name] = _run(node, values)
    except Exception:  # a reshape that needs the real batch, or reads another tensor
        return None
    out = values[nodes[-1].name]
    if not isinstance(out, torch.Tensor) or out.dim() != len(sizes) or out.shape[0] != 1 or (
            tuple(out.shape[2:]) != tuple(sizes[2:])):
        return None
    flat = out.reshape(out.shape[1], positions)
    channels = torch.div(flat[:, 0], positions, rounding_mode="floor")
    expected = channels[:, None] * positions + torch.arange(positions, dtype=torch.float64)
    if not torch.equal(flat, expected):
        return None
    return tuple(int(channel) for channel in channels)


def _ancestors(end: fx.Node, source: fx.Node) -> list[str]:
    """The nodes `end` is computed from, back to `source`. A node among them that does not
    descend from `source` (another tensor, a parameter) is listed too: `_run` refuses its op,
    so the probe fails and the map is not one of the channels."""
    seen: list[str] = []
    pending = [end]
    while pending:
        node = pending.pop()
        if node.name in seen or node is source:
            continue
        seen.append(node.name)
        pending.extend(node.all_input_nodes)
    return seen


def _run(node: fx.Node, values: dict[str, Any]) -> Any:
    if node.op not in ("call_function", "call_method"):
        raise ValueError(f"{node.op} in a channel map")
    args = fx.node.map_arg(node.args, lambda arg: values[arg.name])
    kwargs = fx.node.map_arg(node.kwargs, lambda arg: values[arg.name])
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    return node.target(*args, **kwargs)  # type: ignore[operator]


def _is_chunk(node: fx.Node) -> bool:
    return _method(node) in _CHUNKS or (
        node.op == "call_function" and node.target in (torch.chunk, torch.split,
                                                        torch.tensor_split))


def _is_layout(node: fx.Node) -> bool:
    return _method(node) in _LAYOUT_METHODS or (
        node.op == "call_function" and node.target in _LAYOUT_FUNCTIONS)


def _method(node: fx.Node) -> str | None:
    return str(node.target) if node.op == "call_method" else None


def _op_name(node: fx.Node) -> str:
    return str(node.target) if node.op == "call_method" else getattr(
        node.target, "__name__", str(node.target))


def _is_tensor(node: fx.Node) -> bool:
    return isinstance(node.meta.get("tensor_meta"), TensorMetadata)


def _sizes(node: fx.Node) -> tuple[int, ...]:
    meta = node.meta.get("tensor_meta")
    return tuple(int(size) for size in meta.shape) if isinstance(meta, TensorMetadata) else ()
