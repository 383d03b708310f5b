"""Baechi's m-ETF (Jeon et al., SoCC 2020): memory-constrained Earliest Time First.

ETF (Hwang et al. 1989) list-schedules the operator graph: over every pair of a ready
op and a device it takes the pair with the earliest start time, places the op there and
repeats.  Baechi adds memory: a device is eligible for an op only if its free memory
holds the op; an op's output is allocated when it is scheduled and freed once all its
consumers have run; parameters stay resident; a co-location group goes where its first
member goes, and the first member needs room for the whole group.  The engine is
:func:`algorithms.sched.etf.etf_schedule`; costs are the static w_i and c_ij of
:func:`algorithms.sched.levels.static_costs` (Baechi profiles each op and fits transfer
times linearly in bytes, which is what the cost model gives here).  Ties go to the op
earlier in Baechi's BFS topological order.

Out of memory.  Baechi's m-ETF cannot continue when no device holds a ready op (Celeritas
Table 3: "m-SCT and m-ETF encounter OOM during placement").  We then keep placing without
the memory check, so that the simulator can still judge the strategy, and report
``placement_oom`` (and the number of such steps) in Plan.info; the experiments print such
a run as OOM.

The schedule order handed to the simulator is the ETF schedule itself
(:func:`algorithms.sched.orders.order_from_starts` on the start times).
"""

from __future__ import annotations

from algorithms.base import Algorithm
from algorithms.sched.constraints import memory_split
from algorithms.sched.etf import etf_schedule
from algorithms.sched.levels import static_costs
from algorithms.sched.orders import bfs_topological_order, order_from_starts, positions
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.strategy import Plan, Strategy


class METF(Algorithm):
    """Baechi's m-ETF."""

    graph_kind = "op"

    def __init__(self, name: str = "m_etf", seed: int = 0) -> None:
        super().__init__(name, seed)

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        w, c = static_costs(graph, cluster, costs)
        mem, pers = memory_split(graph, costs)
        rank = positions(bfs_topological_order(graph))
        res = etf_schedule(graph, cluster, w, c, mem, pers, rank)
        order = order_from_starts(res["start"], graph)
        info = {
            "objective_s": res["makespan"],
            "placement_oom": res["oom_steps"] > 0,
            "oom_steps": res["oom_steps"],
        }
        return Plan(graph, Strategy.placement(res["device"], order), info=info)
