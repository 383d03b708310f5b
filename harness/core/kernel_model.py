"""The calibrated kernel model's evaluation side: the committed table
(``harness/data/kernel_calibration.json``, fitted by ``python -m harness.kernel_fit``), the
monotone piecewise-linear log-efficiency curves of each op class (:class:`KernelModel`) and
the convolution filter families they distinguish.  :mod:`harness.core.calibrated` evaluates it;
:mod:`harness.app.kernel_fit` fits it from the DeepBench kernels."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.errors import UserError

DATA = Path(__file__).resolve().parents[1] / "data"
TABLE = DATA / "kernel_calibration.json"
TABLE_FORMAT = "harness.kernel_calibration/1"

#: log2 knots of the monotone efficiency curves (8 .. 16384)
KNOTS: tuple[float, ...] = tuple(float(x) for x in range(3, 15))
CLASSES: tuple[str, ...] = ("gemm", "conv_fwd", "conv_bwd_data", "conv_bwd_filter", "rnn")
CONV_FLAGS: tuple[str, ...] = ("winograd3x3", "winograd5x5", "spatial", "strided1x1", "strided", "narrow")
#: the GPU each DeepBench device column was measured on, and the peak its efficiencies are
#: relative to.  P100: DeepBench does not say which board; its FP32 GEMMs reach 9.12 TFLOP/s,
#: 98 % of the PCIe card's 9.3 and 86 % of the SXM2 module's 10.6 - we read it as an SXM2 P100
#: (cuBLAS SGEMM does not reach 98 % of peak).  Its fp16_pseudo kernels compute in FP32.
#: V100: DGX-1 (SXM2, 15.7 FP32 / 125 tensor TFLOP/s), as DeepBench's results say.
REFERENCE_PEAK_TFLOPS: dict[tuple[str, str], float] = {
    ("P100", "fp32"): 10.6, ("P100", "fp16_pseudo"): 10.6, ("V100", "fp32"): 15.7, ("V100", "fp16_mixed"): 125.0,
}
#: the memory bandwidth of those GPUs (datasheets: P100 HBM2 732 GB/s, V100 HBM2 900 GB/s): the
#: reference of the compute-to-bandwidth transfer rule of :mod:`harness.core.calibrated`
REFERENCE_MEM_BW_GBPS: dict[str, float] = {"P100": 732.0, "V100": 900.0}

class FitError(UserError, RuntimeError):
    """The measurement files are missing or malformed."""


# ---------------------------------------------------------------------------- the model
def monotone_curve(log2x: np.ndarray, inc: np.ndarray) -> np.ndarray:
    """f(log2 x) in natural-log units: piecewise linear through the knots with value
    ``-sum(inc[j:])`` at knot j (0 at the last), clamped above the last knot, slope 1 (per
    factor e of x) below the first."""
    knots = np.asarray(KNOTS)
    vals = -np.concatenate([np.cumsum(inc[::-1])[::-1], [0.0]])
    f = np.interp(np.clip(log2x, knots[0], knots[-1]), knots, vals)
    return f + np.minimum(log2x - knots[0], 0.0) * np.log(2.0)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


@dataclass
class KernelModel:
    """Fitted parameters of one class (see the module docstring)."""

    log_emax: float
    t0_s: float
    inc: np.ndarray  # [3, len(KNOTS) - 1] increments (>= 0) of f_m, f_n, f_k
    flag_log: np.ndarray  # [len(CONV_FLAGS)]

    def log_eff(self, dims: np.ndarray, flags: np.ndarray | None = None) -> np.ndarray:
        """log efficiency of kernels with GEMM dims ``dims`` [n, 3] (and conv flags)."""
        l2 = np.log2(np.maximum(np.asarray(dims, dtype=np.float64), 1.0))
        out = self.log_emax + sum(monotone_curve(l2[:, j], self.inc[j]) for j in range(3))
        if flags is not None and len(self.flag_log):
            out = out + np.asarray(flags, dtype=np.float64) @ self.flag_log
        return out

    def time(self, dims: np.ndarray, flops: np.ndarray, peak: float, flags: np.ndarray | None = None) -> np.ndarray:
        return self.t0_s + np.asarray(flops, dtype=np.float64) / (peak * np.exp(self.log_eff(dims, flags)))

    @classmethod
    def from_vector(cls, th: np.ndarray, nflags: int) -> "KernelModel":
        k = len(KNOTS) - 1
        return cls(float(-np.logaddexp(0.0, -th[0])), float(np.exp(th[1])),
                   softplus(th[2:2 + 3 * k].reshape(3, k)), th[2 + 3 * k:2 + 3 * k + nflags].copy())

    def to_dict(self) -> dict[str, Any]:
        return {"log_emax": self.log_emax, "t0_us": self.t0_s * 1e6, "inc": np.round(self.inc, 6).tolist(),
                "flag_log": np.round(self.flag_log, 6).tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelModel":
        return cls(float(d["log_emax"]), float(d["t0_us"]) * 1e-6, np.asarray(d["inc"], dtype=np.float64),
                   np.asarray(d["flag_log"], dtype=np.float64))


def conv_flags(r: np.ndarray, s: np.ndarray, stride_h: np.ndarray, stride_w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The filter-family flags :data:`CONV_FLAGS` of convolutions (one row each), relative to a
    1x1 stride-1 filter (the most measured family, a plain GEMM): 3x3 and 5x5 stride-1 filters
    (Winograd / FFT in cuDNN), other stride-1 filters (1x7, 7x1, ...: implicit GEMM), 1x1
    filters with a stride, other strided filters, and fewer than 8 input channels (a first
    layer; no tensor-core tile).  A family DeepBench did not measure keeps the 1x1 curve."""
    unit = (stride_h == 1) & (stride_w == 1)
    pointwise = (r == 1) & (s == 1)
    w3, w5 = (r == 3) & (s == 3) & unit, (r == 5) & (s == 5) & unit
    return np.stack([w3, w5, ~pointwise & unit & ~w3 & ~w5, pointwise & ~unit, ~pointwise & ~unit, c < 8],
                    axis=1).astype(np.float64)


def load_table(path: Path = TABLE) -> dict[str, Any]:
    """The committed calibration table."""
    try:
        table = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FitError(f"calibration table {path} does not exist: run python -m harness.kernel_fit --write") from None
    except json.JSONDecodeError as e:
        raise FitError(f"calibration table {path} is not valid JSON (line {e.lineno}, column {e.colno})") from None
    if table.get("format") != TABLE_FORMAT:
        raise FitError(f"{path} is not a calibration table: format {table.get('format')!r}, expected {TABLE_FORMAT!r}")
    return table
