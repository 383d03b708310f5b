"""Configuration spaces and cost tables of a layer graph: what OptCNN, its DFS baseline, PaSE,
FlexFlow's MCMC and brute force all search, so that their optima are comparable like with like.

Configurations (OptCNN Sec. 4 and Table 1; PaSE Sec. 1)
-------------------------------------------------------
A configuration of a layer is a degree for each dim it may split; shard k (row-major over the
dims) runs on device k (``mapping: linear``) or spread over the cluster (``mapping: spread``).
Two spaces:

* ``space: optcnn``: the dims are the layer's ``parallel_dims`` (OptCNN Table 1: sample,
  channel, height, width, length; a GEMM's m, n and batch dims), any degree from 1 to the
  dim's size (equal partitioning, :func:`harness.layergraph.part`);
* ``space: pase``: PaSE's iteration domains (:func:`harness.pase_costs.pase_domain`: a GEMM's
  m, n and k, a convolution's batch, output and input channels and kernel, never its h and
  w), degrees that divide the dim's size d with ``d / degree >= cutoff``.

The degrees of a layer multiply to a divisor of the device count (``product: divides``, our
reading of OptCNN: configs use 1, 2, 4... of the devices) or to at most the device count
(``product: at_most``, PaSE). Inputs have one configuration: the data loader writes each
shard's input where it is needed, so an input costs nothing and moves nothing.

Costs (OptCNN Eq. 1 under ``costs=analytical``, PaSE's t_V + t_E under ``costs=pase``)
-----------------------------------------------------------------------------------------
Node cost vectors ``node_cost[v][c]`` and edge cost matrices ``edge_cost[e][c_u, c_v]``, in
seconds:

* t_C(v, c): the slowest shard's forward + backward time from the CostModel
  (:meth:`harness.costs.AnalyticalCostModel.layer_times`); a shard does the fraction of the
  iteration domain its ranges cover.
* t_S(v, c): parameter synchronisation after back propagation. Shards that cover the same
  part of the weights (they differ only in dims that do not index the weights: sample,
  height, width, length) hold replicas; each replica group synchronises its part of the
  parameters through a parameter server (OptCNN) or a ring all-reduce (``costs.sync``); the
  groups run concurrently, t_S is the slowest. A parameter shared by r layers (an unrolled
  RNN) counts 1/r at each.
* t_R(v, c): only for splits of reduction dims (PaSE's space under analytical costs): the
  all-reduce that completes the partial sums of each output part, forward.
* t_X(e, c_u, c_v): the bytes of every consumer shard's input region (halos of convolutions
  and pools included, :meth:`harness.layergraph.LayerGraph.in_region`) that no producer shard
  on its device wrote, sent by the producer shards that wrote them, forward, and the matching
  gradients back, backward. Our reading of "the time to transfer the input tensors ... using
  the size of the data to be moved and the known communication bandwidth": the transfers of
  one edge run concurrently and each link of the cluster carries its share, so a direction
  takes ``max over links (bytes on the link / its bandwidth)`` plus the slowest route's
  latency. On OptCNN's device graph (a link per device pair) this is the largest single
  transfer; where GPUs share a NIC it counts the contention.

Under ``costs=pase`` the same tables hold PaSE's t_V (node) and t_E (edge) of
:class:`harness.pase_costs.PaseCostModel`, in FLOPs divided by its peak FLOP/s.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from algorithms.base import Algorithm
from harness.cluster import Cluster
from harness.errors import UserError
from harness.layer_shards import (
    MAPPINGS,
    OUTPUT,
    REDUCTION,
    ShardGrid,
    edge_itemsize,
    in_boxes,
    make_grid,
    mapped_devices,
    out_boxes,
    overlap_elements,
    param_dim_names,
    remote_elements,
    strategy_rows,
    sync_bytes,
)
from harness.layergraph import LayerGraph
from harness.pase_costs import pase_domain
from harness.strategy import ParallelConfig, Strategy

SPACES = ("optcnn", "pase")
PRODUCTS = ("divides", "at_most")


class ConfigSpaceError(UserError, ValueError):
    """A layer has no valid configuration, or a strategy's config is outside the space."""


def is_pase(costs: Any) -> bool:
    """True for PaSE's FLOP cost model (``costs=pase``)."""
    return getattr(costs, "model", None) == "pase"


@dataclass(frozen=True)
class SpaceOptions:
    """Which configurations a search may choose from (see the module docstring)."""

    space: str = "optcnn"
    product: str = "divides"
    cutoff: int = 1
    mapping: str = "linear"

    def __post_init__(self) -> None:
        if self.space not in SPACES:
            raise ValueError(f"space must be one of {SPACES}, got {self.space!r}")
        if self.product not in PRODUCTS:
            raise ValueError(f"product must be one of {PRODUCTS}, got {self.product!r}")
        if self.mapping not in MAPPINGS:
            raise ValueError(f"mapping must be one of {MAPPINGS}, got {self.mapping!r}")
        if self.cutoff < 1:
            raise ValueError(f"cutoff must be >= 1, got {self.cutoff}")


def resolve_options(lg: LayerGraph, costs: Any, space: str | None = None, product: str | None = None,
                    cutoff: int | str | None = None, mapping: str | None = None) -> SpaceOptions:
    """Fill ``None`` options from the cost model: PaSE's space, product and cutoff under
    ``costs=pase``, OptCNN's (divisors, no cutoff) otherwise."""
    pase = is_pase(costs)
    space = space or ("pase" if pase else "optcnn")
    product = product or (getattr(costs, "product", "at_most") if pase else "divides")
    if cutoff in (None, "auto"):
        cutoff = costs.cutoff_for(lg) if pase else (4 if space == "pase" and any(k.startswith("conv") for k in lg.kinds) else 1)
    return SpaceOptions(space, product, int(cutoff), mapping or "linear")


def _divisors(n: int) -> list[int]:
    small = [i for i in range(1, int(math.isqrt(n)) + 1) if n % i == 0]
    return sorted(set(small + [n // i for i in small]))


def config_dims(lg: LayerGraph, v: int, opts: SpaceOptions) -> tuple[str, ...]:
    """The dims a configuration of node v assigns degrees to."""
    if lg.kinds[v] == "input":
        return ()
    return tuple(lg.parallel_dims[v]) if opts.space == "optcnn" else pase_domain(lg, v)


def enumerate_configs(lg: LayerGraph, v: int, num_devices: int, opts: SpaceOptions) -> tuple[tuple[str, ...], np.ndarray]:
    """Every configuration of node v: ``(dims, degrees [C, len(dims)])``, the all-ones config first."""
    dims = config_dims(lg, v, opts)
    N = int(num_devices)
    choices = []
    for d in dims:
        size = int(lg.dims[v][d])
        if opts.space == "optcnn":
            cand = range(1, min(size, N) + 1)
        else:
            cand = [e for e in _divisors(size) if e <= N and size // e >= opts.cutoff] or [1]
        if opts.product == "divides":
            cand = [e for e in cand if N % e == 0]
        choices.append(sorted(set(cand) | {1}))
    out: list[tuple[int, ...]] = []

    def rec(k: int, prod: int, acc: tuple[int, ...]) -> None:
        if k == len(dims):
            if prod <= N and (opts.product == "at_most" or N % prod == 0):
                out.append(acc)
            return
        for e in choices[k]:
            if prod * e > N:
                break
            rec(k + 1, prod * e, acc + (e,))

    rec(0, 1, ())
    deg = np.asarray(out, dtype=np.int64).reshape(len(out), len(dims))
    if len(deg) == 0:  # pragma: no cover - the all-ones config always fits
        raise ConfigSpaceError(f"layer {lg.names[v]} ({lg.kinds[v]}) has no valid configuration for {N} devices")
    return dims, deg


# ============================================================================ context
class _Links:
    """Link incidence of a cluster's routes, for the per-link load of a set of transfers."""

    def __init__(self, cluster: Cluster) -> None:
        D, L = cluster.num_devices, len(cluster.links)
        inc = np.zeros((D, D, L))
        inv_bw = np.array([1.0 / l.bw for l in cluster.links]) if L else np.zeros(0)
        for i in range(D):
            for j in range(D):
                for l in cluster.routes[i][j]:
                    inc[i, j, l] = inv_bw[l]
        self.w = inc
        self.lat = cluster.route_lat


@dataclass(eq=False)
class _Ctx:
    lg: LayerGraph
    cluster: Cluster
    costs: Any
    pase: bool
    links: _Links | None = None
    sync: np.ndarray | None = None
    edge_cache: dict[bytes, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    ar_cache: dict[tuple[float, tuple[int, ...]], float] = field(default_factory=dict)
    group_cache: dict[tuple, list[tuple[int, ...]]] = field(default_factory=dict)
    route_cache: dict[tuple, Any] = field(default_factory=dict)

    def allreduce(self, nbytes: float, devs: tuple[int, ...]) -> float:
        key = (nbytes, devs)
        t = self.ar_cache.get(key)
        if t is None:
            t = self.ar_cache[key] = float(self.costs.allreduce_time(nbytes, list(devs)))
        return t


def _make_ctx(lg: LayerGraph, cluster: Cluster, costs: Any) -> _Ctx:
    pase = is_pase(costs)
    ctx = _Ctx(lg, cluster, costs, pase)
    if not pase:
        ctx.links = _Links(cluster)
        ctx.sync = sync_bytes(lg)
    return ctx


# ============================================================================ node costs
def _node_costs(ctx: _Ctx, grid: ShardGrid) -> dict[str, np.ndarray]:
    """Cost parts of node ``grid.node`` for every config of the grid, in seconds."""
    lg, v = ctx.lg, grid.node
    C = grid.num_configs
    if ctx.pase:
        flops = ctx.costs.vertex_flops(lg, v, grid.dims, grid.degrees)
        return {"t_V": flops / ctx.costs.peak_flops}
    # t_C: the slowest shard's fraction of the domain (REPLICATED dims do the whole of it)
    sizes = np.array([lg.dims[v].get(d, 1) for d in grid.dims], dtype=np.float64)
    split = grid.roles != 2
    frac_s = np.prod(np.where(split[None, None, :], (grid.hi - grid.lo) / sizes[None, None, :], 1.0), axis=2) if len(sizes) else np.ones(grid.valid.shape)
    frac = np.where(grid.valid, frac_s, 0.0).max(axis=1)
    t_c = np.zeros(C)
    kinds: dict[str, int] = {}
    for d in range(ctx.cluster.num_devices):
        kinds.setdefault(ctx.cluster.devices[d].spec.kind, d)
    for kind, rep in kinds.items():
        f, b = ctx.costs.layer_times(lg, rep, frac, nodes=np.full(C, v))
        if len(kinds) == 1:
            t_c = f + b
        else:
            uses = np.array([any(ctx.cluster.devices[x].spec.kind == kind for x in row[row >= 0]) for row in grid.devices])
            t_c = np.maximum(t_c, np.where(uses, f + b, 0.0))
    # t_S: replica groups over the dims that do not index the weights
    t_s = np.zeros(C)
    sb = float(ctx.sync[v])
    pdims = param_dim_names(lg, v)
    if sb > 0:
        pk = [k for k, d in enumerate(grid.dims) if d in pdims]
        for c in range(C):
            s = int(grid.nshards[c])
            if s <= 1:
                continue
            P = int(np.prod(grid.degrees[c, pk])) if pk else 1
            if P == s:
                continue
            key = grid.lo[c, :s][:, pk] if pk else np.zeros((s, 0), dtype=np.int64)
            t_s[c] = _max_group_allreduce(ctx, key, grid.devices[c, :s], sb / P)
    # t_R: partial sums of a REDUCTION split, completed by an all-reduce per output part
    t_r = np.zeros(C)
    red = grid.roles == REDUCTION
    if red.any():
        outk = np.flatnonzero(grid.roles == OUTPUT)
        out_b = float(lg.out_bytes[v])
        osizes = sizes[outk]
        for c in np.flatnonzero((grid.degrees[:, red] > 1).any(axis=1)).tolist():
            s = int(grid.nshards[c])
            part_frac = float(np.prod(np.ceil(osizes / grid.degrees[c, outk]) / osizes)) if len(outk) else 1.0
            key = grid.lo[c, :s][:, outk]
            t_r[c] = _max_group_allreduce(ctx, key, grid.devices[c, :s], out_b * part_frac)
    return {"t_C": t_c, "t_S": t_s, "t_R": t_r}


def _max_group_allreduce(ctx: _Ctx, key: np.ndarray, devs: np.ndarray, nbytes: float) -> float:
    """Slowest all-reduce of ``nbytes`` among the groups of shards with equal ``key`` rows."""
    ck = (key.tobytes(), key.shape, devs.tobytes())
    groups = ctx.group_cache.get(ck)
    if groups is None:
        _, gid = np.unique(key, axis=0, return_inverse=True)
        gid = np.asarray(gid).reshape(-1)
        groups = [tuple(int(x) for x in devs[gid == g]) for g in range(int(gid.max()) + 1)]
        groups = ctx.group_cache[ck] = [g for g in groups if len(g) > 1]
    return max((ctx.allreduce(nbytes, g) for g in groups), default=0.0)


# ============================================================================ edge costs
def _route_matrices(ctx: _Ctx, du: tuple[int, ...], dv: tuple[int, ...]) -> tuple[Any, list[tuple[float, np.ndarray]], list[tuple[float, np.ndarray]]]:
    """For producer devices ``du`` and consumer devices ``dv``: the sparse [2L, |du| |dv|] matrix
    whose row l (l + L) holds 1 / bandwidth of link l for every pair whose forward (backward)
    route uses it, and the pairs of each distinct forward (backward) route latency."""
    key = (du, dv)
    hit = ctx.route_cache.get(key)
    if hit is not None:
        return hit
    import scipy.sparse as sp

    links = ctx.links
    L = links.w.shape[2]
    ia, ib = np.asarray(du), np.asarray(dv)
    wf = links.w[ia[:, None], ib[None, :]].reshape(-1, L)
    wb = links.w[ib[None, :], ia[:, None]].reshape(-1, L)
    wt = sp.csr_matrix(np.concatenate([wf, wb], axis=1).T)
    lat_f = links.lat[ia[:, None], ib[None, :]].reshape(-1)
    lat_b = links.lat[ib[None, :], ia[:, None]].reshape(-1)
    by_f = [(float(x), np.flatnonzero(lat_f == x)) for x in np.unique(lat_f) if x > 0]
    by_b = [(float(x), np.flatnonzero(lat_b == x)) for x in np.unique(lat_b) if x > 0]
    hit = ctx.route_cache[key] = (wt, by_f, by_b)
    return hit


def _transfer_time(ctx: _Ctx, T: np.ndarray, dev_u: np.ndarray, dev_v: np.ndarray) -> np.ndarray:
    """Forward + backward time of the transfers ``T`` [Cu, Su, Cv, Sv] (bytes), per config pair:
    per direction the most loaded link's bytes over its bandwidth, plus the slowest route's latency."""
    links = ctx.links
    Cu, Su, Cv, Sv = T.shape
    out = np.zeros((Cu, Cv))
    if not T.any():
        return out
    rows_u: dict[tuple[int, ...], list[int]] = {}
    for c in range(Cu):
        rows_u.setdefault(tuple(int(x) for x in dev_u[c] if x >= 0), []).append(c)
    rows_v: dict[tuple[int, ...], list[int]] = {}
    for c in range(Cv):
        rows_v.setdefault(tuple(int(x) for x in dev_v[c] if x >= 0), []).append(c)
    L = links.w.shape[2]
    for du, ru in rows_u.items():
        a = len(du)
        Tu = T[ru, :a]  # [nu, a, Cv, Sv]
        for dv, rv in rows_v.items():
            b = len(dv)
            # pairs (i, j) as rows, config pairs as columns
            x = Tu[:, :, rv, :b].transpose(1, 3, 0, 2).reshape(a * b, len(ru) * len(rv))
            if not x.any():
                continue
            wt, by_f, by_b = _route_matrices(ctx, du, dv)
            loads = wt @ x  # [2L, configs]
            t = loads[:L].max(axis=0) + loads[L:].max(axis=0) if L else np.zeros(x.shape[1])
            lf = np.zeros(x.shape[1])
            for lat, pairs in by_f:
                lf = np.maximum(lf, np.where(x[pairs].any(axis=0), lat, 0.0))
            lb = np.zeros(x.shape[1])
            for lat, pairs in by_b:
                lb = np.maximum(lb, np.where(x[pairs].any(axis=0), lat, 0.0))
            out[np.ix_(ru, rv)] = (t + lf + lb).reshape(len(ru), len(rv))
    return out


def _edge_costs(ctx: _Ctx, e: int, gu: ShardGrid, gv: ShardGrid) -> tuple[np.ndarray, np.ndarray]:
    """``(seconds, bytes moved forward)`` of edge e for every config pair: ``[Cu, Cv]`` each."""
    lg = ctx.lg
    u = int(lg.src[e])
    Cu, Cv = gu.num_configs, gv.num_configs
    if lg.kinds[u] == "input":
        return np.zeros((Cu, Cv)), np.zeros((Cu, Cv))
    if ctx.pase:
        fl = ctx.costs.edge_flops(lg, e, gu.dims, gu.degrees, gv.dims, gv.degrees)
        return fl / ctx.costs.peak_flops, fl / ctx.costs.r * 8.0
    plo, phi = out_boxes(lg, gu, int(lg.src_port[e]))
    qlo, qhi = in_boxes(lg, gv, int(lg.dst_port[e]))
    item = edge_itemsize(lg, e)
    h = hashlib.blake2b(digest_size=16)
    for arr in (plo, phi, qlo, qhi, gu.devices, gv.devices, gu.group, gu.first, np.array([item])):
        h.update(np.ascontiguousarray(arr).tobytes())
        h.update(str(arr.shape).encode())
    key = h.digest()
    hit = ctx.edge_cache.get(key)
    if hit is not None:
        return hit
    Su, Sv = gu.smax, gv.smax
    block = max(1, (1 << 22) // max(1, Su * Cv * Sv))
    t = np.zeros((Cu, Cv))
    nb = np.zeros((Cu, Cv))
    for c0 in range(0, Cu, block):
        sl = slice(c0, min(Cu, c0 + block))
        ov = overlap_elements(plo[sl], phi[sl], qlo, qhi)
        T = remote_elements(lg, e, gu, gv, ov=ov, cu_slice=sl) * item
        nb[sl] = T.sum(axis=(1, 3))
        t[sl] = _transfer_time(ctx, T, gu.devices[sl], gv.devices)
    ctx.edge_cache[key] = (t, nb)
    return t, nb


# ============================================================================ tables
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


def build_tables(lg: LayerGraph, cluster: Cluster, costs: Any, options: SpaceOptions | None = None,
                 progress: bool = False) -> LayerCostTables:
    """Enumerate every node's configs and fill the node and edge cost tables (see the module docstring)."""
    t0 = time.perf_counter()
    opts = options or resolve_options(lg, costs)
    N = cluster.num_devices
    ctx = _make_ctx(lg, cluster, costs)
    dims, degrees, devices, grids = [], [], [], []
    for v in range(lg.num_nodes):
        d, deg = enumerate_configs(lg, v, N, opts)
        dev = mapped_devices(np.prod(deg, axis=1) if deg.shape[1] else np.ones(len(deg), dtype=np.int64), N, opts.mapping)
        dims.append(d)
        degrees.append(deg)
        devices.append(dev)
        grids.append(make_grid(lg, v, d, deg, dev))
    parts: dict[str, list[np.ndarray]] = {}
    node_cost = []
    for v in range(lg.num_nodes):
        p = _node_costs(ctx, grids[v])
        for k, arr in p.items():
            parts.setdefault(k, []).append(arr)
        node_cost.append(sum(p.values()))
    edge_cost, edge_bytes = [], []
    eit: Iterable[int] = range(lg.num_edges)
    if progress:
        from tqdm import tqdm

        eit = tqdm(eit, desc=f"t_X tables ({lg.meta.get('model', '?')}, {N} devices)", unit="edge", leave=False)
    for e in eit:
        t, b = _edge_costs(ctx, e, grids[int(lg.src[e])], grids[int(lg.dst[e])])
        edge_cost.append(t)
        edge_bytes.append(b)
    return LayerCostTables(lg, N, opts, "pase" if ctx.pase else "analytical", dims, degrees, devices, node_cost,
                           edge_cost, edge_bytes, parts, time.perf_counter() - t0,
                           {"edge_cache_entries": len(ctx.edge_cache),
                            **({"peak_flops": costs.peak_flops, "r": costs.r} if ctx.pase else {})})


_TABLE_CACHE: "weakref.WeakKeyDictionary[LayerGraph, dict[tuple, LayerCostTables]]" = weakref.WeakKeyDictionary()


def cached_tables(lg: LayerGraph, cluster: Cluster, costs: Any, options: SpaceOptions, progress: bool = False) -> LayerCostTables:
    """:func:`build_tables`, memoised per (graph, cluster, cost model, options) object identity,
    so that experiments running several searches on one problem build its tables once."""
    per = _TABLE_CACHE.setdefault(lg, {})
    key = (id(cluster), id(costs), options)
    hit = per.get(key)
    if hit is None:
        hit = per[key] = build_tables(lg, cluster, costs, options, progress)
    return hit


# ============================================================================ evaluation
def evaluate(lg: LayerGraph, strategy: Strategy, cluster: Cluster, costs: Any) -> dict[str, Any]:
    """The strategy's own-objective evaluation (OptCNN Eq. 1 / PaSE t_V + t_E), with the same
    cost functions as the tables but for the strategy's explicit configs and devices (so a
    fixed strategy outside a search space, e.g. DP at a degree PaSE's cutoff forbids, is
    still evaluated). Returns ``objective_s``, the sums of each part and ``moved_bytes``."""
    strategy.validate(lg, cluster.num_devices)
    ctx = _make_ctx(lg, cluster, costs)
    dims, degs, devs = strategy_rows(lg, strategy, cluster.num_devices)
    grids = [make_grid(lg, v, dims[v], degs[v], devs[v]) for v in range(lg.num_nodes)]
    out: dict[str, Any] = {}
    total = 0.0
    for v in range(lg.num_nodes):
        for k, arr in _node_costs(ctx, grids[v]).items():
            out[k] = out.get(k, 0.0) + float(arr[0])
            total += float(arr[0])
    tx = 0.0
    moved = 0.0
    for e in range(lg.num_edges):
        t, b = _edge_costs(ctx, e, grids[int(lg.src[e])], grids[int(lg.dst[e])])
        tx += float(t[0, 0])
        moved += float(b[0, 0])
    out["t_E" if ctx.pase else "t_X"] = tx
    out["objective_s"] = total + tx
    out["moved_bytes"] = moved
    if ctx.pase:
        out["objective_flops"] = out["objective_s"] * costs.peak_flops
    return out


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


# ============================================================================ algorithms
class LayerSearch(Algorithm):
    """Base of the searches over a layer graph's configurations (``graph_kind = "layer"``).

    Parameters shared by every search (``None`` takes the cost model's default, see
    :func:`resolve_options`): ``space`` (optcnn | pase), ``product`` (divides | at_most),
    ``cutoff`` (PaSE's minimum per-processor size of a split dim), ``mapping`` (linear |
    spread: the device of shard k).
    """

    graph_kind = "layer"

    def __init__(self, name: str, space: str | None = None, product: str | None = None, cutoff: int | str | None = None,
                 mapping: str | None = None, progress: bool = False, **params: Any) -> None:
        super().__init__(name, space=space, product=product, cutoff=cutoff, mapping=mapping, **params)
        self.space, self.product, self.cutoff, self.mapping = space, product, cutoff, mapping
        self.progress = bool(progress)

    def options(self, lg: LayerGraph, costs: Any) -> SpaceOptions:
        return resolve_options(lg, costs, self.space, self.product, self.cutoff, self.mapping)

    def tables(self, lg: LayerGraph, cluster: Cluster, costs: Any) -> LayerCostTables:
        if not isinstance(lg, LayerGraph):
            raise TypeError(f"{self.name} searches a LayerGraph (graph_kind 'layer'), got {type(lg).__name__}")
        return cached_tables(lg, cluster, costs, self.options(lg, costs), self.progress)

    def info(self, tables: LayerCostTables, idx: np.ndarray, search_s: float, complete: bool, **extra: Any) -> dict[str, Any]:
        """``Plan.info``: the objective, completeness and what the search reports."""
        obj = tables.objective(idx)
        out = {
            "objective_s": obj,
            "search_complete": bool(complete),
            "search_s": search_s,
            "tables_s": tables.build_seconds,
            "cost_model": tables.model,
            "space": tables.options.space,
            "product": tables.options.product,
            "cutoff": tables.options.cutoff,
            "mapping": tables.options.mapping,
            "configs_total": int(tables.num_configs.sum()),
            "configs_max": int(tables.num_configs.max()),
            "moved_bytes_fwd": tables.moved_bytes(idx),
        }
        if tables.model == "pase":
            out["objective_flops"] = obj * float(tables.meta["peak_flops"])
        out.update(extra)
        return out
