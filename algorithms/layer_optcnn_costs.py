"""OptCNN's cost functions of a layer graph's configurations (OptCNN Eq. 1), computed with the
job's time cost model (``costs=analytical``, and every cost model but ``costs=pase``).

Node cost vectors and edge cost matrices, in seconds, for every configuration (pair) at once:

* t_C(v, c): the slowest shard's forward + backward time from the CostModel
  (:meth:`harness.core.costs.AnalyticalCostModel.layer_times`); a shard does the fraction of the
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
  and pools included, :meth:`harness.core.layergraph.LayerGraph.in_region`) that no producer shard
  on its device wrote, sent by the producer shards that wrote them, forward, and the matching
  gradients back, backward. Our reading of "the time to transfer the input tensors ... using
  the size of the data to be moved and the known communication bandwidth": the transfers of
  one edge run concurrently and each link of the cluster carries its share, so a direction
  takes ``max over links (bytes on the link / its bandwidth)`` plus the slowest route's
  latency. On OptCNN's device graph (a link per device pair) this is the largest single
  transfer; where GPUs share a NIC it counts the contention.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from algorithms.layer_configs import SpaceOptions
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.layer_shards import (
    OUTPUT,
    REDUCTION,
    REPLICATED,
    ShardGrid,
    edge_itemsize,
    in_boxes,
    out_boxes,
    overlap_elements,
    param_dim_names,
    remote_elements,
    sync_bytes,
)
from harness.core.layergraph import LayerGraph

#: (latency, indices of the device pairs whose route has it), one entry per distinct latency > 0
LatencyGroups = list[tuple[float, np.ndarray]]


class RouteLinks:
    """Link incidence of a cluster's routes, for the per-link load of a set of transfers:
    ``w[i, j, l]`` is 1 / bandwidth of link l when the route i -> j uses it (else 0), ``lat[i, j]``
    the route's latency."""

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


class OptCNNLayerCosts:
    """t_C + t_S (+ t_R) per node and t_X per edge of one (layer graph, cluster, cost model),
    with the caches that make the tables of one problem cheap to fill (see the module docstring)."""

    #: ``LayerCostTables.model``
    model = "analytical"
    #: the edge part's key in :func:`algorithms.layer_costs.evaluate`
    edge_part = "t_X"

    def __init__(self, lg: LayerGraph, cluster: Cluster, costs: CostModel) -> None:
        self.lg = lg
        self.cluster = cluster
        self.costs = costs
        self.links = RouteLinks(cluster)
        self.sync = sync_bytes(lg)
        self.edge_cache: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self.ar_cache: dict[tuple[float, tuple[int, ...]], float] = {}
        self.group_cache: dict[tuple, list[tuple[int, ...]]] = {}
        self.route_cache: dict[tuple, Any] = {}

    @classmethod
    def default_options(cls, lg: LayerGraph, costs: CostModel, space: str | None, product: str | None,
                        cutoff: int | str | None, mapping: str | None) -> SpaceOptions:
        """OptCNN's space (divisors, no cutoff); in PaSE's space, its CNN cutoff of 4."""
        space = space or "optcnn"
        product = product or "divides"
        if cutoff in (None, "auto"):
            cutoff = 4 if space == "pase" and any(k.startswith("conv") for k in lg.kinds) else 1
        return SpaceOptions(space, product, int(cutoff), mapping or "linear")

    def table_meta(self) -> dict[str, Any]:
        """What :class:`algorithms.layer_tables.LayerCostTables` records of the build."""
        return {"edge_cache_entries": len(self.edge_cache)}

    def objective_extras(self, objective_s: float) -> dict[str, Any]:
        """Nothing beyond seconds."""
        return {}

    # ------------------------------------------------------------------ node costs
    def allreduce(self, nbytes: float, devs: tuple[int, ...]) -> float:
        """The cost model's all-reduce of ``nbytes`` among ``devs``, memoised."""
        key = (nbytes, devs)
        t = self.ar_cache.get(key)
        if t is None:
            t = self.ar_cache[key] = float(self.costs.allreduce_time(nbytes, list(devs)))
        return t

    def node_costs(self, grid: ShardGrid) -> dict[str, np.ndarray]:
        """t_C, t_S and t_R of node ``grid.node`` for every config of the grid, in seconds."""
        lg, v = self.lg, grid.node
        C = grid.num_configs
        # t_C: the slowest shard's fraction of the domain (REPLICATED dims do the whole of it)
        sizes = np.array([lg.dims[v].get(d, 1) for d in grid.dims], dtype=np.float64)
        split = grid.roles != REPLICATED
        if len(sizes):
            frac_s = np.prod(np.where(split[None, None, :], (grid.hi - grid.lo) / sizes[None, None, :], 1.0), axis=2)
        else:
            frac_s = np.ones(grid.valid.shape)
        frac = np.where(grid.valid, frac_s, 0.0).max(axis=1)
        t_c = np.zeros(C)
        kinds: dict[str, int] = {}
        for d in range(self.cluster.num_devices):
            kinds.setdefault(self.cluster.devices[d].spec.kind, d)
        for kind, rep in kinds.items():
            f, b = self.costs.layer_times(lg, rep, frac, nodes=np.full(C, v))
            if len(kinds) == 1:
                t_c = f + b
            else:
                uses = np.array([any(self.cluster.devices[x].spec.kind == kind for x in row[row >= 0]) for row in grid.devices])
                t_c = np.maximum(t_c, np.where(uses, f + b, 0.0))
        # t_S: replica groups over the dims that do not index the weights
        t_s = np.zeros(C)
        sb = float(self.sync[v])
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
                t_s[c] = self.max_group_allreduce(key, grid.devices[c, :s], sb / P)
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
                t_r[c] = self.max_group_allreduce(key, grid.devices[c, :s], out_b * part_frac)
        return {"t_C": t_c, "t_S": t_s, "t_R": t_r}

    def max_group_allreduce(self, key: np.ndarray, devs: np.ndarray, nbytes: float) -> float:
        """Slowest all-reduce of ``nbytes`` among the groups of shards with equal ``key`` rows."""
        ck = (key.tobytes(), key.shape, devs.tobytes())
        groups = self.group_cache.get(ck)
        if groups is None:
            _, gid = np.unique(key, axis=0, return_inverse=True)
            gid = np.asarray(gid).reshape(-1)
            groups = [tuple(int(x) for x in devs[gid == g]) for g in range(int(gid.max()) + 1)]
            groups = self.group_cache[ck] = [g for g in groups if len(g) > 1]
        return max((self.allreduce(nbytes, g) for g in groups), default=0.0)

    # ------------------------------------------------------------------ edge costs
    def route_matrices(self, du: tuple[int, ...], dv: tuple[int, ...]) -> tuple[Any, LatencyGroups, LatencyGroups]:
        """For producer devices ``du`` and consumer devices ``dv``: the sparse [2L, |du| |dv|] matrix
        whose row l (l + L) holds 1 / bandwidth of link l for every pair whose forward (backward)
        route uses it, and the pairs of each distinct forward (backward) route latency."""
        key = (du, dv)
        hit = self.route_cache.get(key)
        if hit is not None:
            return hit
        import scipy.sparse as sp

        links = self.links
        L = links.w.shape[2]
        ia, ib = np.asarray(du), np.asarray(dv)
        wf = links.w[ia[:, None], ib[None, :]].reshape(-1, L)
        wb = links.w[ib[None, :], ia[:, None]].reshape(-1, L)
        wt = sp.csr_matrix(np.concatenate([wf, wb], axis=1).T)
        lat_f = links.lat[ia[:, None], ib[None, :]].reshape(-1)
        lat_b = links.lat[ib[None, :], ia[:, None]].reshape(-1)
        by_f = [(float(x), np.flatnonzero(lat_f == x)) for x in np.unique(lat_f) if x > 0]
        by_b = [(float(x), np.flatnonzero(lat_b == x)) for x in np.unique(lat_b) if x > 0]
        hit = self.route_cache[key] = (wt, by_f, by_b)
        return hit

    def transfer_time(self, T: np.ndarray, dev_u: np.ndarray, dev_v: np.ndarray) -> np.ndarray:
        """Forward + backward time of the transfers ``T`` [Cu, Su, Cv, Sv] (bytes), per config pair:
        per direction the most loaded link's bytes over its bandwidth, plus the slowest route's latency."""
        links = self.links
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
                wt, by_f, by_b = self.route_matrices(du, dv)
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

    def edge_costs(self, e: int, gu: ShardGrid, gv: ShardGrid) -> tuple[np.ndarray, np.ndarray]:
        """t_X of edge e for every config pair and the bytes it moves forward: ``[Cu, Cv]`` each.
        An edge from an input moves nothing."""
        lg = self.lg
        u = int(lg.src[e])
        Cu, Cv = gu.num_configs, gv.num_configs
        if lg.kinds[u] == "input":
            return np.zeros((Cu, Cv)), np.zeros((Cu, Cv))
        plo, phi = out_boxes(lg, gu, int(lg.src_port[e]))
        qlo, qhi = in_boxes(lg, gv, int(lg.dst_port[e]))
        item = edge_itemsize(lg, e)
        h = hashlib.blake2b(digest_size=16)
        for arr in (plo, phi, qlo, qhi, gu.devices, gv.devices, gu.group, gu.first, np.array([item])):
            h.update(np.ascontiguousarray(arr).tobytes())
            h.update(str(arr.shape).encode())
        key = h.digest()
        hit = self.edge_cache.get(key)
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
            t[sl] = self.transfer_time(T, gu.devices[sl], gv.devices)
        self.edge_cache[key] = (t, nb)
        return t, nb
