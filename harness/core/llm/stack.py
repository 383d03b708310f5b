"""The stack graph: a model as an ordered chain of pipeline-partitionable units (graph kind ``"stack"``).

A transformer is its embedding, its ``layers`` blocks and its head (:func:`transformer_stack`);
no traced graph of the whole model is needed: a block is costed once per distinct shape and
shard (:meth:`StackGraph.signature`, :func:`harness.core.llm.work.unit_times`).  A CNN of the zoo
is a chain of units cut from its layer graph (:func:`layer_stack`), so that GPipe and the other
pipeline schedules run on ResNet too.

A unit records what a pipeline partition needs without costing anything: its parameters (and
how many of them are MoE experts), the FLOPs of one sample's forward through it, and the bytes
of the activation it hands on (what a pipeline boundary after it sends), per sample, unsharded.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from harness.core.errors import ModelConfigError
from harness.core.llm.flops import unit_forward_flops
from harness.core.llm.spec import TransformerSpec
from harness.core.precision import Precision

UNIT_KINDS: tuple[str, ...] = ("embedding", "block", "head", "layer")
#: the ``graph_identity`` format of a stack graph (strategy.json)
STACK_FORMAT = "harness.stackgraph/1"
#: layer kinds that start a unit of a CNN's stack graph (GEMM-like layers: the roofline's
#: ``conv`` and ``gemm`` classes); the cheap layers after one (norms, activations, pools, adds) join it
HEAVY_LAYER_KINDS = frozenset({"conv1d", "conv2d", "conv3d", "linear", "matmul", "lstm", "gru", "rnn"})
#: bytes per element of a dtype name
DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True)
class StackUnit:
    """One pipeline-partitionable unit (see the module docstring)."""

    kind: str               # one of UNIT_KINDS ("layer": a run of a CNN's layer graph)
    name: str
    params: int             # parameter elements, unsharded
    expert_params: int      # of which in MoE experts (sharded by EP)
    flops_fwd: float        # forward FLOPs of one sample (one sequence) through the unit, unsharded
    out_bytes: float        # bytes of the activation it hands to the next unit, per sample (what a pipeline boundary after it sends)
    moe: bool = False


def activation_dtype(precision: str) -> str:
    """The dtype activations are kept in under ``precision``: the autocast dtype under AMP, else
    the model's (``fp16_master``'s FP16 copy; ``fp32`` and ``tf32`` keep FP32 activations)."""
    prec = Precision(precision)
    return prec.compute_dtype


def activation_bytes(precision: str) -> int:
    """Bytes per activation element under ``precision`` (2 for 16-bit, 4 for FP32)."""
    return DTYPE_BYTES[activation_dtype(precision)]


@dataclass(eq=False)
class StackGraph:
    """A model as a chain of units (see the module docstring); ``batch_size`` is the global
    batch (sequences, or samples for a CNN), ``seq_len`` 1 for a CNN."""

    name: str
    units: list[StackUnit]
    batch_size: int
    seq_len: int
    precision: str
    spec: TransformerSpec | None
    layer_graph: Any = None
    unit_nodes: list[np.ndarray] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: memo of :func:`harness.core.llm.work.unit_times`: cost model -> {(signature, shard, device kind): UnitTimes}
    unit_cache: "weakref.WeakKeyDictionary[Any, dict[Any, Any]]" = field(default_factory=weakref.WeakKeyDictionary, repr=False)

    def __post_init__(self) -> None:
        if not self.units:
            raise ModelConfigError(f"model {self.name!r}: a stack graph needs at least one unit")
        bad = [u.kind for u in self.units if u.kind not in UNIT_KINDS]
        if bad:
            raise ModelConfigError(f"model {self.name!r}: unit kind {bad[0]!r} is not one of {', '.join(UNIT_KINDS)}")
        Precision(self.precision)
        self.batch_size, self.seq_len = int(self.batch_size), int(self.seq_len)
        self._fingerprint: str | None = None

    @property
    def num_nodes(self) -> int:
        """The number of units."""
        return len(self.units)

    @property
    def kind(self) -> str:
        return "stack"

    def signature(self, u: int) -> tuple:
        """Units with equal signatures cost the same under the same shard: every dense block of a
        transformer is one costing (its kind, whether it is MoE, the shape, the sequence and the
        precision); a CNN's units are each their own."""
        unit = self.units[u]
        if self.spec is not None and unit.kind != "layer":
            return (unit.kind, unit.moe, self.spec, self.seq_len, self.precision)
        return ("layer", self.fingerprint(), u)

    def params(self) -> int:
        """All parameter elements."""
        return sum(u.params for u in self.units)

    def fingerprint(self) -> str:
        """A digest of the units, the shape, the sequence length and the precision (the batch aside)."""
        if self._fingerprint is None:
            body = {"units": [asdict(u) for u in self.units], "seq_len": self.seq_len, "precision": self.precision,
                    "spec": asdict(self.spec) if self.spec is not None else None}
            self._fingerprint = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return self._fingerprint

    def to_dict(self) -> dict[str, Any]:
        """The graph's identity and units (strategy.json); a CNN's layer graph is not included."""
        return {"format": STACK_FORMAT, "kind": "stack", "name": self.name, "batch_size": self.batch_size,
                "seq_len": self.seq_len, "precision": self.precision, "num_units": self.num_nodes,
                "params": self.params(), "fingerprint": self.fingerprint(),
                "spec": asdict(self.spec) if self.spec is not None else None,
                "units": [asdict(u) for u in self.units]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StackGraph":
        """The graph :meth:`to_dict` wrote (without a CNN's layer graph: its units cannot be costed again)."""
        try:
            spec = TransformerSpec(**d["spec"]) if d.get("spec") else None
            units = [StackUnit(**u) for u in d["units"]]
            return cls(str(d["name"]), units, int(d["batch_size"]), int(d["seq_len"]), str(d["precision"]), spec)
        except (KeyError, TypeError, ValueError) as e:
            raise ModelConfigError(f"malformed stack graph: {type(e).__name__}: {e}") from None

    def __repr__(self) -> str:
        return f"StackGraph({self.name!r}, {self.num_nodes} units, batch {self.batch_size}, seq {self.seq_len}, {self.precision})"


def transformer_stack(spec: TransformerSpec, batch_size: int, precision: str = "fp32", name: str | None = None,
                      meta: Mapping[str, Any] | None = None) -> StackGraph:
    """A transformer's stack graph: ``embedding``, ``block0`` .. ``block{l-1}``, ``head``."""
    a = activation_bytes(precision)
    s, h = spec.seq_len, spec.hidden
    units = [StackUnit("embedding", "embedding", spec.embedding_params(), 0, unit_forward_flops(spec, "embedding", False),
                       float(s * h * a))]
    for i in range(spec.layers):
        moe = spec.is_moe_layer(i)
        other, experts = spec.block_params(moe)
        units.append(StackUnit("block", f"block{i}", other + experts, experts, unit_forward_flops(spec, "block", moe),
                               float(s * h * a), moe))
    units.append(StackUnit("head", "head", spec.head_params(), 0, unit_forward_flops(spec, "head", False), 0.0))
    return StackGraph(name or spec.name, units, batch_size, s, precision, spec, meta=dict(meta or {}))


def layer_stack(lgraph: Any, name: str, batch_size: int, precision: str) -> StackGraph:
    """A CNN's stack graph from its layer graph (built at ``batch_size``): one unit per GEMM-like
    layer (:data:`HEAVY_LAYER_KINDS`) with the cheap layers that follow it in the layer graph's
    topological order (the inputs and whatever precedes the first such layer join the first
    unit).  A unit's ``out_bytes`` are those of every tensor crossing the cut after it, once each
    (a cut inside a residual block carries both the branch and the shortcut), per sample."""
    n = lgraph.num_nodes
    kinds = list(lgraph.kinds)
    heavy = [v for v in range(n) if kinds[v] in HEAVY_LAYER_KINDS]
    starts = [0] + heavy[1:] if heavy else [0]
    bounds = [*starts, n]
    B = float(lgraph.meta.get("batch_size", batch_size) or batch_size)
    crossing = _crossing_bytes(lgraph) / B
    itemsize = DTYPE_BYTES.get(str(lgraph.meta.get("dtype", "float32")), 4)
    units, nodes = [], []
    for i in range(len(starts)):
        lo, hi = bounds[i], bounds[i + 1]
        idx = np.arange(lo, hi)
        params = int(np.asarray(lgraph.param_bytes)[idx].sum()) // itemsize
        first = next((v for v in idx if kinds[v] in HEAVY_LAYER_KINDS), lo)
        units.append(StackUnit("layer", f"{lgraph.names[first]}", params, 0, float(np.asarray(lgraph.flops_fwd)[idx].sum()) / B,
                               float(crossing[hi]) if hi < n else 0.0))
        nodes.append(idx)
    return StackGraph(name, units, batch_size, 1, precision, None, layer_graph=lgraph, unit_nodes=nodes,
                      meta={"layer_nodes": n})


def _crossing_bytes(lgraph: Any) -> np.ndarray:
    """Per cut position ``c`` (``0..n``: between node ``c-1`` and node ``c``), the bytes of the
    tensors produced before it and read after it, each tensor (producer, output port) once."""
    n = lgraph.num_nodes
    src, dst, nb = np.asarray(lgraph.src, np.int64), np.asarray(lgraph.dst, np.int64), np.asarray(lgraph.nbytes, np.float64)
    port = np.asarray(lgraph.src_port, np.int64) if getattr(lgraph, "src_port", None) is not None else np.zeros(len(src), np.int64)
    diff = np.zeros(n + 2)
    if len(src):
        key = src * (int(port.max()) + 1) + port
        order = np.lexsort((-dst, key))                 # per tensor, its farthest reader first
        first = np.ones(len(order), bool)
        first[1:] = key[order][1:] != key[order][:-1]
        t = order[first]
        np.add.at(diff, src[t] + 1, nb[t])              # crosses cuts src+1 .. last reader
        np.add.at(diff, dst[t] + 1, -nb[t])
    return np.cumsum(diff)[: n + 1]
