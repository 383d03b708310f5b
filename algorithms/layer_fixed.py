"""Fixed layer-wise strategies in OptCNN's configuration space (OptCNN Sec. 6 baselines).

* ``model_parallel``: "distributes the network parameters in each layer equally to all
  devices" (OptCNN, after Krizhevsky 2014): channel degree N on every layer.
* ``owt``: Krizhevsky's "one weird trick": data parallelism (sample degree N) for the
  convolutional and pooling layers, model parallelism (channel degree N) for the
  fully-connected ones.
* ``data_parallel`` on the layer graph is the foundation's :class:`algorithms.baselines.DataParallel`
  with ``graph: layer`` (the same strategy, sample degree N everywhere).

Our readings. MP: a layer whose channel dim is smaller than N (an RGB input, a 1-channel
output) takes the largest divisor of N that fits; a layer without a channel dim runs on
device 0. OWT: a layer is on the model-parallel side when it is a linear layer, or when it is
neither a convolution nor a pooling and all its inputs are on that side (the ReLUs and
dropouts between fully-connected layers); everything else (convolutions, pools, their
normalisations and activations, the flatten before the first fully-connected layer) is data
parallel. Both report their Eq. 1 (or PaSE) objective, evaluated with the same cost functions as
the searches (:func:`algorithms.layer_costs.evaluate`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from algorithms.base import Algorithm
from algorithms.layer_costs import evaluate
from harness.core.checks import one_of, optional, positive_int
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.layer_shards import MAPPINGS, shard_devices
from harness.core.layergraph import LayerGraph
from harness.core.strategy import ParallelConfig, Plan, Strategy, StrategyError

CONV_POOL = frozenset({"conv1d", "conv2d", "conv3d", "pool1d", "pool2d", "pool3d"})


def _fit(size: int, n: int) -> int:
    """Largest divisor of n that is at most size."""
    return max(d for d in range(1, n + 1) if n % d == 0 and d <= size)


def layer_strategy(lg: LayerGraph, dims: list[dict[str, int]], num_devices: int, mapping: str = "linear", **meta: Any) -> Strategy:
    """A Strategy giving node v the degrees ``dims[v]`` (shards mapped onto devices by ``mapping``)."""
    configs: list[ParallelConfig] = []
    ids: dict[ParallelConfig, int] = {}
    cid = np.zeros(lg.num_nodes, dtype=np.int32)
    for v, d in enumerate(dims):
        d = {k: int(x) for k, x in d.items() if x > 1}
        deg = int(np.prod(list(d.values()))) if d else 1
        cfg = ParallelConfig.make(d, shard_devices(deg, num_devices, mapping).tolist())
        if cfg not in ids:
            ids[cfg] = len(configs)
            configs.append(cfg)
        cid[v] = ids[cfg]
    n = lg.num_nodes
    return Strategy(np.full(n, -1, dtype=np.int32), np.arange(n), cid, configs, dict(meta))


def data_parallel_dims(lg: LayerGraph, n: int) -> list[dict[str, int]]:
    """Sample degree n on every layer; a clear error for a batch smaller than n."""
    out = []
    for v in range(lg.num_nodes):
        s = lg.dims[v].get("sample")
        if s is not None and s < n and lg.kinds[v] != "input":
            raise StrategyError(f"layer {lg.names[v]} has sample size {s} < {n} devices: data parallelism cannot split it {n} ways")
        out.append({"sample": n} if lg.kinds[v] != "input" else {})
    return out


def model_parallel_dims(lg: LayerGraph, n: int) -> list[dict[str, int]]:
    out = []
    for v in range(lg.num_nodes):
        c = lg.dims[v].get("channel")
        out.append({"channel": _fit(c, n)} if c is not None and lg.kinds[v] != "input" else {})
    return out


def owt_dims(lg: LayerGraph, n: int) -> list[dict[str, int]]:
    mp = np.zeros(lg.num_nodes, dtype=bool)
    for v in range(lg.num_nodes):
        preds = lg.predecessors(v)
        kind = lg.kinds[v]
        mp[v] = kind == "linear" or (kind not in CONV_POOL and kind != "input" and len(preds) > 0 and bool(mp[preds].all()))
    dp = data_parallel_dims(lg, n)
    mpd = model_parallel_dims(lg, n)
    return [mpd[v] if mp[v] else dp[v] for v in range(lg.num_nodes)]


class _Fixed(Algorithm):
    """A fixed strategy: ``rule(graph, n)``'s degrees on ``devices`` devices (``None``: the
    cluster's), shards mapped by ``mapping``; reports its own objective."""

    graph_kind = "layer"
    rule = staticmethod(model_parallel_dims)

    def __init__(self, name: str, seed: int = 0, devices: int | None = None, mapping: str = "linear") -> None:
        super().__init__(name, seed)
        self.devices = optional(positive_int, devices, "algo.devices")  # null: the cluster's
        self.mapping = one_of(mapping, "algo.mapping", MAPPINGS)

    def describe(self) -> dict[str, Any]:
        """The name, the seed, ``devices`` and ``mapping``."""
        return {**super().describe(), "devices": self.devices, "mapping": self.mapping}

    def plan(self, graph: LayerGraph, cluster: Cluster, costs: CostModel) -> Plan:
        if not isinstance(graph, LayerGraph):
            raise TypeError(f"{self.name} is a layer-graph strategy (graph_kind 'layer'), got {type(graph).__name__}")
        n = cluster.num_devices if self.devices is None else self.devices
        if n > cluster.num_devices:
            raise StrategyError(f"algo.devices={n} is more than the {cluster.num_devices} devices of cluster {cluster.name!r}")
        strat = layer_strategy(graph, type(self).rule(graph, n), cluster.num_devices, self.mapping, algo=self.name)
        t0 = time.perf_counter()
        ev = evaluate(graph, strat, cluster, costs)
        info = {**ev, "search_complete": True, "evaluate_s": time.perf_counter() - t0}
        return Plan(graph, strat, info=info)


class ModelParallel(_Fixed):
    """Channel degree N on every layer."""

    graph_kind = "layer"
    rule = staticmethod(model_parallel_dims)

    def __init__(self, name: str = "model_parallel", seed: int = 0, devices: int | None = None, mapping: str = "linear") -> None:
        super().__init__(name, seed, devices, mapping)


class OWT(_Fixed):
    """Krizhevsky's one weird trick: DP for conv and pool, MP for fully-connected layers."""

    graph_kind = "layer"
    rule = staticmethod(owt_dims)

    def __init__(self, name: str = "owt", seed: int = 0, devices: int | None = None, mapping: str = "linear") -> None:
        super().__init__(name, seed, devices, mapping)


#: the baselines a budgeted search starts from or falls back on (those in its space): data parallelism and OWT
SEEDS = {"data_parallel": data_parallel_dims, "owt": owt_dims}
