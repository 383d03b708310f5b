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

from dataclasses import dataclass

import numpy as np

from simulators.engine_loop import buffer_peaks, schedule
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
    """Simulate the task graph; see the module docstring for the rules. The event loop is
    :func:`simulators.engine_loop.schedule`, compiled; what is static is prepared here."""
    if mode not in MODES:
        raise ValueError(f"sim.order must be one of {MODES}, got {mode!r}")
    T = tg.num_tasks
    comp_mask = tg.kind == COMPUTE
    comp = np.flatnonzero(comp_mask)
    dev = tg.dev.astype(np.int64)
    # device d's compute tasks in strategy order (strict mode), as one CSR
    by = comp[np.lexsort((comp, tg.prio[comp], tg.dev[comp]))] if mode == "strict" else np.zeros(0, dtype=np.int64)
    seq_ptr = np.zeros(num_devices + 1, dtype=np.int64)
    if len(by):
        seq_ptr[1:] = np.cumsum(np.bincount(dev[by], minlength=num_devices))
    has_steal = tg.steal is not None and len(tg.steal) and tg.steal.any()
    start_a, end_a, cp_a, stolen = schedule(
        tg.dur.astype(np.float64), dev, comp_mask, tg.succ_ptr.astype(np.int64), tg.succ_idx.astype(np.int64),
        tg.res_ptr.astype(np.int64), tg.res_idx.astype(np.int64), tg.indeg.astype(np.int64), tg.prio.astype(np.int64),
        tg.dst.astype(np.int64), tg.steal.astype(np.float64) if has_steal else np.zeros(0), seq_ptr, by.astype(np.int64),
        num_devices, num_links, MODES.index(mode))
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
        peak_mem=peak_memory(tg, start_a, end_a, num_devices),
        link_busy=link_busy,
        critical_path=float((cp_a + tg.dur)[comp_mask].max()) if len(comp) else 0.0,
    )


def peak_memory(tg: TaskGraph, start: np.ndarray, end: np.ndarray, num_devices: int) -> np.ndarray:
    """Peak bytes per device over the simulated step, from the buffers' lifetimes.

    A compute task's output lives from its start, a transfer's received copy from the
    moment the transfer is queued (its last predecessor's end), and a buffer until the
    last task reading it ends (its own end when nothing reads it).  At equal times frees
    come before allocations, as on a device where the next op starts once the previous
    one has released its inputs.  Worked out after the loop from the timeline
    (:func:`simulators.engine_loop.buffer_peaks`, one stable sort of the buffers' events),
    so the event loop carries no memory bookkeeping; the parameters are static.
    """
    peak = buffer_peaks(num_devices, tg.kind == COMPUTE, start, end, tg.succ_ptr.astype(np.int64), tg.succ_idx.astype(np.int64),
                        tg.use_ptr.astype(np.int64), tg.use_idx.astype(np.int64), tg.alloc_dev.astype(np.int64),
                        tg.alloc_bytes.astype(np.int64))
    return tg.static_mem.astype(np.int64) + peak
