"""Fixed strategies: one device, data parallelism, round robin.

``data_parallel`` is the DP column of FD-DPS Table 5 and OptCNN Fig. 7: every operator is
split along the sample dimension over all devices, and the simulator inserts the gradient
all-reduce where a weight gradient (a partial sum) meets the optimizer update.
With ``graph: layer`` the same strategy (sample degree N on every layer) is made for the
layer graph (OptCNN's DP baseline); its Eq. 1 objective is then reported too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.base import Algorithm
from algorithms.sched.constraints import follow_colocation
from harness.core.cluster import Cluster
from harness.core.checks import integer, one_of, positive_int
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
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

    ``graph``: ``op`` (the operator graph, default) or ``layer`` (the layer graph: the same
    strategy, with its OptCNN Eq. 1 / PaSE objective in ``Plan.info``).
    """

    graph_kind = "op"

    def __init__(self, name: str = "data_parallel", seed: int = 0, devices: int | None = None, graph: str = "op") -> None:
        super().__init__(name, seed)
        self.devices = None if devices is None else positive_int(devices, "algo.devices", StrategyError)
        self.graph_kind = one_of(graph, "algo.graph", ("op", "layer"))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "devices": self.devices, "graph": self.graph_kind}

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        k = cluster.num_devices if self.devices is None else self.devices
        if k > cluster.num_devices:
            raise StrategyError(f"algo.devices={k} is more than the {cluster.num_devices} devices of cluster {cluster.name!r}")
        check_batch_split(graph, k)
        cfg = ParallelConfig.make({"sample": k}, range(k))
        strategy = Strategy.uniform_config(graph.num_nodes, cfg)
        if self.graph_kind == "op":
            return Plan(graph, strategy)
        from algorithms.layer_costs import evaluate

        info = {**evaluate(graph, strategy, cluster, costs), "search_complete": True}
        return Plan(graph, strategy, info=info)


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
