"""``algo=hybrid_search``: the plan with the shortest simulated step that fits memory, over the
degrees TP x PP x DP x CP (x EP), the schedule (1F1B, interleaved with its chunks, ZB-H1), the
micro-batch, recomputation, the ZeRO stage, sequence parallelism and even or uneven stages.

Exact over the space it declares (:mod:`algorithms.llm_search_space`): a branch and bound
(:mod:`algorithms.llm_search`) that simulates candidates best lower bound first and prunes
those whose memory bound exceeds the GPU's or whose step bound cannot beat the incumbent
(:mod:`algorithms.llm_search_bounds`: why each bound cannot exceed the simulation).  Uneven
stages come from a bottleneck-minimising partition of the units (:mod:`algorithms.stage_dp`,
Alpa's inter-operator pass on a chain), under the memory bound where the even-time partition
would not fit.  Seeded with the hand-tuned plan (:mod:`algorithms.llm_search_seeds`), simulated
first, so that the answer is never slower; ``budget_s`` stops the search early and says so
(``search_complete: false``).

The simulator is the algorithm's environment (``conf/algo/hybrid_search.yaml`` wires in
``simulators.simulate.simulate``, as HRL's): the algorithm never imports it.

``Plan.info``: the chosen plan (``parallel_plan``), ``top_k`` (the ``k`` fastest plans of the
space, each with its step, throughput, where the time goes and its memory by kind), the
``runner_up``, the ``baseline`` (the seed) and the search's counts (``candidates_total``,
``pruned_by_memory``, ``pruned_by_bound``, ``duplicates``, ``simulated``, ``not_reached``,
``search_complete``), and with ``intra_stage`` (a dense transformer, TP > 1) the intra-stage
solver's verdict on the chosen plan's block (:func:`algorithms.block_splits.block_split_cost`:
whether PaSE's DP and OptCNN's elimination, exact under their own cost models, return Megatron's
column-then-row split at that TP degree, and where they differ; the stack costing models
Megatron's split only, so the search keeps it and says so).
"""

from __future__ import annotations

from typing import Any, Sequence

from algorithms.base import Algorithm
from algorithms.block_splits import block_split_cost
from algorithms.llm_search import Environment, Outcome, run_search
from algorithms.llm_search_seeds import seed_plan
from algorithms.llm_search_space import SEARCH_RECOMPUTE, SEARCH_SCHEDULES, STAGE_MODES, SearchSpace
from algorithms.stack_plans import stack_plan_info
from harness.core.checks import boolean, non_negative_number, optional, positive_int
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.errors import UserError
from harness.core.fabric import fabric_of
from harness.core.llm.stack import StackGraph
from harness.core.strategy import Plan


class SearchError(UserError, ValueError):
    """The search cannot run: no environment to simulate its candidates in."""


class HybridSearch(Algorithm):
    """The fastest simulated plan that fits memory over the declared space (module docstring)."""

    graph_kind = "stack"
    paper = "this harness (issue 35): exact branch and bound over Megatron-LM's space, Alpa's inter-operator stage DP"

    def __init__(self, name: str = "hybrid_search", seed: int = 0, budget_s: float | None = None, top_k: int = 3,
                 max_tp: int | None = None, max_pp: int | None = None, max_cp: int | None = None, max_ep: int | None = None,
                 max_micro_batch: int = 8, max_vpp: int = 4, schedules: Sequence[str] | str = SEARCH_SCHEDULES,
                 recompute: Sequence[str] | str = SEARCH_RECOMPUTE, zero: Sequence[int] | int = (0, 1, 2, 3),
                 sequence_parallel: Sequence[bool] | bool = (False, True), stages: Sequence[str] | str = STAGE_MODES,
                 seed_plan: dict[str, Any] | None = None, intra_stage: bool = True, environment: Environment | None = None) -> None:
        super().__init__(name, seed)
        self.budget_s = optional(non_negative_number, budget_s, "algo.budget_s")
        self.top_k = positive_int(top_k, "algo.top_k")
        self.space = SearchSpace(max_tp, max_pp, max_cp, max_ep, max_micro_batch, max_vpp, schedules, recompute, zero,
                                 sequence_parallel, stages)
        if seed_plan is not None and not isinstance(seed_plan, dict):
            raise SearchError(f"algo.seed_plan must be a mapping of algo=megatron's keys (tp, pp, ...), got {seed_plan!r:.80}")
        self.seed_plan = seed_plan
        self.intra_stage = boolean(intra_stage, "algo.intra_stage")
        self.environment = environment

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "budget_s": self.budget_s, "top_k": self.top_k, **self.space.describe(),
                "seed_plan": self.seed_plan, "intra_stage": self.intra_stage}

    def plan(self, graph: StackGraph, cluster: Cluster, costs: CostModel) -> Plan:
        if self.environment is None:
            raise SearchError(f"{self.name} simulates its candidates and has no environment to simulate them in: set "
                              "algo.environment (conf/algo/hybrid_search.yaml wires in the simulator) or pass environment=simulate")
        meta = {"algo": self.name}
        gpus = cluster.num_devices
        degrees = list(self.space.degrees(graph, gpus, fabric_of(cluster).gpus_per_node))
        seed = seed_plan(graph, gpus, self.seed_plan, degrees, meta)
        out = run_search(graph, cluster, costs, self.space, self.environment, seed, self.budget_s, self.top_k, meta)
        ranked = out.ranked()
        best = ranked[0] if ranked else out.seed
        info = {**stack_plan_info(best.plan, graph, cluster), **search_info(out, ranked, self.top_k)}
        if self.intra_stage and graph.spec is not None and not graph.spec.experts and best.plan.tp > 1:
            # the intra-stage solver: PaSE's DP and OptCNN's elimination on the block at the chosen TP degree
            info["intra_stage"] = block_split_cost(graph.spec, best.plan.tp, best.plan.micro_batch, cluster, graph.precision).describe()
        if not ranked:
            info.setdefault("warnings", []).append(
                f"no plan of the space fits the GPUs' memory (nor the seed, {out.seed_source}): the seed is returned, out of memory")
        return Plan(graph, best.plan, info=info)


def search_info(out: Outcome, ranked: list[Any], k: int) -> dict[str, Any]:
    """``Plan.info``'s search keys (module docstring)."""
    top = [s.entry for s in ranked[:k]]
    return {
        "top_k": top,
        "runner_up": top[1] if len(top) > 1 else None,
        "baseline": {**out.seed.entry, "source": out.seed_source},
        "search_complete": out.search_complete,
        "candidates_total": out.candidates_total,
        "pruned_by_memory": out.pruned_by_memory,
        "pruned_by_bound": out.pruned_by_bound,
        "duplicates": out.duplicates,
        "simulated": len(out.simulated) + 1,
        "not_reached": out.not_reached,
        "stage_dp": out.stage_dp,
    }
