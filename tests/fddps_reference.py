"""Test oracles of FD-DPS's scheduler: the literal O(V(V+E)) recomputation of Alg. 3 lines 9-14
that the incremental updates of :class:`algorithms.fddps_dcp.DCPScheduler` must match, and the
EST / LST / DCPL of a given (partial) schedule (Eqs. 6-10, Fig. 3)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from algorithms.fddps_dcp import DCPScheduler
from algorithms.sched.schedgraph import CommFn, SchedGraph


def chain_topological_order(nodes: Sequence[int], pptr: list[int], sptr: list[int], succ: list[int], dprev: list[int],
                            dnext: list[int], keep: Sequence[bool]) -> list[int]:
    """A topological order of ``nodes`` in the partially scheduled graph: the DAG edges between
    kept nodes plus an edge from each operator to the next one on its device."""
    indeg = {v: pptr[v + 1] - pptr[v] + (1 if dprev[v] >= 0 else 0) for v in nodes}
    stack = [v for v in nodes if indeg[v] == 0]
    topo: list[int] = []
    while stack:
        v = stack.pop()
        topo.append(v)
        outs = [succ[i] for i in range(sptr[v], sptr[v + 1]) if keep[succ[i]]]
        if dnext[v] >= 0:
            outs.append(dnext[v])
        for c in outs:
            indeg[c] -= 1
            if indeg[c] == 0:
                stack.append(c)
    if len(topo) != len(nodes):
        raise RuntimeError("FD-DPS: the partially scheduled graph has a cycle")
    return topo


def full_values(s: DCPScheduler) -> tuple[list[float], list[float]]:
    """TL and BL of every node recomputed from scratch on the partially scheduled graph."""
    n, dev, ETa, comm, nb, cbar = s.n, s.dev, s.ETa, s.comm, s.nb, s.cbar
    pptr, pred, peid, sptr, succ, seid = s.pptr, s.pred, s.peid, s.sptr, s.succ, s.seid
    placed = [v for v in range(n) if dev[v] >= 0]
    topo = chain_topological_order(placed, pptr, sptr, succ, s.dprev, s.dnext, [d >= 0 for d in dev])
    TL = [0.0] * n
    for v in topo:
        q = s.dprev[v]
        new = TL[q] + ETa[q] if q >= 0 else 0.0
        for i in range(pptr[v], pptr[v + 1]):
            p = pred[i]
            t = TL[p] + ETa[p] + comm(nb[peid[i]], dev[p], dev[v])
            if t > new:
                new = t
        TL[v] = new
    for v in range(n):
        if dev[v] < 0:
            best = 0.0
            for i in range(pptr[v], pptr[v + 1]):
                p = pred[i]
                if dev[p] >= 0:
                    t = TL[p] + ETa[p] + cbar[peid[i]]
                    if t > best:
                        best = t
            TL[v] = best
    BL = list(s.bl_static)
    for v in reversed(topo):
        y = s.dnext[v]
        best = BL[y] if y >= 0 else 0.0
        for i in range(sptr[v], sptr[v + 1]):
            c = succ[i]
            t = (comm(nb[seid[i]], dev[v], dev[c]) if dev[c] >= 0 else cbar[seid[i]]) + BL[c]
            if t > best:
                best = t
        BL[v] = ETa[v] + best
    return TL, BL


class FullRecomputeScheduler(DCPScheduler):
    """Alg. 3 lines 9-14 literally: EST/LST of every node from scratch after every step."""

    def update_levels(self, o: int, nxt: int) -> None:
        TL, BL = full_values(self)
        self.TL[:], self.BL[:] = TL, BL
        self.bdirty = [False] * self.n
        self.dcpl_heap = []
        self.ver = [0] * self.n
        for v in range(self.n):
            if self.dev[v] >= 0 or self.missing[v] < self.pptr[v + 1] - self.pptr[v] or self.pptr[v] == self.pptr[v + 1]:
                self.push_dcpl(v)
        self.rheap = []
        for v in range(self.n):
            if self.dev[v] < 0 and self.missing[v] == 0:
                self.push_ready(v)


class VerifiedScheduler(DCPScheduler):
    """The incremental scheduler, checked against :func:`full_values` after every step."""

    def step(self) -> int:
        o = super().step()
        TL, BL = full_values(self)
        for v in range(self.n):
            bl = self.bottom_level(v) if self.dev[v] >= 0 else self.BL[v]
            if TL[v] != self.TL[v] or BL[v] != bl:
                raise AssertionError(f"incremental EST/LST differ from a full recomputation at node {v}: "
                                     f"TL {self.TL[v]} vs {TL[v]}, BL {bl} vs {BL[v]}")
        full = max([TL[v] + BL[v] for v in range(self.n) if self.dev[v] >= 0 or self.pptr[v] == self.pptr[v + 1]], default=0.0)
        if abs(full - self.dcpl()) > 1e-12 * max(full, 1e-30):
            raise AssertionError(f"incremental DCPL {self.dcpl()} differs from a full recomputation {full}")
        return o


def partial_schedule_levels(sg: SchedGraph, comm: CommFn, device: Sequence[int], device_order: Sequence[Sequence[int]]
                            ) -> tuple[np.ndarray, np.ndarray, float, list[int]]:
    """EST and LST of every node (Eq. 6-7), DCPL (Eq. 10) and one dynamic critical path for a
    given (partial) placement: ``device[v]`` (-1 unscheduled) and the operators of each device
    in order.  Unscheduled operators use mean costs; EST of an unscheduled operator here
    includes its unscheduled parents (the textbook definition on the whole graph)."""
    n = sg.num_nodes
    pptr, pred, peid = (x.tolist() for x in sg.pred_csr())
    sptr, succ, seid = (x.tolist() for x in sg.succ_csr())
    nb, cbar = sg.nbytes.tolist(), sg.c.tolist()
    dev = [int(x) for x in device]
    et = [sg.et[dev[v], v] if dev[v] >= 0 else sg.w[v] for v in range(n)]
    dprev, dnext = [-1] * n, [-1] * n
    for seq in device_order:
        for a, b in zip(seq, seq[1:]):
            dnext[a], dprev[b] = b, a

    def cost(e: int, a: int, b: int) -> float:
        return comm(nb[e], dev[a], dev[b]) if dev[a] >= 0 and dev[b] >= 0 else cbar[e]

    try:
        topo = chain_topological_order(range(n), pptr, sptr, succ, dprev, dnext, [True] * n)
    except RuntimeError as e:
        raise ValueError("device orders contradict the graph's edges (cycle)") from e
    est = [0.0] * n
    for v in topo:
        q = dprev[v]
        best = est[q] + et[q] if q >= 0 else 0.0
        for i in range(pptr[v], pptr[v + 1]):
            p = pred[i]
            best = max(best, est[p] + et[p] + cost(peid[i], p, v))
        est[v] = best
    bl = [0.0] * n
    for v in reversed(topo):
        y = dnext[v]
        best = bl[y] if y >= 0 else 0.0
        for i in range(sptr[v], sptr[v + 1]):
            best = max(best, cost(seid[i], v, succ[i]) + bl[succ[i]])
        bl[v] = et[v] + best
    dcpl = max((est[v] + bl[v] for v in range(n)), default=0.0)
    lst = [dcpl - bl[v] for v in range(n)]
    # walk one critical path: start at a critical entry, follow critical successors
    tol = 1e-9 * max(dcpl, 1e-30)
    crit = [abs(lst[v] - est[v]) <= tol for v in range(n)]
    path: list[int] = []
    cur = next((v for v in topo if crit[v] and est[v] <= tol), -1)
    while cur >= 0:
        path.append(cur)
        nxt = -1
        outs = [(succ[i], seid[i]) for i in range(sptr[cur], sptr[cur + 1])] + ([(dnext[cur], -1)] if dnext[cur] >= 0 else [])
        for c, e in outs:
            c_cost = 0.0 if e < 0 else cost(e, cur, c)
            if crit[c] and abs(est[cur] + et[cur] + c_cost - est[c]) <= tol:
                nxt = c
                break
        cur = nxt
    return np.asarray(est), np.asarray(lst), float(dcpl), path
