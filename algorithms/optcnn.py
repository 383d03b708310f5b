"""OptCNN (Jia, Lin, Qi and Aiken, ICML 2018): layer-wise parallelism by graph search.

``optcnn`` is Algorithm 1: node elimination (Eq. 2) and edge elimination (Eq. 3) repeated to
a fixpoint, enumeration of the final graph (K nodes), and the eliminations undone in reverse
order (Theorems 1 and 2 make the result optimal under Eq. 1). ``optcnn_dfs`` is the baseline
of Table 3: a depth-first search over the original graph, exact, with pruning.

Our readings of the paper:

* Edge elimination is applied eagerly: whenever a node elimination creates an edge (i, k)
  next to an existing one, the two are summed at once (Eq. 3). The fixpoint of Alg. 1 lines
  6-13 is the same graph.
* A node is eliminated when it has exactly one in-edge and one out-edge *after* parallel edges
  are merged (Fig. 5 and 6: the inception module's branches collapse to parallel edges, then
  to one edge). Sources and sinks are never eliminated, so a two-terminal series-parallel
  graph ends at K = 2, as in Table 3. ``eliminate_leaves: true`` is our extension: a node
  with a single neighbour and no other edge is folded into that neighbour's node cost too,
  which keeps the optimum and can shrink K further on graphs with several inputs.
* Line 14 enumerates every strategy of the final graph, vectorised in numpy when the final
  graph has at most ``enum_limit`` strategies; a larger final graph (a graph that is not
  series-parallel) is searched by the exact depth-first branch and bound below under the
  time budget, and ``search_complete`` says whether it finished.
* The DFS baseline assigns configurations in topological order and prunes a branch when its
  partial cost plus a lower bound of the rest (each remaining node's cheapest configuration
  including its cheapest in-edges) reaches the best complete strategy found so far; children
  are visited cheapest first and the first complete strategy is a greedy one.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import numpy as np

from algorithms.layer_fixed import SEEDS
from algorithms.layer_search import LayerSearch
from algorithms.layer_tables import LayerCostTables, seed_strategies
from harness.core.checks import boolean, non_negative_number, optional, positive_int
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.layergraph import LayerGraph
from harness.core.strategy import Plan

#: largest [Ci, Cj, Ck] block a node elimination materialises at once (entries)
_BLOCK = 1 << 24


def node_eliminate(a: np.ndarray, nj: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Eq. 2: ``t_X(e', c_i, c_k) = min_{c_j} t_X(e1, c_i, c_j) + t_C + t_S(c_j) + t_X(e2, c_j, c_k)``.

    ``a`` [Ci, Cj], ``nj`` [Cj], ``b`` [Cj, Ck]; returns the new edge [Ci, Ck]. The minimising
    c_j is recomputed for the one (c_i, c_k) pair that matters when the elimination is undone
    (:func:`best_middle`), so no argmin table is built.
    """
    ci, cj = a.shape
    ck = b.shape[1]
    bj = nj[:, None] + b  # [Cj, Ck]
    rows = max(1, _BLOCK // max(1, cj * ck))
    if rows >= ci:
        return (a[:, :, None] + bj[None, :, :]).min(axis=1)
    val = np.empty((ci, ck))
    for r0 in range(0, ci, rows):
        val[r0:r0 + rows] = (a[r0:r0 + rows, :, None] + bj[None, :, :]).min(axis=1)
    return val


def best_middle(a: np.ndarray, nj: np.ndarray, b: np.ndarray, ci: int, ck: int) -> int:
    """The c_j that attains Eq. 2's minimum for (c_i, c_k): undoing a node elimination (Alg. 1 line 18)."""
    return int(np.argmin(a[ci] + nj + b[:, ck]))


def branch_and_bound(order: list[int], node_cost: dict[int, np.ndarray], edges: dict[tuple[int, int], np.ndarray],
                     budget_s: float | None = None, check_every: int = 2048,
                     incumbent: dict[int, int] | None = None) -> tuple[dict[int, int], float, bool, int, float]:
    """Exact depth-first search with pruning over the nodes ``order`` (OptCNN Table 3's baseline).

    ``edges[(u, v)]`` is a cost matrix [C_u, C_v] between two nodes of ``order``. Returns
    ``(assignment, cost, complete, expanded, lower_bound)``; ``complete`` is False when
    ``budget_s`` ran out (the assignment is then the best found so far: the incumbent). An
    ``incumbent`` (a config per node, e.g. the best baseline) is the first best; without one the
    budget applies once the greedy first descent has found a complete strategy.
    ``lower_bound`` is the root bound (every node at its cheapest with its cheapest edges).
    """
    K = len(order)
    pos = {v: i for i, v in enumerate(order)}
    # at depth t, the matrices to already-assigned nodes, oriented [C_s, C_t]
    back: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(K)]
    for (u, v), m in edges.items():
        pu, pv = pos[u], pos[v]
        if pu < pv:
            back[pv].append((pu, m))
        else:
            back[pu].append((pv, m.T))
    costs = [node_cost[v] for v in order]
    # lower bound of depth t: cheapest config with its cheapest back edges
    lb = np.zeros(K + 1)
    for t in range(K - 1, -1, -1):
        vec = costs[t].copy()
        for _, m in back[t]:
            vec = vec + m.min(axis=0)
        lb[t] = lb[t + 1] + float(vec.min())
    t0 = time.perf_counter()
    assign = [0] * K
    best = math.inf
    best_assign: list[int] | None = None
    if incumbent is not None and K:
        best_assign = [int(incumbent[v]) for v in order]
        best = sum(float(costs[t][best_assign[t]]) for t in range(K))
        best += sum(float(m[best_assign[s], best_assign[t]]) for t in range(K) for s, m in back[t])
    partial = [0.0] * (K + 1)
    cand: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * K
    vals: list[np.ndarray] = [np.zeros(0)] * K
    ptr = [0] * K

    def expand(t: int) -> None:
        vec = costs[t].copy()
        for s, m in back[t]:
            vec += m[assign[s]]
        o = np.argsort(vec, kind="stable")
        cand[t] = o
        vals[t] = vec[o]
        ptr[t] = 0

    expanded = 0
    complete = True
    if K == 0:
        return {}, 0.0, True, 0, 0.0
    expand(0)
    depth = 0
    while depth >= 0:
        if ptr[depth] >= len(cand[depth]):
            depth -= 1
            continue
        i = ptr[depth]
        ptr[depth] = i + 1
        val = float(vals[depth][i])
        if partial[depth] + val + lb[depth + 1] >= best:
            depth -= 1  # children are sorted: the rest of this level is no better
            continue
        assign[depth] = int(cand[depth][i])
        partial[depth + 1] = partial[depth] + val
        if depth == K - 1:
            best = partial[K]
            best_assign = list(assign)
            continue
        depth += 1
        expand(depth)
        expanded += 1
        # the budget applies once a complete strategy exists (the incumbent, or the greedy first descent)
        if budget_s is not None and best_assign is not None and expanded % check_every == 0 and time.perf_counter() - t0 > budget_s:
            complete = False
            break
    assert best_assign is not None
    return {v: best_assign[i] for i, v in enumerate(order)}, best, complete, expanded, float(lb[0])


class OptCNN(LayerSearch):
    """OptCNN Algorithm 1 (node + edge elimination, enumeration, undo).

    ``enum_limit``: the final graph is enumerated when it has at most this many strategies,
    else searched by branch and bound within ``budget_s`` seconds (``None``: no budget);
    ``eliminate_leaves``: our extension, single-neighbour nodes folded too. The space options
    are :class:`LayerSearch`'s.
    """

    graph_kind = "layer"

    def __init__(self, name: str = "optcnn", seed: int = 0, space: str | None = None, product: str | None = None,
                 cutoff: int | str | None = None, mapping: str | None = None, enum_limit: int = 10_000_000,
                 budget_s: float | None = 60.0, eliminate_leaves: bool = False, progress: bool = False) -> None:
        super().__init__(name, seed, space, product, cutoff, mapping, progress)
        self.enum_limit = positive_int(enum_limit, "algo.enum_limit")
        # 0: no time to search (the best baseline of the space); null: no budget
        self.budget_seconds = optional(non_negative_number, budget_s, "algo.budget_s")
        self.budget_s = budget_s  # as configured, for describe()
        self.eliminate_leaves = boolean(eliminate_leaves, "algo.eliminate_leaves")

    def describe(self) -> dict[str, Any]:
        """:class:`LayerSearch`'s parameters, then ``enum_limit``, ``budget_s``, ``eliminate_leaves``."""
        return {**super().describe(), "enum_limit": self.enum_limit, "budget_s": self.budget_s,
                "eliminate_leaves": self.eliminate_leaves}

    def plan(self, graph: LayerGraph, cluster: Cluster, costs: CostModel) -> Plan:
        tables = self.tables(graph, cluster, costs)
        t0 = time.perf_counter()
        idx, stats = self.search(tables)
        search_s = time.perf_counter() - t0
        info = self.info(tables, idx, search_s, stats.pop("complete"), search_budget_s=self.budget_seconds, **stats)
        return Plan(graph, tables.strategy(idx, algo=self.name), info=info)

    def search(self, tables: LayerCostTables) -> tuple[np.ndarray, dict[str, Any]]:
        """Algorithm 1 on precomputed cost tables: the optimal config index per node and statistics."""
        n = tables.num_nodes
        ncost = [c.copy() for c in tables.node_cost]
        E = tables.merged_edges()
        succ: list[set[int]] = [set() for _ in range(n)]
        pred: list[set[int]] = [set() for _ in range(n)]
        for u, v in E:
            succ[u].add(v)
            pred[v].add(u)
        alive = np.ones(n, dtype=bool)
        history: list[tuple[Any, ...]] = []
        node_elims = edge_elims = leaf_elims = 0
        edge_elims = tables.lgraph.num_edges - len(E)  # parallel edges merged up front (Eq. 3)
        q = deque(v for v in range(n) if len(pred[v]) == 1 and len(succ[v]) == 1)
        leaves = deque(v for v in range(n) if len(pred[v]) + len(succ[v]) == 1) if self.eliminate_leaves else deque()
        while q or leaves:
            if q:
                j = q.popleft()
                if not alive[j] or len(pred[j]) != 1 or len(succ[j]) != 1:
                    continue
                i, k = next(iter(pred[j])), next(iter(succ[j]))
                a, b = E.pop((i, j)), E.pop((j, k))
                val = node_eliminate(a, ncost[j], b)
                history.append(("node", j, i, k, (a, ncost[j], b)))
                node_elims += 1
                alive[j] = False
                succ[i].discard(j)
                pred[k].discard(j)
                if (i, k) in E:
                    E[(i, k)] = E[(i, k)] + val
                    edge_elims += 1
                else:
                    E[(i, k)] = val
                    succ[i].add(k)
                    pred[k].add(i)
                for x in (i, k):
                    if len(pred[x]) == 1 and len(succ[x]) == 1:
                        q.append(x)
                    if self.eliminate_leaves and len(pred[x]) + len(succ[x]) == 1:
                        leaves.append(x)
                continue
            j = leaves.popleft()
            if not alive[j] or len(pred[j]) + len(succ[j]) != 1 or alive.sum() <= 1:
                continue
            if pred[j]:
                i = next(iter(pred[j]))
                m = E.pop((i, j))  # [Ci, Cj]
                succ[i].discard(j)
            else:
                i = next(iter(succ[j]))
                m = E.pop((j, i)).T
                pred[i].discard(j)
            t = m + ncost[j][None, :]
            arg = t.argmin(axis=1).astype(np.int32)
            ncost[i] = ncost[i] + t[np.arange(len(t)), arg]
            history.append(("leaf", j, i, arg))
            leaf_elims += 1
            alive[j] = False
            for x in (i,):
                if len(pred[x]) == 1 and len(succ[x]) == 1:
                    q.append(x)
                if len(pred[x]) + len(succ[x]) == 1:
                    leaves.append(x)
        final = np.flatnonzero(alive).tolist()
        K = len(final)
        sizes = [len(ncost[v]) for v in final]
        space = math.prod(sizes)
        idx = np.zeros(n, dtype=np.int64)
        complete = True
        extra: dict[str, Any] = {}
        if space <= self.enum_limit:
            # Alg. 1 line 14: every strategy of the final graph, as one broadcast array
            pos = {v: a for a, v in enumerate(final)}
            total = np.zeros(sizes)
            for a, v in enumerate(final):
                shape = [1] * K
                shape[a] = sizes[a]
                total = total + ncost[v].reshape(shape)
            for (u, v), m in E.items():
                shape = [1] * K
                shape[pos[u]], shape[pos[v]] = sizes[pos[u]], sizes[pos[v]]
                mm = m if pos[u] < pos[v] else m.T
                total = total + mm.reshape(shape)
            best = np.unravel_index(int(np.argmin(total)), total.shape) if K else ()
            for a, v in enumerate(final):
                idx[v] = int(best[a])
            enumerated = "exhaustive"
        else:
            # seeded with the best baseline of the space, so a budgeted answer is never worse than it
            seeds = seed_strategies(tables, SEEDS)
            start = {v: int(seeds[0][1][v]) for v in final} if seeds else None
            assign, value, complete, _, bound = branch_and_bound(final, {v: ncost[v] for v in final}, E, self.budget_seconds,
                                                                 incumbent=start)
            for v, c in assign.items():
                idx[v] = c
            enumerated = "branch_and_bound"
            extra = {"seeded_with": seeds[0][0] if seeds else None, "lower_bound_s": bound,
                     "gap_to_lower_bound": (value - bound) / bound if bound > 0 else 0.0}
        # Alg. 1 lines 15-23: undo the eliminations in reverse
        for h in reversed(history):
            if h[0] == "node":
                _, j, i, k, (a, nj, b) = h
                idx[j] = best_middle(a, nj, b, int(idx[i]), int(idx[k]))
            else:
                _, j, i, arg = h
                idx[j] = int(arg[idx[i]])
        return idx, {"K": K, "final_strategies": int(space), "node_eliminations": node_elims,
                     "edge_eliminations": edge_elims, "leaf_eliminations": leaf_elims,
                     "final_search": enumerated, "complete": complete, **extra}


class OptCNNDFS(LayerSearch):
    """OptCNN Table 3's baseline: exhaustive depth-first search with pruning, under a time
    budget of ``budget_s`` seconds. The space options are :class:`LayerSearch`'s."""

    graph_kind = "layer"

    def __init__(self, name: str = "optcnn_dfs", seed: int = 0, space: str | None = None, product: str | None = None,
                 cutoff: int | str | None = None, mapping: str | None = None, budget_s: float | None = 60.0,
                 progress: bool = False) -> None:
        super().__init__(name, seed, space, product, cutoff, mapping, progress)
        self.budget_seconds = optional(non_negative_number, budget_s, "algo.budget_s")  # null: no budget
        self.budget_s = budget_s  # as configured, for describe()

    def describe(self) -> dict[str, Any]:
        """:class:`LayerSearch`'s parameters, then ``budget_s``."""
        return {**super().describe(), "budget_s": self.budget_s}

    def plan(self, graph: LayerGraph, cluster: Cluster, costs: CostModel) -> Plan:
        tables = self.tables(graph, cluster, costs)
        t0 = time.perf_counter()
        order = list(range(tables.num_nodes))  # node ids are a topological order
        seeds = seed_strategies(tables, SEEDS)
        assign, value, complete, expanded, bound = branch_and_bound(
            order, dict(enumerate(tables.node_cost)), tables.merged_edges(), self.budget_seconds,
            incumbent={v: int(seeds[0][1][v]) for v in order} if seeds else None)
        search_s = time.perf_counter() - t0
        idx = np.array([assign[v] for v in order], dtype=np.int64)
        info = self.info(tables, idx, search_s, complete, search_budget_s=self.budget_seconds, expanded=expanded,
                         seeded_with=seeds[0][0] if seeds else None, lower_bound_s=bound,
                         gap_to_lower_bound=(value - bound) / bound if bound > 0 else 0.0)
        return Plan(graph, tables.strategy(idx, algo=self.name), info=info)
