"""Fit the calibrated cost model's kernel efficiencies to real GPU measurements.

``python -m harness.kernel_fit`` reads ``harness/data/gpu/deepbench_*.csv`` (real kernels timed
on a P100 and a V100) and ``harness/data/gpu/a100_h100/`` (A100 / H100 GEMMs by precision,
FlashAttention-2, gpu-stream bandwidths and launch intervals: :mod:`harness.app.kernel_samples`;
both directories' READMEs give the sources), fits one model per GPU, precision and kernel class
on a seeded 70 % of the rows, reports the error on the other 30 % (and on the check rows: boards
and kernels costed by a fit, never fitted), and with ``--write`` stores the fitted parameters in
``harness/data/kernel_calibration.json`` - the table :class:`harness.core.calibrated.CalibratedCostModel`
reads, beside the GEMMs timed on single boards (``a100_h100/board_gemm.csv``), stored unfitted for
each board's own rate (:mod:`harness.core.board_rate`).  ``--spread 0 1 2 3 4`` refits on other
seeds' splits: how far the choice of held-out rows alone moves each class's error.  The fit is
deterministic: the same data and seed give the same table.

The kernel model (one per device, precision and class; ``F`` FLOPs, ``P`` the peak of the
precision's math, ``(m, n, k)`` the kernel's GEMM dims)::

    t = t0 + F / (P * e),   log e = min(log e_max + f_m(log2 m) + f_n(log2 n) + f_k(log2 k) + sum_j b_j x_j, log e_ceil)

Each ``f`` is piecewise linear in log2 of the dim, non-decreasing, zero from 2^14 up (a big
enough dim wastes nothing) and falling with slope 1 below 2^3 (a dim smaller than a tile
wastes the rest of the tile); ``x_j`` are 0/1 flags of the convolution's algorithm family
relative to 1x1 stride-1 filters (3x3 and 5x5 stride-1 filters, which cuDNN runs as Winograd
or FFT; other stride-1 filters; strided 1x1 and other strided filters; fewer than 8 input
channels), so a Winograd convolution may reach more than the peak in direct-convolution FLOPs.
``e_ceil`` is the best efficiency of a kernel the class was fitted on (:func:`ceiling`): the
curves never give a larger kernel more than any measured one reached.  Monotone in every dim,
the model never makes a shard of a kernel faster per FLOP than the whole kernel.  Classes and
their GEMM dims:

* ``gemm``: the GEMM's (m, n, k) (a batched or grouped GEMM's batch folded into m);
* ``conv_fwd`` / ``conv_bwd_data`` / ``conv_bwd_filter``: the implicit GEMM of each pass -
  (N*P*Q, K, C*R*S), (N*H*W, C, K*R*S), (K, C*R*S, N*P*Q) - with the filter flags;
* ``rnn``: the recurrent GEMM of one step of an LSTM / GRU / vanilla RNN layer as cuDNN runs
  it (DeepBench times the whole layer, the input projection excluded): forward (n, G*h, h)
  and backward-data (n, h, G*h) per step, backward-weights (G*h, h, n*T) once per layer, with
  G = 4, 3, 1 gates; a step's time includes its pointwise gate math;
* ``attention``: a fused FlashAttention-2 kernel at (s_q', s_kv', d) - the query and key lengths,
  halved when causal, and the head size (:func:`harness.core.kernel_model.attention_features`) -
  with the flags causal, head wider than 128 and backward; a forward + backward measurement is
  fitted as the sum of its two kernels, the A100's backward flag is the H100's
  (:data:`BORROWED_FLAGS`) and the fixed time of both the launch interval (:data:`LAUNCH_T0`).

Memory-bound kernels (:func:`memory_fit`): per device family, the fraction of the datasheet
bandwidth that gpu-stream's read-and-write kernels reach (a geometric mean over the 70 %) and
the measured launch interval.

Collectives: DeepBench's NCCL all-reduces on its 8-GPU PCIe servers (``cluster=deepbench_p100``)
are fitted per GPU count to the ring formula ``2(p-1) * alpha + 2(p-1)/p * bytes / (eta * B)``,
``B`` the ring bandwidth of that cluster (:meth:`harness.core.cluster.Cluster.ring_bandwidth`), and
reported leave-one-size-out; their efficiencies ``eta`` calibrate a PCIe node's fabric and the
InfiniBand across such nodes (:func:`harness.core.nccl_calibration.pcie_calibration`,
:func:`~harness.core.nccl_calibration.pcie_net_calibration`), on which NCCL's model prices the
all-reduces of both simulators.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from harness.app.kernel_samples import (Samples, attention_impl_rows, attention_samples, board_rows, gemm_samples, launch_intervals,
                                        memory_rows)
from harness.core.kernel_model import (
    ATTN_FLAGS, CONV_FLAGS, DATA, KNOTS, REFERENCE_MEM_BW_GBPS, REFERENCE_PEAK_TFLOPS, TABLE, TABLE_FORMAT, FitError, KernelModel,
    conv_flags,
)

GPU_DATA = DATA / "gpu"

SEED = 0
TRAIN_SHARE = 0.7
SMOOTH = 0.3  # penalty on the change of a curve's increments between knots (smoothness)
RNN_GATES = {"lstm": 4, "gru": 3, "vanilla": 1}
DEEPBENCH = "baidu-research/DeepBench"


def fit_model(s: Samples, peak: float, fixed: Mapping[int, float] | None = None, t0_s: float | None = None) -> KernelModel:
    """Least squares on log time (soft-L1, so a few odd kernels do not drag the curve), with a
    smoothness penalty on each curve's increments.  A flag no sample has keeps the unflagged
    curve (its coefficient is held at 0): the residuals do not depend on it, and a free
    parameter the data do not pin can drift anywhere in the solver's steps.  ``fixed`` holds
    flags at given values (a coefficient the samples cannot separate from the curves, taken
    from another fit), ``t0_s`` the fixed time per kernel (where no sample is small enough to
    show it).  A sample with a second kernel (:attr:`Samples.then`) is fitted on the sum of both
    kernels' times.  The fitted model's ceiling (:attr:`KernelModel.log_ceiling`,
    :func:`ceiling`) is the best efficiency of a kernel it was fitted on: beyond the measured
    kernels the curves do not extrapolate a higher one (a GEMM larger than any measured runs at
    the best measured FLOP/s, not at the peak the curves would approach)."""
    from scipy.optimize import least_squares

    k = len(KNOTS) - 1
    nflags = s.flags.shape[1]
    seen = s.flags.any(axis=0) if len(s.time_s) else np.zeros(nflags, dtype=bool)
    if s.then is not None and (s.then[2] > 0).any():
        seen = seen | s.then[1][s.then[2] > 0].any(axis=0)
    held = np.zeros(nflags)
    free = seen.copy()
    for j, v in (fixed or {}).items():
        held[j], free[j] = float(v), False
    log_t = np.log(s.time_s)
    n_curve = 2 + 3 * k
    lead = 1 if t0_s is not None else 0  # t0's slot, left out of the free parameters when held

    def full(th: np.ndarray) -> np.ndarray:
        head = np.concatenate([th[:1], [np.log(t0_s)], th[1:n_curve - 1]]) if lead else th[:n_curve]
        flag_log = held.copy()
        flag_log[free] = th[n_curve - lead:]
        return np.concatenate([head, flag_log])

    def resid(th: np.ndarray) -> np.ndarray:
        v = full(th)
        m = KernelModel.from_vector(v, nflags)
        raw = v[2:n_curve].reshape(3, k)
        return np.concatenate([np.log(s.predict(m, peak)) - log_t, SMOOTH * np.diff(raw, axis=1).ravel()])

    th0 = np.concatenate([[2.0], [] if lead else [np.log(5e-6)], np.full(3 * k, -2.0), np.zeros(int(free.sum()))])
    res = least_squares(resid, th0, loss="soft_l1", f_scale=0.1, max_nfev=4000)
    model = KernelModel.from_vector(full(res.x), nflags)
    return KernelModel.from_vector(full(res.x), nflags, ceiling(model, s, peak))


def ceiling(model: KernelModel, s: Samples, peak: float) -> float:
    """The log of the most efficient kernel of ``s``: the highest efficiency the curves of
    ``model`` give any of its kernels, and no more than the highest ``F / (P t)`` a row of one
    kernel was measured at (a row of two kernels times their sum: it bounds neither alone)."""
    if not len(s.time_s):
        return float("inf")
    flags = s.flags if model.flag_log.size else None
    eff = [model.log_eff(s.dims, flags)]
    single = np.ones(len(s.time_s), dtype=bool)
    if s.then is not None:
        single = s.then[2] <= 0
        eff.append(model.log_eff(s.then[0][~single], s.then[1][~single] if flags is not None else None))
    out = float(np.max(np.concatenate(eff)))
    if single.any():
        out = min(out, float(np.log(np.max(s.flops[single] / (peak * s.time_s[single])))))
    return out


# ---------------------------------------------------------------------------- the data
def _num(col: Any) -> np.ndarray:
    import pandas as pd

    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)


def load_samples(data_dir: Path = GPU_DATA) -> tuple[dict[tuple[str, str, str], Samples], list[str]]:
    """Samples per (device, precision, class) and notes on the rows left out."""
    import pandas as pd

    notes: list[str] = []
    try:
        gemm = pd.read_csv(data_dir / "deepbench_gemm.csv")
        conv = pd.read_csv(data_dir / "deepbench_conv.csv")
        rnn = pd.read_csv(data_dir / "deepbench_rnn.csv")
    except (OSError, pd.errors.ParserError) as e:
        raise FitError(f"cannot read the DeepBench files in {data_dir}: {e}") from None
    out: dict[tuple[str, str, str], Samples] = {}

    t = _num(gemm["time_msec"]) * 1e-3
    bad = ~np.isfinite(t)
    if bad.any():
        notes.append(f"deepbench_gemm.csv: {int(bad.sum())} rows without a time (a note in the time column) left out")
    for key, df in gemm[~bad].groupby(["device", "precision"]):
        d = df[["m", "n", "k"]].to_numpy(np.float64)
        out[(*key, "gemm")] = Samples(d, np.zeros((len(d), 0)), 2 * d.prod(axis=1), t[~bad][df.index.map(gemm[~bad].index.get_loc)],
                                      [f"gemm {int(a)}x{int(b)}x{int(c)}" for a, b, c in d], None, [DEEPBENCH] * len(d))

    n_, c_, h_, w_, k_, r_, s_ = (conv[x].to_numpy(np.float64) for x in ("n", "c", "h", "w", "k", "r", "s"))
    sh, sw = conv["vertical_stride"].to_numpy(np.float64), conv["horizontal_stride"].to_numpy(np.float64)
    ph, pw = conv["pad_h"].to_numpy(np.float64), conv["pad_w"].to_numpy(np.float64)
    p_ = np.floor((h_ + 2 * ph - r_) / sh) + 1
    q_ = np.floor((w_ + 2 * pw - s_) / sw) + 1
    flags = conv_flags(r_, s_, sh, sw, c_)
    flops = 2 * n_ * k_ * p_ * q_ * c_ * r_ * s_
    passes = {"conv_fwd": ("forward_msec", (n_ * p_ * q_, k_, c_ * r_ * s_)),
              "conv_bwd_data": ("wrt_inputs_msec", (n_ * h_ * w_, c_, k_ * r_ * s_)),
              "conv_bwd_filter": ("wrt_parameters_msec", (k_, c_ * r_ * s_, n_ * p_ * q_))}
    for cls, (col, dims) in passes.items():
        tt = _num(conv[col]) * 1e-3
        d = np.stack(dims, axis=1)
        miss = ~np.isfinite(tt)
        if miss.any():
            notes.append(f"deepbench_conv.csv: {int(miss.sum())} {cls} cells not measured (N/A*) left out")
        for key, df in conv.groupby(["device", "precision"]):
            i = df.index.to_numpy()
            i = i[np.isfinite(tt[i])]
            out[(*key, cls)] = Samples(d[i], flags[i], flops[i], tt[i], [
                f"{cls} {int(c_[j])}->{int(k_[j])} {int(h_[j])}x{int(w_[j])} f{int(r_[j])}x{int(s_[j])}/{int(sh[j])} n{int(n_[j])}" for j in i],
                None, [DEEPBENCH] * len(i))

    for key, df in rnn.groupby(["device", "precision"]):
        dims, fl, tt, lab = [], [], [], []
        split = 0
        for row in df.itertuples():
            g, h, b, steps = RNN_GATES[str(row.cell)], float(row.hidden_units), float(row.n), float(row.timesteps)
            step_flops = 2 * b * g * h * h
            parts = [((b, g * h, h), step_flops, _scalar(row.time_forward_msec) / steps, "fwd")]
            bi, bw = _scalar(row.time_backward_wrt_inputs_msec), _scalar(row.time_backward_wrt_weights_msec)
            if np.isfinite(bi) and np.isfinite(bw):
                parts += [((b, h, g * h), step_flops, bi / steps, "bwd_data"), ((g * h, h, b * steps), step_flops * steps, bw, "bwd_weights")]
                split += 1
            for dd, f, ms, what in parts:
                if np.isfinite(ms) and ms > 0:
                    dims.append(dd), fl.append(f), tt.append(ms * 1e-3), lab.append(f"rnn {row.cell} h{int(h)} n{int(b)} {what}")
        if split < len(df):
            notes.append(f"deepbench_rnn.csv {key[0]} {key[1]}: backward not split into data and weights in "
                         f"{len(df) - split} of {len(df)} rows: forward steps only there")
        out[(*key, "rnn")] = Samples(np.asarray(dims, np.float64), np.zeros((len(dims), 0)), np.asarray(fl), np.asarray(tt), lab,
                                     None, [DEEPBENCH] * len(lab))
    return out, notes


def _scalar(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


# ---------------------------------------------------------------------------- all-reduce
def allreduce_fit(data_dir: Path = GPU_DATA) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """Per GPU count: the ring formula's ``alpha_us`` and bandwidth efficiency ``eta`` on
    DeepBench's PCIe servers, and a leave-one-size-out error row per measurement."""
    import pandas as pd

    from harness.core.cluster import preset

    df = pd.read_csv(data_dir / "deepbench_allreduce.csv")
    fits: dict[str, dict[str, float]] = {}
    rows: list[dict[str, Any]] = []
    for (p, nodes), g in df.groupby(["gpus", "nodes"]):
        p, nodes = int(p), int(nodes)
        cl = preset("deepbench_p100", nodes=nodes)
        ring = cl.ring_bandwidth(range(p))
        nbytes = g["floats"].to_numpy(np.float64) * 4
        t = g["mean_ms"].to_numpy(np.float64) * 1e-3
        x_bw = 2 * (p - 1) / p * nbytes / ring  # seconds at eta = 1
        x_lat = np.full(len(t), 2.0 * (p - 1))

        def solve(idx: np.ndarray) -> tuple[float, float]:
            # t = x_lat * alpha + x_bw / eta: linear in (alpha, 1/eta); fit relative errors
            a = np.stack([x_lat[idx], x_bw[idx]], axis=1) / t[idx, None]
            coef, *_ = np.linalg.lstsq(a, np.ones(len(idx)), rcond=None)
            alpha, inv_eta = max(coef[0], 0.0), max(coef[1], 1e-9)
            return alpha, 1.0 / inv_eta

        alpha, eta = solve(np.arange(len(t)))
        fits[str(p)] = {"alpha_us": alpha * 1e6, "eta": eta, "nodes": nodes, "ring_GBps": ring / 1e9}
        for i in range(len(t)):
            a_i, e_i = solve(np.delete(np.arange(len(t)), i))
            pred = x_lat[i] * a_i + x_bw[i] / e_i
            rows.append({"device": "P100", "precision": "fp32", "class": "allreduce", "split": "leave-one-out",
                         "kernel": f"allreduce {p} GPUs {int(nbytes[i])} B", "measured_s": float(t[i]),
                         "predicted_s": float(pred), "rel_error": float(pred / t[i] - 1)})
    return fits, rows


# ---------------------------------------------------------------------------- the table
def split_indices(n: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """A seeded train / test split of n rows (70 / 30)."""
    idx = np.random.default_rng(seed).permutation(n)
    cut = int(round(TRAIN_SHARE * n))
    return np.sort(idx[:cut]), np.sort(idx[cut:])


#: classes whose samples are all too long to show a fixed time per kernel (FlashAttention-2's
#: benchmark holds 16k tokens: 1-30 ms kernels, where a fixed time of a few microseconds and the
#: curves trade off freely - left free, it fits a few hundred microseconds and would swamp a
#: micro-batch's short attention kernel): their ``t0`` is the family's measured launch interval
LAUNCH_T0: tuple[tuple[str, str, str], ...] = (("A100", "fp16", "attention"), ("H100", "fp16", "attention"))
#: flags a class's own samples cannot pin, borrowed from another device's fit of the same kernel
#: (class key -> (donor class key, flag)): FlashAttention-2's A100 rows all time a forward and a
#: backward together, so its backward factor is the H100's, fitted where the same kernel code
#: was timed forward alone and forward + backward
BORROWED_FLAGS: dict[tuple[str, str, str], tuple[tuple[str, str, str], str]] = {
    ("A100", "fp16", "attention"): (("H100", "fp16", "attention"), "backward"),
}


def _errors(err: np.ndarray) -> dict[str, Any]:
    return {"median_abs_error": float(np.median(np.abs(err))) if len(err) else None,
            "p90_abs_error": float(np.percentile(np.abs(err), 90)) if len(err) else None}


def _rows(dev: str, prec: str, cls: str, part: str, labels: Sequence[str], measured: np.ndarray, pred: np.ndarray) -> list[dict[str, Any]]:
    return [{"device": dev, "precision": prec, "class": cls, "split": part, "kernel": lab, "measured_s": float(m),
             "predicted_s": float(p), "rel_error": float(p / m - 1)} for lab, m, p in zip(labels, measured, pred)]


def all_samples(data_dir: Path = GPU_DATA) -> tuple[dict[tuple[str, str, str], Samples], dict[tuple[str, str, str], Samples], list[str]]:
    """Every class's samples - DeepBench's P100 / V100 kernels, the A100 / H100 GEMMs and
    FlashAttention-2 rows - the check rows (costed by a fit, never fitted), and notes."""
    samples, notes = load_samples(data_dir)
    gemm, checks, more = gemm_samples(data_dir / "a100_h100")
    return {**samples, **gemm, **attention_samples(data_dir / "a100_h100")}, checks, notes + more


def memory_fit(data_dir: Path = GPU_DATA, seed: int = SEED) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per device family, the fraction of its datasheet bandwidth memory-bound kernels reach (the
    geometric mean of gpu-stream's kernels on the seeded 70 %; the error on the other 30 % and
    on the check boards) and its kernel-launch interval; one error row per measurement, in
    seconds per GB moved."""
    fit_rows, check_rows = memory_rows(data_dir / "a100_h100")
    launch = launch_intervals(data_dir / "a100_h100")
    entries: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for fam, r in sorted(fit_rows.items()):
        tr, te = split_indices(len(r.fraction), seed)
        frac = float(np.exp(np.mean(np.log(r.fraction[tr]))))
        per_gb = 1.0 / (r.fraction * r.bw_GBps)
        pred = 1.0 / (frac * r.bw_GBps)
        for part, idx in (("train", tr), ("test", te)):
            rows += _rows(fam, "-", "memory", part, [r.label[i] for i in idx], per_gb[idx], pred[idx])
        entry = {"bw_fraction": frac, **launch.get(fam, {}), "train_rows": int(len(tr)), "test_rows": int(len(te)),
                 **{f"test_{k}": v for k, v in _errors(pred[te] / per_gb[te] - 1).items()}, "rests_on": r.rests_on()}
        if fam in check_rows:
            c = check_rows[fam]
            c_meas, c_pred = 1.0 / (c.fraction * c.bw_GBps), 1.0 / (frac * c.bw_GBps)
            rows += _rows(fam, "-", "memory", "check", c.label, c_meas, c_pred)
            entry.update({"check_rows": len(c.label), **{f"check_{k}": v for k, v in _errors(c_pred / c_meas - 1).items()},
                          "check_rests_on": c.rests_on()})
        entries[fam] = entry
    return entries, rows


def fit_all(data_dir: Path = GPU_DATA, seed: int = SEED, progress: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The calibration table and one error row per measured kernel (train, test and check)."""
    samples, checks, notes = all_samples(data_dir)
    launch = launch_intervals(data_dir / "a100_h100")
    entries: dict[str, Any] = {}
    models: dict[tuple[str, str, str], KernelModel] = {}
    rows: list[dict[str, Any]] = []
    keys = sorted(samples, key=lambda key: (key in BORROWED_FLAGS, key))  # the donors first
    it: Any = keys
    if progress:
        from tqdm import tqdm

        it = tqdm(keys, desc="fitting kernel classes", unit="class", file=sys.stderr)
    for key in it:
        dev, prec, cls = key
        s = samples[key]
        peak = REFERENCE_PEAK_TFLOPS[(dev, prec)] * 1e12
        fixed, borrowed = None, {}
        if key in BORROWED_FLAGS:
            donor, flag = BORROWED_FLAGS[key]
            j = ATTN_FLAGS.index(flag)
            fixed = {j: float(models[donor].flag_log[j])}
            borrowed = {"borrowed_flags": {flag: "/".join(donor)}}
        t0 = launch[dev]["launch_us"] * 1e-6 if key in LAUNCH_T0 else None
        tr, te = split_indices(len(s.time_s), seed)
        model = models[key] = fit_model(s.take(tr), peak, fixed, t0)
        pred = s.predict(model, peak)
        for part, idx in (("train", tr), ("test", te)):
            rows += _rows(dev, prec, cls, part, [s.label[i] for i in idx], s.time_s[idx], pred[idx])
        entries.setdefault(dev, {}).setdefault(prec, {})[cls] = {
            **model.to_dict(), "train_rows": int(len(tr)), "test_rows": int(len(te)),
            **{f"test_{k}": v for k, v in _errors(pred[te] / s.time_s[te] - 1).items()}, "rests_on": s.rests_on(), **borrowed,
            **({"t0_held": f"the {dev} launch interval ({launch[dev]['launch_measured_on']})"} if t0 is not None else {}),
        }
    for key, c in sorted(checks.items()):
        if key not in models:
            notes.append(f"{len(c.time_s)} check rows of {'/'.join(key)}: no fit of that class to check")
            continue
        dev, prec, cls = key
        pred = c.predict(models[key], REFERENCE_PEAK_TFLOPS[(dev, prec)] * 1e12)
        rows += _rows(dev, prec, cls, "check", c.label, c.time_s, pred)
        entries[dev][prec][cls].update({"check_rows": int(len(c.time_s)),
                                        **{f"check_{k}": v for k, v in _errors(pred / c.time_s - 1).items()},
                                        "check_rests_on": c.rests_on()})
    memory, mem_rows = memory_fit(data_dir, seed)
    rows += mem_rows
    coll, coll_rows = allreduce_fit(data_dir)
    rows += coll_rows
    boards = board_rows(data_dir / "a100_h100")
    for name, b in sorted(boards.items()):
        notes.append(f"a100_h100/board_gemm.csv: {len(b['rows'])} {b['gpu']} GEMMs of board {name}, not fitted: the board's own "
                     "rate against the family's fit (costs.devices.<kind>.board)")
    impls = attention_impl_rows(data_dir / "a100_h100")
    for fam, per in sorted(impls.items()):
        for name, entry in sorted(per.items()):
            notes.append(f"a100_h100/attention.csv: {len(entry['rows'])} {fam} rows of model.attention={name}, not fitted: its rate "
                         "against the family's FlashAttention-2 fit")
    table = {
        "format": TABLE_FORMAT,
        "source": "P100 / V100: DeepBench (baidu-research/DeepBench da81ba7, results/train/DeepBench_NV_{P100,V100}.xlsx), "
                  "see harness/data/gpu/README.md; A100 / H100: harness/data/gpu/a100_h100/ (GEMM, FlashAttention-2, "
                  "gpu-stream, gpu-small-kernels), see its README.md",
        "seed": seed, "train_share": TRAIN_SHARE, "knots_log2": list(KNOTS), "conv_flags": list(CONV_FLAGS),
        "attention_flags": list(ATTN_FLAGS),
        "reference_peak_tflops": {f"{d}/{p}": v for (d, p), v in REFERENCE_PEAK_TFLOPS.items()},
        "reference_mem_bw_GBps": REFERENCE_MEM_BW_GBPS,
        "notes": notes, "kernels": entries, "memory": memory, "boards": boards, "attention_impls": impls,
        "allreduce": {"cluster": "deepbench_p100", "fits": coll},
    }
    return table, rows


def error_summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median and 90th percentile of |predicted / measured - 1| per device, precision, class, split."""
    groups: dict[tuple[str, str, str, str], list[float]] = {}
    for r in rows:
        groups.setdefault((r["device"], r["precision"], r["class"], r["split"]), []).append(abs(r["rel_error"]))
    return [{"device": d, "precision": p, "class": c, "split": s, "kernels": len(v),
             "median_abs_error": float(np.median(v)), "p90_abs_error": float(np.percentile(v, 90))}
            for (d, p, c, s), v in sorted(groups.items())]


def seed_spread(seeds: Sequence[int], data_dir: Path = GPU_DATA) -> dict[tuple[str, str, str], dict[int, float]]:
    """The held-out median error of every class under each seed's 70 / 30 split (the same data and
    model, another draw of the rows held out): how far the split alone moves a class's error, the
    floor under a goal on it."""
    from tqdm import tqdm

    out: dict[tuple[str, str, str], dict[int, float]] = {}
    for seed in tqdm(list(seeds), desc="refitting per split seed", unit="seed", file=sys.stderr):
        _, rows = fit_all(data_dir, seed=int(seed), progress=False)
        for r in error_summary(rows):
            if r["split"] == "test":
                out.setdefault((r["device"], r["precision"], r["class"]), {})[int(seed)] = r["median_abs_error"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.kernel_fit", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write the table to {TABLE.relative_to(DATA.parents[1])}")
    ap.add_argument("--report", type=Path, help="write one error row per measured kernel to this CSV")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--spread", type=int, nargs="+", metavar="SEED",
                    help="also refit on these seeds' splits and print each class's held-out median under each")
    args = ap.parse_args(argv)
    table, rows = fit_all(seed=args.seed)
    for line in table["notes"]:
        print(f"note: {line}")
    print(f"{'device':<6} {'precision':<12} {'class':<16} {'split':<13} {'n':>4} {'median':>7} {'p90':>7}")
    for s in error_summary(rows):
        print(f"{s['device']:<6} {s['precision']:<12} {s['class']:<16} {s['split']:<13} {s['kernels']:>4} "
              f"{100 * s['median_abs_error']:6.1f}% {100 * s['p90_abs_error']:6.1f}%")
    if args.spread:
        spread = seed_spread(args.spread)
        print(f"held-out median error per split seed ({' '.join(str(x) for x in args.spread)}):")
        for (d, p, c), v in sorted(spread.items()):
            errs = [v.get(x, float("nan")) for x in args.spread]
            print(f"{d:<6} {p:<12} {c:<16} " + " ".join(f"{100 * e:6.1f}%" for e in errs)
                  + f"   range {100 * min(errs):.1f}-{100 * max(errs):.1f} %")
    if args.report:
        import pandas as pd

        pd.DataFrame(rows).to_csv(args.report, index=False)
        print(f"wrote {args.report}")
    if args.write:
        TABLE.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
