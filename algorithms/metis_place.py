"""Metis (Karypis and Kumar 1997) as a placement baseline (Celeritas Sec. 6.2.2): a k-way
partition of the operator graph into as many parts as devices with pymetis, minimising
the edge cut under a balance constraint.

* Vertex weights are compute times w_i (:func:`algorithms.sched.levels.static_costs`),
  edge weights are the bytes an edge moves; the graph is made undirected (METIS needs
  both directions).  METIS takes positive integers: weights are scaled so that the
  largest is ``weight_scale`` and rounded up to at least 1 (views and getitem, which
  take no time, weigh 1).
* Balance: METIS's ``ufactor`` (the allowed imbalance in thousandths: 30 = 3%, METIS's
  default for k-way), and its ``seed`` from the config.
* Memory: the partition ignores it, as METIS does (Celeritas Table 3 shows Metis OOM on
  three of four models); the simulator reports the OOM.
* Co-location groups: METIS partitions the quotient graph in which each group is one vertex
  (:func:`colocation_quotient`: vertex weight = the sum of its members' w, edge weight = the
  sum of the bytes of the edges between two vertices, edges inside a group dropped), and every
  member takes its group's part.  Partitioning the operators and moving each group to its
  first member's part afterwards would undo the balance METIS found: with TensorFlow-style
  gradient co-location a group is a module's forward and backward, METIS tends to cut between
  the two passes, and the groups' moves then leave parts empty (``graph.colocate_gradients``
  on six GPUs: RNNLM used 3 of the 6; ResNet-50's busiest device carried 2.5x the mean
  compute, now 1.13x, and its cut fell from 14.9 to 2.1 GB).
* The schedule order is node order (a topological order).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.base import Algorithm
from algorithms.sched.levels import static_costs
from harness.core.checks import positive_int
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.strategy import Plan, Strategy


def _scaled(x: np.ndarray, top: int) -> np.ndarray:
    """Positive integers proportional to x, the largest equal to ``top``."""
    x = np.asarray(x, dtype=np.float64)
    mx = float(x.max(initial=0.0))
    if mx <= 0:
        return np.ones(len(x), dtype=np.int64)
    return np.maximum(1, np.ceil(x / mx * top)).astype(np.int64)


def colocation_quotient(graph: OpGraph) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]:
    """The graph with each co-location group contracted to one vertex, undirected.

    Returns ``(vertex_of, m, u, v, edge_of)``: the vertex of every node (groups first, in group
    id order, then the ungrouped nodes in node order), the number of vertices, and one edge
    ``u < v`` per pair of adjacent vertices, with ``edge_of[e]`` the quotient edge that graph
    edge e folds into (-1 for an edge inside a group).  Weights are summed over these maps."""
    group = graph.coloc.astype(np.int64)
    grouped = group >= 0
    _, gid = np.unique(group[grouped], return_inverse=True)
    ng = int(gid.max()) + 1 if len(gid) else 0
    vertex_of = np.empty(graph.num_nodes, dtype=np.int64)
    vertex_of[grouped] = gid
    vertex_of[~grouped] = ng + np.arange(int((~grouped).sum()))
    m = ng + int((~grouped).sum())
    a, b = vertex_of[graph.src], vertex_of[graph.dst]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    cross = lo != hi
    pairs, inv = np.unique(lo[cross] * m + hi[cross], return_inverse=True)
    edge_of = np.full(graph.num_edges, -1, dtype=np.int64)
    edge_of[cross] = np.asarray(inv).reshape(-1)
    return vertex_of, m, pairs // m, pairs % m, edge_of


def metis_partition(graph: OpGraph, parts: int, vweights: np.ndarray, eweights: np.ndarray, ufactor: int = 30, seed: int = 0) -> tuple[np.ndarray, int]:
    """pymetis k-way partition of the undirected version of ``graph``: (part per node, edge cut)."""
    lo, hi = np.minimum(graph.src, graph.dst).astype(np.int64), np.maximum(graph.src, graph.dst).astype(np.int64)
    return part_graph(graph.num_nodes, lo, hi, np.asarray(eweights), parts, np.asarray(vweights), ufactor, seed)


def part_graph(n: int, u: np.ndarray, v: np.ndarray, eweights: np.ndarray, parts: int, vweights: np.ndarray, ufactor: int = 30,
               seed: int = 0) -> tuple[np.ndarray, int]:
    """pymetis k-way partition of the undirected graph on ``n`` vertices with edges ``(u[e], v[e])``
    (each pair once, either direction): (part per vertex, edge cut)."""
    if parts <= 1 or n == 0:
        return np.zeros(n, dtype=np.int64), 0
    try:
        import pymetis
    except ImportError as e:  # pragma: no cover - pymetis is a declared dependency
        raise ImportError("algo=metis needs pymetis (pip install pymetis; it is in pyproject.toml)") from e
    u, v = np.concatenate([u, v]).astype(np.int64), np.concatenate([v, u]).astype(np.int64)
    ew = np.concatenate([eweights, eweights]).astype(np.int64)
    order = np.lexsort((v, u))
    u, v, ew = u[order], v[order], ew[order]
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(u, minlength=n), out=xadj[1:])
    opts = pymetis.Options(ufactor=int(ufactor), seed=int(seed))
    weights = dict(vweights=vweights.tolist(), eweights=ew.tolist(), options=opts)
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2
        cut, membership = pymetis.part_graph(parts, pymetis.CSRAdjacency(xadj.tolist(), v.tolist()), **weights)
    else:  # pragma: no cover - older pymetis
        cut, membership = pymetis.part_graph(parts, xadj=xadj.tolist(), adjncy=v.tolist(), **weights)
    return np.asarray(membership, dtype=np.int64), int(cut)


class Metis(Algorithm):
    """k-way Metis partition of the co-location quotient graph: vertex weight = compute time,
    edge weight = bytes (each summed over what a vertex or edge contracts)."""

    graph_kind = "op"

    def __init__(self, name: str = "metis", seed: int = 0, ufactor: int = 30, weight_scale: int = 100000) -> None:
        super().__init__(name, seed)
        self.ufactor = positive_int(ufactor, "algo.ufactor")  # thousandths of imbalance
        self.weight_scale = positive_int(weight_scale, "algo.weight_scale")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "ufactor": self.ufactor, "weight_scale": self.weight_scale}

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        w, _ = static_costs(graph, cluster, costs)
        vertex_of, m, u, v, edge_of = colocation_quotient(graph)
        vw = _scaled(np.bincount(vertex_of, weights=w, minlength=m), self.weight_scale)
        cross = edge_of >= 0
        ew = _scaled(np.bincount(edge_of[cross], weights=graph.nbytes[cross].astype(np.float64), minlength=len(u)), self.weight_scale)
        part, cut = part_graph(m, u, v, ew, cluster.num_devices, vw, self.ufactor, self.seed)
        device = part[vertex_of]
        load = np.bincount(device, weights=w, minlength=cluster.num_devices)
        info = {"edge_cut_weight": cut, "compute_per_device_s": load.tolist(), "cut_bytes": int(graph.nbytes[device[graph.src] != device[graph.dst]].sum())}
        return Plan(graph, Strategy.placement(device), info=info)
