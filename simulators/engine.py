"""The discrete-event engine: list-schedules a :class:`~simulators.taskgraph.TaskGraph`.

* A device runs one compute task at a time.  ``strict`` mode runs each device's tasks in
  strategy order, as a real rank executing its schedule does; ``priority`` starts the
  ready task with the smallest order; ``ready`` starts ready tasks first come, first served.
* A transfer (or collective) holds every link of its route for its whole duration; links
  serve transfers first come, first served, so transfers that share a link contend.
  A transfer is queued when its producer finishes and starts once all its links are free.
* Events are kept in a heap of ``(time, task id)``: ties are broken by task id, so the
  same input gives the same timeline bit for bit.
* Memory: a compute task allocates its output buffer when it starts, a transfer its
  received copy when it is queued; a buffer is freed when the last task reading it finishes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

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


def run(tg: TaskGraph, num_devices: int, num_links: int, mode: str = "strict") -> EngineResult:
    """Simulate the task graph; see the module docstring for the rules.

    The loop is written flat (no helper calls, slices instead of index loops) because it
    runs once per task: it is the simulator's hot path.
    """
    if mode not in MODES:
        raise ValueError(f"sim.order must be one of {MODES}, got {mode!r}")
    T = tg.num_tasks
    kind = tg.kind.tolist()
    dur = tg.dur.tolist()
    dev = tg.dev.tolist()
    succ_ptr = tg.succ_ptr.tolist()
    succ_idx = tg.succ_idx.tolist()
    res_ptr = tg.res_ptr.tolist()
    res_idx = tg.res_idx.tolist()
    use_ptr = tg.use_ptr.tolist()
    use_idx = tg.use_idx.tolist()
    alloc_dev = tg.alloc_dev.tolist()
    alloc_bytes = tg.alloc_bytes.tolist()
    remaining = tg.indeg.tolist()
    refcnt = np.bincount(tg.use_idx, minlength=T).tolist()
    prio = tg.prio.tolist()

    start = [0.0] * T
    end = [0.0] * T
    cp = [0.0] * T  # earliest start with free communication (for the lower bound)
    link_free = [0.0] * num_links
    cur = tg.static_mem.astype(np.int64).tolist()
    peak = list(cur)
    busy = [False] * num_devices
    ready = [False] * T
    strict = mode == "strict"
    by_prio = mode == "priority"
    comp = np.flatnonzero(tg.kind == COMPUTE)
    seq: list[list[int]] = [[] for _ in range(num_devices)]
    if strict:
        by = comp[np.lexsort((comp, tg.prio[comp], tg.dev[comp]))]
        for t in by.tolist():
            seq[dev[t]].append(t)
    seq_len = [len(x) for x in seq]
    pos = [0] * num_devices
    dev_heap: list[list[tuple[int, int]]] = [[] for _ in range(num_devices)]
    heap: list[tuple[float, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    arrivals = 0
    done = 0

    # tasks ready at time 0, in id order; then events in (time, task id) order
    newly = [t for t in range(T) if remaining[t] == 0]
    now = 0.0
    d = -1
    while True:
        # -- start what became ready at `now`
        for t in newly:
            if kind[t] == COMPUTE:
                dd = dev[t]
                if strict:
                    ready[t] = True
                    if busy[dd] or seq[dd][pos[dd]] != t:
                        continue
                else:
                    arrivals += 1
                    push(dev_heap[dd], (prio[t] if by_prio else arrivals, t))
                    if busy[dd]:
                        continue
                    t = pop(dev_heap[dd])[1]
                busy[dd] = True
                start[t] = now
                e = now + dur[t]
                end[t] = e
                b = alloc_bytes[t]
                if b:
                    c = cur[dd] + b
                    cur[dd] = c
                    if c > peak[dd]:
                        peak[dd] = c
                push(heap, (e, t))
                continue
            links = res_idx[res_ptr[t]:res_ptr[t + 1]]
            st = now
            for l in links:
                f = link_free[l]
                if f > st:
                    st = f
            e = st + dur[t]
            for l in links:
                link_free[l] = e
            start[t] = st
            end[t] = e
            dd = alloc_dev[t]
            if dd >= 0:
                c = cur[dd] + alloc_bytes[t]
                cur[dd] = c
                if c > peak[dd]:
                    peak[dd] = c
            push(heap, (e, t))
        # -- a device that finished may start its next task
        if d >= 0 and not busy[d]:
            nxt = -1
            if strict:
                if pos[d] < seq_len[d]:
                    nxt = seq[d][pos[d]]
                    if not ready[nxt]:
                        nxt = -1
            elif dev_heap[d]:
                nxt = pop(dev_heap[d])[1]
            if nxt >= 0:
                busy[d] = True
                start[nxt] = now
                e = now + dur[nxt]
                end[nxt] = e
                b = alloc_bytes[nxt]
                if b:
                    c = cur[d] + b
                    cur[d] = c
                    if c > peak[d]:
                        peak[d] = c
                push(heap, (e, nxt))
        if not heap:
            break
        # -- next event: task t finishes at `now`
        now, t = pop(heap)
        done += 1
        for b in use_idx[use_ptr[t]:use_ptr[t + 1]]:
            r = refcnt[b] - 1
            refcnt[b] = r
            if r == 0:
                cur[alloc_dev[b]] -= alloc_bytes[b]
        if refcnt[t] == 0 and alloc_dev[t] >= 0:
            cur[alloc_dev[t]] -= alloc_bytes[t]
        if kind[t] == COMPUTE:
            d = dev[t]
            busy[d] = False
            if strict:
                pos[d] += 1
            cp_end = cp[t] + dur[t]
        else:
            d = -1
            cp_end = cp[t]
        newly = []
        for s in succ_idx[succ_ptr[t]:succ_ptr[t + 1]]:
            if cp_end > cp[s]:
                cp[s] = cp_end
            r = remaining[s] - 1
            remaining[s] = r
            if r == 0:
                newly.append(s)

    if done != T:
        stuck = [t for t in range(T) if remaining[t] > 0]
        raise SimulationError(
            f"simulation stopped with {T - done} of {T} tasks not run (first waiting task {stuck[0] if stuck else '?'}): "
            "the schedule order deadlocks or the task graph has a cycle"
        )
    start_a = np.asarray(start)
    end_a = np.asarray(end)
    is_comp = tg.kind == COMPUTE
    busy_time = np.bincount(tg.dev[is_comp], weights=tg.dur[is_comp], minlength=num_devices)
    owner = np.repeat(np.arange(T), np.diff(tg.res_ptr))
    link_busy = np.bincount(tg.res_idx, weights=tg.dur[owner], minlength=num_links) if len(owner) else np.zeros(num_links)
    cp_a = np.asarray(cp)
    return EngineResult(
        start=start_a,
        end=end_a,
        makespan=float(end_a.max()) if T else 0.0,
        busy=busy_time,
        peak_mem=np.asarray(peak, dtype=np.int64),
        link_busy=link_busy,
        critical_path=float((cp_a + tg.dur)[is_comp].max()) if is_comp.any() else 0.0,
    )
