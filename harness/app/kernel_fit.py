"""Fit the calibrated cost model's kernel efficiencies to DeepBench's GPU measurements.

``python -m harness.kernel_fit`` reads ``harness/data/gpu/deepbench_*.csv`` (real kernels
timed on a P100 and a V100, see that directory's README), fits one model per GPU, precision
and kernel class on a seeded 70 % of the rows, reports the error on the other 30 %, and with
``--write`` stores the fitted parameters in ``harness/data/kernel_calibration.json`` - the
table :class:`harness.core.calibrated.CalibratedCostModel` reads.  The fit is deterministic: the
same data and seed give the same table.

The kernel model (one per device, precision and class; ``F`` FLOPs, ``P`` the peak of the
precision's math, ``(m, n, k)`` the kernel's GEMM dims)::

    t = t0 + F / (P * e),   log e = log e_max + f_m(log2 m) + f_n(log2 n) + f_k(log2 k) + sum_j b_j x_j

Each ``f`` is piecewise linear in log2 of the dim, non-decreasing, zero from 2^14 up (a big
enough dim wastes nothing) and falling with slope 1 below 2^3 (a dim smaller than a tile
wastes the rest of the tile); ``x_j`` are 0/1 flags of the convolution's algorithm family
relative to 1x1 stride-1 filters (3x3 and 5x5 stride-1 filters, which cuDNN runs as Winograd
or FFT; other stride-1 filters; strided 1x1 and other strided filters; fewer than 8 input
channels), so a Winograd convolution may reach more than the peak in direct-convolution FLOPs.
Monotone in every dim, the model never makes a shard of a kernel faster per FLOP than the
whole kernel.  Classes and their GEMM dims:

* ``gemm``: the GEMM's (m, n, k);
* ``conv_fwd`` / ``conv_bwd_data`` / ``conv_bwd_filter``: the implicit GEMM of each pass -
  (N*P*Q, K, C*R*S), (N*H*W, C, K*R*S), (K, C*R*S, N*P*Q) - with the filter flags;
* ``rnn``: the recurrent GEMM of one step of an LSTM / GRU / vanilla RNN layer as cuDNN runs
  it (DeepBench times the whole layer, the input projection excluded): forward (n, G*h, h)
  and backward-data (n, h, G*h) per step, backward-weights (G*h, h, n*T) once per layer, with
  G = 4, 3, 1 gates; a step's time includes its pointwise gate math.

Collectives: DeepBench's NCCL all-reduces on its 8-GPU PCIe servers (``cluster=deepbench_p100``)
are fitted per GPU count to the ring formula ``2(p-1) * alpha + 2(p-1)/p * bytes / (eta * B)``,
``B`` the ring bandwidth of that cluster (:meth:`harness.core.cluster.Cluster.ring_bandwidth`), and
reported leave-one-size-out.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from harness.core.kernel_model import (
    CONV_FLAGS, DATA, KNOTS, REFERENCE_MEM_BW_GBPS, REFERENCE_PEAK_TFLOPS, TABLE, TABLE_FORMAT, FitError, KernelModel, conv_flags,
)

GPU_DATA = DATA / "gpu"

SEED = 0
TRAIN_SHARE = 0.7
SMOOTH = 0.3  # penalty on the change of a curve's increments between knots (smoothness)
RNN_GATES = {"lstm": 4, "gru": 3, "vanilla": 1}


@dataclass
class Samples:
    """Measured kernels of one (device, precision, class): GEMM dims, flags, FLOPs, seconds."""

    dims: np.ndarray  # [n, 3] m, n, k
    flags: np.ndarray  # [n, len(CONV_FLAGS)] (zero columns for non-convolution classes)
    flops: np.ndarray
    time_s: np.ndarray
    label: list[str]


def fit_model(s: Samples, peak: float) -> KernelModel:
    """Least squares on log time (soft-L1, so a few odd kernels do not drag the curve), with a
    smoothness penalty on each curve's increments.  A filter family no sample has keeps the 1x1
    curve (its flag's coefficient is held at 0): the residuals do not depend on it, and a free
    parameter the data do not pin can drift anywhere in the solver's steps."""
    from scipy.optimize import least_squares

    k = len(KNOTS) - 1
    nflags = s.flags.shape[1] if s.flags.size and s.flags.any() else 0
    seen = s.flags[:, :nflags].any(axis=0) if nflags else np.zeros(0, dtype=bool)
    log_t = np.log(s.time_s)
    n_curve = 2 + 3 * k

    def full(th: np.ndarray) -> np.ndarray:
        flag_log = np.zeros(nflags)
        flag_log[seen] = th[n_curve:]
        return np.concatenate([th[:n_curve], flag_log])

    def resid(th: np.ndarray) -> np.ndarray:
        m = KernelModel.from_vector(full(th), nflags)
        pred = m.time(s.dims, s.flops, peak, s.flags[:, :nflags] if nflags else None)
        raw = th[2:n_curve].reshape(3, k)
        return np.concatenate([np.log(pred) - log_t, SMOOTH * np.diff(raw, axis=1).ravel()])

    th0 = np.concatenate([[2.0, np.log(5e-6)], np.full(3 * k, -2.0), np.zeros(int(seen.sum()))])
    res = least_squares(resid, th0, loss="soft_l1", f_scale=0.1, max_nfev=4000)
    return KernelModel.from_vector(full(res.x), nflags)


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
                                      [f"gemm {int(a)}x{int(b)}x{int(c)}" for a, b, c in d])

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
                f"{cls} {int(c_[j])}->{int(k_[j])} {int(h_[j])}x{int(w_[j])} f{int(r_[j])}x{int(s_[j])}/{int(sh[j])} n{int(n_[j])}" for j in i])

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
        out[(*key, "rnn")] = Samples(np.asarray(dims, np.float64), np.zeros((len(dims), 0)), np.asarray(fl), np.asarray(tt), lab)
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


def fit_all(data_dir: Path = GPU_DATA, seed: int = SEED, progress: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The calibration table and one error row per measured kernel (train and test)."""
    samples, notes = load_samples(data_dir)
    entries: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    keys = sorted(samples)
    it: Any = keys
    if progress:
        from tqdm import tqdm

        it = tqdm(keys, desc="fitting kernel classes", unit="class", file=sys.stderr)
    for dev, prec, cls in it:
        s = samples[(dev, prec, cls)]
        peak = REFERENCE_PEAK_TFLOPS[(dev, prec)] * 1e12
        tr, te = split_indices(len(s.time_s), seed)
        sub = Samples(s.dims[tr], s.flags[tr] if s.flags.size else s.flags, s.flops[tr], s.time_s[tr], [s.label[i] for i in tr])
        model = fit_model(sub, peak)
        pred = model.time(s.dims, s.flops, peak, s.flags if model.flag_log.size else None)
        err = pred / s.time_s - 1
        for part, idx in (("train", tr), ("test", te)):
            for i in idx:
                rows.append({"device": dev, "precision": prec, "class": cls, "split": part, "kernel": s.label[i],
                             "measured_s": float(s.time_s[i]), "predicted_s": float(pred[i]), "rel_error": float(err[i])})
        entries.setdefault(dev, {}).setdefault(prec, {})[cls] = {
            **model.to_dict(), "train_rows": int(len(tr)), "test_rows": int(len(te)),
            "test_median_abs_error": float(np.median(np.abs(err[te]))) if len(te) else None,
            "test_p90_abs_error": float(np.percentile(np.abs(err[te]), 90)) if len(te) else None,
        }
    coll, coll_rows = allreduce_fit(data_dir)
    rows += coll_rows
    table = {
        "format": TABLE_FORMAT,
        "source": "DeepBench (baidu-research/DeepBench da81ba7, results/train/DeepBench_NV_{P100,V100}.xlsx); "
                  "see harness/data/gpu/README.md",
        "seed": seed, "train_share": TRAIN_SHARE, "knots_log2": list(KNOTS), "conv_flags": list(CONV_FLAGS),
        "reference_peak_tflops": {f"{d}/{p}": v for (d, p), v in REFERENCE_PEAK_TFLOPS.items()},
        "reference_mem_bw_GBps": REFERENCE_MEM_BW_GBPS,
        "notes": notes, "kernels": entries,
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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.kernel_fit", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write the table to {TABLE.relative_to(DATA.parents[1])}")
    ap.add_argument("--report", type=Path, help="write one error row per measured kernel to this CSV")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args(argv)
    table, rows = fit_all(seed=args.seed)
    for line in table["notes"]:
        print(f"note: {line}")
    print(f"{'device':<6} {'precision':<12} {'class':<16} {'split':<13} {'n':>4} {'median':>7} {'p90':>7}")
    for s in error_summary(rows):
        print(f"{s['device']:<6} {s['precision']:<12} {s['class']:<16} {s['split']:<13} {s['kernels']:>4} "
              f"{100 * s['median_abs_error']:6.1f}% {100 * s['p90_abs_error']:6.1f}%")
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
