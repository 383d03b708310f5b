"""A fixed piece of work each benchmark measures in its own run, beside its figure.

A benchmark's seconds depend on the machine and its load: the same code measured 40 ms on one
2-core VM and 104 ms on another.  So each benchmark also times two fixed workloads, right
before and right after its timed region (:func:`measure`), and states its figure and its goal
as a ratio to one of them (:func:`tests.helpers.assert_goal`): on a machine 2-3x slower, or
busier, the reference slows down with the figure and the ratio stays.

* ``python``: the interpreter - a heap and a dict driven by a linear congruential generator,
  what list schedulers and graph builders spend their time on;
* ``numpy``: array work - a stable argsort, a cumulative sum, a weighted bincount and a gather
  over 2^18 elements, what the task-graph expansion and the cost tables spend theirs on.

Each takes about 15 ms on a quiet development VM.  The reference statistic follows the figure's:
a benchmark's fastest round (what a momentary stall moves least) is set beside the fastest
sample, a median or a single long round (which averages the machine's load over its run)
beside the median sample, a slowest round beside the slowest; the spread (slowest / fastest
sample - 1) and the 1-minute load average before and after say how busy the machine was: a
load above its cores (:meth:`Reference.busy`) means the benchmark waited for one.
"""

from __future__ import annotations

import heapq
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

#: the workloads' sizes: fixed, so that a reference means the same work on every machine
PYTHON_STEPS = 30_000
NUMPY_ELEMENTS = 1 << 17
#: samples of each workload taken before and again after a benchmark's timed region: short and
#: several, so that some fall between a busy machine's stalls as a benchmark's fastest round does
SAMPLES = 5


def python_work(steps: int = PYTHON_STEPS) -> int:
    """Interpreter-bound work: ``steps`` pushes on a bounded heap and dict updates."""
    heap: list[tuple[int, int]] = []
    seen: dict[int, int] = {}
    x = 12345
    for i in range(steps):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        heapq.heappush(heap, (x % 1000, i))
        seen[x % 4096] = seen.get(x % 4096, 0) + 1
        if len(heap) > 64:
            heapq.heappop(heap)
    return len(heap) + len(seen)


_RNG = np.random.default_rng(0)
_VALUES = _RNG.random(NUMPY_ELEMENTS)
_INDEX = _RNG.integers(0, NUMPY_ELEMENTS, NUMPY_ELEMENTS)


def numpy_work() -> float:
    """Array-bound work over :data:`NUMPY_ELEMENTS` float64s: sort, scan, scatter, gather."""
    order = np.argsort(_VALUES, kind="stable")
    scan = np.cumsum(_VALUES[order])
    bins = np.bincount(_INDEX & 0xFFF, weights=scan, minlength=1 << 12)
    return float(bins.sum() + _VALUES[_INDEX].sum())


WORKLOADS: dict[str, Callable[[], object]] = {"python": python_work, "numpy": numpy_work}


@dataclass
class Reference:
    """The samples (seconds) of each fixed workload taken around one benchmark."""

    samples: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in WORKLOADS})
    #: whether the samples after the benchmark's timed region are taken
    finished: bool = False
    #: the 1-minute load average when the samples were taken (before, after)
    loads: list[float] = field(default_factory=list)

    def take(self, n: int = SAMPLES) -> None:
        """Time each workload ``n`` more times."""
        self.loads.append(os.getloadavg()[0])
        for kind, work in WORKLOADS.items():
            for _ in range(n):
                t0 = time.perf_counter()
                work()
                self.samples[kind].append(time.perf_counter() - t0)

    def finish(self) -> None:
        """Take the samples after the benchmark (once)."""
        if not self.finished:
            self.take()
            self.finished = True

    def seconds(self, kind: str, stat: str = "min") -> float:
        """The reference: the fastest (``min``), median or slowest (``max``) sample of the workload ``kind``."""
        return {"min": min, "median": statistics.median, "max": max}[stat](self.samples[kind])

    def spread(self, kind: str) -> float:
        """Slowest over fastest sample, minus 1: how much the machine moved around the benchmark."""
        return max(self.samples[kind]) / min(self.samples[kind]) - 1.0

    def busy(self) -> bool:
        """Whether the machine was busy around the benchmark: a 1-minute load average above the
        cores this process may use (more runnable tasks than cores)."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(self.loads, default=0.0) > cores

    def info(self) -> dict[str, float | bool | list[float]]:
        """What a benchmark's ``extra_info`` records of its reference."""
        out: dict[str, float | bool | list[float]] = {"load_average": list(self.loads), "busy": self.busy()}
        for k in WORKLOADS:
            out.update({f"reference_{k}_s": self.seconds(k), f"reference_{k}_median_s": self.seconds(k, "median"),
                        f"reference_{k}_spread": self.spread(k)})
        return out


def measure() -> Reference:
    """A reference with its first samples taken (the ones before the benchmark)."""
    ref = Reference()
    ref.take()
    return ref
