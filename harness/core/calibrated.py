"""The calibrated cost model (``costs=calibrated``, the default): kernel times fitted to real GPUs.

Every kernel of a node (:class:`harness.core.kernels.KernelTable`) is costed by the model
:mod:`harness.app.kernel_fit` fitted to real measurements of its class, device and precision,
and a node takes the sum of its kernels.  Which measured GPU a device is calibrated against is
configured per device kind (``conf/costs/calibrated.yaml``, ``costs.devices.<kind>.ref``):

* P100 and V100: DeepBench's kernels (GEMM, the three convolution passes, recurrent-cell GEMMs);
* A100 and H100: their own measurements (``harness/data/gpu/a100_h100/``): GEMMs by precision
  (TF32, FP16, BF16, FP32 on the A100; TF32, BF16 and FP8 on the H100, whose FP16 GEMMs read
  the BF16 fit), FlashAttention-2 forward and backward (``ATTN`` rows), and memory-bound
  kernels at the fraction of the datasheet bandwidth gpu-stream's read-and-write kernels reach,
  plus the measured back-to-back launch interval; a board of a family (A100 40 / 80 GB, H100
  SXM5 80 / 96 GB, H200) reads the family's efficiencies relative to its own peaks and
  bandwidth; a board with GEMMs timed on it (``costs.devices.<kind>.board``: the 500 W H100)
  runs its tensor-core kernels at its own rate against those fits (:mod:`harness.core.board_rate`);
* what a device's measured GPU lacks is read from another's fits by a documented transfer rule
  (:data:`harness.core.kernel_model.MATH_FITS`, ``FALLBACK``): the A100 / H100 convolutions and
  recurrent cells from the V100's, the H100's FP32 (CUDA-core) GEMMs from the A100's, and a
  device configured ``extrapolated`` (no measurements of its own) from its ``ref``'s.  The
  same efficiency curves, each kernel's dims divided by ``kappa = (P / BW) / (P_ref / BW_ref)``
  - the ratio of the device's compute-to-bandwidth balance to the measured board's - before the
  curves are read: a GPU whose peak grew faster than its memory bandwidth needs proportionally
  larger problems to reach the same fraction of its peak.  Every such figure is labelled
  ``extrapolated`` in :meth:`CalibratedCostModel.report`.  The rule reads every device's GEMM
  and convolution curves (``kappa`` is 1 on a measured board and near it for its other boards:
  0.88 for a PCIe P100); the attention curves are read at the kernel's own lengths;
* a device not in the table (a CPU) is costed by the analytical roofline, and says so.

Math mode to fit: FP32 runs on CUDA cores; TF32, FP16, BF16, FP8 on tensor cores where the
device has them (a ``tf32`` / ``float16`` / ``bfloat16`` / ``float8`` peak), else like FP32 -
P100 AMP kernels are DeepBench's ``fp16_pseudo`` (FP16 data, FP32 math) at the FP32 peak, and
BF16 on a V100 runs at FP32 speed; an FP8 kernel on a device without FP8 is an error.

Memory-bound kernels on a device without bandwidth measurements (P100, V100) keep the
roofline's reading: ``launch + bytes / (mem_efficiency x bandwidth)``, with the bytes of
multi-pass kernels (batch norm, softmax, layer norm) counted per pass; attention there is the
analytical roofline's, at its ``attention`` efficiency.  All-reduce: NCCL's tuning model on the
cluster's fabric (:func:`harness.core.fabric.fabric_of`, :func:`harness.core.fabric.placed_collective_time`),
the same that prices the stack simulator's collectives - ring, tree across nodes and NVLS on an
H100 NVSwitch node, the fastest, at the bandwidths NCCL measured on A100 / H100 NVSwitch nodes
and InfiniBand / RoCE, DeepBench's measured all-reduce efficiency on a P100 / V100 PCIe node
(and InfiniBand across such nodes), the datasheet's elsewhere (a DGX-1's NVLink cube-mesh) -
with the group placed as its devices' hosts place it (nodes spanned, ranks per node).  The
report names each level's source (``allreduce``).  A parameter server (``costs.sync: ps``), a
device without fits or a cluster the fabric cannot describe takes the roofline's formula.

Its figures are checked when it is built: the roofline's as :func:`harness.core.costs.check_roofline`
(``costs.efficiency.*``, ``costs.mem_efficiency``, ``costs.launch_us``, ``costs.sync``), each
``costs.devices.<kind>`` entry a mapping of ``ref`` (a measured GPU), ``extrapolated`` and
``memory`` (whose bandwidth measurements its memory-bound kernels read; ``ref``'s by default);
a bad one is an error naming its key.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from harness.core.board_rate import attention_rates, board_rate, impl_rate, rows_for
from harness.core.cluster import Cluster, DeviceSpec
from harness.core.costs import AnalyticalCostModel, CostModelError, affine_bytes, node_memory, refuse_unknown, with_measured
from harness.core.checks import unit_fraction
from harness.core.errors import ClusterError, UserError
from harness.core.fabric import Fabric, Placement, fabric_of, fabric_report, placed_collective_time, placement_of
from harness.core.graph import OpGraph
from harness.core.kernel_model import (
    MATH_FITS, REFERENCE_MEM_BW_GBPS, REFERENCE_PEAK_TFLOPS, TABLE, KernelModel, attention_features, conv_flags, fit_source,
    load_table,
)
from harness.core.kernels import ATTN, ATTN_IMPLS, CONV_BWD_DATA, CONV_BWD_FILTER, CONV_FWD, GEMM, MEM, KernelTable
from harness.core.precision import MATH

if TYPE_CHECKING:
    from harness.core.layergraph import LayerGraph

#: the class of each kernel kind (:data:`harness.core.kernels.KINDS`; memory-bound rows have none)
KIND_CLASS: dict[int, str] = {GEMM: "gemm", CONV_FWD: "conv_fwd", CONV_BWD_DATA: "conv_bwd_data",
                              CONV_BWD_FILTER: "conv_bwd_filter", ATTN: "attention"}


class CalibrationError(UserError, ValueError):
    """A calibrated-cost configuration names an unknown reference GPU or fit."""


#: the keys of a ``costs.devices.<kind>`` entry
DEVICE_ENTRY_KEYS: tuple[str, ...] = ("ref", "extrapolated", "memory", "board")


def _device_entry(entry: Any, key: str, memory: Mapping[str, Any], boards: Mapping[str, Any]) -> dict[str, Any]:
    """A ``costs.devices.<kind>`` entry, checked: a mapping of :data:`DEVICE_ENTRY_KEYS` whose
    ``ref`` names a measured GPU of :data:`harness.core.kernel_model.MATH_FITS`, whose
    ``memory``, if given, a bandwidth fit of the table and whose ``board``, if given, a board of
    the table measured on ``ref``'s family (:mod:`harness.core.board_rate`)."""
    refs = " | ".join(MATH_FITS)
    if not isinstance(entry, Mapping):
        raise CalibrationError(f"{key} must be a mapping {{ref: {refs}, extrapolated: true | false}}, got {entry!r}")
    unknown = [str(k) for k in entry if k not in DEVICE_ENTRY_KEYS]
    if unknown:
        raise CalibrationError(f"{key}.{unknown[0]} is not a key of a calibrated device: it takes {', '.join(DEVICE_ENTRY_KEYS)}")
    if entry.get("ref") not in MATH_FITS:
        raise CalibrationError(f"{key}.ref must be one of {', '.join(MATH_FITS)}, got {entry.get('ref')!r}")
    if "memory" in entry and entry["memory"] not in memory:
        raise CalibrationError(f"{key}.memory must be one of {', '.join(memory) or '(none in the table)'}, got {entry['memory']!r}")
    if "board" in entry:
        if entry["board"] not in boards:
            raise CalibrationError(f"{key}.board must be one of {', '.join(boards) or '(none in the table)'}, got {entry['board']!r}")
        if boards[entry["board"]]["gpu"] != entry["ref"]:
            raise CalibrationError(f"{key}.board {entry['board']} was measured on an {boards[entry['board']]['gpu']}, "
                                   f"not on {key}.ref {entry['ref']}")
    return dict(entry)


@dataclass(frozen=True)
class _ClassFit:
    """What costs one class of one math mode on one device: the fitted model, the peak, the
    size scale and the label the report gives it."""

    model: KernelModel
    peak: float
    kappa: float
    label: str  # e.g. "V100/fp16_mixed conv_fwd at the float16 peak (extrapolated)"
    rate: float = 1.0  # the board's own rate (harness.core.board_rate): times over it
    source: tuple[str, str] = ("", "")  # the measured GPU and precision of the fit


def _balance(spec: DeviceSpec, peak: float, gpu: str, prec: str) -> float:
    """kappa: ``spec``'s FLOPs per byte at ``peak`` over those of the measured ``gpu`` the fit of
    ``prec`` rests on; a GEMM's dims are divided by it, so that a board of other balance reads the
    fit where its kernels turn from memory- to compute-bound."""
    return (peak / spec.mem_bw) / (REFERENCE_PEAK_TFLOPS[(gpu, prec)] * 1e12 / (REFERENCE_MEM_BW_GBPS[gpu] * 1e9))


class CalibratedCostModel:
    """Kernel times from the measured kernel fits (see the module docstring)."""

    def __init__(
        self,
        cluster: Cluster,
        devices: Mapping[str, Mapping[str, Any]],
        table: str | None = None,
        mem_efficiency: float = 0.8,
        launch_us: float = 5.0,
        sync: str = "ring",
        efficiency: Mapping[str, float] | None = None,
        in_situ: float = 1.0,
        overlap_slowdown: float = 0.0,
        **unknown: Any,
    ) -> None:
        refuse_unknown(type(self), unknown)
        self.cluster = cluster
        self.in_situ = unit_fraction(in_situ, "costs.in_situ", CostModelError)
        self.analytical = AnalyticalCostModel(cluster, efficiency=efficiency, mem_efficiency=mem_efficiency,
                                              launch_us=launch_us, sync=sync, overlap_slowdown=overlap_slowdown)
        self.overlap_slowdown = self.analytical.overlap_slowdown  # checked there, as the roofline's figures are
        self.sync = sync
        self.table_path = Path(table) if table else TABLE
        self.table = load_table(self.table_path)
        memory = self.table.get("memory", {})
        boards = self.table.get("boards", {})
        self.devices = {str(k): _device_entry(v, f"costs.devices.{k}", memory, boards) for k, v in devices.items()}
        self.mem_eff = float(mem_efficiency)
        self.launch = float(launch_us) * 1e-6
        self.efficiency = dict(efficiency or {})
        self._fits: dict[tuple[str, str, str], _ClassFit | None] = {}
        self._impl_cache: dict[tuple[str, str], list[float]] = {}
        self._rooflines: dict[str, AnalyticalCostModel] = {}
        self._times: "weakref.WeakKeyDictionary[Any, dict[tuple[str, float], np.ndarray]]" = weakref.WeakKeyDictionary()
        self._used: dict[str, set[str]] = {}
        self._fabric_read, self._fabric_error = False, ""
        self._fabric_cache: Fabric | None = None
        self._placements: dict[tuple[int, ...], Placement] = {}
        self._allreduce_used = False

    # ------------------------------------------------------------------ which fit
    def calibrated(self, kind: str) -> bool:
        """Is this device kind costed from the kernel fits (else by the roofline)?"""
        return kind in self.devices

    def _memory_fit(self, kind: str) -> dict[str, Any] | None:
        """The bandwidth fit a device kind's memory-bound kernels read (None: the roofline's figures)."""
        cfg = self.devices[kind]
        return self.table.get("memory", {}).get(cfg.get("memory", cfg["ref"]))

    def _roofline(self, spec: DeviceSpec) -> AnalyticalCostModel:
        """The roofline of a device kind: at its measured bandwidth fraction and launch interval
        where its memory is measured, else the configured ``mem_efficiency`` and ``launch_us``."""
        mem = self._memory_fit(spec.kind) if self.calibrated(spec.kind) else None
        if mem is None:
            return self.analytical
        if spec.kind not in self._rooflines:
            self._rooflines[spec.kind] = AnalyticalCostModel(
                self.cluster, efficiency=self.efficiency, mem_efficiency=min(float(mem["bw_fraction"]), 1.0),
                launch_us=float(mem["launch_us"]), sync=self.sync)
        return self._rooflines[spec.kind]

    def _fit(self, spec: DeviceSpec, math: int, cls: str) -> _ClassFit | None:
        """The fit of class ``cls`` for kernels of math mode ``math`` on ``spec`` (None: no
        measured GPU has that class - the roofline's)."""
        name = MATH[int(math)]
        key = (spec.kind, name, cls)
        if key not in self._fits:
            cfg = self.devices[spec.kind]
            if name == "fp8" and "float8" not in spec.peak_flops:
                raise CalibrationError(f"an FP8 kernel on {spec.kind}, which has no FP8 tensor cores (no peak_tflops.float8): "
                                       "use precision=amp_bf16 there")
            src = fit_source(self.table, cfg["ref"], spec.peak_flops, name, cls)
            if src is None:
                self._fits[key] = None
                return None
            gpu, prec, peak_key, transferred = src
            peak = float(spec.peak_flops[peak_key])
            kappa = 1.0 if cls == "attention" else _balance(spec, peak, gpu, prec)
            what = "attention (FlashAttention-2)" if cls == "attention" else cls
            label = f"{gpu}/{prec} {what} at the {peak_key} peak" + (
                " (extrapolated)" if transferred or cfg.get("extrapolated", False) else "")
            rate, rate_label = self._board_rate(spec, gpu, prec) if "board" in cfg else (1.0, "")
            self._fits[key] = _ClassFit(KernelModel.from_dict(self.table["kernels"][gpu][prec][cls]), peak, float(kappa),
                                        label + rate_label, rate, (gpu, prec))
        return self._fits[key]

    def _board_rate(self, spec: DeviceSpec, gpu: str, prec: str) -> tuple[float, str]:
        """The rate of ``spec``'s configured board in fit precision ``prec`` and the label that
        says so (:mod:`harness.core.board_rate`): its GEMMs of ``prec`` (else of BF16) against
        the ``gpu`` GEMM fit of their precision at the board's own peak and balance."""
        name = self.devices[spec.kind]["board"]
        rows, of = rows_for(self.table["boards"][name]["rows"], prec)
        # the GEMM fit of the rows' precision (a fit precision is also a math mode's name)
        src = fit_source(self.table, gpu, spec.peak_flops, of, "gemm") if rows else None
        if src is None:
            return 1.0, f" (board {name}: no GEMMs measured to rate it)"
        g, p, peak_key, _ = src
        peak = float(spec.peak_flops[peak_key])
        rate = board_rate(rows, KernelModel.from_dict(self.table["kernels"][g][p]["gemm"]), peak, _balance(spec, peak, g, p))
        return rate, f" x {rate:.3f} (board {name}: {len(rows)} {of} GEMMs measured on it)"

    # ------------------------------------------------------------------ compute
    def node_times(self, graph: OpGraph, device: int, fraction: float = 1.0) -> np.ndarray:
        spec = self.cluster.devices[device].spec
        kernels = getattr(graph, "kernels", None)
        if not self.calibrated(spec.kind) or kernels is None:
            self._used.setdefault(spec.kind, set()).add(
                "analytical roofline" + ("" if self.calibrated(spec.kind) else " (no kernel fit for this device)"))
            # in situ scales the modelled times, not the ones the graph carries measured
            return with_measured(graph, spec.kind, fraction, self._sustained(self._roofline(spec).node_times(graph, device, fraction)))
        per_graph = self._times.setdefault(graph, {})
        key = (spec.kind, float(fraction))
        if key not in per_graph:  # a node the graph has a measured time for takes it (with_measured)
            per_graph[key] = with_measured(graph, spec.kind, fraction,
                                           self._sustained(self._kernel_node_times(graph.num_nodes, kernels, spec, fraction, device)))
        return per_graph[key]

    def _kernel_node_times(self, n: int, kt: KernelTable, spec: DeviceSpec, fraction: float | np.ndarray,
                           device: int = 0) -> np.ndarray:
        dims = kt.with_fraction(fraction)
        t = np.zeros(len(kt))
        used = self._used.setdefault(spec.kind, set())
        mem = kt.kind == MEM
        m = self._memory_fit(spec.kind)
        launch, bw = (self.launch, spec.mem_bw * self.mem_eff) if m is None else \
            (float(m["launch_us"]) * 1e-6, spec.mem_bw * float(m["bw_fraction"]))
        if mem.any():
            t[mem] = launch + dims[mem, 0] / bw
            if m is not None:
                used.add(f"{self.devices[spec.kind].get('memory', self.devices[spec.kind]['ref'])} memory-bound: "
                         f"{float(m['bw_fraction']):.3f} of {spec.mem_bw / 1e9:.0f} GB/s, launch {float(m['launch_us']):.2f} us")
        flops = kt.flops(dims)
        nbytes = kt.nbytes(dims) if m is not None else None   # the floor's bytes, where the bandwidth is measured
        roofline = np.zeros(len(kt), dtype=bool)
        for math in sorted(set(kt.math[~mem].tolist())):
            for kind in sorted(set(kt.kind[~mem & (kt.math == math)].tolist())):
                sel = ~mem & (kt.math == math) & (kt.kind == kind)
                rnn = sel & kt.rnn if kind == GEMM else np.zeros_like(sel)
                for part, cls in ((sel & ~rnn, KIND_CLASS[kind]), (rnn, "rnn")):
                    if not part.any():
                        continue
                    fit = self._fit(spec, math, cls)
                    if fit is None and cls == "rnn":  # no recurrent-cell fit: a plain GEMM
                        fit = self._fit(spec, math, "gemm")
                    if fit is None:
                        roofline |= part
                        continue
                    used.add(fit.label)
                    t[part] = self._class_rows(fit, kind, dims[part], flops[part], kt)
                    if kind == ATTN:
                        for impl in sorted(set(dims[part, 7].astype(int).tolist()) - {0}):
                            used.add(f"{ATTN_IMPLS[impl]} attention at its rate against {fit.source[0]} FlashAttention-2 "
                                     f"({len(self.table['attention_impls'][fit.source[0]][ATTN_IMPLS[impl]]['rows'])} rows measured)")
                    if nbytes is not None:
                        # no kernel moves its operands faster than the measured memory-bound kernels
                        # do: where a fit extrapolates past its measurements (a short reduction dim,
                        # a thin batched matmul) its bytes over that bandwidth bound it from below
                        t[part] = np.maximum(t[part], launch + nbytes[part] / bw)
        if roofline.any():  # a class no measured GPU has (attention on a P100 / V100): the roofline's
            rows = np.flatnonzero(roofline)
            scaled = KernelTable(np.zeros(len(rows)), kt.kind[rows], dims[rows].astype(np.int64), kt.bdim[rows], kt.math[rows],
                                 kt.rnn[rows])
            t[roofline] = self._roofline(spec).kernel_row_times(scaled, device)
            used.add("analytical roofline (" + ", ".join(sorted({KIND_CLASS[int(k)] for k in kt.kind[roofline]})) + " kernels)")
        return np.bincount(kt.node, weights=t, minlength=n)

    def kernel_times(self, kernels: KernelTable, device: int, num_nodes: int = 1) -> np.ndarray:
        """Seconds per node of a kernel table (each row whole): every row by the fit of its class
        (GEMM, convolution passes, attention) or the measured bandwidth (memory-bound rows), the
        roofline where no fit applies; a device without fits entirely by the roofline
        (:meth:`harness.core.costs.AnalyticalCostModel.kernel_times`)."""
        spec = self.cluster.devices[device].spec
        if not self.calibrated(spec.kind):
            self._used.setdefault(spec.kind, set()).add("analytical roofline (no kernel fit for this device)")
            return self._sustained(self.analytical.kernel_times(kernels, device, num_nodes))
        if not len(kernels):
            return np.zeros(num_nodes)
        return self._sustained(self._kernel_node_times(num_nodes, kernels, spec, 1.0, device))

    @staticmethod
    def _gemm_dims(kind: int, d: np.ndarray, kt: KernelTable) -> np.ndarray:
        """Per row of one kind, the (m, n, k) the fitted curves read: a GEMM's own (batch folded
        into m), or the implicit GEMM of a convolution pass."""
        if kind == GEMM:
            return np.stack([d[:, 0] * d[:, 1], d[:, 2], d[:, 3]], axis=1)
        p, q = kt.conv_out(d)
        n_, c, h, w, k, r, s, g = d[:, 0], d[:, 1], d[:, 2], d[:, 3], d[:, 4], d[:, 5], d[:, 6], np.maximum(d[:, 13], 1)
        crs = c / g * r * s
        if kind == CONV_FWD:
            return np.stack([n_ * p * q, k, crs], axis=1)
        if kind == CONV_BWD_DATA:
            return np.stack([n_ * h * w, c, k / g * r * s], axis=1)
        return np.stack([k, crs, n_ * p * q], axis=1)

    def _class_rows(self, fit: _ClassFit, kind: int, dims: np.ndarray, flops: np.ndarray, kt: KernelTable) -> np.ndarray:
        """Seconds of rows of one kind by one class fit: GEMM-like rows at their (m, n, k) over
        ``kappa`` (convolutions with their filter flags), attention rows at their lengths and
        head size (:func:`harness.core.kernel_model.attention_features`)."""
        model = fit.model
        if kind == ATTN:
            gd, flags = attention_features(dims[:, 1], dims[:, 2], dims[:, 3], dims[:, 4], dims[:, 5])
            t = model.time(gd, flops, fit.peak, flags if model.flag_log.size else None) / fit.rate
            for impl in sorted(set(dims[:, 7].astype(int).tolist()) - {0}):
                sel = dims[:, 7] == impl
                t[sel] /= self._impl_rates(fit, ATTN_IMPLS[impl], dims[sel, 4] > 0, dims[sel, 3])
            return t
        gd = self._gemm_dims(kind, dims, kt) / fit.kappa
        flags = conv_flags(dims[:, 5], dims[:, 6], dims[:, 7], dims[:, 8], dims[:, 1]) if model.flag_log.size else None
        return model.time(gd, flops, fit.peak, flags) / fit.rate

    def _impl_rates(self, fit: _ClassFit, name: str, causal: np.ndarray, head_dim: np.ndarray) -> np.ndarray:
        """Per attention row run by kernel ``name`` (not FlashAttention-2), its measured rate against
        ``fit``, the FlashAttention-2 fit of the measured GPU it reads (:func:`harness.core.board_rate.impl_rate`);
        a one-line error where that GPU never ran the kernel."""
        gpu, prec = fit.source
        measured = self.table.get("attention_impls", {})
        entry = measured.get(gpu, {}).get(name)
        if entry is None:
            where = [g for g, per in measured.items() if name in per]
            raise CalibrationError(f"model.attention={name}: that kernel was measured on {', '.join(where) or 'no GPU'} only, not "
                                   f"on an {gpu}: use model.attention=flash there")
        key = (gpu, name)
        if key not in self._impl_cache:
            self._impl_cache[key] = attention_rates(entry["rows"], fit.model, REFERENCE_PEAK_TFLOPS[(gpu, prec)] * 1e12)
        rates = self._impl_cache[key]
        return np.array([impl_rate(entry["rows"], rates, bool(c), int(d)) for c, d in zip(causal, head_dim)])

    def _sustained(self, seconds: np.ndarray) -> np.ndarray:
        """Kernel seconds as a training step sustains them: the isolated kernels' (the fits') over
        ``costs.in_situ``, the fraction of its isolated rate a kernel keeps inside a step."""
        return seconds if self.in_situ == 1.0 else np.asarray(seconds) / self.in_situ

    def compute_time(self, graph: OpGraph, node: int, device: int, fraction: float = 1.0) -> float:
        return float(self.node_times(graph, device, fraction)[node])

    # ------------------------------------------------------------------ communication
    def transfer_time(self, nbytes: float, src: int, dst: int) -> float:
        return self.analytical.transfer_time(nbytes, src, dst)

    def transfer_routes(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self.analytical.transfer_routes()

    def allreduce_time(self, nbytes: float | np.ndarray, devices: Sequence[int]) -> float | np.ndarray:
        """NCCL's all-reduce on the cluster's fabric (:func:`harness.core.fabric.placed_collective_time`
        on :func:`harness.core.fabric.fabric_of`, the collective model the stack simulator prices
        its collectives with), the group placed as its devices' hosts place it; a parameter
        server (``sync: ps``), a device without kernel fits or a cluster the fabric cannot
        describe (nodes of unequal size) is the analytical model's.  0 where ``nbytes <= 0``."""
        devs = list(devices)
        p = len(devs)
        if p <= 1:
            return affine_bytes(nbytes, 0.0, 0.0)
        fabric = self._fabric() if self.sync == "ring" else None
        if fabric is None or not all(self.calibrated(self.cluster.devices[d].spec.kind) for d in devs):
            return self.analytical.allreduce_time(nbytes, devs)
        key = tuple(int(d) for d in devs)
        pl = self._placements.get(key)
        if pl is None:
            pl = self._placements[key] = placement_of(self.cluster, key, fabric.pod_nodes)
        self._allreduce_used = True  # the report names the fabric's sources
        if np.ndim(nbytes) == 0:
            x = float(nbytes)
            return placed_collective_time(fabric, "all_reduce", x, p, pl) if x > 0 else 0.0
        nb = np.asarray(nbytes, dtype=np.float64)
        sizes, inverse = np.unique(nb, return_inverse=True)
        times = np.array([placed_collective_time(fabric, "all_reduce", x, p, pl) if x > 0 else 0.0 for x in sizes.tolist()])
        return times[inverse].reshape(nb.shape)

    def _fabric(self) -> Fabric | None:
        """The cluster's fabric with its NCCL calibration (read once: a cluster is immutable);
        None where :func:`harness.core.fabric.fabric_of` cannot describe it."""
        if not self._fabric_read:
            self._fabric_read = True
            try:
                self._fabric_cache = fabric_of(self.cluster)
            except ClusterError as e:
                self._fabric_error = str(e)
        return self._fabric_cache

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
            fwd, bwd = self.analytical.layer_times(lgraph, device, fraction, nodes)
            return self._sustained(fwd), self._sustained(bwd)
        fwd_k, bwd_k = _layer_kernels(lgraph)
        idx = np.arange(lgraph.num_nodes) if nodes is None else np.asarray(nodes)
        frac = np.broadcast_to(np.asarray(fraction, dtype=np.float64), (len(idx),))
        a_fwd, a_bwd = self._roofline(spec).layer_times(lgraph, device, frac, idx)
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
            out.append(self._sustained(res))
        return out[0], out[1]

    # ------------------------------------------------------------------ reporting
    def report(self) -> dict[str, Any]:
        """Which fit costed each device kind so far (``extrapolated`` where it is) and, once an
        all-reduce was priced on the fabric, where its figures come from
        (:func:`harness.core.fabric.fabric_report`: NCCL's model, and inside a node and across
        nodes the calibration's source - ``datasheet`` or the measured system - and bandwidths)."""
        out: dict[str, Any] = {"model": "calibrated", "table": str(self.table_path),
                               "devices": {kind: "; ".join(sorted(labels)) for kind, labels in self._used.items()}}
        if self.in_situ != 1.0:
            out["in_situ"] = f"every kernel at {self.in_situ:.3f} of its isolated rate (costs.in_situ)"
        if self.overlap_slowdown:
            out["overlap_slowdown"] = (f"an op overlapping a collective {100 * self.overlap_slowdown:.1f} % slower while it runs "
                                       "(costs.overlap_slowdown)")
        if self._allreduce_used and self._fabric_cache is not None:
            out["allreduce"] = fabric_report(self._fabric_cache)
        elif self._fabric_error:
            out["allreduce"] = {"model": "analytical ring (the fabric cannot describe this cluster)", "reason": self._fabric_error}
        return out

    def describe(self) -> dict[str, Any]:
        return {"model": "calibrated", "table": str(self.table_path), "devices": self.devices,
                "mem_efficiency": self.mem_eff, "launch_us": self.launch * 1e6, "sync": self.sync, "in_situ": self.in_situ,
                "overlap_slowdown": self.overlap_slowdown}


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
