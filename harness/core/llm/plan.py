"""A parallel plan of a stack graph: the degrees, the schedule, the micro-batch, recomputation,
ZeRO and the stage partition, and every rule a valid combination obeys.

A :class:`ParallelPlan` is the ``strategy`` of the :class:`~harness.core.strategy.Plan` a
stack-graph algorithm (``algo=megatron``, ``fsdp``, ``data_parallel`` on a stack graph)
returns.  Its GPUs are ``tp * pp * dp * cp`` in Megatron-LM's rank order (tensor fastest, then
context, then data, then pipeline); expert parallelism (``ep``) subdivides the data-parallel x
context-parallel ranks of the MoE layers, as Megatron-LM places it.  The stack graph's units
(embedding, blocks, head; or a CNN's layers) are cut into ``pp * vpp`` contiguous *virtual
stages* (model chunks): ``stages[c]`` units in chunk ``c``, which runs on pipeline stage
``c % pp`` (Narayanan et al., SC'21, Sec. 2.2.2: interleaved 1F1B gives each device ``vpp``
chunks, round robin).

:meth:`ParallelPlan.validate` holds every rule of a runnable combination; each broken rule is
one :class:`PlanError` line naming the keys as the user types them and a nearby valid choice
(``algo.tp=6 does not divide model.heads=32: use algo.tp=4 or algo.tp=8``).  The rules and what
this module allows where the frameworks differ:

* degrees are integers >= 1 and ``tp * pp * dp * cp`` is the GPU count;
* TP divides ``model.heads``, ``model.kv_heads`` and ``model.ffn_hidden`` (and an MoE's expert
  FFN).  KV heads are split, never replicated: Megatron-LM's attention takes
  ``divide(num_query_groups, tp_size)`` (megatron/core/transformer/attention.py), which asserts
  divisibility, and torchtitan shards the K and V projections column-wise the same way; so a
  GQA model with 8 KV heads runs with ``tp`` 1, 2, 4 or 8;
* the vocabulary is never refused: Megatron-LM pads it to a multiple of
  ``128 * tp`` (``--make-vocab-size-divisible-by``); :func:`padded_vocab` is that padding;
* TP across nodes (``tp`` above the GPUs of a node) is legal and slow: a warning
  (:func:`plan_warnings`), not a refusal;
* CP splits the sequence into ``2 * cp`` chunks (causal load balancing: each rank takes an early
  and a late chunk, Megatron-LM / Transformer Engine), so ``2 * cp`` divides ``seq_len``;
  sequence parallelism needs ``tp > 1`` and ``seq_len / cp`` divisible by ``tp``;
* EP needs an MoE model, divides ``model.experts`` and ``dp * cp``; EP with TP needs sequence
  parallelism (Megatron-LM's arguments check: "When using expert parallelism and tensor
  parallelism, sequence parallelism must be used");
* the global batch is divisible by ``dp * micro_batch``; ``m = batch / (dp * micro_batch)``;
* ``vpp > 1`` is the interleaved schedule (and needs ``pp > 1``), the interleaved schedule needs
  ``vpp > 1`` and ``m`` a multiple of ``pp`` (Megatron-LM runs its micro-batches in groups of
  ``pp``); ZB-H1 runs one chunk per stage (``vpp == 1``);
* ``pp * vpp`` chunks of at least one unit each, summing to the graph's units; the default
  partition (:func:`default_stages`) needs the blocks to split evenly into the chunks when
  ``vpp > 1``, as Megatron-LM's interleaving does, and spreads an uneven remainder over the
  middle stages when ``vpp == 1``;
* ZeRO stage 0..3; ZeRO-3 with ``pp > 1`` is allowed (torchtitan runs FSDP with PP; Megatron-LM
  does not shard parameters);
* ``keep_lp_grads`` (DeepSpeed's BF16_Optimizer) with ZeRO 0 or 1 and a precision whose
  gradients are kept wider than its weights (``amp_bf16``, ``amp_fp8``);
* ``grad_accumulation`` other than ``fused`` (a separate pass adding each micro-batch's
  gradients into the stored ones) with ZeRO 0 or 1, and not ``autograd`` beside
  ``keep_lp_grads`` (whose ``update_hp_grads`` is that pass, every micro-batch);
* a CNN's stack graph (no transformer shape) takes no TP, CP or EP: its stages pipeline and its
  replicas split the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from harness.core.checks import boolean, did_you_mean, one_of, optional, positive_int
from harness.core.errors import UserError
from harness.core.llm.memory import STATE_BYTES
from harness.core.llm.schedules import INTERLEAVED
from harness.core.llm.work import RECOMPUTE, Shard

if TYPE_CHECKING:
    from harness.core.llm.stack import StackGraph

#: the pipeline schedules: GPipe (Huang et al. 2019), 1F1B (PipeDream-Flush, Narayanan et al.
#: 2021), Megatron-LM's interleaved 1F1B (SC'21) and torch.distributed.pipelining's, ZB-H1 (Qi et
#: al., ICLR'24); harness.core.llm.schedules gives each one's order
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", *INTERLEAVED, "zb_h1")
#: how a step's micro-batches' weight gradients add up (:attr:`ParallelPlan.grad_accumulation`)
GRAD_ACCUMULATION: tuple[str, ...] = ("fused", "hook", "autograd")

#: ZeRO stages (Rajbhandari et al., SC'20): 0 plain data parallelism (DDP), 1 optimizer states
#: sharded (Megatron-LM's distributed optimizer), 2 + gradients, 3 + parameters (FSDP)
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)

#: the ``format`` of a parallel plan's strategy.json
PLAN_FORMAT = "harness.parallel_plan/1"

#: Megatron-LM's default gradient bucket: 40M parameters (megatron/core/distributed/
#: distributed_data_parallel_config.py, ``bucket_size``), of 4-byte main gradients
DEFAULT_BUCKET_BYTES = 40_000_000 * 4

#: Megatron-LM's ``--make-vocab-size-divisible-by`` default
VOCAB_DIVISIBLE_BY = 128

#: what ``algo.stages`` takes besides a list of unit counts
BALANCED = "balanced"


class PlanError(UserError, ValueError):
    """A parallel plan breaks a rule; the one-line message names the rule broken and a nearby
    valid choice."""


# ---------------------------------------------------------------------------- value checks (shared with the algorithms)
def degree(value: Any, key: str) -> int:
    """A parallel degree (``algo.tp`` ...) or a count: an integer >= 1, else a :class:`PlanError`."""
    return positive_int(value, key, PlanError)


def zero_stage(value: Any, key: str = "algo.zero") -> int:
    """A ZeRO stage, one of :data:`ZERO_STAGES`, else a :class:`PlanError` naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, float, str)):
        raise PlanError(f"{key} must be an integer ZeRO stage 0, 1, 2 or 3, got {value!r}")
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x.is_integer() and int(x) in ZERO_STAGES):
        raise PlanError(f"{key} must be an integer ZeRO stage 0, 1, 2 or 3 (0: DDP, 1: optimizer states sharded, "
                        f"2: + gradients, 3: + parameters, FSDP), got {value!r}")
    return int(x)


def schedule_name(value: Any, key: str = "algo.schedule") -> str | None:
    """``None`` (the plan's default: interleaved when ``vpp > 1``, else 1F1B) or one of :data:`SCHEDULES`."""
    return optional(one_of, value, key, SCHEDULES, error=PlanError)


def recompute_name(value: Any, key: str = "algo.recompute") -> str:
    """One of :data:`~harness.core.llm.work.RECOMPUTE` (none, selective, full)."""
    return one_of(value, key, RECOMPUTE, PlanError)


def stage_spec(value: Any, key: str = "algo.stages") -> str | tuple[int, ...] | None:
    """What ``algo.stages`` takes: ``None`` (the default partition), ``"balanced"``
    (:func:`balanced_stages`) or a list of unit counts per virtual stage, each an integer >= 1."""
    if value is None or value == BALANCED:
        return value
    if isinstance(value, (list, tuple)) and value:
        return tuple(positive_int(v, f"{key}[{i}]", PlanError) for i, v in enumerate(value))
    raise PlanError(f"{key} must be null (even stages), {BALANCED} or a list of integers >= 1 (units per virtual stage), got {value!r}")


def padded_vocab(vocab: int, tp: int, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """The vocabulary Megatron-LM allocates: ``vocab`` rounded up to a multiple of
    ``divisible_by * tp`` (``_vocab_size_with_padding``), so that every TP rank holds an equal
    slice of the embedding and the output projection."""
    q = divisible_by * tp
    return -(-vocab // q) * q


# ---------------------------------------------------------------------------- nearby choices
def near(ok: Callable[[int], bool], x: int, lo: int, hi: int) -> list[int]:
    """The value of ``lo..hi`` nearest ``x`` from below and from above that ``ok`` takes (those
    that exist, below first)."""
    below = next((v for v in range(min(x - 1, hi), lo - 1, -1) if ok(v)), None)
    above = next((v for v in range(max(x + 1, lo), hi + 1) if ok(v)), None)
    return [v for v in (below, above) if v is not None]


def either(key: str, values: Sequence[int]) -> str:
    """``algo.tp=4 or algo.tp=8`` (empty when there is no value to offer)."""
    return " or ".join(f"{key}={v}" for v in values)


def use(key: str, values: Sequence[int]) -> str:
    """``use algo.tp=4 or algo.tp=8`` (empty when there is no value to offer)."""
    return "use " + either(key, values) if values else ""


def multiples_near(x: int, q: int) -> list[int]:
    """The multiples of ``q`` nearest ``x`` from below (if positive) and above."""
    lo = (x // q) * q
    out = [lo] if 0 < lo < x else []
    return out + [lo + q if lo + q > x else lo + 2 * q]


# ---------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class ParallelPlan:
    """The degrees, schedule and memory options of one training step on ``gpus`` GPUs (see the
    module docstring for the rank order and the rules)."""

    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    schedule: str = "1f1b"
    micro_batch: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    zero: int = 0
    #: units per virtual stage, ``pp * vpp`` entries summing to the graph's units; chunk c runs on stage c % pp
    stages: tuple[int, ...] = ()
    #: bucketed DP gradient reduction overlapped with the backward (Megatron --overlap-grad-reduce, FSDP)
    overlap_grad_reduce: bool = True
    #: ZeRO-3 / distributed-optimizer parameter all-gathers prefetched (Megatron --overlap-param-gather, FSDP prefetch)
    overlap_param_gather: bool = True
    #: bytes of gradients per DP bucket (FSDP: one unit per bucket)
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    #: ZeRO-3 / FSDP: free the gathered parameters after a unit's forward and gather them again for its
    #: backward (FSDP's reshard_after_forward; ZeRO-3); False keeps them from forward to backward (ZeRO-2-like memory)
    reshard_after_forward: bool = True
    #: ZeRO-3 under a pipeline as torchtitan runs FSDP2 with torch.distributed.pipelining: each unit's
    #: parameters gathered once per step (its first forward) and kept, its gradients accumulated
    #: unsharded and reduce-scattered once, after its last micro-batch's backward
    gather_once: bool = False
    #: Megatron-LM's scatter/gather of pipeline sends without SP (SC'21 Sec. 4.1: each TP rank sends 1/t of the
    #: boundary activation, the next stage all-gathers it; DeepSpeed's pipeline engine alike); False: every rank sends all of it
    scatter_gather: bool = True
    #: DeepSpeed's BF16_Optimizer under its pipeline engine (``runtime/bf16_optimizer.py``): the 16-bit
    #: gradients stay allocated beside the unsharded wider accumulation buffer, and every micro-batch's
    #: backward adds them into it (``update_hp_grads``); False: the 16-bit gradient is freed as it is
    #: accumulated (Megatron-LM's main_grad)
    keep_lp_grads: bool = False
    #: how each micro-batch's weight gradients join the step's: ``fused`` into the weight-gradient GEMM
    #: (Megatron-LM's gradient_accumulation_fusion) or over sharded gradients (ZeRO 2 / 3, FSDP): no pass of
    #: its own; ``hook``: a memory-bound pass after every micro-batch's backward reading each new 16-bit
    #: gradient and reading and writing the stored one (Megatron-LM's local DDP hook ``main_grad.add_(grad)``,
    #: which its fp16 runs kept until gradient_accumulation_fusion took fp16 in September 2022);
    #: ``autograd``: the same pass from the second micro-batch on (PyTorch's AccumulateGrad adds into
    #: ``param.grad``, the first micro-batch's gradient is stored as it is: Megatron-LM's DDP of 2021,
    #: DeepSpeed's fp16 ZeRO 0 / 1)
    grad_accumulation: str = "fused"
    #: a pipeline send holds its sender until it is delivered: the sending stage's next op waits for it
    #: (DeepSpeed's pipeline engine: blocking ``dist.send``, whose NCCL work the compute stream waits on;
    #: Megatron-LM: ``torch.cuda.synchronize()`` after each ``batch_isend_irecv``, Megatron-Core's
    #: ``batch_p2p_sync``); False: the sender goes on (torch.distributed.pipelining's ``isend``)
    blocking_sends: bool = False
    #: who made the plan (``algo``), for strategy.json; not part of the plan's identity
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        put = object.__setattr__
        for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "bucket_bytes"):
            put(self, k, degree(getattr(self, k), f"algo.{k}"))
        put(self, "schedule", one_of(self.schedule, "algo.schedule", SCHEDULES, PlanError))
        put(self, "recompute", recompute_name(self.recompute))
        put(self, "zero", zero_stage(self.zero))
        for k in ("sequence_parallel", "overlap_grad_reduce", "overlap_param_gather", "reshard_after_forward", "gather_once",
                  "scatter_gather", "keep_lp_grads", "blocking_sends"):
            put(self, k, boolean(getattr(self, k), f"algo.{k}", PlanError))
        check_lp_grads_zero(self.keep_lp_grads, self.zero)
        put(self, "grad_accumulation", one_of(self.grad_accumulation, "algo.grad_accumulation", GRAD_ACCUMULATION, PlanError))
        check_grad_accumulation(self.grad_accumulation, self.zero, self.keep_lp_grads)
        stages = self.stages
        if isinstance(stages, np.ndarray):
            stages = stages.tolist()
        if not isinstance(stages, (list, tuple)):
            raise PlanError(f"algo.stages must be a list of integers >= 1 (units per virtual stage), got {stages!r}")
        put(self, "stages", tuple(positive_int(v, f"algo.stages[{i}]", PlanError) for i, v in enumerate(stages)))
        if not isinstance(self.meta, dict):
            raise PlanError(f"a parallel plan's meta must be an object, got {self.meta!r:.60}")

    # ------------------------------------------------------------------ derived
    @property
    def gpus(self) -> int:
        """``tp * pp * dp * cp``: every GPU of the plan."""
        return self.tp * self.pp * self.dp * self.cp

    @property
    def chunks(self) -> int:
        """Virtual stages (model chunks): ``pp * vpp``."""
        return self.pp * self.vpp

    def micro_batches(self, batch_size: int) -> int:
        """``m = batch_size / (micro_batch * dp)``: the micro-batches each replica runs per step
        (gradient accumulation); a batch that does not divide is a :class:`PlanError`."""
        check_batch(self, int(batch_size))
        return int(batch_size) // (self.micro_batch * self.dp)

    def chunk_start(self, c: int) -> int:
        """The first unit of virtual stage ``c``."""
        self._check_chunk(c)
        return int(sum(self.stages[:c]))

    @property
    def accumulation(self) -> str:
        """The step's gradient accumulation as it runs: ``hook`` under ``keep_lp_grads``
        (DeepSpeed's ``update_hp_grads`` after every micro-batch), else ``grad_accumulation``."""
        return "hook" if self.keep_lp_grads else self.grad_accumulation

    def accumulates(self, i: int) -> bool:
        """Whether micro-batch ``i``'s backward is followed by a separate gradient accumulation
        pass (:attr:`accumulation`): ``hook`` after every micro-batch, ``autograd`` from the second
        on, ``fused`` never."""
        return self.accumulation == "hook" or (self.accumulation == "autograd" and i > 0)

    @property
    def send_split(self) -> int:
        """How many pieces the plan's pipeline sends are cut into (:func:`send_split`)."""
        return send_split(self.tp, self.sequence_parallel, self.scatter_gather)

    def chunk_units(self, c: int) -> range:
        """The units of virtual stage ``c`` (contiguous)."""
        start = self.chunk_start(c)
        return range(start, start + self.stages[c])

    def stage_of_chunk(self, c: int) -> int:
        """The pipeline stage that runs virtual stage ``c``: ``c % pp``."""
        self._check_chunk(c)
        return c % self.pp

    def chunks_of_stage(self, s: int) -> list[int]:
        """The virtual stages pipeline stage ``s`` runs, in model order: ``s, s + pp, ...``."""
        if not 0 <= s < self.pp:
            raise IndexError(f"stage {s} of a {self.pp}-stage pipeline")
        return list(range(s, self.chunks, self.pp))

    def stage_units(self, s: int) -> list[int]:
        """Every unit pipeline stage ``s`` holds (its chunks' units, in model order)."""
        return [u for c in self.chunks_of_stage(s) for u in self.chunk_units(c)]

    def _check_chunk(self, c: int) -> None:
        if len(self.stages) != self.chunks:
            raise PlanError(f"the plan has {len(self.stages)} virtual stages in algo.stages, and algo.pp x algo.vpp = {self.chunks}: "
                            f"give {self.chunks} unit counts")
        if not 0 <= c < self.chunks:
            raise IndexError(f"virtual stage {c} of {self.chunks}")

    def shard(self) -> Shard:
        """What one GPU of the plan does of a unit (:class:`harness.core.llm.work.Shard`)."""
        return Shard(tp=self.tp, sp=self.sequence_parallel, cp=self.cp, ep=self.ep, micro_batch=self.micro_batch,
                     recompute=self.recompute)

    def devices_used(self) -> list[int]:
        """Every GPU of the plan, ``range(gpus)`` (strategy.json's and result.json's ``devices_used``)."""
        return list(range(self.gpus))

    # ------------------------------------------------------------------ output
    def describe(self) -> dict[str, Any]:
        """The plan as result.json reports it: every field but ``meta``, plus ``gpus`` and ``chunks``."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "meta"}
        d["stages"] = list(self.stages)
        return {**d, "gpus": self.gpus, "chunks": self.chunks}

    def to_dict(self) -> dict[str, Any]:
        """strategy.json's keys (docs/strategy_format.md): ``format`` :data:`PLAN_FORMAT`, each
        field, and ``meta``."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["stages"] = list(self.stages)
        d["meta"] = dict(self.meta)
        return {"format": PLAN_FORMAT, **d}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ParallelPlan":
        """The plan of a :meth:`to_dict` mapping (a job's strategy.json may add ``graph``); an
        unknown or missing key and a bad value are a :class:`PlanError`."""
        if not isinstance(d, Mapping) or d.get("format") != PLAN_FORMAT:
            got = d.get("format") if isinstance(d, Mapping) else type(d).__name__
            raise PlanError(f"not a parallel plan: format is {got!r}, expected {PLAN_FORMAT!r}")
        names = [f.name for f in fields(cls)]
        body = {k: v for k, v in d.items() if k not in ("format", "graph")}
        unknown = [k for k in body if k not in names]
        if unknown:
            raise PlanError(f"a parallel plan has no key {unknown[0]!r}: {did_you_mean(str(unknown[0]), names)}it takes {', '.join(names)}")
        missing = [k for k in ("tp", "pp", "dp") if k not in body]
        if missing:
            raise PlanError(f"parallel plan: {missing[0]} is missing (a plan gives tp, pp and dp, and optionally {', '.join(names[3:])})")
        if "stages" in body and not isinstance(body["stages"], (list, tuple)):
            raise PlanError(f"parallel plan: stages must be a list of integers >= 1, got {body['stages']!r:.60}")
        if body.get("meta") is None:
            body["meta"] = {}
        return cls(**body)

    # ------------------------------------------------------------------ rules
    def validate(self, graph: StackGraph, num_gpus: int) -> None:
        """Raise a :class:`PlanError` for the first rule (module docstring) the plan breaks on
        ``graph`` with ``num_gpus`` GPUs."""
        check_gpus(self, num_gpus)
        check_shape(self, graph)
        check_schedule(self)
        check_batch(self, int(graph.batch_size))
        check_interleaved_batch(self, int(graph.batch_size))
        check_lp_grads(self, graph.precision)
        check_stages(self, graph)


# ---------------------------------------------------------------------------- the rules, one function each
def check_gpus(plan: ParallelPlan, num_gpus: int) -> None:
    """``tp * pp * dp * cp`` is the GPU count."""
    if plan.gpus == num_gpus:
        return
    head = (f"algo.tp={plan.tp} x algo.pp={plan.pp} x algo.dp={plan.dp} x algo.cp={plan.cp} = {plan.gpus} GPUs, "
            f"but the cluster has {num_gpus}")
    raise PlanError(f"{head}: {fill_hint(num_gpus, plan.tp, plan.pp, plan.cp)}")


def fill_hint(num_gpus: int, tp: int, pp: int, cp: int) -> str:
    """A nearby valid choice when ``tp * pp * cp`` does not fit ``num_gpus``: the data-parallel
    degree they leave, else a pipeline, tensor or context degree (the first of them that is not
    1) whose product with the others divides the GPUs."""
    if num_gpus % (tp * pp * cp) == 0:
        return f"use algo.dp={num_gpus // (tp * pp * cp)} (or leave algo.dp out: the GPUs the other degrees leave)"
    degrees = {"pp": pp, "tp": tp, "cp": cp}
    for key, x in degrees.items():
        if x == 1:
            continue
        others = tp * pp * cp // x
        if num_gpus % others == 0:
            return use(f"algo.{key}", near(lambda v: (num_gpus // others) % v == 0, x, 1, num_gpus // others))
    return f"use degrees whose product algo.tp x algo.pp x algo.cp divides the {num_gpus} GPUs"


def tp_fits(spec: Any, v: int) -> bool:
    """Whether tensor-parallel degree ``v`` splits ``spec``'s heads, KV heads and MLPs."""
    expert_ffn = spec.expert_ffn_hidden or spec.ffn_hidden
    return (spec.heads % v == 0 and spec.kv_heads % v == 0 and spec.ffn_hidden % v == 0
            and (not spec.experts or expert_ffn % v == 0))


def check_shape(plan: ParallelPlan, graph: StackGraph) -> None:
    """The degrees against the model's shape: TP, SP, CP, EP (module docstring)."""
    spec = graph.spec
    name = graph.name
    if spec is None:
        for key, v in (("tp", plan.tp), ("cp", plan.cp), ("ep", plan.ep)):
            if v > 1:
                raise PlanError(f"algo.{key}={v} splits a transformer's layers, and model {name} is a chain of layers (a CNN's stack "
                                f"graph) without a transformer shape: use algo.{key}=1 (its stages pipeline and its replicas split the batch)")
    else:
        check_tensor(plan, spec)
    if plan.sequence_parallel and plan.tp == 1:
        raise PlanError("algo.sequence_parallel=true splits the sequence over the tensor-parallel ranks and needs algo.tp > 1: "
                        "use algo.tp=2 (or more), or algo.sequence_parallel=false")
    if spec is None:
        return
    s = int(graph.seq_len)
    rest = plan.gpus // (plan.tp * plan.pp)
    if plan.cp > 1 and s % (2 * plan.cp):
        raise PlanError(f"algo.cp={plan.cp} cuts model.seq_len={s} into 2 x algo.cp = {2 * plan.cp} chunks (causal load balancing: "
                        f"each rank takes an early and a late chunk), which do not divide it: "
                        f"{use('algo.cp', near(lambda v: (v == 1 or s % (2 * v) == 0) and rest % v == 0, plan.cp, 1, s // 2))}")
    if plan.sequence_parallel and (s // plan.cp) % plan.tp:
        q = plan.tp * plan.cp * (2 if plan.cp > 1 else 1)
        raise PlanError(f"algo.sequence_parallel=true splits the sequence of model.seq_len={s} / algo.cp={plan.cp} over algo.tp={plan.tp} "
                        f"ranks, which does not divide it: use a model.seq_len that is a multiple of {q} "
                        f"({' or '.join(map(str, multiples_near(s, q)))}), or algo.sequence_parallel=false")
    check_experts(plan, spec, name)


def check_tensor(plan: ParallelPlan, spec: Any) -> None:
    """TP divides the heads, the KV heads and the FFN (and an MoE's expert FFN)."""
    tp = plan.tp
    hi = max(spec.heads, tp + 1)
    rest = plan.gpus // (plan.pp * plan.cp)  # a suggestion keeps the GPU count (dp follows when left out)
    hint = use("algo.tp", near(lambda v: tp_fits(spec, v) and rest % v == 0, tp, 1, hi))
    if spec.heads % tp:
        raise PlanError(f"algo.tp={tp} does not divide model.heads={spec.heads}: {hint}")
    if spec.kv_heads % tp:
        raise PlanError(f"algo.tp={tp} does not divide model.kv_heads={spec.kv_heads} (the KV heads are split over the tensor-parallel "
                        f"ranks, not replicated, as Megatron-LM splits its query groups): {hint}")
    if spec.ffn_hidden % tp:
        raise PlanError(f"algo.tp={tp} does not divide model.ffn_hidden={spec.ffn_hidden}: {hint}")
    expert_ffn = spec.expert_ffn_hidden or spec.ffn_hidden
    if spec.experts and expert_ffn % tp:
        raise PlanError(f"algo.tp={tp} does not divide model.expert_ffn_hidden={expert_ffn} (experts are split like the MLP): {hint}")


def check_experts(plan: ParallelPlan, spec: Any, name: str) -> None:
    """EP needs an MoE model, divides its experts and ``dp * cp``, and needs SP beside TP."""
    ep = plan.ep
    if ep == 1:
        return
    if not spec.experts:
        raise PlanError(f"algo.ep={ep} splits a mixture of experts' experts, and model {name} is dense (model.experts=0): use algo.ep=1")
    E, dc = spec.experts, plan.dp * plan.cp
    hint = use("algo.ep", near(lambda v: E % v == 0 and dc % v == 0, ep, 1, max(E, ep + 1)))
    if E % ep:
        raise PlanError(f"algo.ep={ep} does not divide model.experts={E}: {hint}")
    if dc % ep:
        raise PlanError(f"algo.ep={ep} must divide algo.dp x algo.cp = {plan.dp} x {plan.cp} = {dc} (the expert-parallel ranks are "
                        f"data- or context-parallel ranks of the dense layers, as Megatron-LM places them): {hint}")
    if plan.tp > 1 and not plan.sequence_parallel:
        raise PlanError(f"algo.ep={ep} with algo.tp={plan.tp} needs algo.sequence_parallel=true (Megatron-LM's MoE layers take "
                        "sequence-parallel tokens when tensor and expert parallelism meet): set algo.sequence_parallel=true, or algo.ep=1")


def check_schedule(plan: ParallelPlan) -> None:
    """``vpp > 1`` is the interleaved schedule on ``pp > 1`` stages; interleaved needs ``vpp > 1``;
    ZB-H1 runs one chunk per stage."""
    if plan.vpp > 1 and plan.pp == 1:
        raise PlanError(f"algo.vpp={plan.vpp} splits each pipeline stage into model chunks and needs algo.pp > 1: use algo.vpp=1, "
                        "or algo.pp=2 (or more)")
    if plan.schedule == "zb_h1" and plan.vpp > 1:
        raise PlanError(f"algo.schedule=zb_h1 runs one model chunk per stage (ZB-H1, Qi et al. ICLR'24), and algo.vpp={plan.vpp}: "
                        f"use algo.vpp=1, or algo.schedule=interleaved to keep algo.vpp={plan.vpp}")
    if plan.vpp > 1 and plan.schedule not in INTERLEAVED:
        raise PlanError(f"algo.vpp={plan.vpp} runs the interleaved 1F1B schedule, not algo.schedule={plan.schedule}: "
                        "use algo.schedule=interleaved (or leave algo.schedule out), or algo.vpp=1")
    if plan.schedule in INTERLEAVED and plan.vpp == 1:
        raise PlanError(f"algo.schedule={plan.schedule} needs algo.vpp > 1 model chunks per stage: use algo.vpp=2 (or more), "
                        "or algo.schedule=1f1b")


def check_batch(plan: ParallelPlan, batch: int) -> None:
    """The global batch is divisible by ``dp * micro_batch``."""
    q = plan.dp * plan.micro_batch
    if batch % q == 0:
        return
    alt = ""
    if batch % plan.dp == 0:
        per = batch // plan.dp
        alt = ", or " + either("algo.micro_batch", near(lambda v: per % v == 0, plan.micro_batch, 1, per))
    raise PlanError(f"model.batch_size={batch} is not divisible by algo.dp x algo.micro_batch = {plan.dp} x {plan.micro_batch} = {q} "
                    f"(every data-parallel replica runs whole micro-batches): "
                    f"{use('model.batch_size', multiples_near(batch, q))}{alt}")


def check_interleaved_batch(plan: ParallelPlan, batch: int) -> None:
    """Interleaved 1F1B: ``m`` a multiple of ``pp``."""
    if plan.schedule not in INTERLEAVED:
        return
    m = batch // (plan.dp * plan.micro_batch)
    if m % plan.pp == 0:
        return
    per = batch // plan.dp
    mbs = near(lambda v: per % v == 0 and (per // v) % plan.pp == 0, plan.micro_batch, 1, per)
    alt = f", {either('algo.micro_batch', mbs)}" if mbs else ""
    raise PlanError(f"algo.schedule={plan.schedule} needs the micro-batch count m = model.batch_size / (algo.dp x algo.micro_batch) = "
                    f"{batch} / ({plan.dp} x {plan.micro_batch}) = {m} to be a multiple of algo.pp={plan.pp} (the interleaved "
                    f"1F1B runs micro-batches in groups of pp): "
                    f"{use('model.batch_size', multiples_near(batch, plan.dp * plan.micro_batch * plan.pp))}{alt}, or algo.vpp=1")


def unit_summary(graph: StackGraph) -> str:
    """``98 units (embedding, 96 blocks, head)`` or ``12 units (layers)``."""
    kinds = [u.kind for u in graph.units]
    parts = [f"{kinds.count(k)} {k}s" if kinds.count(k) > 1 else k for k in ("embedding", "block", "head", "layer") if k in kinds]
    return f"{len(kinds)} units ({', '.join(parts)})"


def check_stages(plan: ParallelPlan, graph: StackGraph) -> None:
    """``pp * vpp`` chunks, at most one per unit, ``stages`` with ``pp * vpp`` entries summing to the units."""
    n = graph.num_nodes
    if plan.chunks > n:
        what = "algo.pp" if plan.vpp == 1 else "algo.pp x algo.vpp"
        hint = use("algo.pp", near(lambda v: v * plan.vpp <= n, plan.pp, 1, n)) if plan.pp > 1 else "use algo.vpp=1"
        raise PlanError(f"{what} = {plan.chunks} pipeline chunks of at least one unit each, and model {graph.name} has "
                        f"{unit_summary(graph)}: {hint}")
    if len(plan.stages) != plan.chunks:
        raise PlanError(f"algo.stages lists {len(plan.stages)} virtual stages, and algo.pp x algo.vpp = {plan.pp} x {plan.vpp} = "
                        f"{plan.chunks}: give {plan.chunks} unit counts (or leave algo.stages out: even stages)")
    total = sum(plan.stages)
    if total != n:
        raise PlanError(f"algo.stages sums to {total} units, and model {graph.name} has {unit_summary(graph)}: make them sum to {n}")


def plan_warnings(plan: ParallelPlan, gpus_per_node: int) -> list[str]:
    """What is legal but slow: tensor-parallel groups that span nodes (their all-reduces then
    cross the inter-node fabric; Megatron-LM keeps TP inside a node)."""
    out = []
    if plan.tp > gpus_per_node or gpus_per_node % plan.tp:
        out.append(f"algo.tp={plan.tp} spans nodes of {gpus_per_node} GPUs: every block's tensor-parallel all-reduces cross the "
                   f"inter-node fabric (legal, slow; Megatron-LM keeps algo.tp <= the GPUs of a node)")
    return out


# ---------------------------------------------------------------------------- partitions
def body_range(graph: StackGraph) -> tuple[int, int]:
    """``(first, end)``: the units between the leading embedding units and the trailing head
    units (all units of a CNN's stack graph)."""
    kinds = [u.kind for u in graph.units]
    first = 0
    while first < len(kinds) and kinds[first] == "embedding":
        first += 1
    end = len(kinds)
    while end > first and kinds[end - 1] == "head":
        end -= 1
    return first, end


def default_stages(graph: StackGraph, pp: int, vpp: int) -> tuple[int, ...]:
    """The default partition into ``pp * vpp`` virtual stages: the blocks (a CNN's layers) split
    evenly, the embedding on the first chunk and the head on the last (Megatron-LM's layout).
    With ``vpp > 1`` the blocks must divide evenly (Megatron-LM's interleaving requires it); with
    ``vpp == 1`` the remainder goes one block each to the middle stages, the most central first,
    then to the first stage (its embedding is a cheap lookup) and last to the last (the head's
    projection is heavy)."""
    C = pp * vpp
    first, end = body_range(graph)
    blocks = end - first
    what = "blocks" if graph.spec is not None else "layers"
    key = "model.layers" if graph.spec is not None else "the model's units"
    if C > blocks:
        hint = use("algo.pp", near(lambda v: v * vpp <= blocks, pp, 1, max(blocks, 1)))
        raise PlanError(f"{key}={blocks} {what} cannot fill algo.pp x algo.vpp = {pp} x {vpp} = {C} virtual stages with one each: "
                        f"{hint + ', or ' if hint else ''}give algo.stages (units per virtual stage, {graph.num_nodes} in all)")
    q, r = divmod(blocks, C)
    if r and vpp > 1:
        vs = near(lambda v: v > 1 and blocks % (pp * v) == 0, vpp, 2, blocks // pp)
        raise PlanError(f"{key}={blocks} {what} do not split evenly into algo.pp x algo.vpp = {pp} x {vpp} = {C} model chunks (the "
                        f"interleaved schedule's chunks are equal, as Megatron-LM requires): {use('algo.vpp', [*vs, 1])}, "
                        "or give algo.stages")
    counts = [q] * C
    middle = sorted(range(1, C - 1), key=lambda c: (abs(2 * c - (C - 1)), c))
    for c in (middle + [0, C - 1])[:r]:
        counts[c] += 1
    counts[0] += first
    counts[-1] += graph.num_nodes - end
    return tuple(counts)


def balanced_stages(graph: StackGraph, pp: int, vpp: int, weights: Sequence[float] | np.ndarray) -> tuple[int, ...]:
    """A contiguous partition of the units into ``pp * vpp`` virtual stages, each of at least
    one unit, that minimises the heaviest chunk's weight (the linear partition problem: the
    optimum is a contiguous sum, found by bisection over the sorted contiguous sums with a greedy
    feasibility test, exact).  Ties go to the partition packed from the last unit backwards, so
    the first stage, which holds the most micro-batches in flight under 1F1B, is the lightest.
    With ``vpp > 1`` it balances the chunks (each stage then holds ``vpp`` of them).
    ``weights``: one non-negative finite figure per unit (its forward + backward time)."""
    w = np.asarray(weights, dtype=np.float64)
    n, C = graph.num_nodes, pp * vpp
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"balanced_stages needs {n} finite non-negative unit weights, got {w!r:.80}")
    if C > n:
        raise PlanError(f"algo.pp x algo.vpp = {C} virtual stages of at least one unit each, and model {graph.name} has "
                        f"{unit_summary(graph)}: {use('algo.pp', near(lambda v: v * vpp <= n, pp, 1, n))}")
    prefix = np.concatenate([[0.0], np.cumsum(w)])
    sums = (prefix[None, :] - prefix[:, None])[np.triu_indices(n + 1, 1)]
    cand = np.unique(sums[sums >= w.max()])
    lo, hi = 0, len(cand) - 1  # cand[-1] is the whole sum: one chunk always fits
    while lo < hi:
        mid = (lo + hi) // 2
        if len(greedy_cuts(prefix, float(cand[mid]))) <= C:
            hi = mid
        else:
            lo = mid + 1
    pieces = greedy_cuts(prefix, float(cand[lo]))
    while len(pieces) < C:  # split the heaviest piece of two or more units where its halves are most even
        heavy = max((p for p in pieces if p[1] - p[0] > 1), key=lambda p: (prefix[p[1]] - prefix[p[0]], -p[0]))
        a, b = heavy
        k = min(range(a + 1, b), key=lambda j: (max(prefix[j] - prefix[a], prefix[b] - prefix[j]), j))
        i = pieces.index(heavy)
        pieces[i:i + 1] = [(a, k), (k, b)]
    return tuple(b - a for a, b in pieces)


def greedy_cuts(prefix: np.ndarray, limit: float) -> list[tuple[int, int]]:
    """Contiguous pieces ``(start, end)`` of weight at most ``limit``, packed greedily from the
    last unit backwards (the fewest such pieces)."""
    pieces = []
    end = len(prefix) - 1
    while end > 0:
        s = end - 1
        while s > 0 and prefix[end] - prefix[s - 1] <= limit:
            s -= 1
        pieces.append((s, end))
        end = s
    return pieces[::-1]


def check_lp_grads_zero(keep_lp_grads: bool, zero: int) -> None:
    """``algo.keep_lp_grads`` is DeepSpeed's BF16_Optimizer, which keeps every gradient unsharded:
    ZeRO 0 or 1 only, else a one-line :class:`PlanError`."""
    if keep_lp_grads and zero > 1:
        raise PlanError(f"algo.keep_lp_grads=true is DeepSpeed's BF16_Optimizer, which keeps every gradient unsharded (ZeRO 0 "
                        f"or 1 only); got algo.zero={zero}: set algo.zero=1 or algo.keep_lp_grads=false")


def check_grad_accumulation(mode: str, zero: int, keep_lp_grads: bool) -> None:
    """``algo.grad_accumulation`` other than ``fused`` adds whole unsharded gradients: ZeRO 0 or 1
    only; ``autograd`` beside ``keep_lp_grads`` (whose accumulation pass runs every micro-batch) is
    a contradiction.  Else a one-line :class:`PlanError`."""
    if mode != "fused" and zero > 1:
        raise PlanError(f"algo.grad_accumulation={mode} adds each micro-batch's unsharded gradients into the stored ones, and "
                        f"algo.zero={zero} shards the gradients (each micro-batch's are reduce-scattered): set algo.zero=1 or "
                        f"algo.grad_accumulation=fused")
    if mode == "autograd" and keep_lp_grads:
        raise PlanError("algo.keep_lp_grads=true accumulates every micro-batch's gradients in DeepSpeed's update_hp_grads, "
                        "first micro-batch included: set algo.grad_accumulation=hook (or fused), not autograd")


def check_lp_grads(plan: ParallelPlan, precision: str) -> None:
    """``algo.keep_lp_grads`` keeps 16-bit gradients beside wider ones: a precision whose gradients
    are kept wider than its weights (``amp_bf16``, ``amp_fp8``; :data:`~harness.core.llm.memory.STATE_BYTES`)."""
    if not plan.keep_lp_grads:
        return
    w, g, _ = STATE_BYTES[precision]
    if g <= w:
        raise PlanError(f"algo.keep_lp_grads=true keeps the 16-bit gradients beside a wider accumulation (DeepSpeed's "
                        f"BF16_Optimizer), and precision={precision} keeps its gradients in {g} bytes like its weights: "
                        f"use precision=amp_bf16 or algo.keep_lp_grads=false")


def send_split(tp: int, sequence_parallel: bool, scatter_gather: bool = True) -> int:
    """How many pieces a pipeline send is cut into: ``tp`` under Megatron-LM's scatter/gather (no
    sequence parallelism: every TP rank holds the whole activation), else 1
    (:func:`harness.core.llm.pipeline_links.stage_send_time`)."""
    return tp if scatter_gather and not sequence_parallel else 1


# ---------------------------------------------------------------------------- building a plan
def plan_from_degrees(graph: StackGraph, num_gpus: int, tp: int = 1, pp: int = 1, dp: int | None = None, cp: int = 1, ep: int = 1,
                      vpp: int = 1, schedule: str | None = None, micro_batch: int = 1, recompute: str = "none",
                      sequence_parallel: bool = False, zero: int = 0, stages: str | Sequence[int] | None = None,
                      overlap_grad_reduce: bool = True, overlap_param_gather: bool = True, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                      reshard_after_forward: bool = True, gather_once: bool = False, scatter_gather: bool = True,
                      keep_lp_grads: bool = False, grad_accumulation: str = "fused", blocking_sends: bool = False, weights: Sequence[float] | np.ndarray | Callable[[ParallelPlan], Sequence[float]] | None = None,
                      meta: dict[str, Any] | None = None) -> ParallelPlan:
    """The validated plan of the given degrees on ``num_gpus`` GPUs: ``dp`` defaults to the GPUs
    the others leave (``num_gpus / (tp * pp * cp)``), the schedule to interleaved 1F1B when
    ``vpp > 1`` and 1F1B otherwise, ``stages`` to :func:`default_stages` (``"balanced"``:
    :func:`balanced_stages` with ``weights``: one figure per unit, or a function of the plan
    (its degrees checked, its stages not yet cut) that gives them; by default each unit's
    forward FLOPs)."""
    tp, pp, cp, ep, vpp = (degree(v, f"algo.{k}") for k, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep), ("vpp", vpp)))
    num_gpus = degree(num_gpus, "the GPU count")
    if dp is None:
        if num_gpus % (tp * pp * cp):
            raise PlanError(f"algo.tp x algo.pp x algo.cp = {tp} x {pp} x {cp} = {tp * pp * cp} does not divide the cluster's {num_gpus} "
                            f"GPUs: {fill_hint(num_gpus, tp, pp, cp)}")
        dp = num_gpus // (tp * pp * cp)
    dp = degree(dp, "algo.dp")
    sched = schedule_name(schedule) or ("interleaved" if vpp > 1 else "1f1b")
    spec = stage_spec(stages)
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, schedule=sched, micro_batch=micro_batch, recompute=recompute,
                        sequence_parallel=sequence_parallel, zero=zero, stages=spec if isinstance(spec, tuple) else (),
                        overlap_grad_reduce=overlap_grad_reduce, overlap_param_gather=overlap_param_gather, bucket_bytes=bucket_bytes,
                        reshard_after_forward=reshard_after_forward, gather_once=gather_once, scatter_gather=scatter_gather,
                        keep_lp_grads=keep_lp_grads, grad_accumulation=grad_accumulation, blocking_sends=blocking_sends,
                        meta=dict(meta or {}))
    check_gpus(plan, num_gpus)
    check_shape(plan, graph)
    check_schedule(plan)
    check_batch(plan, int(graph.batch_size))
    check_interleaved_batch(plan, int(graph.batch_size))
    check_lp_grads(plan, graph.precision)
    if not isinstance(spec, tuple):
        if spec == BALANCED:
            w = [u.flops_fwd for u in graph.units] if weights is None else weights(plan) if callable(weights) else weights
            parts = balanced_stages(graph, pp, vpp, w)
        else:
            parts = default_stages(graph, pp, vpp)
        plan = replace(plan, stages=parts)
    plan.validate(graph, num_gpus)
    return plan
