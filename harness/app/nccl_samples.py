"""The rows of ``nccl.csv`` as samples of the fabric's NCCL model, or why a row is left out.

``harness/data/gpu/a100_h100/nccl.csv`` (a copy of the project's shared measurements, see that
directory's README) holds 270 rows of very different kinds: full nccl-tests sweeps, single
points, bars read off NVIDIA's slides, lines read off plots, OSU benchmarks, copy-engine
bandwidths, DeepEP kernels.  :func:`load` turns each into a :class:`Sample` - the system's
datasheet fabric (:class:`harness.core.fabric.Fabric`: NVLink per direction from the GPU's
datasheet, each GPU's share of its node's NICs at their line rate), which calibration applies
to it, the collective, the ranks, the bytes and the measured seconds - or a :class:`Left` with
the reason, so that no row is silently dropped.

Measured seconds: the row's time where it has one (nccl-tests' out-of-place column); else from
its bus bandwidth by nccl-tests' definitions (all-reduce: algbw x 2(n-1)/n; all-gather,
reduce-scatter, all-to-all: x (n-1)/n; send/receive: x 1); a row without a size (a slide's bar,
a quoted peak) is the plateau, taken at :data:`PLATEAU_BYTES`, where latency is negligible.

``use``: ``fit`` rows may be drawn into the fit's training split; ``check`` rows never are
(their setup is partly assumed, or their class has no factor of its own: the all-gathers,
reduce-scatters and all-to-alls are predicted from factors fitted on all-reduces).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.fabric import Fabric
from harness.core.kernel_model import DATA

NCCL_CSV = DATA / "gpu" / "a100_h100" / "nccl.csv"
#: the error classes of the calibration
CLASSES: tuple[str, ...] = ("intra all-reduce", "intra all-gather / reduce-scatter", "inter-node", "all-to-all", "p2p")
#: NVLink bandwidth per GPU per direction (bytes/s): A100 datasheet (2021), 600 GB/s bidirectional
#: (12 NVLink 3 links); H100 SXM5 datasheet (2023), 900 GB/s bidirectional (18 NVLink 4 links; H200 the same)
NVLINK = {"A100": 300e9, "H100": 450e9}
#: the size a row without one (a plateau) is taken at
PLATEAU_BYTES = 2.0 ** 36
#: link latencies a point-to-point message pays (the presets' assumed figures: conf/cluster/dgx_a100.yaml)
NVLINK_LAT, NIC_LAT = 5e-6, 3e-6
GB = 1e9
#: nccl-tests' bus-bandwidth factor per collective, for n ranks
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_to_all": lambda n: (n - 1) / n, "p2p": lambda n: 1.0}


@dataclass(frozen=True)
class Sample:
    """One measured collective on a system described by its datasheet figures."""

    row: int  # 0-based row of nccl.csv
    cls: str  # one of CLASSES
    system: str  # the stratum of the split: class and system
    use: str  # "fit" or "check"
    base: Fabric  # the datasheet fabric
    family: str  # the GPU family whose NVSwitch calibration applies ("" for none)
    net: bool  # the InfiniBand / RoCE calibration applies
    nvls: bool  # NCCL may run NVLS / NVLSTree
    op: str  # a collective of harness.core.fabric.OPS, or "p2p"
    ranks: int
    nbytes: float
    time_s: float
    note: str = ""
    reading: str = "measured"  # "measured", or "plot" / "slide": read off a published figure (its uncertainty in the CSV)


@dataclass(frozen=True)
class Left:
    """A row left out, and why."""

    row: int
    reason: str


def number(cell: Any) -> float:
    """The first number in a cell (``~96 (peak)`` -> 96, ``371-377`` -> 371), NaN if none."""
    m = re.search(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", str(cell)) if cell is not None else None
    return float(m.group()) if m else math.nan


def node_fabric(family: str, gpus: int, nodes: int, nic_GBps: float = 0.0, rail: bool = True) -> Fabric:
    """The datasheet fabric of ``nodes`` NVSwitch nodes of ``gpus`` GPUs, each GPU with ``nic_GBps``
    of its node's NICs (line rate / 8 bits)."""
    return Fabric(gpus, nodes, NVLINK[family] if gpus > 1 else 0.0, NVLINK_LAT if gpus > 1 else 0.0,
                  nic_GBps * GB if nodes > 1 else 0.0, NIC_LAT if nodes > 1 else 0.0, rail)


def _seconds(r: dict[str, Any], op: str, ranks: int) -> tuple[float, float, str]:
    """(bytes, measured seconds, note) of a row (module docstring)."""
    nbytes, t = number(r["bytes"]), number(r["time_us"]) * 1e-6
    busbw, algbw = number(r["busbw"]), number(r["algbw"])
    note = ""
    if not nbytes > 0 or "sweep" in str(r["bytes"]) or "up to" in str(r["bytes"]):
        if "sweep" in str(r["bytes"]):  # "8..134217728 sweep": its peak, at its largest size
            nbytes, t, note = float(str(r["bytes"]).split("..")[-1].split()[0]), math.nan, "the sweep's peak, at its largest size"
        else:
            nbytes, t, note = PLATEAU_BYTES, math.nan, "no size: the plateau"
    if not t > 0:
        if busbw > 0:
            t = nbytes * BUS_FACTOR[op](ranks) / (busbw * GB)
        elif algbw > 0:
            t = nbytes / (algbw * GB)
    return nbytes, t, note


def classify(i: int, r: dict[str, Any]) -> Sample | Left:
    """Row ``i`` of nccl.csv as a sample, or why it is left out (rules in order; the first that
    matches decides)."""
    system, coll, how = str(r["gpu_system"]), str(r["collective"]), str(r["how_measured"])
    left = _left_out(system, coll, how)
    if left:
        return Left(i, left)
    nodes_cell, gpn_cell = str(r["nodes"]), str(r["gpus_per_node"])
    nodes = int(number(nodes_cell)) if nodes_cell.strip().isdigit() else 4  # the GTC slides' "> 1": their other slide's 4 x 8
    gpn = int(number(gpn_cell)) if gpn_cell.strip().isdigit() else 8
    family = "A100" if any(k in system for k in ("A100", "BM.GPU4.8", "NVL3")) else "H100"  # BM.GPU4.8: OCI's 8 x A100 shape
    op = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter", "all_to_all": "all_to_all",
          "sendrecv": "p2p", "p2p_bw": "p2p"}[coll.split(" ")[0]]
    nvls = ("NVLS" in coll or "SHARP" in system) and "NVLS off" not in coll and "NVLS_ENABLE=0" not in coll
    use, note, nic = "fit", "", 0.0
    if nodes > 1 or (op == "p2p" and gpn == 1):
        nic, nvls, note = _network(system, coll, family)
        if "paper: up to 2048" in system:
            use = "check"
    if op in ("all_gather", "reduce_scatter", "all_to_all") or (op == "p2p" and nodes > 1):
        use = "check"
    cls = ("p2p" if op == "p2p" else "all-to-all" if op == "all_to_all" else "inter-node" if nodes > 1
           else "intra all-reduce" if op == "all_reduce" else "intra all-gather / reduce-scatter")
    ranks = 2 if op == "p2p" else nodes * gpn
    nbytes, t, size_note = _seconds(r, op, ranks)
    if not (t > 0 and math.isfinite(t)):
        return Left(i, "no time, bus or algorithm bandwidth to compare")
    label = f"{family} {'NVLS' if nvls else 'ring'}" if cls != "p2p" else family
    base = node_fabric(family, gpn if op != "p2p" or nodes == 1 else 1, nodes if op != "p2p" else max(nodes, 1), nic)
    if op == "p2p" and nodes == 1:
        base = node_fabric(family, 8, 1)
    notes = "; ".join(x for x in (note, size_note, "H200 (H100's NVLink 4 / NVSwitch)" if "H200" in system else "") if x)
    reading = "plot" if "READ OFF PLOT" in how else "slide" if "READ OFF SLIDE" in how else "measured"
    return Sample(i, cls, f"{cls}: {label}", use, base, family if (nodes == 1 or gpn > 1) else "", nodes > 1, nvls, op,
                  ranks, nbytes, t, notes, reading)


def _left_out(system: str, coll: str, how: str) -> str:
    """Why a row is not a sample of this calibration ("" when it is one)."""
    rules = (
        (coll.startswith("moe_dispatch"), "DeepEP's dispatch / combine kernels, not NCCL"),
        (coll.startswith(("h2d_bw", "d2h_bw")), "a host <-> device copy, not a collective"),
        (coll.startswith("p2p_latency"), "MPI (UCX) latency, not NCCL's"),
        ("p2pBandwidthLatencyTest" in coll or "nvbandwidth" in coll or "(NVLink, unidirectional)" in coll,
         "a copy-engine copy (p2pBandwidthLatencyTest / nvbandwidth / vendor test), not NCCL"),
        ("osu_bw D->D)" in coll and "1 NIC" not in coll and "2 NICs" not in coll, "an MPI (UCX) copy over NVLink, not NCCL"),
        ("H800" in system, "H800: reduced NVLink (another fabric); the algorithm is not stated"),
        ("PCIe" in system, "a PCIe or NVLink-bridge system: no NVSwitch, the datasheet model"),
        ("V100" in system, "V100 (DGX-1 hybrid cube-mesh): outside the A100 / H100 calibration"),
        (re.match(r"^(\d+x)?\d+Gb(E| RDMA)", system) is not None, "the GPUs, GPUs per node and NICs per GPU are not stated"),
        ("SHARP" in system and "NVLink4" not in system, "in-network reduction (InfiniBand SHARP / CollNet) is not modelled"),
        ("peak expectation" in coll, "a maintainer's expectation, not a measurement"),
        ("HPE Apollo" in system, "a user's report of an under-performing node (the maintainer: it should reach ~230 GB/s)"),
        ("x2, cluster network RoCEv2 16x100Gbps" in system and "horovod" in how,
         "an untuned run (its source's tuned runs of the same nodes reach 170-192 GB/s at 10 GiB; this one plateaus at 72 "
         "and dips at 16-256 MB)"),
        ("A3 Mega" in system, "GPUDirect-TCPXO (not InfiniBand / RoCE); the network is not stated in the file"),
    )
    return next((reason for hit, reason in rules if hit), "")


def _network(system: str, coll: str, family: str) -> tuple[float, bool, str]:
    """(each GPU's NIC share in GB/s, NCCL may run NVLSTree, note) of a multi-node row."""
    if "OCI BM.GPU4.8" in system:
        if "1 NIC" in coll:
            return 12.5, False, "one 100 Gb/s NIC"
        if "2 NICs" in coll:
            return 25.0, False, "two 100 Gb/s NICs"
        return 16 * 12.5 / 8, False, "OCI BM.GPU4.8: 16 x 100 Gb/s RoCE per node"
    if "OCI BM.GPU.H100.8" in system:
        return 16 * 25.0 / 8, True, "OCI BM.GPU.H100.8: 16 x 200 Gb/s RoCE per node; NCCL 2.21.5 runs NVLSTree"
    if system.startswith("H100 cluster"):  # the NVLSTree plot and Fernandez et al.'s: nodes and NICs not named
        return 50.0, True, "DGX H100-class: 8 x 400 Gb/s per node assumed; NVLSTree (NCCL's default)"
    if "4x HDR" in system:
        return 4 * 25.0 / 8, False, "4 x 200 Gb/s HDR per node of 8"
    if "DGX A100" in system:
        return 25.0, False, "DGX A100: 8 x 200 Gb/s HDR per node; 4 nodes"
    if "DGX H100" in system:
        return 50.0, False, "DGX H100: 8 x 400 Gb/s NDR per node; 4 nodes; the slide's bar without SHARP"
    raise ValueError(f"no network rule for the multi-node row {system!r}: add one to nccl_samples._network")


def load(path: Path = NCCL_CSV) -> tuple[list[Sample], list[Left]]:
    """Every row of ``path`` as a sample or a reason."""
    import pandas as pd

    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    samples: list[Sample] = []
    left: list[Left] = []
    for i, r in enumerate(df.to_dict("records")):
        s = classify(i, r)
        (samples if isinstance(s, Sample) else left).append(s)  # type: ignore[arg-type]
    return samples, left
