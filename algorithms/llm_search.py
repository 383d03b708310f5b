"""The branch and bound of ``algo=hybrid_search`` over the space of :mod:`algorithms.llm_search_space`.

1. The seed (:mod:`algorithms.llm_search_seeds`) is simulated first: the answer is never worse.
2. Every candidate enters a heap keyed by a lower bound of its step, tightened in levels as it
   comes to the top (best bound first): level 0, ``m`` times its heaviest stage's seconds per
   micro-batch (the even partition's; for a balanced one the average stage's, which no partition
   undercuts); level 1, once its stage partition is cut (``even``: Megatron-LM's
   :func:`~harness.core.llm.plan.default_stages`; ``balanced``: :func:`algorithms.stage_dp.min_bottleneck_stages`
   over the units' seconds on their GPU, under the memory bound when the unconstrained partition
   does not fit), its memory bound (above a GPU's memory: pruned by memory; a balanced partition
   equal to the even one: a duplicate) and the closed-form step bound; level 2, the replayed
   schedule (:mod:`algorithms.llm_search_bounds`); then it is simulated.
3. Once the top of the heap is above the ``k``-th best simulated step (``k``: ``top_k``) no
   candidate left can enter the top ``k``: they are pruned by the bound, whatever level they
   reached, and the top ``k`` of the space are exact (ties to within a relative :data:`TIE`).
   With ``budget_s`` the search stops when its time is spent and says so (``not_reached``: the
   candidates left).

The counts say where each candidate left the search: pruned by memory or by bound, a duplicate
(a partition or a plan met before, the seed's included), or simulated.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from algorithms.llm_search_bounds import MemoryModel, Orders, replay_bound, step_bound
from algorithms.llm_search_costing import Costing, UnitTable, shard_key
from algorithms.llm_search_space import Candidate, SearchSpace
from algorithms.stage_dp import min_bottleneck_stages
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.fabric import fabric_of
from harness.core.llm.plan import ParallelPlan, default_stages
from harness.core.llm.stack import StackGraph

#: the relative slack of a bound against the incumbent: a candidate is pruned only when its bound
#: exceeds the k-th best step by more than this (floating-point sums in another order)
TIE = 1e-9
#: the kinds of exposed communication the simulator reports (``comm_exposed_s``)
COMM_KINDS: tuple[str, ...] = ("tp", "cp", "ep", "pp", "dp")

#: the environment: (graph, plan, cluster, costs) -> a simulated step with step_time_s, oom, extras
Environment = Callable[[StackGraph, ParallelPlan, Cluster, CostModel], Any]


@dataclass
class Simulated:
    """One simulated plan and what the explanation reports of it."""

    plan: ParallelPlan
    step_time_s: float
    oom: bool
    bound_s: float | None
    entry: dict[str, Any]


@dataclass
class Outcome:
    """What the search found and how it got there."""

    seed: Simulated
    seed_source: str
    simulated: list[Simulated] = field(default_factory=list)
    candidates_total: int = 0
    pruned_by_memory: int = 0
    pruned_by_bound: int = 0
    duplicates: int = 0
    not_reached: int = 0
    search_complete: bool = True
    stage_dp: dict[str, int] = field(default_factory=dict)

    def ranked(self) -> list[Simulated]:
        """Every simulated plan that fits memory, fastest first (the seed among them), each plan once."""
        seen, out = set(), []
        for s in sorted([self.seed, *self.simulated], key=lambda s: s.step_time_s):
            if not s.oom and s.plan not in seen:
                seen.add(s.plan)
                out.append(s)
        return out


def explain(plan: ParallelPlan, res: Any, table: UnitTable, m: int, bound: float | None) -> dict[str, Any]:
    """A simulated plan as the explanation reports it: the plan, its step and throughput, where
    the time goes (per stage on average: compute, recomputation, bubble, exposed communication by
    kind; they add up to the step) and the memory of its fullest GPU by kind."""
    step = float(res.step_time_s)
    ex = getattr(res, "extras", {}) or {}
    exposed = {k: float((ex.get("comm_exposed_s") or {}).get(k, 0.0)) for k in COMM_KINDS}
    bubble = float(ex.get("bubble_fraction", 0.0)) * step
    rec = float(np.mean([m * table.rec[list(plan.stage_units(s))].sum() for s in range(plan.pp)]))
    split = {"compute": step - bubble - sum(exposed.values()) - rec, "recompute": rec, "bubble": bubble, **exposed}
    out = {"plan": plan.describe(), "micro_batches": m, "step_time_s": step, "oom": bool(res.oom),
           "tokens_per_s_per_gpu": ex.get("tokens_per_s_per_gpu"), "mfu": ex.get("mfu"), "time_split_s": split,
           "memory_by_kind": dict(ex.get("memory_breakdown") or {}), "peak_memory_bytes": ex.get("peak_memory_max_bytes")}
    if bound is not None:
        out["step_bound_s"] = bound
    return out


class Partitions:
    """The stage partitions of the candidates, memoised: ``even`` per (pp, vpp); ``balanced`` per
    (shard, pp, vpp) without a memory limit and per (shard, pp, ZeRO, micro-batches in flight)
    with one (``stats``: the partitions cut, how many the memory bound reshaped, how many it
    ruled out)."""

    def __init__(self, graph: StackGraph, capacity: int) -> None:
        self.graph, self.capacity = graph, capacity
        self.memo: dict[Any, tuple[int, ...] | None] = {}
        self.loads: dict[Any, float] = {}
        self.infeasible: dict[Any, bool] = {}
        self.stats = {"cut": 0, "memory_reshaped": 0, "memory_infeasible": 0}

    def even(self, pp: int, vpp: int) -> tuple[int, ...]:
        """Megatron-LM's partition (:func:`~harness.core.llm.plan.default_stages`)."""
        key = ("even", pp, vpp)
        if key not in self.memo:
            self.memo[key] = default_stages(self.graph, pp, vpp)
        return self.memo[key]  # type: ignore[return-value]

    def fastest(self, c: Candidate, t: UnitTable) -> tuple[int, ...]:
        """The bottleneck-minimising partition (:mod:`algorithms.stage_dp`) of the units' seconds
        (forward + backward op per micro-batch) into ``pp * vpp`` chunks."""
        key = ("time", shard_key(c), c.pp, c.vpp)
        if key not in self.memo:
            self.stats["cut"] += 1
            self.memo[key] = min_bottleneck_stages(t.f + t.b, c.pp * c.vpp)
        return self.memo[key]  # type: ignore[return-value]

    def stage_load(self, c: Candidate, t: UnitTable) -> float:
        """A lower bound of the heaviest stage's seconds per micro-batch under ``c``'s partition
        mode: even, its own; balanced, the average stage's (and with one chunk per stage the
        heaviest unit's), which no partition undercuts."""
        key = (shard_key(c), c.pp, c.vpp, c.stages)
        if key not in self.loads:
            w = t.f + t.b
            if c.stages == "even":
                starts = np.concatenate([[0], np.cumsum(self.even(c.pp, c.vpp))[:-1]]).astype(np.int64)
                self.loads[key] = float(np.add.reduceat(w, starts).reshape(c.vpp, c.pp).sum(0).max())
            else:
                self.loads[key] = max(float(w.sum()) / c.pp, float(w.max()) if c.vpp == 1 else 0.0)
        return self.loads[key]

    def balanced(self, c: Candidate, t: UnitTable, mem: MemoryModel) -> tuple[int, ...] | None:
        """:meth:`fastest`, and with one chunk per stage, when it does not fit the memory bound,
        the least bottleneck that fits (``None``: none fits)."""
        parts = self.fastest(c, t)
        if parts is None or c.vpp > 1 or float(mem.stages(parts).max()) <= self.capacity:
            return parts
        inflight = tuple(mem.inflight[0].tolist())
        nkey = (shard_key(c), c.pp, inflight)
        if nkey not in self.infeasible:
            # ZeRO 3 keeps the least per parameter: what does not fit under it fits under no stage of ZeRO
            self.infeasible[nkey] = self.constrained(c._replace(zero=3), t, MemoryModel(c._replace(zero=3), t, mem.m, mem.precision)) is None
        if self.infeasible[nkey]:
            return None
        return self.constrained(c, t, mem)

    def constrained(self, c: Candidate, t: UnitTable, mem: MemoryModel) -> tuple[int, ...] | None:
        """The least bottleneck under the memory bound (one chunk per stage), memoised."""
        key = ("memory", shard_key(c), c.pp, c.zero, tuple(mem.inflight[0].tolist()))
        if key not in self.memo:
            self.memo[key] = parts = min_bottleneck_stages(t.f + t.b, c.pp, mem.fits(self.capacity))
            self.stats["memory_infeasible" if parts is None else "memory_reshaped"] += 1
        return self.memo[key]


def run_search(graph: StackGraph, cluster: Cluster, costs: CostModel, space: SearchSpace, environment: Environment,
               seed: tuple[ParallelPlan, str], budget_s: float | None, top_k: int, meta: dict[str, Any]) -> Outcome:
    """The search of the module docstring; the seed plan is simulated before anything else."""
    t0 = time.perf_counter()

    def out_of_time() -> bool:
        return budget_s is not None and time.perf_counter() - t0 >= budget_s

    costing = Costing(graph, cluster, costs)
    B = int(graph.batch_size)

    def simulate(plan: ParallelPlan, bound: float | None) -> Simulated:
        res = environment(graph, plan, cluster, costs)
        entry = explain(plan, res, costing.table(plan), plan.micro_batches(B), bound)
        return Simulated(plan, float(res.step_time_s), bool(res.oom), bound, entry)

    seed_plan, source = seed
    outcome = Outcome(simulate(seed_plan, None), source)
    cands = space.candidates(graph, cluster.num_devices, fabric_of(cluster).gpus_per_node)
    outcome.candidates_total = len(cands)
    parts_of = Partitions(graph, costing.capacity)
    orders = Orders()
    # level 0: the heaviest stage's work, m times; 1: the closed-form bound; 2: the replayed schedule; then simulated
    queue: list[tuple[float, int, int, tuple[int, ...]]] = []
    for i, c in enumerate(cands):
        if out_of_time():  # not even the first bounds: the seed is the answer
            outcome.search_complete, outcome.not_reached, outcome.stage_dp = False, len(cands), dict(parts_of.stats)
            return outcome
        queue.append((B // (c.dp * c.micro_batch) * parts_of.stage_load(c, costing.table(c)), i, 0, ()))
    heapq.heapify(queue)
    steps = [outcome.seed.step_time_s] if not outcome.seed.oom else []
    seen = {seed_plan}
    while queue:
        bound, i, level, parts = queue[0]
        threshold = steps[top_k - 1] if len(steps) >= top_k else np.inf
        if bound > threshold * (1 + TIE):
            outcome.pruned_by_bound += len(queue)
            break
        if out_of_time():
            outcome.search_complete = False
            outcome.not_reached = len(queue)
            break
        heapq.heappop(queue)
        c = cands[i]
        m = B // (c.dp * c.micro_batch)
        t = costing.table(c)
        if level == 0:  # cut the stages, check the memory, bound the step in closed form
            mem = MemoryModel(c, t, m, costing.precision)
            parts = parts_of.even(c.pp, c.vpp) if c.stages == "even" else parts_of.balanced(c, t, mem)
            if parts is None or float(mem.stages(parts).max()) > costing.capacity:
                outcome.pruned_by_memory += 1
            elif c.stages == "balanced" and "even" in space.stage_choices(graph, c.pp, c.vpp) and parts == parts_of.even(c.pp, c.vpp):
                outcome.duplicates += 1
            else:
                heapq.heappush(queue, (max(bound, step_bound(costing, c, parts, t, m)), i, 1, parts))
            continue
        if level == 1:  # the replayed schedule: a tighter bound, before paying for a simulation
            heapq.heappush(queue, (max(bound, replay_bound(costing, orders, c, parts, t, m)), i, 2, parts))
            continue
        plan = c.plan(parts, meta)
        if plan in seen:
            outcome.duplicates += 1
            continue
        seen.add(plan)
        sim = simulate(plan, bound)
        outcome.simulated.append(sim)
        if not sim.oom:
            steps = sorted([*steps, sim.step_time_s])[:top_k]
    outcome.stage_dp = dict(parts_of.stats)
    return outcome
