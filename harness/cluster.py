"""Clusters: devices, directional links, and a route (list of links) between every pair.

Links follow the alpha-beta model: a transfer of ``b`` bytes over a route takes
``sum(lat) + b / min(bw)``.  Routes go through shared links (a GPU's NVLink or PCIe port,
a PCIe switch uplink, a node's NIC), so transfers that share a link contend for it in the
simulator.  Every link is directional (full duplex = two links).

Units: bandwidths in the YAML are ``bw_GBps`` (gigabytes per second) or ``bw_gbps``
(gigabits per second, the network convention), per direction (``link_GBps``: one NVLink
brick); latencies ``lat_us``; device peaks ``peak_tflops`` per math mode (``float32`` on CUDA
cores; ``tf32``, ``float16``, ``bfloat16`` on tensor cores, dense); memory ``mem_GiB`` and
``mem_bw_GBps``.  In Python everything is SI: bytes, seconds, FLOP/s, bytes/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from harness.errors import UserError

GIB = 2**30


class ClusterError(UserError, ValueError):
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

    def ring_bandwidth(self, devices: Sequence[int]) -> float:
        """Per-GPU bandwidth (bytes/s, each direction) that a bandwidth-optimal ring all-reduce
        among ``devices`` can use - NCCL's rings, which run one ring per NVLink brick at once.

        Reading: each member injects into the members on its host at the sum of the
        bandwidths of its direct links (single-link routes) to them when it has any (NVLink
        bricks: several rings at once), else at the bottleneck (smallest) bandwidth of its
        routes to them (a PCIe tree, a switch port); the group's figure is the smallest over
        its members.  A group on several hosts is also bounded, per host, by the NICs its GPUs
        there use: NIC bandwidth x NICs used.  A ring crosses each host boundary once per
        direction, so a ring's traffic leaves a host through one NIC at the ring's full
        bandwidth, and NCCL runs one ring per NIC (rail-aligned on DGX nodes): k NICs carry k
        rings at once.  Contention between the ring's own flows on shared links (a switch
        uplink, QPI) is not counted: a ring that visits the GPUs of each switch in turn
        crosses every shared link once per direction.  One device gives ``inf`` (nothing to
        send).
        """
        group = [int(x) for x in devices]
        if len(set(group)) != len(group) or not all(0 <= x < self.num_devices for x in group):
            raise ClusterError(f"cluster {self.name!r}: ring_bandwidth needs distinct device ids in 0..{self.num_devices - 1}, got {group}")
        if len(group) < 2:
            return math.inf
        bw = math.inf
        per_host: dict[int, list[int]] = {}
        for x in group:
            per_host.setdefault(self.devices[x].host, []).append(x)
        for xs in per_host.values():
            for x in xs:
                others = [y for y in xs if y != x]
                if not others:
                    continue
                direct = {self.routes[x][y][0] for y in others if self.route_len[x, y] == 1}
                inject = sum(self.links[l].bw for l in direct) if direct else min(float(self.route_bw[x, y]) for y in others)
                bw = min(bw, inject)
        if len(per_host) > 1:
            if "nic_of" not in self.meta:
                raise ClusterError(f"cluster {self.name!r} spans hosts but does not describe its NICs (meta nic_of, nic_bw)")
            for xs in per_host.values():
                bw = min(bw, self.meta["nic_bw"] * len({self.meta["nic_of"][x] for x in xs}))
        return float(bw)

    def describe(self) -> str:
        spec = self.devices[0].spec
        hosts = len({d.host for d in self.devices})
        text = (
            f"{self.name}: {self.num_devices} x {spec.kind} on {hosts} host(s), "
            f"{len(self.links)} links ({', '.join(self.link_classes) or 'none'})"
        )
        if self.num_devices > 1 and (hosts == 1 or "nic_of" in self.meta):
            text += f", ring all-reduce {self.ring_bandwidth(range(self.num_devices)) / 1e9:.1f} GB/s per GPU"
        return text


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


#: the routes among one host's GPUs, by (source, destination) device id
Routes = dict[tuple[int, int], tuple[int, ...]]


def _lat(spec: Mapping[str, Any], default_us: float) -> float:
    """A link's latency in seconds from its ``lat_us``."""
    return float(spec.get("lat_us", default_us)) * 1e-6


def _mesh_routes(b: _Builder, prefix: str, gpus: list[int], spec: Mapping[str, Any], key: str) -> Routes:
    """A dedicated link per ordered pair of GPUs (all-to-all NVLink of equal width)."""
    cls, bw, lat = str(spec.get("cls", "nvlink")), _bw(spec, f"intra-node link of {prefix}"), _lat(spec, 5.0)
    routes: Routes = {}
    for a in range(len(gpus)):
        for c in range(len(gpus)):
            if a != c:
                routes[gpus[a], gpus[c]] = (b.link(f"{prefix}gpu{a}->gpu{c}", cls, bw, lat),)
    return routes


def _switch_routes(b: _Builder, prefix: str, gpus: list[int], spec: Mapping[str, Any], key: str) -> Routes:
    """A non-blocking switch (NVSwitch): one port per GPU each way, every route is port in -> port out."""
    cls, bw, lat = str(spec.get("cls", "nvlink")), _bw(spec, f"intra-node link of {prefix}"), _lat(spec, 5.0)
    k = len(gpus)
    up = [b.link(f"{prefix}gpu{a}->sw", cls, bw, lat / 2) for a in range(k)]
    down = [b.link(f"{prefix}sw->gpu{a}", cls, bw, lat / 2) for a in range(k)]
    return {(gpus[a], gpus[c]): (up[a], down[c]) for a in range(k) for c in range(k) if a != c}


def _pcie_tree_routes(b: _Builder, prefix: str, gpus: list[int], spec: Mapping[str, Any], key: str) -> Routes:
    """GPUs under PCIe switches (``gpus_per_switch``), each switch's ``uplink`` to a root complex.

    With ``sockets: S`` the switches are split evenly among S CPU sockets, each with its own
    root complex, and the roots are joined by ``qpi: {bw_GBps, lat_us}`` (a link per ordered
    pair of sockets): a route between GPUs on different sockets is GPU -> switch -> root(a) ->
    QPI -> root(b) -> switch -> GPU.  Without ``sockets`` there is one root, named ``root``.
    """
    cls, bw, lat = str(spec.get("cls", "nvlink")), _bw(spec, f"intra-node link of {prefix}"), _lat(spec, 5.0)
    k = len(gpus)
    per_sw = int(spec.get("gpus_per_switch", 2))
    up = [b.link(f"{prefix}gpu{a}->sw{a // per_sw}", cls, bw, lat / 2) for a in range(k)]
    down = [b.link(f"{prefix}sw{a // per_sw}->gpu{a}", cls, bw, lat / 2) for a in range(k)]
    nsw = (k + per_sw - 1) // per_sw
    sockets = int(spec.get("sockets", 1))
    if sockets < 1 or nsw % sockets:
        raise ClusterError(f"{key}.sockets: {sockets} socket(s) cannot share the {nsw} PCIe switch(es) evenly")
    sock = [s // (nsw // sockets) for s in range(nsw)]
    root = [f"root{sock[s]}" if sockets > 1 else "root" for s in range(nsw)]
    up_bw = _bw(spec.get("uplink", spec), f"PCIe switch uplink of {prefix}")
    sw_up = [b.link(f"{prefix}sw{s}->{root[s]}", cls, up_bw, 0.0) for s in range(nsw)]
    sw_down = [b.link(f"{prefix}{root[s]}->sw{s}", cls, up_bw, 0.0) for s in range(nsw)]
    qpi: dict[tuple[int, int], int] = {}
    if sockets > 1:
        q = spec.get("qpi")
        if q is None:
            raise ClusterError(f"{key}.qpi is missing: {sockets} sockets need qpi: {{bw_GBps, lat_us}} between their root complexes")
        qcls, qbw, qlat = str(q.get("cls", "qpi")), _bw(q, f"{key}.qpi"), _lat(q, 0.0)
        for x in range(sockets):
            for y in range(sockets):
                if x != y:
                    qpi[x, y] = b.link(f"{prefix}root{x}->root{y}", qcls, qbw, qlat)
    routes: Routes = {}
    for a in range(k):
        for c in range(k):
            if a == c:
                continue
            sa, sc = a // per_sw, c // per_sw
            if sa == sc:
                routes[gpus[a], gpus[c]] = (up[a], down[c])
            else:
                cross = (qpi[sock[sa], sock[sc]],) if sock[sa] != sock[sc] else ()
                routes[gpus[a], gpus[c]] = (up[a], sw_up[sa], *cross, sw_down[sc], down[c])
    return routes


def _nvlink_pairs(pairs: Any, k: int, key: str) -> dict[tuple[int, int], int]:
    """``[[i, j, nlinks], ...]`` checked against a node of ``k`` GPUs, as ``{(min, max): nlinks}``."""
    if not isinstance(pairs, Sequence) or isinstance(pairs, str):
        raise ClusterError(f"{key}.pairs must be a list [[i, j, nlinks], ...] of the GPU pairs with NVLink (got {pairs!r})")
    out: dict[tuple[int, int], int] = {}
    for p in pairs:
        try:
            i, j, n = (int(v) for v in p)
        except (TypeError, ValueError):
            raise ClusterError(f"{key}.pairs entry {p!r} is not [i, j, nlinks]") from None
        if not (0 <= i < k and 0 <= j < k) or i == j:
            raise ClusterError(f"{key}.pairs entry {[i, j, n]} must name two different GPUs among 0..{k - 1}")
        if n < 1:
            raise ClusterError(f"{key}.pairs entry {[i, j, n]}: nlinks must be >= 1")
        pair = (min(i, j), max(i, j))
        if pair in out:
            raise ClusterError(f"{key}.pairs lists GPUs {pair[0]} and {pair[1]} twice")
        out[pair] = n
    return out


def _nvlink_mesh_routes(b: _Builder, prefix: str, gpus: list[int], spec: Mapping[str, Any], key: str) -> Routes:
    """NVLink point to point, as on DGX-1's hybrid cube-mesh: each listed pair ``[i, j, nlinks]``
    gets ``nlinks`` bricks of ``link_GBps`` per direction (one directional link each way of
    ``nlinks x link_GBps``).  Pairs without an NVLink take their route through ``fallback``
    (an intra-node spec, typically a ``pcie_tree`` with ``sockets``: CUDA peer-to-peer between
    GPUs without an NVLink goes over PCIe, and over QPI across CPU sockets)."""
    if spec.get("link_GBps") is None:
        raise ClusterError(f"{key}.link_GBps is missing: nvlink_mesh needs the bandwidth of one brick per direction")
    cls, brick, lat = str(spec.get("cls", "nvlink")), float(spec["link_GBps"]) * 1e9, _lat(spec, 5.0)
    bricks = _nvlink_pairs(spec.get("pairs"), len(gpus), key)
    routes: Routes = {}
    for (a, c), n in bricks.items():
        routes[gpus[a], gpus[c]] = (b.link(f"{prefix}gpu{a}->gpu{c}", cls, n * brick, lat),)
        routes[gpus[c], gpus[a]] = (b.link(f"{prefix}gpu{c}->gpu{a}", cls, n * brick, lat),)
    fallback = spec.get("fallback")
    if fallback is None:
        missing = [(a, c) for a in range(len(gpus)) for c in range(a + 1, len(gpus)) if (a, c) not in bricks]
        if missing:
            raise ClusterError(f"{key}.fallback is missing: GPUs {missing[0][0]} and {missing[0][1]} have no NVLink ({len(missing)} such pair(s))")
        return routes
    if str(fallback.get("topology", "switch")) == "nvlink_mesh":
        raise ClusterError(f"{key}.fallback cannot be another nvlink_mesh")
    for pair, r in _intra_routes(b, prefix, gpus, fallback, f"{key}.fallback").items():
        routes.setdefault(pair, r)
    return routes


_TOPOLOGIES = {"mesh": _mesh_routes, "switch": _switch_routes, "pcie_tree": _pcie_tree_routes, "nvlink_mesh": _nvlink_mesh_routes}


def _intra_routes(b: _Builder, prefix: str, gpus: list[int], spec: Mapping[str, Any], key: str = "intra") -> Routes:
    """Routes among the GPUs of one host, by ``spec["topology"]`` (``key`` names ``spec`` in errors)."""
    topo = str(spec.get("topology", "switch"))
    if topo not in _TOPOLOGIES:
        raise ClusterError(f"unknown intra-node topology {topo!r}: use {', '.join(_TOPOLOGIES)}")
    return _TOPOLOGIES[topo](b, prefix, gpus, spec, key)


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

    ``intra`` describes the links inside a host (``topology`` mesh / switch / pcie_tree /
    nvlink_mesh, ``cls``, ``bw_GBps`` or ``bw_gbps``, ``lat_us``; see ``_pcie_tree_routes``
    and ``_nvlink_mesh_routes`` for their own keys); ``inter`` the NICs of each host
    (``nics_per_node``: k NICs, GPU g of a host using NIC g * k // gpus; 1 by default);
    ``host_link`` the path from a GPU to its NIC (PCIe by default).  A route between hosts is
    GPU -> its NIC (host_link) -> NIC egress -> NIC ingress of the destination GPU's NIC -> GPU.
    Other keys land in ``Cluster.meta``; ``collective: {lat_us, bw_GBps}`` (measured all-reduce
    figures, e.g. by ``python -m harness.calibrate``) replaces the links' in the cost model's
    ring all-reduce.
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
    nic_meta: dict[str, Any] = {}
    if nodes > 1:
        if inter is None:
            raise ClusterError(f"cluster {name!r} has {nodes} nodes but no inter-node link (inter:)")
        nic_bw = _bw(inter, f"inter-node link of {name}")
        nic_lat = float(inter.get("lat_us", 2.0)) * 1e-6
        icls = str(inter.get("cls", "ib"))
        nics = int(inter.get("nics_per_node", 1))
        if not 1 <= nics <= gpus:
            raise ClusterError(f"inter.nics_per_node: {nics} must be between 1 and gpus ({gpus})")
        nic_of = [(dev.id % gpus) * nics // gpus for dev in devices]
        nic = [f"nic{m}" if nics > 1 else "nic" for m in range(nics)]
        hl = dict(host_link or {"cls": "pcie", "bw_GBps": 16.0, "lat_us": 1.0})
        hbw = _bw(hl, f"GPU-to-NIC link of {name}")
        hlat = float(hl.get("lat_us", 1.0)) * 1e-6
        hcls = str(hl.get("cls", "pcie"))
        to_nic = [b.link(f"{dev.name}->{nic[nic_of[dev.id]]}", hcls, hbw, hlat / 2) for dev in devices]
        from_nic = [b.link(f"{nic[nic_of[dev.id]]}->{dev.name}", hcls, hbw, hlat / 2) for dev in devices]
        nic_out = [[b.link(f"n{h}/{nic[m]}->net", icls, nic_bw, nic_lat / 2) for m in range(nics)] for h in range(nodes)]
        nic_in = [[b.link(f"net->n{h}/{nic[m]}", icls, nic_bw, nic_lat / 2) for m in range(nics)] for h in range(nodes)]
        for i, di in enumerate(devices):
            for j, dj in enumerate(devices):
                if di.host != dj.host:
                    routes[i][j] = (to_nic[i], nic_out[di.host][nic_of[i]], nic_in[dj.host][nic_of[j]], from_nic[j])
        nic_meta = {"nics_per_node": nics, "nic_bw": nic_bw, "nic_of": tuple(nic_of)}
    return Cluster(name, devices, b.links, routes, {"gpus_per_node": gpus, "nodes": nodes, **nic_meta, **meta})


#: the cluster presets of the Hydra config (conf/cluster/<name>.yaml)
PRESETS = Path(__file__).resolve().parents[1] / "conf" / "cluster"


def preset(name: str, **overrides: Any) -> Cluster:
    """Build the preset ``conf/cluster/<name>.yaml`` without Hydra (its ``device`` default and
    plain values only), with top-level keys overridden (``nodes=2``): for code that needs a
    named testbed outside a job, such as the all-reduce fit of :mod:`harness.kernel_fit`."""
    import yaml

    path = PRESETS / f"{name}.yaml"
    if not path.exists():
        raise ClusterError(f"unknown cluster preset {name!r}: no {path}")
    spec = dict(yaml.safe_load(path.read_text()) or {})
    device_name = next((d["device"] for d in spec.pop("defaults", []) if isinstance(d, dict) and "device" in d), None)
    if device_name is None:
        raise ClusterError(f"cluster preset {name!r} names no device (defaults: - device: ...)")
    device = yaml.safe_load((PRESETS / "device" / f"{device_name}.yaml").read_text())
    spec.pop("_target_", None)
    spec.update(overrides)
    return build_cluster(device=device, **spec)
