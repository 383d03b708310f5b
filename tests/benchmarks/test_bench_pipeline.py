"""Pipeline simulator speed (issue 33): a Llama-3-405B step on 16,384 H100s (tp 8, pp 16, dp 128,
m = 16, 126 blocks; Llama Team 2024, Sec. 3.3.2's layout) simulated - the units costed, the task
graph built, the event engine, the memory peaks and the figures - in at most 2 s and 2 GB (the
issue's goal: GOALS["llama3_405b_16k"] x the ``python`` reference of
:mod:`tests.benchmarks.reference`, the work being interpreter-bound; the memory, tracemalloc's
peak, asserted as it is), and the 1T GPT of Narayanan et al. SC'21 Table 1 (3072 A100s, tp 8,
pp 64, dp 6, m = 512, full recomputation: about 460k tasks) in a few seconds (5 s:
GOALS["gpt_1t_3072"]).  Each round costs the units afresh (the graph's unit memo cleared)."""

from __future__ import annotations

import tracemalloc

from harness.app.compose import compose
from harness.app.run import build
from harness.core.llm.plan import plan_from_degrees
from simulators.pipeline import simulate_pipeline
from tests.helpers import assert_goal

#: the goals as ratios to the python reference (about 14 ms on the 2-core VM): 2 s and 5 s
GOALS = {"llama3_405b_16k": 140, "gpt_1t_3072": 360}
#: the issue's memory goal for the 16,384-GPU step
MEMORY_GOAL_BYTES = 2 * 2**30


def problem(model: str, cluster: str, nodes: int, **degrees):
    cfg = compose([f"model={model}", f"cluster={cluster}", f"cluster.nodes={nodes}", "precision=amp_bf16"])
    src, cl, costs, _, _ = build(cfg)
    g = src.stack_graph(precision="amp_bf16")
    return g, plan_from_degrees(g, cl.num_devices, **degrees), cl, costs


def test_llama3_405b_on_16384_gpus(benchmark, reference):
    g, plan, cluster, costs = problem("llama3_405b", "superpod_h100", 2048, tp=8, pp=16, sequence_parallel=True, zero=1)
    assert cluster.num_devices == 16384 and plan.dp == 128 and plan.micro_batches(g.batch_size) == 16
    res = benchmark.pedantic(lambda: simulate_pipeline(g, plan, cluster, costs), setup=g.unit_cache.clear, rounds=9,
                             iterations=1, warmup_rounds=1)
    g.unit_cache.clear()
    tracemalloc.start()
    try:
        simulate_pipeline(g, plan, cluster, costs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    benchmark.extra_info.update({"tasks": sum(res.num_tasks.values()), "peak_traced_bytes": peak, "step_time_s": res.step_time_s})
    assert peak <= MEMORY_GOAL_BYTES
    assert_goal(benchmark, reference, "python", GOALS["llama3_405b_16k"], "simulate Llama 3 405B on 16,384 GPUs")


def test_gpt_1t_on_3072_gpus(benchmark, reference):
    g, plan, cluster, costs = problem("gpt_1t", "superpod_a100", 384, tp=8, pp=64, recompute="full")
    assert plan.micro_batches(g.batch_size) == 512
    res = benchmark.pedantic(lambda: simulate_pipeline(g, plan, cluster, costs), setup=g.unit_cache.clear, rounds=3,
                             iterations=1, warmup_rounds=1)
    benchmark.extra_info.update({"tasks": sum(res.num_tasks.values()), "step_time_s": res.step_time_s})
    assert_goal(benchmark, reference, "python", GOALS["gpt_1t_3072"], "simulate GPT 1T on 3072 GPUs")
