"""Baechi's m-TOPO (Jeon et al., SoCC 2020), as Celeritas describes and compares it.

Walk the operators in a BFS topological order and fill devices one after another; a
device takes operators until its memory would exceed ``total / devices + largest op``
(and never its capacity), then the next device starts.  Co-location groups are placed
with their first member.  ``coloc_memory: first`` counts only the first member's memory
for a group, which is what Baechi does and what Celeritas (Sec. 6.3) blames for m-TOPO's
OOM on NMT; ``all`` counts the whole group.  Memory is the static sum of what each op
adds (its output plus the parameters it owns); nothing is freed, as in Baechi.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.base import Algorithm, bfs_topological_order
from harness.cluster import Cluster
from harness.costs import CostModel
from harness.graph import OpGraph
from harness.strategy import Plan, Strategy


class MTopo(Algorithm):
    def __init__(self, name: str = "m_topo", coloc_memory: str = "first", **kw: Any) -> None:
        if coloc_memory not in ("first", "all"):
            raise ValueError(f"m_topo.coloc_memory must be 'first' or 'all', got {coloc_memory!r}")
        super().__init__(name, coloc_memory=coloc_memory, **kw)
        self.coloc_memory = coloc_memory

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        n, D = graph.num_nodes, cluster.num_devices
        mem = costs.memory(graph).astype(np.float64)
        cap = cluster.mem_capacity.astype(np.float64)
        fill_to = np.minimum(cap, mem.sum() / D + (mem.max() if n else 0.0))
        group_mem = np.zeros(0)
        if (graph.coloc >= 0).any():
            group_mem = np.bincount(graph.coloc[graph.coloc >= 0], weights=mem[graph.coloc >= 0])
        coloc = graph.coloc.tolist()
        device = np.full(n, -1, dtype=np.int64)
        group_dev: dict[int, int] = {}
        used = np.zeros(D)
        d = 0
        for v in bfs_topological_order(graph).tolist():
            g = coloc[v]
            if g >= 0 and g in group_dev:
                # later members ride with the group: under "all" their memory was counted
                # with the first member, under "first" (Baechi) it is not counted at all
                device[v] = group_dev[g]
                continue
            need = group_mem[g] if (g >= 0 and self.coloc_memory == "all") else mem[v]
            while d < D - 1 and used[d] + need > fill_to[d]:
                d += 1
            device[v] = d
            used[d] += need
            if g >= 0:
                group_dev[g] = d
        order = np.arange(n)
        return Plan(graph, Strategy.placement(device, order), info={"fill_to_bytes": fill_to.tolist(), "planned_bytes": used.tolist()})
