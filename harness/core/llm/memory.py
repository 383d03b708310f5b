"""The model states of a parallel plan per GPU: weights, gradients and optimizer states by
precision and ZeRO stage, as the pipeline simulator charges them (:mod:`simulators.pipeline_costs`)
and as the plan searches bound them (:mod:`algorithms.llm_search_bounds`): one formula, here.

ZeRO (Rajbhandari et al., SC'20, Sec. 5): stage 1 shards the optimizer states over the
data-parallel ranks, stage 2 the gradients too, stage 3 the parameters too; under fp16 mixed
precision that is 16P unsharded, ``4P + 12P/d`` (ZeRO-1), ``2P + 14P/d`` (ZeRO-2), ``16P/d``
(ZeRO-3).  Megatron-LM's distributed optimizer and FSDP shard over the data x context parallel
ranks (``dp * cp``); an expert's parameters over the expert-data-parallel group
(``dp * cp / ep``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: bytes per parameter element of (weights, gradients, optimizer states) by precision.  FP16 mixed
#: precision: 16-bit weights and gradients, fp32 master weights + Adam's m and v (ZeRO, Rajbhandari
#: et al. SC'20, Sec. 3.1: 2 + 2 + 12 = 16 bytes).  BF16 mixed precision keeps and reduces the
#: gradients in fp32 (2 + 4 + 12 = 18 bytes): Megatron-LM turns on
#: ``accumulate_allreduce_grads_in_fp32`` whenever ``--bf16`` is given (``megatron/training/arguments.py``),
#: and torchtitan's FSDP2 reduces in fp32 (``mixed_precision_reduce = "float32"``); DeepSpeed's
#: BF16_Optimizer keeps the 16-bit gradients as well (``algo.keep_lp_grads``: the pipeline
#: simulator charges them on top of these; no search chooses it).  fp32 / tf32:
#: fp32 weights and gradients, m and v; pure fp16 / bf16: everything 16-bit, no master copy.
#: Gradients are reduced in the type they are kept in (DeepSpeed's BF16_Optimizer: in BF16, its wire type).  ``fp16_master`` (apex O2, Megatron-LM's
#: ``--fp16``) is the FP16 mixed precision of ZeRO's count; ``amp_fp8`` keeps ``amp_bf16``'s states
#: (the FP8 recipe quantizes the BF16 weights each step: harness.core.llm.fp8).
STATE_BYTES: dict[str, tuple[int, int, int]] = {
    "amp_bf16": (2, 4, 12), "amp_fp16": (2, 2, 12), "fp32": (4, 4, 8), "tf32": (4, 4, 8), "fp16": (2, 2, 4), "bf16": (2, 2, 4),
    "fp16_master": (2, 2, 12), "amp_fp8": (2, 4, 12),
}


def shard_groups(plan: Any) -> tuple[int, int]:
    """(ranks a ZeRO shard of dense parameters spans, ranks of an expert parameter's) for a plan
    with ``dp``, ``cp`` and ``ep``: ``dp * cp`` (Megatron's distributed optimizer and FSDP shard
    over data x context parallel ranks) and ``dp * cp / ep`` (the expert-data-parallel group)."""
    d = plan.dp * plan.cp
    return d, max(1, d // plan.ep)


def sharded(zero: int) -> tuple[bool, bool, bool]:
    """Which of (weights, gradients, optimizer states) ZeRO stage ``zero`` shards: the optimizer
    states from stage 1, the gradients from 2, the weights at 3."""
    return zero >= 3, zero >= 2, zero >= 1


def model_state_bytes(precision: str, zero: int, dense: Any, expert: Any, d: int, de: int) -> tuple[Any, Any, Any]:
    """(weights, gradients, optimizer states) in bytes on one GPU holding ``dense`` dense and
    ``expert`` expert parameter elements (after TP and EP), ZeRO stage ``zero`` over ``d`` ranks
    (experts over ``de``; :func:`sharded`), each rounded up to whole bytes.  ``dense`` and
    ``expert`` may be numpy arrays (one entry per stage): the result then is too."""
    sharded_part = np.asarray(dense, dtype=np.float64) / d + np.asarray(expert, dtype=np.float64) / de
    full = np.asarray(dense, dtype=np.float64) + np.asarray(expert, dtype=np.float64)
    return tuple(np.ceil(b * (sharded_part if s else full)) for b, s in zip(STATE_BYTES[precision], sharded(zero)))  # type: ignore[return-value]


def state_coefficients(precision: str, zero: int, d: int, de: int) -> tuple[float, float]:
    """Bytes of model states per dense and per expert parameter element on one GPU: the sum of
    :func:`model_state_bytes`'s three kinds before they are rounded up (so ``coefficient x
    elements`` never exceeds it), linear in the elements, as a stage partition's search needs."""
    per = [(b / d, b / de) if s else (float(b), float(b)) for b, s in zip(STATE_BYTES[precision], sharded(zero))]
    return sum(p[0] for p in per), sum(p[1] for p in per)
