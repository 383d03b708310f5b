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

Every figure is checked where it is read, and a bad one is a :class:`ClusterError` naming its
key as the user types it (``cluster.intra.bw_GBps must be > 0, got -5``): bandwidths, peaks
and memory finite, > 0 and in a plausible range (:data:`harness.core.topology.RANGES`: a
subnormal bandwidth would make every transfer take forever), latencies finite and >= 0,
``gpus``, ``nodes`` and other counts integers >= 1, and no more devices than the simulator's
D x D route tables hold (:data:`MAX_ROUTE_BYTES`).  A key that a block does not take is refused
with the nearest one it does ("did you mean cluster.intra.bw_GBps?"), at every level: the
cluster, its device, ``intra`` by topology, ``inter``, ``host_link``, ``collective``,
``host_comm``.  The checks of :mod:`harness.core.checks` take the error class to raise, so the
cost models and graph sources use them for their own keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from harness.core.checks import did_you_mean, integer, positive_int
from harness.core.errors import ClusterError
from harness.core.topology import LINK_KEYS, Link, LinkBuilder, block, figure, intra_routes, link_bandwidth, link_latency

GIB = 2**30


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
#: the keys of a device spec (``conf/cluster/device/*.yaml``)
DEVICE_KEYS: tuple[str, ...] = ("kind", "peak_tflops", "mem_bw_GBps", "mem_GiB")
#: the math modes a device's ``peak_tflops`` may name (``float32`` is required)
PEAK_KEYS: tuple[str, ...] = ("float32", "tf32", "float16", "bfloat16", "float64")
#: other words for a device key, for "did you mean"
DEVICE_ALIASES: dict[str, str] = {"peak": "peak_tflops", "tflops": "peak_tflops", "memory": "mem_GiB", "mem": "mem_GiB",
                                  "mem_GB": "mem_GiB", "bandwidth": "mem_bw_GBps", "mem_bw": "mem_bw_GBps", "name": "kind"}
#: the keys of a cluster config (``conf/cluster/*.yaml``, without ``_target_`` and ``defaults``)
CLUSTER_KEYS: tuple[str, ...] = ("name", "device", "gpus", "nodes", "intra", "inter", "host_link", "collective", "host_comm")
#: the keys of ``cluster.inter``, a host's NICs
INTER_KEYS: tuple[str, ...] = (*LINK_KEYS, "nics_per_node")
#: the most memory the route tables of a cluster may take (``routes`` and its arrays are D x D):
#: about 2500 devices
MAX_ROUTE_BYTES = 2**30
#: what one pair of devices costs the route tables: a tuple of link ids (~100 bytes with its
#: list slot), bandwidth and latency (16), a padded row of up to 6 link ids (48) and its length (8)
ROUTE_PAIR_BYTES = 172


def _peaks(peaks: Any, key: str) -> dict[str, float]:
    """FLOP/s per math mode from ``peak_tflops`` (one number: the FP32 peak; or a mapping by
    :data:`PEAK_KEYS` with a ``float32`` entry), each in its plausible range."""
    if not isinstance(peaks, Mapping):
        return {"float32": figure(peaks, key, "tflops") * 1e12}
    unknown = [str(k) for k in peaks if str(k) not in PEAK_KEYS]
    if unknown:
        raise ClusterError(f"{key}.{unknown[0]} is not a math mode: {did_you_mean(unknown[0], PEAK_KEYS, f'{key}.')}"
                           f"peak_tflops takes {', '.join(PEAK_KEYS)}")
    if "float32" not in peaks:
        raise ClusterError(f"{key}.float32 is missing: every device needs its FP32 peak (the fallback of the other modes)")
    return {str(k): figure(v, f"{key}.{k}", "tflops") * 1e12 for k, v in dict(peaks).items()}


def device_spec(spec: Mapping[str, Any], key: str = "cluster.device") -> DeviceSpec:
    """Build a :class:`DeviceSpec` from a YAML mapping (``kind, peak_tflops, mem_bw_GBps, mem_GiB``)
    at config path ``key``; a missing, unknown or out-of-range key is a :class:`ClusterError`."""
    if not isinstance(spec, Mapping):
        raise ClusterError(f"{key} must be a mapping of {', '.join(DEVICE_KEYS)}, got {spec!r}")
    unknown = [str(k) for k in spec if str(k) not in DEVICE_KEYS]
    if unknown:
        raise ClusterError(f"{key}.{unknown[0]} is not a device key: {did_you_mean(unknown[0], DEVICE_KEYS, f'{key}.', DEVICE_ALIASES)}"
                           f"a device takes {', '.join(DEVICE_KEYS)}")
    missing = [k for k in DEVICE_KEYS if k not in spec]
    if missing:
        raise ClusterError(f"{key} is missing {missing[0]!r}: a device needs {', '.join(DEVICE_KEYS)}")
    return DeviceSpec(str(spec["kind"]), _peaks(spec["peak_tflops"], f"{key}.peak_tflops"),
                      figure(spec["mem_bw_GBps"], f"{key}.mem_bw_GBps", "GBps") * 1e9,
                      int(figure(spec["mem_GiB"], f"{key}.mem_GiB", "GiB") * GIB))


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
    nvlink_mesh, ``cls``, ``bw_GBps`` or ``bw_gbps``, ``lat_us``; :mod:`harness.core.topology`
    lists the topologies' own keys); ``inter`` the NICs of each host
    (``nics_per_node``: k NICs, GPU g of a host using NIC g * k // gpus; 1 by default);
    ``host_link`` the path from a GPU to its NIC (PCIe by default).  A route between hosts is
    GPU -> its NIC (host_link) -> NIC egress -> NIC ingress of the destination GPU's NIC -> GPU.
    Two more keys land in ``Cluster.meta`` (:data:`META_KEYS`): ``collective: {lat_us, bw_GBps}``
    (measured all-reduce figures, e.g. by ``python -m harness.calibrate``) replaces the links'
    in the cost model's ring all-reduce; ``host_comm`` (:data:`HOST_COMM_KEYS`) is what a
    message costs a CPU rank's core (see :func:`simulators.taskgraph.build_taskgraph`).  Any
    other key, and any figure out of range, is a :class:`ClusterError` naming it.
    """

    gpus, nodes = positive_int(gpus, "cluster.gpus", ClusterError), positive_int(nodes, "cluster.nodes", ClusterError)
    _check_size(gpus * nodes)
    _check_meta(meta)
    spec = device_spec(device)
    intra = intra if intra is not None else {"topology": "switch", "cls": "nvlink", "bw_GBps": 25.0, "lat_us": 5.0}
    b = LinkBuilder()
    devices = [Device(h * gpus + g, f"n{h}/gpu{g}", spec, h) for h in range(nodes) for g in range(gpus)]
    d = len(devices)
    routes: list[list[tuple[int, ...]]] = [[() for _ in range(d)] for _ in range(d)]
    for h in range(nodes):
        ids = list(range(h * gpus, (h + 1) * gpus))
        prefix = f"n{h}/" if nodes > 1 else ""
        for (i, j), links in intra_routes(b, prefix, ids, intra).items():
            routes[i][j] = links
    nic_meta: dict[str, Any] = {}
    if nodes > 1:
        if inter is None:
            raise ClusterError(f"cluster {name!r} has {nodes} nodes but no inter-node link (inter:)")
        inter = block(inter, "cluster.inter", INTER_KEYS)
        nic_bw = link_bandwidth(inter, "cluster.inter")
        nic_lat = link_latency(inter, 2.0, "cluster.inter")
        icls = str(inter.get("cls", "ib"))
        nics = integer(inter.get("nics_per_node", 1), "cluster.inter.nics_per_node", ClusterError)
        if not 1 <= nics <= gpus:
            raise ClusterError(f"cluster.inter.nics_per_node: {nics} must be between 1 and gpus ({gpus})")
        nic_of = [(dev.id % gpus) * nics // gpus for dev in devices]
        nic = [f"nic{m}" if nics > 1 else "nic" for m in range(nics)]
        hl = block(host_link if host_link is not None else {"cls": "pcie", "bw_GBps": 16.0, "lat_us": 1.0}, "cluster.host_link", LINK_KEYS)
        hbw = link_bandwidth(hl, "cluster.host_link")
        hlat = link_latency(hl, 1.0, "cluster.host_link")
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


#: the keys of ``cluster.collective`` (a measured all-reduce) and their rule (a unit of
#: :data:`harness.core.topology.RANGES`); both required
COLLECTIVE_KEYS: dict[str, str] = {"lat_us": "us", "bw_GBps": "GBps"}
#: the keys of ``cluster.host_comm`` and their rule: times >= 0, the copy rate and the time
#: constants > 0 (``tau_us``), ``recv_when`` one of two words (:class:`simulators.hostcost.CpuHostCost` takes them)
HOST_COMM_KEYS: dict[str, str] = {
    "per_message_us": "us", "copy_GBps": "GBps", "recv_idle_us": "us",
    "send_cold_us": "us", "send_tau_us": "tau_us", "recv_cold_us": "us", "recv_tau_us": "tau_us", "recv_when": "always | busy",
}
#: the keys of a cluster config that land in ``Cluster.meta``
META_KEYS: tuple[str, ...] = ("collective", "host_comm")


def _check_size(devices: int) -> None:
    """Refuse a cluster whose D x D route tables would take more than :data:`MAX_ROUTE_BYTES`,
    before they are allocated."""
    need = devices * devices * ROUTE_PAIR_BYTES
    if need > MAX_ROUTE_BYTES:
        most = int(math.isqrt(MAX_ROUTE_BYTES // ROUTE_PAIR_BYTES))
        raise ClusterError(f"cluster.gpus x cluster.nodes = {devices} devices is more than the simulator represents: its "
                           f"routes are a {devices} x {devices} table (about {need / 2**30:.3g} GiB, the limit is "
                           f"{MAX_ROUTE_BYTES / 2**30:g} GiB, {most} devices); take fewer gpus or nodes")


def _check_meta(meta: Mapping[str, Any]) -> None:
    """Refuse a cluster key :func:`build_cluster` does not take and figures of ``collective``
    and ``host_comm`` out of range, naming the key."""
    unknown = [str(k) for k in meta if k not in META_KEYS]
    if unknown:
        hint = did_you_mean(unknown[0], CLUSTER_KEYS, "cluster.", {"gpu": "gpus", "node": "nodes", "host": "host_link"})
        raise ClusterError(f"cluster.{unknown[0]} is not a cluster key: {hint}a cluster takes {', '.join(CLUSTER_KEYS)}")
    if meta.get("collective") is not None:
        _check_figures(meta["collective"], "cluster.collective", COLLECTIVE_KEYS, required=tuple(COLLECTIVE_KEYS))
    if meta.get("host_comm") is not None:
        _check_figures(meta["host_comm"], "cluster.host_comm", HOST_COMM_KEYS, required=("copy_GBps",))


def _check_figures(figures: Any, key: str, rules: Mapping[str, str], required: Sequence[str]) -> None:
    """Check a mapping of figures at ``key`` against ``rules`` (a unit of
    :data:`harness.core.topology.RANGES`, or the choices ``a | b``): every key known, the
    ``required`` ones present, each value in range."""
    figures = block(figures, key, tuple(rules))
    missing = [k for k in required if figures.get(k) is None]
    if missing:
        raise ClusterError(f"{key}.{missing[0]} is missing: {key} needs {', '.join(required)}")
    for k, v in figures.items():
        rule = rules[k]
        if " | " not in rule:
            figure(v, f"{key}.{k}", rule)
        elif v not in rule.split(" | "):
            raise ClusterError(f"{key}.{k} must be {' or '.join(map(repr, rule.split(' | ')))}, got {v!r}")


#: the cluster presets of the Hydra config (conf/cluster/<name>.yaml)
PRESETS = Path(__file__).resolve().parents[2] / "conf" / "cluster"


def preset(name: str, **overrides: Any) -> Cluster:
    """Build the preset ``conf/cluster/<name>.yaml`` without Hydra (its ``device`` default and
    plain values only), with top-level keys overridden (``nodes=2``): for code that needs a
    named testbed outside a job, such as the all-reduce fit of :mod:`harness.app.kernel_fit`."""
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
