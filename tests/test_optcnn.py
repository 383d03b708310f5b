"""OptCNN (Jia et al. 2018): configuration spaces, Eq. 1 cost tables, Algorithm 1 (node and
edge elimination) and its DFS baseline, the fixed DP / MP / OWT strategies, and the proofs
the issue asks for: the optimum equals PaSE's and brute force's, chains and series-parallel
graphs reduce to K <= 2."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from algorithms.baselines import DataParallel
from algorithms.layer_configs import ConfigSpaceError, SpaceOptions, enumerate_configs
from algorithms.layer_costs import evaluate, resolve_options
from algorithms.layer_fixed import OWT, ModelParallel, model_parallel_dims, owt_dims
from algorithms.layer_tables import brute_force, build_tables
from algorithms.optcnn import OptCNN, OptCNNDFS, best_middle, branch_and_bound, node_eliminate
from algorithms.pase import vertex_elimination
from harness.core.costs import AnalyticalCostModel
from harness.core.strategy import ParallelConfig, Strategy, StrategyError
from tests.helpers import make_cluster
from tests.layer_cases import build, chain, random_dag, series_parallel, small_dags

BIG = dict(B=32, C=256, L=64)  # sizes at which splitting pays off on the test cluster


@pytest.fixture(scope="module")
def cl4():
    return make_cluster(4, lat_us=2.0, bw_GBps=50)


@pytest.fixture(scope="module")
def costs4(cl4):
    return AnalyticalCostModel(cl4)


# ---------------------------------------------------------------------- configuration spaces
def test_optcnn_space_is_table1_degrees_dividing_the_device_count():
    g = chain(0, 3, B=8, C=2, L=16)
    dims, deg = enumerate_configs(g, 1, 4, SpaceOptions("optcnn", "divides"))
    assert dims == ("sample", "channel", "length")
    assert (4 % deg.prod(axis=1) == 0).all()
    assert (deg[:, 1] <= 2).all()  # channel has size 2
    assert tuple(deg[0]) == (1, 1, 1)
    assert {tuple(r) for r in deg} >= {(4, 1, 1), (1, 1, 4), (2, 2, 1), (2, 1, 2), (1, 2, 2)}
    _, deg8 = enumerate_configs(g, 1, 6, SpaceOptions("optcnn", "at_most"))
    assert (deg8.prod(axis=1) <= 6).all() and any(r.prod() == 5 for r in deg8)
    # an input has exactly one configuration: the loader writes each shard's input
    assert enumerate_configs(g, 0, 4, SpaceOptions())[1].shape == (1, 0)


def test_resolve_options_follows_the_cost_model(cl4, costs4):
    from harness.core.pase_costs import PaseCostModel

    g = chain(0, 3)
    assert resolve_options(g, costs4) == SpaceOptions("optcnn", "divides", 1, "linear")
    p = resolve_options(g, PaseCostModel(cl4))
    assert (p.space, p.product, p.cutoff) == ("pase", "at_most", 4)  # a graph with convolutions: a CNN
    with pytest.raises(ValueError, match="space"):
        SpaceOptions("nope")


def test_the_cost_model_is_chosen_by_its_class(cl4, costs4):
    """PaSE's t_V / t_E for a PaseCostModel, OptCNN's t_C / t_S / t_R / t_X for any other."""
    from algorithms.layer_costs import layer_cost_model
    from algorithms.layer_optcnn_costs import OptCNNLayerCosts
    from algorithms.layer_pase_costs import PaseLayerCosts
    from harness.core.pase_costs import PaseCostModel

    g = chain(0, 3)
    assert isinstance(layer_cost_model(g, cl4, costs4), OptCNNLayerCosts)
    assert isinstance(layer_cost_model(g, cl4, PaseCostModel(cl4)), PaseLayerCosts)
    assert build_tables(g, cl4, costs4).model == "analytical"
    T = build_tables(g, cl4, PaseCostModel(cl4))
    assert T.model == "pase" and set(T.parts) == {"t_V"} and {"peak_flops", "r"} <= set(T.meta)


#: result.json's ``algo_params`` of the registered layer-graph algorithms (conf/algo), as before
#: their parameters were made explicit
LAYER_ALGO_PARAMS = {
    "optcnn": {"name": "optcnn", "seed": 0, "space": None, "product": None, "cutoff": None, "mapping": "linear",
               "enum_limit": 10000000, "budget_s": 60, "eliminate_leaves": False},
    "optcnn_dfs": {"name": "optcnn_dfs", "seed": 0, "space": None, "product": None, "cutoff": None, "mapping": "linear",
                   "budget_s": 60},
    "pase": {"name": "pase", "seed": 0, "space": None, "product": None, "cutoff": None, "mapping": "linear",
             "max_entries": 268435456, "block_entries": 8388608, "dtype": "float64", "budget_s": 60},
    "owt": {"name": "owt", "seed": 0, "devices": None, "mapping": "linear"},
    "model_parallel": {"name": "model_parallel", "seed": 0, "devices": None, "mapping": "linear"},
}


@pytest.mark.parametrize("algo", sorted(LAYER_ALGO_PARAMS))
def test_layer_algorithms_have_explicit_parameters(algo):
    """conf/algo/<algo>.yaml instantiates with the harness's seed; describe() is the same dict
    (and the same JSON) as before; no catch-all parameters; graph_kind is "layer"."""
    import inspect
    import json
    from pathlib import Path

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "algo" / f"{algo}.yaml")
    a = instantiate(cfg, seed=0, _convert_="all")
    assert a.graph_kind == "layer"
    assert json.dumps(a.describe()) == json.dumps(LAYER_ALGO_PARAMS[algo])
    from algorithms.base import Algorithm

    for cls in type(a).__mro__[:type(a).__mro__.index(Algorithm)]:
        if "__init__" in vars(cls):
            kinds = {p.kind for p in inspect.signature(cls.__init__).parameters.values()}
            assert inspect.Parameter.VAR_KEYWORD not in kinds, cls.__name__
            assert inspect.Parameter.VAR_POSITIONAL not in kinds, cls.__name__


def test_tables_match_the_explicit_evaluation(cl4, costs4):
    """The node/edge tables and evaluate() of the strategy they encode give the same Eq. 1."""
    rng = np.random.default_rng(0)
    for seed in range(4):
        g = random_dag(seed, 6, 0.7, **BIG)
        T = build_tables(g, cl4, costs4)
        for _ in range(5):
            idx = np.array([rng.integers(0, c) for c in T.num_configs])
            ev = evaluate(g, T.strategy(idx), cl4, costs4)
            assert ev["objective_s"] == pytest.approx(T.objective(idx), rel=1e-12)
            assert ev["moved_bytes"] == pytest.approx(T.moved_bytes(idx))
            assert (T.index_of(T.strategy(idx))[1:] == idx[1:]).all()


def test_t_x_counts_halos_and_only_the_non_resident_part(cl4, costs4):
    # input -> conv1d(k=3) -> conv1d(k=3): split along length, each shard misses one halo row per side
    g = build(["input", "conv1d", "conv1d"], [(0, 1), (1, 2)], B=2, C=4, L=16)
    T = build_tables(g, cl4, costs4)
    dims = T.dims[1]
    row = {d: 1 for d in dims}
    row["length"] = 4
    c = int(np.flatnonzero((T.degrees[1] == [row[d] for d in dims]).all(axis=1))[0])
    c2 = int(np.flatnonzero((T.degrees[2] == [row[d] for d in T.dims[2]]).all(axis=1))[0])
    # shards 1 and 2 need 2 halo columns (one each side), shards 0 and 3 one: 6 columns of B*C floats
    assert T.edge_bytes[1][c, c2] == 6 * 2 * 4 * 4
    # the edge from an input moves nothing
    assert not T.edge_bytes[0].any() and not T.edge_cost[0].any()
    # equal configs without halo need nothing
    s = {d: 1 for d in dims}
    s["sample"] = 2
    cs = int(np.flatnonzero((T.degrees[1] == [s[d] for d in dims]).all(axis=1))[0])
    assert T.edge_bytes[1][cs, cs] == 0 and T.edge_cost[1][cs, cs] == 0


@pytest.mark.parametrize("space", ["optcnn", "pase"])  # PaSE's space has replicas (reduction splits)
@pytest.mark.parametrize("mapping", ["linear", "spread"])
@pytest.mark.parametrize("compiled", [False, True])
def test_t_x_is_the_most_loaded_link_each_way_plus_latency(monkeypatch, compiled, mapping, space):
    """The t_X table, vectorised (numpy) and compiled (the kernel of large builds), against a
    direct loop over shard pairs and the links of their routes."""
    import algorithms.layer_transfers as layer_transfers
    from harness.core.layer_shards import edge_itemsize, make_grid, remote_elements

    monkeypatch.setattr(layer_transfers, "COMPILED_FROM", 0 if compiled else 1 << 62)
    monkeypatch.setattr(layer_transfers, "COLD_FROM", 0 if compiled else 1 << 62)
    cl = make_cluster(2, nodes=2, lat_us=3.0)  # NVLink inside a host, a shared NIC between hosts
    costs = AnalyticalCostModel(cl)
    g = random_dag(5, 4, 0.7, B=16, C=64, L=32)
    T = build_tables(g, cl, costs, SpaceOptions(space, "divides", 1, mapping))
    assert T.meta["edge_tables_compiled"] is compiled
    D, L = cl.num_devices, len(cl.links)
    W = np.zeros((D, D, L))  # 1 / bandwidth of every link on the route i -> j
    for i in range(D):
        for j in range(D):
            for link in cl.routes[i][j]:
                W[i, j, link] = 1.0 / cl.links[link].bw
    lat = cl.route_lat
    for e in range(g.num_edges):
        u, v = int(g.src[e]), int(g.dst[e])
        if g.kinds[u] == "input":
            continue
        gu, gv = (make_grid(g, x, T.dims[x], T.degrees[x], T.devices[x]) for x in (u, v))
        moved = remote_elements(g, e, gu, gv) * edge_itemsize(g, e)
        for cu in range(gu.num_configs):
            for cv in range(gv.num_configs):
                fwd, bwd, lf, lb = np.zeros(W.shape[2]), np.zeros(W.shape[2]), 0.0, 0.0
                for i in range(gu.nshards[cu]):
                    for j in range(gv.nshards[cv]):
                        b = moved[cu, i, cv, j]
                        if b > 0:
                            di, dj = gu.devices[cu, i], gv.devices[cv, j]
                            fwd += b * W[di, dj]
                            bwd += b * W[dj, di]
                            lf, lb = max(lf, lat[di, dj]), max(lb, lat[dj, di])
                want = fwd.max() + bwd.max() + lf + lb
                assert T.edge_cost[e][cu, cv] == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_t_s_parameter_server_and_ring(cl4):
    g = chain(1, 3, **BIG)
    ring = build_tables(g, cl4, AnalyticalCostModel(cl4, sync="ring"))
    ps = build_tables(g, cl4, AnalyticalCostModel(cl4, sync="ps"))
    v = 1
    dims = ring.dims[v]
    c = int(np.flatnonzero((ring.degrees[v] == [4 if d == "sample" else 1 for d in dims]).all(axis=1))[0])
    m = int(np.flatnonzero((ring.degrees[v] == [4 if d == "channel" else 1 for d in dims]).all(axis=1))[0])
    assert ring.parts["t_S"][v][c] > 0 and ps.parts["t_S"][v][c] > ring.parts["t_S"][v][c]
    assert ring.parts["t_S"][v][m] == 0  # channel split: disjoint weights, nothing to synchronise


# ---------------------------------------------------------------------- Algorithm 1
def test_node_elimination_is_eq2():
    rng = np.random.default_rng(1)
    a, nj, b = rng.random((3, 4)), rng.random(4), rng.random((4, 5))
    val = node_eliminate(a, nj, b)
    full = a[:, :, None] + nj[None, :, None] + b[None, :, :]
    assert np.allclose(val, full.min(axis=1))
    assert all(best_middle(a, nj, b, i, k) == full[i, :, k].argmin() for i in range(3) for k in range(5))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=small_dags(max_nodes=5), sync=st.sampled_from(["ring", "ps"]), topo=st.sampled_from(["switch", "mesh"]))
def test_optcnn_equals_pase_equals_brute_force(g, sync, topo):
    """The issue's proof: on random small layer graphs the three optima coincide."""
    cl = make_cluster(4, topology=topo, lat_us=2.0, bw_GBps=50)
    T = build_tables(g, cl, AnalyticalCostModel(cl, sync=sync))
    _, best = brute_force(T)
    idx_o, stats = OptCNN().search(T)
    idx_p, cost_p, _ = vertex_elimination(T)
    assert stats["complete"]
    assert T.objective(idx_o) == pytest.approx(best, rel=1e-12, abs=1e-18)
    assert T.objective(idx_p) == pytest.approx(best, rel=1e-12, abs=1e-18)
    assert cost_p == pytest.approx(best, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 30))
def test_chains_reduce_to_two_nodes(seed, n):
    cl = make_cluster(2)
    T = build_tables(chain(seed, n), cl, AnalyticalCostModel(cl))
    _, stats = OptCNN().search(T)
    assert stats["K"] <= 2 and stats["final_search"] == "exhaustive"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 25))
def test_series_parallel_graphs_reduce_to_two_nodes(seed, steps):
    cl = make_cluster(2)
    g = series_parallel(seed, steps)
    T = build_tables(g, cl, AnalyticalCostModel(cl))
    idx, stats = OptCNN().search(T)
    assert stats["K"] <= 2
    _, cost, _ = vertex_elimination(T)
    assert T.objective(idx) == pytest.approx(cost, rel=1e-12)


def test_leaf_elimination_extension_keeps_the_optimum(cl4, costs4):
    for seed in range(5):
        T = build_tables(random_dag(seed, 7, 0.6, **BIG), cl4, costs4)
        i1, s1 = OptCNN().search(T)
        i2, s2 = OptCNN(eliminate_leaves=True).search(T)
        assert s2["K"] <= s1["K"]
        assert T.objective(i2) == pytest.approx(T.objective(i1), rel=1e-12)


def test_large_final_graph_falls_back_to_branch_and_bound(cl4, costs4):
    T = build_tables(random_dag(3, 7, 1.0, **BIG), cl4, costs4)
    idx, stats = OptCNN(enum_limit=1).search(T)
    assert stats["final_search"] == "branch_and_bound" and stats["K"] > 2 and stats["complete"]
    assert T.objective(idx) == pytest.approx(brute_force(T)[1], rel=1e-12)


# ---------------------------------------------------------------------- DFS baseline
def test_dfs_is_exact_and_reports_an_exhausted_budget(cl4, costs4):
    g = random_dag(5, 6, 0.5, **BIG)
    T = build_tables(g, cl4, costs4)
    plan = OptCNNDFS(budget_s=60).plan(g, cl4, costs4)
    assert plan.info["search_complete"]
    assert plan.info["objective_s"] == pytest.approx(brute_force(T)[1], rel=1e-12)
    # an exhausted budget: the best strategy so far, flagged incomplete
    order = list(range(T.num_nodes))
    assign, cost, complete, _, bound = branch_and_bound(order, dict(enumerate(T.node_cost)), T.merged_edges(), budget_s=0.0, check_every=1)
    assert complete is False and sorted(assign) == order
    assert cost == pytest.approx(T.objective([assign[v] for v in order])) and cost >= brute_force(T)[1] * (1 - 1e-12)
    assert bound <= brute_force(T)[1] * (1 + 1e-12)


def test_a_budgeted_search_is_never_worse_than_the_best_baseline_in_its_space(cl4, costs4):
    from algorithms.layer_fixed import SEEDS
    from algorithms.layer_tables import seed_strategies

    g = random_dag(7, 8, 1.0, **BIG)
    T = build_tables(g, cl4, costs4)
    seeds = seed_strategies(T, SEEDS)
    assert seeds, "data parallelism lies in OptCNN's space"
    best_seed = seeds[0][2]
    for plan in (OptCNNDFS(budget_s=0.0).plan(g, cl4, costs4), OptCNN(enum_limit=1, budget_s=0.0).plan(g, cl4, costs4)):
        assert plan.info["objective_s"] <= best_seed * (1 + 1e-12)
        assert plan.info["seeded_with"] == seeds[0][0] and plan.info["gap_to_lower_bound"] >= 0
    # with an incumbent, the budget applies from the start: the answer is the seed or better
    order = list(range(T.num_nodes))
    assign, cost, complete, _, bound = branch_and_bound(order, dict(enumerate(T.node_cost)), T.merged_edges(), budget_s=0.0,
                                                        check_every=1, incumbent=dict(enumerate(seeds[0][1].tolist())))
    assert cost <= best_seed * (1 + 1e-12) and bound <= cost


def test_branch_and_bound_orients_edges_both_ways():
    nc = {0: np.array([0.0, 1.0]), 1: np.array([5.0, 0.0])}
    edges = {(0, 1): np.array([[0.0, 10.0], [0.0, 0.0]])}
    for order in ([0, 1], [1, 0]):
        assign, cost, complete, _, _ = branch_and_bound(order, nc, edges)
        assert complete and cost == 1.0 and assign == {0: 1, 1: 1}


# ---------------------------------------------------------------------- plans and fixed strategies
def test_plan_reports_k_objective_and_a_valid_strategy(cl4, costs4):
    g = series_parallel(4, 10, **BIG)
    plan = OptCNN().plan(g, cl4, costs4)
    plan.strategy.validate(g, 4)
    for key in ("objective_s", "K", "search_complete", "tables_s", "search_s", "configs_total"):
        assert key in plan.info
    assert plan.info["K"] == 2
    assert plan.info["objective_s"] == pytest.approx(evaluate(g, plan.strategy, cl4, costs4)["objective_s"])


def test_fixed_strategies_never_beat_optcnn(cl4, costs4):
    for seed in range(3):
        g = random_dag(seed, 6, 0.5, **BIG)
        best = OptCNN().plan(g, cl4, costs4).info["objective_s"]
        for algo in (DataParallel(graph="layer"), ModelParallel(), OWT()):
            plan = algo.plan(g, cl4, costs4)
            assert plan.info["objective_s"] >= best * (1 - 1e-12)


def test_data_parallel_on_the_layer_graph_is_the_same_strategy(cl4, costs4):
    g = chain(0, 4, **BIG)
    algo = DataParallel(graph="layer")
    assert algo.graph_kind == "layer" and DataParallel().graph_kind == "op"
    plan = algo.plan(g, cl4, costs4)
    assert plan.strategy == Strategy.uniform_config(g.num_nodes, ParallelConfig.make({"sample": 4}, range(4)))
    T = build_tables(g, cl4, costs4)
    assert plan.info["objective_s"] == pytest.approx(T.objective(T.index_of(plan.strategy)))
    with pytest.raises(ValueError, match="graph"):
        DataParallel(graph="nope")


def test_data_parallel_with_a_batch_smaller_than_the_devices_names_the_layer(cl4, costs4):
    g = chain(0, 3, B=2)
    with pytest.raises(StrategyError, match="conv1d1|pointwise1|elementwise1|splits sample"):
        DataParallel(graph="layer").plan(g, cl4, costs4)


def test_mp_and_owt_rules():
    from tests.layer_cases import build as b

    g = b(["input", "conv1d", "elementwise", "pointwise"], [(0, 1), (1, 2), (2, 3)], C=3)
    mp = model_parallel_dims(g, 4)
    assert mp[1] == {"channel": 2}  # 3 channels: the largest divisor of 4 that fits
    ow = owt_dims(g, 4)
    assert all(d == {"sample": 4} for d in ow[1:])  # no fully-connected layer: all DP


def test_owt_splits_fully_connected_layers_by_channel():
    import torch.nn as nn

    from harness.core.layerfx import build_layer_graph

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.pool = nn.MaxPool2d(2)
            self.fc1 = nn.Linear(8 * 4 * 4, 16)
            self.relu = nn.ReLU()
            self.fc2 = nn.Linear(16, 8)

        def forward(self, x):
            return self.fc2(self.relu(self.fc1(self.pool(self.conv(x)).flatten(1))))

    g = build_layer_graph(Net(), [((8, 3, 8, 8), "float32")])
    dims = owt_dims(g, 4)
    by = dict(zip(g.names, dims))
    assert by["conv"] == {"sample": 4} and by["pool"] == {"sample": 4}
    assert by["fc1"] == {"channel": 4} and by["relu"] == {"channel": 4} and by["fc2"] == {"channel": 4}


def test_index_of_names_a_config_outside_the_space(cl4, costs4):
    g = chain(0, 3, **BIG)
    T = build_tables(g, cl4, costs4)
    bad = Strategy.uniform_config(g.num_nodes, ParallelConfig.make({"sample": 3}, range(3)))
    with pytest.raises(ConfigSpaceError, match="not in the optcnn space"):
        T.index_of(bad)


# ---------------------------------------------------------------------- experiments (quick)
def test_optcnn_experiments_quick(tmp_path):
    """Every OptCNN experiment's --quick run writes its CSV, PNG and README section, with the
    paper's numbers labelled as the paper's."""
    import pandas as pd

    from experiments import optcnn_fig7, optcnn_fig8, optcnn_table3, optcnn_table4, optcnn_table5

    out = str(tmp_path)
    for mod, stem in ((optcnn_table3, "table3"), (optcnn_fig7, "fig7"), (optcnn_fig8, "fig8"), (optcnn_table4, "table4"),
                      (optcnn_table5, "table5")):
        assert mod.main(["--quick", "--out", out]) == 0
        assert (tmp_path / f"{stem}.csv").exists() and (tmp_path / f"{stem}.png").exists()
    readme = (tmp_path / "README.md").read_text()
    for head in ("Table 3", "Figure 7", "Figure 8", "Table 4", "Table 5"):
        assert f"## {head}" in readme
    assert "paper" in readme and "python -m experiments optcnn_table3 --quick" in readme
    t3 = pd.read_csv(tmp_path / "table3.csv")
    assert (t3["K"] == 2).all() and t3["same_optimum"].astype(str).eq("True").all()
    runs = pd.read_csv(tmp_path / "layerwise_runs.csv")
    assert set(runs["algo"]) == {"data_parallel", "model_parallel", "owt", "optcnn"} and (runs["step_time_s"] > 0).all()


def test_spread_mapping_places_small_configs_across_the_cluster():
    cl = make_cluster(2, nodes=2)  # 4 devices, 2 per host
    costs = AnalyticalCostModel(cl)
    g = chain(3, 4, **BIG)
    T = build_tables(g, cl, costs, SpaceOptions("optcnn", "divides", 1, "spread"))
    two = [c for c in range(len(T.degrees[1])) if T.degrees[1][c].prod() == 2]
    assert all(T.config(1, c).devices == (0, 2) for c in two)
    idx, _ = OptCNN().search(T)
    assert T.objective(idx) == pytest.approx(brute_force(T)[1], rel=1e-12)
