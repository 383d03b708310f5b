"""What every algorithm is: a callable from (graph, cluster, costs) to a :class:`Plan`.

An algorithm is registered by a file ``conf/algo/<name>.yaml`` whose ``_target_`` names
its class; the list of algorithms is the list of those files.  ``graph_kind`` says which
graph the harness hands it: the operator graph (``"op"``) or the layer graph (``"layer"``).
Algorithms see the graph, the cluster and a cost oracle, never the simulator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.cluster import Cluster
from harness.costs import CostModel
from harness.graph import OpGraph
from harness.strategy import Plan


class Algorithm:
    """Base class: subclasses set ``graph_kind`` and implement :meth:`plan`."""

    graph_kind: str = "op"

    def __init__(self, name: str, seed: int = 0, **params: Any) -> None:
        self.name = name
        self.seed = int(seed)
        self.params = params

    def plan(self, graph: Any, cluster: Cluster, costs: CostModel) -> Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """The algorithm's parameters, as they go into result.json."""
        return {"name": self.name, "seed": self.seed, **self.params}


def derived_meta(graph: OpGraph, **extra: Any) -> dict[str, Any]:
    """``meta`` for a graph an algorithm derives from ``graph`` (a coarse graph, a split graph):
    the source's keys and ``extra``, without ``renumbered_from``.  That key is the old id of each
    node of the *source* graph when :meth:`OpGraph.from_unordered` renumbered it; carried over,
    it would claim the derived graph was renumbered too (and index its nodes with the source's
    permutation)."""
    meta = {k: v for k, v in graph.meta.items() if k != "renumbered_from"}
    meta.update(extra)
    return meta


def follow_colocation(graph: OpGraph, device: np.ndarray) -> np.ndarray:
    """Move every member of a co-location group to the device of its first member
    (Celeritas Sec. 5: "co-location groups follow their first member")."""
    out = np.asarray(device).copy()
    for members in graph.coloc_groups():
        out[members] = out[members[0]]
    return out


def bfs_topological_order(graph: OpGraph) -> np.ndarray:
    """Kahn's algorithm with a FIFO queue: the order TensorFlow's placer (and Baechi's
    m-TOPO) walks the graph in."""
    from collections import deque

    n = graph.num_nodes
    indeg = np.bincount(graph.dst, minlength=n).tolist()
    ptr, succ, _ = graph.succ_csr()
    ptr_l, succ_l = ptr.tolist(), succ.tolist()
    q = deque(v for v in range(n) if indeg[v] == 0)
    order: list[int] = []
    while q:
        v = q.popleft()
        order.append(v)
        for i in range(ptr_l[v], ptr_l[v + 1]):
            w = succ_l[i]
            indeg[w] -= 1
            if indeg[w] == 0:
                q.append(w)
    return np.asarray(order, dtype=np.int64)
