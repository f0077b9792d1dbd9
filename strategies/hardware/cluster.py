"""Cluster specs: the hardware a parallelization strategy runs on.

A `Cluster` says how many nodes and devices there are, what one device can do (peak FLOP/s,
memory, memory bandwidth) and how fast any two devices talk to each other. The cost model asks
`link(a, b)` for transfers between two devices and `slowest_link(devices)` for the bottleneck of
a gradient all-reduce ring over a set of devices.

The hierarchy, innermost first: optional device groups inside a node (e.g. GPUs behind one PCIe
switch), the node, optional racks of nodes. Device ids are node-major: device ``d`` lives on node
``d // devices_per_node``.

Users give a preset name (a YAML file in ``strategies/hardware/clusters/``) or a path to their
own YAML file. Quantities in YAML are plain SI numbers or strings with units ("20 GB/s", "100 Gb/s",
"9 us", "10.6 TFLOP/s", "16 GiB"); `Cluster.to_yaml` writes units back so that loading the dump
gives an equal cluster.
"""

from __future__ import annotations

import math
import operator
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from decimal import Context, Decimal, InvalidOperation
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from layerwise.strategies.errors import ClusterError, shown
from layerwise.strategies.files.documents import parse_yaml, read_yaml
from layerwise.strategies.text import Name

__all__ = [
    "Cluster",
    "DeviceGroups",
    "DeviceType",
    "Link",
    "Links",
    "Racks",
    "cluster_from_mapping",
    "format_quantity",
    "load_cluster",
    "parse_quantity",
    "preset_names",
    "presets",
]

SCHEMA_VERSION = 1

_D = Decimal
# Enough digits that products of a written number and a unit factor are exact; the single
# rounding to float then happens in float(Decimal), which rounds correctly.
_EXACT = Context(prec=200)

# ---------------------------------------------------------------------------------------------
# Units
# ---------------------------------------------------------------------------------------------

# kind -> unit -> factor to the SI base unit. Units are matched exactly (case-sensitive: "Gb/s"
# is gigabits, "GB/s" gigabytes).
_UNITS: dict[str, dict[str, Decimal]] = {
    "bandwidth": {
        "B/s": _D("1"),
        "kB/s": _D("1e3"),
        "KB/s": _D("1e3"),
        "MB/s": _D("1e6"),
        "GB/s": _D("1e9"),
        "TB/s": _D("1e12"),
        "KiB/s": _D("1024"),
        "MiB/s": _D("1048576"),
        "GiB/s": _D("1073741824"),
        "TiB/s": _D("1099511627776"),
        "b/s": _D("0.125"),
        "kb/s": _D("125"),
        "Kb/s": _D("125"),
        "Mb/s": _D("125e3"),
        "Gb/s": _D("125e6"),
        "Tb/s": _D("125e9"),
        "bit/s": _D("0.125"),
        "kbit/s": _D("125"),
        "Mbit/s": _D("125e3"),
        "Gbit/s": _D("125e6"),
        "Tbit/s": _D("125e9"),
    },
    "latency": {
        "s": _D("1"),
        "ms": _D("1e-3"),
        "us": _D("1e-6"),
        "\u00b5s": _D("1e-6"),  # MICRO SIGN
        "\u03bcs": _D("1e-6"),  # GREEK SMALL LETTER MU
        "ns": _D("1e-9"),
    },
    "flops": {
        "FLOP/s": _D("1"),
        "kFLOP/s": _D("1e3"),
        "MFLOP/s": _D("1e6"),
        "GFLOP/s": _D("1e9"),
        "TFLOP/s": _D("1e12"),
        "PFLOP/s": _D("1e15"),
        "FLOPS": _D("1"),
        "kFLOPS": _D("1e3"),
        "MFLOPS": _D("1e6"),
        "GFLOPS": _D("1e9"),
        "TFLOPS": _D("1e12"),
        "PFLOPS": _D("1e15"),
    },
    "memory": {
        "B": _D("1"),
        "kB": _D("1e3"),
        "KB": _D("1e3"),
        "MB": _D("1e6"),
        "GB": _D("1e9"),
        "TB": _D("1e12"),
        "KiB": _D("1024"),
        "MiB": _D("1048576"),
        "GiB": _D("1073741824"),
        "TiB": _D("1099511627776"),
    },
}

# Units `format_quantity` writes, in the order it prefers them on a tie (largest first).
_OUTPUT_UNITS: dict[str, tuple[str, ...]] = {
    "bandwidth": ("TiB/s", "TB/s", "GiB/s", "GB/s", "MiB/s", "MB/s", "KiB/s", "kB/s", "B/s"),
    "latency": ("s", "ms", "us", "ns"),
    "flops": ("PFLOP/s", "TFLOP/s", "GFLOP/s", "MFLOP/s", "kFLOP/s", "FLOP/s"),
    "memory": ("TiB", "TB", "GiB", "GB", "MiB", "MB", "KiB", "kB", "B"),
}

_EXAMPLES = {
    "bandwidth": "12.5 GB/s",
    "latency": "10 us",
    "flops": "10.6 TFLOP/s",
    "memory": "16 GiB",
}

_QUANTITY_RE = re.compile(
    r"^\s*(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<unit>\S.*?)?\s*$"
)


def _scaled(number: str, factor: Decimal) -> float:
    """float(number x factor), computed exactly and rounded once."""
    return float(_EXACT.multiply(Decimal(number), factor))


def parse_quantity(value: Any, kind: str) -> float:
    """Read a number in SI base units, or a string with a unit, as a float in base units.

    `kind` is "bandwidth" (bytes/s), "latency" (seconds), "flops" (FLOP/s) or "memory" (bytes).
    "30.31 us" gives the float nearest to 30.31e-6 (the same as the literal 30.31e-6).
    Raises ValueError with a one-line message on anything else.
    """
    units = _UNITS[kind]
    if isinstance(value, bool):
        raise ValueError(f"cannot read {shown(value)} as a {kind} (e.g. '{_EXAMPLES[kind]}')")
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str):
        match = _QUANTITY_RE.match(value)
        unit = match.group("unit") if match else None
        if match is None or (unit is not None and unit not in units):
            raise ValueError(f"cannot read '{value}' as a {kind} (e.g. '{_EXAMPLES[kind]}')")
        try:
            result = _scaled(match.group("num"), units[unit] if unit is not None else _D(1))
        except (InvalidOperation, OverflowError):
            result = math.inf
    else:
        raise ValueError(f"cannot read {shown(value)} as a {kind} (e.g. '{_EXAMPLES[kind]}')")
    if not math.isfinite(result):
        raise ValueError(f"must be a finite number (got {shown(value)})")
    return result


def _number_text(value: float, factor: Decimal) -> str | None:
    """The shortest decimal text t with t x factor reading back as `value`, or None."""
    x = float(_EXACT.divide(Decimal(value), factor))
    for digits in range(1, 18):
        text = f"{x:.{digits}g}"
        if _scaled(text, factor) == value:
            if "e" in text:
                plain = format(Decimal(text), "f")
                if len(plain) <= 20:
                    text = plain
            return text
    return None


def format_quantity(value: float, kind: str) -> str | float:
    """`value` (base units) as text with a unit that `parse_quantity` reads back exactly.

    Among the units in which the number is at least 1, picks the one needing the fewest
    significant digits, the largest unit on a tie (values below 1 of the smallest unit use the
    smallest unit); the text must read back as exactly `value`. Falls back to the plain number.
    """
    if isinstance(value, bool) or not math.isfinite(value):
        return value
    units = _UNITS[kind]
    names = _OUTPUT_UNITS[kind]
    if value == 0:
        return "0 " + next(u for u in names if units[u] == 1)
    # largest first, so strict < below keeps the largest on a tie; below 1 of the smallest
    # unit, smallest first ("0.1 ns", not "0.0000000001 s")
    candidates = [u for u in names if abs(Decimal(value)) >= units[u]] or list(reversed(names))
    best: tuple[int, str] | None = None
    for unit in candidates:
        text = _number_text(value, units[unit])
        if text is None:
            continue
        digits = len(text.lstrip("-").replace(".", "").strip("0")) or 1
        if best is None or digits < best[0]:
            best = (digits, f"{text} {unit}")
    return best[1] if best is not None else value


# Far above any real device or link (HBM moves ~5e12 B/s, a GPU does ~1e15 FLOP/s, a WAN
# answers in ~0.1 s); a larger number is a typo, and a huge latency makes every time inf.
_LARGEST = {"bandwidth": 1e15, "latency": 10.0, "flops": 1e18, "memory": float(2**50)}


def _quantity(kind: str, *, allow_zero: bool = False, integer: bool = False):
    def validate(value: Any) -> float | int:
        result = parse_quantity(value, kind)
        if result < 0 or (result == 0 and not allow_zero):
            raise ValueError(f"must be {'>=' if allow_zero else '>'} 0 (got {shown(value)})")
        if 0 < result < sys.float_info.min:  # a denormal: every time priced from it is nan
            raise ValueError(f"{shown(value)} is below the smallest normal number "
                             f"({sys.float_info.min:.3g}); give a real {kind}")
        if result > _LARGEST[kind]:
            raise ValueError(f"{shown(value)} is above any real {kind} "
                             f"({format_quantity(_LARGEST[kind], kind)}); give a real {kind}")
        if integer:
            if not result.is_integer():
                raise ValueError(f"must be a whole number of bytes (got {shown(value)})")
            return int(result)
        return result

    return BeforeValidator(validate)


Bandwidth = Annotated[float, _quantity("bandwidth")]
Latency = Annotated[float, _quantity("latency", allow_zero=True)]
Flops = Annotated[float, _quantity("flops")]
MemoryBytes = Annotated[int, _quantity("memory", integer=True)]

# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # field name -> quantity kind, for `to_yaml`'s human units.
    _units: ClassVar[dict[str, str]] = {}


class Link(_Spec):
    """A point-to-point connection: bandwidth in bytes/s (one direction), latency in seconds.

    `ring_bandwidth` and `ring_latency`, where given, are the alpha and 1/beta of the backend's
    own all-reduce over this link, fitted to measured all-reduces in the ring form
    2(p-1)(alpha + m*beta/p) (`layerwise calibrate` writes them). A library all-reduce adds
    reduction arithmetic and copies to the messages; on CPUs with gloo it runs at a fraction
    of the point-to-point bandwidth. Without them a ring moves at the point-to-point figures.

    `shared_by`: how many devices share one port of this link (aligned runs of that many
    consecutive devices): a node with one network card for its four GPUs has `shared_by: 4`
    on `inter_node`. The port's bandwidth is split among its devices that move data over it
    at the same time (`cost/cost_model.py`, `cost/tables.py`); 1 gives every device a port of
    its own.
    """

    bandwidth: Bandwidth
    latency: Latency
    ring_bandwidth: Bandwidth | None = None
    ring_latency: Latency | None = None
    shared_by: int = Field(default=1, gt=0, le=1024, strict=True)  # int16 in cost/tables.py

    _units: ClassVar[dict[str, str]] = {"bandwidth": "bandwidth", "latency": "latency",
                                        "ring_bandwidth": "bandwidth",
                                        "ring_latency": "latency"}

    def time(self, nbytes: float) -> float:
        """Seconds to move `nbytes` over this link (latency + size / bandwidth)."""
        return self.latency + nbytes / self.bandwidth

    @property
    def allreduce_latency(self) -> float:
        """The alpha of an all-reduce ring step: measured, or the point-to-point latency."""
        return self.latency if self.ring_latency is None else self.ring_latency

    @property
    def allreduce_bandwidth(self) -> float:
        """The 1/beta of an all-reduce ring step: measured, or the point-to-point bandwidth."""
        return self.bandwidth if self.ring_bandwidth is None else self.ring_bandwidth

    def allreduce_seconds(self, nbytes: int, ranks: int) -> float:
        """A ring all-reduce of `nbytes` over `ranks` devices joined by this link: 2(r-1)
        steps of one chunk of ceil(m/r) bytes (docs/research.md: ParaDL), at the ring figures if
        measured."""
        chunk = -(-nbytes // ranks)
        return 2 * (ranks - 1) * (self.allreduce_latency + chunk / self.allreduce_bandwidth)


class DeviceType(_Spec):
    """One accelerator. `peak_flops_bf16` is None where the device has no bf16 support.

    `multiprocessors` (a GPU's SM count) and `kernel_latency` (the fixed cost of one kernel
    launch) feed the analytic device model (strategies/hardware/device_model.py): work is spread
    over the SMs in waves of tiles, and every kernel costs at least its launch. Without them (a CPU,
    a calibrated cluster) t_c is the plain roofline. `gemm_split_k` says whether the device's
    GEMM library splits the reduction of a forward or backward-data GEMM across thread blocks
    to fill the SMs (split-K); backward weights is split either way. `host_layer_seconds` and
    `host_op_seconds` are what the device's host takes to drive one layer's tile and each of
    its ops, forward and backward (benchmarks/host_dispatch.py measures them): the floor under
    a tile whose kernels are shorter.
    """

    name: Name = Field(min_length=1)
    peak_flops_fp32: Flops
    peak_flops_bf16: Flops | None = None
    memory_bytes: MemoryBytes
    memory_bandwidth: Bandwidth
    multiprocessors: int | None = Field(default=None, gt=0, strict=True)
    kernel_latency: Latency | None = None
    gemm_split_k: bool = True
    host_layer_seconds: Latency | None = None
    host_op_seconds: Latency | None = None

    _units: ClassVar[dict[str, str]] = {
        "peak_flops_fp32": "flops",
        "peak_flops_bf16": "flops",
        "memory_bytes": "memory",
        "memory_bandwidth": "bandwidth",
        "kernel_latency": "latency",
        "host_layer_seconds": "latency",
        "host_op_seconds": "latency",
    }


class DeviceGroups(_Spec):
    """Groups of `size` consecutive devices inside a node that share a faster `link`."""

    size: int = Field(gt=0, strict=True)
    link: Link


class Racks(_Spec):
    """Nodes grouped into racks of `nodes_per_rack`; `link` joins nodes in different racks."""

    nodes_per_rack: int = Field(gt=0, strict=True)
    link: Link


class Links(_Spec):
    intra_node: Link
    inter_node: Link


# The runtime's gradient bucket (DDP's default, bucket_cap_mb=25): a replica group's weight
# gradients are all-reduced in buckets of at least this many bytes. With gloo on a 2-core VM
# 230 MB of gradients reduce in 178 ms as 25 MB buckets, 242 ms as 8 MB and 199 ms as 64 MB.
GRADIENT_BUCKET_BYTES = 25 << 20


class Cluster(_Spec):
    """A homogeneous cluster: `nodes` x `devices_per_node` devices of one `device` type.

    `sync` prices gradient synchronisation (t_s): `ring`, one ring all-reduce per layer (a
    latency per layer); `parameter_server`, the paper's round trip per layer; `bucketed`, the
    layerwise runtime's own pattern, a group's gradients in buckets of GRADIENT_BUCKET_BYTES
    (a latency per bucket; `layerwise calibrate` writes this, since it measures the runtime).
    `bucket_copy_bandwidth`: how fast a device copies its gradients into a bucket's flat
    buffer, which the runtime does once a step before each bucket's all-reduce (measured by
    `layerwise calibrate`; None where not measured: not priced).
    """

    schema_version: int = SCHEMA_VERSION
    name: Name = Field(min_length=1)
    description: Name = ""
    nodes: int = Field(gt=0, strict=True)  # `nodes: true` is not one node
    devices_per_node: int = Field(gt=0, strict=True)
    device: DeviceType
    links: Links
    groups: DeviceGroups | None = None
    racks: Racks | None = None
    sync: Literal["ring", "parameter_server", "bucketed"] = "ring"
    compute_efficiency: float = Field(default=0.5, gt=0, le=1)
    bucket_copy_bandwidth: Bandwidth | None = None

    @model_validator(mode="after")
    def _check_structure(self) -> Cluster:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version: this layerwise reads version {SCHEMA_VERSION} "
                f"(got {self.schema_version})"
            )
        if self.groups is not None and self.devices_per_node % self.groups.size:
            raise ValueError(
                f"groups.size: must divide devices_per_node ({self.devices_per_node}) "
                f"(got {self.groups.size})"
            )
        for where, link, unit, devices in self._port_units():
            if unit == 1 and link.shared_by > 1:
                raise ValueError(
                    f"{where}.shared_by: must be 1 (got {link.shared_by}): each device has "
                    "its own port of this link; devices behind one switch are a `groups` entry"
                )
            if unit % link.shared_by:
                raise ValueError(
                    f"{where}.shared_by: the devices sharing a port sit in one {devices} "
                    f"({unit} devices), so it must divide {unit} (got {link.shared_by})"
                )
        return self

    def _port_units(self) -> list[tuple[str, Link, int, str]]:
        """Each link with the unit its ports serve: (where in the spec, link, devices in that
        unit, what the unit is). Traffic leaves a node through the node's ports, a group
        through the group's, and a group's own link joins single devices."""
        group = self.groups.size if self.groups is not None else 1
        units = [("links.intra_node", self.links.intra_node, group, "device group"),
                 ("links.inter_node", self.links.inter_node, self.devices_per_node, "node")]
        if self.groups is not None:
            units.append(("groups.link", self.groups.link, 1, "device"))
        if self.racks is not None:
            units.append(("racks.link", self.racks.link, self.devices_per_node, "node"))
        return units

    # -- structure ----------------------------------------------------------------------------

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    def _device(self, device: Any) -> int:
        try:
            d = operator.index(device)
        except TypeError:
            raise ClusterError(f"device id must be an integer (got {shown(device)})") from None
        if not 0 <= d < self.num_devices:
            raise ClusterError(
                f"device {d} is out of range: cluster '{self.name}' has devices "
                f"0..{self.num_devices - 1}"
            )
        return d

    def node_of(self, device: int) -> int:
        """The node that holds `device`."""
        return self._device(device) // self.devices_per_node

    def rack_of(self, device: int) -> int:
        """The rack that holds `device` (0 for every device when there are no racks)."""
        node = self.node_of(device)
        return node // self.racks.nodes_per_rack if self.racks is not None else 0

    def link(self, a: int, b: int) -> Link | None:
        """The link between devices `a` and `b`; None when a == b (no transfer needed)."""
        a, b = self._device(a), self._device(b)
        if a == b:
            return None
        if self.groups is not None and a // self.groups.size == b // self.groups.size:
            return self.groups.link
        node_a, node_b = a // self.devices_per_node, b // self.devices_per_node
        if node_a == node_b:
            return self.links.intra_node
        if self.racks is None or (
            node_a // self.racks.nodes_per_rack == node_b // self.racks.nodes_per_rack
        ):
            return self.links.inter_node
        return self.racks.link

    def link_tiers(self) -> list[tuple[int, Link]]:
        """The hierarchy as nested units of consecutive devices, innermost first: (size, link)
        where two devices in one unit of `size` but in different units of the tier before
        (single devices before the first) talk over `link`, as `link` says. Units of a size
        are the device ranges [k * size, (k + 1) * size); the last tier spans the cluster."""
        sizes = [self.groups.size] if self.groups is not None else []
        sizes.append(self.devices_per_node)
        if self.racks is not None:
            sizes.append(self.devices_per_node * self.racks.nodes_per_rack)
        sizes.append(self.num_devices)
        tiers: list[tuple[int, Link]] = []
        inner = 1
        for size in sizes:
            if inner < size <= self.num_devices:
                link = self.link(0, inner)
                assert link is not None  # devices 0 and inner > 0 differ
                tiers.append((size, link))
                inner = size
        return tiers

    def slowest_link(self, devices: Iterable[int]) -> Link | None:
        """The bottleneck among all pairs of `devices`: min bandwidth and max latency.

        None for fewer than two distinct devices. Computed from which levels of the hierarchy
        the set spans (group, node, rack, cluster), in time linear in len(devices). When the
        lowest bandwidth and the highest latency come from different levels, the result
        combines them.
        """
        ids = {self._device(d) for d in devices}
        if len(ids) < 2:
            return None
        dpn = self.devices_per_node
        spanned: list[Link] = []
        if self.groups is not None:
            size = self.groups.size
            group_counts = Counter(d // size for d in ids)
            if any(c > 1 for c in group_counts.values()):
                spanned.append(self.groups.link)
            # two different groups on one node talk over intra_node
            per_node = dpn // size
            if any(c > 1 for c in Counter(g // per_node for g in group_counts).values()):
                spanned.append(self.links.intra_node)
            nodes = {g // per_node for g in group_counts}
        else:
            node_counts = Counter(d // dpn for d in ids)
            if any(c > 1 for c in node_counts.values()):
                spanned.append(self.links.intra_node)
            nodes = set(node_counts)
        if self.racks is None:
            if len(nodes) > 1:
                spanned.append(self.links.inter_node)
        else:
            rack_counts = Counter(n // self.racks.nodes_per_rack for n in nodes)
            if any(c > 1 for c in rack_counts.values()):
                spanned.append(self.links.inter_node)
            if len(rack_counts) > 1:
                spanned.append(self.racks.link)
        bandwidth = min(link.bandwidth for link in spanned)
        latency = max(link.latency for link in spanned)
        for link in spanned:  # one level that is both, as it is
            if link.bandwidth == bandwidth and link.latency == latency:
                return link
        return Link(bandwidth=bandwidth, latency=latency)

    # -- output -------------------------------------------------------------------------------

    def to_yaml(self) -> str:
        """This cluster as YAML with human units; `load_cluster` reads it back equal."""
        header = f"# layerwise cluster spec (schema_version {self.schema_version})\n"
        return header + yaml.safe_dump(
            _to_plain(self),
            sort_keys=False,
            allow_unicode=True,
            default_flow_style=False,
            width=120,
        )


def _to_plain(model: _Spec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in type(model).model_fields:
        value = getattr(model, field)
        if isinstance(value, _Spec):
            value = _to_plain(value)
        elif value is not None and field in model._units:
            value = format_quantity(value, model._units[field])
        out[field] = value
    return out


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that a validation error location (minus its last part) points into."""
    model: type[BaseModel] = Cluster
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        annotation = field.annotation
        candidates = getattr(annotation, "__args__", (annotation,))
        sub = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if sub is None:
            return None
        model = sub
    return model


def _error_line(error: Mapping[str, Any]) -> str:
    """One pydantic error as 'dotted.path: what is wrong'."""
    loc = tuple(error.get("loc", ()))
    path = ".".join(str(p) for p in loc)
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    got = shown(error.get("input"))
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        known = f" (known fields: {', '.join(parent.model_fields)})" if parent else ""
        text = f"unknown field{known}"
    elif kind == "missing":
        text = "required field is missing"
    elif kind == "greater_than":
        text = f"must be > {ctx.get('gt')} (got {got})"
    elif kind == "greater_than_equal":
        text = f"must be >= {ctx.get('ge')} (got {got})"
    elif kind == "less_than_equal":
        text = f"must be <= {ctx.get('le')} (got {got})"
    elif kind == "less_than":
        text = f"must be < {ctx.get('lt')} (got {got})"
    elif kind == "literal_error":
        text = f"must be {ctx.get('expected')} (got {got})"
    elif kind == "string_too_short":
        text = "must not be empty"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        text = f"must be a mapping of fields (got {got})"
    elif kind == "value_error" and "error" in ctx:
        text = str(ctx["error"])
    else:
        msg = str(error.get("msg", "invalid value"))
        msg = msg[:1].lower() + msg[1:]
        text = f"{msg} (got {got})"
    text = " ".join(text.split())
    return f"{path}: {text}" if path else text


def cluster_from_mapping(data: Any, source: str = "cluster") -> Cluster:
    """Validate a mapping (parsed YAML, or built in code) into a Cluster.

    Raises ClusterError with one line ``"{source}: field.path: what is wrong"``.
    """
    if not isinstance(data, Mapping):
        kind = "nothing (the file is empty)" if data is None else f"a {type(data).__name__}"
        raise ClusterError(
            f"{source}: the top level must be a mapping of cluster fields "
            f"(name, nodes, devices_per_node, device, links, ...), got {kind}"
        )
    try:
        return Cluster.model_validate(dict(data))
    except ValidationError as exc:
        errors = exc.errors()
        first = _error_line(errors[0]) if errors else "invalid cluster"
        raise ClusterError(f"{source}: {first}") from None


def _parse_yaml(text: str, source: str) -> Cluster:
    return cluster_from_mapping(parse_yaml(text, source, ClusterError), source)


def _presets_dir():
    return resources.files("layerwise.strategies.hardware").joinpath("clusters")


@cache
def preset_names() -> list[str]:
    """Names of the bundled cluster presets, sorted."""
    names = [
        entry.name[: -len(".yaml")]
        for entry in _presets_dir().iterdir()
        if entry.is_file() and entry.name.endswith(".yaml")
    ]
    return sorted(names)


@cache
def _load_preset(name: str) -> Cluster:
    text = _presets_dir().joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    return _parse_yaml(text, f"cluster preset '{name}'")


def presets() -> list[Cluster]:
    """Every bundled preset, in `preset_names()` order."""
    return [_load_preset(name) for name in preset_names()]


def _hint() -> str:
    return f"presets: {', '.join(preset_names())}; a path to a cluster YAML file works too"


def _load_file(path: Path) -> Cluster:
    source = f"cluster file {path}"
    if not path.exists():
        raise ClusterError(f"{source}: no such file ({_hint()})")
    return cluster_from_mapping(read_yaml(path, source, ClusterError), source)


def load_cluster(name_or_path: str | os.PathLike[str] | Cluster) -> Cluster:
    """A preset by name (see `preset_names()`) or a cluster YAML file by path.

    A `Path` is always a file; a string is a preset name when one has that name, else a path
    when it looks like one (has a directory separator, a .yaml/.yml suffix, or exists). A
    `Cluster` is returned as is. Raises ClusterError with a one-line message.
    """
    if isinstance(name_or_path, Cluster):
        return name_or_path
    if isinstance(name_or_path, os.PathLike):
        return _load_file(Path(name_or_path))
    if not isinstance(name_or_path, str):
        raise ClusterError(
            f"a cluster is a preset name or a path, not {shown(name_or_path)} ({_hint()})"
        )
    text = name_or_path.strip()
    if text in preset_names():
        return _load_preset(text)
    path = Path(text).expanduser()
    looks_like_path = (
        "/" in text
        or os.sep in text
        or path.suffix.lower() in (".yaml", ".yml")
        or (bool(text) and path.exists())
    )
    if looks_like_path:
        return _load_file(path)
    raise ClusterError(f"unknown cluster '{name_or_path}': {_hint()}")
