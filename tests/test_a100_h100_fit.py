"""The A100 / H100 kernel calibration (``harness/app/kernel_samples.py``, ``harness/app/kernel_fit.py``,
``harness/core/calibrated.py``): the measurements read into samples (every row fitted, checked or
left out with a note; FlashAttention-2's FLOP convention), the attention features, the fit of
samples of two kernels and of borrowed flags, the efficiency ceiling, the committed table as a
fresh fit reproduces it (predictions and held-out errors, never parameter digits), and the cost
model: which fit each device, math mode and class reads, a known measurement of every class
costed within its class's error, the measured bandwidth and launch interval, the report's labels.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.app.compose import compose
from harness.app.kernel_fit import BORROWED_FLAGS, LAUNCH_T0, fit_model, memory_fit, split_indices
from harness.app.kernel_samples import (A100_H100_DATA, PREDICTABLE_INPUTS, PROBE_SOURCE, STREAM_DATASHEET_GBPS, STREAM_FITTED,
                                        SampleError, Samples, attention_samples, gemm_samples, input_factors, memory_rows, probe_gemm_rows,
                                        probe_memory_rows, PROBE_STREAM)
from harness.app.run import build
from harness.core.calibrated import CalibratedCostModel, CalibrationError
from harness.core.costs import AnalyticalCostModel
from harness.core.kernel_model import (ATTN_FLAGS, FALLBACK, KNOTS, MATH_FITS, REFERENCE_MEM_BW_GBPS, REFERENCE_PEAK_TFLOPS, KernelModel,
                                       attention_features, fit_source, load_table)
from harness.core.kernels import ATTN, GEMM, MEM, NCOLS, KernelTable
from harness.core.precision import MATH
from tests.kernel_fit_helpers import assert_same_fit

GEMM_CSV = A100_H100_DATA / "gemm.csv"
#: a cluster whose devices are each measured board (A100 of NVIDIA's plot: 40 GB SXM4; H100 SXM5 80 GB)
BOARDS = {"A100": ["cluster=dgx_a100"], "H100": ["cluster=dgx_h100"], "A100-80GB": ["cluster=dgx_a100", "cluster/device=a100_sxm4_80gb"],
          "H100-96GB": ["cluster=dgx_h100", "cluster/device=h100_sxm5_96gb"], "H200": ["cluster=dgx_h100", "cluster/device=h200_sxm"],
          "V100": ["cluster=dgx1_v100"]}


def costs_on(board: str) -> CalibratedCostModel:
    costs = build(compose(["model=lenet5", *BOARDS[board]]))[2]
    assert isinstance(costs, CalibratedCostModel)
    return costs


def table(rows: list[tuple[int, list[float], str]]) -> KernelTable:
    """One node with a kernel per (kind, dims, math name) row."""
    n = len(rows)
    dims = [list(r[1]) + [0] * (NCOLS - len(r[1])) for r in rows]
    return KernelTable(np.zeros(n), [r[0] for r in rows], dims, [-1] * n, [MATH.index(r[2]) for r in rows], [False] * n)


@pytest.fixture(scope="module")
def samples() -> dict[tuple[str, str, str], Samples]:
    gemm, _, _ = gemm_samples()
    return {**gemm, **attention_samples()}


# ---------------------------------------------------------------------------- the measurements
def test_every_gemm_row_is_fitted_checked_or_left_out_with_a_note() -> None:
    fit, check, notes = gemm_samples()
    df = pd.read_csv(GEMM_CSV)
    no_dims = int(df[["m", "n", "k"]].isna().any(axis=1).sum())
    assert no_dims == 12 and any(f"{no_dims} rows without m, n, k" in n for n in notes)
    probe = probe_gemm_rows()
    assert sum(len(s.time_s) for s in fit.values()) + sum(len(s.time_s) for s in check.values()) + no_dims == len(df) + len(probe)
    # this project's probe: its in-situ BF16 GEMMs are fitted, its isolated ones (BF16 and FP8) checked
    for role, into in (("fit", fit), ("check", check)):
        mine = probe[probe["role"] == role]
        for prec in ("bf16", "fp8"):
            labels = into.get(("H100", prec, "gemm"), Samples(np.zeros((0, 3)), np.zeros((0, 0)), np.zeros(0), np.zeros(0), [])).source
            want = int(mine["dtype"].str.startswith(prec).sum())
            assert sum(s.startswith(PROBE_SOURCE) for s in labels) == want
    assert set(fit) == {("A100", p, "gemm") for p in ("bf16", "fp16", "tf32", "fp32")} | {("H100", p, "gemm") for p in ("bf16", "tf32", "fp8")}
    # H800 FP8 rows (the H100's SMs) train the H100 FP8 fit; PCIe, H200, GH200 and the H100's FP16 rows are checks
    h800 = int((df["gpu"] == "H800").sum())
    assert sum(lab.startswith("H800 ") for lab in fit[("H100", "fp8", "gemm")].label) == h800 == 28
    checked = [lab for s in check.values() for lab in s.label]
    assert sum(lab.startswith(("H200 ", "GH200 ")) for lab in checked) == 3
    assert sum(lab.startswith("H100 fp16 ") for lab in checked) == 6
    assert ("H100", "bf16", "gemm") in check and ("H100", "fp16", "gemm") not in fit
    for s in [*fit.values(), *check.values()]:
        assert (s.time_s > 0).all() and np.isfinite(s.time_s).all() and len(s.source) == len(s.label) == len(s.time_s)
        assert s.flags.shape == (len(s.time_s), 0)


def test_a_gemm_sample_is_its_flops_at_the_measured_rate() -> None:
    fit, _, _ = gemm_samples()
    s = fit[("A100", "tf32", "gemm")]  # (the 16-bit rows of this source: brought to random inputs, below)
    i = s.label.index("A100 tf32 gemm 1x4096x4096x4096")
    df = pd.read_csv(GEMM_CSV)
    tf = float(df[(df["gpu"] == "A100") & (df["dtype"] == "tf32") & (df["m"] == 4096) & (df["n"] == 4096)]["tflops"].iloc[0])
    assert s.flops[i] == 2 * 4096**3 and s.time_s[i] == pytest.approx(2 * 4096**3 / (tf * 1e12), rel=1e-12)
    g = fit[("H100", "fp8", "gemm")]  # a grouped GEMM: batch groups of m rows each, one GEMM of all of them
    j = g.label.index("H800 fp8_e4m3 (block-scaled) gemm 4x8192x4096x7168")
    np.testing.assert_array_equal(g.dims[j], [4 * 8192, 4096, 7168])


def test_predictable_input_rows_are_brought_to_random_inputs_at_their_shared_shape(tmp_path) -> None:
    """NVIDIA's launch figure (292 TFLOP/s at 8192^3) against the same shape on random-normal inputs
    (257): its 16-bit rows take 292 / 257 the time they read, its TF32 / FP32 rows and every other
    source stand as measured."""
    fit, _, notes = gemm_samples()
    df = pd.read_csv(GEMM_CSV)
    ref = pd.read_csv(A100_H100_DATA / "gemm_inputs.csv")
    randn = float(ref[ref["inputs"] == "randn"]["tflops"].iloc[0])
    plot = df["source"].str.startswith(next(iter(PREDICTABLE_INPUTS)))
    for prec, scaled in (("bf16", True), ("fp16", True), ("tf32", False), ("fp32", False)):
        s = fit[("A100", prec, "gemm")]
        i = s.label.index(f"A100 {prec} gemm 1x8192x8192x8192")
        tf = float(df[plot & (df["dtype"] == prec) & (df["m"] == 8192)]["tflops"].iloc[0])
        want_tf = randn if scaled else tf
        assert s.time_s[i] == pytest.approx(2 * 8192**3 / (want_tf * 1e12), rel=1e-12), prec
    assert input_factors(df)[(next(iter(PREDICTABLE_INPUTS)), "bf16")] == pytest.approx(257 / 292, rel=1e-12)
    j = fit[("A100", "bf16", "gemm")].label.index("A100 bf16 gemm 1x1024x10240x5120")  # MAMF: torch.randn, as measured
    assert fit[("A100", "bf16", "gemm")].time_s[j] == pytest.approx(2 * 1024 * 10240 * 5120 / 271.2e12, rel=1e-12)
    assert sum("brought to random-normal inputs" in n for n in notes) == 2
    # a reference without the source's shape is refused, naming the file
    for name in ("gemm.csv", "attention.csv", "membw.csv"):
        (tmp_path / name).write_bytes((A100_H100_DATA / name).read_bytes())
    ref.assign(m=4096).to_csv(tmp_path / "gemm_inputs.csv", index=False)
    with pytest.raises(SampleError, match="gemm_inputs.csv: no random-input A100 row"):
        gemm_samples(tmp_path)


def test_attention_samples_follow_flashattentions_flop_count() -> None:
    """FlashAttention-2's benchmark: 4 b h s^2 d FLOPs forward, half when causal, backward 2.5 times
    that; a forward + backward row is its two kernels."""
    att = attention_samples()
    assert set(att) == {("A100", "fp16", "attention"), ("H100", "fp16", "attention")}
    a = att[("A100", "fp16", "attention")]
    assert len(a.time_s) == 24 and a.then is not None and (a.then[2] > 0).all()
    i = a.label.index("A100 FA2 fwd+bwd causal d128 s2048")
    fwd = 4.0 * 8 * 16 * 2048**2 * 128 / 2  # batch 16k / s, 2048 / d heads
    assert a.flops[i] == fwd and a.then[2][i] == 2.5 * fwd
    assert a.time_s[i] == pytest.approx(3.5 * fwd / 155e12, rel=1e-12)  # the figure's 155 TFLOP/s
    np.testing.assert_array_equal(a.flags[i], [1, 0, 0])
    np.testing.assert_array_equal(a.then[1][i], [1, 0, 1])
    h = att[("H100", "fp16", "attention")]
    fwd_only = np.array([" fwd " in lab for lab in h.label])
    assert fwd_only.sum() == 36 and (h.then[2][fwd_only] == 0).all() and (h.then[2][~fwd_only] > 0).all()
    assert h.flags[:, ATTN_FLAGS.index("wide_head")].sum() == 12  # head size 256, forward only


def test_attention_features() -> None:
    dims, flags = attention_features(np.array([4096, 4096, 1024]), np.array([4096, 4096, 8192]), np.array([128, 256, 64]),
                                     np.array([1, 0, 1]), np.array([0, 1, 1]))
    np.testing.assert_array_equal(dims, [[2048, 2048, 128], [4096, 4096, 256], [512, 4096, 64]])
    np.testing.assert_array_equal(flags, [[1, 0, 0], [0, 1, 1], [1, 0, 1]])
    assert list(ATTN_FLAGS) == ["causal", "wide_head", "backward"]


def test_memory_rows_and_the_fit_are_the_geometric_mean_of_the_fitted_kernels() -> None:
    df = pd.read_csv(A100_H100_DATA / "membw.csv")
    fit, check = memory_rows()
    assert set(fit) == {"A100", "H100", "H200"}
    stream = df[df["benchmark"] == "gpu-stream"]
    probe = probe_memory_rows()
    assert sum(len(r.fraction) for r in fit.values()) + sum(len(r.fraction) for r in check.values()) == len(stream) + len(probe)
    # the probe's STREAM kernels on its H100 SXM5 are fitted with gpu-stream's, its other memory-bound kernels checked
    stream_probe = [f for name, f, _ in probe if name.split("_")[0] in PROBE_STREAM]
    assert len(stream_probe) == 8 and all(np.isclose(fit["H100"].fraction, f).any() for f in stream_probe)
    a = stream[stream["gpu"] == "A100"]
    want = [float(v) / STREAM_DATASHEET_GBPS[("A100", "80GB" if "80GB" in var else "40GB")]
            for v, var, k in zip(a["value"], a["gpu_variant"], a["kernel"]) if k in STREAM_FITTED]
    np.testing.assert_allclose(np.sort(fit["A100"].fraction), np.sort(want), rtol=1e-12)
    entries, rows = memory_fit()
    for fam, r in fit.items():
        tr, te = split_indices(len(r.fraction))
        assert entries[fam]["bw_fraction"] == pytest.approx(float(np.exp(np.log(r.fraction[tr]).mean())), rel=1e-12)
        assert (entries[fam]["train_rows"], entries[fam]["test_rows"]) == (len(tr), len(te))
    launches = df[(df["benchmark"] == "gpu-small-kernels") & df["config"].str.startswith("stream launches")].set_index("gpu")["value"]
    assert entries["A100"]["launch_us"] == float(launches["A100"])
    assert entries["H100"]["launch_us"] == entries["H200"]["launch_us"] == float(launches["H200"])  # no H100 measured
    assert {r["split"] for r in rows} == {"train", "test", "check"}


# ---------------------------------------------------------------------------- the fit
def test_fit_model_recovers_flags_from_samples_of_two_kernels() -> None:
    """Forward rows and forward + backward rows of one synthetic attention model: the fit finds
    its backward factor; with the factor and the fixed time held (borrowed, the launch interval),
    forward + backward rows alone suffice."""
    k = len(KNOTS) - 1
    inc = np.stack([np.full(k, 0.1), np.full(k, 0.1), np.full(k, 0.05)])
    true = KernelModel(np.log(0.7), 5e-6, inc, np.array([-0.1, -0.15, -0.12]))
    peak = 989e12
    rng = np.random.default_rng(4)
    n = 120
    s = np.round(2.0 ** rng.uniform(9, 14, n))
    d = rng.choice([64.0, 128.0, 256.0], n)
    causal = rng.random(n) < 0.5
    both = rng.random(n) < 0.5
    dims, flags = attention_features(s, s, d, causal, np.zeros(n))
    bdims, bflags = attention_features(s, s, d, causal, np.ones(n))
    fl = 4.0 * 32 * s * s * d * np.where(causal, 0.5, 1.0)
    then = (bdims, bflags, np.where(both, 2.5 * fl, 0.0))
    probe = Samples(dims, flags, fl, np.ones(n), [""] * n, then)
    sam = Samples(dims, flags, fl, probe.predict(true, peak), [""] * n, then)
    m = fit_model(sam, peak)
    np.testing.assert_allclose(m.flag_log, true.flag_log, atol=0.02)
    np.testing.assert_allclose(sam.predict(m, peak), sam.time_s, rtol=0.02)
    only_both = sam.take(np.flatnonzero(both))
    held = fit_model(only_both, peak, fixed={2: -0.12}, t0_s=5e-6)
    assert held.flag_log[2] == -0.12 and held.t0_s == pytest.approx(5e-6, rel=1e-12)
    np.testing.assert_allclose(only_both.predict(held, peak), only_both.time_s, rtol=0.02)
    assert np.isfinite(held.log_ceiling) and held.log_ceiling <= 0


def test_a_fit_never_gives_more_than_the_best_measured_efficiency(samples: dict[tuple[str, str, str], Samples]) -> None:
    """The ceiling is the highest efficiency the curves give a kernel the fit saw (forward and
    backward kernels of a forward + backward row alike), and no more than the best FLOP/s a row
    of one kernel was measured at; no dims, however large, get more."""
    for key in (("H100", "bf16", "gemm"), ("A100", "fp16", "attention")):
        s = samples[key]
        peak = REFERENCE_PEAK_TFLOPS[key[:2]] * 1e12
        tr, _ = split_indices(len(s.time_s))
        sub = s.take(tr)
        fixed = {2: -0.1} if key[2] == "attention" else None
        m = fit_model(sub, peak, fixed)
        uncapped = KernelModel(m.log_emax, m.t0_s, m.inc, m.flag_log)
        flags = sub.flags if m.flag_log.size else None
        raw = [uncapped.log_eff(sub.dims, flags)]
        if sub.then is not None:
            raw.append(uncapped.log_eff(sub.then[0], sub.then[1]))
        single = np.ones(len(sub.time_s), bool) if sub.then is None else sub.then[2] <= 0
        measured = np.log(np.max(sub.flops[single] / (peak * sub.time_s[single]))) if single.any() else np.inf
        assert m.log_ceiling == pytest.approx(min(float(np.max(np.concatenate(raw))), measured), rel=1e-12)
        assert (sub.predict(m, peak) >= sub.predict(uncapped, peak)).all()
        big = 2.0 ** np.random.default_rng(0).uniform(3, 20, size=(500, 3))
        bflags = np.zeros((500, m.flag_log.size)) if m.flag_log.size else None
        assert (m.log_eff(big, bflags) <= m.log_ceiling).all()
        assert (uncapped.log_eff(big, bflags) > m.log_ceiling).any()  # ... which the curves alone would pass
    assert np.exp(m.log_ceiling) < 1.0
    h = KernelModel.from_dict(load_table()["kernels"]["H100"]["bf16"]["gemm"])
    assert np.exp(h.log_ceiling) <= 794.5 / 989.4 + 1e-12  # never above the best H100 BF16 GEMM measured (MAMF)


@pytest.mark.parametrize("key", [("A100", "bf16", "gemm"), ("A100", "fp16", "gemm"), ("A100", "tf32", "gemm"), ("A100", "fp32", "gemm"),
                                 ("H100", "fp8", "gemm"), ("H100", "fp16", "attention"), ("A100", "fp16", "attention")])
def test_committed_a100_h100_classes_reproduce(samples: dict[tuple[str, str, str], Samples], key: tuple[str, str, str]) -> None:
    """A fresh fit of each class predicts the committed table's times and held-out error (the two
    large H100 GEMM classes: the slow test of tests/test_calibrated.py, with every class)."""
    committed = load_table()
    dev, prec, cls = key
    s = samples[key]
    peak = REFERENCE_PEAK_TFLOPS[(dev, prec)] * 1e12
    fixed = None
    if key in BORROWED_FLAGS:
        donor, flag = BORROWED_FLAGS[key]
        j = ATTN_FLAGS.index(flag)
        fixed = {j: KernelModel.from_dict(committed["kernels"][donor[0]][donor[1]][donor[2]]).flag_log[j]}
        assert committed["kernels"][dev][prec][cls]["borrowed_flags"] == {flag: "/".join(donor)}
    t0 = None
    if key in LAUNCH_T0:  # too long to show a fixed time: the family's launch interval
        t0 = committed["memory"][dev]["launch_us"] * 1e-6
        assert KernelModel.from_dict(committed["kernels"][dev][prec][cls]).t0_s == pytest.approx(t0, rel=1e-9)
    tr, te = split_indices(len(s.time_s))
    m = fit_model(s.take(tr), peak, fixed, t0)
    ref = committed["kernels"][dev][prec][cls]
    assert (ref["train_rows"], ref["test_rows"]) == (len(tr), len(te))
    assert ref["rests_on"] == s.rests_on()
    assert_same_fit(m, ref, s, peak, te, "/".join(key))


#: the held-out median error per class the committed fit reaches (the issue's goal: 5 %), and the
#: classes at the floor of their data (README: the H100 TF32 rows of XLA's table are not monotone in
#: their dims; the FP8 class rests on 29 rows of two kernel libraries; the BF16 class fits XLA's
#: microbenchmark table beside this project's in-situ GEMMs of a training step, which run about 5 %
#: slower at the large shapes both cover: 5.4-7.0 % over seeds 0-4) with what their spread over
#: other seeds' splits showed
GOAL = 0.05
AT_THE_FLOOR = {("H100", "tf32", "gemm"): 0.15, ("H100", "fp8", "gemm"): 0.08, ("H100", "bf16", "gemm"): 0.07}


def test_held_out_errors_as_committed() -> None:
    t = load_table()
    for dev in ("A100", "H100"):
        for prec, classes in t["kernels"][dev].items():
            for cls, e in classes.items():
                assert e["test_rows"] >= 7, (dev, prec, cls)
                assert e["test_median_abs_error"] <= AT_THE_FLOOR.get((dev, prec, cls), GOAL), (dev, prec, cls)
                assert e["test_p90_abs_error"] >= e["test_median_abs_error"]
    for fam, e in t["memory"].items():
        assert e["test_median_abs_error"] <= GOAL and 0.5 < e["bw_fraction"] < 1.0, fam


# ---------------------------------------------------------------------------- which fit a kernel reads
def test_fit_source_resolves_math_modes_classes_and_fallbacks() -> None:
    t = load_table()
    h100 = {"float32", "tf32", "float16", "bfloat16", "float8"}
    a100 = h100 - {"float8"}
    v100 = {"float32", "float16"}
    assert fit_source(t, "H100", h100, "bf16", "gemm") == ("H100", "bf16", "bfloat16", False)
    assert fit_source(t, "H100", h100, "fp16", "gemm") == ("H100", "bf16", "float16", False)   # the BF16 fit, same rate
    assert fit_source(t, "H100", h100, "fp8", "gemm") == ("H100", "fp8", "float8", False)
    assert fit_source(t, "H100", h100, "fp32", "gemm") == ("A100", "fp32", "float32", True)    # no H100 FP32 GEMM measured
    assert fit_source(t, "H100", h100, "bf16", "attention") == ("H100", "fp16", "bfloat16", False)
    assert fit_source(t, "H100", h100, "bf16", "conv_fwd") == ("V100", "fp16_mixed", "bfloat16", True)
    assert fit_source(t, "A100", a100, "tf32", "gemm") == ("A100", "tf32", "tf32", False)
    assert fit_source(t, "A100", a100, "fp16", "rnn") == ("V100", "fp16_mixed", "float16", True)
    assert fit_source(t, "A100", a100, "fp32", "attention") is None   # FlashAttention is 16-bit: the roofline
    assert fit_source(t, "V100", v100, "bf16", "gemm") == ("V100", "fp32", "float32", False)  # no BF16 on a V100
    assert fit_source(t, "V100", v100, "fp16", "attention") is None
    assert fit_source(t, "P100", {"float32"}, "fp16", "gemm") == ("P100", "fp16_pseudo", "float32", False)
    assert set(FALLBACK) <= set(MATH_FITS) and set(MATH_FITS) == {"P100", "V100", "A100", "H100"}


def test_a_variant_reads_its_familys_curves_at_its_own_peak_and_balance() -> None:
    """A100 80 GB: the A100 fit (measured on the 40 GB board) at dims / kappa, kappa the ratio of
    compute-to-bandwidth balances (1,555 / 2,039 GB/s); not extrapolated."""
    costs = costs_on("A100-80GB")
    spec = costs.cluster.devices[0].spec
    kt = table([(GEMM, [1, 2048, 512, 1024], "bf16")])
    kappa = (spec.peak_flops["bfloat16"] / spec.mem_bw) / (312e12 / (REFERENCE_MEM_BW_GBPS["A100"] * 1e9))
    assert kappa == pytest.approx(1555 / 2039)
    model = KernelModel.from_dict(load_table()["kernels"]["A100"]["bf16"]["gemm"])
    want = model.time(np.array([[2048.0, 512.0, 1024.0]]) / kappa, kt.flops(), spec.peak_flops["bfloat16"])[0]
    assert costs.kernel_times(kt, 0)[0] == pytest.approx(want, rel=1e-12)
    assert "extrapolated" not in costs.report()["devices"][spec.kind]


@pytest.mark.parametrize("board", ["A100", "A100-80GB", "H100", "H200"])
def test_no_kernel_is_faster_than_its_bytes_at_the_measured_bandwidth(board: str) -> None:
    """Where a GPU's memory-bound kernels are measured, a fitted kernel costs at least its
    operands' and output's bytes at that bandwidth plus the launch interval: eager attention's
    ``QK^T`` (K = 96: the GEMM curves, fitted to square and near-square matmuls, would give it the
    large-GEMM rate), a fused attention kernel; a large square GEMM stays compute-bound, well
    above the floor."""
    costs = costs_on(board)
    spec = costs.cluster.devices[0].spec
    mem = costs.table["memory"][costs.devices[spec.kind].get("memory", costs.devices[spec.kind]["ref"])]
    bw, launch = spec.mem_bw * float(mem["bw_fraction"]), float(mem["launch_us"]) * 1e-6
    thin = table([(GEMM, [384, 2048, 2048, 96], "bf16")])
    assert costs.kernel_times(thin, 0)[0] >= (launch + thin.nbytes()[0] / bw) * (1 - 1e-12)
    square = table([(GEMM, [1, 8192, 8192, 8192], "bf16")])
    assert costs.kernel_times(square, 0)[0] > 2 * (launch + square.nbytes()[0] / bw)
    flash = table([(ATTN, [64, 8192, 8192, 128, 1, 0, 1], "bf16")])
    assert costs.kernel_times(flash, 0)[0] > launch + flash.nbytes()[0] / bw


# ---------------------------------------------------------------------------- a known row per class
def _largest_row(s: Samples) -> int:
    return int(np.argmax(s.flops + (s.then[2] if s.then is not None else 0.0)))


@pytest.mark.parametrize("key, board, math", [
    (("A100", "bf16", "gemm"), "A100", "bf16"), (("A100", "fp16", "gemm"), "A100", "fp16"), (("A100", "tf32", "gemm"), "A100", "tf32"),
    (("A100", "fp32", "gemm"), "A100", "fp32"), (("H100", "bf16", "gemm"), "H100", "bf16"), (("H100", "tf32", "gemm"), "H100", "tf32"),
    (("H100", "fp8", "gemm"), "H100", "fp8")])
def test_a_measured_gemm_costs_within_its_classs_error(samples: dict[tuple[str, str, str], Samples], key: tuple[str, str, str],
                                                       board: str, math: str) -> None:
    """The largest measured GEMM of each class, as a kernel row on its measured board, costs its
    measurement within the class's committed 90th-percentile error (the cost model reads the
    fit the table says: its peak, dims and no transfer)."""
    s = samples[key]
    i = _largest_row(s)
    costs = costs_on(board)
    m, n, k = s.dims[i]
    t = costs.kernel_times(table([(GEMM, [1, m, n, k], math)]), 0)[0]
    p90 = load_table()["kernels"][key[0]][key[1]][key[2]]["test_p90_abs_error"]
    assert abs(t / s.time_s[i] - 1) <= p90, s.label[i]
    assert f"{key[0]}/{key[1]} gemm" in costs.report()["devices"][costs.cluster.devices[0].spec.kind]


@pytest.mark.parametrize("family", ["A100", "H100"])
def test_a_measured_attention_costs_within_its_classs_error(samples: dict[tuple[str, str, str], Samples], family: str) -> None:
    """FlashAttention-2 forward + backward, causal, head size 128, 4k tokens: the two ATTN rows a
    transformer block writes (bf16), within the class's 90th-percentile error of the figure."""
    s = samples[(family, "fp16", "attention")]
    i = s.label.index(f"{family} FA2 fwd+bwd causal d128 s4096")
    bh = s.flops[i] / (4.0 * 4096 * 4096 * 128 * 0.5)
    costs = costs_on(family)
    kt = table([(ATTN, [bh, 4096, 4096, 128, 1, 0, 1], "bf16"), (ATTN, [bh, 4096, 4096, 128, 1, 1, 1], "bf16")])
    assert kt.flops().sum() == pytest.approx(s.flops[i] + s.then[2][i], rel=1e-12)
    t = costs.kernel_times(kt, 0)[0]
    p90 = load_table()["kernels"][family]["fp16"]["attention"]["test_p90_abs_error"]
    assert abs(t / s.time_s[i] - 1) <= p90
    assert f"{family}/fp16 attention (FlashAttention-2) at the bfloat16 peak" in costs.report()["devices"][costs.cluster.devices[0].spec.kind]


@pytest.mark.parametrize("board, family, datasheet, measured", [("A100-80GB", "A100", 2039.0, 1732.0), ("H200", "H200", 4800.0, 3165.0)])
def test_a_memory_bound_kernel_runs_at_the_measured_bandwidth(board: str, family: str, datasheet: float, measured: float) -> None:
    """gpu-stream's scale kernel (one load, one store) over 4 GiB: the launch interval plus its bytes
    at the family's fraction of the board's datasheet bandwidth, within the fit's held-out error of
    the measured bandwidth."""
    costs = costs_on(board)
    spec = costs.cluster.devices[0].spec
    assert spec.mem_bw == datasheet * 1e9
    mem = load_table()["memory"][family]
    nbytes = 4 * 2**30
    t = costs.kernel_times(table([(MEM, [nbytes], "fp32")]), 0)[0]
    assert t == pytest.approx(mem["launch_us"] * 1e-6 + nbytes / (mem["bw_fraction"] * spec.mem_bw), rel=1e-12)
    assert abs(nbytes / t / (measured * 1e9) - 1) <= mem["test_p90_abs_error"]
    assert f"{family} memory-bound" in costs.report()["devices"][spec.kind]


# ---------------------------------------------------------------------------- the cost model's other readings
def test_math_modes_on_an_h100() -> None:
    costs = costs_on("H100")
    t = load_table()["kernels"]
    kt = table([(GEMM, [1, 4096, 4096, 4096], "fp16"), (GEMM, [1, 4096, 4096, 4096], "bf16")])
    a, b = (costs.kernel_times(kt.take(np.array([i]), np.zeros(1)), 0)[0] for i in (0, 1))
    assert a == b  # FP16 reads the BF16 fit at the same peak
    d = np.array([[4096.0, 4096.0, 4096.0]])
    fp8 = costs.kernel_times(table([(GEMM, [1, 4096, 4096, 4096], "fp8")]), 0)[0]
    assert fp8 == pytest.approx(KernelModel.from_dict(t["H100"]["fp8"]["gemm"]).time(d, 2 * d.prod(1), 1978.9e12)[0], rel=1e-12)
    assert fp8 < 0.75 * b
    fp32 = costs.kernel_times(table([(GEMM, [1, 4096, 4096, 4096], "fp32")]), 0)[0]
    assert fp32 > 5 * b
    labels = costs.report()["devices"]["H100-SXM5-80GB"]
    assert "H100/bf16 gemm at the float16 peak" in labels and "H100/fp8 gemm at the float8 peak" in labels
    assert "A100/fp32 gemm at the float32 peak (extrapolated)" in labels


def test_an_fp8_kernel_on_a_gpu_without_fp8_is_refused() -> None:
    costs = costs_on("A100")
    with pytest.raises(CalibrationError, match="FP8 kernel on A100-SXM4-40GB, which has no FP8 tensor cores"):
        costs.kernel_times(table([(GEMM, [1, 512, 512, 512], "fp8")]), 0)


def test_attention_without_a_fit_is_the_roofline() -> None:
    """A V100 (no FlashAttention measured) and FP32 attention on an A100: the roofline's row times."""
    kt = table([(ATTN, [64, 2048, 2048, 128, 1, 0, 1], "fp16")])
    v100 = costs_on("V100")
    assert v100.kernel_times(kt, 0)[0] == pytest.approx(v100.analytical.kernel_row_times(kt, 0)[0], rel=1e-12)
    assert "analytical roofline (attention kernels)" in v100.report()["devices"]["V100-SXM2-16GB"]
    a100 = costs_on("A100")
    kt32 = table([(ATTN, [64, 2048, 2048, 128, 1, 0, 1], "fp32")])
    mem = load_table()["memory"]["A100"]
    spec = a100.cluster.devices[0].spec
    roof = AnalyticalCostModel(a100.cluster, efficiency={"attention": 0.6}, mem_efficiency=mem["bw_fraction"], launch_us=mem["launch_us"])
    assert a100.kernel_times(kt32, 0)[0] == pytest.approx(roof.kernel_row_times(kt32, 0)[0], rel=1e-12)
    assert "analytical roofline (attention kernels)" in a100.report()["devices"][spec.kind]


def test_the_torchtitan_h100_reads_the_h100_fits_at_its_own_bandwidth() -> None:
    costs = costs_on("H100-96GB")
    spec = costs.cluster.devices[0].spec
    assert spec.kind == "H100-SXM-96GB-HBM2e-500W" and costs.calibrated(spec.kind)
    mem = load_table()["memory"]["H100"]
    assert costs.kernel_times(table([(MEM, [1e9], "bf16")]), 0)[0] == pytest.approx(
        mem["launch_us"] * 1e-6 + 1e9 / (mem["bw_fraction"] * 2400e9), rel=1e-12)
    costs.kernel_times(table([(GEMM, [1, 8192, 8192, 8192], "bf16")]), 0)
    assert "extrapolated" not in costs.report()["devices"][spec.kind]


def test_layer_graph_layers_without_kernels_use_the_measured_bandwidth() -> None:
    lg = build(compose(["model=alexnet", "model.batch_size=8"]))[0].layer_graph()
    costs = costs_on("A100")
    mem = load_table()["memory"]["A100"]
    roof = AnalyticalCostModel(costs.cluster, efficiency=dict(costs.efficiency), mem_efficiency=mem["bw_fraction"], launch_us=mem["launch_us"])
    fwd, bwd = costs.layer_times(lg, 0)
    rf, rb = roof.layer_times(lg, 0)
    other = ~np.isin(np.array(lg.kinds), ("conv2d", "linear"))
    np.testing.assert_allclose(fwd[other], rf[other], rtol=1e-12)
    np.testing.assert_allclose(bwd[other], rb[other], rtol=1e-12)
