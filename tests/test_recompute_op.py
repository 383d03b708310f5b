"""``recompute=op``: torchtitan's per-op selective activation checkpointing on a dense block
(harness.core.llm.block_work, harness.core.llm.flops.op_recomputed)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.core.errors import OptionError
from harness.core.kernels import ATTN, GEMM, MEM
from harness.core.llm.flops import hardware_flops, model_flops, op_recompute_flops, op_recomputed
from harness.core.llm.spec import TransformerSpec
from harness.core.llm.stack import transformer_stack
from harness.core.llm.work import Shard, unit_work
from tests.helpers import refused

S, H, HEADS, KV, FFN = 1024, 512, 8, 2, 1408


def llama(**kw) -> TransformerSpec:
    """A small Llama-shaped model: GQA, SwiGLU, RoPE, RMSNorm, no biases, fused attention."""
    return TransformerSpec("llama", 2, H, HEADS, KV, FFN, True, S, 32000, False, **kw)


def block(spec: TransformerSpec, recompute: str, t: int = 1, sp: bool = False, b: int = 2):
    return unit_work(transformer_stack(spec, 16, "amp_bf16"), 1, Shard(tp=t, sp=sp, micro_batch=b, recompute=recompute))


def test_every_second_mm_is_recomputed_and_every_addmm():
    assert op_recomputed(llama()) == {"k", "o", "w3"}                      # wq wk wv wo w1 w3 w2: mm 2, 4 and 6
    assert op_recomputed(llama(qkv_bias=True)) == {"q", "k", "v", "w1", "w2"}  # q, k, v are addmm: wo, w1, w3, w2 are mm 1-4
    plain = TransformerSpec("gpt", 2, H, HEADS, HEADS, 4 * H, False, S, 32000, True)
    assert op_recomputed(plain) == {"k", "o", "fc2"}
    assert op_recomputed(TransformerSpec("gpt", 2, H, HEADS, HEADS, 4 * H, False, S, 32000, True, linear_bias=True)) == \
        {"q", "k", "v", "o", "fc1", "fc2"}


@pytest.mark.parametrize("b", [1, 3])
def test_stored_bytes_are_the_input_the_kept_matmuls_and_the_attention_output(b):
    spec, A, T = llama(), 2, b * S
    q, kv, d = H, KV * (H // HEADS), H // HEADS
    kept = T * A * (q + kv + FFN + H)                                      # wq, wv, w1, w2 outputs
    attn = T * A * q + 4 * b * HEADS * S                                   # the fused kernel's output and FP32 statistics
    assert d * HEADS == H
    assert block(spec, "op", b=b).stored_bytes == T * H * A + kept + attn
    full, op, sel = (block(spec, rc, b=b).stored_bytes for rc in ("full", "op", "selective"))
    assert full < op < sel


def test_recomputed_kernels_are_the_memory_bound_ones_and_the_dropped_matmuls():
    spec, b = llama(), 2
    w = block(spec, "op", b=b)
    rec = w.recompute
    assert ATTN not in rec.kind.tolist()                                    # the fused attention's output is kept
    assert int(np.sum(rec.kind == MEM)) == int(np.sum(w.fwd.kind == MEM))   # norms, RoPE, SwiGLU, residuals all re-run
    gemm_flops = float(rec.flops()[rec.kind == GEMM].sum())
    assert gemm_flops == pytest.approx(b * S * op_recompute_flops(spec, S, causal=True))
    assert 0 < gemm_flops < float(w.fwd.flops()[w.fwd.kind == GEMM].sum())


def test_hardware_flops_count_the_recomputed_matmuls_once_more():
    spec, batch = llama(), 4
    extra = hardware_flops(spec, batch, "op", S) - model_flops(spec, batch, S)
    per_token = 2 * H * (KV * (H // HEADS) + H + FFN)                      # k, o, w3
    assert extra == pytest.approx(batch * S * spec.layers * per_token)
    eager = llama(attention="eager")
    assert op_recompute_flops(eager, S) == pytest.approx(per_token + 4 * S * H)   # eager: the core's bmm re-run too


def test_under_tp_and_sp_the_all_gathers_rerun_and_the_reduce_scatters_are_kept():
    w = block(llama(), "op", t=2, sp=True)
    rec = sorted(c.op for c in w.collectives if c.phase == "recompute")
    fwd = sorted(c.op for c in w.collectives if c.phase == "forward" and c.op != "reduce_scatter")
    assert rec == fwd == ["all_gather", "all_gather"]


def test_op_is_refused_for_moe_blocks():
    spec = TransformerSpec("moe", 2, H, HEADS, KV, FFN, True, S, 32000, False, experts=4, top_k=2, expert_ffn_hidden=FFN)
    graph = transformer_stack(spec, 16, "amp_bf16")
    refused(lambda: unit_work(graph, 1, Shard(recompute="op")), "algo.recompute=op", kind=OptionError)
    with pytest.raises(ValueError, match="dense blocks"):
        hardware_flops(spec, 4, "op", S)
