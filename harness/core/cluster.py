"""Clusters: devices, directional links, and a route (list of links) between every pair.

Links follow the alpha-beta model: a transfer of ``b`` bytes over a route takes
``sum(lat) + b / min(bw)``.  Routes go through shared links (a GPU's NVLink or PCIe port,
a PCIe switch uplink, a node's NIC), so transfers that share a link contend for it in the
simulator.  Every link is directional (full duplex = two links).

Units: bandwidths in the YAML are ``bw_GBps`` (gigabytes per second) or ``bw_gbps``
(gigabits per second, the network convention), per direction (``link_GBps``: one NVLink
brick); latencies ``lat_us``; device peaks ``peak_tflops`` per math mode (``float32`` on CUDA
cores; ``tf32``, ``float16``, ``bfloat16``, ``float8`` (FP8, E4M3 or E5M2: the same rate) on
tensor cores, dense); memory ``mem_GiB`` and
``mem_bw_GBps``.  In Python everything is SI: bytes, seconds, FLOP/s, bytes/s.

Every figure is checked where it is read, and a bad one is a :class:`ClusterError` naming its
key as the user types it (``cluster.intra.bw_GBps must be > 0, got -5``): bandwidths, peaks
and memory finite, > 0 and in a plausible range (:data:`harness.core.topology.RANGES`: a
subnormal bandwidth would make every transfer take forever), latencies finite and >= 0,
``gpus``, ``nodes`` and other counts integers >= 1, and at most :data:`MAX_DEVICES` devices.  The
links and the D x D route tables are built on first use (:class:`harness.core.wiring.Wiring`):
an operator- or layer-graph simulation needs the tables and is refused beyond
:data:`MAX_ROUTE_BYTES` (about 2,500 devices); the stack simulator never asks.  A key that a block does not take is refused
with the nearest one it does ("did you mean cluster.intra.bw_GBps?"), at every level: the
cluster, its device, ``intra`` by topology, ``inter``, ``host_link``, ``collective``,
``host_comm``.  The checks of :mod:`harness.core.checks` take the error class to raise, so the
cost models and graph sources use them for their own keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from harness.core.checks import boolean, did_you_mean, non_negative_number, positive_int
from harness.core.errors import ClusterError
from harness.core.topology import Link, block, figure
from harness.core.wiring import NicSpec, Wiring, host_wiring, nic_spec

GIB = 2**30


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One accelerator model, from its datasheet."""

    kind: str
    peak_flops: Mapping[str, float]  # FLOP/s per dtype name ("float32", "float16", ...)
    mem_bw: float  # bytes/s
    #: bytes the framework's tensors may take: the datasheet's less ``runtime_bytes``, over ``alloc_reserve``
    mem_capacity: int
    #: device memory the software stack holds outside the framework's tensors (the CUDA context with
    #: its loaded kernels, the communication library's buffers): a cluster's ``runtime_GiB``
    runtime_bytes: int = 0
    #: the caching allocator's reserved bytes per byte of tensors at the peak (its pool's rounding and
    #: fragmentation): a cluster's ``allocator_reserve``; 1: not modelled
    alloc_reserve: float = 1.0

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


class Cluster:
    """Devices, links and routes.  ``routes[i][j]`` is the tuple of link ids from i to j.

    A cluster from :func:`build_cluster` carries its :class:`~harness.core.wiring.Wiring`: any
    link (:meth:`link`) and any route (:meth:`route`) is answered on demand, the link list on
    first use of :attr:`links`, and the D x D tables (:attr:`routes`, :attr:`route_bw`,
    :attr:`route_lat`, :attr:`route_links`, :attr:`route_len`) on first use of any of them, once
    :func:`check_route_tables` allows their size.  So a 16,384-GPU cluster builds in milliseconds
    for the stack simulator, which never asks for them, while an operator- or layer-graph plan on
    it is refused in one line naming the device count.  A cluster given its ``links`` and
    ``routes`` (a hand-made one, :meth:`subset`) is checked at once.
    """

    def __init__(self, name: str, devices: list[Device], links: list[Link] | None = None,
                 routes: list[list[tuple[int, ...]]] | None = None, meta: dict[str, Any] | None = None,
                 wiring: Wiring | None = None) -> None:
        self.name, self.devices = name, devices
        self.meta: dict[str, Any] = meta if meta is not None else {}
        self.wiring = wiring
        self._links = list(links) if links is not None else None
        self._routes = routes
        self._tables: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        d = len(devices)
        if d == 0:
            raise ClusterError(f"cluster {name!r} has no devices")
        if wiring is None:
            if links is None or routes is None:
                raise ClusterError(f"cluster {name!r} needs its links and routes (or a wiring)")
            self._check_routes()

    def _check_routes(self) -> None:
        """Every route of a hand-made cluster names known links, and every pair has one."""
        d, nl, routes = self.num_devices, self.num_links, self._routes
        assert routes is not None
        if len(routes) != d or any(len(r) != d for r in routes):
            raise ClusterError(f"cluster {self.name!r}: routes must be a {d}x{d} table")
        for i in range(d):
            for j in range(d):
                r = routes[i][j]
                if i != j and not r:
                    raise ClusterError(f"cluster {self.name!r}: no route from device {i} to device {j}")
                for l in r:
                    if not 0 <= l < nl:
                        raise ClusterError(f"cluster {self.name!r}: route {i}->{j} uses unknown link {l}")

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_links(self) -> int:
        """How many links (without listing them)."""
        if self._links is not None:
            return len(self._links)
        assert self.wiring is not None
        return self.wiring.num_links

    @property
    def links(self) -> list[Link]:
        """Every link by id (built on first use: O(devices))."""
        if self._links is None:
            assert self.wiring is not None
            self._links = self.wiring.links()
        return self._links

    def link(self, lid: int) -> Link:
        """Link ``lid``, without building the list."""
        if self._links is not None:
            return self._links[lid]
        assert self.wiring is not None
        return self.wiring.link(lid)

    def route(self, i: int, j: int) -> tuple[int, ...]:
        """The link ids from device ``i`` to ``j``, without building the tables."""
        if self._routes is not None:
            return self._routes[i][j]
        assert self.wiring is not None
        return self.wiring.route(i, j)

    @property
    def link_classes(self) -> list[str]:
        """The link classes present, sorted."""
        if self._links is None and self.wiring is not None:
            return self.wiring.link_classes()
        return sorted({l.cls for l in self.links})

    @property
    def routes(self) -> list[list[tuple[int, ...]]]:
        """The D x D table of routes (built on first use; refused beyond :data:`MAX_ROUTE_BYTES`)."""
        if self._routes is None:
            assert self.wiring is not None
            d = self.num_devices
            check_route_tables(d)
            w = self.wiring
            self._routes = [[w.route(i, j) for j in range(d)] for i in range(d)]
        return self._routes

    def _route_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(bottleneck bandwidth, latency, padded link ids, route length) of every pair."""
        if self._tables is None:
            d, routes, links = self.num_devices, self.routes, self.links
            bw, lat = np.full((d, d), np.inf), np.zeros((d, d))
            width = max((len(r) for row in routes for r in row), default=0)
            ids = np.full((d, d, width), -1, dtype=np.int64)
            length = np.zeros((d, d), dtype=np.int64)
            for i in range(d):
                for j in range(d):
                    r = routes[i][j]
                    if i != j:
                        bw[i, j] = min(links[l].bw for l in r)
                        lat[i, j] = sum(links[l].lat for l in r)
                    ids[i, j, : len(r)] = r
                    length[i, j] = len(r)
            self._tables = (bw, lat, ids, length)
        return self._tables

    @property
    def route_bw(self) -> np.ndarray:
        """[D, D] bottleneck bandwidth of each route (bytes/s; inf on the diagonal)."""
        return self._route_tables()[0]

    @property
    def route_lat(self) -> np.ndarray:
        """[D, D] latency of each route (s), the sum of its links'."""
        return self._route_tables()[1]

    @property
    def route_links(self) -> np.ndarray:
        """[D, D, width] link ids of each route, padded with -1."""
        return self._route_tables()[2]

    @property
    def route_len(self) -> np.ndarray:
        """[D, D] number of links of each route."""
        return self._route_tables()[3]

    @property
    def mem_capacity(self) -> np.ndarray:
        return np.array([dev.spec.mem_capacity for dev in self.devices], dtype=np.int64)

    def subset(self, k: int) -> "Cluster":
        """The first ``k`` devices with the links their routes use (OptCNN Fig. 7's 1..16 GPU points)."""
        if not 1 <= k <= self.num_devices:
            raise ClusterError(f"cluster {self.name!r} has {self.num_devices} devices; cannot take {k}")
        check_route_tables(k)
        used = sorted({l for i in range(k) for j in range(k) for l in self.route(i, j)})
        remap = {old: new for new, old in enumerate(used)}
        links = [Link(remap[l], self.link(l).name, self.link(l).cls, self.link(l).bw, self.link(l).lat) for l in used]
        routes = [[tuple(remap[l] for l in self.route(i, j)) for j in range(k)] for i in range(k)]
        return Cluster(f"{self.name}[:{k}]", self.devices[:k], links, routes, dict(self.meta))

    def with_host_comm(self, host_comm: Mapping[str, Any]) -> "Cluster":
        """The same cluster with other ``host_comm`` figures (what a message costs a CPU rank's
        core, see :func:`simulators.taskgraph.build_taskgraph`); this one is left as it is."""
        return Cluster(self.name, self.devices, self._links, self._routes, {**self.meta, "host_comm": dict(host_comm)}, self.wiring)

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
        send).  Routes are looked up pair by pair (:meth:`route`), never as tables.
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
                routes = [self.route(x, y) for y in others]
                direct = {r[0] for r in routes if len(r) == 1}
                inject = sum(self.link(l).bw for l in direct) if direct else min(min(self.link(l).bw for l in r) for r in routes)
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
            f"{self.num_links} links ({', '.join(self.link_classes) or 'none'})"
        )
        if self.num_devices > 1 and (hosts == 1 or "nic_of" in self.meta):
            text += f", ring all-reduce {self.ring_bandwidth(range(self.num_devices)) / 1e9:.1f} GB/s per GPU"
        return text


# ---------------------------------------------------------------------------- builders
#: the keys of a device spec (``conf/cluster/device/*.yaml``)
DEVICE_KEYS: tuple[str, ...] = ("kind", "peak_tflops", "mem_bw_GBps", "mem_GiB")
#: the math modes a device's ``peak_tflops`` may name (``float32`` is required; ``float8``: the FP8
#: tensor-core rate, E4M3 and E5M2 alike)
PEAK_KEYS: tuple[str, ...] = ("float32", "tf32", "float16", "bfloat16", "float64", "float8")
#: other words for a device key, for "did you mean"
DEVICE_ALIASES: dict[str, str] = {"peak": "peak_tflops", "tflops": "peak_tflops", "memory": "mem_GiB", "mem": "mem_GiB",
                                  "mem_GB": "mem_GiB", "bandwidth": "mem_bw_GBps", "mem_bw": "mem_bw_GBps", "name": "kind"}
#: the keys of a cluster config (``conf/cluster/*.yaml``, without ``_target_`` and ``defaults``)
CLUSTER_KEYS: tuple[str, ...] = ("name", "device", "gpus", "nodes", "intra", "inter", "host_link", "runtime_GiB",
                                  "allocator_reserve", "collective", "host_comm")
#: the plausible range of ``cluster.allocator_reserve`` (reserved / allocated bytes at the peak)
ALLOCATOR_RESERVE_RANGE: tuple[float, float] = (1.0, 3.0)
#: the most memory the route tables of a cluster may take (``routes`` and its arrays are D x D,
#: built only when an operator- or layer-graph simulation asks for them): about 2500 devices
MAX_ROUTE_BYTES = 2**30
#: the most devices a cluster may have (its device list, a few hundred bytes each; the stack
#: simulator needs nothing per pair): 2^17, eight times the 16,384 GPUs of Llama 3 405B's run
MAX_DEVICES = 2**17
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


def runtime_spec(spec: DeviceSpec, runtime_GiB: Any, key: str = "cluster.runtime_GiB", allocator_reserve: Any = 1.0) -> DeviceSpec:
    """``spec`` with ``runtime_GiB`` of its memory held by the software stack and the rest shared
    by the tensors and the caching allocator's slack: the tensors may take ``(memory - runtime) /
    allocator_reserve`` (a :class:`ClusterError` naming the key for a figure not a number, a
    runtime < 0 or not below the device's memory, a reserve outside :data:`ALLOCATOR_RESERVE_RANGE`)."""
    runtime = int(non_negative_number(runtime_GiB, key, ClusterError) * GIB)
    if runtime >= spec.mem_capacity:
        raise ClusterError(f"{key} = {runtime_GiB} leaves none of the {spec.kind}'s {spec.mem_capacity / GIB:g} GiB to the "
                           "framework's tensors; it is the memory the CUDA context and NCCL hold (about 2 GiB)")
    reserve = non_negative_number(allocator_reserve, "cluster.allocator_reserve", ClusterError)
    lo, hi = ALLOCATOR_RESERVE_RANGE
    if not lo <= reserve <= hi:
        raise ClusterError(f"cluster.allocator_reserve = {allocator_reserve} is outside {lo:g}-{hi:g}: it is the caching "
                           "allocator's reserved bytes per allocated byte at the peak (1: not modelled; about 1.2 measured)")
    return replace(spec, mem_capacity=int((spec.mem_capacity - runtime) / reserve), runtime_bytes=runtime, alloc_reserve=float(reserve))


def build_cluster(
    name: str,
    device: Mapping[str, Any],
    gpus: int,
    nodes: int = 1,
    intra: Mapping[str, Any] | None = None,
    inter: Mapping[str, Any] | None = None,
    host_link: Mapping[str, Any] | None = None,
    runtime_GiB: float = 0.0,
    allocator_reserve: float = 1.0,
    **meta: Any,
) -> Cluster:
    """Build a cluster of ``nodes`` hosts with ``gpus`` devices each (the Hydra ``_target_`` of conf/cluster).

    ``intra`` describes the links inside a host (``topology`` mesh / switch / pcie_tree /
    nvlink_mesh, ``cls``, ``bw_GBps`` or ``bw_gbps``, ``lat_us``; :mod:`harness.core.topology`
    lists the topologies' own keys); ``inter`` the NICs of each host
    (``nics_per_node``: k NICs, GPU g of a host using NIC g * k // gpus; 1 by default);
    ``host_link`` the path from a GPU to its NIC (PCIe by default).  A route between hosts is
    GPU -> its NIC (host_link) -> NIC egress -> NIC ingress of the destination GPU's NIC -> GPU.
    ``inter`` also says the network's shape, which the collective model of
    :mod:`harness.core.fabric` reads (the routes do not): ``rail_optimized`` (GPU g of every node
    on rail g, false by default), ``pod_nodes`` (nodes per full-bisection pod, 0 = one pod) and
    ``pod_oversubscription`` (x >= 1: the bandwidth between pods is 1/x of the NICs'); so does
    ``intra.nvls`` (a switch: NCCL's NVLink SHARP all-reduce on or off; unset, the fabric's default).
    Two more keys land in ``Cluster.meta`` (:data:`META_KEYS`): ``collective: {lat_us, bw_GBps}``
    (measured all-reduce figures, e.g. by ``python -m harness.calibrate``) replaces the links'
    in the cost model's ring all-reduce; ``host_comm`` (:data:`HOST_COMM_KEYS`) is what a
    message costs a CPU rank's core (see :func:`simulators.taskgraph.build_taskgraph`).  Any
    other key, and any figure out of range, is a :class:`ClusterError` naming it.
    ``runtime_GiB`` is the device memory the cluster's software stack holds before the framework
    allocates a tensor (the CUDA context and its kernels, NCCL's communicators; 0: not modelled):
    every device's :attr:`DeviceSpec.mem_capacity` is its datasheet memory less it, so plans,
    searches and OOM verdicts see what the tensors may take (:func:`runtime_spec`).
    ``allocator_reserve`` (>= 1) is the caching allocator's pool per byte of tensors at the peak
    (PyTorch's reserved over its allocated bytes: rounding and fragmentation); the tensors may take
    the rest over it, and an nvidia-smi figure is the tensors times it plus ``runtime_GiB``.
    """

    gpus, nodes = positive_int(gpus, "cluster.gpus", ClusterError), positive_int(nodes, "cluster.nodes", ClusterError)
    _check_size(gpus, nodes)
    _check_meta(meta)
    spec = runtime_spec(device_spec(device), runtime_GiB, allocator_reserve=allocator_reserve)
    intra = intra if intra is not None else {"topology": "switch", "cls": "nvlink", "bw_GBps": 25.0, "lat_us": 5.0}
    host = host_wiring(gpus, nodes, intra)
    nic_meta: dict[str, Any] = {}
    nic: NicSpec | None = None
    if nodes > 1:
        if inter is None:
            raise ClusterError(f"cluster {name!r} has {nodes} nodes but no inter-node link (inter:)")
        nic, nic_meta = nic_spec(inter, host_link, gpus, nodes)
    wiring = Wiring(gpus, nodes, host, nic)
    devices = [Device(h * gpus + g, f"n{h}/gpu{g}", spec, h) for h in range(nodes) for g in range(gpus)]
    if nic is not None:
        nic_meta["nic_of"] = tuple(wiring.nic_of(dev.id) for dev in devices)
    shape = {"intra_topology": str(intra.get("topology", "switch")),
             "nvls": None if intra.get("nvls") is None else boolean(intra["nvls"], "cluster.intra.nvls", ClusterError)}
    return Cluster(name, devices, meta={"gpus_per_node": gpus, "nodes": nodes, **shape, **nic_meta, **meta}, wiring=wiring)


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


def _check_size(gpus: int, nodes: int) -> None:
    """Refuse, before anything is allocated, a cluster of more than :data:`MAX_DEVICES` devices,
    and a host whose own routes (gpus x gpus, built with the cluster) would pass the route budget."""
    devices = gpus * nodes
    if devices > MAX_DEVICES:
        raise ClusterError(f"cluster.gpus x cluster.nodes = {devices} devices is more than the simulator represents "
                           f"(at most {MAX_DEVICES} devices); take fewer gpus or nodes")
    if gpus * gpus * ROUTE_PAIR_BYTES > MAX_ROUTE_BYTES:
        raise ClusterError(f"cluster.gpus = {gpus} devices per node is more than the simulator represents: the routes "
                           f"inside a node are a {gpus} x {gpus} table (the limit is {max_route_devices()} devices per "
                           f"node); take fewer gpus and more nodes")


def max_route_devices() -> int:
    """The most devices whose D x D route tables fit :data:`MAX_ROUTE_BYTES`."""
    return int(math.isqrt(MAX_ROUTE_BYTES // ROUTE_PAIR_BYTES))


def check_route_tables(devices: int) -> None:
    """Refuse to build the D x D route tables of ``devices`` devices when they would take more
    than :data:`MAX_ROUTE_BYTES`: an operator- or layer-graph simulation needs them, the stack
    simulator does not (one line naming the device count and both ways out)."""
    need = devices * devices * ROUTE_PAIR_BYTES
    if need > MAX_ROUTE_BYTES:
        raise ClusterError(f"cluster.gpus x cluster.nodes = {devices} devices is more than an operator or layer graph's "
                           f"simulation represents: its routes are a {devices} x {devices} table (about {need / 2**30:.3g} "
                           f"GiB, the limit is {MAX_ROUTE_BYTES / 2**30:g} GiB, {max_route_devices()} devices); take fewer "
                           f"gpus or nodes, or plan with a stack algorithm (algo=megatron, algo=fsdp), which needs no routes")


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
