"""Errors a user can fix, raised by the domain core.

Every message is one line that says what is wrong and how to fix it; the CLI prints it without
a traceback and exits with the error's `exit_code`: 2 for bad input, 1 when the input was fine
and the machine or a store failed it. Anything that is not a `LayerwiseError` is a bug.
"""

import math
import reprlib
from typing import ClassVar


class LayerwiseError(ValueError):
    """Bad input from the user: unknown name, malformed file, impossible request."""

    exit_code: ClassVar[int] = 2


class FailedError(LayerwiseError):
    """Sound input that the machine or a store failed: a full disk, a damaged database."""

    exit_code: ClassVar[int] = 1


class UnknownModelError(LayerwiseError):
    """A model name that is neither in the zoo nor a `package.module:factory` reference."""


class GraphError(LayerwiseError):
    """A model that cannot be turned into a layer graph (untraceable, unsupported operation)."""


class ClusterError(LayerwiseError):
    """A cluster name or file that cannot be used (unknown preset, malformed or invalid YAML)."""


class ConfigError(LayerwiseError):
    """A parallel configuration that is malformed or does not fit its layer or cluster."""


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 50, 50
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 6


def shown(value: object, width: int = 60) -> str:
    """A user's value quoted in an error message: one line of at most `width` characters,
    rendered piece by piece (reprlib), so a huge or deeply nested value is never rendered
    whole on the way."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        text = str(int(value)) if abs(value) < 1e16 else repr(value)
    else:
        text = _SHORT.repr(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."
