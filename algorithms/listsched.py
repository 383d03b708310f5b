"""Primitives shared by the list-scheduling placers (HEFT, FD-DPS, FastT, MP-DPS, m-ETF,
m-SCT, Celeritas): static costs, top and bottom levels, and device timelines with
insertion slots.

These are the textbook definitions (Kwok and Ahmad 1999; Topcuoglu et al. 2002) that the
papers build on:

* ``w_i``: computation cost of node i (Celeritas Eq. 1's w_i, HEFT's mean w_i);
* ``c_ij``: communication cost of edge (i, j) when its endpoints sit on different devices;
* ``tlevel(i)``: length of the longest path from an entry node to i, excluding w_i
  (Celeritas Eq. 2);
* ``blevel(i)``: length of the longest path from i to an exit node, including w_i
  (Celeritas Eq. 3; HEFT's upward rank);
* a device :class:`Timeline` of busy intervals answers "earliest start of a task of
  duration d that is ready at t", either after the last task (append) or in the first
  idle gap that fits (insertion, HEFT Sec. 4.1).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from harness.cluster import Cluster
from harness.costs import CostModel
from harness.graph import OpGraph


def static_costs(graph: OpGraph, cluster: Cluster, costs: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """(w, c): each node's compute time averaged over the cluster's devices, and each edge's
    transfer time averaged over ordered pairs of distinct devices (HEFT's mean costs; on a
    homogeneous cluster w is simply the time on any device)."""
    D = cluster.num_devices
    kinds: dict[str, int] = {}
    for d, dev in enumerate(cluster.devices):
        kinds.setdefault(dev.spec.kind, d)
    w = np.zeros(graph.num_nodes)
    for kind, d in kinds.items():
        share = sum(dev.spec.kind == kind for dev in cluster.devices) / D
        w += share * costs.node_times(graph, d)
    if D < 2 or graph.num_edges == 0:
        return w, np.zeros(graph.num_edges)
    off = ~np.eye(D, dtype=bool)
    inv_bw = (1.0 / cluster.route_bw[off]).mean()
    lat = cluster.route_lat[off].mean()
    c = np.where(graph.nbytes > 0, lat + graph.nbytes * inv_bw, 0.0)
    return w, c


def tlevel(graph: OpGraph, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Top level of every node (Celeritas Eq. 2): max over predecessors of tlevel + w + c."""
    ptr, pred, eid = graph.pred_csr()
    ptr_l, pred_l, eid_l = ptr.tolist(), pred.tolist(), eid.tolist()
    wl, cl = w.tolist(), c.tolist()
    tl = [0.0] * graph.num_nodes
    for v in range(graph.num_nodes):
        best = 0.0
        for i in range(ptr_l[v], ptr_l[v + 1]):
            u = pred_l[i]
            x = tl[u] + wl[u] + cl[eid_l[i]]
            if x > best:
                best = x
        tl[v] = best
    return np.asarray(tl)


def blevel(graph: OpGraph, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Bottom level of every node (Celeritas Eq. 3, HEFT's upward rank): w plus the max over
    successors of c + blevel."""
    ptr, succ, eid = graph.succ_csr()
    ptr_l, succ_l, eid_l = ptr.tolist(), succ.tolist(), eid.tolist()
    wl, cl = w.tolist(), c.tolist()
    bl = [0.0] * graph.num_nodes
    for v in range(graph.num_nodes - 1, -1, -1):
        best = 0.0
        for i in range(ptr_l[v], ptr_l[v + 1]):
            x = cl[eid_l[i]] + bl[succ_l[i]]
            if x > best:
                best = x
        bl[v] = wl[v] + best
    return np.asarray(bl)


class Timeline:
    """Busy intervals of one device, kept sorted, for insertion-based list scheduling."""

    __slots__ = ("starts", "ends", "nodes")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.nodes: list[int] = []

    @property
    def finish(self) -> float:
        """When the device is free for good (end of its last task)."""
        return self.ends[-1] if self.ends else 0.0

    def earliest_start(self, ready: float, dur: float, insertion: bool = True) -> float:
        """Earliest start >= ``ready`` of a task lasting ``dur``: the first idle gap that fits
        (``insertion``), else after the last task."""
        if not insertion or not self.starts:
            return max(ready, self.finish)
        # gaps: [end of task k-1, start of task k); begin at the gap containing `ready`
        k = bisect_right(self.ends, ready)
        prev_end = self.ends[k - 1] if k > 0 else 0.0
        starts = self.starts
        ends = self.ends
        for j in range(k, len(starts)):
            s = max(ready, prev_end)
            if s + dur <= starts[j]:
                return s
            prev_end = ends[j]
        return max(ready, prev_end)

    def insert(self, start: float, dur: float, node: int) -> None:
        """Occupy ``[start, start + dur)`` (the caller found it free with :meth:`earliest_start`)."""
        # after every task that ends by `start`: a zero-length task (a view) at the start of a
        # running task goes before it, so `ends` stays sorted as well as `starts`
        k = bisect_right(self.ends, start)
        self.starts.insert(k, start)
        self.ends.insert(k, start + dur)
        self.nodes.insert(k, node)

    def order(self) -> list[int]:
        """Nodes in the order they run on this device."""
        return list(self.nodes)

    def __len__(self) -> int:
        return len(self.starts)

    def __repr__(self) -> str:
        return f"Timeline({len(self)} tasks, finish {self.finish:.6g})"


def order_from_starts(start: np.ndarray, graph: OpGraph) -> np.ndarray:
    """A global schedule order from start times: sort by (start, node id).  It respects every
    edge whenever each node starts no earlier than its predecessors (a list schedule does):
    ties come from zero-length predecessors, and node ids are topological."""
    key = np.lexsort((np.arange(graph.num_nodes), start))
    order = np.empty(graph.num_nodes, dtype=np.int64)
    order[key] = np.arange(graph.num_nodes)
    if graph.num_edges and (order[graph.src] >= order[graph.dst]).any():
        raise ValueError("start times do not respect the graph's edges: a node starts before its input")
    return order


def describe_timelines(tls: list[Timeline]) -> dict[str, Any]:
    """Per-device task counts and finish times (for Plan.info)."""
    return {"tasks_per_device": [len(t) for t in tls], "finish_per_device": [t.finish for t in tls]}
