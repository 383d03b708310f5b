"""FLOP counting of a transformer's step (harness/core/llm/flops.py): Korthikanti's closed forms,
their published MFU and HFU from their published iteration times, Narayanan's 96-coefficient
hardware FLOPs (BLOOM's published TFLOP/s from its iteration time), and the generalisation to
GQA, gated MLPs and MoE against a count from the kernels each unit really runs."""

from __future__ import annotations

import math

import pytest

from harness.core.llm.flops import core_flops, hardware_flops, hfu, logit_flops, mfu, model_flops
from harness.core.llm.spec import TransformerSpec
from harness.core.llm.stack import transformer_stack
from harness.core.llm.work import Shard, unit_work

#: the A100's dense BF16/FP16 tensor-core peak (NVIDIA A100 datasheet), the peak the papers use
A100_PEAK = 312e12

#: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys'23),
#: Table 3 (configurations) and Table 5 (iteration times, MFU, HFU) of the sequence-parallel +
#: selective-recompute runs, as /work/shared/data/llm/published_llm_training.csv holds them (rows
#: KOR22-1b .. 4b): (layers, hidden, heads, GPUs, global batch, iteration s, MFU %, HFU %);
#: sequence 2048, vocabulary 51200.
KORTHIKANTI = [
    (48, 6144, 64, 8, 4, 1.10, 41.5, 43.7),         # 22B
    (96, 12288, 96, 64, 64, 13.75, 51.4, 52.8),     # 175B
    (105, 20480, 128, 280, 280, 37.83, 56.0, 57.0),  # 530B
    (128, 25600, 160, 512, 512, 71.49, 56.3, 57.0),  # 1T
]

#: Narayanan et al. (SC'21) Table 1's shapes (layers, hidden, heads, batch), s = 2048, V = 51200
SC21 = [(24, 2304, 24, 512), (30, 3072, 32, 512), (36, 4096, 32, 512), (40, 6144, 48, 1024), (48, 8192, 64, 1536),
        (60, 10240, 80, 1792), (80, 12288, 96, 2304), (96, 16384, 128, 2160), (105, 20480, 128, 2520), (128, 25600, 160, 3072)]


def gpt(layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 51200) -> TransformerSpec:
    """A Megatron GPT of this shape."""
    return TransformerSpec("gpt", layers, hidden, heads, heads, 4 * hidden, False, seq, vocab, True, position="learned",
                           norm="layernorm", linear_bias=True)


@pytest.mark.parametrize("layers, hidden, heads, gpus, batch, iter_s, mfu_pct, hfu_pct", KORTHIKANTI)
def test_korthikanti_mfu_and_hfu_from_their_iteration_times(layers, hidden, heads, gpus, batch, iter_s, mfu_pct, hfu_pct):
    spec = gpt(layers, hidden, heads)
    assert 100 * mfu(spec, batch, iter_s, gpus, A100_PEAK) == pytest.approx(mfu_pct, abs=0.5)
    assert 100 * hfu(spec, batch, "selective", iter_s, gpus, A100_PEAK) == pytest.approx(hfu_pct, abs=0.5)


@pytest.mark.parametrize("layers, hidden, heads, batch", SC21)
def test_the_closed_forms_of_korthikanti_and_narayanan(layers, hidden, heads, batch):
    """For a GPT the generalised counts are exactly 72 B s l h^2 (1 + s/6h + V/12lh) (model),
    96 B s l h^2 (1 + s/6h + V/16lh) (full recompute, SC'21 Eq. 3) and
    72 B s l h^2 (1 + s/3h + V/12lh) (selective)."""
    spec = gpt(layers, hidden, heads)
    B, s, l, h, V = batch, 2048, layers, hidden, 51200
    base = B * s * l * h * h
    assert model_flops(spec, B) == pytest.approx(72 * base * (1 + s / (6 * h) + V / (12 * l * h)), rel=1e-12)
    assert hardware_flops(spec, B, "full") == pytest.approx(96 * base * (1 + s / (6 * h) + V / (16 * l * h)), rel=1e-12)
    assert hardware_flops(spec, B, "selective") == pytest.approx(72 * base * (1 + s / (3 * h) + V / (12 * l * h)), rel=1e-12)
    assert hardware_flops(spec, B, "none") == model_flops(spec, B)


def test_bloom_tflops_from_its_iteration_time():
    """BigScience's log line (train/tr11-176B-ml README: 104.7 s a step on 384 A100s, batch 2048,
    full recompute, vocabulary padded to 250,680 in the row) reports 149.77 TFLOP/s: the
    96-coefficient hardware FLOPs exactly."""
    spec = TransformerSpec("bloom", 70, 14336, 112, 112, 57344, False, 2048, 250680, True, position="alibi", norm="layernorm",
                           linear_bias=True, embedding_norm=True)
    tflops = hardware_flops(spec, 2048, "full") / (104.7 * 384) / 1e12
    assert tflops == pytest.approx(149.77, abs=0.05)


def test_utilisation_is_flops_over_capacity_and_refuses_nonsense():
    spec = gpt(2, 256, 4, seq=128, vocab=1000)
    assert mfu(spec, 8, 2.0, 4, 1e12) == pytest.approx(model_flops(spec, 8) / 8e12)
    assert hfu(spec, 8, "full", 2.0, 4, 1e12) > mfu(spec, 8, 2.0, 4, 1e12)
    for bad in ((0.0, 4, 1e12), (1.0, 0, 1e12), (1.0, 4, 0.0), (math.nan, 4, 1e12)):
        with pytest.raises(ValueError):
            mfu(spec, 8, *bad)
    with pytest.raises(ValueError, match="recompute"):
        hardware_flops(spec, 8, "some")


@pytest.mark.parametrize("spec", [
    TransformerSpec("gqa", 3, 512, 8, 2, 1376, True, 256, 1000, False),
    TransformerSpec("moe", 4, 512, 8, 4, 1024, True, 256, 1000, False, experts=8, top_k=2, expert_ffn_hidden=512, shared_experts=1,
                    first_dense_layers=1),
    TransformerSpec("hd", 2, 512, 8, 8, 2048, False, 128, 999, True, head_dim=96),
], ids=["gqa_swiglu", "moe_shared", "head_dim"])
def test_model_flops_match_the_kernels_of_the_units(spec):
    """Three forward passes' worth of every GEMM the units run (the attention core counted whole,
    the router left out, as the definition says) is the model FLOPs of the generalisation."""
    graph = transformer_stack(spec, 1, "amp_bf16")
    gemm, router = 0.0, 0.0
    for u, unit in enumerate(graph.units):
        work = unit_work(graph, u, Shard())
        flops = work.fwd.flops()
        gemm += float(flops.sum())
        if unit.moe:
            router += 2.0 * spec.seq_len * spec.hidden * spec.experts
        assert float(flops.sum()) == pytest.approx(unit.flops_fwd, rel=1e-12)
    causal_half = spec.layers * spec.seq_len * core_flops(spec, spec.seq_len) / 2
    assert 3 * (gemm - router + causal_half) == pytest.approx(model_flops(spec, 1), rel=1e-12)
    assert logit_flops(spec) == 2 * spec.hidden * spec.vocab


def test_causal_halving_is_megatrons_newer_count():
    spec = gpt(4, 1024, 16)
    full, half = model_flops(spec, 2), model_flops(spec, 2, causal=True)
    assert full - half == pytest.approx(3 * 2 * 2048 * 4 * core_flops(spec, 2048) / 2)
