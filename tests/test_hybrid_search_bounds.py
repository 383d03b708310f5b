"""algo=hybrid_search's pieces against what they claim (issue 35): the stage DP against every
partition, the declared space against the plan rules, the schedules' counts against their
orders, and the memory and step lower bounds against the simulation on random small problems."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from algorithms.llm_search import Partitions
from algorithms.llm_search_bounds import (MemoryModel, Orders, in_flight_at_first_backward, replay_bound, step_bound,
                                          zb_weights_before_last_backward)
from algorithms.llm_search_costing import Costing
from algorithms.llm_search_space import Candidate, SearchSpace
from algorithms.stage_dp import min_bottleneck_stages
from harness.core.costs import AnalyticalCostModel
from harness.core.llm.memory import model_state_bytes, state_coefficients
from harness.core.llm.plan import PlanError, plan_from_degrees
from harness.core.llm.schedules import stage_order
from simulators.pipeline_figures import CAT
from simulators.simulate import simulate
from tests.helpers import make_cluster
from tests.stack_helpers import toy_stack

#: the relative slack of a bound against the simulation: sums of the same durations in another order
ROUNDING = 1e-9


# ---------------------------------------------------------------------------- the stage DP
def compositions(n: int, chunks: int) -> Any:
    for cuts in itertools.combinations(range(1, n), chunks - 1):
        b = (0, *cuts, n)
        yield tuple(b[i + 1] - b[i] for i in range(chunks))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_stage_dp_finds_the_least_bottleneck_of_every_partition(data: Any) -> None:
    """Against every contiguous partition: the same least heaviest piece, under a memory limit
    that grows with the units and with the stage's micro-batches in flight too."""
    n = data.draw(st.integers(1, 9))
    chunks = data.draw(st.integers(1, n))
    w = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.25]) | st.floats(0, 10), min_size=n, max_size=n)))
    mem = np.array(data.draw(st.lists(st.floats(0, 1), min_size=n, max_size=n)))
    cap = data.draw(st.floats(0.05, 3))
    limited = data.draw(st.booleans())

    def fits(s: int, b: int, e: int) -> bool:
        return (chunks - s) * float(mem[b:e].sum()) <= cap

    f = fits if limited else None
    best = None
    for parts in compositions(n, chunks):
        edges = np.cumsum((0, *parts))
        if f is not None and not all(f(s, int(edges[s]), int(edges[s + 1])) for s in range(chunks)):
            continue
        v = max(float(w[edges[s]:edges[s + 1]].sum()) for s in range(chunks))
        best = v if best is None else min(best, v)
    got = min_bottleneck_stages(w, chunks, f)
    if best is None:
        assert got is None
        return
    assert got is not None and sum(got) == n and min(got) >= 1 and len(got) == chunks
    edges = np.cumsum((0, *got))
    assert f is None or all(f(s, int(edges[s]), int(edges[s + 1])) for s in range(chunks))
    assert max(float(w[edges[s]:edges[s + 1]].sum()) for s in range(chunks)) == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_the_stage_dp_packs_from_the_back_and_refuses_what_cannot_be_cut() -> None:
    w = np.r_[0.3, np.full(126, 1.0), 2.0]  # Llama 3 405B's shape: a light embedding, 126 blocks, a heavy head
    parts = min_bottleneck_stages(w, 16)
    assert parts == (9, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7)  # the head's stage one block lighter, the first one heavier
    assert min_bottleneck_stages([1.0, 1.0], 3) is None
    with pytest.raises(ValueError, match="finite non-negative"):
        min_bottleneck_stages([1.0, float("nan")], 1)


# ---------------------------------------------------------------------------- the declared space
@pytest.mark.parametrize("gpus, kw", [(8, {}), (16, {"layers": 4, "heads": 8, "kv_heads": 4}), (8, {"experts": 4, "top_k": 2})])
def test_the_space_is_the_rules_product_within_its_bounds(gpus: int, kw: dict[str, Any]) -> None:
    """Every even-stage candidate is a valid plan, and every valid plan of the raw product within
    the declared bounds is a candidate (the rules of harness.core.llm.plan, by brute force)."""
    g = toy_stack(batch=32, **kw)
    space = SearchSpace(max_micro_batch=4, max_vpp=2)
    cands = {c for c in space.candidates(g, gpus, 8) if c.stages == "even"}
    valid = set()
    for tp, pp, cp, ep, vpp, sched, mb, rc, sp, z in itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8, 16), (1,), (1, 2, 4), (1, 2),
                                                                      ("1f1b", "interleaved", "zb_h1"), (1, 2, 4, 8, 16, 32),
                                                                      ("none", "selective", "full"), (False, True), (0, 1, 2, 3)):
        if tp > 8 or (pp == 1 and sched != "1f1b") or (vpp > 1) != (sched == "interleaved"):
            continue  # outside the declared bounds: TP within a node; one stage runs no schedule
        try:
            p = plan_from_degrees(g, gpus, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, schedule=sched, micro_batch=mb, recompute=rc,
                                  sequence_parallel=sp, zero=z)
        except PlanError:
            continue
        if mb > 4 and not (pp == 1 and mb == 32 // p.dp):
            continue  # the micro-batch cap (without a pipeline the whole per-replica batch is declared too)
        valid.add(Candidate(tp, cp, ep, pp, p.dp, vpp, p.schedule, mb, rc, sp, z, "even"))
    assert cands == valid and cands


def test_the_space_refuses_a_bad_choice_in_one_line() -> None:
    from harness.core.errors import OptionError
    from tests.helpers import refused

    refused(lambda: SearchSpace(schedules=["1f1b", "gpipe"]), "algo.schedules[1] must be one of 1f1b, interleaved, zb_h1", kind=OptionError)
    refused(lambda: SearchSpace(zero=[0, 4]), "algo.zero[1]", kind=OptionError)
    refused(lambda: SearchSpace(stages=[]), "algo.stages must be one or a non-empty list", kind=OptionError)
    refused(lambda: SearchSpace(max_micro_batch=0), "algo.max_micro_batch", kind=OptionError)
    assert SearchSpace(zero=3).zero == (3,) and SearchSpace(sequence_parallel=True).sequence_parallel == (True,)


# ---------------------------------------------------------------------------- the schedules' counts
@pytest.mark.parametrize("schedule, pp, m, vpp", [("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1), ("zb_h1", 4, 8, 1), ("zb_h1", 5, 3, 1),
                                                  ("gpipe", 3, 4, 1), ("interleaved", 4, 8, 2), ("interleaved", 4, 4, 3),
                                                  ("interleaved", 2, 6, 4), ("1f1b", 1, 3, 1), ("interleaved_torch", 4, 4, 2),
                                                  ("interleaved_torch", 8, 8, 2), ("interleaved_torch", 4, 8, 3)])
def test_the_counts_of_the_bounds_are_the_orders(schedule: str, pp: int, m: int, vpp: int) -> None:
    for s in range(pp):
        ops = stage_order(schedule, pp, m, vpp, s)
        first_b = next(i for i, o in enumerate(ops) if o.kind == "B")
        counts = [sum(1 for o in ops[:first_b] if o.kind == "F" and o.chunk == l * pp + s) for l in range(vpp)]
        assert in_flight_at_first_backward(schedule, pp, vpp, m, s) == counts
        if schedule == "zb_h1":
            last_b = max(i for i, o in enumerate(ops) if o.kind == "B")
            assert zb_weights_before_last_backward(pp, m, s) == sum(o.kind == "W" for o in ops[:last_b])


def test_the_memory_coefficients_are_the_states_before_rounding() -> None:
    for prec, zero, d, de in itertools.product(("amp_bf16", "fp32"), (0, 1, 2, 3), (1, 3, 8), (1, 2)):
        cd, ce = state_coefficients(prec, zero, d, de)
        for dense, expert in ((1000, 0), (12345, 678), (1, 1)):
            total = float(sum(model_state_bytes(prec, zero, dense, expert, d, de)))
            assert cd * dense + ce * expert <= total < cd * dense + ce * expert + 3 + 1e-6


# ---------------------------------------------------------------------------- the bounds against the simulator
@st.composite
def problems(draw: Any) -> tuple[Any, Any, Any, Candidate]:
    moe = draw(st.booleans())
    kw: dict[str, Any] = dict(layers=draw(st.integers(2, 6)), hidden=draw(st.sampled_from([256, 512])), heads=8,
                              kv_heads=draw(st.sampled_from([4, 8])), ffn_hidden=1024, seq_len=draw(st.sampled_from([128, 256])),
                              vocab=draw(st.sampled_from([1000, 32000])), tied_embeddings=draw(st.booleans()))
    if moe:
        kw.update(experts=4, top_k=2)
    g = toy_stack(batch=draw(st.sampled_from([16, 32])), **kw)
    nodes = draw(st.sampled_from([1, 2]))
    cluster = make_cluster(8 // nodes, nodes=nodes, mem_GiB=draw(st.sampled_from([0.25, 1.0, 16.0])))
    cands = SearchSpace(max_micro_batch=4, max_vpp=3).candidates(g, 8, 8 // nodes)
    return g, cluster, AnalyticalCostModel(cluster), cands[draw(st.integers(0, len(cands) - 1))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_the_bounds_never_exceed_the_simulation(problem: tuple[Any, Any, Any, Candidate]) -> None:
    """On random small problems and candidates: the memory bound of every stage is at most its
    simulated peak, and the closed-form and replayed step bounds at most the simulated step."""
    g, cluster, costs, c = problem
    costing = Costing(g, cluster, costs)
    t = costing.table(c)
    m = g.batch_size // (c.dp * c.micro_batch)
    mem = MemoryModel(c, t, m, g.precision)
    parts_of = Partitions(g, costing.capacity)
    parts = parts_of.even(c.pp, c.vpp) if c.stages == "even" else (parts_of.balanced(c, t, mem) or parts_of.fastest(c, t))
    res = simulate(g, c.plan(parts), cluster, costs)
    peak = np.asarray(res.peak_memory_bytes, dtype=np.float64)
    assert np.all(mem.stages(parts) <= peak * (1 + ROUNDING)), (mem.stages(parts), peak)
    assert step_bound(costing, c, parts, t, m) <= res.step_time_s * (1 + ROUNDING)
    assert replay_bound(costing, Orders(), c, parts, t, m) <= res.step_time_s * (1 + ROUNDING)


def test_the_replayed_bound_misses_only_the_optimizer_when_communication_is_free() -> None:
    """One node whose links have no latency and a vast bandwidth: the replayed schedule is the
    simulated step but for the optimizer step, which the bound leaves out (tight where only
    compute remains)."""
    g = toy_stack(batch=32, layers=8)
    cluster = make_cluster(8, bw_GBps=1e9, mem_GiB=16)
    costs = AnalyticalCostModel(cluster)
    costing = Costing(g, cluster, costs)
    for c in (Candidate(1, 1, 1, 4, 2, 1, "1f1b", 2, "none", False, 0, "even"),
              Candidate(1, 1, 1, 2, 4, 2, "interleaved", 1, "full", False, 1, "even"),
              Candidate(2, 1, 1, 4, 1, 1, "zb_h1", 4, "selective", True, 2, "even")):
        t = costing.table(c)
        m = 32 // (c.dp * c.micro_batch)
        parts = Partitions(g, costing.capacity).even(c.pp, c.vpp)
        res = simulate(g, c.plan(parts), cluster, costs)
        optimizer = float(res.taskgraph.dur[res.taskgraph.meta["cat"] == CAT["opt"]].max())
        bound = replay_bound(costing, Orders(), c, parts, t, m)
        assert res.step_time_s - optimizer - 1e-6 * res.step_time_s <= bound <= res.step_time_s
