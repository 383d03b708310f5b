"""FastT (Yi et al., "Optimizing distributed training deployment in heterogeneous GPU
clusters", CoNEXT 2020), as FD-DPS (Sec. 2.2, 5.1) describes it.

FastT has no public code; this is our reading of the descriptions, not a port:

* **Static critical-path priorities**: every operator gets ``tlevel + blevel`` with mean
  costs (the length of the longest path through it; operators on the critical path have
  the largest value), ties broken by ``blevel`` then node id.  Unlike FD-DPS the
  priorities are computed once and never updated while scheduling ("FastT uses static
  operator priority according to the critical path", FD-DPS Sec. 5.2).
* **Earliest-finish device choice**: the ready operator of highest priority goes to the
  device where it finishes earliest, with insertion into idle gaps
  (:func:`algorithms.sched.engine.ready_list_schedule`).
* **Operator splitting**: FastT's white-box search splits operators on the critical path
  of the current schedule.  Each round takes up to ``candidates_per_round`` of the
  longest splittable operators on that path (conv / conv backward / matmul with at most
  ``max_param_MiB`` of parameters, :mod:`algorithms.opsplit`), splits them in two along
  the batch (or channel) dimension, reschedules, and keeps the split only if the
  schedule's makespan drops; rejected operators are not tried again.  At most
  ``max_rounds`` rounds; each original operator is split at most once.

Co-location groups and the memory filter are those of the other list schedulers.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from algorithms.base import Algorithm
from algorithms.sched.engine import ListSchedule, ready_list_schedule, schedule_critical_path
from algorithms.sched.levels import blevel, tlevel
from algorithms.sched.orders import order_from_starts
from algorithms.sched.schedgraph import SchedGraph, comm_fn
from algorithms.opsplit import DEFAULT_SPLIT_OPS, SPLIT_DIMS, op_names, param_bytes_read, split_dim_of, split_graph
from harness.core.checks import boolean, non_negative_int, non_negative_number, one_of, positive_int
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.strategy import Plan, Strategy


def fastt_schedule(graph: OpGraph, cluster: Cluster, costs: CostModel, insertion: bool = True) -> tuple[SchedGraph, ListSchedule]:
    """FastT's placement and order of one graph: static CP priority, earliest finish."""
    sg = SchedGraph.from_opgraph(graph, cluster, costs)
    bl = blevel(sg, sg.w, sg.c)
    cp = tlevel(sg, sg.w, sg.c) + bl
    return sg, ready_list_schedule(sg, cluster, comm_fn(costs), [cp, bl], insertion=insertion)


class FastT(Algorithm):
    """FastT: static critical-path list scheduling plus greedy critical-path op splitting."""

    graph_kind = "op"
    paper = "FastT (Yi et al., CoNEXT 2020; our reading of FD-DPS's description)"
    findings = "results/fddps/README.md"

    def __init__(
        self,
        name: str = "fastt",
        seed: int = 0,
        split: bool = True,
        split_ops: Sequence[str] = DEFAULT_SPLIT_OPS,
        max_param_MiB: float = 32.0,
        split_dim: str = "batch",
        max_rounds: int = 16,
        candidates_per_round: int = 4,
        insertion: bool = True,
    ) -> None:
        super().__init__(name, seed)
        self.split = boolean(split, "algo.split")
        self.split_ops = op_names(split_ops, "algo.split_ops")
        self.max_param_MiB = non_negative_number(max_param_MiB, "algo.max_param_MiB")
        self.max_param = self.max_param_MiB * 2**20
        self.split_dim = one_of(split_dim, "algo.split_dim", SPLIT_DIMS)
        self.max_rounds = non_negative_int(max_rounds, "algo.max_rounds")
        self.per_round = positive_int(candidates_per_round, "algo.candidates_per_round")
        self.insertion = boolean(insertion, "algo.insertion")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "split": self.split, "split_ops": self.split_ops, "max_param_MiB": self.max_param_MiB,
                "split_dim": self.split_dim, "max_rounds": self.max_rounds, "candidates_per_round": self.per_round,
                "insertion": self.insertion}

    def _candidates(self, g: OpGraph, path: list[int], et: np.ndarray, whole: np.ndarray, tried: set[int], origin: np.ndarray) -> dict[int, str]:
        pbytes = param_bytes_read(g)
        ops = set(self.split_ops)
        out: list[tuple[float, int, str]] = []
        for v in path:
            o = int(origin[v])
            if o < 0 or not whole[v] or o in tried or g.targets[v] not in ops or pbytes[v] > self.max_param:
                continue
            d = split_dim_of(g, v, self.split_dim)
            if d is not None:
                out.append((-float(et[v]), v, d))
        out.sort()
        return {v: d for _, v, d in out[: self.per_round]}

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        t0 = time.perf_counter()
        comm = comm_fn(costs)
        g = graph
        origin = np.arange(graph.num_nodes)
        sg, sched = fastt_schedule(g, cluster, costs, self.insertion)
        initial = sched.makespan
        tried: set[int] = set()
        accepted: list[str] = []
        rounds = 0
        for _ in range(self.max_rounds if self.split else 0):
            # a node still stands for its whole original operator when it is the only one from it
            counts = np.bincount(origin[origin >= 0], minlength=graph.num_nodes)
            whole = (origin >= 0) & (counts[np.maximum(origin, 0)] == 1)
            path = schedule_critical_path(sg, sched, comm)
            cand = self._candidates(g, path, sg.et[0], whole, tried, origin)
            if not cand:
                break
            rounds += 1
            res = split_graph(g, cand)
            sg2, sched2 = fastt_schedule(res.graph, cluster, costs, self.insertion)
            if sched2.makespan < sched.makespan:
                accepted += [g.names[v] for v in cand]
                origin = np.where(res.origin >= 0, origin[np.maximum(res.origin, 0)], -1)
                g, sg, sched = res.graph, sg2, sched2
            else:
                tried.update(int(origin[v]) for v in cand)
        order = order_from_starts(sched.start, g)
        info = {
            "objective_s": sched.makespan,
            "search_complete": True,
            "initial_makespan_s": initial,
            "split_rounds": rounds,
            "split_ops": len(accepted),
            "split_names": accepted[:200],
            "memory_fallbacks": sched.mem_fallbacks,
            "tasks_per_device": np.bincount(sched.device, minlength=cluster.num_devices).tolist(),
            "search_seconds_inner": time.perf_counter() - t0,
        }
        plan_origin = origin if g is not graph else None
        return Plan(g, Strategy.placement(sched.device, order), origin=plan_origin, info=info)
