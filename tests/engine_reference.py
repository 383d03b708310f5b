"""The engine's event loop and memory peaks as plain Python: the readable statement of the
rules of :mod:`simulators.engine` that its compiled loop (:mod:`simulators.engine_loop`) must
reproduce bit for bit (tests/test_engine_compiled.py). Not used by the product."""

from __future__ import annotations

import heapq

import numpy as np

from simulators.engine import MODES, EngineResult, SimulationError
from simulators.taskgraph import COMPUTE, TaskGraph


def run(tg: TaskGraph, num_devices: int, num_links: int, mode: str = "strict") -> EngineResult:
    """:func:`simulators.engine.run`, in Python (as it was before the loop was compiled)."""
    if mode not in MODES:
        raise ValueError(f"sim.order must be one of {MODES}, got {mode!r}")
    T = tg.num_tasks
    dur = tg.dur.tolist()
    dev = tg.dev.tolist()
    succ_ptr = tg.succ_ptr.tolist()
    succ_idx = tg.succ_idx.tolist()
    res_ptr = tg.res_ptr.tolist()
    res_idx = tg.res_idx.tolist()
    remaining = tg.indeg.tolist()
    prio = tg.prio.tolist()
    dst = tg.dst.tolist()
    steal = tg.steal.tolist() if tg.steal is not None and len(tg.steal) and tg.steal.any() else None
    running = [-1] * num_devices
    stolen = [0.0] * num_devices

    start = [0.0] * T
    end = [-1.0] * T  # stays negative for a task that never ran
    cp = [0.0] * T  # earliest start with free communication (for the lower bound)
    link_free = [0.0] * num_links
    busy = [False] * num_devices
    ready = [False] * T
    comp_mask = tg.kind == COMPUTE
    is_comp = comp_mask.tolist()
    strict = mode == "strict"
    by_prio = mode == "priority"
    comp = np.flatnonzero(comp_mask)
    seq: list[list[int]] = [[] for _ in range(num_devices)]
    if strict:
        by = comp[np.lexsort((comp, tg.prio[comp], tg.dev[comp]))]
        for t in by.tolist():
            seq[dev[t]].append(t)
    # head[d]: the next task of device d's sequence in strict mode (-1 once it is done)
    head = [s[0] if s else -1 for s in seq]
    seq_len = [len(x) for x in seq]
    pos = [0] * num_devices
    dev_heap: list[list[tuple[int, int]]] = [[] for _ in range(num_devices)]
    heap: list[tuple[float, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    arrivals = 0

    # The roots are released at time 0 as if they were the successors of a virtual task,
    # so one loop handles them and every later release: tasks released by the same event
    # start in id order, events are handled in (time, task id) order.
    succ = [t for t in range(T) if remaining[t] == 0]
    for t in succ:
        remaining[t] = 1
    now = 0.0
    cp_end = 0.0
    d = -1
    while True:
        # -- release the successors of the task that finished at `now`; start what is ready
        for s in succ:
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
                    push(dev_heap[dd], (prio[s] if by_prio else arrivals, s))
                    if busy[dd]:
                        continue
                    s = pop(dev_heap[dd])[1]
                busy[dd] = True
                running[dd] = s
                start[s] = now
                e = now + dur[s]
                end[s] = e
                push(heap, (e, s))
                continue
            links = res_idx[res_ptr[s]:res_ptr[s + 1]]
            st = now
            for l in links:
                f = link_free[l]
                if f > st:
                    st = f
            e = st + dur[s]
            for l in links:
                link_free[l] = e
            start[s] = st
            end[s] = e
            push(heap, (e, s))
        # -- a device that finished may start its next task
        if d >= 0 and not busy[d]:
            nxt = -1
            if strict:
                nxt = head[d]
                if nxt >= 0 and not ready[nxt]:
                    nxt = -1
            elif dev_heap[d]:
                nxt = pop(dev_heap[d])[1]
            if nxt >= 0:
                busy[d] = True
                running[d] = nxt
                start[nxt] = now
                e = now + dur[nxt]
                end[nxt] = e
                push(heap, (e, nxt))
        if not heap:
            break
        # -- next event: task t finishes at `now`
        now, t = pop(heap)
        if is_comp[t]:
            if now != end[t]:  # lengthened by a receive since this event was pushed
                succ = []
                d = -1
                continue
            d = dev[t]
            busy[d] = False
            if strict:
                p = pos[d] + 1
                pos[d] = p
                head[d] = seq[d][p] if p < seq_len[d] else -1
            cp_end = cp[t] + dur[t]
        else:
            d = -1
            cp_end = cp[t]
            if steal is not None and steal[t] > 0.0:
                dd = dst[t]
                if busy[dd]:
                    c = running[dd]
                    e = end[c] + steal[t]
                    end[c] = e
                    stolen[dd] += steal[t]
                    push(heap, (e, c))
        succ = succ_idx[succ_ptr[t]:succ_ptr[t + 1]]

    start_a = np.asarray(start)
    end_a = np.asarray(end)
    not_run = np.flatnonzero(end_a < 0)
    if len(not_run):
        raise SimulationError(
            f"simulation stopped with {len(not_run)} of {T} tasks not run (first waiting task {int(not_run[0])}): "
            "the schedule order deadlocks or the task graph has a cycle"
        )
    busy_time = np.bincount(tg.dev[comp_mask], weights=tg.dur[comp_mask], minlength=num_devices) + np.asarray(stolen)
    owner = np.repeat(np.arange(T), np.diff(tg.res_ptr))
    link_busy = np.bincount(tg.res_idx, weights=tg.dur[owner], minlength=num_links) if len(owner) else np.zeros(num_links)
    cp_a = np.asarray(cp)
    return EngineResult(
        start=start_a,
        end=end_a,
        makespan=float(end_a.max()) if T else 0.0,
        busy=busy_time,
        peak_mem=peak_memory(tg, start_a, end_a, num_devices),
        link_busy=link_busy,
        critical_path=float((cp_a + tg.dur)[comp_mask].max()) if len(comp) else 0.0,
    )


def peak_memory(tg: TaskGraph, start: np.ndarray, end: np.ndarray, num_devices: int) -> np.ndarray:
    """:func:`simulators.engine.peak_memory`, vectorised with numpy (as it was before it was compiled).

    A compute task's output lives from its start, a transfer's received copy from the
    moment the transfer is queued (its last predecessor's end), and a buffer until the
    last task reading it ends (its own end when nothing reads it).  At equal times frees
    come before allocations, as on a device where the next op starts once the previous
    one has released its inputs.  Vectorised over all buffers (sorts and a cumsum),
    so the event loop carries no memory bookkeeping.
    """
    T = len(start)
    static = tg.static_mem.astype(np.int64)
    buf = np.flatnonzero((tg.alloc_dev >= 0) & (tg.alloc_bytes != 0))
    if not len(buf):
        return static.copy()
    queued = np.zeros(T)
    if len(tg.succ_idx):
        np.maximum.at(queued, tg.succ_idx, end[np.repeat(np.arange(T), np.diff(tg.succ_ptr))])
    t_alloc = np.where(tg.kind == COMPUTE, start, queued)
    t_free = end.copy()
    if len(tg.use_idx):
        np.maximum.at(t_free, tg.use_idx, end[np.repeat(np.arange(T), np.diff(tg.use_ptr))])
    nb = tg.alloc_bytes[buf].astype(np.int64)
    n = len(buf)
    dev = np.concatenate([tg.alloc_dev[buf], tg.alloc_dev[buf]])
    delta = np.concatenate([-nb, nb])
    # events 0..n-1 free, n..2n-1 allocate; time order with frees first at equal times: sort
    # each half (any order among equal times is fine within a half), then a stable sort of the
    # two sorted runs, frees first (timsort merges two runs in linear time); a stable radix
    # sort by device then keeps that order within each device
    tf, ta = t_free[buf], t_alloc[buf]
    fr, al = np.argsort(tf), np.argsort(ta)
    by_time = np.concatenate([fr, al + n])[np.argsort(np.concatenate([tf[fr], ta[al]]), kind="stable")]
    dkey = dev[by_time].astype(np.int16 if num_devices < 2**15 else np.int64)
    order = by_time[np.argsort(dkey, kind="stable")]
    running = np.cumsum(delta[order])
    dev_sorted = dev[order]
    counts = np.bincount(dev_sorted, minlength=num_devices)
    first = np.cumsum(counts) - counts
    present = np.flatnonzero(counts)
    # running total within each device's segment, then its maximum
    base = np.zeros(num_devices, dtype=np.int64)
    base[present] = np.where(first[present] > 0, running[first[present] - 1], 0)
    running -= base[dev_sorted]
    peak = static.copy()
    peak[present] += np.maximum(np.maximum.reduceat(running, first[present]), 0)
    return peak
