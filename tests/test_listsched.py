"""Shared list-scheduling primitives: levels, static costs, insertion timelines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.sched.levels import blevel, static_costs, tlevel
from algorithms.sched.orders import order_from_starts
from algorithms.sched.timeline import Timeline
from harness.core.costs import AnalyticalCostModel
from tests.helpers import make_cluster, make_graph


def test_levels_on_a_diamond():
    g = make_graph(4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    w = np.array([1.0, 5.0, 2.0, 1.0])
    c = np.array([1.0, 3.0, 1.0, 1.0])
    assert tlevel(g, w, c).tolist() == [0.0, 2.0, 4.0, 8.0]
    assert blevel(g, w, c).tolist() == [9.0, 7.0, 4.0, 1.0]
    # tlevel + blevel is the longest path through each node; its max is the critical path
    assert (tlevel(g, w, c) + blevel(g, w, c)).max() == 9.0


def test_static_costs_match_the_cost_model():
    cl = make_cluster(4, lat_us=2.0)
    costs = AnalyticalCostModel(cl)
    g = make_graph(2, [(0, 1)], None, [10_000_000])
    w, c = static_costs(g, cl, costs)
    assert w.tolist() == costs.node_times(g, 0).tolist()
    assert c[0] == pytest.approx(costs.transfer_time(10_000_000, 0, 1))


def test_timeline_insertion_and_append():
    t = Timeline()
    t.insert(0.0, 2.0, 0)
    t.insert(5.0, 1.0, 1)
    assert t.earliest_start(0.0, 3.0) == 2.0  # fits in the gap [2, 5)
    assert t.earliest_start(0.0, 4.0) == 6.0  # does not fit: after the last task
    assert t.earliest_start(0.0, 3.0, insertion=False) == 6.0
    assert t.earliest_start(3.0, 1.0) == 3.0
    t.insert(2.0, 3.0, 2)
    assert t.order() == [0, 2, 1] and t.finish == 6.0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0.01, 10)), max_size=30))
def test_timeline_never_overlaps(reqs):
    t = Timeline()
    for i, (ready, dur) in enumerate(reqs):
        s = t.earliest_start(ready, dur)
        assert s >= ready
        t.insert(s, dur, i)
    assert all(e <= s2 + 1e-9 for e, s2 in zip(t.ends, t.starts[1:]))


def test_order_from_starts_respects_edges_with_zero_length_nodes():
    g = make_graph(3, [(0, 1), (1, 2)])
    order = order_from_starts(np.array([0.0, 0.0, 0.0]), g)
    assert order.tolist() == [0, 1, 2]


def test_zero_length_task_at_a_running_tasks_start_keeps_the_timeline_sorted():
    t = Timeline()
    t.insert(1.0, 4.0, 0)
    t.insert(1.0, 0.0, 1)  # a view starting with the running task
    assert t.ends == sorted(t.ends) and t.starts == sorted(t.starts)
    assert t.earliest_start(0.0, 2.0) == 5.0  # never inside [1, 5)
