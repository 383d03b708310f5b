"""The foundation's algorithms: valid strategies, m-TOPO's memory cap, co-location."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.baselines import DataParallel, RoundRobin, SingleDevice
from algorithms.m_topo import MTopo
from algorithms.sched.constraints import follow_colocation
from algorithms.sched.orders import bfs_topological_order
from harness.core.costs import AnalyticalCostModel, node_memory
from simulators.simulate import simulate
from tests.helpers import make_cluster, make_graph

ALGOS = [SingleDevice(), DataParallel(), RoundRobin(), MTopo(), MTopo(coloc_memory="all")]


@pytest.mark.parametrize("algo", ALGOS, ids=lambda a: f"{a.name}-{a.describe()}")
def test_valid_strategy_and_simulates(algo, tiny_graph):
    cl = make_cluster(4)
    costs = AnalyticalCostModel(cl)
    plan = algo.plan(tiny_graph, cl, costs)
    plan.strategy.validate(plan.graph, cl.num_devices)
    res = simulate(plan.graph, plan.strategy, cl, costs)
    assert res.step_time_s > 0 and res.step_time_s >= res.plan_lower_bound_s * (1 - 1e-9)


@pytest.mark.parametrize("algo", [RoundRobin(), MTopo()], ids=lambda a: a.name)
def test_colocation_groups_share_a_device(algo, tiny_graph):
    cl = make_cluster(4)
    plan = algo.plan(tiny_graph, cl, AnalyticalCostModel(cl))
    for members in tiny_graph.coloc_groups():
        assert len(set(plan.strategy.device[members].tolist())) == 1


def test_data_parallel_is_sample_degree_n_everywhere(tiny_graph):
    cl = make_cluster(4)
    s = DataParallel().plan(tiny_graph, cl, AnalyticalCostModel(cl)).strategy
    assert (s.config_id == 0).all()
    assert s.configs[0].dims == (("sample", 4),) and s.configs[0].devices == (0, 1, 2, 3)
    assert DataParallel(devices=2).plan(tiny_graph, cl, AnalyticalCostModel(cl)).strategy.configs[0].degree == 2


def test_m_topo_fills_devices_in_order_up_to_the_cap():
    # 8 equal nodes of 1 GiB on 4 devices: cap = 8/4 + 1 = 3 GiB per device
    g = make_graph(8, [(i, i + 1) for i in range(7)])
    g.out_bytes[:] = 2**30
    cl = make_cluster(4)
    plan = MTopo().plan(g, cl, AnalyticalCostModel(cl))
    assert plan.strategy.device.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert plan.info["fill_to_bytes"][0] == pytest.approx(3 * 2**30)
    # a tiny device is never filled past its capacity while another device has room
    small = make_cluster(4, mem_GiB=2)
    dev = MTopo().plan(g, small, AnalyticalCostModel(small)).strategy.device
    assert np.bincount(dev, minlength=4).tolist() == [2, 2, 2, 2]


def test_m_topo_coloc_memory_modes_differ():
    # node 0 starts a group with nodes 5..7 (4 GiB together); "first" counts 1 GiB only
    g = make_graph(8, [(i, i + 1) for i in range(7)])
    g.out_bytes[:] = 2**30
    g.coloc[[0, 5, 6, 7]] = 0
    cl = make_cluster(2)
    first = MTopo(coloc_memory="first").plan(g, cl, AnalyticalCostModel(cl))
    allm = MTopo(coloc_memory="all").plan(g, cl, AnalyticalCostModel(cl))
    others = [1, 2, 3, 4]
    # Baechi's accounting leaves room for four more nodes beside the group, the full count for one
    assert (first.strategy.device[others] == 0).sum() == 4
    assert (allm.strategy.device[others] == 0).sum() == 1
    for plan in (first, allm):
        assert (plan.strategy.device[[0, 5, 6, 7]] == plan.strategy.device[0]).all()


def test_bfs_order_and_follow_colocation():
    g = make_graph(4, [(0, 2), (1, 3), (2, 3)])
    assert bfs_topological_order(g).tolist() == [0, 1, 2, 3]
    g.coloc[[1, 3]] = 0
    assert follow_colocation(g, np.array([0, 1, 2, 3])).tolist() == [0, 1, 2, 1]


def test_node_memory_is_what_m_topo_budgets(tiny_graph):
    cl = make_cluster(4)
    costs = AnalyticalCostModel(cl)
    assert (costs.memory(tiny_graph) == node_memory(tiny_graph)).all()
    assert node_memory(tiny_graph).sum() >= tiny_graph.param_bytes.sum()
