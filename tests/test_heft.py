"""HEFT against the worked example of Topcuoglu, Hariri and Wu (IEEE TPDS 2002, Fig. 2)."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.heft import HEFT, heft_schedule
from algorithms.sched.levels import blevel
from algorithms.sched.schedgraph import SchedGraph
from harness.core.costs import AnalyticalCostModel
from simulators.simulate import simulate
from tests.helpers import make_cluster, make_graph
from tests.sched_cases import EDGES, W, TableCosts, three_processors

@pytest.fixture
def example():
    g = make_graph(10, [(a, b) for a, b, _ in EDGES], nbytes=[c for _, _, c in EDGES])
    cl = three_processors()
    return g, cl, TableCosts(cl, W)


def test_upward_ranks_match_the_paper(example):
    g, cl, costs = example
    sg = SchedGraph.from_opgraph(g, cl, costs)
    rank = blevel(sg, sg.w, sg.c)
    paper = [108.0, 77.0, 80.0, 80.0, 69.0, 63.333, 42.667, 35.667, 44.333, 14.667]
    assert rank == pytest.approx(paper, abs=1e-3)


def test_makespan_is_80(example):
    g, cl, costs = example
    dev, start, finish = heft_schedule(SchedGraph.from_opgraph(g, cl, costs), cl, costs)
    assert finish.max() == pytest.approx(80.0)
    # the paper's schedule: n1 on P3 at 0, n10 on P2 ending at 80
    assert dev[0] == 2 and start[0] == 0.0
    assert dev[9] == 1 and finish[9] == pytest.approx(80.0)
    plan = HEFT().plan(g, cl, costs)
    assert plan.info["objective_s"] == pytest.approx(80.0)
    plan.strategy.validate(g, 3)


def test_insertion_never_hurts_on_the_example(example):
    g, cl, costs = example
    sg = SchedGraph.from_opgraph(g, cl, costs)
    with_ins = heft_schedule(sg, cl, costs, insertion=True)[2].max()
    without = heft_schedule(sg, cl, costs, insertion=False)[2].max()
    assert with_ins <= without


def test_schedule_respects_dependencies_and_replays_in_the_simulator():
    rng = np.random.default_rng(0)
    edges = sorted({(int(a), int(b)) for a, b in rng.integers(0, 40, (90, 2)) if a < b})
    g = make_graph(40, edges, flops=rng.uniform(1e8, 5e9, 40).tolist(), nbytes=rng.integers(1e5, 1e6, len(edges)).tolist())
    cl = make_cluster(4, topology="mesh")
    costs = AnalyticalCostModel(cl, efficiency={"gemm": 1.0}, launch_us=0.0)
    plan = HEFT().plan(g, cl, costs)
    plan.strategy.validate(g, 4)
    o = plan.strategy.order
    assert (o[g.src] < o[g.dst]).all()
    # a link per device pair and few transfers: no contention, so the simulator's strict
    # per-device order replays the plan's own schedule exactly
    res = simulate(plan.graph, plan.strategy, cl, costs)
    assert res.step_time_s == pytest.approx(plan.info["objective_s"], rel=1e-9)


def test_colocation_groups_and_memory_filter():
    g = make_graph(6, [(0, 1), (1, 2), (0, 3), (3, 4), (4, 5)])
    g.coloc[[1, 4]] = 0
    cl = make_cluster(3)
    plan = HEFT().plan(g, cl, AnalyticalCostModel(cl))
    assert plan.strategy.device[1] == plan.strategy.device[4]
    # a device too small for a node is never chosen while another one has room
    g2 = make_graph(4, [(0, 1), (0, 2), (0, 3)])
    g2.out_bytes[:] = 2**30
    small = make_cluster(2, mem_GiB=2.5)
    dev = HEFT().plan(g2, small, AnalyticalCostModel(small)).strategy.device
    assert np.bincount(dev, minlength=2).max() <= 2
