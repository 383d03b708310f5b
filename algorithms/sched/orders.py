"""Topological orders and schedule orders.

* :func:`bfs_topological_order`: Kahn's algorithm with a FIFO queue, the order TensorFlow's
  placer (and Baechi's m-TOPO) walks the graph in;
* :func:`dfs_topo_order`: DFS-TOPO (Celeritas Sec. 4.2.2) and, with a key, CPD-TOPO
  (Alg. 1's ``CPD_Topo``, :func:`cpd_topo`);
* :func:`positions` (a sequence's inverse: the position of every node) and
  :func:`order_from_starts` (a schedule order from start times).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from algorithms.sched.engine import ReadyCounter
from algorithms.sched.levels import cpath
from harness.core.graph import OpGraph


def positions(seq: np.ndarray) -> np.ndarray:
    """Inverse of a sequence of node ids: ``pos[seq[i]] = i``."""
    pos = np.empty(len(seq), dtype=np.int64)
    pos[seq] = np.arange(len(seq))
    return pos


def bfs_topological_order(graph: OpGraph) -> np.ndarray:
    """Kahn's algorithm with a FIFO queue: the order TensorFlow's placer (and Baechi's
    m-TOPO) walks the graph in."""
    ready = ReadyCounter.of(graph)
    q = deque(ready.sources())
    order: list[int] = []
    while q:
        v = q.popleft()
        order.append(v)
        q.extend(ready.release(v))
    return np.asarray(order, dtype=np.int64)


def dfs_topo_order(graph: OpGraph, key: np.ndarray | None = None) -> np.ndarray:
    """A depth-first topological order (Celeritas Sec. 4.2.2 DFS-TOPO, Alg. 1 CPD_Topo).

    A stack ``Q`` holds the 0-indegree nodes; its head is popped and output, its out-edges
    are deleted, and its children that reach indegree 0 are pushed on the head in
    increasing ``key`` order, so the child with the largest key is output next.  The
    initial sources are sorted by decreasing key (largest at the head).  ``key=None`` is
    plain DFS-TOPO: a smaller node id is preferred.  Ties in ``key`` go to the smaller id.
    Returns the sequence of node ids (position i holds the i-th node output).
    """
    n = graph.num_nodes
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    ids = np.arange(n)
    # rank: a total order where a larger rank is preferred (key, then smaller id)
    by = np.lexsort((-ids, np.zeros(n) if key is None else np.asarray(key, dtype=np.float64)))
    if key is None:
        by = ids[::-1]
    rank = np.empty(n, dtype=np.int64)
    rank[by] = ids
    src, dst = graph.src.astype(np.int64), graph.dst.astype(np.int64)
    # successors of every node, sorted by increasing rank of the child
    e = np.lexsort((rank[dst], src))
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    indeg = np.bincount(dst, minlength=n)
    ready = ReadyCounter(indeg.tolist(), ptr.tolist(), dst[e].tolist())
    sources = np.flatnonzero(indeg == 0)
    stack = sources[np.argsort(rank[sources], kind="stable")].tolist()  # head = end of list
    out: list[int] = []
    while stack:
        v = stack.pop()
        out.append(v)
        stack.extend(ready.release(v))
    if len(out) != n:  # pragma: no cover - OpGraph guarantees a DAG
        raise ValueError(f"graph {graph.meta.get('model', '?')} is not a DAG: DFS-TOPO output {len(out)} of {n} nodes")
    return np.asarray(out, dtype=np.int64)


def cpd_topo(graph: OpGraph, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """CPD-TOPO (Celeritas Alg. 1, ``CPD_Topo``): DFS-TOPO keyed by cpath = tlevel + blevel
    (Eqs. 2-3), so the child on the critical path comes out next; the sequence of node ids."""
    return dfs_topo_order(graph, cpath(graph, w, c))


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
