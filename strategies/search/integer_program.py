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
_INFEASIBLE = 2  # scipy.optimize.milp's status when HiGHS proves no choice meets the rows


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
    found, lower = solve_program(Program({name: cost[None] for name, cost in nodes.items()},
                                         edges), time_limit)
    return (None if found is None else {name: index for name, (_, index) in found.items()},
            lower)


@dataclass(frozen=True)
class Program:
    """The choice as an integer program: per node a (variant, config) cost array (a variant is
    a way to run the same config, as keeping or recomputing a layer's activations; edges see
    the config alone), the edges' cost matrices, and optional linear rows over the nodes'
    choices: `rows[name]` a (variant, row, config) array of coefficients, each row's sum at
    most `row_limits` (inf costs mark choices that do not exist)."""

    nodes: dict[str, np.ndarray]
    edges: dict[tuple[str, str], np.ndarray]
    rows: dict[str, np.ndarray] | None = None
    row_limits: np.ndarray | None = None


def solve_program(program: Program, time_limit: float, relative_gap: float = _RELATIVE_GAP
                  ) -> tuple[dict[str, tuple[int, int]] | None, float]:
    """HiGHS' (variant, config index) per node (None when it found none in time), stopping
    once proven within `relative_gap` of the optimum, and its proven lower bound on the
    optimum (0 when it has none, inf when no choice meets the rows)."""
    nodes, edges = program.nodes, program.edges
    names = list(nodes)
    x_start = dict(zip(names, np.cumsum([0] + [nodes[n].size for n in names[:-1]]),
                       strict=True))
    x_count = sum(cost.size for cost in nodes.values())
    y_start = {}
    offset = x_count
    for key, matrix in edges.items():
        y_start[key] = offset
        offset += matrix.size
    # costs in units of the cheapest possible total, so that HiGHS' absolute tolerances
    # mean the same on any model
    scale = max(sum(float(cost.min()) for cost in nodes.values())
                + sum(float(matrix.min()) for matrix in edges.values()), 1e-12)
    objective = np.concatenate([np.where(np.isfinite(nodes[n]), nodes[n], 0.0).ravel()
                                for n in names]
                               + [matrix.ravel() for matrix in edges.values()]) / scale
    upper = np.ones(offset)
    upper[:x_count] = np.concatenate([np.isfinite(nodes[n]).ravel() for n in names])
    rows, columns, values = [], [], []
    row = 0
    for name in names:  # one (variant, config) per node
        rows.append(np.full(nodes[name].size, row))
        columns.append(x_start[name] + np.arange(nodes[name].size))
        values.append(np.ones(nodes[name].size))
        row += 1

    def config_columns(name: str, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(config index, column) of every variant's x of each config of `name`."""
        variants = nodes[name].shape[0]
        return (np.tile(np.arange(count), variants),
                x_start[name] + np.arange(variants * count))

    for (u, v), matrix in edges.items():
        size_u, size_v = matrix.shape
        grid = y_start[(u, v)] + np.arange(matrix.size).reshape(size_u, size_v)
        # sum over cj of y[ci, cj] - (x[u, ci] over its variants) = 0, one row per ci
        configs, x_columns = config_columns(u, size_u)
        rows += [np.repeat(row + np.arange(size_u), size_v), row + configs]
        columns += [grid.ravel(), x_columns]
        values += [np.ones(matrix.size), -np.ones(len(x_columns))]
        row += size_u
        # sum over ci of y[ci, cj] - (x[v, cj] over its variants) = 0, one row per cj
        configs, x_columns = config_columns(v, size_v)
        rows += [np.tile(row + np.arange(size_v), size_u), row + configs]
        columns += [grid.ravel(), x_columns]
        values += [np.ones(matrix.size), -np.ones(len(x_columns))]
        row += size_v
    equalities = row
    if program.rows is not None and program.row_limits is not None:
        for name, coefficients in program.rows.items():
            variant, limit_row, config = np.nonzero(coefficients)
            rows.append(row + limit_row)
            columns.append(x_start[name] + variant * nodes[name].shape[1] + config)
            values.append(coefficients[variant, limit_row, config])
        row += len(program.row_limits)
    matrix = coo_array((np.concatenate(values), (np.concatenate(rows), np.concatenate(columns))),
                       shape=(row, offset)).tocsr()
    lower_rows = np.zeros(row)
    upper_rows = np.zeros(row)
    lower_rows[:len(names)] = upper_rows[:len(names)] = 1.0
    if program.row_limits is not None:
        lower_rows[equalities:] = -np.inf
        upper_rows[equalities:] = program.row_limits
    integrality = np.zeros(offset)
    integrality[:x_count] = 1
    result = milp(objective, integrality=integrality, bounds=(np.zeros(offset), upper),
                  constraints=LinearConstraint(matrix, lower_rows, upper_rows),
                  options={"time_limit": time_limit, "mip_rel_gap": relative_gap})
    if result.status == _INFEASIBLE:
        return None, np.inf
    if result.mip_dual_bound is None or not np.isfinite(result.mip_dual_bound):
        lower = 0.0
    else:
        lower = float(result.mip_dual_bound) * scale
    if result.x is None:
        return None, lower
    choice = {}
    for name in names:
        variant, index = np.unravel_index(
            int(np.argmax(result.x[x_start[name]:x_start[name] + nodes[name].size])),
            nodes[name].shape)
        choice[name] = (int(variant), int(index))
    return choice, lower
