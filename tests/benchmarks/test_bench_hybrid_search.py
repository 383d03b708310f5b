"""Search time of ``algo=hybrid_search`` (issue 35), asserted against the issue's goals as ratios to
the ``python`` reference workload timed in the same run (:mod:`tests.benchmarks.reference`, about
14 ms on the 2-core VM; the search is interpreter-bound: its bounds, its stage DP and the
simulations it runs):

| what | the issue's goal | peers |
|---|---|---|
| Llama 3 405B on 16,384 H100 (superpod_h100, 2048 nodes, batch 2048 x 8192) | <= 10 s | Alpa ~40 min for GPT-39B on 64 GPUs |
| GPT-3 175B on 1,024 A100 (superpod_a100, 128 nodes, batch 1536) | <= 2 s | |

The whole of ``HybridSearch.plan`` is timed, as a job reports ``search_seconds``: the seed's
simulation, the space, every bound, the stage DP and the simulations, with the units costed
afresh each round (the graph's unit memo cleared).  ``extra_info`` records what the search did
(candidates, pruned, simulated) and whether it was complete; a search cut short would not count.

    python -m pytest tests/benchmarks/test_bench_hybrid_search.py -m bench
"""

from __future__ import annotations

from algorithms.hybrid_search import HybridSearch
from harness.app.compose import compose
from harness.app.run import build
from simulators.simulate import simulate
from tests.helpers import assert_goal

#: the goals as ratios to the python reference: the issue's 10 s and 2 s over its ~14 ms
GOALS = {"llama3_405b_16k": 700, "gpt3_175b_1k": 140}


def problem(model: str, cluster: str, nodes: int):
    cfg = compose([f"model={model}", f"cluster={cluster}", f"cluster.nodes={nodes}"])
    src, cl, costs, _, _ = build(cfg)
    return src.stack_graph(precision=str(cfg.precision)), cl, costs


def run(benchmark, g, cluster, costs) -> dict:
    algo = HybridSearch(environment=simulate)
    plan = benchmark.pedantic(lambda: algo.plan(g, cluster, costs), setup=g.unit_cache.clear, rounds=3, iterations=1, warmup_rounds=1)
    info = plan.info
    benchmark.extra_info.update({k: info[k] for k in ("candidates_total", "pruned_by_memory", "pruned_by_bound", "duplicates",
                                                      "simulated", "search_complete")})
    benchmark.extra_info.update({"step_time_s": info["top_k"][0]["step_time_s"], "baseline_step_s": info["baseline"]["step_time_s"]})
    assert info["search_complete"] and info["top_k"][0]["step_time_s"] <= info["baseline"]["step_time_s"]
    return info


def test_llama3_405b_on_16384_h100(benchmark, reference):
    g, cluster, costs = problem("llama3_405b", "superpod_h100", 2048)
    assert cluster.num_devices == 16384 and g.batch_size == 2048 and g.seq_len == 8192
    run(benchmark, g, cluster, costs)
    assert_goal(benchmark, reference, "python", GOALS["llama3_405b_16k"], "search Llama 3 405B on 16,384 H100")


def test_gpt3_175b_on_1024_a100(benchmark, reference):
    g, cluster, costs = problem("gpt3_175b", "superpod_a100", 128)
    assert cluster.num_devices == 1024 and g.batch_size == 1536
    run(benchmark, g, cluster, costs)
    assert_goal(benchmark, reference, "python", GOALS["gpt3_175b_1k"], "search GPT-3 175B on 1,024 A100")
