"""The stack-graph algorithms (algo=megatron, fsdp, data_parallel on a stack graph), how a job
picks the graph kind an algorithm plans on, the replay of a parallel plan (algo=from_file), the
problem's bound of a stack graph and its worth references (issue 33)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from algorithms.baselines import DataParallel, SingleDevice
from algorithms.from_file import FromFile, ReplayError
from algorithms.fsdp import FSDP
from algorithms.megatron import Megatron
from algorithms.stack_plans import unit_weights
from harness.app.bounds import problem_bound
from harness.app.run import pick_graph_kind, source_graph_kinds
from harness.app.worth import stack_references
from harness.core.costs import AnalyticalCostModel
from harness.core.errors import UserError
from harness.core.llm.plan import ParallelPlan, PlanError, plan_from_degrees
from harness.core.llm.source import LLMModel
from harness.core.strategy import StrategyError, graph_identity
from simulators.simulate import simulate
from tests.helpers import make_cluster, refused, run_harness
from tests.stack_helpers import chain_stack, toy_stack


@pytest.fixture(scope="module")
def setting() -> tuple[Any, Any, Any]:
    cluster = make_cluster(8, mem_GiB=80)
    return toy_stack(batch=32), cluster, AnalyticalCostModel(cluster)


# ---------------------------------------------------------------------------- the algorithms
def test_megatron_plans_the_given_degrees_with_its_distributed_optimizer(setting: Any) -> None:
    g, cluster, costs = setting
    plan = Megatron(tp=2, pp=2, micro_batch=2, recompute="selective", sequence_parallel=True).plan(g, cluster, costs)
    p = plan.strategy
    assert isinstance(p, ParallelPlan) and plan.graph is g
    assert (p.tp, p.pp, p.dp, p.zero, p.schedule, p.stages) == (2, 2, 2, 1, "1f1b", (5, 5))
    assert plan.info["micro_batches"] == 32 // (2 * 2) and plan.info["parallel_plan"]["sequence_parallel"] is True
    assert p.meta == {"algo": "megatron"}


def test_megatron_balanced_stages_even_out_the_units_times(setting: Any) -> None:
    """With a 32,000-token vocabulary the head (the vocabulary projection and the loss) outweighs
    a block of this small model several times: a balanced partition leaves the head alone on the
    last stage, and its heaviest stage is lighter than the even partition's."""
    _, cluster, costs = setting
    g = toy_stack(batch=32, vocab=32000)
    even = Megatron(pp=4).plan(g, cluster, costs).strategy
    bal = Megatron(pp=4, stages="balanced").plan(g, cluster, costs).strategy
    w = unit_weights(g, bal, costs)

    def heaviest(p: ParallelPlan) -> float:
        return max(sum(w[u] for u in p.chunk_units(c)) for c in range(p.chunks))

    assert w[-1] > 3 * w[1]
    assert heaviest(bal) < heaviest(even) and bal.stages[-1] == 1 < even.stages[-1]
    assert sum(bal.stages) == g.num_nodes
    assert Megatron(pp=2, stages=[4, 6]).plan(g, cluster, costs).strategy.stages == (4, 6)


def test_fsdp_is_zero_3_over_what_tp_leaves(setting: Any) -> None:
    g, cluster, costs = setting
    p = FSDP(tp=2, micro_batch=2, reshard_after_forward=False).plan(g, cluster, costs).strategy
    assert (p.tp, p.pp, p.dp, p.zero, p.reshard_after_forward, p.micro_batch) == (2, 1, 4, 3, False, 2)
    assert FSDP().plan(g, cluster, costs).strategy.dp == 8


def test_data_parallel_on_a_stack_graph_is_plain_ddp(setting: Any) -> None:
    g, cluster, costs = setting
    p = DataParallel().plan(g, cluster, costs).strategy
    assert (p.tp, p.pp, p.cp, p.dp, p.zero, p.micro_batch) == (1, 1, 1, 8, 0, 1)   # a transformer: one sequence per micro-batch
    cnn = chain_stack([1.0] * 4, batch=32)
    assert DataParallel(devices=4).plan(cnn, cluster, costs).strategy.micro_batch == 8   # a CNN: the per-replica batch at once
    assert DataParallel(micro_batch=2).plan(g, cluster, costs).strategy.micro_batch == 2
    refused(lambda: DataParallel().plan(toy_stack(batch=12), cluster, costs), "data parallelism over 8 GPUs splits model.batch_size=12",
            "use model.batch_size=8 or 16", "or use algo.devices=6", kind=StrategyError)


def test_a_stack_algorithm_refuses_what_its_degrees_break_in_one_line(setting: Any) -> None:
    g, cluster, costs = setting
    refused(lambda: Megatron(tp=3).plan(g, cluster, costs), "does not divide the cluster's 8 GPUs", kind=PlanError)
    refused(lambda: FSDP(tp=16).plan(g, make_cluster(16), costs), "algo.tp=16 does not divide model.kv_heads=8", kind=PlanError)


# ---------------------------------------------------------------------------- which graph an algorithm gets
class Source:
    """A graph source with the given graph methods."""

    name, batch_size, graph_source = "fake", 8, "test"

    def __init__(self, *kinds: str) -> None:
        for k in kinds:
            setattr(self, f"{k}_graph", lambda *a, **kw: None)


def test_an_algorithm_gets_the_first_of_its_kinds_the_model_gives() -> None:
    llm = LLMModel(layers=2, hidden=64, heads=4)
    assert source_graph_kinds(llm) == ("stack",)
    assert source_graph_kinds(Source("op", "layer", "stack")) == ("op", "layer", "stack")
    assert pick_graph_kind(DataParallel(), llm) == "stack"                       # no operator graph: DDP on the stack
    assert pick_graph_kind(DataParallel(), Source("op", "layer", "stack")) == "op"  # a CNN: as before
    assert pick_graph_kind(DataParallel(graph="layer"), Source("op", "layer")) == "layer"
    assert pick_graph_kind(Megatron(), Source("op", "layer", "stack")) == "stack"   # GPipe on ResNet
    assert pick_graph_kind(SingleDevice(), Source("op")) == "op"


def test_a_model_without_the_graph_an_algorithm_needs_is_one_line() -> None:
    refused(lambda: pick_graph_kind(Megatron(), Source("op")), "algo=megatron plans on a stack graph", "gives op graphs only",
            kind=UserError)
    refused(lambda: pick_graph_kind(SingleDevice(), LLMModel(layers=2, hidden=64, heads=4)), "gives stack graphs only",
            "algo=megatron, fsdp, data_parallel", kind=UserError)


# ---------------------------------------------------------------------------- replay
def save(tmp_path: Path, plan: Any, graph: Any, **extra: Any) -> Path:
    d = {**plan.to_dict(), "graph": graph_identity(graph), **extra}
    p = tmp_path / "strategy.json"
    p.write_text(json.dumps(d))
    return p


def test_a_parallel_plan_replays_to_the_same_plan(tmp_path: Path, setting: Any) -> None:
    g, cluster, costs = setting
    plan = Megatron(tp=2, pp=2, stages=[3, 7]).plan(g, cluster, costs)
    path = save(tmp_path, plan.strategy, g)
    algo = FromFile(path=str(path))
    assert algo.graph_kinds == ("stack",)
    replay = algo.plan(g, cluster, costs)
    assert replay.strategy == plan.strategy and replay.info["source_algo"] == "megatron"


def test_a_hand_written_plan_gets_the_default_stages(tmp_path: Path, setting: Any) -> None:
    g, cluster, costs = setting
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"format": "harness.parallel_plan/1", "tp": 2, "pp": 2, "dp": 1}))
    p = FromFile(path=str(path)).plan(g, cluster, costs).strategy
    assert p.stages == (5, 5) and p.gpus == 4


def test_a_parallel_plan_for_another_graph_or_breaking_a_rule_is_refused(tmp_path: Path, setting: Any) -> None:
    g, cluster, costs = setting
    plan = Megatron(tp=2, pp=2).plan(g, cluster, costs).strategy
    path = save(tmp_path, plan, g)
    refused(lambda: FromFile(path=str(path)).plan(toy_stack(batch=32, layers=6), cluster, costs), "is for another graph", kind=ReplayError)
    refused(lambda: FromFile(path=str(path)).plan(toy_stack(batch=31), cluster, costs), "model.batch_size=31 is not divisible",
            kind=ReplayError)
    refused(lambda: FromFile(path=str(path)).plan(g, make_cluster(4), costs), "the plan uses 8 GPUs", kind=ReplayError)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "harness.parallel_plan/1", "tp": 2, "pp": 2, "dp": 1, "stagse": [5, 5]}))
    refused(lambda: FromFile(path=str(bad)).plan(g, cluster, costs), "a parallel plan has no key 'stagse': did you mean stages?",
            kind=ReplayError)


# ---------------------------------------------------------------------------- the problem's bound and the references
def test_the_stack_bound_is_the_same_for_every_plan_and_beaten_by_none(setting: Any) -> None:
    g, cluster, costs = setting
    b = problem_bound(g, cluster, costs)
    assert b["lower_bound_s"] == b["bound_work_s"] > 0 and b["bound_critical_path_s"] == 0.0
    assert problem_bound(toy_stack(batch=64), cluster, costs)["bound_work_s"] == pytest.approx(2 * b["bound_work_s"], rel=1e-12)
    assert problem_bound(g, make_cluster(4), AnalyticalCostModel(make_cluster(4)))["bound_work_s"] == pytest.approx(2 * b["bound_work_s"])
    for algo in (Megatron(tp=2, pp=2), Megatron(pp=4, vpp=2, micro_batch=1), FSDP(), DataParallel(), Megatron(tp=8, recompute="full")):
        step = simulate(g, algo.plan(g, cluster, costs).strategy, cluster, costs).step_time_s
        assert step >= b["lower_bound_s"]


def test_the_references_leave_out_what_does_not_fit(setting: Any) -> None:
    g, cluster, costs = setting
    refs = stack_references(g, cluster, costs)
    one = plan_from_degrees(g, 1, dp=1, micro_batch=32)
    res = simulate(g, one, cluster, costs)
    assert ("single_device_s" in refs) == (not res.oom)
    assert refs["data_parallel_s"] == simulate(g, DataParallel().plan(g, cluster, costs).strategy, cluster, costs).step_time_s
    small = make_cluster(8, mem_GiB=0.01)   # nothing fits in 10 MiB
    assert stack_references(g, small, AnalyticalCostModel(small)) == {}


# ---------------------------------------------------------------------------- through the command line
def test_a_tensor_parallel_group_across_nodes_is_a_warning_of_the_job(tmp_path: Path) -> None:
    r = run_harness("model=llm", "model.layers=2", "model.heads=16", "model.kv_heads=16", "model.batch_size=16", "cluster=h100x16_2nodes",
                    "algo=megatron", "algo.tp=16", "output.worth=false", "output.gantt=false", f"hydra.run.dir={tmp_path}", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads((tmp_path / "result.json").read_text())
    assert row["graph_kind"] == "stack" and any("algo.tp=16 spans nodes of 8 GPUs" in w for w in row["warnings"])
    assert "WARNING" in r.stdout


def test_a_stack_plan_is_not_run_for_real(tmp_path: Path) -> None:
    r = run_harness("model=llm", "model.layers=2", "cluster=cpu2", "algo=megatron", "sim=realrun", f"hydra.run.dir={tmp_path}", timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert any(line.startswith("error: sim=realrun executes operator-graph plans") for line in r.stderr.splitlines()), r.stderr[-2000:]
