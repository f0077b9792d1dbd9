"""Per-layer configuration space (Jia et al. 2018, section 3 and Table 1).

A layer is parallelized by cutting its OUTPUT tensor into tiles along sample (n), channel (c)
and its spatial dims: length (l) of a 1-d layer, height (h) and width (w) of a 2-d one, depth (d),
height and width of a 3-d one; the product of the degrees is the number of devices the layer
uses, which may be fewer than the cluster has. A `ParallelConfig` is those degrees plus the
devices that hold the tiles, written compactly as `n4c1h2w1@0-7` (2-d and fully connected
layers), `n2c1d2h2w1@0-7` (3-d) or `n1c2l4@0-7` (1-d).

Every tensor is seen through one 5-d view (n, c, d, h, w) with its spatial dims aligned to the
right (`tiles.as_view`): a 2-d layer has d = 1, a 1-d layer's length is the view's w (shown as
l), a fully connected (N, F) layer has d = h = w = 1. So search, cost tables and plans handle
every rank with one code path, and a 2-d strategy file reads as it always did.

Enumeration rules (issue: configuration space):
- a degree is a power of two and never larger than its dimension;
- a dimension the layer cannot split keeps degree 1 (Table 1: fully connected {n, c}; 1-D conv
  and pool {n, c, l}; 2-D {n, c, h, w}; 3-D {n, c, d, h, w}; elementwise, add and concat like
  their output; flatten {n});
- a degree never exceeds what the layer's ops allow along its dimension (`Layer.max_degrees`:
  GroupNorm's channel degree divides its group count, a reflect padding's border tiles hold
  the rows it mirrors, a circular padding keeps h and w whole);
- the devices are a contiguous block of `product` devices starting at an offset aligned to the
  block size, so a layer on 4 of 16 devices can sit on 0-3, 4-7, 8-11 or 12-15.
Tiles need not be equal when a degree does not divide its dimension: tile i of a dimension of
size S split d ways covers [i*S//d, (i+1)*S//d), so every element belongs to exactly one tile.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field, model_validator

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.graph import Layer

DIMS: tuple[str, ...] = ("n", "c", "d", "h", "w")

Degrees = tuple[int, int, int, int, int]  # along (n, c, d, h, w)

# the written forms: 2-d and fully connected layers, 3-d layers, 1-d layers
_TEXT = re.compile(r"^n(\d+)c(\d+)(?:d(\d+))?h(\d+)w(\d+)@([0-9,\- ]+)$")
_TEXT_1D = re.compile(r"^n(\d+)c(\d+)l(\d+)@([0-9,\- ]+)$")


class ParallelConfig(BaseModel):
    """Degrees of one layer's split and the devices holding its tiles (row-major n, c, d, h, w;
    a 1-d layer's length is w)."""

    model_config = ConfigDict(frozen=True)

    n: int = Field(default=1, ge=1)
    c: int = Field(default=1, ge=1)
    d: int = Field(default=1, ge=1)
    h: int = Field(default=1, ge=1)
    w: int = Field(default=1, ge=1)
    devices: tuple[int, ...]

    @model_validator(mode="after")
    def _devices_match_degrees(self) -> ParallelConfig:
        if len(self.devices) != self.size:
            raise ValueError(
                f"{self.size} tiles need {self.size} devices, got {len(self.devices)}"
            )
        if len(set(self.devices)) != len(self.devices):
            raise ValueError(f"a device holds two tiles: {list(self.devices)}")
        if any(device < 0 for device in self.devices):
            raise ValueError(f"device ids must be >= 0: {list(self.devices)}")
        return self

    @property
    def degrees(self) -> Degrees:
        return (self.n, self.c, self.d, self.h, self.w)

    @property
    def size(self) -> int:
        """Number of tiles, which is the number of devices the layer uses."""
        return self.n * self.c * self.d * self.h * self.w

    @property
    def text(self) -> str:
        """The written form without knowing the layer: d only where it is split (a layer's
        own form, with l or d always, is `config_text`)."""
        depth = f"d{self.d}" if self.d > 1 else ""
        return f"n{self.n}c{self.c}{depth}h{self.h}w{self.w}@{format_devices(self.devices)}"

    def __str__(self) -> str:
        return self.text

    def tiles(self) -> Iterator[tuple[Degrees, int]]:
        """Each tile's index along (n, c, d, h, w) with the device that computes it."""
        indices = itertools.product(*(range(degree) for degree in self.degrees))
        yield from zip(indices, self.devices, strict=True)

    @classmethod
    def parse(cls, text: str) -> ParallelConfig:
        """Read the compact form, e.g. `n4c1h2w1@0-7`, `n1c2h1w1@3,6`, `n1c1d2h2w1@0-3` or
        `n2c1l2@0-3`."""
        match, length = _TEXT.match(text.strip()), _TEXT_1D.match(text.strip())
        if match:
            n, c, h, w = (int(group) for group in (*match.groups()[:2], *match.groups()[3:5]))
            d, devices = int(match.group(3) or 1), match.group(6)
        elif length:
            (n, c, w), d, h, devices = (int(g) for g in length.groups()[:3]), 1, 1, length[4]
        else:
            raise ConfigError(
                f"cannot read parallel config '{text}': expected e.g. 'n4c1h2w1@0-7' "
                "(degrees for n, c, h, w, then the devices as ids and ranges; "
                "'n1c1d2h2w1@0-3' for a 3-d layer, 'n2c1l2@0-3' for a 1-d one)"
            )
        try:
            return cls(n=n, c=c, d=d, h=h, w=w, devices=parse_devices(devices))
        except ValueError as error:
            reason = _first_validation_message(error)
            raise ConfigError(f"invalid parallel config '{text}': {reason}") from None


def _first_validation_message(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):
        first = errors()[0]
        location = ".".join(str(part) for part in first.get("loc", ()))
        message = str(first.get("msg", error)).removeprefix("Value error, ")
        return f"{location}: {message}" if location else message
    return str(error)


def format_devices(devices: tuple[int, ...]) -> str:
    """Device ids as comma-separated ids and ascending runs: (0,1,2,3,8) -> '0-3,8'."""
    parts: list[str] = []
    start = previous = devices[0]
    for device in (*devices[1:], None):
        if device is not None and device == previous + 1:
            previous = device
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if device is not None:
            start = previous = device
    return ",".join(parts)


def parse_devices(text: str) -> tuple[int, ...]:
    devices: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            raise ConfigError(f"empty device entry in '{text}'")
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ConfigError(f"cannot read devices '{text}': use ids and ranges like 0-3,8")
        low, high = int(first), int(last or first)
        if high < low:
            raise ConfigError(f"descending device range '{part}' in '{text}'")
        devices.extend(range(low, high + 1))
    return tuple(devices)


def tile_range(size: int, degree: int, index: int) -> tuple[int, int]:
    """[start, stop) of tile `index` when a dimension of `size` is cut into `degree` tiles."""
    return (index * size // degree, (index + 1) * size // degree)


@functools.cache  # asked for every range of every tile the cost tables price
def view_dims(rank: int) -> tuple[int, ...]:
    """The positions in the 5-d view (n, c, d, h, w) of a tensor of `rank` dims: n and c,
    then its spatial dims aligned to the right (a 1-d layer's length is w, a 2-d layer's
    height and width are h and w); an (N, F) tensor is n and c."""
    if not 2 <= rank <= 5:
        raise ConfigError(f"a {rank}-d tensor has no layerwise view: layers take (N, F), "
                          "(N, C, L), (N, C, H, W) or (N, C, D, H, W) tensors")
    return (0, 1, *range(7 - rank, 5))


@functools.lru_cache(maxsize=4096)  # the layers' shapes, asked per needed range
def as_view(shape: tuple[int, ...]) -> Degrees:
    """A shape in the 5-d view: (N, C, D, H, W), 1 where the tensor lacks a dim."""
    view = [1, 1, 1, 1, 1]
    for position, size in zip(view_dims(len(shape)), shape, strict=True):
        view[position] = size
    return (view[0], view[1], view[2], view[3], view[4])


def dim_name(layer: Layer, dim: str) -> str:
    """How `layer`'s dim is written: the view's w is a 1-d layer's length, l."""
    return "l" if dim == "w" and len(layer.output_shape) == 3 else dim


def config_text(layer: Layer, config: ParallelConfig) -> str:
    """`config` as written for `layer`: `n1c2l4@0-7` for a 1-d layer, `n1c1d2h2w1@0-3` for a
    3-d one (d always), `n4c1h2w1@0-7` for every other."""
    devices = format_devices(config.devices)
    rank = len(layer.output_shape)
    if rank == 3 and config.d == config.h == 1:
        return f"n{config.n}c{config.c}l{config.w}@{devices}"
    if rank == 5:
        return f"n{config.n}c{config.c}d{config.d}h{config.h}w{config.w}@{devices}"
    return config.text


def parallel_dims(layer: Layer) -> tuple[str, ...]:
    """The dimensions a layer's output may be split along (Jia et al. 2018, Table 1), less
    those its ops hold whole (`Layer.max_degrees` of 1: GroupNorm's h and w, circular
    padding)."""
    return tuple(dim for dim in _shape_dims(layer) if layer.max_degrees.get(dim, 2) > 1)


def max_degree(layer: Layer, dim: str) -> int:
    """The largest degree along `dim`: its size, less where the layer's ops allow less, 1
    where the layer cannot split it."""
    if dim not in parallel_dims(layer):
        return 1
    return min(dim_sizes(layer)[dim], layer.max_degrees.get(dim, dim_sizes(layer)[dim]))


def _shape_dims(layer: Layer) -> tuple[str, ...]:
    if layer.kind == "flatten":
        return ("n",)
    if not 2 <= len(layer.output_shape) <= 5:
        raise ConfigError(
            f"layer '{layer.name}' has a {len(layer.output_shape)}-d output "
            f"{layer.output_shape}; layerwise parallelizes (N, F), (N, C, L), (N, C, H, W) "
            "and (N, C, D, H, W) tensors"
        )
    return tuple(DIMS[position] for position in view_dims(len(layer.output_shape)))


def dim_sizes(layer: Layer) -> dict[str, int]:
    """Size of each of n, c, d, h, w in the layer's output view (1 for dims it lacks)."""
    return dict(zip(DIMS, as_view(layer.output_shape), strict=True))


def _powers_of_two(limit: int) -> list[int]:
    degrees = [1]
    while degrees[-1] * 2 <= limit:
        degrees.append(degrees[-1] * 2)
    return degrees


def degree_choices(layer: Layer, devices: int) -> list[Degrees]:
    """Every legal (n, c, d, h, w) degree tuple of `layer` on at most `devices` devices."""
    options = [_powers_of_two(min(max_degree(layer, dim), devices)) for dim in DIMS]
    return [
        degrees
        for degrees in itertools.product(*options)
        if degrees[0] * degrees[1] * degrees[2] * degrees[3] * degrees[4] <= devices
    ]


def placements(size: int, devices: int) -> list[tuple[int, ...]]:
    """Contiguous blocks of `size` devices at offsets aligned to `size`."""
    return [tuple(range(start, start + size)) for start in range(0, devices - size + 1, size)]


def enumerate_configs(layer: Layer, devices: int) -> list[ParallelConfig]:
    """All ParallelConfigs of `layer` on a cluster of `devices` devices."""
    _check_devices(devices)
    configs: list[ParallelConfig] = []
    for n, c, d, h, w in degree_choices(layer, devices):
        for block in placements(n * c * d * h * w, devices):
            configs.append(ParallelConfig(n=n, c=c, d=d, h=h, w=w, devices=block))
    return configs


def count_configs(layer: Layer, devices: int) -> int:
    """len(enumerate_configs(layer, devices)) without building them."""
    _check_devices(devices)
    return sum(devices // math.prod(degrees) for degrees in degree_choices(layer, devices))


def _check_devices(devices: int) -> None:
    if devices < 1:
        raise ConfigError(f"the number of devices must be >= 1 (got {devices})")


def check_config(layer: Layer, config: ParallelConfig, devices: int) -> None:
    """Raise ConfigError (one line) unless `config` is legal for `layer` on `devices` devices."""
    sizes = dim_sizes(layer)
    splittable = parallel_dims(layer)
    text = config_text(layer, config)
    for dim, degree in zip(DIMS, config.degrees, strict=True):
        name = dim_name(layer, dim)
        if degree & (degree - 1):
            raise ConfigError(
                f"layer '{layer.name}': degree {degree} along {name} is not a power of two "
                f"(config {text})"
            )
        if degree > 1 and dim not in splittable:
            raise ConfigError(
                f"layer '{layer.name}' ({layer.label}) cannot be split along {name}: it "
                f"splits along {', '.join(dim_name(layer, d) for d in splittable)} "
                f"(config {text})"
            )
        if degree > sizes[dim]:
            raise ConfigError(
                f"layer '{layer.name}': degree {degree} along {name} exceeds its size "
                f"{sizes[dim]} (config {text})"
            )
        if degree > max_degree(layer, dim):
            raise ConfigError(
                f"layer '{layer.name}' ({layer.label}) splits along {name} at most "
                f"{max_degree(layer, dim)} ways, not {degree}: {layer.held_reason} "
                f"(config {text})"
            )
    highest = max(config.devices)
    if highest >= devices:
        raise ConfigError(
            f"layer '{layer.name}': config {text} uses device {highest} but only "
            f"{devices} devices (0-{devices - 1}) exist"
        )
