"""Baechi's m-SCT (Jeon et al., SoCC 2020): memory-constrained Small Communication Times.

SCT (Hanen and Munier 1995) first picks for every op a *favourite child*, the successor
it should share a device with, from the LP relaxation of a scheduling integer program,
then list-schedules like ETF except that a device that has just run an op waits for that
op's favourite child (when the child starts earliest there), taking meanwhile only
*urgent* ops, whose inputs are available on every device.

The LP (Baechi's ``FavoriteChildLPSolver``), solved with scipy's HiGHS
(:func:`scipy.optimize.linprog`): one variable x_ij in [0, 1] per edge (x_ij = 0 means
"j is i's favourite child", so the transfer is saved), a start time s_i >= 0 per node and
the makespan W::

    minimise W
    s_i + w_i + c_ij x_ij <= s_j        for every edge (i, j)
    sum_j x_ij >= outdeg(i) - 1          every node has at most one favourite child
    sum_i x_ij >= indeg(j) - 1           every node is the favourite of at most one parent
    s_i + w_i <= W                       for every sink (every node, through the chains)

(times in microseconds so that HiGHS's tolerances are meaningful).  Rounding with the
threshold (default 0.5, as Baechi): x_ij <= threshold makes j a favourite-child candidate
of i; conflicts left by the rounding (Baechi's TODO) are resolved greedily by increasing
x_ij, then decreasing c_ij, so every node keeps at most one favourite child and one
favourite parent.

The schedule is :func:`algorithms.sched.etf.etf_schedule` with the favourite children:
memory, co-location and the out-of-memory report are as in m-ETF (``placement_oom``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from algorithms.base import Algorithm
from algorithms.sched.constraints import memory_split
from algorithms.sched.etf import etf_schedule
from algorithms.sched.levels import static_costs
from algorithms.sched.orders import bfs_topological_order, order_from_starts, positions
from harness.core.checks import number_in, optional, positive_number
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.strategy import Plan, Strategy


def favourite_child_lp(graph: OpGraph, w: np.ndarray, c: np.ndarray, time_limit_s: float | None = None) -> tuple[np.ndarray, float, str]:
    """Solve the LP relaxation; returns (x per edge, relaxed makespan in seconds, status)."""
    n, E = graph.num_nodes, graph.num_edges
    scale = 1e6  # seconds -> microseconds
    wu, cu = w * scale, c * scale
    src, dst = graph.src.astype(np.int64), graph.dst.astype(np.int64)
    X, S, W = 0, E, E + n  # variable offsets
    rows, cols, vals, rhs = [], [], [], []
    r = 0
    # precedence: s_i - s_j + c_ij x_ij <= -w_i
    e = np.arange(E)
    rows += [r + e, r + e, r + e]
    cols += [S + src, S + dst, X + e]
    vals += [np.ones(E), -np.ones(E), cu]
    rhs.append(-wu[src])
    r += E
    # at most one favourite child, -sum_j x_ij <= 1 - outdeg(i), and at most one favourite
    # parent, -sum_i x_ij <= 1 - indeg(j): one row per node of degree >= 2 on that side
    outdeg = np.bincount(src, minlength=n)
    for end in (src, dst):
        deg = np.bincount(end, minlength=n)
        sel = deg[end] >= 2
        if sel.any():
            u, inv = np.unique(end[sel], return_inverse=True)
            rows.append(r + inv)
            cols.append(X + e[sel])
            vals.append(-np.ones(int(sel.sum())))
            rhs.append(1.0 - deg[u])
            r += len(u)
    # makespan: s_i - W <= -w_i for every sink
    sinks = np.flatnonzero(outdeg == 0)
    k = np.arange(len(sinks))
    rows += [r + k, r + k]
    cols += [S + sinks, np.full(len(sinks), W)]
    vals += [np.ones(len(sinks)), -np.ones(len(sinks))]
    rhs.append(-wu[sinks])
    r += len(sinks)
    A = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, E + n + 1))
    b = np.concatenate(rhs)
    cost = np.zeros(E + n + 1)
    cost[W] = 1.0
    bounds = np.zeros((E + n + 1, 2))
    bounds[:, 1] = np.inf
    bounds[:E, 1] = 1.0
    options: dict[str, Any] = {"presolve": True}
    if time_limit_s is not None:
        options["time_limit"] = float(time_limit_s)
    res = linprog(cost, A_ub=A, b_ub=b, bounds=bounds, method="highs", options=options)
    if res.x is None:
        raise RuntimeError(f"m_sct: the favourite-child LP failed on {graph.meta.get('model', 'the graph')}: {res.message}")
    return res.x[:E], float(res.x[W]) / scale, str(res.message)


def round_favourites(graph: OpGraph, x: np.ndarray, c: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """favourite[i] = i's favourite child or -1: edges with x_ij <= threshold, greedily by
    (x ascending, c descending), at most one child per parent and one parent per child."""
    n = graph.num_nodes
    fav = np.full(n, -1, dtype=np.int64)
    has_parent = np.zeros(n, dtype=bool)
    cand = np.flatnonzero(x <= threshold + 1e-9)
    order = cand[np.lexsort((-c[cand], x[cand]))]
    src, dst = graph.src.tolist(), graph.dst.tolist()
    for e in order.tolist():
        i, j = src[e], dst[e]
        if fav[i] < 0 and not has_parent[j]:
            fav[i] = j
            has_parent[j] = True
    return fav


class MSCT(Algorithm):
    """Baechi's m-SCT: favourite children from the LP relaxation (HiGHS), then m-ETF that waits for them."""

    graph_kind = "op"

    def __init__(self, name: str = "m_sct", seed: int = 0, threshold: float = 0.5, lp_time_limit_s: float | None = None) -> None:
        super().__init__(name, seed)
        self.threshold = number_in(threshold, "algo.threshold", 0.0, 1.0)
        self.lp_time_limit_s = optional(positive_number, lp_time_limit_s, "algo.lp_time_limit_s")  # null: none

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "threshold": self.threshold, "lp_time_limit_s": self.lp_time_limit_s}

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        w, c = static_costs(graph, cluster, costs)
        t0 = time.perf_counter()
        if graph.num_edges:
            x, lp_makespan, status = favourite_child_lp(graph, w, c, self.lp_time_limit_s)
        else:
            x, lp_makespan, status = np.zeros(0), float(w.max(initial=0.0)), "no edges"
        lp_s = time.perf_counter() - t0
        fav = round_favourites(graph, x, c, self.threshold)
        mem, pers = memory_split(graph, costs)
        rank = positions(bfs_topological_order(graph))
        res = etf_schedule(graph, cluster, w, c, mem, pers, rank, favourite=fav)
        order = order_from_starts(res["start"], graph)
        info = {
            "objective_s": res["makespan"],
            "lp_makespan_s": lp_makespan,
            "lp_status": status,
            "lp_seconds": lp_s,
            "favourite_children": int((fav >= 0).sum()),
            "favourite_followed": res["favourite_followed"],
            "placement_oom": res["oom_steps"] > 0,
            "oom_steps": res["oom_steps"],
        }
        return Plan(graph, Strategy.placement(res["device"], order), info=info)
