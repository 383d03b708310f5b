"""What the plan search (:mod:`algorithms.llm_search`) knows of a problem before it simulates
anything, memoised: per shard the units' seconds, bytes and parameters (:class:`UnitTable`, from
:func:`harness.core.llm.work.unit_times`, with the tensor- / expert-parallel collectives that
occupy a GPU costed by the fabric on Megatron-LM's process groups), the collectives of the
data-parallel gradient buckets and parameter gathers, and the pipeline sends between stages -
each as the pipeline simulator (:mod:`simulators.pipeline`) charges it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from algorithms.llm_search_space import Candidate
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.fabric import Fabric, Group, collective_time, fabric_of, rank_layout
from harness.core.llm.memory import STATE_BYTES
from harness.core.llm.pipeline_links import stage_send_time
from harness.core.llm.plan import DEFAULT_BUCKET_BYTES, ParallelPlan, send_split
from harness.core.llm.stack import StackGraph
from harness.core.llm.work import unit_times

PHASE_KEYS = ("forward", "backward", "recompute")


@dataclass(eq=False)
class UnitTable:
    """Per unit, one micro-batch on one GPU under one shard: the seconds of its ops (``f``
    forward, ``b`` the whole backward op, ``bi`` ZB-H1's backward op, ``w`` ZB-H1's W, ``rec`` the
    recomputation alone, each with the collectives that occupy the GPU; ``bcomm`` the backward's
    collectives, which run after its gradient is complete) and its bytes and
    parameter elements (``dense``, ``expert``; ``tied``: a tied head's copy of the embedding, which it
    holds when on another stage than the embedding); prefix sums and range maxima for the stage DP."""

    f: np.ndarray
    b: np.ndarray
    bi: np.ndarray
    w: np.ndarray
    rec: np.ndarray
    bcomm: np.ndarray
    stored: np.ndarray
    transient: np.ndarray
    boundary: np.ndarray
    dense: np.ndarray
    expert: np.ndarray
    tied: np.ndarray

    def __post_init__(self) -> None:
        self.prefix = {k: np.concatenate([[0.0], np.cumsum(getattr(self, k))]).tolist() for k in ("dense", "expert", "stored")}
        self.max_transient = RangeMax(self.transient)
        self.max_boundary = RangeMax(self.boundary)


class RangeMax:
    """The maximum of ``values[b:e]`` in constant time (a sparse table of the maxima of the
    power-of-two runs)."""

    def __init__(self, values: np.ndarray) -> None:
        levels = [np.asarray(values, dtype=np.float64)]
        while 2 ** len(levels) <= len(values):
            prev, half = levels[-1], 2 ** (len(levels) - 1)
            levels.append(np.maximum(prev[:-half], prev[half:]))
        self.levels = [lv.tolist() for lv in levels]

    def __call__(self, b: int, e: int) -> float:
        k = (e - b).bit_length() - 1
        lv = self.levels[k]
        return max(lv[b], lv[e - (1 << k)])


def shard_key(x: Candidate | ParallelPlan) -> tuple[int, bool, int, int, int, str]:
    """What sets a unit's work on one GPU (:class:`~harness.core.llm.work.Shard`'s fields), as a
    plain tuple: ``(tp, sequence_parallel, cp, ep, micro_batch, recompute)``."""
    return x.tp, x.sequence_parallel, x.cp, x.ep, x.micro_batch, x.recompute


@dataclass(frozen=True)
class Bucket:
    """A data-parallel gradient bucket of a stage: units ``lo..hi-1`` of chunk ``chunk`` and the
    seconds of its collectives (dense and expert parameters, each its own call): ``reduce`` of
    its gradients (all-reduce under ZeRO 0, reduce-scatter under 1 and 2), ``gather`` of its
    updated weights (ZeRO 1 and 2)."""

    chunk: int
    lo: int
    hi: int
    reduce: tuple[float, float]
    gather: tuple[float, float]


@dataclass(frozen=True)
class StageBuckets:
    """A stage's buckets (in the order the simulator builds them), the earliest end of each one's
    parameter gather (ZeRO 1/2), and the index of the bucket holding the stage's first unit."""

    buckets: list[Bucket]
    gather_end: list[float]
    first: int


class Costing:
    """The unit tables and collective times of one problem (graph, cluster, cost model),
    memoised; see the module docstring for what they hold."""

    def __init__(self, graph: StackGraph, cluster: Cluster, costs: CostModel) -> None:
        self.graph, self.cluster, self.costs = graph, cluster, costs
        self.fabric: Fabric = fabric_of(cluster)
        kinds: dict[str, int] = {}
        for d in cluster.devices:
            kinds.setdefault(d.spec.kind, d.id)
        #: one device of each kind: a unit's seconds are the least over them (a bound on any stage's)
        self.devices = list(kinds.values())
        #: the largest memory of a GPU: a plan whose bound exceeds it exceeds every stage's
        self.capacity = max(int(d.spec.mem_capacity) for d in cluster.devices)
        self.precision = graph.precision
        self.tables: dict[tuple, UnitTable] = {}
        self.colls: dict[tuple[str, float, Group], float] = {}
        self.dp_units: dict[tuple, dict[str, np.ndarray]] = {}
        self.p2ps: dict[tuple[float, int, int, int], float] = {}
        self.bucket_memo: dict[Any, list[StageBuckets]] = {}

    def coll(self, op: str, nbytes: float, group: Group) -> float:
        """A collective's seconds (zero for a group of one or no bytes), memoised."""
        if group.size <= 1 or nbytes <= 0:
            return 0.0
        key = (op, float(nbytes), group)
        t = self.colls.get(key)
        if t is None:
            t = self.colls[key] = float(collective_time(self.fabric, op, float(nbytes), group))
        return t

    def p2p(self, c: Candidate, starts: np.ndarray, t: UnitTable) -> list[float]:
        """Per chunk boundary ``k`` (chunk ``k`` to ``k + 1``), the pipeline send's seconds
        (:func:`harness.core.llm.pipeline_links.stage_send_time` of the chunk's last unit's
        boundary bytes, Megatron-LM's scatter/gather without SP; none between chunks of one stage), memoised."""
        pp, C = c.pp, len(starts)
        stride = c.tp * c.cp * c.dp
        split = send_split(c.tp, c.sequence_parallel)   # the search's plans keep Megatron-LM's default
        out = []
        for k in range(C - 1):
            a, b = k % pp, (k + 1) % pp
            nb = float(t.boundary[int(starts[k + 1]) - 1])
            key = (nb, stride, a, b, split)
            if key not in self.p2ps:
                self.p2ps[key] = stage_send_time(self.fabric, nb, stride, a, b, split) if a != b else 0.0
            out.append(self.p2ps[key])
        return out

    def unit_collectives(self, c: Candidate, t: UnitTable) -> dict[str, np.ndarray]:
        """Per unit, the seconds of the data-parallel collectives of its parameters under ``c``
        (``all_reduce`` and ``reduce_scatter`` of its gradients, ``all_gather`` of its weights;
        dense parameters, with a tied head's copy of the embedding when the pipeline puts the head
        on another stage, over the ``dp x cp`` ranks, expert parameters over the
        expert-data-parallel ones), memoised per shard, data-parallel degree and pipeline."""
        key = (shard_key(c), c.dp, c.pp > 1)
        if key in self.dp_units:
            return self.dp_units[key]
        w_b, g_b, _ = STATE_BYTES[self.precision]
        groups = rank_layout(c.tp, c.cp, c.ep, c.dp, c.pp)
        d, e = groups["dp_cp"], groups["edp"]
        dense = t.dense + (t.tied if c.pp > 1 else 0.0)
        out = {k: np.zeros(len(t.f)) for k in ("all_reduce", "reduce_scatter", "all_gather")}
        for u in range(len(t.f)):
            for op, per in (("all_reduce", g_b), ("reduce_scatter", g_b), ("all_gather", w_b)):
                out[op][u] = self.coll(op, per * dense[u], d) + self.coll(op, per * t.expert[u], e)
        self.dp_units[key] = out
        return out

    def embedding_sync(self, c: Candidate, t: UnitTable) -> float:
        """Megatron-LM's all-reduce of a tied embedding's gradient between the first and the last
        stage, on each one's data-parallel link after its last backward (none without a pipeline
        or a tied head)."""
        tied = float(t.tied.sum())
        if c.pp == 1 or tied <= 0:
            return 0.0
        stride = c.tp * c.cp * c.dp
        return self.coll("all_reduce", STATE_BYTES[self.precision][1] * tied, Group(2, max(1, (c.pp - 1) * stride)))

    def table(self, c: Candidate | ParallelPlan) -> UnitTable:
        """The :class:`UnitTable` of ``c``'s shard (a candidate's or a plan's; its collectives on
        the TP, CP and EP groups, which the shard alone sets)."""
        skey = shard_key(c)
        if skey in self.tables:
            return self.tables[skey]
        shard = c.shard()
        g = self.graph
        groups = rank_layout(c.tp, c.cp, c.ep, c.dp, c.pp)
        n = g.num_nodes
        cols = {k: np.zeros(n) for k in ("f", "b", "bi", "w", "rec", "bcomm", "stored", "transient", "boundary", "dense", "expert",
                                                                                                     "tied")}
        memo: dict[Any, tuple[float, ...]] = {}
        for u in range(n):
            sig = g.signature(u)
            if sig not in memo:
                best = None
                for dev in self.devices:
                    ut = unit_times(g, u, shard, self.costs, dev)
                    comm = dict.fromkeys(PHASE_KEYS, 0.0)
                    for call in ut.collectives:
                        if not call.overlapped and call.op != "send_recv":
                            comm[call.phase] += call.count * self.coll(call.op, call.nbytes, groups[call.group])
                    rec = ut.recompute_s + comm["recompute"]
                    times = (ut.fwd_s + comm["forward"], rec + ut.bwd_input_s + ut.bwd_weight_s + comm["backward"],
                             rec + ut.bwd_input_s + comm["backward"], ut.bwd_weight_s, ut.recompute_s, comm["backward"])
                    best = times if best is None else tuple(min(a, b) for a, b in zip(best, times))
                unit = g.units[u]
                expert = min(int(round(unit.expert_params / (c.ep * c.tp))), int(ut.params_local)) if unit.expert_params else 0
                memo[sig] = (*best, ut.stored_bytes, ut.transient_bytes, ut.boundary_bytes, ut.params_local - expert, expert,
                             ut.tied_params_local)
            for k, v in zip(cols, memo[sig]):
                cols[k][u] = v
        table = self.tables[skey] = UnitTable(**cols)
        return table

    def buckets(self, c: Candidate, parts: tuple[int, ...], t: UnitTable) -> list[StageBuckets]:
        """Per stage, its gradient buckets as the simulator fills them (Megatron's DDP buffer:
        per chunk, the units in backward order until ``bucket_bytes`` of gradients; a tied head on
        another stage than the embedding holds a copy of it) and when each one's parameter gather
        can end (ZeRO 1/2: all queued at the start, the last bucket first, on the stage's
        data-parallel link), memoised per shard, degrees and partition."""
        key = (shard_key(c), c.dp, c.pp, c.zero == 0, parts)
        if key in self.bucket_memo:
            return self.bucket_memo[key]
        w_b, g_b, _ = STATE_BYTES[self.precision]
        groups = rank_layout(c.tp, c.cp, c.ep, c.dp, c.pp)
        d, e = groups["dp_cp"], groups["edp"]
        pp, C = c.pp, len(parts)
        bounds = np.concatenate([[0], np.cumsum(parts)]).astype(np.int64).tolist()
        stage_of = np.repeat(np.arange(C) % pp, parts)
        dense = (t.dense + np.where(stage_of != stage_of[0], t.tied, 0.0)).tolist()
        expert = t.expert.tolist()
        op = "all_reduce" if c.zero == 0 else "reduce_scatter"
        out: list[list[Bucket]] = [[] for _ in range(pp)]
        times: dict[tuple[float, float], tuple[tuple[float, float], tuple[float, float]]] = {}

        def close(ch: int, lo: int, hi: int) -> Bucket:
            dn, ex = float(sum(dense[lo:hi])), float(sum(expert[lo:hi]))
            if (dn, ex) not in times:
                times[(dn, ex)] = ((self.coll(op, g_b * dn, d), self.coll(op, g_b * ex, e)),
                                   (self.coll("all_gather", w_b * dn, d), self.coll("all_gather", w_b * ex, e)))
            return Bucket(ch, lo, hi, *times[(dn, ex)])

        for ch in range(C):
            lo, hi = bounds[ch], bounds[ch + 1]
            end, size = hi, 0.0
            for u in range(hi - 1, lo - 1, -1):
                size += g_b * (dense[u] + expert[u])
                if size >= DEFAULT_BUCKET_BYTES:
                    out[ch % pp].append(close(ch, u, end))
                    end, size = u, 0.0
            if end > lo:
                out[ch % pp].append(close(ch, lo, end))
        stages = []
        for s, bs in enumerate(out):
            ends, now = [0.0] * len(bs), 0.0
            for k in range(len(bs) - 1, -1, -1):
                now += sum(bs[k].gather)
                ends[k] = now
            first = next(k for k, b in enumerate(bs) if b.lo == bounds[s])
            stages.append(StageBuckets(bs, ends, first))
        self.bucket_memo[key] = stages
        return stages
