"""The search's fallback when exact elimination would need too large a table: the same choice
posed as an integer program and solved by HiGHS (through `scipy.optimize.milp`), as Alpa and
meta-pytorch/autoparallel pose it, with the solver's proven bound on how far from the optimum
the answer can be.

Variables: x[v, c] in {0, 1}, one per config of each node (exactly one set per node), and
y[e, ci, cj] in [0, 1] per pair of configs of each edge, tied to the endpoints by the marginal
constraints sum_cj y[e, ci, cj] = x[u, ci] and sum_ci y[e, ci, cj] = x[v, cj]; with integral x
only y[e, c_u, c_v] can be non-zero, so y need not be integral. Objective: node costs + edge
costs, the same sum elimination minimises.

scipy is the one library beyond torch, numpy and pydantic that the core imports, here only:
a numerical library like numpy (wheels for every platform torch has, no services), needed
wherever a search runs so that every valid model gets a strategy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import LinearConstraint, milp
from scipy.sparse import coo_array

from strategies.memory import check_memory

DEFAULT_TIME_LIMIT_SECONDS = 60.0
# HiGHS' memory per pair-of-configs column (its two nonzeros, bounds, cost, presolve copies)
_BYTES_PER_PAIR = 200
_RELATIVE_GAP = 1e-6  # stop once proven within this of the optimum (HiGHS' default is 1e-4)


@dataclass(frozen=True)
class MilpSolution:
    """Config index per node, its cost, and the proven relative gap to the optimum."""

    choice: dict[str, int]
    cost: float
    gap: float


def solve_milp(nodes: dict[str, np.ndarray], edges: dict[tuple[str, str], np.ndarray],
               time_limit: float = DEFAULT_TIME_LIMIT_SECONDS) -> MilpSolution:
    """Minimise sum(node[v][c_v]) + sum(edge[u, v][c_u, c_v]) with HiGHS, over the configs
    that `prune` cannot rule out (none of which the optimum uses)."""
    pruned = prune(nodes, edges)
    keep = pruned.keep
    pairs = sum(int(keep[u].sum()) * int(keep[v].sum()) for u, v in edges)
    check_memory(pairs * _BYTES_PER_PAIR, f"the integer program over {pairs:,} pairs of configs",
                 "plan for fewer devices or use --placement origin")
    found, lower = _solve_kept({name: cost[keep[name]] for name, cost in nodes.items()},
                               {(u, v): matrix[np.ix_(keep[u], keep[v])]
                                for (u, v), matrix in edges.items()}, time_limit)
    choice = pruned.incumbent  # HiGHS' answer where it has one at least as good
    if found is not None:
        solved = {name: int(np.flatnonzero(keep[name])[index])
                  for name, index in found.items()}
        if _total(nodes, edges, solved) <= _total(nodes, edges, choice):
            choice = solved
    cost = _total(nodes, edges, choice)
    lower = max(lower, pruned.lower)
    return MilpSolution(choice=choice, cost=cost,
                        gap=max(0.0, (cost - lower) / cost) if cost > 0 else 0.0)


@dataclass(frozen=True)
class Pruned:
    """What `prune` proved: the configs the optimum may use (a mask per node), a feasible
    strategy (config index per node), and a lower bound on the optimum."""

    keep: dict[str, np.ndarray]
    incumbent: dict[str, int]
    lower: float


def _edge_shares(nodes: dict[str, np.ndarray],
                 edges: dict[tuple[str, str], np.ndarray]) -> dict[tuple[str, str], np.ndarray]:
    """Each edge's matrix plus an equal share of its endpoints' costs: the shares and the
    costs of nodes without edges add up to the objective."""
    degree = dict.fromkeys(nodes, 0)
    for u, v in edges:
        degree[u] += 1
        degree[v] += 1
    return {(u, v): matrix + nodes[u][:, None] / degree[u] + nodes[v][None, :] / degree[v]
            for (u, v), matrix in edges.items()}


def _total(nodes: dict[str, np.ndarray], edges: dict[tuple[str, str], np.ndarray],
           choice: dict[str, int]) -> float:
    return (sum(float(cost[choice[name]]) for name, cost in nodes.items())
            + sum(float(matrix[choice[u], choice[v]]) for (u, v), matrix in edges.items()))


def _local_search(nodes: dict[str, np.ndarray], edges: dict[tuple[str, str], np.ndarray],
                  choice: dict[str, int]) -> dict[str, int]:
    """Improve `choice` one node at a time (each to its best config given its neighbours)
    until no single change helps: a feasible strategy, so an upper bound on the optimum."""
    improved = True
    while improved:
        improved = False
        for name, cost in nodes.items():
            local = cost.copy()
            for (u, v), matrix in edges.items():
                if u == name:
                    local += matrix[:, choice[v]]
                elif v == name:
                    local += matrix[choice[u], :]
            best = int(np.argmin(local))
            if local[best] < local[choice[name]]:
                choice[name] = best
                improved = True
    return choice


def prune(nodes: dict[str, np.ndarray], edges: dict[tuple[str, str], np.ndarray]) -> Pruned:
    """Which configs of each node the optimum may use.

    With the objective written as a sum over edges of shares (`_edge_shares`), fixing node v
    to config c costs at least the minimum of each share given c on v's edges plus the
    minimum of every other share: a lower bound. A config whose bound exceeds a feasible
    strategy's cost (`_local_search`) cannot be optimal. Minima over the configs still kept
    only grow, so this repeats until nothing more goes.
    """
    shares = _edge_shares(nodes, edges)
    alone = [name for name in nodes if not any(name in key for key in edges)]
    keep = {name: np.ones(len(cost), dtype=bool) for name, cost in nodes.items()}
    incumbent: dict[str, int] = {}
    upper = base = 0.0
    for _ in range(8):
        masked = {key: np.where(keep[key[0]][:, None] & keep[key[1]][None, :], share, np.inf)
                  for key, share in shares.items()}
        base = (sum(float(share.min()) for share in masked.values())
                + sum(float(nodes[name][keep[name]].min()) for name in alone))
        bound = {name: np.full(len(cost), base) for name, cost in nodes.items()}
        for (u, v), share in masked.items():
            lowest = float(share.min())
            bound[u] += share.min(axis=1) - lowest
            bound[v] += share.min(axis=0) - lowest
        for name in alone:  # no edges: its own cost in place of its minimum
            bound[name] += nodes[name] - nodes[name][keep[name]].min()
        if not incumbent:
            start = {name: int(np.argmin(values)) for name, values in bound.items()}
            incumbent = _local_search(nodes, edges, start)
            upper = _total(nodes, edges, incumbent)
        slack = upper * (1 + 1e-9) + 1e-15  # never drop a config on rounding
        narrowed = {name: keep[name] & (bound[name] <= slack) for name in nodes}
        if all(np.array_equal(narrowed[name], keep[name]) for name in nodes):
            break
        keep = narrowed
    return Pruned(keep=keep, incumbent=incumbent, lower=base)


def _solve_kept(nodes: dict[str, np.ndarray], edges: dict[tuple[str, str], np.ndarray],
                time_limit: float) -> tuple[dict[str, int] | None, float]:
    """The integer program itself: HiGHS' config index per node (None when it found no
    strategy in time) and its proven lower bound on the optimum (0 when it has none)."""
    names = list(nodes)
    x_start = dict(zip(names, np.cumsum([0] + [len(nodes[n]) for n in names[:-1]]),
                       strict=True))
    x_count = sum(len(cost) for cost in nodes.values())
    y_start = {}
    offset = x_count
    for key, matrix in edges.items():
        y_start[key] = offset
        offset += matrix.size
    # costs in units of the cheapest possible total, so that HiGHS' absolute tolerances
    # mean the same on any model
    scale = max(sum(float(cost.min()) for cost in nodes.values())
                + sum(float(matrix.min()) for matrix in edges.values()), 1e-12)
    objective = np.concatenate([nodes[n] for n in names]
                               + [matrix.ravel() for matrix in edges.values()]) / scale
    rows, columns, values = [], [], []
    row = 0
    for name in names:  # one config per node
        rows.append(np.full(len(nodes[name]), row))
        columns.append(x_start[name] + np.arange(len(nodes[name])))
        values.append(np.ones(len(nodes[name])))
        row += 1
    for (u, v), matrix in edges.items():
        size_u, size_v = matrix.shape
        grid = y_start[(u, v)] + np.arange(matrix.size).reshape(size_u, size_v)
        # sum over cj of y[ci, cj] - x[u, ci] = 0, one row per ci
        rows += [np.repeat(row + np.arange(size_u), size_v), row + np.arange(size_u)]
        columns += [grid.ravel(), x_start[u] + np.arange(size_u)]
        values += [np.ones(matrix.size), -np.ones(size_u)]
        row += size_u
        # sum over ci of y[ci, cj] - x[v, cj] = 0, one row per cj
        rows += [np.tile(row + np.arange(size_v), size_u), row + np.arange(size_v)]
        columns += [grid.ravel(), x_start[v] + np.arange(size_v)]
        values += [np.ones(matrix.size), -np.ones(size_v)]
        row += size_v
    matrix = coo_array((np.concatenate(values), (np.concatenate(rows), np.concatenate(columns))),
                       shape=(row, offset)).tocsr()
    bounds = np.zeros(row)
    bounds[:len(names)] = 1.0
    integrality = np.zeros(offset)
    integrality[:x_count] = 1
    result = milp(objective, integrality=integrality, bounds=(0, 1),
                  constraints=LinearConstraint(matrix, bounds, bounds),
                  options={"time_limit": time_limit, "mip_rel_gap": _RELATIVE_GAP})
    if result.mip_dual_bound is None or not np.isfinite(result.mip_dual_bound):
        lower = 0.0
    else:
        lower = float(result.mip_dual_bound) * scale
    if result.x is None:
        return None, lower
    return {name: int(np.argmax(result.x[x_start[name]:x_start[name] + len(nodes[name])]))
            for name in names}, lower
