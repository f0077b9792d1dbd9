"""The torch.distributed calls of one rank, and the bytes each of them sends.

One `Communicator` owns the rank's process groups (torchtitan's rule: no global group state
beyond init) and a `ByteCounter` keyed by (layer, category):
- transfer: activations and their gradients moved between layers (point-to-point);
- sync: all-reduces of replicated weights' gradients and of BatchNorm batch statistics;
- loss: per-sample scalars of the cross-entropy over channel-split scores, and the step's loss.
All-reduces are counted as the ring algorithm (gloo's and NCCL's for large messages) sends
them: the buffer cut in r chunks, every rank sends r-1 chunks to reduce-scatter and r-1 to
all-gather, so a group sends 2(r-1) times the buffer in all (cost_model.py's t_s bytes).

A `WaitClock` beside it keeps the seconds the rank spent blocked in those calls per category:
Eq. 1's t_x and t_s as the step met them (waiting for the peer included), so that a measured
step splits into compute and the two communication terms the cost model predicts apart. On a
GPU the calls return before the transfer ends and the clock reads only the host's wait.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from layerwise.strategies.model.space import tile_range

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


class Waits(NamedTuple):
    """Seconds blocked and calls waited in, per category."""

    seconds: dict[Category, float]
    calls: dict[Category, int]


def least_waiting(ranks: Sequence[Waits]) -> Waits:
    """Of every rank's waits in one step, the waits of the rank that waited least: a rank idle
    while another computes a layer alone waits for that compute, which is t_c; the
    least-waiting rank's waits are the communication itself."""
    return min(ranks, key=lambda waits: sum(waits.seconds.values()))


class WaitClock:
    """Seconds this rank spent blocked in communication, and the calls it waited in, per
    category, since the last reset."""

    def __init__(self) -> None:
        self.seconds: dict[Category, float] = defaultdict(float)
        self.calls: dict[Category, int] = defaultdict(int)

    def add(self, category: Category, started: float) -> None:
        """Add the time since `started` (a `time.perf_counter()` reading) to `category`."""
        self.seconds[category] += time.perf_counter() - started
        self.calls[category] += 1

    def reset(self) -> Waits:
        """What was waited since the last reset."""
        waits = Waits(dict(self.seconds), dict(self.calls))
        self.seconds, self.calls = defaultdict(float), defaultdict(int)
        return waits


class Communicator:
    """Point-to-point exchanges and group all-reduces of one rank, with byte counts.

    With world 1 nothing is initialised and every call is local. Groups must be listed in the
    same order on every rank (`StrategyPlan.groups`): creating a group is collective.
    """

    def __init__(self, rank: int, world: int, groups: Sequence[tuple[int, ...]]) -> None:
        self.rank = rank
        self.world = world
        self.counter = ByteCounter()
        self.clock = WaitClock()
        self._groups: dict[tuple[int, ...], dist.ProcessGroup | None] = {}
        everyone = tuple(range(world))
        self._groups[everyone] = None  # the default group
        for group in groups:
            if group != everyone:
                created = dist.new_group(list(group))
                if self.rank in group:
                    self._groups[group] = created

    def exchange(self, sends: Sequence[tuple[int, torch.Tensor]],
                 receives: Sequence[tuple[int, torch.Tensor]], tag: int,
                 layer: str, category: Category = "transfer") -> None:
        """Send each (peer, tensor) and fill each (peer, buffer); returns when all are done."""
        if not sends and not receives:
            return
        started = time.perf_counter()
        exchange_tagged([(peer, tensor, tag) for peer, tensor in sends],
                        [(peer, buffer, tag) for peer, buffer in receives])
        self.clock.add(category, started)
        for _, tensor in sends:
            self.counter.add(layer, category, tensor.numel() * tensor.element_size())

    def all_reduce(self, tensor: torch.Tensor, group: tuple[int, ...],
                   counted_as: tuple[str, Category] | None,
                   op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """Reduce `tensor` in place over `group` (this rank must be in it).

        `counted_as` names the (layer, category) its bytes go to; None when the caller counts
        the parts of a bucket itself (`count_ring`).
        """
        if len(group) == 1:
            return tensor
        started = time.perf_counter()
        dist.all_reduce(tensor, op=op, group=self._groups[group])
        self.clock.add(counted_as[1] if counted_as is not None else "sync", started)
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

    def wait(self, work: dist.Work, category: Category = "sync") -> None:
        """Wait for `work` from `all_reduce_async`, the wait on the clock under `category`."""
        started = time.perf_counter()
        work.wait()
        self.clock.add(category, started)

    def count_ring(self, layer: str, category: Category, elements: int, element_size: int,
                   group: tuple[int, ...]) -> None:
        """Count a ring all-reduce of `elements` that ran inside a larger bucket."""
        self.counter.add(layer, category,
                         ring_bytes(elements, element_size, len(group), group.index(self.rank)))

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def exchange_tagged(sends: Sequence[tuple[int, torch.Tensor, int]],
                    receives: Sequence[tuple[int, torch.Tensor, int]]) -> None:
    """Send each (peer, tensor, tag) and fill each (peer, buffer, tag); returns when all are
    done. Outside the step (gathering a state), so nothing is counted."""
    operations = [dist.P2POp(dist.isend, tensor, peer, tag=tag) for peer, tensor, tag in sends]
    operations += [dist.P2POp(dist.irecv, tensor, peer, tag=tag)
                   for peer, tensor, tag in receives]
    if operations:
        for work in dist.batch_isend_irecv(operations):
            work.wait()


TensorTree = dict[str, dict[str, torch.Tensor]]  # entry -> state-dict key -> tensor


def gather_tensor_trees(part: TensorTree, rank: int, world: int,
                        device: torch.device) -> list[TensorTree] | None:
    """Every rank's `part` on rank 0, on the CPU, in rank order; None on the other ranks.

    Collective. Only the names, shapes and dtypes are pickled (`gather_object`); the tensors
    travel as tensors, point to point. Pickling them instead cost AlexNet's local engine 14 s
    per float64 checkpoint on two gloo processes, most of it serialising.
    """
    own = {entry: {key: tensor.detach().cpu() for key, tensor in tensors.items()}
           for entry, tensors in part.items()}
    if world == 1:
        return [own]
    layout = [(entry, key, tuple(tensor.shape), tensor.dtype)
              for entry, tensors in part.items() for key, tensor in tensors.items()]
    layouts: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(layout, layouts, dst=0)
    if rank != 0:
        exchange_tagged([(0, part[entry][key].detach().to(device).contiguous(), tag)
                         for tag, (entry, key, _, _) in enumerate(layout)
                         if part[entry][key].numel()], [])
        return None
    assert layouts is not None
    trees = [own]
    receives, arrivals = [], []
    for source, source_layout in enumerate(layouts[1:], start=1):
        tree: TensorTree = {}
        for tag, (entry, key, shape, dtype) in enumerate(source_layout):
            buffer = torch.empty(shape, dtype=dtype, device=device)
            tree.setdefault(entry, {})[key] = buffer
            if buffer.numel():
                receives.append((source, buffer, tag))
        arrivals.append(tree)
    exchange_tagged([], receives)
    trees += [{entry: {key: tensor.cpu() for key, tensor in tensors.items()}
               for entry, tensors in tree.items()} for tree in arrivals]
    return trees


def init_distributed(backend: str, timeout_seconds: float,
                     init_method: str | None = None) -> tuple[int, int]:
    """Join the torchrun job, through `init_method` (rank and world size from torchrun's
    environment) or else torchrun's own store; returns (rank, world size)."""
    timeout = timedelta(seconds=timeout_seconds)
    if init_method is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(backend, init_method=init_method, timeout=timeout,
                                rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    return dist.get_rank(), dist.get_world_size()
