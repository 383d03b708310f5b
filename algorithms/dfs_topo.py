"""DFS-TOPO placement (Celeritas Sec. 4.2.2): sequential, memory-filled placement in a
depth-first topological order.

This is the placement Celeritas's Standard Evaluation uses to run the large-batch model
once (Sec. 4.2.1, step 2: "place nodes on one device until reaching its memory limit,
then move on to the next device", with the DFS-TOPO order instead of Baechi's BFS-like
m-TOPO order, Fig. 3).  DFS-TOPO keeps a stack of 0-indegree nodes; the head is output,
its out-edges deleted, and its children that reach indegree 0 go to the head, so a
chain of neighbours stays together (:func:`algorithms.sched.orders.dfs_topo_order`).

Memory is static (the sum of ``costs.memory`` over the nodes placed on a device, never
freed) against ``cluster.mem_capacity``.  When no later device has room for a node it
goes to the device with the most free memory: the best-effort rule Celeritas adds to both
DFS-TOPO and m-TOPO for its measurement-time comparison (Sec. 6.3).  Co-location groups
follow their first member.  The schedule order is the DFS-TOPO order itself.
"""

from __future__ import annotations

import numpy as np

from algorithms.base import Algorithm
from algorithms.sched.constraints import sequential_fill
from algorithms.sched.orders import dfs_topo_order, positions
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.strategy import Plan, Strategy


class DfsTopo(Algorithm):
    """Sequential memory-filled placement in DFS-TOPO order (Celeritas Sec. 4.2.2)."""

    graph_kind = "op"

    def __init__(self, name: str = "dfs_topo", seed: int = 0) -> None:
        super().__init__(name, seed)

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        seq = dfs_topo_order(graph)
        mem = np.asarray(costs.memory(graph), dtype=np.float64)
        device, info = sequential_fill(graph, seq, mem, cluster.mem_capacity)
        info["devices_filled"] = int(len(np.unique(device)))
        return Plan(graph, Strategy.placement(device, positions(seq)), info=info)
