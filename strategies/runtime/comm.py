"""The torch.distributed calls of one rank, and the bytes each of them sends.

One `Communicator` owns the rank's process groups (torchtitan's rule: no global group state
beyond init) and a `ByteCounter` keyed by (layer, category):
- transfer: activations and their gradients moved between layers (one all-to-all per
  exchange, each piece sent once to the rank that needs it);
- sync: all-reduces of replicated weights' gradients and of BatchNorm batch statistics;
- loss: per-sample scalars of the cross-entropy over channel-split scores, and the step's loss.
All-reduces are counted as the ring algorithm (gloo's and NCCL's for large messages) sends
them: the buffer cut in r chunks, every rank sends r-1 chunks to reduce-scatter and r-1 to
all-gather, so a group sends 2(r-1) times the buffer in all (cost.py's t_s bytes).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Hashable, Sequence
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from strategies.space import tile_range

Category = str  # "transfer" | "sync" | "loss"


def ring_bytes(elements: int, element_size: int, group_size: int, position: int) -> int:
    """Bytes rank `position` of a ring all-reduce of `elements` sends (both phases).

    It sends every chunk but one in each phase: all but chunk position+1 in reduce-scatter and
    all but chunk position+2 in all-gather (mod r); summed over the ring, 2(r-1) buffers.
    """
    if group_size == 1:
        return 0
    chunks = [tile_range(elements, group_size, i) for i in range(group_size)]
    skipped = sum(chunks[(position + shift) % group_size][1]
                  - chunks[(position + shift) % group_size][0] for shift in (1, 2))
    return (2 * elements - skipped) * element_size


class ByteCounter:
    """Bytes this rank sent, per (layer, category), since the last reset."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, Category], int] = defaultdict(int)

    def add(self, layer: str, category: Category, nbytes: int) -> None:
        if nbytes:
            self.counts[(layer, category)] += nbytes

    def reset(self) -> dict[tuple[str, Category], int]:
        counts, self.counts = dict(self.counts), defaultdict(int)
        return counts


class Communicator:
    """Exchanges between layers and group all-reduces of one rank, with byte counts.

    With world 1 nothing is initialised and every call is local. Groups must be listed in the
    same order on every rank (`StrategyPlan.groups`, `StrategyPlan.exchange_groups`): creating
    a group is collective. Exchanges run on process groups of their own, so that they never
    queue behind a gradient bucket's all-reduce still running on a replica group.
    """

    def __init__(self, rank: int, world: int, groups: Sequence[tuple[int, ...]],
                 exchange_groups: Sequence[tuple[int, ...]] = ()) -> None:
        self.rank = rank
        self.world = world
        self.counter = ByteCounter()
        self._groups: dict[tuple[int, ...], dist.ProcessGroup | None] = {}
        everyone = tuple(range(world))
        self._groups[everyone] = None  # the default group
        for group in groups:
            if group != everyone:
                created = dist.new_group(list(group))
                if self.rank in group:
                    self._groups[group] = created
        self._exchange_groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        self._buffers: dict[tuple[Hashable, str], torch.Tensor] = {}
        for group in exchange_groups:
            created = dist.new_group(list(group))
            if self.rank in group:
                self._exchange_groups[group] = created

    def exchange(self, sends: Sequence[tuple[int, torch.Tensor]],
                 receives: Sequence[tuple[int, Sequence[int]]], group: tuple[int, ...],
                 layer: str, dtype: torch.dtype, device: torch.device, key: Hashable,
                 category: Category = "transfer") -> list[torch.Tensor]:
        """Send each (peer, tensor) and receive a tensor of each (peer, shape) within `group`.

        Every member of `group` (an exchange group given at construction) calls this for the
        same exchange, with or without pieces of its own; a rank outside it has none. One
        all_to_all_single moves all pieces: each peer's pieces go as one split, in the order
        given. A collective rather than batch_isend_irecv because with gloo on CPUs it pays
        the latency once per exchange instead of once per message: after a layer's compute a
        small exchange took ~3 ms point to point here and ~1 ms as an all-to-all (16 MiB:
        21 ms against 19 ms). Returns the received tensors (views of one buffer) in the order
        of `receives`.

        The flat send and receive buffers are kept per `key` (one per exchange of a step) and
        reused by the next exchange with that key, as gradient buckets are: a fresh buffer of
        a few MB page-faults on every step on CPUs. The caller must be done with the received
        views before it exchanges with the same key again.
        """
        if self.rank not in group:
            if sends or receives:
                raise ValueError(f"rank {self.rank} has pieces to move outside group {group}")
            return []
        if group not in self._exchange_groups:
            raise ValueError(f"group {group} was not given as an exchange group")
        slot = {peer: position for position, peer in enumerate(group)}
        send_order = sorted(range(len(sends)), key=lambda i: slot[sends[i][0]])
        receive_order = sorted(range(len(receives)), key=lambda i: slot[receives[i][0]])
        input_splits = [0] * len(group)
        for peer, tensor in sends:
            input_splits[slot[peer]] += tensor.numel()
        output_splits = [0] * len(group)
        sizes = [math.prod(shape) for _, shape in receives]
        for (peer, _), size in zip(receives, sizes, strict=True):
            output_splits[slot[peer]] += size
        outgoing = self._buffer(key, "out", sum(input_splits), dtype, device)
        if sends:
            torch.cat([sends[i][1].reshape(-1) for i in send_order], out=outgoing)
        incoming = self._buffer(key, "in", sum(output_splits), dtype, device)
        dist.all_to_all_single(incoming, outgoing, output_splits, input_splits,
                               group=self._exchange_groups[group])
        received: list[torch.Tensor] = [incoming] * len(receives)
        offset = 0
        for i in receive_order:
            received[i] = incoming[offset:offset + sizes[i]].view(receives[i][1])
            offset += sizes[i]
        for _, tensor in sends:
            self.counter.add(layer, category, tensor.numel() * tensor.element_size())
        return received

    def _buffer(self, key: Hashable, direction: str, size: int, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
        """The kept flat buffer of (key, direction), new where its size or kind changed."""
        buffer = self._buffers.get((key, direction))
        if (buffer is None or buffer.numel() != size or buffer.dtype != dtype
                or buffer.device != device):
            buffer = self._buffers[(key, direction)] = torch.empty(size, dtype=dtype,
                                                                   device=device)
        return buffer

    def all_reduce(self, tensor: torch.Tensor, group: tuple[int, ...],
                   counted_as: tuple[str, Category] | None,
                   op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """Reduce `tensor` in place over `group` (this rank must be in it).

        `counted_as` names the (layer, category) its bytes go to; None when the caller counts
        the parts of a bucket itself (`count_ring`).
        """
        if len(group) == 1:
            return tensor
        dist.all_reduce(tensor, op=op, group=self._groups[group])
        if counted_as is not None:
            self.count_ring(*counted_as, tensor.numel(), tensor.element_size(), group)
        return tensor

    def all_reduce_async(self, tensor: torch.Tensor,
                         group: tuple[int, ...]) -> dist.Work | None:
        """Start summing `tensor` in place over `group`; wait on the returned work (None:
        nothing to do). The caller counts the bytes (`count_ring`)."""
        if len(group) == 1:
            return None
        return dist.all_reduce(tensor, group=self._groups[group], async_op=True)

    def count_ring(self, layer: str, category: Category, elements: int, element_size: int,
                   group: tuple[int, ...]) -> None:
        """Count a ring all-reduce of `elements` that ran inside a larger bucket."""
        self.counter.add(layer, category,
                         ring_bytes(elements, element_size, len(group), group.index(self.rank)))

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def local_rendezvous(folder: str | os.PathLike[str]) -> str:
    """An init_method for processes on this machine: a file store in `folder` (fresh for each
    launch). A TCP port picked free in advance can be taken by another process before the
    store binds it; a file in one's own folder cannot."""
    return Path(folder, "rendezvous").absolute().as_uri()


def init_distributed(backend: str, timeout_seconds: float) -> tuple[int, int]:
    """Join the torchrun job from its environment; returns (rank, world size)."""
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_seconds))
    return dist.get_rank(), dist.get_world_size()
