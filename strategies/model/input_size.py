"""An input's spatial size as commands take it and settings keep it.

`--image-size N` gives one side for every spatial dim of the model (a square image, a cube
volume); `--input-shape C,L | C,H,W | C,D,H,W` gives the channels and each dim's own size.
Kept apart from the zoo (torch) so that settings and options can name the type.
"""

from __future__ import annotations

from layerwise.strategies.errors import LayerwiseError

# An input's spatial size: one side for every spatial dim of the model (a square image, a cube
# volume), or each dim's own size, (L,), (H, W) or (D, H, W).
InputSize = int | tuple[int, ...]


def spatial_size(size: InputSize, dims: int) -> tuple[int, ...]:
    """`size` as one entry per spatial dim of a model with `dims` of them."""
    return (size,) * dims if isinstance(size, int) else tuple(size)


def compact_size(sizes: tuple[int, ...]) -> InputSize:
    """The spatial sizes of an input as settings write them: a square image as its side (as
    every 2-d run always has), anything else as its sizes."""
    return sizes[0] if len(sizes) == 2 and sizes[0] == sizes[1] else tuple(sizes)


def parse_input_shape(text: str) -> tuple[int, tuple[int, ...]]:
    """`--input-shape C,L | C,H,W | C,D,H,W` as (channels, spatial sizes)."""
    parts = [part.strip() for part in text.replace("x", ",").split(",")]
    if not 2 <= len(parts) <= 4 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise LayerwiseError(f"cannot read --input-shape '{text}': give the channels and the "
                             "spatial sizes as positive integers, C,L (a signal), C,H,W (an "
                             "image) or C,D,H,W (a volume), e.g. 1,64,64,64")
    channels, *sizes = (int(part) for part in parts)
    return channels, tuple(sizes)
