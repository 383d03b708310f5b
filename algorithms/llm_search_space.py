"""The space ``algo=hybrid_search`` declares: every combination of degrees, schedule,
micro-batch, recomputation, ZeRO stage, sequence parallelism and stage partition that the plan
rules of :mod:`harness.core.llm.plan` allow, within the bounds its parameters set.

Each choice, for a model on ``G`` GPUs of ``g`` per node and a global batch ``B``:

* ``tp``: the divisors of ``G`` that split the heads, KV heads and FFNs (:func:`~harness.core.llm.plan.tp_fits`),
  at most ``max_tp`` (default ``g``: Megatron-LM keeps TP inside a node); 1 for a CNN;
* ``cp``: 1, or with ``max_cp`` (default: 1 below :data:`LONG_SEQUENCE` tokens, else
  ``seq_len / 8192``: the Llama 3 paper's 131,072-token stage ran CP 16, 8,192 tokens per rank,
  Table 4) every degree whose ``2 cp`` chunks divide the sequence;
* ``pp``: the divisors of ``G / (tp cp)`` up to the units (and ``max_pp``); ``dp`` is what is left;
* ``ep`` (MoE only): the divisors of the experts that divide ``dp cp`` (up to ``max_ep``);
* ``sequence_parallel``: the declared values when ``tp > 1`` (off at ``tp = 1``; on wherever EP
  meets TP, as the rules require);
* ``micro_batch``: the divisors of ``B / dp`` up to ``max_micro_batch``, and without a pipeline
  ``B / dp`` itself (one micro-batch a step, as plain data parallelism runs);
* ``schedule``: with ``pp > 1`` each declared one of 1F1B, ZB-H1 and the interleaved 1F1B with
  ``vpp = 2 .. max_vpp`` chunks per stage (``m`` a multiple of ``pp``); one stage needs none (1F1B);
* ``recompute``, ``zero``: the declared values;
* ``stages``: ``even`` (Megatron-LM's default partition, where the rules allow it) and
  ``balanced`` (:mod:`algorithms.stage_dp`, cut when the candidate is costed).

Every candidate is valid by construction (the tests hold the enumeration equal to the raw
product filtered by :meth:`ParallelPlan.validate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

from harness.core.checks import boolean, one_of, optional, positive_int
from harness.core.errors import OptionError
from harness.core.llm.plan import ParallelPlan, body_range, tp_fits
from harness.core.llm.shard import RECOMPUTE
from harness.core.llm.stack import StackGraph
from harness.core.llm.work import Shard

#: the schedules the search declares (GPipe is 1F1B's order with every micro-batch in flight: never faster, never smaller)
SEARCH_SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved", "zb_h1")
#: how the units are cut into stages: Megatron-LM's even blocks, or the bottleneck-minimising partition of stage_dp
STAGE_MODES: tuple[str, ...] = ("even", "balanced")
#: from this many tokens per sequence the search tries context parallelism unless ``max_cp`` says otherwise
LONG_SEQUENCE = 32768
#: tokens per context-parallel rank the default ``max_cp`` keeps (Llama 3, Table 4: 131,072 tokens over CP 16)
TOKENS_PER_CP_RANK = 8192

#: the recomputation modes searched unless ``algo.recompute`` names others (torchtitan's ``op``
#: policy is a mode of the simulator, not of Megatron-LM's space; it may be asked for)
SEARCH_RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")


class Candidate(NamedTuple):
    """One point of the space (its stage partition is cut when it is costed)."""

    tp: int
    cp: int
    ep: int
    pp: int
    dp: int
    vpp: int
    schedule: str
    micro_batch: int
    recompute: str
    sequence_parallel: bool
    zero: int
    stages: str

    def shard(self) -> Shard:
        """What one GPU does of a unit under the candidate."""
        return Shard(tp=self.tp, sp=self.sequence_parallel, cp=self.cp, ep=self.ep, micro_batch=self.micro_batch,
                     recompute=self.recompute)

    def plan(self, parts: tuple[int, ...], meta: dict[str, Any] | None = None) -> ParallelPlan:
        """The parallel plan of the candidate with ``parts`` units per virtual stage (Megatron-LM's
        overlapped gradient reduction and parameter gathers, its default bucket)."""
        return ParallelPlan(tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep, vpp=self.vpp, schedule=self.schedule,
                            micro_batch=self.micro_batch, recompute=self.recompute, sequence_parallel=self.sequence_parallel,
                            zero=self.zero, stages=parts, meta=dict(meta or {}))


def divisors(n: int) -> list[int]:
    """The divisors of ``n >= 1``, ascending."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def choice_list(value: Any, key: str, choices: tuple[Any, ...], check: Any = None) -> tuple[Any, ...]:
    """A non-empty list of distinct values of ``choices`` (in the declared order; one value alone
    is a list of one), else an :class:`OptionError` naming ``key``."""
    if not isinstance(value, (list, tuple)):
        value = check(value, key) if check is not None else value
        return (one_of(value, key, choices),)
    if not value:
        shown = ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)
        raise OptionError(f"{key} must be one or a non-empty list of {shown}, got {value!r}")
    out: list[Any] = []
    for i, v in enumerate(value):
        v = check(v, f"{key}[{i}]") if check is not None else v
        v = one_of(v, f"{key}[{i}]", choices)
        if v not in out:
            out.append(v)
    return tuple(out)


def zero_choice(value: Any, key: str) -> int:
    """One ZeRO stage of a list (an integer 0-3)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(f"{key} must be an integer ZeRO stage 0, 1, 2 or 3, got {value!r}")
    return value


def bool_choice(value: Any, key: str) -> bool:
    """One value of a list of flags (true or false)."""
    return boolean(value, key)


@dataclass(frozen=True)
class SearchSpace:
    """The bounds and choices ``algo=hybrid_search`` declares (module docstring); each value is
    checked as it is taken, naming ``algo.<key>``."""

    max_tp: int | None = None
    max_pp: int | None = None
    max_cp: int | None = None
    max_ep: int | None = None
    max_micro_batch: int = 8
    max_vpp: int = 4
    schedules: tuple[str, ...] = SEARCH_SCHEDULES
    recompute: tuple[str, ...] = SEARCH_RECOMPUTE
    zero: tuple[int, ...] = (0, 1, 2, 3)
    sequence_parallel: tuple[bool, ...] = (False, True)
    stages: tuple[str, ...] = STAGE_MODES

    def __post_init__(self) -> None:
        put = object.__setattr__
        for k in ("max_tp", "max_pp", "max_cp", "max_ep"):
            put(self, k, optional(positive_int, getattr(self, k), f"algo.{k}"))
        put(self, "max_micro_batch", positive_int(self.max_micro_batch, "algo.max_micro_batch"))
        put(self, "max_vpp", positive_int(self.max_vpp, "algo.max_vpp"))
        put(self, "schedules", choice_list(self.schedules, "algo.schedules", SEARCH_SCHEDULES))
        put(self, "recompute", choice_list(self.recompute, "algo.recompute", RECOMPUTE))
        put(self, "zero", choice_list(self.zero, "algo.zero", (0, 1, 2, 3), zero_choice))
        put(self, "sequence_parallel", choice_list(self.sequence_parallel, "algo.sequence_parallel", (False, True), bool_choice))
        put(self, "stages", choice_list(self.stages, "algo.stages", STAGE_MODES))

    def describe(self) -> dict[str, Any]:
        """The declared bounds and choices, as result.json reports them."""
        return {"max_tp": self.max_tp, "max_pp": self.max_pp, "max_cp": self.max_cp, "max_ep": self.max_ep,
                "max_micro_batch": self.max_micro_batch, "max_vpp": self.max_vpp, "schedules": list(self.schedules),
                "recompute": list(self.recompute), "zero": list(self.zero), "sequence_parallel": list(self.sequence_parallel),
                "stages": list(self.stages)}

    # ------------------------------------------------------------------ the degrees
    def cp_choices(self, graph: StackGraph) -> list[int]:
        """Context-parallel degrees (module docstring): 1 for a CNN or a short sequence by default."""
        if graph.spec is None:
            return [1]
        s = int(graph.seq_len)
        cap = self.max_cp if self.max_cp is not None else (1 if s < LONG_SEQUENCE else max(1, s // TOKENS_PER_CP_RANK))
        return [c for c in range(1, cap + 1) if c == 1 or s % (2 * c) == 0]

    def degrees(self, graph: StackGraph, gpus: int, gpus_per_node: int) -> Iterator[tuple[int, int, int, int, int]]:
        """``(tp, cp, ep, pp, dp)`` of every valid combination of degrees on ``gpus`` GPUs."""
        spec = graph.spec
        n = graph.num_nodes
        max_tp = self.max_tp if self.max_tp is not None else gpus_per_node
        tps = [1] if spec is None else [t for t in divisors(gpus) if t <= max_tp and tp_fits(spec, t)]
        for tp in tps:
            for cp in self.cp_choices(graph):
                if (gpus // tp) % cp or gpus % tp:
                    continue
                for pp in divisors(gpus // (tp * cp)):
                    if pp > n or (self.max_pp is not None and pp > self.max_pp):
                        continue
                    dp = gpus // (tp * cp * pp)
                    if graph.batch_size % dp:
                        continue
                    eps = [1]
                    if spec is not None and spec.experts:
                        eps = [e for e in divisors(spec.experts) if (dp * cp) % e == 0 and (self.max_ep is None or e <= self.max_ep)]
                    for ep in eps:
                        yield tp, cp, ep, pp, dp

    def sp_choices(self, graph: StackGraph, tp: int, cp: int, ep: int) -> list[bool]:
        """Sequence parallelism: off at ``tp = 1``; on where EP meets TP; else the declared values
        the sequence allows."""
        if tp == 1:
            return [False]
        ok = (int(graph.seq_len) // cp) % tp == 0
        out = [v for v in self.sequence_parallel if ok or not v]
        if ep > 1:
            out = [True] if ok else []
        return out

    def micro_batch_choices(self, per_replica: int, pp: int) -> list[int]:
        """The divisors of the per-replica batch up to ``max_micro_batch``; without a pipeline also
        the whole of it (one micro-batch a step: data parallelism without gradient accumulation)."""
        out = [d for d in divisors(per_replica) if d <= self.max_micro_batch]
        return out + [per_replica] if pp == 1 and per_replica > self.max_micro_batch else out

    def schedule_choices(self, graph: StackGraph, pp: int, m: int) -> list[tuple[str, int]]:
        """``(schedule, vpp)`` pairs for ``pp`` stages and ``m`` micro-batches."""
        if pp == 1:
            return [("1f1b", 1)]
        out = []
        for sched in self.schedules:
            if sched != "interleaved":
                out.append((sched, 1))
            elif m % pp == 0:
                out += [("interleaved", v) for v in range(2, self.max_vpp + 1) if pp * v <= graph.num_nodes]
        return out

    def stage_choices(self, graph: StackGraph, pp: int, vpp: int) -> list[str]:
        """The stage modes valid for ``pp * vpp`` chunks: ``even`` where Megatron-LM's default
        partition exists (blocks at least the chunks, and dividing evenly when interleaved),
        ``balanced`` wherever every chunk gets a unit; a single stage has only one partition."""
        C = pp * vpp
        first, end = body_range(graph)
        blocks = end - first
        out = []
        for mode in self.stages:
            if mode == "even" and C <= blocks and (vpp == 1 or blocks % C == 0):
                out.append(mode)
            elif mode == "balanced" and C <= graph.num_nodes and pp > 1:
                out.append(mode)
        if pp == 1 and not out:
            out = ["even"]
        return out

    def candidates(self, graph: StackGraph, gpus: int, gpus_per_node: int) -> list[Candidate]:
        """Every candidate of the space on ``gpus`` GPUs, in a fixed order (ties between equal
        steps go to the earliest)."""
        out = []
        B = int(graph.batch_size)
        for tp, cp, ep, pp, dp in self.degrees(graph, gpus, gpus_per_node):
            sps = self.sp_choices(graph, tp, cp, ep)
            for mb in self.micro_batch_choices(B // dp, pp):
                m = B // (dp * mb)
                for sched, vpp in self.schedule_choices(graph, pp, m):
                    for mode in self.stage_choices(graph, pp, vpp):
                        for rc in self.recompute:
                            for sp in sps:
                                for z in self.zero:
                                    out.append(Candidate(tp, cp, ep, pp, dp, vpp, sched, mb, rc, sp, z, mode))
        return out
