"""The compiled run of FD-DPS's dynamic-critical-path scheduler (numba), for
:meth:`algorithms.fddps_dcp.DCPScheduler.run`; imported only for graphs large enough to pay for
numba's start-up.

It is the same scheduler as :class:`algorithms.fddps_dcp.DCPScheduler`, statement for statement:
Sort_Node (Alg. 1) on the lazy ready heap keyed by (-(TL + BL), queue position), Find_Slot
(Alg. 2) with Eq. 11 and the device rules (1)-(4) and Eq. 12, and the incremental updates (DCPL
from a lazy max-heap, TL pushed through the forward cone of the operator after the slot, bottom
levels of placed operators marked stale and recomputed on demand).  Both heaps hold keys that
are totally ordered (every entry carries its node and a version), so any correct heap pops them
in the same order; the float expressions are written in the same order as in Python, so the
schedule is the same to the bit (tests/test_fddps.py compares both on random graphs).

What it does not cover stays in Python: ``slot="idle"`` with the gap index (the linear scan of
idle gaps is covered), and transfer costs that are not a route's latency plus bytes over its
bandwidth (:func:`algorithms.sched.schedgraph.route_tables`).
"""

from __future__ import annotations

import heapq

import numpy as np
from numba import njit

#: indices of the counters in the ``stats`` array the kernel fills
STATS = ("rule_parent", "rule_lookahead", "rule_earliest", "rule_fallback", "rule_pinned", "forward_updates",
         "bl_recomputed", "bl_marked", "slot_scans", "horizon_cuts")
R_PARENT, R_LOOKAHEAD, R_EARLIEST, R_FALLBACK, R_PINNED = 0, 1, 2, 3, 4
S_FORWARD, S_BL_RE, S_BL_MARKED, S_SCANS, S_CUTS = 5, 6, 7, 8, 9


@njit(cache=True)
def _comm(b, a, d, lat, bw):  # type: ignore[no-untyped-def]
    """c_ij of ``b`` bytes from device a to device d (0 on one device), as ``comm_fn``."""
    if a == d or b <= 0:
        return 0.0
    return lat[a, d] + b / bw[a, d]


@njit(cache=True)
def _bottom_level(x, BL, bdirty, ETa, dev, nb, cbar, sptr, succ, seid, dnext, lat, bw, stats):  # type: ignore[no-untyped-def]
    """BL of a placed operator, recomputing the stale values below it (post-order DFS)."""
    if not bdirty[x]:
        return BL[x]
    stack = [x]
    n_re = 0
    while len(stack):
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
            t = (_comm(nb[seid[i]], dy, dc, lat, bw) if dc >= 0 else cbar[seid[i]]) + BL[c]
            if t > best:
                best = t
        BL[y] = ETa[y] + best
        bdirty[y] = False
        n_re += 1
        stack.pop()
    stats[S_BL_RE] += n_re
    return BL[x]


@njit(cache=True)
def _mark_dirty(o, bdirty, pptr, pred, dprev, stats):  # type: ignore[no-untyped-def]
    """o was just placed: mark it and its placed ancestors stale (closed upwards)."""
    stack = [o]
    k = 0
    while len(stack):
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
    stats[S_BL_MARKED] += k


@njit(cache=True)
def _push_dcpl(v, TL, ETa, BL, dev, ver, heap):  # type: ignore[no-untyped-def]
    ver[v] += 1
    val = TL[v] + (ETa[v] if dev[v] >= 0 else BL[v])
    heapq.heappush(heap, (-val, v, ver[v]))


@njit(cache=True)
def _push_ready(v, TL, BL, seq, nseq, rver, rheap):  # type: ignore[no-untyped-def]
    """Enter v in the ready queue; ``nseq`` is a one-element counter of queue positions."""
    if seq[v] < 0:
        seq[v] = nseq[0]
        nseq[0] += 1
    rver[v] += 1
    heapq.heappush(rheap, (-(TL[v] + BL[v]), seq[v], v, rver[v]))


@njit(cache=True)
def _forward(start, TL, ETa, BL, dev, nb, cbar, pptr, pred, peid, sptr, succ, seid, dprev, dnext, missing,  # type: ignore[no-untyped-def]
             ver, dheap, seq, nseq, rver, rheap, inq, lat, bw, stats):
    """Propagate TL increases from ``start`` through placed operators (DAG and device edges)."""
    heap = [(TL[start], start)]
    inq[start] = True
    n_upd = 0
    while len(heap):
        _, x = heapq.heappop(heap)
        inq[x] = False
        q = dprev[x]
        new = TL[q] + ETa[q] if q >= 0 else 0.0
        dx = dev[x]
        for i in range(pptr[x], pptr[x + 1]):
            p = pred[i]
            t = TL[p] + ETa[p] + _comm(nb[peid[i]], dev[p], dx, lat, bw)
            if t > new:
                new = t
        if new == TL[x]:
            continue
        TL[x] = new
        n_upd += 1
        _push_dcpl(x, TL, ETa, BL, dev, ver, dheap)
        fx = new + ETa[x]
        for i in range(sptr[x], sptr[x + 1]):
            c = succ[i]
            if dev[c] >= 0:
                if not inq[c]:
                    inq[c] = True
                    heapq.heappush(heap, (TL[c], c))
            else:
                t = fx + cbar[seid[i]]
                if t > TL[c]:
                    TL[c] = t
                    _push_dcpl(c, TL, ETa, BL, dev, ver, dheap)
                    if missing[c] == 0:
                        _push_ready(c, TL, BL, seq, nseq, rver, rheap)
        y = dnext[x]
        if y >= 0 and not inq[y]:
            inq[y] = True
            heapq.heappush(heap, (TL[y], y))
    stats[S_FORWARD] += n_upd


@njit(cache=True)
def _slot(o, d, dcpl, tol, TL, ETa, BL, bdirty, dev, nb, cbar, et, pptr, pred, peid, sptr, succ, seid,  # type: ignore[no-untyped-def]
          dnext, dl, lst_slots, horizon, lat, bw, stats):
    """(position, start) of o's slot on device d, as ``DCPScheduler._slot``."""
    est = 0.0
    for i in range(pptr[o], pptr[o + 1]):
        p = pred[i]
        t = TL[p] + ETa[p] + _comm(nb[peid[i]], dev[p], d, lat, bw)
        if t > est:
            est = t
    lst = dl[d]
    L = len(lst)
    lo, hi = 0, L  # bisect_right on the finish times
    while lo < hi:
        mid = (lo + hi) // 2
        x = lst[mid]
        if est < TL[x] + ETa[x]:
            hi = mid
        else:
            lo = mid + 1
    k = lo
    if horizon and k < L - horizon:
        k = L - horizon
        stats[S_CUTS] += 1
    prev_end = TL[lst[k - 1]] + ETa[lst[k - 1]] if k > 0 else 0.0
    dur = et[d, o]
    k0 = k
    while k < L:
        m = lst[k]
        s = est if est > prev_end else prev_end
        if s + dur <= TL[m]:
            stats[S_SCANS] += k - k0
            return k, s
        if lst_slots:
            blm = _bottom_level(m, BL, bdirty, ETa, dev, nb, cbar, sptr, succ, seid, dnext, lat, bw, stats) \
                if bdirty[m] else BL[m]
            if s + dur <= dcpl - blm + tol:
                stats[S_SCANS] += k - k0
                return k, s
        prev_end = TL[m] + ETa[m]
        k += 1
    stats[S_SCANS] += k - k0
    return L, (est if est > prev_end else prev_end)


@njit(cache=True)
def dcp_run(pptr, pred, peid, sptr, succ, seid, nb, cbar, et, wbar, bl_static, group, pin, group_mem, mem, free,  # type: ignore[no-untyped-def]
            missing, lat, bw, eps, lst_slots, horizon):
    """Schedule every node (Alg. 3): ``(dev, TL, stats, fallbacks, ok)``.

    Arrays as :class:`algorithms.fddps_dcp.DCPScheduler` holds them: CSR predecessors and
    successors with edge ids, bytes ``nb`` and mean transfer ``cbar`` per edge, ``et [D, n]``,
    ``wbar``, the static bottom level; co-location ``group`` per node, ``pin`` and
    ``group_mem`` per group, ``mem`` per node, ``free`` per device (rule ``whole``, changed in
    place); ``missing`` inputs per node (changed in place); route latency ``lat`` and
    bandwidth ``bw [D, D]``.  ``ok`` is False when the ready queue ran dry (a cycle).
    """
    n = wbar.shape[0]
    D = et.shape[0]
    dev = np.full(n, -1, dtype=np.int64)
    TL = np.zeros(n)
    BL = bl_static.copy()
    bdirty = np.zeros(n, dtype=np.bool_)
    ETa = wbar.copy()
    dnext = np.full(n, -1, dtype=np.int64)
    dprev = np.full(n, -1, dtype=np.int64)
    ver = np.zeros(n, dtype=np.int64)
    rver = np.zeros(n, dtype=np.int64)
    seq = np.full(n, -1, dtype=np.int64)
    nseq = np.zeros(1, dtype=np.int64)
    inq = np.zeros(n, dtype=np.bool_)
    stats = np.zeros(len(STATS), dtype=np.int64)
    fallbacks = 0
    dl = [[np.int64(0)][:0] for _ in range(D)]
    dheap = [(0.0, np.int64(0), np.int64(0))][:0]
    rheap = [(0.0, np.int64(0), np.int64(0), np.int64(0))][:0]
    starts = np.zeros(D)
    positions = np.zeros(D, dtype=np.int64)
    cands = np.zeros(D, dtype=np.int64)
    pflag = np.zeros(D, dtype=np.bool_)
    for v in range(n):
        if missing[v] == 0:
            _push_dcpl(v, TL, ETa, BL, dev, ver, dheap)
            _push_ready(v, TL, BL, seq, nseq, rver, rheap)
    for _ in range(n):
        # DCPL (Eq. 10): the top of the lazy max-heap
        dcpl = 0.0
        while len(dheap):
            negv, v, vv = dheap[0]
            if vv == ver[v]:
                dcpl = -negv
                break
            heapq.heappop(dheap)
        # Sort_Node (Alg. 1): the first critical ready node in queue order, else the highest Score
        tol = eps * max(abs(dcpl), 1e-30)
        found = False
        while len(rheap):
            top = heapq.heappop(rheap)
            if top[3] == rver[top[2]] and dev[top[2]] < 0:
                found = True
                break
        if not found:
            return dev, TL, stats, fallbacks, False
        o = top[2]
        if not (-top[0] < dcpl - tol):
            crit = [top]
            while len(rheap):
                e = heapq.heappop(rheap)
                if not (e[3] == rver[e[2]] and dev[e[2]] < 0):
                    continue
                if -e[0] < dcpl - tol:
                    heapq.heappush(rheap, e)
                    break
                crit.append(e)
            first = 0
            for j in range(1, len(crit)):
                if crit[j][1] < crit[first][1]:
                    first = j
            for j in range(len(crit)):
                if j != first:
                    heapq.heappush(rheap, crit[j])
            o = crit[first][2]
        # Find_Slot (Alg. 2): the memory filter, then a slot on every candidate device
        g = group[o]
        pinned = pin[g] if g >= 0 else -1
        nc = 0
        if pinned >= 0:
            cands[0] = pinned
            nc = 1
        else:
            need = group_mem[g] if g >= 0 else mem[o]
            for d in range(D):
                if free[d] >= need:
                    cands[nc] = d
                    nc += 1
            if nc == 0:
                fallbacks += 1
                cands[0] = np.argmax(free)
                nc = 1
        for j in range(nc):
            d = cands[j]
            positions[d], starts[d] = _slot(o, d, dcpl, tol, TL, ETa, BL, bdirty, dev, nb, cbar, et, pptr, pred,
                                            peid, sptr, succ, seid, dnext, dl, lst_slots, horizon, lat, bw, stats)
        rule = -1
        best_d = cands[0]
        if nc == 1 and pinned >= 0:
            rule = R_PINNED
        else:
            lst_o = dcpl - BL[o]
            n11 = 0
            for j in range(nc):
                if starts[cands[j]] <= lst_o + tol:
                    n11 += 1
            if n11 == 0:
                # rule (4): earliest finish; ties towards the lowest-priority operator after the slot
                best = np.inf
                for j in range(nc):
                    d = cands[j]
                    f = starts[d] + et[d, o]
                    if f < best:
                        best = f
                nties = 0
                best_key = 0.0
                for j in range(nc):
                    d = cands[j]
                    if starts[d] + et[d, o] <= best + tol:
                        nties += 1
                nt = 0
                for j in range(nc):
                    d = cands[j]
                    if not (starts[d] + et[d, o] <= best + tol):
                        continue
                    if nties == 1:
                        best_d = d
                        break
                    lst = dl[d]
                    k = positions[d]
                    if k >= len(lst):
                        key = -np.inf
                    else:
                        m = lst[k]
                        key = -(dcpl - _bottom_level(m, BL, bdirty, ETa, dev, nb, cbar, sptr, succ, seid, dnext, lat,
                                                     bw, stats) - TL[m])
                    if nt == 0 or key < best_key:  # ties in slack: the lower device, met first
                        best_key, best_d = key, d
                    nt += 1
                rule = R_FALLBACK
            else:
                for d in range(D):
                    pflag[d] = False
                for i in range(pptr[o], pptr[o + 1]):
                    pd = dev[pred[i]]
                    if pd >= 0:
                        pflag[pd] = True
                npar = 0
                for j in range(nc):
                    d = cands[j]
                    if starts[d] <= lst_o + tol and pflag[d]:
                        npar += 1
                use_par = npar > 0
                pool = np.empty(nc, dtype=np.int64)
                npool = 0
                for j in range(nc):
                    d = cands[j]
                    if starts[d] <= lst_o + tol and (pflag[d] or not use_par):
                        pool[npool] = d
                        npool += 1
                if npool == 1:
                    best_d = pool[0]
                    rule = R_PARENT if use_par else R_EARLIEST
                else:
                    # Eq. 12's o_c: the child of highest Score (TL + BL, with o placed at its EST)
                    bk, child = -1.0, -1
                    fo = TL[o] + wbar[o]
                    for i in range(sptr[o], sptr[o + 1]):
                        c = succ[i]
                        t = fo + cbar[seid[i]]
                        key = BL[c] + (t if t > TL[c] else TL[c])
                        if key > bk:
                            bk, child = key, c
                    if child < 0:
                        best_d = pool[0]
                        for j in range(1, npool):
                            d = pool[j]
                            if starts[d] < starts[best_d]:
                                best_d = d
                        rule = R_PARENT if use_par else R_EARLIEST
                    else:
                        # Eq. 12: the device minimising start(o) + start(o_c) with o_c right after o
                        best_sum, best_start = 0.0, 0.0  # the key (start(o) + start(o_c), start(o), device)
                        for j in range(npool):
                            d = pool[j]
                            s = starts[d]
                            sc = s + et[d, o]
                            for i in range(pptr[child], pptr[child + 1]):
                                q = pred[i]
                                if q == o or dev[q] < 0:
                                    continue
                                t = TL[q] + ETa[q] + _comm(nb[peid[i]], dev[q], d, lat, bw)
                                if t > sc:
                                    sc = t
                            if j == 0 or s + sc < best_sum or (s + sc == best_sum and s < best_start):
                                best_sum, best_start, best_d = s + sc, s, d
                        rule = R_PARENT if use_par else R_LOOKAHEAD
        stats[rule] += 1
        # Update (Sec. 4.3 (3)): put o on best_d in its slot, then TL / BL / DCPL
        d = best_d
        k, s = positions[d], starts[d]
        lst = dl[d]
        lst.insert(k, o)
        prev = lst[k - 1] if k > 0 else -1
        nxt = lst[k + 1] if k + 1 < len(lst) else -1
        dprev[o], dnext[o] = prev, nxt
        if prev >= 0:
            dnext[prev] = o
        if nxt >= 0:
            dprev[nxt] = o
        dev[o] = d
        ETa[o] = et[d, o]
        TL[o] = s
        if g < 0:
            free[d] -= mem[o]
        elif pin[g] < 0:
            pin[g] = d
            free[d] -= group_mem[g]
        fo = s + ETa[o]
        for i in range(sptr[o], sptr[o + 1]):
            c = succ[i]
            t = fo + cbar[seid[i]]
            if t > TL[c]:
                TL[c] = t
                _push_dcpl(c, TL, ETa, BL, dev, ver, dheap)
            elif ver[c] == 0:  # its first placed parent: its path term enters DCPL
                _push_dcpl(c, TL, ETa, BL, dev, ver, dheap)
        for i in range(sptr[o], sptr[o + 1]):
            c = succ[i]
            missing[c] -= 1
            if missing[c] == 0:
                _push_ready(c, TL, BL, seq, nseq, rver, rheap)
        _push_dcpl(o, TL, ETa, BL, dev, ver, dheap)
        if nxt >= 0:
            _forward(nxt, TL, ETa, BL, dev, nb, cbar, pptr, pred, peid, sptr, succ, seid, dprev, dnext, missing, ver,
                     dheap, seq, nseq, rver, rheap, inq, lat, bw, stats)
        _mark_dirty(o, bdirty, pptr, pred, dprev, stats)
    return dev, TL, stats, fallbacks, True
