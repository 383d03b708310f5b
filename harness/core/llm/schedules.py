"""Pipeline schedules: the order in which one pipeline stage runs its forward and backward passes
(what a schedule *is*, so the core's: the pipeline simulator, :mod:`simulators.pipeline`, runs a
stage's tasks in this order, and the plan search, :mod:`algorithms.llm_search_bounds`, bounds a
plan's step by it).

A pipeline of ``pp`` stages runs ``m`` micro-batches through ``pp * vpp`` model chunks (virtual
stages); chunk ``c`` lives on stage ``c % pp`` (Megatron-LM's layout: stage ``s`` holds chunks
``s, s + pp, s + 2 pp, ...``).  :func:`stage_order` lists the :class:`Op` s one stage runs, in
order; the simulator (:mod:`simulators.pipeline`) turns each op into the tasks of its chunk's
units and the engine runs a stage's tasks in that order, so the bubble comes out of the
simulation.

* ``gpipe`` (Huang et al., NeurIPS'19): every forward, then every backward (micro-batches in
  order, as ``torch.distributed.pipelining.ScheduleGPipe``); all ``m`` micro-batches in flight.
* ``1f1b`` (PipeDream-Flush; Megatron-LM's ``forward_backward_pipelining_without_interleaving``):
  ``min(pp - stage - 1, m)`` warm-up forwards, then one forward and one backward in turn, then
  the cool-down backwards; at most ``pp - stage`` micro-batches in flight.
* ``interleaved`` (Narayanan et al., SC'21; Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``): ``m * vpp`` chunk passes; virtual
  micro-batch ``k`` is micro-batch ``(k // (pp vpp)) pp + k % pp`` of local chunk
  ``(k % (pp vpp)) // pp`` (backwards walk the chunks in reverse); ``2 (pp - stage - 1) +
  (vpp - 1) pp`` warm-up forwards (all of them when ``m == pp``), then one forward and one
  backward in turn, then the cool-down.  ``m`` must be a multiple of ``pp``.
* ``interleaved_torch`` (``torch.distributed.pipelining.ScheduleInterleaved1F1B``, torchtitan's
  ``Interleaved1F1B``): the same order and warm-up count, capped at ``m vpp``, without Megatron's
  all-warm-up case when ``m == pp`` (its ``_get_warmup_ops``): there the later stages start their
  backwards early and hold fewer chunk passes (the last stage ``(vpp - 1) pp + 1`` against
  ``m vpp``).
* ``zb_h1`` (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24; the order of
  sail-sg/zero-bubble-pipeline-parallelism's ``ZeroBubbleH1Pipeline`` with its exact semantics):
  the backward split into ``B`` (input gradient, on the critical path) and ``W`` (weight
  gradient); 1F1B's warm-up, then ``stage`` rounds of F, B with their W deferred, then F, B, W
  rounds, the remaining B, W and last the ``stage`` deferred W: the deferred W fill the
  cool-down's bubble.  Peak memory as 1F1B's (``pp`` micro-batches on the worst stage).

Bubble (the quantity the formulas state): with every chunk pass of a kind taking the same
time and communication free, a stage's *ideal* time is ``m * vpp * (f + b)`` (its own work,
``f`` and ``b`` one chunk's forward and backward), the step is the ideal time plus the bubble,
and **bubble / ideal** is ``(pp - 1) / m`` for GPipe and 1F1B, ``(pp - 1) / (vpp m)`` for the
interleaved schedule (Narayanan et al., SC'21, Sec. 2.2), and for ZB-H1 with ``f = b = w``
``(pp - 1) / (3 m)``, a third of 1F1B's (its paper: a bubble of ``(pp - 1)(f + b - w)`` against
1F1B's ``(pp - 1)(f + b + w)``).  As a fraction of the step that is ``(pp - 1) / (m + pp - 1)``
for 1F1B.  ``tests/test_pipeline_schedules.py`` simulates these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: the op kinds: F forward; B backward (the input gradient only in a schedule with W ops, else
#: the whole backward); W the weight gradient (zb_h1)
OP_KINDS: tuple[str, ...] = ("F", "B", "W")


@dataclass(frozen=True)
class Op:
    """One pass of one micro-batch through one model chunk on a stage."""

    kind: str  # "F" | "B" | "W"
    micro: int  # micro-batch index, 0..m-1
    chunk: int  # virtual stage (model chunk) index, 0..pp*vpp-1; it runs on stage chunk % pp


def _gpipe(pp: int, m: int, stage: int) -> list[Op]:
    return [Op("F", i, stage) for i in range(m)] + [Op("B", i, stage) for i in range(m)]


def _one_f_one_b(pp: int, m: int, stage: int) -> list[Op]:
    warm = min(pp - stage - 1, m)
    ops = [Op("F", i, stage) for i in range(warm)]
    for i in range(m - warm):
        ops += [Op("F", warm + i, stage), Op("B", i, stage)]
    ops += [Op("B", i, stage) for i in range(m - warm, m)]
    return ops


#: the interleaved 1F1B schedules: Megatron-LM's and torch.distributed.pipelining's
INTERLEAVED: tuple[str, ...] = ("interleaved", "interleaved_torch")


def interleaved_warmup(schedule: str, pp: int, m: int, vpp: int, stage: int) -> int:
    """The warm-up forwards (chunk passes) stage ``stage`` of an interleaved schedule runs before
    its first backward: ``2 (pp - stage - 1) + (vpp - 1) pp``, at most ``m vpp``, and under
    Megatron-LM's (``interleaved``) all of them when ``m == pp``."""
    total = m * vpp
    if schedule == "interleaved" and m == pp:
        return total
    return min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)


def _interleaved(pp: int, m: int, vpp: int, stage: int, schedule: str = "interleaved") -> list[Op]:
    total = m * vpp
    group = pp * vpp

    def op(kind: str, k: int) -> Op:
        local = (k % group) // pp
        if kind == "B":
            local = vpp - 1 - local
        return Op(kind, (k // group) * pp + k % pp, local * pp + stage)

    warm = interleaved_warmup(schedule, pp, m, vpp, stage)
    ops = [op("F", k) for k in range(warm)]
    for k in range(total - warm):
        ops += [op("F", warm + k), op("B", k)]
    ops += [op("B", k) for k in range(total - warm, total)]
    return ops


def _zb_h1(pp: int, m: int, stage: int) -> list[Op]:
    ops: list[Op] = []
    f = b = w = 0
    for _ in range(pp - stage - 1):  # warm-up forwards
        if f < m:
            ops.append(Op("F", f, stage))
            f += 1
    for _ in range(stage):  # 1F1B rounds whose W is deferred
        if f < m:
            ops += [Op("F", f, stage), Op("B", b, stage)]
            f += 1
            b += 1
    while f < m:  # F, B, W
        ops += [Op("F", f, stage), Op("B", b, stage), Op("W", w, stage)]
        f, b, w = f + 1, b + 1, w + 1
    while b < m:  # cool-down: B, W
        ops += [Op("B", b, stage), Op("W", w, stage)]
        b, w = b + 1, w + 1
    ops += [Op("W", i, stage) for i in range(w, m)]  # the deferred W fill the tail's bubble
    return ops


#: the order of each schedule (names as ``harness.core.llm.plan.SCHEDULES``)
ORDERS: dict[str, Callable[[int, int, int, int], list[Op]]] = {
    "gpipe": lambda pp, m, vpp, s: _gpipe(pp, m, s),
    "1f1b": lambda pp, m, vpp, s: _one_f_one_b(pp, m, s),
    "interleaved": _interleaved,
    "interleaved_torch": lambda pp, m, vpp, s: _interleaved(pp, m, vpp, s, "interleaved_torch"),
    "zb_h1": lambda pp, m, vpp, s: _zb_h1(pp, m, s),
}


def stage_order(schedule: str, pp: int, m: int, vpp: int, stage: int) -> list[Op]:
    """The ops stage ``stage`` of a ``pp``-stage pipeline runs for ``m`` micro-batches and ``vpp``
    chunks per stage, in order (see the module docstring for each schedule).

    The plan validates the combination for the user (``harness.core.llm.plan``); what reaches
    here unchecked is a bug, a ``ValueError``."""
    if schedule not in ORDERS:
        raise ValueError(f"unknown pipeline schedule {schedule!r}: one of {', '.join(ORDERS)}")
    if pp < 1 or m < 1 or vpp < 1 or not 0 <= stage < pp:
        raise ValueError(f"stage_order needs pp, m, vpp >= 1 and 0 <= stage < pp, got pp={pp} m={m} vpp={vpp} stage={stage}")
    if schedule in INTERLEAVED:
        if m % pp:
            raise ValueError(f"the interleaved schedule needs m a multiple of pp, got m={m} pp={pp}")
    elif vpp != 1:
        raise ValueError(f"schedule {schedule!r} runs one chunk per stage, got vpp={vpp}")
    return ORDERS[schedule](pp, m, vpp, stage)


def splits_backward(schedule: str) -> bool:
    """Whether the schedule runs the weight gradient as its own W op (ZB-H1)."""
    return schedule == "zb_h1"


def in_flight(ops: list[Op]) -> int:
    """The most chunk passes whose forward has run and whose activations are not yet freed
    (at the end of the backward, or of W where the schedule has W ops), over the stage's order:
    the activation memory a stage needs, in chunk-micro-batches (1F1B's first stage: ``pp``;
    interleaved: ``vpp pp + pp - 1``, Megatron-LM's ``theoretical_memory_usage.py`` factor
    ``1 + (pp - 1) / (pp vpp)`` times ``pp vpp``)."""
    release = "W" if any(o.kind == "W" for o in ops) else "B"
    live = peak = 0
    for o in ops:
        if o.kind == "F":
            live += 1
            peak = max(peak, live)
        elif o.kind == release:
            live -= 1
    return peak
