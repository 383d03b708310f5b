"""The discrete-event simulator: unit cases and invariants on random DAGs (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.core.costs import AnalyticalCostModel
from harness.core.graph import BATCHED, PARTIAL, REPLICATED, UPDATE, OpGraph
from harness.core.strategy import ParallelConfig, Strategy, StrategyError
from simulators import engine
from simulators.simulate import simulate
from simulators.shards import make_shards
from simulators.taskgraph import COLLECTIVE, COMPUTE, TRANSFER
from tests.helpers import make_cluster, make_graph, random_dags, random_placement, random_topo_order, receiving_cluster
from tests.taskgraph_reference import make_shards_loop

EPS = 1e-12


def check_invariants(res) -> None:
    """No overlap on a device or a link, every dependency respected, step >= lower bound."""
    tg, tl = res.taskgraph, res.timeline
    start, end = tl.start, tl.end
    comp = np.flatnonzero(tg.kind == COMPUTE)
    for d in np.unique(tg.dev[comp]):
        s = comp[tg.dev[comp] == d]
        o = s[np.argsort(start[s], kind="stable")]
        assert np.all(start[o][1:] >= end[o][:-1] - EPS), f"two compute tasks overlap on device {d}"
    owner = np.repeat(np.arange(tg.num_tasks), np.diff(tg.res_ptr))
    for l in np.unique(tg.res_idx):
        s = owner[tg.res_idx == l]
        o = s[np.argsort(start[s], kind="stable")]
        assert np.all(start[o][1:] >= end[o][:-1] - EPS), f"two transfers overlap on link {l}"
    src = np.repeat(np.arange(tg.num_tasks), np.diff(tg.succ_ptr))
    assert np.all(start[tg.succ_idx] >= end[src] - EPS), "a task started before its input finished"
    assert np.allclose(end - start, tg.dur)
    assert res.step_time_s >= res.plan_lower_bound_s * (1 - 1e-9) - EPS
    assert res.step_time_s == pytest.approx(end.max() if len(end) else 0.0)


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(random_dags(), st.integers(1, 4), st.integers(0, 2**31 - 1), st.sampled_from(engine.MODES), st.sampled_from(["switch", "mesh", "pcie_tree"]))
def test_invariants_random_placements(g, ndev, seed, mode, topo):
    cl = make_cluster(ndev, topology=topo, lat_us=3.0)
    costs = AnalyticalCostModel(cl, launch_us=1.0)
    strat = random_placement(g, ndev, seed)
    res = simulate(g, strat, cl, costs, order=mode)
    check_invariants(res)
    again = simulate(g, strat, cl, costs, order=mode)
    assert np.array_equal(res.timeline.start, again.timeline.start)
    assert np.array_equal(res.timeline.end, again.timeline.end)
    assert res.peak_memory_bytes == again.peak_memory_bytes
    assert res.comm_bytes == again.comm_bytes


@SETTINGS
@given(random_dags(), st.integers(2, 3), st.integers(0, 2**31 - 1), st.sampled_from(engine.MODES), st.floats(0.0, 500.0))
def test_invariants_with_receives_that_preempt(g, ndev, seed, mode, per_message_us):
    """host_comm.recv_when: busy - receives lengthen the op their device runs when they arrive:
    still no overlap, every dependency kept, each compute task at least its duration, the
    devices' busy time is what their tasks took, and the same input gives the same timeline
    (the host-cost model's own cases: tests/test_hostcost.py)."""
    cl = receiving_cluster(ndev, per_message_us)
    costs = AnalyticalCostModel(cl, launch_us=1.0)
    strat = random_placement(g, ndev, seed)
    res = simulate(g, strat, cl, costs, order=mode)
    tg, tl = res.taskgraph, res.timeline
    comp = np.flatnonzero(tg.kind == COMPUTE)
    for d in range(ndev):
        s = comp[tg.dev[comp] == d]
        o = s[np.argsort(tl.start[s], kind="stable")]
        assert np.all(tl.start[o][1:] >= tl.end[o][:-1] - EPS)
        assert res.device_busy_s[d] == pytest.approx(float((tl.end[s] - tl.start[s]).sum()), abs=1e-12)
    src = np.repeat(np.arange(tg.num_tasks), np.diff(tg.succ_ptr))
    assert np.all(tl.start[tg.succ_idx] >= tl.end[src] - EPS)
    assert np.all(tl.end - tl.start >= tg.dur - EPS)
    other = np.flatnonzero(tg.kind != COMPUTE)
    assert np.allclose((tl.end - tl.start)[other], tg.dur[other])  # only compute tasks are lengthened
    assert res.step_time_s >= res.plan_lower_bound_s * (1 - 1e-9) - EPS
    again = simulate(g, strat, cl, costs, order=mode)
    assert np.array_equal(tl.end, again.timeline.end)


SHARD_FIELDS = ("node", "dev", "dur", "prio", "forward", "mem", "is_coll", "coll_devices", "e_src", "e_dst", "e_bytes",
                "e_data", "r_shard", "r_param", "home")


def assert_same_shards(g, strat, cl, costs) -> None:
    """simulators.shards (arrays) against tests/taskgraph_reference.py (the loop), field by field."""
    got, want = make_shards(g, strat, cl, costs), make_shards_loop(g, strat, cl, costs)
    for name in SHARD_FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, dict):
            assert a == b, name
        else:
            assert a.dtype == b.dtype and np.array_equal(a, b), name


def mixed_strategy(g, ndev: int, seed: int) -> Strategy:
    """Some nodes placed, the others on sample configs: all devices in a random order, the same
    reversed (same degree, other devices per shard), the first half of them (consumers off
    the producer's devices), and the first tuple again as a config of its own (a partial read
    by its own replica)."""
    rng = np.random.default_rng(seed)
    perm = tuple(rng.permutation(ndev).tolist())
    tuples = [perm, perm[::-1], perm[: max(1, ndev // 2)], perm]
    configs = [ParallelConfig.make({"sample": len(t)}, t) for t in tuples]
    cid = np.where(rng.random(g.num_nodes) < 0.25, -1, rng.integers(0, len(configs), g.num_nodes))
    dev = np.where(cid < 0, rng.integers(0, ndev, g.num_nodes), -1)
    return Strategy(dev, random_topo_order(g, seed), cid, configs)


@SETTINGS
@given(random_dags(25), st.integers(2, 4), st.integers(0, 2**31 - 1))
def test_shards_on_arrays_equal_the_loop(g, ndev, seed):
    """Every role on both ends of an edge, uneven splits (overlapping batch parts), replicas
    read locally, all-reduces, placed nodes among split ones."""
    rng = np.random.default_rng(seed)
    g.batch_role[:] = rng.choice([BATCHED, PARTIAL, REPLICATED], g.num_nodes)
    g.free[:] = rng.random(g.num_nodes) < 0.2
    g.out_bytes[:] = rng.integers(0, 10**7, g.num_nodes)
    cl = make_cluster(ndev, lat_us=1.0)
    assert_same_shards(g, mixed_strategy(g, ndev, seed), cl, AnalyticalCostModel(cl))


@pytest.mark.parametrize("how", ["data_parallel", "mixed", "placement"])
def test_shards_on_arrays_equal_the_loop_on_a_captured_graph(tiny_graph, how):
    """A captured training step: parameters, their home devices and reads, batch-norm's partial
    statistics, the optimizer's updates."""
    g = tiny_graph
    cl = make_cluster(4)
    if how == "data_parallel":
        strat = Strategy.uniform_config(g.num_nodes, ParallelConfig.make({"sample": 4}, range(4)))
    elif how == "mixed":
        strat = mixed_strategy(g, 4, 3)
    else:
        strat = random_placement(g, 4, 3)
    assert_same_shards(g, strat, cl, AnalyticalCostModel(cl))


def test_a_config_split_along_another_dim_is_named():
    g = make_graph(3, [(0, 1), (1, 2)])
    strat = Strategy(np.array([0, -1, -1]), np.arange(3), np.array([-1, 1, 0]),
                     [ParallelConfig.make({"sample": 2}, [0, 1]), ParallelConfig.make({"channel": 2}, [0, 1])])
    with pytest.raises(StrategyError, match=r"node 1 \(v1\) is split along \['channel'\]"):
        make_shards(g, strat, make_cluster(2), AnalyticalCostModel(make_cluster(2)))


@SETTINGS
@given(random_dags(15), st.integers(1, 4), st.integers(1, 2))
def test_invariants_two_nodes_and_sample_configs(g, gpus, nodes):
    """Multi-host routes (through NICs) and data-parallel expansion keep the invariants."""
    cl = make_cluster(gpus, nodes=nodes, lat_us=2.0)
    costs = AnalyticalCostModel(cl)
    k = cl.num_devices
    strat = Strategy.uniform_config(g.num_nodes, ParallelConfig.make({"sample": k}, range(k)))
    res = simulate(g, strat, cl, costs)
    check_invariants(res)
    # every batched op is split k ways: total compute is the same work, k launches each
    assert res.num_tasks["compute"] == k * g.num_nodes


@SETTINGS
@given(st.integers(1, 40), st.lists(st.floats(0.0, 1e10), min_size=40, max_size=40), st.integers(0, 3))
def test_chain_on_one_device_is_sum_of_op_times(n, flops, dev):
    g = make_graph(n, [(i, i + 1) for i in range(n - 1)], flops[:n])
    cl = make_cluster(4)
    costs = AnalyticalCostModel(cl, launch_us=2.0)
    res = simulate(g, Strategy.placement(np.full(n, dev)), cl, costs)
    assert res.step_time_s == pytest.approx(costs.node_times(g, dev).sum(), rel=1e-12)
    assert res.comm_bytes == 0
    assert res.device_busy_s[dev] == pytest.approx(res.step_time_s)


def test_transfer_time_is_alpha_beta(cluster4, costs4):
    g = make_graph(2, [(0, 1)], [1e9, 1e9], [10_000_000])
    res = simulate(g, Strategy.placement([0, 1]), cluster4, costs4)
    t = 1e9 / 10e12
    assert res.step_time_s == pytest.approx(2 * t + 10_000_000 / 10e9)
    assert res.num_tasks["transfer"] == 1
    assert res.bytes_by_class == {"nvlink": 10_000_000}


def test_measured_collective_replaces_the_links_in_the_ring_formula():
    from harness.core.cluster import build_cluster
    from tests.helpers import DEVICE

    intra = {"topology": "mesh", "cls": "loopback", "bw_GBps": 1.0, "lat_us": 100.0}
    plain = AnalyticalCostModel(build_cluster("cpu", DEVICE, gpus=4, intra=intra))
    meas = AnalyticalCostModel(build_cluster("cpu", DEVICE, gpus=4, intra=intra, collective={"lat_us": 500.0, "bw_GBps": 4.0}))
    assert plain.allreduce_time(8e6, [0, 1, 2, 3]) == pytest.approx(2 * 3 / 4 * 8e6 / 1e9 + 6 * 100e-6)
    assert meas.allreduce_time(8e6, [0, 1, 2, 3]) == pytest.approx(2 * 3 / 4 * 8e6 / 4e9 + 6 * 500e-6)
    assert meas.transfer_time(8e6, 0, 1) == plain.transfer_time(8e6, 0, 1)


def test_transfers_sharing_a_link_contend(cluster4, costs4):
    # 0 -> 1 and 0 -> 2 both leave device 0 through its one switch port: they serialise
    g = make_graph(3, [(0, 1), (0, 2)], [0.0, 0.0, 0.0], [10_000_000, 10_000_000])
    res = simulate(g, Strategy.placement([0, 1, 2]), cluster4, costs4)
    assert res.step_time_s == pytest.approx(2 * 10_000_000 / 10e9)
    # on a mesh every pair has its own link: they overlap
    mesh = make_cluster(4, topology="mesh")
    res2 = simulate(g, Strategy.placement([0, 1, 2]), mesh, AnalyticalCostModel(mesh, launch_us=0.0))
    assert res2.step_time_s == pytest.approx(10_000_000 / 10e9)


def test_transfer_cached_per_destination(cluster4, costs4):
    # one tensor read by two consumers on device 1 crosses once
    g = make_graph(3, [(0, 1), (0, 2)], None, [4_000_000, 4_000_000])
    res = simulate(g, Strategy.placement([0, 1, 1]), cluster4, costs4)
    assert res.num_tasks["transfer"] == 1
    assert res.comm_bytes == 4_000_000


def test_strict_order_is_followed_on_a_device(cluster4, costs4):
    # two independent nodes on one device: the lower order runs first even if it is node 1
    g = make_graph(2, [], [1e9, 2e9])
    res = simulate(g, Strategy.placement([0, 0], [1, 0]), cluster4, costs4)
    assert res.timeline.start[1] == 0.0
    assert res.timeline.start[0] == pytest.approx(res.timeline.end[1])


def test_lower_bound_is_max_of_critical_path_and_work(cluster4, costs4):
    g = make_graph(4, [(0, 1)], [4e9, 4e9, 1e9, 1e9])
    res = simulate(g, Strategy.placement([0, 0, 0, 0]), cluster4, costs4)
    t = costs4.node_times(g, 0)
    assert res.plan_critical_path_s == pytest.approx(t[0] + t[1])
    assert res.plan_work_bound_s == pytest.approx(t.sum() / 4)
    assert res.plan_lower_bound_s == pytest.approx(max(t[0] + t[1], t.sum() / 4))


def _dp_graph() -> OpGraph:
    """x -> fwd (batched) -> wgrad (partial) -> update (replicated); fwd reads parameter 0."""
    g = make_graph(3, [(0, 1), (1, 2)], [8e9, 8e9, 1e6], [64_000_000, 40_000_000])
    g.batch_role[:] = [BATCHED, PARTIAL, REPLICATED]
    g.phase[2] = UPDATE
    g.out_bytes[:] = [64_000_000, 40_000_000, 40_000_000]
    g.param_bytes = np.array([40_000_000])
    g.param_ptr = np.array([0, 1, 1, 2])
    g.param_idx = np.array([0, 0], np.int32)
    g.update_node = np.array([2], np.int32)
    g.grad_node = np.array([1], np.int32)
    return g


def test_data_parallel_inserts_one_allreduce(cluster4, costs4):
    g = _dp_graph()
    strat = Strategy.uniform_config(3, ParallelConfig.make({"sample": 4}, range(4)))
    res = simulate(g, strat, cluster4, costs4)
    tg = res.taskgraph
    assert res.num_tasks == {"compute": 12, "transfer": 0, "collective": 1}
    coll = int(np.flatnonzero(tg.kind == COLLECTIVE)[0])
    assert tg.dur[coll] == pytest.approx(costs4.allreduce_time(40_000_000, [0, 1, 2, 3]))
    # ring all-reduce puts 2(p-1) x bytes on the wire in total
    assert res.comm_bytes == 2 * 3 * 40_000_000
    # batched and partial shards do a quarter of the work, the update runs whole on every replica
    comp = np.flatnonzero(tg.kind == COMPUTE)
    t_full = costs4.node_times(g, 0)
    np.testing.assert_allclose(np.sort(tg.dur[comp]), np.sort(np.r_[[t_full[0] / 4] * 4, [t_full[1] / 4] * 4, [t_full[2]] * 4]))
    # every replica holds the parameter for the whole step
    assert all(p >= 40_000_000 for p in res.peak_memory_bytes)


def test_parameter_read_on_another_device_is_transferred(cluster4, costs4):
    g = _dp_graph()
    # forward on device 1, gradient and update on device 0 (the parameter's home)
    res = simulate(g, Strategy.placement([1, 0, 0]), cluster4, costs4)
    tg = res.taskgraph
    p_tr = np.flatnonzero((tg.kind == TRANSFER) & (tg.param >= 0))
    assert len(p_tr) == 1 and tg.nbytes[p_tr[0]] == 40_000_000 and tg.dst[p_tr[0]] == 1
    check_invariants(res)


def test_memory_follows_liveness(cluster4, costs4):
    # a -> b -> c on one device: a's output dies when b finishes, so peak is two outputs
    g = make_graph(3, [(0, 1), (1, 2)], None, [100, 100])
    g.out_bytes[:] = [1000, 2000, 4000]
    res = simulate(g, Strategy.placement([0, 0, 0]), cluster4, costs4)
    assert res.peak_memory_bytes[0] == 2000 + 4000
    # a view (free node) keeps its base alive until the view's reader is done
    g2 = make_graph(4, [(0, 1), (1, 3), (2, 3)], None, [100, 100, 100])
    g2.out_bytes[:] = [1000, 1000, 5000, 10]
    g2.free[1] = True
    res2 = simulate(g2, Strategy.placement([0, 0, 0, 0]), cluster4, costs4)
    assert res2.peak_memory_bytes[0] == 1000 + 5000 + 10


def brute_force_peak(res) -> list[int]:
    """Largest live set per device at any allocation instant, buffer by buffer in plain Python.

    A buffer lives from its allocation (a compute task's start; a transfer's queueing, i.e.
    its last predecessor's end) up to, not including, the end of its last reader."""
    tg, tl = res.taskgraph, res.timeline
    T = tg.num_tasks
    preds: list[list[int]] = [[] for _ in range(T)]
    readers: list[list[int]] = [[] for _ in range(T)]
    for t in range(T):
        for s in tg.succ_idx[tg.succ_ptr[t]:tg.succ_ptr[t + 1]]:
            preds[s].append(t)
        for b in tg.use_idx[tg.use_ptr[t]:tg.use_ptr[t + 1]]:
            readers[b].append(t)
    live = []
    for b in range(T):
        if tg.alloc_dev[b] < 0 or tg.alloc_bytes[b] == 0:
            continue
        born = tl.start[b] if tg.kind[b] == COMPUTE else max((tl.end[p] for p in preds[b]), default=0.0)
        dies = max([tl.end[b]] + [tl.end[r] for r in readers[b]])
        live.append((int(tg.alloc_dev[b]), born, dies, int(tg.alloc_bytes[b])))
    peak = [int(x) for x in tg.static_mem]
    for d, x, _, _ in live:
        now = int(tg.static_mem[d]) + sum(nb for dd, born, dies, nb in live if dd == d and born <= x < dies)
        peak[d] = max(peak[d], now)
    return peak


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=random_dags(12), seed=st.integers(0, 2**16), order=st.sampled_from(engine.MODES))
def test_peak_memory_is_the_largest_live_set(g, seed, order):
    rng = np.random.default_rng(seed)
    g.out_bytes[:] = rng.integers(0, 5_000_000, g.num_nodes)
    g.free[:] = rng.random(g.num_nodes) < 0.2
    cl = make_cluster(3)
    res = simulate(g, Strategy.placement(rng.integers(0, 3, g.num_nodes)), cl, AnalyticalCostModel(cl), order)
    assert res.peak_memory_bytes == brute_force_peak(res)


def test_an_order_that_deadlocks_names_a_waiting_task(cluster4, costs4):
    # the engine's own guard: a device told to run b before a, where b reads a
    g = make_graph(2, [(0, 1)])
    tg = simulate(g, Strategy.placement([0, 0]), cluster4, costs4).taskgraph
    tg.prio[:] = tg.prio[::-1].copy()
    with pytest.raises(engine.SimulationError, match="2 of 2 tasks not run .first waiting task 0.*deadlocks"):
        engine.run(tg, 4, len(cluster4.links), "strict")


def test_oom_is_a_flag_not_a_crash():
    cl = make_cluster(2, mem_GiB=0.001)
    g = make_graph(2, [(0, 1)], None, [10])
    g.out_bytes[:] = [2**21, 2**21]
    res = simulate(g, Strategy.placement([0, 0]), cl, AnalyticalCostModel(cl))
    assert res.oom and res.oom_devices == [0]


def test_invalid_strategy_is_refused_with_the_culprit(cluster4, costs4):
    g = make_graph(3, [(0, 1), (1, 2)])
    with pytest.raises(StrategyError, match=r"node 2 \(v2\) is placed on device 7"):
        simulate(g, Strategy.placement([0, 1, 7]), cluster4, costs4)
    with pytest.raises(StrategyError, match="v2 .* no later than its input v1"):
        simulate(g, Strategy.placement([0, 0, 0], [0, 2, 1]), cluster4, costs4)


def test_non_sample_config_on_op_graph_is_refused(cluster4, costs4):
    g = make_graph(2, [(0, 1)])
    strat = Strategy.uniform_config(2, ParallelConfig.make({"sample": 2, "channel": 2}, range(4)))
    with pytest.raises(StrategyError, match="split along \\['channel'\\]"):
        simulate(g, strat, cluster4, costs4)


def test_chrome_trace_has_one_event_per_compute_task(cluster4, costs4):
    g = make_graph(3, [(0, 1), (1, 2)])
    res = simulate(g, Strategy.placement([0, 1, 1]), cluster4, costs4)
    tr = res.chrome_trace()
    x = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    assert sum(e["pid"] == 0 for e in x) == 3
    assert sum(e["pid"] == 1 for e in x) == 2  # one transfer over two switch links
    assert all(e["dur"] >= 0 for e in x)


def test_partial_read_by_its_own_replica_is_not_reduced(cluster4, costs4):
    """Batch-norm statistics (partial) feeding the batched backward stay per replica, as in DDP."""
    g = make_graph(3, [(0, 1), (1, 2), (0, 2)], [1e9, 1e6, 1e9], [4_000_000, 4_000, 4_000_000])
    g.batch_role[:] = [BATCHED, PARTIAL, BATCHED]
    strat = Strategy.uniform_config(3, ParallelConfig.make({"sample": 4}, range(4)))
    res = simulate(g, strat, cluster4, costs4)
    assert res.num_tasks["collective"] == 0 and res.comm_bytes == 0
