"""Metis (pymetis k-way partition) and HRL (grouper + placer trained with REINFORCE)."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.hrl import HRL, Adam, HierarchicalPolicy, op_features
from algorithms.metis_place import Metis, metis_partition
from algorithms.sched.levels import static_costs
from harness.core.costs import AnalyticalCostModel
from simulators.simulate import simulate
from tests.helpers import make_cluster, make_graph


def costs_for(cl):
    return AnalyticalCostModel(cl, efficiency={"gemm": 1.0, "conv": 1.0}, launch_us=0.0)


def two_chains_with_a_light_bridge():
    # chains 0..4 and 5..9 with heavy internal edges, one light edge between them
    edges = [(i, i + 1) for i in range(4)] + [(i, i + 1) for i in range(5, 9)] + [(2, 7)]
    nb = [10**9] * 8 + [10]
    return make_graph(10, edges, nbytes=nb)


def test_metis_cuts_the_light_edge_and_balances():
    g = two_chains_with_a_light_bridge()
    part, cut = metis_partition(g, 2, np.ones(10, dtype=np.int64), np.maximum(1, g.nbytes // 10), ufactor=30, seed=0)
    assert set(part[:5].tolist()) != set(part[5:].tolist())
    assert len(set(part[:5].tolist())) == 1 and len(set(part[5:].tolist())) == 1
    assert cut == 1


def test_metis_plan_is_valid_deterministic_and_follows_colocation(tiny_graph):
    cl = make_cluster(4)
    costs = costs_for(cl)
    plan = Metis(seed=3).plan(tiny_graph, cl, costs)
    plan.strategy.validate(tiny_graph, 4)
    assert Metis(seed=3).plan(tiny_graph, cl, costs).strategy == plan.strategy
    for members in tiny_graph.coloc_groups():
        assert len(set(plan.strategy.device[members].tolist())) == 1
    assert len(plan.info["compute_per_device_s"]) == 4
    assert simulate(tiny_graph, plan.strategy, cl, costs).step_time_s > 0


def test_metis_on_one_device_and_bad_ufactor():
    g = make_graph(3, [(0, 1), (1, 2)])
    cl = make_cluster(1)
    assert Metis().plan(g, cl, costs_for(cl)).strategy.device.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="ufactor"):
        Metis(ufactor=0)


# ---------------------------------------------------------------------------- HRL
def numeric_grad(f, p, key, idx, eps=1e-6):
    old = p[key][idx]
    p[key][idx] = old + eps
    a = f()
    p[key][idx] = old - eps
    b = f()
    p[key][idx] = old
    return (a - b) / (2 * eps)


def test_policy_gradients_match_finite_differences(tiny_graph):
    rng = np.random.default_rng(0)
    cl = make_cluster(4)
    costs = costs_for(cl)
    w, _ = static_costs(tiny_graph, cl, costs)
    X = op_features(tiny_graph, w, costs.memory(tiny_graph).astype(float))
    pol = HierarchicalPolicy(X.shape[1], 6, 4, 5, rng)
    groups, gc = pol.group(X, np.random.default_rng(1))
    emb = rng.standard_normal((4, pol.E))
    acts, pc = pol.place(emb, np.random.default_rng(2))

    def logp():
        h = np.tanh(X @ pol.p["g_w1"] + pol.p["g_b1"])
        z = h @ pol.p["g_w2"] + pol.p["g_b2"]
        lg = (z - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)) - z.max(1, keepdims=True))[np.arange(len(X)), groups].sum()
        hs = np.zeros(pol.H)
        prev = pol.D
        lp = 0.0
        for t in range(len(emb)):
            hs = np.tanh(emb[t] @ pol.p["p_wx"] + pol.p["p_b"] + hs @ pol.p["p_wh"] + pol.p["p_wd"][prev])
            z2 = hs @ pol.p["p_wo"] + pol.p["p_bo"]
            lp += z2[acts[t]] - np.log(np.exp(z2).sum())
            prev = acts[t]
        return lg + lp

    grads = {k: np.zeros_like(v) for k, v in pol.p.items()}
    pol.group_grad(X, gc, 1.0, grads)
    pol.place_grad(pc, 1.0, grads)
    for key, idx in [("g_w1", (0, 1)), ("g_b2", (2,)), ("p_wx", (1, 2)), ("p_wh", (0, 3)), ("p_wd", (4, 1)), ("p_wo", (2, 0))]:
        assert grads[key][idx] == pytest.approx(numeric_grad(logp, pol.p, key, idx), rel=1e-4, abs=1e-7)


def test_adam_descends_a_quadratic():
    p = {"x": np.array([3.0, -2.0])}
    opt = Adam(p, lr=0.1)
    for _ in range(300):
        opt.step(p, {"x": 2 * p["x"]})
    assert np.abs(p["x"]).max() < 0.05


def test_hrl_plan_reports_budget_and_is_deterministic(tiny_graph):
    cl = make_cluster(4)
    costs = costs_for(cl)
    plan = HRL(samples=12, samples_per_step=4, seed=5, environment=simulate).plan(tiny_graph, cl, costs)
    plan.strategy.validate(tiny_graph, 4)
    info = plan.info
    assert info["samples"] == 12 and info["sample_budget"] == 12 and info["search_complete"]
    assert info["wall_time_s"] > 0 and info["num_groups"] == 80
    assert info["best_step_time_s"] <= info["first_step_time_s"]
    res = simulate(tiny_graph, plan.strategy, cl, costs)
    assert res.step_time_s == pytest.approx(info["best_step_time_s"])
    again = HRL(samples=12, samples_per_step=4, seed=5, environment=simulate).plan(tiny_graph, cl, costs)
    assert again.strategy == plan.strategy
    for members in tiny_graph.coloc_groups():
        assert len(set(plan.strategy.device[members].tolist())) == 1


def test_hrl_time_budget_stops_early(tiny_graph):
    cl = make_cluster(4)
    plan = HRL(samples=10_000, time_budget_s=0.5, environment=simulate).plan(tiny_graph, cl, costs_for(cl))
    assert plan.info["samples"] < 10_000 and not plan.info["search_complete"]
    assert plan.info["search_budget_s"] == 0.5


def test_hrl_learns_to_keep_a_communication_bound_chain_together():
    # 20-node chain, huge edges: any split costs seconds, one device costs milliseconds
    g = make_graph(20, [(i, i + 1) for i in range(19)], flops=[1e9] * 20, nbytes=[10**10] * 19)
    cl = make_cluster(2, bw_GBps=10.0, mem_GiB=1000)
    costs = costs_for(cl)
    plan = HRL(samples=200, samples_per_step=8, num_groups=4, lr=0.1, seed=0, environment=simulate).plan(g, cl, costs)
    assert len(set(plan.strategy.device.tolist())) == 1
    assert plan.info["best_step_time_s"] < 0.01


def test_hrl_oom_placements_get_the_failing_signal():
    g = make_graph(4, [(0, 1), (1, 2), (2, 3)], nbytes=[2**33] * 3)
    cl = make_cluster(2, mem_GiB=1)
    plan = HRL(samples=8, environment=simulate).plan(g, cl, costs_for(cl))
    assert plan.info["best_oom"] and plan.info["oom_samples"] == 8


def test_hrl_bad_budget_is_named():
    with pytest.raises(ValueError, match="samples"):
        HRL(samples=0, environment=simulate)


def test_hrl_without_an_environment_says_how_to_give_it_one(tiny_graph):
    from algorithms.hrl import HRLError

    cl = make_cluster(2)
    with pytest.raises(HRLError, match=r"^hrl trains on measured step times .*set algo.environment"):
        HRL(samples=2).plan(tiny_graph, cl, costs_for(cl))
