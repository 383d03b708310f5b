"""Celeritas: CPD-TOPO, Optimal_BP, the coarse graph, Order-Place, Adjusting Placement,
memory fallback, co-location, and Standard Evaluation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from algorithms.celeritas import Celeritas, coarse_graph, coarsen, optimal_bp
from algorithms.sched.levels import blevel, ccr, cpath, static_costs, tlevel
from algorithms.sched.orders import bfs_topological_order, cpd_topo, dfs_topo_order, positions
from algorithms.standard_eval import StandardEvaluationError, check_same_structure, default_small_batches, linear_fit, standard_evaluation
from harness.core.costs import AnalyticalCostModel
from harness.core.graph import GraphError
from simulators.simulate import simulate
from tests.helpers import make_cluster, make_graph


def costs_for(cl):
    return AnalyticalCostModel(cl, efficiency={"gemm": 1.0, "conv": 1.0}, launch_us=0.0)


# ---------------------------------------------------------------------------- orders
def test_cpath_is_tlevel_plus_blevel_and_cpd_topo_follows_the_critical_child():
    # 0 -> 1 (light), 0 -> 2 (heavy), both -> 3: the heavy child has the larger id
    g = make_graph(4, [(0, 1), (0, 2), (1, 3), (2, 3)], flops=[1e9, 1e9, 9e9, 1e9])
    w = np.array([1.0, 1.0, 9.0, 1.0])
    c = np.array([0.5, 0.5, 0.5, 0.5])
    assert cpath(g, w, c).tolist() == (tlevel(g, w, c) + blevel(g, w, c)).tolist()
    assert cpd_topo(g, w, c).tolist() == [0, 2, 1, 3]  # critical child first
    assert dfs_topo_order(g).tolist() == [0, 1, 2, 3]  # plain DFS-TOPO prefers the smaller id


def test_dfs_topo_keeps_chains_together_where_bfs_interleaves():
    # Celeritas Fig. 3: two chains 0-2-4 and 1-3-5
    g = make_graph(6, [(0, 2), (2, 4), (1, 3), (3, 5)])
    assert dfs_topo_order(g).tolist() == [0, 2, 4, 1, 3, 5]
    assert bfs_topological_order(g).tolist() == [0, 1, 2, 3, 4, 5]


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 25), st.integers(0, 10_000), st.booleans())
def test_dfs_and_cpd_orders_are_topological_permutations(n, seed, cpd):
    rng = np.random.default_rng(seed)
    edges = sorted({(int(a), int(b)) for a, b in rng.integers(0, n, size=(2 * n, 2)) if a < b})
    g = make_graph(n, edges)
    w, c = rng.random(n), rng.random(len(edges))
    seq = cpd_topo(g, w, c) if cpd else dfs_topo_order(g)
    assert sorted(seq.tolist()) == list(range(n))
    pos = positions(seq)
    assert all(pos[a] < pos[b] for a, b in edges)


# ---------------------------------------------------------------------------- Optimal_BP
def brute_force_bp(g, seq, c, mem, R, M):
    """Minimum over all partitions of seq into intervals (size <= R, memory <= M or a
    single node) of the cost of the edges leaving each interval."""
    n = len(seq)
    pos = positions(seq)
    best = np.inf
    for cuts in itertools.product([0, 1], repeat=n - 1):
        starts = [0] + [i + 1 for i, b in enumerate(cuts) if b]
        ends = starts[1:] + [n]
        if any(e - s > R or (e - s > 1 and mem[seq[s:e]].sum() > M) for s, e in zip(starts, ends)):
            continue
        part = np.zeros(n, dtype=int)
        for k, s in enumerate(starts):
            part[s:] = k
        cut = sum(c[e] for e in range(g.num_edges) if part[pos[g.src[e]]] != part[pos[g.dst[e]]])
        best = min(best, cut)
    return best


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 9), st.integers(0, 10_000), st.integers(1, 4), st.floats(1.0, 6.0))
@example(7, 0, 2, 1.9999999999999991)  # 10 - M rounds to 8: the memory cap must be checked on the sums
def test_optimal_bp_matches_brute_force(n, seed, R, M):
    rng = np.random.default_rng(seed)
    edges = sorted({(int(a), int(b)) for a, b in rng.integers(0, n, size=(2 * n, 2)) if a < b})
    g = make_graph(n, edges)
    c = rng.integers(1, 10, size=len(edges)).astype(float)
    mem = rng.integers(1, 4, size=n).astype(float)
    seq = dfs_topo_order(g)
    starts, S = optimal_bp(g, seq, c, mem, R, M)
    assert S == pytest.approx(brute_force_bp(g, seq, c, mem, R, M))
    # the breakpoints realise S and respect R and M
    ends = list(starts[1:]) + [n]
    assert starts[0] == 0 and all(0 < e - s <= R for s, e in zip(starts, ends))
    assert all(e - s == 1 or mem[seq[s:e]].sum() <= M for s, e in zip(starts, ends))


def test_optimal_bp_cuts_at_the_cheapest_edge_of_a_chain():
    g = make_graph(6, [(i, i + 1) for i in range(5)])
    c = np.array([5.0, 5.0, 1.0, 5.0, 5.0])
    starts, S = optimal_bp(g, np.arange(6), c, np.ones(6), R=4, M=np.inf)
    assert starts.tolist() == [0, 3] and S == 1.0


# ---------------------------------------------------------------------------- coarse graph
def test_coarse_graph_is_a_dag_and_keeps_flops_and_dataflow(tiny_graph):
    cl = make_cluster(4)
    costs = costs_for(cl)
    w, c = static_costs(tiny_graph, cl, costs)
    mem = costs.memory(tiny_graph).astype(float)
    co = coarsen(tiny_graph, w, c, mem, R=10)
    cg = co.graph
    assert cg.num_nodes == co.num_clusters < tiny_graph.num_nodes
    assert (cg.src < cg.dst).all()  # node ids are a topological order: a DAG
    assert cg.flops.sum() == pytest.approx(tiny_graph.flops.sum())
    assert co.w.sum() == pytest.approx(w.sum())
    assert sorted(np.concatenate([co.members(k) for k in range(co.num_clusters)]).tolist()) == list(range(tiny_graph.num_nodes))
    # every cross-cluster edge of the original graph is carried by a coarse edge
    a, b = co.cluster_of[tiny_graph.src], co.cluster_of[tiny_graph.dst]
    cross = {(int(x), int(y)) for x, y in zip(a, b) if x != y}
    assert cross == set(zip(cg.src.tolist(), cg.dst.tolist()))
    # each crossing tensor is counted once per destination cluster
    assert cg.nbytes.sum() <= tiny_graph.nbytes[a != b].sum()
    assert ccr(co.w, co.c) < ccr(w, c)


def test_merging_non_adjacent_nodes_is_a_cycle_and_is_named():
    # Celeritas Fig. 4: merging the ends of a path around a middle node makes a loop
    g = make_graph(3, [(0, 1), (1, 2)])
    with pytest.raises(GraphError, match="cycle"):
        coarse_graph(g, np.array([0, 1, 0]), 2, np.ones(2))


@settings(max_examples=30, deadline=None)
@given(st.integers(3, 60), st.integers(0, 10_000), st.integers(1, 12))
def test_coarse_graph_of_random_dags_is_a_dag(n, seed, R):
    rng = np.random.default_rng(seed)
    edges = sorted({(int(a), int(b)) for a, b in rng.integers(0, n, size=(3 * n, 2)) if a < b})
    g = make_graph(n, edges)
    co = coarsen(g, rng.random(n), rng.random(len(edges)), rng.random(n), R=R)
    assert (co.graph.src < co.graph.dst).all()
    assert co.graph.flops.sum() == pytest.approx(g.flops.sum())


# ---------------------------------------------------------------------------- placement
def fork_join(bytes_: int):
    # 0 -> {1, 2} -> 3 with two heavy middle nodes
    return make_graph(4, [(0, 1), (0, 2), (1, 3), (2, 3)], flops=[1e9, 4e10, 4e10, 1e9], nbytes=[bytes_] * 4)


def test_adjusting_placement_splits_parallel_work_when_communication_is_cheap():
    cl = make_cluster(4, bw_GBps=100.0)
    costs = costs_for(cl)
    g = fork_join(1000)
    cel = Celeritas(R=1).plan(g, cl, costs)
    op = Celeritas(name="order_place", adjust=False, R=1).plan(g, cl, costs)
    assert cel.strategy.device[1] != cel.strategy.device[2]  # Eq. 9 moved one branch
    assert cel.info["adjusted_nodes"] >= 1
    assert len(set(op.strategy.device.tolist())) == 1  # Order-Place fills device 0
    s_cel = simulate(g, cel.strategy, cl, costs).step_time_s
    s_op = simulate(g, op.strategy, cl, costs).step_time_s
    assert s_cel < s_op


def test_adjusting_placement_keeps_a_node_home_when_sending_back_costs_more():
    cl = make_cluster(4, bw_GBps=1.0, mem_GiB=1000)
    costs = costs_for(cl)
    g = fork_join(20_000_000_000)  # 20 GB edges: 20 s each, far above the 4 s of compute
    cel = Celeritas(R=1).plan(g, cl, costs)
    assert len(set(cel.strategy.device.tolist())) == 1
    assert cel.info["adjusted_nodes"] == 0


def test_memory_fallback_goes_to_the_least_used_device():
    g = make_graph(8, [(i, i + 1) for i in range(7)])
    g.out_bytes[:] = 2**30  # 1 GiB per node, 8 GiB in all
    cl = make_cluster(2, mem_GiB=2)  # 4 GiB in all: half the nodes cannot fit
    costs = costs_for(cl)
    for algo in (Celeritas(R=1), Celeritas(name="order_place", adjust=False, R=1)):
        plan = algo.plan(g, cl, costs)
        dev = plan.strategy.device
        assert plan.info["fallback_nodes"] == 4
        assert np.bincount(dev, minlength=2).tolist() == [4, 4]  # best effort balances usage
    op = Celeritas(name="order_place", adjust=False, R=1).plan(g, cl, costs).strategy.device
    assert op[:2].tolist() == [0, 0] and op[2:4].tolist() == [1, 1]  # fill device 0, then device 1


def test_liveness_memory_gives_outputs_back_once_their_readers_are_placed():
    # a chain of 1 GiB outputs: static Ava_m runs out, liveness sees at most 2 GiB live
    g = make_graph(8, [(i, i + 1) for i in range(7)], nbytes=[2**30] * 7)
    cl = make_cluster(2, mem_GiB=3)
    costs = costs_for(cl)
    static = Celeritas(R=1).plan(g, cl, costs)
    live = Celeritas(R=1, memory="liveness").plan(g, cl, costs)
    assert static.info["fallback_nodes"] > 0
    assert live.info["fallback_nodes"] == 0
    with pytest.raises(ValueError, match="memory"):
        Celeritas(memory="peak")


def test_cluster_memory_cap_m_limits_cluster_size():
    g = make_graph(8, [(i, i + 1) for i in range(7)])
    g.out_bytes[:] = 2**30
    cl = make_cluster(2, mem_GiB=8)
    costs = costs_for(cl)
    co, _, _ = Celeritas(M=0.25).coarsen(g, cl, costs)  # 2 GiB per cluster: 2 nodes each
    assert co.num_clusters == 4


def test_plan_is_valid_follows_colocation_and_replays_in_the_simulator(tiny_graph):
    cl = make_cluster(4)
    costs = costs_for(cl)
    for algo in (Celeritas(), Celeritas(name="order_place", adjust=False), Celeritas(R=3)):
        plan = algo.plan(tiny_graph, cl, costs)
        assert plan.graph is tiny_graph and plan.origin is None
        plan.strategy.validate(tiny_graph, 4)
        for members in tiny_graph.coloc_groups():
            assert len(set(plan.strategy.device[members].tolist())) == 1
        res = simulate(tiny_graph, plan.strategy, cl, costs)
        assert res.step_time_s >= res.plan_lower_bound_s * (1 - 1e-9)
        assert plan.info["coarse_nodes"] <= tiny_graph.num_nodes


def test_celeritas_is_deterministic(tiny_graph):
    cl = make_cluster(4)
    costs = costs_for(cl)
    a, b = Celeritas().plan(tiny_graph, cl, costs), Celeritas().plan(tiny_graph, cl, costs)
    assert a.strategy == b.strategy


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="R"):
        Celeritas(R=0)
    with pytest.raises(ValueError, match="M"):
        Celeritas(M=0)


# ---------------------------------------------------------------------------- Standard Evaluation
def test_linear_fit_and_default_batches():
    x = np.array([2.0, 4.0, 8.0])
    Y = np.stack([3 + 2 * x, 5 * np.ones(3)], axis=1)
    a, k = linear_fit(x, Y)
    assert a.tolist() == pytest.approx([3.0, 5.0]) and k.tolist() == pytest.approx([2.0, 0.0])
    assert default_small_batches(512) == [16, 32, 64]
    assert default_small_batches(32) == [1, 2, 4]
    assert len(default_small_batches(2)) >= 2


def test_standard_evaluation_predicts_the_large_batch():
    from harness.app.compose import compose
    from harness.app.run import build

    cfg = compose(["model=lenet5", "model.batch_size=16", "cluster=p100x4"])
    src, cl, costs, _, _ = build(cfg)
    se = standard_evaluation(src, costs, small_batches=[2, 4, 8], graph_kw=dict(cfg.graph))
    s = se.summary()
    assert se.batch == 16 and se.small_batches == [2, 4, 8]
    # against the analytical model memory is exactly linear in the batch; time nearly so
    assert s["mem_dev_mean"] < 1e-9 and s["time_dev_mean"] < 0.05
    assert len(se.placement) == se.graph.num_nodes and (se.placement >= 0).all()
    assert np.isnan(se.mem_dev[se.mem_acc == 0]).all()


def test_standard_evaluation_names_a_graph_that_changes_with_the_batch():
    g1 = make_graph(3, [(0, 1), (1, 2)])
    g2 = make_graph(4, [(0, 1), (1, 2), (2, 3)])
    with pytest.raises(StandardEvaluationError, match="4 nodes"):
        check_same_structure(g1, g2, "toy at batch 2")
    g3 = make_graph(3, [(0, 1), (0, 2)])
    with pytest.raises(StandardEvaluationError, match="edges differ"):
        check_same_structure(g1, g3, "toy at batch 2")


def test_colocate_gradients_ties_each_modules_backward_to_its_forward(tiny_graph):
    from harness.core.graph_rewrites import colocate_gradients

    g2 = colocate_gradients(tiny_graph)
    assert g2.num_nodes == tiny_graph.num_nodes and tiny_graph.meta.get("colocate_gradients") is None
    for L, name in enumerate(tiny_graph.layer_names):
        if name in ("model", "loss"):
            continue
        sel = (tiny_graph.layer == L) & (tiny_graph.phase < 2)
        if sel.sum() > 1:
            assert len(set(g2.coloc[sel].tolist())) == 1 and g2.coloc[sel][0] >= 0, name
    for members in tiny_graph.coloc_groups():  # the captured groups survive
        assert len(set(g2.coloc[members].tolist())) == 1
    cl = make_cluster(4)
    plan = Celeritas().plan(g2, cl, costs_for(cl))
    for members in g2.coloc_groups():
        assert len(set(plan.strategy.device[members].tolist())) == 1
