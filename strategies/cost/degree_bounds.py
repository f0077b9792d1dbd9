"""A lower bound of t_x for every pair of configs of an edge from the other side's degrees
alone: where the other config's tiles sit is left free, so one value per config and degrees
of the other side stands for all of that side's placements, and configs of equal degrees
whose ends see equal links share one row (a class: on 64 devices 848 configs make about 210).

The search's bounds (search/elimination.py) first prune with this bound, then, where the
pairs left are still many, price the bound that reads each config's ends (tables.py,
`TransferTables.lower_bounds`) between the configs it keeps only. Where a block sits matters
far less for pruning than how it is split: on 64 devices the least ends bound over each pair
of degrees keeps as many configs as the ends bound itself (Inception-v3: 1,891 against
1,876). This bound keeps 3.2% of Inception-v3's configs on 64 devices of p100x16 and 1.1%
of ResNet-50's (0.20% and 0.02% of their pairs); without the windows and the bare ends below
it kept 30% and 2.9%.

The bound. A device at one end of a config (its first or last) receives, per Eq. 1's t_x as
tables.py prices it, the elements its tile needs in link classes from the innermost outwards:
with I_k the elements held within its unit of tier k (its own tile's share I_own first, every
element last) and c_k the seconds per element over class k (a shared port's times the
receivers behind it),

    seconds = sum_k (I_k - I_(k-1)) c_k >= sum_k (I_k - I_(k-1)) c'_k
            = -I_own c'_0 + sum_(k < K) I_k (c'_k - c'_(k+1)) + I_K c'_K,

with c'_k = min over j >= k of c_j (non-decreasing), so every coefficient but the last is at
most 0 and any upper bound of I_own and the I_k gives a lower bound. I_own <= T, the largest
share of any one tile of the other side (the product over dims of the largest 1-d overlap:
boxes overlap dim by dim). A unit of u devices holds at most u of its tiles, I_k <= u_k T;
where every config of the other side's degrees is an aligned run (its first device a
multiple of its size, tile k on its k-th device, k row-major over n, c, d, h, w), the unit
holds one aligned window of u_k consecutive tiles: the trailing dims whole, an aligned run
of one dim, one tile of each leading dim, and I_k is at most the most any such window holds
(forward, the window is one tile of coarser degrees: power-of-two tiles nest). Messages
likewise, with at most one per device and the count of tiles touching (exact: it depends on
the degrees alone) last. The pass's bound is the larger of the two ends, as the ends bound's
is; forward at the consumer's ends (I_K: the elements its tile needs), backward at the
producer's (I_K: its tile's elements the consumer tiles need, counted per consumer tile).

Bare ends. The two ends share one placement of the other side: where its run of devices is
too short to reach into the units of both (of the device itself, or of a tier), one end's
unit holds none of its tiles, whichever end, so that end's I of that unit and every inner
one are 0; the bound is then the lesser of the two ways. On 64 devices of p100x16, samples
split over 32 devices feeding samples and channels split over 64 (Inception-v3's last
block): one end of the consumer needs what a producer in another node holds, and the bound
rises from 1.7 ms to 12.4 ms (t_x 32.2 ms; the backward pass, at the producer's ends, keeps
its old bound).

Valid for any placement of the other side, so for each of its configs; equal to the ends
bound where a whole pair sits in one device. Our own code: no library bounds these tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layerwise.strategies.model.space import DIMS, ParallelConfig

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
    `exponents`) and its row (`row`): configs with equal degrees, equal seconds per element
    at both ends, equal gaps between their ends' units and alike aligned or not share one. An
    aligned run is a run of consecutive devices whose first is a multiple of their number.
    Per row, its degrees (`row_degree`), the seconds per element of each link class at each
    end, (rows, 2, classes), before the envelope, those gaps, and its devices where its
    configs are aligned runs. Per degrees, how many devices each config of them spans where
    all are runs (`run_sizes`), or aligned runs (`aligned_sizes`), the table slots of
    their end tiles (`ends`: the first and last tile along each dim, (G, 2) entries), their
    exponents (`degrees`, (G,) entries) and per inner tier the codes of their windows
    (`windows`), grouped (`grouped_at`); a unit of that tier holds one window of the tiles of
    a config of those degrees where all of them sit at a start that is a multiple of their
    size (else `window_scale` is the unit: a unit holds at most that many of its tiles)."""

    exponents: np.ndarray  # (G, dims) log2 of each distinct degrees, the padding dim last
    degree: np.ndarray  # (C,)
    row: np.ndarray  # (C,)
    row_degree: np.ndarray  # (R,)
    row_rates: np.ndarray  # (R, 2, classes)
    row_gaps: np.ndarray  # (R, levels) `end_gaps` of each row's ends
    row_aligned: np.ndarray  # (R,) its devices where its configs are aligned runs, else 0
    run_sizes: np.ndarray  # (G,) each degrees' devices; 0 where a config of them is no run
    aligned_sizes: np.ndarray  # (G,) the same where all are aligned runs, else 0
    end_tiles: np.ndarray  # (G, 2, dims) the table slot of each end tile along each dim
    ends: GroupedAt
    degrees: GroupedAt
    windows: tuple[GroupedAt, ...]  # per inner tier: `window_codes` of each degrees
    window_scale: np.ndarray  # (tiers, G): 1, or the unit where its windows do not hold

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


def end_gaps(first: np.ndarray, last: np.ndarray, units: Sequence[int]) -> np.ndarray:
    """(C, levels): for the first and last device of each config, per level (the device
    itself, then each inner tier's unit of `units` devices, aligned), the fewest devices a
    run of consecutive devices needs to reach into both ends' units; 0 where both ends share
    one (any run that reaches one reaches both, or neither)."""
    gaps = np.zeros((len(first), 1 + len(units)), dtype=np.int64)
    for level, unit in enumerate([1, *units]):
        apart = last // unit - first // unit
        gaps[:, level] = np.where(apart > 0, (apart - 1) * unit + 2, 0)
    return gaps


def window_codes(exponents: np.ndarray, unit: int, levels: int) -> np.ndarray:
    """(G, dims): how each dim of each degrees (`exponents`, the padding dim last) enters the
    tiles of one aligned unit of `unit` devices, as a column of `window_table`'s tables.

    A config's tile k sits on its k-th device, k row-major over n, c, d, h, w; where its
    start is a multiple of its size, a unit of 2^m devices (aligned) holds the tiles of
    2^m consecutive k at a multiple of 2^m, or all of them if fewer: the trailing dims
    whole, one dim in an aligned run of 2^t of its tiles, and one tile of each leading dim.
    Codes: leading at exponent e: e; whole: levels + e; a run of 2^t (0 < t < e):
    2 * levels + e * levels + t."""
    codes = exponents.copy()  # leading, until the unit's tiles are spent
    spare = np.full(len(exponents), unit.bit_length() - 1, dtype=np.int64)
    for dim in reversed(range(len(DIMS))):
        exponent = exponents[:, dim]
        taken = np.minimum(exponent, spare)
        codes[:, dim] = np.where(taken == exponent, levels + exponent,
                                 np.where(taken == 0, exponent,
                                          2 * levels + exponent * levels + taken))
        spare -= taken
    return codes


def window_table(single: np.ndarray, whole: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """(slots, 2 * levels + levels^2): per end tile (a row), each `window_codes` column:
    leading at exponent e, `single[:, e]` (the most one tile of 2^e holds); whole,
    `whole[:, e]` (all tiles of 2^e together); an aligned run of 2^t of them, `runs[:, e, t]`
    (the most any such run holds); int64."""
    slots, levels = single.shape
    table = np.zeros((slots, levels * (2 + levels)), dtype=np.int64)
    table[:, :levels] = single
    table[:, levels:2 * levels] = whole
    table[:, 2 * levels:] = runs.reshape(slots, levels * levels)
    return table


def end_rows(configs: Sequence[ParallelConfig], dims: int,
             per_element: Sequence[float], sharing: np.ndarray | None,
             shared: Sequence[bool], width: int,
             groups: Sequence[tuple[int, int]], units: Sequence[int]) -> EndRows:
    """`EndRows` of `configs`; `sharing` is `ConfigTable.sharing`'s (configs, D, classes)
    for these configs (None where no port is shared), `shared` which classes' ports are;
    `width` the tables' slots per exponent, `groups` their groups of two dims; `units` the
    inner tiers' unit sizes."""
    exponents = np.zeros((len(configs), dims), dtype=np.int64)
    ends = np.zeros((len(configs), 2), dtype=np.int64)
    runs = np.zeros(len(configs), dtype=bool)
    for row, config in enumerate(configs):
        exponents[row, :len(config.degrees)] = [d.bit_length() - 1 for d in config.degrees]
        ends[row] = (config.devices[0], config.devices[-1])
        runs[row] = config.devices[-1] - config.devices[0] == config.size - 1
    aligned = runs & (ends[:, 0] % np.array([config.size for config in configs],
                                            dtype=np.int64).reshape(-1) == 0)
    distinct, degree = np.unique(exponents, axis=0, return_inverse=True)
    degree = degree.reshape(-1)
    all_runs = np.ones(len(distinct), dtype=bool)
    np.logical_and.at(all_runs, degree, runs)
    all_aligned = np.ones(len(distinct), dtype=bool)
    np.logical_and.at(all_aligned, degree, aligned)
    levels = (width - 1).bit_length()  # exponents 0 .. levels - 1
    rates = np.broadcast_to(np.asarray(per_element, dtype=np.float64),
                            (len(configs), 2, len(per_element)))
    if sharing is not None:
        behind = sharing[np.arange(len(configs))[:, None], ends]  # (C, 2, classes)
        rates = rates * np.where(np.asarray(shared), behind, 1.0)
    gaps = end_gaps(ends[:, 0], ends[:, 1], units)
    key = np.concatenate([degree[:, None].astype(np.float64), rates.reshape(len(configs), -1),
                          gaps.astype(np.float64), aligned[:, None].astype(np.float64)],
                         axis=1)
    sizes = 1 << distinct.sum(axis=1)
    _, first, row = np.unique(key, axis=0, return_index=True, return_inverse=True)
    tiles = end_tiles(distinct, width)
    return EndRows(exponents=distinct, degree=degree, row=row.reshape(-1),
                   row_degree=degree[first], row_rates=rates[first], row_gaps=gaps[first],
                   row_aligned=np.where(aligned[first], sizes[degree[first]], 0),
                   run_sizes=np.where(all_runs, sizes, 0),
                   aligned_sizes=np.where(all_aligned, sizes, 0),
                   end_tiles=tiles, ends=grouped_at(tiles, groups),
                   degrees=grouped_at(distinct, groups),
                   windows=tuple(grouped_at(np.where(all_aligned[:, None], window_codes(
                       distinct, unit, levels), distinct), groups) for unit in units),
                   window_scale=np.array([np.where(all_aligned, 1.0, float(unit))
                                          for unit in units]).reshape(len(units), -1))


def grouped_index(ends: GroupedAt, other: GroupedAt) -> tuple[np.ndarray, ...]:
    """Per group of two dims, where each (end degrees, end, other degrees) entry reads the
    flat table of products over the distinct pairs of rows and of columns (`group_product`),
    (G_e, 2, G_o): the same for every edge between two lists."""
    return tuple(of[..., None] * len(columns) + other_of for of, columns, other_of in zip(
        ends.of, other.first, other.of, strict=True))


def group_product(first: np.ndarray, second: np.ndarray, ends: GroupedAt, other: GroupedAt,
                  index: tuple[np.ndarray, ...], group: int) -> np.ndarray:
    """(G_e, 2, G_o): the product of the tables of one group of two dims, `first` and
    `second`, at each degrees' ends (`ends`: `EndRows.ends`, the table rows) and each degrees
    of the other side (`other`: its `EndRows.degrees`, the table columns), in float64
    (`end_seconds` reads them so; counts of elements, exact below 2^53): taken over the
    distinct pairs of rows and of columns (a few dozen), then gathered once through `index`
    (`grouped_index`), a third of the gathers of one per dim."""
    rows = (ends.first[group][:, None], ends.second[group][:, None])
    columns = (other.first[group][None, :], other.second[group][None, :])
    small = (first[rows[0], columns[0]] * second[rows[1], columns[1]]).astype(np.float64)
    return small.ravel().take(index[group])


def _envelope(values: np.ndarray) -> np.ndarray:
    """min over classes j >= k, for each k (the last axis)."""
    return np.minimum.accumulate(values[..., ::-1], axis=-1)[..., ::-1]


def bare_levels(rows: EndRows, other: EndRows, units: Sequence[int]) -> np.ndarray:
    """(rows, G of `other`): the outermost level (0: the device itself, then each inner tier
    of `units`) at which, wherever the other side's config of those degrees sits, one of the
    row's two ends has none of its tiles within its unit (and so within every inner one);
    -1 where both may. A run of s devices reaches into the units of both ends only if s is
    at least `end_gaps`; an aligned run of s into both ends of an aligned run of r only if
    both lie in one aligned block of max(unit, s) devices: r <= max(unit, s)."""
    bare = np.full((len(rows.row_gaps), len(other.run_sizes)), -1, dtype=np.int64)
    runs, aligned = other.run_sizes[None, :], other.aligned_sizes[None, :]
    for level, unit in enumerate([1, *units]):
        short = (runs > 0) & (runs < rows.row_gaps[:, level, None])
        short |= (aligned > 0) & (rows.row_aligned[:, None] > np.maximum(unit, aligned))
        bare[short] = level  # a level short is short at every inner one: the outermost wins
    return bare


def end_seconds(rates: np.ndarray, latency: Sequence[float], units: Sequence[int],
                 total: np.ndarray, largest: np.ndarray, touching: np.ndarray,
                 windows: Sequence[np.ndarray], bare: np.ndarray) -> np.ndarray:
    """The module's bound of one pass, (rows, G): `rates` (rows, 2, classes) the seconds per
    element of each class at each end, `latency` per class, `units` the inner tiers' unit
    sizes (classes - 1 of them), and per row, end and degrees of the other side (rows, 2, G),
    in float64: the elements the end receives in all (`total`, or (rows, 2, 1) where it does
    not depend on the other side), the largest share one tile of the other side holds
    (`largest`), the most the other side's tiles in the end's unit of each inner tier can
    hold (`windows`), and the tiles touching (`touching`). Each term is computed into one
    scratch array (the arrays are large: on 64 devices a 3-d edge's are 460 x 2 x 460).

    The larger of the two ends', except where one end's units up to some level hold none of
    the other side's tiles, whichever end it is (`bare`: `bare_levels`, per row and degrees
    of the other side): then that end's terms of those levels vanish (each is <= 0), and the
    bound is the lesser of the two ways: one end so, the other as it is."""
    per_element = _envelope(rates)[..., None, :]  # (rows, 2, 1, classes)
    waits = _envelope(np.asarray(latency, dtype=np.float64))
    last = len(units)
    beyond = bare[:, None, :]  # (rows, 1, G)
    levels = int(beyond.max(initial=-1)) + 1  # of which some end drops its terms
    # the terms of the levels an end may drop, summed innermost first: the end's bound
    # without them is its bound less those sums (each <= 0)
    through: list[np.ndarray] = []
    # every element over the outermost link, less the bound's own rounding where all cancels
    outermost = np.multiply(touching, waits[last])
    outermost += total * per_element[..., last]
    outermost *= 1.0 - _CANCELLED
    scratch = np.minimum(total, largest)
    scratch *= per_element[..., 0]
    inner = np.negative(scratch, out=scratch)
    term = np.minimum(1.0, touching)
    term *= waits[0]
    inner -= term
    for k, unit in enumerate(units):
        if len(through) < levels:
            through.append(inner.copy())
        np.minimum(total, windows[k], out=term)
        term *= per_element[..., k] - per_element[..., k + 1]
        inner += term
        np.minimum(float(unit), touching, out=term)
        term *= waits[k] - waits[k + 1]
        inner += term
    if len(through) < levels:
        through.append(inner.copy())
    seconds = np.add(outermost, inner, out=inner)
    both = np.maximum(seconds[:, 0], seconds[:, 1])  # the larger end (a reduction over
    both = np.maximum(both, 0.0, out=both)  # the middle axis of two is slower)
    if not levels:
        return both
    dropped = through[0]
    for level in range(1, levels):  # the sum through each entry's own level
        np.copyto(dropped, through[level], where=beyond >= level)
    alone = np.subtract(seconds, dropped, out=dropped)  # each end without the other's tiles
    one_way = np.minimum(np.maximum(alone[:, 0], seconds[:, 1]),
                         np.maximum(seconds[:, 0], alone[:, 1]))
    return np.where(beyond[:, 0] >= 0, np.maximum(one_way, 0.0), both)
