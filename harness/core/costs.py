"""Cost models: what turns FLOPs and bytes into seconds.

Every algorithm and the simulator see costs only through :class:`CostModel`.  The
analytical model here is a roofline; a profiled model (measured operator times) plugs in
behind the same interface.

* compute: ``max(FLOPs / (peak x class efficiency), bytes / (memory bandwidth x efficiency)) + launch``
  for a node that runs a kernel; views, getitem and detach (``graph.free``) cost nothing.
* transfer (alpha-beta along the route): ``sum(lat) + bytes / min(bw)``.
* gradient synchronisation: ring all-reduce ``2(p-1)/p * bytes / B + 2(p-1) * alpha``
  (B, alpha: the slowest hop of the ring, or a cluster's measured ``collective: {lat_us, bw_GBps}``
  when it has one, as cpu2 from ``python -m harness.calibrate``), or a parameter server on the group's first
  device: ``2 * ((p-1) * bytes / B_ps + alpha)`` (OptCNN's t_S).
* kernels (:meth:`AnalyticalCostModel.kernel_times`, a transformer block's kernels written by
  :mod:`harness.core.llm.work`): the same roofline per kernel row, at the row's own math peak
  (:func:`math_peak`), FLOPs and bytes from :class:`harness.core.kernels.KernelTable`, GEMMs at
  the ``gemm`` efficiency, convolution passes at ``conv``, fused attention at ``attention``,
  memory-bound rows at the memory bandwidth, plus the launch overhead per row.
* layer shards (:meth:`AnalyticalCostModel.layer_times`, the layer graph's OptCNN t_C split
  into forward and backward): the same roofline on a layer's ``flops_fwd`` / ``flops_bwd`` and
  its memory traffic (``io_bytes`` forward, twice that backward), scaled by the shard's
  fraction of the iteration domain; inputs and views cost nothing.

The figures are checked when a model is built (:func:`check_roofline`): efficiencies in
(0, 1] by op class (``conv``, ``gemm``, ``attention``, ``other``), ``mem_efficiency`` in (0, 1],
``launch_us`` >= 0, ``sync`` ring or ps; a bad one is a :class:`CostModelError` naming its key
(``costs.efficiency.gemm must be in (0, 1], got 1.5``).

Measured times: a graph's ``node_time_s`` (a graph file's measured seconds per node and device
kind, :mod:`harness.core.graph`) replaces every model's estimate of a measured node on a device
of that kind, in the one place models answer per-node times (:func:`with_measured`, called by
each model's ``node_times``).  A shard that does ``fraction`` of a node's work (the simulator's
data-parallel shard of a batch-scaled node, ``OpGraph.batch_scaled``) takes ``fraction`` of the
measured time: the measurement is the whole node's, split linearly with the batch; a node that
is not batch-scaled runs whole (``fraction`` 1) and takes all of it.
"""

from __future__ import annotations

import inspect
import re
import weakref
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from harness.core.cluster import Cluster, DeviceSpec

from harness.core.checks import non_negative_number, unit_fraction
from harness.core.errors import UserError
from harness.core.graph import UPDATE, OpGraph
from harness.core.kernels import ATTN, CONV_KINDS, GEMM, MEM, KernelTable

if TYPE_CHECKING:
    from harness.core.layergraph import LayerGraph

#: op classes of the roofline, matched against the aten target in this order
OP_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("conv", re.compile(r"^aten\.(convolution|_convolution|convolution_backward|cudnn_convolution|conv\w*)\b")),
    ("gemm", re.compile(r"^aten\.(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_dot_product\w*)\b")),
)


#: roofline class of a layer graph kind (the rest are ``other``)
LAYER_CLASSES: dict[str, str] = {
    "conv1d": "conv", "conv2d": "conv", "conv3d": "conv",
    "linear": "gemm", "matmul": "gemm", "lstm": "gemm", "gru": "gemm", "rnn": "gemm",
}
#: layer kinds that run no kernel (an input is written by the data loader; a view aliases)
FREE_LAYER_KINDS = frozenset({"input", "view"})


class CostModelError(UserError, ValueError):
    """A cost-model figure is out of range or a key is unknown; the message names the key."""


#: the roofline's op classes and their default efficiencies (``costs.efficiency``); ``attention``
#: is a fused attention kernel's (FlashAttention-2, Dao 2023: 50-73 % of an A100's peak forward,
#: less backward; 0.6 is inside that range, an assumption like the others, not a fit)
DEFAULT_EFFICIENCY: dict[str, float] = {"conv": 0.5, "gemm": 0.7, "attention": 0.6, "other": 1.0}


def _efficiency_table(efficiency: Mapping[str, Any] | None, key: str) -> dict[str, float]:
    """The efficiency of every op class: the defaults overridden by ``efficiency`` (each in (0, 1])."""
    given = dict(efficiency or {})
    unknown = [str(k) for k in given if k not in DEFAULT_EFFICIENCY]
    if unknown:
        raise CostModelError(f"{key}.{unknown[0]} is not an op class: the roofline's classes are {', '.join(DEFAULT_EFFICIENCY)}")
    return {**DEFAULT_EFFICIENCY, **{k: unit_fraction(v, f"{key}.{k}", CostModelError) for k, v in given.items()}}


def _sync_mode(sync: Any, key: str) -> str:
    """``ring`` (ring all-reduce) or ``ps`` (parameter server)."""
    if sync not in ("ring", "ps"):
        raise CostModelError(f"{key} must be 'ring' or 'ps', got {sync!r}")
    return str(sync)


#: the analytical model's figures and how each is checked and converted (value, key) -> value
ROOFLINE_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "efficiency": _efficiency_table,
    "mem_efficiency": lambda v, key: unit_fraction(v, key, CostModelError),
    "launch_us": lambda v, key: non_negative_number(v, key, CostModelError),
    "sync": _sync_mode,
    "overlap_slowdown": lambda v, key: non_negative_number(v, key, CostModelError),
}


def stolen_fraction(overlap_slowdown: float) -> float:
    """The fraction of an overlapped collective's seconds the op it overlaps loses: a kernel
    ``overlap_slowdown`` slower while the collective's NCCL kernel holds some of the GPU's SMs
    does ``1 / (1 + slowdown)`` of its work in that time, so it ends ``slowdown / (1 + slowdown)``
    of the collective's duration later (``CostModel.overlap_slowdown``)."""
    return overlap_slowdown / (1.0 + overlap_slowdown)


def config_keys(owner: type) -> list[str]:
    """The keyword parameters a cost-model class takes from its config: its own and its bases'
    (a subclass passes the keys it does not take on to its base, as ``PaseCostModel`` does;
    ``cluster`` is given by the harness)."""
    keys: list[str] = []
    for cls in owner.__mro__:
        if "__init__" not in vars(cls) or cls is object:
            continue
        for name, p in inspect.signature(cls.__init__).parameters.items():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in ("self", "cluster", *keys):
                keys.append(name)
    return keys


def refuse_unknown(owner: type, unknown: Mapping[str, Any]) -> None:
    """Refuse config keys the cost model ``owner`` does not take (``+costs.<key>=...``), naming
    the first and listing those it takes."""
    if unknown:
        raise CostModelError(f"costs.{next(iter(unknown))} is not a parameter of {owner.__name__}: it takes {', '.join(config_keys(owner))}")


def check_roofline(block: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The analytical model's figures given in a config block (``costs``, ``costs.fallback``),
    checked and converted; a key the model does not take or a value out of range is a
    :class:`CostModelError` naming ``<key>.<name>``."""
    unknown = [str(k) for k in block if k not in ROOFLINE_CHECKS]
    if unknown:
        raise CostModelError(f"{key}.{unknown[0]} is not a figure of the analytical model: it takes {', '.join(ROOFLINE_CHECKS)}")
    return {k: ROOFLINE_CHECKS[k](v, f"{key}.{k}") for k, v in block.items()}


def op_class(target: str) -> str:
    """The roofline class of an aten target: ``conv``, ``gemm`` or ``other``."""
    for name, pat in OP_CLASSES:
        if pat.match(target):
            return name
    return "other"


def op_classes(targets: Sequence[str]) -> list[str]:
    """:func:`op_class` of every target, each distinct target matched once (a graph has few)."""
    by_target = {t: op_class(t) for t in set(targets)}
    return [by_target[t] for t in targets]


def with_measured(graph: Any, kind: str, fraction: float, times: np.ndarray) -> np.ndarray:
    """``times`` (a model's estimates for every node of ``graph`` on a device of ``kind`` doing
    ``fraction`` of its work) with each node the graph has a measured time for on that kind (or
    on ``"*"``) replaced by ``fraction`` x that time.  The same array when nothing applies, so a
    graph without measurements costs exactly what it did."""
    measured = graph.measured_times(kind) if isinstance(graph, OpGraph) else None
    if measured is None:
        return times
    return np.where(np.isnan(measured), times, measured * fraction)


def affine_bytes(nbytes: float | np.ndarray, fixed: float, per_byte: float) -> float | np.ndarray:
    """``fixed + per_byte * nbytes`` where ``nbytes > 0``, else 0: a collective's alpha-beta time,
    a float for a float and an array for an array."""
    if np.ndim(nbytes) == 0:
        return float(fixed + per_byte * nbytes) if nbytes > 0 else 0.0
    nb = np.asarray(nbytes, dtype=np.float64)
    return np.where(nb > 0, fixed + per_byte * nb, 0.0)


@runtime_checkable
class CostModel(Protocol):
    """What algorithms and the simulator may ask about time and memory."""

    cluster: Cluster

    def node_times(self, graph: OpGraph, device: int, fraction: float = 1.0) -> np.ndarray:
        """Seconds of every node of ``graph`` on ``device`` when it processes ``fraction`` of its work."""
        ...

    def compute_time(self, graph: OpGraph, node: int, device: int, fraction: float = 1.0) -> float:
        """w_i: seconds of one node (or one shard of it) on one device."""
        ...

    #: how gradients are synchronised among replicas: ``ring`` (NCCL's ring all-reduce) or ``ps``
    sync: str
    #: how much slower a kernel runs while a collective's NCCL kernel shares its GPU (0.189: 18.9 %
    #: slower); the simulator charges an op running as an overlapped collective ends
    #: ``slowdown / (1 + slowdown)`` of the collective's seconds (:func:`stolen_fraction`)
    overlap_slowdown: float

    def transfer_time(self, nbytes: float, src: int, dst: int) -> float:
        """c_ij: seconds to move ``nbytes`` from device ``src`` to device ``dst`` (0 when equal)."""
        ...

    def transfer_routes(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(latency in s, bandwidth in bytes/s) ``[D, D]`` when :meth:`transfer_time` is exactly
        ``lat[src, dst] + nbytes / bw[src, dst]`` (0 on the diagonal and for no bytes), so that a
        scheduler may read the tables instead of calling it (and a compiled kernel can); None
        when it is not.  A model that changes :meth:`transfer_time` answers this too."""
        ...

    def report(self) -> dict[str, Any]:
        """What the model looked up for the graph it costed last (``costs_report`` in result.json)."""
        ...

    def allreduce_time(self, nbytes: float | np.ndarray, devices: Sequence[int]) -> float | np.ndarray:
        """Seconds to synchronise ``nbytes`` of gradients among ``devices`` (0 for nothing to send
        or one device); an array of sizes gives an array of seconds, one call for many layers."""
        ...

    def memory(self, graph: OpGraph) -> np.ndarray:
        """Bytes each node adds to its device's memory (output plus parameters it owns)."""
        ...

    def layer_times(self, lgraph: "LayerGraph", device: int, fraction: float | np.ndarray = 1.0,
                    nodes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) seconds of a shard doing ``fraction`` of each layer on ``device``
        (OptCNN's t_C = forward + backward); for ``nodes`` only when given (``fraction`` then
        one value per entry)."""
        ...

    def kernel_times(self, kernels: KernelTable, device: int, num_nodes: int = 1) -> np.ndarray:
        """Seconds of each node ``0..num_nodes-1`` of a kernel table on ``device``: the sum of its
        rows' times, each row the whole kernel as its dims say (a transformer block's kernels on
        one GPU, :func:`harness.core.llm.work.unit_work`)."""
        ...


class AnalyticalCostModel:
    """Roofline costs from the cluster's datasheet figures (the default ``costs=analytical``)."""

    def __init__(
        self,
        cluster: Cluster,
        efficiency: Mapping[str, float] | None = None,
        mem_efficiency: float = 0.8,
        launch_us: float = 5.0,
        sync: str = "ring",
        overlap_slowdown: float = 0.0,
        **unknown: Any,
    ) -> None:
        refuse_unknown(type(self), unknown)
        fig = check_roofline({"efficiency": efficiency, "mem_efficiency": mem_efficiency, "launch_us": launch_us, "sync": sync,
                              "overlap_slowdown": overlap_slowdown}, "costs")
        self.cluster = cluster
        self.efficiency = fig["efficiency"]
        self.mem_efficiency = fig["mem_efficiency"]
        self.launch = fig["launch_us"] * 1e-6
        self.sync = fig["sync"]
        self.overlap_slowdown = fig["overlap_slowdown"]
        self._parts: "weakref.WeakKeyDictionary[OpGraph, dict[str, tuple[np.ndarray, np.ndarray]]]" = weakref.WeakKeyDictionary()

    # -- compute
    def _roofline_parts(self, graph: OpGraph, device: int) -> tuple[np.ndarray, np.ndarray]:
        """(seconds of the fraction-scaled part, seconds of the fixed part) per node on a device kind."""
        spec = self.cluster.devices[device].spec
        per_graph = self._parts.setdefault(graph, {})
        if spec.kind not in per_graph:
            eff = np.array([self.efficiency.get(c, self.efficiency["other"]) for c in op_classes(graph.targets)])
            t_flop = graph.flops / (node_peaks(graph, spec) * eff)
            t_mem = graph.work_bytes / (spec.mem_bw * self.mem_efficiency)
            scaled = np.where(graph.free, 0.0, np.maximum(t_flop, t_mem))
            fixed = np.where(graph.free, 0.0, self.launch)
            per_graph[spec.kind] = (scaled, fixed)
        return per_graph[spec.kind]

    def node_times(self, graph: OpGraph, device: int, fraction: float = 1.0) -> np.ndarray:
        scaled, fixed = self._roofline_parts(graph, device)
        return with_measured(graph, self.cluster.devices[device].spec.kind, fraction, scaled * fraction + fixed)

    def compute_time(self, graph: OpGraph, node: int, device: int, fraction: float = 1.0) -> float:
        measured = graph.measured_times(self.cluster.devices[device].spec.kind) if isinstance(graph, OpGraph) else None
        if measured is not None and not np.isnan(measured[node]):
            return float(measured[node] * fraction)
        scaled, fixed = self._roofline_parts(graph, device)
        return float(scaled[node] * fraction + fixed[node])

    # -- communication
    def transfer_time(self, nbytes: float, src: int, dst: int) -> float:
        if src == dst or nbytes <= 0:
            return 0.0
        return float(self.cluster.route_lat[src, dst] + nbytes / self.cluster.route_bw[src, dst])

    def transfer_routes(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self.cluster.route_lat, self.cluster.route_bw

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": "analytical", "sync": self.sync}
        if self.overlap_slowdown:
            out["overlap_slowdown"] = self.overlap_slowdown
        return out

    def allreduce_time(self, nbytes: float | np.ndarray, devices: Sequence[int]) -> float | np.ndarray:
        devs = list(devices)
        p = len(devs)
        if p <= 1:
            return affine_bytes(nbytes, 0.0, 0.0)
        if self.sync == "ps":
            ps = devs[0]
            bw = min(self.cluster.route_bw[w, ps] for w in devs[1:])
            lat = max(self.cluster.route_lat[w, ps] for w in devs[1:])
            return affine_bytes(nbytes, 2 * lat, 2 * (p - 1) / bw)
        coll = self.cluster.meta.get("collective")
        if coll:  # a measured collective (harness.app.calibrate), in the ring formula's terms
            bw, lat = float(coll["bw_GBps"]) * 1e9, float(coll["lat_us"]) * 1e-6
        else:
            hops = [(devs[k], devs[(k + 1) % p]) for k in range(p)]
            bw = min(self.cluster.route_bw[a, b] for a, b in hops)
            lat = max(self.cluster.route_lat[a, b] for a, b in hops)
        return affine_bytes(nbytes, 2 * (p - 1) * lat, 2 * (p - 1) / p / bw)

    # -- memory
    def memory(self, graph: OpGraph) -> np.ndarray:
        return node_memory(graph)

    # -- kernel tables (a transformer block's kernels)
    def kernel_row_times(self, kernels: KernelTable, device: int) -> np.ndarray:
        """Roofline seconds of each row of ``kernels`` on ``device`` (see the module docstring)."""
        spec = self.cluster.devices[device].spec
        kind = kernels.kind
        peaks = np.array([math_peak(spec, m) for m in range(len(MATH_PEAK_KEYS))])[kernels.math.astype(np.int64)]
        eff = np.select([kind == GEMM, np.isin(kind, CONV_KINDS), kind == ATTN],
                        [self.efficiency["gemm"], self.efficiency["conv"], self.efficiency["attention"]], self.efficiency["other"])
        t_flop = kernels.flops() / (peaks * eff)
        t_mem = kernels.nbytes() / (spec.mem_bw * self.mem_efficiency)
        return np.where(kind == MEM, t_mem, np.maximum(t_flop, t_mem)) + self.launch

    def kernel_times(self, kernels: KernelTable, device: int, num_nodes: int = 1) -> np.ndarray:
        if not len(kernels):
            return np.zeros(num_nodes)
        return np.bincount(kernels.node, weights=self.kernel_row_times(kernels, device), minlength=num_nodes)

    # -- layer graph shards (OptCNN t_C)
    def _layer_parts(self, lgraph: "LayerGraph", device: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(forward scaled, backward scaled, fixed) seconds per layer on a device kind."""
        spec = self.cluster.devices[device].spec
        cache = getattr(self, "_lparts", None)
        if cache is None:
            cache = self._lparts = weakref.WeakKeyDictionary()
        per_graph = cache.setdefault(lgraph, {})
        if spec.kind not in per_graph:
            dtype = str(lgraph.meta.get("dtype", "float32"))
            eff = np.array([self.efficiency.get(LAYER_CLASSES.get(k, "other"), self.efficiency["other"]) for k in lgraph.kinds])
            free = np.array([k in FREE_LAYER_KINDS for k in lgraph.kinds], dtype=bool)
            peak = spec.peak(dtype) * eff
            mem = spec.mem_bw * self.mem_efficiency
            io = lgraph.io_bytes.astype(np.float64)
            fwd = np.where(free, 0.0, np.maximum(lgraph.flops_fwd / peak, io / mem))
            bwd = np.where(free, 0.0, np.maximum(lgraph.flops_bwd / peak, 2.0 * io / mem))
            per_graph[spec.kind] = (fwd, bwd, np.where(free, 0.0, self.launch))
        return per_graph[spec.kind]

    def layer_times(self, lgraph: "LayerGraph", device: int, fraction: float | np.ndarray = 1.0,
                    nodes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        fwd, bwd, fixed = self._layer_parts(lgraph, device)
        if nodes is not None:
            fwd, bwd, fixed = fwd[nodes], bwd[nodes], fixed[nodes]
        return fwd * fraction + fixed, bwd * fraction + fixed


#: the peak key of each math mode (harness.core.precision.MATH: fp32, tf32, fp16, bf16, fp64, int, fp8)
MATH_PEAK_KEYS: tuple[str, ...] = ("float32", "tf32", "float16", "bfloat16", "float32", "float32", "float8")


def math_peak(spec: DeviceSpec, math: int) -> float:
    """FLOP/s of a kernel in math mode ``math`` on ``spec``: its tensor-core peak where the
    device has one for that mode, else its FP32 peak (TF32 on a V100 runs as FP32).  FP8 is the
    dense ``float8`` peak (E4M3 and E5M2 run at one rate: H100 SXM5 1,978.9 TFLOPS, the
    whitepaper's figure); a device without one never gets an FP8 kernel
    (:meth:`harness.core.precision.Precision.check_device` refuses ``amp_fp8`` there)."""
    return spec.peak_flops.get(MATH_PEAK_KEYS[int(math)], spec.peak_flops["float32"])


def node_peaks(graph: OpGraph, spec: DeviceSpec) -> np.ndarray:
    """Per node, the peak FLOP/s of its math mode (its most FLOP-heavy kernel's,
    :meth:`harness.core.kernels.KernelTable.node_math`); a graph without a kernel table runs every
    node at the peak of its ``meta["dtype"]``."""
    if graph.kernels is None:
        return np.full(graph.num_nodes, spec.peak(str(graph.meta.get("dtype", "float32"))))
    table = np.array([math_peak(spec, m) for m in range(len(MATH_PEAK_KEYS))])
    return table[graph.kernels.node_math(graph.num_nodes)]


def node_memory(graph: OpGraph) -> np.ndarray:
    """Bytes each node adds to a device: its output (views alias their input, updates are in
    place) plus every parameter it is the first node to read."""
    out = np.where(graph.free | (graph.phase == UPDATE), 0, graph.out_bytes).astype(np.int64)
    first = graph.param_first_reader()
    has = first >= 0
    np.add.at(out, first[has], graph.param_bytes[has])
    return out
