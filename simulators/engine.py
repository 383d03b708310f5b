"""The discrete-event engine: list-schedules a :class:`~simulators.taskgraph.TaskGraph`.

* A device runs one compute task at a time.  ``strict`` mode runs each device's tasks in
  strategy order, as a real rank executing its schedule does; ``priority`` starts the
  ready task with the smallest order; ``ready`` starts ready tasks first come, first served.
* A transfer (or collective) holds every link of its route for its whole duration; links
  serve transfers first come, first served, so transfers that share a link contend.
  A transfer is queued when its producer finishes and starts once all its links are free.
* A transfer with a ``steal`` time (CPU devices whose receiving thread shares the core:
  :class:`simulators.hostcost.CpuHostCost` with ``recv_when: busy``) that arrives while its
  destination device computes lengthens that compute task by it: the receive preempted the
  op.  Arriving at an idle device it costs nothing more (the link's latency holds the wake-up).
* Events are kept in a heap of ``(time, task id)``: ties are broken by task id, so the
  same input gives the same timeline bit for bit.
* Memory: a compute task allocates its output buffer when it starts, a transfer its
  received copy when it is queued; a buffer is freed when the last task reading it
  finishes.  It is worked out after the loop from the timeline (:func:`peak_memory`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from harness.core.compiled import use_compiled
from simulators.taskgraph import COMPUTE, TaskGraph

MODES = ("strict", "priority", "ready")


class SimulationError(RuntimeError):
    """The task graph could not be run to completion (a dependency cycle or an order deadlock)."""


@dataclass(eq=False)
class EngineResult:
    start: np.ndarray
    end: np.ndarray
    makespan: float
    busy: np.ndarray  # compute seconds per device
    peak_mem: np.ndarray  # bytes per device
    link_busy: np.ndarray  # seconds per link
    critical_path: float  # longest chain of compute time, communication counted as free


#: the compiled loop (simulators/engine_loop.py) runs task graphs of at least COMPILED_FROM tasks
#: once it is loaded in the process (:func:`warm_up`; a sweep loads it before its workers fork),
#: and of at least COLD_FROM when loading it is part of the cost: numba's start-up, about 0.5 s
#: per process, against the Python loop's 200k tasks/s and the compiled one's 6M
COMPILED_FROM = 20_000
COLD_FROM = 150_000


def warm_up() -> None:
    """Load the compiled loop and memory peaks (numba's cache, or a compile on a first run), so
    that this process and the workers it forks run them with no start-up cost."""
    from simulators.engine_loop import buffer_peaks, schedule

    z = np.zeros(0, dtype=np.int64)
    one = np.zeros(1, dtype=np.int64)
    ptr = np.zeros(2, dtype=np.int64)
    schedule(np.zeros(1), one, np.ones(1, dtype=np.bool_), ptr, z, ptr, z, one, one, one, np.zeros(0), np.array([0, 1]), one, 1, 0, 0)
    buffer_peaks(1, np.ones(1, dtype=np.bool_), np.zeros(1), np.ones(1), ptr, z, ptr, z, one, one)


def _compiled_by_default(num_tasks: int) -> bool:
    """Whether a task graph of ``num_tasks`` runs compiled when the caller does not say."""
    return use_compiled(num_tasks, COMPILED_FROM, COLD_FROM, kernel="simulators.engine_loop")


def run(tg: TaskGraph, num_devices: int, num_links: int, mode: str = "strict", compiled: bool | None = None) -> EngineResult:
    """Simulate the task graph; see the module docstring for the rules. The loop runs compiled
    (:mod:`simulators.engine_loop`) on large task graphs (:data:`COMPILED_FROM`, :data:`COLD_FROM`),
    in Python on small ones, or as ``compiled`` says; both give the same timeline to the bit
    (tests/test_engine_compiled.py)."""
    if mode not in MODES:
        raise ValueError(f"sim.order must be one of {MODES}, got {mode!r}")
    T = tg.num_tasks
    comp_mask = tg.kind == COMPUTE
    compiled = compiled if compiled is not None else _compiled_by_default(T)
    if compiled:
        start_a, end_a, cp_a, stolen = _schedule_compiled(tg, num_devices, num_links, mode)
    else:
        start_a, end_a, cp_a, stolen = _schedule_python(tg, num_devices, num_links, mode)
    not_run = np.flatnonzero(end_a < 0)
    if len(not_run):
        raise SimulationError(
            f"simulation stopped with {len(not_run)} of {T} tasks not run (first waiting task {int(not_run[0])}): "
            "the schedule order deadlocks or the task graph has a cycle"
        )
    busy_time = np.bincount(tg.dev[comp_mask], weights=tg.dur[comp_mask], minlength=num_devices) + stolen
    owner = np.repeat(np.arange(T), np.diff(tg.res_ptr))
    link_busy = np.bincount(tg.res_idx, weights=tg.dur[owner], minlength=num_links) if len(owner) else np.zeros(num_links)
    return EngineResult(
        start=start_a,
        end=end_a,
        makespan=float(end_a.max()) if T else 0.0,
        busy=busy_time,
        peak_mem=peak_memory(tg, start_a, end_a, num_devices, compiled),
        link_busy=link_busy,
        critical_path=float((cp_a + tg.dur)[comp_mask].max()) if comp_mask.any() else 0.0,
    )


def _schedule_compiled(tg: TaskGraph, num_devices: int, num_links: int, mode: str) -> tuple[np.ndarray, ...]:
    """:func:`simulators.engine_loop.schedule` on the task graph's arrays: ``(start, end, cp, stolen)``."""
    from simulators.engine_loop import schedule

    comp = np.flatnonzero(tg.kind == COMPUTE)
    dev = tg.dev.astype(np.int64)
    # device d's compute tasks in strategy order (strict mode), as one CSR
    by = comp[np.lexsort((comp, tg.prio[comp], tg.dev[comp]))] if mode == "strict" else np.zeros(0, dtype=np.int64)
    seq_ptr = np.zeros(num_devices + 1, dtype=np.int64)
    if len(by):
        seq_ptr[1:] = np.cumsum(np.bincount(dev[by], minlength=num_devices))
    has_steal = tg.steal is not None and len(tg.steal) and tg.steal.any()
    return schedule(
        tg.dur.astype(np.float64), dev, tg.kind == COMPUTE, tg.succ_ptr.astype(np.int64), tg.succ_idx.astype(np.int64),
        tg.res_ptr.astype(np.int64), tg.res_idx.astype(np.int64), tg.indeg.astype(np.int64), tg.prio.astype(np.int64),
        tg.dst.astype(np.int64), tg.steal.astype(np.float64) if has_steal else np.zeros(0), seq_ptr, by.astype(np.int64),
        num_devices, num_links, MODES.index(mode))


def _schedule_python(tg: TaskGraph, num_devices: int, num_links: int, mode: str) -> tuple[np.ndarray, ...]:
    """The event loop in Python, for small task graphs: ``(start, end, cp, stolen)``. Written
    flat (no helper calls, slices instead of index loops) because it runs once per task."""
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

    return np.asarray(start), np.asarray(end), np.asarray(cp), np.asarray(stolen)


def peak_memory(tg: TaskGraph, start: np.ndarray, end: np.ndarray, num_devices: int, compiled: bool | None = None) -> np.ndarray:
    """Peak bytes per device over the simulated step, from the buffers' lifetimes.

    A compute task's output lives from its start, a transfer's received copy from the
    moment the transfer is queued (its last predecessor's end), and a buffer until the
    last task reading it ends (its own end when nothing reads it).  At equal times frees
    come before allocations, as on a device where the next op starts once the previous
    one has released its inputs.  Worked out after the loop from the timeline, so the event
    loop carries no memory bookkeeping; the parameters are static. Compiled
    (:func:`simulators.engine_loop.buffer_peaks`, one stable sort) where the loop is.
    """
    if not (compiled if compiled is not None else _compiled_by_default(len(start))):
        return _peaks_numpy(tg, start, end, num_devices)
    from simulators.engine_loop import buffer_peaks

    peak = buffer_peaks(num_devices, tg.kind == COMPUTE, start, end, tg.succ_ptr.astype(np.int64), tg.succ_idx.astype(np.int64),
                        tg.use_ptr.astype(np.int64), tg.use_idx.astype(np.int64), tg.alloc_dev.astype(np.int64),
                        tg.alloc_bytes.astype(np.int64))
    return tg.static_mem.astype(np.int64) + peak


def _peaks_numpy(tg: TaskGraph, start: np.ndarray, end: np.ndarray, num_devices: int) -> np.ndarray:
    """:func:`peak_memory` vectorised with numpy (sorts and a cumsum).

    A compute task's output lives from its start, a transfer's received copy from the
    moment the transfer is queued (its last predecessor's end), and a buffer until the
    last task reading it ends (its own end when nothing reads it).  At equal times frees
    come before allocations, as on a device where the next op starts once the previous
    one has released its inputs.
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
