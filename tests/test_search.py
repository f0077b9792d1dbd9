"""Search: exact against brute force, never worse than a baseline, deterministic."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strategies.baselines import BASELINES, baseline
from strategies.cluster import load_cluster
from strategies.compute import AnalyticCompute
from strategies.cost import CostModel
from strategies.graph import build_graph
from strategies.search import optimal_strategy, solve
from strategies.space import dim_sizes, parallel_dims

CLUSTER = load_cluster("p100x16")


def brute_force(nodes, edges) -> float:
    names = list(nodes)
    best = np.inf
    for choice in itertools.product(*(range(len(nodes[n])) for n in names)):
        pick = dict(zip(names, choice, strict=True))
        total = sum(nodes[n][pick[n]] for n in names)
        total += sum(cost[pick[u], pick[v]] for (u, v), cost in edges.items())
        best = min(best, total)
    return float(best)


def total_cost(nodes, edges, choice) -> float:
    return float(sum(nodes[n][choice[n]] for n in nodes)
                 + sum(cost[choice[u], choice[v]] for (u, v), cost in edges.items()))


@st.composite
def series_parallel(draw):
    """A random two-terminal series-parallel DAG (the shape of CNN graphs)."""
    counter = itertools.count()

    def build(depth: int) -> tuple[str, str, list[tuple[str, str]]]:
        kind = draw(st.sampled_from(["edge", "series", "parallel"] if depth < 3 else ["edge"]))
        if kind == "edge":
            u, v = f"v{next(counter)}", f"v{next(counter)}"
            return u, v, [(u, v)]
        first = build(depth + 1)
        second = build(depth + 1)
        if kind == "series":
            rename = {second[0]: first[1]}
            edges = first[2] + [(rename.get(a, a), rename.get(b, b)) for a, b in second[2]]
            return first[0], second[1], edges
        rename = {second[0]: first[0], second[1]: first[1]}
        edges = first[2] + [(rename.get(a, a), rename.get(b, b)) for a, b in second[2]]
        return first[0], first[1], edges

    _, _, edges = build(0)
    return list(dict.fromkeys(edges))


def random_costs(draw, edges, max_configs=3):
    names = list(dict.fromkeys(n for edge in edges for n in edge))
    sizes = {n: draw(st.integers(1, max_configs)) for n in names}
    values = st.integers(0, 50)
    nodes = {n: np.array(draw(st.lists(values, min_size=sizes[n], max_size=sizes[n])), float)
             for n in names}
    matrices = {}
    for u, v in edges:
        flat = draw(st.lists(values, min_size=sizes[u] * sizes[v], max_size=sizes[u] * sizes[v]))
        matrices[(u, v)] = np.array(flat, float).reshape(sizes[u], sizes[v])
    return nodes, matrices


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_series_parallel_graphs_reduce_and_match_brute_force(data):
    edges = data.draw(series_parallel())
    nodes, matrices = random_costs(data.draw, edges)
    if np.prod([len(c) for c in nodes.values()]) > 20_000:
        return
    solution = solve(nodes, matrices)
    assert solution.final_nodes == 1  # series-parallel graphs eliminate completely
    assert solution.cost == pytest.approx(brute_force(nodes, matrices))
    assert total_cost(nodes, matrices, solution.choice) == pytest.approx(solution.cost)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_dags_that_do_not_reduce_are_still_exact(data):
    count = data.draw(st.integers(4, 7))
    names = [f"v{i}" for i in range(count)]
    pairs = [(names[i], names[j]) for i in range(count) for j in range(i + 1, count)]
    edges = data.draw(st.lists(st.sampled_from(pairs), min_size=count, max_size=3 * count,
                               unique=True))
    nodes, matrices = random_costs(data.draw, edges)
    for name in names:  # isolated nodes too
        nodes.setdefault(name, np.array([float(data.draw(st.integers(0, 9)))]))
    solution = solve(nodes, matrices)
    assert solution.cost == pytest.approx(brute_force(nodes, matrices))
    assert total_cost(nodes, matrices, solution.choice) == pytest.approx(solution.cost)


def brute_force_model(cost: CostModel) -> float:
    graph = cost.graph
    nodes = {layer.name: cost.node_seconds(layer) for layer in graph.layers}
    edges = {(u, v): cost.edge(graph.by_name[u], graph.by_name[v])[0] for u, v in graph.edges}
    return brute_force(nodes, edges)


def chain_dp(cost: CostModel) -> float:
    """Viterbi over a chain network: an independent exact optimum for linear graphs."""
    graph = cost.graph
    best = cost.node_seconds(graph.layers[0])
    for layer in graph.layers[1:]:
        (source,) = layer.inputs
        matrix = cost.edge(graph.by_name[source], layer)[0]
        best = (best[:, None] + matrix).min(axis=0) + cost.node_seconds(layer)
    return float(best.min())


def restricted_model(graph, devices: int, keep: int) -> CostModel:
    """A cost model whose search space keeps `keep` configs per layer (brute-forceable)."""
    cost = CostModel(graph, CLUSTER, devices, AnalyticCompute(CLUSTER))
    rng = np.random.default_rng(0)
    # layers of one search space keep one subset: the cost model shares edge tables between
    # layers of equal dimension sizes and splittable dimensions
    kept: dict[tuple, list] = {}
    restricted = {}
    for layer in graph.layers:
        configs = cost.configs[layer.name]
        space = (tuple(dim_sizes(layer).values()), parallel_dims(layer))
        if space not in kept:
            kept[space] = [configs[i] for i in sorted(
                rng.choice(len(configs), min(keep, len(configs)), replace=False))]
        restricted[layer.name] = kept[space]
    cost.configs = restricted
    return cost


@pytest.mark.parametrize("name", ["lenet5", "alexnet"])
@pytest.mark.parametrize("devices", [2, 4])
def test_zoo_chains_match_an_independent_dynamic_program(name, devices):
    graph = build_graph(name, batch=8 * devices, image_size=32, num_classes=10)
    cost = CostModel(graph, CLUSTER, devices, AnalyticCompute(CLUSTER), placement="aligned")
    result = optimal_strategy(cost)
    assert result.final_graph_nodes == 1
    assert result.predicted.step_seconds == pytest.approx(chain_dp(cost), rel=1e-9)


@pytest.mark.parametrize(("name", "keep"), [("lenet5", 3), ("tiny_cnn", 3)])
def test_zoo_graphs_match_brute_force_on_a_reduced_space(name, keep):
    graph = build_graph(name, batch=8, image_size=32, num_classes=10)
    cost = restricted_model(graph, 2, keep)
    result = optimal_strategy(cost)
    assert result.predicted.step_seconds == pytest.approx(brute_force_model(cost), rel=1e-9)


@pytest.mark.parametrize(("name", "devices"), [("tiny_cnn", 4), ("resnet18", 4),
                                               ("inception_v3", 4), ("vgg16", 8)])
def test_never_worse_than_any_baseline(name, devices):
    size = 32 if name != "inception_v3" else 75
    graph = build_graph(name, batch=32 * devices, image_size=size)
    cost = CostModel(graph, CLUSTER, devices, AnalyticCompute(CLUSTER))
    result = optimal_strategy(cost)
    assert result.final_graph_nodes == 1
    for strategy in BASELINES:
        other = cost.evaluate(baseline(strategy, graph, devices))
        assert result.predicted.step_seconds <= other.step_seconds * (1 + 1e-9), strategy


def test_vgg16_on_4_gpus_follows_the_papers_pattern():
    """Jia et al. 2018, Table 5: the large early conv layers sample-parallel on every device,
    the deepest conv layers split otherwise, the FC layers channel-split."""
    graph = build_graph("vgg16", batch=128)
    result = optimal_strategy(CostModel(graph, CLUSTER, 4, AnalyticCompute(CLUSTER)))
    convs = [layer for layer in graph.layers if layer.kind == "conv"]
    assert all(result.assignment[layer.name].n == 4 for layer in convs[:7])  # groups 1-3
    assert all(result.assignment[layer.name].n < 4 for layer in convs[-3:])  # group 5
    for layer in graph.layers:
        if layer.kind == "linear":
            assert result.assignment[layer.name].c > 1


def test_search_is_deterministic():
    graph = build_graph("resnet18", batch=64, image_size=32)
    first = optimal_strategy(CostModel(graph, CLUSTER, 4, AnalyticCompute(CLUSTER)))
    second = optimal_strategy(CostModel(graph, CLUSTER, 4, AnalyticCompute(CLUSTER)))
    assert first.assignment == second.assignment
