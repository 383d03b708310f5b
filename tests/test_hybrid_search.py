"""algo=hybrid_search (issue 35): exact over its space (the enumeration's optimum, by brute force),
never slower than its seed, cut short by its budget and saying so, uneven stages the simulator
confirms, and an answer that explains itself."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from algorithms.hybrid_search import HybridSearch, SearchError
from algorithms.llm_search import Partitions
from algorithms.llm_search_bounds import MemoryModel
from algorithms.llm_search_costing import Costing
from algorithms.llm_search_seeds import PUBLISHED, seed_plan
from algorithms.llm_search_space import Candidate, SearchSpace
from harness.core.costs import AnalyticalCostModel
from harness.core.fabric import fabric_of
from harness.core.llm.plan import ParallelPlan, PlanError
from simulators.simulate import simulate
from tests.helpers import make_cluster, refused, run_harness
from tests.stack_helpers import toy_stack


def brute_force(g: Any, cluster: Any, costs: Any, space: SearchSpace, seed: ParallelPlan) -> float:
    """The fastest simulated step that fits memory over every candidate of ``space`` and the seed,
    each candidate simulated with the partition the search gives it."""
    costing = Costing(g, cluster, costs)
    parts_of = Partitions(g, costing.capacity)
    best = math.inf
    res = simulate(g, seed, cluster, costs)
    if not res.oom:
        best = res.step_time_s
    for c in space.candidates(g, cluster.num_devices, fabric_of(cluster).gpus_per_node):
        t = costing.table(c)
        m = g.batch_size // (c.dp * c.micro_batch)
        if c.stages == "even":
            parts = parts_of.even(c.pp, c.vpp)
        else:
            parts = parts_of.balanced(c, t, MemoryModel(c, t, m, g.precision)) or parts_of.fastest(c, t)
        res = simulate(g, c.plan(parts), cluster, costs)
        if not res.oom:
            best = min(best, res.step_time_s)
    return best


@st.composite
def small_problems(draw: Any) -> tuple[Any, Any, dict[str, Any]]:
    kw: dict[str, Any] = dict(layers=draw(st.integers(2, 5)), hidden=draw(st.sampled_from([256, 512])),
                              vocab=draw(st.sampled_from([1000, 32000])), tied_embeddings=draw(st.booleans()))
    if draw(st.booleans()):
        kw.update(experts=4, top_k=2)
    g = toy_stack(batch=draw(st.sampled_from([8, 16])), **kw)
    nodes = draw(st.sampled_from([1, 2]))
    gpus = draw(st.sampled_from([8, 16])) // nodes
    cluster = make_cluster(gpus, nodes=nodes, mem_GiB=draw(st.sampled_from([0.25, 0.5, 16.0])))
    space = dict(max_micro_batch=2, max_vpp=2, max_tp=draw(st.sampled_from([2, 4])), zero=draw(st.sampled_from([[0, 1, 3], [1, 2], [3]])),
                 recompute=draw(st.sampled_from([["none", "full"], ["selective"]])), top_k=draw(st.sampled_from([1, 2])))
    return g, cluster, space


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems())
def test_the_search_returns_the_enumerations_optimum(problem: tuple[Any, Any, dict[str, Any]]) -> None:
    """Exactness: on spaces small enough to simulate every candidate, the search's step is the
    brute force's (the fastest that fits, seed included), and the search simulated fewer."""
    g, cluster, kw = problem
    costs = AnalyticalCostModel(cluster)
    algo = HybridSearch(environment=simulate, **kw)
    plan = algo.plan(g, cluster, costs)
    info = plan.info
    best = brute_force(g, cluster, costs, algo.space, seed_of(algo, g, cluster))
    if math.isinf(best):
        assert info["top_k"] == [] and any("no plan of the space fits" in w for w in info["warnings"])
        return
    assert info["search_complete"] and info["top_k"][0]["step_time_s"] == pytest.approx(best, rel=1e-12)
    res = simulate(g, plan.strategy, cluster, costs)
    assert res.step_time_s == pytest.approx(best, rel=1e-12) and not res.oom
    assert info["simulated"] <= info["candidates_total"] + 1
    counted = info["pruned_by_memory"] + info["pruned_by_bound"] + info["duplicates"] + info["simulated"] - 1
    assert counted == info["candidates_total"]


def seed_of(algo: HybridSearch, g: Any, cluster: Any) -> ParallelPlan:
    """The plan ``algo`` is seeded with on ``cluster``."""
    gpus = cluster.num_devices
    return seed_plan(g, gpus, algo.seed_plan, list(algo.space.degrees(g, gpus, fabric_of(cluster).gpus_per_node)), {})[0]


@pytest.fixture(scope="module")
def setting() -> tuple[Any, Any, Any]:
    cluster = make_cluster(8, mem_GiB=16)
    return toy_stack(batch=32, layers=8, vocab=32000), cluster, AnalyticalCostModel(cluster)


# ---------------------------------------------------------------------------- seed, budget, explanation
def test_never_slower_than_its_seed_and_cut_short_by_its_budget(setting: Any) -> None:
    g, cluster, costs = setting
    seed = {"tp": 2, "pp": 2, "micro_batch": 2, "recompute": "full", "zero": 1}
    full = HybridSearch(environment=simulate, seed_plan=seed).plan(g, cluster, costs).info
    assert full["search_complete"] and full["not_reached"] == 0
    base = full["baseline"]
    assert base["source"] == "algo.seed_plan" and base["plan"]["tp"] == 2 and base["plan"]["recompute"] == "full"
    assert full["top_k"][0]["step_time_s"] <= base["step_time_s"]
    cut = HybridSearch(environment=simulate, seed_plan=seed, budget_s=0).plan(g, cluster, costs)
    info = cut.info
    assert not info["search_complete"] and info["simulated"] == 1 and info["not_reached"] == info["candidates_total"]
    assert info["top_k"][0]["step_time_s"] == base["step_time_s"] and cut.strategy.recompute == "full"  # the seed itself


def test_the_answer_explains_itself(setting: Any) -> None:
    g, cluster, costs = setting
    plan = HybridSearch(environment=simulate, top_k=3).plan(g, cluster, costs)
    info = json.loads(json.dumps(plan.info))  # what result.json carries
    top = info["top_k"]
    assert len(top) == 3 and [e["step_time_s"] for e in top] == sorted(e["step_time_s"] for e in top)
    assert info["runner_up"] == top[1] and info["parallel_plan"] == top[0]["plan"] == plan.strategy.describe()
    for e in [*top, info["baseline"]]:
        split = e["time_split_s"]
        assert set(split) == {"compute", "recompute", "bubble", "tp", "cp", "ep", "pp", "dp"}
        assert sum(split.values()) == pytest.approx(e["step_time_s"], rel=1e-9) and min(split.values()) >= -1e-12
        assert sum(e["memory_by_kind"].values()) == e["peak_memory_bytes"]
    res = simulate(g, plan.strategy, cluster, costs)
    assert res.step_time_s == top[0]["step_time_s"] and res.extras["memory_breakdown"] == top[0]["memory_by_kind"]
    for k in ("candidates_total", "pruned_by_memory", "pruned_by_bound", "duplicates", "simulated", "search_complete", "stage_dp"):
        assert k in info


def test_the_seed_is_the_published_plan_else_fsdp_else_megatron() -> None:
    from harness.core.llm.spec import TransformerSpec
    from harness.core.llm.stack import transformer_stack

    g = toy_stack(batch=32)
    assert seed_plan(g, 8, None, [], {})[1].startswith("FSDP")
    odd = toy_stack(batch=12)  # 12 sequences do not split over 8 GPUs: Megatron-LM's widest TP, fewest stages
    plan, source = seed_plan(odd, 8, None, list(SearchSpace().degrees(odd, 8, 8)), {})
    assert source.startswith("Megatron-LM") and plan.tp == 8 and plan.pp == 1
    spec = TransformerSpec(name="gpt3_175b", layers=96, hidden=12288, heads=96, kv_heads=96, ffn_hidden=4 * 12288, gated_mlp=False,
                           seq_len=2048, vocab=51200, tied_embeddings=True)
    gpt3 = transformer_stack(spec, 1536, "amp_bf16")
    plan, source = seed_plan(gpt3, 1024, None, [], {})
    assert "Korthikanti" in source and (plan.tp, plan.pp, plan.vpp, plan.recompute) == (8, 8, 3, "selective")
    assert set(PUBLISHED) >= {"gpt3_175b", "llama3_405b", "bloom_176b", "gpt_1t"}
    refused(lambda: seed_plan(g, 8, {"tp": 3}, [], {}), "algo.seed_plan is not a valid plan here", "algo.tp x algo.pp", kind=PlanError)
    refused(lambda: seed_plan(g, 8, {"tpp": 2}, [], {}), "algo.seed_plan.tpp is not a key", "did you mean algo.seed_plan.tp")


def test_without_an_environment_it_says_what_to_set(setting: Any) -> None:
    g, cluster, costs = setting
    refused(lambda: HybridSearch().plan(g, cluster, costs), "set algo.environment", kind=SearchError)


# ---------------------------------------------------------------------------- uneven stages
def test_uneven_stages_are_faster_in_simulation_where_the_head_is_heavy() -> None:
    """A 128k vocabulary makes the head several blocks' worth: the stage DP gives its stage fewer
    blocks, and the simulator confirms the shorter step (Alpa's bottleneck objective)."""
    g = toy_stack(batch=32, layers=8, vocab=128000)
    cluster = make_cluster(8, mem_GiB=16)
    costs = AnalyticalCostModel(cluster)
    costing = Costing(g, cluster, costs)
    parts_of = Partitions(g, costing.capacity)
    c = Candidate(1, 1, 1, 4, 2, 1, "1f1b", 2, "none", False, 1, "balanced")
    t = costing.table(c)
    even, balanced = parts_of.even(4, 1), parts_of.fastest(c, t)
    assert balanced != even and balanced[-1] < even[-1]
    step = {k: simulate(g, c.plan(p), cluster, costs).step_time_s for k, p in (("even", even), ("balanced", balanced))}
    assert step["balanced"] < step["even"]


def test_the_stage_dp_moves_blocks_off_the_stages_that_would_run_out_of_memory() -> None:
    """1F1B's first stage holds pp micro-batches in flight, the last one: where the even-time
    partition does not fit, the memory bound reshapes it and the simulated plan fits."""
    g = toy_stack(batch=64, layers=16, hidden=1024, heads=16, ffn_hidden=4096, seq_len=1024, vocab=1000)
    c = Candidate(1, 1, 1, 4, 2, 1, "1f1b", 1, "none", False, 1, "balanced")
    for gib in np.linspace(0.4, 3.0, 27):
        cluster = make_cluster(8, mem_GiB=float(gib))
        costs = AnalyticalCostModel(cluster)
        costing = Costing(g, cluster, costs)
        parts_of = Partitions(g, costing.capacity)
        t = costing.table(c)
        mem = MemoryModel(c, t, 64 // 2, g.precision)
        parts = parts_of.balanced(c, t, mem)
        if parts is not None and parts != parts_of.fastest(c, t):
            assert parts_of.stats["memory_reshaped"] >= 1 and parts[0] < parts[-1]
            assert float(mem.stages(parts_of.fastest(c, t)).max()) > costing.capacity >= float(mem.stages(parts).max())
            assert simulate(g, c.plan(parts_of.fastest(c, t)), cluster, costs).oom
            assert not simulate(g, c.plan(parts), cluster, costs).oom
            return
    pytest.fail("no memory size between 0.4 and 3 GiB made the stage DP reshape the partition")


# ---------------------------------------------------------------------------- through the command line
def test_a_job_prints_the_chosen_plan_beside_the_runner_up_and_the_baseline(tmp_path: Path) -> None:
    r = run_harness("model=llm", "model.layers=4", "model.hidden=512", "model.heads=8", "model.batch_size=16", "model.seq_len=256",
                    "cluster=superpod_h100", "cluster.nodes=1", "algo=hybrid_search", "algo.max_micro_batch=2", "output.gantt=false",
                    "output.trace=false", "output.worth=false", f"hydra.run.dir={tmp_path}", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for line in ("search ", "chosen ", "runner-up ", "baseline ", "complete (exact over the space)"):
        assert line in r.stdout, line
    row = json.loads((tmp_path / "result.json").read_text())
    info = row["algo_info"]
    assert info["top_k"][0]["step_time_s"] == row["step_time_s"] and info["baseline"]["source"].startswith("FSDP")
    assert row["algo_params"]["schedules"] == ["1f1b", "interleaved", "zb_h1"] and row["algo_params"]["max_micro_batch"] == 2


def test_the_intra_stage_solver_reports_on_the_chosen_block() -> None:
    """Where memory forces tensor parallelism, the chosen plan's block goes to PaSE's DP and
    OptCNN's elimination (algorithms.block_splits): their verdict on Megatron's split is reported."""
    g = toy_stack(batch=16, layers=4, hidden=2048, heads=16, kv_heads=8, ffn_hidden=8192, seq_len=1024)
    cluster = make_cluster(8, mem_GiB=1)
    plan = HybridSearch(environment=simulate, max_micro_batch=2, max_vpp=2).plan(g, cluster, AnalyticalCostModel(cluster))
    assert plan.strategy.tp > 1
    intra = plan.info["intra_stage"]
    assert intra["tp"] == plan.strategy.tp and set(intra["solvers"]) == {"pase", "optcnn"}
    assert intra["megatron_optimal"] == all(s["rediscovers_megatron"] for s in intra["solvers"].values() if s["megatron_s"] is not None)
    off = HybridSearch(environment=simulate, max_micro_batch=2, max_vpp=2, intra_stage=False).plan(g, cluster, AnalyticalCostModel(cluster))
    assert "intra_stage" not in off.info and off.strategy == plan.strategy
