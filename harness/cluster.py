"""Clusters: devices, directional links, and a route (list of links) between every pair.

Links follow the alpha-beta model: a transfer of ``b`` bytes over a route takes
``sum(lat) + b / min(bw)``.  Routes go through shared links (a GPU's NVLink or PCIe port,
a PCIe switch uplink, a node's NIC), so transfers that share a link contend for it in the
simulator.  Every link is directional (full duplex = two links).

Units: bandwidths in the YAML are ``bw_GBps`` (gigabytes per second) or ``bw_gbps``
(gigabits per second, the network convention); latencies ``lat_us``; device peaks
``peak_tflops`` per dtype; memory ``mem_GiB`` and ``mem_bw_GBps``.  In Python everything
is SI: bytes, seconds, FLOP/s, bytes/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

GIB = 2**30


class ClusterError(ValueError):
    """A cluster description is invalid (no devices, unknown topology, missing bandwidth)."""


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One accelerator model, from its datasheet."""

    kind: str
    peak_flops: Mapping[str, float]  # FLOP/s per dtype name ("float32", "float16", ...)
    mem_bw: float  # bytes/s
    mem_capacity: int  # bytes

    def peak(self, dtype: str = "float32") -> float:
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        return self.peak_flops["float32"]


@dataclass(frozen=True, slots=True)
class Device:
    id: int
    name: str  # e.g. "n0/gpu2"
    spec: DeviceSpec
    host: int


@dataclass(frozen=True, slots=True)
class Link:
    """A directional link.  ``cls`` is the link class used when reporting bytes moved."""

    id: int
    name: str
    cls: str
    bw: float  # bytes/s
    lat: float  # s


@dataclass(eq=False)
class Cluster:
    """Devices, links and routes.  ``routes[i][j]`` is the tuple of link ids from i to j."""

    name: str
    devices: list[Device]
    links: list[Link]
    routes: list[list[tuple[int, ...]]]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        d = len(self.devices)
        if d == 0:
            raise ClusterError(f"cluster {self.name!r} has no devices")
        if len(self.routes) != d or any(len(r) != d for r in self.routes):
            raise ClusterError(f"cluster {self.name!r}: routes must be a {d}x{d} table")
        nl = len(self.links)
        for i in range(d):
            for j in range(d):
                r = self.routes[i][j]
                if i != j and not r:
                    raise ClusterError(f"cluster {self.name!r}: no route from device {i} to device {j}")
                for l in r:
                    if not 0 <= l < nl:
                        raise ClusterError(f"cluster {self.name!r}: route {i}->{j} uses unknown link {l}")
        self.route_bw = np.full((d, d), np.inf)
        self.route_lat = np.zeros((d, d))
        for i in range(d):
            for j in range(d):
                if i != j:
                    self.route_bw[i, j] = min(self.links[l].bw for l in self.routes[i][j])
                    self.route_lat[i, j] = sum(self.links[l].lat for l in self.routes[i][j])
        self.link_classes: list[str] = sorted({l.cls for l in self.links})
        width = max((len(r) for row in self.routes for r in row), default=0)
        #: routes as a padded array [D, D, width] of link ids (-1 = none) and their lengths
        self.route_links = np.full((d, d, width), -1, dtype=np.int64)
        self.route_len = np.zeros((d, d), dtype=np.int64)
        for i in range(d):
            for j in range(d):
                r = self.routes[i][j]
                self.route_links[i, j, : len(r)] = r
                self.route_len[i, j] = len(r)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def mem_capacity(self) -> np.ndarray:
        return np.array([dev.spec.mem_capacity for dev in self.devices], dtype=np.int64)

    def subset(self, k: int) -> "Cluster":
        """The first ``k`` devices with the links their routes use (OptCNN Fig. 7's 1..16 GPU points)."""
        if not 1 <= k <= self.num_devices:
            raise ClusterError(f"cluster {self.name!r} has {self.num_devices} devices; cannot take {k}")
        used = sorted({l for i in range(k) for j in range(k) for l in self.routes[i][j]})
        remap = {old: new for new, old in enumerate(used)}
        links = [Link(remap[l], self.links[l].name, self.links[l].cls, self.links[l].bw, self.links[l].lat) for l in used]
        routes = [[tuple(remap[l] for l in self.routes[i][j]) for j in range(k)] for i in range(k)]
        return Cluster(f"{self.name}[:{k}]", self.devices[:k], links, routes, dict(self.meta))

    def with_host_comm(self, host_comm: Mapping[str, Any]) -> "Cluster":
        """The same cluster with other ``host_comm`` figures (what a message costs a CPU rank's
        core, see :func:`simulators.taskgraph.build_taskgraph`); this one is left as it is."""
        return Cluster(self.name, self.devices, self.links, self.routes, {**self.meta, "host_comm": dict(host_comm)})

    def describe(self) -> str:
        spec = self.devices[0].spec
        hosts = len({d.host for d in self.devices})
        return (
            f"{self.name}: {self.num_devices} x {spec.kind} on {hosts} host(s), "
            f"{len(self.links)} links ({', '.join(self.link_classes) or 'none'})"
        )


# ---------------------------------------------------------------------------- builders
def _bw(spec: Mapping[str, Any], what: str) -> float:
    if spec.get("bw_GBps") is not None:
        return float(spec["bw_GBps"]) * 1e9
    if spec.get("bw_gbps") is not None:
        return float(spec["bw_gbps"]) * 1e9 / 8
    raise ClusterError(f"{what} needs bw_GBps (gigabytes/s) or bw_gbps (gigabits/s)")


def device_spec(spec: Mapping[str, Any]) -> DeviceSpec:
    """Build a :class:`DeviceSpec` from a YAML mapping (``kind, peak_tflops, mem_bw_GBps, mem_GiB``)."""
    try:
        peaks = spec["peak_tflops"]
        peak = {str(k): float(v) * 1e12 for k, v in dict(peaks).items()} if isinstance(peaks, Mapping) else {"float32": float(peaks) * 1e12}
        return DeviceSpec(str(spec["kind"]), peak, float(spec["mem_bw_GBps"]) * 1e9, int(float(spec["mem_GiB"]) * GIB))
    except KeyError as e:
        raise ClusterError(f"device spec is missing {e.args[0]!r}: needs kind, peak_tflops, mem_bw_GBps, mem_GiB") from None


class _Builder:
    def __init__(self) -> None:
        self.links: list[Link] = []

    def link(self, name: str, cls: str, bw: float, lat: float) -> int:
        self.links.append(Link(len(self.links), name, cls, bw, lat))
        return len(self.links) - 1


def _intra_routes(b: _Builder, prefix: str, gpus: list[int], spec: Mapping[str, Any]) -> dict[tuple[int, int], tuple[int, ...]]:
    """Routes among the GPUs of one host."""
    topo = str(spec.get("topology", "switch"))
    cls = str(spec.get("cls", "nvlink"))
    bw = _bw(spec, f"intra-node link of {prefix}")
    lat = float(spec.get("lat_us", 5.0)) * 1e-6
    k = len(gpus)
    routes: dict[tuple[int, int], tuple[int, ...]] = {}
    if topo == "mesh":
        pair = {}
        for a in range(k):
            for c in range(k):
                if a != c:
                    pair[a, c] = b.link(f"{prefix}gpu{a}->gpu{c}", cls, bw, lat)
                    routes[gpus[a], gpus[c]] = (pair[a, c],)
    elif topo == "switch":
        up = [b.link(f"{prefix}gpu{a}->sw", cls, bw, lat / 2) for a in range(k)]
        down = [b.link(f"{prefix}sw->gpu{a}", cls, bw, lat / 2) for a in range(k)]
        for a in range(k):
            for c in range(k):
                if a != c:
                    routes[gpus[a], gpus[c]] = (up[a], down[c])
    elif topo == "pcie_tree":
        per_sw = int(spec.get("gpus_per_switch", 2))
        up = [b.link(f"{prefix}gpu{a}->sw{a // per_sw}", cls, bw, lat / 2) for a in range(k)]
        down = [b.link(f"{prefix}sw{a // per_sw}->gpu{a}", cls, bw, lat / 2) for a in range(k)]
        nsw = (k + per_sw - 1) // per_sw
        up_bw = _bw(spec.get("uplink", spec), f"PCIe switch uplink of {prefix}")
        sw_up = [b.link(f"{prefix}sw{s}->root", cls, up_bw, 0.0) for s in range(nsw)]
        sw_down = [b.link(f"{prefix}root->sw{s}", cls, up_bw, 0.0) for s in range(nsw)]
        for a in range(k):
            for c in range(k):
                if a == c:
                    continue
                sa, sc = a // per_sw, c // per_sw
                routes[gpus[a], gpus[c]] = (up[a], down[c]) if sa == sc else (up[a], sw_up[sa], sw_down[sc], down[c])
    else:
        raise ClusterError(f"unknown intra-node topology {topo!r}: use mesh, switch or pcie_tree")
    return routes


def build_cluster(
    name: str,
    device: Mapping[str, Any],
    gpus: int,
    nodes: int = 1,
    intra: Mapping[str, Any] | None = None,
    inter: Mapping[str, Any] | None = None,
    host_link: Mapping[str, Any] | None = None,
    **meta: Any,
) -> Cluster:
    """Build a cluster of ``nodes`` hosts with ``gpus`` devices each (the Hydra ``_target_`` of conf/cluster).

    ``intra`` describes the links inside a host (``topology`` mesh / switch / pcie_tree,
    ``cls``, ``bw_GBps`` or ``bw_gbps``, ``lat_us``); ``inter`` the NIC of each host;
    ``host_link`` the path from a GPU to its host's NIC (PCIe by default).  A route between
    hosts is GPU -> NIC (host_link) -> NIC egress -> NIC ingress -> GPU.  Other keys land in
    ``Cluster.meta``; ``collective: {lat_us, bw_GBps}`` (measured all-reduce figures, e.g. by
    ``python -m harness.calibrate``) replaces the links' in the cost model's ring all-reduce.
    """
    if gpus < 1 or nodes < 1:
        raise ClusterError(f"cluster {name!r}: gpus and nodes must be >= 1 (got gpus={gpus}, nodes={nodes})")
    spec = device_spec(device)
    intra = dict(intra or {"topology": "switch", "cls": "nvlink", "bw_GBps": 25.0, "lat_us": 5.0})
    b = _Builder()
    devices = [Device(h * gpus + g, f"n{h}/gpu{g}", spec, h) for h in range(nodes) for g in range(gpus)]
    d = len(devices)
    routes: list[list[tuple[int, ...]]] = [[() for _ in range(d)] for _ in range(d)]
    for h in range(nodes):
        ids = list(range(h * gpus, (h + 1) * gpus))
        prefix = f"n{h}/" if nodes > 1 else ""
        for (i, j), links in _intra_routes(b, prefix, ids, intra).items():
            routes[i][j] = links
    if nodes > 1:
        if inter is None:
            raise ClusterError(f"cluster {name!r} has {nodes} nodes but no inter-node link (inter:)")
        nic_bw = _bw(inter, f"inter-node link of {name}")
        nic_lat = float(inter.get("lat_us", 2.0)) * 1e-6
        icls = str(inter.get("cls", "ib"))
        hl = dict(host_link or {"cls": "pcie", "bw_GBps": 16.0, "lat_us": 1.0})
        hbw = _bw(hl, f"GPU-to-NIC link of {name}")
        hlat = float(hl.get("lat_us", 1.0)) * 1e-6
        hcls = str(hl.get("cls", "pcie"))
        to_nic = [b.link(f"{dev.name}->nic", hcls, hbw, hlat / 2) for dev in devices]
        from_nic = [b.link(f"nic->{dev.name}", hcls, hbw, hlat / 2) for dev in devices]
        nic_out = [b.link(f"n{h}/nic->net", icls, nic_bw, nic_lat / 2) for h in range(nodes)]
        nic_in = [b.link(f"net->n{h}/nic", icls, nic_bw, nic_lat / 2) for h in range(nodes)]
        for i, di in enumerate(devices):
            for j, dj in enumerate(devices):
                if di.host != dj.host:
                    routes[i][j] = (to_nic[i], nic_out[di.host], nic_in[dj.host], from_nic[j])
    return Cluster(name, devices, b.links, routes, {"gpus_per_node": gpus, "nodes": nodes, **meta})
