"""A lower bound of t_x for every pair of configs of an edge from the other side's degrees
alone: where the other config's tiles sit is left free, so one value per config and degrees
of the other side stands for all of that side's placements, and configs of equal degrees
whose ends see equal links share one row (a class: on 64 devices 848 configs make about 210).

The search's bounds (search/elimination.py) first prune with this bound, then price the
bound that reads each config's ends (tables.py, `TransferTables.lower_bounds`) between the
configs it keeps only. Where a block sits matters far less for pruning than how it is split:
on 64 devices the least ends bound over each pair of degrees keeps as many configs as the
ends bound itself (Inception-v3: 1,891 against 1,876); this bound, which also lets each end
have its own best placement, keeps 30% of Inception-v3's configs and 11% of ResNet-50's, 9%
and 1% of their pairs, and the ends bound between those does the rest.

The bound. A device at one end of a config (its first or last) receives, per Eq. 1's t_x as
tables.py prices it, the elements its tile needs in link classes from the innermost outwards:
with I_k the elements held within its unit of tier k (its own tile's share I_own first, every
element last) and c_k the seconds per element over class k (a shared port's times the
receivers behind it),

    seconds = sum_k (I_k - I_(k-1)) c_k >= sum_k (I_k - I_(k-1)) c'_k
            = -I_own c'_0 + sum_(k < K) I_k (c'_k - c'_(k+1)) + I_K c'_K,

with c'_k = min over j >= k of c_j (non-decreasing), so every coefficient but the last is at
most 0 and any upper bound of I_own and the I_k gives a lower bound. The other side's tiles
sit one per device, so a unit of u devices holds at most u of them: I_k <= min(I_K, u_k T),
with T the largest share of any one of its tiles (the product over dims of the largest 1-d
overlap: boxes overlap dim by dim) and I_own <= T. Messages likewise, with at most one per
device and the count of tiles touching (exact: it depends on the degrees alone) last. The
pass's bound is the larger of the two ends, as the ends bound's is; forward at the consumer's
ends (I_K: the elements its tile needs), backward at the producer's (I_K: its tile's elements
the consumer tiles need, counted per consumer tile). Valid for any placement of the other
side, so for each of its configs; equal to the ends bound where a whole pair sits in one
device. Our own code: no library bounds these tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layerwise.strategies.model.space import ParallelConfig

# The bound's own rounding where every term cancels (a pair on one device): below this share
# of its largest term a bound is not a transfer
_CANCELLED = 1e-12


@dataclass(frozen=True)
class GroupedAt:
    """Where one side's degrees read the per-dim tables, per group of two dims (`dims`): the
    distinct pairs of table indices (`first`, `second`) and the pair of each entry (`of`,
    shaped as the entries). Per list of configs, not per edge: every edge over that list
    gathers through the same pairs."""

    dims: tuple[tuple[int, int], ...]
    first: tuple[np.ndarray, ...]
    second: tuple[np.ndarray, ...]
    of: tuple[np.ndarray, ...]


def grouped_at(at: np.ndarray, groups: Sequence[tuple[int, int]]) -> GroupedAt:
    """`GroupedAt` of table indices `at` (..., dims), non-negative."""
    first, second, of = [], [], []
    for d0, d1 in groups:
        base = int(at[..., d1].max(initial=0)) + 1  # pairs of indices as one number, and back
        pairs, pair_of = np.unique(at[..., d0] * base + at[..., d1], return_inverse=True)
        first.append(pairs // base)
        second.append(pairs % base)
        of.append(pair_of.reshape(at.shape[:-1]))
    return GroupedAt(dims=tuple(groups), first=tuple(first), second=tuple(second),
                     of=tuple(of))


@dataclass(frozen=True)
class EndRows:
    """A list of configs as the bound reads it: each config's degrees (`degree`, an index into
    `exponents`) and its row (`row`): configs with equal degrees and equal seconds per element
    at both ends share one. Per row, its degrees (`row_degree`) and the seconds per element of
    each link class at each end, (rows, 2, classes), before the envelope. Per degrees, the
    table slots of their end tiles (`ends`: the first and last tile along each dim, (G, 2)
    entries) and their exponents (`degrees`, (G,) entries), grouped (`grouped_at`)."""

    exponents: np.ndarray  # (G, dims) log2 of each distinct degrees, the padding dim last
    degree: np.ndarray  # (C,)
    row: np.ndarray  # (C,)
    row_degree: np.ndarray  # (R,)
    row_rates: np.ndarray  # (R, 2, classes)
    end_tiles: np.ndarray  # (G, 2, dims) the table slot of each end tile along each dim
    ends: GroupedAt
    degrees: GroupedAt

    def rows_of_degrees(self, per_degrees: np.ndarray) -> np.ndarray:
        """`per_degrees` (degrees first) as rows: each row its degrees'; the array itself where
        every degrees is one row, in order (no class splits one: a copy saved per term)."""
        if len(self.row_degree) == len(self.exponents):  # rows sort by degrees first
            return per_degrees
        return per_degrees[self.row_degree]


def end_tiles(exponents: np.ndarray, width: int) -> np.ndarray:
    """(G, 2, dims): the table slot (exponent * width + index) of the first and the last tile
    along each dim of each degrees (`exponents`, (G, dims)): those a config's first and last
    devices hold."""
    first = exponents * width
    return np.stack([first, first + (1 << exponents) - 1], axis=1)


def end_rows(configs: Sequence[ParallelConfig], dims: int,
             per_element: Sequence[float], sharing: np.ndarray | None,
             shared: Sequence[bool], width: int,
             groups: Sequence[tuple[int, int]]) -> EndRows:
    """`EndRows` of `configs`; `sharing` is `ConfigTable.sharing`'s (configs, D, classes)
    for these configs (None where no port is shared), `shared` which classes' ports are;
    `width` the tables' slots per exponent, `groups` their groups of two dims."""
    exponents = np.zeros((len(configs), dims), dtype=np.int64)
    ends = np.zeros((len(configs), 2), dtype=np.int64)
    for row, config in enumerate(configs):
        exponents[row, :len(config.degrees)] = [d.bit_length() - 1 for d in config.degrees]
        ends[row] = (config.devices[0], config.devices[-1])
    distinct, degree = np.unique(exponents, axis=0, return_inverse=True)
    degree = degree.reshape(-1)
    rates = np.broadcast_to(np.asarray(per_element, dtype=np.float64),
                            (len(configs), 2, len(per_element)))
    if sharing is not None:
        behind = sharing[np.arange(len(configs))[:, None], ends]  # (C, 2, classes)
        rates = rates * np.where(np.asarray(shared), behind, 1.0)
    key = np.concatenate([degree[:, None].astype(np.float64), rates.reshape(len(configs), -1)],
                         axis=1)
    _, first, row = np.unique(key, axis=0, return_index=True, return_inverse=True)
    tiles = end_tiles(distinct, width)
    return EndRows(exponents=distinct, degree=degree, row=row.reshape(-1),
                   row_degree=degree[first], row_rates=rates[first], end_tiles=tiles,
                   ends=grouped_at(tiles, groups), degrees=grouped_at(distinct, groups))


def grouped_products(tables: Sequence[np.ndarray], ends: GroupedAt,
                     other: GroupedAt) -> np.ndarray:
    """(G_e, 2, G_o): the product over dims of `tables[dim][end tile, other exponent]`, for
    each degrees of the side whose ends are read (`ends`: `EndRows.ends`, the table rows) and
    each degrees of the other side (`other`: its `EndRows.degrees`, the table columns), in
    float64 (`end_seconds` reads them so; counts of elements, exact below 2^53). Dims multiply
    in groups of two: each group's product is first taken over the distinct pairs of rows and
    of columns (a few dozen), then gathered once, a third of the gathers of one per dim."""
    product = None
    for group, (d0, d1) in enumerate(ends.dims):
        rows = (ends.first[group][:, None], ends.second[group][:, None])
        columns = (other.first[group][None, :], other.second[group][None, :])
        small = (tables[d0][rows[0], columns[0]]
                 * tables[d1][rows[1], columns[1]]).astype(np.float64)
        part = small[ends.of[group][..., None], other.of[group]]
        product = part if product is None else np.multiply(product, part, out=product)
    assert product is not None  # one group at least
    return product


def _envelope(values: np.ndarray) -> np.ndarray:
    """min over classes j >= k, for each k (the last axis)."""
    return np.minimum.accumulate(values[..., ::-1], axis=-1)[..., ::-1]


def end_seconds(rates: np.ndarray, latency: Sequence[float], units: Sequence[int],
                total: np.ndarray, largest: np.ndarray, touching: np.ndarray) -> np.ndarray:
    """The module's bound of one pass, the larger of the two ends', (rows, G): `rates`
    (rows, 2, classes) the seconds per element of each class at each end, `latency` per class,
    `units` the inner tiers' unit sizes (classes - 1 of them), and per row, end and degrees of
    the other side (rows, 2, G), in float64: the elements the end receives in all (`total`,
    or (rows, 2, 1) where it does not depend on the other side), the largest share one tile
    of the other side holds (`largest`), and the tiles touching (`touching`). Each term is
    computed into one scratch array (the arrays are large: on 64 devices a 3-d edge's are 460
    x 2 x 460)."""
    per_element = _envelope(rates)[..., None, :]  # (rows, 2, 1, classes)
    waits = _envelope(np.asarray(latency, dtype=np.float64))
    last = len(units)
    outermost = total * per_element[..., last] + touching * waits[last]
    scratch = np.minimum(total, largest)
    scratch *= per_element[..., 0]
    seconds = np.subtract(outermost, scratch, out=scratch)
    term = np.minimum(1.0, touching)
    term *= waits[0]
    seconds -= term
    for k, unit in enumerate(units):
        np.multiply(unit, largest, out=term)
        np.minimum(total, term, out=term)
        term *= per_element[..., k] - per_element[..., k + 1]
        seconds += term
        np.minimum(float(unit), touching, out=term)
        term *= waits[k] - waits[k + 1]
        seconds += term
    seconds -= np.multiply(_CANCELLED, outermost, out=term)
    return np.maximum(seconds, 0.0, out=seconds).max(axis=1)
