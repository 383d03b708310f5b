"""Fully sharded data parallelism (``algo=fsdp``): ZeRO-3 over every GPU, as torchtitan and
MosaicML's LLM Foundry run it.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
(SC'20) stage 3; Zhao et al., "PyTorch FSDP" (VLDB'23).  Every GPU holds ``1 / dp`` of the
parameters, gradients and optimizer states; each unit (a transformer block, the embedding, the
head: FSDP2 wraps one module per block in torchtitan) gathers its parameters before its forward
and again before its backward (``reshard_after_forward``, FSDP's FULL_SHARD; false keeps them
gathered from forward to backward, SHARD_GRAD_OP), prefetching the next unit's all-gather, and
reduce-scatters its gradients after its backward.  No pipeline (``pp = 1``); optional tensor
and context parallelism inside (torchtitan's FSDP + TP, ``algo.tp``, with ``algo.sequence_parallel``;
``algo.cp``), so ``dp = gpus / (tp * cp)``; the global batch runs as micro-batches of
``algo.micro_batch`` sequences per GPU with gradient accumulation.
"""

from __future__ import annotations

from typing import Any

from algorithms.base import Algorithm
from algorithms.stack_plans import stack_plan_info
from harness.core.checks import boolean
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.llm.plan import degree, plan_from_degrees, recompute_name
from harness.core.llm.stack import StackGraph
from harness.core.strategy import Plan


class FSDP(Algorithm):
    """ZeRO-3 / FSDP over ``gpus / (tp * cp)`` replicas, one unit per bucket (see the module docstring)."""

    graph_kind = "stack"
    paper = "Zhao et al., PyTorch FSDP (VLDB'23); Rajbhandari et al., ZeRO (SC'20)"

    def __init__(self, name: str = "fsdp", seed: int = 0, micro_batch: int = 1, recompute: str = "none", tp: int = 1, cp: int = 1,
                 sequence_parallel: bool = False, reshard_after_forward: bool = True, overlap_param_gather: bool = True) -> None:
        super().__init__(name, seed)
        self.micro_batch = degree(micro_batch, "algo.micro_batch")
        self.recompute = recompute_name(recompute)
        self.tp = degree(tp, "algo.tp")
        self.cp = degree(cp, "algo.cp")
        self.sequence_parallel = boolean(sequence_parallel, "algo.sequence_parallel")
        self.reshard_after_forward = boolean(reshard_after_forward, "algo.reshard_after_forward")
        self.overlap_param_gather = boolean(overlap_param_gather, "algo.overlap_param_gather")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "micro_batch": self.micro_batch, "recompute": self.recompute, "tp": self.tp, "cp": self.cp,
                "sequence_parallel": self.sequence_parallel, "reshard_after_forward": self.reshard_after_forward,
                "overlap_param_gather": self.overlap_param_gather}

    def plan(self, graph: StackGraph, cluster: Cluster, costs: CostModel) -> Plan:
        plan = plan_from_degrees(graph, cluster.num_devices, tp=self.tp, pp=1, cp=self.cp, micro_batch=self.micro_batch,
                                 recompute=self.recompute, sequence_parallel=self.sequence_parallel, zero=3,
                                 overlap_grad_reduce=True, overlap_param_gather=self.overlap_param_gather,
                                 reshard_after_forward=self.reshard_after_forward, meta={"algo": self.name})
        return Plan(graph, plan, info=stack_plan_info(plan, graph, cluster))
