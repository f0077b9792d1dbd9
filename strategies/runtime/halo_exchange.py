"""The halo exchange: moving tiles between the devices of two layers with different splits.

A tile of a convolution or pooling needs more input than the matching tile of the layer before
holds: its receptive field reaches rows (or columns) of the neighbours' tiles, the halo. More
generally, a consumer split along other dims or over other devices than its producer needs
pieces of several producer tiles. `plan.py` decides, per edge and rank, which box each rank
needs and which pieces of which producer tiles make it up; this module moves them:

- forward, `gather`: each rank sends the pieces of its producer tile that others need and
  assembles its needed box from what it holds and what arrives (point-to-point, one phase per
  edge, every byte counted by the communicator as the edge's transfer, Jia et al.'s t_x);
- backward, `return_gradient`: the needed box's gradient goes back in the same pieces and is
  summed into the producer tile's gradient, so overlapping halos add up (the gradient of a
  gather is a scatter-add).

Written here because no library moves arbitrary receptive-field boxes between arbitrary tilings
(DTensor's halo path covers only the last dim on a 1-D mesh, docs/research.md: torch.distributed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from layerwise.strategies.model.tiles import Box, real_box
from layerwise.strategies.runtime.comm import Communicator
from layerwise.strategies.runtime.plan import InputPlan, local_slices, shape_of


def tile_part(tensor: torch.Tensor, box: Box, within: Box) -> torch.Tensor:
    """The part of a tile (or its gradient) covering `box`, the tile covering `within`.

    Tiles keep their layer's own rank ((N, F) after a linear layer or a flatten, (N, C, L) in
    a 1-d net), so that no step pays a reshape in and out of the 5-d view per layer (each is
    an autograd node forward and backward); the view's dims a tile lacks have ranges (0, 1),
    and the slices of the dims it has index it.
    """
    rank = tensor.dim()
    return tensor[local_slices(real_box(box, rank), real_box(within, rank))]


def real_shape(box: Box, rank: int) -> tuple[int, ...]:
    """The shape of a tensor of `rank` dims holding the view box `box`."""
    return shape_of(real_box(box, rank))


def phase_tag(layer_index: int, input_index: int, direction: int) -> int:
    """A message tag unique to one exchange phase (gloo matches messages by tag)."""
    return (layer_index * 64 + input_index) * 2 + direction


@dataclass(frozen=True)
class HaloExchange:
    """One rank's side of every exchange phase, on its communicator, device and dtype."""

    comm: Communicator
    device: torch.device
    dtype: torch.dtype

    def empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty(shape, device=self.device, dtype=self.dtype)

    def gather(self, layer_index: int, input_plan: InputPlan, producer: torch.Tensor | None,
               producer_box: Box | None, producer_dims: int, layer: str) -> torch.Tensor | None:
        """This rank's needed box of one input, assembled from the producer tiles (forward).

        `producer` is this rank's producer tile covering `producer_box` (None where it holds
        none); the box comes back in the producer's rank (`producer_dims`). A needed box that
        is exactly this rank's own producer tile is the tile itself, not a copy.
        """
        rank = self.comm.rank
        sends = []
        for piece in input_plan.sends_from(rank):
            assert producer is not None and producer_box is not None
            part = tile_part(producer.detach(), piece.box, producer_box)
            sends.append((piece.target, part.reshape(shape_of(piece.box)).contiguous()))
        needed = input_plan.needed.get(rank)
        pieces = input_plan.received_by(rank) if needed is not None else []
        tag = phase_tag(layer_index, input_plan.index, 0)
        if (needed is not None and producer is not None and len(pieces) == 1
                and pieces[0].box == producer_box == needed):
            self.comm.exchange(sends, [], tag=tag, layer=layer)
            return producer
        receives = [(p.source, self.empty(shape_of(p.box))) for p in pieces if p.remote]
        self.comm.exchange(sends, receives, tag=tag, layer=layer)
        if needed is None:
            return None
        box = self.empty(shape_of(needed))
        received = iter(buffer for _, buffer in receives)
        for piece in pieces:
            if piece.remote:
                box[local_slices(piece.box, needed)] = next(received)
            else:
                assert producer is not None and producer_box is not None
                part = tile_part(producer.detach(), piece.box, producer_box)
                box[local_slices(piece.box, needed)] = part.reshape(shape_of(piece.box))
        return box.reshape(real_shape(needed, producer_dims)) if producer_dims < 5 else box

    def return_gradient(self, layer_index: int, input_plan: InputPlan,
                        needed_gradient: torch.Tensor | None, producer_box: Box | None,
                        total: torch.Tensor | None, layer: str) -> torch.Tensor | None:
        """Send the needed box's gradient back to the producer tiles (backward); returns
        `total`, the producer tile's gradient so far, with what belongs to this rank's tile
        added (created at the first piece; None where this rank holds no producer tile)."""
        rank = self.comm.rank
        sends, local = [], []
        if needed_gradient is not None:
            needed = input_plan.needed[rank]
            for piece in input_plan.received_by(rank):
                part = tile_part(needed_gradient, piece.box, needed).reshape(shape_of(piece.box))
                if piece.remote:
                    sends.append((piece.source, part.contiguous()))
                else:
                    local.append((piece, part))
        incoming = input_plan.sends_from(rank)
        receives = [(p.target, self.empty(shape_of(p.box))) for p in incoming]
        self.comm.exchange(sends, receives, tag=phase_tag(layer_index, input_plan.index, 1),
                           layer=layer)
        if producer_box is None:
            return total
        arrived = ((piece, buffer) for piece, (_, buffer) in zip(incoming, receives,
                                                                   strict=True))
        for piece, part in [*local, *arrived]:
            if total is None:
                total = self.empty(shape_of(producer_box)).zero_()
            total[local_slices(piece.box, producer_box)] += part
        return total
