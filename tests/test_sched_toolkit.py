"""The scheduling toolkit (algorithms/sched): orders, ready counting, co-location pinning, the
memory rules of the placers, the sequential fill, liveness, replay and the CCR of Eq. 1."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.sched.constraints import (
    BufferLiveness,
    Colocation,
    SequentialFill,
    StaticMemory,
    follow_colocation,
    persistent_memory,
    sequential_fill,
)
from algorithms.sched.engine import ReadyCounter, arrival_row, replay_finish
from algorithms.sched.levels import ccr, graph_ccr, static_costs
from algorithms.sched.orders import bfs_topological_order, cpd_topo, dfs_topo_order, positions
from harness.core.costs import AnalyticalCostModel
from tests.helpers import make_cluster, make_graph

GiB = 2**30


def diamond():
    return make_graph(4, [(0, 1), (0, 2), (1, 3), (2, 3)])


def test_ready_counter_releases_successors_once_all_inputs_are_placed():
    r = ReadyCounter.of(diamond())
    assert r.sources() == [0]
    assert r.release(0) == [1, 2]
    assert r.release(1) == [] and r.release(2) == [3]


def test_orders():
    g = make_graph(5, [(0, 1), (0, 2), (1, 3), (2, 4)])
    assert bfs_topological_order(g).tolist() == [0, 1, 2, 3, 4]
    assert dfs_topo_order(g).tolist() == [0, 1, 3, 2, 4]  # a chain of neighbours stays together
    # CPD-TOPO: the child on the critical path first (node 2's branch is the long one)
    w, c = np.array([1.0, 1.0, 5.0, 1.0, 5.0]), np.zeros(4)
    seq = cpd_topo(g, w, c)
    assert seq.tolist() == [0, 2, 4, 1, 3]
    assert positions(seq)[seq].tolist() == list(range(5))


def test_colocation_pins_a_group_to_its_first_placed_member():
    col = Colocation(np.array([-1, 0, 0, -1, 0]))
    assert col.pinned(1) == -1 and col.place(2, 3) == 3
    assert col.pinned(1) == 3 and col.place(4, 0) == 3 and col.place(0, 1) == 1
    assert col.node_pin.tolist() == [-1, 3, 3, -1, 3]
    g = make_graph(3, [])
    g.coloc[[0, 2]] = 0
    assert follow_colocation(g, np.array([2, 1, 0])).tolist() == [2, 1, 2]


@pytest.mark.parametrize("rule, need_first, free_after", [
    ("whole", 3.0, [7.0, 10.0]),     # the group is reserved and charged when its first member lands
    ("member", 1.0, [7.0, 10.0]),    # every member charged its own, on the group's device
    ("first", 1.0, [9.0, 10.0]),     # only the first member counts (Baechi's m-TOPO)
    ("reserve", 3.0, [7.0, 10.0]),   # room for the group, members charged as placed (m-ETF)
])
def test_group_memory_rules(rule, need_first, free_after):
    mem = StaticMemory(Colocation(np.array([0, 0, 0])), np.array([1.0, 1.0, 1.0]), np.array([10.0, 10.0]), rule)
    assert mem.need(0) == need_first
    for v in range(3):
        assert mem.place(v, 0 if v == 0 else 1) == 0  # later members follow the first
    assert mem.free == free_after


def test_memory_filter_and_best_effort():
    mem = StaticMemory(Colocation(np.array([-1, -1, -1])), np.array([6.0, 6.0, 6.0]), np.array([10.0, 8.0]))
    assert mem.candidates(0) == [0, 1]
    mem.place(0, 0)
    assert mem.candidates(1) == [1]
    mem.place(1, 1)
    assert mem.candidates(2) == [0] and mem.fallbacks == 1  # nothing fits: the most free device


def test_sequential_fill_overflow_rules():
    mem = StaticMemory(Colocation(np.full(4, -1)), np.full(4, 4.0), np.array([5.0, 5.0]), "member")
    fill = SequentialFill(mem)
    assert [mem.place(v, fill.device(4.0)) for v in range(4)] == [0, 1, 0, 1]  # best effort: most free
    assert mem.fallbacks == 2
    mem = StaticMemory(Colocation(np.full(4, -1)), np.full(4, 4.0), np.array([5.0, 5.0]), "member")
    fill = SequentialFill(mem, overflow="last")
    assert [mem.place(v, fill.device(4.0)) for v in range(4)] == [0, 1, 1, 1] and mem.fallbacks == 0


def test_sequential_fill_charges_members_to_their_group():
    g = make_graph(4, [(0, 1), (1, 2), (2, 3)])
    g.coloc[[0, 3]] = 0
    dev, info = sequential_fill(g, np.arange(4), np.full(4, GiB, dtype=np.float64), np.array([2.5 * GiB, 4 * GiB]))
    assert dev.tolist() == [0, 0, 1, 0] and info["fallback_nodes"] == 0
    assert info["static_free_bytes"] == [-0.5 * GiB, 3 * GiB]


def test_parameters_are_owned_by_their_first_reader():
    g = make_graph(3, [(0, 1), (1, 2)])
    g.param_bytes = np.array([100, 7], dtype=np.int64)
    g.param_ptr = np.array([0, 0, 2, 3], dtype=np.int64)
    g.param_idx = np.array([0, 1, 0], dtype=np.int32)
    assert g.param_first_reader().tolist() == [1, 1]
    assert persistent_memory(g).tolist() == [0, 107, 0]


def test_liveness_frees_a_buffer_after_its_last_reader():
    g = make_graph(3, [(0, 1), (0, 2)])
    live = BufferLiveness(g, np.array([5.0, 1.0, 1.0]))
    free, dev = [0.0, 0.0], [0, 1, 1]
    live.placed(0, dev, free)
    live.placed(1, dev, free)
    assert free == [0.0, 1.0]  # node 1's output has no reader; node 0's still has one
    live.placed(2, dev, free)
    assert free == [5.0, 2.0]


def test_arrival_and_replay():
    g = make_graph(3, [(0, 2), (1, 2)])
    pptr, pred, peid = (x.tolist() for x in g.pred_csr())
    assert arrival_row(2, pptr, pred, peid, [1.0, 2.0, 0.0], [0, 1, -1], [10.0, 1.0], 2) == [3.0, 11.0]
    fin = replay_finish(g, np.array([0, 1, 0]), np.arange(3), np.array([1.0, 2.0, 1.0]), np.array([10.0, 1.0]))
    assert fin.tolist() == [1.0, 2.0, 4.0]


def test_ccr_is_celeritas_eq1_on_the_static_costs():
    """CCR = sum of c_ij / sum of w_i (Eq. 1), with the costs the placers plan with."""
    cl = make_cluster(4, lat_us=2.0)
    costs = AnalyticalCostModel(cl)
    g = make_graph(3, [(0, 1), (1, 2)], None, [10_000_000, 0])
    w, c = static_costs(g, cl, costs)
    assert graph_ccr(g, cl, costs) == ccr(w, c) == pytest.approx(c.sum() / w.sum())
    assert c[1] == 0.0 and ccr(w, np.zeros(2)) == 0.0 and ccr(np.zeros(3), c) == 0.0
