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

from algorithms.base import Algorithm
from algorithms.sched.constraints import Colocation, SequentialFill, StaticMemory
from algorithms.sched.orders import bfs_topological_order
from harness.core.checks import one_of
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.strategy import Plan, Strategy

#: m-TOPO's co-location accounting -> the group rule of :class:`StaticMemory`
COLOC_MEMORY = {"first": "first", "all": "whole"}


class MTopo(Algorithm):
    """Baechi's m-TOPO: fill devices in BFS topological order up to ``total / devices + largest op``."""

    graph_kind = "op"

    def __init__(self, name: str = "m_topo", seed: int = 0, coloc_memory: str = "first") -> None:
        super().__init__(name, seed)
        self.coloc_memory = one_of(coloc_memory, "algo.coloc_memory", tuple(COLOC_MEMORY))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "coloc_memory": self.coloc_memory}

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        n, D = graph.num_nodes, cluster.num_devices
        mem = costs.memory(graph).astype(np.float64)
        cap = cluster.mem_capacity.astype(np.float64)
        fill_to = np.minimum(cap, mem.sum() / D + (mem.max() if n else 0.0))
        # later members ride with their group: under "all" their memory was counted with the
        # first member, under "first" (Baechi) it is not counted at all
        memory = StaticMemory(Colocation(graph.coloc), mem, fill_to, COLOC_MEMORY[self.coloc_memory])
        fill = SequentialFill(memory, overflow="last")
        device = np.full(n, -1, dtype=np.int64)
        used = np.zeros(D)
        for v in bfs_topological_order(graph).tolist():
            p = memory.coloc.pinned(v)
            if p >= 0:
                device[v] = memory.place(v, p)
                continue
            need = memory.need(v)
            d = fill.device(need)
            device[v] = memory.place(v, d)
            used[d] += need
        order = np.arange(n)
        return Plan(graph, Strategy.placement(device, order), info={"fill_to_bytes": fill_to.tolist(), "planned_bytes": used.tolist()})
