"""``model.kernels``: a block's memory-bound steps as one fused kernel each, as PyTorch eager runs
torchtitan's Llama code, or with its blocks under torch.compile (:mod:`harness.core.llm.eager`)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.core.errors import ModelConfigError
from harness.core.kernels import MEM
from harness.core.llm.eager import F32
from harness.core.llm.source import LLMModel
from harness.core.llm.spec import TransformerSpec
from harness.core.llm.stack import transformer_stack
from harness.core.llm.work import PHASE_NAMES, Shard, unit_work
from tests.helpers import refused

S, H = 1024, 512


def llama(kernels: str, kv_heads: int = 2, **kw) -> TransformerSpec:
    return TransformerSpec("llama", 2, H, 8, kv_heads, 1536, True, S, 32000, False, kernels=kernels, **kw)


def work(spec: TransformerSpec, unit: int = 1, recompute: str = "none", t: int = 1, b: int = 2):
    graph = transformer_stack(spec, 16, "amp_bf16")
    return unit_work(graph, unit, Shard(tp=t, sp=t > 1, micro_batch=b, recompute=recompute))


def mem_bytes(table) -> int:
    kind = np.asarray(table.kind)
    return int(np.asarray(table.dims)[kind == MEM, 0].sum()) if len(table) else 0


def math_rows(table) -> list[tuple[int, tuple[int, ...]]]:
    kind, dims = np.asarray(table.kind), np.asarray(table.dims)
    return [(int(k), tuple(int(x) for x in d)) for k, d in zip(kind, dims) if k != MEM]


@pytest.mark.parametrize("unit", [1, 3])  # a block, the head
@pytest.mark.parametrize("recompute", ["none", "full", "op"])
def test_the_style_changes_only_the_memory_bound_kernels_and_eager_moves_more_bytes(unit, recompute):
    styles = ("fused", "compiled", "compiled_blocks", "eager")   # each runs fewer of its steps fused than the one before
    works = [work(llama(k), unit, recompute) for k in styles]
    for phase in PHASE_NAMES:
        tables = [getattr(w, phase) for w in works]
        assert all(math_rows(t) == math_rows(tables[0]) for t in tables), phase
        moved = [mem_bytes(t) for t in tables]
        assert moved == sorted(moved), (phase, moved)
    fused, eager = works[0], works[-1]
    assert mem_bytes(eager.fwd) > mem_bytes(fused.fwd) and mem_bytes(eager.bwd_input) > mem_bytes(fused.bwd_input)
    assert all(w.collectives == fused.collectives for w in works)
    if unit == 1:  # a block: compiled with or without the loss is the same block
        assert all(mem_bytes(getattr(works[1], ph)) == mem_bytes(getattr(works[2], ph)) for ph in PHASE_NAMES)


def test_compiled_multi_head_blocks_are_the_fused_ones_and_gqa_adds_only_repeat_kv():
    mha_fused, mha_compiled = work(llama("fused", kv_heads=8)), work(llama("compiled", kv_heads=8))
    for phase in PHASE_NAMES:
        assert mem_bytes(getattr(mha_fused, phase)) == mem_bytes(getattr(mha_compiled, phase))
    gqa_fused, gqa_compiled = work(llama("fused")), work(llama("compiled"))
    T, group = 2 * S, 8 // 2
    copy = 2 * T * H * 2 * (1 + 1 / group)    # K and V written at every query head, read once per KV head
    assert mem_bytes(gqa_compiled.fwd) - mem_bytes(gqa_fused.fwd) == pytest.approx(copy, abs=4)
    assert mem_bytes(gqa_compiled.bwd_input) - mem_bytes(gqa_fused.bwd_input) == pytest.approx(copy, abs=4)
    assert gqa_compiled.stored_bytes == gqa_fused.stored_bytes


def test_layernorm_and_gelu_are_one_aten_kernel_eager_or_not():
    """Eager or fused, a LayerNorm and a GeLU are one kernel each way; eager code's separate Q, K and
    V projections add only the two sums of their input gradients (a gated MLP's gate and up one)."""
    gpt = {k: TransformerSpec("gpt", 2, H, 8, 8, 4 * H, False, S, 32000, True, kernels=k, position="learned", norm="layernorm")
           for k in ("fused", "eager")}
    a, e = work(gpt["fused"]), work(gpt["eager"])
    T = 2 * S
    for phase in PHASE_NAMES:
        extra = 2 * 3 * T * H * 2 if phase == "bwd_input" else 0
        assert mem_bytes(getattr(e, phase)) - mem_bytes(getattr(a, phase)) == extra
    assert len(e.bwd_input) - len(a.bwd_input) == 2
    assert a.stored_bytes == e.stored_bytes


def test_eager_keeps_the_fp32_copies_of_its_norm_and_rope_inputs_unless_recomputed():
    T = 2 * S
    ql, kvdl = H, 2 * H // 8
    extra = 2 * T * H * F32 + T * (ql + kvdl) * F32
    for rc in ("none", "selective"):
        assert work(llama("eager"), recompute=rc).stored_bytes - work(llama("fused"), recompute=rc).stored_bytes == extra
    for rc in ("full", "op"):
        assert work(llama("eager"), recompute=rc).stored_bytes == work(llama("fused"), recompute=rc).stored_bytes
    # what is recomputed is materialised again: the eager block's full-recompute working set holds the copies
    assert work(llama("eager"), recompute="full").transient_bytes - work(llama("fused"), recompute="full").transient_bytes == extra


@pytest.mark.parametrize("t", [1, 4])
def test_torchtitans_loss_runs_eager_unless_it_is_compiled_with_the_model(t):
    fused, compiled, blocks, eager = (work(llama(k), 3, t=t) for k in ("fused", "compiled", "compiled_blocks", "eager"))
    assert len({w.stored_bytes for w in (fused, compiled, blocks, eager)}) == 1  # the kept FP32 log-probabilities / softmax
    logits = 2 * S * (32000 // t)
    assert blocks.transient_bytes == eager.transient_bytes == 2 * F32 * logits
    assert fused.transient_bytes == compiled.transient_bytes == 2 * logits   # the 16-bit logits beside the FP32 softmax
    for phase in PHASE_NAMES:
        assert mem_bytes(getattr(blocks, phase)) == mem_bytes(getattr(eager, phase))   # the head: its final norm and loss eager


def test_a_misspelt_style_is_one_line():
    refused(lambda: LLMModel(kernels="inductor"), "model.kernels", "fused", "eager", "compiled_blocks", kind=ModelConfigError)


def test_casts_up_to_fp32_and_log_softmax_are_charged_as_an_h100_measured_them():
    """An up-cast moves its bytes at UPCAST_RATE of a copy's rate and log_softmax reads a row three
    times: the committed probe measurements give both (the constants are those readings)."""
    import pandas as pd

    from harness.app.kernel_samples import A100_H100_DATA
    from harness.core.llm import eager as ek

    k = pd.read_csv(A100_H100_DATA / "h100_probe_kernels.csv")
    rate = k[k["kernel"] == "memory"].groupby("name")["GBps"].mean()
    assert ek.UPCAST_RATE == pytest.approx(rate["cast_bf16_fp32"] / rate["copy_fp32"], abs=5e-4)
    # log_softmax's time at a copy's rate: (reads + 1) passes of its FP32 rows
    passes = 2 * rate["copy_fp32"] / rate["log_softmax_fp32"]
    assert round(passes) == ek.LOG_SOFTMAX_READS + 1
    assert ek.upcast(2) == pytest.approx((2 + F32) / ek.UPCAST_RATE) and ek.upcast(4) == 2 * F32
    assert ek.cross_entropy(2).fwd == (ek.upcast(2), (ek.LOG_SOFTMAX_READS + 1) * F32)
    assert ek.rmsnorm(2, H).fwd[0] == ek.rope(2).fwd[0] == ek.rope(2).bwd[0] == ek.upcast(2)
