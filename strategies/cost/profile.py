"""Measured compute time of every layer tile: t_c of Jia et al. 2018, section 3 and Eq. 1.

t_c(l, c) is the time one training step spends computing the largest tile of layer `l` under config
`c` (devices run their tiles at once, so the largest one sets the pace): its forward, its backward
and the SGD update of its weight shard (ParaDL's WU_l; Jia et al.'s t_c leaves the update out, yet
it is ~30% of AlexNet's step on a CPU and a data-parallel device updates every weight). Jia et al.
MEASURE t_c by running the layer in that configuration; so does this module: for each distinct tile
of each layer it builds real tensors of the tile's shapes (`tiles.largest_tile`: the output box and
the needed input boxes, halos included), runs on them the very functions the runtime's tiles run
(`layerwise.strategies.model.ops`: conv with the tile's weight shard, pooling, linear, add, concat,
flatten, elementwise) followed by its fused ops (BatchNorm in training mode, activations, dropout),
then the backward pass and the update, and keeps the median time. Values do not change the time, so
the tensors are fresh random ones made from the layer's parameter shapes: the model's weights are
never needed (a meta-device model works).

Many configs share a tile (`TileWork.key`): each distinct key of each layer is measured once. A
`Profile` holds the medians, layer name -> tile key -> seconds (forward + backward in
`seconds`, the update in `update_seconds`, the forward alone in `forward_seconds`: what
recomputing the tile in the backward costs), with the identity of what was measured (model
structure, global batch, device, torch version, dtype, and how many profilers ran at once). It
is stored as JSON under data/profiles/, named so that a different model, batch, device, torch
version or concurrency gets its own file; `profile_graph(existing=...)` extends a profile with
only the tiles it lacks.

On CPUs the ranks of one machine share its cores' caches and memory bandwidth, so
`profile_graph_concurrently` runs one profiler per rank at once: the profile a run of P
processes on this machine should be predicted from (`Profile.processes` = P).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import queue
import shlex
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import torch
import torch.multiprocessing as torch_mp
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.atomic import read_json_model, write_atomic
from layerwise.strategies.files.documents import read_json
from layerwise.strategies.files.locations import PROFILE_DIR, safe_name
from layerwise.strategies.hardware.this_machine import device_name, resolve_device
from layerwise.strategies.model import ops
from layerwise.strategies.model.fx_nodes import count_include_pad
from layerwise.strategies.model.graph import Layer, LayerGraph, param_key
from layerwise.strategies.model.op_call import OpCall
from layerwise.strategies.model.space import ParallelConfig, enumerate_configs
from layerwise.strategies.model.tiles import TileWork, as_view, largest_tile, tile_box
from layerwise.strategies.processes.huge_pages import huge_pages_in_use
from layerwise.strategies.processes.owned_folder import owned_folder
from layerwise.strategies.processes.parent_death import die_with_multiprocessing_parent
from layerwise.strategies.processes.terminate import start_then_join, terminate_as_exit
from layerwise.strategies.sgd import Sgd

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_REPEATS",
    "DEFAULT_WARMUP",
    "SCHEMA_VERSION",
    "SGD_MOMENTUM",
    "SGD_WEIGHT_DECAY",
    "Profile",
    "TileProgram",
    "TileTimes",
    "build_tile",
    "concurrent_threads",
    "default_profile_path",
    "measure_tile",
    "missing_tiles",
    "profile_graph",
    "profile_key",
    "run_tile",
    "tile_plan",
    "total_seconds",
]

# Schema 2: a tile's time includes the SGD update of its weight shard; a schema-1 profile
# (passes only) is measured again, see Profile.reusable.
SCHEMA_VERSION = 2
DTYPE = "float32"  # fp32 training, as in every paper layerwise implements

# Repetitions per tile. CPU runs are slow and steady, GPU runs fast and noisier.
DEFAULT_WARMUP = {"cpu": 1, "cuda": 5}
DEFAULT_REPEATS = {"cpu": 3, "cuda": 10}
# Stop repeating a tile once its timed runs add up to this: big tiles are stable, and a CPU
# profile of ResNet-18 must finish in minutes.
DEFAULT_BUDGET_S = 0.2

# A tile's step ends with the SGD update of its weight shard with the defaults of `layerwise
# train` (momentum and weight decay each add a pass over the weights). A tiny rate keeps the
# random weights where they are; the rate does not change the time.
SGD_MOMENTUM = 0.9
SGD_WEIGHT_DECAY = 1e-4
UPDATE_LR = 1e-9

DROPOUT_P = 0.5  # FusedOp does not carry p; the time of dropout does not depend on it
# BatchNorm's momentum and eps are not in the graph: torch's defaults (they do not change the time)
BATCH_NORM_MOMENTUM = 0.1
BATCH_NORM_EPS = 1e-5

ProgressCallback = Callable[[int, int, str], None]


# ---------------------------------------------------------------------------------------------
# The stored profile
# ---------------------------------------------------------------------------------------------


# A measured time: a negative or NaN one (a hand-edited or damaged file) would price Eq. 1
# with nonsense, printed as -998.66 ms or nanx and searched as a saving
# a tile measured above an hour is not a measurement (and 1e308 makes every step inf)
Seconds = Annotated[float, Field(ge=0, le=3600.0, allow_inf_nan=False)]


class Profile(BaseModel):
    """Median seconds of each distinct tile of each layer of one model: forward + backward in
    `seconds`, the SGD update of the tile's weight shard in `update_seconds` (0 without
    weights), both layer name -> tile key -> seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    model: str
    structure_hash: str
    input_shape: tuple[int, ...]
    device_name: str
    device_type: Literal["cpu", "cuda"]
    torch_version: str
    dtype: str = DTYPE
    batch: int
    devices: int
    threads: int
    processes: int = 1  # profilers that ran at once on this machine, one per rank of a run
    # whether the profilers' large CPU tensors were on huge pages (processes/huge_pages.py): it
    # moves a large layer's CPU time, so it is part of the key; False in files from before
    huge_pages: bool = False
    method: str
    warmup: int
    repeats: int
    seconds: dict[str, dict[str, Seconds]]
    update_seconds: dict[str, dict[str, Seconds]]
    # the forward alone, of the tiles measured since it was recorded (none in older files)
    forward_seconds: dict[str, dict[str, Seconds]] = {}
    created: str

    @property
    def key(self) -> str:
        """The file-name key of this profile (see `profile_key`)."""
        return _key(self.model, self.structure_hash, self.device_name, self.dtype, self.batch,
                    self.torch_version, self.processes, self.huge_pages)

    @property
    def tile_count(self) -> int:
        return sum(len(tiles) for tiles in self.seconds.values())

    def tile_seconds(self, layer_name: str, tile_key: str) -> float:
        """The measured forward + backward of one tile; LayerwiseError (one line) when it was
        not measured."""
        return self._lookup(self.seconds, layer_name, tile_key)

    def tile_forward_seconds(self, layer_name: str, tile_key: str) -> float | None:
        """The measured forward alone of one tile; None where the file predates it."""
        return self.forward_seconds.get(layer_name, {}).get(tile_key)

    def tile_update_seconds(self, layer_name: str, tile_key: str) -> float:
        """The measured SGD update of one tile's weight shard (0 for a layer without weights);
        LayerwiseError (one line) when it was not measured."""
        return self._lookup(self.update_seconds, layer_name, tile_key)

    def _lookup(self, table: dict[str, dict[str, float]], layer_name: str,
                tile_key: str) -> float:
        tiles = table.get(layer_name)
        if tiles is None:
            raise LayerwiseError(
                f"profile of {self.model} (batch {self.batch}, {self.device_name}) has no layer "
                f"'{layer_name}'; {self._rerun_hint()}"
            )
        seconds = tiles.get(tile_key)
        if seconds is None:
            raise LayerwiseError(
                f"profile of {self.model} (batch {self.batch}, {self.device_name}) has no time "
                f"for layer '{layer_name}' tile {tile_key} (it covers configs on up to "
                f"{self.devices} devices); {self._rerun_hint()}"
            )
        return seconds

    def check_matches(self, graph: LayerGraph, batch: int | None = None,
                      source: str | Path | None = None) -> None:
        """LayerwiseError (one line) unless this profile was made for `graph` at `batch`."""
        batch = graph.batch if batch is None else batch
        if self.structure_hash == graph.structure_hash and self.batch == batch:
            return
        where = f"profile {source}" if source is not None else "the profile"
        raise LayerwiseError(
            f"{where} was made for model {self.model} (structure {self.structure_hash}, batch "
            f"{self.batch}); this run needs {graph.model} (structure {graph.structure_hash}, "
            f"batch {batch}); rerun {_profile_command(graph.model, graph.input_shape, batch)}"
        )

    def check_device(self, name: str, torch_version: str, huge_pages: bool, dtype: str = DTYPE,
                     source: str | Path | None = None) -> None:
        """LayerwiseError unless this profile was measured on `name` with this torch, dtype and
        huge-page setting."""
        here = (name, torch_version, dtype, _pages(huge_pages))
        there = (self.device_name, self.torch_version, self.dtype, _pages(self.huge_pages))
        if here == there:
            return
        where = f"profile {source}" if source is not None else "the profile"
        raise LayerwiseError(
            f"{where} was measured on {there[0]} with torch {there[1]} ({there[2]}, "
            f"{there[3]}); this machine is {here[0]} with torch {here[1]} ({here[2]}, "
            f"{here[3]}); profile again with --force "
            "or write to another --out file"
        )

    def check_processes(self, processes: int, source: str | Path | None = None) -> None:
        """LayerwiseError unless this profile was measured with `processes` profilers at once
        (times measured beside other ranks differ from times measured alone)."""
        if self.processes == processes:
            return
        where = f"profile {source}" if source is not None else "the profile"
        raise LayerwiseError(
            f"{where} was measured with {self.processes} profiler(s) at once; this one needs "
            f"{processes}; profile again with --force or write to another --out file"
        )

    def _rerun_hint(self) -> str:
        return (f"profile again with {_profile_command(self.model, self.input_shape, self.batch)} "
                "using the device count of this search (it measures only the tiles the file lacks)")

    def save(self, path: str | Path) -> Path:
        """Write this profile as JSON, atomically."""
        return write_atomic(path, self.model_dump_json(indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """Read a profile written by `save`; LayerwiseError (one line) on any problem."""
        return read_json_model(cls, path, "profile",
                               "make one with `layerwise profile` (or profile again with --force)")

    @classmethod
    def reusable(cls, path: str | Path) -> Profile | None:
        """The profile at `path` to extend, or None when there is none to extend: no file, or
        one an older layerwise measured another way (a lower schema_version), which is then
        measured again and replaced. A broken file or a newer schema is an error, as in load."""
        source = Path(path)
        if not source.exists():
            return None
        with contextlib.suppress(LayerwiseError):
            data = read_json(source, f"profile {source}")
            version = data.get("schema_version") if isinstance(data, dict) else None
            if isinstance(version, int) and version < SCHEMA_VERSION:
                return None
        return cls.load(source)


def _profile_command(model: str, input_shape: Sequence[int], batch: int) -> str:
    """The command that profiles `model` at this input, ready to paste into a shell."""
    shape = ",".join(str(size) for size in input_shape[1:])
    return (f"`layerwise profile {shlex.quote(model)} --devices N --batch {batch} "
            f"--input-shape {shape}`")


# ---------------------------------------------------------------------------------------------
# Where profiles live
# ---------------------------------------------------------------------------------------------


def _pages(huge_pages: bool) -> str:
    return f"huge pages {'on' if huge_pages else 'off'}"


def _key(model: str, structure_hash: str, device: str, dtype: str, batch: int,
         torch_version: str, processes: int = 1, huge_pages: bool = False) -> str:
    concurrent = f"-x{processes}" if processes > 1 else ""
    pages = "-hugepages" if huge_pages else ""
    return (f"{safe_name(model)}-{structure_hash}-{safe_name(device, 40)}-{dtype}-b{batch}"
            f"-torch{safe_name(torch_version, 24)}{pages}{concurrent}")


def profile_key(graph: LayerGraph, device_name: str, dtype: str = DTYPE,
                batch: int | None = None, torch_version: str | None = None,
                processes: int = 1, huge_pages: bool | None = None) -> str:
    """File-name key: model, structure hash, device, dtype, global batch, torch version and,
    `-hugepages` when the profilers ran with huge pages (default: as this process's
    environment says) and, when several ran at once, their number (`-xP`).

    Anything that changes a tile's time changes the key, so a new device or torch upgrade
    profiles again instead of reusing stale numbers.
    """
    return _key(graph.model, graph.structure_hash, device_name, dtype,
                graph.batch if batch is None else batch, torch_version or torch.__version__,
                processes, huge_pages_in_use() if huge_pages is None else huge_pages)


def default_profile_path(graph: LayerGraph, device_name: str, dtype: str = DTYPE,
                         batch: int | None = None, *, torch_version: str | None = None,
                         processes: int = 1, huge_pages: bool | None = None,
                         root: str | Path | None = None) -> Path:
    """data/profiles/<key>.json under `root` (default: the current directory)."""
    base = Path(root) if root is not None else Path()
    key = profile_key(graph, device_name, dtype, batch, torch_version, processes, huge_pages)
    return base / PROFILE_DIR / f"{key}.json"


# ---------------------------------------------------------------------------------------------
# The device
# ---------------------------------------------------------------------------------------------






# ---------------------------------------------------------------------------------------------
# One tile: the layer's computation on tensors of the tile's shapes
# ---------------------------------------------------------------------------------------------


# a tile's forward: (its input boxes, its parameter shards by name) -> its output
Compute = Callable[[Sequence[torch.Tensor], Mapping[str, torch.Tensor]], torch.Tensor]
# a one-input elementwise op: (tensor, the tile's parameter shards by name) -> tensor
Elementwise = Callable[[torch.Tensor, Mapping[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class TileProgram:
    """Leaf tensors of one tile and the forward computation that produces its output."""

    inputs: tuple[torch.Tensor, ...]
    params: dict[str, torch.Tensor]
    compute: Compute

    def forward(self) -> torch.Tensor:
        return self.compute(self.inputs, self.params)

    @property
    def leaves(self) -> list[torch.Tensor]:
        """Tensors whose gradient backprop computes: the tile's weights and activation inputs."""
        tensors = [*self.inputs, *self.params.values()]
        return [tensor for tensor in tensors if tensor.requires_grad]


def _tile_channels(tile: TileWork) -> int:
    return as_view(tile.output_shape)[1]


def _tile_param_shapes(layer: Layer, tile: TileWork) -> dict[str, tuple[int, ...]]:
    """Each parameter's shard on the tile's device: its channel dim (`Layer.channel_dim`: dim
    0 of conv/linear weights, biases and fused BatchNorm's affine vectors, dim 1 of a
    transposed convolution's weight) cut to the tile's output channels (Jia et al. 2018: a
    channel split shards the weights); anything else is replicated.
    """
    channels = _tile_channels(tile)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in layer.param_shapes.items():
        dim = layer.channel_dim(name, shape)
        if dim is not None:
            shape = (*shape[:dim], channels, *shape[dim + 1:])
        shapes[name] = shape
    return shapes


def _whole_group(values: torch.Tensor) -> torch.Tensor:
    """The replica group's all-reduce of BatchNorm statistics, as one device computes it: the
    transfer is the cost model's sync time (t_s), not the tile's compute."""
    return values


def _batch_norm(layer: Layer, tile: TileWork, prefix: str,
                device: torch.device) -> Elementwise:
    """BatchNorm of the tile as the runtime's tile runs it (`ops.batch_norm`): torch's own
    when the tile holds every sample and position of its channels, else synchronised over its
    replica group; its running statistics updated as the runtime's shards are."""
    channels = as_view(tile.output_shape)[1]
    count = math.prod(layer.output_shape) // layer.output_shape[1]
    reduce = None if math.prod(tile.output_shape) // channels == count else _whole_group
    running_mean = torch.zeros(channels, device=device)
    running_var = torch.ones(channels, device=device)

    def apply(x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return ops.batch_norm(x, params.get(f"{prefix}weight"), params.get(f"{prefix}bias"),
                              running_mean, running_var, BATCH_NORM_MOMENTUM, BATCH_NORM_EPS,
                              count, reduce)

    return apply


def _group_norm(op: str, layer: Layer, tile: TileWork, prefix: str) -> Elementwise:
    """GroupNorm of the tile (`ops.group_norm`) with the group count its op name keeps: the
    tile's own statistics when it holds whole planes, else the plane's tiles' sum (timed as
    one device computes it, the transfer being the cost model's t_s)."""
    groups = int(op.partition("(")[2].rstrip(")"))
    channels = layer.output_shape[1]
    plane = math.prod(layer.output_shape[2:])
    reduce = None if math.prod(tile.output_shape[2:]) == plane else _whole_group

    def apply(x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return ops.group_norm(x, groups, channels, params.get(f"{prefix}weight"),
                              params.get(f"{prefix}bias"), BATCH_NORM_EPS, plane, reduce)

    return apply


def _dropout(tile: TileWork, unit: str) -> Elementwise:
    """Dropout of the tile (`ops.dropout`) with its mask drawn as it runs (`ops.dropout_mask`):
    a step draws every mask, so the draw is timed with the op."""
    shape = tuple(tile.output_shape)
    box = tuple((0, size) for size in as_view(shape))  # the mask is the tile's own

    def apply(x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        mask = ops.dropout_mask(shape, DROPOUT_P, unit, x.device, x.dtype)
        return ops.dropout(x, mask, box)

    return apply


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "relu6": F.relu6,
    "leaky_relu": F.leaky_relu,
    "elu": F.elu,
    "gelu": F.gelu,
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "hardswish": F.hardswish,
    "identity": lambda x: x,
    "contiguous": lambda x: x.contiguous(),
    "add_scalar": lambda x: x + 1.0,
    "sub_scalar": lambda x: x - 1.0,
    "mul_scalar": lambda x: x * 2.0,
}
# graph.py's op of a tensor combined with a parameter it reads directly -> the combination
_WITH_PARAMETER: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "mul_param": torch.mul, "add_param": torch.add, "sub_param": torch.sub}
# dropout op (graph.py's name) -> what one draw of its mask covers
_DROPOUTS = {"dropout": "element", "dropout1d": "channel", "dropout2d": "channel",
             "dropout3d": "channel", "stochastic_depth": "sample",
             "stochastic_depth(batch)": "batch"}
# nn module class name -> the functional name above
_MODULE_OPS = {"ReLU": "relu", "ReLU6": "relu6", "LeakyReLU": "leaky_relu", "ELU": "elu",
               "GELU": "gelu", "SiLU": "silu", "Sigmoid": "sigmoid", "Tanh": "tanh",
               "Hardswish": "hardswish", "Dropout": "dropout", "Dropout1d": "dropout1d",
               "Dropout2d": "dropout2d", "Dropout3d": "dropout3d", "Identity": "identity"}


def _elementwise(op: str, function: OpCall | None, layer: Layer, tile: TileWork, prefix: str,
                 device: torch.device) -> Elementwise:
    """A one-input elementwise op on the tile, as the runtime's tile runs it: (tensor, params)
    -> tensor, its parameters named `prefix` + name in params ("" for the layer's own op,
    "target." for a fused one); `function` is the op's `Layer.function`."""
    if op in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"):
        return _batch_norm(layer, tile, prefix, device)
    if op.partition("(")[0] in ("GroupNorm", "group_norm"):
        return _group_norm(op, layer, tile, prefix)
    if op == "PReLU":
        return lambda x, params: F.prelu(x, params[f"{prefix}weight"])
    if op in _WITH_PARAMETER:  # a parameter used directly (a layer scale): the one it reads
        return lambda x, params: _WITH_PARAMETER[op](x, next(
            value for key, value in params.items()
            if key.startswith(prefix) and "." not in key[len(prefix):]))
    if op in ("InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"):
        return lambda x, params: ops.sync_instance_norm(
            x, params.get(f"{prefix}weight"), params.get(f"{prefix}bias"), BATCH_NORM_EPS,
            math.prod(x.shape[2:]), None)
    if op.partition("(")[0] in ("LayerNorm", "layer_norm"):
        return lambda x, params: ops.layer_norm(x, params.get(f"{prefix}weight"),
                                                params.get(f"{prefix}bias"), BATCH_NORM_EPS,
                                                ops.normalizes_channels(op))
    name = _MODULE_OPS.get(op, op)
    if name in _DROPOUTS:
        return _dropout(tile, _DROPOUTS[name])
    activation = _ACTIVATIONS.get(name) or _by_nature(op, function, layer)
    return lambda x, params: ops.activation(x, activation, writes_input=False)


def _by_nature(op: str, function: OpCall | None, layer: Layer) -> Callable[[torch.Tensor],
                                                                         torch.Tensor]:
    """An elementwise op the layer graph took by its nature (Hardsigmoid, Mish, a library's
    own function), rebuilt from what the graph wrote down of its call."""
    try:
        if function is None:
            raise ValueError("the layer graph kept no call for it")
        return function.build()
    except Exception as error:  # an import, a lookup or a bare instance: the same answer
        raise LayerwiseError(
            f"cannot profile layer '{layer.name}': its elementwise op '{op}' cannot run "
            f"without the model ({error}); price t_c with the device model (--analytic) "
            "instead of a profile") from error


def _main_op(layer: Layer, tile: TileWork, device: torch.device) -> Compute:
    """The layer's own op on the tile: the runtime's `ops.layer_op` at a place of the tile's
    shapes (`tiles.tile_box`), or its elementwise op."""
    if layer.kind == "elementwise":
        apply = _elementwise(layer.op, layer.function, layer, tile, "", device)
        return lambda inputs, params: apply(inputs[0], params)
    box = tile_box(layer, tile)
    include_pad = count_include_pad(layer.op, None)

    def compute(inputs: Sequence[torch.Tensor], params: Mapping[str, torch.Tensor]):
        return ops.layer_op(layer, inputs, params.get("weight"), params.get("bias"), box,
                            include_pad)

    return compute


def _tile_compute(layer: Layer, tile: TileWork, device: torch.device) -> Compute:
    """The layer's operation on the tile, then its fused ops in order."""
    main = _main_op(layer, tile, device)
    fused = [_elementwise(op.op, op.function, layer, tile, param_key(op.target, ""), device)
             for op in layer.fused]

    def compute(inputs: Sequence[torch.Tensor], params: Mapping[str, torch.Tensor]):
        y = main(inputs, params)
        for apply in fused:
            y = apply(y, params)
        return y

    return compute


def build_tile(layer: Layer, tile: TileWork, device: str | torch.device = "cpu",
               needs_input_grad: Sequence[bool] | None = None, seed: int = 0) -> TileProgram:
    """Random leaf tensors of the tile's input and weight-shard shapes, and its computation.

    `needs_input_grad` says per input whether backprop computes its gradient (False for the
    network's input images); default: all inputs. Weights always need their gradient.
    """
    if layer.kind == "input":
        raise LayerwiseError(f"layer '{layer.name}' is the network input: nothing to run")
    grads = tuple(needs_input_grad) if needs_input_grad is not None else (True,) * len(
        tile.input_shapes)
    generator = torch.Generator().manual_seed(seed)
    target = torch.device(device)

    def leaf(shape: Sequence[int], requires_grad: bool) -> torch.Tensor:
        values = torch.randn(tuple(shape), generator=generator, dtype=torch.float32)
        return values.to(target).requires_grad_(requires_grad)

    inputs = tuple(leaf(shape, grad) for shape, grad in zip(tile.input_shapes, grads,
                                                            strict=True))
    params = {name: leaf(shape, True) for name, shape in _tile_param_shapes(layer, tile).items()}
    return TileProgram(inputs=inputs, params=params, compute=_tile_compute(layer, tile, target))


def run_tile(layer: Layer, tile: TileWork, device: str | torch.device = "cpu") -> torch.Tensor:
    """The tile's forward output (its shape is exactly `tile.output_shape`)."""
    return build_tile(layer, tile, device).forward()


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


class TileTimes(NamedTuple):
    """Median seconds of one tile's training step, in its two parts: forward + backward (run
    once per micro-batch) and the SGD update of its weight shard (once per step); and the
    forward alone (what recomputing the tile in the backward costs)."""

    passes: float
    update: float
    forward: float = 0.0


class _Passes:
    """Forward and backward of the tile as a step runs them, timed apart: the forward with
    the gradients cleared (set to None, as zero_grad does), then the backward into the leaves'
    .grad."""

    def __init__(self, program: TileProgram, grad_output: torch.Tensor) -> None:
        self.program, self.grad_output = program, grad_output
        self.output: torch.Tensor | None = None

    def forward(self) -> None:
        for leaf in self.program.leaves:
            leaf.grad = None
        self.output = self.program.forward()

    def backward(self) -> None:
        if self.output is not None and self.output.requires_grad:
            self.output.backward(self.grad_output)
        self.output = None


def _cpu_times(parts: Sequence[Callable[[], None]], repeats: int, budget_s: float,
               ) -> list[list[float]]:
    """Up to `repeats` runs of the parts in turn, each part timed; stops once runs add up to
    `budget_s` (at least one run)."""
    times: list[list[float]] = []
    while len(times) < repeats and (not times or math.fsum(map(sum, times)) < budget_s):
        run = []
        for part in parts:
            start = time.perf_counter()
            part()
            run.append(time.perf_counter() - start)
        times.append(run)
    return times


def _cuda_times(parts: Sequence[Callable[[], None]], repeats: int, budget_s: float,
                device: torch.device) -> list[list[float]]:
    """As _cpu_times, timed by CUDA events recorded between the parts, the runs queued back
    to back: the host issues run after run without waiting for the device, as a step issues
    layer after layer, so a part's time is the device's while the device is the slower and
    the host's while the host is (timing each run alone, the device idled while the host
    issued the first kernels: 1.2-1.8x a step's compute on networks of small layers,
    benchmarks/tile_overlap.py). The host stops queueing once `budget_s` of wall time has
    passed (at least one run)."""
    runs: list[list[torch.cuda.Event]] = []
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    while len(runs) < repeats and (not runs or time.perf_counter() - started < budget_s):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(len(parts) + 1)]
        events[0].record()
        for part, end in zip(parts, events[1:], strict=True):
            part()
            end.record()
        runs.append(events)
    if runs:  # none for a warm-up of 0 runs
        runs[-1][-1].synchronize()
    return [[start.elapsed_time(end) / 1000.0  # elapsed_time is in ms
             for start, end in itertools.pairwise(events)] for events in runs]


def measure_tile(layer: Layer, tile: TileWork, device: str | torch.device = "cpu",
                 warmup: int | None = None, repeats: int | None = None,
                 budget_s: float = DEFAULT_BUDGET_S,
                 needs_input_grad: Sequence[bool] | None = None,
                 threads: int | None = None) -> TileTimes:
    """Median seconds of one training step of `tile` of `layer` on `device`: forward +
    backward, then the SGD update of its weight shard (momentum and weight decay as
    `layerwise train`'s defaults), each timed on its own.

    `warmup` untimed runs first (stopping early once they use up `budget_s`), then up to
    `repeats` timed runs, stopping once the timed ones add up to `budget_s` (at least one).
    CUDA is timed with CUDA events, CPU with time.perf_counter, with `threads` torch threads
    when given. The input layer takes 0 s; a tile without weights has no update (0 s).
    """
    if layer.kind == "input":
        return TileTimes(0.0, 0.0)
    target = torch.device(device)
    kind = "cuda" if target.type == "cuda" else "cpu"
    warmup = DEFAULT_WARMUP[kind] if warmup is None else warmup
    repeats = DEFAULT_REPEATS[kind] if repeats is None else repeats
    if repeats < 1 or warmup < 0:
        raise LayerwiseError(f"repeats must be >= 1 and warmup >= 0 (got {repeats}, {warmup})")
    program = build_tile(layer, tile, target, needs_input_grad)
    grad_output = torch.randn(tile.output_shape, generator=torch.Generator().manual_seed(1))
    grad_output = grad_output.to(target)
    passes = _Passes(program, grad_output)
    parts = [passes.forward, passes.backward]
    if program.params:
        optimizer = Sgd(program.params.values(), lr=UPDATE_LR, momentum=SGD_MOMENTUM,
                        weight_decay=SGD_WEIGHT_DECAY)  # the runtime's step
        parts.append(optimizer.step)

    with _threads(threads):
        if kind == "cuda":
            _cuda_times(parts, warmup, budget_s, target)
            times = _cuda_times(parts, repeats, budget_s, target)
        else:
            _cpu_times(parts, warmup, budget_s)
            times = _cpu_times(parts, repeats, budget_s)
    return TileTimes(passes=statistics.median(run[0] + run[1] for run in times),
                     update=statistics.median(run[2] for run in times) if len(parts) > 2
                     else 0.0,
                     forward=statistics.median(run[0] for run in times))


# ---------------------------------------------------------------------------------------------
# A whole graph
# ---------------------------------------------------------------------------------------------


def tile_plan(graph: LayerGraph, devices: int,
              configs: Mapping[str, Sequence[ParallelConfig]] | None = None,
              ) -> dict[str, dict[str, TileWork]]:
    """Layer name -> distinct tile key -> tile, over the layer's configs in `configs` (a layer
    not in it: its whole search space on `devices` devices). The configs beyond the search
    space that a schedule's pricer reads are the caller's to add (the loader's
    `profiled_configs` holds both)."""
    plan: dict[str, dict[str, TileWork]] = {}
    for layer in graph.layers:
        chosen = configs.get(layer.name) if configs is not None else None
        layer_configs = chosen if chosen is not None else enumerate_configs(layer, devices)
        tiles: dict[str, TileWork] = {}
        for config in layer_configs:
            tile = largest_tile(layer, config)
            tiles.setdefault(tile.key, tile)
        plan[layer.name] = tiles
    return plan


def missing_tiles(plan: Mapping[str, Mapping[str, TileWork]],
                  existing: Profile | None) -> dict[str, dict[str, TileWork]]:
    """The tiles of `plan` that `existing` has no time for (every tile without one)."""
    known = existing.seconds if existing is not None else {}
    return {
        name: {key: tile for key, tile in tiles.items() if key not in known.get(name, {})}
        for name, tiles in plan.items()
    }


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `count` for the block (unchanged when None)."""
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def profile_graph(
    graph: LayerGraph,
    devices: int,
    configs: Mapping[str, Sequence[ParallelConfig]] | None = None,
    device: str | torch.device = "cpu",
    warmup: int | None = None,
    repeats: int | None = None,
    progress: ProgressCallback | None = None,
    existing: Profile | None = None,
    threads: int | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    processes: int = 1,
    lockstep: Callable[[], None] | None = None,
) -> Profile:
    """Measure t_c of every distinct tile of every layer that `existing` lacks.

    `configs` maps layer names to the configs to cover (a layer not in it: all of
    `enumerate_configs(layer, devices)`). Input layers get 0 s without running anything.
    `progress(done_layers, total_layers, layer_name)` is called after each layer. With nothing
    left to measure, `existing` itself is returned. `processes` records how many profilers run
    at once (profile_graph_concurrently's); `existing` must have been measured so too; they
    wait for each other in `lockstep()`, called before each tile is measured.
    """
    target = resolve_device(device)
    kind: Literal["cpu", "cuda"] = "cuda" if target.type == "cuda" else "cpu"
    name = device_name(target)
    if existing is not None:
        existing.check_matches(graph)
        existing.check_device(name, torch.__version__, huge_pages_in_use())
        existing.check_processes(processes)
    warmup = DEFAULT_WARMUP[kind] if warmup is None else warmup
    repeats = DEFAULT_REPEATS[kind] if repeats is None else repeats
    if repeats < 1 or warmup < 0:
        raise LayerwiseError(f"repeats must be >= 1 and warmup >= 0 (got {repeats}, {warmup})")
    if threads is not None and threads < 1:
        raise LayerwiseError(f"threads must be >= 1 (got {threads})")
    plan = tile_plan(graph, devices, configs)
    todo = missing_tiles(plan, existing)
    producers = graph.by_name
    seconds = {layer: dict(tiles) for layer, tiles in
               (existing.seconds if existing is not None else {}).items()}
    updates = {layer: dict(tiles) for layer, tiles in
               (existing.update_seconds if existing is not None else {}).items()}
    forwards = {layer: dict(tiles) for layer, tiles in
                (existing.forward_seconds if existing is not None else {}).items()}
    rng_devices = [target.index or 0] if kind == "cuda" else []
    with _threads(threads), torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(0)  # dropout masks: the same inputs on every run
        for done, layer in enumerate(graph.layers, start=1):
            grads = [producers[source].kind != "input" for source in layer.inputs]
            layer_seconds = seconds.setdefault(layer.name, {})
            layer_updates = updates.setdefault(layer.name, {})
            layer_forwards = forwards.setdefault(layer.name, {})
            for key, tile in todo[layer.name].items():
                if layer.kind != "input" and lockstep is not None:
                    lockstep()
                layer_seconds[key], layer_updates[key], layer_forwards[key] = measure_tile(
                    layer, tile, target, warmup, repeats, budget_s, grads)
            if progress is not None:
                progress(done, len(graph.layers), layer.name)
        thread_count = torch.get_num_threads()
    if existing is not None and not any(todo.values()):
        return existing
    return Profile(
        model=graph.model,
        structure_hash=graph.structure_hash,
        input_shape=graph.input_shape,
        device_name=name,
        device_type=kind,
        torch_version=torch.__version__,
        batch=graph.batch,
        devices=max(devices, existing.devices if existing else 0),
        threads=thread_count,
        processes=processes,
        huge_pages=huge_pages_in_use(),
        method="cuda-events-queued" if kind == "cuda" else "monotonic-median",
        warmup=warmup,
        repeats=repeats,
        seconds=seconds,
        update_seconds=updates,
        forward_seconds=forwards,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def concurrent_threads(processes: int) -> int:
    """torch threads per profiler when `processes` run at once: what each training worker on
    this machine uses (the cores shared evenly among the local ranks)."""
    return max(1, (os.cpu_count() or 1) // processes)


def profile_graph_concurrently(graph: LayerGraph, devices: int, processes: int,
                               progress: ProgressCallback | None = None,
                               **options: object) -> Profile:
    """t_c on CPUs as a training run meets it: `processes` profilers at once, one per rank.

    Ranks of a run on one machine share its cores' caches and memory bandwidth; a layer
    profiled alone on an idle machine runs ~1.3x faster than inside a 2-process step on a 2-core
    VM (ResNet-18). Each process measures every tile in the same order and waits for the others
    before each tile, so that the same tile runs side by side on every core, as a run's ranks
    compute (waiting only per layer, they could drift apart over a layer's many tiles and time
    some alone); a tile's time is the slowest process's, as every collective waits for the
    slowest rank. `options` are profile_graph's
    (`existing` too: each process measures only what it lacks); `progress` follows the first
    process. Ranks on GPUs each have their own device: profile those with profile_graph.
    """
    if processes < 1:
        raise LayerwiseError(f"processes must be >= 1 (got {processes})")
    if processes == 1:
        return profile_graph(graph, devices, progress=progress, **options)  # type: ignore[arg-type]
    if resolve_device(options.get("device", "cpu")).type != "cpu":  # type: ignore[arg-type]
        raise LayerwiseError("concurrent profiling is for CPUs, where ranks share one machine; "
                             "each GPU rank has its own device: profile with 1 process")
    existing = options.get("existing")
    if isinstance(existing, Profile) and not any(missing_tiles(tile_plan(
            graph, devices, options.get("configs")), existing).values()):  # type: ignore[arg-type]
        # nothing to measure: no processes to start (the checks and the result as one's)
        return profile_graph(graph, devices, progress=progress,  # type: ignore[arg-type]
                             processes=processes, **options)
    context = torch_mp.get_context("spawn")
    barrier, layers_done = context.Barrier(processes), context.Queue()
    with terminate_as_exit(), owned_folder("layerwise-profile-") as folder:
        start_then_join(lambda: torch_mp.start_processes(
            _profile_worker, args=(graph, devices, options, processes, barrier, layers_done,
                                   folder),
            nprocs=processes, join=False, start_method="spawn"),
            lambda: _report(layers_done, progress))
        _report(layers_done, progress)
        profiles = [Profile.model_validate_json(Path(folder, f"{rank}.json").read_text(
            encoding="utf-8")) for rank in range(processes)]

    def slowest(field: str) -> dict[str, dict[str, float]]:
        tables = [getattr(profile, field) for profile in profiles]
        return {layer: {key: max(table[layer][key] for table in tables) for key in tiles}
                for layer, tiles in tables[0].items()}

    return profiles[0].model_copy(update={
        "seconds": slowest("seconds"), "update_seconds": slowest("update_seconds"),
        "forward_seconds": slowest("forward_seconds"),
        "method": f"{profiles[0].method}-{processes}-concurrent"})


def _report(layers_done: object, progress: ProgressCallback | None) -> None:
    """Pass on the progress the first profiler has queued since the last call."""
    while True:
        try:
            done = layers_done.get_nowait()  # type: ignore[attr-defined]
        except queue.Empty:
            return
        if progress is not None:
            progress(*done)


def _profile_worker(rank: int, graph: LayerGraph, devices: int, options: dict[str, object],
                    processes: int, barrier: object, layers_done: object, folder: Path) -> None:
    die_with_multiprocessing_parent()
    def layer_done(done: int, total: int, name: str) -> None:
        if rank == 0:
            layers_done.put((done, total, name))  # type: ignore[attr-defined]

    profile = profile_graph(graph, devices, progress=layer_done,  # type: ignore[arg-type]
                            processes=processes, lockstep=barrier.wait,  # type: ignore[attr-defined]
                            **options)
    write_atomic(Path(folder, f"{rank}.json"), profile.model_dump_json(), make_folder=False)


def total_seconds(profile: Profile, layer_name: str) -> float:
    """Sum of the measured step times of a layer's tiles, update included (what the CLI
    summary shows)."""
    return math.fsum([*profile.seconds.get(layer_name, {}).values(),
                      *profile.update_seconds.get(layer_name, {}).values()])
