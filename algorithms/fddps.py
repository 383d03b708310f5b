"""FD-DPS (Wang et al., Mathematics 10(24):4788, 2022, Sec. 4) and D-DPS(-F).

FD-DPS = fine-grained operator splitting (Sec. 4.1, :mod:`algorithms.opsplit`) followed by
dynamic-critical-path list scheduling (Sec. 4.2-4.4, Alg. 1-3).  ``FDDPS(split=False)`` is
the paper's D-DPS(-F) (Table 7), registered as ``conf/algo/dddps_f.yaml``.

The scheduler (the partially scheduled graph, EST / LST / DCPL, Sort_Node, Find_Slot, the
device rules and the incremental updates, with our readings of the paper's OCR-damaged
boxes) is :class:`algorithms.fddps_dcp.DCPScheduler`.

* Alg. 3's outer ``while True`` around the split step repeats until "the optimal
  strategy is found"; one split pass and one scheduling pass is what Sec. 4.4 describes
  and what we run.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from algorithms.base import Algorithm
from algorithms.fddps_dcp import SLOT_RULES, DCPScheduler
from algorithms.opsplit import DEFAULT_SPLIT_OPS, SPLIT_DIMS, SplitRule, op_names, split_for_fddps
from algorithms.sched.orders import order_from_starts
from algorithms.sched.schedgraph import SchedGraph, comm_fn, route_tables
from harness.core.checks import boolean, non_negative_int, non_negative_number, one_of, positive_int, positive_number
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.strategy import Plan, Strategy


class FDDPS(Algorithm):
    """FD-DPS: split (Sec. 4.1) then dynamic-critical-path scheduling (Sec. 4.2-4.4).

    ``split=False`` is D-DPS(-F).
    """

    graph_kind = "op"
    paper = "FD-DPS (Wang et al., Mathematics 2022)"
    paper_claim = "shorter steps than FastT and MP-DPS on multi-GPU servers (Table 5) and that splitting operators helps (Table 7)"
    findings = "results/fddps/README.md"

    def __init__(
        self,
        name: str = "fddps",
        seed: int = 0,
        split: bool = True,
        split_ops: Sequence[str] = DEFAULT_SPLIT_OPS,
        min_time_ms: float = 1.0,
        max_param_MiB: float = 32.0,
        split_dim: str = "auto",
        slot: str = "lst",
        horizon: int | str = "auto",
        eps: float = 1e-9,
        exact_up_to: int = 100000,
        auto_horizon: int = 64,
        compiled: bool | None = None,
    ) -> None:
        super().__init__(name, seed)
        self.split = boolean(split, "algo.split")
        self.split_ops = op_names(split_ops, "algo.split_ops")
        self.min_time_ms = non_negative_number(min_time_ms, "algo.min_time_ms")
        self.max_param_MiB = non_negative_number(max_param_MiB, "algo.max_param_MiB")
        self.split_dim = one_of(split_dim, "algo.split_dim", SPLIT_DIMS)
        self.rule = SplitRule(tuple(self.split_ops), self.min_time_ms, self.max_param_MiB, self.split_dim)
        self.slot = one_of(slot, "algo.slot", SLOT_RULES)
        # auto, 0 (exact) or the N > 0 last gaps searched per device
        self.horizon = horizon if horizon == "auto" else non_negative_int(horizon, "algo.horizon")
        self.eps = positive_number(eps, "algo.eps")
        self.exact_up_to = non_negative_int(exact_up_to, "algo.exact_up_to")
        self.auto_horizon = positive_int(auto_horizon, "algo.auto_horizon")
        self.compiled = one_of(compiled, "algo.compiled", (None, True, False))  # null: by graph size

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "split": self.split, "split_ops": self.split_ops, "min_time_ms": self.min_time_ms,
                "max_param_MiB": self.max_param_MiB, "split_dim": self.split_dim, "slot": self.slot, "horizon": self.horizon,
                "eps": self.eps, "exact_up_to": self.exact_up_to, "auto_horizon": self.auto_horizon,
                "compiled": self.compiled}

    def horizon_for(self, num_nodes: int) -> int:
        """The slot-search horizon for a graph: ``auto`` is exact (0) up to ``exact_up_to``
        nodes and ``auto_horizon`` gaps beyond, where the exact Eq. 11 search grows
        superlinearly (README of results/fddps gives the step-time cost of the trade)."""
        if self.horizon != "auto":
            return int(self.horizon)
        return 0 if num_nodes <= self.exact_up_to else self.auto_horizon

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        t0 = time.perf_counter()
        origin = None
        info: dict[str, Any] = {}
        g = graph
        if self.split:
            res = split_for_fddps(graph, costs.node_times(graph, 0), self.rule)
            g, origin = res.graph, res.origin
            info.update(res.info)
        t_split = time.perf_counter() - t0
        sg = SchedGraph.from_opgraph(g, cluster, costs)
        horizon = self.horizon_for(g.num_nodes)
        sched = DCPScheduler(sg, cluster, comm_fn(costs), self.eps, self.slot, horizon, routes=route_tables(costs),
                             compiled=self.compiled)
        t1 = time.perf_counter()
        dev, start = sched.run()
        t_sched = time.perf_counter() - t1
        order = order_from_starts(start, g)
        finish = start + sg.et[dev, np.arange(g.num_nodes)]
        info.update({
            "objective_s": float(finish.max()) if len(finish) else 0.0,
            "search_complete": True,
            "slot": self.slot,
            "horizon": horizon,
            "search_exact": horizon == 0,
            "split_seconds": t_split,
            "schedule_seconds": t_sched,
            "step_us": 1e6 * t_sched / max(g.num_nodes, 1),
            "memory_fallbacks": sched.memory.fallbacks,
            "tasks_per_device": np.bincount(dev, minlength=cluster.num_devices).tolist(),
            **sched.stats,
        })
        return Plan(g, Strategy.placement(dev, order), origin=origin, info=info)
