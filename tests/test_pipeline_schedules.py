"""Pipeline schedules (harness/core/llm/schedules.py) and the bubble and activation memory the simulated
pipeline gives them (simulators/pipeline.py's expansion run by the event engine).

The formulas (``../shared/data/llm/README.md``; Narayanan et al. SC'21 Sec. 2.2; Qi et al. ICLR'24):
with every chunk pass of a kind taking the same time and communication free, the bubble over the
ideal time (a stage's own work, ``m vpp (f + b)``) is ``(pp - 1) / m`` for GPipe and 1F1B,
``(pp - 1) / (vpp m)`` for interleaved 1F1B, and ZB-H1's is a third of 1F1B's when F, B and W take
the same time; 1F1B's first stage holds ``pp`` micro-batches' activations, the interleaved
schedule's ``1 + (pp - 1) / (pp vpp)`` times that (Megatron-LM's theoretical_memory_usage.py).
Where compute is not uniform the engine is held to an independent recurrence over the same orders.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from harness.core.llm.plan import SCHEDULES, ParallelPlan
from simulators import engine
from simulators.pipeline import expand_pipeline
from simulators.pipeline_costs import UnitCost
from simulators.pipeline_figures import time_split
from harness.core.llm.schedules import ORDERS, Op, in_flight, splits_backward, stage_order


def orders_ok(schedule: str, pp: int, m: int, vpp: int) -> None:
    """Every stage runs each of its (kind, micro, chunk) passes once, F before B before W."""
    kinds = ("F", "B", "W") if splits_backward(schedule) else ("F", "B")
    for s in range(pp):
        ops = stage_order(schedule, pp, m, vpp, s)
        want = {(k, i, c) for k in kinds for i in range(m) for c in range(s, pp * vpp, pp)}
        got = [(o.kind, o.micro, o.chunk) for o in ops]
        assert len(got) == len(set(got)) and set(got) == want
        pos = {x: n for n, x in enumerate(got)}
        for i, c in itertools.product(range(m), range(s, pp * vpp, pp)):
            assert pos[("F", i, c)] < pos[("B", i, c)]
            if "W" in kinds:
                assert pos[("B", i, c)] < pos[("W", i, c)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb_h1"])
@pytest.mark.parametrize("pp,m", [(1, 1), (1, 5), (2, 1), (4, 3), (4, 4), (4, 9), (8, 16)])
def test_every_pass_once_in_dependency_order(schedule: str, pp: int, m: int) -> None:
    orders_ok(schedule, pp, m, 1)


@pytest.mark.parametrize("pp,m,vpp", [(2, 2, 2), (2, 4, 2), (4, 4, 2), (4, 8, 3), (4, 12, 2), (8, 16, 4)])
def test_interleaved_every_pass_once(pp: int, m: int, vpp: int) -> None:
    orders_ok("interleaved", pp, m, vpp)


@pytest.mark.parametrize("pp,m,vpp", [(2, 2, 2), (4, 4, 2), (4, 8, 3), (8, 8, 2), (8, 16, 4)])
def test_torchs_interleaved_is_megatrons_but_when_m_is_pp(pp: int, m: int, vpp: int) -> None:
    """torch.distributed.pipelining's ScheduleInterleaved1F1B (``_get_warmup_ops``): Megatron-LM's
    order and warm-up, without its all-forwards-first case when ``m == pp``; there every stage
    warms up ``2 (pp - s - 1) + (vpp - 1) pp`` chunk passes (capped at ``m vpp``), so the last
    holds ``(vpp - 1) pp + 1`` at most."""
    orders_ok("interleaved_torch", pp, m, vpp)
    for s in range(pp):
        mega, torch_ = stage_order("interleaved", pp, m, vpp, s), stage_order("interleaved_torch", pp, m, vpp, s)
        warm = min(2 * (pp - s - 1) + (vpp - 1) * pp, m * vpp)
        first_b = next(i for i, o in enumerate(torch_) if o.kind == "B")  # warm-up, then one forward, then backwards in turn
        assert first_b == (warm + 1 if warm < m * vpp else m * vpp)
        assert (mega == torch_) is (m != pp or warm == m * vpp)
    if m == pp:
        assert in_flight(stage_order("interleaved_torch", pp, m, vpp, pp - 1)) == (vpp - 1) * pp + 1
        assert in_flight(stage_order("interleaved", pp, m, vpp, pp - 1)) == m * vpp


def test_schedule_names_are_the_plans() -> None:
    assert tuple(ORDERS) == SCHEDULES


def test_one_f_one_b_warm_up_is_megatrons() -> None:
    # forward_backward_pipelining_without_interleaving: pp - rank - 1 warm-up forwards, then 1F1B
    for s in range(4):
        ops = stage_order("1f1b", 4, 8, 1, s)
        warm = next(n for n, o in enumerate(ops) if o.kind == "B") - 1
        assert warm == 4 - s - 1
        steady = ops[warm: warm + 2 * (8 - warm)]
        assert [o.kind for o in steady] == ["F", "B"] * (8 - warm)
    assert [o.kind for o in stage_order("1f1b", 4, 2, 1, 0)] == ["F", "F", "B", "B"]  # m < pp: warm-up capped at m


def test_interleaved_order_is_megatrons() -> None:
    # pp=2, vpp=2, m=4, stage 0: warm-up 2(pp-1) + (vpp-1)pp = 4 chunk passes; chunks 0 and 2
    F, B = "F", "B"
    want = [(F, 0, 0), (F, 1, 0), (F, 0, 2), (F, 1, 2), (F, 2, 0), (B, 0, 2), (F, 3, 0), (B, 1, 2), (F, 2, 2), (B, 0, 0),
            (F, 3, 2), (B, 1, 0), (B, 2, 2), (B, 3, 2), (B, 2, 0), (B, 3, 0)]
    assert stage_order("interleaved", 2, 4, 2, 0) == [Op(*x) for x in want]
    # m == pp: every forward first (Megatron's all-warm-up case)
    ops = stage_order("interleaved", 4, 4, 2, 3)
    assert [o.kind for o in ops] == ["F"] * 8 + ["B"] * 8


def test_zb_h1_defers_stage_w_passes_to_the_tail() -> None:
    pp, m = 4, 8
    for s in range(pp):
        ops = stage_order("zb_h1", pp, m, 1, s)
        tail = len(ops) - next(n for n in range(len(ops) - 1, -1, -1) if ops[n].kind != "W") - 1
        assert tail == s + 1  # the stage's deferred W after the last round's own W
        assert [o.kind for o in ops[: pp - s - 1]] == ["F"] * (pp - s - 1)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (8, 16)])
def test_in_flight_micro_batches(pp: int, m: int) -> None:
    for s in range(pp):
        assert in_flight(stage_order("gpipe", pp, m, 1, s)) == m
        assert in_flight(stage_order("1f1b", pp, m, 1, s)) == pp - s
        assert in_flight(stage_order("zb_h1", pp, m, 1, s)) == pp  # its peak: 1F1B's first stage
    for vpp in (2, 3):
        mm = 2 * pp  # m > pp: not the all-warm-up case
        # Megatron-LM's factor 1 + (pp - 1) / (pp vpp) on pp vpp chunk-micro-batches
        assert in_flight(stage_order("interleaved", pp, mm, vpp, 0)) == vpp * pp + pp - 1


@pytest.mark.parametrize("bad", [("pipedream", 2, 4, 1, 0), ("1f1b", 2, 4, 2, 0), ("interleaved", 4, 6, 2, 0), ("1f1b", 2, 4, 1, 2),
                                 ("gpipe", 0, 4, 1, 0), ("1f1b", 2, 0, 1, 0)])
def test_stage_order_refuses_what_the_plan_refuses(bad: tuple) -> None:
    with pytest.raises(ValueError):
        stage_order(*bad)


# ---------------------------------------------------------------------------- simulated
def simulate(schedule: str, pp: int, m: int, vpp: int = 1, times: list[tuple[float, float, float]] | None = None,
             per_chunk: int = 2, p2p: list[float] | None = None, stored: int = 1000) -> tuple[engine.EngineResult, dict, object]:
    """The expansion of a plan with ``per_chunk`` units per chunk (``times[u]`` = forward, backward
    and weight-gradient seconds of unit u; uniform by default), free DP and optimizer, run by the engine."""
    C = pp * vpp
    n = C * per_chunk
    times = times or [(0.5, 1.0, 0.0)] * n
    plan = ParallelPlan(tp=1, pp=pp, dp=1, vpp=vpp, schedule=schedule, stages=(per_chunk,) * C)
    units = [UnitCost(f"u{u}", f, b, w, 0.0, stored_bytes=stored) for u, (f, b, w) in enumerate(times)]
    tg, _ = expand_pipeline(plan, m, units, p2p or [0.0] * (C - 1), lambda op, nb, g: (0.0, 0.0), [0.0] * pp, "amp_bf16")
    tl = engine.run(tg, pp, 3 * pp)
    return tl, time_split(tg, tl, pp), tg


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp,m", [(2, 1), (2, 6), (4, 3), (4, 8), (8, 8), (8, 32)])
def test_bubble_gpipe_1f1b(schedule: str, pp: int, m: int) -> None:
    tl, split, _ = simulate(schedule, pp, m)
    ideal = m * 2 * (0.5 + 1.0)
    assert (tl.makespan - ideal) / ideal == pytest.approx((pp - 1) / m, rel=1e-12)  # bubble over ideal time
    # the reported fraction: of the step, averaged over the stages
    assert split["bubble"].mean() / tl.makespan == pytest.approx((pp - 1) / (m + pp - 1), rel=1e-12)
    assert not any(split[k].any() for k in ("tp", "cp", "ep", "pp", "dp"))


@pytest.mark.parametrize("pp,m,vpp", [(2, 4, 2), (4, 8, 2), (4, 8, 3), (4, 16, 4), (8, 16, 2)])
def test_bubble_interleaved(pp: int, m: int, vpp: int) -> None:
    tl, _, _ = simulate("interleaved", pp, m, vpp)
    ideal = m * vpp * 2 * (0.5 + 1.0)
    assert (tl.makespan - ideal) / ideal == pytest.approx((pp - 1) / (vpp * m), rel=1e-12)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 4), (4, 12), (8, 16)])
def test_bubble_zb_h1_is_a_third_of_1f1b(pp: int, m: int) -> None:
    zb, _, _ = simulate("zb_h1", pp, m, times=[(1.0, 1.0, 1.0)] * (2 * pp))
    ob, _, _ = simulate("1f1b", pp, m, times=[(1.0, 2.0, 0.0)] * (2 * pp))  # the same work, B and W as one backward
    ideal = m * 2 * 3.0
    assert (ob.makespan - ideal) / ideal == pytest.approx((pp - 1) / m)
    assert (zb.makespan - ideal) / ideal == pytest.approx((pp - 1) / (3 * m))  # (pp - 1)(f + b - w) over m (f + b + w)


def test_activation_memory_in_flight() -> None:
    pp, m, stored = 4, 8, 1000
    stage_bytes = 2 * stored  # two units per chunk
    tl, _, _ = simulate("1f1b", pp, m)
    assert tl.peak_mem.tolist() == [(pp - s) * stage_bytes for s in range(pp)]  # the first stage: pp micro-batches
    g, _, _ = simulate("gpipe", pp, m)
    assert g.peak_mem.tolist() == [m * stage_bytes] * pp
    z, _, _ = simulate("zb_h1", pp, m, times=[(1.0, 1.0, 1.0)] * (2 * pp))
    assert z.peak_mem.max() == tl.peak_mem.max()  # ZB-H1: 1F1B's peak
    for vpp in (2, 4):
        it, _, _ = simulate("interleaved", pp, m, vpp)
        # Megatron-LM: the first stage's activations x (1 + (pp - 1) / (pp vpp)) of 1F1B's pp micro-batches
        assert it.peak_mem[0] == pytest.approx(pp * (vpp * stage_bytes) * (1 + (pp - 1) / (pp * vpp)))


def reference_makespan(schedule: str, pp: int, m: int, vpp: int, chunk_s: dict[str, list[float]], p2p: list[float]) -> float:
    """An independent recurrence: each stage runs its ops in order, an op starts when its stage is
    free and its inputs are there (the previous chunk's forward plus the transfer; the next chunk's
    backward plus the transfer; its own forward; its own B for a W)."""
    C = pp * vpp
    orders = [stage_order(schedule, pp, m, vpp, s) for s in range(pp)]
    end: dict[tuple[str, int, int], float] = {}
    pos, free = [0] * pp, [0.0] * pp
    while any(pos[s] < len(orders[s]) for s in range(pp)):
        moved = False
        for s in range(pp):
            while pos[s] < len(orders[s]):
                o = orders[s][pos[s]]
                need = []
                if o.kind == "F" and o.chunk > 0:
                    need.append((("F", o.micro, o.chunk - 1), p2p[o.chunk - 1]))
                if o.kind == "B":
                    need.append((("F", o.micro, o.chunk), 0.0))
                    if o.chunk < C - 1:
                        need.append((("B", o.micro, o.chunk + 1), p2p[o.chunk]))
                if o.kind == "W":
                    need.append((("B", o.micro, o.chunk), 0.0))
                if any(k not in end for k, _ in need):
                    break
                start = max([free[s]] + [end[k] + d for k, d in need])
                end[(o.kind, o.micro, o.chunk)] = free[s] = start + chunk_s[o.kind][o.chunk]
                pos[s] += 1
                moved = True
        assert moved, "the orders deadlock"
    return max(free)


@pytest.mark.parametrize("schedule,pp,m,vpp", [("1f1b", 4, 6, 1), ("gpipe", 3, 4, 1), ("interleaved", 2, 4, 3), ("zb_h1", 4, 5, 1),
                                                ("interleaved", 4, 8, 2)])
def test_uneven_stages_match_a_reference_recurrence(schedule: str, pp: int, m: int, vpp: int) -> None:
    rng = np.random.default_rng(7)
    C = pp * vpp
    times = [tuple(float(x) for x in rng.uniform(0.2, 2.0, 3)) for _ in range(2 * C)]
    p2p = [float(x) for x in rng.uniform(0.0, 0.5, C - 1)]
    tl, _, tg = simulate(schedule, pp, m, vpp, times=times, p2p=p2p)
    split = splits_backward(schedule)
    chunk_s = {"F": [times[2 * c][0] + times[2 * c + 1][0] for c in range(C)],
               "B": [sum(times[2 * c + k][1] + (0.0 if split else times[2 * c + k][2]) for k in (0, 1)) for c in range(C)],
               "W": [times[2 * c][2] + times[2 * c + 1][2] for c in range(C)]}
    assert tl.makespan == pytest.approx(reference_makespan(schedule, pp, m, vpp, chunk_s, p2p), rel=1e-12)
