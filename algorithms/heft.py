"""HEFT with insertion (Topcuoglu, Hariri and Wu, IEEE TPDS 13(3), 2002).

1. Upward rank ``rank_u(i) = w-bar_i + max_{j in succ(i)} (c-bar_ij + rank_u(j))`` with
   mean computation and communication costs (Sec. 4.1, Eq. 4-5): the shared
   :func:`algorithms.sched.levels.blevel` on :func:`~algorithms.sched.levels.static_costs`.
2. Tasks in decreasing rank_u (ties by node id; we take the highest-ranked *ready* task,
   which is the same list whenever ranks strictly decrease along edges and stays a valid
   order when zero-cost views make ranks equal).
3. Each task goes to the device that minimises its earliest finish time
   ``EFT(i, p) = w_ip + EST(i, p)`` where ``EST`` is the first idle gap on p that fits after
   all inputs have arrived (insertion-based policy, Eq. 1-3).

Co-location groups are placed with their first member; devices whose remaining static
memory cannot take a node are skipped (shared with the other list schedulers).  On the
10-task example of the paper (Fig. 2, three processors) the makespan is 80
(tests/test_heft.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.base import Algorithm
from algorithms.sched.engine import ready_list_schedule
from algorithms.sched.levels import blevel
from algorithms.sched.orders import order_from_starts
from algorithms.sched.schedgraph import SchedGraph, comm_fn
from algorithms.sched.timeline import describe_timelines
from harness.core.checks import boolean
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.strategy import Plan, Strategy


class HEFT(Algorithm):
    """Heterogeneous Earliest Finish Time; ``insertion=False`` appends after each device's last task."""

    graph_kind = "op"

    def __init__(self, name: str = "heft", seed: int = 0, insertion: bool = True) -> None:
        super().__init__(name, seed)
        self.insertion = boolean(insertion, "algo.insertion")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "insertion": self.insertion}

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        sg = SchedGraph.from_opgraph(graph, cluster, costs)
        rank_u = blevel(sg, sg.w, sg.c)
        sched = ready_list_schedule(sg, cluster, comm_fn(costs), [rank_u], insertion=self.insertion)
        order = order_from_starts(sched.start, graph)
        info = {
            "objective_s": sched.makespan,
            "search_complete": True,
            "memory_fallbacks": sched.mem_fallbacks,
            **describe_timelines(sched.timelines),
        }
        return Plan(graph, Strategy.placement(sched.device, order), info=info)


def heft_schedule(sg: SchedGraph, cluster: Cluster, costs: CostModel, insertion: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(device, start, finish) of HEFT on an already built :class:`SchedGraph` (for tests and
    for comparing schedulers on hand-made cost tables)."""
    sched = ready_list_schedule(sg, cluster, comm_fn(costs), [blevel(sg, sg.w, sg.c)], insertion=insertion)
    return sched.device, sched.start, sched.finish
