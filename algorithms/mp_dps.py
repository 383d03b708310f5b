"""MP-DPS (Wang et al., ref. [21] of FD-DPS): compute-aware node merging, then scheduling
with path prediction.

MP-DPS has no public code; this is our reading of FD-DPS's description ("it reduces the
search space by merging nodes with computing power awareness ... it implements optimal
scheduling by predicting the path cost in DAG", Sec. 5.1), not a port:

* **Compute-aware merging.**  An operator u whose only consumer is v is merged into v
  when its compute time is at most ``merge_ratio`` times the mean time to send its output
  to another device (w-bar_u <= ratio * c-bar_uv): placing such an operator away from its
  consumer can never pay for the transfer, so the scheduler need not consider it.  Views
  (zero time) always merge into their single consumer.  Merging only along an operator's
  single out-edge contracts in-trees, which keeps the merged graph acyclic; merged nodes
  run their members back to back in node order.  Co-location groups that meet in a merged
  node become one group.
* **Path prediction.**  PEFT's optimistic cost table (Arabnejad and Barbosa, IEEE TPDS
  25(3), 2014): ``OCT(t_i, p_k) = max_{t_j in succ} min_{p_w} (OCT(t_j, p_w) + w(t_j, p_w)
  + c-bar_ij [p_w != p_k])``; ready merged nodes are taken in decreasing ``rank_oct``
  (the mean of their OCT row) and each goes to the device minimising the optimistic
  finish ``EFT(t_i, p) + OCT(t_i, p)``, with insertion into idle gaps.

The plan is on the original graph: each member of a merged node gets the node's device and
a start time inside the node's slot.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.base import Algorithm
from algorithms.sched.engine import expand_group_starts, ready_list_schedule
from algorithms.sched.orders import order_from_starts
from algorithms.sched.schedgraph import SchedGraph, comm_fn
from harness.core.checks import boolean, non_negative_number
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.strategy import Plan, Strategy


def merge_groups(sg: SchedGraph, merge_ratio: float) -> np.ndarray:
    """Compute-aware merging: group id per node (numbered in a topological order of the
    merged graph: by the id of each group's root, its last member)."""
    n = sg.num_nodes
    sptr, succ, seid = sg.succ_csr()
    outdeg = np.diff(sptr)
    target = np.arange(n)
    single = np.flatnonzero(outdeg == 1)
    if len(single):
        e = seid[sptr[single]]
        v = succ[sptr[single]]
        light = sg.w[single] <= merge_ratio * sg.c[e]
        target[single[light]] = v[light]
    root = target.copy()
    for u in range(n - 1, -1, -1):  # targets point to higher ids: resolve from the end
        if target[u] != u:
            root[u] = root[target[u]]
    _, group = np.unique(root, return_inverse=True)
    return group.astype(np.int64)


def optimistic_cost_table(sg: SchedGraph) -> np.ndarray:
    """PEFT's OCT[v, p] (exit nodes: 0)."""
    n, D = sg.num_nodes, sg.num_devices
    sptr, succ, seid = (x.tolist() for x in sg.succ_csr())
    et = sg.et.T.copy()  # [n, D]
    c = sg.c
    oct_ = np.zeros((n, D))
    for v in range(n - 1, -1, -1):
        if sptr[v] == sptr[v + 1]:
            continue
        best = np.full(D, -np.inf)
        for i in range(sptr[v], sptr[v + 1]):
            j = succ[i]
            a = oct_[j] + et[j]
            np.maximum(best, np.minimum(a, a.min() + c[seid[i]]), out=best)
        oct_[v] = best
    return oct_


class MPDPS(Algorithm):
    """MP-DPS: merge light operators into their consumer, then PEFT-style list scheduling."""

    graph_kind = "op"
    paper = "MP-DPS (ref. [21] of FD-DPS; our reading)"
    findings = "results/fddps/README.md"

    def __init__(self, name: str = "mp_dps", seed: int = 0, merge_ratio: float = 1.0, insertion: bool = True) -> None:
        super().__init__(name, seed)
        self.merge_ratio = non_negative_number(merge_ratio, "algo.merge_ratio")
        self.insertion = boolean(insertion, "algo.insertion")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "merge_ratio": self.merge_ratio, "insertion": self.insertion}

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        sg = SchedGraph.from_opgraph(graph, cluster, costs)
        group = merge_groups(sg, self.merge_ratio)
        q = sg.quotient(group, cluster)
        oct_ = optimistic_cost_table(q)
        rank = oct_.mean(axis=1)
        sched = ready_list_schedule(q, cluster, comm_fn(costs), [rank], bias=oct_, insertion=self.insertion)
        dev, start = expand_group_starts(group, sched, sg.et, sg)
        order = order_from_starts(start, graph)
        info = {
            "objective_s": sched.makespan,
            "search_complete": True,
            "merged_nodes": int(q.num_nodes),
            "merge_factor": float(graph.num_nodes / max(q.num_nodes, 1)),
            "memory_fallbacks": sched.mem_fallbacks,
            "tasks_per_device": np.bincount(dev, minlength=cluster.num_devices).tolist(),
        }
        return Plan(graph, Strategy.placement(dev, order), info=info)
