"""Shared pieces of the memory-aware placers of the Celeritas comparison (Celeritas,
Order-Place, DFS-TOPO, Baechi's m-ETF and m-SCT, Metis, HRL).

Nothing here is specific to one algorithm: depth-first topological orders (Celeritas
Sec. 4.2.2 DFS-TOPO; Alg. 1's CPD_Topo is the same walk with a critical-path key),
the split of each node's memory into a persistent part (parameters it owns) and a
transient part (its output), co-location bookkeeping ("co-location groups follow their
first member", Celeritas Sec. 6.1, as in Baechi), a sequential memory fill (Celeritas
Sec. 4.2.1 step 2 and Order-Place), the ETF / SCT list-scheduling engine with memory
(Baechi's m-ETF and m-SCT), and the CCR of Celeritas Eq. 1.

Memory model (what "respects device memory" means for the placers):

* ``costs.memory(graph)[v]`` is what node ``v`` adds to its device (output plus the
  parameters it is the first to read); ``cluster.mem_capacity`` is each device's budget.
* *Static* accounting (Celeritas Alg. 2's ``Ava_m``, DFS-TOPO, Order-Place, Baechi's
  m-TOPO) sums ``costs.memory`` over everything placed on a device and never frees.
  It over-estimates the simulator's peak (which follows liveness), so these placers
  may run out of "static" memory on a model whose step fits; they then fall back to the
  device with the most free memory (Celeritas's best-effort rule) and say how often.
* *Liveness* accounting (Baechi's m-ETF / m-SCT): a node's output is allocated when it
  is scheduled and freed once every consumer of the buffer has been scheduled; views
  pass their input's buffer on (as in the simulator); parameters stay resident.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.cluster import Cluster
from harness.costs import CostModel
from harness.graph import OpGraph


# ---------------------------------------------------------------------------- orders
def dfs_topo_order(graph: OpGraph, key: np.ndarray | None = None) -> np.ndarray:
    """A depth-first topological order (Celeritas Sec. 4.2.2 DFS-TOPO, Alg. 1 CPD_Topo).

    A stack ``Q`` holds the 0-indegree nodes; its head is popped and output, its out-edges
    are deleted, and its children that reach indegree 0 are pushed on the head in
    increasing ``key`` order, so the child with the largest key is output next.  The
    initial sources are sorted by decreasing key (largest at the head).  ``key=None`` is
    plain DFS-TOPO: a smaller node id is preferred.  Ties in ``key`` go to the smaller id.
    Returns the sequence of node ids (position i holds the i-th node output).
    """
    n = graph.num_nodes
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    ids = np.arange(n)
    # rank: a total order where a larger rank is preferred (key, then smaller id)
    by = np.lexsort((-ids, np.zeros(n) if key is None else np.asarray(key, dtype=np.float64)))
    if key is None:
        by = ids[::-1]
    rank = np.empty(n, dtype=np.int64)
    rank[by] = ids
    src, dst = graph.src.astype(np.int64), graph.dst.astype(np.int64)
    # successors of every node, sorted by increasing rank of the child
    e = np.lexsort((rank[dst], src))
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    succ_l = dst[e].tolist()
    ptr_l = ptr.tolist()
    indeg = np.bincount(dst, minlength=n).tolist()
    sources = np.flatnonzero(np.bincount(dst, minlength=n) == 0)
    stack = sources[np.argsort(rank[sources], kind="stable")].tolist()  # head = end of list
    out: list[int] = []
    while stack:
        v = stack.pop()
        out.append(v)
        for i in range(ptr_l[v], ptr_l[v + 1]):
            w = succ_l[i]
            indeg[w] -= 1
            if indeg[w] == 0:
                stack.append(w)
    if len(out) != n:  # pragma: no cover - OpGraph guarantees a DAG
        raise ValueError(f"graph {graph.meta.get('model', '?')} is not a DAG: DFS-TOPO output {len(out)} of {n} nodes")
    return np.asarray(out, dtype=np.int64)


def positions(seq: np.ndarray) -> np.ndarray:
    """Inverse of a sequence of node ids: ``pos[seq[i]] = i``."""
    pos = np.empty(len(seq), dtype=np.int64)
    pos[seq] = np.arange(len(seq))
    return pos


# ---------------------------------------------------------------------------- memory
def persistent_memory(graph: OpGraph) -> np.ndarray:
    """Bytes of parameters each node is the first (in node order) to read: the part of
    ``costs.memory`` that stays resident for the whole step."""
    out = np.zeros(graph.num_nodes, dtype=np.int64)
    counts = np.diff(graph.param_ptr)
    if counts.sum() == 0:
        return out
    owners = np.repeat(np.arange(graph.num_nodes), counts)
    first = np.full(len(graph.param_bytes), -1, dtype=np.int64)
    first[graph.param_idx[::-1]] = owners[::-1]
    has = first >= 0
    np.add.at(out, first[has], graph.param_bytes[has])
    return out


def memory_split(graph: OpGraph, costs: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """(total, persistent) bytes per node: ``costs.memory`` and its parameter part; the
    transient part (the output) is ``total - persistent``."""
    total = np.asarray(costs.memory(graph), dtype=np.float64)
    pers = np.minimum(persistent_memory(graph).astype(np.float64), total)
    return total, pers


def most_free_device(free: np.ndarray) -> int:
    """Celeritas's best-effort rule (Sec. 5.2, Alg. 2 line 20): the device with the lowest
    memory usage, read as the most free memory (the same on a homogeneous cluster; Alg. 2
    prints ``argmin Ava_m``, which would pick the fullest device and contradicts the text)."""
    return int(np.argmax(free))


class Colocation:
    """Co-location groups follow their first member (Celeritas Sec. 6.1, as in Baechi):
    the first member an algorithm places pins its group's device."""

    __slots__ = ("group", "group_dev")

    def __init__(self, graph: OpGraph) -> None:
        self.group = graph.coloc.astype(np.int64)
        ng = int(self.group.max(initial=-1)) + 1
        self.group_dev = np.full(ng, -1, dtype=np.int64)

    def pinned(self, v: int) -> int:
        """The device v must go to (its group's), or -1 if it is free to go anywhere."""
        g = self.group[v]
        return int(self.group_dev[g]) if g >= 0 else -1

    def place(self, v: int, d: int) -> int:
        """Place v: returns its device (the group's, if pinned) and pins its group."""
        g = self.group[v]
        if g < 0:
            return d
        if self.group_dev[g] < 0:
            self.group_dev[g] = d
        return int(self.group_dev[g])

    def pinned_array(self) -> np.ndarray:
        """Device of each node's group (-1 where unpinned or not in a group)."""
        return np.where(self.group >= 0, self.group_dev[np.maximum(self.group, 0)], -1) if len(self.group_dev) else np.full(len(self.group), -1)


def sequential_fill(graph: OpGraph, seq: np.ndarray, mem: np.ndarray, capacity: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """Place nodes in the order ``seq`` on device 0 until its memory is full, then on the
    next device, and so on (Celeritas Sec. 4.2.1 step 2 with DFS-TOPO; Order-Place on the
    coarse graph).  Static accounting: ``mem`` is summed and never freed.  A node that fits
    on no later device goes to the device with the most free memory (best effort).
    Co-location groups follow their first member; their memory is charged to the group's
    device.  Returns (device per node, info)."""
    n, D = graph.num_nodes, len(capacity)
    free = capacity.astype(np.float64).copy()
    dev = np.full(n, -1, dtype=np.int64)
    col = Colocation(graph)
    d = 0
    fallback = 0
    for v in seq.tolist():
        p = col.pinned(v)
        if p >= 0:
            dev[v] = p
            free[p] -= mem[v]
            continue
        need = mem[v]
        while d < D and free[d] < need:
            d += 1
        if d < D:
            tgt = d
        else:
            tgt = most_free_device(free)
            fallback += 1
            d = D  # exhausted: later nodes go to the most free device (where they fit, if anywhere)
        dev[v] = col.place(v, tgt)
        free[dev[v]] -= need
    return dev, {"fallback_nodes": fallback, "static_free_bytes": free.tolist()}


# ---------------------------------------------------------------------------- costs
def ccr(w: np.ndarray, c: np.ndarray) -> float:
    """Communication-to-computation ratio, Celeritas Eq. 1: sum of c_ij over sum of w_i."""
    tw = float(np.sum(w))
    return float(np.sum(c)) / tw if tw > 0 else 0.0


def transfer_terms(cluster: Cluster) -> tuple[float, float]:
    """(mean latency, mean 1/bandwidth) over ordered pairs of distinct devices: the c_ij
    of :func:`algorithms.listsched.static_costs`, split so that merged tensors can be costed."""
    D = cluster.num_devices
    if D < 2:
        return 0.0, 0.0
    off = ~np.eye(D, dtype=bool)
    return float(cluster.route_lat[off].mean()), float((1.0 / cluster.route_bw[off]).mean())


# ---------------------------------------------------------------------------- ETF / SCT engine
def buffer_roots(graph: OpGraph) -> np.ndarray:
    """For every node, the node whose output buffer it really is: a free node (view,
    getitem, detach) passes its first input's buffer on, as in the simulator."""
    n = graph.num_nodes
    root = np.arange(n, dtype=np.int64)
    ptr, pred, _ = graph.pred_csr()
    free = graph.free
    for v in range(n):
        if free[v] and ptr[v + 1] > ptr[v]:
            root[v] = root[pred[ptr[v]]]
    return root


def etf_schedule(
    graph: OpGraph,
    cluster: Cluster,
    w: np.ndarray,
    c: np.ndarray,
    mem: np.ndarray,
    persistent: np.ndarray,
    rank: np.ndarray,
    favourite: np.ndarray | None = None,
) -> dict[str, Any]:
    """Memory-constrained earliest-time-first list scheduling (Baechi's m-ETF), and with
    ``favourite`` Baechi's m-SCT (Hanen and Munier's small-communication-time rule).

    ETF (Hwang et al. 1989): repeatedly take, over all pairs of a ready op and a device,
    the pair with the earliest start ``max(data ready time on the device, device free)``;
    ties go to the op with the smaller ``rank`` (Baechi: its topological order), then the
    smaller device id.  A device runs one op at a time, with no insertion into idle gaps.
    The data ready time of op v on device d is ``max over preds p of fin[p] + c_pv``, with
    c_pv = 0 when p is on d.

    Memory (Baechi's m-ETF): a device is eligible for an op only if its free memory holds
    the op's ``mem`` (for the first member of a co-location group: the whole group's);
    the op's output is allocated when it is scheduled and freed once every reader of the
    buffer has been scheduled; ``persistent`` bytes (parameters) are never freed.  An
    input from another device is held as a copy on the consumer's device (once per tensor
    and device, as the simulator caches transfers) until all consumers of the tensor have
    been scheduled.  Baechi does not count these copies; the simulator (like a real
    runtime) allocates them.  They are charged when the consumer is placed, whereas the
    simulator receives a tensor as soon as it is produced, which an accounting in placement
    order cannot foresee: forward activations sent to a backward device occupy it earlier
    than m-ETF believes (results/celeritas/README.md, Table 3).  Later members of a group
    go to the group's device whatever its memory.  When no pair is
    eligible the placement has run out of memory (Baechi stops there): we count the step
    in ``oom_steps`` and take the earliest pair without the memory check, so that a
    strategy still exists for the simulator to judge.

    SCT (``favourite[v]`` = v's favourite child or -1): when a device has just run v and
    v's favourite child f is ready and starts earliest on this device, the device waits
    for f: it takes only f, or an *urgent* op (one whose data is available on every
    eligible device: at the max over devices of its start), whichever comes first, urgent
    first on ties.  This is Baechi's AWAKE device state.

    Returns ``device``, ``start``, ``finish`` per node and counters.
    """
    n, D = graph.num_nodes, cluster.num_devices
    free_mem = cluster.mem_capacity.astype(np.float64).copy()
    avail = np.zeros(D)
    dev = np.full(n, -1, dtype=np.int64)
    start = np.zeros(n)
    fin = np.zeros(n)
    drt = np.zeros((n, D))
    pptr, ppred, peid = graph.pred_csr()
    sptr, ssucc, _ = graph.succ_csr()
    pptr_l, ppred_l, peid_l = pptr.tolist(), ppred.tolist(), peid.tolist()
    sptr_l, ssucc_l = sptr.tolist(), ssucc.tolist()
    c_l = c.tolist()
    w_l = w.tolist()
    indeg = np.bincount(graph.dst, minlength=n).tolist()
    transient = np.maximum(mem - persistent, 0.0).tolist()
    root = buffer_roots(graph)
    readers = (np.bincount(root[graph.src], minlength=n) if graph.num_edges else np.zeros(n, np.int64)).tolist()
    root_l = root.tolist()
    # co-location: pin[v] = device of v's group once its first member is placed
    group = graph.coloc.astype(np.int64)
    pin = np.full(n, -1, dtype=np.int64)
    members: dict[int, np.ndarray] = {}
    for m in graph.coloc_groups():
        members[int(group[m[0]])] = m
    group_need = {g: float(mem[m].sum()) for g, m in members.items()}
    req_unpinned = np.array([group_need[g] if g >= 0 else mem[v] for v, g in enumerate(group.tolist())]) if n else np.zeros(0)
    fav = favourite.tolist() if favourite is not None else None
    last_op = [-1] * D
    nbytes_l = graph.nbytes.astype(np.float64).tolist()
    consumers_left = np.bincount(graph.src, minlength=n).tolist() if graph.num_edges else [0] * n
    copies: dict[tuple[int, int], float] = {}
    copy_devs: dict[int, list[int]] = {}
    rank = np.asarray(rank, dtype=np.int64)

    ready: list[int] = [v for v in range(n) if indeg[v] == 0]
    where = {v: i for i, v in enumerate(ready)}
    oom_steps = 0
    followed = 0
    inf = np.inf
    for _ in range(n):
        ids = np.fromiter(ready, dtype=np.int64, count=len(ready))
        est = np.maximum(drt[ids], avail[None, :])
        pins = pin[ids]
        pinned_rows = pins >= 0
        ok = req_unpinned[ids][:, None] <= free_mem[None, :]
        if pinned_rows.any():
            pr = np.flatnonzero(pinned_rows)
            ok[pr] = False
            ok[pr, pins[pr]] = True
        if not ok[~pinned_rows].any() and (~pinned_rows).any() and not pinned_rows.any():
            # nothing fits anywhere: out of memory during placement
            oom_steps += 1
            ok[:] = True
        est_m = np.where(ok, est, inf)
        best: tuple[float, int, int, int] | None = None  # (start, rank, device, row)
        urg: np.ndarray | None = None
        for d in range(D):
            cand: tuple[float, int, int, int] | None = None
            lo = last_op[d]
            f = fav[lo] if (fav is not None and lo >= 0) else -1
            if f >= 0 and f in where:
                rf = where[f]
                tf = float(est_m[rf, d])
                if tf < inf and tf <= est_m[rf].min():
                    # AWAKE: only the favourite child, or an urgent op if one comes first
                    if urg is None:
                        urg = np.where(ok, est, -inf).max(axis=1)
                    u_t = np.where(ok[:, d], urg, inf)
                    mu = float(u_t.min())
                    if mu <= tf:
                        rows = np.flatnonzero(u_t == mu)
                        r = int(rows[np.argmin(rank[ids[rows]])])
                        cand = (mu, int(rank[ids[r]]), d, r)
                    else:
                        cand = (tf, int(rank[f]), d, rf)
            if cand is None:
                col_d = est_m[:, d]
                mn = float(col_d.min())
                if mn == inf:
                    continue
                rows = np.flatnonzero(col_d == mn)
                r = int(rows[np.argmin(rank[ids[rows]])])
                cand = (mn, int(rank[ids[r]]), d, r)
            if best is None or cand[:3] < best[:3]:
                best = cand
        if best is None:  # pragma: no cover - every ready op has an allowed device
            raise RuntimeError("ETF found no (op, device) pair to schedule")
        s, _, d, r = best
        v = int(ids[r])
        if fav is not None and last_op[d] >= 0 and v == fav[last_op[d]]:
            followed += 1
        g = int(group[v])
        if g >= 0 and pin[v] < 0:
            pin[members[g]] = d
        dev[v] = d
        start[v] = s
        f_v = s + w_l[v]
        fin[v] = f_v
        avail[d] = f_v
        last_op[d] = v
        free_mem[d] -= mem[v]
        # inputs from other devices arrive as copies held on d (once per tensor and device)
        for k in range(pptr_l[v], pptr_l[v + 1]):
            p = ppred_l[k]
            if dev[p] != d and (p, d) not in copies:
                copies[(p, d)] = nbytes_l[peid_l[k]]
                free_mem[d] -= nbytes_l[peid_l[k]]
                copy_devs.setdefault(p, []).append(d)
        i = where.pop(v)
        last = ready.pop()
        if last != v:
            ready[i] = last
            where[last] = i
        # free the buffers whose readers have all been scheduled
        for k in range(pptr_l[v], pptr_l[v + 1]):
            p = ppred_l[k]
            b = root_l[p]
            readers[b] -= 1
            if readers[b] == 0:
                free_mem[dev[b]] += transient[b]
            consumers_left[p] -= 1
            if consumers_left[p] == 0:
                for dd in copy_devs.pop(p, ()):
                    free_mem[dd] += copies.pop((p, dd))
        if root_l[v] == v and readers[v] == 0:
            free_mem[d] += transient[v]
        # successors that became ready: their data ready time on every device
        for k in range(sptr_l[v], sptr_l[v + 1]):
            x = ssucc_l[k]
            indeg[x] -= 1
            if indeg[x] == 0:
                drt[x] = _data_ready(x, pptr_l, ppred_l, peid_l, fin, dev, c_l, D)
                where[x] = len(ready)
                ready.append(x)
    return {
        "device": dev,
        "start": start,
        "finish": fin,
        "makespan": float(fin.max()) if n else 0.0,
        "oom_steps": oom_steps,
        "favourite_followed": followed,
        "static_free_bytes": free_mem.tolist(),
    }


def _data_ready(x: int, pptr: list[int], ppred: list[int], peid: list[int], fin: np.ndarray, dev: np.ndarray, c: list[float], D: int) -> np.ndarray:
    """Data ready time of node x on every device: max over preds p of fin[p], plus c_px
    when p sits on another device."""
    row = [0.0] * D
    for j in range(pptr[x], pptr[x + 1]):
        p = ppred[j]
        fp = float(fin[p])
        t = fp + c[peid[j]]
        dp = int(dev[p])
        for d in range(D):
            tt = fp if d == dp else t
            if tt > row[d]:
                row[d] = tt
    return np.asarray(row)
