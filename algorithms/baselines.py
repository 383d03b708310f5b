"""Fixed strategies: one device, data parallelism, round robin.

``data_parallel`` is the DP column of FD-DPS Table 5 and OptCNN Fig. 7: every operator is
split along the sample dimension over all devices, and the simulator inserts the gradient
all-reduce where a weight gradient (a partial sum) meets the optimizer update.
With ``graph: layer`` the same strategy (sample degree N on every layer) is made for the
layer graph (OptCNN's DP baseline); its Eq. 1 objective is then reported too.  On a stack graph
(a model given by its shape, ``model=llm``, which has no operator graph; or ``graph: stack``) it
is plain DDP as a :class:`~harness.core.llm.plan.ParallelPlan`: ``dp`` = the devices, no
tensor, pipeline or context parallelism, no sharding (ZeRO 0), the gradients all-reduced in
buckets overlapped with the backward; ``micro_batch`` (null) is the whole per-replica batch
for a CNN, as the operator-graph data parallelism runs it, and one sequence for a transformer
(Megatron-LM's default ``--micro-batch-size``), the rest accumulated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.base import Algorithm
from algorithms.sched.constraints import follow_colocation
from algorithms.stack_plans import stack_plan_info
from harness.core.cluster import Cluster
from harness.core.checks import integer, one_of, positive_int
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.llm.plan import multiples_near, near, plan_from_degrees, use
from harness.core.llm.stack import StackGraph
from harness.core.strategy import ParallelConfig, Plan, Strategy, StrategyError


class SingleDevice(Algorithm):
    """Everything on one device (the single-GPU column of the papers' tables)."""

    graph_kind = "op"

    def __init__(self, name: str = "single_device", seed: int = 0, device: int = 0) -> None:
        super().__init__(name, seed)
        self.device = integer(device, "algo.device", StrategyError)
        if self.device < 0:
            raise StrategyError(f"algo.device must be a device id >= 0, got {self.device}")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "device": self.device}

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        return Plan(graph, Strategy.placement(np.full(graph.num_nodes, self.device)))


class DataParallel(Algorithm):
    """Sample-dimension degree N on every node over ``devices`` (default: all).

    ``graph``: ``op`` (the operator graph, default; a model with none, ``model=llm``, gets the
    stack graph), ``layer`` (the layer graph: the same strategy, with its OptCNN Eq. 1 / PaSE
    objective in ``Plan.info``) or ``stack`` (DDP on the stack graph, see the module docstring).
    """

    graph_kind = "op"

    def __init__(self, name: str = "data_parallel", seed: int = 0, devices: int | None = None, graph: str = "op",
                 micro_batch: int | None = None) -> None:
        super().__init__(name, seed)
        self.devices = None if devices is None else positive_int(devices, "algo.devices", StrategyError)
        self.graph_kind = one_of(graph, "algo.graph", ("op", "layer", "stack"))
        self.micro_batch = None if micro_batch is None else positive_int(micro_batch, "algo.micro_batch", StrategyError)

    @property
    def graph_kinds(self) -> tuple[str, ...]:
        """``op`` first and ``stack`` where the model has no operator graph; or the kind ``algo.graph`` names."""
        return ("op", "stack") if self.graph_kind == "op" else (self.graph_kind,)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "devices": self.devices, "graph": self.graph_kind, "micro_batch": self.micro_batch}

    def plan(self, graph: OpGraph | StackGraph, cluster: Cluster, costs: CostModel) -> Plan:
        k = cluster.num_devices if self.devices is None else self.devices
        if k > cluster.num_devices:
            raise StrategyError(f"algo.devices={k} is more than the {cluster.num_devices} devices of cluster {cluster.name!r}")
        if isinstance(graph, StackGraph):
            return self.plan_stack(graph, k, cluster)
        check_batch_split(graph, k)
        cfg = ParallelConfig.make({"sample": k}, range(k))
        strategy = Strategy.uniform_config(graph.num_nodes, cfg)
        if self.graph_kind == "op":
            return Plan(graph, strategy)
        from algorithms.layer_costs import evaluate

        info = {**evaluate(graph, strategy, cluster, costs), "search_complete": True}
        return Plan(graph, strategy, info=info)


    def plan_stack(self, graph: StackGraph, k: int, cluster: Cluster) -> Plan:
        """DDP over ``k`` GPUs of a stack graph (see the module docstring)."""
        batch = int(graph.batch_size)
        if batch % k:
            ks = near(lambda v: batch % v == 0, k, 1, cluster.num_devices)
            raise StrategyError(f"data parallelism over {k} GPUs splits model.batch_size={batch} {k} ways, which does not divide it: "
                                f"use model.batch_size={' or '.join(map(str, multiples_near(batch, k)))}"
                                + (f", or {use('algo.devices', ks)}" if ks else ""))
        mb = self.micro_batch or (batch // k if graph.spec is None else 1)
        plan = plan_from_degrees(graph, k, dp=k, micro_batch=mb, zero=0, meta={"algo": self.name})
        return Plan(graph, plan, info=stack_plan_info(plan, graph, cluster))


def check_batch_split(graph: Any, k: int) -> None:
    """Refuse to split ``graph``'s batch ``k`` ways when it has fewer than ``k`` samples: its
    ``meta.batch_size`` (1 when a graph file gives none) or, in a layer graph, a layer's sample
    dim.  A shard of a fraction of one sample is no data parallelism a framework can run."""
    if k <= 1:
        return
    batch = graph.meta.get("batch_size", 1)
    for v, dims in enumerate(getattr(graph, "dims", ())):  # a layer graph: its layers' sample dims
        s = dims.get("sample")
        if s is not None and s < k and graph.kinds[v] != "input":
            raise StrategyError(f"layer {graph.names[v]} has sample size {s} < {k} devices: data parallelism cannot split it "
                                f"{k} ways (model.batch_size is {batch}; use a larger batch or algo.devices <= {s})")
    if isinstance(batch, (int, np.integer)) and not isinstance(batch, bool) and 0 < batch < k:
        raise StrategyError(f"data parallelism over {k} devices splits the batch {k} ways, and the graph's batch "
                            f"(model.batch_size) is {int(batch)}: use a batch of at least {k} or algo.devices <= {int(batch)}")


class RoundRobin(Algorithm):
    """Node i on device i mod N (co-location groups follow their first member)."""

    graph_kind = "op"

    def __init__(self, name: str = "round_robin", seed: int = 0) -> None:
        super().__init__(name, seed)

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        dev = np.arange(graph.num_nodes) % cluster.num_devices
        return Plan(graph, Strategy.placement(follow_colocation(graph, dev)))
