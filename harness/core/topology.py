"""The links and routes inside a host, by topology (``cluster.intra.topology``): ``mesh`` (a
link per ordered pair), ``switch`` (NVSwitch: a port per GPU each way), ``pcie_tree`` (PCIe
switches under one or more CPU sockets joined by QPI) and ``nvlink_mesh`` (DGX-1's hybrid
cube-mesh, with a fallback for the pairs without an NVLink).  :func:`intra_routes` builds them
for :func:`harness.core.cluster.build_cluster`; every figure is checked as it is read and a bad
one is a :class:`~harness.core.cluster.ClusterError` naming its key as the user types it
(``cluster.intra.uplink.bw_GBps``), and so is a key a block does not take (:data:`TOPOLOGY_KEYS`,
with the nearest key it does take).  A figure must lie in its plausible range (:data:`RANGES`):
outside it a transfer or compute time overflows to infinity or vanishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from harness.core.checks import integer, known_keys, non_negative_number, positive_int, positive_number
from harness.core.errors import ClusterError

#: the keys of a link (``cluster.inter``, ``cluster.host_link``, ``qpi``; an intra topology adds its own)
LINK_KEYS: tuple[str, ...] = ("cls", "bw_GBps", "bw_gbps", "lat_us")
#: the keys of ``cluster.intra`` by topology
TOPOLOGY_KEYS: dict[str, tuple[str, ...]] = {
    "mesh": ("topology", *LINK_KEYS),
    "switch": ("topology", *LINK_KEYS, "nvls"),  # nvls: NCCL's NVLink SHARP (harness.core.fabric), not a route
    "pcie_tree": ("topology", *LINK_KEYS, "gpus_per_switch", "sockets", "uplink", "qpi"),
    "nvlink_mesh": ("topology", "cls", "lat_us", "link_GBps", "pairs", "fallback"),
}
#: the keys of a PCIe switch's ``uplink`` (its latency is the switch's)
UPLINK_KEYS: tuple[str, ...] = ("bw_GBps", "bw_gbps")
#: other words for a figure's key, for "did you mean"
ALIASES: dict[str, str] = {"bandwidth": "bw_GBps", "bw": "bw_GBps", "gbps": "bw_gbps", "latency": "lat_us", "lat": "lat_us",
                           "class": "cls", "nics": "nics_per_node", "link_bw": "link_GBps"}
#: plausible range (low, high, unit) of each kind of figure, in the unit of its key: a bandwidth
#: below 1 kB/s or a peak below 1 kFLOP/s makes a time overflow to infinity, one above 1 EB/s or
#: 1 ZFLOP/s makes it vanish; a latency is at most 1000 s; a memory 1 KiB to 1 PiB
RANGES: dict[str, tuple[float, float, str]] = {
    "GBps": (1e-6, 1e9, "GB/s"), "gbps": (8e-6, 8e9, "Gb/s"), "us": (0.0, 1e9, "us"),
    "tflops": (1e-9, 1e9, "TFLOP/s"), "GiB": (1e-6, 1e6, "GiB"), "tau_us": (1e-6, 1e9, "us"),
}


def figure(value: Any, key: str, unit: str) -> float:
    """``value`` as a float in the plausible range of its ``unit`` (a key of :data:`RANGES`), else a
    :class:`ClusterError` naming ``key``: NaN, infinity, a value <= 0 (< 0 for a latency) as the
    other checks say it, then the range."""
    lo, hi, shown = RANGES[unit]
    x = non_negative_number(value, key, ClusterError) if lo == 0 else positive_number(value, key, ClusterError)
    if not lo <= x <= hi:
        raise ClusterError(f"{key} must be between {lo:g} and {hi:g} {shown} (a plausible figure: outside it the "
                           f"simulated times overflow or vanish), got {value!r}")
    return x


def block(spec: Any, key: str, known: Sequence[str]) -> Mapping[str, Any]:
    """The mapping at config path ``key``, every key of it in ``known``, else a :class:`ClusterError`
    naming the path (and the nearest known key)."""
    if not isinstance(spec, Mapping):
        raise ClusterError(f"{key} must be a mapping of {', '.join(known)}, got {spec!r}")
    known_keys(spec, known, key, ClusterError, ALIASES)
    return spec


def link_bandwidth(spec: Mapping[str, Any], key: str) -> float:
    """A link's bandwidth in bytes/s from the ``bw_GBps`` or ``bw_gbps`` of the spec at config
    path ``key`` (``cluster.inter``)."""
    if spec.get("bw_GBps") is not None:
        return figure(spec["bw_GBps"], f"{key}.bw_GBps", "GBps") * 1e9
    if spec.get("bw_gbps") is not None:
        return figure(spec["bw_gbps"], f"{key}.bw_gbps", "gbps") * 1e9 / 8
    raise ClusterError(f"{key} needs bw_GBps (gigabytes/s) or bw_gbps (gigabits/s)")


@dataclass(frozen=True, slots=True)
class Link:
    """A directional link.  ``cls`` is the link class used when reporting bytes moved."""

    id: int
    name: str
    cls: str
    bw: float  # bytes/s
    lat: float  # s


class LinkBuilder:
    """Numbers the links of a cluster as the route builders create them."""

    def __init__(self) -> None:
        self.links: list[Link] = []

    def link(self, name: str, cls: str, bw: float, lat: float) -> int:
        """Add a directional link; its id."""
        self.links.append(Link(len(self.links), name, cls, bw, lat))
        return len(self.links) - 1


#: the routes among one host's GPUs, by (source, destination) device id
Routes = dict[tuple[int, int], tuple[int, ...]]


def link_latency(spec: Mapping[str, Any], default_us: float, key: str) -> float:
    """A link's latency in seconds from the ``lat_us`` of the spec at config path ``key``."""
    return figure(spec.get("lat_us", default_us), f"{key}.lat_us", "us") * 1e-6


def _mesh_routes(b: LinkBuilder, prefix: str, gpus: list[int], spec: Mapping[str, Any], key: str) -> Routes:
    """A dedicated link per ordered pair of GPUs (all-to-all NVLink of equal width)."""
    cls, bw, lat = str(spec.get("cls", "nvlink")), link_bandwidth(spec, key), link_latency(spec, 5.0, key)
    routes: Routes = {}
    for a in range(len(gpus)):
        for c in range(len(gpus)):
            if a != c:
                routes[gpus[a], gpus[c]] = (b.link(f"{prefix}gpu{a}->gpu{c}", cls, bw, lat),)
    return routes


def _switch_routes(b: LinkBuilder, prefix: str, gpus: list[int], spec: Mapping[str, Any], key: str) -> Routes:
    """A non-blocking switch (NVSwitch): one port per GPU each way, every route is port in -> port out."""
    cls, bw, lat = str(spec.get("cls", "nvlink")), link_bandwidth(spec, key), link_latency(spec, 5.0, key)
    k = len(gpus)
    up = [b.link(f"{prefix}gpu{a}->sw", cls, bw, lat / 2) for a in range(k)]
    down = [b.link(f"{prefix}sw->gpu{a}", cls, bw, lat / 2) for a in range(k)]
    return {(gpus[a], gpus[c]): (up[a], down[c]) for a in range(k) for c in range(k) if a != c}


def _pcie_tree_routes(b: LinkBuilder, prefix: str, gpus: list[int], spec: Mapping[str, Any], key: str) -> Routes:
    """GPUs under PCIe switches (``gpus_per_switch``), each switch's ``uplink`` to a root complex.

    With ``sockets: S`` the switches are split evenly among S CPU sockets, each with its own
    root complex, and the roots are joined by ``qpi: {bw_GBps, lat_us}`` (a link per ordered
    pair of sockets): a route between GPUs on different sockets is GPU -> switch -> root(a) ->
    QPI -> root(b) -> switch -> GPU.  Without ``sockets`` there is one root, named ``root``.
    """
    cls, bw, lat = str(spec.get("cls", "nvlink")), link_bandwidth(spec, key), link_latency(spec, 5.0, key)
    k = len(gpus)
    per_sw = positive_int(spec.get("gpus_per_switch", 2), f"{key}.gpus_per_switch", ClusterError)
    up = [b.link(f"{prefix}gpu{a}->sw{a // per_sw}", cls, bw, lat / 2) for a in range(k)]
    down = [b.link(f"{prefix}sw{a // per_sw}->gpu{a}", cls, bw, lat / 2) for a in range(k)]
    nsw = (k + per_sw - 1) // per_sw
    sockets = integer(spec.get("sockets", 1), f"{key}.sockets", ClusterError)
    if sockets < 1 or nsw % sockets:
        raise ClusterError(f"{key}.sockets: {sockets} socket(s) cannot share the {nsw} PCIe switch(es) evenly")
    sock = [s // (nsw // sockets) for s in range(nsw)]
    root = [f"root{sock[s]}" if sockets > 1 else "root" for s in range(nsw)]
    uplink = spec.get("uplink")
    up_bw = link_bandwidth(block(uplink, f"{key}.uplink", UPLINK_KEYS), f"{key}.uplink") if uplink is not None else bw
    sw_up = [b.link(f"{prefix}sw{s}->{root[s]}", cls, up_bw, 0.0) for s in range(nsw)]
    sw_down = [b.link(f"{prefix}{root[s]}->sw{s}", cls, up_bw, 0.0) for s in range(nsw)]
    qpi: dict[tuple[int, int], int] = {}
    if sockets > 1:
        if spec.get("qpi") is None:
            raise ClusterError(f"{key}.qpi is missing: {sockets} sockets need qpi: {{bw_GBps, lat_us}} between their root complexes")
        q = block(spec["qpi"], f"{key}.qpi", LINK_KEYS)
        qcls, qbw, qlat = str(q.get("cls", "qpi")), link_bandwidth(q, f"{key}.qpi"), link_latency(q, 0.0, f"{key}.qpi")
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


def _nvlink_mesh_routes(b: LinkBuilder, prefix: str, gpus: list[int], spec: Mapping[str, Any], key: str) -> Routes:
    """NVLink point to point, as on DGX-1's hybrid cube-mesh: each listed pair ``[i, j, nlinks]``
    gets ``nlinks`` bricks of ``link_GBps`` per direction (one directional link each way of
    ``nlinks x link_GBps``).  Pairs without an NVLink take their route through ``fallback``
    (an intra-node spec, typically a ``pcie_tree`` with ``sockets``: CUDA peer-to-peer between
    GPUs without an NVLink goes over PCIe, and over QPI across CPU sockets)."""
    if spec.get("link_GBps") is None:
        raise ClusterError(f"{key}.link_GBps is missing: nvlink_mesh needs the bandwidth of one brick per direction")
    brick = figure(spec["link_GBps"], f"{key}.link_GBps", "GBps") * 1e9
    cls, lat = str(spec.get("cls", "nvlink")), link_latency(spec, 5.0, key)
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
    if isinstance(fallback, Mapping) and str(fallback.get("topology", "switch")) == "nvlink_mesh":
        raise ClusterError(f"{key}.fallback cannot be another nvlink_mesh")
    for pair, r in intra_routes(b, prefix, gpus, fallback, f"{key}.fallback").items():
        routes.setdefault(pair, r)
    return routes


TOPOLOGIES = {"mesh": _mesh_routes, "switch": _switch_routes, "pcie_tree": _pcie_tree_routes, "nvlink_mesh": _nvlink_mesh_routes}


def intra_routes(b: LinkBuilder, prefix: str, gpus: list[int], spec: Mapping[str, Any], key: str = "cluster.intra") -> Routes:
    """Routes among the GPUs of one host, by ``spec["topology"]`` (``key``, the spec's path in
    the config such as ``cluster.intra`` or ``cluster.intra.fallback``, names it in errors); a key
    the topology does not take (:data:`TOPOLOGY_KEYS`) is refused."""
    if not isinstance(spec, Mapping):
        raise ClusterError(f"{key} must be a mapping (topology: {' | '.join(TOPOLOGIES)}, and its figures), got {spec!r}")
    topo = str(spec.get("topology", "switch"))
    if topo not in TOPOLOGIES:
        raise ClusterError(f"{key}.topology={topo!r} is not a topology: use {', '.join(TOPOLOGIES)}")
    return TOPOLOGIES[topo](b, prefix, gpus, block(spec, key, TOPOLOGY_KEYS[topo]), key)
