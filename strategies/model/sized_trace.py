"""Tracing a model whose Python reads its tensors' sizes: the fallback when torch.fx cannot.

fx traces with proxies that stand for any input, so Python that reads a size (`len(x.shape)`,
`if skip.shape[2] != up.shape[2]:`) cannot run: fx has no value to give it. MONAI's BasicUNet
pads each upsampled map to its skip's size that way. torch.fx's MetaTracer traces with a meta
tensor beside every value, so such reads see this input's sizes and become constants of the
graph. layerwise builds a graph per input shape anyway; what must not be baked in is the batch,
which tiles split: the graph is kept only if it runs at another batch as the model does. A pad
that the size check made zero (even sides) is the identity and leaves the graph (any traced
graph's zero pads do: `trace_module`). A spatial size
read into an op's arguments (a view by the input's height) becomes a constant too, which no
check here can tell from a real one: `layerwise verify` proves a plan of such a model exact or
not, as for any other.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import warnings
from collections.abc import Iterator
from copy import deepcopy
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.meta_tracer import MetaTracer
from torch.fx.passes.shape_prop import ShapeProp

from layerwise.strategies.model.padding import PAD_FUNCTIONS


@contextlib.contextmanager
def proxies_are_tensors() -> Iterator[None]:
    """While fx traces, `torch.jit.isinstance(value, torch.Tensor)` holds for a traced value,
    as it holds for the tensor the value stands for (MONAI's UpCat concatenates its skip
    input only when that check passes, and fx would trace the other branch silently)."""
    original = torch.jit.isinstance

    def isinstance_of_traced(obj: Any, target_type: Any) -> bool:
        if isinstance(obj, fx.Proxy) and target_type is torch.Tensor:
            return True
        return original(obj, target_type)

    torch.jit.isinstance = isinstance_of_traced
    try:
        yield
    finally:
        torch.jit.isinstance = original


def trace_module(module: nn.Module, input_shape: tuple[int, ...]) -> fx.GraphModule:
    """`module`'s fx graph as every part of layerwise reads it (its layer graph, each engine):
    traced with traced values taken for tensors, else with this input's sizes known. Raises
    fx's own error where neither works."""
    try:
        with proxies_are_tensors():
            gm = fx.symbolic_trace(module)
    except Exception:
        sized = traced_at_its_sizes(module, input_shape)
        if sized is None:
            raise
        return sized
    _drop_zero_pads(gm)
    return gm


def traced_at_its_sizes(model: nn.Module, input_shape: tuple[int, ...]) -> fx.GraphModule | None:
    """`model` traced with this input's sizes known, or None where that fails or the graph
    depends on the batch (it must run at another batch, giving what the model gives)."""
    try:
        shadow = deepcopy(model).to("meta")  # the tracer runs every op on meta tensors
        argument = next(iter(inspect.signature(model.forward).parameters))
        with proxies_are_tensors(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer warns of each value it cannot size
            graph = MetaTracer().trace(shadow, meta_args={
                argument: torch.empty(input_shape, device="meta")})
        gm = fx.GraphModule(model, graph)
    except Exception:  # fx and the model raise many types; all mean "not this way"
        return None
    _drop_zero_pads(gm)
    return gm if _runs_as_the_model(gm, model, (input_shape[0] + 1, *input_shape[1:])) else None


def _drop_zero_pads(gm: fx.GraphModule) -> None:
    """Pads of zero on every side (a size check that found nothing to pad) pass their input
    on: the identity."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in PAD_FUNCTIONS:
            pad = node.args[1] if len(node.args) > 1 else node.kwargs.get("pad")
            if isinstance(pad, list | tuple) and not any(pad):
                node.replace_all_uses_with(node.args[0])
                gm.graph.erase_node(node)
    gm.recompile()


def _runs_as_the_model(gm: fx.GraphModule, model: nn.Module,
                       input_shape: tuple[int, ...]) -> bool:
    """Whether the graph and the model give outputs of the same shapes on `input_shape`
    (fake tensors: nothing of the model changes)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    fake_mode = None if device.type == "meta" else FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ShapeProp(gm, fake_mode=fake_mode).propagate(torch.empty(input_shape, device=device))
            with fake_mode or contextlib.nullcontext():
                expected = model(torch.empty(input_shape, device=device))
    except Exception:  # any failure: not the model's graph at this batch
        return False
    returned = next(node for node in gm.graph.nodes if node.op == "output").args[0]
    got = [node.meta["tensor_meta"].shape for node in _flat(returned)]
    return [tuple(shape) for shape in got] == [tuple(value.shape) for value in _flat(expected)]


def _flat(value: Any) -> list[Any]:
    """A returned value's tensors (or nodes), one level of tuple or list unpacked."""
    return list(value) if isinstance(value, list | tuple) else [value]
