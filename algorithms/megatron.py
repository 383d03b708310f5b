"""Megatron-LM's 3D parallelism as given (``algo=megatron``): no search, the user's degrees.

Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC'21): tensor parallelism inside a node (Shoeybi et al. 2019's column- then
row-parallel attention and MLP), pipeline parallelism across nodes with the 1F1B or the
interleaved 1F1B schedule (``algo.vpp`` model chunks per stage), data parallelism over what
the GPUs leave; Korthikanti et al. (MLSys'23) add sequence parallelism and selective
recomputation; context parallelism (ring attention) and expert parallelism (MoE) as
Megatron-Core runs them.  The optimizer is Megatron's distributed optimizer by default
(``algo.zero=1``: the optimizer states sharded over the data-parallel ranks), the gradient
reduction bucketed and overlapped with the backward (``--overlap-grad-reduce``), the parameter
all-gathers overlapped with the next forward (``--overlap-param-gather``).

The plan is the :class:`~harness.core.llm.plan.ParallelPlan` of these degrees, validated by
:func:`~harness.core.llm.plan.plan_from_degrees` (a broken rule is one line with a nearby
valid choice).  ``algo.stages``: ``null`` cuts the blocks evenly (Megatron-LM's default, the
embedding with the first stage's blocks and the head with the last's), ``balanced`` cuts the
units so that the heaviest virtual stage (forward + backward + recompute time of its units,
from the job's cost model) is as light as can be (:func:`~harness.core.llm.plan.balanced_stages`),
a list gives the units of each virtual stage.
"""

from __future__ import annotations

from typing import Any

from algorithms.base import Algorithm
from algorithms.stack_plans import stack_plan_info, unit_weights
from harness.core.checks import boolean, one_of
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.llm.plan import (GRAD_ACCUMULATION, PlanError, check_grad_accumulation, check_lp_grads_zero, degree, plan_from_degrees,
                                   recompute_name, schedule_name, stage_spec, zero_stage)
from harness.core.llm.stack import StackGraph
from harness.core.strategy import Plan


class Megatron(Algorithm):
    """The given TP / PP / DP / CP / EP degrees, schedule, micro-batch, recomputation and ZeRO
    stage as Megatron-LM runs them (see the module docstring)."""

    graph_kind = "stack"
    paper = "Narayanan et al., Megatron-LM (SC'21)"

    def __init__(self, name: str = "megatron", seed: int = 0, tp: int = 1, pp: int = 1, dp: int | None = None, cp: int = 1, ep: int = 1,
                 vpp: int = 1, schedule: str | None = None, micro_batch: int = 1, recompute: str = "none", sequence_parallel: bool = False,
                 zero: int = 1, stages: str | list[int] | None = None, overlap_grad_reduce: bool = True,
                 overlap_param_gather: bool = True, gather_once: bool = False, scatter_gather: bool = True,
                 keep_lp_grads: bool = False, grad_accumulation: str = "fused", blocking_sends: bool = False) -> None:
        super().__init__(name, seed)
        self.tp, self.pp, self.cp, self.ep, self.vpp = (degree(v, f"algo.{k}") for k, v in
                                                        (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep), ("vpp", vpp)))
        self.dp = None if dp is None else degree(dp, "algo.dp")
        self.schedule = schedule_name(schedule)
        self.micro_batch = degree(micro_batch, "algo.micro_batch")
        self.recompute = recompute_name(recompute)
        self.sequence_parallel = boolean(sequence_parallel, "algo.sequence_parallel")
        self.zero = zero_stage(zero)
        self.stages = stage_spec(stages)
        self.overlap_grad_reduce = boolean(overlap_grad_reduce, "algo.overlap_grad_reduce")
        self.overlap_param_gather = boolean(overlap_param_gather, "algo.overlap_param_gather")
        self.gather_once = boolean(gather_once, "algo.gather_once")
        self.scatter_gather = boolean(scatter_gather, "algo.scatter_gather")
        self.keep_lp_grads = boolean(keep_lp_grads, "algo.keep_lp_grads")
        check_lp_grads_zero(self.keep_lp_grads, self.zero)
        self.grad_accumulation = one_of(grad_accumulation, "algo.grad_accumulation", GRAD_ACCUMULATION, PlanError)
        check_grad_accumulation(self.grad_accumulation, self.zero, self.keep_lp_grads)
        self.blocking_sends = boolean(blocking_sends, "algo.blocking_sends")
        if self.gather_once and self.zero != 3:
            raise PlanError(f"algo.gather_once=true keeps ZeRO-3's gathered parameters for the step; it needs algo.zero=3, got {self.zero}")

    def describe(self) -> dict[str, Any]:
        stages = list(self.stages) if isinstance(self.stages, tuple) else self.stages
        return {**super().describe(), "tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "ep": self.ep, "vpp": self.vpp,
                "schedule": self.schedule, "micro_batch": self.micro_batch, "recompute": self.recompute,
                "sequence_parallel": self.sequence_parallel, "zero": self.zero, "stages": stages,
                "overlap_grad_reduce": self.overlap_grad_reduce, "overlap_param_gather": self.overlap_param_gather,
                "gather_once": self.gather_once, "scatter_gather": self.scatter_gather, "keep_lp_grads": self.keep_lp_grads,
                "grad_accumulation": self.grad_accumulation, "blocking_sends": self.blocking_sends}

    def plan(self, graph: StackGraph, cluster: Cluster, costs: CostModel) -> Plan:
        kw: dict[str, Any] = dict(tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep, vpp=self.vpp, schedule=self.schedule,
                                  micro_batch=self.micro_batch, recompute=self.recompute, sequence_parallel=self.sequence_parallel,
                                  zero=self.zero, overlap_grad_reduce=self.overlap_grad_reduce,
                                  overlap_param_gather=self.overlap_param_gather, gather_once=self.gather_once,
                                  scatter_gather=self.scatter_gather, keep_lp_grads=self.keep_lp_grads,
                                  grad_accumulation=self.grad_accumulation, blocking_sends=self.blocking_sends,
                                  meta={"algo": self.name})
        plan = plan_from_degrees(graph, cluster.num_devices, stages=self.stages, weights=lambda p: unit_weights(graph, p, costs), **kw)
        return Plan(graph, plan, info=stack_plan_info(plan, graph, cluster))
