"""Lower bounds of a candidate plan's simulated step and peak memory, computed without simulating
it: what lets ``algo=hybrid_search`` prune and stay exact over its space.

Every figure comes from :class:`~algorithms.llm_search_costing.Costing`, which reads what the
pipeline simulator (:mod:`simulators.pipeline`) builds its tasks from.  ``F`` is one
micro-batch's forward op of a chunk on its stage's GPU (the units' forward kernels and the
tensor- / expert-parallel collectives that occupy the GPU), ``B`` its backward op
(recomputation, input and weight gradients and their collectives; under ZB-H1 without the weight
gradient, which is its own op ``W``).  Chunk ``s < pp`` is the first chunk of stage ``s``.

**Why a step bound cannot exceed the simulated step.**  The simulator runs each stage's tasks
one at a time in the schedule's order (``sim.order=strict``, the environment's), each task once
its dependencies have ended, and a collective or send on its link first come, first served.  A
start is the latest of its predecessors' ends (max-plus), so charging a task no more than the
simulator does, or dropping a wait, can only make every time earlier.  The bounds charge each op
exactly the simulator's compute and GPU-occupying collectives; ring attention's exchange and the
optimizer step count zero; a send between stages costs its transfer time without the queue on
its link.  A tied head on another stage than the embedding holds a copy of it (Megatron-LM): its
parameters are in the head's collectives and memory, and the copy's gradient is all-reduced
between the first and the last stage after each one's last backward, on its data-parallel link.

* :func:`replay_bound` (the tighter, level 2): the schedule replayed op by op with those
  durations: each op after the previous op of its stage and after the ops it needs (the
  forward of the chunk before plus the send, the backward of the chunk after plus the send, its
  own forward).  ZeRO 1/2: the parameter all-gathers are queued on the stage's data-parallel
  link at the start, in the simulator's order, so a bucket's gather ends no earlier than the sum
  of those queued before it and its own; the first forward of a bucket's units waits for it.
  ZeRO 0-2: each bucket's gradient reduction is released once the last micro-batch's backward
  of its units has run (the op's start plus the backward of the chunk's units down to the
  bucket's first, less that unit's backward collectives, which follow its gradient); the link
  runs one collective at a time, and over all schedules of jobs with release times on one
  machine, earliest release first finishes first (``1|r_j|C_max``), so that schedule on the
  released-no-later times is a bound on when the last reduction, hence the optimizer step, can
  end (the tied embedding's all-reduce joins it, released at its stage's last op).  ZeRO-3: the stage's first unit's gather before its first forward,
  its reduce-scatter after the stage's last gradient, and the link's total (every unit's
  all-gather before each forward and backward and reduce-scatter after each backward, ``m``
  times, one after another).
* :func:`step_bound` (closed form, level 1): the replay's chains in closed form, for every
  candidate before it is replayed.  (1) *Head*: stage ``s``'s first op, the forward of micro-batch
  0 on chunk ``s``, starts at ``h_s >= max(g_s, h_{s-1} + F_{s-1} + p_{s-1})`` (``g_s``: ZeRO's gather
  of the bucket or unit it needs, ``p``: the send).  (2) *Own work*: the stage then runs all its
  ops: ``h_s + m sum(F + B + W)``.  (3) *Tail*: under 1F1B and the interleaved schedule a stage's
  last op is the backward of micro-batch ``m - 1`` on chunk ``s`` (Megatron-LM's orders; ``m`` a
  multiple of ``pp`` when interleaved), which needs that of chunk ``s + 1``: ``T_s >= max(h_s +
  busy_s, T_{s+1} + p_s + B_s)``; under 1F1B also, before the forward of micro-batch ``m - 1`` the
  stage ran every forward and all but ``k = min(pp - s, m)`` backwards, and that micro-batch's
  backward needs it to go forward and back through every later stage; under ZB-H1 the backward
  of micro-batch ``m - 1`` follows every forward and backward and the W ops before it, its W ops
  after it.  (4) the stage's first unit is the last whose gradient completes (when its backward's
  compute ends, before that backward's collectives): its bucket's (unit's, ZeRO-3) reduction
  follows; so does the tied embedding's all-reduce on the first and last stage.  (5) ZeRO-3's
  link total.

**Memory bound** (:class:`MemoryModel`), why it cannot exceed the simulated peak: weights,
gradients and optimizer states are :func:`~harness.core.llm.memory.state_coefficients` times the
stage's parameter elements, a tied head's copy included (the simulator's
:func:`~harness.core.llm.memory.model_state_bytes` before rounding up); the largest transient and the two P2P buffers
are the simulator's static kinds (its ZeRO-2/3 buffers, which only add, are left out); and at
the start of a stage's first backward every forward run before it still holds its activations
(a forward's buffers are freed by its backward, or W): ``min(pp - s, m)`` micro-batches of the
stage under 1F1B and ZB-H1, the interleaved schedule's warm-up plus one
(:func:`in_flight_at_first_backward`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np

from algorithms.llm_search_costing import Costing, UnitTable
from algorithms.llm_search_space import Candidate
from harness.core.llm.memory import state_coefficients
from harness.core.llm.schedules import interleaved_warmup, stage_order


# ---------------------------------------------------------------------------- the schedules' counts
def in_flight_at_first_backward(schedule: str, pp: int, vpp: int, m: int, s: int) -> list[int]:
    """Per local chunk ``l`` of stage ``s`` (chunk ``l * pp + s``), the forwards the stage has run
    when its first backward starts (none of them freed yet): 1F1B and ZB-H1 run ``min(pp - s - 1, m)``
    warm-up forwards and one more; GPipe all ``m``; the interleaved 1F1B ``2 (pp - s - 1) + (vpp - 1) pp``
    warm-up chunk passes (Megatron's all of them when ``m == pp``) and one more, virtual micro-batch ``k``
    on local chunk ``(k mod pp vpp) // pp`` (:mod:`harness.core.llm.schedules`)."""
    if schedule in ("1f1b", "zb_h1"):
        return [min(pp - s, m)]
    if schedule == "gpipe":
        return [m]
    total, group = m * vpp, pp * vpp
    warm = interleaved_warmup(schedule, pp, m, vpp, s)
    n = min(total, warm + 1)
    full, rem = divmod(n, group)
    return [full * pp + min(max(rem - l * pp, 0), pp) for l in range(vpp)]


@lru_cache(maxsize=4096)
def in_flight_matrix(schedule: str, pp: int, vpp: int, m: int) -> np.ndarray:
    """:func:`in_flight_at_first_backward` of every stage: ``(vpp, pp)`` counts (read only)."""
    out = np.array([in_flight_at_first_backward(schedule, pp, vpp, m, s) for s in range(pp)], dtype=np.float64).T
    out.setflags(write=False)
    return out


def zb_weights_before_last_backward(pp: int, m: int, s: int) -> int:
    """ZB-H1 on stage ``s``: the W ops that run before the backward of micro-batch ``m - 1``
    (``min(pp - s - 1, m)`` warm-up forwards; up to ``s`` F, B rounds with W deferred; F, B, W
    rounds; B, W rounds; the deferred W last)."""
    warm = min(pp - s - 1, m)
    r1 = min(s, m - warm)
    r2 = m - warm - r1
    r3 = m - r1 - r2
    return r2 + r3 - 1 if r3 > 0 else max(r2 - 1, 0)


# ---------------------------------------------------------------------------- memory
class MemoryModel:
    """The memory bound of one candidate's stages (module docstring) from a unit table: whether
    a stage holding a contiguous run of units fits (:meth:`fits`, what the stage DP asks), and
    every stage's bound under a whole partition (:meth:`stages`); the same sums either way."""

    def __init__(self, c: Candidate, t: UnitTable, m: int, precision: str) -> None:
        self.c, self.t, self.m, self.precision = c, t, m, precision
        d = c.dp * c.cp
        self.coef_dense, self.coef_expert = state_coefficients(precision, c.zero, d, max(1, d // c.ep))
        self.inflight = in_flight_matrix(c.schedule, c.pp, c.vpp, m)  # (vpp, pp)
        self.buffers = 2.0 if c.pp > 1 else 0.0
        #: a tied head's copy of the embedding, on the last stage (never the embedding's) when there is a pipeline
        self.tied = self.coef_dense * float(t.tied.sum()) if c.pp > 1 else 0.0

    def fits(self, capacity: float) -> Callable[[int, int, int], bool]:
        """``fits(s, b, e)``: whether stage ``s`` holding units ``b..e-1`` is within ``capacity``
        (:meth:`stage`; what the stage DP asks)."""
        t, p = self.t, self.t.prefix
        pd, pe, ps = p["dense"], p["expert"], p["stored"]
        cd, ce, buf, tied, n, k = self.coef_dense, self.coef_expert, self.buffers, self.tied, len(t.f), self.inflight[0].tolist()
        mt, mb = t.max_transient, t.max_boundary

        def fits(s: int, b: int, e: int) -> bool:
            return (cd * (pd[e] - pd[b]) + ce * (pe[e] - pe[b]) + (tied if e == n else 0.0) + mt(b, e) + buf * mb(b, e)
                    + k[s] * (ps[e] - ps[b])) <= capacity
        return fits

    def stages(self, parts: tuple[int, ...]) -> np.ndarray:
        """The bound of every stage under ``parts`` units per virtual stage (chunk ``c`` on stage ``c % pp``)."""
        pp, vpp = self.c.pp, self.c.vpp
        starts = np.concatenate([[0], np.cumsum(parts)[:-1]]).astype(np.int64)
        t = self.t
        states = np.add.reduceat(self.coef_dense * t.dense + self.coef_expert * t.expert, starts).reshape(vpp, pp).sum(0)
        states[-1] += self.tied
        static = states + np.maximum.reduceat(t.transient, starts).reshape(vpp, pp).max(0)
        if pp > 1:
            static = static + self.buffers * np.maximum.reduceat(t.boundary, starts).reshape(vpp, pp).max(0)
        return static + (self.inflight * np.add.reduceat(t.stored, starts).reshape(vpp, pp)).sum(0)


# ---------------------------------------------------------------------------- the data-parallel link
def first_unit_terms(costing: Costing, c: Candidate, parts: tuple[int, ...], starts: np.ndarray,
                     t: UnitTable) -> tuple[np.ndarray, np.ndarray]:
    """Per stage: ``g``, the wait of its first forward for the parameters of its first unit
    (ZeRO 1/2: its bucket's gather, queued; ZeRO 3: the unit's), and ``red``, the reduction of
    that unit's gradient (its bucket's; ZeRO 3: the unit's reduce-scatter)."""
    if c.zero == 3:
        per = costing.unit_collectives(c, t)
        first = starts[: c.pp]
        return per["all_gather"][first], per["reduce_scatter"][first]
    stages = costing.buckets(c, parts, t)
    red = np.array([sum(sb.buckets[sb.first].reduce) for sb in stages])
    g = np.array([sb.gather_end[sb.first] for sb in stages]) if c.zero >= 1 else np.zeros(c.pp)
    return g, red


def zero3_link(costing: Costing, c: Candidate, starts: np.ndarray, t: UnitTable, m: int) -> np.ndarray:
    """ZeRO-3: per stage, the sum of its link's collectives (``m`` times, every unit: an
    all-gather before its forward and its backward, a reduce-scatter after its backward)."""
    if c.zero != 3:
        return np.zeros(c.pp)
    per = costing.unit_collectives(c, t)
    return m * np.add.reduceat(2 * per["all_gather"] + per["reduce_scatter"], starts).reshape(c.vpp, c.pp).sum(0)


# ---------------------------------------------------------------------------- the step, closed form
def reverse_max_plus(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``T_j = max(x_j, T_{j+1} + b_j)`` from the last entry back (``T_last = x_last``):
    ``max_{i >= j}(x_i + sum_{j <= k < i} b_k)``."""
    pb = np.concatenate([[0.0], np.cumsum(b)])[: len(x)]
    return np.maximum.accumulate((x + pb)[::-1])[::-1] - pb


def step_bound(costing: Costing, c: Candidate, parts: tuple[int, ...], t: UnitTable, m: int) -> float:
    """The closed-form lower bound of ``c``'s simulated step with ``parts`` units per virtual
    stage (module docstring, items 1-5)."""
    pp, vpp = c.pp, c.vpp
    zb = c.schedule == "zb_h1"
    starts = np.concatenate([[0], np.cumsum(parts)[:-1]]).astype(np.int64)
    Fc = np.add.reduceat(t.f, starts)
    Bc = np.add.reduceat(t.bi if zb else t.b, starts)
    F1, B1 = Fc[:pp], Bc[:pp]
    Ws = np.add.reduceat(t.w, starts)[:pp] if zb else np.zeros(pp)
    busy = m * (Fc.reshape(vpp, pp).sum(0) + Bc.reshape(vpp, pp).sum(0) + Ws)
    g, red = first_unit_terms(costing, c, parts, starts, t)
    p = np.zeros(pp)
    p[: pp - 1] = costing.p2p(c, starts, t)[: pp - 1]  # the sends between the stages' first chunks
    pf = np.concatenate([[0.0], np.cumsum(F1 + p)])[:pp]
    head = np.maximum.accumulate(g - pf) + pf
    if zb:
        wb = np.array([zb_weights_before_last_backward(pp, m, s) for s in range(pp)], dtype=np.float64)
        tb = reverse_max_plus(head + m * (F1 + B1) + wb * Ws, B1 + p)
        end = np.maximum(tb + (m - wb) * Ws, head + busy)
    else:
        x = head + busy
        if c.schedule == "1f1b":
            k = np.minimum(pp - np.arange(pp), m)
            later = np.concatenate([np.cumsum((F1 + B1 + 2 * p)[::-1])[::-1][1:], [0.0]]) + 2 * p
            x = np.maximum(x, head + m * F1 + (m - k) * B1 + later + B1)
        end = reverse_max_plus(x, B1 + p)
    trail = np.zeros(pp) if zb else t.bcomm[starts[:pp]]  # the first unit's gradient is complete before its backward's collectives
    sync = costing.embedding_sync(c, t)  # the tied embedding's all-reduce, first and last stage, after their last backward
    link = zero3_link(costing, c, starts, t, m)
    link[[0, -1]] += sync
    return float(max(float(end.max()), float((end - trail + red).max()), float(end[[0, -1]].max()) + sync, float(link.max())))


# ---------------------------------------------------------------------------- the schedule, replayed
class Orders:
    """Every stage's op order (:func:`harness.core.llm.schedules.stage_order`) as ``(kind, micro,
    chunk)`` tuples (kind 0 F, 1 B, 2 W), memoised per schedule, stages, micro-batches and chunks."""

    def __init__(self) -> None:
        self.memo: dict[tuple[str, int, int, int], list[list[tuple[int, int, int]]]] = {}

    def __call__(self, schedule: str, pp: int, m: int, vpp: int) -> list[list[tuple[int, int, int]]]:
        key = (schedule, pp, m, vpp)
        if key not in self.memo:
            code = {"F": 0, "B": 1, "W": 2}
            self.memo[key] = [[(code[o.kind], o.micro, o.chunk) for o in stage_order(schedule, pp, m, vpp, s)] for s in range(pp)]
        return self.memo[key]


def earliest_release_first(jobs: list[tuple[float, float]]) -> float:
    """The end of the last of ``jobs`` (release, duration) run one at a time, earliest release first."""
    now = 0.0
    for r, d in sorted(jobs, key=lambda j: j[0]):
        now = max(now, r) + d
    return now


def replay_bound(costing: Costing, orders: Orders, c: Candidate, parts: tuple[int, ...], t: UnitTable, m: int) -> float:
    """The schedule replayed with its waits on ZeRO's gathers and the data-parallel link's
    reductions (module docstring): a lower bound of the simulated step."""
    pp, C = c.pp, c.pp * c.vpp
    zb = c.schedule == "zb_h1"
    bounds = np.concatenate([[0], np.cumsum(parts)]).astype(np.int64)
    starts = bounds[:-1]
    grad = t.w if zb else t.b  # the op that completes a unit's gradient: B (W under ZB-H1)
    dur = (np.add.reduceat(t.f, starts).tolist(), np.add.reduceat(t.bi if zb else t.b, starts).tolist(),
           np.add.reduceat(t.w, starts).tolist())
    p2p = [*costing.p2p(c, starts, t), 0.0]
    stages = costing.buckets(c, parts, t) if c.zero < 3 else []
    # the first forward of a chunk: starts after its first unit's gather, ends after each of its buckets' gather and the units from there
    gate_start, gate_end = [0.0] * C, [0.0] * C
    if c.zero in (1, 2):
        for sb in stages:
            for b, ge in zip(sb.buckets, sb.gather_end):
                if b.lo == bounds[b.chunk]:
                    gate_start[b.chunk] = ge
                gate_end[b.chunk] = max(gate_end[b.chunk], ge + float(t.f[b.lo:bounds[b.chunk + 1]].sum()))
    g3, red3 = first_unit_terms(costing, c, parts, starts, t) if c.zero == 3 else (np.zeros(pp), np.zeros(pp))
    ops = orders(c.schedule, pp, m, c.vpp)
    nan = float("nan")
    done = [[nan] * (m * C) for _ in range(3)]  # end of (kind, micro * C + chunk)
    clock = g3.tolist()
    pos = [0] * pp
    left = sum(len(o) for o in ops)
    while left:
        moved = 0
        for s in range(pp):
            order, i, now = ops[s], pos[s], clock[s]
            while i < len(order):
                kind, mi, ch = order[i]
                k = mi * C + ch
                if kind == 0:
                    dep = done[0][k - 1] + p2p[ch - 1] if ch > 0 else 0.0
                    if mi == 0:
                        dep = max(dep, gate_start[ch])
                elif kind == 1:
                    dep = done[0][k] if ch == C - 1 else done[1][k + 1] + p2p[ch]
                else:
                    dep = 0.0
                if dep != dep:  # not run yet (NaN)
                    break
                now = max(now, dep) + dur[kind][ch]
                if kind == 0 and mi == 0:
                    now = max(now, gate_end[ch])
                done[kind][k] = now
                i += 1
            moved += i - pos[s]
            pos[s], clock[s] = i, now
        if not moved:
            raise RuntimeError(f"the {c.schedule} order of {pp} stages and {m} micro-batches deadlocks")
        left -= moved
    last = 2 if zb else 1
    out = max(clock)
    trail = np.zeros(len(t.f)) if zb else t.bcomm  # a unit's gradient is complete before its backward's collectives
    sync = costing.embedding_sync(c, t)  # the tied embedding's all-reduce, first and last stage, after their last op
    if sync > 0:
        out = max(out, clock[0] + sync, clock[-1] + sync)
    if c.zero == 3:
        link = zero3_link(costing, c, starts, t, m)
        link[[0, -1]] += sync
        out = max(out, max(done[last][(m - 1) * C + s] - float(trail[starts[s]]) + red3[s] for s in range(pp)), float(link.max()))
    for s, sb in enumerate(stages):  # the data-parallel link: gathers from the start, each reduction once released
        jobs = [(0.0, sum(b.gather)) for b in sb.buckets] if c.zero in (1, 2) else []
        if sync > 0 and s in (0, pp - 1):
            jobs.append((clock[s], sync))
        for b in sb.buckets:
            op_end = done[last][(m - 1) * C + b.chunk]
            release = op_end - dur[last][b.chunk] + float(grad[b.lo:bounds[b.chunk + 1]].sum()) - float(trail[b.lo])
            jobs += [(release, b.reduce[0]), (release, b.reduce[1])]
        out = max(out, earliest_release_first(jobs))
    return float(out)
