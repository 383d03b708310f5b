"""Clusters of any size: links and per-pair routes on demand (harness/core/wiring.py), the D x D
tables only when an operator- or layer-graph simulation asks for them, and refused in one line
beyond their budget."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
import yaml

from harness.core.cluster import MAX_DEVICES, Cluster, build_cluster, check_route_tables, max_route_devices
from harness.core.errors import ClusterError
from harness.core.fabric import Group, collective_time, fabric_of
from tests.helpers import preset_cluster

CONF = Path(__file__).resolve().parents[1] / "conf" / "cluster"
A100 = yaml.safe_load((CONF / "device" / "a100_sxm4_80gb.yaml").read_text())


def superpod(nodes: int) -> Cluster:
    return build_cluster("superpod", A100, gpus=8, nodes=nodes, intra={"topology": "switch", "bw_GBps": 300},
                         inter={"bw_gbps": 200, "nics_per_node": 8, "rail_optimized": True}, host_link={"bw_GBps": 31.5})


@pytest.mark.parametrize("overrides", [
    ["cluster=p100x16_4nodes"], ["cluster=dgx1_v100", "cluster.nodes=2"], ["cluster=deepbench_p100", "cluster.nodes=3"],
    ["cluster=h100x32_ndr"], ["cluster=parametric", "cluster.nodes=3", "cluster.gpus=4"], ["cluster=jean_zay_a100", "cluster.nodes=3"],
    ["cluster=p100x8_2containers"], ["cluster=h100x8"], ["cluster=cpu2"],
])
def test_links_and_routes_on_demand_are_the_tables(overrides):
    """What the wiring answers pair by pair is what the tables hold, and the link list is the
    links one by one (the tables are the builder's of before: test_gpu_clusters' digests)."""
    lazy, eager = preset_cluster(*overrides), preset_cluster(*overrides)
    d = lazy.num_devices
    routes = [[lazy.route(i, j) for j in range(d)] for i in range(d)]
    singles = [lazy.link(lid) for lid in range(lazy.num_links)]
    classes = lazy.link_classes
    assert routes == eager.routes and singles == eager.links and classes == eager.link_classes
    assert lazy.num_links == len(eager.links)
    for i in range(d):
        for j in range(d):
            r = eager.routes[i][j]
            assert eager.route_bw[i, j] == (min(eager.links[l].bw for l in r) if r else float("inf"))
    assert lazy.ring_bandwidth(range(min(d, 8))) == eager.ring_bandwidth(range(min(d, 8)))


def test_a_16384_gpu_cluster_builds_without_routes():
    """Llama 3 405B's 16,384 GPUs: the cluster is its devices (a few MB); the fabric, a route or a
    link are answered pair by pair; the tables would be 43 GiB and are refused in one line."""
    tracemalloc.start()
    try:
        cl = superpod(2048)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert cl.num_devices == 16384 and peak < 16 * 2**20
    assert cl.num_links == 2048 * 16 + 2 * 16384 + 2 * 2048 * 8 and cl.link_classes == ["ib", "nvlink", "pcie"]
    assert [cl.link(lid).name for lid in cl.route(8 * 2047 + 7, 3)] == ["n2047/gpu7->nic7", "n2047/nic7->net", "net->n0/nic3", "nic3->n0/gpu3"]
    assert [cl.link(lid).name for lid in cl.route(9, 10)] == ["n1/gpu1->sw", "n1/sw->gpu2"]
    f = fabric_of(cl, calibrated=False)  # the datasheet figures (the NCCL calibration scales them)
    assert (f.nodes, f.intra_bw, f.inter_bw, f.rail_optimized) == (2048, 300e9, 25e9, True)
    assert collective_time(f, "all_reduce", 1e9, Group(128, 8)) > 0
    with pytest.raises(ClusterError) as e:
        _ = cl.route_lat
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("cluster.gpus x cluster.nodes = 16384 devices is more than an operator or layer graph")
    assert "algo=megatron" in msg and f"{max_route_devices()} devices" in msg


def test_the_route_tables_are_built_up_to_their_budget():
    check_route_tables(max_route_devices())
    with pytest.raises(ClusterError, match=f"= {max_route_devices() + 1} devices"):
        check_route_tables(max_route_devices() + 1)
    small = superpod(4)
    assert len(small.routes) == 32 and small.route_len[0, 9] == 4
    sub = superpod(2048).subset(16)  # the first GPUs of a large cluster, with their own tables
    assert sub.num_devices == 16 and sub.routes == small.subset(16).routes


def test_the_size_limits_are_one_line():
    with pytest.raises(ClusterError, match=rf"^cluster\.gpus x cluster\.nodes = {MAX_DEVICES + 8} devices is more than the simulator represents \(at most {MAX_DEVICES} devices\)"):
        superpod(MAX_DEVICES // 8 + 1)
    with pytest.raises(ClusterError, match=r"^cluster\.gpus = 5000 devices per node is more than the simulator represents"):
        build_cluster("x", A100, gpus=5000, nodes=1)


def test_host_comm_keeps_the_cluster_lazy():
    cl = superpod(2048).with_host_comm({"copy_GBps": 10.0})
    assert cl.meta["host_comm"] == {"copy_GBps": 10.0} and cl.num_links == superpod(2048).num_links


@pytest.mark.parametrize("inter,match", [
    ({"bw_gbps": 200, "rail_optimized": "yes"}, r"^cluster\.inter\.rail_optimized must be true or false"),
    ({"bw_gbps": 200, "pod_nodes": -1}, r"^cluster\.inter\.pod_nodes must be an integer >= 0"),
    ({"bw_gbps": 200, "pod_oversubscription": 0.5}, r"^cluster\.inter\.pod_oversubscription must be in \[1, 1000\]"),
    ({"bw_gbps": 200, "pod_node": 4}, r"^cluster\.inter\.pod_node is not a key of cluster\.inter: did you mean cluster\.inter\.pod_nodes\?"),
])
def test_the_fabric_keys_are_checked(inter, match):
    with pytest.raises(ClusterError, match=match) as e:
        build_cluster("x", A100, gpus=8, nodes=2, inter=inter)
    assert "\n" not in str(e.value)
