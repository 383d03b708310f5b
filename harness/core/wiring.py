"""How a cluster of identical hosts is wired, answered on demand: the id, figures and name of any
link and the route between any two devices, without the D x D tables.

:func:`harness.core.cluster.build_cluster` describes ``nodes`` hosts of ``gpus`` devices each:
the same links inside every host (:func:`harness.core.topology.intra_routes`) and, across hosts,
a route GPU -> its NIC -> the network -> the destination's NIC -> GPU.  Every link id follows
from that shape by arithmetic, in the order the builder has always numbered them (host 0's
links, host 1's, ..., then every GPU's link to its NIC, every GPU's link from its NIC, every
NIC's egress, every NIC's ingress), so a route costs O(1), the link list O(devices), and the
per-pair tables (:attr:`harness.core.cluster.Cluster.routes`) are built only when an operator-
or layer-graph simulation asks for them.  A 16,384-GPU cluster is a few numbers until then.
:func:`nic_spec` checks the NICs' block of the config (``cluster.inter``, ``cluster.host_link``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from harness.core.checks import boolean, integer, non_negative_int, number_in
from harness.core.errors import ClusterError
from harness.core.topology import LINK_KEYS, Link, LinkBuilder, Routes, block, intra_routes, link_bandwidth, link_latency

#: the keys of ``cluster.inter``, a host's NICs and the network's shape
INTER_KEYS: tuple[str, ...] = (*LINK_KEYS, "nics_per_node", "rail_optimized", "pod_nodes", "pod_oversubscription")


@dataclass(frozen=True)
class NicSpec:
    """The NICs of every host and the path to them, as checked from ``cluster.inter`` and
    ``cluster.host_link`` (SI units)."""

    nics: int  # NICs per host; GPU g of a host uses NIC g * nics // gpus
    bw: float  # bytes/s per NIC per direction
    lat: float  # s, NIC to NIC (half on egress, half on ingress)
    cls: str
    host_bw: float  # bytes/s, GPU to its NIC (host_link)
    host_lat: float  # s, GPU to NIC and back (half each way)
    host_cls: str


def nic_spec(inter: Mapping[str, Any], host_link: Mapping[str, Any] | None, gpus: int, nodes: int) -> tuple[NicSpec, dict[str, Any]]:
    """The NICs of ``cluster.inter`` and the path to them (``cluster.host_link``, PCIe by default),
    checked, and what of them lands in ``Cluster.meta``: ``nics_per_node``, ``nic_bw`` and the
    network's shape, which :mod:`harness.core.fabric` reads (``rail_optimized``, ``pod_nodes``: 0
    when one pod holds every node, ``pod_oversubscription``)."""
    inter = block(inter, "cluster.inter", INTER_KEYS)
    bw, lat, cls = link_bandwidth(inter, "cluster.inter"), link_latency(inter, 2.0, "cluster.inter"), str(inter.get("cls", "ib"))
    nics = integer(inter.get("nics_per_node", 1), "cluster.inter.nics_per_node", ClusterError)
    if not 1 <= nics <= gpus:
        raise ClusterError(f"cluster.inter.nics_per_node: {nics} must be between 1 and gpus ({gpus})")
    hl = block(host_link if host_link is not None else {"cls": "pcie", "bw_GBps": 16.0, "lat_us": 1.0}, "cluster.host_link", LINK_KEYS)
    nic = NicSpec(nics, bw, lat, cls, link_bandwidth(hl, "cluster.host_link"), link_latency(hl, 1.0, "cluster.host_link"),
                  str(hl.get("cls", "pcie")))
    shape = {"rail_optimized": boolean(inter.get("rail_optimized", False), "cluster.inter.rail_optimized", ClusterError),
             "pod_nodes": non_negative_int(inter.get("pod_nodes", 0), "cluster.inter.pod_nodes", ClusterError),
             "pod_oversubscription": number_in(inter.get("pod_oversubscription", 1.0), "cluster.inter.pod_oversubscription",
                                               1.0, 1e3, ClusterError)}
    if shape["pod_nodes"] >= nodes:
        shape["pod_nodes"] = 0  # one pod holds every node: no traffic crosses pods
    return nic, {"nics_per_node": nics, "nic_bw": nic.bw, **shape}


def host_wiring(gpus: int, nodes: int, intra: Mapping[str, Any]) -> tuple[Routes, list[Link]]:
    """Host 0's routes (device ids 0..gpus-1) and links, named as the builder names them (``n0/``
    when there are several hosts); building them checks ``intra``."""
    b = LinkBuilder()
    prefix = "n0/" if nodes > 1 else ""
    routes = intra_routes(b, prefix, list(range(gpus)), intra)
    if any(not lk.name.startswith(prefix) for lk in b.links):
        raise AssertionError("a topology builder named a link without its host prefix")
    return routes, b.links


class Wiring:
    """The links and routes of ``nodes`` identical hosts of ``gpus`` devices (see the module
    docstring): host 0's routes and links (:func:`host_wiring`), the others' being copies of
    them with their own names and ids, and the NICs (:func:`nic_spec`) when there are several."""

    def __init__(self, gpus: int, nodes: int, host: tuple[Routes, list[Link]], nic: NicSpec | None) -> None:
        if nodes > 1 and nic is None:
            raise ClusterError(f"{nodes} hosts need their NICs (cluster.inter)")
        self.gpus, self.nodes, self.nic = gpus, nodes, nic
        self.prefix = "n0/" if nodes > 1 else ""
        #: host 0's routes (device ids 0..gpus-1) and links; host h's are the same shifted by h
        self.host_routes, self.host_links = host
        self.per_host = len(self.host_links)
        self.devices = gpus * nodes
        self.nic_base = nodes * self.per_host

    # ------------------------------------------------------------------ ids and figures
    @property
    def num_links(self) -> int:
        """How many links the cluster has."""
        if self.nic is None or self.nodes == 1:
            return self.nic_base
        return self.nic_base + 2 * self.devices + 2 * self.nodes * self.nic.nics

    def nic_of(self, device: int) -> int:
        """The NIC (0..nics-1, on its host) that ``device`` uses."""
        assert self.nic is not None
        return (device % self.gpus) * self.nic.nics // self.gpus

    def _nic_name(self, m: int) -> str:
        assert self.nic is not None
        return f"nic{m}" if self.nic.nics > 1 else "nic"

    def link(self, lid: int) -> Link:
        """Link ``lid`` as the builder numbers it (see the module docstring)."""
        if not 0 <= lid < self.num_links:
            raise IndexError(f"link {lid} out of range (the cluster has {self.num_links})")
        if lid < self.nic_base:
            host, k = divmod(lid, self.per_host) if self.per_host else (0, 0)
            t = self.host_links[k]
            return t if host == 0 else Link(lid, f"n{host}/{t.name[len(self.prefix):]}", t.cls, t.bw, t.lat)
        nic, d = self.nic, self.devices
        assert nic is not None
        k = lid - self.nic_base
        if k < 2 * d:  # a GPU's link to (first block) or from (second) its NIC
            dev = k % d
            gpu, nic_name = f"n{dev // self.gpus}/gpu{dev % self.gpus}", self._nic_name(self.nic_of(dev))
            name = f"{gpu}->{nic_name}" if k < d else f"{nic_name}->{gpu}"
            return Link(lid, name, nic.host_cls, nic.host_bw, nic.host_lat / 2)
        k -= 2 * d
        egress, k = k < self.nodes * nic.nics, k % (self.nodes * nic.nics)
        host, m = divmod(k, nic.nics)
        name = f"n{host}/{self._nic_name(m)}->net" if egress else f"net->n{host}/{self._nic_name(m)}"
        return Link(lid, name, nic.cls, nic.bw, nic.lat / 2)

    def links(self) -> list[Link]:
        """Every link, by id (O(devices))."""
        out = list(self.host_links)
        strip = len(self.prefix)
        for h in range(1, self.nodes):
            off = h * self.per_host
            out.extend(Link(t.id + off, f"n{h}/{t.name[strip:]}", t.cls, t.bw, t.lat) for t in self.host_links)
        out.extend(self.link(lid) for lid in range(self.nic_base, self.num_links))
        return out

    def link_classes(self) -> list[str]:
        """The classes of the links, sorted, without listing them."""
        classes = {lk.cls for lk in self.host_links}
        if self.nic is not None and self.nodes > 1:
            classes |= {self.nic.cls, self.nic.host_cls}
        return sorted(classes)

    def route(self, i: int, j: int) -> tuple[int, ...]:
        """The link ids from device ``i`` to device ``j`` (empty for i == j)."""
        if i == j:
            return ()
        hi, hj = divmod(i, self.gpus), divmod(j, self.gpus)
        if hi[0] == hj[0]:
            off = hi[0] * self.per_host
            return tuple(lid + off for lid in self.host_routes[hi[1], hj[1]])
        nic = self.nic
        assert nic is not None
        d, per = self.devices, self.nodes * nic.nics
        egress = self.nic_base + 2 * d + hi[0] * nic.nics + self.nic_of(i)
        ingress = self.nic_base + 2 * d + per + hj[0] * nic.nics + self.nic_of(j)
        return (self.nic_base + i, egress, ingress, self.nic_base + d + j)
