"""Helpers shared by the list schedulers of the FD-DPS family (HEFT, FastT, MP-DPS, FD-DPS).

* :class:`SchedGraph`: an array view of a DAG as a list scheduler sees it: per-device
  execution times ``et[d][v]`` (ET(o_i, v_k) of FD-DPS Eq. 6), mean costs ``w``/``c``
  (HEFT's mean w_i and c_ij; listsched.static_costs), edge bytes, static memory and
  co-location groups.  It has ``succ_csr``/``pred_csr``/``num_nodes``, so the shared
  :func:`algorithms.listsched.tlevel` / :func:`~algorithms.listsched.blevel` run on it.
  :meth:`SchedGraph.quotient` contracts groups of nodes (MP-DPS's merged nodes).
* :func:`comm_fn`: c_ij for a concrete pair of devices (``costs.transfer_time``, inlined
  for the analytical model with the very same formula, so times agree bit for bit).
* :class:`Resources`: the memory filter ("select the device set that satisfies the
  resource requirements", FD-DPS Sec. 4.3 (2)) and co-location pinning (a group goes
  where its first member is placed; the group's whole static memory is charged then).
* :func:`ready_list_schedule`: a textbook ready-list scheduler with insertion
  (:class:`algorithms.listsched.Timeline`), parameterised by a priority and a per-device
  bias added to the finish time (0 for HEFT / FastT, PEFT's optimistic cost for MP-DPS).
* :func:`schedule_critical_path`: the chain of nodes that fixes a list schedule's makespan.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from algorithms.listsched import Timeline, static_costs
from harness.cluster import Cluster
from harness.costs import AnalyticalCostModel, CostModel
from harness.graph import EdgeListGraph, OpGraph

CommFn = Callable[[float, int, int], float]


@dataclass(eq=False)
class SchedGraph(EdgeListGraph):
    """What a list scheduler needs of a DAG; node ids are a topological order (src < dst)."""

    num_nodes: int
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray  # bytes per edge (what c_ij is computed from on a concrete device pair)
    et: np.ndarray  # [D, n] execution time of every node on every device
    w: np.ndarray  # [n] mean execution time (HEFT's w-bar)
    c: np.ndarray  # [E] mean transfer time over pairs of distinct devices (c-bar)
    mem: np.ndarray  # [n] static bytes a node adds to its device
    coloc: np.ndarray  # [n] co-location group or -1
    names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._succ: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pred: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        if len(self.src) and (self.src >= self.dst).any():
            e = int(np.flatnonzero(self.src >= self.dst)[0])
            raise ValueError(f"SchedGraph edge {int(self.src[e])} -> {int(self.dst[e])} does not follow node order")

    @property
    def num_devices(self) -> int:
        return int(self.et.shape[0])

    @classmethod
    def from_opgraph(cls, graph: OpGraph, cluster: Cluster, costs: CostModel) -> "SchedGraph":
        D = cluster.num_devices
        et = np.zeros((D, graph.num_nodes))
        by_kind: dict[str, np.ndarray] = {}
        for d, dev in enumerate(cluster.devices):
            if dev.spec.kind not in by_kind:
                by_kind[dev.spec.kind] = np.asarray(costs.node_times(graph, d), dtype=np.float64)
            et[d] = by_kind[dev.spec.kind]
        w, c = static_costs(graph, cluster, costs)
        return cls(
            num_nodes=graph.num_nodes, src=graph.src.astype(np.int64), dst=graph.dst.astype(np.int64),
            nbytes=graph.nbytes.astype(np.int64), et=et, w=np.asarray(w, dtype=np.float64), c=np.asarray(c, dtype=np.float64),
            mem=np.asarray(costs.memory(graph), dtype=np.int64), coloc=graph.coloc.astype(np.int64), names=list(graph.names),
        )

    def quotient(self, group: np.ndarray, cluster: Cluster) -> "SchedGraph":
        """Contract nodes with the same ``group`` id (ids 0..G-1, numbered so that the quotient
        is topological: every edge between groups goes from a lower to a higher id).

        Execution time and memory add up; parallel edges merge (bytes add, and c-bar is
        recomputed from the summed bytes with the cluster's mean link figures); co-location
        groups that share a merged node become one group, so pinning stays consistent.
        """
        group = np.asarray(group, dtype=np.int64)
        G = int(group.max()) + 1 if len(group) else 0
        et = np.zeros((self.num_devices, G))
        for d in range(self.num_devices):
            et[d] = np.bincount(group, weights=self.et[d], minlength=G)
        w = np.bincount(group, weights=self.w, minlength=G)
        mem = np.bincount(group, weights=self.mem, minlength=G).astype(np.int64)
        gs, gd = group[self.src], group[self.dst]
        ext = gs != gd
        if (gs[ext] > gd[ext]).any():
            raise ValueError("quotient groups are not numbered topologically (an edge goes to a lower group id)")
        key = gs[ext] * max(G, 1) + gd[ext]
        ukey, inv = np.unique(key, return_inverse=True)
        nb = np.bincount(inv, weights=self.nbytes[ext], minlength=len(ukey)).astype(np.int64)
        qs, qd = ukey // max(G, 1), ukey % max(G, 1)
        D = cluster.num_devices
        if D > 1:
            off = ~np.eye(D, dtype=bool)
            inv_bw = (1.0 / cluster.route_bw[off]).mean()
            lat = cluster.route_lat[off].mean()
            c = np.where(nb > 0, lat + nb * inv_bw, 0.0)
        else:
            c = np.zeros(len(nb))
        # co-location: union the groups that meet in one merged node
        parent = list(range(G))

        def find(a: int) -> int:
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        first_of: dict[int, int] = {}
        for v, cg in zip(group.tolist(), self.coloc.tolist()):
            if cg < 0:
                continue
            if cg in first_of:
                ra, rb = find(first_of[cg]), find(v)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
            else:
                first_of[cg] = v
        has = np.zeros(G, dtype=bool)
        has[group[self.coloc >= 0]] = True
        roots = np.array([find(g) for g in range(G)], dtype=np.int64)
        coloc = np.full(G, -1, dtype=np.int64)
        if has.any():
            _, ids = np.unique(roots[has], return_inverse=True)
            coloc[has] = ids
        names = [""] * G
        for v in range(self.num_nodes - 1, -1, -1):
            names[group[v]] = self.names[v] if self.names else str(v)
        return SchedGraph(G, qs, qd, nb, et, w, c, mem, coloc, names)


def comm_fn(costs: CostModel, cluster: Cluster) -> CommFn:
    """c_ij for a concrete device pair: ``costs.transfer_time``; for the analytical model the
    same formula (route latency + bytes / route bandwidth) read from Python lists."""
    if isinstance(costs, AnalyticalCostModel) and type(costs).transfer_time is AnalyticalCostModel.transfer_time:
        lat = cluster.route_lat.tolist()
        bw = cluster.route_bw.tolist()

        def comm(nbytes: float, a: int, b: int) -> float:
            if a == b or nbytes <= 0:
                return 0.0
            return lat[a][b] + nbytes / bw[a][b]

        return comm
    return lambda nbytes, a, b: 0.0 if a == b else float(costs.transfer_time(nbytes, a, b))


class Resources:
    """Static memory per device and co-location pinning during a list schedule.

    ``candidates(v)``: the pinned device of v's co-location group when the group has been
    placed, else every device whose remaining capacity (capacity minus the static memory
    of what is already there) can take v (v's whole group for a group's first member);
    when none can, the device with the most free memory (and ``fallbacks`` counts it).
    """

    def __init__(self, sg: SchedGraph, cluster: Cluster) -> None:
        self.D = cluster.num_devices
        self.cap = cluster.mem_capacity.astype(np.float64).tolist()
        self.used = [0.0] * self.D
        self.mem = sg.mem.astype(np.float64).tolist()
        self.coloc = sg.coloc.tolist()
        ng = int(sg.coloc.max()) + 1 if len(sg.coloc) and sg.coloc.max() >= 0 else 0
        gm = np.zeros(ng)
        if ng:
            sel = sg.coloc >= 0
            gm = np.bincount(sg.coloc[sel], weights=sg.mem[sel].astype(np.float64), minlength=ng)
        self.group_mem = gm.tolist()
        self.pin = [-1] * ng
        self.fallbacks = 0
        self.all = list(range(self.D))

    def pinned(self, v: int) -> int:
        g = self.coloc[v]
        return self.pin[g] if g >= 0 else -1

    def candidates(self, v: int) -> list[int]:
        g = self.coloc[v]
        if g >= 0 and self.pin[g] >= 0:
            return [self.pin[g]]
        need = self.group_mem[g] if g >= 0 else self.mem[v]
        used, cap = self.used, self.cap
        ok = [d for d in self.all if used[d] + need <= cap[d]]
        if ok:
            return ok
        self.fallbacks += 1
        free = [cap[d] - used[d] for d in self.all]
        return [int(np.argmax(free))]

    def commit(self, v: int, d: int) -> None:
        g = self.coloc[v]
        if g >= 0:
            if self.pin[g] < 0:
                self.pin[g] = d
                self.used[d] += self.group_mem[g]
        else:
            self.used[d] += self.mem[v]


@dataclass(eq=False)
class ListSchedule:
    """A list schedule: device, start and finish of every node, and the device timelines."""

    device: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    timelines: list[Timeline]
    mem_fallbacks: int = 0

    @property
    def makespan(self) -> float:
        return float(self.finish.max()) if len(self.finish) else 0.0


def ready_list_schedule(
    sg: SchedGraph,
    cluster: Cluster,
    comm: CommFn,
    priority: Sequence[np.ndarray],
    bias: np.ndarray | None = None,
    insertion: bool = True,
) -> ListSchedule:
    """Schedule ready nodes one at a time, highest ``priority`` first, each on the device
    minimising its finish time (plus ``bias[v, d]`` where given; PEFT's O_EFT), with
    insertion into idle gaps (HEFT Sec. 4.1).

    ``priority`` is a sequence of keys compared lexicographically (higher first); node id
    breaks the remaining ties, so the result is deterministic.
    """
    n, D = sg.num_nodes, cluster.num_devices
    pptr, pred, peid = (x.tolist() for x in sg.pred_csr())
    sptr, succ, _ = (x.tolist() for x in sg.succ_csr())
    nb = sg.nbytes.tolist()
    et = [row.tolist() for row in sg.et]
    keys = [np.asarray(k, dtype=np.float64).tolist() for k in priority]
    bias_l = bias.tolist() if bias is not None else None
    res = Resources(sg, cluster)
    tls = [Timeline() for _ in range(D)]
    dev = [-1] * n
    start = [0.0] * n
    fin = [0.0] * n
    missing = np.bincount(sg.dst, minlength=n).tolist() if sg.num_edges else [0] * n

    def entry(v: int) -> tuple[Any, ...]:
        return (*(-k[v] for k in keys), v)

    heap = [entry(v) for v in range(n) if missing[v] == 0]
    heapq.heapify(heap)
    while heap:
        v = heapq.heappop(heap)[-1]
        best = (float("inf"), 0.0, -1)
        for d in res.candidates(v):
            ready = 0.0
            for i in range(pptr[v], pptr[v + 1]):
                p = pred[i]
                t = fin[p] + comm(nb[peid[i]], dev[p], d)
                if t > ready:
                    ready = t
            dur = et[d][v]
            s = tls[d].earliest_start(ready, dur, insertion)
            score = s + dur + (bias_l[v][d] if bias_l is not None else 0.0)
            if score < best[0]:
                best = (score, s, d)
        _, s, d = best
        dur = et[d][v]
        tls[d].insert(s, dur, v)
        res.commit(v, d)
        dev[v], start[v], fin[v] = d, s, s + dur
        for i in range(sptr[v], sptr[v + 1]):
            u = succ[i]
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(heap, entry(u))
    if any(x < 0 for x in dev):
        raise RuntimeError("list schedule left nodes unscheduled: the graph has a cycle")
    return ListSchedule(np.asarray(dev, dtype=np.int64), np.asarray(start), np.asarray(fin), tls, res.fallbacks)


def schedule_critical_path(sg: SchedGraph, sched: ListSchedule, comm: CommFn) -> list[int]:
    """The chain that fixes the makespan of a list schedule: from the last node to finish,
    step back to the input (or the previous task on the device) that its start waited for."""
    n = sg.num_nodes
    if n == 0:
        return []
    pptr, pred, peid = (x.tolist() for x in sg.pred_csr())
    nb = sg.nbytes.tolist()
    dev, start, fin = sched.device.tolist(), sched.start.tolist(), sched.finish.tolist()
    prev_on_dev = [-1] * n
    for tl in sched.timelines:
        nodes = tl.nodes
        for a, b in zip(nodes, nodes[1:]):
            prev_on_dev[b] = a
    v = int(np.argmax(sched.finish))
    path = [v]
    while True:
        s = start[v]
        tol = 1e-12 * max(1.0, abs(s))
        nxt = -1
        for i in range(pptr[v], pptr[v + 1]):
            p = pred[i]
            if fin[p] + comm(nb[peid[i]], dev[p], dev[v]) >= s - tol:
                nxt = p
                break
        if nxt < 0:
            q = prev_on_dev[v]
            if q >= 0 and fin[q] >= s - tol:
                nxt = q
        if nxt < 0:
            break
        path.append(nxt)
        v = nxt
    return path[::-1]


def expand_group_starts(group: np.ndarray, sched: ListSchedule, et: np.ndarray, sg: "SchedGraph | None" = None) -> tuple[np.ndarray, np.ndarray]:
    """Devices and start times of the members of contracted groups: members run back to
    back in node order from their group's start, each with its own time on the group's device.
    With ``sg`` (the uncontracted graph), rounding is repaired so that no member starts
    before one of its inputs (sums in a different order can differ in the last bit)."""
    group = np.asarray(group, dtype=np.int64)
    dev = sched.device[group]
    own = et[dev, np.arange(len(group))]
    # cumulative time of the earlier members of the same group (members are in node order)
    order = np.lexsort((np.arange(len(group)), group))
    csum = np.cumsum(own[order])
    g_sorted = group[order]
    first = np.concatenate([[True], g_sorted[1:] != g_sorted[:-1]]) if len(order) else np.zeros(0, bool)
    base = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0)) if len(order) else np.zeros(0, np.int64)
    before = csum - own[order] - (csum[base] - own[order][base])
    start = np.empty(len(group))
    start[order] = sched.start[g_sorted] + before
    if sg is not None and sg.num_edges:
        pptr, pred, _ = (x.tolist() for x in sg.pred_csr())
        st = start.tolist()
        for v in range(len(st)):
            for i in range(pptr[v], pptr[v + 1]):
                if st[pred[i]] > st[v]:
                    st[v] = st[pred[i]]
        start = np.asarray(st)
    return dev, start


class GapIndex:
    """The idle gaps of one device whose tasks never move once placed, for fast insertion.

    Tasks are kept in blocks of at most ``2 * block`` tasks with the largest idle gap of each
    block, so "the first idle gap of at least d after time t" skips whole blocks.  The
    answers are those of a linear scan over the gaps (comparisons are made the same way:
    ``start + dur <= next start``); the block maxima only decide which blocks to skip.
    """

    __slots__ = ("block", "st", "en", "nodes", "gmax", "bend")

    def __init__(self, block: int = 64) -> None:
        self.block = block
        self.st: list[list[float]] = []
        self.en: list[list[float]] = []
        self.nodes: list[list[int]] = []
        self.gmax: list[float] = []
        self.bend: list[float] = []

    def __len__(self) -> int:
        return sum(len(x) for x in self.nodes)

    def _gmax(self, b: int) -> float:
        st, en = self.st[b], self.en[b]
        prev = self.bend[b - 1] if b > 0 else 0.0
        best = st[0] - prev if st else float("-inf")
        for j in range(1, len(st)):
            g = st[j] - en[j - 1]
            if g > best:
                best = g
        return best

    def find(self, est: float, dur: float) -> tuple[int, int, float]:
        """(block, offset, start) of the first idle gap that fits a task of ``dur`` ready at
        ``est``, after every task that finishes by ``est``; or the end of the device."""
        bend = self.bend
        nb = len(bend)
        b = bisect_right(bend, est)
        if b >= nb:
            last = bend[-1] if nb else 0.0
            return (nb - 1 if nb else 0), (len(self.st[-1]) if nb else 0), (est if est > last else last)
        st, en = self.st[b], self.en[b]
        j = bisect_right(en, est)
        prev_end = en[j - 1] if j > 0 else (bend[b - 1] if b > 0 else 0.0)
        s = est if est > prev_end else prev_end
        if s + dur <= st[j]:
            return b, j, s
        for jj in range(j + 1, len(st)):
            if en[jj - 1] + dur <= st[jj]:
                return b, jj, en[jj - 1]
        gmax = self.gmax
        for bb in range(b + 1, nb):
            # skip a block only if no gap can pass the float test below: e + dur rounds, so
            # a gap a couple of ulps shorter than dur (even of length 0) may still fit
            if gmax[bb] + 2.0 * math.ulp(bend[bb]) < dur:
                continue
            st, en = self.st[bb], self.en[bb]
            if bend[bb - 1] + dur <= st[0]:
                return bb, 0, bend[bb - 1]
            for jj in range(1, len(st)):
                if en[jj - 1] + dur <= st[jj]:
                    return bb, jj, en[jj - 1]
        last = bend[-1]
        return nb - 1, len(self.st[-1]), (est if est > last else last)

    def position(self, b: int, j: int) -> int:
        """Global position of (block, offset) in the device's sequence."""
        return sum(len(x) for x in self.nodes[:b]) + j

    def insert(self, b: int, j: int, node: int, start: float, end: float) -> None:
        if not self.nodes:
            self.st.append([start])
            self.en.append([end])
            self.nodes.append([node])
            self.bend.append(end)
            self.gmax.append(start)
            return
        self.st[b].insert(j, start)
        self.en[b].insert(j, end)
        self.nodes[b].insert(j, node)
        self.bend[b] = self.en[b][-1]
        if len(self.nodes[b]) > 2 * self.block:
            h = len(self.nodes[b]) // 2
            for arr in (self.st, self.en, self.nodes):
                arr.insert(b + 1, arr[b][h:])
                del arr[b][h:]
            self.bend.insert(b + 1, self.en[b + 1][-1])
            self.bend[b] = self.en[b][-1]
            self.gmax.insert(b + 1, 0.0)
            self.gmax[b + 1] = self._gmax(b + 1)
        self.gmax[b] = self._gmax(b)
        if b + 1 < len(self.nodes):
            self.gmax[b + 1] = self._gmax(b + 1)
