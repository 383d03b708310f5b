"""FastT (static critical-path priority + greedy splitting) and MP-DPS (merging + PEFT)."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.fastt import FastT, fastt_schedule
from algorithms.mp_dps import MPDPS, merge_groups, optimistic_cost_table
from algorithms.sched.engine import expand_group_starts, ready_list_schedule, schedule_critical_path
from algorithms.sched.schedgraph import SchedGraph, comm_fn
from harness.core.costs import AnalyticalCostModel
from harness.core.graph import BATCHED
from simulators.simulate import simulate
from tests.helpers import make_cluster, make_graph
from tests.sched_cases import TableCosts, three_processors


def wide_conv_chain():
    """A chain of heavy, splittable convolutions with small tensors: splitting pays on 4 devices."""
    n = 6
    g = make_graph(n, [(i, i + 1) for i in range(n - 1)], flops=[4e10] * n, nbytes=[10_000] * (n - 1), role=BATCHED)
    g.targets[:] = ["aten.convolution.default"] * n
    g.meta["batch_axis"] = [0] * n
    g.out_shapes = [[[8, 16, 4, 4]] for _ in range(n)]
    return g


def test_fastt_splits_ops_on_the_critical_path():
    g = wide_conv_chain()
    cl = make_cluster(4)
    costs = AnalyticalCostModel(cl)
    plan = FastT().plan(g, cl, costs)
    assert plan.info["split_ops"] > 0 and plan.origin is not None
    assert plan.info["objective_s"] < plan.info["initial_makespan_s"]
    assert plan.graph.flops.sum() == pytest.approx(g.flops.sum())
    plan.strategy.validate(plan.graph, 4)
    o = plan.strategy.order
    assert (o[plan.graph.src] < o[plan.graph.dst]).all()
    # without splitting it is plain static-priority list scheduling on the input graph
    plain = FastT(split=False).plan(g, cl, costs)
    assert plain.graph is g and plain.origin is None and plain.info["split_ops"] == 0


def test_fastt_priorities_are_static_critical_path_lengths():
    from tests.sched_cases import EDGES, W

    g = make_graph(10, [(a, b) for a, b, _ in EDGES], nbytes=[c for _, _, c in EDGES])
    cl = three_processors()
    costs = TableCosts(cl, W)
    sg, sched = fastt_schedule(g, cl, costs)
    assert sched.makespan > 0
    path = schedule_critical_path(sg, sched, comm_fn(costs))
    assert path[0] == 0 and path[-1] == 9  # the entry and the exit task fix the makespan
    fin, st = sched.finish, sched.start
    assert (fin[g.src] <= st[g.dst] + 1e-9).all()


def test_merge_groups_contract_single_consumer_chains_into_a_dag():
    # 0 -> 1 -> 2 and 0 -> 3; light nodes 1 and 3 merge into their consumers
    g = make_graph(5, [(0, 1), (1, 2), (0, 3), (3, 4), (2, 4)], flops=[1e9, 1e3, 1e9, 1e3, 1e9], nbytes=[10**8] * 5)
    cl = make_cluster(2)
    sg = SchedGraph.from_opgraph(g, cl, AnalyticalCostModel(cl))
    group = merge_groups(sg, 1.0)
    assert group[1] == group[2] and group[3] == group[4] and group[0] != group[1]
    q = sg.quotient(group, cl)
    assert (q.src < q.dst).all()
    assert q.et[0].sum() == pytest.approx(sg.et[0].sum())
    assert merge_groups(sg, 0.0).tolist() == list(range(5))  # ratio 0: nothing (but views) merges


def test_optimistic_cost_table_by_hand():
    # a -> b -> c on two devices of different speed; OCT(exit) = 0
    g = make_graph(3, [(0, 1), (1, 2)], nbytes=[5, 5])
    cl = three_processors()
    costs = TableCosts(cl, np.array([[1, 2, 3], [4, 1, 9], [2, 6, 1]], dtype=float))
    sg = SchedGraph.from_opgraph(g, cl, costs)
    oct_ = optimistic_cost_table(sg)
    assert oct_[2].tolist() == [0, 0, 0]
    # OCT(b, p) = min(w(c, p), min_w w(c, w) + c-bar) = min(w(c, p), 1 + 5)
    assert oct_[1].tolist() == [2.0, 6.0, 1.0]
    # OCT(a, p) = min over w of OCT(b, w) + w(b, w) + 5 [w != p]
    best = np.minimum(oct_[1] + sg.et[:, 1], (oct_[1] + sg.et[:, 1]).min() + 5)
    assert oct_[0].tolist() == best.tolist()


def test_mp_dps_plan_is_valid_and_members_share_their_device():
    rng = np.random.default_rng(5)
    n = 60
    edges = sorted({(int(a), int(b)) for a, b in rng.integers(0, n, (2 * n, 2)) if a < b})
    fl = rng.uniform(1e6, 5e9, n)
    g = make_graph(n, edges, flops=fl.tolist(), nbytes=rng.integers(1e5, 1e7, len(edges)).tolist())
    g.coloc[[3, 17, 40]] = 0
    cl = make_cluster(4)
    costs = AnalyticalCostModel(cl)
    plan = MPDPS().plan(g, cl, costs)
    plan.strategy.validate(g, 4)
    assert plan.graph is g and plan.origin is None
    assert len(set(plan.strategy.device[[3, 17, 40]].tolist())) == 1
    sg = SchedGraph.from_opgraph(g, cl, costs)
    group = merge_groups(sg, 1.0)
    for gid in np.unique(group):
        assert len(set(plan.strategy.device[group == gid].tolist())) == 1
    res = simulate(g, plan.strategy, cl, costs)
    assert res.step_time_s > 0


def test_expanded_starts_respect_edges():
    g = wide_conv_chain()
    cl = make_cluster(2)
    sg = SchedGraph.from_opgraph(g, cl, AnalyticalCostModel(cl))
    group = np.array([0, 0, 1, 1, 1, 2])
    q = sg.quotient(group, cl)
    sched = ready_list_schedule(q, cl, comm_fn(AnalyticalCostModel(cl)), [np.zeros(q.num_nodes)])
    dev, start = expand_group_starts(group, sched, sg.et, sg)
    assert (start[g.src] <= start[g.dst]).all()
    assert len(set(dev[[2, 3, 4]].tolist())) == 1


def test_options_are_checked():
    with pytest.raises(ValueError, match="merge_ratio"):
        MPDPS(merge_ratio=-1)
    with pytest.raises(ValueError, match="max_rounds"):
        FastT(max_rounds=-1)
