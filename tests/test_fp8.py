"""The FP8 recipe of a transformer block (``precision=amp_fp8``, :mod:`harness.core.llm.fp8`).

Pins, each against a count made here from the block's shape: which GEMMs run in FP8 (every
linear layer's three, not the router's, the head's or the attention core), the bytes of the
quantize kernels the recipe adds (an amax pass and a cast per operand, the output gradient's
with its transposed copy, the input and weight again backward), the FP8 all-gather of a
sequence-parallel input and the BF16 gradients it mirrors, the stored activations (the BF16
step's), the FP8 peak a GEMM runs at, the refusal on a GPU without FP8 (A100), and an
``amp_fp8`` job on H100s end to end.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.core.costs import AnalyticalCostModel
from harness.core.kernels import ATTN, GEMM, MEM, NCOLS, KernelTable
from harness.core.llm.block_work import block_work, head_work
from harness.core.llm.fp8 import FP8_BYTES, quantize_bytes
from harness.core.llm.shard import Shard, UnitWork
from harness.core.llm.spec import TransformerSpec
from harness.core.precision import BF16, FP8, PrecisionError
from tests.helpers import preset_cluster, refused

PHASES = ("fwd", "bwd_input", "bwd_weight", "recompute")
#: a small Llama-like block: grouped-query attention, SwiGLU
SPEC = TransformerSpec("t", 2, 256, 8, 2, 768, True, 128, 1000, False)
MOE = TransformerSpec("m", 2, 256, 8, 8, 768, True, 128, 1000, False, experts=4, top_k=2, expert_ffn_hidden=384,
                      shared_experts=1)
A = 2  # BF16 bytes


def work(precision: str, spec: TransformerSpec = SPEC, moe: bool = False, **shard: object) -> UnitWork:
    return block_work(spec, spec.seq_len, precision, Shard(**{"tp": 2, "sp": True, "micro_batch": 2, **shard}), moe)


def rows(w: UnitWork, phase: str) -> list[tuple[int, tuple[int, ...], int]]:
    kt = getattr(w, phase)
    return [(int(k), tuple(int(x) for x in d), int(m)) for k, d, m in zip(kt.kind, kt.dims, kt.math)]


def test_every_linear_gemm_runs_in_fp8_and_nothing_else_does() -> None:
    bf, f8 = work("amp_bf16"), work("amp_fp8")
    for phase in ("fwd", "bwd_input", "bwd_weight"):
        gemm_bf = [(d, m) for k, d, m in rows(bf, phase) if k == GEMM]
        gemm_f8 = [(d, m) for k, d, m in rows(f8, phase) if k == GEMM]
        # the same GEMMs in the same order: QKV, output projection, gate + up, down
        assert [d for d, _ in gemm_f8] == [d for d, _ in gemm_bf] and len(gemm_f8) == 4
        assert {m for _, m in gemm_bf} == {BF16} and {m for _, m in gemm_f8} == {FP8}
        assert {m for k, _, m in rows(f8, phase) if k == ATTN} <= {BF16}
    # the attention core, norms and residuals are the BF16 step's: only quantize kernels are added
    for phase in ("fwd", "bwd_input"):
        assert [r for r in rows(f8, phase) if not (r[0] == GEMM or r[2] == FP8)] == [r for r in rows(bf, phase) if r[0] != GEMM]
    # the head's logits GEMM stays BF16, and so does a MoE layer's router; its experts run FP8
    head = head_work(SPEC, SPEC.seq_len, "amp_fp8", Shard(tp=2, sp=True, micro_batch=2))
    assert {m for k, _, m in rows(head, "fwd") if k == GEMM} == {BF16}
    moe = [(d, m) for k, d, m in rows(work("amp_fp8", MOE, moe=True), "fwd") if k == GEMM]
    router = [m for d, m in moe if d[2] == MOE.experts]
    assert router == [BF16] and [m for d, m in moe if d[2] != MOE.experts] == [FP8] * 6  # QKV, proj, experts x2, shared x2


def test_quantize_kernels_move_the_recipes_bytes() -> None:
    assert quantize_bytes(1000, 2, True) == (2000, 4000)   # amax reads; the cast reads and writes two FP8 copies
    assert quantize_bytes(1000, 2, False) == (2000, 3000)
    w = work("amp_fp8")
    h, t, b, s = SPEC.hidden, 2, 2, SPEC.seq_len
    T, n = b * s, b * s // t                            # tokens through the GEMMs, and the sequence-parallel shard
    q, kv, f = h // t, (SPEC.kv_heads * SPEC.head_size) // t, SPEC.ffn_hidden // t
    one, both = 2 * A + FP8_BYTES, 2 * A + 2 * FP8_BYTES  # bytes per element quantized (with the transposed copy)
    fwd_inputs = n * h + T * q + n * h + T * f           # QKV and gate/up quantize their SP shard before the all-gather
    inputs = T * h + T * q + T * h + T * f               # ... and each whole input again for its weight gradient
    weights = h * (q + 2 * kv) + q * h + h * 2 * f + f * h
    out_grads = T * (q + 2 * kv) + T * h + T * 2 * f + T * h
    fp8_mem = {p: sum(d[0] for k, d, m in rows(w, p) if k == MEM and m == FP8) for p in PHASES}
    assert fp8_mem == {"fwd": one * (fwd_inputs + weights), "bwd_input": both * out_grads + one * weights,
                       "bwd_weight": one * inputs, "recompute": 0}
    # two kernels per operand: 4 linears x (input, weight) forward, (output gradient, weight) and input backward
    counts = {p: sum(1 for k, _, m in rows(w, p) if k == MEM and m == FP8) for p in PHASES}
    assert counts == {"fwd": 16, "bwd_input": 16, "bwd_weight": 8, "recompute": 0}
    # full recomputation re-runs the forward, quantize kernels and FP8 GEMMs included
    full = work("amp_fp8", recompute="full")
    assert rows(full, "recompute") == rows(full, "fwd")


def test_sequence_parallel_inputs_are_gathered_in_fp8_and_their_gradients_in_bf16() -> None:
    bf, f8 = work("amp_bf16"), work("amp_fp8")
    T, h = 2 * SPEC.seq_len, SPEC.hidden
    calls = [(c.op, c.phase, c.nbytes) for c in f8.collectives]
    assert [(c.op, c.phase, c.nbytes) for c in bf.collectives if c.op != "all_gather" or c.phase != "forward"] == \
        [x for x in calls if x[0] != "all_gather" or x[1] != "forward"]
    assert [x[2] for x in calls if x[:2] == ("all_gather", "forward")] == [T * h * FP8_BYTES] * 2
    assert [x[2] for x in calls if x[:2] == ("reduce_scatter", "backward")] == [T * h * A] * 2


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_stored_activations_are_the_bf16_steps(recompute: str) -> None:
    """torchao keeps each linear layer's BF16 input for its backward (and quantizes it again)."""
    bf, f8 = work("amp_bf16", recompute=recompute), work("amp_fp8", recompute=recompute)
    assert (f8.stored_bytes, f8.transient_bytes, f8.params_local) == (bf.stored_bytes, bf.transient_bytes, bf.params_local)


def test_an_fp8_gemm_runs_at_the_fp8_peak() -> None:
    cluster = preset_cluster("cluster=dgx_h100")
    spec = cluster.devices[0].spec
    assert spec.peak_flops["float8"] == 1978.9e12  # H100 SXM5 dense FP8, the whitepaper's figure
    model = AnalyticalCostModel(cluster)
    m = 8192
    dims = np.zeros((2, NCOLS), dtype=np.int64)
    dims[:, :4] = (1, m, m, m)
    kt = KernelTable(np.zeros(2), [GEMM, GEMM], dims, [1, 1], [FP8, BF16], [False, False])
    t = model.kernel_row_times(kt, 0) - model.launch
    eff = model.efficiency["gemm"]
    np.testing.assert_allclose(t, [2.0 * m**3 / (1978.9e12 * eff), 2.0 * m**3 / (989.4e12 * eff)], rtol=1e-12)


#: two blocks of Llama 3 8B's shape (its model card: hidden 4096, 32 heads, 8 KV heads, FFN 14336)
LLM = ["model=llm", "model.layers=2", "model.hidden=4096", "model.heads=32", "model.kv_heads=8", "model.ffn_hidden=14336",
       "model.seq_len=4096", "model.vocab=32000", "model.batch_size=16", "algo=fsdp", "costs=analytical",
       "output.gantt=false", "output.trace=false", "output.worth=false"]


def test_amp_fp8_is_refused_on_an_a100() -> None:
    from harness.app.compose import compose
    from harness.app.run import run

    refused(lambda: run(compose([*LLM, "cluster=dgx_a100", "precision=amp_fp8"])), "precision=amp_fp8 needs FP8 tensor cores",
            "A100-SXM4-40GB", "precision=amp_bf16", kind=PrecisionError)


def test_an_amp_fp8_job_on_h100s() -> None:
    from harness.app.compose import compose
    from harness.app.run import run

    res = {p: run(compose([*LLM, "cluster=dgx_h100", f"precision={p}"])).row for p in ("amp_bf16", "amp_fp8")}
    # at this size the GEMMs outweigh the quantize kernels (a small model's FP8 step can be the slower)
    assert 0 < res["amp_fp8"]["step_time_s"] < res["amp_bf16"]["step_time_s"]
    assert res["amp_fp8"]["precision"] == "amp_fp8"
    mem = {p: r["memory_breakdown"] for p, r in res.items()}
    # weights, gradients, optimizer states and activations as amp_bf16's
    for kind in ("weights", "gradients", "optimizer", "activations"):
        assert mem["amp_fp8"][kind] == mem["amp_bf16"][kind], kind
