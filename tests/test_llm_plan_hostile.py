"""Issue 33: every invalid combination of a parallel plan is one line naming the rule broken and
a nearby valid choice (a :class:`PlanError`), one test per rule - through ``plan_from_degrees``
and, for a few, through ``python -m harness`` (one line on stderr, exit 1, no result.json)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from harness.core.llm.plan import ParallelPlan, PlanError, plan_from_degrees
from tests.helpers import refused, run_harness
from tests.stack_helpers import chain_stack, toy_stack


def bad(graph: Any, gpus: int, *fragments: str, **degrees: Any) -> PlanError:
    """``plan_from_degrees(graph, gpus, **degrees)`` is refused in one line holding every fragment."""
    return refused(lambda: plan_from_degrees(graph, gpus, **degrees), *fragments, kind=PlanError)


# ---------------------------------------------------------------------------- values
@pytest.mark.parametrize("key", ["tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch"])
@pytest.mark.parametrize("value", [0, -1, 2.5, math.nan, "abc", True])
def test_a_degree_is_an_integer_of_at_least_one(key: str, value: Any) -> None:
    bad(toy_stack(), 16, f"algo.{key} must be an integer >= 1", **{key: value})


@pytest.mark.parametrize("value", [-1, 4, 1.5, math.nan, "two", True])
def test_zero_is_a_stage_from_0_to_3(value: Any) -> None:
    bad(toy_stack(), 16, "algo.zero must be an integer ZeRO stage 0, 1, 2 or 3", "got", zero=value)


def test_recompute_is_none_selective_or_full() -> None:
    bad(toy_stack(), 16, "algo.recompute must be one of none, selective, full", "'some'", recompute="some")


def test_the_schedule_is_one_of_five() -> None:
    bad(toy_stack(), 16, "algo.schedule must be one of gpipe, 1f1b, interleaved, interleaved_torch, zb_h1", "'pipedream'",
        schedule="pipedream")
    bad(toy_stack(), 16, "algo.schedule=interleaved_torch needs algo.vpp > 1", schedule="interleaved_torch", pp=4)


@pytest.mark.parametrize("stages", ["even", 3, [2, 0, 8], [2.5, 7.5]])
def test_stages_are_null_balanced_or_unit_counts(stages: Any) -> None:
    bad(toy_stack(), 2, "algo.stages", "got", pp=2, stages=stages)


# ---------------------------------------------------------------------------- degrees and the GPU count
def test_the_degrees_multiply_to_the_gpu_count() -> None:
    bad(toy_stack(), 16, "algo.tp=2 x algo.pp=2 x algo.dp=3 x algo.cp=1 = 12 GPUs, but the cluster has 16", "use algo.dp=4",
        tp=2, pp=2, dp=3)


def test_tp_pp_cp_divide_the_gpus_when_dp_is_left_out() -> None:
    bad(toy_stack(), 16, "algo.tp x algo.pp x algo.cp = 2 x 3 x 1 = 6 does not divide the cluster's 16 GPUs", "use algo.pp=2 or algo.pp=4",
        tp=2, pp=3)
    bad(toy_stack(), 16, "= 3 does not divide", "use algo.cp=2 or algo.cp=4", cp=3)


# ---------------------------------------------------------------------------- tensor parallelism and the shape
def test_tp_divides_the_heads() -> None:
    g = toy_stack(heads=32, kv_heads=32, hidden=1024, ffn_hidden=4096)
    bad(g, 48, "algo.tp=6 does not divide model.heads=32", "use algo.tp=4 or algo.tp=8", tp=6)


def test_tp_divides_the_kv_heads() -> None:
    g = toy_stack(heads=32, kv_heads=4, hidden=1024, ffn_hidden=4096)
    bad(g, 8, "algo.tp=8 does not divide model.kv_heads=4", "use algo.tp=4", tp=8)


def test_tp_divides_the_ffn() -> None:
    g = toy_stack(heads=16, kv_heads=16, ffn_hidden=1000)
    bad(g, 16, "algo.tp=16 does not divide model.ffn_hidden=1000", "use algo.tp=8", tp=16)


def test_tp_divides_an_experts_ffn() -> None:
    g = toy_stack(heads=16, kv_heads=16, ffn_hidden=2048, experts=8, top_k=2, expert_ffn_hidden=1000)
    bad(g, 16, "algo.tp=16 does not divide model.expert_ffn_hidden=1000", "use algo.tp=8", tp=16, sequence_parallel=True)


def test_a_cnn_takes_no_tensor_context_or_expert_parallelism() -> None:
    g = chain_stack([1.0] * 6, batch=8)
    bad(g, 2, "algo.tp=2 splits a transformer's layers", "a CNN's stack graph", "use algo.tp=1", tp=2)
    bad(g, 2, "algo.cp=2", "use algo.cp=1", cp=2)
    bad(g, 2, "algo.ep=2", "use algo.ep=1", ep=2)


# ---------------------------------------------------------------------------- sequence and context parallelism
def test_sequence_parallelism_needs_tp() -> None:
    bad(toy_stack(), 16, "algo.sequence_parallel=true", "needs algo.tp > 1", "algo.sequence_parallel=false", sequence_parallel=True)


def test_sequence_parallelism_splits_the_sequence_evenly() -> None:
    bad(toy_stack(seq_len=100), 16, "model.seq_len=100", "algo.tp=8", "a multiple of 8 (96 or 104)", tp=8, sequence_parallel=True)


def test_cp_cuts_the_sequence_into_2cp_chunks() -> None:
    bad(toy_stack(seq_len=258), 16, "algo.cp=2 cuts model.seq_len=258 into 2 x algo.cp = 4 chunks", "causal load balancing",
        "use algo.cp=1", cp=2)
    bad(toy_stack(seq_len=256), 48, "algo.cp=3", "use algo.cp=2 or algo.cp=4", cp=3)


# ---------------------------------------------------------------------------- experts
def test_a_dense_model_takes_no_expert_parallelism() -> None:
    bad(toy_stack(), 16, "algo.ep=2", "model toy is dense (model.experts=0)", "use algo.ep=1", ep=2)


def test_ep_divides_the_experts() -> None:
    g = toy_stack(experts=6, top_k=2)
    bad(g, 16, "algo.ep=4 does not divide model.experts=6", "use algo.ep=2", ep=4)   # 3 and 6 do not divide dp = 16


def test_ep_divides_dp_times_cp() -> None:
    g = toy_stack(experts=8, top_k=2)
    bad(g, 16, "algo.ep=8 must divide algo.dp x algo.cp = 4 x 1 = 4", "use algo.ep=4", tp=2, pp=2, ep=8, sequence_parallel=True)


def test_ep_with_tp_needs_sequence_parallelism() -> None:
    g = toy_stack(experts=8, top_k=2)
    bad(g, 16, "algo.ep=2 with algo.tp=2 needs algo.sequence_parallel=true", tp=2, ep=2)


# ---------------------------------------------------------------------------- batch and schedule
def test_the_batch_divides_into_dp_times_micro_batch() -> None:
    bad(toy_stack(batch=100), 16, "model.batch_size=100 is not divisible by algo.dp x algo.micro_batch = 8 x 1 = 8",
        "use model.batch_size=96 or model.batch_size=104", tp=2)
    bad(toy_stack(batch=64), 16, "= 8 x 3 = 24", "algo.micro_batch=2 or algo.micro_batch=4", tp=2, micro_batch=3)


def test_interleaving_needs_a_micro_batch_count_that_is_a_multiple_of_pp() -> None:
    g = toy_stack(layers=16, batch=12)
    bad(g, 8, "algo.schedule=interleaved needs the micro-batch count m", "= 12 / (1 x 1) = 12", "a multiple of algo.pp=8",
        "use model.batch_size=8 or model.batch_size=16", "or algo.vpp=1", pp=8, vpp=2)


def test_interleaving_needs_vpp_above_one() -> None:
    bad(toy_stack(), 4, "algo.schedule=interleaved needs algo.vpp > 1", "use algo.vpp=2", "or algo.schedule=1f1b", pp=4,
        schedule="interleaved")


def test_vpp_above_one_is_the_interleaved_schedule() -> None:
    bad(toy_stack(), 4, "algo.vpp=2 runs the interleaved 1F1B schedule, not algo.schedule=1f1b", "use algo.schedule=interleaved",
        pp=4, vpp=2, schedule="1f1b")
    bad(toy_stack(), 4, "not algo.schedule=gpipe", pp=4, vpp=2, schedule="gpipe")


def test_vpp_needs_a_pipeline() -> None:
    bad(toy_stack(), 4, "algo.vpp=2 splits each pipeline stage into model chunks and needs algo.pp > 1", vpp=2)


def test_zero_bubble_runs_one_chunk_per_stage() -> None:
    bad(toy_stack(), 4, "algo.schedule=zb_h1 runs one model chunk per stage", "use algo.vpp=1", pp=4, vpp=2, schedule="zb_h1")


# ---------------------------------------------------------------------------- stages
def test_the_blocks_split_evenly_into_interleaved_chunks() -> None:
    g = toy_stack(layers=12, batch=64)
    bad(g, 4, "model.layers=12 blocks do not split evenly into algo.pp x algo.vpp = 4 x 2 = 8 model chunks", "use algo.vpp=3",
        "or give algo.stages", pp=4, vpp=2)


def test_the_blocks_fill_every_stage() -> None:
    bad(toy_stack(layers=4, batch=64), 8, "model.layers=4 blocks cannot fill algo.pp x algo.vpp = 8 x 1 = 8 virtual stages",
        "use algo.pp=4", "give algo.stages", pp=8)


def test_at_most_one_stage_per_unit() -> None:
    g = chain_stack([1.0] * 4, batch=8)
    bad(g, 8, "algo.pp = 8 pipeline chunks of at least one unit each", "has 4 units (4 layers)", "use algo.pp=4", pp=8,
        stages=[1] * 8)


def test_stages_list_one_count_per_virtual_stage() -> None:
    bad(toy_stack(layers=8, batch=64), 4, "algo.stages lists 3 virtual stages, and algo.pp x algo.vpp = 4 x 1 = 4", "give 4 unit counts",
        pp=4, stages=[3, 3, 4])


def test_stages_sum_to_the_units() -> None:
    bad(toy_stack(layers=8, batch=64), 4, "algo.stages sums to 9 units, and model toy has 10 units (embedding, 8 blocks, head)",
        "make them sum to 10", pp=4, stages=[3, 2, 2, 2])


def test_a_plan_built_by_hand_is_checked_too() -> None:
    g = toy_stack(layers=8, batch=64)
    p = ParallelPlan(tp=2, pp=2, dp=4, stages=(5, 5), schedule="gpipe")
    p.validate(g, 16)
    refused(lambda: p.validate(g, 8), "= 16 GPUs, but the cluster has 8", kind=PlanError)
    refused(lambda: ParallelPlan(tp=2, pp=2, dp=4, stages=(5, 5), sequence_parallel="yes"), "algo.sequence_parallel must be true or false",
            kind=PlanError)


# ---------------------------------------------------------------------------- through the command line
@pytest.mark.parametrize("overrides, fragments", [
    (["model=llm", "model.heads=4", "model.kv_heads=4", "cluster=h100x8", "algo=megatron", "algo.tp=8"],
     ["algo.tp=8 does not divide model.heads=4: use algo.tp=4"]),
    (["model=llm", "model.batch_size=12", "cluster=h100x8", "algo=megatron", "algo.pp=2", "algo.vpp=2"],
     ["algo.schedule=interleaved needs the micro-batch count m", "a multiple of algo.pp=2"]),
    (["model=llm", "cluster=h100x8", "algo=megatron", "algo.zero=5"], ["algo=megatron: algo.zero must be an integer ZeRO stage"]),
    (["model=lenet5", "cluster=p100x4", "algo=megatron", "algo.tp=2"], ["algo.tp=2 splits a transformer's layers", "use algo.tp=1"]),
])
def test_the_command_line_prints_one_line(tmp_path: Path, overrides: list[str], fragments: list[str]) -> None:
    out = tmp_path / "run"
    r = run_harness(*overrides, f"hydra.run.dir={out}", timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and all(f in lines[0] for f in fragments), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert not (out / "result.json").exists()
