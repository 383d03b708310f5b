"""The progress board of a real run: every rank writes what it is doing (:data:`P_START`...) on
its row of a small memory-mapped file (:class:`Progress`), and the launcher's
:class:`Watchdog` reads it and ends a run in which nothing has moved for ``rank_timeout_s``,
naming the ranks that stopped it (:func:`stall_message`; see :mod:`simulators.realrun.launcher`)."""

from __future__ import annotations

import mmap
import os
import re
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from simulators.realrun.job import Job, RealRunError


#: What a rank is doing, as it writes it on the progress board (:class:`Progress`): not yet
#: heard from, loading its job, at the rendezvous, building its state and program, at the barrier
#: before a step, running its ops, waiting for a message / a collective / its sends, at the barrier
#: of the in-situ profile or running it, at the barrier after its last step, done
(P_START, P_LOAD, P_RENDEZVOUS, P_SETUP, P_BARRIER, P_STEP, P_RECV, P_COLLECTIVE, P_DRAIN, P_PROFILE_WAIT, P_PROFILE, P_FINAL,
 P_DONE) = range(13)
#: the phases in which a rank waits for the others
WAITING = frozenset({P_RENDEZVOUS, P_BARRIER, P_RECV, P_COLLECTIVE, P_DRAIN, P_PROFILE_WAIT, P_FINAL})
#: a rank's row on the board, int64: phase, job (its index in the launch), step, detail (P_RECV:
#: the sender's rank << 32 | the tag; P_COLLECTIVE: the all-reduced node, -1 for another collective)
BOARD_SLOTS = 4


class Progress:
    """One rank's row of the progress board: a file of ``world`` x :data:`BOARD_SLOTS` int64
    that every rank of a local launch maps into memory and the launcher reads (:class:`Watchdog`).
    ``row`` is written where the rank's phase changes (:data:`P_START`...), a memory store each;
    without a board (a job run by hand under torchrun) it is the rank's own memory."""

    def __init__(self, board: str | None, rank: int) -> None:
        if board:
            with open(board, "r+b") as fh:
                buf: Any = mmap.mmap(fh.fileno(), 0)
        else:
            buf = bytearray(8 * BOARD_SLOTS * (rank + 1))
        self.row = memoryview(buf).cast("q")[rank * BOARD_SLOTS:(rank + 1) * BOARD_SLOTS]

    def set(self, phase: int, job: int | None = None, step: int | None = None) -> None:
        """Enter ``phase`` (of ``job``, at ``step``, where given)."""
        if job is not None:
            self.row[1] = job
        if step is not None:
            self.row[2] = step
        self.row[0] = phase


def _advance(row: Sequence[int]) -> tuple[int, int]:
    """How far a rank got, as a sortable key: phases before the first job, then per job its
    set-up, each step's barrier, the step itself (running or waiting inside it), the in-situ
    profile after it, and the barrier after the last step."""
    phase, job, step = (int(x) for x in row[:3])
    if phase <= P_RENDEZVOUS:
        return -1, phase
    if phase == P_DONE:
        return 1 << 40, 0
    if phase == P_SETUP:
        return job, -1
    if phase == P_FINAL:
        return job, 1 << 40
    return job, 3 * step + (0 if phase == P_BARRIER else 2 if phase in (P_PROFILE_WAIT, P_PROFILE) else 1)


def _doing(row: Sequence[int], jobs: Sequence[Job]) -> str:
    """What a rank was doing, from its row on the board."""
    phase, k, s, detail = (int(x) for x in row)
    job = jobs[min(max(k, 0), len(jobs) - 1)]
    of = f" of job {k}" if len(jobs) > 1 else ""
    at = f"step {s}{' (warm-up)' if s < job.warmup else ''}{of}"
    return {
        P_START: "had not started (never heard from, and no CPU time used, since its launch)",
        P_LOAD: "was loading its job",
        P_RENDEZVOUS: "was waiting at the rendezvous (init_process_group)",
        P_SETUP: f"was building its model, state and program{of}",
        P_BARRIER: f"was waiting at the barrier before {at}",
        P_STEP: f"was running its ops in {at}",
        P_RECV: f"was waiting for a message from rank {detail >> 32} (tag {detail & 0xFFFFFFFF}) in {at}",
        P_COLLECTIVE: f"was waiting for {f'the all-reduce of node {detail}' if detail >= 0 else 'a collective'} in {at}",
        P_DRAIN: f"was waiting for its sends to complete at the end of {at}",
        P_PROFILE_WAIT: f"was waiting at the barrier of the in-situ profile after {at}",
        P_PROFILE: f"was running the in-situ profile after {at}",
        P_FINAL: f"was waiting at the barrier after its last step{of}",
        P_DONE: "had finished",
    }.get(phase, f"was in unknown phase {phase}")


def _ranks(rs: Sequence[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}"


def _plural(what: str) -> str:
    """What several ranks were doing: ``was running its ops`` -> ``were running their ops``."""
    return re.sub(r"\bits\b", "their", re.sub("^was ", "were ", what))


def stall_message(rows: np.ndarray, jobs: Sequence[Job], timeout_s: float) -> str:
    """The line that reports a run in which no rank made progress for ``timeout_s``, from the
    board's ``rows`` (one per rank): the ranks that stopped it - of the least advanced ranks
    (:func:`_advance`) those not waiting for the others, or all of them when every one waits
    (a deadlock, a message that never comes) - then what every rank was doing."""
    keys = [_advance(r) for r in rows]
    behind = [q for q, key in enumerate(keys) if key == min(keys)]
    stuck = [q for q in behind if int(rows[q][0]) not in WAITING] or behind
    doing: dict[str, list[int]] = {}
    for q in stuck + [q for q in range(len(rows)) if q not in stuck]:
        doing.setdefault(_doing(rows[q], jobs), []).append(q)
    return (f"real run stalled: {_ranks(stuck)} stopped responding (no rank made progress for {timeout_s:g} s, sim.rank_timeout_s): "
            + "; ".join(f"{_ranks(qs)} {what if len(qs) == 1 else _plural(what)}" for what, qs in doing.items())
            + f"; all {len(rows)} ranks were ended (raise sim.rank_timeout_s if a step of this plan takes longer)")


#: the share of a core a rank that is not waiting must use between two looks to count as working
BUSY_SHARE = 0.05
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_ticks(pid: int) -> int:
    """A process's user + system CPU time in clock ticks (Linux's /proc; 0 where unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


class Watchdog:
    """The launcher's side of the progress board: creates it, and :meth:`check` raises a
    :class:`RealRunError` (:func:`stall_message`) once nothing has moved for the jobs'
    ``rank_timeout_s``: not the board, and no rank that is not waiting for the others used
    :data:`BUSY_SHARE` of a core (a rank still starting Python and importing torch, or one
    computing a long op or a slow first step, works without writing on the board; a rank
    blocked in an op, or waiting, uses next to no CPU)."""

    def __init__(self, board: Path, jobs: Sequence[Job]) -> None:
        self.board, self.jobs = board, list(jobs)
        self.timeout_s = max(j.rank_timeout_s for j in jobs)
        board.write_bytes(bytes(8 * BOARD_SLOTS * jobs[0].world))
        self.seen = b""
        self.ticks: list[int] = []
        self.since = self.last = time.monotonic()

    def check(self, pids: Sequence[int] = ()) -> None:
        """``pids``: the ranks' processes, where known (by rank)."""
        data, now = self.board.read_bytes(), time.monotonic()
        rows = np.frombuffer(data, dtype=np.int64).reshape(-1, BOARD_SLOTS)
        ticks = [_cpu_ticks(pid) for pid in pids]
        working = [q for q in range(min(len(ticks), len(self.ticks), len(rows))) if int(rows[q][0]) not in WAITING]
        busy = any(ticks[q] - self.ticks[q] >= BUSY_SHARE * (now - self.last) * _HZ for q in working)
        self.ticks, self.last = ticks, now
        if data != self.seen or busy:
            self.seen, self.since = data, now
        elif now - self.since > self.timeout_s:
            raise RealRunError(stall_message(rows, self.jobs, self.timeout_s))
