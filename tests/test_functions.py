"""The split-exact autograd pieces on tiles of one tensor, each tile in its own thread with a
real group reduction between the threads: the synchronised BatchNorm (4-d and 2-d inputs, with
and without affine weights) and the cross-entropy over class-split scores give the outputs and
gradients of torch's BatchNorm and cross-entropy on the whole tensor."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from layerwise.strategies.model.ops import sync_batch_norm
from layerwise.strategies.runtime.functions import sharded_cross_entropy

WAIT_SECONDS = 60.0  # far above a reduction's milliseconds: reached only if a member failed


class ThreadGroup:
    """An in-place reduction over `size` threads: each contributes a tensor, all get the sum
    (or max), as a process group's all_reduce does. A member that fails breaks the barrier,
    so the others stop waiting at once instead of hanging the suite."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=WAIT_SECONDS)
        self.parts: dict[int, torch.Tensor] = {}

    def reducer(self, member: int, op: Callable[[torch.Tensor, int], torch.Tensor],
                ) -> Callable[[torch.Tensor], torch.Tensor]:
        def reduce(values: torch.Tensor) -> torch.Tensor:
            self.parts[member] = values.clone()
            self.barrier.wait()
            combined = op(torch.stack([self.parts[m] for m in range(self.size)]), 0)
            self.barrier.wait()  # everyone has read the parts before the next reduction
            return values.copy_(combined)
        return reduce


def run_members(size: int, work: Callable[[int], None], group: ThreadGroup | None = None,
                ) -> None:
    """`work(member)` on `size` threads at once; the first member's error is raised here, and
    breaks `group`'s barrier so that the other members do not wait for it."""
    errors: list[BaseException] = []

    def guarded(member: int) -> None:
        try:
            work(member)
        except BaseException as error:
            errors.append(error)
            if group is not None:
                group.barrier.abort()

    threads = [threading.Thread(target=guarded, args=(member,)) for member in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=2 * WAIT_SECONDS)
        assert not thread.is_alive(), "a member is still waiting: the test would hang"
    if errors:
        raise errors[0]


def _sum(stacked: torch.Tensor, dim: int) -> torch.Tensor:
    return stacked.sum(dim)


def _max(stacked: torch.Tensor, dim: int) -> torch.Tensor:
    return stacked.amax(dim)


@pytest.mark.parametrize(("shape", "affine", "split_dim"), [
    ((6, 5, 7, 4), True, 0), ((6, 5, 7, 4), True, 2), ((6, 5, 7, 4), False, 3),
    ((9, 5), True, 0),
])
def test_synchronised_batch_norm_over_tiles_equals_batch_norm_of_the_whole(shape, affine,
                                                                           split_dim):
    generator = torch.Generator().manual_seed(0)
    whole = (torch.randn(shape, generator=generator, dtype=torch.float64) * 2 + 3)
    upstream = torch.randn(shape, generator=generator, dtype=torch.float64)
    channels = shape[1]
    weight = torch.rand(channels, generator=generator, dtype=torch.float64) + 0.5
    bias = torch.randn(channels, generator=generator, dtype=torch.float64)

    x = whole.clone().requires_grad_()
    w, b = (weight.clone().requires_grad_(), bias.clone().requires_grad_()) if affine else (
        None, None)
    running = (torch.zeros(channels, dtype=torch.float64), torch.ones(channels,
                                                                      dtype=torch.float64))
    expected = F.batch_norm(x, *running, w, b, True, 0.1, 1e-5)
    expected.backward(upstream)

    tiles = list(whole.chunk(2, split_dim))
    grads = list(upstream.chunk(2, split_dim))
    group = ThreadGroup(2)
    count = whole.numel() // channels
    results: dict[int, tuple[torch.Tensor, ...]] = {}

    def member(index: int) -> None:
        tile = tiles[index].clone().requires_grad_()
        tw, tb = ((weight.clone().requires_grad_(), bias.clone().requires_grad_())
                  if affine else (None, None))
        stats = (torch.zeros(channels, dtype=torch.float64),
                 torch.ones(channels, dtype=torch.float64))
        out = sync_batch_norm(tile, tw, tb, *stats, 0.1, 1e-5, count,
                              group.reducer(index, _sum))
        out.backward(grads[index])
        results[index] = (out.detach(), tile.grad, *stats,
                          *((tw.grad, tb.grad) if affine else ()))

    run_members(2, member, group)
    torch.testing.assert_close(torch.cat([results[i][0] for i in range(2)], split_dim),
                               expected.detach())
    torch.testing.assert_close(torch.cat([results[i][1] for i in range(2)], split_dim), x.grad)
    for index in range(2):  # running statistics: every tile's copy is the whole batch's
        torch.testing.assert_close(results[index][2], running[0])
        torch.testing.assert_close(results[index][3], running[1])
    if affine:  # local sums, which the replica group's gradient all-reduce adds up
        torch.testing.assert_close(results[0][4] + results[1][4], w.grad)
        torch.testing.assert_close(results[0][5] + results[1][5], b.grad)


@pytest.mark.parametrize("shards", [2, 3])
def test_cross_entropy_over_class_shards_equals_cross_entropy_of_the_whole(shards):
    generator = torch.Generator().manual_seed(1)
    batch, classes = 8, 9
    scores = torch.randn(batch, classes, generator=generator, dtype=torch.float64) * 4
    targets = torch.randint(0, classes, (batch,), generator=generator)
    whole = scores.clone().requires_grad_()
    expected = F.cross_entropy(whole, targets)
    expected.backward()

    starts = [classes * s // shards for s in range(shards + 1)]
    group = ThreadGroup(shards)
    results: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def member(index: int) -> None:
        piece = scores[:, starts[index]:starts[index + 1]].clone().requires_grad_()
        share = sharded_cross_entropy(piece, targets, starts[index], shards, batch,
                                      group.reducer(index, _max), group.reducer(index, _sum))
        share.backward()
        results[index] = (share.detach(), piece.grad)

    run_members(shards, member, group)
    torch.testing.assert_close(sum(results[i][0] for i in range(shards)), expected.detach())
    torch.testing.assert_close(torch.cat([results[i][1] for i in range(shards)], 1), whole.grad)
