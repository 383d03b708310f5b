"""Static costs and levels of a DAG, as the list-scheduling papers define them (Kwok and Ahmad
1999; Topcuoglu et al. 2002; Celeritas Sec. 5.1):

* ``w_i``: computation cost of node i (Celeritas Eq. 1's w_i, HEFT's mean w_i);
* ``c_ij``: communication cost of edge (i, j) when its endpoints sit on different devices;
* ``tlevel(i)``: length of the longest path from an entry node to i, excluding w_i
  (Celeritas Eq. 2);
* ``blevel(i)``: length of the longest path from i to an exit node, including w_i
  (Celeritas Eq. 3; HEFT's upward rank);
* ``cpath(i) = tlevel(i) + blevel(i)``: the longest path through i (CPD-TOPO's key);
* the CCR of Celeritas Eq. 1: sum of c_ij over sum of w_i.

The functions take any graph with ``num_nodes``, ``pred_csr`` and ``succ_csr`` whose node ids
are a topological order (an :class:`~harness.core.graph.OpGraph` or a
:class:`~algorithms.sched.schedgraph.SchedGraph`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph


def mean_transfer_time(nbytes: np.ndarray, cluster: Cluster) -> np.ndarray:
    """c-bar of tensors of ``nbytes``: mean latency plus bytes times the mean inverse bandwidth
    over ordered pairs of distinct devices (0 for an empty tensor, and on one device)."""
    D = cluster.num_devices
    if D < 2:
        return np.zeros(len(nbytes))
    off = ~np.eye(D, dtype=bool)
    inv_bw = (1.0 / cluster.route_bw[off]).mean()
    lat = cluster.route_lat[off].mean()
    return np.where(nbytes > 0, lat + nbytes * inv_bw, 0.0)


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
    return w, mean_transfer_time(graph.nbytes, cluster)


def tlevel(graph: Any, w: np.ndarray, c: np.ndarray) -> np.ndarray:
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


def blevel(graph: Any, w: np.ndarray, c: np.ndarray) -> np.ndarray:
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


def cpath(graph: Any, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """cpath(v) = tlevel(v) + blevel(v) (Celeritas Eqs. 2-3): the longest path through v."""
    return tlevel(graph, w, c) + blevel(graph, w, c)


def ccr(w: np.ndarray, c: np.ndarray) -> float:
    """Communication-to-computation ratio, Celeritas Eq. 1: the sum of c_ij over the edges
    divided by the sum of w_i over the nodes, for the costs a placer plans with (the static
    costs of :func:`static_costs`, or a coarse graph's summed costs after fusion, Table 2)."""
    tw = float(np.sum(w))
    return float(np.sum(c)) / tw if tw > 0 else 0.0


def graph_ccr(graph: OpGraph, cluster: Cluster, costs: CostModel) -> float:
    """Celeritas Eq. 1 of an operator graph on a cluster: :func:`ccr` of its static costs
    (every edge costed as if it crossed devices, at the cluster's mean link figures)."""
    return ccr(*static_costs(graph, cluster, costs))
