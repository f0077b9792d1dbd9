"""An elementwise op taken by its nature, written down so that it can run without the model.

The layer graph takes any op that is elementwise by its nature (Hardsigmoid, Mish, a model
library's own function), and the runtime runs it through the model's own fx node. The profiler
times tiles from the graph alone (it may run in another process or from a graph read back
from disk), so the graph keeps what the call needs: the `module:name` of the module class or
function, a module's plain attributes (a slope, a threshold, `inplace`) and a function's
constant arguments, with the tensor's place among them. Only JSON values are kept, so the
graph stays a document; an op whose state is anything else is recorded as not rebuildable,
and the profiler says so.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue
from torch import Tensor, fx, nn

_SCALARS = (bool, int, float, str, type(None))


class OpCall(BaseModel):
    """A module class built from its plain attributes, or a function with its constants."""

    model_config = ConfigDict(frozen=True)

    reference: str  # `module:name` (or `module:Outer.name`)
    attributes: dict[str, JsonValue] = {}  # a module's, set on a bare instance
    args: tuple[JsonValue, ...] = ()  # a function's positional constants
    kwargs: dict[str, JsonValue] = {}  # and keyword ones
    tensor_at: int | str = 0  # the tensor's position in args, or its keyword
    unrecorded: str = ""  # why the call could not be written down ("" when it was)

    def build(self) -> Callable[[Tensor], Tensor]:
        """The op as the model runs it, on any tensor; raises ValueError saying why not."""
        if self.unrecorded:
            raise ValueError(self.unrecorded)
        found = _import(self.reference)
        if isinstance(found, type) and issubclass(found, nn.Module):
            module = found.__new__(found)
            nn.Module.__init__(module)  # a bare module: no constructor arguments needed
            module.__dict__.update(self.attributes)
            return module
        if not callable(found):
            raise ValueError(f"{self.reference} is not callable")

        def call(x: Tensor) -> Tensor:
            args = list(self.args)
            kwargs = dict(self.kwargs)
            if isinstance(self.tensor_at, int):
                args.insert(self.tensor_at, x)
            else:
                kwargs[self.tensor_at] = x
            return found(*args, **kwargs)

        return call


def module_call(module: nn.Module) -> OpCall:
    """A parameter-free module as a call: its class and its plain attributes."""
    attributes: dict[str, JsonValue] = {}
    for key, value in vars(module).items():
        if key.startswith("_") or key == "training":
            continue
        if not _is_json(value):
            return OpCall(reference=_reference(type(module)), unrecorded=(
                f"its attribute {key} is a {type(value).__name__}, not a plain value"))
        attributes[key] = False if key == "inplace" else _plain(value)  # tiles keep their input
    return OpCall(reference=_reference(type(module)), attributes=attributes)


def function_call(node: fx.Node, function: Callable[..., Any]) -> OpCall:
    """A function call on one tensor as a call: the function and the call's constants."""
    reference = _reference(function)
    tensor_at: int | str | None = None
    args: list[JsonValue] = []
    for index, arg in enumerate(node.args):
        if isinstance(arg, fx.Node):
            tensor_at = index
        elif _is_json(arg):
            args.append(_plain(arg))
        else:
            return OpCall(reference=reference, unrecorded=(
                f"its argument {index} is a {type(arg).__name__}, not a plain value"))
    kwargs: dict[str, JsonValue] = {}
    for key, value in node.kwargs.items():
        if isinstance(value, fx.Node):
            tensor_at = key
        elif _is_json(value):
            kwargs[key] = _plain(value)
        else:
            return OpCall(reference=reference, unrecorded=(
                f"its argument {key} is a {type(value).__name__}, not a plain value"))
    if tensor_at is None:
        return OpCall(reference=reference, unrecorded="it reads no tensor argument")
    return OpCall(reference=reference, args=tuple(args), kwargs=kwargs, tensor_at=tensor_at)


def _is_json(value: object) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_json(item) for item in value)
    return isinstance(value, _SCALARS)


def _plain(value: Any) -> JsonValue:
    """A JSON value of a plain one: tuples as lists."""
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value  # type: ignore[no-any-return]


def _reference(function: Callable[..., Any]) -> str:
    """`module:name` of a class or function; its qualified name when the module does not
    expose it by its plain name (torch's builtins live on torch under their plain names)."""
    module = function.__module__ or ""
    name = getattr(function, "__name__", "")
    try:
        if getattr(importlib.import_module(module), name, None) is function:
            return f"{module}:{name}"
    except ImportError:
        pass
    return f"{module}:{getattr(function, '__qualname__', name)}"


def _import(reference: str) -> object:
    module_name, _, qualname = reference.partition(":")
    try:
        found: object = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"{reference} cannot be imported ({type(error).__name__}: "
                         f"{error})") from error
    return found
