"""The bounds that drop configs before the exact search: valid on any graph, and the search
over what they keep returns the very strategy the search over everything returns."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerwise.strategies.cost import tables
from layerwise.strategies.cost.compute_time import AnalyticCompute
from layerwise.strategies.cost.cost_model import CostModel
from layerwise.strategies.hardware.cluster import load_cluster
from layerwise.strategies.model.graph import build_graph
from layerwise.strategies.search import elimination as search
from layerwise.strategies.search.config_bounds import forest_bounds, share_bounds, total
from layerwise.strategies.search.elimination import collector_paused, graph_costs
from layerwise.strategies.search.min_marginals import min_marginals

CLUSTER = load_cluster("p100x16-2018")


def random_problem(data) -> tuple[dict[str, np.ndarray], dict[tuple[str, str], np.ndarray]]:
    """A random DAG of 2-6 nodes with 1-3 configs each; small integer costs, so ties abound;
    edge costs may be negative (the bounds must not assume t_x >= 0)."""
    count = data.draw(st.integers(2, 6))
    names = [f"v{index}" for index in range(count)]
    pairs = [(names[i], names[j]) for i in range(count) for j in range(i + 1, count)]
    edges = data.draw(st.lists(st.sampled_from(pairs), max_size=2 * count, unique=True))
    sizes = {name: data.draw(st.integers(1, 3)) for name in names}
    nodes = {name: np.array(data.draw(st.lists(st.integers(0, 9), min_size=sizes[name],
                                               max_size=sizes[name])), float)
             for name in names}
    matrices = {(u, v): np.array(data.draw(st.lists(
        st.integers(-3, 9), min_size=sizes[u] * sizes[v], max_size=sizes[u] * sizes[v])),
        float).reshape(sizes[u], sizes[v]) for u, v in edges}
    return nodes, matrices


@pytest.mark.parametrize("bounds", [forest_bounds, share_bounds])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_bounds_keep_every_optimal_config_and_enclose_the_optimum(bounds, data):
    nodes, edges = random_problem(data)
    names = list(nodes)
    totals = {choice: total(nodes, edges, dict(zip(names, choice, strict=True)))
              for choice in itertools.product(*(range(len(nodes[name])) for name in names))}
    optimum = min(totals.values())
    found = bounds(nodes, edges)
    assert total(nodes, edges, found.incumbent) == pytest.approx(found.upper)
    assert found.lower <= optimum + 1e-9 and optimum <= found.upper + 1e-9
    for choice, cost in totals.items():
        if cost == optimum:  # every optimal strategy survives, config by config
            for name, index in zip(names, choice, strict=True):
                assert index in found.kept[name], (name, index)


def searched_both_ways(model: str, devices: int) -> tuple[search.Solution, search.Solution]:
    graph = build_graph(model, batch=32 * devices)
    cost = CostModel(graph, CLUSTER, devices, AnalyticCompute(CLUSTER), placement="aligned")
    order = [layer.name for layer in graph.layers]
    with collector_paused():
        nodes, edges = graph_costs(cost)
        return search.solve(nodes, edges, order=order), search._eliminate(nodes, edges, order)


@pytest.mark.parametrize(("model", "devices"), [("resnet18", 8), ("inception_v3", 4),
                                                ("vgg16", 16)])
def test_the_search_over_the_kept_configs_returns_the_search_over_all(model, devices):
    """Residual blocks, concatenated branches and a chain: the bounds drop most configs, and
    the strategy and its cost are those of the elimination over every config, bit for bit."""
    pruned, everything = searched_both_ways(model, devices)
    assert pruned.configs_kept < pruned.configs / 2
    assert pruned.cost == everything.cost
    assert pruned.choice == everything.choice


@pytest.mark.parametrize(("model", "devices", "image_size", "batch", "placement", "bounds"), [
    ("resnet18", 32, 32, 32, "aligned", ["by degrees", "by end devices"]),
    ("resnet18", 32, 32, 32, "origin", ["by end devices"]),
    ("inception_v3", 16, 299, 32, "aligned", ["by degrees"]),
    ("m5", 64, 4000, 1, "aligned", ["by degrees"])])
def test_bounds_from_cheap_transfer_bounds_find_the_strategy_of_the_search_over_all(
        model, devices, image_size, batch, placement, bounds, monkeypatch):
    """On many devices the search costs t_x exactly only between the configs that bounds keep:
    bounds from degrees alone where their classes are few (aligned spaces), bounds from each
    config's end devices between the configs those keep where pricing all their pairs exactly
    would cost more (made so here for the residual blocks, which the degree bounds alone
    prune to a few hundred configs), or between all configs (an origin space): the same
    strategy, the same cost, bit for bit (residual blocks across 8 nodes, both ways;
    concatenated branches; a 1-d network across 16 nodes, a sample per device)."""
    if bounds == ["by degrees", "by end devices"]:
        monkeypatch.setattr(search, "_EXACT_TERMS_PER_KIND", 0)
    graph = build_graph(model, batch=batch * devices, image_size=image_size)
    cluster = CLUSTER.model_copy(update={"nodes": devices // CLUSTER.devices_per_node})
    cost = CostModel(graph, cluster, devices, AnalyticCompute(cluster), placement=placement)
    assert devices >= search._BOUNDED_FROM_DEVICES
    steps: list[str] = []
    result = search.optimal_strategy(cost, progress=steps.append)
    assert [step.removeprefix("bounding ") for step in steps
            if step.startswith("bounding")] == bounds
    with collector_paused():
        nodes, edges = graph_costs(cost)
        everything = search._eliminate(nodes, edges, [layer.name for layer in graph.layers])
    assert result.configs_kept < result.configs / 4
    assert result.assignment == {layer.name: cost.configs[layer.name][everything.choice[
        layer.name]] for layer in graph.layers}
    assert result.predicted.step_seconds == pytest.approx(everything.cost, rel=1e-12)


def test_the_end_devices_bound_transfers_from_below_and_are_exact_on_two_devices():
    graph = build_graph("resnet18", batch=4 * 32, image_size=16)
    cluster = CLUSTER.model_copy(update={"nodes": 8})
    cost = CostModel(graph, cluster, 32, AnalyticCompute(cluster), placement="aligned")
    for u, v in graph.edges[:6]:
        producer, consumer = graph.by_name[u], graph.by_name[v]
        exact, lower = cost.edge(producer, consumer)[0], cost.edge_lower_bound(producer, consumer)
        assert (lower <= exact).all() and (lower < exact).any()
        small = (np.array([c.size for c in cost.configs[u]])[:, None] <= 2) & (
            np.array([c.size for c in cost.configs[v]])[None, :] <= 2)
        assert (lower[small] == exact[small]).all()


@pytest.mark.parametrize(("model", "cluster_name", "nodes", "image_size"),
                         [("resnet18", "p100x16", 8, 32), ("inception_v3", "p100x16", 4, 75),
                          ("unet3d", "h200x8", 2, 16), ("m5", "k20x8", 4, 4000)])
def test_degree_bounds_bound_the_ends_bound_from_below(model, cluster_name, nodes, image_size):
    """The first pruning's bound, from each config and the other side's degrees alone, is at
    most the ends bound on every pair of configs (so at most t_x), and not nothing: on the
    edge from the input (no backward), residual, concatenated (branches needing no part of
    a tile), 3-d and 1-d edges; across nodes whose ports are shared, nodes of 8, and PCIe
    groups inside nodes (two inner tiers)."""
    cluster = load_cluster(cluster_name)
    cluster = cluster.model_copy(update={"nodes": nodes})
    devices = cluster.num_devices
    graph = build_graph(model, batch=2 * devices, image_size=image_size)
    cost = CostModel(graph, cluster, devices, AnalyticCompute(cluster), placement="aligned")
    edges = graph.edges[:6] + graph.edges[-6:]
    assert graph.by_name[edges[0][0]].kind == "input"
    for u, v in edges:
        producer, consumer = graph.by_name[u], graph.by_name[v]
        bound = cost.edge_degree_bound(producer, consumer)[
            np.ix_(cost.degree_classes(producer), cost.degree_classes(consumer))]
        ends = cost.edge_lower_bound(producer, consumer)
        assert (bound <= ends).all(), (u, v)
        assert (bound > 0).any(), (u, v)


@pytest.mark.parametrize(("cluster_name", "nodes"), [("p100x16", 4), ("k20x8", 2)])
def test_degree_bounds_hold_for_configs_off_the_aligned_runs(cluster_name, nodes):
    """Where a config's block starts off a multiple of its size, or its devices are no run,
    the bound reads no window of a unit and ties no ends through it, and still bounds the
    ends bound from below: every pair of a mix of aligned runs, runs off alignment, blocks
    out of order and scattered devices, into and out of a strided pooling, between 3x3
    convolutions and on both inputs of a residual sum, across shared ports and PCIe groups."""
    cluster = load_cluster(cluster_name).model_copy(update={"nodes": nodes})
    devices = cluster.num_devices
    graph = build_graph("resnet18", batch=2 * devices, image_size=32)
    cost = CostModel(graph, cluster, devices, AnalyticCompute(cluster), placement="aligned")
    random = np.random.default_rng(7)
    transfers = tables.TransferTables(cluster, devices)
    for u, v in graph.edges[1:7]:
        producer, consumer = graph.by_name[u], graph.by_name[v]
        mixed = []
        for name in (u, v):
            aligned = cost.configs[name]
            large = [config for config in aligned if config.size > 4]  # beyond a unit
            picked = ([large[i] for i in random.choice(len(large), 8, replace=False)]
                      + [aligned[i] for i in random.choice(len(aligned), 4, replace=False)])
            for config in picked[:8]:  # the same degrees off their aligned places
                size = config.size
                start = int(random.integers(0, devices - size + 1))
                scattered = tuple(sorted(random.choice(devices, size, replace=False)))
                for block in (tuple(range(start, start + size)), scattered,
                              tuple(reversed(range(start, start + size)))):
                    mixed.append(config.model_copy(update={"devices": block}))
            mixed.extend(picked)
        producer_configs, consumer_configs = mixed[:len(mixed) // 2], mixed[len(mixed) // 2:]
        spaces = (("mixed", u), ("mixed", v))
        bound = transfers.degree_bounds(producer, consumer, producer_configs, consumer_configs,
                                        spaces)[np.ix_(transfers.degree_classes(producer_configs),
                                                       transfers.degree_classes(consumer_configs))]
        ends = transfers.lower_bounds(producer, consumer, producer_configs, consumer_configs)
        assert (bound <= ends).all(), (u, v)
        assert (bound > 0).any(), (u, v)


@pytest.mark.parametrize(("ends_tables", "space_unions"), [(False, True), (True, True),
                                                           (True, False)])
def test_ends_bounds_between_some_configs_are_the_whole_matrices_entries_bit_for_bit(
        ends_tables, space_unions, monkeypatch):
    """The second pruning prices the ends bound between the configs the first kept only, each
    edge's own, from per-device terms built once per kind of edge: every entry is the whole
    bound matrix's, bit for bit, in the order asked for (whole tables, or from 32 devices
    each pass's ends-only tables over the configs asked of each search space, or over those
    each kind's edges ask for)."""
    if ends_tables:
        monkeypatch.setattr(tables, "_ENDS_TABLES_FROM_DEVICES", 0)
    if not space_unions:
        monkeypatch.setattr(tables, "_UNION_CONFIG_DEVICES", -1)
    graph = build_graph("resnet18", batch=16 * 8, image_size=32)
    cluster = load_cluster("p100x16")
    cost = CostModel(graph, cluster, 16, AnalyticCompute(cluster), placement="aligned")
    random = np.random.default_rng(1)
    kept = {name: random.choice(len(configs), 1 + len(configs) // 3, replace=False)
            for name, configs in cost.configs.items()}
    for (u, v), matrix in cost.edge_lower_bounds(kept).items():
        whole = cost.edge_lower_bound(graph.by_name[u], graph.by_name[v])
        assert matrix.tobytes() == whole[np.ix_(kept[u], kept[v])].tobytes(), (u, v)


@pytest.mark.parametrize(("model", "devices", "image_size"),
                         [("resnet18", 16, 32), ("unet3d", 8, 16), ("m5", 16, 4000)])
def test_bounds_from_the_ends_tables_are_those_of_the_whole_tables_bit_for_bit(
        model, devices, image_size, monkeypatch):
    """From 32 devices on, a bound's passes read tables of each side's end devices only
    (`ConfigTable`'s ends_only): every bound is the one the whole tables give, bit for bit, on
    the edge from the input, residual, strided, 3-d (depth) and 1-d edges, across nodes whose
    ports are shared, uneven tiles included."""
    graph = build_graph(model, batch=3 * devices, image_size=image_size)
    cluster = load_cluster("p100x16")
    assert any(link.shared_by > 1 for _, link in cluster.link_tiers())

    def bounds(ends_from: int) -> list[np.ndarray]:
        monkeypatch.setattr(tables, "_ENDS_TABLES_FROM_DEVICES", ends_from)
        cost = CostModel(graph, cluster, devices, AnalyticCompute(cluster), placement="aligned")
        return [cost.edge_lower_bound(graph.by_name[u], graph.by_name[v])
                for u, v in graph.edges[:8]]

    ends, whole = bounds(0), bounds(devices + 1)
    assert graph.by_name[graph.edges[0][0]].kind == "input"
    assert [array.tobytes() for array in ends] == [array.tobytes() for array in whole]


@pytest.mark.parametrize(("model", "cluster_name", "devices"),
                         [("resnet18", "p100x16", 16), ("unet3d", "h200x8", 16)])
def test_pairs_copied_by_a_shift_are_those_priced_directly_bit_for_bit(
        model, cluster_name, devices, monkeypatch):
    """Pairs whose blocks a shift by whole nodes maps onto pairs already priced are copied
    from them: every whole matrix (seconds and bytes) and every bound is the one pricing
    each pair directly gives, bit for bit, with less work (on 16 devices, 4 nodes of 4: 0.75
    of it; 2 nodes of 8: 0.81)."""
    graph = build_graph(model, batch=2 * devices, image_size=16)
    cluster = load_cluster(cluster_name)
    cluster = cluster.model_copy(update={"nodes": devices // cluster.devices_per_node})
    edges = graph.edges[:6]

    def priced() -> tuple[list[bytes], int]:
        cost = CostModel(graph, cluster, devices, AnalyticCompute(cluster), placement="aligned")
        arrays = []
        for u, v in edges:
            producer, consumer = graph.by_name[u], graph.by_name[v]
            arrays.extend(cost.edge(producer, consumer))
            arrays.append(cost.edge_lower_bound(producer, consumer))
        return [array.tobytes() for array in arrays], cost.terms_priced

    shifted, shifted_work = priced()
    monkeypatch.setattr(tables.TransferTables, "_shifted", lambda *_: None)
    direct, direct_work = priced()
    assert shifted == direct
    assert shifted_work < direct_work


@pytest.mark.parametrize("cluster_name", ["p100x16", "p100x16-2018", "h200x8"])
def test_sync_looked_up_once_per_shift_is_each_blocks_own_bit_for_bit(cluster_name,
                                                                       monkeypatch):
    """t_s looks up a block's replica links once per start modulo the cluster's symmetry:
    every config's sync seconds and bytes are those of its own links, bit for bit, on 32
    devices of 6-GPU nodes (aligned blocks of 4 and 8 then straddle nodes at some starts, not
    at others) with ports shared by 4 (rings and a parameter server) or none."""
    graph = build_graph("resnet18", batch=64, image_size=16)
    cluster = load_cluster(cluster_name).model_copy(update={"devices_per_node": 6, "nodes": 6})

    def synced() -> list[bytes]:
        cost = CostModel(graph, cluster, 32, AnalyticCompute(cluster), placement="aligned")
        return [array.tobytes() for layer in graph.layers
                for array in cost.sync(layer, cost.configs[layer.name])]

    once = synced()
    monkeypatch.setattr(CostModel, "_shifted_back", lambda _self, devices: devices)
    assert once == synced()


@pytest.mark.parametrize("terms", ["kept", "over budget", "ends tables"])
def test_the_exact_pass_over_kept_configs_gives_the_whole_matrices_entries_bit_for_bit(
        terms, monkeypatch):
    """The search's exact t_x between the kept configs reads the per-device terms its bounds
    built (or, past their memory budget or where the bounds read ends-only tables, builds the
    kept configs' own, one build shared by the edges of repeated blocks when every edge is
    asked for at once, and read from an earlier pass's matrices where the configs asked are
    within theirs); every entry is the whole matrix's, bit for bit, in the order the configs
    are asked for: on the edge from the input (no backward), residual and strided edges,
    across nodes whose ports are shared."""
    if terms == "over budget":
        monkeypatch.setattr(tables, "_KEPT_SIDES_BYTES", 0)
    elif terms == "ends tables":
        monkeypatch.setattr(tables, "_ENDS_TABLES_FROM_DEVICES", 0)
    graph = build_graph("resnet18", batch=16 * 8, image_size=32)
    cluster = load_cluster("p100x16")
    assert any(link.shared_by > 1 for _, link in cluster.link_tiers())
    cost = CostModel(graph, cluster, 16, AnalyticCompute(cluster), placement="aligned")
    random = np.random.default_rng(0)
    edges = graph.edges[:10]
    assert graph.by_name[edges[0][0]].kind == "input"
    for u, v in edges:
        producer, consumer = graph.by_name[u], graph.by_name[v]
        whole = cost.edge(producer, consumer)[0]
        cost.edge_lower_bound(producer, consumer)
        for count in (1, 9):
            kept_u = random.choice(len(cost.configs[u]), count, replace=False)
            kept_v = random.choice(len(cost.configs[v]), count, replace=False)
            kept = cost.kept_edge(producer, consumer, kept_u, kept_v)
            assert kept.tobytes() == whole[np.ix_(kept_u, kept_v)].tobytes(), (u, v)
    # all edges at once, as the search asks: the stages' repeated blocks (equal terms, configs
    # asked for that differ) read one build over every config they ask for
    wholes = {(u, v): cost.edge(graph.by_name[u], graph.by_name[v])[0] for u, v in graph.edges}
    asked = [{name: random.choice(len(configs), count, replace=False)
              for name, configs in cost.configs.items()} for count in (1, 5)]
    # and sets that mostly overlap, as the kept configs of repeated blocks do: the union's
    # every pair is priced at once
    asked.append({name: np.unique(np.concatenate([np.arange(8), random.choice(
        len(configs), 1)])) for name, configs in cost.configs.items()})
    for kept in asked:
        for (u, v), matrix in cost.kept_edges(kept).items():
            assert matrix.tobytes() == wholes[u, v][np.ix_(kept[u], kept[v])].tobytes(), (u, v)
    # configs within ones already priced (the exact pass after the upper bound's candidates)
    # are read from those matrices: the same entries, no term priced again
    priced = cost.terms_priced
    within = {name: np.sort(random.choice(kept, 3, replace=False))
              for name, kept in asked[-1].items()}
    for (u, v), matrix in cost.kept_edges(within).items():
        assert matrix.tobytes() == wholes[u, v][np.ix_(within[u], within[v])].tobytes(), (u, v)
    assert cost.terms_priced == priced


def test_kinds_priced_together_give_each_kinds_own_entries_bit_for_bit(monkeypatch):
    """Kinds of edge between the same two lists of configs (Inception-v3's branches and
    concatenations: up to 17 kinds at once here) are priced in one build of their sides and
    one pass: every edge's entries are its whole matrix's, and those each kind priced alone
    gives, bit for bit, in the order the configs are asked for."""
    graph = build_graph("inception_v3", batch=16 * 8, image_size=75)
    cluster = load_cluster("p100x16")
    random = np.random.default_rng(1)

    def kept_matrices(cost: CostModel) -> tuple[list[dict[tuple[str, str], bytes]],
                                                list[dict[str, np.ndarray]]]:
        asked = [{name: np.sort(random.choice(len(configs), count, replace=False))
                  for name, configs in cost.configs.items()} for count in (3, 8)]
        return [{edge: matrix.tobytes() for edge, matrix in cost.kept_edges(kept).items()}
                for kept in asked], asked

    cost = CostModel(graph, cluster, 16, AnalyticCompute(cluster), placement="aligned")
    together, asked = kept_matrices(cost)
    for (u, v) in graph.edges[::12]:
        whole = cost.edge(graph.by_name[u], graph.by_name[v])[0]
        for kept, matrices in zip(asked, together, strict=True):
            assert matrices[u, v] == whole[np.ix_(kept[u], kept[v])].tobytes(), (u, v)
    monkeypatch.setattr(tables, "_KIND_TERMS", -(1 << 62))  # no batch pays: each kind alone
    random = np.random.default_rng(1)
    alone, _ = kept_matrices(CostModel(graph, cluster, 16, AnalyticCompute(cluster),
                                       placement="aligned"))
    assert alone == together


def test_a_strategy_best_for_the_bounds_tightens_them_on_residual_networks(monkeypatch):
    """Where the forest's strategy (which ignores each residual block's shortcut) keeps many
    configs, the strategy best for the bounds themselves over the configs kept, priced
    exactly, bounds the optimum from above more closely: fewer configs kept, the same
    strategy and cost."""
    devices = 32
    graph = build_graph("resnet50", batch=32 * devices, image_size=32)
    cluster = load_cluster("p100x16")
    cluster = cluster.model_copy(update={"nodes": devices // cluster.devices_per_node})

    def searched() -> search.SearchResult:
        cost = CostModel(graph, cluster, devices, AnalyticCompute(cluster), placement="origin")
        return search.optimal_strategy(cost)

    tightened = searched()
    share = search._LOOSE_SHARE
    monkeypatch.setattr(search, "_LOOSE_SHARE", 1.0)  # never past it: the forest's alone
    forest_only = searched()
    assert forest_only.configs_kept > share * forest_only.configs
    assert tightened.configs_kept < forest_only.configs_kept / 2
    assert tightened.assignment == forest_only.assignment
    assert tightened.predicted == forest_only.predicted


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_min_marginals_through_the_eliminations_are_those_of_every_strategy(data):
    """Each config's least strategy cost, from the eliminations and the pass back through
    them, equals the least over every strategy that uses it (random DAGs, ties, negative edge
    costs, several parts), to rounding."""
    nodes, edges = random_problem(data)
    names = list(nodes)
    found = min_marginals(nodes, edges, names)
    assert found is not None
    best = {name: np.full(len(cost), np.inf) for name, cost in nodes.items()}
    for choice in itertools.product(*(range(len(nodes[name])) for name in names)):
        cost = total(nodes, edges, dict(zip(names, choice, strict=True)))
        for name, index in zip(names, choice, strict=True):
            best[name][index] = min(best[name][index], cost)
    for name in names:
        np.testing.assert_allclose(found[name], best[name], rtol=0, atol=1e-9)
