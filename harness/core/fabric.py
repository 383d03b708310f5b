"""The cluster's fabric as a collective sees it, for plans that never ask for per-pair routes.

A :class:`Fabric` is a cluster reduced to what a symmetric parallel plan needs: nodes of
``gpus_per_node`` GPUs behind NVSwitch (or PCIe), every GPU's share of its node's NICs across
nodes, the network's shape (rail-optimised or not, full-bisection pods joined by oversubscribed
links).  :func:`fabric_of` reads it off a :class:`~harness.core.cluster.Cluster` (any preset:
the NVSwitch presets, the PCIe and hybrid cube-mesh ones, one node or many), looking up a few
routes of host 0 and never the D x D tables, so it works at any size.

A :class:`Group` is a process group of Megatron-LM's rank order (:func:`rank_layout`): ``size``
ranks ``stride`` apart.  Every group of a kind runs at once (all TP ranks' DP groups reduce
together), so each GPU has its own share of the node's NICs, and a group's time is the time of
the group that holds rank 0.

:func:`collective_time` is NCCL's own cost model (``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime`` in ``src/graph/tuning.cc``, NVIDIA/nccl@b6475625, NCCL 2.19) with the
bus bandwidth taken from the fabric instead of NCCL's topology search: for each algorithm (ring;
tree for an all-reduce across nodes) and protocol (LL, LL128, Simple), a base latency plus a
latency per step (NVLink, PCI or network hop), plus the bytes over the algorithm bandwidth; the
fastest wins, as NCCL picks it.  That is the message-size-dependent bandwidth: small messages
pay latency and LL's quarter bandwidth, large ones approach the bus bandwidth (see
:data:`NCCL_REF` for what is taken and what is left out).  Hierarchy: a group inside one node
moves its bytes over NVSwitch at ``intra_bw``; one across nodes runs NCCL's pipelined rings (or
trees), whose rate is that of the slower hop kind, ``min(intra_bw, r * inter_bw)`` with ``r`` its
ranks on a node (one ring per NIC, GPU g on rail g), and whose latency counts each step at its
hop's figure.

NVLink SHARP (NVLS, :func:`nvls_time`): on an H100 NVSwitch node NCCL (2.17 and later, on by
default where the switches support multicast) also runs an all-reduce as NVLS inside a node and
NVLSTree across nodes; it is one more candidate of the fastest-wins choice, all-reduce only.

Calibration (:mod:`harness.core.nccl_calibration`): :func:`fabric_of` takes the datasheet
figures of the cluster and, where nccl-tests measured a system like it (A100 / H100 NVSwitch
nodes, InfiniBand / RoCE across nodes), scales them by what NCCL achieved of them (the ring's
bus bandwidth, NVLS's, a point-to-point message's, the NIC's) and NCCL's latency table by the
fitted factors; a P100 / V100 PCIe node, and InfiniBand across such nodes, at DeepBench's
measured all-reduce efficiencies; a fabric without measurements keeps the datasheet figures, and
:func:`fabric_report` says which a job used.  The tuning model itself is NCCL's; only the
figures it is given are fitted, to kernel-level measurements, never to training runs.

Both simulators price collectives here: the stack simulator with :func:`collective_time` on
its groups of the rank order, the event simulator (the calibrated cost model's
``allreduce_time``) with :func:`placed_collective_time` on whatever devices a strategy chose,
placed by their hosts (:func:`placement_of`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from harness.core.checks import positive_int
from harness.core.cluster import Cluster
from harness.core.errors import ClusterError, OptionError
from harness.core.nccl_calibration import (DATASHEET, NETWORK_CLASSES, PCIE_FAMILIES, IntraCalibration, NetCalibration,
                                           intra_calibration, net_calibration, pcie_calibration, pcie_net_calibration,
                                           source_errors)

#: the collectives :func:`collective_time` costs
OPS: tuple[str, ...] = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")
PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")
#: where every constant below comes from
NCCL_REF = "NVIDIA/nccl@b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2 src/graph/tuning.cc (NCCL 2.20.3, makefiles/version.mk)"
US = 1e-6
#: baseLat (us) per algorithm, by protocol (LL, LL128, Simple)
BASE_LAT: dict[str, tuple[float, ...]] = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
#: hwLat (us): the latency of one step by hop kind and algorithm, by protocol
HW_LAT: dict[str, dict[str, tuple[float, ...]]] = {
    "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0)},
}
#: getNetOverhead on an x86 Intel host (us), three times for Simple: the floor of an inter-node ring's intra steps
NET_OVERHEAD = 1.0
#: llMaxBws (GB/s): LL's bandwidth cap inside one node (Ampere and Hopper), and across 2 and more nodes (Intel host)
LL_MAX_BW: tuple[float, ...] = (87.7, 39.0, 20.4)
#: the "plateau effect of ring": a multi-node ring all-reduce in Simple pays this much more latency (compute capability >= 8.0)
RING_PLATEAU = 1.4
#: treeCorrectionFactor: the tree's bandwidth at sizes 64 B x 2^k (k = 0..22) by protocol
TREE_CORRECTION: tuple[tuple[float, ...], ...] = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
INTRA_LINKS: tuple[str, ...] = ("nvlink", "pci")
#: NVLS's latency (us): hwLat[NVLINK][NVLS][Simple] (its baseLat is 0; NVLS runs Simple only)
NVLS_LAT = 23.0
#: NVLSTree's latency per network level (us): hwLat[NET][NVLS_TREE][Simple]
NVLS_TREE_NET_LAT = 14.0


@dataclass(frozen=True)
class Fabric:
    """Nodes of GPUs behind one switch (or PCIe tree) and the network across them.

    Bandwidths are bytes/s per GPU per direction when every GPU of a node communicates at once
    (the symmetric plans: every TP rank's DP group reduces together): ``inter_bw`` is a GPU's
    share of its node's NICs, ``nics_per_node * nic_bw / gpus_per_node``, capped by its link to
    the NIC.  0 where there is nothing to cross (one GPU per node, one node).  ``intra_link``
    picks NCCL's per-step latencies inside a node; ``pod_nodes`` nodes form a full-bisection pod
    (0: the whole fabric is one) and traffic between pods has ``1 / pod_oversubscription`` of
    the NICs' bandwidth (Llama 3's RoCE cluster: pods of 3,072 GPUs, 1:7 above them).
    """

    gpus_per_node: int
    nodes: int
    intra_bw: float
    intra_lat: float
    inter_bw: float
    inter_lat: float
    rail_optimized: bool
    intra_link: str = "nvlink"
    pod_nodes: int = 0
    pod_oversubscription: float = 1.0
    #: NVLS's all-reduce algorithm bandwidth inside a node (bytes/s); 0: NCCL has no NVLS here
    nvls_bw: float = 0.0
    #: multipliers of NCCL's latency table: its base and intra-node step latencies (and NVLS's), its network steps
    lat_scale: float = 1.0
    net_lat_scale: float = 1.0
    #: a point-to-point message's bandwidth inside a node (bytes/s); 0: ``intra_bw``
    p2p_bw: float = 0.0
    #: where the figures inside a node and across nodes come from: "datasheet" or a calibration's name
    intra_source: str = DATASHEET
    inter_source: str = DATASHEET

    def __post_init__(self) -> None:
        bad = [k for k, v in (("intra_bw", self.intra_bw), ("intra_lat", self.intra_lat), ("inter_bw", self.inter_bw),
                              ("inter_lat", self.inter_lat), ("nvls_bw", self.nvls_bw), ("p2p_bw", self.p2p_bw))
               if not (math.isfinite(v) and v >= 0)]
        scales_ok = all(math.isfinite(v) and v > 0 for v in (self.lat_scale, self.net_lat_scale))
        if self.gpus_per_node < 1 or self.nodes < 1 or bad or not scales_ok or self.intra_link not in INTRA_LINKS \
                or self.pod_nodes < 0 or not self.pod_oversubscription >= 1 or (self.gpus_per_node > 1 and self.intra_bw <= 0) \
                or (self.nodes > 1 and self.inter_bw <= 0):
            raise ClusterError(f"fabric {self} is not a fabric: counts >= 1, bandwidths > 0 where there is something to cross, "
                               f"latencies >= 0, latency scales > 0, intra_link one of {', '.join(INTRA_LINKS)}, "
                               f"pod_oversubscription >= 1")

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def node_of(self, rank: int) -> int:
        """The node of global rank ``rank`` (ranks fill node 0 first)."""
        return rank // self.gpus_per_node

    def pod_of(self, rank: int) -> int:
        """The pod of global rank ``rank`` (0 everywhere when the fabric is one pod)."""
        return self.node_of(rank) // self.pod_nodes if self.pod_nodes else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Placement:
    """Where the ranks of the group that holds rank 0 sit."""

    nodes: int  # nodes spanned
    ranks_per_node: int  # the most ranks on one node
    min_ranks_per_node: int  # the fewest: a ring enters and leaves every node, through that many NICs
    pods: int  # pods spanned


@dataclass(frozen=True)
class Group:
    """A process group: ``size`` ranks ``stride`` apart in the global rank order."""

    size: int
    stride: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or isinstance(self.stride, bool) or int(self.size) != self.size \
                or int(self.stride) != self.stride or self.size < 1 or self.stride < 1:
            raise ValueError(f"a group needs a size and a stride >= 1, got {self.size}, {self.stride}")

    def placement(self, gpus_per_node: int, pod_nodes: int = 0) -> Placement:
        """Nodes and pods spanned, ranks per node (most and fewest)."""
        return _placement(int(self.size), int(self.stride), gpus_per_node, pod_nodes)

    def nodes_spanned(self, gpus_per_node: int) -> int:
        return self.placement(gpus_per_node).nodes

    def ranks_per_node(self, gpus_per_node: int) -> int:
        return self.placement(gpus_per_node).ranks_per_node

    def last_rank(self) -> int:
        return (self.size - 1) * self.stride


@lru_cache(maxsize=4096)
def _placement(size: int, stride: int, g: int, pod_nodes: int) -> Placement:
    """Consecutive ranks k * stride differ by at most one node (pod) when stride <= g (g * pod_nodes),
    so the nodes (pods) spanned are every one from the first to the last."""
    span = (size - 1) * stride
    nodes = size if stride >= g else span // g + 1
    pods = 1 if not pod_nodes else size if stride >= g * pod_nodes else span // (g * pod_nodes) + 1
    if stride >= g:
        return Placement(nodes, 1, 1, pods)
    counts = np.bincount(np.arange(size, dtype=np.int64) * stride // g)
    counts = counts[counts > 0]
    return Placement(nodes, int(counts.max()), int(counts.min()), pods)


def rank_layout(tp: int, cp: int, ep: int, dp: int, pp: int) -> dict[str, Group]:
    """The process groups of Megatron-LM's rank order (``megatron/core/parallel_state.py``,
    ``RankGenerator`` with order ``tp-cp-ep-dp-pp``): TP fastest, then CP, then DP, then PP.
    Experts re-split the CP x DP ranks as EP x expert-DP with EP right after TP (Megatron-core's
    expert ``RankGenerator``, expert TP = TP).  Keys: ``tp``, ``cp``, ``dp``, ``pp`` (the stride
    between stages), ``ep``, ``edp`` (the experts' data-parallel group), ``dp_cp`` (the ranks the
    distributed optimizer shards over)."""
    tp, cp, ep, dp, pp = (positive_int(v, f"algo.{k}") for k, v in (("tp", tp), ("cp", cp), ("ep", ep), ("dp", dp), ("pp", pp)))
    if (dp * cp) % ep:
        raise OptionError(f"algo.ep={ep} does not divide algo.dp x algo.cp = {dp * cp}: Megatron-LM's experts split the "
                          f"data-parallel ranks")
    return {"tp": Group(tp, 1), "cp": Group(cp, tp), "dp": Group(dp, tp * cp), "pp": Group(pp, tp * cp * dp),
            "ep": Group(ep, tp), "edp": Group(dp * cp // ep, tp * ep), "dp_cp": Group(dp * cp, tp)}


def fabric_of(cluster: Cluster, calibrated: bool = True) -> Fabric:
    """The fabric of ``cluster`` (any preset).  Its datasheet figures: ``intra_bw`` is the ring
    bandwidth of host 0's GPUs (:meth:`Cluster.ring_bandwidth`: the NVSwitch port, the NVLink
    bricks of a cube-mesh, a PCIe tree's bottleneck), ``intra_lat`` the latency of the route
    between its first two GPUs; ``inter_bw`` a GPU's share of its node's NICs capped by the
    bottleneck of its route to another node (``host_link``, the NIC), ``inter_lat`` that route's
    latency; the network's shape from ``cluster.inter`` (rail_optimized, pod_nodes,
    pod_oversubscription).  ``calibrated`` (the default): then scaled by the NCCL calibration
    where one covers the cluster (:func:`calibrate`), with NVLS where ``cluster.intra.nvls`` says
    so (default: on for an H100 NVSwitch node, as NCCL >= 2.17 runs it)."""
    meta, devs = cluster.meta, cluster.devices
    g = int(meta.get("gpus_per_node", sum(d.host == devs[0].host for d in devs)))
    nodes = int(meta.get("nodes", len({d.host for d in devs})))
    if g * nodes != cluster.num_devices:
        raise ClusterError(f"cluster {cluster.name!r} is not nodes of equal size ({cluster.num_devices} devices, {g} on its first host)")
    host0 = [d.id for d in devs if d.host == devs[0].host]

    def latency(route: tuple[int, ...]) -> float:
        return sum(cluster.link(lid).lat for lid in route)

    intra_bw = intra_lat = inter_bw = inter_lat = 0.0
    intra_link, nic_cls = "nvlink", ""
    if g > 1:
        intra_bw = cluster.ring_bandwidth(host0)
        intra_lat = latency(cluster.route(host0[0], host0[1]))
        classes = {cluster.link(lid).cls for b in host0[1:] for lid in cluster.route(host0[0], b)}
        intra_link = "nvlink" if "nvlink" in classes else "pci"
    if nodes > 1:
        other = next(d.id for d in devs if d.host != devs[0].host)
        route = cluster.route(host0[0], other)
        if "nic_bw" not in meta:
            raise ClusterError(f"cluster {cluster.name!r} spans hosts but does not describe its NICs (meta nic_bw, nics_per_node)")
        inter_bw = min(min(cluster.link(lid).bw for lid in route), meta["nic_bw"] * meta.get("nics_per_node", 1) / g)
        inter_lat = latency(route)
        nic_cls = "+".join(sorted({cluster.link(lid).cls for lid in route} - {"pcie", "pci", "nvlink"}))
    fabric = Fabric(g, nodes, float(intra_bw), float(intra_lat), float(inter_bw), float(inter_lat),
                    bool(meta.get("rail_optimized", False)), intra_link, int(meta.get("pod_nodes", 0)),
                    float(meta.get("pod_oversubscription", 1.0)))
    if not calibrated:
        return fabric
    kind = devs[0].spec.kind
    switch = g > 1 and intra_link == "nvlink" and meta.get("intra_topology", "switch") == "switch"
    pcie = g > 1 and intra_link == "pci" and str(kind).upper().startswith(PCIE_FAMILIES)
    intra = intra_calibration(kind) if switch else (pcie_calibration() if pcie else None)
    nvls = meta.get("nvls")
    if nvls and g > 1 and (intra is None or intra.nvls_eff <= 0):  # one GPU a node: nothing for NVLS to do
        raise ClusterError(f"cluster.intra.nvls=true: NVLink SHARP needs third-generation NVSwitch (an H100 / H200 "
                           f"NVSwitch node), and cluster {cluster.name!r} has {kind} GPUs on "
                           f"{meta.get('intra_topology', 'switch')} {intra_link}; set cluster.intra.nvls=false")
    if nvls is None:
        nvls = intra is not None and intra.nvls_eff > 0
    net = net_calibration(kind, nic_cls) if nodes > 1 else None
    if net is None and pcie and nodes > 1 and nic_cls in NETWORK_CLASSES:
        net = pcie_net_calibration()
    return calibrate(fabric, intra, net, bool(nvls))


def calibrate(fabric: Fabric, intra: IntraCalibration | None, net: NetCalibration | None, nvls: bool = False) -> Fabric:
    """``fabric`` (its datasheet figures) at what NCCL achieves of them: inside a node the ring's
    bus bandwidth ``bus_eff x intra_bw``, a point-to-point message's ``p2p_eff`` of that, NVLS's
    algorithm bandwidth ``nvls_eff x intra_bw`` when ``nvls``, NCCL's base and intra-node latencies
    x ``lat_scale``; across nodes the NICs at ``net_eff`` of their line rate and NCCL's network
    latencies x its ``lat_scale``.  ``None``: that part keeps the datasheet figures."""
    kw: dict[str, Any] = {}
    if intra is not None and fabric.gpus_per_node > 1:
        bus = fabric.intra_bw * intra.bus_eff
        kw.update(intra_bw=bus, p2p_bw=bus * intra.p2p_eff, lat_scale=intra.lat_scale, intra_source=intra.name,
                  nvls_bw=fabric.intra_bw * intra.nvls_eff if nvls else 0.0)
    if net is not None and fabric.nodes > 1:
        kw.update(inter_bw=fabric.inter_bw * net.net_eff, net_lat_scale=net.lat_scale, inter_source=net.name)
    return replace(fabric, **kw) if kw else fabric


def fabric_report(fabric: Fabric) -> dict[str, Any]:
    """Which figures a job's collectives ran at (``fabric_report`` in result.json): inside a node
    and across nodes, the source (``datasheet`` or the NCCL calibration's system, with its
    held-out errors per class), the bus bandwidth per GPU, NVLS's, a point-to-point message's and
    the latency scales of NCCL's table."""
    out: dict[str, Any] = {"model": NCCL_REF}
    if fabric.gpus_per_node > 1:
        out["intra"] = {"source": fabric.intra_source, "link": fabric.intra_link, "bus_GBps": fabric.intra_bw / 1e9,
                        "p2p_GBps": (fabric.p2p_bw or fabric.intra_bw) / 1e9,
                        "nvls_GBps": fabric.nvls_bw / 1e9 if fabric.nvls_bw > 0 else None,
                        "latency_scale": fabric.lat_scale, **source_errors(fabric.intra_source)}
    if fabric.nodes > 1:
        out["inter"] = {"source": fabric.inter_source, "nic_GBps_per_gpu": fabric.inter_bw / 1e9,
                        "latency_scale": fabric.net_lat_scale, **source_errors(fabric.inter_source)}
    return out


def _checked_bytes(nbytes: float) -> float:
    x = float(nbytes)
    if not (math.isfinite(x) and x >= 0):
        raise ValueError(f"a collective's bytes must be finite and >= 0, got {nbytes!r}")
    return x


def _checked(fabric: Fabric, group: Group, nbytes: float) -> float:
    x = _checked_bytes(nbytes)
    if group.last_rank() >= fabric.gpus:
        raise ClusterError(f"a group of {group.size} ranks {group.stride} apart reaches rank {group.last_rank()}, beyond the "
                           f"fabric's {fabric.gpus} GPUs ({fabric.nodes} nodes of {fabric.gpus_per_node})")
    return x


def bus_bandwidth(fabric: Fabric, group: Group) -> float:
    """The bus bandwidth (bytes/s per rank) of NCCL's rings and trees over ``group``: NVSwitch
    inside a node; across nodes the slower of NVSwitch and the network (:func:`network_bandwidth`)."""
    return placed_bus_bandwidth(fabric, group.placement(fabric.gpus_per_node, fabric.pod_nodes))


def placed_bus_bandwidth(fabric: Fabric, pl: Placement) -> float:
    """:func:`bus_bandwidth` of a group placed as ``pl``."""
    if pl.nodes == 1:
        return fabric.intra_bw
    across = network_bandwidth(fabric, pl)
    return min(fabric.intra_bw, across) if fabric.gpus_per_node > 1 else across


def network_bandwidth(fabric: Fabric, pl: Placement) -> float:
    """What a group placed as ``pl`` moves across nodes per rank: the ``r`` NICs of the node
    where it has fewest ranks (one ring per NIC), and between pods, when the pods' links are
    oversubscribed x : 1, that times min(1, (nodes per pod) / x) (each ring leaves a pod once per
    (nodes per pod) node crossings; the rest of its traffic stays inside)."""
    across = pl.min_ranks_per_node * fabric.inter_bw
    if pl.pods > 1:
        across *= min(1.0, pl.nodes / pl.pods / fabric.pod_oversubscription)
    return across


def collective_time(fabric: Fabric, op: str, nbytes: float, group: Group) -> float:
    """Seconds of collective ``op`` (:data:`OPS`) over ``group`` with ``nbytes`` as NCCL is called
    with them (an all-reduce's or broadcast's buffer, a reduce-scatter's full input, an
    all-gather's full output, an all-to-all's send buffer per rank); 0 for a group of one or no
    bytes.  NCCL's tuning model on the fabric's bandwidths (module docstring): ring in LL / LL128 /
    Simple, tree for an all-reduce across nodes, and NVLS / NVLSTree for an all-reduce where the
    fabric has NVLS, the fastest; an all-to-all as NCCL's grouped send/receive
    (:func:`all_to_all_time`)."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}: one of {', '.join(OPS)}")
    x = _checked(fabric, group, nbytes)
    if group.size == 1 or x == 0:
        return 0.0
    return _placed_time(fabric, op, x, group.size, group.placement(fabric.gpus_per_node, fabric.pod_nodes))


def placement_of(cluster: Cluster, devices: Sequence[int], pod_nodes: int = 0) -> Placement:
    """Where ``devices`` (any ids of ``cluster``) sit, read off their hosts
    (``cluster.devices[d].host``): the nodes spanned, the most and fewest of them on one node,
    and the pods spanned (a pod: ``pod_nodes`` consecutive nodes in the order the cluster's
    hosts first appear; 0: one pod).  What :meth:`Group.placement` computes for a group of
    Megatron-LM's rank order, for a group that is not one (a subset the event simulator's
    strategies choose)."""
    order: dict[int, int] = {}
    for d in cluster.devices:
        order.setdefault(d.host, len(order))
    counts: dict[int, int] = {}
    for x in devices:
        node = order[cluster.devices[int(x)].host]
        counts[node] = counts.get(node, 0) + 1
    if not counts:
        raise ValueError("a placement needs at least one device")
    pods = len({n // pod_nodes for n in counts}) if pod_nodes else 1
    return Placement(len(counts), max(counts.values()), min(counts.values()), pods)


def placed_collective_time(fabric: Fabric, op: str, nbytes: float, size: int, pl: Placement) -> float:
    """:func:`collective_time` of a group of ``size`` ranks placed as ``pl`` (:func:`placement_of`)
    rather than a :class:`Group` of the rank order: the same NCCL model (ring, tree, NVLS, the
    fastest; an all-to-all as :func:`all_to_all_time`) on the same fabric."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}: one of {', '.join(OPS)}")
    x = _checked_bytes(nbytes)
    if not (1 <= pl.min_ranks_per_node <= pl.ranks_per_node <= fabric.gpus_per_node and 1 <= pl.nodes <= fabric.nodes
            and pl.nodes * pl.min_ranks_per_node <= size <= pl.nodes * pl.ranks_per_node and 1 <= pl.pods <= pl.nodes):
        raise ClusterError(f"{size} ranks placed as {pl} do not fit the fabric's {fabric.nodes} nodes of {fabric.gpus_per_node}")
    if size == 1 or x == 0:
        return 0.0
    return _placed_time(fabric, op, x, int(size), pl)


@lru_cache(maxsize=65536)
def _placed_time(fabric: Fabric, op: str, x: float, p: int, pl: Placement) -> float:
    if op == "all_to_all":
        return _all_to_all_time(fabric, x, p, pl)
    bus = placed_bus_bandwidth(fabric, pl)
    best = _ring_time(fabric, op, x, p, pl.nodes, bus)
    if op == "all_reduce" and pl.nodes > 1:
        best = min(best, _tree_time(fabric, x, p, pl.nodes, bus))
    if op == "all_reduce" and fabric.nvls_bw > 0:
        best = min(best, nvls_time(fabric, x, pl))
    return best


def nvls_time(fabric: Fabric, x: float, pl: Placement) -> float:
    """NCCL's NVLS all-reduce (NVLink SHARP: the NVSwitch reduces and multicasts) on a group placed
    as ``pl``: inside one node NVLS's latency plus the bytes at its algorithm bandwidth
    ``nvls_bw``, whatever the ranks (NCCL's model, algorithm bandwidth = 5/6 of a bus bandwidth
    that does not depend on the ranks); across nodes NVLSTree - NVLS inside each node, a tree of
    the nodes, each GPU's NIC carrying its share of the reduced buffer: algorithm bandwidth the
    slower of NVLS and the network (:func:`network_bandwidth`; halved above two nodes, a tree's
    up and down passes, as NCCL's ``bwInter/2``), latency NVLS's plus two network steps per tree
    level.  NCCL runs NVLS only with two or more ranks on a node: infinite otherwise."""
    if fabric.nvls_bw <= 0 or pl.min_ranks_per_node < 2:
        return math.inf
    lat = NVLS_LAT * fabric.lat_scale
    if pl.nodes == 1:
        return lat * US + x / fabric.nvls_bw
    net = network_bandwidth(fabric, pl) / (1.0 if pl.nodes <= 2 else 2.0)
    lat += 2 * int(math.log2(pl.nodes)) * NVLS_TREE_NET_LAT * fabric.net_lat_scale
    return lat * US + x / min(fabric.nvls_bw, net)


def _ring_time(fabric: Fabric, op: str, x: float, p: int, nodes: int, bus: float) -> float:
    """NCCL's ring: ``nsteps`` steps (2(p-1) for an all-reduce, p-1 otherwise), of which the
    inter-node ones (2 x nodes for an all-reduce, nodes - 1 otherwise, at most nsteps) at the
    network's latency; algorithm bandwidth = bus bandwidth x p / nsteps (1 for a broadcast), so
    an all-reduce moves 2(p-1)/p of its bytes per rank, a reduce-scatter or all-gather (p-1)/p.
    The base and intra-node latencies are scaled by the fabric's ``lat_scale``, the network's
    (and the host's network overhead) by ``net_lat_scale``."""
    nsteps = 2 * (p - 1) if op == "all_reduce" else p - 1
    ninter = min(nsteps, (2 * nodes if nodes > 1 else 0) if op == "all_reduce" else nodes - 1)
    ratio = 1.0 if op == "broadcast" else p / nsteps
    s, sn = fabric.lat_scale, fabric.net_lat_scale
    best = math.inf
    for k, proto in enumerate(PROTOCOLS):
        if proto == "LL":
            b = min(LL_MAX_BW[min(nodes, 3) - 1] * 1e9, bus * (0.25 if nodes > 1 or op == "all_reduce" else 1 / 3))
        elif proto == "LL128":
            b = bus * (0.7 if p / nodes < 2 else 0.92)
        else:
            b = bus
        intra = HW_LAT[fabric.intra_link]["ring"][k] * s
        if nodes > 1:
            intra = max(intra, NET_OVERHEAD * (3 if proto == "Simple" else 1) * sn)
        lat = BASE_LAT["ring"][k] * s + (nsteps - ninter) * intra + ninter * HW_LAT["net"]["ring"][k] * sn
        if proto == "Simple" and nodes > 1 and op == "all_reduce":
            lat *= RING_PLATEAU
        best = min(best, lat * US + x / (b * ratio))
    return best


def _tree_time(fabric: Fabric, x: float, p: int, nodes: int, bus: float) -> float:
    """NCCL's tree all-reduce across nodes (a chain inside each node, a double binary tree across):
    bus bandwidth x 0.92 (LL: / 3.8 capped; LL128: x 120/128) x the size's correction factor,
    algorithm bandwidth half of it; latency 2 ((ranks per node - 1) intra steps + log2(nodes)
    network steps), scaled as the ring's.  NCCL's correction table dips at medium sizes, which
    would let a larger message finish sooner: the time is made non-decreasing in size (the
    largest time of any smaller size), which changes nothing where the table does not rise."""
    ppn, levels = p // nodes, int(math.log2(nodes))
    s, sn = fabric.lat_scale, fabric.net_lat_scale
    best = math.inf
    for k, proto in enumerate(PROTOCOLS):
        b = bus * 0.92
        if proto == "LL":
            b = min(b / 3.8, LL_MAX_BW[min(nodes, 3) - 1] * 1e9)
        elif proto == "LL128":
            b *= 120 / 128
        lat = (BASE_LAT["tree"][k] * s + 2 * ((ppn - 1) * HW_LAT[fabric.intra_link]["tree"][k] * s
                                              + levels * HW_LAT["net"]["tree"][k] * sn)) * US

        def raw(size: float, k: int = k, b: float = b, lat: float = lat) -> float:
            return lat + size / (0.5 * b * _tree_correction(k, size))

        t = raw(x)
        for j in range(min(_size_class(x), len(TREE_CORRECTION[k]))):
            t = max(t, raw(64.0 * 2 ** (j + 1) - 1))
        best = min(best, t)
    return best


def _size_class(x: float) -> int:
    """NCCL's ``log2i(nBytes >> 6)``."""
    return max(int(x) >> 6, 1).bit_length() - 1


def _tree_correction(k: int, x: float) -> float:
    c = _size_class(x)
    return TREE_CORRECTION[k][c] if c < len(TREE_CORRECTION[k]) else 1.0


def all_to_all_time(fabric: Fabric, nbytes: float, group: Group) -> float:
    """An all-to-all as NCCL runs it, a send and a receive per peer in one group (Simple
    protocol): one step per peer, at the NVLink (PCI) step latency for the peers on the node and
    the network's for the others, after NCCL's base latency (an upper bound: NCCL overlaps peers
    across channels; the latencies scaled as the ring's); bytes: each rank sends (p-1)/p of its
    buffer, the part to the other nodes through its own NIC share, the part to other pods at
    1/oversubscription of it, the rest over NVSwitch - plus, on a rail-optimised fabric, the off-node part NCCL's PXN first forwards
    over NVLink to the GPU on the destination's rail (all but the 1/r already on it); the
    slowest of the three sets the time."""
    x = _checked(fabric, group, nbytes)
    if group.size == 1 or x == 0:
        return 0.0
    return _all_to_all_time(fabric, x, group.size, group.placement(fabric.gpus_per_node, fabric.pod_nodes))


def _all_to_all_time(fabric: Fabric, x: float, p: int, pl: Placement) -> float:
    hw = HW_LAT[fabric.intra_link]["ring"][2] * fabric.lat_scale
    lat = BASE_LAT["ring"][2] * fabric.lat_scale + (pl.ranks_per_node - 1) * hw \
        + (p - pl.ranks_per_node) * HW_LAT["net"]["ring"][2] * fabric.net_lat_scale
    if pl.nodes == 1:
        return lat * US + x * (p - 1) / p / fabric.intra_bw
    r = pl.min_ranks_per_node
    off = x * (p - r) / p
    nvlink = x * (pl.ranks_per_node - 1) / p + (off * (1 - 1 / r) if fabric.rail_optimized else 0.0)
    t = off / fabric.inter_bw
    if fabric.gpus_per_node > 1:
        t = max(t, nvlink / fabric.intra_bw)
    if pl.pods > 1:
        t = max(t, x * (1 - 1 / pl.pods) * fabric.pod_oversubscription / fabric.inter_bw)
    return lat * US + t


def p2p_time(fabric: Fabric, nbytes: float, same_node: bool, same_pod: bool = True) -> float:
    """One message of ``nbytes`` between two GPUs (a pipeline send, every GPU of a stage sending
    at once): the link's latency plus the bytes over NVSwitch (at the fabric's point-to-point
    bandwidth where calibrated) when ``same_node``, else over the GPU's share of its NICs, at
    1/oversubscription of it between pods (``same_pod`` false)."""
    x = float(nbytes)
    if not (math.isfinite(x) and x >= 0):
        raise ValueError(f"a message's bytes must be finite and >= 0, got {nbytes!r}")
    if x == 0:
        return 0.0
    if same_node:
        if fabric.gpus_per_node == 1:
            raise ClusterError("a message inside a node of one GPU: there is no other GPU on it")
        return fabric.intra_lat + x / (fabric.p2p_bw or fabric.intra_bw)
    if fabric.nodes == 1:
        raise ClusterError("a message across nodes on a fabric of one node")
    bw = fabric.inter_bw / (1.0 if same_pod else fabric.pod_oversubscription)
    return fabric.inter_lat + x / bw
