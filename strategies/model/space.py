"""Per-layer configuration space (Jia et al. 2018, section 3 and Table 1).

A layer is parallelized by cutting its OUTPUT tensor into tiles along sample (n), channel (c),
height (h) and width (w); the product of the degrees is the number of devices the layer uses,
which may be fewer than the cluster has. A `ParallelConfig` is those degrees plus the devices
that hold the tiles, written compactly as `n4c1h2w1@0-7`.

Enumeration rules (issue: configuration space):
- a degree is a power of two and never larger than its dimension;
- a dimension the layer cannot split keeps degree 1 (Table 1: fully connected {n, c}; 2-D conv
  and pool {n, c, h, w}; elementwise, add and concat like their output; flatten {n});
- a degree never exceeds what the layer's ops allow along its dimension (`Layer.max_degrees`:
  GroupNorm's channel degree divides its group count, a reflect padding's border tiles hold
  the rows it mirrors, a circular padding keeps h and w whole);
- the devices are a contiguous block of `product` devices starting at an offset aligned to the
  block size, so a layer on 4 of 16 devices can sit on 0-3, 4-7, 8-11 or 12-15.
Tiles need not be equal when a degree does not divide its dimension: tile i of a dimension of
size S split d ways covers [i*S//d, (i+1)*S//d), so every element belongs to exactly one tile.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field, model_validator

from layerwise.strategies.errors import ConfigError
from layerwise.strategies.model.graph import Layer

DIMS: tuple[str, ...] = ("n", "c", "h", "w")

_TEXT = re.compile(r"^n(\d+)c(\d+)h(\d+)w(\d+)@([0-9,\- ]+)$")


class ParallelConfig(BaseModel):
    """Degrees of one layer's split and the devices holding its tiles (row-major n, c, h, w)."""

    model_config = ConfigDict(frozen=True)

    n: int = Field(default=1, ge=1)
    c: int = Field(default=1, ge=1)
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
    def degrees(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w)

    @property
    def size(self) -> int:
        """Number of tiles, which is the number of devices the layer uses."""
        return self.n * self.c * self.h * self.w

    @property
    def text(self) -> str:
        return f"n{self.n}c{self.c}h{self.h}w{self.w}@{format_devices(self.devices)}"

    def __str__(self) -> str:
        return self.text

    def tiles(self) -> Iterator[tuple[tuple[int, int, int, int], int]]:
        """Each tile's index along (n, c, h, w) with the device that computes it."""
        indices = itertools.product(*(range(degree) for degree in self.degrees))
        yield from zip(indices, self.devices, strict=True)

    @classmethod
    def parse(cls, text: str) -> ParallelConfig:
        """Read the compact form, e.g. `n4c1h2w1@0-7` or `n1c2h1w1@3,6`."""
        match = _TEXT.match(text.strip())
        if not match:
            raise ConfigError(
                f"cannot read parallel config '{text}': expected e.g. 'n4c1h2w1@0-7' "
                "(degrees for n, c, h, w, then the devices as ids and ranges)"
            )
        n, c, h, w = (int(group) for group in match.groups()[:4])
        try:
            return cls(n=n, c=c, h=h, w=w, devices=parse_devices(match.group(5)))
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
    if len(layer.output_shape) == 2:
        return ("n", "c")
    if len(layer.output_shape) == 4:
        return DIMS
    raise ConfigError(
        f"layer '{layer.name}' has a {len(layer.output_shape)}-d output "
        f"{layer.output_shape}; layerwise parallelizes 2-d (N, F) and 4-d (N, C, H, W) tensors"
    )


def dim_sizes(layer: Layer) -> dict[str, int]:
    """Size of each of n, c, h, w in the layer's output (1 for dims a 2-d output lacks)."""
    padded = (*layer.output_shape, 1, 1)[:4]
    return dict(zip(DIMS, padded, strict=True))


def _powers_of_two(limit: int) -> list[int]:
    degrees = [1]
    while degrees[-1] * 2 <= limit:
        degrees.append(degrees[-1] * 2)
    return degrees


def degree_choices(layer: Layer, devices: int) -> list[tuple[int, int, int, int]]:
    """Every legal (n, c, h, w) degree tuple of `layer` on at most `devices` devices."""
    options = [_powers_of_two(min(max_degree(layer, dim), devices)) for dim in DIMS]
    return [
        degrees
        for degrees in itertools.product(*options)
        if degrees[0] * degrees[1] * degrees[2] * degrees[3] <= devices
    ]


def placements(size: int, devices: int) -> list[tuple[int, ...]]:
    """Contiguous blocks of `size` devices at offsets aligned to `size`."""
    return [tuple(range(start, start + size)) for start in range(0, devices - size + 1, size)]


def enumerate_configs(layer: Layer, devices: int) -> list[ParallelConfig]:
    """All ParallelConfigs of `layer` on a cluster of `devices` devices."""
    _check_devices(devices)
    configs: list[ParallelConfig] = []
    for n, c, h, w in degree_choices(layer, devices):
        for block in placements(n * c * h * w, devices):
            configs.append(ParallelConfig(n=n, c=c, h=h, w=w, devices=block))
    return configs


def count_configs(layer: Layer, devices: int) -> int:
    """len(enumerate_configs(layer, devices)) without building them."""
    _check_devices(devices)
    return sum(devices // (n * c * h * w) for n, c, h, w in degree_choices(layer, devices))


def _check_devices(devices: int) -> None:
    if devices < 1:
        raise ConfigError(f"the number of devices must be >= 1 (got {devices})")


def check_config(layer: Layer, config: ParallelConfig, devices: int) -> None:
    """Raise ConfigError (one line) unless `config` is legal for `layer` on `devices` devices."""
    sizes = dim_sizes(layer)
    splittable = parallel_dims(layer)
    for dim, degree in zip(DIMS, config.degrees, strict=True):
        if degree & (degree - 1):
            raise ConfigError(
                f"layer '{layer.name}': degree {degree} along {dim} is not a power of two "
                f"(config {config.text})"
            )
        if degree > 1 and dim not in splittable:
            raise ConfigError(
                f"layer '{layer.name}' ({layer.label}) cannot be split along {dim}: "
                f"it splits along {', '.join(splittable)} (config {config.text})"
            )
        if degree > sizes[dim]:
            raise ConfigError(
                f"layer '{layer.name}': degree {degree} along {dim} exceeds its size "
                f"{sizes[dim]} (config {config.text})"
            )
        if degree > max_degree(layer, dim):
            raise ConfigError(
                f"layer '{layer.name}' ({layer.label}) splits along {dim} at most "
                f"{max_degree(layer, dim)} ways, not {degree}: {layer.held_reason} "
                f"(config {config.text})"
            )
    highest = max(config.devices)
    if highest >= devices:
        raise ConfigError(
            f"layer '{layer.name}': config {config.text} uses device {highest} but only "
            f"{devices} devices (0-{devices - 1}) exist"
        )
