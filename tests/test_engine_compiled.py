"""The engine's two loops: compiled (simulators/engine_loop.py, large task graphs) and plain
Python (small ones) give the same timeline, busy and link times, critical path and memory
peaks, bit for bit, on random DAGs in every order mode, with receives that preempt, and on
planned zoo strategies (collectives, layer graphs)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.app.compose import compose
from harness.core.costs import AnalyticalCostModel
from harness.core.strategy import Strategy
from harness.app.run import build
from simulators import engine
from simulators.simulate import simulate
from simulators.taskgraph import build_taskgraph
from tests.helpers import make_cluster, random_dags, random_placement, receiving_cluster

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same(tg, num_devices: int, num_links: int, mode: str) -> None:
    got = engine.run(tg, num_devices, num_links, mode, compiled=True)
    want = engine.run(tg, num_devices, num_links, mode, compiled=False)
    for name in ("start", "end", "busy", "peak_mem", "link_busy"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert got.makespan == want.makespan and got.critical_path == want.critical_path


@SETTINGS
@given(random_dags(), st.integers(1, 4), st.integers(0, 2**31 - 1), st.sampled_from(engine.MODES), st.sampled_from(["switch", "mesh", "pcie_tree"]))
def test_random_placements(g, ndev, seed, mode, topo):
    cl = make_cluster(ndev, topology=topo, lat_us=3.0)
    costs = AnalyticalCostModel(cl, launch_us=1.0)
    strat = random_placement(g, ndev, seed)
    assert_same(build_taskgraph(g, strat, cl, costs), ndev, len(cl.links), mode)


@SETTINGS
@given(random_dags(), st.integers(2, 3), st.integers(0, 2**31 - 1), st.sampled_from(engine.MODES), st.floats(0.0, 500.0))
def test_receives_that_preempt(g, ndev, seed, mode, per_message_us):
    cl = receiving_cluster(ndev, per_message_us)
    costs = AnalyticalCostModel(cl, launch_us=1.0)
    strat = random_placement(g, ndev, seed)
    assert_same(build_taskgraph(g, strat, cl, costs), ndev, len(cl.links), mode)


@pytest.mark.parametrize("overrides", [
    ["algo=data_parallel", "model=lenet5", "cluster=p100x8"],
    ["algo=owt", "model=lenet5", "cluster=p100x4", "sim.order=priority"],
    ["algo=heft", "model=lenet5", "cluster=p100x4", "sim.order=ready"],
    ["algo=round_robin", "model=lenet5", "cluster=cpu2", "+cluster.host_comm.recv_when=busy"],
], ids=["collectives", "layer_graph_priority", "ready", "cpu_receives"])
def test_planned_zoo_strategies(overrides):
    """(The zoo's small graphs run the Python loop by default; both are forced here.)"""
    cfg = compose(overrides)
    source, cluster, costs, algo, _ = build(cfg)
    graph = source.op_graph() if algo.graph_kind == "op" else source.layer_graph()
    plan = algo.plan(graph, cluster, costs)
    res = simulate(plan.graph, plan.strategy, cluster, costs, order=str(cfg.sim.order))
    assert_same(res.taskgraph, cluster.num_devices, len(cluster.links), str(cfg.sim.order))


def test_a_deadlock_is_refused_alike():
    from tests.helpers import make_graph

    cl = make_cluster(1)
    tg = simulate(make_graph(2, [(0, 1)]), Strategy.placement([0, 0]), cl, AnalyticalCostModel(cl)).taskgraph
    tg.prio[:] = tg.prio[::-1].copy()  # the reader first: it waits forever
    for compiled in (True, False):
        with pytest.raises(engine.SimulationError, match="2 of 2 tasks not run .first waiting task 0"):
            engine.run(tg, 1, len(cl.links), "strict", compiled=compiled)


def test_use_compiled_is_one_rule_for_every_kernel(monkeypatch):
    """harness.core.compiled.use_compiled: a forced choice wins; else the warm threshold once the
    kernel's module is loaded in this process, the cold one before; one threshold when no cold
    one is given.  The engine's default follows it."""
    import sys

    from harness.core.compiled import kernel_loaded, use_compiled

    name = "harness_test_no_such_kernel"
    assert not kernel_loaded(name)
    assert not use_compiled(500, 100, 1000, kernel=name) and use_compiled(1000, 100, 1000, kernel=name)
    assert use_compiled(10, 100, 1000, kernel=name, forced=True) and not use_compiled(10**9, 100, 1000, kernel=name, forced=False)
    monkeypatch.setitem(sys.modules, name, sys)
    assert kernel_loaded(name) and use_compiled(100, 100, 1000, kernel=name) and not use_compiled(99, 100, 1000, kernel=name)
    assert use_compiled(7, 7) and not use_compiled(6, 7) and not use_compiled(6, 7, kernel=name)
    monkeypatch.delitem(sys.modules, "simulators.engine_loop", raising=False)
    assert not engine._compiled_by_default(engine.COLD_FROM - 1) and engine._compiled_by_default(engine.COLD_FROM)
    monkeypatch.setitem(sys.modules, "simulators.engine_loop", sys)
    assert engine._compiled_by_default(engine.COMPILED_FROM) and not engine._compiled_by_default(engine.COMPILED_FROM - 1)
