"""The calibrated kernel model's evaluation side: the committed table
(``harness/data/kernel_calibration.json``, fitted by ``python -m harness.kernel_fit``), the
monotone piecewise-linear log-efficiency curves of each op class (:class:`KernelModel`), the
convolution filter families and attention features they distinguish, and which fit each math
mode reads on each measured GPU (:data:`MATH_FITS`).  :mod:`harness.core.calibrated` evaluates
it; :mod:`harness.app.kernel_fit` fits it from DeepBench's P100 / V100 kernels and the A100 /
H100 measurements of ``harness/data/gpu/a100_h100/``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.errors import UserError

DATA = Path(__file__).resolve().parents[1] / "data"
TABLE = DATA / "kernel_calibration.json"
TABLE_FORMAT = "harness.kernel_calibration/2"

#: log2 knots of the monotone efficiency curves (8 .. 16384)
KNOTS: tuple[float, ...] = tuple(float(x) for x in range(3, 15))
CLASSES: tuple[str, ...] = ("gemm", "conv_fwd", "conv_bwd_data", "conv_bwd_filter", "rnn", "attention")
CONV_FLAGS: tuple[str, ...] = ("winograd3x3", "winograd5x5", "spatial", "strided1x1", "strided", "narrow")
#: the flags of an attention kernel (:func:`attention_features`)
ATTN_FLAGS: tuple[str, ...] = ("causal", "wide_head", "backward")
#: head sizes above this run FlashAttention-2's kernels for wide heads (smaller tiles: its
#: 128-wide kernels reach 370 TFLOP/s forward on an H100, its 256-wide ones 326)
WIDE_HEAD = 128
#: the GPU each measured column was measured on, and the peak its efficiencies are relative to
#: (TFLOP/s, dense).  P100: DeepBench does not say which board; its FP32 GEMMs reach 9.12
#: TFLOP/s, 98 % of the PCIe card's 9.3 and 86 % of the SXM2 module's 10.6 - we read it as an
#: SXM2 P100 (cuBLAS SGEMM does not reach 98 % of peak).  Its fp16_pseudo kernels compute in
#: FP32.  V100: DGX-1 (SXM2, 15.7 FP32 / 125 tensor TFLOP/s), as DeepBench's results say.
#: A100: the A100 Tensor Core GPU datasheet (2021): FP32 19.5, TF32 156, BF16 / FP16 312 (the
#: same for SXM4 and PCIe, 40 and 80 GB).  H100: the H100 whitepaper's dense SXM5 figures (TF32
#: 494.7, BF16 / FP16 989.4, FP8 1,978.9; conf/cluster/device/h100_sxm5.yaml); its FP16 and
#: attention rows are relative to the FP16 peak, the same as BF16's.
REFERENCE_PEAK_TFLOPS: dict[tuple[str, str], float] = {
    ("P100", "fp32"): 10.6, ("P100", "fp16_pseudo"): 10.6, ("V100", "fp32"): 15.7, ("V100", "fp16_mixed"): 125.0,
    ("A100", "fp32"): 19.5, ("A100", "tf32"): 156.0, ("A100", "fp16"): 312.0, ("A100", "bf16"): 312.0,
    ("H100", "tf32"): 494.7, ("H100", "fp16"): 989.4, ("H100", "bf16"): 989.4, ("H100", "fp8"): 1978.9,
}
#: the memory bandwidth of those GPUs (GB/s, datasheets: P100 HBM2 732, V100 HBM2 900, A100 SXM4
#: 40 GB 1,555 - the launch-era board of NVIDIA's CUDA 11 GEMM plot, most of the A100 rows -
#: H100 SXM5 3,350): the reference of the compute-to-bandwidth transfer rule of
#: :mod:`harness.core.calibrated`
REFERENCE_MEM_BW_GBPS: dict[str, float] = {"P100": 732.0, "V100": 900.0, "A100": 1555.0, "H100": 3350.0}

#: which fit a kernel of each math mode (:data:`harness.core.precision.MATH` by name) reads on a
#: device calibrated against each measured GPU, by class (``"*"``: every class not named):
#: (GPU whose fits it is, precision, the device's peak key it is relative to).  An entry applies
#: where the device has that peak; where it has not, the math runs at the FP32 rate and reads
#: the ``fp32`` entry (TF32 on a V100, BF16 on a P100).  FP16 GEMMs on an H100 read the BF16
#: fit (the same tensor-core rate; the six FP16 rows measured are a check, see
#: harness/data/gpu/a100_h100/README.md); FP32 GEMMs on an H100 (CUDA cores, none measured)
#: read the A100's, by the transfer rule; FlashAttention rows of both 16-bit types read the
#: attention fit of the FP16 benchmarks.
MATH_FITS: dict[str, dict[str, dict[str, tuple[str, str, str]]]] = {
    "P100": {"fp32": {"*": ("P100", "fp32", "float32")}, "fp16": {"*": ("P100", "fp16_pseudo", "float32")}},
    "V100": {"fp32": {"*": ("V100", "fp32", "float32")}, "tf32": {"*": ("V100", "fp16_mixed", "tf32")},
             "fp16": {"*": ("V100", "fp16_mixed", "float16")}, "bf16": {"*": ("V100", "fp16_mixed", "bfloat16")}},
    "A100": {"fp32": {"*": ("A100", "fp32", "float32")}, "tf32": {"*": ("A100", "tf32", "tf32")},
             "fp16": {"*": ("A100", "fp16", "float16")},
             "bf16": {"*": ("A100", "bf16", "bfloat16"), "attention": ("A100", "fp16", "bfloat16")}},
    "H100": {"fp32": {"*": ("A100", "fp32", "float32")}, "tf32": {"*": ("H100", "tf32", "tf32")},
             "fp16": {"*": ("H100", "bf16", "float16"), "attention": ("H100", "fp16", "float16")},
             "bf16": {"*": ("H100", "bf16", "bfloat16"), "attention": ("H100", "fp16", "bfloat16")},
             "fp8": {"*": ("H100", "fp8", "float8")}},
}
#: a measured GPU whose own measurements lack a class (the A100 and H100 have no convolution or
#: recurrent-cell kernels) reads that class from this GPU's fits, by the transfer rule
FALLBACK: dict[str, str] = {"A100": "V100", "H100": "V100"}


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
    """Fitted parameters of one class (see the module docstring).  ``log_ceiling``: the log of
    the highest efficiency the curves give any kernel the fit saw, the most the model gives any
    kernel: the curves do not extrapolate an efficiency beyond the measured kernels' (``inf``:
    no ceiling)."""

    log_emax: float
    t0_s: float
    inc: np.ndarray  # [3, len(KNOTS) - 1] increments (>= 0) of f_m, f_n, f_k
    flag_log: np.ndarray  # [number of the class's flags]
    log_ceiling: float = float("inf")

    def log_eff(self, dims: np.ndarray, flags: np.ndarray | None = None) -> np.ndarray:
        """log efficiency of kernels with GEMM dims ``dims`` [n, 3] (and flags)."""
        l2 = np.log2(np.maximum(np.asarray(dims, dtype=np.float64), 1.0))
        out = self.log_emax + sum(monotone_curve(l2[:, j], self.inc[j]) for j in range(3))
        if flags is not None and len(self.flag_log):
            out = out + np.asarray(flags, dtype=np.float64) @ self.flag_log
        return np.minimum(out, self.log_ceiling)

    def time(self, dims: np.ndarray, flops: np.ndarray, peak: float, flags: np.ndarray | None = None) -> np.ndarray:
        """``t0 + F / (P e)``: seconds of kernels of ``flops`` FLOPs at ``peak`` FLOP/s."""
        return self.t0_s + np.asarray(flops, dtype=np.float64) / (peak * np.exp(self.log_eff(dims, flags)))

    @classmethod
    def from_vector(cls, th: np.ndarray, nflags: int, log_ceiling: float = float("inf")) -> "KernelModel":
        k = len(KNOTS) - 1
        return cls(float(-np.logaddexp(0.0, -th[0])), float(np.exp(th[1])),
                   softplus(th[2:2 + 3 * k].reshape(3, k)), th[2 + 3 * k:2 + 3 * k + nflags].copy(), float(log_ceiling))

    def to_dict(self) -> dict[str, Any]:
        return {"log_emax": self.log_emax, "t0_us": self.t0_s * 1e6, "inc": np.round(self.inc, 6).tolist(),
                "flag_log": np.round(self.flag_log, 6).tolist(),
                "log_ceiling": None if np.isinf(self.log_ceiling) else self.log_ceiling}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelModel":
        ceiling = d.get("log_ceiling")
        return cls(float(d["log_emax"]), float(d["t0_us"]) * 1e-6, np.asarray(d["inc"], dtype=np.float64),
                   np.asarray(d["flag_log"], dtype=np.float64), float("inf") if ceiling is None else float(ceiling))


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


def attention_flops(bh: Any, seqlen: Any, head_dim: Any, causal: Any) -> np.ndarray:
    """A fused attention forward's FLOPs as FlashAttention's benchmark counts them: ``4 b h s^2 d``
    over ``bh`` = batch x heads, half when causal (a backward is 2.5 times it:
    :data:`harness.core.kernels.ATTN_BWD_FACTOR`)."""
    s = np.asarray(seqlen, dtype=np.float64)
    return 4.0 * np.asarray(bh, dtype=np.float64) * s * s * np.asarray(head_dim, dtype=np.float64) \
        * np.where(np.asarray(causal, dtype=bool), 0.5, 1.0)


def attention_features(s_q: np.ndarray, s_kv: np.ndarray, head_dim: np.ndarray, causal: np.ndarray,
                       backward: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (dims, flags) a fused attention kernel's efficiency is read at: the curves at the
    query and key lengths each query and key block actually meets - half of each when causal
    (query row i sees i keys: FlashAttention skips the masked blocks) - and at the head size, and
    the flags :data:`ATTN_FLAGS`: causal (the diagonal blocks computed and masked), a head wider
    than :data:`WIDE_HEAD`, the backward pass."""
    c = np.asarray(causal, dtype=np.float64) > 0
    half = np.where(c, 0.5, 1.0)
    dims = np.stack([np.asarray(s_q, np.float64) * half, np.asarray(s_kv, np.float64) * half,
                     np.asarray(head_dim, np.float64)], axis=1)
    flags = np.stack([c, np.asarray(head_dim) > WIDE_HEAD, np.asarray(backward, np.float64) > 0], axis=1).astype(np.float64)
    return dims, flags


def fit_source(table: dict[str, Any], ref: str, peak_keys: Any, math: str, cls: str) -> tuple[str, str, str, bool] | None:
    """Which fit costs a kernel of math mode ``math`` (a :data:`harness.core.precision.MATH` name)
    and class ``cls`` on a device calibrated against measured GPU ``ref`` whose peaks are
    ``peak_keys``: (GPU, precision, peak key, transferred from another GPU), or None when no
    measured GPU has that class (attention on a P100 / V100: the roofline's).  :data:`MATH_FITS`
    says which fit a math mode reads, the ``fp32`` entry where the device lacks the entry's peak,
    :data:`FALLBACK` where ``ref``'s own measurements lack the class."""
    gpu: str | None = ref
    while gpu is not None:
        fits = MATH_FITS[gpu]
        entry = fits.get(math, fits["fp32"])
        src = entry.get(cls, entry["*"])
        if src[2] not in peak_keys:
            entry = fits["fp32"]
            src = entry.get(cls, entry["*"])
        if cls in table.get("kernels", {}).get(src[0], {}).get(src[1], {}):
            return src[0], src[1], src[2], src[0] != ref
        gpu = FALLBACK.get(gpu)
    return None


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
