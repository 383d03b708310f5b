"""A board's own tensor-core rate (harness/core/board_rate.py): GEMMs timed on a 500 W H100
against the H100 fits, applied by the calibrated cost model to every tensor-core kernel the board
runs (``costs.devices.<kind>.board``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.app.compose import compose
from harness.app.kernel_samples import SampleError, board_rows
from harness.app.run import build
from harness.core.board_rate import attention_rates, board_rate, impl_rate, rows_for
from harness.core.calibrated import CalibratedCostModel, CalibrationError
from harness.core.kernel_model import KernelModel, load_table
from harness.core.kernels import ATTN, GEMM, MEM
from harness.core.precision import BF16, FP8, TF32
from harness.core.graph import OpGraph
from tests.helpers import kernel_graph

KIND = "H100-SXM-96GB-HBM2e-500W"
BOARD = "H100-500W"


@pytest.fixture(scope="module")
def costs() -> Any:
    """The default cost model on torchtitan's 500 W H100 cluster (one node)."""
    return build(compose(["model=lenet5", "cluster=torchtitan_h100", "cluster.nodes=1"]))[2]


def plain(costs: Any) -> CalibratedCostModel:
    """The same device without its board: the H100 fits at its configured peaks alone."""
    return CalibratedCostModel(costs.cluster, devices={KIND: {"ref": "H100"}})


def board_gemms(precision: str, math: int) -> tuple[OpGraph, np.ndarray]:
    """The board's measured GEMMs of ``precision`` as one-kernel nodes, and their measured seconds."""
    rows = [r for r in load_table()["boards"][BOARD]["rows"] if r["precision"] == precision]
    g = kernel_graph([(GEMM, [1, r["m"], r["n"], r["k"]], 1, math) for r in rows])
    return g, np.array([r["seconds"] for r in rows])


@pytest.mark.parametrize("precision, math", [("bf16", BF16), ("fp8", FP8)])
def test_the_boards_gemms_cost_their_median_rate(costs: Any, precision: str, math: int) -> None:
    """Each precision's rate is the median of its GEMMs' modelled / measured time, so those GEMMs
    cost their measured time at the median (three rows: the middle one exactly)."""
    g, measured = board_gemms(precision, math)
    assert len(measured) == 3
    ratio = costs.node_times(g, 0) / measured
    assert float(np.median(ratio)) == pytest.approx(1.0, rel=1e-12)
    assert ratio.min() < 1.0 < ratio.max() or np.allclose(ratio, 1.0)


def test_every_tensor_core_kernel_of_a_precision_takes_its_rate(costs: Any) -> None:
    """Against the board-less device: GEMMs and attention of a precision slow by one factor (the
    precision's rate; TF32, with no GEMMs of its own on the board, the BF16 one); memory-bound
    kernels not at all; and the report names the board."""
    rows = [(GEMM, [1, 4096, 1024, 512], 1, BF16), (GEMM, [4, 8192, 4096, 4096], 1, BF16),
            (ATTN, [64, 2048, 2048, 128, 1, 0, 1], 0, BF16), (GEMM, [1, 8192, 8192, 8192], 1, FP8),
            (GEMM, [1, 2048, 2048, 2048], 1, TF32), (MEM, [1 << 26], 0, BF16)]
    g = kernel_graph(rows)
    base = plain(costs)
    slow = base.node_times(g, 0) / costs.node_times(g, 0)
    table = load_table()
    bf16 = slow[0]
    assert bf16 < 1.0  # the 500 W board runs the fit's GEMMs slower than its nominal peak says
    assert slow[1] == pytest.approx(bf16, rel=1e-12) and slow[2] == pytest.approx(bf16, rel=1e-12)
    assert slow[4] == pytest.approx(bf16, rel=1e-12)  # TF32 takes the BF16 GEMMs' rate
    assert slow[3] != pytest.approx(bf16, rel=1e-3)  # FP8 has GEMMs of its own on the board
    assert slow[5] == 1.0
    own, of = rows_for(table["boards"][BOARD]["rows"], "fp8")
    assert of == "fp8" and len(own) == 3
    label = costs.report()["devices"][KIND]
    assert f"x {bf16:.3f} (board {BOARD}: 3 bf16 GEMMs measured on it)" in label
    assert "board" not in base.report()["devices"][KIND]


def test_a_board_is_checked_when_the_model_is_built(costs: Any) -> None:
    """An unknown board, or one measured on another family than the device's ``ref``, is a
    one-line error naming the key."""
    with pytest.raises(CalibrationError, match=rf"costs.devices.{KIND}.board must be one of {BOARD}, got 'B200'"):
        CalibratedCostModel(costs.cluster, devices={KIND: {"ref": "H100", "board": "B200"}})
    with pytest.raises(CalibrationError, match=rf"board {BOARD} was measured on an H100, not on costs.devices.{KIND}.ref A100"):
        CalibratedCostModel(costs.cluster, devices={KIND: {"ref": "A100", "board": BOARD}})


@settings(max_examples=30, deadline=None)
@given(rate=st.floats(0.3, 1.5), shapes=st.lists(st.tuples(st.integers(6, 15), st.integers(6, 15), st.integers(6, 15)),
                                                  min_size=1, max_size=7))
def test_board_rate_recovers_a_uniform_slowdown(rate: float, shapes: list[tuple[int, int, int]]) -> None:
    """GEMMs that all ran at ``rate`` of a known model's time give back exactly that rate, at any
    peak and size scale."""
    model = KernelModel.from_dict(load_table()["kernels"]["H100"]["bf16"]["gemm"])
    peak, kappa = 900e12, 1.3
    dims = np.array([[2.0 ** a, 2.0 ** b, 2.0 ** c] for a, b, c in shapes])
    t = model.time(dims / kappa, 2.0 * dims.prod(axis=1), peak) / rate
    rows = [{"m": d[0], "n": d[1], "k": d[2], "seconds": s} for d, s in zip(dims, t)]
    assert board_rate(rows, model, peak, kappa) == pytest.approx(rate, rel=1e-9)
    assert board_rate([], model, peak, kappa) == 1.0


def test_board_rows_read_the_file_and_refuse_a_foreign_gpu(tmp_path: Path) -> None:
    """The committed file's boards, and a board of a GPU outside the A100 / H100 families refused
    in one line."""
    boards = board_rows()
    assert set(boards) == {BOARD} and boards[BOARD]["gpu"] == "H100"
    assert {r["precision"] for r in boards[BOARD]["rows"]} == {"bf16", "fp8"}
    assert board_rows(tmp_path) == {}
    head = "board,gpu,dtype,m,n,k,tflops,time_ms,library,source,locator,how_measured,notes\n"
    (tmp_path / "board_gemm.csv").write_text(head + "X-700W,B200,bf16,8,8,8,1,1,cuBLAS,src,loc,how,\n")
    with pytest.raises(SampleError, match="board X-700W's GPU B200 is not an A100 or H100"):
        board_rows(tmp_path)
    for bad in ("nan", "0", "-1", "inf"):
        (tmp_path / "board_gemm.csv").write_text(head + f"X-700W,H100,bf16,8,8,8,1,{bad},cuBLAS,src,loc,how,\n")
        with pytest.raises(SampleError, match=f"bf16 GEMM 8x8x8 has time_ms {bad}: a time must be a positive number"):
            board_rows(tmp_path)


def test_the_table_carries_the_boards_rows() -> None:
    """kernel_fit writes the board rows into the table, in seconds, never into the H100 fits."""
    table = json.loads(json.dumps(load_table()))
    rows = table["boards"][BOARD]["rows"]
    assert all(r["seconds"] > 0 for r in rows)
    assert not any("FBGEMM" in s for s in table["kernels"]["H100"]["bf16"]["gemm"]["rests_on"])


# ---------------------------------------------------------------------------- another attention kernel
def a100_costs() -> Any:
    return build(compose(["model=lenet5", "cluster=superpod_a100", "cluster.nodes=1"]))[2]


def test_a_triton_attention_row_costs_flashattention2s_time_over_its_measured_rate() -> None:
    """On an A100, an ``ATTN`` row naming llm-foundry's Triton kernel (impl 1) costs the
    FlashAttention-2 row's time over the median rate of that kernel's measured rows of the same
    causality and nearest head size; impl 0 rows are untouched; the report names the kernel."""
    costs = a100_costs()
    rows = [(ATTN, [128, 2048, 2048, 128, 1, 0, 1, 0], 0, BF16), (ATTN, [128, 2048, 2048, 128, 1, 0, 1, 1], 0, BF16),
            (ATTN, [128, 2048, 2048, 128, 1, 1, 1, 1], 0, BF16), (ATTN, [256, 4096, 4096, 64, 0, 0, 1, 1], 0, BF16)]
    t = costs.node_times(kernel_graph(rows), 0)
    table = load_table()
    measured = table["attention_impls"]["A100"]["flash_triton"]["rows"]
    rates = attention_rates(measured, KernelModel.from_dict(table["kernels"]["A100"]["fp16"]["attention"]), 312e12)
    causal128, full64 = impl_rate(measured, rates, True, 128), impl_rate(measured, rates, False, 64)
    assert 0.3 < causal128 < 0.7 and causal128 != pytest.approx(full64, rel=1e-3)
    assert t[1] == pytest.approx(t[0] / causal128, rel=1e-12)
    fa2 = costs.node_times(kernel_graph([(ATTN, [128, 2048, 2048, 128, 1, 1, 1, 0], 0, BF16),
                                     (ATTN, [256, 4096, 4096, 64, 0, 0, 1, 0], 0, BF16)]), 0)
    assert t[2] == pytest.approx(fa2[0] / causal128, rel=1e-12) and t[3] == pytest.approx(fa2[1] / full64, rel=1e-12)
    assert "flash_triton attention at its rate against A100 FlashAttention-2 (24 rows measured)" in costs.report()["devices"]["A100-SXM4-80GB"]


def test_a_kernel_nobody_timed_on_a_gpu_is_a_one_line_error(costs: Any) -> None:
    g = kernel_graph([(ATTN, [128, 2048, 2048, 128, 1, 0, 1, 1], 0, BF16)])
    with pytest.raises(CalibrationError, match="model.attention=flash_triton: that kernel was measured on A100 only, not on an H100: "
                                               "use model.attention=flash there"):
        costs.node_times(g, 0)


def test_impl_rate_takes_the_same_causality_at_the_nearest_head_size() -> None:
    rows = [{"causal": True, "head_dim": 64}, {"causal": True, "head_dim": 128}, {"causal": True, "head_dim": 128},
            {"causal": False, "head_dim": 128}]
    rates = [0.9, 0.4, 0.6, 0.7]
    assert impl_rate(rows, rates, True, 128) == pytest.approx(0.5)
    assert impl_rate(rows, rates, True, 80) == pytest.approx(0.9)      # 64 is nearer than 128
    assert impl_rate(rows, rates, False, 64) == pytest.approx(0.7)     # the only non-causal rows


@settings(max_examples=20, deadline=None)
@given(rate=st.floats(0.2, 1.2), causal=st.booleans(), both=st.booleans(), d=st.sampled_from([64, 128, 256]),
       s=st.sampled_from([512, 2048, 8192]))
def test_attention_rates_recover_a_uniform_slowdown(rate: float, causal: bool, both: bool, d: int, s: int) -> None:
    """Rows timed at ``rate`` of the FlashAttention-2 model's own time give that rate back."""
    model = KernelModel.from_dict(load_table()["kernels"]["A100"]["fp16"]["attention"])
    row = {"pass": "fwd+bwd" if both else "fwd", "causal": causal, "head_dim": d, "seqlen": s, "bh": 16384 // s * 16, "seconds": 1.0}
    own = attention_rates([row], model, 312e12)[0]          # the model's time over 1 s: the model's time
    row["seconds"] = own / rate
    assert attention_rates([row], model, 312e12)[0] == pytest.approx(rate, rel=1e-9)


def test_flash_triton_is_flashattention_in_every_count_but_its_kernel() -> None:
    """The spec takes ``attention=flash_triton``; its block has the FLOPs, stored bytes and kernels of
    ``flash`` with the attention rows naming kernel 1."""
    from harness.core.llm.block_work import block_work
    from harness.core.llm.shard import Shard
    from harness.core.llm.spec import TransformerSpec

    def spec(attention: str) -> TransformerSpec:
        return TransformerSpec("mpt", 2, 256, 4, 4, 1024, False, 128, 512, True, position="learned", norm="layernorm",
                               linear_bias=True, attention=attention)

    a, b = spec("flash"), spec("flash_triton")
    assert b.fused_attention and not spec("eager").fused_attention
    wa, wb = (block_work(x, 128, "amp_bf16", Shard(micro_batch=2), False) for x in (a, b))
    for phase in ("fwd", "bwd_input"):
        ka, kb = getattr(wa, phase), getattr(wb, phase)
        attn = kb.kind == ATTN
        assert attn.any() and (kb.dims[attn, 7] == 1).all() and (ka.dims[ka.kind == ATTN, 7] == 0).all()
        np.testing.assert_array_equal(ka.flops(), kb.flops())
    assert wa.stored_bytes == wb.stored_bytes


def test_attention_impl_rows_refuse_a_rate_that_is_not_a_positive_number(tmp_path: Path) -> None:
    from harness.app.kernel_samples import attention_impl_rows

    head = "gpu,gpu_variant,impl,pass,causal,head_dim,seqlen,batch,nheads,dtype,tflops,source,locator,how_measured,notes\n"
    (tmp_path / "attention.csv").write_text(head + "A100,SXM4,FlashAttention Triton,fwd+bwd,True,128,2048,8,16,fp16,95,src,loc,how,\n")
    (row,) = attention_impl_rows(tmp_path)["A100"]["flash_triton"]["rows"]
    assert row["seconds"] == pytest.approx(4 * 128 * 2048 ** 2 * 128 * 0.5 * 3.5 / 95e12, rel=1e-12)
    (tmp_path / "attention.csv").write_text(head + "A100,SXM4,FlashAttention Triton,fwd+bwd,True,128,2048,8,16,fp16,0,src,loc,how,\n")
    with pytest.raises(SampleError, match="an A100 FlashAttention Triton row has tflops 0: it must be a positive number"):
        attention_impl_rows(tmp_path)
