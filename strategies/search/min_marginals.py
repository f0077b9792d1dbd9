"""Every config's min-marginal of a pairwise min-sum problem that Jia's eliminations reduce.

A config's min-marginal is the least cost of any strategy that uses it. The search's forest
bounds (config_bounds.py) compute them over a spanning forest, each dropped edge cut in half: on
Inception-v3 its concatenations keep one of their four input edges, and on 16 devices of h200x8
the forest's least bound sits 1.0% under the optimum of the very bounds it relaxes, while the
elimination over them finds 0.12% under. Here the eliminations themselves run forward (node
elimination, Eq. 2; edge elimination, Eq. 3; a leaf folded into its one neighbour), what is left
is tried exhaustively (a single node for every zoo network), and a second pass back through the
eliminations gives every eliminated node's min-marginals, and each of its edges' pairwise ones,
from the pairwise min-marginals of the edge it became:

    pair j between i and k (its edge M_j(a, b) = min_c e_ij(a, c) + n_j(c) + e_jk(c, b)):
        outside(a, b) = P_ik(a, b) - M_j(a, b)
        P_ij(a, c) = min_b outside(a, b) + e_ij(a, c) + n_j(c) + e_jk(c, b), P_jk likewise,
        and j's own min-marginals the least over both;
    leaf j folded into o (o's vector gained f_j(a) = min_c e_oj(a, c) + n_j(c)):
        P_oj(a, c) = m_o(a) - f_j(a) + e_oj(a, c) + n_j(c).

Min-marginals and pairwise ones do not change as the eliminations shrink the graph (each is
exact), so those of an edge are read where its first end to go is eliminated, or at the end.
Exact: the same minima as trying every strategy (tests/test_pruning.py). Our own code: no
library runs min-plus eliminations over tensors of configurations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Triples of configs (C_i x C_j x C_k) in one min-plus block, either pass, sized for cache
_CHUNK_ELEMENTS = 1 << 18
# What is left after the eliminations is solved exhaustively up to this many joint configs
_FINAL_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class _Pair:
    """Node j eliminated between i (its one predecessor) and k (its one successor)."""

    j: str
    i: str
    k: str
    first: np.ndarray  # e_ij (i x j)
    cost: np.ndarray  # n_j
    second: np.ndarray  # e_jk (j x k)
    merged: np.ndarray  # M_j (i x k)


@dataclass(frozen=True)
class _Leaf:
    """Node j folded into its one neighbour o."""

    j: str
    o: str
    edge: np.ndarray  # e_oj oriented (o x j)
    cost: np.ndarray  # n_j
    folded: np.ndarray  # f_j over o's configs


def min_marginals(nodes: dict[str, np.ndarray], edges: dict[tuple[str, str], np.ndarray],
                  order: Sequence[str]) -> dict[str, np.ndarray] | None:
    """Per node, the least cost of any strategy using each of its configs (node costs plus
    edge costs, the objective `config_bounds.total` prices); None where the eliminations leave
    nodes of more than `_FINAL_ELEMENTS` joint configs (the caller keeps its forest bounds).
    `order` fixes which eliminable node goes first, as `elimination.solve`'s does."""
    vectors = dict(nodes)
    matrices = dict(edges)
    neighbours: dict[str, set[str]] = {name: set() for name in nodes}
    for u, v in edges:
        neighbours[u].add(v)
        neighbours[v].add(u)
    steps: list[_Pair | _Leaf] = []
    changed = True
    while changed:
        changed = False
        for j in order:
            if j not in vectors or len(vectors) == 1:
                continue
            around = neighbours[j]
            preds = [u for u in around if (u, j) in matrices]
            succs = [v for v in around if (j, v) in matrices]
            if len(preds) == 1 and len(succs) == 1 and len(around) == 2:
                (i,), (k,) = preds, succs
                first, cost, second = matrices.pop((i, j)), vectors.pop(j), matrices.pop((j, k))
                merged = min_plus(first + cost[None, :], second)[0]
                steps.append(_Pair(j, i, k, first, cost, second, merged))
                neighbours[i].discard(j)
                neighbours[k].discard(j)
                del neighbours[j]
                matrices[(i, k)] = matrices[(i, k)] + merged if (i, k) in matrices else merged
                neighbours[i].add(k)
                neighbours[k].add(i)
            elif len(around) == 1:
                (o,) = around
                edge = matrices.pop((o, j)) if (o, j) in matrices else matrices.pop((j, o)).T
                cost = vectors.pop(j)
                folded = fold(edge, cost)[0]
                steps.append(_Leaf(j, o, edge, cost, folded))
                vectors[o] = vectors[o] + folded
                neighbours[o].discard(j)
                del neighbours[j]
            else:
                continue
            changed = True
    marginal, pairwise = _final(vectors, matrices)
    if marginal is None:
        return None
    for step in reversed(steps):
        if isinstance(step, _Pair):
            outside = _less(_pairwise(pairwise, step.i, step.k), step.merged)
            to_i, to_k, own = _through(outside, step.first, step.cost, step.second)
            pairwise[(step.i, step.j)] = to_i
            pairwise[(step.j, step.k)] = to_k
            marginal[step.j] = own
        else:
            outside = _less(marginal[step.o], step.folded)
            joint = outside[:, None] + step.edge + step.cost[None, :]
            pairwise[(step.o, step.j)] = joint
            marginal[step.j] = joint.min(axis=0)
    return marginal


def _final(vectors: dict[str, np.ndarray], matrices: dict[tuple[str, str], np.ndarray],
           ) -> tuple[dict[str, np.ndarray] | None, dict[tuple[str, str], np.ndarray]]:
    """Min-marginals and pairwise ones of what the eliminations left: nodes without edges
    between them (one per connected part: each adds the others' least), else every joint
    config tried where they are at most `_FINAL_ELEMENTS`; (None, {}) beyond."""
    names = list(vectors)
    if not matrices:
        least = {name: float(vector.min()) for name, vector in vectors.items()}
        rest = sum(least.values())
        return {name: vector + (rest - least[name]) for name, vector in vectors.items()}, {}
    shape = [len(vectors[name]) for name in names]
    if int(np.prod(shape, dtype=np.float64)) > _FINAL_ELEMENTS:
        return None, {}
    axis = {name: index for index, name in enumerate(names)}
    joint = np.zeros(shape)
    for name, vector in vectors.items():
        joint = joint + vector.reshape([-1 if index == axis[name] else 1
                                        for index in range(len(names))])
    for (u, v), matrix in matrices.items():
        view = matrix if axis[u] < axis[v] else matrix.T
        joint = joint + view.reshape([view.shape[0] if index == min(axis[u], axis[v]) else
                                      view.shape[1] if index == max(axis[u], axis[v]) else 1
                                      for index in range(len(names))])
    marginal = {name: joint.min(axis=tuple(other for other in range(len(names))
                                           if other != axis[name])) for name in names}
    pairwise = {}
    for u, v in matrices:
        low, high = sorted((axis[u], axis[v]))
        both = joint.min(axis=tuple(other for other in range(len(names))
                                    if other not in (low, high)))
        pairwise[(u, v)] = both if axis[u] < axis[v] else both.T
    return marginal, pairwise


def _pairwise(pairwise: dict[tuple[str, str], np.ndarray], u: str, v: str) -> np.ndarray:
    """The pairwise min-marginals of u and v as (u x v), whichever way their edge ran."""
    return pairwise[(u, v)] if (u, v) in pairwise else pairwise[(v, u)].T


def _less(total: np.ndarray, part: np.ndarray) -> np.ndarray:
    """total - part, infinite where the part is (no strategy passes there at all)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(part), np.inf, total - part)


def min_plus(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """out[i, k] = min_j left[i, j] + right[j, k], with the argmin j, in bounded memory (Eq. 2's
    node elimination, for `elimination.solve` and the pass forward here).

    Blocks are laid out (i, k, j) so that the reductions run over contiguous memory.
    """
    left = np.ascontiguousarray(left)
    right_t = np.ascontiguousarray(right.T)
    rows = max(1, _CHUNK_ELEMENTS // max(1, left.shape[1] * right.shape[1]))
    best = np.empty((left.shape[0], right.shape[1]))
    # argmins kept until the search ends: the narrowest type that holds a config index
    arg = np.empty((left.shape[0], right.shape[1]),
                   dtype=np.int16 if left.shape[1] <= np.iinfo(np.int16).max else np.int64)
    # one buffer for every block: allocating each anew costs a quarter of the time
    buffer = np.empty((min(rows, left.shape[0]), right.shape[1], left.shape[1]))
    for start in range(0, left.shape[0], rows):
        block = buffer[:min(rows, left.shape[0] - start)]
        np.add(left[start:start + rows, None, :], right_t[None, :, :], out=block)
        found = block.argmin(axis=2)
        arg[start:start + rows] = found
        best[start:start + rows] = _at_last(block, found)
    return best, arg


def _at_last(block: np.ndarray, found: np.ndarray) -> np.ndarray:
    """block[..., found] of a C-contiguous block, one flat gather: 4-5x faster than
    `take_along_axis`, and with argmin 3-10x faster than a min over the last axis (blocks of
    20-70 configs a side)."""
    width = block.shape[-1]
    return block.ravel().take(np.arange(found.size) * width + found.ravel()).reshape(
        found.shape)


def fold(matrix: np.ndarray, cost_j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A leaf j folded into its neighbour (`elimination.solve`'s leaf step and the pass
    forward here): per neighbour config, min over c_j of the edge plus j's cost, and the
    argmin."""
    total = matrix + cost_j[None, :]
    arg = total.argmin(axis=1)
    return total[np.arange(len(arg)), arg], arg


def _through(outside: np.ndarray, first: np.ndarray, cost: np.ndarray,
             second: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For j between i and k: over (a, c, b) = outside(a, b) + e_ij(a, c) + n_j(c) +
    e_jk(c, b), the least over b (i x j), over a (j x k), and over both (j), in blocks of i's
    configs."""
    with_cost = first + cost[None, :]
    to_i = np.empty(first.shape)
    to_k = np.full(second.shape, np.inf)
    rows = max(1, _CHUNK_ELEMENTS // max(1, second.size))
    buffer = np.empty((min(rows, len(outside)), *second.shape))  # one for every block
    for start in range(0, len(outside), rows):
        block = buffer[:min(rows, len(outside) - start)]  # (a, c, b)
        np.add(outside[start:start + rows, None, :], with_cost[start:start + rows, :, None],
               out=block)
        block += second[None, :, :]
        to_i[start:start + rows] = _at_last(block, block.argmin(axis=2))
        np.minimum(to_k, block.min(axis=0), out=to_k)
    return to_i, to_k, to_k.min(axis=1)
