"""The fabric a collective sees (harness/core/fabric.py): Megatron-LM's rank layout, where a
group's ranks sit, NCCL's cost model on the fabric's bandwidths, and the LLM cluster presets."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.app.compose import compose
from harness.app.run import build
from harness.core.cluster import build_cluster, device_spec
from harness.core.errors import ClusterError, OptionError
from harness.core.fabric import (OPS, Fabric, Group, Placement, all_to_all_time, bus_bandwidth, calibrate, collective_time,
                                 fabric_of, fabric_report, nvls_time, p2p_time, placed_collective_time, placement_of, rank_layout)
from harness.core.kernel_model import load_table as kernel_table
from harness.core.nccl_calibration import (OPA_CSV, OPA_NET, PCIE, PCIE_NET, IntraCalibration, NetCalibration, load_table,
                                           opa_net_calibration)
from tests.helpers import DEVICE, make_cluster, preset_cluster

CONF = Path(__file__).resolve().parents[1] / "conf" / "cluster"
#: a DGX SuperPOD-like fabric of 64 nodes: NVSwitch 300 GB/s, 25 GB/s NIC per GPU
POD = Fabric(gpus_per_node=8, nodes=64, intra_bw=300e9, intra_lat=5e-6, inter_bw=25e9, inter_lat=3e-6, rail_optimized=True)
SIZES = [2.0 ** k for k in range(0, 35)] + [3e3, 7e5, 1.1e8, 5e9]


def slope(fabric: Fabric, op: str, group: Group, nbytes: float = 4e10) -> float:
    """Seconds per byte of ``op`` at large sizes (where the bandwidth term rules)."""
    return (collective_time(fabric, op, 2 * nbytes, group) - collective_time(fabric, op, nbytes, group)) / nbytes


# ---------------------------------------------------------------------------- rank layout
@pytest.mark.parametrize("tp,cp,ep,dp,pp", [(8, 1, 1, 16, 4), (2, 2, 4, 4, 3), (4, 1, 2, 2, 1), (1, 4, 1, 2, 2), (8, 2, 8, 4, 2)])
def test_rank_layout_is_megatrons_order(tp, cp, ep, dp, pp):
    """Brute force: the global ranks as a [pp, dp, cp, tp] grid (TP fastest); each group of rank 0
    is the line of the grid along its dimension, and the experts' grid is [pp, dp*cp/ep, ep, tp]."""
    grid = np.arange(tp * cp * dp * pp).reshape(pp, dp, cp, tp)
    expert = grid.reshape(pp, dp * cp // ep, ep, tp)
    want = {"tp": grid[0, 0, 0, :], "cp": grid[0, 0, :, 0], "dp": grid[0, :, 0, 0], "pp": grid[:, 0, 0, 0],
            "ep": expert[0, 0, :, 0], "edp": expert[0, :, 0, 0], "dp_cp": grid[0, :, :, 0].ravel()}
    layout = rank_layout(tp, cp, ep, dp, pp)
    assert set(layout) == set(want)
    for name, ranks in want.items():
        g = layout[name]
        assert list(range(0, g.size * g.stride, g.stride)) == sorted(ranks.tolist()), name


def test_rank_layout_refuses_an_ep_that_does_not_split_the_data_parallel_ranks():
    with pytest.raises(OptionError, match=r"^algo\.ep=3 does not divide algo\.dp x algo\.cp = 8") as e:
        rank_layout(tp=2, cp=2, ep=3, dp=4, pp=1)
    assert "\n" not in str(e.value)
    with pytest.raises(OptionError, match=r"^algo\.tp must be an integer >= 1"):
        rank_layout(tp=0, cp=1, ep=1, dp=1, pp=1)


def test_placement_against_brute_force():
    for size, stride, g, pod in itertools.product((1, 2, 3, 5, 8, 13, 64), (1, 2, 3, 4, 6, 8, 12, 32), (1, 4, 8), (0, 1, 3)):
        ranks = np.arange(size) * stride
        nodes, counts = np.unique(ranks // g, return_counts=True)
        pl = Group(size, stride).placement(g, pod)
        assert (pl.nodes, pl.ranks_per_node, pl.min_ranks_per_node) == (len(nodes), counts.max(), counts.min())
        assert pl.pods == (len(np.unique(nodes // pod)) if pod else 1)
    assert Group(8, 8).nodes_spanned(8) == 8 and Group(16).ranks_per_node(8) == 8


@pytest.mark.parametrize("size,stride", [(0, 1), (2, 0), (1.5, 1), (True, 1)])
def test_a_group_needs_counts(size, stride):
    with pytest.raises(ValueError):
        Group(size, stride)


# ---------------------------------------------------------------------------- collective times
def test_nothing_to_do_costs_nothing():
    for op in OPS:
        assert collective_time(POD, op, 1e9, Group(1)) == 0.0
        assert collective_time(POD, op, 0, Group(64, 8)) == 0.0
    assert p2p_time(POD, 0, same_node=False) == 0.0


def test_a_group_inside_a_node_uses_only_nvswitch_figures():
    other = Fabric(8, 64, 300e9, 5e-6, inter_bw=1e9, inter_lat=1e-3, rail_optimized=False, pod_nodes=2, pod_oversubscription=50)
    faster = Fabric(8, 64, 600e9, 5e-6, 25e9, 3e-6, True)
    for op in OPS:
        for nbytes in (1e3, 1e6, 1e9):
            assert collective_time(POD, op, nbytes, Group(8)) == collective_time(other, op, nbytes, Group(8))
        assert slope(faster, op, Group(8)) == pytest.approx(slope(POD, op, Group(8)) / 2)


@pytest.mark.parametrize("group", [Group(8), Group(4, 2), Group(16), Group(32, 8), Group(2, 8), Group(512, 1)])
def test_ring_moves_its_share_of_the_bytes(group):
    """At large sizes NCCL's Simple ring wins and a rank moves 2(p-1)/p of an all-reduce's bytes,
    (p-1)/p of a reduce-scatter's input or an all-gather's output, all of a broadcast's, at the
    bus bandwidth."""
    p, bus = group.size, bus_bandwidth(POD, group)
    assert slope(POD, "all_reduce", group) == pytest.approx(2 * (p - 1) / p / bus, rel=1e-9)
    for op in ("reduce_scatter", "all_gather"):
        assert slope(POD, op, group) == pytest.approx((p - 1) / p / bus, rel=1e-9)
    assert slope(POD, "broadcast", group) == pytest.approx(1 / bus, rel=1e-9)


def test_bus_bandwidth_is_the_slower_hop():
    assert bus_bandwidth(POD, Group(8)) == 300e9  # NVSwitch
    assert bus_bandwidth(POD, Group(16, 8)) == 25e9  # one rank per node: its rail
    assert bus_bandwidth(POD, Group(32, 2)) == 4 * 25e9  # four ranks per node: four NICs
    assert bus_bandwidth(POD, Group(128)) == min(300e9, 8 * 25e9)
    assert bus_bandwidth(POD, Group(12)) == 4 * 25e9  # 8 + 4: the second node has four NICs for the ring


def test_across_nodes_is_slower_per_byte_than_inside():
    for op in OPS:
        assert slope(POD, op, Group(8, 8)) > slope(POD, op, Group(8, 1))
        assert collective_time(POD, op, 1e8, Group(8, 8)) > collective_time(POD, op, 1e8, Group(8, 1))


@pytest.mark.parametrize("fabric", [POD, Fabric(8, 2048, 450e9, 5e-6, 50e9, 3e-6, False, "nvlink", 384, 7.0),
                                    Fabric(4, 16, 15.75e9, 1e-5, 6.25e9, 3e-6, False, "pci")])
def test_monotone_in_bytes(fabric):
    groups = [Group(p, s) for p in (2, 4, 8, 16, 64, 256) for s in (1, 2, fabric.gpus_per_node, 64)
              if (p - 1) * s < fabric.gpus]
    for op, group in itertools.product(OPS, groups):
        times = [collective_time(fabric, op, x, group) for x in sorted(SIZES)]
        assert all(b >= a for a, b in zip(times, times[1:])), (op, group)
        assert all(math.isfinite(t) and t > 0 for t in times)


def test_monotone_in_group_size():
    for op, stride in itertools.product(OPS, (1, 2, 8, 16)):
        for nbytes in (1e3, 1e6, 1e8, 1e10):
            times = [collective_time(POD, op, nbytes, Group(p, stride)) for p in (2, 4, 8, 16, 32) if (p - 1) * stride < POD.gpus]
            assert all(b >= a for a, b in zip(times, times[1:])), (op, stride, nbytes, times)


def test_small_messages_pay_the_latency_of_nccls_ll_ring():
    """One byte among 8 GPUs on NVLink: NCCL's LL ring, 6.6 us + 2 x 7 steps x 0.6 us."""
    assert collective_time(POD, "all_reduce", 1, Group(8)) == pytest.approx(15.0e-6, rel=1e-3)
    assert collective_time(POD, "all_gather", 8, Group(8)) == pytest.approx((6.6 + 7 * 0.6) * 1e-6, rel=1e-3)


def test_a_large_all_reduce_over_many_nodes_takes_the_tree():
    """Hundreds of nodes: the ring's 2 x nodes network steps cost more than the tree's
    2 log2(nodes), so the tree (bus bandwidth x 0.92, half of it as algorithm bandwidth) wins
    where the bytes do not dominate; the ring wins again once they do."""
    big = Fabric(8, 1024, 300e9, 5e-6, 25e9, 3e-6, True)
    group = Group(1024, 8)
    ring_bytes = 2 * 1023 / 1024 / 25e9
    t = collective_time(big, "all_reduce", 1e6, group)
    assert t < 2 * 1023 * 14e-6  # less than the ring's network steps alone
    assert slope(big, "all_reduce", group, 1e11) == pytest.approx(ring_bytes)


def test_pods_joined_by_oversubscribed_links():
    """A ring leaves a pod once per (nodes per pod) node crossings: with 1:7 above the pods it
    slows only when a pod holds fewer than 7 of its nodes."""
    f = Fabric(8, 64, 300e9, 5e-6, 25e9, 3e-6, False, "nvlink", pod_nodes=8, pod_oversubscription=7.0)
    assert bus_bandwidth(f, Group(8, 8)) == 25e9  # one pod
    assert bus_bandwidth(f, Group(16, 8)) == 25e9  # 8 nodes in each of 2 pods
    assert bus_bandwidth(f, Group(8, 64)) == pytest.approx(25e9 / 7)  # one node per pod
    assert bus_bandwidth(f, Group(16, 32)) == pytest.approx(25e9 * 2 / 7)
    # an all-to-all sends (P-1)/P of its bytes across pods at 1/7 of the NIC
    assert slope(f, "all_to_all", Group(16, 32)) == pytest.approx((1 - 1 / 8) * 7 / 25e9)  # 8 pods
    assert p2p_time(f, 1e9, same_node=False, same_pod=False) == pytest.approx(3e-6 + 7 * 1e9 / 25e9)


def test_all_to_all_bytes():
    """Inside a node (p-1)/p of the buffer over NVSwitch; across nodes the off-node part over the
    rank's NIC share; PXN (rail-optimised) forwards off-node bytes over NVLink too."""
    assert slope(POD, "all_to_all", Group(8)) == pytest.approx(7 / 8 / 300e9)
    assert slope(POD, "all_to_all", Group(64)) == pytest.approx(56 / 64 / 25e9)
    no_rails = Fabric(8, 64, 10e9, 5e-6, 25e9, 3e-6, False)
    rails = Fabric(8, 64, 10e9, 5e-6, 25e9, 3e-6, True)
    assert slope(no_rails, "all_to_all", Group(64)) == pytest.approx(56 / 64 / 25e9)
    assert slope(rails, "all_to_all", Group(64)) == pytest.approx((7 / 64 + 56 / 64 * 7 / 8) / 10e9)
    assert all_to_all_time(POD, 1e6, Group(16)) == collective_time(POD, "all_to_all", 1e6, Group(16))


def test_p2p():
    assert p2p_time(POD, 1e9, same_node=True) == pytest.approx(5e-6 + 1e9 / 300e9)
    assert p2p_time(POD, 1e9, same_node=False) == pytest.approx(3e-6 + 1e9 / 25e9)
    one_node = Fabric(8, 1, 300e9, 5e-6, 0.0, 0.0, False)
    with pytest.raises(ClusterError, match="across nodes on a fabric of one node"):
        p2p_time(one_node, 1, same_node=False)


@pytest.mark.parametrize("call,error,match", [
    (lambda: collective_time(POD, "all_reduce", 1e6, Group(2, 512)), ClusterError, r"^a group of 2 ranks 512 apart reaches rank 512, beyond the fabric's 512 GPUs"),
    (lambda: collective_time(POD, "allreduce", 1e6, Group(2)), ValueError, r"^unknown collective 'allreduce'"),
    (lambda: collective_time(POD, "all_reduce", math.nan, Group(2)), ValueError, r"finite and >= 0"),
    (lambda: collective_time(POD, "all_reduce", -1, Group(2)), ValueError, r"finite and >= 0"),
    (lambda: p2p_time(POD, math.inf, True), ValueError, r"finite and >= 0"),
    (lambda: Fabric(8, 2, 300e9, 5e-6, 0.0, 3e-6, True), ClusterError, r"is not a fabric"),
    (lambda: Fabric(8, 1, math.nan, 5e-6, 0.0, 3e-6, True), ClusterError, r"is not a fabric"),
])
def test_refused(call, error, match):
    with pytest.raises(error, match=match) as e:
        call()
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------- fabric_of and the presets
@pytest.mark.parametrize("overrides,intra,inter,gpus,nodes,rail,pods", [
    (["cluster=superpod_a100"], 300e9, 8 * 200e9 / 8 / 8, 8, 20, True, (0, 1.0)),
    (["cluster=superpod_h100", "cluster.nodes=2048"], 450e9, 400e9 / 8, 8, 2048, True, (0, 1.0)),
    (["cluster=jean_zay_a100"], 300e9, 4 * 100e9 / 8 / 8, 8, 48, False, (0, 1.0)),
    (["cluster=h100_roce"], 450e9, 400e9 / 8, 8, 2048, False, (384, 7.0)),
    (["cluster=h100_roce", "cluster.nodes=64"], 450e9, 400e9 / 8, 8, 64, False, (0, 7.0)),  # one pod holds them all
    (["cluster=h100x16_2nodes"], 450e9, 3200e9 / 8 / 8, 8, 2, False, (0, 1.0)),  # one NIC of 3200 Gb/s for 8 GPUs
    (["cluster=p100x16_4nodes"], 3 * 20e9, 100e9 / 8 / 4, 4, 4, False, (0, 1.0)),  # 3 NVLinks; one EDR NIC for 4 GPUs
    (["cluster=dgx1_v100"], 150e9, 0.0, 8, 1, False, (0, 1.0)),
])
def test_fabric_of_presets(overrides, intra, inter, gpus, nodes, rail, pods):
    """The datasheet figures read off the presets (before the NCCL calibration scales them)."""
    f = fabric_of(preset_cluster(*overrides), calibrated=False)
    assert (f.gpus_per_node, f.nodes, f.rail_optimized, (f.pod_nodes, f.pod_oversubscription)) == (gpus, nodes, rail, pods)
    assert f.intra_bw == pytest.approx(intra) and f.inter_bw == pytest.approx(inter)
    assert f.intra_link == "nvlink"


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF.glob("*.yaml")))
def test_fabric_of_every_preset(name):
    cl = preset_cluster(f"cluster={name}")
    f = fabric_of(cl)
    assert f.gpus == cl.num_devices and f.intra_bw > 0 and math.isfinite(f.intra_bw)
    assert (f.inter_bw > 0) == (f.nodes > 1)
    assert collective_time(f, "all_reduce", 1e8, Group(f.gpus)) > 0


def test_fabric_of_a_hand_made_cluster():
    f = fabric_of(make_cluster(4, nodes=2, bw_GBps=10.0, lat_us=2.0))
    assert (f.gpus_per_node, f.nodes, f.intra_bw, f.inter_bw) == (4, 2, 10e9, 5e9 / 4)  # one NIC for 4 GPUs
    assert f.intra_lat == pytest.approx(2e-6) and f.intra_link == "nvlink"


def test_h100_devices():
    def spec(name):
        return device_spec(yaml.safe_load((CONF / "device" / f"{name}.yaml").read_text()))

    h, t = spec("h100_sxm5"), spec("h100_sxm5_96gb")
    assert h.peak("float8") == pytest.approx(2 * h.peak("bfloat16"), rel=1e-4)  # FP8 tensor cores: twice BF16 (rounded figures)
    assert t.mem_bw == 2.4e12 and t.mem_capacity == 96 * 2**30
    nvl = {"float32": 60e12, "tf32": 417.5e12, "bfloat16": 835e12, "float16": 835e12, "float8": 1671e12}  # H100 NVL, dense
    for k, sxm in h.peak_flops.items():  # the 500 W part: the middle of the SXM-to-NVL range torchtitan's paper gives
        assert t.peak(k) == pytest.approx((sxm + nvl[k]) / 2, rel=1e-3)


# ---------------------------------------------------------------------------- NVLS and the NCCL calibration
#: an H100-like pod with NVLS: ring bus 360 GB/s, NVLS 260 GB/s, 45 GB/s of NIC per GPU, NCCL's latencies x2 and x3
NVLS_POD = Fabric(8, 64, 360e9, 5e-6, 45e9, 3e-6, True, nvls_bw=260e9, lat_scale=2.0, net_lat_scale=3.0)


def test_nvls_inside_a_node():
    """NVLS: 23 us x lat_scale, then the bytes at nvls_bw whatever the ranks; the fastest wins, so
    a large all-reduce of 8 ranks runs NVLS (260 > 360 x 8/14) and one of 2 the ring (360 > 260)."""
    for p in (3, 5, 8):
        pl = Group(p).placement(8)
        assert nvls_time(NVLS_POD, 1e9, pl) == pytest.approx(2 * 23e-6 + 1e9 / 260e9)
    assert slope(NVLS_POD, "all_reduce", Group(8)) == pytest.approx(1 / 260e9)
    assert slope(NVLS_POD, "all_reduce", Group(2)) == pytest.approx(1 / 360e9)
    ring = replace(NVLS_POD, nvls_bw=0.0)
    assert collective_time(NVLS_POD, "all_reduce", 64, Group(8)) == collective_time(ring, "all_reduce", 64, Group(8))  # LL wins small
    for op in ("all_gather", "reduce_scatter", "all_to_all", "broadcast"):  # NVLS is an all-reduce algorithm here
        assert collective_time(NVLS_POD, op, 1e9, Group(8)) == collective_time(ring, op, 1e9, Group(8))


def test_nvls_tree_across_nodes():
    """NVLSTree: the slower of NVLS and the network (r NICs; halved above two nodes), latency NVLS's
    plus 2 log2(nodes) network levels of 14 us x net_lat_scale; none with one rank per node."""
    two, four = Group(16).placement(8), Group(32).placement(8)
    assert nvls_time(NVLS_POD, 1e9, two) == pytest.approx((2 * 23 + 2 * 1 * 14 * 3) * 1e-6 + 1e9 / 260e9)
    assert nvls_time(NVLS_POD, 1e9, four) == pytest.approx((2 * 23 + 2 * 2 * 14 * 3) * 1e-6 + 1e9 / (8 * 45e9 / 2))
    half = Group(8, 2).placement(8)  # 4 ranks on each of 2 nodes: 4 NICs
    assert nvls_time(NVLS_POD, 1e9, half) == pytest.approx((2 * 23 + 2 * 14 * 3) * 1e-6 + 1e9 / (4 * 45e9))
    assert nvls_time(NVLS_POD, 1e9, Group(16, 8).placement(8)) == math.inf
    ring = replace(NVLS_POD, nvls_bw=0.0)
    assert collective_time(NVLS_POD, "all_reduce", 1e9, Group(16, 8)) == collective_time(ring, "all_reduce", 1e9, Group(16, 8))


def test_latency_scales():
    """lat_scale multiplies NCCL's base and intra-node step latencies, net_lat_scale its network
    steps (and the host's network overhead): one byte, LL ring."""
    f = Fabric(8, 2, 300e9, 5e-6, 25e9, 3e-6, True, lat_scale=2.0, net_lat_scale=3.0)
    assert collective_time(f, "all_gather", 8, Group(8)) == pytest.approx(2 * (6.6 + 7 * 0.6) * 1e-6, rel=1e-3)
    # 16 ranks on 2 nodes: 15 steps, 1 across (LL: 2.7 us), the 14 others at max(0.6 x 2, 1.0 x 3) us
    assert collective_time(f, "all_gather", 16, Group(16)) == pytest.approx((2 * 6.6 + 14 * 3.0 + 3 * 2.7) * 1e-6, rel=1e-3)


def test_p2p_bandwidth():
    f = replace(POD, p2p_bw=200e9)
    assert p2p_time(f, 1e9, same_node=True) == pytest.approx(5e-6 + 1e9 / 200e9)
    assert p2p_time(f, 1e9, same_node=False) == p2p_time(POD, 1e9, same_node=False)


def test_calibrate_scales_the_datasheet_figures():
    intra, net = IntraCalibration("X/nvswitch", 0.5, 0.8, 2.0, 0.6), NetCalibration("ib_roce", 0.9, 3.0)
    f = calibrate(POD, intra, net, nvls=True)
    assert (f.intra_bw, f.p2p_bw, f.nvls_bw, f.inter_bw) == pytest.approx((150e9, 120e9, 180e9, 22.5e9))
    assert (f.lat_scale, f.net_lat_scale, f.intra_source, f.inter_source) == (2.0, 3.0, "X/nvswitch", "ib_roce")
    assert calibrate(POD, intra, net, nvls=False).nvls_bw == 0.0
    assert calibrate(POD, None, None) == POD
    assert calibrate(POD, None, net).intra_bw == POD.intra_bw and calibrate(POD, intra, None).inter_bw == POD.inter_bw


def test_fabric_of_calibrates_the_measured_systems():
    """A100 / H100 NVSwitch nodes and InfiniBand / RoCE take the table's factors; NVLS is on by
    default on H100 only; Omni-Path and V100 / P100 NVLink nodes keep their datasheet figures (a
    P100 / V100 PCIe node: test_a_pcie_node_prices_its_all_reduce_as_the_event_simulator_does)."""
    table = load_table()
    a100, h100 = table["systems"]["A100/nvswitch"], table["systems"]["H100/nvswitch"]
    f = fabric_of(preset_cluster("cluster=superpod_a100"))
    assert (f.intra_source, f.inter_source, f.nvls_bw) == ("A100/nvswitch", "ib_roce", 0.0)
    assert f.intra_bw == pytest.approx(300e9 * a100["bus_eff"]) and f.p2p_bw == pytest.approx(f.intra_bw * a100["p2p_eff"])
    assert f.inter_bw == pytest.approx(25e9 * table["systems"]["ib_roce"]["net_eff"])
    h = fabric_of(preset_cluster("cluster=dgx_h100"))
    assert h.nvls_bw == pytest.approx(450e9 * h100["nvls_eff"]) and h.intra_bw == pytest.approx(450e9 * h100["bus_eff"])
    assert fabric_of(preset_cluster("cluster=dgx_h100", "cluster.intra.nvls=false")).nvls_bw == 0.0
    assert fabric_of(preset_cluster("cluster=parametric")).nvls_bw > 0  # nvls: null, an H100
    assert fabric_of(preset_cluster("cluster=jean_zay_a100")).inter_source == OPA_NET  # Omni-Path: test_omni_path_...
    assert fabric_of(preset_cluster("cluster=jean_zay_a100", "cluster/device=h100_sxm5")).inter_source == "datasheet"
    for overrides in (["cluster=dgx1_v100"], ["cluster=p100x16_4nodes"], ["cluster=parametric", "cluster/device=p100_sxm2"],
                      ["cluster=cpu2"]):
        cl = preset_cluster(*overrides)
        assert fabric_of(cl) == fabric_of(cl, calibrated=False), overrides


def test_omni_path_across_a100_nodes_runs_at_bigscience_measured_rate(tmp_path: Path) -> None:
    """Jean Zay's Omni-Path: every GPU's share of its node's adapters at the efficiency NCCL
    reached there (net_eff, below 1); a ring that crosses each node through one adapter, as NCCL's
    log shows the measured one did, prices that 4 GB all-reduce at each measured trial's time but
    the warm-up; without the measurements the datasheet."""
    import csv

    net = opa_net_calibration()
    assert net is not None and net.name == OPA_NET and 0.05 < net.net_eff < 1.0
    f, raw = fabric_of(preset_cluster("cluster=jean_zay_a100")), fabric_of(preset_cluster("cluster=jean_zay_a100"), calibrated=False)
    assert f.inter_bw == pytest.approx(raw.inter_bw * net.net_eff) and f.intra_bw > raw.inter_bw
    assert fabric_report(f)["inter"]["source"] == OPA_NET
    one_adapter = fabric_of(preset_cluster("cluster=jean_zay_a100", "cluster.nodes=4", "cluster.inter.nics_per_node=1"))
    with OPA_CSV.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        t = collective_time(one_adapter, r["collective"], float(r["bytes"]), Group(int(r["ranks"])))
        if r["use"] == "fit":
            assert t == pytest.approx(float(r["time_s"]), rel=0.01)
        else:  # the warm-up: slower than the calibrated ring, and not what it was calibrated on
            assert float(r["time_s"]) > 2 * t
    assert opa_net_calibration(str(tmp_path / "missing.csv")) is None


def deepbench_ring(cl, nbytes: float, devs: list[int]) -> float:
    """DeepBench's fitted ring (harness.app.kernel_fit.allreduce_fit) for ``devs`` of ``cl``: the
    fit of the measured group size nearest below, of one host or of two."""
    fits = kernel_table()["allreduce"]["fits"]
    multi = len({cl.devices[d].host for d in devs}) > 1
    p = len(devs)
    fit = [f for k, f in sorted((int(k), f) for k, f in fits.items()) if (int(f["nodes"]) > 1) == multi and k <= p][-1]
    return 2 * (p - 1) * fit["alpha_us"] * 1e-6 + 2 * (p - 1) / p * nbytes / (fit["eta"] * cl.ring_bandwidth(devs))


@pytest.mark.parametrize("overrides, gpus", [(["cluster=p100x8"], 8), (["cluster=v100x4_pcie"], 4),
                                             (["cluster=deepbench_p100", "cluster.nodes=2"], 16)])
def test_a_pcie_node_prices_its_all_reduce_as_the_event_simulator_does(overrides: list[str], gpus: int) -> None:
    """A P100 / V100 PCIe node's ring runs at DeepBench's measured all-reduce efficiency, and so
    does InfiniBand across such nodes: the event simulator's all-reduce (the calibrated cost
    model) is the fabric's, and a gradient-sized one costs what DeepBench's fitted ring gives
    within NCCL's and the fit's latency terms; a point-to-point message keeps the datasheet rate;
    the report names the source."""
    cl = preset_cluster(*overrides)
    costs = build(compose(["model=lenet5", *overrides]))[2]
    f, raw = fabric_of(cl), fabric_of(cl, calibrated=False)
    assert f.intra_source == PCIE and f.p2p_bw == pytest.approx(raw.intra_bw)
    assert f.inter_source == (PCIE_NET if f.nodes > 1 else "datasheet")
    for nbytes in (25e6, 259e6):
        event = costs.allreduce_time(nbytes, list(range(gpus)))
        assert collective_time(f, "all_reduce", nbytes, Group(gpus)) == pytest.approx(event, rel=1e-12)
        assert deepbench_ring(cl, nbytes, list(range(gpus))) == pytest.approx(event, rel=0.05)
        assert collective_time(raw, "all_reduce", nbytes, Group(gpus)) < event   # the datasheet ring: faster (an efficiency < 1)
    assert fabric_report(f)["intra"]["source"] == PCIE
    # a PCIe cluster joined by something else than InfiniBand / RoCE keeps its datasheet network
    assert fabric_of(preset_cluster("cluster=p100x8_2containers")).inter_source == "datasheet"


@pytest.mark.parametrize("overrides", [["cluster=superpod_a100", "cluster.nodes=4"], ["cluster=h100_roce", "cluster.nodes=8",
                                                                                       "cluster.inter.pod_nodes=3"],
                                       ["cluster=p100x16_4nodes"], ["cluster=dgx_h100"]])
def test_a_group_of_the_rank_order_is_placed_by_its_hosts_as_by_its_stride(overrides: list[str]) -> None:
    """placement_of (the devices' hosts) gives what Group.placement computes for a group of the
    rank order, and placed_collective_time on it is collective_time, for every collective."""
    cl = preset_cluster(*overrides)
    f = fabric_of(cl)
    for size, stride in itertools.product((1, 2, 3, 4, 8, 16), (1, 2, 3, 4, 8)):
        group = Group(size, stride)
        if group.last_rank() >= f.gpus:
            continue
        pl = placement_of(cl, [k * stride for k in range(size)], f.pod_nodes)
        assert pl == group.placement(f.gpus_per_node, f.pod_nodes), (size, stride)
        for op, nbytes in itertools.product(OPS, (0.0, 3e3, 1.1e8)):
            assert placed_collective_time(f, op, nbytes, size, pl) == collective_time(f, op, nbytes, group), (op, size, stride)


def test_placement_of_an_irregular_group() -> None:
    """Any device set: nodes spanned, most and fewest ranks on one node; a placement that cannot
    hold the ranks or does not fit the fabric is refused."""
    cl = preset_cluster("cluster=superpod_a100", "cluster.nodes=4")
    f = fabric_of(cl)
    assert placement_of(cl, [0, 1, 2, 9]) == Placement(2, 3, 1, 1)
    assert placement_of(cl, [5, 1, 30, 17, 16]) == Placement(3, 2, 1, 1)
    assert placement_of(cl, [24, 8], pod_nodes=2) == Placement(2, 1, 1, 2)
    with pytest.raises(ValueError):
        placement_of(cl, [])
    with pytest.raises(ClusterError):
        placed_collective_time(f, "all_reduce", 1e6, 4, Placement(2, 9, 1, 1))  # 9 ranks on a node of 8
    with pytest.raises(ClusterError):
        placed_collective_time(f, "all_reduce", 1e6, 7, Placement(2, 3, 1, 1))  # 7 ranks do not fit 2 nodes of at most 3
    with pytest.raises(ValueError):
        placed_collective_time(f, "gather", 1e6, 2, Placement(1, 2, 2, 1))


def test_nvls_on_an_a100_is_refused():
    with pytest.raises(ClusterError, match=r"^cluster\.intra\.nvls=true: NVLink SHARP needs third-generation NVSwitch") as e:
        fabric_of(preset_cluster("cluster=superpod_a100", "cluster.intra.nvls=true"))
    assert "\n" not in str(e.value)
    with pytest.raises(ClusterError, match=r"^cluster\.intra\.nvls must be true or false, got 'maybe'"):
        build_cluster("x", DEVICE, 8, intra={"topology": "switch", "cls": "nvlink", "bw_GBps": 450, "nvls": "maybe"})


@pytest.mark.parametrize("overrides", [["cluster=superpod_h100", "cluster.nodes=64"], ["cluster=h100_roce"],
                                       ["cluster=superpod_a100", "cluster.nodes=64"]])
def test_calibrated_fabrics_stay_monotone(overrides):
    """Time non-decreasing in bytes and in the group's size on the calibrated fabrics (NVLS and
    NVLSTree among NCCL's candidates on the H100s)."""
    f = fabric_of(preset_cluster(*overrides))
    for op, stride in itertools.product(OPS, (1, 2, 8)):
        groups = [Group(p, stride) for p in (2, 4, 8, 16, 32, 64) if (p - 1) * stride < f.gpus]
        for group in groups:
            times = [collective_time(f, op, x, group) for x in sorted(SIZES)]
            assert all(b >= a for a, b in zip(times, times[1:])), (op, group)
        for nbytes in (1e3, 1e6, 1e8, 1e10):
            times = [collective_time(f, op, nbytes, g) for g in groups]
            assert all(b >= a for a, b in zip(times, times[1:])), (op, stride, nbytes, times)


def test_fabric_report():
    rep = fabric_report(fabric_of(preset_cluster("cluster=superpod_h100", "cluster.nodes=4")))
    assert rep["intra"]["source"] == "H100/nvswitch" and rep["inter"]["source"] == "ib_roce"
    assert rep["intra"]["nvls_GBps"] > 0 and rep["intra"]["heldout_error"]["intra all-reduce"]["rows"] > 0
    assert "inter-node" in rep["inter"]["heldout_error"]
    plain = fabric_report(fabric_of(preset_cluster("cluster=dgx1_v100")))
    assert plain["intra"]["source"] == "datasheet" and "heldout_error" not in plain["intra"] and "inter" not in plain


@pytest.mark.parametrize("kw", [{"nvls_bw": -1.0}, {"lat_scale": 0.0}, {"net_lat_scale": math.nan}, {"p2p_bw": math.inf}])
def test_refused_calibrated_figures(kw):
    with pytest.raises(ClusterError, match="is not a fabric"):
        replace(POD, **kw)
