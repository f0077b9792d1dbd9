"""A model reference with the factory's own arguments: `package.module:factory(key=value, ...)`.

Model libraries configure their networks by constructor arguments layerwise does not offer
(torchvision's `googlenet(aux_logits=False)`, MONAI's `UNet(spatial_dims=3, in_channels=1,
out_channels=2, channels=(16, 32, 64), strides=(2, 2))`), so a reference may name them after
the factory, as Python would call it. Only keyword arguments with literal values (numbers,
strings, True/False/None, tuples, lists and dicts of them) are read, with Python's own
literal parser: a reference is data, and nothing in it is run.
"""

from __future__ import annotations

import ast
from typing import Any

from layerwise.strategies.errors import UnknownModelError


def split_reference(reference: str) -> tuple[str, dict[str, Any]]:
    """(`package.module:factory`, its keyword arguments) of a reference, {} when it has none."""
    head, parenthesis, rest = reference.partition("(")
    if not parenthesis:
        return reference, {}
    try:
        call = ast.parse(f"factory({rest}", mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        reason = error.msg if isinstance(error, SyntaxError) else type(error).__name__
        raise UnknownModelError(
            f"model reference {reference!r} has arguments Python cannot read ({reason}): "
            "write them as factory(key=value, ...)") from None
    if not isinstance(call, ast.Call) or call.args or any(
            keyword.arg is None for keyword in call.keywords):
        raise UnknownModelError(
            f"model reference {reference!r}: give the factory's arguments by keyword, as "
            "factory(key=value, ...)")
    arguments: dict[str, Any] = {}
    for keyword in call.keywords:
        try:
            arguments[str(keyword.arg)] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            raise UnknownModelError(
                f"model reference {reference!r}: argument {keyword.arg} is not a literal; "
                "write numbers, strings, True/False/None, or tuples and lists of them") from None
    return head.strip(), arguments
