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
from harness.core.board_rate import board_rate, rows_for
from harness.core.calibrated import CalibratedCostModel, CalibrationError
from harness.core.kernel_model import KernelModel, load_table
from harness.core.kernels import ATTN, GEMM, MEM, NCOLS, KernelTable
from harness.core.precision import BF16, FP8, TF32
from harness.core.graph import OpGraph

KIND = "H100-SXM-96GB-HBM2e-500W"
BOARD = "H100-500W"


@pytest.fixture(scope="module")
def costs() -> Any:
    """The default cost model on torchtitan's 500 W H100 cluster (one node)."""
    return build(compose(["model=lenet5", "cluster=torchtitan_h100", "cluster.nodes=1"]))[2]


def plain(costs: Any) -> CalibratedCostModel:
    """The same device without its board: the H100 fits at its configured peaks alone."""
    return CalibratedCostModel(costs.cluster, devices={KIND: {"ref": "H100"}})


def graph_of(rows: list[tuple[int, list[int], int, int]]) -> OpGraph:
    """One node per (kind, dims, bdim, math) kernel row."""
    n = len(rows)
    kt = KernelTable(list(range(n)), [r[0] for r in rows], [list(r[1]) + [0] * (NCOLS - len(r[1])) for r in rows],
                     [r[2] for r in rows], [r[3] for r in rows], [False] * n)
    return OpGraph(names=[f"k{i}" for i in range(n)], targets=["aten.mm.default"] * n, phase=[0] * n, layer=[0] * n,
                   layer_names=["l"], flops=kt.flops(), out_bytes=[0] * n, work_bytes=[0] * n, free=[False] * n,
                   batch_role=[0] * n, coloc=[-1] * n, src=[], dst=[], nbytes=[], kernels=kt)


def board_gemms(precision: str, math: int) -> tuple[OpGraph, np.ndarray]:
    """The board's measured GEMMs of ``precision`` as one-kernel nodes, and their measured seconds."""
    rows = [r for r in load_table()["boards"][BOARD]["rows"] if r["precision"] == precision]
    g = graph_of([(GEMM, [1, r["m"], r["n"], r["k"]], 1, math) for r in rows])
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
    g = graph_of(rows)
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


def test_the_table_carries_the_boards_rows() -> None:
    """kernel_fit writes the board rows into the table, in seconds, never into the H100 fits."""
    table = json.loads(json.dumps(load_table()))
    rows = table["boards"][BOARD]["rows"]
    assert all(r["seconds"] > 0 for r in rows)
    assert not any("FBGEMM" in s for s in table["kernels"]["H100"]["bf16"]["gemm"]["rests_on"])
