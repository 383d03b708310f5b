"""Cost tables of a layer graph over a configuration space: a node cost vector per layer and
an edge cost matrix per edge, filled once by the chosen cost model
(:func:`algorithms.layer_costs.layer_cost_model`) and searched by OptCNN, its DFS baseline,
PaSE, FlexFlow's MCMC and brute force.

Node cost vectors ``node_cost[v][c]`` and edge cost matrices ``edge_cost[e][c_u, c_v]`` are in
seconds: OptCNN's t_C + t_S (+ t_R) and t_X (Eq. 1) under ``costs=analytical``
(:mod:`algorithms.layer_optcnn_costs`), PaSE's t_V and t_E under ``costs=pase``
(:mod:`algorithms.layer_pase_costs`). The objective of a strategy is their sum.
"""

from __future__ import annotations

import itertools
import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from algorithms.layer_configs import ConfigSpaceError, SpaceOptions, enumerate_configs
from algorithms.layer_costs import layer_cost_model, resolve_options
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.errors import UserError
from harness.core.layer_shards import ShardGrid, make_grid, mapped_devices
from harness.core.layergraph import LayerGraph
from harness.core.strategy import ParallelConfig, Strategy


@dataclass(eq=False)
class LayerCostTables:
    """Node cost vectors and edge cost matrices of a layer graph over a config space.

    ``degrees[v]`` [C_v, len(dims[v])] lists node v's configurations and ``devices[v]``
    [C_v, Smax] their shards' devices; ``node_cost[v]`` [C_v] and ``edge_cost[e]`` [C_u, C_v]
    are seconds; ``parts`` splits node costs (t_C, t_S, t_R; or PaSE's t_V); ``edge_bytes[e]``
    is the forward bytes an edge moves (PaSE: its words x 8). The objective of a strategy
    (config index per node) is OptCNN's Eq. 1 / PaSE's t_V + t_E: :meth:`objective`.
    """

    lgraph: LayerGraph
    num_devices: int
    options: SpaceOptions
    model: str
    dims: list[tuple[str, ...]]
    degrees: list[np.ndarray]
    devices: list[np.ndarray]
    node_cost: list[np.ndarray]
    edge_cost: list[np.ndarray]
    edge_bytes: list[np.ndarray]
    parts: dict[str, list[np.ndarray]]
    build_seconds: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return len(self.node_cost)

    @property
    def num_configs(self) -> np.ndarray:
        return np.array([len(c) for c in self.node_cost], dtype=np.int64)

    def objective(self, idx: Sequence[int] | np.ndarray) -> float:
        """Eq. 1 (OptCNN) / t_V + t_E (PaSE) of the strategy choosing config ``idx[v]`` at v."""
        idx = np.asarray(idx, dtype=np.int64)
        lg = self.lgraph
        total = sum(float(self.node_cost[v][idx[v]]) for v in range(self.num_nodes))
        for e in range(lg.num_edges):
            total += float(self.edge_cost[e][idx[lg.src[e]], idx[lg.dst[e]]])
        return total

    def objectives(self, idx: np.ndarray) -> np.ndarray:
        """Objective of many strategies at once: ``idx`` [B, num_nodes]."""
        idx = np.asarray(idx, dtype=np.int64)
        lg = self.lgraph
        out = np.zeros(len(idx))
        for v in range(self.num_nodes):
            out += self.node_cost[v][idx[:, v]]
        for e in range(lg.num_edges):
            out += self.edge_cost[e][idx[:, lg.src[e]], idx[:, lg.dst[e]]]
        return out

    def moved_bytes(self, idx: Sequence[int] | np.ndarray) -> float:
        """Bytes the edges of the strategy ``idx`` move forward."""
        idx = np.asarray(idx, dtype=np.int64)
        lg = self.lgraph
        return float(sum(self.edge_bytes[e][idx[lg.src[e]], idx[lg.dst[e]]] for e in range(lg.num_edges)))

    def config(self, v: int, c: int) -> ParallelConfig:
        """Config c of node v (degree-1 dims dropped: the shard order is unchanged)."""
        deg = self.degrees[v][c]
        devs = self.devices[v][c]
        return ParallelConfig.make({d: int(x) for d, x in zip(self.dims[v], deg) if x > 1}, devs[devs >= 0].tolist())

    def strategy(self, idx: Sequence[int] | np.ndarray, **meta: Any) -> Strategy:
        """The :class:`Strategy` choosing config ``idx[v]`` at every node (shared configs deduplicated)."""
        idx = np.asarray(idx, dtype=np.int64)
        configs: list[ParallelConfig] = []
        ids: dict[ParallelConfig, int] = {}
        cid = np.zeros(self.num_nodes, dtype=np.int32)
        for v in range(self.num_nodes):
            cfg = self.config(v, int(idx[v]))
            if cfg not in ids:
                ids[cfg] = len(configs)
                configs.append(cfg)
            cid[v] = ids[cfg]
        n = self.num_nodes
        return Strategy(np.full(n, -1, dtype=np.int32), np.arange(n), cid, configs, dict(meta))

    def index_of(self, strategy: Strategy) -> np.ndarray:
        """Config index per node of ``strategy`` (inputs: their one config); raises
        :class:`ConfigSpaceError` naming the first layer whose config is outside the space."""
        out = np.zeros(self.num_nodes, dtype=np.int64)
        for v in range(self.num_nodes):
            if self.lgraph.kinds[v] == "input":
                continue
            cfg = strategy.config_of(v)
            if cfg is None:
                cfg = ParallelConfig.make({}, [int(strategy.device[v])])
            want = dict(cfg.dims)
            if any(d not in self.dims[v] for d, x in want.items() if x > 1):
                raise ConfigSpaceError(f"layer {self.lgraph.names[v]}: config {cfg} splits a dim outside its space {self.dims[v]}")
            row = np.array([want.get(d, 1) for d in self.dims[v]], dtype=np.int64)
            hits = np.flatnonzero((self.degrees[v] == row).all(axis=1)) if len(row) else np.array([0])
            hits = [c for c in hits.tolist() if tuple(self.devices[v][c][self.devices[v][c] >= 0].tolist()) == tuple(cfg.devices)]
            if not hits:
                raise ConfigSpaceError(f"layer {self.lgraph.names[v]}: config {cfg} is not in the {self.options.space} space "
                                       f"({self.options.product} {self.num_devices} devices, mapping {self.options.mapping})")
            out[v] = hits[0]
        return out

    def merged_edges(self) -> dict[tuple[int, int], np.ndarray]:
        """Edge matrices with parallel edges (one producer feeding two ports) summed: OptCNN's
        edge elimination (Eq. 3) applied once up front."""
        out: dict[tuple[int, int], np.ndarray] = {}
        lg = self.lgraph
        for e in range(lg.num_edges):
            k = (int(lg.src[e]), int(lg.dst[e]))
            out[k] = out[k] + self.edge_cost[e] if k in out else self.edge_cost[e].copy()
        return out

    def describe(self, idx: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """One row per layer: name, kind, config, node cost parts (for reports, Table 5)."""
        idx = np.asarray(idx, dtype=np.int64)
        rows = []
        for v in range(self.num_nodes):
            c = int(idx[v])
            row = {"layer": self.lgraph.names[v], "kind": self.lgraph.kinds[v],
                   "config": {d: int(x) for d, x in zip(self.dims[v], self.degrees[v][c])}}
            for k, arr in self.parts.items():
                row[k] = float(arr[v][c])
            rows.append(row)
        return rows


def build_tables(lg: LayerGraph, cluster: Cluster, costs: CostModel, options: SpaceOptions | None = None,
                 progress: bool = False) -> LayerCostTables:
    """Enumerate every node's configs and fill the node and edge cost tables (see the module docstring)."""
    t0 = time.perf_counter()
    opts = options or resolve_options(lg, costs)
    N = cluster.num_devices
    model = layer_cost_model(lg, cluster, costs)
    dims, degrees, devices, grids = [], [], [], []
    # layers alike in what the space sees share their configs, devices and shard grids
    config_memo: dict[tuple, tuple[tuple[str, ...], np.ndarray]] = {}
    device_memo: dict[bytes, np.ndarray] = {}
    grid_memo: dict[tuple, ShardGrid] = {}
    for v in range(lg.num_nodes):
        d, deg = enumerate_configs(lg, v, N, opts, config_memo)
        dkey = deg.tobytes() + str(deg.shape).encode()
        dev = device_memo.get(dkey)
        if dev is None:
            dev = device_memo[dkey] = mapped_devices(np.prod(deg, axis=1) if deg.shape[1] else np.ones(len(deg), dtype=np.int64),
                                                     N, opts.mapping)
        dims.append(d)
        degrees.append(deg)
        devices.append(dev)
        grids.append(make_grid(lg, v, d, deg, dev, grid_memo))
    parts: dict[str, list[np.ndarray]] = {}
    node_cost = []
    for p in model.node_costs(grids):
        for k, arr in p.items():
            parts.setdefault(k, []).append(arr)
        node_cost.append(sum(p.values()))
    if progress:
        from tqdm import tqdm

        with tqdm(total=lg.num_edges, desc=f"t_X tables ({lg.meta.get('model', '?')}, {N} devices)", unit="edge", leave=False) as bar:
            edge_cost, edge_bytes = model.edge_costs(grids, bar.update)
    else:
        edge_cost, edge_bytes = model.edge_costs(grids)
    return LayerCostTables(lg, N, opts, model.model, dims, degrees, devices, node_cost,
                           edge_cost, edge_bytes, parts, time.perf_counter() - t0, model.table_meta())


_TABLE_CACHE: "weakref.WeakKeyDictionary[LayerGraph, dict[tuple, LayerCostTables]]" = weakref.WeakKeyDictionary()


def cached_tables(lg: LayerGraph, cluster: Cluster, costs: CostModel, options: SpaceOptions, progress: bool = False) -> LayerCostTables:
    """:func:`build_tables`, memoised per (graph, cluster, cost model, options) object identity,
    so that experiments running several searches on one problem build its tables once."""
    per = _TABLE_CACHE.setdefault(lg, {})
    key = (id(cluster), id(costs), options)
    hit = per.get(key)
    if hit is None:
        hit = per[key] = build_tables(lg, cluster, costs, options, progress)
    return hit


def brute_force(tables: LayerCostTables, limit: int = 2_000_000) -> tuple[np.ndarray, float]:
    """Exhaustive minimum of the objective (for proofs on small graphs); refuses more than ``limit`` strategies."""
    sizes = tables.num_configs
    total = int(np.prod(sizes.astype(object)))
    if total > limit:
        raise ValueError(f"brute force over {total} strategies exceeds the limit {limit}")
    best, best_idx = math.inf, None
    chunk = 65536
    it = itertools.product(*(range(int(c)) for c in sizes))
    while True:
        block = list(itertools.islice(it, chunk))
        if not block:
            break
        idx = np.asarray(block, dtype=np.int64)
        obj = tables.objectives(idx)
        k = int(np.argmin(obj))
        if obj[k] < best:
            best, best_idx = float(obj[k]), idx[k]
    assert best_idx is not None
    return best_idx, best



def config_index(tables: LayerCostTables, v: int, degrees: dict[str, int]) -> int | None:
    """Index of node v's configuration with these degrees (others 1), None when the space lacks it."""
    want = np.array([int(degrees.get(d, 1)) for d in tables.dims[v]], dtype=np.int64)
    if any(int(x) > 1 for d, x in degrees.items() if d not in tables.dims[v]):
        return None
    hit = np.flatnonzero((tables.degrees[v] == want).all(axis=1)) if len(want) else np.array([0])
    return int(hit[0]) if len(hit) else None


def seed_strategies(tables: LayerCostTables, rules: dict[str, Any]) -> list[tuple[str, np.ndarray, float]]:
    """The baselines (``name -> rule(lgraph, n) -> degrees per node``) that lie in the tables'
    space, as ``(name, config index per node, objective)``, cheapest first: what a budgeted
    search starts from, so that its answer is never worse than the best of them."""
    out = []
    for name, rule in rules.items():
        try:
            dims = rule(tables.lgraph, tables.num_devices)
        except UserError:
            continue  # e.g. a batch smaller than the device count
        idx = [config_index(tables, v, d) for v, d in enumerate(dims)]
        if all(i is not None for i in idx):
            arr = np.asarray(idx, dtype=np.int64)
            out.append((name, arr, tables.objective(arr)))
    return sorted(out, key=lambda t: t[2])
