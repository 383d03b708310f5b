"""The array view of a DAG a list scheduler works on (HEFT, FastT, MP-DPS, FD-DPS).

:class:`SchedGraph` holds per-device execution times ``et[d][v]`` (ET(o_i, v_k) of FD-DPS
Eq. 6), mean costs ``w``/``c`` (HEFT's mean w_i and c_ij,
:func:`algorithms.sched.levels.static_costs`), edge bytes, static memory and co-location
groups.  It has ``succ_csr``/``pred_csr``/``num_nodes``, so the levels of
:mod:`algorithms.sched.levels` run on it; :meth:`SchedGraph.quotient` contracts groups of
nodes (MP-DPS's merged nodes).  :func:`comm_fn` is c_ij for a concrete pair of devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from algorithms.sched.levels import mean_transfer_time, static_costs
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import EdgeListGraph, OpGraph
from harness.core.graph_rewrites import union_roots

CommFn = Callable[[float, int, int], float]


@dataclass(eq=False)
class SchedGraph(EdgeListGraph):
    """What a list scheduler needs of a DAG; node ids are a topological order (src < dst)."""

    num_nodes: int
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray  # bytes per edge (what c_ij is computed from on a concrete device pair)
    et: np.ndarray  # [D, n] execution time of every node on every device
    w: np.ndarray  # [n] mean execution time (HEFT's w-bar)
    c: np.ndarray  # [E] mean transfer time over pairs of distinct devices (c-bar)
    mem: np.ndarray  # [n] static bytes a node adds to its device
    coloc: np.ndarray  # [n] co-location group or -1
    names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._succ: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pred: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        if len(self.src) and (self.src >= self.dst).any():
            e = int(np.flatnonzero(self.src >= self.dst)[0])
            raise ValueError(f"SchedGraph edge {int(self.src[e])} -> {int(self.dst[e])} does not follow node order")

    @property
    def num_devices(self) -> int:
        return int(self.et.shape[0])

    @classmethod
    def from_opgraph(cls, graph: OpGraph, cluster: Cluster, costs: CostModel) -> "SchedGraph":
        D = cluster.num_devices
        et = np.zeros((D, graph.num_nodes))
        by_kind: dict[str, np.ndarray] = {}
        for d, dev in enumerate(cluster.devices):
            if dev.spec.kind not in by_kind:
                by_kind[dev.spec.kind] = np.asarray(costs.node_times(graph, d), dtype=np.float64)
            et[d] = by_kind[dev.spec.kind]
        w, c = static_costs(graph, cluster, costs)
        return cls(
            num_nodes=graph.num_nodes, src=graph.src.astype(np.int64), dst=graph.dst.astype(np.int64),
            nbytes=graph.nbytes.astype(np.int64), et=et, w=np.asarray(w, dtype=np.float64), c=np.asarray(c, dtype=np.float64),
            mem=np.asarray(costs.memory(graph), dtype=np.int64), coloc=graph.coloc.astype(np.int64), names=list(graph.names),
        )

    def quotient(self, group: np.ndarray, cluster: Cluster) -> "SchedGraph":
        """Contract nodes with the same ``group`` id (ids 0..G-1, numbered so that the quotient
        is topological: every edge between groups goes from a lower to a higher id).

        Execution time and memory add up; parallel edges merge (bytes add, and c-bar is
        recomputed from the summed bytes with the cluster's mean link figures); co-location
        groups that share a merged node become one group, so pinning stays consistent.
        """
        group = np.asarray(group, dtype=np.int64)
        G = int(group.max()) + 1 if len(group) else 0
        et = np.zeros((self.num_devices, G))
        for d in range(self.num_devices):
            et[d] = np.bincount(group, weights=self.et[d], minlength=G)
        w = np.bincount(group, weights=self.w, minlength=G)
        mem = np.bincount(group, weights=self.mem, minlength=G).astype(np.int64)
        gs, gd = group[self.src], group[self.dst]
        ext = gs != gd
        if (gs[ext] > gd[ext]).any():
            raise ValueError("quotient groups are not numbered topologically (an edge goes to a lower group id)")
        key = gs[ext] * max(G, 1) + gd[ext]
        ukey, inv = np.unique(key, return_inverse=True)
        nb = np.bincount(inv, weights=self.nbytes[ext], minlength=len(ukey)).astype(np.int64)
        qs, qd = ukey // max(G, 1), ukey % max(G, 1)
        c = mean_transfer_time(nb, cluster)
        # co-location: union the groups that meet in one merged node
        first_of: dict[int, int] = {}
        unions: list[tuple[int, int]] = []
        for v, cg in zip(group.tolist(), self.coloc.tolist()):
            if cg < 0:
                continue
            if cg in first_of:
                unions.append((first_of[cg], v))
            else:
                first_of[cg] = v
        has = np.zeros(G, dtype=bool)
        has[group[self.coloc >= 0]] = True
        roots = union_roots(G, unions)
        coloc = np.full(G, -1, dtype=np.int64)
        if has.any():
            _, ids = np.unique(roots[has], return_inverse=True)
            coloc[has] = ids
        names = [""] * G
        for v in range(self.num_nodes - 1, -1, -1):
            names[group[v]] = self.names[v] if self.names else str(v)
        return SchedGraph(G, qs, qd, nb, et, w, c, mem, coloc, names)


def route_tables(costs: CostModel) -> tuple[np.ndarray, np.ndarray] | None:
    """(latency, bandwidth) ``[D, D]`` of the routes when c_ij is route latency + bytes / route
    bandwidth, as the cost model says (:meth:`~harness.core.costs.CostModel.transfer_routes`),
    else None."""
    return costs.transfer_routes()


def comm_fn(costs: CostModel) -> CommFn:
    """c_ij for a concrete device pair: ``costs.transfer_time``; for the analytical formula
    (:func:`route_tables`) the same sum read from Python lists."""
    routes = route_tables(costs)
    if routes is not None:
        lat = routes[0].tolist()
        bw = routes[1].tolist()

        def comm(nbytes: float, a: int, b: int) -> float:
            if a == b or nbytes <= 0:
                return 0.0
            return lat[a][b] + nbytes / bw[a][b]

        return comm
    return lambda nbytes, a, b: 0.0 if a == b else float(costs.transfer_time(nbytes, a, b))
