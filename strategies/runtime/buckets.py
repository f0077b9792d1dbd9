"""Gradient all-reduces that start while the backward still runs (DDP's overlap), per group.

A layer's weight gradients are final once that layer's own backward has run (every weight belongs to
one layer), so they join the open bucket of the layer's replica group right then; a bucket that
reaches `bucket_bytes` starts an asynchronous all-reduce at once and the backward goes on. Every
member of a group meets the same layers in the same order with shards of the same sizes, so bucket
boundaries, and the order of each group's collectives, agree on every rank. Bytes are counted per
layer, as if each layer's gradients were reduced alone (the ring sends the same total either way).
Each bucket's flat buffer is allocated once and reused every step, as DDP's are: a fresh buffer of
100+ MB page-faults on every step (filling AlexNet's 151 MB bucket that way takes 63 ms here, more
than its share of the backward). Small tensors that a group must sum at the end of the step anyway
(the step's loss) ride in that group's last bucket instead of taking an all-reduce of their own:
with gloo on CPUs a small all-reduce costs 1-3 ms after compute (docs/research.md: measured
behaviour), a tenth of a LeNet-5 step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from layerwise.strategies.hardware.cluster import GRADIENT_BUCKET_BYTES
from layerwise.strategies.runtime.comm import Communicator


@dataclass
class _Bucket:
    members: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    nbytes: int = 0


class GradientBuckets:
    """Sum replicated weights' gradients over their replica groups, overlapped with backward."""

    def __init__(self, comm: Communicator, group_order: list[tuple[int, ...]],
                 bucket_bytes: int = GRADIENT_BUCKET_BYTES) -> None:
        self.comm = comm
        self.group_order = group_order
        self.bucket_bytes = bucket_bytes
        self._open: dict[tuple[int, ...], _Bucket] = {}
        self._running: list[tuple[dist.Work | None, torch.Tensor, tuple[int, ...],
                                  list[tuple[str, nn.Parameter]], torch.Tensor | None]] = []
        self._buffers: dict[tuple[object, ...], torch.Tensor] = {}

    def add(self, layer: str, group: tuple[int, ...], parameters: list[nn.Parameter]) -> None:
        """The final gradients of `layer`'s weights, replicated over `group`."""
        if len(group) == 1 or not parameters:
            return
        bucket = self._open.setdefault(group, _Bucket())
        for parameter in parameters:
            bucket.members.append((layer, parameter))
            bucket.nbytes += parameter.numel() * parameter.element_size()
        if bucket.nbytes >= self.bucket_bytes:
            self._start(group, self._open.pop(group))

    def _start(self, group: tuple[int, ...], bucket: _Bucket,
               rider: torch.Tensor | None = None) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for _, p in bucket.members]
        if rider is not None:
            grads.append(rider)
        key = (group, tuple(id(parameter) for _, parameter in bucket.members), rider is not None)
        flat = self._buffers[key] = flatten_into(self._buffers.get(key), grads)
        work = self.comm.all_reduce_async(flat, group)
        self._running.append((work, flat, group, bucket.members, rider))

    def finish(self, riders: dict[tuple[int, ...], torch.Tensor] | None = None) -> None:
        """Start what is left (in the shared group order), wait, and write the sums back.

        `riders` maps a group to a small tensor to sum over it in place, in the group's last
        bucket where one is open and of its dtype, else alone. Every member of a group must pass
        the same riders (bucket boundaries agree on every member, so whether it rides does too).
        """
        riders = {group: rider for group, rider in (riders or {}).items() if len(group) > 1}
        order = [*self.group_order, *(group for group in riders if group not in self.group_order)]
        for group in order:
            bucket = self._open.pop(group, None)
            rider = riders.pop(group, None)
            if bucket is not None and rider is not None and (
                    rider.dtype != bucket.members[0][1].dtype):
                self._start(group, _Bucket(), rider)
                rider = None
            if bucket is not None or rider is not None:
                self._start(group, bucket or _Bucket(), rider)
        for work, flat, group, members, rider in self._running:
            if work is not None:  # a bucket of the rider alone carries no gradients
                self.comm.wait(work, "sync" if members else "loss")
            offset = 0
            for layer, parameter in members:
                size = parameter.numel()
                parameter.grad = flat[offset:offset + size].view_as(parameter)
                offset += size
                self.comm.count_ring(layer, "sync", size, parameter.element_size(), group)
            if rider is not None:
                rider.copy_(flat[offset:].view_as(rider))
        self._running = []


def flatten_into(buffer: torch.Tensor | None, grads: list[torch.Tensor]) -> torch.Tensor:
    """The gradients concatenated into `buffer`, or into a new one where it cannot be reused.

    A new buffer on the first step, or where the buffer's size changed, or while gradients
    still view it (not reset to None since its last use).
    """
    size = sum(grad.numel() for grad in grads)
    if (buffer is None or buffer.numel() != size
            or any(_same_memory(grad, buffer) for grad in grads)):
        buffer = torch.empty(size, dtype=grads[0].dtype, device=grads[0].device)
    torch.cat([grad.reshape(-1) for grad in grads], out=buffer)
    return buffer


def _same_memory(tensor: torch.Tensor, other: torch.Tensor) -> bool:
    return tensor.untyped_storage().data_ptr() == other.untyped_storage().data_ptr()
