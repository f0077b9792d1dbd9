"""Exact search for the optimal layer-wise strategy (Jia et al. 2018, Algorithm 1).

The graph's nodes carry a cost vector (t_c + t_s per config) and its edges a cost matrix (t_x
per pair of configs). First, bounds from a spanning forest drop every config that no optimal
strategy uses (config_bounds.py: on 64 devices ResNet-50 keeps 7% of its configs); then
eliminations shrink the graph while keeping the optimum:
- node elimination (Eq. 2): a node j with one in-edge (i, j) and one out-edge (j, k) becomes
  an edge (i, k) with cost(c_i, c_k) = min over c_j of t(e1) + node(j) + t(e2); keep the argmin;
- edge elimination (Eq. 3): two edges with the same endpoints become one, costs added;
- a node with a single neighbour (the network input, the last layer, a side branch) folds
  into that neighbour's vector by the same min rule.
They alternate until nothing applies; the K nodes left (K <= 1 for every network in the zoo) are
solved exactly by variable elimination (dynamic programming over the tree decomposition that a
min-size elimination order defines; exhaustive for K <= 2). Dense connectivity (every block reading
all earlier outputs) can leave a K whose tables no memory holds: those go to an integer program
(integer_program.py), whose answer comes with a proven gap to the optimum. Undoing the eliminations
in reverse recovers every layer's config. Our own code: no library implements this min-plus
elimination over tensors of configurations.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from layerwise.strategies.breakdown import Breakdown
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.model.space import ParallelConfig
from layerwise.strategies.search.config_bounds import (
    Bounds,
    forest_bounds,
    forest_lower_bounds,
    restricted,
    within,
)
from layerwise.strategies.search.min_marginals import fold, min_marginals, min_plus

_T = TypeVar("_T")
_MAX_FACTOR_ELEMENTS = 50_000_000  # larger variable elimination tables go to the integer program
# From this many devices the search bounds with cheap t_x lower bounds before costing pairs
# exactly (`kept_costs`); below, costing every pair is as fast or faster. One core, whole
# space, the two paths interleaved in one process (median of 9, bounded over exact): 4 devices
# Inception-v3 1.23x, ResNet-50 1.45x; 8: 0.94x, 1.25x; 16: 0.71x, 0.78x (the exact pass over
# the kept configs reads the per-device terms the bounds built).
_LOOSE_SHARE = 0.05  # kept configs past this share of all: seek a tighter upper bound first
_CANDIDATES = 3  # per layer, the configs of least lower bound that bound is sought among
# per layer, the degrees of least degree bound an upper bound is sought among first: on 64
# devices Inception-v3's best strategy over 3 cost 21% over the optimum, over 6 2.3%, over 12
# the optimum itself (before the bounds read windows and shared placements); since, 6 or 8
# price 2-3x fewer terms on 16 devices in the same time, and M5 on 64 devices of h200x8 5.6x more
_DEGREE_CANDIDATES = 12
_NEIGHBOUR_DEGREES = 2  # and the first this many of each neighbour's (`_degree_candidates`)
# The degree bounds prune first where their classes of configs are at most this share of the
# pairs (aligned spaces: 0.18 on 16 devices, 0.06 on 64; an origin space has one config per
# degrees: 1)
_DEGREE_PAIRS_SHARE = 0.25
# After them the search prices exactly the pairs of the configs they keep, with no ends bound
# between, where that is at most this many per-device terms per kind of edge (about the cost of
# building one kind's ends-bound terms): ResNet-50 on 64 devices 92 thousand per kind, 1.81 ->
# 0.96 s; CosmoFlow 3-d 580 thousand, 2.10 -> 1.58 s; on 32 devices CosmoFlow 3-d 1.5 million,
# 0.91 s with the ends bound against 1.55 without (one core)
_EXACT_TERMS_PER_KIND = 600_000
_BOUNDED_FROM_DEVICES = 16


class SearchResult(BaseModel):
    """The optimal strategy and how it was found."""

    model_config = ConfigDict(frozen=True)

    assignment: dict[str, ParallelConfig]
    predicted: Breakdown
    search_seconds: float
    search_method: str
    optimality_gap: float  # proven relative distance to the optimum (0: exact)
    final_graph_nodes: int
    nodes_eliminated: int
    edges_eliminated: int
    configs: int  # in all layers' search spaces
    configs_kept: int  # those the bounds could not rule out, which the elimination searched
    memory_budget_bytes: int | None = None  # per device, when the search held plans to one
    memory_rounds: int = 0  # Lagrangian rounds the budget took (0: the optimum fitted)
    # what proved the gap of a plan held to the budget, e.g. "40 rounds of Lagrangian
    # multipliers and HiGHS' integer program"
    memory_bound: str = ""
    # layers whose forward the backward recomputes to fit the budget
    recompute: frozenset[str] = frozenset()


@dataclass
class Solution:
    """Config index per node, the optimal total cost, and the elimination statistics."""

    choice: dict[str, int]
    cost: float
    final_nodes: int
    nodes_eliminated: int
    edges_eliminated: int
    method: str
    gap: float = 0.0  # proven relative distance to the optimum (0: exact)
    configs: int = 0  # in all search spaces
    configs_kept: int = 0  # after the bounds


@dataclass
class _Graph:
    """The graph being eliminated; every vector and matrix carries a key (`_Keys`) that says
    how it was computed, so equal keys mean equal values."""

    nodes: dict[str, np.ndarray]
    edges: dict[tuple[str, str], np.ndarray]
    keys: _Keys
    node_keys: dict[str, int] = field(default_factory=dict)
    edge_keys: dict[tuple[str, str], int] = field(default_factory=dict)
    succ: dict[str, set[str]] = field(default_factory=dict)
    pred: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.node_keys = {name: self.keys.leaf(cost) for name, cost in self.nodes.items()}
        self.edge_keys = {edge: self.keys.leaf(cost) for edge, cost in self.edges.items()}
        self.succ = {name: set() for name in self.nodes}
        self.pred = {name: set() for name in self.nodes}
        for u, v in self.edges:
            self.succ[u].add(v)
            self.pred[v].add(u)

    def add_edge(self, u: str, v: str, cost: np.ndarray, key: int) -> bool:
        """Add an edge; returns True when it merged with an existing one (Eq. 3)."""
        if (u, v) in self.edges:
            merged = self.keys.derived("sum", self.edge_keys[(u, v)], key)
            self.edges[(u, v)] = self.keys.memo(merged, lambda: self.edges[(u, v)] + cost)
            self.edge_keys[(u, v)] = merged
            return True
        self.edges[(u, v)] = cost
        self.edge_keys[(u, v)] = key
        self.succ[u].add(v)
        self.pred[v].add(u)
        return False

    def remove(self, node: str) -> None:
        for v in self.succ.pop(node):
            self.pred[v].discard(node)
            del self.edges[(node, v)], self.edge_keys[(node, v)]
        for u in self.pred.pop(node):
            self.succ[u].discard(node)
            del self.edges[(u, node)], self.edge_keys[(u, node)]
        del self.nodes[node], self.node_keys[node]


class _Keys:
    """Names for the values an elimination computes, and those values, computed once.

    Networks repeat blocks: the cost model hands equal layers and edges the same array, so
    eliminating the second of two equal blocks repeats the first one's arithmetic exactly.
    A value's key is its operation and its operands' keys (the input arrays are keyed by
    identity; the caller holds them for the whole search), numbered as small integers.
    """

    def __init__(self) -> None:
        self._numbers: dict[tuple[object, ...], int] = {}
        self._values: dict[int, object] = {}

    def leaf(self, array: np.ndarray) -> int:
        return self._numbers.setdefault(("leaf", id(array)), len(self._numbers))

    def derived(self, operation: str, *operands: int) -> int:
        return self._numbers.setdefault((operation, *operands), len(self._numbers))

    def memo(self, key: int, compute: Callable[[], _T]) -> _T:
        if key not in self._values:
            self._values[key] = compute()
        return self._values[key]  # type: ignore[return-value]


def solve(nodes: dict[str, np.ndarray], edges: dict[tuple[str, str], np.ndarray],
          order: list[str] | None = None) -> Solution:
    """Minimise sum(node[v][c_v]) + sum(edge[u, v][c_u, c_v]) exactly.

    Configs that bounds prove in no optimal strategy go first (`forest_bounds`); the
    elimination runs over the rest and returns the strategy it would over all. `order`
    (default: insertion order of `nodes`) fixes which eliminable node goes first, so results
    are deterministic.
    """
    bounds = forest_bounds(nodes, edges)
    solution = _eliminate(*bounds.restrict(nodes, edges), order or list(nodes))
    assert solution is not None  # the integer program solves whatever is left
    solution.choice = bounds.original(solution.choice)
    solution.configs = sum(len(cost) for cost in nodes.values())
    solution.configs_kept = sum(len(kept) for kept in bounds.kept.values())
    return solution


def _eliminate(nodes: dict[str, np.ndarray], edges: dict[tuple[str, str], np.ndarray],
               sequence: list[str], milp: bool = True) -> Solution | None:
    """Jia's node and edge eliminations to a fixed point, the rest solved exactly, and every
    eliminated node's config recovered. Without `milp`, None where what the eliminations
    leave would need the integer program."""
    keys = _Keys()
    graph = _Graph(dict(nodes), dict(edges), keys)
    undo: list[tuple[str, str, tuple[str, ...], np.ndarray]] = []
    nodes_eliminated = edges_eliminated = 0
    changed = True
    while changed:
        changed = False
        for j in sequence:
            if j not in graph.nodes or len(graph.nodes) == 1:
                continue
            preds, succs = graph.pred[j], graph.succ[j]
            cost_j = graph.nodes[j]
            if len(preds) == 1 and len(succs) == 1:
                (i,), (k,) = preds, succs
                first, second = graph.edges[(i, j)], graph.edges[(j, k)]
                key = keys.derived("pair", graph.edge_keys[(i, j)], graph.node_keys[j],
                                   graph.edge_keys[(j, k)])
                merged_cost, arg = keys.memo(
                    key, lambda first=first, cost_j=cost_j, second=second: min_plus(
                        first + cost_j[None, :], second))
                graph.remove(j)
                edges_eliminated += graph.add_edge(i, k, merged_cost, key)
                undo.append(("pair", j, (i, k), arg))
            elif len(preds) + len(succs) == 1:
                (other,) = preds or succs
                matrix = graph.edges[(other, j)] if preds else graph.edges[(j, other)].T
                edge_key = graph.edge_keys[(other, j) if preds else (j, other)]
                key = keys.derived("fold" if preds else "fold_back", edge_key,
                                   graph.node_keys[j])
                folded, arg = keys.memo(key, lambda matrix=matrix, cost_j=cost_j: fold(
                    matrix, cost_j))
                summed = keys.derived("plus", graph.node_keys[other], key)
                graph.nodes[other] = keys.memo(
                    summed, lambda other=other, folded=folded: graph.nodes[other] + folded)
                graph.node_keys[other] = summed
                graph.remove(j)
                undo.append(("single", j, (other,), arg))
            else:
                continue
            nodes_eliminated += 1
            changed = True
    final_nodes = len(graph.nodes)
    final = _solve_final(graph, milp)
    if final is None:
        return None
    choice, cost, method, gap = final
    for kind, j, neighbours, arg in reversed(undo):
        if kind == "pair":
            choice[j] = int(arg[choice[neighbours[0]], choice[neighbours[1]]])
        else:
            choice[j] = int(arg[choice[neighbours[0]]])
    return Solution(choice=choice, cost=cost, final_nodes=final_nodes,
                    nodes_eliminated=nodes_eliminated, edges_eliminated=edges_eliminated,
                    method=method, gap=gap)


def _elimination_order(graph: _Graph) -> tuple[list[str], int]:
    """A variable elimination order for what Jia's eliminations left, and its largest table.

    Eliminating a node makes a table over it and its neighbours (who then become neighbours
    of each other), so each step takes the node whose table is smallest (the weighted
    min-degree heuristic of treewidth, sizes being config counts), ties broken by the fewest
    new neighbour pairs (min-fill), then by graph order.
    """
    sizes = {name: len(cost) for name, cost in graph.nodes.items()}
    position = {name: index for index, name in enumerate(graph.nodes)}
    adjacent = {name: graph.pred[name] | graph.succ[name] for name in graph.nodes}

    def weight(name: str) -> tuple[int, int, int]:
        around = adjacent[name]
        table = math.prod(sizes[other] for other in around) * sizes[name]
        fill = sum(1 for a in around for b in around if a < b and b not in adjacent[a])
        return table, fill, position[name]

    order: list[str] = []
    largest = 0
    while adjacent:
        name = min(adjacent, key=weight)
        largest = max(largest, weight(name)[0])
        around = adjacent.pop(name)
        for other in around:
            adjacent[other] = (adjacent[other] | around) - {other, name}
        order.append(name)
    return order, largest


def _solve_final(graph: _Graph,
                 milp: bool = True) -> tuple[dict[str, int], float, str, float] | None:
    """The minimum of what elimination left: variable elimination when its largest table is
    small enough (exact), else the integer program (within its proven gap; None without
    `milp`)."""
    order, largest = _elimination_order(graph)
    if largest > _MAX_FACTOR_ELEMENTS:
        if not milp:
            return None
        from layerwise.strategies.search.integer_program import (
            solve_milp,  # scipy loads only for the graphs that need it
        )

        solution = solve_milp(graph.nodes, graph.edges)
        return (solution.choice, solution.cost,
                f"elimination+milp (gap {solution.gap:.2%})", solution.gap)
    choice, total = _variable_elimination(graph, order)
    method = ("elimination+exhaustive" if len(graph.nodes) <= 2
              else "elimination+variable-elimination")
    return choice, total, method, 0.0


def _variable_elimination(graph: _Graph, order: list[str]) -> tuple[dict[str, int], float]:
    """Exact minimum by eliminating the nodes in `order`, each into a table over its
    neighbours, then choosing back in reverse."""
    factors: list[tuple[tuple[str, ...], np.ndarray]] = [
        ((name,), cost) for name, cost in graph.nodes.items()
    ] + [((u, v), cost) for (u, v), cost in graph.edges.items()]
    trace: list[tuple[str, tuple[str, ...], np.ndarray]] = []
    total = 0.0
    for var in order:
        touching = [(scope, cost) for scope, cost in factors if var in scope]
        factors = [(scope, cost) for scope, cost in factors if var not in scope]
        scope = tuple(dict.fromkeys(v for s, _ in touching for v in s if v != var))
        sizes = {v: c.shape[s.index(v)] for s, c in touching for v in s}
        joint = np.zeros([sizes[v] for v in (*scope, var)])
        axes = {v: n for n, v in enumerate((*scope, var))}
        for s, cost in touching:
            shape = [1] * len(axes)
            for v, size in zip(s, cost.shape, strict=True):
                shape[axes[v]] = size
            transpose = sorted(range(len(s)), key=lambda n: axes[s[n]])
            joint = joint + cost.transpose(transpose).reshape(shape)
        arg = joint.argmin(axis=-1)
        best = joint.min(axis=-1)
        trace.append((var, scope, arg))
        if scope:
            factors.append((scope, best))
        else:
            total += float(best)
    choice: dict[str, int] = {}
    for var, scope, arg in reversed(trace):
        choice[var] = int(arg[tuple(choice[v] for v in scope)])
    return choice, total


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a search runs.

    A search allocates many short-lived arrays and configs but makes no reference cycles, so the
    collector frees nothing there; yet each of its full passes walks every object the process
    holds (torch's included): 10-25% of a 16-device search.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def graph_costs(cost_model: CostModel, progress: Callable[[str], None] | None = None,
                ) -> tuple[dict[str, np.ndarray], dict[tuple[str, str], np.ndarray]]:
    """Every node vector (t_c + t_s per config) and exact edge matrix (t_x per pair) of the
    whole search spaces: the search without bounds (`kept_costs`), for comparing with it."""
    graph = cost_model.graph
    report = progress or (lambda _message: None)
    cost_model.check_memory(whole_spaces=True)
    report("costing layers")
    nodes = {layer.name: cost_model.node_seconds(layer) for layer in graph.layers}
    report("costing edges")
    edges = {
        (u, v): cost_model.edge(graph.by_name[u], graph.by_name[v])[0] for u, v in graph.edges
    }
    return nodes, edges


@dataclass(frozen=True)
class KeptCosts:
    """What the search needs: the bounds' kept configs, and over those only, every node
    vector and the exact edge matrices."""

    bounds: Bounds
    nodes: dict[str, np.ndarray]
    edges: dict[tuple[str, str], np.ndarray]
    configs: int  # in all layers' search spaces


def kept_costs(cost_model: CostModel,
               progress: Callable[[str], None] | None = None) -> KeptCosts:
    """From _BOUNDED_FROM_DEVICES devices on: node vectors of the whole spaces; the bounds of a
    spanning forest (each layer keeping the input edge of the largest tensor), up to twice:
    first over t_x bounded from each config and the other side's degrees
    (`CostModel.edge_degree_bound`, where its classes pay), then, unless pricing exactly the
    pairs of the configs that kept costs less than it (`_EXACT_TERMS_PER_KIND`), over the
    bound from each config's ends (`CostModel.edge_lower_bound`) between those configs; each
    forest's strategy priced exactly for the upper bound, and what each forest keeps narrowed
    by the exact min-marginals of its bound (`_marginal_bounds`, `_narrowed`); then exact t_x
    only between the configs kept. Exact t_x of whole spaces is most of a search's work on
    many devices, and the bounds keep 0.1-7% of the configs; the first pruning leaves a small
    share of the pairs (on 64 devices of p100x16 Inception-v3 126 configs of 102,704), where
    pricing them exactly beats the ends bound. On fewer devices every config is kept and
    every pair costed exactly (`solve` still bounds them before eliminating)."""
    graph = cost_model.graph
    report = progress or (lambda _message: None)
    if cost_model.devices < _BOUNDED_FROM_DEVICES:
        nodes, edges = graph_costs(cost_model, progress)
        return KeptCosts(bounds=Bounds.everything(nodes), nodes=nodes, edges=edges,
                         configs=sum(len(cost) for cost in nodes.values()))
    cost_model.check_memory(whole_spaces=True)
    report("costing layers")
    nodes = {layer.name: cost_model.node_seconds(layer) for layer in graph.layers}
    parent: dict[str, str] = {}
    for u, v in graph.edges:
        if v not in parent or (math.prod(graph.by_name[u].output_shape)
                               > math.prod(graph.by_name[parent[v]].output_shape)):
            parent[v] = u

    def forest(nodes: dict[str, np.ndarray], bounded: dict[tuple[str, str], np.ndarray],
               ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        # every edge's t_x bound: off the forest it still lifts both ends (Inception-v3 at 64
        # devices: 3,725 configs kept, against 13,450 with those edges bounded by 0)
        return forest_lower_bounds(
            nodes, {edge: cost for edge, cost in bounded.items() if parent[edge[1]] == edge[0]},
            {edge: cost for edge, cost in bounded.items() if parent[edge[1]] != edge[0]})

    first = Bounds.everything(nodes)
    if _degree_classes_pay(cost_model):
        report("bounding by degrees")
        lower, choice = _degree_forest(cost_model, nodes, forest)
        choice, upper = _best_of(cost_model, nodes,
                                 _degree_candidates(cost_model, lower, choice))
        first = _marginal_bounds(cost_model, nodes, within(lower, choice, upper))
        if _exact_terms(cost_model, first.kept) <= _EXACT_TERMS_PER_KIND * cost_model.edge_kinds():
            report("costing edges")
            return _priced_exactly(cost_model, nodes, first)
    report("bounding by end devices")
    space = first.kept  # the ends bound is priced between these configs only
    if first.incumbent:
        bounded = cost_model.edge_lower_bounds(space)
    else:  # between all: the whole spaces' tables copy pairs by symmetry
        bounded = {(u, v): cost_model.edge_lower_bound(graph.by_name[u], graph.by_name[v])
                   for u, v in graph.edges}
    lower_within, choice_within = forest({name: cost[space[name]] for name, cost in nodes.items()},
                                         bounded)
    choice = {name: int(space[name][index]) for name, index in choice_within.items()}
    upper = _priced(cost_model, nodes, choice)
    if first.upper < upper:  # the first forest's strategy is kept: it costs less
        choice, upper = first.incumbent, first.upper
    lower = {}
    for name, bound in lower_within.items():  # the configs the first pruning dropped stay out
        lower[name] = np.full(len(nodes[name]), np.inf)
        lower[name][space[name]] = bound
    bounds = within(lower, choice, upper)
    if not all(np.isin(kept, space[name]).all() for name, kept in bounds.kept.items()):
        bounds = first  # the second bounds proved nothing (an infinite step): the first stand
    if sum(len(kept) for kept in bounds.kept.values()) > _LOOSE_SHARE * sum(
            len(cost) for cost in nodes.values()):
        at = {name: np.searchsorted(space[name], kept) for name, kept in bounds.kept.items()}
        bounds = _tightened(cost_model, nodes, restricted({}, bounded, at)[1], lower, bounds)
    if bounds.incumbent:  # the ends bound's exact min-marginals over what its forest kept
        at = {name: np.searchsorted(space[name], kept) for name, kept in bounds.kept.items()}
        bounds = _narrowed(bounds, nodes, restricted({}, bounded, at)[1],
                           [layer.name for layer in graph.layers])
    report("costing edges")
    return _priced_exactly(cost_model, nodes, bounds)


def _priced_exactly(cost_model: CostModel, nodes: dict[str, np.ndarray],
                    bounds: Bounds) -> KeptCosts:
    """The search's costs: exact t_x between the configs `bounds` keeps, and their nodes."""
    edges = cost_model.kept_edges(bounds.kept)
    cost_model.forget_kept_tables()
    return KeptCosts(bounds=bounds, nodes=bounds.restrict(nodes, {})[0], edges=edges,
                     configs=sum(len(cost) for cost in nodes.values()))


def _exact_terms(cost_model: CostModel, kept: dict[str, np.ndarray]) -> int:
    """The per-device terms exact t_x between the configs `kept` takes at most: each pair's
    forward over its consumer's devices and its backward over its producer's."""
    sizes = {name: np.array([cost_model.configs[name][index].size for index in at])
             for name, at in kept.items()}
    return sum(len(sizes[u]) * int(sizes[v].sum()) + len(sizes[v]) * int(sizes[u].sum())
               for u, v in cost_model.graph.edges)


def _tightened(cost_model: CostModel, nodes: dict[str, np.ndarray],
               bounded: dict[tuple[str, str], np.ndarray], lower: dict[str, np.ndarray],
               bounds: Bounds) -> Bounds:
    """`bounds` with a closer upper bound, where the forest's strategy left many configs kept.

    That strategy ignores the edges the forest dropped (a residual block's shortcut), so its
    exact price can sit well above the optimum. Candidates per layer: the strategy best for
    the lower bounds themselves over the configs kept (`bounded`: their matrices), the
    forest's, and the _CANDIDATES configs of least lower bound; the best strategy over those,
    with exact t_x between them, is a strategy, so its price bounds the optimum from above. On
    256 devices (origin): the upper bound 4.5% over the optimum -> 0.3% on ResNet-50, 2.5% ->
    0.15% on ResNet-101, and the configs kept 18.7-24.3% -> 5.9-7.9% on ResNet-50, -101 and
    -152. Skipped where the eliminations would leave a graph only the integer program
    solves."""
    graph = cost_model.graph
    order = [layer.name for layer in graph.layers]
    relaxed = _eliminate(bounds.restrict(nodes, {})[0], bounded, order, milp=False)
    if relaxed is None:
        return bounds
    best = bounds.original(relaxed.choice)
    incumbent = bounds.incumbent or best  # none where the bounds proved nothing
    candidates = {name: np.unique(np.concatenate([
        kept[np.argsort(lower[name][kept], kind="stable")[:_CANDIDATES]],
        [incumbent[name], best[name]]])) for name, kept in bounds.kept.items()}
    choice, upper = _best_of(cost_model, nodes, candidates)
    return within(lower, choice, upper) if upper < bounds.upper else bounds


def _degree_classes_pay(cost_model: CostModel) -> bool:
    """Whether the search prunes by the degree bounds first: where the pairs of classes are at
    most _DEGREE_PAIRS_SHARE of the pairs of configs (aligned spaces place each degrees at
    many starts)."""
    graph = cost_model.graph
    classes = {layer.name: int(cost_model.degree_classes(layer).max()) + 1
               for layer in graph.layers}
    configs = {name: len(cost) for name, cost in cost_model.configs.items()}
    return sum(classes[u] * classes[v] for u, v in graph.edges) <= _DEGREE_PAIRS_SHARE * sum(
        configs[u] * configs[v] for u, v in graph.edges)


def _degree_forest(cost_model: CostModel, nodes: dict[str, np.ndarray],
                   forest: Callable[[dict[str, np.ndarray], dict[tuple[str, str], np.ndarray]],
                                    tuple[dict[str, np.ndarray], dict[str, int]]],
                   ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """`forest`'s lower bounds over the degree bounds, per config, and its strategy. Configs
    of one class have equal rows and columns in every degree bound, so the forest runs over
    the classes, each at its least node cost: a config's bound is its class's, with its own
    node cost for the class's least (the min-marginal of the forest over the configs
    themselves), at a sixteenth of the work on 64 devices."""
    graph = cost_model.graph
    classes = {layer.name: cost_model.degree_classes(layer) for layer in graph.layers}
    least = {}
    for name, cost in nodes.items():
        least[name] = np.full(int(classes[name].max()) + 1, np.inf)
        np.minimum.at(least[name], classes[name], cost)
    lower, choice = forest(least, {(u, v): cost_model.edge_degree_bound(
        graph.by_name[u], graph.by_name[v]) for u, v in graph.edges})
    bounds = {name: lower[name][of] + nodes[name] - least[name][of]
              for name, of in classes.items()}
    # the forest's strategy: in each layer, its class's config of least node cost (the first)
    picked = {name: int(np.flatnonzero((of == choice[name])
                                       & (nodes[name] == least[name][choice[name]]))[0])
              for name, of in classes.items()}
    return bounds, picked


def _marginal_bounds(cost_model: CostModel, nodes: dict[str, np.ndarray],
                     bounds: Bounds) -> Bounds:
    """`bounds` narrowed by the exact min-marginals (min_marginals.py) of the problem with the
    degree bounds in place of t_x, over the configs `bounds` keeps: the forest cut each edge
    it dropped in half, the eliminations cut none (Inception-v3 on 64 devices of p100x16:
    3,289 configs kept -> 126, the least bound the optimum itself; on h200x8 11,287 -> 3,337;
    on 16 devices of h200x8 4,691 -> 733). Configs of one class have equal rows and
    columns in every degree bound, so the eliminations run over the classes kept, each at
    its least node cost among the configs kept, as `_degree_forest`'s forest does. As
    `bounds` where the eliminations leave too much to try, or where nothing is proven yet."""
    if not bounds.incumbent:
        return bounds
    graph = cost_model.graph
    kept = bounds.kept
    classes, of, least = {}, {}, {}
    for layer in graph.layers:
        name = layer.name
        classes[name], of[name] = np.unique(cost_model.degree_classes(layer)[kept[name]],
                                            return_inverse=True)
        least[name] = np.full(len(classes[name]), np.inf)
        np.minimum.at(least[name], of[name], nodes[name][kept[name]])
    marginal = min_marginals(
        least, {(u, v): cost_model.edge_degree_bound(graph.by_name[u], graph.by_name[v])[
            np.ix_(classes[u], classes[v])] for u, v in graph.edges},
        [layer.name for layer in graph.layers])
    if marginal is None:
        return bounds
    return _within_kept(bounds, nodes, {
        name: marginal[name][of[name]] + cost[kept[name]] - least[name][of[name]]
        for name, cost in nodes.items()})


def _narrowed(bounds: Bounds, nodes: dict[str, np.ndarray],
              edges: dict[tuple[str, str], np.ndarray], order: list[str]) -> Bounds:
    """`bounds` narrowed by the exact min-marginals of the problem with `edges` (lower bounds
    of t_x between the configs `bounds` keeps) in place of t_x; as it is where the
    eliminations leave too much to try."""
    marginal = min_marginals({name: cost[bounds.kept[name]] for name, cost in nodes.items()},
                             edges, order)
    return bounds if marginal is None else _within_kept(bounds, nodes, marginal)


def _within_kept(bounds: Bounds, nodes: dict[str, np.ndarray],
                 kept_lower: dict[str, np.ndarray]) -> Bounds:
    """`within` over the configs `bounds` keeps, `kept_lower[name]` their lower bounds in its
    order; the configs it dropped stay out, its strategy and upper bound stand."""
    lower = {}
    for name, cost in nodes.items():
        lower[name] = np.full(len(cost), np.inf)
        lower[name][bounds.kept[name]] = kept_lower[name]
    return within(lower, bounds.incumbent, bounds.upper)


def _degree_candidates(cost_model: CostModel, lower: dict[str, np.ndarray],
                       incumbent: dict[str, int]) -> dict[str, np.ndarray]:
    """Per layer, the configs an upper bound is sought among after the degree bounds: the
    forest's, and the config of least lower bound of each of the _DEGREE_CANDIDATES degrees of
    least lower bound (those bounds leave a block's place free, so equal degrees tie: the first,
    at the lowest start, keeps the candidates of neighbouring layers on the same devices); and
    the degrees of each neighbour's first _NEIGHBOUR_DEGREES, where the layer has them: a
    layer split as its neighbour moves nothing between them (the 3-d U-Net's upsampling at 64
    devices ranks its optimum's degrees 45th alone, its neighbour 2nd)."""
    graph = cost_model.graph
    spaces: dict[tuple[int, ...], _SpaceDegrees] = {}  # layers share search spaces
    for layer in graph.layers:
        if tuple(map(id, cost_model.configs[layer.name])) not in spaces:
            spaces[tuple(map(id, cost_model.configs[layer.name]))] = _SpaceDegrees(
                *cost_model.distinct_degrees(layer))
    of_layer = {name: spaces[tuple(map(id, configs))]
                for name, configs in cost_model.configs.items()}
    ranked: dict[str, np.ndarray] = {}
    for name, bound in lower.items():
        order = np.argsort(bound, kind="stable")
        _, first = np.unique(of_layer[name].degree[order], return_index=True)
        ranked[name] = order[np.sort(first)[:_DEGREE_CANDIDATES]]
    candidates = {name: [incumbent[name], *picked] for name, picked in ranked.items()}
    for u, v in graph.edges:
        for layer, neighbour in ((u, v), (v, u)):
            space, other = of_layer[layer], of_layer[neighbour]
            for index in ranked[neighbour][:_NEIGHBOUR_DEGREES]:
                degrees = other.degrees[other.degree[index]]
                if degrees in space.lowest:
                    candidates[layer].append(space.lowest[degrees])
    return {name: np.unique(picked) for name, picked in candidates.items()}


class _SpaceDegrees:
    """A search space's configs by degrees (`CostModel.distinct_degrees`): each config's
    degrees as an index (`degree`) into the distinct ones (`degrees`), and the first config of
    each degrees (`lowest`: at the lowest start, as spaces list them)."""

    def __init__(self, distinct: Sequence[ParallelConfig], degree: np.ndarray) -> None:
        self.degree = degree
        self.degrees = [config.degrees for config in distinct]
        first = np.unique(degree, return_index=True)[1]
        self.lowest = {degrees: int(index)
                       for degrees, index in zip(self.degrees, first, strict=True)}


def _best_of(cost_model: CostModel, nodes: dict[str, np.ndarray],
             candidates: dict[str, np.ndarray]) -> tuple[dict[str, int], float]:
    """The best strategy over a few candidate configs per layer, with exact t_x between
    them, and its step: a strategy, so an upper bound of the optimum."""
    order = [layer.name for layer in cost_model.graph.layers]
    edges = cost_model.kept_edges(candidates)
    exact = _eliminate({name: nodes[name][candidates[name]] for name in nodes}, edges, order,
                       milp=False)
    if exact is None:  # only the integer program solves it: the first candidates, priced
        choice = {name: int(kept[0]) for name, kept in candidates.items()}
        return choice, _priced(cost_model, nodes, choice)
    choice = {name: int(candidates[name][index]) for name, index in exact.choice.items()}
    # its exact t_x are entries of the candidates' matrices (bit for bit `_priced`'s)
    return choice, _step(nodes, choice, {(u, v): float(cost[exact.choice[u], exact.choice[v]])
                                         for (u, v), cost in edges.items()})


def _priced(cost_model: CostModel, nodes: dict[str, np.ndarray], choice: dict[str, int]) -> float:
    """The exact step of one strategy (config index per layer): its node costs and exact t_x."""
    edges = cost_model.kept_edges({name: np.array([index]) for name, index in choice.items()})
    return _step(nodes, choice, {edge: float(cost[0, 0]) for edge, cost in edges.items()})


def _step(nodes: dict[str, np.ndarray], choice: dict[str, int],
          transfers: dict[tuple[str, str], float]) -> float:
    """A strategy's step: its node costs, then its t_x in the graph's edge order."""
    return sum(float(cost[choice[name]]) for name, cost in nodes.items()) + sum(
        transfers.values())


def optimal_strategy(cost_model: CostModel,
                     progress: Callable[[str], None] | None = None) -> SearchResult:
    """Bound, cost the kept configs, solve, and evaluate."""
    started = time.perf_counter()
    graph = cost_model.graph
    with collector_paused():
        costs = kept_costs(cost_model, progress)
        if progress:
            progress("eliminating")
        solution = solve(costs.nodes, costs.edges, order=[layer.name for layer in graph.layers])
    choice = costs.bounds.original(solution.choice)
    assignment = {layer.name: cost_model.configs[layer.name][choice[layer.name]]
                  for layer in graph.layers}
    elapsed = time.perf_counter() - started
    return SearchResult(
        assignment=assignment, predicted=cost_model.evaluate(assignment),
        search_seconds=elapsed, search_method=solution.method, optimality_gap=solution.gap,
        final_graph_nodes=solution.final_nodes, nodes_eliminated=solution.nodes_eliminated,
        edges_eliminated=solution.edges_eliminated, configs=costs.configs,
        configs_kept=solution.configs_kept,
    )
