"""Expansion of a layer-graph strategy (OptCNN / PaSE configurations) into the engine's
:class:`~simulators.taskgraph.TaskGraph`, so :func:`simulators.engine.run` replays it unchanged.

One training step, per layer v and shard s of v's configuration (:mod:`harness.core.layer_shards`):

* **forward** compute task on the shard's device (the ``forward`` part of
  :meth:`~harness.core.costs.AnalyticalCostModel.layer_times` for the shard's fraction of the
  iteration domain), in topological order; where the configuration splits a reduction dim
  (a GEMM's k), the shards of each output part then all-reduce their partial sums
  (a COLLECTIVE);
* **transfers**: every consumer shard needs its input region (halos included); what no
  producer shard on its device wrote comes from the producer shard that wrote it (from the
  first replica when several wrote it), once per (producer shard, destination device) as in
  Baechi (the largest region any consumer there needs);
* **backward** compute task in reverse topological order: after the shard's own forward and
  the gradients of every consumer shard that read from it (local, or a gradient TRANSFER of
  the same overlap in the opposite direction: each replica of a replicated part gets it);
* **parameter synchronisation**: shards holding replicas of the same part of v's weights
  (a split along sample, height, width or length) all-reduce their gradients after their
  backward (ring or parameter server, ``costs.sync``), a COLLECTIVE per replica group;
* then nothing else (no optimizer tasks: the update is local).

On a cluster with ``host_comm`` (CPU ranks, cpu2) the transfers also cost the endpoints'
cores compute time, as in the operator-graph expansion (:mod:`simulators.hostcost`).

Inputs are written by the data loader where they are needed: they have no tasks and their
edges move nothing. Memory: a forward task allocates its output part, read by its consumers'
forward *and backward* tasks (activations live until their backward use), a backward task
its input and weight gradients, a transfer its received copy; parameters (1/r of a
parameter shared by r layers) are resident all step on every device holding a part.
"""

from __future__ import annotations


import numpy as np

from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import BACKWARD, FORWARD
from harness.core.layer_shards import (
    OUTPUT,
    REDUCTION,
    ShardGrid,
    box_volume,
    edge_itemsize,
    in_boxes,
    make_grid,
    out_boxes,
    overlap_elements,
    param_dim_names,
    strategy_rows,
    sync_bytes,
)
from harness.core.layergraph import LayerGraph
from harness.core.strategy import Strategy
from simulators.hostcost import Messages, host_cost
from simulators.taskgraph import COLLECTIVE, COMPUTE, TRANSFER, TaskGraph, csr, sorted_unique


class _Tasks:
    """Growable columns of the task table."""

    def __init__(self) -> None:
        self.kind: list[int] = []
        self.dev: list[int] = []
        self.dst: list[int] = []
        self.dur: list[float] = []
        self.prio: list[int] = []
        self.node: list[int] = []
        self.nbytes: list[int] = []
        self.wire: list[float] = []
        self.alloc_dev: list[int] = []
        self.alloc_bytes: list[int] = []
        self.phase: list[int] = []
        self.label: list[str] = []
        self.flops: list[float] = []
        self.links: list[list[int]] = []
        self.dep_src: list[int] = []
        self.dep_dst: list[int] = []
        self.use_task: list[int] = []
        self.use_buf: list[int] = []

    def add(self, kind: int, dev: int, dur: float, node: int, phase: int, label: str, *, dst: int = -1, prio: int = 0,
            nbytes: int = 0, wire: float = 0.0, alloc_dev: int = -1, alloc_bytes: int = 0, flops: float = 0.0,
            links: list[int] | None = None) -> int:
        t = len(self.kind)
        self.kind.append(kind)
        self.dev.append(dev)
        self.dst.append(dst)
        self.dur.append(float(dur))
        self.prio.append(int(prio))
        self.node.append(node)
        self.nbytes.append(int(nbytes))
        self.wire.append(float(wire))
        self.alloc_dev.append(alloc_dev)
        self.alloc_bytes.append(int(alloc_bytes))
        self.phase.append(phase)
        self.label.append(label)
        self.flops.append(float(flops))
        self.links.append(links or [])
        return t

    def dep(self, a: int, b: int) -> None:
        self.dep_src.append(a)
        self.dep_dst.append(b)

    def use(self, task: int, buf: int) -> None:
        self.use_task.append(task)
        self.use_buf.append(buf)


def _collective_links(cluster: Cluster, devs: tuple[int, ...], sync: str) -> list[int]:
    """Links a collective holds: every hop of the ring, or every worker's route to and from the PS."""
    p = len(devs)
    if sync == "ps":
        ps = devs[0]
        return sorted({l for w in devs[1:] for l in (*cluster.routes[w][ps], *cluster.routes[ps][w])})
    return sorted({l for k in range(p) for l in cluster.routes[devs[k]][devs[(k + 1) % p]]})


def _groups(grid: ShardGrid, dims_mask: np.ndarray) -> list[list[int]]:
    """Shards of the grid's config grouped by equal coordinates on the dims in ``dims_mask``."""
    s = int(grid.nshards[0])
    key = grid.lo[0, :s][:, dims_mask]
    _, gid = np.unique(key, axis=0, return_inverse=True)
    gid = np.asarray(gid).reshape(-1)
    return [np.flatnonzero(gid == g).tolist() for g in range(int(gid.max()) + 1)]


def build_layer_taskgraph(lg: LayerGraph, strategy: Strategy, cluster: Cluster, costs: CostModel) -> TaskGraph:
    """Expand a validated layer-graph strategy into the engine's task graph (see the module docstring)."""
    n = lg.num_nodes
    D = cluster.num_devices
    sync = costs.sync
    dims, degs, devs = strategy_rows(lg, strategy, D)
    grids = [make_grid(lg, v, dims[v], degs[v], devs[v]) for v in range(n)]
    share = sync_bytes(lg)
    order = np.asarray(strategy.order, dtype=np.int64)
    top = int(order.max()) + 1 if n else 1
    tk = _Tasks()
    fwd: list[list[int]] = [[] for _ in range(n)]      # forward task per shard
    src_of: list[list[int]] = [[] for _ in range(n)]   # task a consumer of the shard waits for
    bwd: list[list[int]] = [[] for _ in range(n)]
    static = np.zeros(D)
    kinds_rep: dict[str, int] = {}
    for d in range(D):
        kinds_rep.setdefault(cluster.devices[d].spec.kind, d)
    is_input = [k == "input" for k in lg.kinds]

    # ---- forward compute (and reduction collectives)
    for v in range(n):
        if is_input[v]:
            continue
        g = grids[v]
        s_n = int(g.nshards[0])
        sd = g.devices[0, :s_n]
        sizes = np.array([lg.dims[v].get(x, 1) for x in g.dims], dtype=np.float64)
        split = g.roles != 2
        frac = np.prod(np.where(split[None, :], (g.hi[0, :s_n] - g.lo[0, :s_n]) / sizes[None, :], 1.0), axis=1) if len(sizes) else np.ones(s_n)
        tf = np.zeros(s_n)
        tb = np.zeros(s_n)
        for kind, rep in kinds_rep.items():
            sel = np.array([cluster.devices[int(x)].spec.kind == kind for x in sd])
            if sel.any():
                f, b = costs.layer_times(lg, rep, frac[sel], nodes=np.full(int(sel.sum()), v))
                tf[sel], tb[sel] = f, b
        outk = g.roles == OUTPUT
        osz = sizes[outk]
        out_frac = np.prod((g.hi[0, :s_n][:, outk] - g.lo[0, :s_n][:, outk]) / osz[None, :], axis=1) if outk.any() else np.ones(s_n)
        out_mem = 0 if lg.kinds[v] == "view" else 1
        pdims = param_dim_names(lg, v)
        pmask = np.array([x in pdims for x in g.dims], dtype=bool)
        P = int(np.prod(g.degrees[0][pmask])) if pmask.any() else 1
        for s in range(s_n):
            d = int(sd[s])
            fwd[v].append(tk.add(COMPUTE, d, tf[s], v, FORWARD, lg.names[v], prio=int(order[v]),
                                 alloc_dev=d if out_mem else -1, alloc_bytes=int(lg.out_bytes[v] * out_frac[s]) * out_mem,
                                 flops=float(lg.flops_fwd[v]) * frac[s]))
            static[d] += share[v] / P
        src_of[v] = list(fwd[v])
        red = g.roles == REDUCTION
        if red.any() and (g.degrees[0][red] > 1).any():
            for members in _groups(g, outk):
                if len(members) < 2:
                    continue
                mdevs = tuple(int(sd[s]) for s in members)
                nb = float(lg.out_bytes[v] * out_frac[members[0]])
                c = tk.add(COLLECTIVE, -1, costs.allreduce_time(nb, list(mdevs)), v, FORWARD, f"reduce {lg.names[v]}",
                           nbytes=int(nb), wire=2.0 * (len(mdevs) - 1) * nb, links=_collective_links(cluster, mdevs, sync))
                for s in members:
                    tk.dep(fwd[v][s], c)
                    tk.use(c, fwd[v][s])
                    src_of[v][s] = c
        # backward compute: allocates the shard's input gradients and weight gradient
        for s in range(s_n):
            d = int(sd[s])
            ig = 0.0
            for p in range(len(lg.in_dims[v])):
                e = int(lg.in_edges(v)[p])
                if is_input[int(lg.src[e])]:
                    continue
                qlo, qhi = in_boxes(lg, g, p)
                ig += float(box_volume(qlo[0, s], qhi[0, s])) * edge_itemsize(lg, e)
            b = tk.add(COMPUTE, d, tb[s], v, BACKWARD, lg.names[v], prio=2 * top - 1 - int(order[v]),
                       alloc_dev=d, alloc_bytes=int(ig + share[v] / P), flops=float(lg.flops_bwd[v]) * frac[s])
            bwd[v].append(b)
            tk.dep(fwd[v][s], b)
            tk.use(b, fwd[v][s])
        # parameter synchronisation among the replicas of each part of the weights
        if share[v] > 0 and s_n > P:
            for members in _groups(g, pmask):
                if len(members) < 2:
                    continue
                mdevs = tuple(int(sd[s]) for s in members)
                nb = float(share[v] / P)
                c = tk.add(COLLECTIVE, -1, costs.allreduce_time(nb, list(mdevs)), v, BACKWARD, f"sync {lg.names[v]}",
                           nbytes=int(nb), wire=2.0 * (len(mdevs) - 1) * nb, links=_collective_links(cluster, mdevs, sync))
                for s in members:
                    tk.dep(bwd[v][s], c)
                    tk.use(c, bwd[v][s])

    # ---- edges: activations forward, gradients backward
    lat, bw = cluster.route_lat, cluster.route_bw
    cache: dict[tuple[int, int], int] = {}
    for e in range(lg.num_edges):
        u, v = int(lg.src[e]), int(lg.dst[e])
        if is_input[u]:
            continue
        gu, gv = grids[u], grids[v]
        plo, phi = out_boxes(lg, gu, int(lg.src_port[e]))
        qlo, qhi = in_boxes(lg, gv, int(lg.dst_port[e]))
        ov = overlap_elements(plo, phi, qlo, qhi)[0, : int(gu.nshards[0]), 0, : int(gv.nshards[0])]
        item = edge_itemsize(lg, e)
        du = gu.devices[0, : ov.shape[0]]
        dv = gv.devices[0, : ov.shape[1]]
        first = gu.first[0, : ov.shape[0]]
        group = gu.group[0, : ov.shape[0]]
        for j in range(ov.shape[1]):
            need = np.flatnonzero(ov[:, j] > 0)
            if not len(need):
                continue
            dj = int(dv[j])
            local_groups = {int(group[i]) for i in need if du[i] == dj}
            for i in need.tolist():
                gi = int(group[i])
                if du[i] == dj:
                    tk.dep(src_of[u][i], fwd[v][j])
                    tk.use(fwd[v][j], fwd[u][i])
                    tk.use(bwd[v][j], fwd[u][i])
                elif gi not in local_groups and first[i]:
                    nb = float(ov[i, j]) * item
                    key = (src_of[u][i], dj)
                    t = cache.get(key)
                    di = int(du[i])
                    if t is None:
                        t = tk.add(TRANSFER, di, 0.0, u, FORWARD, f"transfer {lg.names[u]}", dst=dj, alloc_dev=dj,
                                   links=list(cluster.routes[di][dj]))
                        cache[key] = t
                        tk.dep(src_of[u][i], t)
                        tk.use(t, fwd[u][i])
                    if nb > tk.nbytes[t]:
                        tk.nbytes[t] = int(nb)
                        tk.wire[t] = float(int(nb))
                        tk.alloc_bytes[t] = int(nb)
                        tk.dur[t] = float(lat[di, dj] + nb / bw[di, dj])
                    tk.dep(t, fwd[v][j])
                    tk.use(fwd[v][j], t)
                    tk.use(bwd[v][j], t)
                # the gradient of the overlap goes back to every producer shard that wrote it
                if du[i] == dj:
                    tk.dep(bwd[v][j], bwd[u][i])
                    tk.use(bwd[u][i], bwd[v][j])
                else:
                    nb = float(ov[i, j]) * item
                    di = int(du[i])
                    t = tk.add(TRANSFER, dj, float(lat[dj, di] + nb / bw[dj, di]), u, BACKWARD, f"gradient {lg.names[u]}",
                               dst=di, nbytes=int(nb), wire=float(int(nb)), alloc_dev=di, alloc_bytes=int(nb),
                               links=list(cluster.routes[dj][di]))
                    tk.dep(bwd[v][j], t)
                    tk.use(t, bwd[v][j])
                    tk.dep(t, bwd[u][i])
                    tk.use(bwd[u][i], t)

    # ---- assemble
    T = len(tk.kind)
    dep = np.asarray(tk.dep_src, dtype=np.int64) * T + np.asarray(tk.dep_dst, dtype=np.int64) if tk.dep_src else np.zeros(0, np.int64)
    dep = sorted_unique(dep) if len(dep) else dep
    dsrc, ddst = dep // max(T, 1), dep % max(T, 1)
    succ_ptr, succ_idx = csr(T, dsrc, ddst)
    indeg = np.bincount(ddst, minlength=T)
    alloc_dev = np.asarray(tk.alloc_dev, dtype=np.int64)
    up = np.asarray(tk.use_task, dtype=np.int64) * T + np.asarray(tk.use_buf, dtype=np.int64) if tk.use_task else np.zeros(0, np.int64)
    up = sorted_unique(up) if len(up) else up
    ut, ub = up // max(T, 1), up % max(T, 1)
    keep = alloc_dev[ub] >= 0 if len(ub) else np.zeros(0, bool)
    use_ptr, use_idx = csr(T, ut[keep], ub[keep])
    res_len = np.array([len(x) for x in tk.links], dtype=np.int64)
    res_ptr = np.zeros(T + 1, dtype=np.int64)
    np.cumsum(res_len, out=res_ptr[1:])
    res_idx = np.asarray([l for x in tk.links for l in x], dtype=np.int64)
    kind = np.asarray(tk.kind, dtype=np.int8)
    dev = np.asarray(tk.dev, dtype=np.int64)
    prio = np.asarray(tk.prio, dtype=np.int64)
    # what the transfers cost the endpoints' cores on CPU ranks (simulators.hostcost)
    compute = kind == COMPUTE
    msgs = Messages.of(compute, np.where(compute, dev, -1), prio, np.asarray(tk.dur, dtype=np.float64),
                       np.asarray(tk.nbytes, dtype=np.int64), dsrc, ddst, kind == TRANSFER)
    dur, steal = host_cost(cluster).charge(msgs)
    return TaskGraph(
        kind=kind, dev=dev, dst=np.asarray(tk.dst, dtype=np.int64), dur=dur, prio=prio,
        node=np.asarray(tk.node, dtype=np.int64), param=np.full(T, -1, dtype=np.int64),
        nbytes=np.asarray(tk.nbytes, dtype=np.int64), res_ptr=res_ptr, res_idx=res_idx,
        succ_ptr=succ_ptr, succ_idx=succ_idx, indeg=indeg, alloc_dev=alloc_dev,
        alloc_bytes=np.asarray(tk.alloc_bytes, dtype=np.int64), use_ptr=use_ptr, use_idx=use_idx,
        static_mem=static.astype(np.int64), num_shards=int((kind == COMPUTE).sum()),
        wire_bytes=np.asarray(tk.wire, dtype=np.float64),
        meta={"graph": "layer", "flops": np.asarray(tk.flops, dtype=np.float64)},
        phase=np.asarray(tk.phase, dtype=np.int8), label=tk.label, steal=steal,
    )
