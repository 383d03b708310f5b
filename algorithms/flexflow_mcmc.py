"""FlexFlow's Markov chain Monte Carlo search (Jia, Zaharia and Aiken, SysML 2019, Sec. 6),
PaSE's main comparator, over the same configuration space and cost tables as OptCNN and PaSE.

The chain starts from data parallelism (sample degree N everywhere, or the nearest config of
the space where the batch or the cutoff forbids it). A move picks a random layer and gives it
a random other configuration; it is accepted with probability ``min(1, exp(-beta * delta /
cost_0))`` (Metropolis-Hastings with FlexFlow's ``exp(-beta * cost)`` target), where delta is
the change of the objective and cost_0 the objective of the start, so that ``beta`` is
dimensionless (our choice: FlexFlow does not give its value). The delta of a move touches only
the layer's node cost and its edges, so a move costs O(degree).

Stopping (FlexFlow: "the search stops when the budget is exhausted or when it cannot improve
the best strategy for half of the search time"): ``iterations`` moves, or ``patience``
(default half of them) moves without improving the best; ``budget_s`` is a wall-clock cap.
The iteration budget makes a run deterministic for a seed; ``search_complete`` is false when
the wall-clock cap cut it short (the chain is never a proof of optimality).

The objective, and how far it is from the simulator
---------------------------------------------------
The chain's cost is OptCNN's Eq. 1 on the tables the layer searches share
(:mod:`algorithms.layer_costs`): t_C + t_S of every layer plus t_X of every edge, so that its
optimum compares with OptCNN's and PaSE's (``experiments/pase_search_time.py`` reports the
MCMC / PaSE objective ratio).  FlexFlow itself scores a strategy with its execution simulator
(per-shard compute tasks and communication tasks, each device and connection running its
tasks in FIFO order), where a layer's parameter synchronisation runs while the layers before
it still back-propagate; our event simulator does the same.  Eq. 1 adds the synchronisation
to the step instead, and on the data-parallel start that is the whole difference: under
``costs=analytical`` the start's t_C equals the simulator's compute per device and its t_S the
durations of the simulator's all-reduces (``tests/test_algorithm_bugs.py``), and the simulated
step is t_C plus the part of t_S the backward pass does not hide.  Measured on the start
(Eq. 1 / simulated step, ``costs=analytical``): alexnet on p100x4 61.8 / 42.7 ms (+45 %: of
19.2 ms of all-reduces 0.07 ms show), resnet50 on p100x8 80.0 / 53.8 ms (+49 %), inception_v3
on p100x8 107.2 / 70.3 ms (+53 %), vgg16 on p100x8 229.1 / 165.5 ms (+38 %), resnet50 on
v100x4_pcie 89.7 / 73.6 ms (+22 %).  The search therefore weighs synchronisation as Eq. 1
does: a move that removes an all-reduce the simulator would have hidden still counts as a gain.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from algorithms.layer_search import LayerSearch
from algorithms.layer_tables import LayerCostTables
from harness.core.checks import non_negative_number, optional, positive_int
from harness.core.cluster import Cluster
from harness.core.layergraph import LayerGraph
from harness.core.strategy import Plan


def start_config(tables: LayerCostTables) -> np.ndarray:
    """Data parallelism in the table's space: per layer, the config splitting only ``sample``
    with the largest degree available (DP itself when it is in the space)."""
    idx = np.zeros(tables.num_nodes, dtype=np.int64)
    for v in range(tables.num_nodes):
        dims, deg = tables.dims[v], tables.degrees[v]
        if "sample" not in dims or not len(deg):
            continue
        k = dims.index("sample")
        only = (np.delete(deg, k, axis=1) == 1).all(axis=1)
        cand = np.flatnonzero(only)
        idx[v] = int(cand[np.argmax(deg[cand, k])])
    return idx


def mcmc(tables: LayerCostTables, seed: int, iterations: int, beta: float, patience: int | None = None,
         budget_s: float | None = None, start: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Run the chain; returns the best config index per node and statistics."""
    rng = np.random.default_rng(seed)
    n = tables.num_nodes
    ncost = [c.tolist() for c in tables.node_cost]
    adj: list[list[tuple[int, list[list[float]], bool]]] = [[] for _ in range(n)]
    for (u, v), m in tables.merged_edges().items():
        rows = m.tolist()
        adj[u].append((v, rows, True))   # u is the producer: m[c_u][c_v]
        adj[v].append((u, rows, False))
    sizes = tables.num_configs
    movable = np.flatnonzero(sizes > 1)
    idx = (start_config(tables) if start is None else np.asarray(start, dtype=np.int64)).tolist()
    cur = tables.objective(idx)
    cost0 = cur if cur > 0 else 1.0
    best, best_idx = cur, list(idx)
    patience = iterations // 2 if patience is None else int(patience)
    since = 0
    accepted = 0
    it = 0
    complete = True
    t0 = time.perf_counter()
    if len(movable) == 0:
        return np.asarray(best_idx), {"iterations": 0, "accepted": 0, "start_objective_s": cur, "complete": True}
    # draw moves in blocks (vectorised random numbers, same stream for a seed)
    block = 4096
    while it < iterations:
        m = min(block, iterations - it)
        vs = movable[rng.integers(0, len(movable), size=m)]
        us = rng.random(m)
        rs = rng.random(m)
        for k in range(m):
            v = int(vs[k])
            c_old = idx[v]
            c_new = int(us[k] * (sizes[v] - 1))
            if c_new >= c_old:
                c_new += 1
            delta = ncost[v][c_new] - ncost[v][c_old]
            for w, rows, producer in adj[v]:
                cw = idx[w]
                if producer:
                    delta += rows[c_new][cw] - rows[c_old][cw]
                else:
                    delta += rows[cw][c_new] - rows[cw][c_old]
            if delta <= 0 or rs[k] < math.exp(-beta * delta / cost0):
                idx[v] = c_new
                cur += delta
                accepted += 1
                if cur < best - 1e-15 * abs(best):
                    best, best_idx = cur, list(idx)
                    since = -1
            since += 1
            it += 1
            if since >= patience:
                break
        if since >= patience:
            break
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            complete = False
            break
    return np.asarray(best_idx, dtype=np.int64), {"iterations": it, "accepted": accepted,
                                                   "start_objective_s": tables.objective(start_config(tables) if start is None else start),
                                                   "complete": complete, "stopped": "patience" if since >= patience else
                                                   ("iterations" if it >= iterations else "budget")}


class FlexFlowMCMC(LayerSearch):
    """FlexFlow's MCMC over layer configurations, started from data parallelism."""

    graph_kind = "layer"

    def __init__(self, name: str = "flexflow_mcmc", seed: int = 0, space: str | None = None, product: str | None = None,
                 cutoff: int | str | None = None, mapping: str | None = None, iterations: int = 100_000, beta: float = 50.0,
                 patience: int | None = None, budget_s: float | None = 600.0, progress: bool = False) -> None:
        super().__init__(name, seed=seed, space=space, product=product, cutoff=cutoff, mapping=mapping, progress=progress)
        self.iterations = positive_int(iterations, "algo.iterations")
        self.beta = non_negative_number(beta, "algo.beta")  # 0: every move accepted (a random walk)
        self.patience = optional(positive_int, patience, "algo.patience")
        self.budget_seconds = optional(non_negative_number, budget_s, "algo.budget_s")
        self.budget_s = budget_s  # as configured, for describe()

    def describe(self) -> dict[str, Any]:
        """:class:`LayerSearch`'s parameters, then ``iterations``, ``beta``, ``patience``, ``budget_s``."""
        return {**super().describe(), "iterations": self.iterations, "beta": self.beta, "patience": self.patience,
                "budget_s": self.budget_s}

    def plan(self, graph: LayerGraph, cluster: Cluster, costs: Any) -> Plan:
        tables = self.tables(graph, cluster, costs)
        t0 = time.perf_counter()
        idx, stats = mcmc(tables, self.seed, self.iterations, self.beta, self.patience, self.budget_seconds)
        search_s = time.perf_counter() - t0
        complete = stats.pop("complete")
        info = self.info(tables, idx, search_s, complete, search_budget_s=self.budget_seconds, samples=stats["iterations"], **stats)
        return Plan(graph, tables.strategy(idx, algo=self.name), info=info)
