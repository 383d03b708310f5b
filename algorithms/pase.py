"""PaSE (Elango, "Efficient parallelization strategy search", vertex elimination): an optimal
strategy under t_V + t_E on any DAG, by dynamic programming over a vertex elimination order.

Alg. 1 processes the vertex v with the fewest unprocessed neighbours (line 18); for every
combination of its neighbours' configurations it keeps only v's best configuration (lines
20-25); its neighbours' tables are restricted to what stays consistent with v's (line 30),
and at the end the tables are joined into the valid strategies (Alg. 3) and the cheapest is
taken (line 37). Thm. 1: no optimal strategy is lost.

Our reading, and how the public code (baidu-research/PaSE, ``scheduler.py``) computes it:
each vertex's table is a *factor*, a cost array over the configurations of the vertices it
mentions. Processing v joins every factor that mentions v (a relational join on the shared
vertices, here a numpy broadcast sum), adds v's t_V and its edges' t_E, and minimises over
v's configuration for each combination of the others: the result is a new factor over v's
unprocessed neighbours (v's "best sub-strategies", line 25). The vertices of the
new factor become neighbours of each other (the public code's ``SortNodes`` merges the
neighbour sets of a processed vertex into its neighbours' in the same way), so "fewest
unprocessed neighbours" is counted in that graph. The final join of Alg. 3 is the
back-substitution: vertices are assigned in reverse processing order, each to its best
configuration given its already assigned neighbours, recomputed from the factors it joined
(one slice each, instead of an argmin table over every combination; the first minimiser wins
a tie). Ties between vertices with as many unprocessed neighbours are broken by the size of
the table processing them would build, then by vertex id.

Memory stays bounded: the join is never written out. :func:`algorithms.pase_join.min_sum`
sums each of its entries from the factors and keeps the minimum over v (compiled, threads
taking ``block_entries`` join entries at a time), so only the new factor is resident beside
the factors a vertex joined, which are kept for its back-substitution;
a factor over more than ``max_entries`` combinations stops the search with an error naming
the vertex. ``largest_table`` reports the largest join (PaSE prints these table sizes).
"""

from __future__ import annotations

import heapq
import math
import time
from typing import Any

import numpy as np

from algorithms.layer_fixed import SEEDS
from algorithms.layer_search import LayerSearch
from algorithms.layer_tables import LayerCostTables, seed_strategies
from algorithms.pase_join import min_sum
from harness.core.checks import non_negative_number, one_of, optional, positive_int
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.layergraph import LayerGraph
from harness.core.strategy import Plan


class TableTooLarge(MemoryError):
    """A vertex elimination would build a factor larger than the configured maximum."""


class SearchBudgetExceeded(TimeoutError):
    """A vertex elimination ran past its deadline."""


def vertex_elimination(tables: LayerCostTables, max_entries: int = 1 << 28, block_entries: int = 1 << 23,
                       progress: bool = False, dtype: Any = np.float64,
                       deadline: float | None = None) -> tuple[np.ndarray, float, dict[str, Any]]:
    """Alg. 1-3 on precomputed cost tables: ``(config index per node, optimal cost, statistics)``.
    :class:`SearchBudgetExceeded` when ``time.perf_counter()`` passes ``deadline`` (checked per vertex).

    ``dtype`` of the joins: float64 (exact up to float64 rounding; the default) or float32
    (half the memory; ties closer than ~1e-7 relative may then be broken differently).
    """
    n = tables.num_nodes
    C = tables.num_configs.tolist()
    names = tables.lgraph.names
    factors: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
    by_scope: dict[tuple[int, ...], int] = {}
    var_factors: list[set[int]] = [set() for _ in range(n)]
    nbrs: list[set[int]] = [set() for _ in range(n)]
    next_id = 0

    def add(scope: tuple[int, ...], arr: np.ndarray) -> None:
        nonlocal next_id
        fid = by_scope.get(scope)
        if fid is not None:
            factors[fid] = (scope, factors[fid][1] + arr)
            return
        fid = next_id
        next_id += 1
        factors[fid] = (scope, arr)
        by_scope[scope] = fid
        for x in scope:
            var_factors[x].add(fid)

    for v in range(n):
        add((v,), tables.node_cost[v].astype(np.float64))
    for (u, v), m in tables.merged_edges().items():
        add((u, v), m.astype(np.float64))  # node ids are topological: u < v
        nbrs[u].add(v)
        nbrs[v].add(u)

    def key(v: int) -> tuple[int, int, int]:
        joint = C[v]
        for x in nbrs[v]:
            joint *= C[x]
        return (len(nbrs[v]), joint, v)

    heap = [key(v) for v in range(n)]
    heapq.heapify(heap)
    done = np.zeros(n, dtype=bool)
    history: list[tuple[int, tuple[int, ...], list[tuple[tuple[int, ...], np.ndarray]]]] = []
    constant = 0.0
    largest_join = largest_factor = 0
    largest_at = ""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc=f"PaSE vertex elimination ({tables.lgraph.meta.get('model', '?')})", unit="vertex", leave=False)
    while heap:
        k = heapq.heappop(heap)
        v = k[2]
        if done[v] or k != key(v):
            continue
        if deadline is not None and time.perf_counter() > deadline:
            raise SearchBudgetExceeded(f"the elimination ran past its budget with {int((~done).sum())} of {n} vertices left")
        S = tuple(sorted(nbrs[v]))
        size_s = math.prod(C[x] for x in S)
        if size_s > max_entries:
            raise TableTooLarge(
                f"processing layer {names[v]} would build a table over {len(S)} neighbours "
                f"({', '.join(names[x] for x in S[:6])}{'...' if len(S) > 6 else ''}) with {size_s:.3g} entries, "
                f"more than max_entries={max_entries}; reduce the devices or the space (cutoff, product)")
        joint = size_s * C[v]
        if joint > largest_join:
            largest_join, largest_at = joint, names[v]
        largest_factor = max(largest_factor, size_s)
        fids = sorted(var_factors[v])
        parts = [factors[f] for f in fids]
        val = min_sum(parts, S, v, C, block_entries, dtype)
        history.append((v, S, parts))
        for f in fids:
            scope, _ = factors.pop(f)
            del by_scope[scope]
            for x in scope:
                var_factors[x].discard(f)
        if S:
            add(S, val)
        else:
            constant += float(val)
        done[v] = True
        for x in S:
            nbrs[x].discard(v)
            nbrs[x].update(y for y in S if y != x)
        for x in S:
            heapq.heappush(heap, key(x))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    idx = np.zeros(n, dtype=np.int64)
    for v, S, parts in reversed(history):
        idx[v] = _best_config(v, parts, idx)
    stats = {"largest_table": int(largest_join), "largest_table_at": largest_at, "largest_factor": int(largest_factor)}
    return idx, constant, stats


def _best_config(v: int, parts: list[tuple[tuple[int, ...], np.ndarray]], idx: np.ndarray) -> int:
    """v's best configuration given its neighbours' (Alg. 1 line 25 for one combination): the
    first minimiser of the joined factors' slice, in float64."""
    vec = None
    for scope, arr in parts:
        row = arr[tuple(slice(None) if x == v else int(idx[x]) for x in scope)]
        vec = row.astype(np.float64) if vec is None else vec + row
    assert vec is not None
    return int(np.argmin(vec))


class PaSE(LayerSearch):
    """PaSE's vertex elimination (Alg. 1-3) with numpy table joins.

    ``max_entries``: the largest factor it builds; ``budget_s``: the elimination's time budget
    (None: none); ``block_entries``: the join entries a thread takes at a time; ``dtype`` of the joins:
    float64 or float32 (:func:`vertex_elimination`). The space options are :class:`LayerSearch`'s.

    A search that would pass ``max_entries`` or ``budget_s`` still returns a plan: the best of the
    baselines in its space (:data:`algorithms.layer_fixed.SEEDS`; the all-ones configuration when
    none lies in it), flagged ``search_complete: false`` with the reason and the gap to a lower
    bound of the optimum (each layer and each edge at its cheapest).
    """

    graph_kind = "layer"

    def __init__(self, name: str = "pase", seed: int = 0, space: str | None = None, product: str | None = None,
                 cutoff: int | str | None = None, mapping: str | None = None, max_entries: int = 1 << 28,
                 block_entries: int = 1 << 23, dtype: str = "float64", budget_s: float | None = 60.0,
                 progress: bool = False) -> None:
        super().__init__(name, seed, space, product, cutoff, mapping, progress)
        optional(non_negative_number, budget_s, "algo.budget_s")  # 0: the best baseline of the space at once
        self.budget_s = budget_s  # as configured, for describe()
        self.max_entries = positive_int(max_entries, "algo.max_entries")
        self.block_entries = positive_int(block_entries, "algo.block_entries")
        self.dtype = np.dtype(one_of(dtype, "algo.dtype", ("float64", "float32")))

    def describe(self) -> dict[str, Any]:
        """:class:`LayerSearch`'s parameters, then ``max_entries``, ``block_entries``, ``dtype``."""
        return {**super().describe(), "max_entries": self.max_entries, "block_entries": self.block_entries,
                "dtype": self.dtype.name, "budget_s": self.budget_s}

    def plan(self, graph: LayerGraph, cluster: Cluster, costs: CostModel) -> Plan:
        tables = self.tables(graph, cluster, costs)
        t0 = time.perf_counter()
        deadline = None if self.budget_s is None else t0 + float(self.budget_s)
        try:
            idx, _, stats = vertex_elimination(tables, self.max_entries, self.block_entries, self.progress, self.dtype, deadline)
            complete = True
        except (TableTooLarge, SearchBudgetExceeded) as why:
            idx, stats = fallback(tables, str(why))
            complete = False
        search_s = time.perf_counter() - t0
        info = self.info(tables, idx, search_s, complete, **stats)
        return Plan(graph, tables.strategy(idx, algo=self.name), info=info)


def fallback(tables: LayerCostTables, why: str) -> tuple[np.ndarray, dict[str, Any]]:
    """The answer of a search that could not finish: the best baseline in the space (else the
    all-ones configuration, index 0 of every layer), with a lower bound of the optimum."""
    seeds = seed_strategies(tables, SEEDS)
    idx = seeds[0][1] if seeds else np.zeros(tables.num_nodes, dtype=np.int64)
    value = tables.objective(idx)
    bound = sum(float(c.min()) for c in tables.node_cost) + sum(float(m.min()) for m in tables.edge_cost if m.size)
    return idx, {"fallback": why, "seeded_with": seeds[0][0] if seeds else "all-ones", "lower_bound_s": bound,
                 "gap_to_lower_bound": (value - bound) / bound if bound > 0 else 0.0}
