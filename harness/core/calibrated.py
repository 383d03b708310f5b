"""The calibrated cost model (``costs=calibrated``, the default): kernel times fitted to real GPUs.

Every kernel of a node (:class:`harness.core.kernels.KernelTable`) is costed by the model
:mod:`harness.app.kernel_fit` fitted to DeepBench's measurements for its class (GEMM, the three
convolution passes, recurrent-cell GEMMs), device and precision, and a node takes the sum of
its kernels.  Which fit a device uses is configured per device kind (``conf/costs/calibrated.yaml``):

* a measured device (P100, V100) uses its own fits, relative to its own peak;
* a device without kernel measurements (A100, H100) is **extrapolated** from the V100's fits
  (the newest GPU DeepBench measured) by a documented transfer rule: the same efficiency
  curves, with the tensor-core fits for TF32 / FP16 / BF16 math and the CUDA-core FP32 fits
  for FP32, each kernel's dims divided by ``kappa = (P / BW) / (P_ref / BW_ref)`` - the ratio
  of the device's compute-to-bandwidth balance to the reference's - before the curves are
  read: a GPU whose peak grew faster than its memory bandwidth needs proportionally larger
  problems to reach the same fraction of its peak.  Every figure from such a device is
  labelled ``extrapolated`` in :meth:`CalibratedCostModel.report`.  The same rule reads the
  curves for every device: ``kappa`` is 1 for the boards DeepBench measured and near it for
  their other boards (0.88 for a PCIe P100, whose lower clock makes it less compute-bound);
* a device not in the table (a CPU) is costed by the analytical roofline, and says so.

Math mode to fit (``harness.core.precision.MATH``): FP32 runs on CUDA cores; TF32, FP16, BF16 on
tensor cores where the device has them (a ``tf32`` / ``float16`` / ``bfloat16`` peak and a
tensor-core fit), else like FP32 - P100 AMP kernels are DeepBench's ``fp16_pseudo`` (FP16
data, FP32 math) at the FP32 peak, and BF16 on a V100 runs at FP32 speed.

Memory-bound kernels (DeepBench has none) keep the roofline's reading: ``launch + bytes /
(mem_efficiency x bandwidth)``, with the bytes of multi-pass kernels (batch norm, softmax,
layer norm) counted per pass.  Fused attention kernels (``ATTN`` rows of a transformer block,
:mod:`harness.core.llm.work`; DeepBench measured none) are the analytical roofline's too, at its
``attention`` efficiency (:meth:`kernel_times`).  All-reduce: NCCL's ring fitted to DeepBench's measured
all-reduces (:func:`harness.app.kernel_fit.allreduce_fit`), ``2(p-1) alpha + 2(p-1)/p bytes /
(eta B)`` with ``B`` the cluster's ring bandwidth (:meth:`harness.core.cluster.Cluster.ring_bandwidth`)
and ``alpha``, ``eta`` of the measured group size nearest below (one host) or of the
two-host fit (several hosts): extrapolated on every cluster but DeepBench's own.

Its figures are checked when it is built: the roofline's as :func:`harness.core.costs.check_roofline`
(``costs.efficiency.*``, ``costs.mem_efficiency``, ``costs.launch_us``, ``costs.sync``), each
``costs.devices.<kind>`` entry a mapping of ``ref`` (a measured GPU) and ``extrapolated``; a
bad one is an error naming its key.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from harness.core.cluster import Cluster, DeviceSpec
from harness.core.costs import AnalyticalCostModel, affine_bytes, node_memory, refuse_unknown, with_measured
from harness.core.errors import UserError
from harness.core.graph import OpGraph
from harness.core.kernel_model import CLASSES, REFERENCE_MEM_BW_GBPS, REFERENCE_PEAK_TFLOPS, TABLE, KernelModel, conv_flags, load_table
from harness.core.kernels import ATTN, CONV_BWD_DATA, CONV_BWD_FILTER, CONV_FWD, GEMM, MEM, KernelTable
from harness.core.precision import BF16, FP16, TF32

if TYPE_CHECKING:
    from harness.core.layergraph import LayerGraph

#: per measured GPU: its CUDA-core fit, its FP16 fit (and the peak key that fit is relative
#: to), its tensor-core fit (None: no tensor cores)
REFERENCES: dict[str, dict[str, Any]] = {
    "P100": {"cuda": "fp32", "half": ("fp16_pseudo", "float32"), "tensor": None},
    "V100": {"cuda": "fp32", "half": ("fp16_mixed", "float16"), "tensor": "fp16_mixed"},
}


class CalibrationError(UserError, ValueError):
    """A calibrated-cost configuration names an unknown reference GPU or fit."""


#: the keys of a ``costs.devices.<kind>`` entry
DEVICE_ENTRY_KEYS: tuple[str, ...] = ("ref", "extrapolated")


def _device_entry(entry: Any, key: str) -> dict[str, Any]:
    """A ``costs.devices.<kind>`` entry, checked: a mapping of :data:`DEVICE_ENTRY_KEYS` whose
    ``ref`` names a measured GPU of :data:`REFERENCES`."""
    if not isinstance(entry, Mapping):
        raise CalibrationError(f"{key} must be a mapping {{ref: {' | '.join(REFERENCES)}, extrapolated: true | false}}, got {entry!r}")
    unknown = [str(k) for k in entry if k not in DEVICE_ENTRY_KEYS]
    if unknown:
        raise CalibrationError(f"{key}.{unknown[0]} is not a key of a calibrated device: it takes {', '.join(DEVICE_ENTRY_KEYS)}")
    if entry.get("ref") not in REFERENCES:
        raise CalibrationError(f"{key}.ref must be one of {', '.join(REFERENCES)}, got {entry.get('ref')!r}")
    return dict(entry)


@dataclass(frozen=True)
class _Fit:
    """What costs one math mode on one device: the fitted models, the peak, the size scale."""

    models: dict[str, KernelModel]
    peak: float
    kappa: float
    label: str  # e.g. "V100/fp16_mixed at float16 peak (extrapolated)"


class CalibratedCostModel:
    """Kernel times from the DeepBench fits (see the module docstring)."""

    def __init__(
        self,
        cluster: Cluster,
        devices: Mapping[str, Mapping[str, Any]],
        table: str | None = None,
        mem_efficiency: float = 0.8,
        launch_us: float = 5.0,
        sync: str = "ring",
        efficiency: Mapping[str, float] | None = None,
        **unknown: Any,
    ) -> None:
        refuse_unknown(type(self), unknown)
        self.cluster = cluster
        self.analytical = AnalyticalCostModel(cluster, efficiency=efficiency, mem_efficiency=mem_efficiency,
                                              launch_us=launch_us, sync=sync)
        self.sync = sync
        self.table_path = Path(table) if table else TABLE
        self.table = load_table(self.table_path)
        self.devices = {str(k): _device_entry(v, f"costs.devices.{k}") for k, v in devices.items()}
        self.mem_eff = float(mem_efficiency)
        self.launch = float(launch_us) * 1e-6
        self._fits: dict[tuple[str, int], _Fit] = {}
        self._times: "weakref.WeakKeyDictionary[Any, dict[tuple[str, float], np.ndarray]]" = weakref.WeakKeyDictionary()
        self._used: dict[str, set[str]] = {}

    # ------------------------------------------------------------------ which fit
    def calibrated(self, kind: str) -> bool:
        """Is this device kind costed from the kernel fits (else by the roofline)?"""
        return kind in self.devices

    def _fit(self, spec: DeviceSpec, math: int) -> _Fit:
        key = (spec.kind, int(math))
        if key not in self._fits:
            cfg = self.devices[spec.kind]
            ref = REFERENCES[cfg["ref"]]
            extrapolated = bool(cfg.get("extrapolated", False))
            tensor_key = {TF32: "tf32", FP16: "float16", BF16: "bfloat16"}.get(int(math))
            if tensor_key and ref["tensor"] and tensor_key in spec.peak_flops:
                prec, peak_key = ref["tensor"], tensor_key
            elif int(math) == FP16:
                prec, peak_key = ref["half"]
            else:
                prec, peak_key = ref["cuda"], "float32"
            fits = self.table["kernels"].get(cfg["ref"], {}).get(prec)
            if not fits:
                raise CalibrationError(f"the calibration table has no {cfg['ref']}/{prec} fits: run python -m harness.kernel_fit --write")
            peak = spec.peak_flops.get(peak_key, spec.peak_flops["float32"])
            ref_peak = REFERENCE_PEAK_TFLOPS[(cfg["ref"], prec)] * 1e12
            kappa = (peak / spec.mem_bw) / (ref_peak / (REFERENCE_MEM_BW_GBPS[cfg["ref"]] * 1e9))
            label = f"{cfg['ref']}/{prec} at the {peak_key} peak" + (" (extrapolated)" if extrapolated else "")
            self._fits[key] = _Fit({c: KernelModel.from_dict(v) for c, v in fits.items()}, float(peak), float(kappa), label)
        return self._fits[key]

    # ------------------------------------------------------------------ compute
    def node_times(self, graph: OpGraph, device: int, fraction: float = 1.0) -> np.ndarray:
        spec = self.cluster.devices[device].spec
        kernels = getattr(graph, "kernels", None)
        if not self.calibrated(spec.kind) or kernels is None:
            self._used.setdefault(spec.kind, set()).add(
                "analytical roofline" + ("" if self.calibrated(spec.kind) else " (no kernel fit for this device)"))
            return self.analytical.node_times(graph, device, fraction)
        per_graph = self._times.setdefault(graph, {})
        key = (spec.kind, float(fraction))
        if key not in per_graph:  # a node the graph has a measured time for takes it (with_measured)
            per_graph[key] = with_measured(graph, spec.kind, fraction,
                                           self._kernel_node_times(graph.num_nodes, kernels, spec, fraction, device))
        return per_graph[key]

    def _kernel_node_times(self, n: int, kt: KernelTable, spec: DeviceSpec, fraction: float | np.ndarray,
                           device: int = 0) -> np.ndarray:
        dims = kt.with_fraction(fraction)
        t = np.zeros(len(kt))
        mem = kt.kind == MEM
        t[mem] = self.launch + dims[mem, 0] / (spec.mem_bw * self.mem_eff)
        attn = kt.kind == ATTN  # no fit: the roofline's (see the module docstring)
        if attn.any():
            rows = np.flatnonzero(attn)
            scaled = KernelTable(np.zeros(len(rows)), kt.kind[rows], dims[rows].astype(np.int64), kt.bdim[rows], kt.math[rows],
                                 kt.rnn[rows])
            t[attn] = self.analytical.kernel_row_times(scaled, device)
            self._used.setdefault(spec.kind, set()).add("analytical roofline (attention kernels)")
        flops = kt.flops(dims)
        fitted = ~mem & ~attn
        for math in sorted(set(kt.math[fitted].tolist())):
            fit = self._fit(spec, math)
            self._used.setdefault(spec.kind, set()).add(fit.label)
            sel = (kt.math == math) & fitted
            t[sel] = self._compute_rows(fit, kt.kind[sel], dims[sel], flops[sel], kt.rnn[sel], kt)
        return np.bincount(kt.node, weights=t, minlength=n)

    def kernel_times(self, kernels: KernelTable, device: int, num_nodes: int = 1) -> np.ndarray:
        """Seconds per node of a kernel table (each row whole): GEMM and convolution rows by the
        fits, attention and memory-bound rows by the roofline; a device without fits entirely by
        the roofline (:meth:`harness.core.costs.AnalyticalCostModel.kernel_times`)."""
        spec = self.cluster.devices[device].spec
        if not self.calibrated(spec.kind):
            self._used.setdefault(spec.kind, set()).add("analytical roofline (no kernel fit for this device)")
            return self.analytical.kernel_times(kernels, device, num_nodes)
        if not len(kernels):
            return np.zeros(num_nodes)
        return self._kernel_node_times(num_nodes, kernels, spec, 1.0, device)

    @staticmethod
    def _gemm_dims(kind: np.ndarray, d: np.ndarray, kt: KernelTable) -> np.ndarray:
        """Per row, the (m, n, k) the fitted curves read: a GEMM's own (batch folded into m),
        or the implicit GEMM of a convolution pass."""
        p, q = kt.conv_out(d)
        n_, c, h, w, k, r, s, g = d[:, 0], d[:, 1], d[:, 2], d[:, 3], d[:, 4], d[:, 5], d[:, 6], np.maximum(d[:, 13], 1)
        crs = c / g * r * s
        out = np.stack([d[:, 0] * d[:, 1], d[:, 2], d[:, 3]], axis=1)  # GEMM rows: batch*m, n, k
        fwd, bdata, bfilt = kind == CONV_FWD, kind == CONV_BWD_DATA, kind == CONV_BWD_FILTER
        out[fwd] = np.stack([n_ * p * q, k, crs], axis=1)[fwd]
        out[bdata] = np.stack([n_ * h * w, c, k / g * r * s], axis=1)[bdata]
        out[bfilt] = np.stack([k, crs, n_ * p * q], axis=1)[bfilt]
        return out

    def _compute_rows(self, fit: _Fit, kind: np.ndarray, dims: np.ndarray, flops: np.ndarray, rnn: np.ndarray,
                      kt: KernelTable) -> np.ndarray:
        gd = self._gemm_dims(kind, dims, kt) / fit.kappa
        flags = conv_flags(dims[:, 5], dims[:, 6], dims[:, 7], dims[:, 8], dims[:, 1])
        out = np.zeros(len(kind))
        classes = np.where(kind == GEMM, np.where(rnn & ("rnn" in fit.models), 4, 0), kind).astype(np.int64)
        for c in sorted(set(classes.tolist())):
            sel = classes == c
            model = fit.models[CLASSES[c]]
            out[sel] = model.time(gd[sel], flops[sel], fit.peak, flags[sel] if model.flag_log.size else None)
        return out

    def compute_time(self, graph: OpGraph, node: int, device: int, fraction: float = 1.0) -> float:
        return float(self.node_times(graph, device, fraction)[node])

    # ------------------------------------------------------------------ communication
    def transfer_time(self, nbytes: float, src: int, dst: int) -> float:
        return self.analytical.transfer_time(nbytes, src, dst)

    def transfer_routes(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self.analytical.transfer_routes()

    def allreduce_time(self, nbytes: float | np.ndarray, devices: Sequence[int]) -> float | np.ndarray:
        devs = list(devices)
        p = len(devs)
        if p <= 1:
            return affine_bytes(nbytes, 0.0, 0.0)
        if self.sync != "ring" or not all(self.calibrated(self.cluster.devices[d].spec.kind) for d in devs):
            return self.analytical.allreduce_time(nbytes, devs)
        fit = self._allreduce_fit(p, len({self.cluster.devices[d].host for d in devs}) > 1)
        ring = self.cluster.ring_bandwidth(devs)
        return affine_bytes(nbytes, 2 * (p - 1) * fit["alpha_us"] * 1e-6, 2 * (p - 1) / p / (fit["eta"] * ring))

    def _allreduce_fit(self, p: int, multi_host: bool) -> dict[str, float]:
        fits = self.table["allreduce"]["fits"]
        cands = sorted((int(k), v) for k, v in fits.items() if (int(v["nodes"]) > 1) == multi_host)
        if not cands:
            cands = sorted((int(k), v) for k, v in fits.items())
        below = [v for k, v in cands if k <= p]
        return below[-1] if below else cands[0][1]

    # ------------------------------------------------------------------ memory
    def memory(self, graph: OpGraph) -> np.ndarray:
        return node_memory(graph)

    # ------------------------------------------------------------------ layer graphs
    def layer_times(self, lgraph: "LayerGraph", device: int, fraction: float | np.ndarray = 1.0,
                    nodes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) seconds of layer shards: each GEMM-like layer as its kernels (a
        convolution's three passes, a linear layer's three GEMMs), the shard's ``fraction`` taken
        off the batch; other layers by the roofline on their bytes."""
        spec = self.cluster.devices[device].spec
        if not self.calibrated(spec.kind):
            return self.analytical.layer_times(lgraph, device, fraction, nodes)
        fwd_k, bwd_k = _layer_kernels(lgraph)
        idx = np.arange(lgraph.num_nodes) if nodes is None else np.asarray(nodes)
        frac = np.broadcast_to(np.asarray(fraction, dtype=np.float64), (len(idx),))
        a_fwd, a_bwd = self.analytical.layer_times(lgraph, device, frac, idx)
        out = []
        for kt, base in ((fwd_k, a_fwd), (bwd_k, a_bwd)):
            res = base.copy()
            # the kernel rows of every entry of idx (a layer may appear once per configuration)
            ptr = kt.ptr(lgraph.num_nodes)
            counts = ptr[idx + 1] - ptr[idx]
            if counts.sum():
                entry = np.repeat(np.arange(len(idx)), counts)
                rows = np.repeat(ptr[idx], counts) + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
                t = self._kernel_node_times(len(idx), kt.take(rows, entry), spec, frac[entry], device)
                res[counts > 0] = t[counts > 0]
            out.append(res)
        return out[0], out[1]

    # ------------------------------------------------------------------ reporting
    def report(self) -> dict[str, Any]:
        """Which fit costed each device kind so far (``extrapolated`` where it is)."""
        return {"model": "calibrated", "table": str(self.table_path),
                "devices": {kind: "; ".join(sorted(labels)) for kind, labels in self._used.items()}}

    def describe(self) -> dict[str, Any]:
        return {"model": "calibrated", "table": str(self.table_path), "devices": self.devices,
                "mem_efficiency": self.mem_eff, "launch_us": self.launch * 1e6, "sync": self.sync}


def _layer_kernels(lgraph: "LayerGraph") -> tuple[KernelTable, KernelTable]:
    """Forward and backward kernels of a layer graph's GEMM-like layers (cached on the graph):
    a convolution as its three passes (output size and stride from its domain and input
    window; ``same`` padding; no data gradient for one that reads a model input, as the
    captured step computes none), a linear or matmul layer as a GEMM forward and its two
    gradient GEMMs backward; the batch column is the sample dim, the math mode that of the
    graph's dtype and precision (``meta``)."""
    cache = getattr(lgraph, "_calibrated_kernels", None)
    if cache is not None:
        return cache
    from harness.core.kernels import NCOLS
    from harness.core.precision import Precision, math_of

    prec = Precision(str(lgraph.meta.get("precision", "fp32")))
    dtype = str(lgraph.meta.get("dtype", prec.param_dtype))
    reads_input = np.zeros(lgraph.num_nodes, dtype=bool)
    data = np.asarray(lgraph.dst_port) == 0
    is_input = np.array([k == "input" for k in lgraph.kinds], dtype=bool)
    reads_input[np.asarray(lgraph.dst)[data & is_input[np.asarray(lgraph.src)]]] = True
    fwd: list[tuple[int, int, tuple[int, ...], int]] = []
    bwd: list[tuple[int, int, tuple[int, ...], int]] = []
    for v, kind in enumerate(lgraph.kinds):
        d = lgraph.dims[v]
        if kind in ("conv1d", "conv2d", "conv3d"):
            ks = [int(size) for name, size in d.items() if name.startswith("kernel_")] or [1]
            r, s = int(np.prod(ks[:-1])), ks[-1]
            stride = _layer_stride(lgraph, v)
            p_ = int(np.prod([size for name, size in d.items() if name in ("height", "depth")] or [1]))
            q_ = int(d.get("width", d.get("length", 1)))
            geo = (d.get("sample", 1), d.get("in_channel", 1), p_ * stride, q_ * stride, d.get("channel", 1), r, s,
                   stride, stride, (r - 1) // 2, (s - 1) // 2, 1, 1, 1)
            fwd.append((v, CONV_FWD, geo, 0))
            bwd += ([] if reads_input[v] else [(v, CONV_BWD_DATA, geo, 0)]) + [(v, CONV_BWD_FILTER, geo, 0)]
        elif kind in ("linear", "matmul"):
            mnk = lgraph.gemm_mnk(v)
            if mnk is None:
                continue
            m, n, k = (int(x) for x in mnk)
            fwd.append((v, GEMM, (1, m, n, k), 1))
            bwd += [(v, GEMM, (1, m, k, n), 1), (v, GEMM, (1, n, k, m), 3)]

    def table(rows: list[tuple[int, int, tuple[int, ...], int]]) -> KernelTable:
        if not rows:
            return KernelTable.empty()
        dims = np.array([tuple(g) + (0,) * (NCOLS - len(g)) for _, _, g, _ in rows], dtype=np.int64)
        math = [math_of(dtype, kind != GEMM, prec) for _, kind, _, _ in rows]
        return KernelTable([r[0] for r in rows], [r[1] for r in rows], dims, [r[3] for r in rows], math, [False] * len(rows))

    out = (table(fwd), table(bwd))
    lgraph._calibrated_kernels = out
    return out


def _layer_stride(lgraph: "LayerGraph", v: int) -> int:
    """A convolution layer's stride along its last spatial axis, from its input window."""
    windows = (lgraph.attrs[v] or {}).get("windows") if lgraph.attrs else None
    if windows:
        for win in windows[0].values() if isinstance(windows[0], dict) else []:
            return max(int(win[0]), 1)
    return 1
