"""What the stack-graph algorithms (``megatron``, ``fsdp``, ``data_parallel`` on a stack graph)
share: the units' weights for a balanced partition and the ``Plan.info`` of a parallel plan."""

from __future__ import annotations

from typing import Any

from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.fabric import fabric_of
from harness.core.llm.plan import ParallelPlan, plan_warnings
from harness.core.llm.stack import StackGraph
from harness.core.llm.work import unit_times


def unit_weights(graph: StackGraph, plan: ParallelPlan, costs: CostModel) -> list[float]:
    """Per unit, one GPU's forward + backward (input and weight gradients) + recompute seconds
    for one micro-batch under ``plan``'s shard (:func:`harness.core.llm.work.unit_times`,
    memoised per distinct unit): what a balanced stage partition evens out."""
    shard = plan.shard()
    out = []
    for u in range(graph.num_nodes):
        t = unit_times(graph, u, shard, costs, 0)
        out.append(float(t.fwd_s + t.bwd_input_s + t.bwd_weight_s + t.recompute_s))
    return out


def stack_plan_info(plan: ParallelPlan, graph: StackGraph, cluster: Cluster) -> dict[str, Any]:
    """``Plan.info`` of a stack-graph plan: the plan as result.json reports it, the micro-batch
    count, and what is legal but slow (``warnings``, which the job's summary prints)."""
    info: dict[str, Any] = {"parallel_plan": plan.describe(), "micro_batches": plan.micro_batches(graph.batch_size)}
    warnings = plan_warnings(plan, fabric_of(cluster).gpus_per_node)
    if warnings:
        info["warnings"] = warnings
    return info
