"""What one GPU does for one stack unit (harness/core/llm/work.py, block_work.py): Korthikanti's
activation-memory formulas (Table 2) for a GPT block, the TP / SP / CP / EP collectives and their
volumes, sharded FLOPs and parameters, the recomputation, the costing of the kernels
(``CostModel.kernel_times``, the ``ATTN`` kernel) and its memo, and a CNN's stack graph."""

from __future__ import annotations

import numpy as np
import pytest
from hydra.utils import instantiate

from harness.app.compose import compose
from harness.app.run import build
from harness.core.costs import AnalyticalCostModel
from harness.core.errors import OptionError
from harness.core.kernels import ATTN, GEMM, MEM, NCOLS, KernelTable
from harness.core.llm.spec import TransformerSpec
from harness.core.llm.stack import StackGraph, transformer_stack
from harness.core.llm.work import PHASE_NAMES, Shard, phase_table, unit_times, unit_work
from harness.core.precision import BF16, FP32
from tests.helpers import refused

S, H, A_HEADS = 2048, 1024, 16


def gpt_block(t: int = 1, sp: bool = False, recompute: str = "none", b: int = 1, cp: int = 1, attention: str = "eager"):
    """The work of one block of a Megatron GPT (dropout, eager attention) in 16-bit."""
    spec = TransformerSpec("gpt", 2, H, A_HEADS, A_HEADS, 4 * H, False, S, 51200, True, position="learned", norm="layernorm",
                           linear_bias=True, dropout=True, attention=attention)
    graph = transformer_stack(spec, 64, "amp_bf16")
    return unit_work(graph, 1, Shard(tp=t, sp=sp, cp=cp, micro_batch=b, recompute=recompute))


@pytest.fixture(scope="module")
def a100() -> AnalyticalCostModel:
    cfg = compose(["cluster=dgx_a100", "costs=analytical"])
    cluster = instantiate(cfg.cluster, _convert_="all")
    return instantiate(cfg.costs, _partial_=True, _convert_="all")(cluster=cluster)


# ---------------------------------------------------------------------------- Korthikanti Table 2
@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("b", [1, 2])
def test_activation_memory_follows_korthikanti_table_2(t, b):
    sbh, ash = S * b * H, A_HEADS * S / H
    assert gpt_block(1, b=b).stored_bytes == sbh * (34 + 5 * ash)                                  # no parallelism
    assert gpt_block(t, b=b).stored_bytes == sbh * (10 + 24 / t + 5 * ash / t)                       # tensor parallel
    assert gpt_block(t, True, b=b).stored_bytes == sbh / t * (34 + 5 * ash)                          # + sequence parallel
    assert gpt_block(t, False, "selective", b=b).stored_bytes == sbh * (10 + 24 / t)                 # + selective recompute
    assert gpt_block(t, True, "selective", b=b).stored_bytes == 34 * sbh / t                         # TP + SP + selective
    assert gpt_block(t, False, "full", b=b).stored_bytes == 2 * sbh                                  # full recompute
    assert gpt_block(t, True, "full", b=b).stored_bytes == 2 * sbh / t                               # ... of the SP-sharded input


def test_flash_attention_keeps_only_the_softmax_statistics():
    for t in (1, 4):
        flash, selective = gpt_block(t, True, attention="flash"), gpt_block(t, True, "selective")
        assert flash.stored_bytes == selective.stored_bytes + 4 * A_HEADS // t * S   # FP32 log-sum-exp per head and query
        assert gpt_block(t, True, "selective", attention="flash").stored_bytes == selective.stored_bytes


def test_alibi_copies_its_bias_into_the_eager_scores_and_reads_it_back():
    """Eager attention under ALiBi (Megatron-DeepSpeed's ``baddbmm(alibi, q, k^T, beta=1)``): one
    more forward write and read of the local score tensor; nothing backward, nothing stored; a
    fused attention kernel adds its bias inside."""
    def mem(position: str, t: int, attention: str = "eager") -> tuple[int, int, int]:
        spec = TransformerSpec("gpt", 2, H, A_HEADS, A_HEADS, 4 * H, False, S, 51200, True, position=position, norm="layernorm",
                               linear_bias=True, dropout=True, attention=attention)
        w = unit_work(transformer_stack(spec, 64, "amp_bf16"), 1, Shard(tp=t, micro_batch=2))
        rows = [(tab, tab.kind == MEM) for tab in (w.fwd, w.bwd_input, w.bwd_weight)]
        return (*(int(tab.dims[m, 0].sum()) for tab, m in rows[:2]), w.stored_bytes)

    for t in (1, 4):
        scores = 2 * (A_HEADS // t) * S * S  # micro-batch 2
        alibi, learned = mem("alibi", t), mem("learned", t)
        assert alibi[0] - learned[0] == 2 * scores * 2 and alibi[1:] == learned[1:]
        assert mem("alibi", t, "flash") == mem("learned", t, "flash")


def test_context_parallelism_divides_the_sequence():
    for rec in ("none", "selective", "full"):
        assert gpt_block(2, True, rec, cp=4).stored_bytes * 4 == gpt_block(2, True, rec).stored_bytes
    assert gpt_block(1, cp=2, attention="flash").boundary_bytes * 2 == gpt_block(1, attention="flash").boundary_bytes


# ---------------------------------------------------------------------------- collectives
def ops(work, phase=None, group="tp"):
    return [(c.op, c.nbytes) for c in work.collectives if c.group == group and (phase is None or c.phase == phase)]


@pytest.mark.parametrize("b", [1, 4])
def test_tensor_parallel_collectives_are_korthikantis_four_all_reduces(b):
    """4 all-reduces of b s h (2 forward, 2 backward); with SP each a reduce-scatter plus an
    all-gather of the same volume; none at t = 1; full recompute re-runs the forward's."""
    vol = b * S * H * 2
    assert ops(gpt_block(1, b=b)) == []
    assert ops(gpt_block(4, b=b), "forward") == [("all_reduce", vol)] * 2
    assert ops(gpt_block(4, b=b), "backward") == [("all_reduce", vol)] * 2
    sp = gpt_block(4, True, b=b)
    assert sorted(ops(sp, "forward")) == sorted(ops(sp, "backward")) == [("all_gather", vol)] * 2 + [("reduce_scatter", vol)] * 2
    assert ops(gpt_block(4, True, "full", b=b), "recompute") == ops(sp, "forward")
    assert ops(gpt_block(4, True, "selective", b=b), "recompute") == []


def test_ring_attention_passes_keys_and_values_round_the_ring():
    w = gpt_block(2, True, "selective", cp=4, attention="flash")
    ring = [c for c in w.collectives if c.group == "cp"]
    kv = 2 * 1 * (S // 4) * (H // 2) * 2
    assert {(c.phase, c.count) for c in ring} == {("forward", 3), ("backward", 6), ("recompute", 3)}
    assert all(c.op == "send_recv" and c.overlapped and c.nbytes == kv for c in ring)


def moe_graph(**kw) -> StackGraph:
    spec = TransformerSpec("moe", 3, 512, 8, 4, 1024, True, 256, 1000, False, experts=8, top_k=2, expert_ffn_hidden=512,
                           shared_experts=1, first_dense_layers=1, **kw)
    return transformer_stack(spec, 16, "amp_bf16")


def test_expert_parallel_all_to_alls_and_sharded_experts():
    g = moe_graph()
    n, k, h = 256, 2, 512
    w = unit_work(g, 2, Shard(ep=4))
    assert ops(w, "forward", "ep") == ops(w, "backward", "ep") == [("all_to_all", n * k * h * 2)] * 2
    assert ops(unit_work(g, 2, Shard(ep=1)), group="ep") == []
    assert ops(unit_work(g, 1, Shard(ep=4)), group="ep") == []          # the first block is dense
    # TP with SP: the routed tokens gathered and scattered round the experts
    tpsp = unit_work(g, 2, Shard(tp=2, sp=True, ep=4))
    assert ("all_gather", n * k * h * 2) in ops(tpsp, "forward") and ("reduce_scatter", n * k * h * 2) in ops(tpsp, "forward")
    # experts split by EP, their channels by TP; router and norms replicated
    other, experts = g.spec.block_params(True)
    assert unit_work(g, 2, Shard()).params_local == other + experts
    assert unit_work(g, 2, Shard(ep=4)).params_local == other + experts // 4
    # the per-GPU expert GEMMs do the same FLOPs whatever the EP degree (balanced routing)
    gemm = [unit_work(g, 2, Shard(ep=e)).fwd for e in (1, 2, 4, 8)]
    assert len({float(t.flops().sum()) for t in gemm}) == 1


# ---------------------------------------------------------------------------- FLOPs, parameters, recompute
@pytest.mark.parametrize("spec", [
    TransformerSpec("gpt", 2, 1024, 16, 16, 4096, False, 512, 51200, True, position="learned", norm="layernorm", linear_bias=True),
    TransformerSpec("llama", 2, 1024, 16, 4, 2816, True, 512, 32000, False),
], ids=["gpt", "gqa"])
@pytest.mark.parametrize("t", [2, 4])
def test_tensor_parallel_shards_divide_flops_and_parameters(spec, t):
    g = transformer_stack(spec, 8, "amp_bf16")
    for u in range(g.num_nodes):
        one, shard = unit_work(g, u, Shard()), unit_work(g, u, Shard(tp=t, sp=True))
        assert shard.fwd.flops().sum() * t == pytest.approx(one.fwd.flops().sum(), rel=1e-12)
        assert one.params_local == g.units[u].params
    block_one, block_t = unit_work(g, 1, Shard()), unit_work(g, 1, Shard(tp=t))
    replicated = 2 * spec.norm_params() + (2 * spec.hidden if spec.linear_bias else 0)   # norms, row-parallel biases
    assert block_t.params_local == (block_one.params_local - replicated) // t + replicated
    head = unit_work(g, g.num_nodes - 1, Shard(tp=t))
    assert head.tied_params_local == (spec.vocab // t * spec.hidden if spec.tied_embeddings else 0)


def test_backward_is_twice_the_gemms_and_2p5_times_the_attention():
    w = gpt_block(2, True, attention="flash")
    fwd = w.fwd
    f_gemm = fwd.flops()[fwd.kind == GEMM].sum()
    f_attn = fwd.flops()[fwd.kind == ATTN].sum()
    bwd = KernelTable.concat([w.bwd_input, w.bwd_weight])
    assert bwd.flops()[bwd.kind == GEMM].sum() == pytest.approx(2 * f_gemm)
    assert bwd.flops()[bwd.kind == ATTN].sum() == pytest.approx(2.5 * f_attn)
    assert w.bwd_weight.flops().sum() == pytest.approx(f_gemm)           # one weight gradient per weight GEMM


def test_recompute_tables():
    none, sel, full = (gpt_block(2, True, r, attention="flash") for r in ("none", "selective", "full"))
    assert len(none.recompute) == 0
    assert sel.recompute.kind.tolist() == [ATTN] and sel.recompute.flops().sum() == sel.fwd.flops()[sel.fwd.kind == ATTN].sum()
    np.testing.assert_array_equal(full.recompute.dims, full.fwd.dims)
    eager = gpt_block(2, True, "selective")
    assert eager.recompute.kind.tolist() == [GEMM, MEM, MEM, GEMM]      # QK^T, softmax, dropout, PV


def test_head_memory_and_boundaries():
    spec = TransformerSpec("h", 2, 1024, 16, 16, 4096, True, 512, 32000, False)
    g = transformer_stack(spec, 8, "amp_bf16")
    head = unit_work(g, 3, Shard(tp=4, sp=True, micro_batch=2))
    T, vl = 2 * 512, 32000 // 4
    assert head.stored_bytes == 2 * (T // 4) * 1024 * 2 + 4 * T * vl
    assert head.transient_bytes == T * vl * 2 and head.boundary_bytes == 0
    assert unit_work(g, 0, Shard(tp=4, sp=True, micro_batch=2)).boundary_bytes == (T // 4) * 1024 * 2
    assert unit_work(g, 1, Shard(tp=4, micro_batch=2)).boundary_bytes == T * 1024 * 2


def test_shard_values_are_checked():
    refused(lambda: Shard(tp=0), "algo.tp must be an integer >= 1", kind=OptionError)
    refused(lambda: Shard(recompute="some"), "algo.recompute must be one of none, selective, full", kind=OptionError)
    refused(lambda: Shard(sp="yes"), "algo.sequence_parallel must be true or false", kind=OptionError)


# ---------------------------------------------------------------------------- kernels and their costs
def rows(kind, dims, math=BF16):
    d = np.zeros((len(dims), NCOLS), np.int64)
    for i, r in enumerate(dims):
        d[i, :len(r)] = r
    k = len(dims)
    return KernelTable(np.arange(k), np.full(k, kind), d, np.zeros(k), np.full(k, math), np.zeros(k, bool))


def test_attention_kernel_flops_and_bytes():
    bh, sq, skv, d = 32, 1024, 4096, 128
    t = rows(ATTN, [(bh, sq, skv, d, 0, 0, 1), (bh, sq, skv, d, 1, 0, 1), (bh, sq, skv, d, 1, 1, 1), (bh, sq, skv, d, 0, 0, 8)])
    f = t.flops()
    assert f[0] == 4 * bh * sq * skv * d and f[1] == f[0] / 2 and f[2] == 2.5 * f[1] and f[3] == f[0]
    b = t.nbytes()
    q, kv = bh * sq * d * 2, bh * skv * d * 2
    assert b[0] == 2 * q + 2 * kv + 4 * bh * sq                                  # Q, O, K, V once, FP32 statistics
    assert b[2] == 2 * (2 * q + 2 * kv) + 4 * bh * sq                            # and their gradients backward
    assert b[3] == 2 * q + 2 * kv / 8 + 4 * bh * sq                              # grouped-query: 8 heads share K and V


def test_analytical_kernel_times_are_a_roofline_per_row(a100):
    spec = a100.cluster.devices[0].spec
    big = rows(GEMM, [(1, 8192, 8192, 8192)])
    t = a100.kernel_times(big, 0, 1)
    assert t[0] == pytest.approx(2 * 8192**3 / (spec.peak_flops["bfloat16"] * 0.7) + 5e-6)
    fp32 = a100.kernel_times(rows(GEMM, [(1, 8192, 8192, 8192)], FP32), 0, 1)
    assert fp32[0] == pytest.approx(2 * 8192**3 / (spec.peak_flops["float32"] * 0.7) + 5e-6)
    mem = a100.kernel_times(rows(MEM, [(10**9,)]), 0, 1)
    assert mem[0] == pytest.approx(1e9 / (spec.mem_bw * 0.8) + 5e-6)
    attn = rows(ATTN, [(64, 4096, 4096, 128, 1, 0, 1)])
    assert a100.kernel_times(attn, 0, 1)[0] == pytest.approx(attn.flops()[0] / (spec.peak_flops["bfloat16"] * 0.6) + 5e-6)
    two = KernelTable.concat([big, rows(MEM, [(10**9,)]).take(np.arange(1), np.array([3]))])
    assert a100.kernel_times(two, 0, 4).tolist() == pytest.approx([t[0], 0.0, 0.0, mem[0]])


def test_calibrated_kernel_times_cost_attention_and_memory_rows_by_their_fits():
    """On an A100 (measured: FlashAttention-2, gpu-stream) a block's attention and memory-bound rows
    are the fits', not the roofline's; on a V100 (DeepBench measured neither) the roofline's."""
    w = gpt_block(2, True, attention="flash")
    table = phase_table(w)
    side = table.take(np.flatnonzero(table.kind != GEMM), np.zeros(int((table.kind != GEMM).sum()), np.int64))
    for name, measured in (("dgx_a100", True), ("dgx1_v100", False)):
        cfg = compose([f"cluster={name}", "costs=calibrated"])
        cluster = instantiate(cfg.cluster, _convert_="all")
        cal = instantiate(cfg.costs, _partial_=True, _convert_="all")(cluster=cluster)
        got = cal.kernel_times(table, 0, len(PHASE_NAMES))
        rough = cal.analytical.kernel_times(table, 0, len(PHASE_NAMES))
        assert np.all(np.isfinite(got)) and np.all(got[:3] > 0) and got[3] == 0
        assert not np.allclose(got, rough)                                       # the GEMMs come from the fits
        side_t = cal.kernel_times(side, 0)[0]
        assert (side_t == pytest.approx(cal.analytical.kernel_times(side, 0)[0])) != measured, name
        report = cal.report()["devices"][cluster.devices[0].spec.kind]
        assert ("attention (FlashAttention-2)" in report) == measured and ("memory-bound" in report) == measured
        assert ("analytical roofline (attention kernels)" in report) != measured


class CountingCosts(AnalyticalCostModel):
    """The analytical model, counting the kernel tables it is asked to cost."""

    calls = 0

    def kernel_times(self, kernels, device, num_nodes=1):
        self.calls += 1
        return super().kernel_times(kernels, device, num_nodes)


def test_unit_times_cost_each_distinct_unit_once(a100):
    costs = CountingCosts(a100.cluster)
    spec = TransformerSpec("l", 24, 1024, 16, 4, 2816, True, 1024, 32000, False)
    g = transformer_stack(spec, 64, "amp_bf16")
    shard = Shard(tp=2, sp=True, micro_batch=2, recompute="selective")
    times = [unit_times(g, u, shard, costs) for u in range(g.num_nodes)]
    assert costs.calls == 3                                                      # embedding, one block, head
    assert all(t is times[1] for t in times[1:-1])
    w = unit_work(g, 1, shard)
    assert times[1].fwd_s == pytest.approx(a100.kernel_times(w.fwd, 0)[0])
    assert times[1].recompute_s == pytest.approx(a100.kernel_times(w.recompute, 0)[0])
    assert times[1].bwd_s == pytest.approx(times[1].recompute_s + times[1].bwd_input_s + times[1].bwd_weight_s)
    assert (times[1].stored_bytes, times[1].params_local) == (w.stored_bytes, w.params_local)
    unit_times(g, 1, Shard(tp=4, sp=True, micro_batch=2, recompute="selective"), costs)
    assert costs.calls == 4


def test_stack_graph_identity():
    g = moe_graph()
    assert g.signature(1) != g.signature(2) and g.signature(2) == g.signature(3)
    back = StackGraph.from_dict(g.to_dict())
    assert back.fingerprint() == g.fingerprint() and back.spec == g.spec and back.units == g.units
    assert back.to_dict()["params"] == g.spec.param_count()


# ---------------------------------------------------------------------------- a CNN's stack graph
@pytest.fixture(scope="module")
def resnet():
    return build(compose(["model=resnet50", "model.batch_size=8"]))[0].stack_graph(precision="fp32")


def test_resnet_as_a_chain_of_units(resnet):
    lg = resnet.layer_graph
    assert resnet.params() == 25_557_032 and resnet.seq_len == 1
    assert np.concatenate(resnet.unit_nodes).tolist() == list(range(lg.num_nodes))
    by_name = {u.name: u for u in resnet.units}
    # after the stem: the max-pool's output only (64 x 56 x 56 floats); inside the first bottleneck
    # the cut carries the branch and the shortcut's input
    assert by_name["stem.0"].out_bytes == 64 * 56 * 56 * 4
    assert by_name["stages.0.0.conv1"].out_bytes == 2 * 64 * 56 * 56 * 4
    assert sum(u.flops_fwd for u in resnet.units) == pytest.approx(float(lg.flops_fwd.sum()) / 8)


def test_cnn_unit_times_come_from_the_layer_times(resnet, a100):
    shard = Shard(micro_batch=2)
    times = [unit_times(resnet, u, shard, a100) for u in range(resnet.num_nodes)]
    fwd, bwd = a100.layer_times(resnet.layer_graph, 0, 2 / 8)
    assert sum(t.fwd_s for t in times) == pytest.approx(float(fwd.sum()))
    assert sum(t.bwd_input_s + t.bwd_weight_s for t in times) == pytest.approx(float(bwd.sum()))
    full = unit_times(resnet, 5, Shard(micro_batch=2, recompute="full"), a100)
    assert full.stored_bytes == int(resnet.units[4].out_bytes * 2) and full.recompute_s == times[5].fwd_s
    assert times[5].boundary_bytes == int(resnet.units[5].out_bytes * 2)
    refused(lambda: unit_times(resnet, 0, Shard(tp=2), a100), "algo.tp=2", "no tensor-parallel split", kind=OptionError)


def test_the_backward_sums_the_residual_streams_gradient_and_reduces_each_bias():
    """Autograd adds the residual stream's two gradients at each residual (3 n h A bytes: two read,
    one written); a biased linear layer's bias gradient is a column sum of its output gradient
    (T x its local output width), a weight-gradient kernel."""
    n_h = 2 * S * H  # b = 2 sequences through every kernel (no SP)
    for bias in (False, True):
        spec = TransformerSpec("gpt", 2, H, A_HEADS, A_HEADS, 4 * H, False, S, 51200, True, position="learned", norm="layernorm",
                               linear_bias=bias)
        for t in (1, 2):
            w = unit_work(transformer_stack(spec, 64, "amp_bf16"), 1, Shard(tp=t, micro_batch=2))
            mem = np.asarray(w.bwd_input.dims)[np.asarray(w.bwd_input.kind) == MEM, 0]
            assert int((mem == 3 * n_h * 2).sum()) == 2
            wmem = np.asarray(w.bwd_weight.dims)[np.asarray(w.bwd_weight.kind) == MEM, 0]
            widths = [3 * H // t, H, 4 * H // t, H]   # QKV and fc1 column-parallel, proj and fc2 whole
            assert sorted(wmem.tolist()) == (sorted(2 * S * x * 2 for x in widths) if bias else [])
