"""The dynamic-critical-path list scheduler of FD-DPS (Wang et al., Mathematics 10(24):4788,
2022, Sec. 4.2-4.4, Alg. 1-3), used by :class:`algorithms.fddps.FDDPS`.

The scheduler, in the paper's terms
-----------------------------------
* **Partially scheduled graph.**  The DAG plus, on every device, an edge from each
  scheduled operator to the next one on that device.  An edge between two scheduled
  operators costs the real transfer time between their devices (0 on one device); an edge
  with an unscheduled end costs the mean transfer time c-bar (the operator is assumed to
  be elsewhere); an unscheduled operator costs its mean time w-bar.
* **EST / LST** (Eq. 6-7) are the longest-path top level ``TL`` and
  ``LST = DCPL - BL`` with ``BL`` the bottom level (execution time included) on that graph;
  **DCPL** (Eq. 10) = max over operators of EST + ET = max TL + BL.
* **Critical node** (Eq. 8): EST == LST, i.e. TL + BL == DCPL (relative tolerance ``eps``).
  **Score** (Eq. 9) = 1 / (LST - EST + eps) = 1 / (DCPL - TL - BL + eps): ordering ready
  operators by Score is ordering them by TL + BL, which is what we do.
* **Sort_Node** (Alg. 1): the first critical operator of the ready queue (FIFO: the order
  in which operators became ready), else the ready operator of highest Score (ties: queue
  order).  A lazy heap keyed by (-(TL + BL), queue position) gives that choice.
* **Device filter**: devices whose remaining memory (capacity minus the static memory of
  what is placed there) can take the operator; a co-location group goes where its first
  member goes (:meth:`algorithms.sched.constraints.StaticMemory.candidates`).
* **Find_Slot** (Alg. 2) on every candidate device v: ``EST(o_i, v)`` with the real
  transfer times from the placed parents (this is the paper's EST' when a parent is on
  v: the transfer term becomes 0).  Slots are the gaps between consecutive operators
  o_j, o_m of v after the last operator that finishes by EST(o_i, v) (so an operator is
  never put before one of its ancestors).  A gap fits when o_i, started at
  ``max(EST(o_i, v), EFT(o_j))``, ends by ``LST(o_m)`` (o_m may be delayed within its
  slack, as in DCP); the first fitting gap (or the end of v) is v's slot.  **Eq. 11**
  holds on v when that slot also keeps o_i within its own LST:
  ``ET(o_i) <= min(LST(o_i) + ET(o_i), LST(o_m)) - max(EST(o_i, v), EFT(o_j))``.
* **Device choice** (Sec. 4.3 (2), rules 1-4): among the devices satisfying Eq. 11,
  (1) a device holding a parent of o_i; (2) otherwise, and to choose between several,
  the child look-ahead of **Eq. 12**: o_c = the child of highest Score and v_b the device
  minimising start(o_i, v) + start(o_c, v) with o_c placed right after o_i on v (DCP's
  composite start time; the paper's ET(o_c) + ET(o_i) is constant on a homogeneous
  cluster); (3) without children, the earliest start; (4) when no device satisfies Eq. 11,
  the device where o_i finishes earliest, ties broken towards the device whose operator
  after the slot has the lowest priority (largest slack).
* **Update** (Sec. 4.3 (3)): edges to a parent on the same device cost 0, the placed
  operator's TL/BL become real, and TL/BL of the affected operators are recomputed.

Readings of the OCR-damaged boxes (checked against Kwok and Ahmad's DCP, IEEE TPDS 7(5), 1996)
-----------------------------------------------------------------------------------------
* Alg. 1 is printed as "for o_i in Node_Queue: if o_i is critical: o_best = o_i; break;
  else compute Score", then "sort(Node_Queue); o_best = Node_Queue[0]" when none is
  critical.  Node_Queue holds the schedulable operators (all parents placed), in the order
  they became schedulable (lines 14-16 push the children of the chosen operator).
* Alg. 2's four branches (parent's device, Eq. 11 + Eq. 12, earliest start, lowest-priority
  device) are read as the rules (1)-(4) of Sec. 4.3 (2) listed above.
* Eq. 11's LST'(o_i) = LST(o_i) - w: LST depends only on successors (Eq. 7), so moving
  a parent onto v changes EST, not LST; we use EST' (the device-specific EST) and LST.
* Eq. 11 lets o_m start as late as LST(o_m), while the sentence before it says "the
  scheduling process cannot affect the execution of scheduled nodes on these devices".
  ``slot="lst"`` (default) follows the equation (and DCP); ``slot="idle"`` follows the
  sentence: only idle gaps, so no placed operator ever moves.
* Eq. 12 is printed as an argmax of ET; the text says v_b *minimises* the execution of
  o_i and o_c, and DCP minimises the sum of their start times: we take that sum.
  Unplaced parents of o_c are ignored (they have no device yet).
* Rule (4) "the device that executes the lowest-priority node": we read it as the
  device where o_i can finish earliest, ties towards the lowest-priority operator.

Incremental updates (exact) and the approximate options
-------------------------------------------------------
Alg. 3 lines 9-14 recompute EST/LST of every node each step: O(V(V+E)) in all.  The
incremental updates below give the same values (the tests keep that full recomputation as a
reference, tests/fddps_reference.py, and compare both schedules and every value after every
step):

* Placing o_i between o_j and o_m can only delay operators in the forward cone of o_m
  (device successors and placed descendants): TL is propagated there with a worklist
  that stops where values do not change; the ready operators below get new keys.
* DCPL needs no bottom levels of placed operators: every path of the partially scheduled
  graph is a run of placed operators followed by unplaced ones, so DCPL = max(max EFT of
  placed operators, max over unplaced u of TL(u) + BL(u)) with the static BL of unplaced
  operators; a lazy max-heap holds those terms.
* BL of placed operators is needed only for LST(o_m) in Eq. 11.  It is kept lazily:
  placing o_i marks o_i and its placed ancestors stale (marks stop at stale nodes, whose
  ancestors are stale already), and a query recomputes the stale part below the asked
  operator.  Old operators that no slot search reaches again are never recomputed.
* With ``slot="idle"`` nothing moves once placed, and a block index of idle gaps
  (:class:`algorithms.sched.timeline.GapIndex`) finds the first fitting gap without scanning.

What stays superlinear is the slot search of Eq. 11 itself: a low-priority operator with
an early EST (a sink of an early layer) scans every gap after its EST on every device.
``horizon=N`` (approximate; 0 = exact) searches only the last N gaps of each device.  The
default ``horizon=auto`` is exact up to ``exact_up_to`` (100k) nodes and searches the last
``auto_horizon`` (64) gaps beyond; ``horizon=0`` keeps the exact search at any size.

Graphs of :data:`COMPILED_FROM` nodes and more run the same steps compiled
(:mod:`algorithms.fddps_dcp_kernel`, numba; the same schedule to the bit, 24x faster on a 20k-node graph),
which is what makes the exact search on an 80k-node graph take seconds, not minutes.  Step
times of the modes are in tests/benchmarks/test_bench_fddps.py and results/fddps/README.md.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from typing import Any

import numpy as np

from algorithms.sched.constraints import Colocation, StaticMemory
from algorithms.sched.engine import ReadyCounter
from algorithms.sched.levels import blevel
from algorithms.sched.schedgraph import CommFn, SchedGraph
from algorithms.sched.timeline import GapIndex
from harness.core.cluster import Cluster
from harness.core.compiled import use_compiled

SLOT_RULES = ("lst", "idle")
#: graphs of at least COMPILED_FROM nodes run compiled (algorithms/fddps_dcp_kernel.py) once the
#: kernel is loaded in the process, COLD_FROM before: loading it from numba's cache costs about
#: 0.6 s (the first compile in a fresh checkout about 8 s), what Python takes for 4-5k nodes
COMPILED_FROM = 500
COLD_FROM = 5_000
RULES = ("parent", "lookahead", "earliest", "fallback", "pinned")


class DCPScheduler:
    """The dynamic-critical-path scheduler of FD-DPS on a :class:`SchedGraph`.

    ``run()`` places every node and returns (device, start) arrays; ``stats`` counts the
    device rules used and the work of the updates.

    State of the partially scheduled graph (plain lists, indexed by node):
    ``TL`` (placed: EST, Eq. 6; unplaced: max over placed parents of EFT + c-bar), ``BL``
    (placed: bottom level, kept lazily: ``bdirty`` marks values that may be stale and
    :meth:`bottom_level` recomputes them on demand; unplaced: the static bottom level),
    ``dev``, ``ETa`` (ET on the chosen device), and per device the ordered list of its
    operators (``dlist``, ``dprev``, ``dnext``).
    """

    def __init__(self, sg: SchedGraph, cluster: Cluster, comm: CommFn, eps: float = 1e-9, slot_rule: str = "lst",
                 horizon: int = 0, gap_index: bool = True, routes: tuple[np.ndarray, np.ndarray] | None = None,
                 compiled: bool | None = None) -> None:
        if slot_rule not in SLOT_RULES:
            raise ValueError(f"fddps slot must be one of {SLOT_RULES}, got {slot_rule!r}")
        self.slot_rule = slot_rule
        if horizon < 0:
            raise ValueError(f"fddps horizon must be >= 0 (0: exact), got {horizon}")
        self.horizon = int(horizon)
        # with idle-gap slots nothing placed ever moves: a block index finds the gaps
        self.gidx = [GapIndex() for _ in range(cluster.num_devices)] if slot_rule == "idle" and gap_index else None
        self.sg, self.cluster, self.comm = sg, cluster, comm
        if compiled and routes is None:
            raise ValueError("the compiled FD-DPS run needs the route tables of comm (schedgraph.route_tables)")
        #: route latency and bandwidth that ``comm`` computes from, for the compiled run
        self.routes = routes
        #: None: the compiled run where it pays (:data:`COMPILED_FROM`, :data:`COLD_FROM`)
        self.compiled = compiled
        self.eps = float(eps)
        n, D = sg.num_nodes, cluster.num_devices
        self.n, self.D = n, D
        self.pptr, self.pred, self.peid = (x.tolist() for x in sg.pred_csr())
        self.sptr, self.succ, self.seid = (x.tolist() for x in sg.succ_csr())
        self.nb = sg.nbytes.tolist()
        self.cbar = sg.c.tolist()
        self.et = [row.tolist() for row in sg.et]
        self.wbar = sg.w.tolist()
        self.bl_static = blevel(sg, sg.w, sg.c).tolist()
        self.memory = StaticMemory(Colocation(sg.coloc), sg.mem, cluster.mem_capacity, "whole")
        self.dev = [-1] * n
        self.TL = [0.0] * n
        self.BL = list(self.bl_static)
        self.bdirty = [False] * n
        self.ETa = list(self.wbar)
        self.dnext = [-1] * n
        self.dprev = [-1] * n
        self.dlist: list[list[int]] = [[] for _ in range(D)]
        self.ready = ReadyCounter.of(sg)
        self.missing = self.ready.missing
        self.ver = [0] * n
        self.dcpl_heap: list[tuple[float, int, int]] = []
        self.rheap: list[tuple[float, int, int, int]] = []
        self.rver = [0] * n
        self.seq = [-1] * n
        self.nseq = 0
        self.stats: dict[str, Any] = {**{f"rule_{r}": 0 for r in RULES}, "forward_updates": 0, "bl_recomputed": 0,
                                      "bl_marked": 0, "slot_scans": 0, "horizon_cuts": 0, "schedule_compiled": False}

    # ------------------------------------------------------------------ DCPL and the ready queue
    def push_dcpl(self, v: int) -> None:
        """Enter v's term of DCPL: EFT for a placed operator, TL + static BL for an unplaced one.

        DCPL (Eq. 10) is the longest path of the partially scheduled graph.  Every path is a
        run of placed operators followed by a run of unplaced ones (an unplaced operator has
        no placed descendant), so its length is at most EFT(s) of its last placed operator s,
        or TL(u) + BL(u) of its first unplaced operator u; both are lengths of real paths.
        """
        self.ver[v] += 1
        val = self.TL[v] + (self.ETa[v] if self.dev[v] >= 0 else self.BL[v])
        heapq.heappush(self.dcpl_heap, (-val, v, self.ver[v]))

    def dcpl(self) -> float:
        """DCPL (Eq. 10) from a lazy max-heap of the terms of :meth:`push_dcpl`."""
        h, ver = self.dcpl_heap, self.ver
        while h:
            negv, v, vv = h[0]
            if vv == ver[v]:
                return -negv
            heapq.heappop(h)
        return 0.0

    def push_ready(self, v: int) -> None:
        """Enter v in the ready queue (keyed by TL + BL, then the order it became ready)."""
        if self.seq[v] < 0:
            self.seq[v] = self.nseq
            self.nseq += 1
        self.rver[v] += 1
        heapq.heappush(self.rheap, (-(self.TL[v] + self.BL[v]), self.seq[v], v, self.rver[v]))

    def _pop_valid(self) -> tuple[float, int, int, int] | None:
        h = self.rheap
        while h:
            e = heapq.heappop(h)
            if e[3] == self.rver[e[2]] and self.dev[e[2]] < 0:
                return e
        return None

    def sort_node(self, dcpl: float) -> int:
        """Alg. 1: the first critical ready node in queue order, else the highest Score."""
        top = self._pop_valid()
        if top is None:
            raise RuntimeError("FD-DPS: no schedulable node left but the graph is not fully scheduled (a cycle?)")
        tol = self.eps * max(abs(dcpl), 1e-30)
        if -top[0] < dcpl - tol:
            return top[2]
        crit = [top]  # several critical nodes: the first one in the queue
        while True:
            e = self._pop_valid()
            if e is None:
                break
            if -e[0] < dcpl - tol:
                heapq.heappush(self.rheap, e)
                break
            crit.append(e)
        crit.sort(key=lambda e: e[1])
        for e in crit[1:]:
            heapq.heappush(self.rheap, e)
        return crit[0][2]

    # ------------------------------------------------------------------ bottom levels of placed operators
    def bottom_level(self, x: int) -> float:
        """BL of a placed operator, recomputing the stale values below it (post-order DFS)."""
        bdirty = self.bdirty
        if not bdirty[x]:
            return self.BL[x]
        BL, ETa, dev, comm, nb, cbar = self.BL, self.ETa, self.dev, self.comm, self.nb, self.cbar
        sptr, succ, seid, dnext = self.sptr, self.succ, self.seid, self.dnext
        stack = [x]
        n_re = 0
        while stack:
            y = stack[-1]
            if not bdirty[y]:
                stack.pop()
                continue
            pending = False
            z = dnext[y]
            if z >= 0 and bdirty[z]:
                stack.append(z)
                pending = True
            for i in range(sptr[y], sptr[y + 1]):
                c = succ[i]
                if bdirty[c]:
                    stack.append(c)
                    pending = True
            if pending:
                continue
            best = BL[z] if z >= 0 else 0.0
            dy = dev[y]
            for i in range(sptr[y], sptr[y + 1]):
                c = succ[i]
                dc = dev[c]
                t = (comm(nb[seid[i]], dy, dc) if dc >= 0 else cbar[seid[i]]) + BL[c]
                if t > best:
                    best = t
            BL[y] = ETa[y] + best
            bdirty[y] = False
            n_re += 1
            stack.pop()
        self.stats["bl_recomputed"] += n_re
        return BL[x]

    def _mark_dirty(self, o: int) -> None:
        """o was just placed: its BL and its ancestors' may change.  Dirty marks are closed
        upwards (a dirty node's ancestors are dirty), so marking stops at dirty nodes."""
        bdirty, pptr, pred, dprev = self.bdirty, self.pptr, self.pred, self.dprev
        stack = [o]
        k = 0
        while stack:
            x = stack.pop()
            if bdirty[x]:
                continue
            bdirty[x] = True
            k += 1
            for i in range(pptr[x], pptr[x + 1]):
                p = pred[i]
                if not bdirty[p]:
                    stack.append(p)
            q = dprev[x]
            if q >= 0 and not bdirty[q]:
                stack.append(q)
        self.stats["bl_marked"] += k

    # ------------------------------------------------------------------ main loop
    def use_compiled(self) -> bool:
        """Whether :meth:`run` takes the compiled kernel: ``compiled`` if given, else from
        :data:`COMPILED_FROM` nodes once it is loaded and :data:`COLD_FROM` before (numba's
        start-up), when the transfer costs are route tables."""
        if self.compiled is None and self.routes is None:
            return False
        return use_compiled(self.n, COMPILED_FROM, COLD_FROM, kernel="algorithms.fddps_dcp_kernel", forced=self.compiled)

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        """Place every node (Alg. 3); returns (device, start) arrays."""
        if self.use_compiled():
            return self.run_compiled()
        for v in self.ready.sources():
            self.push_dcpl(v)
            self.push_ready(v)
        for _ in range(self.n):
            self.step()
        if any(d < 0 for d in self.dev):
            raise RuntimeError("FD-DPS left nodes unscheduled")
        return np.asarray(self.dev, dtype=np.int64), np.asarray(self.TL)

    def run_compiled(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`run` by :func:`algorithms.fddps_dcp_kernel.dcp_run` (the same schedule, bit for
        bit); the final device, TL, memory and statistics are copied back."""
        from algorithms.fddps_dcp_kernel import STATS, dcp_run

        assert self.routes is not None
        sg, mem, coloc = self.sg, self.memory, self.memory.coloc
        pptr, pred, peid = sg.pred_csr()
        sptr, succ, seid = sg.succ_csr()
        i64 = lambda x: np.ascontiguousarray(x, dtype=np.int64)  # noqa: E731 - one compiled signature
        f64 = lambda x: np.ascontiguousarray(x, dtype=np.float64)  # noqa: E731
        pin, free, missing = i64(coloc.pin), f64(mem.free), i64(self.missing)
        dev, TL, stats, fallbacks, ok = dcp_run(
            i64(pptr), i64(pred), i64(peid), i64(sptr), i64(succ), i64(seid), f64(self.nb), f64(self.cbar), f64(sg.et),
            f64(self.wbar), f64(self.bl_static), i64(coloc.group_arr), pin, f64(mem.group_mem), f64(mem.mem_arr), free,
            missing, f64(self.routes[0]), f64(self.routes[1]), self.eps, self.slot_rule == "lst",
            self.horizon if self.gidx is None else 0)  # the gap index searches every idle gap
        if not ok:
            raise RuntimeError("FD-DPS: no schedulable node left but the graph is not fully scheduled (a cycle?)")
        self.dev, self.TL = dev.tolist(), TL.tolist()
        self.missing[:] = missing.tolist()
        for g, d in enumerate(pin.tolist()):
            if d >= 0 and coloc.pin[g] < 0:
                coloc.pin_group(g, d)
        mem.free = free.tolist()
        mem.fallbacks += int(fallbacks)
        for name, k in zip(STATS, stats.tolist()):
            self.stats[name] += k
        self.stats["schedule_compiled"] = True
        return dev, TL

    def step(self) -> int:
        """Schedule one node (Alg. 3 lines 9-26); returns it."""
        dcpl = self.dcpl()
        o = self.sort_node(dcpl)
        d, slot, rule = self.find_slot(o, dcpl)
        self.stats[f"rule_{rule}"] += 1
        self.place(o, d, slot)
        return o

    # ------------------------------------------------------------------ Find_Slot (Alg. 2)
    def _slot(self, o: int, d: int, dcpl: float, tol: float) -> tuple[int, float, float, int, int]:
        """(position, start, EST(o, d), block, offset) of o's slot on device d: the first gap
        after the operators that finish by EST(o, d) in which o ends by the LST of the next
        operator (``slot="lst"``) or by its start (``slot="idle"``, through the gap index)."""
        TL, ETa, dev, comm, nb = self.TL, self.ETa, self.dev, self.comm, self.nb
        est = 0.0
        pred, peid = self.pred, self.peid
        for i in range(self.pptr[o], self.pptr[o + 1]):
            p = pred[i]
            t = TL[p] + ETa[p] + comm(nb[peid[i]], dev[p], d)
            if t > est:
                est = t
        if self.gidx is not None:
            gi = self.gidx[d]
            b, j, s = gi.find(est, self.et[d][o])
            return -1, s, est, b, j  # the position is computed for the chosen device only
        lst = self.dlist[d]
        L = len(lst)
        k = bisect_right(lst, est, key=lambda x: TL[x] + ETa[x]) if L else 0
        if self.horizon and k < L - self.horizon:  # approximate: only the last `horizon` gaps
            k = L - self.horizon
            self.stats["horizon_cuts"] += 1
        prev_end = TL[lst[k - 1]] + ETa[lst[k - 1]] if k > 0 else 0.0
        dur = self.et[d][o]
        bdirty, BL = self.bdirty, self.BL
        lst_slots = self.slot_rule == "lst"
        k0 = k
        while k < L:
            m = lst[k]
            s = est if est > prev_end else prev_end
            if s + dur <= TL[m]:  # an idle gap: o delays nothing
                self.stats["slot_scans"] += k - k0
                return k, s, est, -1, -1
            if lst_slots and s + dur <= dcpl - (self.bottom_level(m) if bdirty[m] else BL[m]) + tol:
                self.stats["slot_scans"] += k - k0
                return k, s, est, -1, -1
            prev_end = TL[m] + ETa[m]
            k += 1
        self.stats["slot_scans"] += k - k0
        return L, (est if est > prev_end else prev_end), est, -1, -1

    def _position(self, d: int, slot: tuple[int, float, float, int, int]) -> int:
        """Position of a slot in device d's sequence."""
        return slot[0] if slot[0] >= 0 else self.gidx[d].position(slot[3], slot[4])  # type: ignore[index]

    def find_slot(self, o: int, dcpl: float) -> tuple[int, tuple[int, float, float, int, int], str]:
        """Alg. 2: (device, its slot as returned by :meth:`_slot`, rule used)."""
        tol = self.eps * max(abs(dcpl), 1e-30)
        cands = self.memory.candidates(o)
        slots = {d: self._slot(o, d, dcpl, tol) for d in cands}
        if len(cands) == 1 and self.memory.coloc.pinned(o) >= 0:
            d = cands[0]
            return d, slots[d], "pinned"
        lst_o = dcpl - self.BL[o]
        et = self.et
        s11 = [d for d in cands if slots[d][1] <= lst_o + tol]
        if not s11:
            # rule (4): earliest finish; ties towards the lowest-priority operator after the slot
            fin = {d: slots[d][1] + et[d][o] for d in cands}
            best = min(fin.values())
            ties = [d for d in cands if fin[d] <= best + tol]
            if len(ties) > 1:
                def slack_after(d: int) -> float:
                    lst, k = self.dlist[d], self._position(d, slots[d])
                    if k >= len(lst):
                        return float("inf")
                    m = lst[k]
                    return dcpl - self.bottom_level(m) - self.TL[m]
                ties.sort(key=lambda d: (-slack_after(d), d))
            d = ties[0]
            return d, slots[d], "fallback"
        pdevs = {self.dev[self.pred[i]] for i in range(self.pptr[o], self.pptr[o + 1])}
        par = [d for d in s11 if d in pdevs]
        pool = par or s11
        if len(pool) == 1:
            d = pool[0]
            return d, slots[d], "parent" if par else "earliest"
        child = self._critical_child(o)
        if child < 0:
            d = min(pool, key=lambda x: (slots[x][1], x))
            return d, slots[d], "parent" if par else "earliest"
        # Eq. 12: the device minimising start(o) + start(o_c) with o_c right after o
        TL, ETa, dev, comm, nb = self.TL, self.ETa, self.dev, self.comm, self.nb
        others = [(self.pred[i], nb[self.peid[i]]) for i in range(self.pptr[child], self.pptr[child + 1])
                  if self.pred[i] != o and dev[self.pred[i]] >= 0]
        best_key: tuple[float, float, int] | None = None
        best_d = pool[0]
        for d in pool:
            s = slots[d][1]
            sc = s + et[d][o]
            for q, b in others:
                t = TL[q] + ETa[q] + comm(b, dev[q], d)
                if t > sc:
                    sc = t
            key = (s + sc, s, d)
            if best_key is None or key < best_key:
                best_key, best_d = key, d
        return best_d, slots[best_d], "parent" if par else "lookahead"

    def _critical_child(self, o: int) -> int:
        """Eq. 12's o_c: the child of highest Score (TL + BL, with o placed at its EST)."""
        best, best_c = -1.0, -1
        fo = self.TL[o] + self.wbar[o]
        for i in range(self.sptr[o], self.sptr[o + 1]):
            c = self.succ[i]
            t = fo + self.cbar[self.seid[i]]
            key = self.BL[c] + (t if t > self.TL[c] else self.TL[c])
            if key > best:
                best, best_c = key, c
        return best_c

    # ------------------------------------------------------------------ Update
    def place(self, o: int, d: int, slot: tuple[int, float, float, int, int]) -> None:
        """Put o on device d in ``slot`` (position, start, ...), then update TL / BL / DCPL."""
        k, s = self._position(d, slot), slot[1]
        if self.gidx is not None:
            self.gidx[d].insert(slot[3], slot[4], o, s, s + self.et[d][o])
        lst = self.dlist[d]
        lst.insert(k, o)
        prev = lst[k - 1] if k > 0 else -1
        nxt = lst[k + 1] if k + 1 < len(lst) else -1
        self.dprev[o], self.dnext[o] = prev, nxt
        if prev >= 0:
            self.dnext[prev] = o
        if nxt >= 0:
            self.dprev[nxt] = o
        self.dev[o] = d
        self.ETa[o] = self.et[d][o]
        self.TL[o] = s
        self.memory.place(o, d)
        TL, cbar = self.TL, self.cbar
        fo = s + self.ETa[o]
        for i in range(self.sptr[o], self.sptr[o + 1]):
            c = self.succ[i]
            t = fo + cbar[self.seid[i]]
            if t > TL[c]:
                TL[c] = t
                self.push_dcpl(c)
            elif self.ver[c] == 0:  # its first placed parent: its path term enters DCPL
                self.push_dcpl(c)
        for c in self.ready.release(o):
            self.push_ready(c)
        self.update_levels(o, nxt)

    def update_levels(self, o: int, nxt: int) -> None:
        """Sec. 4.3 (3) after placing o before ``nxt`` on its device: o's DCPL term, TL of the
        forward cone of ``nxt`` and the stale marks of o's bottom level and its ancestors'."""
        self.push_dcpl(o)
        if nxt >= 0:
            self._forward(nxt)
        self._mark_dirty(o)

    def _forward(self, start: int) -> None:
        """Propagate TL increases from ``start`` through placed operators (DAG and device edges)."""
        TL, ETa, dev, comm, nb = self.TL, self.ETa, self.dev, self.comm, self.nb
        pptr, pred, peid, sptr, succ, seid = self.pptr, self.pred, self.peid, self.sptr, self.succ, self.seid
        cbar, dprev, dnext, missing = self.cbar, self.dprev, self.dnext, self.missing
        heap = [(TL[start], start)]
        inq = {start}
        n_upd = 0
        while heap:
            _, x = heapq.heappop(heap)
            inq.discard(x)
            q = dprev[x]
            new = TL[q] + ETa[q] if q >= 0 else 0.0
            dx = dev[x]
            for i in range(pptr[x], pptr[x + 1]):
                p = pred[i]
                t = TL[p] + ETa[p] + comm(nb[peid[i]], dev[p], dx)
                if t > new:
                    new = t
            if new == TL[x]:
                continue
            TL[x] = new
            n_upd += 1
            self.push_dcpl(x)
            fx = new + ETa[x]
            for i in range(sptr[x], sptr[x + 1]):
                c = succ[i]
                if dev[c] >= 0:
                    if c not in inq:
                        inq.add(c)
                        heapq.heappush(heap, (TL[c], c))
                else:
                    t = fx + cbar[seid[i]]
                    if t > TL[c]:
                        TL[c] = t
                        self.push_dcpl(c)
                        if missing[c] == 0:
                            self.push_ready(c)
            y = dnext[x]
            if y >= 0 and y not in inq:
                inq.add(y)
                heapq.heappush(heap, (TL[y], y))
        self.stats["forward_updates"] += n_upd
