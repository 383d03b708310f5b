"""OptCNN's t_X (Eq. 1): the time an edge's tensor takes between two layers' configurations,
for every pair of configurations at once.

The bytes of every consumer shard's input region (halos of convolutions and pools included,
:meth:`harness.core.layergraph.LayerGraph.in_region`) that no producer shard on its device
wrote are sent by the producer shards that wrote them, forward, and the matching gradients go
back, backward (:func:`harness.core.layer_shards.remote_elements`). Our reading of "the time to
transfer the input tensors ... using the size of the data to be moved and the known
communication bandwidth": the transfers of one edge run concurrently and each link of the
cluster carries its share, so a direction takes ``max over links (bytes on the link / its
bandwidth)`` plus the slowest route's latency. On OptCNN's device graph (a link per device
pair) this is the largest single transfer; where GPUs share a NIC it counts the contention.

At array speed: the bytes of every shard pair of every config pair are laid out by device pair
(under the linear mapping shard s runs on device s, so that is a transpose; otherwise one
``bincount``), and the link loads of all config pairs are one matrix product with the routes'
link incidence. Edges whose two grids, tensor geometry and item size are alike share one table.
Large builds (:data:`COMPILED_FROM`, :data:`COLD_FROM` shard pairs) run a compiled loop over
the shard pairs instead (:mod:`algorithms.layer_transfers_kernel`), which skips pairs that do
not overlap and touches only the links of the routes used: about 4x faster on 16 GPUs.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from harness.core.cluster import Cluster
from harness.core.compiled import use_compiled
from harness.core.layer_shards import (
    ShardGrid, edge_itemsize, in_boxes, out_boxes, overlap_elements, remote_elements, resident_rule,
)
from harness.core.layergraph import LayerGraph

#: shard pairs (elements of the [Cu, Su, Cv, Sv] byte array) per chunk of producer configs
CHUNK = 1 << 21
#: the distinct tables of a build take the compiled kernel from this many shard pairs in all
#: once it is loaded in the process, and from COLD_FROM when loading it (numba's start-up,
#: about 0.5 s) is part of the cost: numpy runs about 45M shard pairs/s here, the kernel 160M
COMPILED_FROM = 1 << 20
COLD_FROM = 1 << 25


class RouteIncidence:
    """Per device pair ``i * D + j``, the links its route crosses in both directions: ``w``
    [D * D, 2L] holds 1 / bandwidth of link l in column l where the forward route i -> j uses it
    and in column L + l where the backward route j -> i (the gradients of what went forward)
    does; ``lat_of`` [D * D, G] marks the pair's forward and backward route latency among the
    ``G`` distinct (direction, latency > 0) of ``lat``."""

    def __init__(self, cluster: Cluster) -> None:
        D, L = cluster.num_devices, len(cluster.links)
        self.num_links = L
        self.w = np.zeros((D * D, 2 * L))
        lat = np.asarray(cluster.route_lat, dtype=np.float64)
        groups: list[tuple[int, float]] = sorted({(k, float(x)) for k, m in enumerate((lat, lat.T)) for x in m.reshape(-1) if x > 0})
        self.lat = np.array([x for _, x in groups])
        self.backward_lat = np.array([k == 1 for k, _ in groups], dtype=bool)
        self.lat_of = np.zeros((D * D, len(groups)), dtype=np.float32)
        for i in range(D):
            for j in range(D):
                p = i * D + j
                for k, (a, b) in enumerate(((i, j), (j, i))):
                    for link in cluster.routes[a][b]:
                        self.w[p, k * L + int(link)] = 1.0 / cluster.links[link].bw
                    if lat[a, b] > 0:
                        self.lat_of[p, groups.index((k, float(lat[a, b])))] = 1.0

    def time(self, pair_bytes: np.ndarray, pairs: np.ndarray) -> np.ndarray:
        """Per row of ``pair_bytes`` [n, P] (the bytes of the device pairs ``pairs``), forward
        plus backward: the most loaded link's seconds plus the slowest latency among the routes
        that carry anything."""
        L = self.num_links
        n = len(pair_bytes)
        t = np.zeros(n)
        if L:
            loads = pair_bytes @ self.w[pairs]
            t = loads[:, :L].max(axis=1) + loads[:, L:].max(axis=1)
        if len(self.lat):
            used = np.where(((pair_bytes > 0).astype(np.float32) @ self.lat_of[pairs]) > 0, self.lat[None, :], 0.0)
            for mask in (~self.backward_lat, self.backward_lat):
                if mask.any():
                    t = t + used[:, mask].max(axis=1)
        return t


class TransferCosts:
    """t_X tables of one (layer graph, cluster), cached by what they are a function of."""

    def __init__(self, lg: LayerGraph, cluster: Cluster, compiled: bool | None = None) -> None:
        self.lg = lg
        self.num_devices = cluster.num_devices
        self.routes = RouteIncidence(cluster)
        #: the routes as the compiled kernel reads them: the cluster's padded link ids and route
        #: lengths per device pair, 1 / bandwidth per link, the route latencies
        self.route_arrays = (cluster.route_links, cluster.route_len, np.array([1.0 / link.bw for link in cluster.links]),
                             np.ascontiguousarray(cluster.route_lat, dtype=np.float64))
        #: None: the compiled kernel where it pays (:data:`COMPILED_FROM`, :data:`COLD_FROM`)
        self.compiled = compiled
        self.kernel_used = False
        self.cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.box_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    # ------------------------------------------------------------------ keys
    def producer_key(self, e: int, gu: ShardGrid) -> tuple:
        """What edge e's producer boxes are a function of: the grid's layout and the output
        port's axes, shape and the sizes of the dims they name (a shard's range of a dim is a
        function of its degree, coordinate and size)."""
        lg = self.lg
        u, sp = int(lg.src[e]), int(lg.src_port[e])
        if sp == 0:
            shape, axes = tuple(lg.out_shape[u]), tuple(lg.out_dims[u])
        else:
            o = lg.attrs[u]["outputs"][sp]
            shape, axes = tuple(o["shape"]), tuple(o["dims"])
        return ("out", gu.layout, sp, axes, shape, tuple(lg.dims[u].get(a) if a else None for a in axes))

    def consumer_key(self, e: int, gv: ShardGrid) -> tuple:
        """What edge e's consumer boxes are a function of: the grid's layout and the input
        port's axes, shape, named sizes, window and selection."""
        lg = self.lg
        v, dp = int(lg.dst[e]), int(lg.dst_port[e])
        axes = tuple(lg.in_dims[v][dp])
        attrs = lg.attrs[v]
        windows, select = attrs.get("windows"), attrs.get("select")
        win = windows[dp] if windows else {}
        sel = (tuple(select[dp]), lg.dims[v].get(select[dp][0])) if select and select[dp] is not None else None
        return ("in", gv.layout, dp, axes, tuple(lg.edge_shape(e)), tuple(lg.dims[v].get(a) if a else None for a in axes),
                tuple(sorted((k, tuple(w)) for k, w in win.items())), sel)

    def boxes(self, e: int, gu: ShardGrid, gv: ShardGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Producer output boxes and consumer input boxes of edge e, cached by their keys."""
        lg = self.lg
        pk, qk = self.producer_key(e, gu), self.consumer_key(e, gv)
        p = self.box_cache.get(pk) if gu.layout else None
        if p is None:
            p = out_boxes(lg, gu, int(lg.src_port[e]))
            if gu.layout:
                self.box_cache[pk] = p
        q = self.box_cache.get(qk) if gv.layout else None
        if q is None:
            q = in_boxes(lg, gv, int(lg.dst_port[e]))
            if gv.layout:
                self.box_cache[qk] = q
        return p[0], p[1], q[0], q[1]

    # ------------------------------------------------------------------ tables
    def tables(self, grids: Sequence[ShardGrid], progress: Callable[[int], Any] | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """t_X and the forward bytes of every edge of the graph (``[Cu, Cv]`` each), for the
        node grids ``grids``; ``progress(n)`` is told as n more edges are done. An edge from an
        input moves nothing. Edges with equal keys share one table; the distinct ones are
        computed in batches of equal shape."""
        lg = self.lg
        t_out: list[np.ndarray | None] = [None] * lg.num_edges
        b_out: list[np.ndarray | None] = [None] * lg.num_edges
        pending: dict[tuple, list[int]] = {}
        for e in range(lg.num_edges):
            gu, gv = grids[int(lg.src[e])], grids[int(lg.dst[e])]
            if lg.kinds[int(lg.src[e])] == "input":
                t_out[e], b_out[e] = np.zeros((gu.num_configs, gv.num_configs)), np.zeros((gu.num_configs, gv.num_configs))
                continue
            key = (self.producer_key(e, gu), self.consumer_key(e, gv), edge_itemsize(lg, e)) if gu.layout and gv.layout else ("edge", e)
            hit = self.cache.get(key)
            if hit is not None:
                t_out[e], b_out[e] = hit
            else:
                pending.setdefault(key, []).append(e)
        if progress is not None:
            progress(lg.num_edges - sum(len(es) for es in pending.values()))

        def store(key: tuple, res: tuple[np.ndarray, np.ndarray]) -> None:
            if key[0] != "edge":
                self.cache[key] = res
            for e in pending[key]:
                t_out[e], b_out[e] = res
            if progress is not None:
                progress(len(pending[key]))

        if self._use_kernel(pending, grids):
            self.kernel_used = True
            for key, es in pending.items():
                store(key, self.compute_compiled(es[0], grids[int(lg.src[es[0]])], grids[int(lg.dst[es[0]])]))
            return t_out, b_out  # type: ignore[return-value]
        alike: dict[tuple, list[tuple]] = {}
        for key, es in pending.items():
            gu, gv = grids[int(lg.src[es[0]])], grids[int(lg.dst[es[0]])]
            linear = _identity(gu.devices) and _identity(gv.devices)
            alike.setdefault((gu.num_configs, gu.smax, gv.num_configs, gv.smax, len(lg.edge_shape(es[0])), linear), []).append(key)
        for (Cu, Su, Cv, Sv, _, linear), keys in alike.items():
            per = max(1, CHUNK // max(1, Cu * Su * Cv * Sv)) if linear else 1
            for k0 in range(0, len(keys), per):
                batch = keys[k0:k0 + per]
                for key, res in zip(batch, self.compute([pending[k][0] for k in batch], grids, linear)):
                    store(key, res)
        return t_out, b_out  # type: ignore[return-value]

    def _use_kernel(self, pending: dict[tuple, list[int]], grids: Sequence[ShardGrid]) -> bool:
        """Whether this build's distinct tables take the compiled kernel (``compiled``, else by
        their shard pairs in all)."""
        if self.compiled is not None:
            return self.compiled
        lg = self.lg
        pairs = 0
        for es in pending.values():
            gu, gv = grids[int(lg.src[es[0]])], grids[int(lg.dst[es[0]])]
            pairs += gu.num_configs * gu.smax * gv.num_configs * gv.smax
        return use_compiled(pairs, COMPILED_FROM, COLD_FROM, kernel="algorithms.layer_transfers_kernel")

    def compute_compiled(self, e: int, gu: ShardGrid, gv: ShardGrid) -> tuple[np.ndarray, np.ndarray]:
        """t_X and forward bytes of one edge by the compiled kernel."""
        from algorithms.layer_transfers_kernel import edge_table

        def arr(x: np.ndarray, dtype: type) -> np.ndarray:  # one compiled signature: C-contiguous, writeable
            return np.require(x, dtype=dtype, requirements=["C", "W"])

        plo, phi, qlo, qhi = (arr(x, np.int64) for x in self.boxes(e, gu, gv))
        t = np.zeros((gu.num_configs, gv.num_configs))
        nb = np.zeros((gu.num_configs, gv.num_configs))
        edge_table(plo, phi, qlo, qhi, arr(gu.devices, np.int64), arr(gu.valid, np.bool_), arr(gu.group, np.int64),
                   arr(gu.first, np.bool_), arr(gv.devices, np.int64), arr(gv.valid, np.bool_), edge_itemsize(self.lg, e),
                   *self.route_arrays, t, nb)
        return t, nb

    def compute(self, edges: list[int], grids: Sequence[ShardGrid], linear: bool) -> list[tuple[np.ndarray, np.ndarray]]:
        """t_X and forward bytes of edges whose grids have one shape: stacked when shard s of
        every config runs on device s (``linear``), one at a time (in chunks of producer
        configs) otherwise or when one edge alone fills a chunk."""
        lg = self.lg
        gus = [grids[int(lg.src[e])] for e in edges]
        gvs = [grids[int(lg.dst[e])] for e in edges]
        Cu, Su, Cv, Sv = gus[0].num_configs, gus[0].smax, gvs[0].num_configs, gvs[0].smax
        if not linear or len(edges) == 1:
            return [self.compute_one(e, gu, gv, linear) for e, gu, gv in zip(edges, gus, gvs)]
        boxes = [self.boxes(e, gu, gv) for e, gu, gv in zip(edges, gus, gvs)]
        plo, phi, qlo, qhi = (np.stack([b[i] for b in boxes]) for i in range(4))
        ov = overlap_elements(plo, phi, qlo, qhi)
        st = {name: np.stack([getattr(g, name) for g in gus]) for name in ("devices", "valid", "group", "first")}
        T = resident_rule(ov, st["devices"], st["valid"], st["group"], st["first"],
                          np.stack([g.devices for g in gvs]), np.stack([g.valid for g in gvs]))
        T *= np.array([edge_itemsize(lg, e) for e in edges])[:, None, None, None, None]
        nb = T.sum(axis=(2, 4))
        pairs = (np.arange(Su)[:, None] * self.num_devices + np.arange(Sv)[None, :]).reshape(-1)
        pb = T.transpose(0, 1, 3, 2, 4).reshape(len(edges) * Cu * Cv, Su * Sv)
        t = self.routes.time(pb, pairs).reshape(len(edges), Cu, Cv)
        return [(t[i], nb[i]) for i in range(len(edges))]

    def compute_one(self, e: int, gu: ShardGrid, gv: ShardGrid, linear: bool) -> tuple[np.ndarray, np.ndarray]:
        """t_X and forward bytes of one edge, in chunks of producer configs."""
        plo, phi, qlo, qhi = self.boxes(e, gu, gv)
        item = edge_itemsize(self.lg, e)
        D = self.num_devices
        Cu, Cv, Su, Sv = gu.num_configs, gv.num_configs, gu.smax, gv.smax
        t = np.zeros((Cu, Cv))
        nb = np.zeros((Cu, Cv))
        block = max(1, CHUNK // max(1, Su * Cv * Sv))
        for c0 in range(0, Cu, block):
            sl = slice(c0, min(Cu, c0 + block))
            n = sl.stop - sl.start
            T = remote_elements(self.lg, e, gu, gv, ov=overlap_elements(plo[sl], phi[sl], qlo, qhi), cu_slice=sl)
            T *= item
            nb[sl] = T.sum(axis=(1, 3))
            # bytes per (config pair, device pair): under the linear mapping the shard pairs are
            # the device pairs, otherwise they are binned
            if linear:
                pairs = (np.arange(Su)[:, None] * D + np.arange(Sv)[None, :]).reshape(-1)
                pb = T.transpose(0, 2, 1, 3).reshape(n * Cv, Su * Sv)
            else:
                du, dv = gu.devices[sl], gv.devices
                pairs = np.arange(D * D)
                pair = np.where((du >= 0)[:, :, None, None] & (dv >= 0)[None, None], du[:, :, None, None] * D + dv[None, None], D * D)
                row = np.arange(n)[:, None, None, None] * Cv + np.arange(Cv)[None, None, :, None]
                flat = (row * (D * D + 1) + pair).reshape(-1)
                pb = np.bincount(flat, weights=T.reshape(-1), minlength=n * Cv * (D * D + 1)).reshape(n * Cv, D * D + 1)[:, : D * D]
            t[sl] = self.routes.time(pb, pairs).reshape(n, Cv)
        return t, nb

    def meta(self) -> dict[str, Any]:
        """What the tables record of the build: the distinct edge tables computed, and whether
        the compiled kernel computed them."""
        return {"edge_cache_entries": len(self.cache), "edge_tables_compiled": self.kernel_used}


def _identity(devices: np.ndarray) -> bool:
    """Whether shard s of every config runs on device s (-1 pads)."""
    s = np.arange(devices.shape[1])[None, :]
    return bool(((devices == s) | (devices < 0)).all())
