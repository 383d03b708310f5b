"""The DeepBench kernel fits (``harness/kernel_fit.py``) and the calibrated cost model
(``harness/core/calibrated.py``); the A100 / H100 fits: tests/test_a100_h100_fit.py.

Pins, for the fit: the monotone efficiency curves, recovery of a known model from noise-free
samples, the seeded 70/30 split, the rows ``load_samples`` leaves out, the committed table
(``harness/data/kernel_calibration.json``) as a fresh fit reproduces its predictions and errors (not
its parameters' last digits, which depend on the CPU and its BLAS), the all-reduce fits
and ``load_table``'s errors.  For the cost model: which fit a device and math mode use
(measured, extrapolated with ``kappa``, or the roofline for a CPU) and the report's labels, a
row's time from its fit, the data-parallel invariant ``t(f) >= f t(1)`` on captured graphs,
faster hardware and math being faster, the Winograd flag, the fitted all-reduce on DeepBench's
own cluster, and layer-graph times.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from harness.app.compose import compose
from harness.core.calibrated import CalibratedCostModel, CalibrationError
from harness.core.capture import TensorSpec, capture
from harness.core.costs import AnalyticalCostModel
from harness.core.fabric import Group, collective_time, fabric_of, placed_collective_time, placement_of
from harness.core.graph import OpGraph
from harness.app.kernel_fit import GPU_DATA, Samples, all_samples, allreduce_fit, fit_all, fit_model, load_samples, split_indices
from harness.core.kernel_model import (CONV_FLAGS, KNOTS, REFERENCE_MEM_BW_GBPS, REFERENCE_PEAK_TFLOPS, TABLE, TABLE_FORMAT, FitError,
                                  KernelModel, conv_flags, load_table, monotone_curve)
from harness.core.kernels import CONV_FWD, GEMM, MEM
from harness.core.nccl_calibration import PCIE
from harness.core.precision import BF16, FP16, FP32, TF32
from harness.app.run import build
from tests.helpers import kernel_graph
from tests.kernel_fit_helpers import ERROR_ABS, assert_same_fit

ZOO: dict[str, list[str]] = {
    "lenet5": ["model=lenet5", "model.batch_size=8"],
    "alexnet": ["model=alexnet", "model.batch_size=8"],
    "resnet50": ["model=resnet50", "model.batch_size=4"],
    "nmt": ["model=nmt", "model.batch_size=4", "model.module.hidden_size=32", "model.module.embed_dim=32",
            "model.vocab=64", "model.src_len=3", "model.tgt_len=3", "model.module.num_layers=2"],
}
GPU_CLUSTERS = ("dgx1_p100", "dgx1_v100", "dgx_h100")
CSV = GPU_DATA


def costs_on(cluster: str, *extra: str) -> Any:
    return build(compose(["model=lenet5", f"cluster={cluster}", *extra]))[2]


def zoo_graph(name: str, precision: str) -> OpGraph:
    cfg = compose(ZOO[name] + [f"precision={precision}"])
    return build(cfg)[0].op_graph(**cfg.graph)  # memoised per configuration by TorchModel


@pytest.fixture(scope="module")
def graphs() -> dict[tuple[str, str], OpGraph]:
    return {(n, p): zoo_graph(n, p) for n in ZOO for p in ("fp32", "amp_fp16")}


class MLP(nn.Module):
    """GEMM-heavy: three 1024-wide linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@pytest.fixture(scope="module")
def mlp() -> dict[str, OpGraph]:
    return {p: capture(MLP, [TensorSpec((1024,))], TensorSpec((), "int64", 16), batch_size=256, name="mlp", precision=p)
            for p in ("fp32", "tf32", "amp_fp16")}


def fitted(ref: str, prec: str, cls: str) -> KernelModel:
    return KernelModel.from_dict(load_table()["kernels"][ref][prec][cls])


# ---------------------------------------------------------------------------- the curves and the fit
def test_monotone_curve_shape() -> None:
    inc = np.random.default_rng(3).uniform(0.0, 0.4, len(KNOTS) - 1)
    x = np.linspace(-2.0, 18.0, 401)
    f = monotone_curve(x, inc)
    assert (np.diff(f) >= -1e-12).all()
    assert (f[x >= KNOTS[-1]] == 0.0).all()
    for j, k in enumerate(KNOTS):
        assert monotone_curve(np.array([k]), inc)[0] == pytest.approx(-inc[j:].sum(), abs=1e-12)
    # below the first knot, each halving of the dim costs a factor 2 of efficiency
    f0 = monotone_curve(np.array([KNOTS[0]]), inc)[0]
    for d in (1.0, 2.0, 3.0):
        assert monotone_curve(np.array([KNOTS[0] - d]), inc)[0] == pytest.approx(f0 - d * np.log(2.0), abs=1e-12)
    assert (monotone_curve(x, np.zeros(len(KNOTS) - 1))[x >= KNOTS[0]] == 0.0).all()


def synthetic_samples(model: KernelModel, n: int, peak: float, seed: int, nflags: int = 0) -> Samples:
    rng = np.random.default_rng(seed)
    dims = np.round(2.0 ** rng.uniform(3.0, 14.5, size=(n, 3)))
    flags = (rng.random((n, nflags)) < 0.3).astype(np.float64)
    flops = 2.0 * dims.prod(axis=1)
    return Samples(dims, flags, flops, model.time(dims, flops, peak, flags if nflags else None), [""] * n)


@pytest.mark.parametrize("nflags", [0, len(CONV_FLAGS)])
def test_fit_model_recovers_a_known_model(nflags: int) -> None:
    k = len(KNOTS) - 1
    # constant increments per curve: the smoothness penalty is zero at the true model
    inc = np.stack([np.full(k, 0.1), np.full(k, 0.05), np.full(k, 0.15)])
    flag_log = np.array([0.5, 0.3, -0.2, -0.4, -0.1, -0.6])[:nflags]
    true = KernelModel(np.log(0.8), 4e-6, inc, flag_log)
    peak = 15.7e12
    train = synthetic_samples(true, 150, peak, seed=1, nflags=nflags)
    model = fit_model(train, peak)
    assert model.flag_log.shape == (nflags,)
    test = synthetic_samples(true, 60, peak, seed=2, nflags=nflags)
    pred = model.time(test.dims, test.flops, peak, test.flags if nflags else None)
    np.testing.assert_allclose(pred, test.time_s, rtol=0.02)
    assert model.log_emax == pytest.approx(np.log(0.8), abs=0.02)
    assert model.t0_s == pytest.approx(4e-6, rel=0.05)
    if nflags:
        np.testing.assert_allclose(model.flag_log, flag_log, atol=0.02)


def test_kernel_model_dict_round_trip() -> None:
    m = fitted("V100", "fp32", "conv_fwd")
    back = KernelModel.from_dict(json.loads(json.dumps(m.to_dict())))
    dims = np.array([[1024.0, 64.0, 576.0], [8.0, 8.0, 8.0]])
    flags = conv_flags(np.array([3, 1]), np.array([3, 1]), np.array([1, 2]), np.array([1, 2]), np.array([64, 3]))
    np.testing.assert_allclose(back.time(dims, 2 * dims.prod(1), 15.7e12, flags), m.time(dims, 2 * dims.prod(1), 15.7e12, flags))
    assert m.log_emax <= 0 and (m.inc >= 0).all() and m.t0_s > 0


def test_split_indices_is_a_seeded_70_30_partition() -> None:
    for n in (10, 159, 94):
        tr, te = split_indices(n)
        tr2, te2 = split_indices(n)
        np.testing.assert_array_equal(tr, tr2)
        np.testing.assert_array_equal(te, te2)
        assert len(np.intersect1d(tr, te)) == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), np.arange(n))
        assert len(tr) == round(0.7 * n) and (np.diff(tr) > 0).all() and (np.diff(te) > 0).all()
    assert not np.array_equal(split_indices(159, seed=1)[0], split_indices(159)[0])


def test_conv_flags() -> None:
    r = np.array([1, 3, 5, 1, 7, 3, 3])
    s = np.array([1, 3, 5, 7, 1, 3, 1])
    st = np.array([1, 1, 1, 1, 1, 2, 2])
    c = np.array([64, 64, 64, 64, 64, 64, 3])
    f = conv_flags(r, s, st, st, c)
    assert list(CONV_FLAGS) == ["winograd3x3", "winograd5x5", "spatial", "strided1x1", "strided", "narrow"]
    np.testing.assert_array_equal(f, [[0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0],
                                      [0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1]])


def test_load_samples_notes_the_rows_left_out() -> None:
    samples, notes = load_samples()
    gemm = pd.read_csv(CSV / "deepbench_gemm.csv")
    conv = pd.read_csv(CSV / "deepbench_conv.csv")
    no_time = int(pd.to_numeric(gemm["time_msec"], errors="coerce").isna().sum())
    na_cells = int((conv["wrt_inputs_msec"].astype(str).str.startswith("N/A")).sum())
    assert (no_time, na_cells) == (4, 20)
    assert any("deepbench_gemm.csv" in n and f"{no_time} rows without a time" in n for n in notes)
    assert any("deepbench_conv.csv" in n and f"{na_cells} conv_bwd_data cells" in n for n in notes)
    assert sum(len(s.time_s) for k, s in samples.items() if k[2] == "gemm") == len(gemm) - no_time
    assert sum(len(s.time_s) for k, s in samples.items() if k[2] == "conv_bwd_data") == len(conv) - na_cells
    assert sum(len(s.time_s) for k, s in samples.items() if k[2] == "conv_fwd") == len(conv)
    assert set(samples) == {(d, p, c) for d, p in REFERENCE_PEAK_TFLOPS if d in ("P100", "V100") for c in
                            ("gemm", "conv_fwd", "conv_bwd_data", "conv_bwd_filter", "rnn")}
    for s in samples.values():
        assert (s.time_s > 0).all() and np.isfinite(s.time_s).all() and (s.flops > 0).all()
        assert len(s.label) == len(s.time_s) == len(s.dims)
    g = samples[("V100", "fp32", "gemm")]
    i = g.label.index("gemm 1760x16x1760")
    assert g.flops[i] == 2 * 1760 * 16 * 1760


def test_load_samples_reports_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FitError, match="cannot read the DeepBench files"):
        load_samples(tmp_path)


def test_committed_table_reproduces_cheap_classes() -> None:
    """A fresh fit of the P100 / V100 GEMM classes (a fraction of a second each) predicts the
    committed table's times and errors (not its parameters' last digits, which depend on the CPU
    and BLAS); the A100 / H100 classes: tests/test_a100_h100_fit.py."""
    table = load_table()
    samples, _ = load_samples()
    for (dev, prec), peak in REFERENCE_PEAK_TFLOPS.items():
        if (dev, prec, "gemm") not in samples:
            continue
        s = samples[(dev, prec, "gemm")]
        tr, te = split_indices(len(s.time_s))
        m = fit_model(s.take(tr), peak * 1e12)
        ref = table["kernels"][dev][prec]["gemm"]
        assert (ref["train_rows"], ref["test_rows"]) == (len(tr), len(te))
        assert_same_fit(m, ref, s, peak * 1e12, te, f"{dev}/{prec}/gemm")
        assert ref["test_median_abs_error"] < 0.1


def test_the_prediction_check_tells_fits_apart() -> None:
    """The check above fails for a fit that is off by more than its tolerance: t0 doubled, or the
    efficiency 1 % lower."""
    table = load_table()
    samples, _ = load_samples()
    s = samples[("V100", "fp32", "gemm")]
    ref = table["kernels"]["V100"]["fp32"]["gemm"]
    peak = REFERENCE_PEAK_TFLOPS[("V100", "fp32")] * 1e12
    _, te = split_indices(len(s.time_s))
    good = KernelModel.from_dict(ref)
    assert_same_fit(good, ref, s, peak, te, "itself")
    for bad in (KernelModel(good.log_emax, 2 * good.t0_s, good.inc, good.flag_log, good.log_ceiling),
                KernelModel(good.log_emax + np.log(0.99), good.t0_s, good.inc, good.flag_log, good.log_ceiling + np.log(0.99))):
        with pytest.raises(AssertionError):
            assert_same_fit(bad, ref, s, peak, te, "perturbed")


@pytest.mark.slow
def test_committed_table_equals_a_fresh_fit() -> None:
    """Every class of a fresh fit predicts the committed table's times and errors (held-out and
    check rows); everything that is not fitted (sizes, notes, seed, the rows each class rests on)
    is the same, and the closed-form fits (all-reduce, memory bandwidth) are equal."""
    fresh, rows = fit_all(progress=False)
    committed = load_table()
    fresh = json.loads(json.dumps(fresh))
    assert set(fresh) == set(committed)
    for key in set(fresh) - {"kernels", "allreduce", "memory"}:
        assert fresh[key] == committed[key], key
    samples, checks, _ = all_samples()
    for (dev, prec, cls), s in samples.items():
        got, want = fresh["kernels"][dev][prec][cls], committed["kernels"][dev][prec][cls]
        assert set(got) == set(want) and (got["train_rows"], got["test_rows"]) == (want["train_rows"], want["test_rows"])
        assert got["rests_on"] == want["rests_on"]
        _, te = split_indices(len(s.time_s))
        peak = REFERENCE_PEAK_TFLOPS[(dev, prec)] * 1e12
        assert_same_fit(KernelModel.from_dict(got), want, s, peak, te, f"{dev}/{prec}/{cls}")
        for key in ("test_p90_abs_error", "check_median_abs_error", "check_p90_abs_error"):
            if key in want:
                assert got[key] == pytest.approx(want[key], abs=ERROR_ABS), (dev, prec, cls, key)
    assert {k for k in checks} <= {(d, p, c) for d in committed["kernels"] for p in committed["kernels"][d]
                                   for c in committed["kernels"][d][p]}
    assert set(fresh["memory"]) == set(committed["memory"])
    for fam, f in fresh["memory"].items():  # a geometric mean: stable to rounding
        for key, v in f.items():
            want = committed["memory"][fam][key]
            assert v == (pytest.approx(want, rel=1e-9) if isinstance(v, float) else want), (fam, key)
    assert fresh["allreduce"]["cluster"] == committed["allreduce"]["cluster"]
    for p, f in fresh["allreduce"]["fits"].items():  # a 2-parameter linear least squares: stable to rounding
        for key, v in f.items():
            assert v == pytest.approx(committed["allreduce"]["fits"][p][key], rel=1e-9), (p, key)
    assert {r["split"] for r in rows} == {"train", "test", "check", "leave-one-out"}


def test_allreduce_fit() -> None:
    fits, rows = allreduce_fit()
    assert set(fits) == {"2", "4", "8", "16"}
    assert [fits[p]["nodes"] for p in ("2", "4", "8", "16")] == [1, 1, 1, 2]
    for f in fits.values():
        assert 0 < f["eta"] <= 1 and f["alpha_us"] >= 0
    # the committed table holds these fits
    committed = load_table()["allreduce"]
    assert committed["cluster"] == "deepbench_p100"
    for p, f in fits.items():
        for key in ("alpha_us", "eta", "ring_GBps"):
            assert committed["fits"][p][key] == pytest.approx(f[key], rel=1e-9)
    df = pd.read_csv(CSV / "deepbench_allreduce.csv")
    assert len(rows) == len(df)
    err = {p: [abs(r["rel_error"]) for r in rows if r["kernel"].startswith(f"allreduce {p} GPUs")] for p in fits}
    assert float(np.median([abs(r["rel_error"]) for r in rows])) < 0.08
    for p in ("2", "4", "8"):  # one host: a few per cent
        assert float(np.median(err[p])) < 0.08, p
    assert float(np.median(err["16"])) < 0.3  # two hosts over InfiniBand: a looser fit


def test_load_table_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(FitError) as e:
        load_table(tmp_path / "missing.json")
    assert "does not exist" in str(e.value) and "missing.json" in str(e.value) and "\n" not in str(e.value)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "harness.kernel_calibration/1",\n "kernels": [1, 2,,]}')
    with pytest.raises(FitError, match=r"not valid JSON \(line 2, column \d+\)") as e:
        load_table(bad)
    assert "\n" not in str(e.value)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "harness.opgraph/1"}))
    with pytest.raises(FitError, match="format 'harness.opgraph/1'") as e:
        load_table(other)
    assert TABLE_FORMAT in str(e.value) and "\n" not in str(e.value)
    assert load_table(TABLE)["format"] == TABLE_FORMAT


# ---------------------------------------------------------------------------- which fit a device uses
def test_calibrated_is_the_default_cost_model() -> None:
    assert isinstance(build(compose(["model=lenet5"]))[2], CalibratedCostModel)


@pytest.mark.parametrize("cluster, kind, ref", [("dgx1_p100", "P100-SXM2-16GB", "P100"), ("dgx1_v100", "V100-SXM2-16GB", "V100"),
                                               ("dgx_a100", "A100-SXM4-40GB", "A100"), ("dgx_h100", "H100-SXM5-80GB", "H100")])
def test_report_labels_extrapolated_devices(graphs: dict[tuple[str, str], OpGraph], cluster: str, kind: str, ref: str) -> None:
    """Each label names the fit that costed a class; ``extrapolated`` only where the fit is another
    GPU's: nowhere on a P100 or V100, the convolutions (DeepBench's V100) on an A100 or H100,
    never their GEMMs or memory-bound kernels, measured on their own boards."""
    costs = costs_on(cluster)
    assert costs.report()["devices"] == {}
    costs.node_times(graphs[("resnet50", "amp_fp16")], 0)
    labels = costs.report()["devices"][kind].split("; ")
    for label in labels:
        own = label.startswith(f"{ref}/") or label.startswith(f"{ref} memory-bound")
        assert ("extrapolated" in label) == (not own), label
    assert any(lab.startswith(f"{ref}/") and " gemm " in lab for lab in labels)
    assert any(" conv_fwd " in lab for lab in labels)
    assert any(lab.startswith(f"{ref} memory-bound") for lab in labels) == (ref in ("A100", "H100"))
    assert costs.calibrated(kind)


def test_cpu_devices_fall_back_to_the_roofline(graphs: dict[tuple[str, str], OpGraph]) -> None:
    cfg = compose(["model=lenet5", "cluster=cpu2"])
    _, cluster, costs, _, _ = build(cfg)
    assert isinstance(costs, CalibratedCostModel)
    ana = AnalyticalCostModel(cluster, efficiency=dict(cfg.costs.efficiency), mem_efficiency=cfg.costs.mem_efficiency,
                              launch_us=cfg.costs.launch_us)
    for key in (("lenet5", "fp32"), ("resnet50", "amp_fp16")):
        g = graphs[key]
        for f in (1.0, 0.25):
            np.testing.assert_array_equal(costs.node_times(g, 1, f), ana.node_times(g, 1, f))
    assert costs.allreduce_time(1e6, [0, 1]) == ana.allreduce_time(1e6, [0, 1])
    kind = cluster.devices[0].spec.kind
    assert not costs.calibrated(kind)
    assert "no kernel fit for this device" in costs.report()["devices"][kind]


def test_a_graph_without_kernels_uses_the_roofline(graphs: dict[tuple[str, str], OpGraph]) -> None:
    import copy

    costs = costs_on("dgx1_v100")
    g = copy.copy(graphs[("lenet5", "fp32")])
    g.kernels = None
    np.testing.assert_array_equal(costs.node_times(g, 0), costs.analytical.node_times(g, 0))
    assert costs.report()["devices"]["V100-SXM2-16GB"] == "analytical roofline"
    assert not np.array_equal(costs.node_times(graphs[("lenet5", "fp32")], 0), costs.analytical.node_times(g, 0))


def test_unknown_reference_gpu_is_an_error() -> None:
    cluster = build(compose(["model=lenet5", "cluster=dgx1_v100"]))[1]
    with pytest.raises(CalibrationError, match="costs.devices.V100-SXM2-16GB.ref must be one of P100, V100, A100, H100, got 'K80'"):
        CalibratedCostModel(cluster, devices={"V100-SXM2-16GB": {"ref": "K80"}})
    with pytest.raises(CalibrationError, match="got None"):
        CalibratedCostModel(cluster, devices={"V100-SXM2-16GB": {}})
    with pytest.raises(CalibrationError, match="costs.devices.V100-SXM2-16GB.memory must be one of A100, H100, H200, got 'V100'"):
        CalibratedCostModel(cluster, devices={"V100-SXM2-16GB": {"ref": "V100", "memory": "V100"}})
    with pytest.raises(CalibrationError, match="costs.devices.V100-SXM2-16GB.kappa is not a key"):
        CalibratedCostModel(cluster, devices={"V100-SXM2-16GB": {"ref": "V100", "kappa": 2}})
    with pytest.raises(FitError, match="does not exist"):
        CalibratedCostModel(cluster, devices={"V100-SXM2-16GB": {"ref": "V100"}}, table="/nonexistent/table.json")


def test_a_row_costs_what_its_fit_says() -> None:
    """Measured devices: kappa 1 on the reference boards; the class, dims and peak a row reads."""
    v100 = costs_on("dgx1_v100")
    p100 = costs_on("dgx1_p100")
    conv = [8, 64, 28, 28, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1]  # N C H W K R S strides pads dilations groups
    g = kernel_graph([(GEMM, [1, 512, 256, 1024], 1, FP32), (GEMM, [1, 512, 256, 1024], 1, FP16),
                          (CONV_FWD, conv, 0, TF32), (MEM, [10_000_000], 0, FP32), (GEMM, [1, 512, 256, 1024], 1, BF16)])
    t = v100.node_times(g, 0)
    flops = g.kernels.flops()
    gd = np.array([[512.0, 256.0, 1024.0]])
    assert t[0] == pytest.approx(fitted("V100", "fp32", "gemm").time(gd, flops[:1], 15.7e12)[0], rel=1e-12)
    assert t[1] == pytest.approx(fitted("V100", "fp16_mixed", "gemm").time(gd, flops[1:2], 125e12)[0], rel=1e-12)
    cd = np.array([[8.0 * 28 * 28, 128.0, 64.0 * 9]])  # the implicit GEMM (N P Q, K, C R S)
    fl = conv_flags(np.array([3]), np.array([3]), np.array([1]), np.array([1]), np.array([64]))
    assert t[2] == pytest.approx(fitted("V100", "fp32", "conv_fwd").time(cd, flops[2:3], 15.7e12, fl)[0], rel=1e-12)
    assert t[3] == pytest.approx(5e-6 + 1e7 / (900e9 * 0.8), rel=1e-12)  # memory-bound: the roofline
    assert t[4] == t[0]  # no BF16 on a V100: FP32 speed
    # a P100 runs FP16 kernels as DeepBench's fp16_pseudo (FP16 data, FP32 math) at the FP32 peak
    tp = p100.node_times(g, 0)
    assert tp[1] == pytest.approx(fitted("P100", "fp16_pseudo", "gemm").time(gd, flops[1:2], 10.6e12)[0], rel=1e-12)
    assert tp[0] == pytest.approx(fitted("P100", "fp32", "gemm").time(gd, flops[:1], 10.6e12)[0], rel=1e-12)
    # a recurrent-cell GEMM reads the rnn fit
    r = kernel_graph([(GEMM, [1, 512, 256, 1024], 1, FP32)], rnn=True)
    assert v100.node_times(r, 0)[0] == pytest.approx(fitted("V100", "fp32", "rnn").time(gd, flops[:1], 15.7e12)[0], rel=1e-12)


@pytest.mark.parametrize("math, peak_key, ref_prec", [(FP32, "float32", "fp32"), (TF32, "tf32", "fp16_mixed"),
                                                      (FP16, "float16", "fp16_mixed"), (BF16, "bfloat16", "fp16_mixed")])
def test_extrapolated_kappa_is_the_compute_to_bandwidth_ratio(math: int, peak_key: str, ref_prec: str) -> None:
    """An H100 configured as extrapolated from the V100 (the transfer rule the A100 / H100 used
    before they were measured, and any unmeasured GPU's) reads the V100 curves at dims / kappa."""
    cluster = costs_on("dgx_h100").cluster
    costs = CalibratedCostModel(cluster, devices={"H100-SXM5-80GB": {"ref": "V100", "extrapolated": True}})
    spec = costs.cluster.devices[0].spec
    peak = spec.peak_flops[peak_key]
    kappa = (peak / spec.mem_bw) / (REFERENCE_PEAK_TFLOPS[("V100", ref_prec)] * 1e12 / (REFERENCE_MEM_BW_GBPS["V100"] * 1e9))
    assert kappa > 1  # an H100 needs bigger problems than a V100 for the same efficiency
    g = kernel_graph([(GEMM, [1, 2048, 512, 1024], 1, math)])
    dims = np.array([[2048.0, 512.0, 1024.0]])
    model = fitted("V100", ref_prec, "gemm")
    expected = model.time(dims / kappa, g.kernels.flops(), peak)[0]
    assert costs.node_times(g, 0)[0] == pytest.approx(expected, rel=1e-12)
    assert costs.node_times(g, 0)[0] != pytest.approx(model.time(dims, g.kernels.flops(), peak)[0], rel=1e-6)
    assert "(extrapolated)" in costs.report()["devices"]["H100-SXM5-80GB"]


# ---------------------------------------------------------------------------- graphs
@pytest.mark.parametrize("cluster", GPU_CLUSTERS)
@pytest.mark.parametrize("precision", ["fp32", "amp_fp16"])
def test_a_shard_never_runs_faster_than_its_share(graphs: dict[tuple[str, str], OpGraph], cluster: str,
                                                 precision: str) -> None:
    costs = costs_on(cluster)
    for name in ZOO:
        g = graphs[(name, precision)]
        full = costs.node_times(g, 0, 1.0)
        assert (full[~g.free] > 0).all() and (full[g.free] == 0).all()
        for f in (0.5, 0.25, 0.125):
            part = costs.node_times(g, 0, f)
            assert (part >= f * full * (1 - 1e-12)).all(), (name, f)
            assert (part <= full * (1 + 1e-12)).all(), (name, f)
        if name in ("alexnet", "resnet50"):  # not all launch overhead: a shard is cheaper
            assert costs.node_times(g, 0, 0.125).sum() < 0.9 * full.sum()


def test_faster_hardware_and_math_are_faster(graphs: dict[tuple[str, str], OpGraph], mlp: dict[str, OpGraph]) -> None:
    p100, v100, h100 = (costs_on(c) for c in GPU_CLUSTERS)
    for name in ZOO:
        g = graphs[(name, "fp32")]
        assert v100.node_times(g, 0).sum() < p100.node_times(g, 0).sum(), name
    # TF32 tensor cores against FP32 CUDA cores: faster on the MLP's small GEMMs (256 x 1024 x 1024, where the
    # measured TF32 kernels reach 40 TFLOP/s), three times faster on a large one
    assert h100.node_times(mlp["tf32"], 0).sum() < h100.node_times(mlp["fp32"], 0).sum()
    big = kernel_graph([(GEMM, [1, 4096, 4096, 4096], 1, TF32), (GEMM, [1, 4096, 4096, 4096], 1, FP32)])
    t_big = h100.node_times(big, 0)
    assert t_big[0] < t_big[1] / 3
    assert h100.node_times(mlp["fp32"], 0).sum() < v100.node_times(mlp["fp32"], 0).sum()
    assert v100.node_times(mlp["amp_fp16"], 0).sum() < v100.node_times(mlp["fp32"], 0).sum()
    assert (v100.node_times(graphs[("resnet50", "amp_fp16")], 0).sum()
            < 0.7 * v100.node_times(graphs[("resnet50", "fp32")], 0).sum())
    # TF32 is FP32 on a V100 (no TF32 units)
    np.testing.assert_array_equal(v100.node_times(mlp["tf32"], 0), v100.node_times(mlp["fp32"], 0))


@pytest.mark.parametrize("cluster, math", [("dgx1_p100", FP32), ("dgx1_v100", FP32), ("dgx1_v100", FP16),
                                           ("dgx1_p100", FP16)])
def test_a_3x3_convolution_beats_a_1x1_of_the_same_flops(cluster: str, math: int) -> None:
    # the same implicit GEMM (N P Q, K, C R S) = (32 * 28 * 28, 64, 576): only the filter differs
    w3 = [32, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1]
    p1 = [32, 576, 28, 28, 64, 1, 1, 1, 1, 0, 0, 1, 1, 1]
    g = kernel_graph([(CONV_FWD, w3, 0, math), (CONV_FWD, p1, 0, math)])
    flops = g.kernels.flops()
    assert flops[0] == flops[1]
    t = costs_on(cluster).node_times(g, 0)
    assert flops[0] / t[0] > 1.2 * flops[1] / t[1]


# ---------------------------------------------------------------------------- all-reduce
def test_allreduce_reproduces_deepbench() -> None:
    df = pd.read_csv(CSV / "deepbench_allreduce.csv")
    for nodes, group in df.groupby("nodes"):
        costs = costs_on("deepbench_p100", f"cluster.nodes={int(nodes)}")
        assert isinstance(costs, CalibratedCostModel)
        for p, rows in group.groupby("gpus"):
            rows = rows.sort_values("floats")
            devs = list(range(int(p)))
            t = np.array([costs.allreduce_time(4 * fl, devs) for fl in rows["floats"]])
            measured = rows["mean_ms"].to_numpy() * 1e-3
            np.testing.assert_allclose(t, measured, rtol=0.3)
            assert (np.diff(t) > 0).all()
    costs = costs_on("deepbench_p100")
    assert costs.allreduce_time(1e6, [3]) == 0.0 and costs.allreduce_time(0.0, [0, 1]) == 0.0


@pytest.mark.parametrize("cluster", [("dgx_a100", "cluster.nodes=2"), ("superpod_a100",), ("dgx_h100", "cluster.nodes=2"),
                                     ("dgx_h100", "cluster.nodes=2", "cluster.intra.nvls=false")])
def test_the_event_simulators_all_reduce_is_the_fabrics(cluster: tuple[str, ...]) -> None:
    """On the NCCL-calibrated clusters the event simulator's all-reduce (the calibrated cost
    model) is NCCL's model on the cluster's fabric, the one the stack simulator prices its
    collectives with: a whole node, two nodes, a strided group, every size; the report names
    the fabric's sources."""
    costs = costs_on(cluster[0], *cluster[1:])
    f = fabric_of(costs.cluster)
    g = f.gpus_per_node
    assert f.intra_source != "datasheet" and f.inter_source != "datasheet"
    for group in (Group(g), Group(2 * g), Group(2, g), Group(g, 2), Group(4)):
        devs = [k * group.stride for k in range(group.size)]
        for nbytes in (1e3, 3e5, 64e6, 2e9):
            assert costs.allreduce_time(nbytes, devs) == collective_time(f, "all_reduce", nbytes, group), (group, nbytes)
    rep = costs.report()["allreduce"]
    assert (rep["intra"]["source"], rep["inter"]["source"]) == (f.intra_source, f.inter_source)


def test_a_device_subset_is_priced_by_its_placement() -> None:
    """A subset of devices is priced where its hosts put it: on one host as the same number of
    ranks inside a node; across hosts over the NICs of the node where it has fewest ranks - two
    GPUs on two hosts are slower than two on one host over InfiniBand, and more ranks on every
    node (more NICs) are faster."""
    costs = costs_on("superpod_a100", "cluster.nodes=4")
    cl, f = costs.cluster, fabric_of(costs.cluster)
    for nbytes in (1e3, 1e6, 1e8, 1e9):
        assert costs.allreduce_time(nbytes, [1, 3, 6]) == collective_time(f, "all_reduce", nbytes, Group(3))
        assert costs.allreduce_time(nbytes, [5, 17]) == collective_time(f, "all_reduce", nbytes, Group(2, 8))
        assert costs.allreduce_time(nbytes, [5, 17]) > costs.allreduce_time(nbytes, [5, 6])
        irregular = costs.allreduce_time(nbytes, [0, 1, 2, 9])
        assert irregular == placed_collective_time(f, "all_reduce", nbytes, 4, placement_of(cl, [0, 1, 2, 9]))
        assert irregular > costs.allreduce_time(nbytes, [0, 1, 2, 3])
    assert costs.allreduce_time(1e9, [0, 1, 2, 9]) > costs.allreduce_time(1e9, [0, 1, 8, 9])  # 1 NIC on a node vs 2
    # the device order does not matter, only where the devices sit
    assert costs.allreduce_time(1e8, [9, 2, 0, 1]) == costs.allreduce_time(1e8, [0, 1, 2, 9])
    # more bytes never take less time; a bigger group on the same nodes never less either
    sizes = np.geomspace(1, 1e10, 60)
    for devs in ([0, 1], [0, 8], list(range(16)), list(range(32))):
        t = costs.allreduce_time(sizes, devs)
        assert (np.diff(t) >= 0).all(), devs
    assert (costs.allreduce_time(sizes, list(range(32))) >= costs.allreduce_time(sizes, list(range(16)))).all()


def test_an_array_of_sizes_is_priced_as_one_call_per_size() -> None:
    costs = costs_on("dgx_h100", "cluster.nodes=2")
    nb = np.array([4e6, 0.0, 1e3, 4e6, 7.5e8, -1.0, 1e3, 2.5e5])
    for devs in (list(range(8)), list(range(16)), [0, 9]):
        t = costs.allreduce_time(nb, devs)
        assert isinstance(t, np.ndarray) and t.shape == nb.shape
        assert t.tolist() == [costs.allreduce_time(float(x), devs) for x in nb]
        assert t[1] == t[5] == 0.0
    assert costs.allreduce_time(nb.reshape(2, 4), list(range(8))).shape == (2, 4)
    assert costs.allreduce_time(np.zeros(0), list(range(8))).shape == (0,)
    assert (costs.allreduce_time(nb, [3]) == 0.0).all() and costs.allreduce_time(1e6, [3]) == 0.0


def test_a_parameter_server_takes_the_roofline() -> None:
    """``costs.sync=ps`` is the roofline's parameter server; the calibrated report names no
    all-reduce source until one is priced on the fabric."""
    ps = costs_on("deepbench_p100", "costs.sync=ps")
    assert ps.allreduce_time(8e6, [0, 1, 2]) == ps.analytical.allreduce_time(8e6, [0, 1, 2])
    assert "allreduce" not in ps.report()
    ring = costs_on("deepbench_p100")
    assert "allreduce" not in ring.report()
    assert ring.allreduce_time(8e6, [0, 1, 2]) == collective_time(fabric_of(ring.cluster), "all_reduce", 8e6, Group(3))
    assert ring.report()["allreduce"]["intra"]["source"] == PCIE


# ---------------------------------------------------------------------------- layer graphs
@pytest.fixture(scope="module")
def alexnet_layers() -> Any:
    return build(compose(ZOO["alexnet"]))[0].layer_graph()


def test_layer_times_on_a_calibrated_gpu(alexnet_layers: Any) -> None:
    lg = alexnet_layers
    costs = costs_on("dgx1_v100")
    fwd, bwd = costs.layer_times(lg, 0)
    afwd, abwd = costs.analytical.layer_times(lg, 0)
    kinds = np.array(lg.kinds)
    gemm_like = np.isin(kinds, ("conv2d", "linear"))
    free = np.isin(kinds, ("input", "view"))
    assert gemm_like.sum() == 8 and free.sum() == 2
    assert (fwd[~free] > 0).all() and (bwd[~free] > 0).all() and (fwd[free] == 0).all()
    assert (fwd[gemm_like] != afwd[gemm_like]).all() and (bwd[gemm_like] != abwd[gemm_like]).all()
    np.testing.assert_array_equal(fwd[~gemm_like], afwd[~gemm_like])
    np.testing.assert_array_equal(bwd[~gemm_like], abwd[~gemm_like])
    # a shard of half the batch: never faster than its share
    hf, hb = costs.layer_times(lg, 0, 0.5)
    assert (hf >= 0.5 * fwd * (1 - 1e-12)).all() and (hb >= 0.5 * bwd * (1 - 1e-12)).all()
    # a convolution's shard is cheaper; the linear layers' GEMMs have m = 8 samples, at the curves' first
    # knot: below it a GEMM wastes the rest of its tile (efficiency falls with m), so half of it costs the same
    conv = kinds == "conv2d"
    assert (hf[conv] < fwd[conv]).all()
    assert (hf[gemm_like & ~conv] == pytest.approx(fwd[gemm_like & ~conv], rel=1e-9))
    # ``nodes``: the same figures for a subset, one fraction per entry
    idx = np.array([17, 1, 4, 21, 0])
    frac = np.array([0.5, 1.0, 0.25, 0.5, 1.0])
    sf, sb = costs.layer_times(lg, 0, frac, idx)
    assert sf.shape == sb.shape == (5,)
    for i, (v, f) in enumerate(zip(idx.tolist(), frac.tolist())):
        ef, eb = costs.layer_times(lg, 0, f)
        assert sf[i] == pytest.approx(ef[v], rel=1e-12) and sb[i] == pytest.approx(eb[v], rel=1e-12)
    # a CPU is the roofline
    cpu = costs_on("cpu2")
    for got, want in zip(cpu.layer_times(lg, 0, 0.5), cpu.analytical.layer_times(lg, 0, 0.5)):
        np.testing.assert_array_equal(got, want)


def test_layer_kernels_match_the_operator_graphs(alexnet_layers: Any) -> None:
    """A layer's forward kernels are the captured step's: the same time per convolution and linear
    layer; a linear layer's backward is its two gradient GEMMs."""
    lg = alexnet_layers
    cfg = compose(ZOO["alexnet"] + ["cluster=dgx1_v100"])
    source, _, costs, _, _ = build(cfg)
    g = source.op_graph(**cfg.graph)
    t = costs.node_times(g, 0)
    fwd, bwd = costs.layer_times(lg, 0)
    checked = 0
    for v, (name, kind) in enumerate(zip(lg.names, lg.kinds)):
        if kind not in ("conv2d", "linear"):
            continue
        ops = [u for u in range(g.num_nodes) if g.layer_names[g.layer[u]] == name and not g.free[u]]
        target = "aten.convolution.default" if kind == "conv2d" else "aten.addmm.default"
        (f_op,) = [u for u in ops if g.targets[u] == target]
        assert fwd[v] == pytest.approx(t[f_op], rel=1e-9), name
        if kind == "linear":
            mms = [u for u in ops if g.targets[u] == "aten.mm.default"]
            assert len(mms) == 2
            assert bwd[v] == pytest.approx(t[mms].sum(), rel=1e-9), name
        checked += 1
    assert checked == 8


def test_layer_times_follow_the_layer_graphs_precision(alexnet_layers: Any) -> None:
    half = build(compose(ZOO["alexnet"]))[0].layer_graph(precision="fp16")
    v100 = costs_on("dgx1_v100")
    assert half.meta["precision"] == "fp16" and half.kinds == alexnet_layers.kinds
    # tensor cores, but not for a first layer of 3 input channels (DeepBench's V100 FP16
    # convolutions of 1 or 3 channels are slower than its FP32 ones; the fit's "narrow" flag)
    wide = [v for v, k in enumerate(half.kinds) if k == "conv2d" and half.dims[v]["in_channel"] >= 8]
    narrow = [v for v, k in enumerate(half.kinds) if k == "conv2d" and half.dims[v]["in_channel"] < 8]
    assert len(wide) == 4 and len(narrow) == 1
    f32, b32 = v100.layer_times(alexnet_layers, 0)
    f16, b16 = v100.layer_times(half, 0)
    assert (f16[wide] < 0.7 * f32[wide]).all() and (b16[wide] < 0.7 * b32[wide]).all()
    assert f16[narrow[0]] > f32[narrow[0]]


def test_a_family_no_kernel_measured_keeps_the_1x1_curve() -> None:
    """DeepBench has no stride-1 filters other than 1x1, 3x3 and 5x5 (Inception's 1x7 / 7x1):
    their flag must stay at 0 whatever the split.  On seed 4's split of the P100 backward-data
    kernels the solver once let that unconstrained coefficient drift to exp(-40), which made
    Inception-v3's step 2.4 million times slower."""
    samples, _ = load_samples()
    s = samples[("P100", "fp32", "conv_bwd_data")]
    spatial = CONV_FLAGS.index("spatial")
    assert not s.flags[:, spatial].any()
    tr, _ = split_indices(len(s.time_s), seed=4)
    m = fit_model(Samples(s.dims[tr], s.flags[tr], s.flops[tr], s.time_s[tr], []), REFERENCE_PEAK_TFLOPS[("P100", "fp32")] * 1e12)
    assert m.flag_log[spatial] == 0.0
    assert np.all(np.abs(m.flag_log) < 5)  # every coefficient some sample pins stays finite and modest
