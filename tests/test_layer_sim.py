"""Simulation of layer-graph strategies (simulators/layer_taskgraph.py): shard tasks keep each
layer's FLOPs, transfers match the cost tables' bytes, gradients flow back, collectives appear
where configs replicate weights or split reductions, traces and Gantt charts work, and the CLI
runs layer-graph algorithms end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from algorithms.layer_configs import SpaceOptions
from algorithms.layer_tables import build_tables
from harness.core.costs import AnalyticalCostModel
from harness.core.graph import BACKWARD, FORWARD
from harness.core.pase_costs import PaseCostModel
from harness.core.strategy import ParallelConfig, Strategy
from simulators.gantt import plot_gantt
from simulators.layer_taskgraph import build_layer_taskgraph
from simulators.simulate import simulate
from simulators.taskgraph import COLLECTIVE, COMPUTE, TRANSFER
from tests.helpers import make_cluster
from tests.layer_cases import build, chain, random_dag

REPO = Path(__file__).resolve().parents[1]
BIG = dict(B=16, C=64, L=32)


def _flops(tg, lg, phase):
    comp = (tg.kind == COMPUTE) & (tg.phase == phase)
    return np.bincount(tg.node[comp], weights=tg.meta["flops"][comp], minlength=lg.num_nodes)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), n=st.integers(2, 7), space=st.sampled_from(["optcnn", "pase"]), ndev=st.sampled_from([2, 4, 6]))
def test_any_configuration_keeps_every_layers_flops(seed, n, space, ndev):
    """The issue's proof: whatever the configuration, the shards' FLOPs add up to the layer's."""
    cl = make_cluster(2, nodes=2) if ndev == 4 else make_cluster(ndev)  # 4 devices on 2 hosts
    g = random_dag(seed, n, 0.5, **BIG)
    costs = AnalyticalCostModel(cl)
    T = build_tables(g, cl, costs, SpaceOptions(space, "at_most", 1))
    rng = np.random.default_rng(seed)
    idx = np.array([rng.integers(0, c) for c in T.num_configs])
    tg = build_layer_taskgraph(g, T.strategy(idx), cl, costs)
    assert np.allclose(_flops(tg, g, FORWARD), g.flops_fwd, rtol=1e-12)
    assert np.allclose(_flops(tg, g, BACKWARD), g.flops_bwd, rtol=1e-12)
    res = simulate(g, T.strategy(idx), cl, costs)
    assert res.step_time_s >= res.plan_lower_bound_s * (1 - 1e-12) > 0


def test_transfers_match_the_tables_and_gradients_flow_back():
    cl = make_cluster(4, lat_us=1.0)
    costs = AnalyticalCostModel(cl)
    rng = np.random.default_rng(0)
    for seed in range(6):
        g = chain(seed, 6, **BIG)
        T = build_tables(g, cl, costs)
        idx = np.array([rng.integers(0, c) for c in T.num_configs])
        tg = build_layer_taskgraph(g, T.strategy(idx), cl, costs)
        tr = tg.kind == TRANSFER
        fwd_bytes = tg.nbytes[tr & (tg.phase == FORWARD)].sum()
        bwd_bytes = tg.nbytes[tr & (tg.phase == BACKWARD)].sum()
        assert fwd_bytes == pytest.approx(T.moved_bytes(idx), abs=g.num_edges)
        assert bwd_bytes == pytest.approx(fwd_bytes, abs=g.num_edges)


def test_collectives_for_replicated_weights_and_split_reductions():
    cl = make_cluster(4)
    costs = AnalyticalCostModel(cl)
    g = build(["input", "conv1d", "elementwise"], [(0, 1), (1, 2)], **BIG)
    dp = Strategy.uniform_config(3, ParallelConfig.make({"sample": 4}, range(4)))
    tg = build_layer_taskgraph(g, dp, cl, costs)
    coll = np.flatnonzero(tg.kind == COLLECTIVE)
    assert len(coll) == 1 and tg.label[coll[0]] == "sync conv1d1" and tg.nbytes[coll[0]] == g.param_bytes[1]
    mp = Strategy.uniform_config(3, ParallelConfig.make({"channel": 4}, range(4)))
    assert not (build_layer_taskgraph(g, mp, cl, costs).kind == COLLECTIVE).any()
    # a k split (PaSE's space): the two halves of in_channel all-reduce their partial sums
    kc = ParallelConfig.make({"in_channel": 2}, [0, 1])
    one = ParallelConfig.make({}, [0])
    st_ = Strategy(np.full(3, -1), np.arange(3), np.array([1, 0, 1]), [kc, one])
    tg = build_layer_taskgraph(g, st_, cl, costs)
    labels = [tg.label[t] for t in np.flatnonzero(tg.kind == COLLECTIVE)]
    assert "reduce conv1d1" in labels and "sync conv1d1" not in labels
    assert _flops(tg, g, FORWARD)[1] == pytest.approx(g.flops_fwd[1])


def test_single_device_keeps_activations_until_backward():
    cl = make_cluster(2)
    costs = AnalyticalCostModel(cl)
    g = chain(1, 6, **BIG)
    one = Strategy.uniform_config(g.num_nodes, ParallelConfig.make({}, [0]))
    res = simulate(g, one, cl, costs)
    assert res.comm_bytes == 0 and res.device_busy_s[1] == 0
    acts = sum(int(g.out_bytes[v]) for v in range(g.num_nodes) if g.kinds[v] not in ("input", "view"))
    assert res.peak_memory_bytes[0] >= acts
    assert res.step_time_s == pytest.approx(res.device_busy_s[0])


def test_pase_strategies_simulate_with_the_roofline(tmp_path):
    cl = make_cluster(4)
    costs = PaseCostModel(cl, cutoff=1)
    g = random_dag(8, 7, 0.6, **BIG)
    from algorithms.pase import PaSE

    plan = PaSE().plan(g, cl, costs)
    res = simulate(g, plan.strategy, cl, costs)
    assert res.step_time_s > 0
    res.write_trace(tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    cats = {e.get("cat") for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"forward", "backward"} <= cats
    plot_gantt(res, tmp_path / "gantt.png")
    assert (tmp_path / "gantt.png").stat().st_size > 1000


def _harness(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_cli_data_parallel_on_the_layer_graph_under_pase_costs(tmp_path):
    """``algo=data_parallel algo.graph=layer`` end to end, with PaSE's cost model for its objective."""
    r = _harness("algo=data_parallel", "algo.graph=layer", "costs=pase", "model=lenet5", "cluster=p100x4",
                 f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads((tmp_path / "result.json").read_text())
    assert row["graph_nodes"] < 50 and row["objective_s"] > 0 and row["search_complete"] is True
    assert row["algo_params"]["graph"] == "layer" and row["algo_info"]["objective_flops"] > 0
    assert row["step_time_s"] > 0 and (tmp_path / "gantt.png").exists() and (tmp_path / "trace.json").exists()
