"""The hand-tuned plan ``algo=hybrid_search`` is seeded with and never returns worse than: the
configuration given as ``algo.seed_plan``; else the one its preset's publication trained with
(:data:`PUBLISHED`, where it is a valid plan on the job's GPUs and batch: its TP, PP, CP and
virtual stages, micro-batch, recomputation, sequence parallelism and ZeRO stage, the data
parallelism what the GPUs leave); else FSDP (ZeRO-3 over every GPU, ``algo=fsdp``'s defaults);
else the even Megatron-LM plan the rules allow with the widest TP inside a node and the fewest
pipeline stages."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from harness.core.checks import known_keys
from harness.core.errors import OptionError
from harness.core.llm.plan import ParallelPlan, PlanError, plan_from_degrees
from harness.core.llm.stack import StackGraph

#: what ``algo.seed_plan`` takes: the keys of ``algo=megatron``
SEED_KEYS: tuple[str, ...] = ("tp", "pp", "dp", "cp", "ep", "vpp", "schedule", "micro_batch", "recompute", "sequence_parallel", "zero",
                              "stages", "overlap_grad_reduce", "overlap_param_gather")

_SC21 = "Narayanan et al., SC'21, Table 1 (full recomputation, Megatron's DDP; micro-batch not published: 1)"

#: preset name -> (the published configuration, its source).  Only what the source states; the
#: data parallelism follows from the job's GPU count.
PUBLISHED: dict[str, tuple[dict[str, Any], str]] = {
    "gpt_1p7b": ({"tp": 1, "pp": 1, "recompute": "full", "zero": 0}, _SC21),
    "gpt_3p6b": ({"tp": 2, "pp": 1, "recompute": "full", "zero": 0}, _SC21),
    "gpt_7p5b": ({"tp": 4, "pp": 1, "recompute": "full", "zero": 0}, _SC21),
    "gpt_18p4b": ({"tp": 8, "pp": 1, "recompute": "full", "zero": 0}, _SC21),
    "gpt_39p1b": ({"tp": 8, "pp": 2, "recompute": "full", "zero": 0}, _SC21),
    "gpt_76p1b": ({"tp": 8, "pp": 4, "recompute": "full", "zero": 0}, _SC21),
    "gpt_145p6b": ({"tp": 8, "pp": 8, "recompute": "full", "zero": 0}, _SC21),
    "gpt_310p1b": ({"tp": 8, "pp": 16, "recompute": "full", "zero": 0}, _SC21),
    "gpt_529p6b": ({"tp": 8, "pp": 35, "recompute": "full", "zero": 0}, _SC21),
    "gpt_1t": ({"tp": 8, "pp": 64, "recompute": "full", "zero": 0}, _SC21),
    "gpt3_175b": ({"tp": 8, "pp": 8, "vpp": 3, "micro_batch": 1, "recompute": "selective", "sequence_parallel": True, "zero": 0},
                  "Korthikanti et al., MLSys'23, Table 3 (GPT-3 175B: TP 8, PP 8, interleaved with 3 chunks, micro-batch 1, "
                  "sequence parallelism and selective recomputation)"),
    "bloom_176b": ({"tp": 4, "pp": 12, "micro_batch": 2, "recompute": "full", "zero": 1},
                   "BigScience, bigscience-workshop/bigscience train/tr11-176B-ml (TP 4, PP 12, micro-batch 2, ZeRO-1, "
                   "activation checkpointing)"),
    "llama3_405b": ({"tp": 8, "pp": 16, "cp": 1, "micro_batch": 1, "sequence_parallel": True, "zero": 1},
                    "Llama Team, The Llama 3 Herd of Models (2024), Table 4 (TP 8, CP 1, PP 16 at 8,192 tokens; micro-batch "
                    "not published: 1; Megatron's sequence parallelism and distributed optimizer)"),
}


def seed_from_mapping(graph: StackGraph, gpus: int, given: Mapping[str, Any], meta: dict[str, Any]) -> ParallelPlan:
    """The plan of ``algo.seed_plan`` (``algo=megatron``'s keys; its default ZeRO-1): one line
    naming the key when it is not a valid plan."""
    if not isinstance(given, Mapping):
        raise OptionError(f"algo.seed_plan must be a mapping of algo=megatron's keys ({', '.join(SEED_KEYS)}), got {given!r:.80}")
    known_keys(given, SEED_KEYS, "algo.seed_plan")
    kw = {"zero": 1, **dict(given)}
    try:
        return plan_from_degrees(graph, gpus, meta=meta, **kw)
    except PlanError as e:
        raise PlanError(f"algo.seed_plan is not a valid plan here: {e}") from None


def first_valid(graph: StackGraph, gpus: int, options: Iterable[dict[str, Any]], meta: dict[str, Any]) -> ParallelPlan | None:
    """The first of ``options`` (``plan_from_degrees`` keywords) that is a valid plan, else None."""
    for kw in options:
        try:
            return plan_from_degrees(graph, gpus, meta=meta, **kw)
        except PlanError:
            continue
    return None


def seed_plan(graph: StackGraph, gpus: int, given: Mapping[str, Any] | None, megatron_degrees: Iterable[tuple[int, int, int, int, int]],
              meta: dict[str, Any]) -> tuple[ParallelPlan, str]:
    """``(plan, where it comes from)`` by the module docstring's order; ``megatron_degrees``: the
    space's ``(tp, cp, ep, pp, dp)`` for the last resort."""
    if given is not None:
        return seed_from_mapping(graph, gpus, given, meta), "algo.seed_plan"
    if graph.name in PUBLISHED:
        kw, source = PUBLISHED[graph.name]
        plan = first_valid(graph, gpus, [kw], meta)
        if plan is not None:
            return plan, f"published: {source}"
    plan = first_valid(graph, gpus, [{"pp": 1, "zero": 3}], meta)
    if plan is not None:
        return plan, "FSDP (ZeRO-3 over every GPU)"
    ranked = sorted(megatron_degrees, key=lambda d: (-d[0], d[3], d[1], d[2]))
    plan = first_valid(graph, gpus, ({"tp": tp, "cp": cp, "ep": ep, "pp": pp, "zero": 1, "sequence_parallel": tp > 1}
                                     for tp, cp, ep, pp, _ in ranked), meta)
    if plan is None:
        raise PlanError(f"model {graph.name} has no valid parallel plan on {gpus} GPUs with model.batch_size={graph.batch_size} "
                        f"(no FSDP, no Megatron-LM plan of the space: every data-parallel degree the degrees leave must divide "
                        f"the batch): use a model.batch_size that is a multiple of {gpus}")
    return plan, "Megatron-LM, even stages (the widest TP inside a node, the fewest stages)"
