"""Which part of a model's weights and buffers each rank holds, and the whole state moved in
and out of those parts (checkpoints).

A layer split along c (Jia et al. 2018, Table 1) shards its weights by output channel: the
rank of an output tile with channels [c0, c1) holds [c0, c1) along the channel dim of every
tensor of the layer's modules (`Layer.channel_dim`: dim 0 of conv/linear weights and biases,
BatchNorm's affine weights and running statistics; dim 1 of a transposed convolution's
weight); splits along n, h and w replicate them. A rank holds the shards of the layers it
has tiles of and nothing else; the full weights are dropped after sharding. Checkpoints go the
other way: `gather` assembles full tensors on rank 0 from one owner of each shard, and
`scatter` cuts a full tensor back into this rank's shard, so a checkpoint is the plain
module's state_dict whatever the strategy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from layerwise.strategies.model.graph import Layer, param_key
from layerwise.strategies.model.sized_trace import trace_module
from layerwise.strategies.runtime.comm import exchange_tagged
from layerwise.strategies.runtime.plan import LayerPlan, StrategyPlan

# module target -> parameter or buffer name -> this rank's shard of it
ModuleShards = dict[str, dict[str, "Shard"]]


@dataclass
class Shard:
    """One state-dict entry held by this rank: [start, stop) of the full tensor along `dim`."""

    key: str
    tensor: torch.Tensor  # nn.Parameter for weights, plain tensor for buffers
    dim: int
    start: int
    stop: int
    sliced: bool  # False for scalars (num_batches_tracked), held whole
    # held whole by every channel tile (no channel dim: a PReLU's one slope): its gradient
    # sums over all of the layer's tiles, not only the replicas of one channel shard
    shared: bool = False


class ShardedModel:
    """One rank's shards of a traced model under a StrategyPlan, and its checkpoints.

    Build it on every rank from the same full module (same seed, same weights): each rank
    keeps only the shards of the layers it holds tiles of. It consumes `module`: the traced
    graph shares its submodules, and their full weights move to the meta device (a copy would
    double the peak memory of building the model); `full_state_dict` gives them back.
    """

    def __init__(self, module: nn.Module, plan: StrategyPlan, rank: int) -> None:
        self.plan = plan
        self.rank = rank
        self.graph_module = trace_module(module, plan.graph.input_shape)
        self.nodes = {node.name: node for node in self.graph_module.graph.nodes}
        first = next(module.parameters(), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.dtype = first.dtype if first is not None else torch.get_default_dtype()
        full_state = module.state_dict()
        # layer name -> its modules' shards, for the layers this rank holds a tile of
        self.layer_shards: dict[str, ModuleShards] = {}
        # state-dict key -> the plan of the layer holding it, the module and the tensor's name
        self._holder: dict[str, tuple[LayerPlan, str, str]] = {}
        for layer_plan in plan.layers:
            held = self._held_tensors(layer_plan.layer)
            self._holder.update({param_key(target, name): (layer_plan, target, name)
                                 for target, names in held.items() for name in names})
            tile = layer_plan.tiles.get(rank)
            if tile is not None:
                self.layer_shards[layer_plan.layer.name] = {
                    target: self._shards(target, names, layer_plan.layer, tile.box[1],
                                         full_state)
                    for target, names in held.items()}
        self.graph_module.to("meta")  # the full weights: each rank keeps its shards only

    def _held_tensors(self, layer: Layer) -> dict[str, list[str]]:
        """Module target -> the names of its parameters and buffers that a layer runs (main op,
        then fused ops): every one of a module it calls, and each one an op reads directly
        (get_attr, e.g. a layer scale)."""
        held: dict[str, list[str]] = {}
        for name in layer.fx_nodes:
            node = self.nodes[name]
            if node.op == "get_attr":
                owner, _, attribute = str(node.target).rpartition(".")
                held.setdefault(owner, []).append(attribute)
            elif node.op == "call_module":
                module = self.graph_module.get_submodule(str(node.target))
                names = [key for key, _ in (*module.named_parameters(recurse=False),
                                            *module.named_buffers(recurse=False))]
                if names:
                    held[str(node.target)] = names
        return held

    def _shards(self, target: str, names: list[str], layer: Layer, channels: tuple[int, int],
                full_state: dict[str, torch.Tensor]) -> dict[str, Shard]:
        """The part of each of the module's tensors `names` that the tile of `channels` holds
        (`_part`)."""
        module = self.graph_module.get_submodule(target)
        shards: dict[str, Shard] = {}
        parameters = dict(module.named_parameters(recurse=False))
        for name in names:
            key = param_key(target, name)
            full = full_state[key]
            sliced = full.dim() > 0
            dim, start, stop = _part(layer, target, name, channels, full.shape)
            data = (full.narrow(dim, start, stop - start) if sliced else full).detach().clone()
            tensor = nn.Parameter(data) if name in parameters else data
            shared = _channel_dim(layer, target, name, full.shape) is None
            shards[name] = Shard(key=key, tensor=tensor, dim=dim, start=start, stop=stop,
                                 sliced=sliced, shared=shared)
        return shards

    # ---- this rank's shards ----------------------------------------------------------------

    def parameters(self) -> Iterator[nn.Parameter]:
        for _, parameter in self.named_parameters():
            yield parameter

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's weight shards, named by the plain module's state-dict keys."""
        for shard in self.shards():
            if isinstance(shard.tensor, nn.Parameter):
                yield shard.key, shard.tensor

    def parameter_keys(self) -> list[str]:
        """State-dict keys of every weight of the model (held by some rank), in order."""
        return [key for key, _ in self.graph_module.named_parameters()]

    def shards(self) -> Iterator[Shard]:
        for modules in self.layer_shards.values():
            for shards in modules.values():
                yield from shards.values()

    # ---- whole state ---------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The plain module's state_dict assembled on rank 0, on the CPU (None elsewhere)."""
        return self.gather({shard.key: shard.tensor.detach() for shard in self.shards()})

    def gather(self, shards: dict[str, torch.Tensor],
               keys: list[str] | None = None) -> dict[str, torch.Tensor] | None:
        """Full tensors on rank 0 (CPU) from each rank's shards, keyed by state-dict key.

        `shards` holds this rank's part of each of `keys` it holds (its weights and buffers,
        or the optimizer's momentum of its weights); `keys` (all state-dict keys by default)
        must be the same on every rank. Returns None on the other ranks.
        """
        empty = self.graph_module.state_dict()  # meta tensors: shapes and dtypes
        if keys is not None:
            empty = {key: empty[key] for key in keys}
        shapes = {key: tensor.shape for key, tensor in empty.items()}
        result = {key: torch.empty(tensor.shape, dtype=tensor.dtype)
                  for key, tensor in empty.items()}
        sends, receives, arrivals = [], [], []
        for tag, (key, owner, dim, start, stop) in enumerate(self._shard_table(shapes)):
            if self.rank == 0 and owner == 0:
                _place(result[key], dim, start, stop, shards[key].cpu())
            elif self.rank == 0:
                shape = list(shapes[key])
                if shape:
                    shape[dim] = stop - start
                buffer = torch.empty(shape, dtype=empty[key].dtype, device=self.device)
                receives.append((owner, buffer, tag))
                arrivals.append((key, dim, start, stop, buffer))
            elif owner == self.rank:
                sends.append((0, shards[key].contiguous(), tag))
        exchange_tagged(sends, receives)
        if self.rank != 0:
            return None
        for key, dim, start, stop, buffer in arrivals:
            _place(result[key], dim, start, stop, buffer.cpu())
        return result

    def _shard_table(self, shapes: dict[str, torch.Size]
                     ) -> list[tuple[str, int, int, int, int]]:
        """(key, owner device, dim, start, stop) of every shard of every state-dict entry.

        The owner of a channel shard is its tile with n, d, h, w index 0 (its replicas are
        equal); a tensor every channel tile holds whole (a scalar, a PReLU's one slope) is
        owned by the tile with index 0. Every rank builds the same table.
        """
        table = []
        for key, shape in shapes.items():
            layer_plan, target, name = self._holder[key]
            for tile in layer_plan.tiles.values():
                if tile.index[0] or any(tile.index[2:]):
                    continue
                dim, start, stop = _part(layer_plan.layer, target, name, tile.box[1], shape)
                if tile.index[1] and (not shape or (start, stop) == (0, shape[dim])):
                    continue  # held whole by every channel tile: the first one's copy
                table.append((key, tile.device, dim, start, stop))
        return table

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Overwrite this rank's shards with their part of a full state_dict."""
        with torch.no_grad():
            for shard, part in zip(self.shards(), self.scatter(state).values(), strict=True):
                shard.tensor.copy_(part)

    def scatter(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's part of each full tensor (of the keys in `full`), on its device."""
        return {shard.key: (full[shard.key].narrow(shard.dim, shard.start,
                                                   shard.stop - shard.start)
                            if shard.sliced else full[shard.key]
                            ).to(self.device, shard.tensor.dtype)
                for shard in self.shards() if shard.key in full}


def _part(layer: Layer, target: str, name: str, channels: tuple[int, int],
          shape: torch.Size) -> tuple[int, int, int]:
    """(dim, start, stop) of a tensor of `shape` (module `target`'s `name`) that the tile of
    output channels `channels` holds: those channels along the layer's channel dim of the
    tensor (`Layer.channel_dim`), all of dim 0 where the tile holds every channel or no dim
    runs along them (a PReLU's one shared slope), (0, 0, 1) for a scalar."""
    if not shape:
        return (0, 0, 1)
    dim = _channel_dim(layer, target, name, shape)
    if dim is None or channels == (0, shape[dim]):
        return (0, 0, shape[0])
    return (dim, *channels)


def _channel_dim(layer: Layer, target: str, name: str, shape: torch.Size) -> int | None:
    """`Layer.channel_dim` of module `target`'s tensor `name` (the layer's own op's by its
    name, a fused op's by its state-dict key)."""
    return layer.channel_dim(name if target == layer.target else param_key(target, name),
                             tuple(shape))


def _place(full: torch.Tensor, dim: int, start: int, stop: int, part: torch.Tensor) -> None:
    if full.dim() == 0:
        full.copy_(part.reshape(()))
    else:
        full.narrow(dim, start, stop - start).copy_(part)
