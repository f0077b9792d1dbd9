"""Shared pieces of the `layerwise` commands: consoles, one-line errors, number formatting,
options several commands take alike."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.model.input_size import InputSize, parse_input_shape
from layerwise.strategies.text import printable

# `--batch G` of search, profile, train and verify: the global batch, beside --batch-per-device
GlobalBatch = Annotated[int | None, typer.Option(
    "--batch", help="Global batch instead of --batch-per-device; it may be smaller than the "
                    "devices (a sample or less each: spatial and channel splits share it).")]

# `--input-shape` of every command that takes --image-size: 1-d signals, images, 3-d volumes
InputShape = Annotated[str | None, typer.Option(
    "--input-shape", help="Input channels and spatial sizes instead of --image-size and "
                          "--in-channels: C,L (a signal), C,H,W (an image) or C,D,H,W (a "
                          "volume), e.g. 1,64,64,64.")]


def input_options(image_size: int | None, in_channels: int | None,
                  input_shape: str | None) -> tuple[InputSize | None, int | None]:
    """(image size, channels) from --image-size and --in-channels, or from --input-shape."""
    if input_shape is None:
        return image_size, in_channels
    if image_size is not None or in_channels is not None:
        raise LayerwiseError("give --input-shape, or --image-size and --in-channels, not both")
    channels, sizes = parse_input_shape(input_shape)
    return sizes, channels


# Printed text is never markup or emoji codes: model names, paths and messages come from the
# user ("[/foo]" would stop Rich, "a:b:c" would print an emoji); style with Text instead.
def _is_terminal(stream: Any) -> bool:
    """Whether `stream` is a terminal; a closed standard stream (`>&-`) is None, and not."""
    return stream is not None and stream.isatty()


console = Console(width=None if _is_terminal(sys.stdout) else 160, markup=False, emoji=False)
error_console = Console(stderr=True, width=None if _is_terminal(sys.stderr) else 200,
                        markup=False, emoji=False)

Command = TypeVar("Command", bound=Callable[..., Any])


def user_errors(command: Command) -> Command:
    """Turn a LayerwiseError into one line on stderr and its exit code (2 for bad input, 1
    for a failure of the machine or a store; no traceback)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except LayerwiseError as error:
            print_error(str(error))
            raise typer.Exit(code=error.exit_code) from None

    return wrapper  # type: ignore[return-value]


def print_error(message: str) -> None:
    """`error: message` on stderr, the message as plain text (no markup, no emoji, control
    characters shown as escapes)."""
    error_console.print(Text.assemble(("error:", "bold red"), " ", printable(message)),
                        highlight=False, soft_wrap=True)


def print_warning(message: str) -> None:
    """`warning: message` on stderr, the message as plain text (no markup, no emoji, control
    characters shown as escapes)."""
    error_console.print(Text.assemble(("warning:", "yellow"), " ", printable(message)),
                        highlight=False, soft_wrap=True)


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


def human_count(value: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:g}"
