"""Device timelines for list scheduling.

* :class:`Timeline`: the busy intervals of one device, kept sorted; it answers "earliest start
  of a task of duration d that is ready at t", either after the last task (append) or in the
  first idle gap that fits (insertion, HEFT Sec. 4.1).
* :class:`GapIndex`: the idle gaps of one device whose tasks never move once placed, in blocks
  with their largest gap, so that the first fitting gap is found without scanning every gap
  (FD-DPS with ``slot="idle"``); it gives the answers of a :class:`Timeline`.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any


class Timeline:
    """Busy intervals of one device, kept sorted, for insertion-based list scheduling."""

    __slots__ = ("starts", "ends", "nodes")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.nodes: list[int] = []

    @property
    def finish(self) -> float:
        """When the device is free for good (end of its last task)."""
        return self.ends[-1] if self.ends else 0.0

    def earliest_start(self, ready: float, dur: float, insertion: bool = True) -> float:
        """Earliest start >= ``ready`` of a task lasting ``dur``: the first idle gap that fits
        (``insertion``), else after the last task."""
        if not insertion or not self.starts:
            return max(ready, self.finish)
        # gaps: [end of task k-1, start of task k); begin at the gap containing `ready`
        k = bisect_right(self.ends, ready)
        prev_end = self.ends[k - 1] if k > 0 else 0.0
        starts = self.starts
        ends = self.ends
        for j in range(k, len(starts)):
            s = max(ready, prev_end)
            if s + dur <= starts[j]:
                return s
            prev_end = ends[j]
        return max(ready, prev_end)

    def insert(self, start: float, dur: float, node: int) -> None:
        """Occupy ``[start, start + dur)`` (the caller found it free with :meth:`earliest_start`)."""
        # after every task that ends by `start`: a zero-length task (a view) at the start of a
        # running task goes before it, so `ends` stays sorted as well as `starts`
        k = bisect_right(self.ends, start)
        self.starts.insert(k, start)
        self.ends.insert(k, start + dur)
        self.nodes.insert(k, node)

    def order(self) -> list[int]:
        """Nodes in the order they run on this device."""
        return list(self.nodes)

    def __len__(self) -> int:
        return len(self.starts)

    def __repr__(self) -> str:
        return f"Timeline({len(self)} tasks, finish {self.finish:.6g})"


class GapIndex:
    """The idle gaps of one device whose tasks never move once placed, for fast insertion.

    Tasks are kept in blocks of at most ``2 * block`` tasks with the largest idle gap of each
    block, so "the first idle gap of at least d after time t" skips whole blocks.  The
    answers are those of a linear scan over the gaps (comparisons are made the same way:
    ``start + dur <= next start``); the block maxima only decide which blocks to skip.
    """

    __slots__ = ("block", "st", "en", "nodes", "gmax", "bend")

    def __init__(self, block: int = 64) -> None:
        self.block = block
        self.st: list[list[float]] = []
        self.en: list[list[float]] = []
        self.nodes: list[list[int]] = []
        self.gmax: list[float] = []
        self.bend: list[float] = []

    def __len__(self) -> int:
        return sum(len(x) for x in self.nodes)

    def _gmax(self, b: int) -> float:
        st, en = self.st[b], self.en[b]
        prev = self.bend[b - 1] if b > 0 else 0.0
        best = st[0] - prev if st else float("-inf")
        for j in range(1, len(st)):
            g = st[j] - en[j - 1]
            if g > best:
                best = g
        return best

    def find(self, est: float, dur: float) -> tuple[int, int, float]:
        """(block, offset, start) of the first idle gap that fits a task of ``dur`` ready at
        ``est``, after every task that finishes by ``est``; or the end of the device."""
        bend = self.bend
        nb = len(bend)
        b = bisect_right(bend, est)
        if b >= nb:
            last = bend[-1] if nb else 0.0
            return (nb - 1 if nb else 0), (len(self.st[-1]) if nb else 0), (est if est > last else last)
        st, en = self.st[b], self.en[b]
        j = bisect_right(en, est)
        prev_end = en[j - 1] if j > 0 else (bend[b - 1] if b > 0 else 0.0)
        s = est if est > prev_end else prev_end
        if s + dur <= st[j]:
            return b, j, s
        for jj in range(j + 1, len(st)):
            if en[jj - 1] + dur <= st[jj]:
                return b, jj, en[jj - 1]
        gmax = self.gmax
        for bb in range(b + 1, nb):
            # skip a block only if no gap can pass the float test below: e + dur rounds, so
            # a gap a couple of ulps shorter than dur (even of length 0) may still fit
            if gmax[bb] + 2.0 * math.ulp(bend[bb]) < dur:
                continue
            st, en = self.st[bb], self.en[bb]
            if bend[bb - 1] + dur <= st[0]:
                return bb, 0, bend[bb - 1]
            for jj in range(1, len(st)):
                if en[jj - 1] + dur <= st[jj]:
                    return bb, jj, en[jj - 1]
        last = bend[-1]
        return nb - 1, len(self.st[-1]), (est if est > last else last)

    def position(self, b: int, j: int) -> int:
        """Global position of (block, offset) in the device's sequence."""
        return sum(len(x) for x in self.nodes[:b]) + j

    def insert(self, b: int, j: int, node: int, start: float, end: float) -> None:
        if not self.nodes:
            self.st.append([start])
            self.en.append([end])
            self.nodes.append([node])
            self.bend.append(end)
            self.gmax.append(start)
            return
        self.st[b].insert(j, start)
        self.en[b].insert(j, end)
        self.nodes[b].insert(j, node)
        self.bend[b] = self.en[b][-1]
        if len(self.nodes[b]) > 2 * self.block:
            h = len(self.nodes[b]) // 2
            for arr in (self.st, self.en, self.nodes):
                arr.insert(b + 1, arr[b][h:])
                del arr[b][h:]
            self.bend.insert(b + 1, self.en[b + 1][-1])
            self.bend[b] = self.en[b][-1]
            self.gmax.insert(b + 1, 0.0)
            self.gmax[b + 1] = self._gmax(b + 1)
        self.gmax[b] = self._gmax(b)
        if b + 1 < len(self.nodes):
            self.gmax[b + 1] = self._gmax(b + 1)


def describe_timelines(tls: list[Timeline]) -> dict[str, Any]:
    """Per-device task counts and finish times (for Plan.info)."""
    return {"tasks_per_device": [len(t) for t in tls], "finish_per_device": [t.finish for t in tls]}
