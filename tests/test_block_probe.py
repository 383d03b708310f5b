"""The GPU probe (``python -m harness.block_probe``, :mod:`harness.app.probe_model`) run on the CPU
at toy sizes: every file and row it writes, the bytes its memory-bound kernels must move, the
decoder's maths (RMSNorm, a rotation that keeps norms, grouped-query attention as multi-head
attention over repeated keys and values), its one-line refusals; and what the project reads of
the committed H100 measurements (:func:`harness.app.kernel_samples.probe_gemm_rows`,
:func:`~harness.app.kernel_samples.probe_memory_rows`, :mod:`experiments._llm_probe`)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from experiments._llm_probe import (attention_table, between_table, class_table, op_class, probe_lines, probe_table, spec_of,
                                   sustained_summary)
from harness.app.block_probe import main
from harness.app.probe_kernels import linears, memory_ops
from harness.app.kernel_samples import PROBE_SOURCE, probe_gemm_rows, probe_memory_rows
from harness.app.probe_model import SHAPES, TINY, Block, RMSNorm, init_, rope_table, rotate


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("probe")
    rc = main(["--out", str(out), "--device", "cpu", "--tiny", "--reps", "2", "--warmup", "1", "--sustain-s", "0.1",
               "--sustain-block-s", "0.2", "--memory-elements", "65536", "--flash", "llama_tiny", "--attention-between", "gpt_tiny"])
    assert rc == 0
    return out


def test_the_probe_writes_every_file_with_a_row_per_unit_pass_and_kernel(probed) -> None:
    for name in ("env.json", "units.csv", "ops.csv", "kernels.csv", "sustained.csv", "sustained_block.csv"):
        assert (probed / name).exists(), name
    assert json.loads((probed / "env.json").read_text())["device"] == "cpu"
    units = pd.read_csv(probed / "units.csv")
    for shape in TINY:
        got = units[units["shape"] == shape]
        assert set(zip(got["unit"], got["pass"])) >= {(u, p) for u in ("block", "head", "embedding") for p in ("forward", "forward_backward")}
    assert set(units[units["unit"] == "block_flash"]["shape"]) == {"llama_tiny"}
    assert (units["median_s"] > 0).all() and (units["min_s"] <= units["median_s"]).all() and (units["reps"] == 2).all()
    kernels = pd.read_csv(probed / "kernels.csv")
    for shape, s in TINY.items():
        gemm = kernels[(kernels["shape"] == shape) & (kernels["kernel"] == "gemm")]
        fp8 = gemm["dtype"].str.startswith("float8")
        assert (~fp8).sum() == 3 * len(linears(s))                          # forward, input and weight gradient of each
        # the Llama shapes' FP8 recipes: tensor-wise and row-wise, each pass; row-wise rescaled, the gradients'
        want = {"float8": 3, "float8_rowwise": 3, "float8_rowwise_rescaled": 2} if s.family == "llama" else {}
        assert gemm[fp8]["dtype"].value_counts().to_dict() == {d: c * len(linears(s)) for d, c in want.items()}
        assert set(gemm[gemm["dtype"] == "float8_rowwise_rescaled"]["pass"]) <= {"bwd_input", "bwd_weight"}
        flops = 2.0 * gemm["m"] * gemm["n"] * gemm["k"]
        np.testing.assert_allclose(gemm["tflops"], flops / gemm["median_s"] / 1e12, rtol=1e-9)
    mem = kernels[kernels["kernel"] == "memory"]
    np.testing.assert_allclose(mem["GBps"], mem["bytes"] / mem["median_s"] / 1e9, rtol=1e-9)
    between = kernels[kernels["name"].str.startswith("flash_")]
    assert set(zip(between["name"], between["pass"])) == {(f"flash_{c}", p) for c in ("alone", "after_gemm", "after_copy")
                                                          for p in ("forward", "backward")}
    assert set(between["shape"]) == {"gpt_tiny"} and (between["median_s"] > 0).all()
    ops = pd.read_csv(probed / "ops.csv")
    assert (ops["self_us"] > 0).all() and {"block", "head", "block_flash"} <= set(ops["unit"])
    assert len(pd.read_csv(probed / "sustained.csv")) == 2 and len(pd.read_csv(probed / "sustained_block.csv")) >= 1


def test_memory_kernels_move_the_bytes_their_operands_hold() -> None:
    n = 4096 * 8
    g = torch.Generator().manual_seed(0)
    ops = {name: (fn, nbytes) for name, fn, nbytes in memory_ops(n, torch.device("cpu"), g)}
    assert ops["copy_bf16"][1] == 2 * 2 * n and ops["triad_fp32"][1] == 3 * 4 * n and ops["cast_bf16_fp32"][1] == 6 * n
    assert ops["fill_bf16"][1] == ops["sum_bf16"][1] == 2 * n
    for name, (fn, _) in ops.items():
        fn()                                                                # each runs as written
    # the bytes are what the output and inputs hold: a copy writes as many as it reads
    out = ops["cast_bf16_fp32"][0]()
    assert out.dtype == torch.float32 and out.numel() == n


def test_rmsnorm_is_its_formula_and_rotation_keeps_each_pairs_norm() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 8)
    norm = RMSNorm(8)
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    torch.testing.assert_close(norm(x), want)
    y = rotate(x, rope_table(5, 8, "cpu"))
    pairs = lambda t: t.reshape(*t.shape[:-1], -1, 2).pow(2).sum(-1)     # noqa: E731
    torch.testing.assert_close(pairs(y), pairs(x))
    torch.testing.assert_close(rotate(x[:, :1], rope_table(1, 8, "cpu")), x[:, :1])   # position 0: no rotation


def test_grouped_query_attention_is_multi_head_attention_over_repeated_keys() -> None:
    s = TINY["llama_tiny"]
    gqa = init_(Block(s), 0)
    mha_shape = type(s)(**{**s.row(), "kv_heads": s.heads})
    mha = Block(mha_shape)
    rep = s.heads // s.kv_heads
    with torch.no_grad():
        for name, p in mha.named_parameters():
            src = dict(gqa.named_parameters())[name]
            if name in ("wk.weight", "wv.weight"):   # each KV head's rows, repeated for the query heads it serves
                p.copy_(src.view(s.kv_heads, 1, s.head_dim, s.hidden).expand(-1, rep, -1, -1).reshape(-1, s.hidden))
            else:
                p.copy_(src)
    x = torch.randn(2, s.seq, s.hidden, generator=torch.Generator().manual_seed(1))
    table = rope_table(s.seq, s.head_dim, "cpu")
    torch.testing.assert_close(gqa(x, table), mha(x, table), rtol=1e-4, atol=1e-5)
    q = torch.randn(1, 2, 4, 8)
    assert F.scaled_dot_product_attention(q, q, q, is_causal=True).shape == q.shape


@pytest.mark.parametrize("argv, says", [
    (["--tiny", "--device", "cpu", "--shapes", "llama_huge"], "unknown shape 'llama_huge'"),
    (["--tiny", "--device", "cpu", "--compile", "nope"], "unknown shape 'nope'"),
    (["--tiny", "--device", "cpu", "--reps", "0"], "--reps must be >= 1"),
    (["--tiny", "--device", "cpu", "--memory-elements", "100"], "--memory-elements must be a multiple of 32768"),
    (["--tiny", "--device", "cpu", "--sustain-s", "nan"], "take seconds >= 0"),
    (["--tiny", "--device", "cpu", "--sustain-block-s", "-1"], "take seconds >= 0"),
    (["--tiny", "--device", "nope"], "--device 'nope' is not a device"),
])
def test_a_mistake_is_one_line(tmp_path, capsys, argv, says) -> None:
    assert main(["--out", str(tmp_path / "o"), *argv]) == 1
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_no_gpu_is_one_line(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--out", str(tmp_path / "o")]) == 1
    assert "sees no CUDA GPU" in capsys.readouterr().err


# ---------------------------------------------------------------------------- what the project reads of it
def test_probe_gemms_are_their_shapes_mean_time(tmp_path) -> None:
    pd.DataFrame({"run": [1, 2, 1], "shape": "x", "unit": "block", "pass": "forward", "layers": 2,
                  "op": ["aten::mm", "aten::mm", "aten::addmm"],
                  "input_shapes": [json.dumps([[64, 32], [32, 16]]), json.dumps([[64, 32], [32, 16]]), json.dumps([[16], [64, 32], [32, 16]])],
                  "calls": [2, 4, 1], "self_us": [20.0, 60.0, 30.0]}).to_csv(tmp_path / "h100_probe_ops.csv", index=False)
    pd.DataFrame({"run": [1, 2, 1], "shape": "x", "kernel": ["gemm", "gemm", "memory"], "name": ["w", "w", "copy_bf16"],
                  "pass": ["forward"] * 3, "m": [64, 64, 100], "n": [16, 16, 1], "k": [32, 32, 1], "dtype": ["bfloat16", "bfloat16", "bf16"],
                  "median_s": [1e-5, 3e-5, 1e-6], "GBps": [np.nan, np.nan, 2000.0]}).to_csv(tmp_path / "h100_probe_kernels.csv", index=False)
    rows = probe_gemm_rows(tmp_path)
    fit = rows[rows["role"] == "fit"].iloc[0]
    assert (fit["m"], fit["n"], fit["k"]) == (64, 16, 32)
    assert fit["time_us"] == pytest.approx((10.0 + 15.0 + 30.0) / 3)          # per call, over every timing of the shape
    check = rows[rows["role"] == "check"].iloc[0]
    assert check["time_us"] == pytest.approx(20.0) and check["dtype"] == "bf16" and check["source"].startswith(PROBE_SOURCE)
    assert probe_memory_rows(tmp_path) == [("copy_bf16", pytest.approx(2000.0 / 3350.0), 3350.0)]
    assert len(probe_gemm_rows(tmp_path / "absent")) == 0 and probe_memory_rows(tmp_path / "absent") == []


def test_op_classes() -> None:
    assert [op_class(o) for o in ("aten::mm", "aten::addmm", "aten::_flash_attention_backward", "aten::mul", "sm90_xmma_gemm")] == \
        ["gemm", "gemm", "attention", "memory", None]


def test_the_simulated_units_are_the_probed_code() -> None:
    llama, mpt = spec_of(SHAPES["llama3_8b"].row(), "eager"), spec_of(SHAPES["mpt_7b"].row(), "eager")
    assert (llama.gated_mlp, llama.kv_heads, llama.position, llama.tied_embeddings) == (True, 8, "rope", False)
    assert (mpt.gated_mlp, mpt.norm, mpt.linear_bias, mpt.position) == (False, "layernorm", True, "learned")


@pytest.fixture(scope="module")
def committed() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    return probe_table(), class_table(), attention_table()


def test_the_committed_measurements_and_their_simulation(committed) -> None:
    units, classes, attention = committed
    assert len(units) and (units["measured_ms"] > 0).all() and (units["simulated_ms"] > 0).all()
    np.testing.assert_allclose(units["ratio"], units["simulated_ms"] / units["measured_ms"], rtol=1e-12)
    fb = units.set_index(["shape", "unit", "pass"])["simulated_ms"]
    for shape, unit, _ in fb.index:
        assert fb[(shape, unit, "forward_backward")] > fb[(shape, unit, "forward")]   # the backward costs something
    assert set(classes["class"]) == {"gemm", "attention", "memory"}
    assert not classes[(classes["unit"] == "head") & (classes["class"] == "attention")].size
    assert set(attention["backend"]) == {"default", "flash", "cudnn"}      # the flash_* context rows are between_table's
    between = between_table()
    assert len(between) and (between[["after_gemm", "after_copy"]] > 0).all().all()
    text = "\n".join(probe_lines(units, classes, attention, sustained_summary(), between))
    assert text.startswith("## One H100, measured by this project") and "nan" not in text
    assert math.isfinite(sustained_summary()["block_factor"])
