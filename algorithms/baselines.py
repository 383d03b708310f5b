"""Fixed strategies: one device, data parallelism, round robin.

``data_parallel`` is the DP column of FD-DPS Table 5 and OptCNN Fig. 7: every operator is
split along the sample dimension over all devices, and the simulator inserts the gradient
all-reduce where a weight gradient (a partial sum) meets the optimizer update.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.base import Algorithm, follow_colocation
from harness.cluster import Cluster
from harness.costs import CostModel
from harness.graph import OpGraph
from harness.strategy import ParallelConfig, Plan, Strategy


class SingleDevice(Algorithm):
    """Everything on one device (the single-GPU column of the papers' tables)."""

    def __init__(self, name: str = "single_device", device: int = 0, **kw: Any) -> None:
        super().__init__(name, device=device, **kw)
        self.device = int(device)

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        return Plan(graph, Strategy.placement(np.full(graph.num_nodes, self.device)))


class DataParallel(Algorithm):
    """Sample-dimension degree N on every node over ``devices`` (default: all)."""

    def __init__(self, name: str = "data_parallel", devices: int | None = None, **kw: Any) -> None:
        super().__init__(name, devices=devices, **kw)
        self.devices = devices

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        k = cluster.num_devices if self.devices is None else int(self.devices)
        cfg = ParallelConfig.make({"sample": k}, range(k))
        return Plan(graph, Strategy.uniform_config(graph.num_nodes, cfg))


class RoundRobin(Algorithm):
    """Node i on device i mod N (co-location groups follow their first member)."""

    def __init__(self, name: str = "round_robin", **kw: Any) -> None:
        super().__init__(name, **kw)

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        dev = np.arange(graph.num_nodes) % cluster.num_devices
        return Plan(graph, Strategy.placement(follow_colocation(graph, dev)))
