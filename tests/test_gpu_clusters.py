"""Datasheet GPU presets and the published testbeds: DGX-1 hybrid cube-mesh, dual-root PCIe,
one NIC per GPU, ring all-reduce bandwidth (all without capture)."""

import hashlib
import json
import math
from pathlib import Path

import pytest
import yaml

from harness.app.compose import compose
from harness.core.cluster import Cluster, ClusterError, build_cluster, device_spec
from harness.app.run import build

DEVICE = {"kind": "test", "peak_tflops": 1.0, "mem_bw_GBps": 100.0, "mem_GiB": 16}
CONF = Path(__file__).resolve().parents[1] / "conf" / "cluster"


def cluster(*overrides: str) -> Cluster:
    return build(compose(list(overrides)))[1]


def link_names(cl: Cluster, i: int, j: int) -> list[str]:
    return [cl.links[l].name for l in cl.routes[i][j]]


def nvlink_bricks(cl: Cluster, brick_GBps: float) -> dict[tuple[int, int], int]:
    """{(i, j): bricks} of the single-link NVLink routes, i < j."""
    out = {}
    for i in range(cl.num_devices):
        for j in range(i + 1, cl.num_devices):
            r = cl.routes[i][j]
            if len(r) == 1 and cl.links[r[0]].cls == "nvlink":
                out[i, j] = round(cl.links[r[0]].bw / (brick_GBps * 1e9))
    return out


# ---------------------------------------------------------------------------- presets


@pytest.mark.parametrize("overrides,devices,hosts,classes", [
    (["cluster=dgx1_p100"], 8, 1, {"nvlink", "pcie", "qpi"}),
    (["cluster=dgx1_v100"], 8, 1, {"nvlink", "pcie", "qpi"}),
    (["cluster=dgx_a100"], 8, 1, {"nvlink"}),
    (["cluster=dgx_h100"], 8, 1, {"nvlink"}),
    (["cluster=h100x32_ndr"], 32, 4, {"nvlink", "pcie", "ib"}),
    (["cluster=deepbench_p100"], 8, 1, {"pcie", "qpi"}),
    (["cluster=deepbench_p100", "cluster.nodes=2"], 16, 2, {"pcie", "qpi", "ib"}),
    (["cluster=dgx1_v100", "cluster.nodes=2"], 16, 2, {"nvlink", "pcie", "qpi", "ib"}),
])
def test_new_presets_build(overrides, devices, hosts, classes):
    cl = cluster(*overrides)
    assert cl.num_devices == devices
    assert len({d.host for d in cl.devices}) == hosts
    assert set(cl.link_classes) == classes
    assert all((len(cl.routes[i][j]) > 0) == (i != j) for i in range(devices) for j in range(devices))


def test_device_presets_follow_the_datasheets():
    def spec(name):
        return device_spec(yaml.safe_load((CONF / "device" / f"{name}.yaml").read_text()))

    tf = 1e12
    assert spec("p100_sxm2").peak_flops == {"float32": 10.6 * tf, "float16": 21.2 * tf}  # no tensor cores
    assert spec("p100_pcie").peak_flops == {"float32": 9.3 * tf, "float16": 18.7 * tf}
    assert spec("v100_sxm2_16gb").peak_flops == {"float32": 15.7 * tf, "float16": 125 * tf}  # no tf32 / bf16
    assert spec("v100_pcie_32gb").peak_flops == {"float32": 14 * tf, "float16": 112 * tf}
    for name, bw, gib in [("a100_sxm4_40gb", 1555, 40), ("a100_sxm4_80gb", 2039, 80)]:
        a = spec(name)
        assert a.peak_flops == {"float32": 19.5 * tf, "tf32": 156 * tf, "bfloat16": 312 * tf, "float16": 312 * tf}
        assert a.mem_bw == bw * 1e9 and a.mem_capacity == gib * 2**30
    h = spec("h100_sxm5")
    assert h.kind == "H100-SXM5-80GB"
    assert h.peak("tf32") == pytest.approx(494.7 * tf) and h.peak("bfloat16") == pytest.approx(989.4 * tf)
    assert h.peak("float32") == 67 * tf


def test_dgx_h100_is_h100x8_with_nics():
    a, b = cluster("cluster=dgx_h100"), cluster("cluster=h100x8")
    assert a.name == "dgx_h100"
    assert [(l.name, l.bw, l.lat) for l in a.links] == [(l.name, l.bw, l.lat) for l in b.links]
    assert a.routes == b.routes


# The links and routes of the presets that existed before the testbeds were added, as the
# builder made them then (sha256 of their names, classes, bandwidths, latencies and routes).
PINNED = [
    (["cluster=p100x4"], "9e2e59ed12ccc852"),
    (["cluster=p100x8"], "44e265ca30dd6adc"),
    (["cluster=p100x8_2containers"], "ded3f983d2cfa9f5"),
    (["cluster=v100x4_pcie"], "326a878a60936b05"),
    (["cluster=h100x8"], "68174d0754b54c3c"),
    (["cluster=h100x16_2nodes"], "bd9c07410b7c9c72"),
    (["cluster=p100x16_4nodes"], "80385be12931c5fd"),
    (["cluster=parametric", "cluster.nodes=3", "cluster.gpus=4"], "08bd6f8ced12efe0"),
]


@pytest.mark.parametrize("overrides,digest", PINNED)
def test_existing_presets_build_the_same_links_and_routes(overrides, digest):
    cl = cluster(*overrides)
    plain = {"links": [[l.id, l.name, l.cls, repr(l.bw), repr(l.lat)] for l in cl.links],
             "routes": [[list(r) for r in row] for row in cl.routes]}
    assert hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16] == digest


# ---------------------------------------------------------------------------- hybrid cube-mesh

QUADS = {(i, j) for q in (range(4), range(4, 8)) for i in q for j in q if i < j}
CUBE = QUADS | {(i, i + 4) for i in range(4)}
# nvidia-smi topo -m of a DGX-1 with V100 (PyTorch's benchmarks/distributed/ddp/README.md)
DGX1V = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
         (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}


@pytest.mark.parametrize("name,brick,per_gpu", [("dgx1_p100", 20, 4), ("dgx1_v100", 25, 6)])
def test_hybrid_cube_mesh(name, brick, per_gpu):
    cl = cluster(f"cluster={name}")
    bricks = nvlink_bricks(cl, brick)
    assert set(bricks) == CUBE
    if name == "dgx1_v100":
        assert bricks == DGX1V
    for g in range(8):
        assert sum(n for (i, j), n in bricks.items() if g in (i, j)) == per_gpu
        # one directional link each way, of the same width
        for h in range(8):
            if (min(g, h), max(g, h)) in bricks:
                assert cl.route_bw[g, h] == cl.route_bw[h, g] == bricks[min(g, h), max(g, h)] * brick * 1e9


@pytest.mark.parametrize("name", ["dgx1_p100", "dgx1_v100"])
def test_pairs_without_nvlink_go_over_pcie_and_qpi(name):
    cl = cluster(f"cluster={name}")
    # every pair without an NVLink is across the sockets (GPUs 0-3 on socket 0, 4-7 on 1)
    for i in range(8):
        for j in range(8):
            if i != j and (min(i, j), max(i, j)) not in CUBE:
                assert [cl.links[l].cls for l in cl.routes[i][j]] == ["pcie", "pcie", "qpi", "pcie", "pcie"]
    assert link_names(cl, 0, 5) == ["gpu0->sw0", "sw0->root0", "root0->root1", "root1->sw2", "sw2->gpu5"]
    assert cl.route_bw[0, 5] == pytest.approx(15.75e9)


def test_dual_root_pcie_tree():
    cl = cluster("cluster=deepbench_p100")
    assert link_names(cl, 0, 1) == ["gpu0->sw0", "sw0->gpu1"]  # same PLX switch
    assert link_names(cl, 0, 2) == ["gpu0->sw0", "sw0->root0", "root0->sw1", "sw1->gpu2"]  # same socket
    assert link_names(cl, 3, 4) == ["gpu3->sw1", "sw1->root0", "root0->root1", "root1->sw2", "sw2->gpu4"]
    assert link_names(cl, 7, 0) == ["gpu7->sw3", "sw3->root1", "root1->root0", "root0->sw0", "sw0->gpu0"]
    qpi = [l for l in cl.links if l.cls == "qpi"]
    assert [l.bw for l in qpi] == [19.2e9, 19.2e9]


# ---------------------------------------------------------------------------- NICs


def test_one_nic_per_gpu_routes():
    cl = cluster("cluster=h100x32_ndr")
    assert link_names(cl, 0, 9) == ["n0/gpu0->nic0", "n0/nic0->net", "net->n1/nic1", "nic1->n1/gpu1"]
    assert link_names(cl, 3, 8 + 5) == ["n0/gpu3->nic3", "n0/nic3->net", "net->n1/nic5", "nic5->n1/gpu5"]
    assert cl.route_bw[0, 9] == pytest.approx(400e9 / 8)
    assert not set(cl.routes[0][8]) & set(cl.routes[1][9])  # rails: GPUs do not share a NIC


def test_nics_shared_by_gpus():
    cl = cluster("cluster=dgx1_v100", "cluster.nodes=2")  # 4 NICs for 8 GPUs: GPU g on NIC g // 2
    assert link_names(cl, 1, 8 + 6) == ["n0/gpu1->nic0", "n0/nic0->net", "net->n1/nic3", "nic3->n1/gpu6"]
    assert set(cl.routes[0][8]) & set(cl.routes[1][9])
    assert not set(cl.routes[0][8]) & set(cl.routes[2][10])


def test_nics_per_node_errors():
    inter = {"bw_gbps": 100}
    for k in (0, 5):
        with pytest.raises(ClusterError, match=r"^cluster\.inter\.nics_per_node: .*$"):
            build_cluster("x", DEVICE, gpus=4, nodes=2, inter={**inter, "nics_per_node": k})


# ---------------------------------------------------------------------------- ring bandwidth


@pytest.mark.parametrize("overrides,group,gbps", [
    (["cluster=dgx1_p100"], range(8), 80),          # 4 bricks x 20 GB/s
    (["cluster=dgx1_v100"], range(8), 150),         # 6 bricks x 25 GB/s
    (["cluster=dgx1_v100"], [0, 3], 50),            # a doubled pair
    (["cluster=dgx1_v100"], [0, 5], 15.75),         # no NVLink: PCIe across QPI
    (["cluster=dgx_a100"], range(8), 300),          # NVSwitch port
    (["cluster=dgx_h100"], range(8), 450),
    (["cluster=h100x8"], range(4), 450),
    (["cluster=deepbench_p100"], range(8), 15.75),  # PCIe 3.0 x16
    (["cluster=h100x32_ndr"], range(16), 400),      # 8 NICs of 400 Gb/s: one ring per NIC
    (["cluster=h100x32_ndr"], [0, 1, 8, 9], 100),   # two NICs used on each host
    (["cluster=deepbench_p100", "cluster.nodes=2"], range(16), 56 / 8),  # one FDR NIC per host
    (["cluster=deepbench_p100", "cluster.nodes=2"], [0, 8], 56 / 8),
    (["cluster=dgx1_v100", "cluster.nodes=2"], range(16), 4 * 12.5),
    (["cluster=dgx1_v100", "cluster.nodes=2"], [0, 1, 8], 12.5),  # GPUs 0 and 1 share NIC 0
])
def test_ring_bandwidth(overrides, group, gbps):
    assert cluster(*overrides).ring_bandwidth(group) == pytest.approx(gbps * 1e9)


def test_ring_bandwidth_edges():
    cl = cluster("cluster=h100x32_ndr")
    assert cl.ring_bandwidth([3]) == math.inf
    assert cl.subset(16).ring_bandwidth(range(16)) == pytest.approx(400e9)
    with pytest.raises(ClusterError, match="distinct device ids"):
        cl.ring_bandwidth([0, 0])
    with pytest.raises(ClusterError, match="distinct device ids"):
        cl.ring_bandwidth([0, 32])
    assert "ring all-reduce 150.0 GB/s per GPU" in cluster("cluster=dgx1_v100").describe()


# ---------------------------------------------------------------------------- bad specs

FALLBACK = {"topology": "pcie_tree", "cls": "pcie", "bw_GBps": 16, "gpus_per_switch": 1}


def mesh(pairs, **extra):
    return {"topology": "nvlink_mesh", "link_GBps": 25, "pairs": pairs, "fallback": FALLBACK, **extra}


@pytest.mark.parametrize("intra,match", [
    (mesh([[0, 4, 1]]), r"^cluster\.intra\.pairs entry \[0, 4, 1\] must name two different GPUs among 0\.\.3$"),
    (mesh([[1, 1, 1]]), r"^cluster\.intra\.pairs entry \[1, 1, 1\]"),
    (mesh([[0, 1, 1], [1, 0, 2]]), r"^cluster\.intra\.pairs lists GPUs 0 and 1 twice$"),
    (mesh([[0, 1, 0]]), r"^cluster\.intra\.pairs entry \[0, 1, 0\]: nlinks must be >= 1$"),
    (mesh([[0, 1]]), r"^cluster\.intra\.pairs entry \[0, 1\] is not \[i, j, nlinks\]$"),
    (mesh(None), r"^cluster\.intra\.pairs must be a list"),
    ({**mesh([[0, 1, 1]]), "fallback": None}, r"^cluster\.intra\.fallback is missing: GPUs 0 and 2 have no NVLink"),
    ({**mesh([[0, 1, 1]]), "link_GBps": None}, r"^cluster\.intra\.link_GBps is missing"),
    (mesh([[0, 1, 1]], fallback={**FALLBACK, "sockets": 3}), r"^cluster\.intra\.fallback\.sockets: 3 socket\(s\) cannot share the 4 PCIe switch\(es\) evenly$"),
    ({**FALLBACK, "gpus_per_switch": 2, "sockets": 2}, r"^cluster\.intra\.qpi is missing"),
    ({**FALLBACK, "gpus_per_switch": 2, "sockets": 0}, r"^cluster\.intra\.sockets: 0 socket"),
])
def test_bad_specs(intra, match):
    with pytest.raises(ClusterError, match=match) as e:
        build_cluster("x", DEVICE, gpus=4, intra=intra)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------- runtime memory
def test_runtime_memory_comes_off_what_the_tensors_may_take() -> None:
    """``cluster.runtime_GiB`` (what the CUDA context and NCCL hold) lowers every device's
    capacity by exactly that much and is kept beside it; 0 by default."""
    bare = build_cluster("x", DEVICE, gpus=2)
    held = build_cluster("x", DEVICE, gpus=2, runtime_GiB=1.5)
    assert bare.devices[0].spec.runtime_bytes == 0 and bare.mem_capacity[0] == 16 * 2**30
    assert held.devices[1].spec.runtime_bytes == int(1.5 * 2**30)
    assert (held.mem_capacity == 16 * 2**30 - int(1.5 * 2**30)).all()


def test_the_allocators_reserve_divides_what_the_tensors_may_take() -> None:
    """``cluster.allocator_reserve`` (the caching allocator's pool per byte of tensors): the tensors
    may take what the runtime leaves over it, and the spec keeps it; 1 by default."""
    held = build_cluster("x", DEVICE, gpus=2, runtime_GiB=1.0, allocator_reserve=1.25)
    assert held.devices[0].spec.alloc_reserve == 1.25 and build_cluster("x", DEVICE, gpus=2).devices[0].spec.alloc_reserve == 1.0
    assert (held.mem_capacity == int((16 * 2**30 - 2**30) / 1.25)).all()


def test_jean_zays_reserve_is_bigsciences_logs_median() -> None:
    """Jean Zay's ``allocator_reserve`` is the median over the runs of
    ``harness/data/llm/allocator_reserve.csv`` (each run one vote), to the two decimals the preset gives."""
    import pandas as pd

    from harness.app.compose import CONF

    runs = pd.read_csv(CONF.parent / "harness" / "data" / "llm" / "allocator_reserve.csv")
    assert len(runs) == 10 and (runs["reserve_min"] <= runs["reserve_median"]).all() and (runs["reserve_median"] <= runs["reserve_max"]).all()
    spec = cluster("model=lenet5", "cluster=jean_zay_a100").devices[0].spec
    assert spec.alloc_reserve == pytest.approx(round(float(runs["reserve_median"].median()), 2), abs=1e-12)
    assert spec.mem_capacity == int((80 * 2**30 - int(2.99 * 2**30)) / spec.alloc_reserve)


@pytest.mark.parametrize("name, gib", [("jean_zay_a100", 2.99), ("superpod_a100", 2.0), ("superpod_h100", 2.0),
                                       ("torchtitan_h100", 2.0), ("dgx_h100", 2.0), ("p100x8", 0.0)])
def test_presets_hold_their_sourced_runtime_memory(name: str, gib: float) -> None:
    cl = cluster("model=lenet5", f"cluster={name}")
    assert cl.devices[0].spec.runtime_bytes == int(gib * 2**30)


def test_a_plan_that_fits_the_datasheet_but_not_beside_the_runtime_is_oom(tmp_path: Path) -> None:
    """The OOM verdict counts the runtime: a BLOOM stage of 78.6 GiB of tensors (TP2 PP6, mb2:
    the sweep's OOM row) fits 80 GiB alone and not beside Jean Zay's 2.99 GiB; result.json says
    what the runtime held."""
    from harness.app.run import run

    base = ["model=bloom_176b", "model.layers=72", "model.heads=64", "model.kv_heads=64", "cluster=jean_zay_a100",
            "algo=megatron", "algo.tp=2", "algo.pp=6", "algo.dp=32", "algo.micro_batch=2", "algo.recompute=full", "algo.zero=1",
            "algo.overlap_grad_reduce=false", "algo.overlap_param_gather=false", "precision=amp_fp16", "output.gantt=false",
            "output.trace=false", "output.worth=false", "cluster.allocator_reserve=1"]
    rows = {}
    for gib in (0, 2.99):
        rows[gib] = run(compose([*base, f"cluster.runtime_GiB={gib}", f"hydra.run.dir={tmp_path / str(gib)}"])).row
    peak = rows[0]["peak_memory_max_bytes"]
    assert peak == rows[2.99]["peak_memory_max_bytes"]
    assert peak < 80 * 2**30 < peak + int(2.99 * 2**30)
    assert not rows[0]["oom"] and rows[2.99]["oom"]
    assert rows[0]["mem_runtime_bytes"] == 0 and rows[2.99]["mem_runtime_bytes"] == int(2.99 * 2**30)
    assert rows[0]["mem_allocator_reserve"] == 1.0


def test_the_summary_says_what_the_runtime_and_the_allocator_hold() -> None:
    from harness.app.summary import stack_lines

    row = {"peak_memory_bytes": [40 * 2**30], "mem_capacity_bytes": [64 * 2**30], "mem_runtime_bytes": 3 * 2**30,
           "mem_allocator_reserve": 1.2}
    memory = dict(stack_lines(row))["memory per GPU"]
    assert "the CUDA context and NCCL hold 3.0 GiB more; the allocator's pool 1.2x the tensors" in memory
    assert "allocator" not in dict(stack_lines({**row, "mem_allocator_reserve": 1.0}))["memory per GPU"]

