"""The ready-list engine: the bookkeeping every list scheduler shares, and the schedulers
built on it.

* :class:`ReadyCounter`: which nodes have all their inputs placed (Kahn's counting; also the
  walk of the topological orders of :mod:`algorithms.sched.orders`).
* :func:`arrival_row`: the data ready time of a node on every device with static edge costs
  (Celeritas Alg. 2's pre_t, Eq. 7; ETF's data ready time).
* :func:`ready_list_schedule`: a textbook ready-list scheduler with insertion
  (:class:`~algorithms.sched.timeline.Timeline`), parameterised by a priority and a per-device
  bias added to the finish time (0 for HEFT / FastT, PEFT's optimistic cost for MP-DPS), under
  the memory filter and co-location pinning of :mod:`algorithms.sched.constraints`.
* :func:`schedule_critical_path`: the chain of nodes that fixes a list schedule's makespan.
* :func:`expand_group_starts`: members of contracted nodes back on the original graph.
* :func:`replay_finish`: finish times of a given placement run in a given order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from algorithms.sched.constraints import Colocation, StaticMemory
from algorithms.sched.schedgraph import CommFn, SchedGraph
from algorithms.sched.timeline import Timeline
from harness.core.cluster import Cluster
from harness.core.graph import OpGraph


class ReadyCounter:
    """Kahn's bookkeeping: how many inputs of every node are still unplaced.

    :meth:`sources` are the nodes ready at the start; :meth:`release` marks a node placed and
    returns its successors that became ready, in successor order.  ``missing[v] == 0`` says v is
    ready (or placed)."""

    __slots__ = ("missing", "sptr", "succ")

    def __init__(self, missing: list[int], sptr: list[int], succ: list[int]) -> None:
        self.missing, self.sptr, self.succ = missing, sptr, succ

    @classmethod
    def of(cls, graph: Any) -> "ReadyCounter":
        """The counter of a graph (``num_nodes``, ``dst``, ``succ_csr``)."""
        n = graph.num_nodes
        missing = np.bincount(graph.dst, minlength=n).tolist() if len(graph.dst) else [0] * n
        ptr, succ, _ = graph.succ_csr()
        return cls(missing, ptr.tolist(), succ.tolist())

    def sources(self) -> list[int]:
        """Nodes without inputs, in node order."""
        return [v for v, m in enumerate(self.missing) if m == 0]

    def release(self, v: int) -> list[int]:
        """v is placed: the successors whose last missing input it was."""
        missing, succ = self.missing, self.succ
        out = []
        for i in range(self.sptr[v], self.sptr[v + 1]):
            u = succ[i]
            missing[u] -= 1
            if missing[u] == 0:
                out.append(u)
        return out


def arrival_row(v: int, pptr: list[int], pred: list[int], peid: list[int], fin: Sequence[float], dev: Sequence[int],
                c: list[float], D: int) -> list[float]:
    """Data ready time of v on every device: the max over its predecessors p of fin[p], plus
    the static c_pv when p sits on another device (Celeritas Eq. 7's pre_t; ETF)."""
    row = [0.0] * D
    for j in range(pptr[v], pptr[v + 1]):
        p = pred[j]
        fp = float(fin[p])
        t = fp + c[peid[j]]
        dp = int(dev[p])
        for d in range(D):
            tt = fp if d == dp else t
            if tt > row[d]:
                row[d] = tt
    return row


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
    insertion into idle gaps (HEFT Sec. 4.1).  The devices tried are those of the memory
    filter (:meth:`~algorithms.sched.constraints.StaticMemory.candidates`, groups reserved
    whole by their first member).

    ``priority`` is a sequence of keys compared lexicographically (higher first); node id
    breaks the remaining ties, so the result is deterministic.
    """
    n, D = sg.num_nodes, cluster.num_devices
    pptr, pred, peid = (x.tolist() for x in sg.pred_csr())
    nb = sg.nbytes.tolist()
    et = [row.tolist() for row in sg.et]
    keys = [np.asarray(k, dtype=np.float64).tolist() for k in priority]
    bias_l = bias.tolist() if bias is not None else None
    memory = StaticMemory(Colocation(sg.coloc), sg.mem, cluster.mem_capacity, "whole")
    ready_set = ReadyCounter.of(sg)
    tls = [Timeline() for _ in range(D)]
    dev = [-1] * n
    start = [0.0] * n
    fin = [0.0] * n

    def entry(v: int) -> tuple[Any, ...]:
        return (*(-k[v] for k in keys), v)

    heap = [entry(v) for v in ready_set.sources()]
    heapq.heapify(heap)
    while heap:
        v = heapq.heappop(heap)[-1]
        best = (float("inf"), 0.0, -1)
        for d in memory.candidates(v):
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
        memory.place(v, d)
        dev[v], start[v], fin[v] = d, s, s + dur
        for u in ready_set.release(v):
            heapq.heappush(heap, entry(u))
    if any(x < 0 for x in dev):
        raise RuntimeError("list schedule left nodes unscheduled: the graph has a cycle")
    return ListSchedule(np.asarray(dev, dtype=np.int64), np.asarray(start), np.asarray(fin), tls, memory.fallbacks)


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


def replay_finish(graph: OpGraph, device: np.ndarray, order: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Finish time of every node when a placement runs in a strict order: nodes run in
    ``order``, each device its own nodes in that order (so a device is available at its last
    finish); a node starts at the max of its device's availability and, over its predecessors
    p, fin[p], plus c_pv when p sits on another device (Celeritas Alg. 2's Fin_t, Eq. 7)."""
    n = graph.num_nodes
    pptr, ppred, peid = graph.pred_csr()
    pptr_l, ppred_l, peid_l = pptr.tolist(), ppred.tolist(), peid.tolist()
    dev = np.asarray(device, dtype=np.int64).tolist()
    wl, cl = np.asarray(w, dtype=np.float64).tolist(), np.asarray(c, dtype=np.float64).tolist()
    avail = [0.0] * (max(dev, default=-1) + 1)
    fin = [0.0] * n
    for v in np.argsort(order, kind="stable").tolist():
        d = dev[v]
        t = avail[d]
        for j in range(pptr_l[v], pptr_l[v + 1]):
            p = ppred_l[j]
            x = fin[p] if dev[p] == d else fin[p] + cl[peid_l[j]]
            if x > t:
                t = x
        fin[v] = avail[d] = t + wl[v]
    return np.asarray(fin)
