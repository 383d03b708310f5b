"""Graph IR, clusters, cost model and strategy type."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.app.compose import compose
from harness.core.cluster import ClusterError, build_cluster
from harness.core.costs import AnalyticalCostModel, node_memory, op_class
from harness.core.graph import GraphError, OpGraph, topological_order
from harness.app.run import build
from harness.core.strategy import ParallelConfig, Strategy, StrategyError
from tests.helpers import DEVICE, make_cluster, make_graph

# ---------------------------------------------------------------------------- graph


def test_graph_csr_and_counts():
    g = make_graph(4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    assert g.num_nodes == 4 and g.num_edges == 4
    assert sorted(g.successors(0).tolist()) == [1, 2]
    assert sorted(g.predecessors(3).tolist()) == [1, 2]
    assert g.successors(3).tolist() == []


def test_graph_rejects_non_topological_ids_and_names_the_edge():
    with pytest.raises(GraphError, match="v1 -> v0 does not follow node order"):
        make_graph(2, [(1, 0)])


def test_from_unordered_renumbers_and_reports_cycles():
    g = make_graph(3, [(0, 1), (1, 2)])
    fields = g.to_dict()
    fields.pop("format")
    fields["src"], fields["dst"] = [2, 0], [0, 1]  # 2 -> 0 -> 1
    h = OpGraph.from_unordered(**fields)
    assert h.names == ["v2", "v0", "v1"]
    assert h.meta["renumbered_from"] == [2, 0, 1]
    assert (h.src < h.dst).all()
    # a graph already in order keeps its ids and drops a permutation it was handed with
    again = h.to_dict()
    again.pop("format")
    assert "renumbered_from" not in OpGraph.from_unordered(**again).meta
    fields["src"], fields["dst"] = [0, 1, 2], [1, 2, 0]
    with pytest.raises(GraphError, match=r"cycle through nodes .*v0"):
        OpGraph.from_unordered(**fields)


def test_topological_order_cycle_message_lists_the_cycle():
    with pytest.raises(GraphError) as e:
        topological_order(3, np.array([0, 1, 2]), np.array([1, 2, 1]), ["a", "b", "c"])
    assert "1 (b)" in str(e.value) and "2 (c)" in str(e.value)


def test_graph_json_round_trip_and_networkx(tmp_path):
    g = make_graph(3, [(0, 1), (1, 2)], [1.0, 2.0, 3.0], [10, 20])
    p = tmp_path / "g.json"
    g.save(p)
    h = OpGraph.load(p)
    for k, v in g.to_dict().items():
        assert h.to_dict()[k] == v, k
    nx_g = g.to_networkx()
    assert nx_g.number_of_nodes() == 3 and nx_g.edges[0, 1]["nbytes"] == 10
    with pytest.raises(GraphError, match="not an op graph file"):
        OpGraph.from_dict({"format": "nope"})


def test_graph_arrays_must_match_node_count():
    with pytest.raises(GraphError, match="flops has length 2, expected 3"):
        OpGraph(names=["a", "b", "c"], targets=["x"] * 3, phase=[0] * 3, layer=[0] * 3, layer_names=["l"], flops=[1, 2],
                out_bytes=[0] * 3, work_bytes=[0] * 3, free=[0] * 3, batch_role=[0] * 3, coloc=[-1] * 3, src=[], dst=[], nbytes=[])


# ---------------------------------------------------------------------------- cluster


@pytest.mark.parametrize("name,devices,cls", [
    ("p100x4", 4, {"nvlink"}),
    ("p100x16_4nodes", 16, {"nvlink", "ib", "pcie"}),
    ("p100x8", 8, {"pcie"}),
    ("p100x8_2containers", 8, {"pcie", "container"}),
    ("v100x4_pcie", 4, {"pcie"}),
    ("h100x8", 8, {"nvlink"}),
    ("h100x16_2nodes", 16, {"nvlink", "ib", "pcie"}),
])
def test_cluster_presets(name, devices, cls):
    cfg = compose([f"cluster={name}"])
    cl = build(cfg)[1]
    assert cl.num_devices == devices
    assert set(cl.link_classes) == cls
    for i in range(devices):
        for j in range(devices):
            assert (len(cl.routes[i][j]) > 0) == (i != j)


def test_nvlink_figures_are_per_direction():
    cl = build(compose(["cluster=p100x4"]))[1]
    assert cl.route_bw[0, 1] == pytest.approx(20e9)  # 160 GB/s bidirectional over 4 links -> 20 per direction
    h = build(compose(["cluster=h100x8"]))[1]
    assert h.route_bw[0, 1] == pytest.approx(450e9)  # 900 GB/s bidirectional
    # 80 GiB on the datasheet, of which the CUDA context and NCCL hold the cluster's runtime_GiB
    assert h.devices[0].spec.mem_capacity + h.devices[0].spec.runtime_bytes == 80 * 2**30


def test_multi_node_route_goes_through_both_nics():
    cl = build(compose(["cluster=p100x16_4nodes"]))[1]
    names = [cl.links[l].name for l in cl.routes[0][5]]
    assert names == ["n0/gpu0->nic", "n0/nic->net", "net->n1/nic", "nic->n1/gpu1"]
    assert cl.route_bw[0, 5] == pytest.approx(100e9 / 8)
    # two GPUs of one node share its NIC: their routes to another node share a link
    assert set(cl.routes[0][5]) & set(cl.routes[1][6])


def test_parametric_cluster():
    cl = build(compose(["cluster=parametric", "cluster.gpus=2", "cluster.nodes=3"]))[1]
    assert cl.num_devices == 6 and cl.name == "gpus2_nodes3"


def test_cluster_errors():
    with pytest.raises(ClusterError, match="cluster.intra.topology='ring' is not a topology"):
        build_cluster("x", DEVICE, gpus=2, intra={"topology": "ring", "bw_GBps": 1})
    with pytest.raises(ClusterError, match="no inter-node link"):
        build_cluster("x", DEVICE, gpus=2, nodes=2)
    with pytest.raises(ClusterError, match="needs bw_GBps"):
        build_cluster("x", DEVICE, gpus=2, intra={"topology": "mesh"})
    with pytest.raises(ClusterError, match="missing 'mem_GiB'"):
        build_cluster("x", {"kind": "a", "peak_tflops": 1, "mem_bw_GBps": 1}, gpus=2)


def test_cluster_subset_keeps_routes():
    cl = build(compose(["cluster=p100x16_4nodes"]))[1]
    sub = cl.subset(8)
    assert sub.num_devices == 8
    assert sub.route_bw[0, 5] == pytest.approx(cl.route_bw[0, 5])
    assert [sub.links[l].name for l in sub.routes[0][5]] == [cl.links[l].name for l in cl.routes[0][5]]


# ---------------------------------------------------------------------------- costs


def test_op_classes():
    assert op_class("aten.convolution.default") == "conv"
    assert op_class("aten.convolution_backward.default") == "conv"
    assert op_class("aten.addmm.default") == "gemm"
    assert op_class("aten.relu.default") == "other"


def test_roofline():
    cl = make_cluster(2)
    c = AnalyticalCostModel(cl, efficiency={"gemm": 0.5}, mem_efficiency=1.0, launch_us=3.0)
    g = make_graph(3, [], [1e12, 0.0, 0.0])
    g.work_bytes[:] = [0, 1e9, 0]
    g.free[2] = True
    t = c.node_times(g, 0)
    assert t[0] == pytest.approx(1e12 / (10e12 * 0.5) + 3e-6)
    assert t[1] == pytest.approx(1e9 / 500e9 + 3e-6)  # memory bound: bytes / bandwidth
    assert t[2] == 0.0  # views cost nothing
    assert c.compute_time(g, 0, 0, fraction=0.25) == pytest.approx(1e12 / 5e12 / 4 + 3e-6)


def test_transfer_and_allreduce_formulas():
    cl = make_cluster(4, lat_us=2.0)
    c = AnalyticalCostModel(cl)
    assert c.transfer_time(10e9, 0, 1) == pytest.approx(2e-6 + 1.0)  # switch: two half-latency hops
    assert c.transfer_time(10e9, 1, 1) == 0.0
    assert c.allreduce_time(8e9, [0, 1, 2, 3]) == pytest.approx(2 * 3 / 4 * 8e9 / 10e9 + 2 * 3 * 2e-6)
    ps = AnalyticalCostModel(cl, sync="ps")
    assert ps.allreduce_time(8e9, [0, 1, 2, 3]) == pytest.approx(2 * (3 * 8e9 / 10e9 + 2e-6))
    assert c.allreduce_time(8e9, [2]) == 0.0


def test_node_memory_counts_each_parameter_once():
    g = make_graph(3, [(0, 1), (1, 2)])
    g.out_bytes[:] = [10, 20, 30]
    g.param_bytes = np.array([1000])
    g.param_ptr = np.array([0, 1, 2, 2])
    g.param_idx = np.array([0, 0], np.int32)
    m = node_memory(g)
    assert m.tolist() == [1010, 20, 30]


# ---------------------------------------------------------------------------- strategy


def test_strategy_json_round_trip(tmp_path):
    s = Strategy(np.array([0, -1, 1]), np.array([0, 1, 2]), np.array([-1, 0, -1]), [ParallelConfig.make({"sample": 2}, [0, 1])], {"k": 1})
    p = tmp_path / "s.json"
    s.save(p)
    assert Strategy.load(p) == s
    assert json.loads(p.read_text())["configs"][0] == {"dims": {"sample": 2}, "devices": [0, 1]}


def test_strategy_validation_names_the_culprit():
    g = make_graph(3, [(0, 1), (1, 2)])
    with pytest.raises(StrategyError, match=r"node 1 \(v1\) is not assigned to any device"):
        Strategy.placement([0, -1, 0]).validate(g, 2)
    with pytest.raises(StrategyError, match="has 2 entries but the graph has 3 nodes"):
        Strategy.placement([0, 0]).validate(g, 2)
    bad_cfg = Strategy.uniform_config(3, ParallelConfig.make({"sample": 4}, [0, 1, 2, 3]))
    with pytest.raises(StrategyError, match="degree 4 exceeds the 2 devices"):
        bad_cfg.validate(g, 2)
    with pytest.raises(StrategyError, match="degrees multiply to 2 but it lists 3 devices"):
        Strategy.uniform_config(3, ParallelConfig.make({"sample": 2}, [0, 1, 2])).validate(g, 4)
    with pytest.raises(StrategyError, match="two shards on one device"):
        Strategy.uniform_config(3, ParallelConfig.make({"sample": 2}, [1, 1])).validate(g, 4)
    with pytest.raises(StrategyError, match="not a strategy"):
        Strategy.from_dict({"format": "x"})
