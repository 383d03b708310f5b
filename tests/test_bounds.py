"""The problem's lower bound (harness.app.bounds): one figure per (graph, cluster, costs),
below the simulated step of every plan of the problem."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from algorithms.baselines import DataParallel, SingleDevice
from harness.app.bounds import problem_bound
from harness.core.costs import AnalyticalCostModel
from simulators.simulate import simulate
from tests.helpers import make_cluster, make_graph, random_dags, random_placement

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def costs_of(cluster, launch_us: float = 5.0) -> AnalyticalCostModel:
    return AnalyticalCostModel(cluster, efficiency={"gemm": 1.0, "conv": 1.0}, launch_us=launch_us)


@SETTINGS
@given(g=random_dags(), seed=st.integers(0, 10_000), ndev=st.integers(1, 4), launch=st.sampled_from([0.0, 5.0]))
def test_no_placement_beats_the_problem_bound(g, seed, ndev, launch):
    cluster = make_cluster(ndev)
    costs = costs_of(cluster, launch)
    bound = problem_bound(g, cluster, costs)["lower_bound_s"]
    for strategy in (random_placement(g, ndev, seed), SingleDevice().plan(g, cluster, costs).strategy,
                     DataParallel().plan(g, cluster, costs).strategy):
        assert simulate(g, strategy, cluster, costs).step_time_s >= bound * (1 - 1e-9) - 1e-15


def test_independent_ops_work_and_span():
    """Four independent equal ops on four devices: the work bound is one op's whole time (a
    split never removes work: k shards pay k launches), the span one op's time at a quarter."""
    cluster = make_cluster(4)
    costs = costs_of(cluster, launch_us=5.0)
    g = make_graph(4, [])
    t1 = costs.node_times(g, 0, 1.0)
    b = problem_bound(g, cluster, costs)
    assert b["bound_work_s"] == pytest.approx(t1.sum() / 4)
    assert b["bound_critical_path_s"] == pytest.approx(costs.node_times(g, 0, 0.25).max())
    assert b["lower_bound_s"] == max(b["bound_work_s"], b["bound_critical_path_s"])


def test_a_chain_on_one_device_is_its_whole_work():
    cluster = make_cluster(1)
    costs = costs_of(cluster)
    g = make_graph(5, [(i, i + 1) for i in range(4)])
    b = problem_bound(g, cluster, costs)
    assert b["lower_bound_s"] == pytest.approx(float(np.sum(costs.node_times(g, 0, 1.0))))
    assert b["bound_critical_path_s"] == pytest.approx(b["bound_work_s"])


def test_an_empty_graph_has_no_bound():
    cluster = make_cluster(2)
    assert problem_bound(make_graph(0, []), cluster, costs_of(cluster))["lower_bound_s"] == 0.0
