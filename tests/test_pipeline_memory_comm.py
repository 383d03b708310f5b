"""The pipeline simulator's memory by kind and its DP / ZeRO / PP communication
(simulators/pipeline.py, simulators/pipeline_figures.py), on resolved unit costs.

Formulas (``../shared/data/llm/README.md``; ZeRO, Rajbhandari et al. SC'20, Sec. 5): mixed-precision
Adam needs 16P bytes unsharded, ZeRO-1 4P + 12P/d, ZeRO-2 2P + 14P/d, ZeRO-3 16P/d; a step moves
about 2P (DP, ZeRO-1, ZeRO-2) or 3P (ZeRO-3) parameter-sized messages through each rank."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from harness.core.llm.plan import ParallelPlan, PlanError
from simulators import engine
from simulators.pipeline import expand_pipeline
from simulators.taskgraph import COMPUTE
from harness.core.llm.memory import STATE_BYTES
from simulators.pipeline_costs import UnitCost, static_memory, wire_bytes
from simulators.pipeline_figures import CAT, COMM_KINDS, time_split


def units_of(n: int, params: int = 1_000_000, expert: int = 0, f: float = 1.0, b: float = 2.0, stored: int = 1000,
             comm: dict | None = None) -> list[UnitCost]:
    return [UnitCost(f"u{u}", f, b, 0.0, 0.0, dict(comm or {}), {}, stored, 0, 4096, params, expert) for u in range(n)]


def run(plan: ParallelPlan, m: int, units: list[UnitCost], coll_bw: float | None = None, p2p: float = 0.0, opt: float = 0.0,
        stolen: float = 0.0):
    """Expand and run; DP / ZeRO collectives at ``coll_bw`` bytes/s over their wire bytes (free when None), each
    lengthening the stage op it ends in by ``stolen`` of its seconds."""
    d = plan.dp * plan.cp

    def coll(op: str, nb: float, grp: str) -> tuple[float, float]:
        size = d if grp == "dp" else max(1, d // plan.ep)
        w = wire_bytes(op, nb, size)
        return (w / coll_bw if coll_bw else 0.0), w

    tg, _ = expand_pipeline(plan, m, units, [p2p] * (plan.chunks - 1), coll, [opt] * plan.pp, "amp_fp16", stolen=stolen)
    tl = engine.run(tg, plan.pp, 3 * plan.pp)
    return tg, tl, time_split(tg, tl, plan.pp)


@pytest.mark.parametrize("zero,formula", [(0, lambda P, d: 16 * P), (1, lambda P, d: 4 * P + 12 * P / d),
                                          (2, lambda P, d: 2 * P + 14 * P / d), (3, lambda P, d: 16 * P / d)])
@pytest.mark.parametrize("dp,cp", [(1, 1), (8, 1), (4, 2)])
def test_model_states_follow_zero(zero: int, formula, dp: int, cp: int) -> None:
    P = 3_000_000
    plan = ParallelPlan(tp=2, pp=2, dp=dp, cp=cp, zero=zero, stages=(3, 2))
    units = units_of(5, params=P // 3)
    mem = static_memory(plan, units, [plan.stage_units(s) for s in range(2)], "amp_fp16")
    d = dp * cp  # Megatron's distributed optimizer and FSDP shard over data x context parallel ranks
    states = mem["weights"][0] + mem["gradients"][0] + mem["optimizer"][0]
    assert states == pytest.approx(formula(P, d), abs=3)
    assert mem["weights"][1] + mem["gradients"][1] + mem["optimizer"][1] == pytest.approx(formula(2 * P // 3, d), abs=3)


def test_expert_states_shard_over_the_expert_data_parallel_group() -> None:
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=4, zero=1, stages=(2,))
    units = units_of(2, params=5_000_000, expert=4_000_000)
    mem = static_memory(plan, units, [[0, 1]], "amp_fp16")
    dense, expert = 2 * 1_000_000, 2 * 4_000_000
    assert mem["optimizer"][0] == pytest.approx(12 * (dense / 8 + expert / 2), abs=2)  # dp*cp/ep = 2 ranks hold an expert


def test_state_bytes_are_sixteen_under_mixed_precision() -> None:
    assert sum(STATE_BYTES["amp_fp16"]) == sum(STATE_BYTES["fp32"]) == 16
    assert STATE_BYTES["amp_bf16"] == (2, 4, 12)  # fp32 main gradients under bf16 (Megatron-LM, torchtitan)


@pytest.mark.parametrize("zero,per_step", [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_dp_traffic_per_step(zero: int, per_step: int) -> None:
    # a ring rank sends (d-1)/d of each parameter-sized message: 2P for all-reduce (or reduce-scatter
    # + all-gather), 3P for ZeRO-3 (gather for forward and backward, reduce-scatter), m = 1
    P, d = 4_000_000, 8
    plan = ParallelPlan(tp=1, pp=1, dp=d, zero=zero, stages=(4,))
    tg, _, _ = run(plan, 1, units_of(4, params=P // 4))
    dp = tg.meta["cat"] == CAT["dp"]
    assert tg.wire_bytes[dp].sum() == pytest.approx(per_step * (d - 1) / d * 2 * P)  # 16-bit messages


def test_zero3_gathers_and_reduces_every_micro_batch() -> None:
    plan = ParallelPlan(tp=1, pp=1, dp=4, zero=3, stages=(3,))
    tg, _, _ = run(plan, 5, units_of(3))
    labels = [tg.label[t] for t in np.flatnonzero(tg.meta["cat"] == CAT["dp"])]
    assert sum(x.startswith("dp all_gather") for x in labels) == 2 * 5 * 3  # forward and backward, per unit and micro-batch
    assert sum(x.startswith("dp reduce_scatter") for x in labels) == 5 * 3
    kept = ParallelPlan(tp=1, pp=1, dp=4, zero=3, stages=(3,), reshard_after_forward=False)
    tg2, _, _ = run(kept, 5, units_of(3))
    assert sum(tg2.label[t].startswith("dp all_gather") for t in np.flatnonzero(tg2.meta["cat"] == CAT["dp"])) == 5 * 3


def test_gather_once_gathers_and_reduces_each_unit_once_a_step() -> None:
    """torchtitan's FSDP2 under a pipeline (``gather_once``): each unit of a stage gathered at its
    first forward and reduce-scattered after its last backward, whatever the micro-batches and the
    schedule; the stage's weights and unsharded gradients held all step."""
    P, d, m = 1_000_000, 4, 6
    for sched, vpp, stages in (("1f1b", 1, (2, 2)), ("interleaved", 2, (1, 1, 1, 1))):
        plan = ParallelPlan(tp=1, pp=2, dp=d, zero=3, stages=stages, schedule=sched, vpp=vpp, gather_once=True)
        tg, _, _ = run(plan, m, units_of(4, params=P))
        labels = [tg.label[t] for t in np.flatnonzero(tg.meta["cat"] == CAT["dp"])]
        assert sum(x.startswith("dp all_gather") for x in labels) == 4
        assert sum(x.startswith("dp reduce_scatter") for x in labels) == 4
    every = ParallelPlan(tp=1, pp=2, dp=d, zero=3, stages=(2, 2))
    once = ParallelPlan(tp=1, pp=2, dp=d, zero=3, stages=(2, 2), gather_once=True)
    units = units_of(4, params=P)
    w, g, _ = STATE_BYTES["amp_bf16"]
    per_stage = [plan_mem["buffers"][0] for plan_mem in (static_memory(p, units, [p.stage_units(s) for s in range(2)], "amp_bf16")
                                                          for p in (every, once))]
    boundary = 2 * units[0].boundary_bytes
    assert per_stage[1] - boundary == (w + g) * 2 * P           # the stage's two units, gathered, and their gradients
    assert per_stage[0] - boundary == w * 2 * P + g * P         # the unit in use and the prefetched one, one unit's gradient


def test_keep_lp_grads_holds_the_16_bit_gradients_and_adds_them_every_micro_batch() -> None:
    """DeepSpeed's BF16_Optimizer (``keep_lp_grads``): the 16-bit gradients (2 bytes a parameter,
    unsharded) beside the FP32 ones all step and nothing else; one accumulation pass per micro-batch
    and chunk after its backward and before that backward's send, on the stage's device."""
    P, m, acc = 1_000_000, 6, 0.3
    base = ParallelPlan(tp=1, pp=2, dp=4, zero=1, stages=(2, 2))
    keep = ParallelPlan(tp=1, pp=2, dp=4, zero=1, stages=(2, 2), keep_lp_grads=True)
    units = units_of(4, params=P)
    mem = [static_memory(p, units, [p.stage_units(s) for s in range(2)], "amp_bf16") for p in (base, keep)]
    for s in range(2):
        assert mem[1]["gradients"][s] - mem[0]["gradients"][s] == STATE_BYTES["amp_bf16"][0] * 2 * P
        assert all(mem[1][k][s] == mem[0][k][s] for k in mem[0] if k != "gradients")

    def step(plan: ParallelPlan, grad_acc):
        tg, _ = expand_pipeline(plan, m, units, [0.05], lambda op, nb, grp: (0.0, 0.0), [0.0, 0.0], "amp_bf16", None, grad_acc)
        return tg, engine.run(tg, 2, 6)

    tg0, tl0 = step(base, None)
    tg, tl = step(keep, [acc, acc])
    # its FP32 gradients are all-reduced in BF16 (each rank then steps its shard and all-gathers), not reduce-scattered
    ar = [t for t, x in enumerate(tg.label) if x.startswith("dp all_reduce bucket")]
    rs = [t for t, x in enumerate(tg0.label) if x.startswith("dp reduce_scatter bucket")]
    assert ar and rs and not any("reduce_scatter" in x for x in tg.label)
    assert sum(tg.nbytes[t] for t in ar) * STATE_BYTES["amp_bf16"][1] == sum(tg0.nbytes[t] for t in rs) * STATE_BYTES["amp_bf16"][0]
    assert any(x.startswith("dp all_gather bucket") for x in tg.label)
    passes = [t for t, x in enumerate(tg.label) if x.startswith("grad accumulate")]
    assert len(passes) == 2 * m and not any(x.startswith("grad accumulate") for x in tg0.label)
    assert tl.busy == pytest.approx(tl0.busy + m * acc)
    assert tl.makespan > tl0.makespan
    for t in passes:
        i = int(tg.label[t].split()[2])
        if tg.dev[t] == 1:  # stage 1 sends micro-batch i's input gradient back only after its pass
            send = tg.label.index(f"pp B{i} c0<-c1")
            assert tl.start[send] >= tl.end[t] - 1e-12


@pytest.mark.parametrize("mode, passes", [("fused", 0), ("hook", 6), ("autograd", 5)])
def test_an_unfused_gradient_accumulation_adds_each_micro_batch_after_its_backward(mode: str, passes: int) -> None:
    """``grad_accumulation``: Megatron-LM's ``main_grad.add_`` hook after every micro-batch's
    backward, PyTorch's AccumulateGrad from the second on (the first micro-batch's gradient is
    stored as it is), fused no pass; the memory does not move (the gradients are stored anyway)."""
    m, acc = 6, 0.3
    plan = ParallelPlan(tp=1, pp=2, dp=4, zero=1, stages=(2, 2), grad_accumulation=mode)
    units = units_of(4)
    tg, _ = expand_pipeline(plan, m, units, [0.05], lambda op, nb, grp: (0.0, 0.0), [0.0, 0.0], "amp_fp16", None, [acc, acc])
    tl = engine.run(tg, 2, 6)
    labels = [x for x in tg.label if x.startswith("grad accumulate")]
    assert len(labels) == 2 * passes
    assert ("grad accumulate 0 c0" in labels) is (mode == "hook")
    fused, _ = expand_pipeline(replace(plan, grad_accumulation="fused"), m, units, [0.05], lambda op, nb, grp: (0.0, 0.0),
                               [0.0, 0.0], "amp_fp16", None, [acc, acc])
    assert tl.busy == pytest.approx(engine.run(fused, 2, 6).busy + passes * acc)
    base = static_memory(replace(plan, grad_accumulation="fused"), units, [plan.stage_units(s) for s in range(2)], "amp_fp16")
    mem = static_memory(plan, units, [plan.stage_units(s) for s in range(2)], "amp_fp16")
    assert all(np.array_equal(mem[k], base[k]) for k in base)


@pytest.mark.parametrize("schedule, vpp", [("1f1b", 1), ("interleaved", 2), ("gpipe", 1), ("zb_h1", 1)])
def test_a_blocking_send_holds_its_stage_until_it_is_delivered(schedule: str, vpp: int) -> None:
    """``blocking_sends`` (DeepSpeed's blocking ``dist.send``, Megatron-LM's synchronize after
    ``batch_isend_irecv``): the sending stage's next task starts only once its send has arrived;
    the work is the same, the step no shorter; without it a stage goes on at once."""
    m, p2p = 4, 0.7
    stages = (1, 1, 1, 1) if vpp == 2 else (2, 2)
    plans = [ParallelPlan(tp=1, pp=2, dp=1, zero=0, vpp=vpp, schedule=schedule, stages=stages, blocking_sends=b) for b in (False, True)]
    (tg0, tl0, _), (tg, tl, _) = (run(p, m, units_of(4), p2p=p2p) for p in plans)
    assert tl.busy == pytest.approx(tl0.busy) and tl.makespan >= tl0.makespan - 1e-12
    sends = [t for t, x in enumerate(tg.label) if x.startswith("pp ")]
    for t in sends:
        src = int(tg.dev[t])
        later = [k for k in range(len(tg.label)) if tg.kind[k] == COMPUTE and tg.dev[k] == src and tl.start[k] > tl.start[t] - 1e-12
                 and tg.prio[k] > max(tg.prio[j] for j in range(len(tg.label)) if tg.kind[j] == COMPUTE and tg.dev[j] == src
                                      and tl.end[j] <= tl.start[t] + 1e-12)]
        assert all(tl.start[k] >= tl.end[t] - 1e-12 for k in later), tg.label[t]
    waited = [t for t in sends if any(tg0.kind[k] == COMPUTE and tg0.dev[k] == tg0.dev[t]
                                      and tl0.start[t] - 1e-12 <= tl0.start[k] < tl0.end[t] - 1e-12 for k in range(len(tg0.label)))]
    assert waited  # without blocking, some stage computed while its send was on the wire


def test_the_accumulation_pass_moves_the_stored_gradients_bytes() -> None:
    """The pass reads each new 16-bit gradient and reads and writes the stored one: 6 bytes a
    parameter with 16-bit gradients (``amp_fp16``), 10 with FP32 ones (``amp_bf16``)."""
    from simulators.pipeline_costs import grad_accumulation_seconds

    class Bytes:
        def kernel_times(self, table, device, n):
            return np.asarray(table.dims[:, 0], dtype=float)

    assert grad_accumulation_seconds(Bytes(), 0, 1000, "amp_fp16") == 6000
    assert grad_accumulation_seconds(Bytes(), 0, 1000, "amp_bf16") == 10000


@pytest.mark.parametrize("kw, says", [({"grad_accumulation": "hook", "zero": 2}, "algo.zero=2 shards the gradients"),
                                      ({"grad_accumulation": "autograd", "keep_lp_grads": True}, "set algo.grad_accumulation=hook"),
                                      ({"grad_accumulation": "fusd"}, "algo.grad_accumulation")])
def test_an_unfused_gradient_accumulation_is_refused_where_it_cannot_be(kw: dict, says: str) -> None:
    with pytest.raises(PlanError, match=says):
        ParallelPlan(tp=1, pp=1, dp=2, **{"zero": 1, **kw})


def test_keep_lp_grads_needs_gradients_wider_than_the_weights() -> None:
    from harness.app.compose import compose
    from harness.app.run import run as run_job

    job = ["model=llm", "model.layers=2", "model.hidden=256", "model.heads=4", "model.kv_heads=4", "model.ffn_hidden=1024",
           "model.seq_len=128", "model.vocab=1000", "model.batch_size=8", "cluster=dgx_a100", "algo=megatron", "algo.tp=2", "algo.pp=2",
           "algo.keep_lp_grads=true", "output.gantt=false", "output.trace=false", "output.worth=false"]
    with pytest.raises(PlanError, match="precision=amp_fp16 keeps its gradients in 2 bytes like its weights"):
        run_job(compose([*job, "precision=amp_fp16"]))
    row = run_job(compose([*job, "precision=amp_bf16"])).row
    assert row["memory_breakdown"]["gradients"] > 0 and row["step_time_s"] > 0


def test_bucketed_reduction_overlaps_the_backward() -> None:
    units = units_of(8, params=20_000_000)  # 40 MB of 16-bit gradients a unit: one bucket per 4 units
    kw = dict(tp=1, pp=1, dp=8, zero=1, stages=(8,), bucket_bytes=160_000_000)
    on, _, split_on = run(ParallelPlan(**kw), 2, units, coll_bw=50e6)
    off, _, split_off = run(ParallelPlan(**kw, overlap_grad_reduce=False), 2, units, coll_bw=50e6)
    buckets = [on.label[t] for t in np.flatnonzero(on.meta["cat"] == CAT["dp"]) if "reduce_scatter" in on.label[t]]
    assert len(buckets) == 2
    assert split_on["dp"][0] < split_off["dp"][0]


def test_time_split_adds_up_to_the_step() -> None:
    comm = {("forward", "tp"): 0.1, ("backward", "tp"): 0.1, ("forward", "ep"): 0.05}
    plan = ParallelPlan(tp=2, pp=4, dp=2, zero=1, stages=(2, 2, 2, 2))
    tg, tl, split = run(plan, 8, units_of(8, comm=comm), coll_bw=1e9, p2p=0.05, opt=0.2)
    step = tl.makespan
    for s in range(4):
        total = split["compute"][s] + sum(split[k][s] for k in COMM_KINDS) + split["bubble"][s]
        assert total == pytest.approx(step)
        assert split["bubble"][s] >= 0
    assert split["tp"] == pytest.approx([8 * 2 * 0.2] * 4)  # two units, forward and backward, per micro-batch
    assert split["ep"] == pytest.approx([8 * 2 * 0.05] * 4)
    assert (split["pp"] > 0).all()  # the P2P transfers delay the next stage's passes
    assert split["compute"] == pytest.approx([8 * 2 * 3.0 + 0.2] * 4)


def test_zero3_prefetch_hides_gathers_shorter_than_a_unit() -> None:
    plan = ParallelPlan(tp=1, pp=1, dp=8, zero=3, stages=(6,))
    units = units_of(6, params=1_000_000)  # a gather: 2 MB x 7/8 at 100 MB/s = 17.5 ms, a unit's forward 1 s
    _, tl, split = run(plan, 2, units, coll_bw=100e6)
    first = wire_bytes("all_gather", 2e6, 8) / 100e6
    assert split["dp"][0] == pytest.approx(first + wire_bytes("reduce_scatter", 2e6, 8) / 100e6)  # the first gather, the last reduce
    slow = units_of(6, params=100_000_000)  # a gather: 200 MB: 1.75 s, longer than a unit: exposed beyond the prefetch
    _, _, split2 = run(plan, 2, slow, coll_bw=100e6)
    assert split2["dp"][0] > 10 * split["dp"][0]


def test_activation_buffers_free_at_their_backward() -> None:
    plan = ParallelPlan(tp=1, pp=1, dp=1, stages=(4,))
    tg, tl, _ = run(plan, 3, units_of(4, stored=100))
    assert tl.peak_mem[0] == 4 * 100  # 1F1B on one stage: one micro-batch in flight
    gp = ParallelPlan(tp=1, pp=1, dp=1, stages=(4,), schedule="gpipe")
    _, tl2, _ = run(gp, 3, units_of(4, stored=100))
    assert tl2.peak_mem[0] == 3 * 4 * 100


@pytest.mark.parametrize("zero,kw", [(3, {}), (1, {"bucket_bytes": 4_000_000})])
@pytest.mark.parametrize("slowdown", [0.1, 0.189, 0.5])
def test_a_collective_overlapping_an_op_slows_it(zero: int, kw: dict, slowdown: float) -> None:
    """Each DP / ZeRO collective that ends while its stage computes lengthens that op by
    slowdown / (1 + slowdown) of its seconds; one ending while the stage waits (FSDP's first gather,
    its last reduce-scatter) costs nothing more."""
    from harness.core.costs import stolen_fraction

    plan = ParallelPlan(tp=1, pp=1, dp=8, zero=zero, stages=(6,), **kw)
    units = units_of(6, params=2_000_000)  # collectives of tens of ms beside units of 1-2 s
    k = stolen_fraction(slowdown)
    assert k == pytest.approx(slowdown / (1 + slowdown)) and 0 < k < slowdown
    tg, tl, _ = run(plan, 2, units, coll_bw=100e6)
    comp = np.flatnonzero((tg.kind == COMPUTE) & (tg.dev == 0))
    colls = np.flatnonzero(tg.meta["cat"] == CAT["dp"])
    inside = [c for c in colls if ((tl.start[comp] < tl.end[c]) & (tl.end[c] < tl.end[comp])).any()]
    assert 0 < len(inside) < len(colls) if zero == 3 else len(inside) > 0
    tg2, tl2, _ = run(plan, 2, units, coll_bw=100e6, stolen=k)
    assert np.array_equal(tg2.steal > 0, np.isin(np.arange(tg2.num_tasks), colls))
    assert tl2.makespan == pytest.approx(tl.makespan + k * float(tg.dur[inside].sum()), rel=1e-9)
    assert tl2.busy[0] == pytest.approx(tl.busy[0] + k * float(tg.dur[inside].sum()), rel=1e-9)
    _, tl0, _ = run(plan, 2, units, coll_bw=100e6, stolen=0.0)
    assert tl0.makespan == tl.makespan
