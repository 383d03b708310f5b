"""Baechi's m-ETF and m-SCT, and Celeritas's DFS-TOPO baseline."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.dfs_topo import DfsTopo
from algorithms.m_etf import METF
from algorithms.m_sct import MSCT, favourite_child_lp, round_favourites
from algorithms.sched.levels import static_costs
from harness.core.costs import AnalyticalCostModel
from simulators.simulate import simulate
from tests.helpers import make_cluster, make_graph


def costs_for(cl):
    return AnalyticalCostModel(cl, efficiency={"gemm": 1.0, "conv": 1.0}, launch_us=0.0)


def fork(n_children: int, child_flops: float, nbytes: int):
    edges = [(0, i) for i in range(1, n_children + 1)]
    return make_graph(n_children + 1, edges, flops=[1e9] + [child_flops] * n_children, nbytes=[nbytes] * n_children)


@pytest.mark.parametrize("algo", [METF(), MSCT(), DfsTopo()], ids=lambda a: a.name)
def test_valid_strategy_colocation_and_simulation(algo, tiny_graph):
    cl = make_cluster(4)
    costs = costs_for(cl)
    plan = algo.plan(tiny_graph, cl, costs)
    assert plan.graph is tiny_graph
    plan.strategy.validate(tiny_graph, 4)
    for members in tiny_graph.coloc_groups():
        assert len(set(plan.strategy.device[members].tolist())) == 1
    res = simulate(tiny_graph, plan.strategy, cl, costs)
    assert res.step_time_s >= res.plan_lower_bound_s * (1 - 1e-9)
    assert algo.plan(tiny_graph, cl, costs).strategy == plan.strategy  # deterministic


def test_m_etf_spreads_independent_work_when_communication_is_cheap():
    cl = make_cluster(4, bw_GBps=100.0)
    costs = costs_for(cl)
    g = fork(4, 1e11, 1000)
    plan = METF().plan(g, cl, costs)
    assert sorted(plan.strategy.device[1:].tolist()) == [0, 1, 2, 3]
    # the simulator replays the ETF schedule (up to the three tiny transfers queueing on one port)
    res = simulate(g, plan.strategy, cl, costs)
    assert res.step_time_s == pytest.approx(plan.info["objective_s"], rel=1e-4)


def test_m_etf_keeps_work_local_when_communication_is_dear():
    cl = make_cluster(4, bw_GBps=0.01, mem_GiB=1000)
    costs = costs_for(cl)
    g = fork(3, 1e9, 10_000_000_000)
    assert set(METF().plan(g, cl, costs).strategy.device.tolist()) == {0}


def test_m_etf_respects_memory_and_frees_outputs():
    # a chain of 1 GiB outputs: 8 GiB of static memory, but only two outputs are ever
    # live, so a 3 GiB device holds the whole chain once outputs are freed
    g = make_graph(8, [(i, i + 1) for i in range(7)], nbytes=[2**30] * 7)
    cl = make_cluster(2, mem_GiB=3)
    costs = costs_for(cl)
    plan = METF().plan(g, cl, costs)
    assert not plan.info["placement_oom"]
    assert not simulate(g, plan.strategy, cl, costs).oom
    # an op bigger than one device goes to the one that holds it
    g2 = make_graph(2, [(0, 1)], nbytes=[5 * 2**30])
    cl2 = make_cluster(2, mem_GiB=3)
    assert METF().plan(g2, cl2, costs_for(cl2)).info["placement_oom"]


def test_m_etf_reports_placement_oom_when_nothing_fits():
    g = make_graph(3, [(0, 1), (0, 2)], nbytes=[4 * 2**30, 4 * 2**30])
    g.out_bytes[:] = 4 * 2**30
    cl = make_cluster(2, mem_GiB=2)
    for algo in (METF(), MSCT()):
        plan = algo.plan(g, cl, costs_for(cl))
        assert plan.info["placement_oom"] and plan.info["oom_steps"] > 0
        plan.strategy.validate(g, 2)  # a strategy exists all the same


def test_favourite_child_lp_on_a_fork():
    # w = 1 s each, c = 1 s: only one child can be the favourite, so the LP splits x = 0.5
    g = make_graph(3, [(0, 1), (0, 2)])
    w = np.ones(3)
    c = np.ones(2)
    x, makespan, status = favourite_child_lp(g, w, c)
    assert makespan == pytest.approx(2.5, abs=1e-6) and "ptimal" in status
    assert x.sum() == pytest.approx(1.0, abs=1e-6)
    fav = round_favourites(g, x, c, 0.5)
    assert fav[0] in (1, 2) and (fav[1:] == -1).all()


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 30), st.integers(0, 10_000))
def test_lp_bounds_and_rounded_favourites_are_a_matching(n, seed):
    rng = np.random.default_rng(seed)
    edges = sorted({(int(a), int(b)) for a, b in rng.integers(0, n, size=(2 * n, 2)) if a < b})
    if not edges:
        return
    g = make_graph(n, edges)
    w, c = rng.random(n) + 0.1, rng.random(len(edges))
    x, makespan, _ = favourite_child_lp(g, w, c)
    assert ((x > -1e-7) & (x < 1 + 1e-7)).all()
    from algorithms.sched.levels import blevel

    assert blevel(g, w, np.zeros(len(edges))).max() - 1e-6 <= makespan <= blevel(g, w, c).max() + 1e-6
    fav = round_favourites(g, x, c, 0.5)
    kids = fav[fav >= 0]
    assert len(kids) == len(set(kids.tolist()))  # every node is the favourite of at most one parent
    es = set(edges)
    assert all((i, int(f)) in es for i, f in enumerate(fav) if f >= 0)


def test_m_sct_keeps_a_chain_with_its_favourite_children():
    # a chain plus a light side branch: the chain's favourite children keep it on one device
    edges = [(0, 1), (1, 2), (2, 3), (0, 4)]
    g = make_graph(5, edges, flops=[1e9, 1e10, 1e10, 1e10, 1e9], nbytes=[10**9] * 4)
    cl = make_cluster(4, bw_GBps=1.0, mem_GiB=100)
    costs = costs_for(cl)
    plan = MSCT().plan(g, cl, costs)
    assert len(set(plan.strategy.device[[0, 1, 2, 3]].tolist())) == 1
    assert plan.info["favourite_children"] >= 3


def test_dfs_topo_fills_devices_in_dfs_order_then_falls_back():
    # two chains; 1 GiB per node; devices of 3 GiB: chain 0-2-4 fills device 0
    g = make_graph(6, [(0, 2), (2, 4), (1, 3), (3, 5)], nbytes=[2**30] * 4)
    g.out_bytes[:] = 2**30
    cl = make_cluster(2, mem_GiB=3)
    plan = DfsTopo().plan(g, cl, costs_for(cl))
    assert plan.strategy.device.tolist() == [0, 1, 0, 1, 0, 1]
    assert plan.info["fallback_nodes"] == 0
    small = make_cluster(2, mem_GiB=2)
    plan = DfsTopo().plan(g, small, costs_for(small))
    assert plan.info["fallback_nodes"] == 2
    assert np.bincount(plan.strategy.device, minlength=2).tolist() == [3, 3]


def test_static_costs_feed_the_lp_in_seconds(tiny_graph):
    cl = make_cluster(4)
    costs = costs_for(cl)
    w, c = static_costs(tiny_graph, cl, costs)
    plan = MSCT().plan(tiny_graph, cl, costs)
    assert plan.info["lp_makespan_s"] <= w.sum() + c.sum()
