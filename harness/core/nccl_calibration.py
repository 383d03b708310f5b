"""The NCCL calibration of the fabric: what NCCL achieves of a cluster's datasheet figures.

``harness/data/nccl_calibration.json`` (written by ``python -m harness.nccl_fit --write`` from
nccl-tests and OSU measurements of A100 and H100 systems, ``harness/data/gpu/a100_h100/nccl.csv``)
holds, per system, the factors :func:`harness.core.fabric.calibrate` applies to a fabric's
datasheet figures before NCCL's tuning model runs on them:

* an NVSwitch node of A100s (``A100/nvswitch``) or H100s (``H100/nvswitch``): ``bus_eff``, the
  ring's bus bandwidth over the NVLink datasheet figure per direction; ``p2p_eff``, a
  point-to-point message's bandwidth over the ring's; ``nvls_eff`` (H100), NVLS's all-reduce
  algorithm bandwidth over the NVLink datasheet figure; ``lat_scale``, the multiplier of NCCL's
  base and intra-node latencies;
* InfiniBand or RoCE across nodes of those GPUs (``ib_roce``): ``net_eff``, the NIC's achieved
  share of its line rate, and ``lat_scale``, the multiplier of NCCL's network latencies.

Each system carries the held-out errors of the classes it was checked on.  A PCIe node takes
the one all-reduce measured on PCIe here, DeepBench's on eight P100s (:func:`pcie_calibration`:
the ring efficiency it measured) and, across nodes over InfiniBand, DeepBench's two-server
all-reduce (:func:`pcie_net_calibration`).  Omni-Path across A100 nodes takes BigScience's
all-reduces on Jean Zay, where BLOOM trained (:func:`opa_net_calibration`).  A cluster no
measurement covers (another GPU's NVSwitch, a cube-mesh node, Omni-Path across other GPUs,
Ethernet) gets ``None`` here, the datasheet model, and says so (:data:`DATASHEET`).
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.core.kernel_model import DATA

#: the committed calibration table
TABLE = DATA / "nccl_calibration.json"
TABLE_FORMAT = 1
#: the label of figures taken from the cluster's datasheet (no calibration)
DATASHEET = "datasheet"
#: device families the measurements cover, by the prefix of a device kind (``cluster.device.kind``);
#: H200 has the H100's NVLink 4 and third-generation NVSwitch
FAMILIES: dict[str, str] = {"A100": "A100", "H100": "H100", "H200": "H100"}
#: NIC link classes (``cluster.inter.cls``) the network calibration covers
NETWORK_CLASSES: tuple[str, ...] = ("ib", "roce")


@dataclass(frozen=True)
class IntraCalibration:
    """What NCCL achieves inside an NVSwitch node of one GPU family (module docstring)."""

    name: str
    bus_eff: float
    p2p_eff: float
    lat_scale: float
    nvls_eff: float = 0.0  # 0: the switch has no NVLink SHARP


@dataclass(frozen=True)
class NetCalibration:
    """What NCCL achieves of the NICs across nodes (module docstring)."""

    name: str
    net_eff: float
    lat_scale: float


def device_family(kind: str) -> str | None:
    """The measured family of a device kind (``A100-SXM4-80GB`` -> ``A100``), None if unmeasured."""
    k = str(kind).upper()
    return next((fam for prefix, fam in FAMILIES.items() if k.startswith(prefix)), None)


@lru_cache(maxsize=8)
def load_table(path: str | None = None) -> dict[str, Any]:
    """The calibration table (``path``, or the committed :data:`TABLE`); an empty one when the
    file is missing, so that every fabric falls back to its datasheet figures."""
    p = Path(path) if path is not None else TABLE
    if not p.exists():
        return {"format": TABLE_FORMAT, "systems": {}}
    table = json.loads(p.read_text())
    if table.get("format") != TABLE_FORMAT:
        raise ValueError(f"{p} has format {table.get('format')!r}, this code reads {TABLE_FORMAT}: regenerate it "
                         f"with python -m harness.nccl_fit --write")
    return table


def intra_calibration(kind: str, table: dict[str, Any] | None = None) -> IntraCalibration | None:
    """The calibration of an NVSwitch node of ``kind`` GPUs, None where none was measured."""
    fam = device_family(kind)
    entry = (table or load_table())["systems"].get(f"{fam}/nvswitch") if fam else None
    if entry is None:
        return None
    return IntraCalibration(f"{fam}/nvswitch", float(entry["bus_eff"]), float(entry["p2p_eff"]), float(entry["lat_scale"]),
                            float(entry.get("nvls_eff", 0.0)))


#: the name a PCIe node's calibration reports (:func:`pcie_calibration`), and the GPU families it
#: applies to: DeepBench's era
PCIE = "DeepBench P100 PCIe all-reduce"
PCIE_FAMILIES: tuple[str, ...] = ("P100", "V100")


@lru_cache(maxsize=1)
def pcie_calibration() -> IntraCalibration | None:
    """A PCIe node's calibration from DeepBench's all-reduces on eight P100s over PCIe (the
    ``allreduce`` fits of ``harness/data/kernel_calibration.json``, one node): the ring's bus
    bandwidth at the measured efficiency ``eta`` of the largest single-node group; a
    point-to-point message at the datasheet rate (no PCIe send was measured); NCCL's latencies
    as they are.  None when the table has no single-node fit.  Read once a process (the
    committed kernel table)."""
    eta = _deepbench_eta(across_nodes=False)
    return None if eta is None else IntraCalibration(PCIE, eta, 1.0 / eta, 1.0)


#: the name the network calibration of PCIe nodes reports (:func:`pcie_net_calibration`)
PCIE_NET = "DeepBench P100 InfiniBand all-reduce"


@lru_cache(maxsize=1)
def pcie_net_calibration() -> NetCalibration | None:
    """The InfiniBand across PCIe nodes of :data:`PCIE_FAMILIES` GPUs, from DeepBench's
    all-reduces on two of its eight-P100 servers (the ``allreduce`` fit of more than one node):
    that ring's bandwidth is bounded by each server's one FDR NIC (the fit's ``ring_GBps`` is the
    NIC's line rate, ``cluster=deepbench_p100 cluster.nodes=2``), so its efficiency ``eta`` is
    what NCCL achieved of the NIC; NCCL's network latencies as they are.  None when the table
    has no fit across nodes.  Read once a process."""
    eta = _deepbench_eta(across_nodes=True)
    return None if eta is None else NetCalibration(PCIE_NET, eta, 1.0)


def _deepbench_eta(across_nodes: bool) -> float | None:
    """The ring efficiency ``eta`` of DeepBench's largest measured all-reduce group on one node or
    across nodes (the ``allreduce`` fits of the committed kernel table), None without such a fit."""
    from harness.core.kernel_model import load_table as kernel_table

    fits = [(int(p), f) for p, f in kernel_table().get("allreduce", {}).get("fits", {}).items()
            if (int(f.get("nodes", 1)) > 1) == across_nodes]
    return float(max(fits, key=lambda pf: pf[0])[1]["eta"]) if fits else None


#: BigScience's all-reduces across Jean Zay's A100 nodes over Omni-Path (:func:`opa_net_calibration`)
OPA_CSV = DATA / "gpu" / "jean_zay_allreduce.csv"
#: the name the Omni-Path calibration reports
OPA_NET = "Jean Zay A100 Omni-Path all-reduce (BigScience)"
#: the NIC class it covers (``cluster.inter.cls``) and the GPU family it was measured on
OPA_CLASS, OPA_FAMILY = "opa", "A100"


@lru_cache(maxsize=2)
def opa_net_calibration(path: str | None = None) -> NetCalibration | None:
    """Omni-Path 100 joining A100 nodes, from BigScience's ``all_reduce_bench`` on four of Jean
    Zay's eight-A100 nodes (``harness/data/gpu/jean_zay_allreduce.csv``, its README): a 4 GB
    all-reduce over the 32 GPUs.  NCCL's log shows the ring's two channels entering every node
    through one host fabric adapter and leaving through another (``nics_crossed_per_node``), so
    its bus bandwidth is what NCCL moved through one adapter each way: ``net_eff`` is that over
    the adapter's line rate (the median of the trials after the warm-up one; the message is so
    large that latency is below 0.01 % of its time, so the ring of :mod:`harness.core.fabric`
    at this efficiency gives the measured time).  NCCL's network latencies as they are (no
    small message was measured).  None without the file.  Read once a process."""
    p = Path(path) if path is not None else OPA_CSV
    if not p.exists():
        return None
    with p.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["use"] == "fit"]
    if not rows:
        return None
    eff = [float(r["busbw_GBps"]) * 8 / (float(r["nic_line_rate_gbps"]) * int(r["nics_crossed_per_node"])) for r in rows]
    return NetCalibration(OPA_NET, float(statistics.median(eff)), 1.0)


def net_calibration(kind: str, nic_cls: str, table: dict[str, Any] | None = None) -> NetCalibration | None:
    """The calibration of InfiniBand / RoCE NICs (``nic_cls``) joining nodes of ``kind`` GPUs
    (the measured systems), of Omni-Path joining A100 nodes (:func:`opa_net_calibration`), None
    for another network or GPU."""
    if nic_cls == OPA_CLASS and device_family(kind) == OPA_FAMILY:
        return opa_net_calibration()
    if nic_cls not in NETWORK_CLASSES or device_family(kind) is None:
        return None
    entry = (table or load_table())["systems"].get("ib_roce")
    if entry is None:
        return None
    return NetCalibration("ib_roce", float(entry["net_eff"]), float(entry["lat_scale"]))


def source_errors(name: str, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """For a report: the held-out errors per class of calibration ``name`` (``heldout_error``:
    class -> median and 90th percentile of |predicted / measured - 1| over the rows the fit never
    saw, and their count), nothing for the datasheet.  The Omni-Path calibration has no rows held
    out (one size of one group, every steady trial in it): its report says so."""
    if name == OPA_NET:
        return {"measurements": {"file": OPA_CSV.name, "held_out": "none: one all-reduce size over one group, every "
                                 "trial but the warm-up fitted (they agree within 1 %)"}}
    entry = (table or load_table())["systems"].get(name)
    if entry is None:
        return {}
    return {"heldout_error": {c: {"median": e["heldout_median_abs_error"], "p90": e["heldout_p90_abs_error"], "rows": e["heldout_rows"]}
                              for c, e in entry.get("heldout", {}).items() if e.get("heldout_rows")},
            "table": TABLE.name}
