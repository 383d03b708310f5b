"""The engine's event loop, compiled with numba: the rules of :mod:`simulators.engine`, one task
per iteration, on flat arrays.

The heaps are binary heaps over preallocated arrays, keyed by ``(key, task id)``. Every key
pushed is distinct (a compute task is pushed again only at a later time, when a receive
lengthens it), so any correct heap pops them in the one sorted order that Python's ``heapq``
pops them in, and the timeline is the same bit for bit. Only additions and comparisons touch
the times, so compilation cannot reassociate or fuse anything.

Compiled once per machine and cached beside this file (numba's ``cache=True``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

STRICT, PRIORITY, READY = 0, 1, 2


@njit(cache=True)
def _less(ka, ia, kb, ib):  # type: ignore[no-untyped-def]
    return ka < kb or (ka == kb and ia < ib)


@njit(cache=True)
def _push(key, ids, base, n, k, i):  # type: ignore[no-untyped-def]
    """Push ``(k, i)`` on the heap of ``n`` entries at ``key/ids[base:]``; returns the new size."""
    j = n
    while j > 0:
        p = (j - 1) >> 1
        if _less(key[base + p], ids[base + p], k, i):
            break
        key[base + j] = key[base + p]
        ids[base + j] = ids[base + p]
        j = p
    key[base + j] = k
    ids[base + j] = i
    return n + 1


@njit(cache=True)
def _pop(key, ids, base, n):  # type: ignore[no-untyped-def]
    """Pop the smallest ``(k, i)`` of the heap of ``n`` entries at ``key/ids[base:]``."""
    k0 = key[base]
    i0 = ids[base]
    n -= 1
    if n > 0:
        k = key[base + n]
        i = ids[base + n]
        j = 0
        while True:
            c = 2 * j + 1
            if c >= n:
                break
            if c + 1 < n and _less(key[base + c + 1], ids[base + c + 1], key[base + c], ids[base + c]):
                c += 1
            if _less(key[base + c], ids[base + c], k, i):
                key[base + j] = key[base + c]
                ids[base + j] = ids[base + c]
                j = c
            else:
                break
        key[base + j] = k
        ids[base + j] = i
    return k0, i0, n


@njit(cache=True)
def schedule(dur, dev, is_comp, succ_ptr, succ_idx, res_ptr, res_idx, indeg, prio, dst, steal,
             seq_ptr, seq_idx, num_devices, num_links, mode):  # type: ignore[no-untyped-def]
    """List-schedule the tasks; returns ``(start, end, cp, stolen)`` (``end`` stays -1 for a
    task that never ran). ``seq_idx[seq_ptr[d]:seq_ptr[d + 1]]`` is device d's compute tasks
    in strategy order (strict mode)."""
    T = len(dur)
    start = np.zeros(T)
    end = np.full(T, -1.0)
    cp = np.zeros(T)
    remaining = indeg.copy()
    link_free = np.zeros(num_links)
    busy = np.zeros(num_devices, dtype=np.bool_)
    running = np.full(num_devices, -1, dtype=np.int64)
    stolen = np.zeros(num_devices)
    ready = np.zeros(T, dtype=np.bool_)
    pos = np.zeros(num_devices, dtype=np.int64)
    head = np.full(num_devices, -1, dtype=np.int64)
    for d in range(num_devices):
        if seq_ptr[d + 1] > seq_ptr[d]:
            head[d] = seq_idx[seq_ptr[d]]
    strict = mode == STRICT
    by_prio = mode == PRIORITY
    has_steal = len(steal) > 0
    # the event heap: a task is pushed once, a compute task again each time a receive lengthens it
    cap = T + 1 + (T if has_steal else 0)
    ev_key = np.zeros(cap)
    ev_id = np.zeros(cap, dtype=np.int64)
    nev = 0
    # per-device ready heaps (priority / ready modes): device d's at offset dh_base[d]
    dh_base = np.zeros(num_devices + 1, dtype=np.int64)
    for t in range(T):
        if is_comp[t]:
            dh_base[dev[t] + 1] += 1
    for d in range(num_devices):
        dh_base[d + 1] += dh_base[d]
    dh_key = np.zeros(max(dh_base[num_devices], 1), dtype=np.int64)
    dh_id = np.zeros(max(dh_base[num_devices], 1), dtype=np.int64)
    dh_n = np.zeros(num_devices, dtype=np.int64)
    arrivals = 0

    # the roots are released at time 0 as the successors of a virtual task
    roots = np.flatnonzero(remaining == 0)
    for t in roots:
        remaining[t] = 1
    cur = roots
    lo = 0
    hi = len(roots)
    now = 0.0
    cp_end = 0.0
    d = -1
    while True:
        # -- release the successors of the task that finished at `now`; start what is ready
        for k in range(lo, hi):
            s = cur[k]
            if cp_end > cp[s]:
                cp[s] = cp_end
            r = remaining[s] - 1
            remaining[s] = r
            if r:
                continue
            if is_comp[s]:
                dd = dev[s]
                if strict:
                    ready[s] = True
                    if busy[dd] or head[dd] != s:
                        continue
                else:
                    arrivals += 1
                    dh_n[dd] = _push(dh_key, dh_id, dh_base[dd], dh_n[dd], prio[s] if by_prio else arrivals, s)
                    if busy[dd]:
                        continue
                    _, s, n = _pop(dh_key, dh_id, dh_base[dd], dh_n[dd])
                    dh_n[dd] = n
                busy[dd] = True
                running[dd] = s
                start[s] = now
                e = now + dur[s]
                end[s] = e
                nev = _push(ev_key, ev_id, 0, nev, e, s)
                continue
            st = now
            for j in range(res_ptr[s], res_ptr[s + 1]):
                f = link_free[res_idx[j]]
                if f > st:
                    st = f
            e = st + dur[s]
            for j in range(res_ptr[s], res_ptr[s + 1]):
                link_free[res_idx[j]] = e
            start[s] = st
            end[s] = e
            nev = _push(ev_key, ev_id, 0, nev, e, s)
        # -- a device that finished may start its next task
        if d >= 0 and not busy[d]:
            nxt = -1
            if strict:
                nxt = head[d]
                if nxt >= 0 and not ready[nxt]:
                    nxt = -1
            elif dh_n[d] > 0:
                _, nxt, n = _pop(dh_key, dh_id, dh_base[d], dh_n[d])
                dh_n[d] = n
            if nxt >= 0:
                busy[d] = True
                running[d] = nxt
                start[nxt] = now
                e = now + dur[nxt]
                end[nxt] = e
                nev = _push(ev_key, ev_id, 0, nev, e, nxt)
        if nev == 0:
            break
        # -- next event: task t finishes at `now`
        now, t, nev = _pop(ev_key, ev_id, 0, nev)
        cur = succ_idx
        if is_comp[t]:
            if now != end[t]:  # lengthened by a receive since this event was pushed
                lo = 0
                hi = 0
                d = -1
                continue
            d = dev[t]
            busy[d] = False
            if strict:
                p = pos[d] + 1
                pos[d] = p
                head[d] = seq_idx[seq_ptr[d] + p] if p < seq_ptr[d + 1] - seq_ptr[d] else -1
            cp_end = cp[t] + dur[t]
        else:
            d = -1
            cp_end = cp[t]
            if has_steal and steal[t] > 0.0:
                dd = dst[t]
                if busy[dd]:
                    c = running[dd]
                    e = end[c] + steal[t]
                    end[c] = e
                    stolen[dd] += steal[t]
                    nev = _push(ev_key, ev_id, 0, nev, e, c)
        lo = succ_ptr[t]
        hi = succ_ptr[t + 1]
    return start, end, cp, stolen


@njit(cache=True)
def buffer_peaks(num_devices, is_comp, start, end, succ_ptr, succ_idx, use_ptr, use_idx, alloc_dev, alloc_bytes):  # type: ignore[no-untyped-def]
    """Peak bytes of the buffers alive at once per device (:func:`simulators.engine.peak_memory`'s
    rules): a compute task's buffer from its start, a transfer's from when it is queued (its
    last predecessor's end), each until the last task reading it ends; frees before
    allocations at equal times."""
    T = len(start)
    queued = np.zeros(T)
    t_free = end.copy()
    for t in range(T):
        e = end[t]
        for j in range(succ_ptr[t], succ_ptr[t + 1]):
            s = succ_idx[j]
            if e > queued[s]:
                queued[s] = e
        for j in range(use_ptr[t], use_ptr[t + 1]):
            b = use_idx[j]
            if e > t_free[b]:
                t_free[b] = e
    n = 0
    for t in range(T):
        if alloc_dev[t] >= 0 and alloc_bytes[t] != 0:
            n += 1
    buf = np.empty(n, dtype=np.int64)
    k = 0
    for t in range(T):
        if alloc_dev[t] >= 0 and alloc_bytes[t] != 0:
            buf[k] = t
            k += 1
    # events 0..n-1 free, n..2n-1 allocate, in time order; a stable sort keeps frees first at equal times
    times = np.empty(2 * n)
    for k in range(n):
        b = buf[k]
        times[k] = t_free[b]
        times[n + k] = start[b] if is_comp[b] else queued[b]
    order = np.argsort(times, kind="mergesort")
    running = np.zeros(num_devices, dtype=np.int64)
    peak = np.zeros(num_devices, dtype=np.int64)
    for k in order:
        b = buf[k % n]
        d = alloc_dev[b]
        running[d] += -alloc_bytes[b] if k < n else alloc_bytes[b]
        if running[d] > peak[d]:
            peak[d] = running[d]
    return peak
