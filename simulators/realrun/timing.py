"""Machine and timing primitives shared by the profiler (``harness.app.profile``), the calibration
(``harness.app.calibrate``) and real runs (``sim=realrun``): which CPU or GPU this is, thread counts
and core pinning, the allocator setting and idle spinners that make a CPU measurement repeatable,
and one whole step executed in node order with every node timed (the in-situ profile)."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Iterator, Sequence

import numpy as np

from simulators.realrun.execgraph import ExecGraph, materialize, resolve


def rank_cores(world: int, threads: int) -> tuple[list[list[int]], bool]:
    """The cores of each of ``world`` ranks of ``threads`` cores, in turn from this process's
    allowed cores (wrapping), and whether they had to share some (more cores wanted than allowed)."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = [[allowed[(r * threads + t) % len(allowed)] for t in range(threads)] for r in range(world)]
    return cores, world * threads > len(allowed)


def pin_to_cores(n: int, offset: int = 0) -> list[int]:
    """Pin this process to ``n`` of its allowed cores (starting at ``offset``, wrapping)."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not allowed:
        return []
    cores = [allowed[(offset + k) % len(allowed)] for k in range(max(1, n))]
    os.sched_setaffinity(0, set(cores))
    return cores


#: glibc's mallopt parameters (malloc.h) and the largest mmap threshold it accepts on 64 bits
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20


@contextlib.contextmanager
def pinned(threads: int, pin: bool = True) -> Iterator[list[int]]:
    """Run the block with ``threads`` torch threads and, with ``pin``, this process pinned to
    ``threads`` of its cores (:func:`pin_to_cores`; yields them); both restored afterwards."""
    import torch

    old_threads = torch.get_num_threads()
    old_cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    torch.set_num_threads(threads)
    cores = pin_to_cores(threads) if pin else []
    try:
        yield cores
    finally:
        torch.set_num_threads(old_threads)
        if cores and old_cores is not None:
            os.sched_setaffinity(0, old_cores)


def steady_malloc(keep_bytes: int = 1 << 30) -> bool:
    """Keep the memory a CPU step frees inside the process, as a GPU's caching allocator does.

    torch's CPU tensors come from glibc's ``malloc``.  By default glibc hands freed memory
    back to the OS (``munmap`` of a chunk above the mmap threshold, a trim of the heap's top
    above the trim threshold), and then every later allocation of that size page-faults each
    of its pages in again.  Whether that happens depends on the heap's layout, so it differs
    from one process to the next (measured: results/README.md, Simulator accuracy).
    A profile and a real run taken in two such processes disagree by that much.  This raises
    the trim threshold to ``keep_bytes`` and the mmap threshold to glibc's maximum (32 MiB), so
    that after the first step the buffers are reused without faults; allocations above 32 MiB
    are still mapped (each one faults, in every process alike).  Process-wide and not undone;
    a no-op where the C library has no ``mallopt`` (not glibc).  Returns whether it was applied."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_TRIM_THRESHOLD, int(min(keep_bytes, 2**31 - 1))) == 1
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1 and ok)


# a busy loop at SCHED_IDLE priority on one core, that exits when its parent does
_SPIN = """\
import os, sys
ppid = os.getppid()
os.sched_setaffinity(0, {int(sys.argv[1])})
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
while os.getppid() == ppid:
    for _ in range(200000):
        pass
"""


class IdleSpinners:
    """Keep ``cores`` from going idle: one busy-loop process per core at ``SCHED_IDLE`` priority.

    A communicating rank sleeps while it waits for its peer; on a virtual machine an idle
    virtual CPU is halted and waking it again can take milliseconds (on bare metal, a deep
    C-state), which makes every wait cost far more, and far more unevenly, than the transfer
    (the effect of the ``idle=poll`` kernel option, without rebooting).  ``SCHED_IDLE`` threads
    run only when nothing else wants the core and are preempted as soon as any other thread
    wakes, so they take next to no time from the ranks' compute or gloo's threads (they do
    count in the load average).  Use as a context manager;
    a no-op where the OS has no ``SCHED_IDLE`` (not Linux).  A spinner also exits by itself
    when the process that started it dies."""

    def __init__(self, cores: Sequence[int]) -> None:
        self.cores = sorted({int(c) for c in cores}) if hasattr(os, "SCHED_IDLE") else []
        self.procs: list[Any] = []

    def __enter__(self) -> "IdleSpinners":
        import subprocess
        import sys

        for c in self.cores:
            self.procs.append(subprocess.Popen([sys.executable, "-c", _SPIN, str(c)], stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return self

    def __exit__(self, *exc: Any) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except Exception:  # noqa: BLE001 - a spinner that ignores SIGTERM is killed
                p.kill()
        self.procs.clear()


# ---------------------------------------------------------------------------- in-situ steps
def dead_inputs(eg: ExecGraph) -> list[list[int]]:
    """Per node, the node values it is the last to read (graph outputs excepted): what a step
    run in node order frees right after that node, as a real run's rank does."""
    n = eg.num_nodes
    last = np.full(n, -1, np.int64)
    for i in range(n):
        for r in eg.refs(i):
            if r.kind == "n":
                last[r.index] = i
    keep = {r.index for r in eg.outputs if r is not None and r.kind == "n"}
    return [sorted({r.index for r in eg.refs(i) if r.kind == "n" and last[r.index] == i and r.index not in keep}) for i in range(n)]


def in_situ_step(eg: ExecGraph, ph: list[Any], device: Any, dead: list[list[int]], fns: Sequence[Any] | None = None) -> np.ndarray:
    """One whole step run in node order, every node timed inside it: seconds per node.

    On CPU a node's time is its call plus the release of the inputs it was the last to read
    (``dead``, from :func:`dead_inputs`), as a real run's rank frees them (``del`` right after
    the op): freeing is host work on the rank's core, a few percent of a step for the zoo's
    small models (results/README.md).  On GPU the caching allocator makes
    a free an untimed host call, and CUDA events bracket the call alone.  The profiler's
    ``mode=in_situ`` repeats this step; ``sim=realrun`` with ``interleave_profile`` runs it
    between its measured steps."""
    import torch

    cuda = torch.device(device).type == "cuda"
    n = eg.num_nodes
    fns = fns if fns is not None else [resolve(ins.target) for ins in eg.instrs]
    out = np.zeros(n)
    vals: list[Any] = [None] * n
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)] if cuda else None
    for i, ins in enumerate(eg.instrs):
        args = materialize(ins.args, vals, ph, device)
        kwargs = materialize(ins.kwargs, vals, ph, device)
        if cuda:
            ev[i][0].record()
            vals[i] = fns[i](*args, **kwargs)
            ev[i][1].record()
        else:
            t0 = time.perf_counter()
            vals[i] = fns[i](*args, **kwargs)
            t1 = time.perf_counter()
        del args, kwargs
        t2 = time.perf_counter()
        for j in dead[i]:
            vals[j] = None
        if not cuda:
            out[i] = (t1 - t0) + (time.perf_counter() - t2)
    if cuda:
        torch.cuda.synchronize(device)
        out[:] = [a.elapsed_time(b) / 1e3 for a, b in ev]
    return out
