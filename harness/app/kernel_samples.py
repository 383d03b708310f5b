"""Measured kernels as fit samples: :class:`Samples` (what :func:`harness.app.kernel_fit.fit_model`
fits one class to) and the A100 / H100 measurements of ``harness/data/gpu/a100_h100/`` read into
it (that directory's README gives every source and caveat).

* GEMM (``gemm.csv``): per device family and precision, the rows of that family's own boards
  are fitted (A100; H100, with DeepGEMM's H800 FP8 rows - the H800 has the H100's SMs, tensor
  cores and clocks, only its NVLink is cut); rows of other boards are checks, costed by the
  fit and reported, never fitted: PCIe cards (a lower power limit), H200 / GH200 (the H100's
  die with other memory and power), and the H100's six FP16 rows (one source, SKU and
  software not stated, 27-40 % of the peak where every SXM5 measurement of a large GEMM reaches
  75-80 %: FP16 costs by the BF16 fit, the same tensor-core rate).  DeepGEMM's grouped GEMMs
  (``batch`` groups of ``m`` rows each, contiguous or masked layout) are fitted as one GEMM of
  all the groups' rows.  NVIDIA's CUDA 11 launch figure's 16-bit rows are brought to random
  inputs (:data:`PREDICTABLE_INPUTS`, ``gemm_inputs.csv``).  Rows without dims (older MAMF
  tables, whose printed dimension order changed between versions) cannot be costed and are
  left out with a note.
* Attention (``attention.csv``): FlashAttention-2's own benchmark (Dao-AILab/flash-attention,
  batch x sequence = 16k tokens, hidden 2048): forward + backward on the A100 and the H100, and
  forward alone on the H100.  A forward + backward row is one sample of two kernels (the
  backward 2.5 times the forward's FLOPs, FlashAttention-2's count); the A100's rows of the
  repository's Triton implementation are kept unfitted as that kernel's rate against the fit
  (:func:`attention_impl_rows`); the other implementations (FlashAttention-1 and -3, cuDNN, the
  H100 figures' newer Triton kernel, xformers, PyTorch's unfused attention) are not a kernel
  costed and are not used.
* Memory-bound kernels (``membw.csv``): gpu-stream's bandwidths (init, read, scale, triad,
  stencils) as fractions of each board's datasheet bandwidth; the kernel-launch interval of
  ``gpu-small-kernels`` (back-to-back stream launches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.errors import UserError
from harness.core.kernel_model import DATA, attention_features, attention_flops
from harness.core.kernels import ATTN_BWD_FACTOR

A100_H100_DATA = DATA / "gpu" / "a100_h100"

#: the device family whose fit a measured board's rows train (others are checks: CHECK_GPUS)
FAMILY: dict[str, str] = {"A100": "A100", "H100": "H100", "H800": "H100"}
#: boards of an H100-class die measured only for reference: costed as an H100, never fitted
CHECK_GPUS: dict[str, str] = {"H200": "H100", "GH200": "H100"}
#: the memory fit a gpu-stream board's rows train: its family's, but the H200's own (HBM3e at
#: 4.8 TB/s reaches a lower fraction of its datasheet than the H100's HBM2e / HBM3)
MEMORY_FAMILY: dict[str, str] = {"A100": "A100", "H100": "H100", "H200": "H200"}
#: datasheet memory bandwidth (GB/s) of the boards gpu-stream measured: A100 40 GB 1,555 and
#: A100 80 GB SXM4 2,039 (A100 datasheet, 2021; gpu-benches' a100_80 board is read as the
#: SXM4 of NHR@FAU's HGX A100 nodes, where its author works: an assumption, the file does not
#: say), H100 PCIe 2,000 (H100 datasheet, "2TB/s"), H200 4,800 (H200 datasheet; a check)
STREAM_DATASHEET_GBPS: dict[tuple[str, str], float] = {
    ("A100", "40GB"): 1555.0, ("A100", "80GB"): 2039.0, ("H100", "PCIe"): 2000.0, ("H200", "H200"): 4800.0,
}
#: gpu-stream kernels that read and write, as a training step's memory-bound kernels do (element-wise
#: ops, norms, casts, the optimizer): fitted; ``init`` (stores only) and ``read`` (loads only) are checks
STREAM_FITTED: tuple[str, ...] = ("scale", "triad", "1pt", "3pt", "5pt")
#: the FP8 dtypes of the GEMM file (E4M3 with per-tensor, or DeepGEMM's 1x128 / 128x128 block, scaling)
FP8_PREFIX = "fp8"
#: GEMM sources read as measured on inputs a training step never multiplies, per family and the
#: precisions concerned: NVIDIA's CUDA 11 launch figure gives 292 TFLOP/s at 8192^3, where the same
#: shape on an A100 ran 295 on zeros and 288 on CUTLASS's integer initialisation but 257 on
#: random-normal inputs (``gemm_inputs.csv``): a tensor core at its power limit clocks higher when
#: few bits switch.  Its 16-bit rows are brought to random inputs (:func:`input_factors`); its TF32
#: and FP32 series stand as read (no measurement of their data dependence).  The other sources
#: draw random inputs: mamf-finder ``torch.randn``, XLA's ``matmul_perf_table_gen``
#: ``MakeFakeArguments`` (the gist's best shape lies at MAMF's rate).
PREDICTABLE_INPUTS: dict[str, tuple[str, tuple[str, ...]]] = {
    'NVIDIA Developer Blog "CUDA 11 Features Revealed"': ("A100", ("bf16", "fp16")),
}


#: this project's own GEMMs (``python -m harness.block_probe`` on a lent H100 SXM5 80 GB, 700 W;
#: ``h100_probe_ops.csv``, ``h100_probe_kernels.csv``), an H100 source beside the published ones
PROBE_SOURCE = "this project: python -m harness.block_probe"
#: the probe's dtype names as ``gemm.csv`` spells them
PROBE_DTYPES = {"bfloat16": "bf16", "float8": "fp8_e4m3fn"}


def _probe_frame(g: Any, dtype: Any, what: str, role: str, file: str) -> Any:
    """Probe GEMMs ``g`` (columns m, n, k, mean seconds, size) read from ``file`` as rows of
    ``gemm.csv`` plus ``role``."""
    import pandas as pd

    flops = 2.0 * g["m"] * g["n"] * g["k"]
    return pd.DataFrame({
        "gpu": "H100", "gpu_variant": "SXM", "dtype": dtype, "batch": 1, "m": g["m"], "n": g["n"], "k": g["k"],
        "tflops": flops / g["mean"] / 1e12, "time_us": g["mean"] * 1e6, "source": f"{PROBE_SOURCE} ({what})",
        "locator": file, "how_measured": "MEASURED: mean of " + g["size"].astype(str) + " timings",
        "software": "torch 2.11.0+cu130", "notes": "H100 80GB HBM3, 700 W", "role": role,
    })


def probe_gemm_rows(data_dir: Path = A100_H100_DATA) -> Any:
    """The probe's GEMMs as rows of ``gemm.csv`` with a ``role``, one per (precision, m, n, k), its
    time the mean over every timing of that shape (both runs, every layer and pass of that shape):

    * ``fit``: BF16 GEMMs *in situ* - ``aten::mm`` / ``aten::addmm`` self device time per call
      inside the probed forward and forward + backward passes (``h100_probe_ops.csv``), between
      the step's other kernels, as the simulator runs them;
    * ``check``: the same shapes *isolated* (``h100_probe_kernels.csv``: back to back, 20 calls
      after 3 warm-ups, random-normal operands; FP8 as ``torch._scaled_mm`` with tensor-wise
      scales): a loop of GEMMs alone holds the power limit longer, and runs about 5 % slower
      than the same GEMM inside a step (docs/gpu_costs.md, "H100 GEMMs in situ").

    Empty where the files are absent."""
    import json

    import pandas as pd

    ops_path, ker_path = Path(data_dir) / "h100_probe_ops.csv", Path(data_dir) / "h100_probe_kernels.csv"
    parts = []
    if ops_path.exists():
        o = _read(ops_path.name, data_dir)
        o = o[o["op"].isin(["aten::mm", "aten::addmm"])]
        dims = []
        for op, shapes in zip(o["op"], o["input_shapes"]):
            sh = json.loads(shapes)[1:] if op == "aten::addmm" else json.loads(shapes)
            dims.append((sh[0][0], sh[1][1], sh[0][1]))
        o = o.assign(m=[d[0] for d in dims], n=[d[1] for d in dims], k=[d[2] for d in dims], t=o["self_us"] / o["calls"] * 1e-6)
        g = o.groupby(["m", "n", "k"], sort=True)["t"].agg(["mean", "size"]).reset_index()
        parts.append(_probe_frame(g, "bf16", "in situ", "fit", ops_path.name))
    if ker_path.exists():
        k = _read(ker_path.name, data_dir)
        k = k[(k["kernel"] == "gemm") & k["dtype"].isin(list(PROBE_DTYPES))]
        for dt, part in k.groupby("dtype", sort=True):
            g = part.groupby(["m", "n", "k"], sort=True)["median_s"].agg(["mean", "size"]).reset_index()
            parts.append(_probe_frame(g, PROBE_DTYPES[str(dt)], "isolated", "check", ker_path.name))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


class SampleError(UserError, ValueError):
    """A measurement file is missing or malformed."""


@dataclass
class Samples:
    """Measured kernels of one (device, precision, class): GEMM dims, flags, FLOPs, seconds.

    ``then``: per row, a second kernel its measured time includes, as (dims, flags, FLOPs) with
    0 FLOPs where a row has none - a forward + backward attention measurement is its forward
    kernel followed by its backward."""

    dims: np.ndarray  # [n, 3] m, n, k
    flags: np.ndarray  # [n, nflags] (zero columns for GEMMs)
    flops: np.ndarray
    time_s: np.ndarray
    label: list[str]
    then: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    #: per row, where it comes from (for the table's "rests_on" and the README)
    source: list[str] = field(default_factory=list)

    def take(self, idx: np.ndarray) -> "Samples":
        """The rows ``idx``."""
        idx = np.asarray(idx, dtype=np.int64)
        then = None if self.then is None else tuple(a[idx] for a in self.then)
        return Samples(self.dims[idx], self.flags[idx], self.flops[idx], self.time_s[idx], [self.label[i] for i in idx],
                       then, [self.source[i] for i in idx] if self.source else [])  # type: ignore[arg-type]

    def predict(self, model: Any, peak: float) -> np.ndarray:
        """Seconds ``model`` (a :class:`harness.core.kernel_model.KernelModel`) gives each row."""
        use = bool(model.flag_log.size)
        t = model.time(self.dims, self.flops, peak, self.flags if use else None)
        if self.then is not None:
            dims, flags, flops = self.then
            has = flops > 0
            if has.any():
                t = t.copy()
                t[has] += model.time(dims[has], flops[has], peak, flags[has] if use else None)
        return t

    def rests_on(self) -> list[str]:
        """Rows per source, as the table records them."""
        return per_source(self.source or ["?"] * len(self.time_s))


def _read(name: str, data_dir: Path) -> Any:
    import pandas as pd

    try:
        return pd.read_csv(Path(data_dir) / name)
    except (OSError, pd.errors.ParserError) as e:
        raise SampleError(f"cannot read {Path(data_dir) / name}: {e}") from None


def source_name(source: str, how: str = "") -> str:
    """A short name for a row's source (its repository or page, without the commit), marked when
    the value was read off a plot or a slide."""
    name = str(source).split("@")[0].split(" (")[0].split(",")[0].strip()
    how = str(how).upper()
    if "READ OFF PLOT" in how:
        name += " [read off a plot]"
    elif "READ OFF" in how:
        name += " [a figure's printed labels]"
    return name


def per_source(sources: list[str]) -> list[str]:
    """Rows per source, as the table records what a class rests on."""
    names, counts = np.unique(np.asarray(sources), return_counts=True)
    return [f"{n}: {int(c)} row{'s' if c != 1 else ''}" for n, c in zip(names.tolist(), counts.tolist())]


def gemm_precision(dtype: str) -> str:
    """The fit precision of a ``gemm.csv`` dtype: XLA's ``f32`` runs TF32 tensor cores (its
    values reach 401 TFLOP/s, above the FP32 peak of 67); every FP8 variant is ``fp8``."""
    d = str(dtype)
    if d.startswith(FP8_PREFIX):
        return "fp8"
    if d.startswith("f32 (XLA"):
        return "tf32"
    return d


def gemm_samples(data_dir: Path = A100_H100_DATA) -> tuple[dict[tuple[str, str, str], Samples], dict[tuple[str, str, str], Samples],
                                                           list[str]]:
    """(fitted samples, check samples, notes) per (family, precision, "gemm")."""
    import pandas as pd

    df = _read("gemm.csv", data_dir)
    probe = probe_gemm_rows(data_dir)
    notes: list[str] = []
    if len(probe):
        df = pd.concat([df, probe], ignore_index=True)
        fitted = int((probe["role"] == "fit").sum())
        notes.append(f"a100_h100/h100_probe_*.csv: {fitted} H100 GEMM shapes this project measured in situ fitted beside gemm.csv, "
                     f"{len(probe) - fitted} isolated ones checked")
    m, n, k, b = (df[c].to_numpy(np.float64) for c in ("m", "n", "k", "batch"))
    has_dims = np.isfinite(m) & np.isfinite(n) & np.isfinite(k)
    if (~has_dims).any():
        notes.append(f"a100_h100/gemm.csv: {int((~has_dims).sum())} rows without m, n, k (older MAMF tables whose printed "
                     "dimension order changed) left out")
    b = np.where(np.isfinite(b), b, 1.0)
    flops = 2.0 * b * m * n * k
    t_us = df["time_us"].to_numpy(np.float64)
    time_s = np.where(np.isfinite(t_us), t_us * 1e-6, flops / (df["tflops"].to_numpy(np.float64) * 1e12))
    fit: dict[tuple[str, str, str], list[int]] = {}
    check: dict[tuple[str, str, str], list[int]] = {}
    for i, row in enumerate(df.itertuples()):
        if not has_dims[i]:
            continue
        gpu, variant, prec = str(row.gpu), str(row.gpu_variant), gemm_precision(row.dtype)
        if getattr(row, "role", "fit") == "check":
            check.setdefault((FAMILY[gpu], prec, "gemm"), []).append(i)
        elif gpu in CHECK_GPUS:
            check.setdefault((CHECK_GPUS[gpu], prec, "gemm"), []).append(i)
        elif gpu not in FAMILY:
            notes.append(f"a100_h100/gemm.csv row {i}: GPU {gpu} is not an A100 or H100 board: left out")
        elif "PCIe" in variant:
            check.setdefault((FAMILY[gpu], prec, "gemm"), []).append(i)
        elif FAMILY[gpu] == "H100" and prec == "fp16":
            check.setdefault(("H100", "bf16", "gemm"), []).append(i)
        else:
            fit.setdefault((FAMILY[gpu], prec, "gemm"), []).append(i)
    factors = input_factors(df, data_dir)
    for (name, prec), f in factors.items():
        rows = _rows_of(df, name, prec)
        time_s[rows] /= f
        notes.append(f"a100_h100/gemm.csv: {int(rows.sum())} {prec} rows of {name} timed x{1 / f:.3f}: brought to "
                     "random-normal inputs (gemm_inputs.csv)")
    dims = np.stack([b * m, n, k], axis=1)
    src = [source_name(s, h) for s, h in zip(df["source"], df["how_measured"])]

    def samples(idx: list[int]) -> Samples:
        j = np.asarray(idx)
        labels = [f"{df['gpu'].iat[i]} {df['dtype'].iat[i]} gemm {int(b[i])}x{int(m[i])}x{int(n[i])}x{int(k[i])}" for i in j]
        return Samples(dims[j], np.zeros((len(j), 0)), flops[j], time_s[j], labels, None, [src[i] for i in j])

    return {key: samples(v) for key, v in fit.items()}, {key: samples(v) for key, v in check.items()}, notes


def _rows_of(gemm: Any, source: str, prec: str) -> np.ndarray:
    """The rows of ``gemm.csv`` (a frame) measured by ``source`` in fit precision ``prec``."""
    return (gemm["source"].astype(str).str.startswith(source) & (gemm["dtype"].map(gemm_precision) == prec)).to_numpy()


def input_factors(gemm: Any, data_dir: Path = A100_H100_DATA) -> dict[tuple[str, str], float]:
    """Per (source, precision) of :data:`PREDICTABLE_INPUTS`, the rate a random-normal input reaches
    over the source's own at the shape both measured (``gemm_inputs.csv``: an A100 at 8192^3; 257 /
    292 = 0.880): the power-limited tensor core's data dependence, by which the source's rows
    overstate a training step's GEMMs."""
    ref = _read("gemm_inputs.csv", data_dir)
    ref = ref[ref["inputs"] == "randn"]
    out: dict[tuple[str, str], float] = {}
    for name, (gpu, precs) in PREDICTABLE_INPUTS.items():
        for prec in precs:
            hit = None
            mine = _rows_of(gemm, name, prec)
            for r in ref[ref["gpu"] == gpu].itertuples():
                own = gemm[mine & ((gemm["m"] == r.m) & (gemm["n"] == r.n) & (gemm["k"] == r.k)).to_numpy()]
                if len(own):
                    hit = float(r.tflops) / float(own["tflops"].iloc[0])
                    break
            if hit is None:
                raise SampleError(f"a100_h100/gemm_inputs.csv: no random-input {gpu} row at a shape {name} measured in {prec}")
            out[(name, prec)] = hit
    return out


def attention_samples(data_dir: Path = A100_H100_DATA) -> dict[tuple[str, str, str], Samples]:
    """FlashAttention-2's benchmark rows per (family, "fp16", "attention"): FLOPs as its
    benchmark counts them (``4 b h s^2 d``, half when causal; backward 2.5 times the forward),
    a forward + backward row as two kernels."""
    df = _read("attention.csv", data_dir)
    df = df[(df["impl"] == "FlashAttention-2") & df["gpu"].isin(list(FAMILY))].reset_index(drop=True)
    out: dict[tuple[str, str, str], Samples] = {}
    for gpu, g in df.groupby("gpu"):
        s = g["seqlen"].to_numpy(np.float64)
        d = g["head_dim"].to_numpy(np.float64)
        bh = g["batch"].to_numpy(np.float64) * g["nheads"].to_numpy(np.float64)
        causal = (g["causal"].astype(str) == "True").to_numpy()
        both = (g["pass"] == "fwd+bwd").to_numpy()
        fwd_flops = attention_flops(bh, s, d, causal)
        total = fwd_flops * np.where(both, 1.0 + ATTN_BWD_FACTOR, 1.0)
        time_s = total / (g["tflops"].to_numpy(np.float64) * 1e12)
        dims, flags = attention_features(s, s, d, causal, np.zeros(len(s)))
        bdims, bflags = attention_features(s, s, d, causal, np.ones(len(s)))
        labels = [f"{gpu} FA2 {p} {'causal' if c else 'full'} d{int(dd)} s{int(ss)}"
                  for p, c, dd, ss in zip(g["pass"], causal, d, s)]
        src = [source_name(a, h) for a, h in zip(g["source"], g["notes"].fillna(""))]
        out[(FAMILY[str(gpu)], "fp16", "attention")] = Samples(dims, flags, fwd_flops, time_s, labels,
                                                               (bdims, bflags, np.where(both, ATTN_BWD_FACTOR * fwd_flops, 0.0)), src)
    return out


@dataclass
class MemoryRows:
    """gpu-stream's bandwidths of one family as fractions of each board's datasheet figure."""

    fraction: np.ndarray
    bw_GBps: np.ndarray  # each row's board's datasheet bandwidth
    label: list[str]
    source: list[str]

    def rests_on(self) -> list[str]:
        """Rows per source."""
        return per_source(self.source)


def memory_rows(data_dir: Path = A100_H100_DATA) -> tuple[dict[str, MemoryRows], dict[str, MemoryRows]]:
    """(fitted, check) rows per memory family (:data:`MEMORY_FAMILY`): each gpu-stream kernel's
    best bandwidth over the occupancy sweep divided by its board's datasheet bandwidth
    (:data:`STREAM_DATASHEET_GBPS`); the kernels of :data:`STREAM_FITTED` are fitted, the others
    checks."""
    df = _read("membw.csv", data_dir)
    df = df[df["benchmark"] == "gpu-stream"]
    fit: dict[str, list[tuple[float, float, str, str]]] = {}
    check: dict[str, list[tuple[float, float, str, str]]] = {}
    for row in df.itertuples():
        gpu, variant = str(row.gpu), str(row.gpu_variant)
        board = next((key for key in STREAM_DATASHEET_GBPS if key[0] == gpu and key[1] in variant), None)
        if board is None:
            raise SampleError(f"a100_h100/membw.csv: no datasheet bandwidth for the gpu-stream board {gpu} {variant!r}")
        bw = STREAM_DATASHEET_GBPS[board]
        label = f"{gpu} {board[1]} stream {row.kernel} {float(row.value):.0f} GB/s"
        item = (float(row.value) / bw, bw, label, source_name(row.source))
        (fit if str(row.kernel) in STREAM_FITTED else check).setdefault(MEMORY_FAMILY[gpu], []).append(item)

    for name, frac, bw in probe_memory_rows(data_dir):
        item = (frac, bw, f"H100 SXM5 probe {name} {frac * bw:.0f} GB/s", source_name(PROBE_SOURCE))
        (fit if name.split("_")[0] in PROBE_STREAM else check).setdefault("H100", []).append(item)

    def rows(v: list[tuple[float, float, str, str]]) -> MemoryRows:
        return MemoryRows(np.array([r[0] for r in v]), np.array([r[1] for r in v]), [r[2] for r in v], [r[3] for r in v])

    return {k: rows(v) for k, v in fit.items()}, {k: rows(v) for k, v in check.items()}


#: the probe's memory-bound kernels that are STREAM's (read and write, no arithmetic beyond a
#: multiply-add): fitted as gpu-stream's are; its other memory-bound kernels are checks
PROBE_STREAM = ("copy", "scale", "add", "triad")
#: the H100 SXM5's datasheet bandwidth (conf/cluster/device/h100_sxm5.yaml), the probe's board
PROBE_BW_GBPS = 3350.0


def probe_memory_rows(data_dir: Path = A100_H100_DATA) -> list[tuple[str, float, float]]:
    """(kernel, fraction of the datasheet bandwidth, that bandwidth) of every memory-bound kernel
    the probe timed on its H100 SXM5 (``h100_probe_kernels.csv``, kernel=memory: the bytes each
    must move over its median time, averaged over runs); none where the file is absent."""
    path = Path(data_dir) / "h100_probe_kernels.csv"
    if not path.exists():
        return []
    k = _read(path.name, data_dir)
    k = k[k["kernel"] == "memory"]
    rate = k.groupby("name", sort=True)["GBps"].mean()
    return [(str(n), float(v) / PROBE_BW_GBPS, PROBE_BW_GBPS) for n, v in rate.items()]


def launch_intervals(data_dir: Path = A100_H100_DATA) -> dict[str, dict[str, Any]]:
    """Per memory family, the back-to-back interval of small kernels issued on a stream
    (gpu-small-kernels' smallest scale kernel): the A100 80 GB's, the H200's, and for the H100 the
    H200's (the same GH100 die; no H100 was measured)."""
    df = _read("membw.csv", data_dir)
    df = df[(df["benchmark"] == "gpu-small-kernels") & df["config"].astype(str).str.startswith("stream launches")]
    out: dict[str, dict[str, Any]] = {}
    for row in df.itertuples():
        gpu = str(row.gpu)
        entry = {"launch_us": float(row.value), "launch_measured_on": gpu, "launch_source": source_name(row.source)}
        for family in {MEMORY_FAMILY.get(gpu), FAMILY.get(gpu, CHECK_GPUS.get(gpu))} - {None}:
            if family not in out or family == gpu:
                out[family] = entry
    return out


def board_rows(data_dir: Path = A100_H100_DATA) -> dict[str, dict[str, Any]]:
    """Per board of ``board_gemm.csv`` (GEMMs timed on one board of a family whose power limit or
    clocks differ from the boards the family's fits rest on - Meta's 500 W H100s), its family and
    its rows (fit precision, m, n, k, seconds, kernel library, source): never fitted into the
    family, read by :class:`harness.core.calibrated.CalibratedCostModel` as the board's own rate
    (``costs.devices.<kind>.board``); none where the file is absent."""
    path = Path(data_dir) / "board_gemm.csv"
    if not path.exists():
        return {}
    df = _read(path.name, data_dir)
    out: dict[str, dict[str, Any]] = {}
    for row in df.itertuples():
        gpu = str(row.gpu)
        if gpu not in FAMILY:
            raise SampleError(f"a100_h100/board_gemm.csv: board {row.board}'s GPU {gpu} is not an A100 or H100")
        if not (math.isfinite(float(row.time_ms)) and float(row.time_ms) > 0):
            raise SampleError(f"a100_h100/board_gemm.csv: board {row.board}'s {row.dtype} GEMM {row.m}x{row.n}x{row.k} has time_ms "
                              f"{row.time_ms}: a time must be a positive number")
        entry = out.setdefault(str(row.board), {"gpu": FAMILY[gpu], "rows": []})
        if entry["gpu"] != FAMILY[gpu]:
            raise SampleError(f"a100_h100/board_gemm.csv: board {row.board} lists GPUs of two families")
        entry["rows"].append({"precision": gemm_precision(row.dtype), "m": int(row.m), "n": int(row.n), "k": int(row.k),
                              "seconds": float(row.time_ms) * 1e-3, "library": str(row.library),
                              "source": source_name(row.source)})
    return out


#: other fused attention kernels' rows in ``attention.csv``, by the ``model.attention`` name that
#: runs them (:data:`harness.core.kernels.ATTN_IMPLS`) and the boards whose rows are that kernel:
#: FlashAttention's benchmark timed its repository's Triton implementation (``flash_attn_triton``,
#: which llm-foundry's ``attn_impl: triton`` copies) forward + backward on an A100 beside
#: FlashAttention-2 (the H100 figures' "Triton" is OpenAI's newer tutorial kernel: not this one)
ATTENTION_IMPLS: dict[str, tuple[str, tuple[str, ...]]] = {"flash_triton": ("FlashAttention Triton", ("A100",))}


def attention_impl_rows(data_dir: Path = A100_H100_DATA) -> dict[str, dict[str, Any]]:
    """Per family, per :data:`ATTENTION_IMPLS` kernel, its timed rows (pass, causal, head size,
    sequence length, batch x heads, seconds: FLOPs as FlashAttention's benchmark counts them,
    :func:`attention_samples`) and sources: never fitted, read by
    :class:`harness.core.calibrated.CalibratedCostModel` as the kernel's rate against the family's
    FlashAttention-2 fit; none where the file is absent."""
    path = Path(data_dir) / "attention.csv"
    if not path.exists():
        return {}
    df = _read(path.name, data_dir)
    out: dict[str, dict[str, Any]] = {}
    for name, (impl, gpus) in ATTENTION_IMPLS.items():
        for gpu, g in df[(df["impl"] == impl) & df["gpu"].isin(list(gpus))].groupby("gpu"):
            rows = []
            for r in g.to_dict("records"):
                causal = str(r["causal"]) == "True"
                if not (math.isfinite(float(r["tflops"])) and float(r["tflops"]) > 0):
                    raise SampleError(f"a100_h100/attention.csv: an {gpu} {impl} row has tflops {r['tflops']}: it must be a positive number")
                bh, s, d = int(r["batch"]) * int(r["nheads"]), int(r["seqlen"]), int(r["head_dim"])
                flops = float(attention_flops(bh, s, d, causal)) * (1.0 + ATTN_BWD_FACTOR if r["pass"] == "fwd+bwd" else 1.0)
                rows.append({"pass": str(r["pass"]), "causal": causal, "head_dim": d, "seqlen": s, "bh": bh,
                             "seconds": flops / (float(r["tflops"]) * 1e12)})
            out.setdefault(FAMILY[str(gpu)], {})[name] = {"rows": rows, "rests_on": per_source(
                [source_name(a, h if isinstance(h, str) else "") for a, h in zip(g["source"], g["notes"])])}
    return out
