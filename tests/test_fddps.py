"""FD-DPS: the dynamic critical path (Fig. 3), exact incremental updates, slots, splitting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from algorithms.fddps import FDDPS
from algorithms.fddps_dcp import DCPScheduler
from algorithms.opsplit import SplitRule, choose_splits, split_graph
from algorithms.sched.schedgraph import SchedGraph, comm_fn, route_tables
from algorithms.sched.timeline import GapIndex, Timeline
from harness.core.cluster import Cluster, Device, DeviceSpec, Link
from harness.core.costs import AnalyticalCostModel
from harness.app.compose import compose
from harness.core.graph import BATCHED, PARTIAL
from harness.app.run import build
from simulators.simulate import simulate
from tests.helpers import make_cluster, make_graph
from tests.fddps_reference import FullRecomputeScheduler, VerifiedScheduler, partial_schedule_levels
from tests.sched_cases import TableCosts, three_processors


# ---------------------------------------------------------------------------- Figure 3
def fig3():
    """o1..o4 of Fig. 3a: E = 5, 20, 10, 8 ms; C12 = 1, C13 = 20, C24 = 1, C34 = 10 ms (two devices)."""
    devs = [Device(i, f"d{i}", DeviceSpec("G", {"float32": 1e12}, 1e12, 2**40), 0) for i in range(2)]
    cl = Cluster("fig3", devs, [Link(0, "0->1", "l", 1.0, 0.0), Link(1, "1->0", "l", 1.0, 0.0)], [[(), (0,)], [(1,), ()]])
    g = make_graph(4, [(0, 1), (0, 2), (1, 3), (2, 3)], nbytes=[1, 20, 1, 10])
    costs = TableCosts(cl, np.array([[5, 5], [20, 20], [10, 10], [8, 8]], dtype=float))
    return g, cl, costs


def test_figure3_critical_paths_53_and_35():
    g, cl, costs = fig3()
    sg = SchedGraph.from_opgraph(g, cl, costs)
    comm = comm_fn(costs)
    # (b) o2 on Device0 after o1, o3 on Device1: critical path o1-o3-o4 of length 53
    est, lst, dcpl, path = partial_schedule_levels(sg, comm, [0, 0, 1, 0], [[0, 1, 3], [2]])
    assert dcpl == pytest.approx(53.0) and path == [0, 2, 3]
    assert (est[path] == lst[path]).all()  # critical nodes: EST == LST (Eq. 8)
    # (c) o3 on Device0 after o1, o2 on Device1: critical path o1-o2-o4 of length 35
    est, lst, dcpl, path = partial_schedule_levels(sg, comm, [0, 1, 0, 0], [[0, 2, 3], [1]])
    assert dcpl == pytest.approx(35.0) and path == [0, 1, 3]
    # before scheduling, with every edge paid, o1-o3-o4 is critical (53)
    assert partial_schedule_levels(sg, comm, [-1] * 4, [[], []])[2] == pytest.approx(53.0)


def test_fddps_schedules_figure3_at_least_as_well_as_3c():
    g, cl, costs = fig3()
    plan = FDDPS(split=False).plan(g, cl, costs)
    assert plan.info["objective_s"] <= 35.0 + 1e-9
    assert plan.strategy.device[1] != plan.strategy.device[2]  # o2 and o3 run in parallel
    plan.strategy.validate(g, 2)


# ---------------------------------------------------------------------------- the earliest start (rules 1 and 3)
@pytest.mark.parametrize("slot", ["lst", "idle"])
def test_a_join_goes_to_the_parent_device_where_it_starts_earliest(slot):
    """Sec. 4.3 (2): among the devices that satisfy Eq. 11 and hold a parent (rule 1), an
    operator without children goes where it "can execute as soon as possible" (rule 3):
    its device-specific EST, the latest arrival of its inputs with the transfer from a parent
    on another device paid (Eq. 6).

    o0 (3 s) and o1 (5 s) feed o2 (5 s) with 2 and 3 bytes over 1 B/s links.  o1 is critical
    (DCPL 13) and takes device 0, o0 device 1 (Eq. 12's look-ahead).  o2 can start at
    max(5, 3 + 2) = 5 on device 0 or at max(3, 5 + 3) = 8 on device 1: the earliest start gives
    a 10 s step, the latest a 13 s one."""
    cl = three_processors()
    g = make_graph(3, [(0, 2), (1, 2)], nbytes=[2, 3])
    costs = TableCosts(cl, np.array([[3.0] * 3, [5.0] * 3, [5.0] * 3]))
    sched = DCPScheduler(SchedGraph.from_opgraph(g, cl, costs), cl, comm_fn(costs), slot_rule=slot)
    dev, start = sched.run()
    assert dev.tolist() == [1, 0, 0] and start.tolist() == [0.0, 0.0, 5.0]
    assert sched.stats["rule_parent"] == 1
    plan = FDDPS(split=False, slot=slot).plan(g, cl, costs)
    assert plan.strategy.device.tolist() == [1, 0, 0] and plan.info["objective_s"] == pytest.approx(10.0)


def test_an_operator_without_parents_or_children_goes_where_it_starts_earliest():
    """Rule (3) with no parent device to prefer: four independent operators of 10, 7, 2 and
    1 s on three identical devices, idle-gap slots (no placed operator moves).  o0 (DCPL 10)
    takes device 0, o1 device 1 (a tie at 0: the lower id); o2 (LST 8) could start at 7 on
    device 1 or at 0 on device 2, o3 (LST 9) at 7 on device 1 or at 2 on device 2.  The latest
    start that Eq. 11 allows would stack both behind o1 (starts 7 and 9)."""
    cl = three_processors()
    g = make_graph(4, [])
    costs = TableCosts(cl, np.array([[10.0] * 3, [7.0] * 3, [2.0] * 3, [1.0] * 3]))
    sched = DCPScheduler(SchedGraph.from_opgraph(g, cl, costs), cl, comm_fn(costs), slot_rule="idle")
    dev, start = sched.run()
    assert dev.tolist() == [0, 1, 2, 2] and start.tolist() == [0.0, 0.0, 0.0, 2.0]
    assert sched.stats["rule_earliest"] == 4


# ---------------------------------------------------------------------------- exactness of the updates
def random_graph(rng: np.random.Generator, n: int, coloc: bool = False):
    edges = sorted({(int(a), int(b)) for a, b in rng.integers(0, n, (2 * n, 2)) if a < b})
    fl = rng.uniform(1e8, 5e9, n)
    fl[rng.random(n) < 0.2] = 0.0
    g = make_graph(n, edges, flops=fl.tolist(), nbytes=rng.integers(100_000, 100_000_000, len(edges)).tolist())
    g.free[:] = fl == 0
    if coloc:
        g.coloc[rng.integers(0, n, 6)] = rng.integers(0, 2, 6)
    return g


@pytest.mark.parametrize("slot", ["lst", "idle"])
@pytest.mark.parametrize("seed", range(6))
def test_incremental_updates_equal_full_recomputation(seed, slot):
    rng = np.random.default_rng(seed)
    g = random_graph(rng, int(rng.integers(20, 90)), coloc=seed % 2 == 0)
    cl = make_cluster(int(rng.integers(2, 5)))
    costs = AnalyticalCostModel(cl)
    sg = SchedGraph.from_opgraph(g, cl, costs)
    # the verified scheduler recomputes EST/LST/DCPL of the whole graph after every step and compares
    inc = VerifiedScheduler(sg, cl, comm_fn(costs), slot_rule=slot)
    dev, start = inc.run()
    full = FullRecomputeScheduler(sg, cl, comm_fn(costs), slot_rule=slot)
    dev2, start2 = full.run()
    assert dev.tolist() == dev2.tolist() and start.tolist() == start2.tolist()
    if slot == "idle":  # the block index of idle gaps gives the linear scan's answers
        lin = DCPScheduler(sg, cl, comm_fn(costs), slot_rule=slot, gap_index=False)
        dev3, start3 = lin.run()
        assert dev.tolist() == dev3.tolist() and start.tolist() == start3.tolist()


def _dcp(sg, cl, costs, slot, horizon, compiled):
    sched = DCPScheduler(sg, cl, comm_fn(costs), slot_rule=slot, horizon=horizon, routes=route_tables(costs), compiled=compiled)
    dev, start = sched.run()
    stats = {k: v for k, v in sched.stats.items() if k != "schedule_compiled"}
    return dev.tolist(), start.tolist(), stats, sched.memory.free, sched.memory.fallbacks, sched.stats["schedule_compiled"]


@pytest.mark.parametrize("horizon", [0, 3])
@pytest.mark.parametrize("slot", ["lst", "idle"])
@pytest.mark.parametrize("seed", range(8))
def test_the_compiled_run_gives_the_python_schedule_bit_for_bit(seed, slot, horizon):
    """algorithms/fddps_dcp_kernel.py against DCPScheduler's Python steps: devices, starts,
    every counter, the memory left and the fall-backs; co-location groups on even seeds, equal
    costs (ties) on seeds 1 mod 4, and devices too small for everything on seeds 2 mod 4 (the
    memory filter and its fall-back)."""
    rng = np.random.default_rng(seed)
    g = random_graph(rng, int(rng.integers(30, 150)), coloc=seed % 2 == 0)
    if seed % 4 == 1:  # equal costs everywhere: ties in every rule's choice
        g.flops[:] = np.where(g.flops > 0, 1e9, 0.0)
        g.nbytes[:] = 1_000_000
    tight = seed % 4 == 2
    if tight:
        g.out_bytes[:] = rng.integers(1, 2**28, g.num_nodes)
    ndev = int(rng.integers(2, 6))
    # tight: all devices together hold less than the graph, so the filter empties and falls back
    cl = make_cluster(ndev, topology="mesh" if seed % 3 else "switch", lat_us=2.0)
    if tight:
        need = float(AnalyticalCostModel(cl).memory(g).sum())
        cl = make_cluster(ndev, topology="mesh" if seed % 3 else "switch", lat_us=2.0, mem_GiB=need / 2**30 / (ndev + 1))
    costs = AnalyticalCostModel(cl)
    sg = SchedGraph.from_opgraph(g, cl, costs)
    py = _dcp(sg, cl, costs, slot, horizon, False)
    cc = _dcp(sg, cl, costs, slot, horizon, True)
    assert not py[5] and cc[5]
    if slot == "idle":  # the Python run finds idle gaps in its block index, which counts no scans
        for stats in (py[2], cc[2]):
            del stats["slot_scans"], stats["horizon_cuts"]
    assert py[:5] == cc[:5]
    assert (py[4] > 0) == tight


def test_the_compiled_run_replays_a_zoo_plan():
    """ResNet-50's split op graph on p100x8: the same plan and objective either way."""
    cfg = compose(["model=resnet50", "model.batch_size=16", "cluster=p100x8"])
    src, cl, costs, _, _ = build(cfg)
    g = src.op_graph(**cfg.graph)
    plans = [FDDPS(compiled=c).plan(g, cl, costs) for c in (False, True)]
    assert [p.info["schedule_compiled"] for p in plans] == [False, True]
    assert plans[0].strategy == plans[1].strategy
    assert plans[0].info["objective_s"] == plans[1].info["objective_s"]


def test_transfers_that_are_not_route_tables_stay_in_python():
    class Odd(AnalyticalCostModel):
        def transfer_time(self, nbytes, src, dst):
            return 0.0 if src == dst else 1e-3

        def transfer_routes(self):
            return None

    cl = make_cluster(2)
    assert route_tables(Odd(cl)) is None and route_tables(AnalyticalCostModel(cl)) is not None
    g = random_graph(np.random.default_rng(0), 40)
    assert FDDPS(split=False).plan(g, cl, Odd(cl)).info["schedule_compiled"] is False
    with pytest.raises(ValueError, match="route tables"):
        FDDPS(split=False, compiled=True).plan(g, cl, Odd(cl))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 10)), max_size=60))
@example([(0.0, 0.0)] * 3 + [(0.0, 1.0)] * 4 + [(0.0, 1.1615212667136899e-249)])  # a 0-length gap fits in float
def test_gap_index_agrees_with_a_timeline(reqs):
    gi, tl = GapIndex(block=2), Timeline()
    for i, (ready, dur) in enumerate(reqs):
        b, j, s = gi.find(ready, dur)
        assert s == tl.earliest_start(ready, dur)
        gi.insert(b, j, i, s, s + dur)
        tl.insert(s, dur, i)
    starts = [x for blk in gi.st for x in blk]
    ends = [x for blk in gi.en for x in blk]
    assert len(gi) == len(reqs) and starts == sorted(starts)
    assert all(e <= s2 for e, s2 in zip(ends, starts[1:]))
    assert tl.ends == sorted(tl.ends)


def test_horizon_is_exact_when_it_covers_the_devices():
    rng = np.random.default_rng(3)
    g = random_graph(rng, 60)
    cl = make_cluster(3)
    costs = AnalyticalCostModel(cl)
    a = FDDPS(split=False).plan(g, cl, costs)
    b = FDDPS(split=False, horizon=1000).plan(g, cl, costs)
    assert a.strategy == b.strategy
    c = FDDPS(split=False, horizon=2).plan(g, cl, costs)
    c.strategy.validate(g, 3)


# ---------------------------------------------------------------------------- schedules
@pytest.mark.parametrize("slot", ["lst", "idle"])
def test_schedule_order_respects_dependencies_and_replays(slot):
    rng = np.random.default_rng(7)
    g = random_graph(rng, 80)
    g.nbytes[:] = rng.integers(1_000, 100_000, g.num_edges)
    cl = make_cluster(4, topology="mesh")
    costs = AnalyticalCostModel(cl, efficiency={"gemm": 1.0}, launch_us=0.0)
    plan = FDDPS(split=False, slot=slot).plan(g, cl, costs)
    plan.strategy.validate(g, 4)
    o = plan.strategy.order
    assert (o[g.src] < o[g.dst]).all()
    # a link per pair and small tensors: the simulator replays the plan's own schedule
    res = simulate(plan.graph, plan.strategy, cl, costs)
    assert res.step_time_s == pytest.approx(plan.info["objective_s"], rel=1e-6)


def test_colocation_and_memory():
    g = make_graph(8, [(0, 1), (1, 2), (0, 3), (3, 4), (4, 5), (2, 6), (5, 7)])
    g.coloc[[1, 4, 7]] = 0
    cl = make_cluster(3)
    plan = FDDPS(split=False).plan(g, cl, AnalyticalCostModel(cl))
    assert len(set(plan.strategy.device[[1, 4, 7]].tolist())) == 1
    g2 = make_graph(6, [(0, i) for i in range(1, 6)])
    g2.out_bytes[:] = 2**30
    small = make_cluster(3, mem_GiB=2.5)
    plan2 = FDDPS(split=False).plan(g2, small, AnalyticalCostModel(small))
    assert np.bincount(plan2.strategy.device, minlength=3).max() <= 2
    assert plan2.info["memory_fallbacks"] == 0


def test_dddps_f_keeps_the_graph():
    g = random_graph(np.random.default_rng(1), 30)
    cl = make_cluster(2)
    plan = FDDPS(name="dddps_f", split=False).plan(g, cl, AnalyticalCostModel(cl))
    assert plan.graph is g and plan.origin is None


def test_options_are_checked():
    with pytest.raises(TypeError, match="update"):
        FDDPS(update="full")  # the full recomputation is a test oracle (tests/fddps_reference.py), not an option
    with pytest.raises(ValueError, match="slot"):
        FDDPS(slot="anywhere")
    with pytest.raises(ValueError, match="horizon"):
        FDDPS(horizon=-1)
    with pytest.raises(ValueError, match="split_dim"):
        FDDPS(split_dim="height")
    with pytest.raises(ValueError, match="compiled"):
        FDDPS(compiled="yes")


# ---------------------------------------------------------------------------- splitting (Sec. 4.1)
def _reaches(g, a: set[int], b: set[int]) -> bool:
    ptr, succ, _ = g.succ_csr()
    seen, stack = set(a), list(a)
    while stack:
        v = stack.pop()
        if v in b:
            return True
        for w in succ[ptr[v]:ptr[v + 1]].tolist():
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return False


def check_split(g, res):
    ng, origin = res.graph, res.origin
    assert len(origin) == ng.num_nodes
    assert ng.flops.sum() == pytest.approx(g.flops.sum(), rel=1e-12)
    assert (ng.src < ng.dst).all()
    members: dict[int, set[int]] = {}
    for i, o in enumerate(origin.tolist()):
        if o >= 0:
            members.setdefault(o, set()).add(i)
    assert set(members) == set(range(g.num_nodes))
    for u, v in zip(g.src.tolist(), g.dst.tolist()):
        assert _reaches(ng, members[u], members[v]), (g.names[u], g.names[v])
    # a parameter's gradient still meets its update in one co-location group
    for p in range(len(ng.param_bytes)):
        gn, un = int(ng.grad_node[p]), int(ng.update_node[p])
        if gn >= 0 and un >= 0 and ng.coloc[un] >= 0:
            assert ng.coloc[gn] == ng.coloc[un]
    assert len(ng.meta["batch_axis"]) == ng.num_nodes


def test_batch_split_of_a_captured_cnn(tiny_graph):
    g = tiny_graph
    times = AnalyticalCostModel(make_cluster(2)).node_times(g, 0)
    dec = choose_splits(g, times, SplitRule(min_time_ms=0.0, max_param_MiB=1e9))
    targets = {g.targets[v] for v in dec}
    assert {"aten.convolution.default", "aten.convolution_backward.default", "aten.addmm.default"} <= targets
    res = split_graph(g, dec)
    check_split(g, res)
    ng = res.graph
    assert res.info["split_ops"] == len(dec) and res.info["aggregate_nodes"] >= 1
    # each split op becomes two halves of half the FLOPs that read the same parameters
    conv = next(v for v in dec if g.targets[v] == "aten.convolution.default")
    halves = np.flatnonzero(res.origin == conv)
    assert len(halves) == 2 and (ng.flops[halves] == g.flops[conv] / 2).all()
    assert ng.params_of(int(halves[0])).tolist() == ng.params_of(int(halves[1])).tolist() == g.params_of(conv).tolist()
    # the conv weight gradient is aggregated, and the aggregate is the new gradient node
    cb = next(v for v in dec if g.targets[v] == "aten.convolution_backward.default")
    p = next(p for p in range(len(g.param_bytes)) if g.coloc[g.grad_node[p]] == g.coloc[cb] and g.coloc[cb] >= 0)
    assert ng.targets[ng.grad_node[p]] == "aten.add.Tensor" and ng.batch_role[ng.grad_node[p]] == PARTIAL
    assert (ng.coloc[np.flatnonzero(res.origin == cb)] == -1).all()


def test_channel_split_needs_a_gather(tiny_graph):
    g = tiny_graph
    conv = next(v for v, t in enumerate(g.targets) if t == "aten.convolution.default")
    res = split_graph(g, {conv: "channel"})
    check_split(g, res)
    assert res.info["gather_nodes"] == 1
    ng = res.graph
    gather = int(np.flatnonzero((res.origin == -1))[0])
    assert ng.targets[gather] == "aten.cat.default" and ng.flops[gather] == 0
    halves = np.flatnonzero(res.origin == conv)
    assert [s[0][1] for s in (ng.out_shapes[h] for h in halves)] == [4, 4]  # 8 output channels in two


def test_consumers_read_the_halves_of_a_batch_split():
    # a chain of batched kernels: splitting the middle one needs no gather
    g = make_graph(3, [(0, 1), (1, 2)], nbytes=[1000, 1000], role=BATCHED)
    g.meta["batch_axis"] = [0, 0, 0]
    g.out_shapes = [[[8, 4]], [[8, 4]], [[8, 4]]]
    res = split_graph(g, {1: "batch"})
    check_split(g, res)
    ng = res.graph
    assert ng.num_nodes == 4 and res.info["gather_nodes"] == 0
    assert sorted(ng.nbytes.tolist()) == [500, 500, 500, 500]


def test_fddps_records_its_splits(tiny_graph):
    cl = make_cluster(4)
    plan = FDDPS(min_time_ms=0.0).plan(tiny_graph, cl, AnalyticalCostModel(cl))
    assert plan.origin is not None and plan.info["split_ops"] > 0
    assert plan.info["split_by_target"] and plan.info["split_names"]
    plan.strategy.validate(plan.graph, 4)
    simulate(plan.graph, plan.strategy, cl, AnalyticalCostModel(cl))
