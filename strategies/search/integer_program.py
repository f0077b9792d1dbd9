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

from layerwise.strategies.hardware.host_memory import check_memory
from layerwise.strategies.search.config_bounds import share_bounds, total

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
    that the share bounds cannot rule out (none of which the optimum uses)."""
    bounds = share_bounds(nodes, edges)
    pairs = sum(len(bounds.kept[u]) * len(bounds.kept[v]) for u, v in edges)
    check_memory(pairs * _BYTES_PER_PAIR, f"the integer program over {pairs:,} pairs of configs",
                 "plan for fewer devices or use --placement origin")
    found, lower = _solve_kept(*bounds.restrict(nodes, edges), time_limit)
    choice = bounds.incumbent  # HiGHS' answer where it has one at least as good
    if found is not None:
        solved = bounds.original(found)
        if total(nodes, edges, solved) <= total(nodes, edges, choice):
            choice = solved
    cost = total(nodes, edges, choice)
    lower = max(lower, bounds.lower)
    return MilpSolution(choice=choice, cost=cost,
                        gap=max(0.0, (cost - lower) / cost) if cost > 0 else 0.0)


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
