"""The layer graph (``LayerGraph``): one node per layer of a DNN, forward and backward together.

This is the computation graph of OptCNN (Jia, Lin, Qi and Aiken, ICML 2018, Sec. 4: "each node
l_i is a layer ... each edge (l_i, l_j) is a tensor that is an output of l_i and an input of
l_j") and of PaSE (vertex elimination: "each operation v has an iteration domain whose size is
represented by an ordered set"). Configuration search (OptCNN node/edge elimination, PaSE's
vertex elimination) runs on it; it is stored array-first so that sweeping every node's configs
is cheap.

Conventions
-----------
*Node ids* are a topological order: every edge has ``src < dst``.

*Iteration domain* ``dims[v]``: an ordered ``dim name -> size`` dict (PaSE's v.dim). Names are
local to a node, but shared conventions make configs comparable across nodes: ``"sample"`` is
always the batch (OptCNN's sample dimension), ``"channel"`` the output channel / feature,
``"height"``, ``"width"``, ``"length"``, ``"depth"`` spatial positions of the output,
``"in_channel"`` and ``"kernel_*"`` reduction dims of a convolution, ``"m"``, ``"n"``, ``"k"``
the GEMM dims of a matmul. ``parallel_dims[v]`` lists the dims a configuration may split
(OptCNN Table 1); reduction dims are in ``dims`` (they matter for FLOPs and for PaSE's GEMM
view) but not in ``parallel_dims``.

*Axis maps*: ``out_dims[v][a]`` names the iteration dim that indexes axis ``a`` of v's output,
``in_dims[v][p][a]`` the dim that indexes axis ``a`` of v's input port ``p``. They turn a split
of the iteration space into the tensor region each shard reads or writes (see
:meth:`LayerGraph.in_region` / :meth:`LayerGraph.out_region`), which is what OptCNN's t_X and
PaSE's t_E need. For an axis named ``d`` of length ``n`` where ``dims[d] == N``:

* ``n == N``: the shard covering ``[lo, hi)`` of ``d`` touches ``[lo, hi)`` of the axis;
* ``n != N``: proportional, ``[lo*n//N, ceil(hi*n/N))``. This covers several axes folded into
  one dim (a linear layer over ``(B, S, D)`` folds ``B*S`` into ``"sample"``: the outer axis
  ``B`` is named ``"sample"``, the inner ones ``""``), a reshape that merges or splits axes,
  grouped convolutions (input channels of the selected groups) and adaptive pooling;
* ``""``: no dim indexes the axis, every shard touches all of it (a broadcast axis, the inner
  axes of a fold);
* ``attrs[v]["windows"][p][str(a)] = [stride, offset, extent]`` overrides the above for that
  input axis: ``[lo*stride + offset, (hi-1)*stride + offset + extent)`` clipped to the axis,
  so convolutions and pools carry their halo (``extent = (kernel-1)*dilation + 1``,
  ``offset = -padding``), concatenation its offsets, slicing its start and step (``x[:, t]``
  reads ``[t, t+1)`` of the time axis: stride 0);
* ``attrs[v]["select"][p] = [dim, i]``: port p is needed only by shards whose range of
  ``dim`` contains ``i`` (the inputs of ``torch.stack``).

Which dims are parallel (OptCNN Table 1, PaSE's configs over iteration domains): linear and
embedding ``{sample, channel}`` (leading axes folded into ``sample``); conv / pool 1D ``{sample,
channel, length}``, 2D ``{sample, channel, height, width}``, 3D adds ``depth``; matmul its batch
dims, ``m`` and ``n`` (not ``k``); elementwise, views, concat and inputs every output dim;
softmax every dim but the normalised one; layer norm the non-normalised dims; reductions the
kept dims; group / instance norm ``sample`` and ``channel``. Batch norm: every output dim, as
OptCNN splits it like the conv it follows; a channel split is exact, a sample / spatial split
needs its 2*C statistics all-reduced to be exact (``attrs["reduce_dims"]`` says which dims the
statistics run over). ``nn.LSTM`` / ``GRU`` / ``RNN`` modules (one node for all time steps):
``sample`` only, the recurrence being sequential. Layers the builder does not know: ``sample``.

*Edges*: one per (producer, consumer, input port); a layer that reads the same tensor twice
(``x * x``) has two edges. ``dst_port[e]`` is the consumer's input position, ``src_port[e]``
the producer's output position (only multi-output layers such as ``nn.LSTM`` have more than
one output; ``out_shape`` / ``out_dims`` describe output 0, ``attrs[v]["outputs"]`` all of them,
``out_bytes`` their total). ``nbytes[e]`` is the size of the tensor on the edge.

What becomes a node (how :func:`build_layer_graph` reads a ``torch.fx`` graph)
---------------------------------------------------------------------------
* every call of a leaf module (the standard ``torch.nn`` layers, plus ``leaf_modules``); a module
  called several times (a shared layer, an LSTM cell unrolled over time steps) gives one node
  per call, named ``path``, ``path@1``, ``path@2``...;
* every function / method call on a tensor that depends on the model's inputs: ``torch.add``,
  ``operator.add``, ``torch.cat``, ``matmul``, ``softmax``, reductions...;
* view and shape ops (``view``, ``reshape``, ``permute``, ``transpose``, ``flatten``, slicing,
  ``chunk``, ``pad``...) are kept as zero-FLOP nodes of kind ``"view"``, not folded into edges: an edge
  then always carries exactly the producer's output, with the same shape on both sides, and
  the view's own axis maps say how its output axes relate to its input axes (folding a
  reshape into an edge would need a second axis map per edge). Algorithms that want to skip
  them can eliminate them like any in-degree-1 node (OptCNN node elimination). ``chunk`` /
  ``split`` / ``unbind`` produce one view node per piece actually used. Ops that return their
  input unchanged (``nn.Identity``, dropout with p = 0, ``contiguous``, ``clone``, ``detach``)
  are not nodes at all: their consumers read the producer;
* shape arithmetic (``x.shape``, ``x.size(1)``, ``len``) is not data: no nodes;
* model inputs become nodes of kind ``"input"`` (zero FLOPs);
* parameters are not nodes: their bytes go to the layer that reads them (``param_bytes``,
  names in ``attrs[v]["params"]``; a shared parameter is counted by each reader, see
  :attr:`LayerGraph.unique_param_bytes`). Tensors that do not depend on inputs or parameters
  (positional tables, causal masks, zero initial states) are constants that every shard can
  make locally: they are not nodes and not edges;
* the loss is not part of the graph (configs are about layers): the graph ends at the model's
  outputs (``meta["outputs"]``). A loss module inside the model becomes a node of kind
  ``"loss"`` (split by sample, each shard a partial loss).

Tracing is ``torch.fx.symbolic_trace``'s module-level tracer with fake-tensor values attached
to every proxy, so shapes are concrete while tracing: ``len(x.unbind(1))``, ``for x_t in
x.unbind(1)``, ``range(x.shape[1])`` and ``if x.shape[1] > 1`` work, and Python loops over time
steps unroll (an explicit LSTM cell gives one node per cell op per step; the calls of its
shared gate ``nn.Linear`` are ``layers.0.gates``, ``layers.0.gates@1``, ...). Control flow on
tensor *values* (``if x.sum() > 0``) cannot be traced and raises :class:`LayerGraphError`; mark
the submodule as a leaf (``leaf_modules``) and it becomes one node, run once on real zeros with
batch 1 to get its output shapes and FLOPs since fake tensors have no values.

FLOPs
-----
``flops_fwd`` / ``flops_bwd`` per node. GEMM-like layers (conv, linear, matmul) count
``2*m*n*k`` multiply-adds (bias omitted, as ``torch.utils.flop_counter`` does), and backward is
``2x`` forward (gradient w.r.t. the input plus gradient w.r.t. the weights). Other layers are
memory-bound; they get a nominal per-element count so that they are not free: elementwise 1
per output element (backward 1), softmax 5 (backward 5), batch/layer norm 5 (backward 10),
pooling one per window element (backward the same), reductions one per input element
(backward the same), embedding 0 forward and one per output element backward (the
scatter-add into the table); views, concatenation and inputs 0. Layers the builder does not
know are measured with ``torch.utils.flop_counter.FlopCounterMode`` on fake tensors and get
backward ``2x`` forward.

Kinds: ``input, conv1d, conv2d, conv3d, linear, matmul, pool1d, pool2d, pool3d, batchnorm,
layernorm, norm, elementwise, softmax, reduce, concat, embedding, view, lstm, gru, rnn, loss,
other``.
"""

from __future__ import annotations

import contextlib
import json
import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from harness.errors import UserError
from harness.graph import EdgeListGraph

if TYPE_CHECKING:
    import networkx as nx
    import torch

LAYERGRAPH_FORMAT = "harness.layergraph/1"

#: kinds whose FLOPs are GEMMs and that :meth:`LayerGraph.gemm_mnk` can view as (m, n, k)
GEMM_KINDS: frozenset[str] = frozenset({"conv1d", "conv2d", "conv3d", "linear", "matmul"})

Range = tuple[int, int]


class LayerGraphError(UserError, ValueError):
    """A layer graph cannot be built (untraceable model, bad input spec) or is malformed."""


def part(n: int, p: int, i: int) -> Range:
    """Part ``i`` of ``p`` of ``range(n)`` under OptCNN's equal partitioning (balanced when p does not divide n)."""
    return (i * n // p, (i + 1) * n // p)


@dataclass(eq=False)
class LayerGraph(EdgeListGraph):
    """Layer graph: one node per layer (fwd + bwd), iteration domains, tensors on the edges.

    See the module docstring for the conventions of ``dims``, ``parallel_dims`` (OptCNN
    Table 1), ``out_dims`` / ``in_dims`` (axis maps) and the edges. All per-node lists and
    arrays are indexed by node id, which is a topological order.
    """

    names: list[str]
    kinds: list[str]
    dims: list[dict[str, int]]
    parallel_dims: list[tuple[str, ...]]
    flops_fwd: np.ndarray
    flops_bwd: np.ndarray
    param_bytes: np.ndarray
    out_shape: list[tuple[int, ...]]
    out_bytes: np.ndarray
    out_dims: list[tuple[str, ...]]
    in_dims: list[list[tuple[str, ...]]]
    attrs: list[dict[str, Any]]
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    dst_port: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    #: output position of ``src`` each edge carries (0 unless the producer has several outputs)
    src_port: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.names)
        self.names = list(self.names)
        self.kinds = list(self.kinds)
        self.dims = [dict(d) for d in self.dims]
        self.parallel_dims = [tuple(p) for p in self.parallel_dims]
        self.out_shape = [tuple(int(x) for x in s) for s in self.out_shape]
        self.out_dims = [tuple(d) for d in self.out_dims]
        self.in_dims = [[tuple(a) for a in ports] for ports in self.in_dims]
        self.attrs = [dict(a) for a in self.attrs]
        self.flops_fwd = np.asarray(self.flops_fwd, dtype=np.float64)
        self.flops_bwd = np.asarray(self.flops_bwd, dtype=np.float64)
        self.param_bytes = np.asarray(self.param_bytes, dtype=np.int64)
        self.out_bytes = np.asarray(self.out_bytes, dtype=np.int64)
        self.src = np.asarray(self.src, dtype=np.int32)
        self.dst = np.asarray(self.dst, dtype=np.int32)
        self.nbytes = np.asarray(self.nbytes, dtype=np.int64)
        self.dst_port = np.asarray(self.dst_port, dtype=np.int32)
        if self.src_port is None:
            self.src_port = np.zeros(len(self.src), dtype=np.int32)
        self.src_port = np.asarray(self.src_port, dtype=np.int32)
        self._validate(n)
        self._succ: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pred: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._index: dict[str, int] | None = None
        self._table: tuple[list[str], np.ndarray, np.ndarray] | None = None

    def _validate(self, n: int) -> None:
        per_node = ("kinds", "dims", "parallel_dims", "flops_fwd", "flops_bwd", "param_bytes",
                    "out_shape", "out_bytes", "out_dims", "in_dims", "attrs")
        for key in per_node:
            if len(getattr(self, key)) != n:
                raise LayerGraphError(f"LayerGraph.{key} has length {len(getattr(self, key))}, expected {n} (one per node)")
        m = len(self.src)
        for key in ("dst", "nbytes", "dst_port", "src_port"):
            if len(getattr(self, key)) != m:
                raise LayerGraphError(f"LayerGraph.{key} has length {len(getattr(self, key))}, expected {m} (one per edge)")
        if len(set(self.names)) != n:
            dup = next(x for x in self.names if self.names.count(x) > 1)
            raise LayerGraphError(f"node name {dup!r} is not unique")
        if m:
            if min(int(self.src.min()), int(self.dst.min())) < 0 or max(int(self.src.max()), int(self.dst.max())) >= n:
                raise LayerGraphError(f"an edge names a node outside 0..{n - 1}")
            back = np.flatnonzero(self.src >= self.dst)
            if len(back):
                e = int(back[0])
                raise LayerGraphError(
                    f"edge {e} {self.names[self.src[e]]} -> {self.names[self.dst[e]]} has src >= dst: "
                    "node ids must be a topological order"
                )
        # every input port of every node is fed by exactly one edge
        n_ports = np.fromiter((len(p) for p in self.in_dims), dtype=np.int64, count=n)
        indeg = np.bincount(self.dst, minlength=n) if m else np.zeros(n, dtype=np.int64)
        bad = np.flatnonzero(indeg != n_ports)
        if len(bad):
            v = int(bad[0])
            raise LayerGraphError(
                f"node {v} ({self.names[v]}) has {int(indeg[v])} in-edges but {int(n_ports[v])} input ports in in_dims"
            )
        if m:
            order = np.lexsort((self.dst_port, self.dst))
            ptr = np.concatenate([[0], np.cumsum(n_ports)])
            rank = np.arange(m) - ptr[self.dst[order]]
            wrong = np.flatnonzero(self.dst_port[order] != rank)
            if len(wrong):
                e = int(order[wrong[0]])
                raise LayerGraphError(
                    f"node {self.names[self.dst[e]]}: input ports must be 0..{int(n_ports[self.dst[e]]) - 1}, each fed once"
                )
        for e in range(m):
            d, port = int(self.dst[e]), int(self.dst_port[e])
            if len(self.in_dims[d][port]) != len(self.edge_shape(e)):
                raise LayerGraphError(
                    f"edge {e} {self.names[self.src[e]]} -> {self.names[d]}: tensor of rank {len(self.edge_shape(e))} "
                    f"but in_dims of port {port} has {len(self.in_dims[d][port])} axes"
                )
        for v in range(n):
            dv = self.dims[v]
            if len(self.out_dims[v]) != len(self.out_shape[v]):
                raise LayerGraphError(f"node {self.names[v]}: out_dims {self.out_dims[v]} do not match out_shape {self.out_shape[v]}")
            for name in self.parallel_dims[v]:
                if name not in dv:
                    raise LayerGraphError(f"node {self.names[v]}: parallel dim {name!r} is not in its dims {list(dv)}")
            for axes in (self.out_dims[v], *self.in_dims[v]):
                for name in axes:
                    if name and name not in dv:
                        raise LayerGraphError(f"node {self.names[v]}: axis dim {name!r} is not in its dims {list(dv)}")

    # ------------------------------------------------------------------ structure
    @property
    def num_nodes(self) -> int:
        return len(self.names)

    def pred_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Predecessors as CSR ``(ptr, pred, edge_id)``, each node's in-edges in port order
        (:class:`EdgeListGraph`'s, which keeps edge order, overridden)."""
        if self._pred is None:
            n = self.num_nodes
            order = np.lexsort((self.dst_port, self.dst)).astype(np.int32)
            ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(self.dst, minlength=n), out=ptr[1:])
            self._pred = (ptr, self.src[order].astype(np.int32), order)
        return self._pred

    def successors(self, v: int) -> np.ndarray:
        ptr, succ, _ = self.succ_csr()
        return succ[ptr[v]:ptr[v + 1]]

    def predecessors(self, v: int) -> np.ndarray:
        """Producers of v's inputs, in port order (a producer feeding two ports appears twice)."""
        ptr, pred, _ = self.pred_csr()
        return pred[ptr[v]:ptr[v + 1]]

    def in_edges(self, v: int) -> np.ndarray:
        """Edge ids into v, in port order (``in_edges(v)[p]`` feeds port p)."""
        ptr, _, eid = self.pred_csr()
        return eid[ptr[v]:ptr[v + 1]]

    def out_edges(self, v: int) -> np.ndarray:
        ptr, _, eid = self.succ_csr()
        return eid[ptr[v]:ptr[v + 1]]

    def index(self, name: str) -> int:
        """Node id of ``name``."""
        if self._index is None:
            self._index = {x: i for i, x in enumerate(self.names)}
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"no node named {name!r} in {self.meta.get('model', 'layer graph')}") from None

    # ------------------------------------------------------------------ per-node views
    def gemm_mnk(self, v: int) -> tuple[int, int, int] | None:
        """PaSE's GEMM view ``(m, n, k)`` of a conv / linear / matmul node, else None.

        linear: m = sample (batch times folded leading dims), n = out features, k = in features.
        conv (implicit GEMM): m = sample x output positions, n = out channels,
        k = in channels per group x kernel positions. matmul: m = batch dims x rows,
        n = columns, k = the contracted dim. Always ``2*m*n*k == flops_fwd[v]``.
        """
        kind, d = self.kinds[v], self.dims[v]
        if kind not in GEMM_KINDS:
            return None
        if kind == "linear":
            return (d.get("sample", 1), d["channel"], d["in_channel"])
        if kind == "matmul":
            n_, k_ = d.get("n", 1), d.get("k", 1)
            m_ = 1
            for name, size in d.items():
                if name not in ("n", "k"):
                    m_ *= size
            return (m_, n_, k_)
        m_ = d["sample"]
        k_ = d["in_channel"]
        for name, size in d.items():
            if name.startswith("kernel_"):
                k_ *= size
            elif name not in ("sample", "channel", "in_channel"):
                m_ *= size
        return (m_, d["channel"], k_)

    def parallel_sizes(self, v: int) -> tuple[int, ...]:
        """Sizes of v's parallel dims, in ``parallel_dims[v]`` order."""
        return tuple(self.dims[v][d] for d in self.parallel_dims[v])

    def dim_table(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Array view of all iteration domains for vectorised config sweeps.

        Returns ``(dim_names, sizes, parallel)``: ``dim_names`` every dim name in order of first
        appearance, ``sizes[v, j]`` the size of dim j in node v (0 when v has no such dim,
        int64, shape (num_nodes, len(dim_names))) and ``parallel[v, j]`` whether v may split it.
        """
        if self._table is None:
            col: dict[str, int] = {}
            for d in self.dims:
                for name in d:
                    col.setdefault(name, len(col))
            sizes = np.zeros((self.num_nodes, len(col)), dtype=np.int64)
            par = np.zeros((self.num_nodes, len(col)), dtype=bool)
            for v, d in enumerate(self.dims):
                for name, size in d.items():
                    sizes[v, col[name]] = size
                for name in self.parallel_dims[v]:
                    par[v, col[name]] = True
            self._table = (list(col), sizes, par)
        return self._table

    @property
    def io_bytes(self) -> np.ndarray:
        """Forward memory traffic per node: bytes of its inputs + outputs + parameters (roofline)."""
        out = self.out_bytes + self.param_bytes
        np.add.at(out, self.dst, self.nbytes)
        return out

    @property
    def unique_param_bytes(self) -> int:
        """Parameter bytes of the model, each shared parameter counted once."""
        seen: dict[str, int] = {}
        anonymous = 0
        for v, a in enumerate(self.attrs):
            named = a.get("params")
            if named:
                seen.update(named)
            else:
                anonymous += int(self.param_bytes[v])
        return sum(seen.values()) + anonymous

    # ------------------------------------------------------------------ tensor regions
    def edge_shape(self, e: int) -> tuple[int, ...]:
        """Shape of the tensor on edge e (= output ``src_port[e]`` of ``src[e]``)."""
        s, k = int(self.src[e]), int(self.src_port[e])
        return self.out_shape[s] if k == 0 else tuple(self.attrs[s]["outputs"][k]["shape"])

    def edge_src_dims(self, e: int) -> tuple[str, ...]:
        """The producer's axis map of the tensor on edge e."""
        s, k = int(self.src[e]), int(self.src_port[e])
        return self.out_dims[s] if k == 0 else tuple(self.attrs[s]["outputs"][k]["dims"])

    def edge_dst_dims(self, e: int) -> tuple[str, ...]:
        """The consumer's axis map of the tensor on edge e."""
        return self.in_dims[int(self.dst[e])][int(self.dst_port[e])]

    def shard_ranges(self, v: int, degrees: Mapping[str, int], coords: Mapping[str, int]) -> dict[str, Range]:
        """Iteration ranges of one shard: each dim in ``degrees`` split evenly, shard ``coords[d]`` of it."""
        d = self.dims[v]
        return {name: part(d[name], int(p), int(coords.get(name, 0))) for name, p in degrees.items() if name in d}

    def out_region(self, v: int, ranges: Mapping[str, Range] | None = None, port: int = 0) -> tuple[Range, ...]:
        """Box of output ``port`` of v written by the shard covering ``ranges`` of v's dims.

        Dims missing from ``ranges`` are whole. Returns one ``(lo, hi)`` per axis.
        """
        if port == 0:
            shape, axes = self.out_shape[v], self.out_dims[v]
        else:
            o = self.attrs[v]["outputs"][port]
            shape, axes = tuple(o["shape"]), tuple(o["dims"])
        return tuple(_axis_range(name, n, self.dims[v], ranges or {}, None) for name, n in zip(axes, shape))

    def in_region(self, v: int, port: int, ranges: Mapping[str, Range] | None = None) -> tuple[Range, ...]:
        """Box of input ``port`` of v read by the shard covering ``ranges`` of v's dims.

        Includes convolution / pooling halos (``attrs["windows"]``); an empty box (some
        ``lo == hi``) means the shard does not need this input at all (a concat input outside
        the shard's slice of the concat axis).
        """
        e = int(self.in_edges(v)[port])
        shape = self.edge_shape(e)
        axes = self.in_dims[v][port]
        a = self.attrs[v]
        ranges = ranges or {}
        windows = a.get("windows")
        win = windows[port] if windows else {}
        box = tuple(_axis_range(name, n, self.dims[v], ranges, win.get(str(i))) for i, (name, n) in enumerate(zip(axes, shape)))
        select = a.get("select")
        if select and select[port] is not None:
            name, idx = select[port]
            lo, hi = ranges.get(name, (0, self.dims[v][name]))
            if not lo <= idx < hi:
                return tuple((0, 0) for _ in shape)
        return box

    # ------------------------------------------------------------------ export
    def to_networkx(self, multigraph: bool = False) -> "nx.DiGraph":
        """A networkx graph with node and edge attributes.

        A ``DiGraph`` by default: parallel edges (one producer feeding two ports) are merged,
        ``nbytes`` summed and ``edge_ids`` / ``ports`` listed; ``multigraph=True`` keeps them
        apart in a ``MultiDiGraph``.
        """
        import networkx as nx

        g: nx.DiGraph = nx.MultiDiGraph() if multigraph else nx.DiGraph()
        g.graph.update(self.meta)
        for v in range(self.num_nodes):
            g.add_node(
                v,
                name=self.names[v],
                kind=self.kinds[v],
                dims=dict(self.dims[v]),
                parallel_dims=self.parallel_dims[v],
                flops_fwd=float(self.flops_fwd[v]),
                flops_bwd=float(self.flops_bwd[v]),
                param_bytes=int(self.param_bytes[v]),
                out_shape=self.out_shape[v],
                out_bytes=int(self.out_bytes[v]),
            )
        for e, (s, d, b, p) in enumerate(zip(self.src.tolist(), self.dst.tolist(), self.nbytes.tolist(), self.dst_port.tolist())):
            if multigraph:
                g.add_edge(s, d, key=e, nbytes=b, port=p, edge_id=e)
            elif g.has_edge(s, d):
                data = g.edges[s, d]
                data["nbytes"] += b
                data["ports"].append(p)
                data["edge_ids"].append(e)
            else:
                g.add_edge(s, d, nbytes=b, ports=[p], edge_ids=[e])
        return g

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (see :meth:`from_dict`)."""
        return {
            "format": LAYERGRAPH_FORMAT,
            "names": self.names,
            "kinds": self.kinds,
            "dims": self.dims,
            "parallel_dims": [list(p) for p in self.parallel_dims],
            "flops_fwd": self.flops_fwd.tolist(),
            "flops_bwd": self.flops_bwd.tolist(),
            "param_bytes": self.param_bytes.tolist(),
            "out_shape": [list(s) for s in self.out_shape],
            "out_bytes": self.out_bytes.tolist(),
            "out_dims": [list(d) for d in self.out_dims],
            "in_dims": [[list(a) for a in ports] for ports in self.in_dims],
            "attrs": self.attrs,
            "src": self.src.tolist(),
            "dst": self.dst.tolist(),
            "nbytes": self.nbytes.tolist(),
            "dst_port": self.dst_port.tolist(),
            "src_port": self.src_port.tolist(),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LayerGraph":
        fmt = d.get("format")
        if fmt != LAYERGRAPH_FORMAT:
            raise LayerGraphError(f"not a layer graph: format is {fmt!r}, expected {LAYERGRAPH_FORMAT!r}")
        return cls(**{k: v for k, v in d.items() if k != "format"})

    def save(self, path: str | Path) -> None:
        """Write the graph as JSON, readable by :meth:`load`."""
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> "LayerGraph":
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"layer graph file {p} does not exist")
        return cls.from_dict(json.loads(p.read_text()))

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for k in self.kinds:
            counts[k] = counts.get(k, 0) + 1
        kinds = ", ".join(f"{k} {c}" for k, c in sorted(counts.items(), key=lambda kc: -kc[1]))
        return (
            f"LayerGraph({self.meta.get('model', '?')}, batch {self.meta.get('batch_size', '?')}: "
            f"{self.num_nodes} nodes, {self.num_edges} edges, "
            f"{self.flops_fwd.sum() / 1e9:.2f} GFLOP fwd + {self.flops_bwd.sum() / 1e9:.2f} bwd, "
            f"params {self.unique_param_bytes / 2**20:.1f} MiB; {kinds})"
        )

    def __repr__(self) -> str:
        return self.summary()


def _axis_range(name: str, n: int, dims: Mapping[str, int], ranges: Mapping[str, Range], window: Sequence[int] | None) -> Range:
    """Range of one tensor axis of length n touched by a shard (see the module docstring)."""
    if window is not None:
        stride, offset, extent = window
        lo, hi = ranges.get(name, (0, dims[name])) if name else (0, 1)
        if hi <= lo:
            return (0, 0)
        a = max(0, lo * stride + offset)
        b = min(n, (hi - 1) * stride + offset + extent)
        return (a, b) if a < b else (min(a, n), min(a, n))
    if not name:
        return (0, n)
    size = dims[name]
    lo, hi = ranges.get(name, (0, size))
    if n == size:
        return (lo, hi)
    return (lo * n // size, -(-hi * n // size))


# ====================================================================== building from torch


@dataclass(frozen=True)
class InputSpec:
    """One model input: its full shape (batch first), dtype and optionally the names of its axes.

    Axis names default by rank: floats ``(sample, channel[, length | height, width | depth,
    height, width])``, integer tokens ``(sample, length, ...)``.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    axes: tuple[str, ...] | None = None


InputLike = Union[InputSpec, "torch.Tensor", Sequence[Any]]


def _as_spec(x: Any, where: str) -> InputSpec:
    """Accept an InputSpec, a tensor (only its shape and dtype are used), ``(shape, dtype[, axes])`` or a shape."""
    import torch

    if isinstance(x, InputSpec):
        return InputSpec(tuple(int(s) for s in x.shape), _dtype_name(x.dtype), tuple(x.axes) if x.axes else None)
    if isinstance(x, torch.Tensor):
        return InputSpec(tuple(x.shape), _dtype_name(x.dtype))
    if isinstance(x, (tuple, list, torch.Size)):
        if all(isinstance(s, int) for s in x):
            return InputSpec(tuple(int(s) for s in x))
        if 2 <= len(x) <= 3 and isinstance(x[0], (tuple, list, torch.Size)):
            axes = tuple(x[2]) if len(x) == 3 and x[2] is not None else None
            return InputSpec(tuple(int(s) for s in x[0]), _dtype_name(x[1]), axes)
    raise LayerGraphError(
        f"input {where}: cannot read {x!r} as an input spec; pass (shape, dtype), (shape, dtype, axis names), "
        "a shape tuple, an InputSpec or a tensor"
    )


def _dtype_name(dtype: Any) -> str:
    import torch

    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    name = str(dtype).removeprefix("torch.")
    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise LayerGraphError(f"unknown dtype {dtype!r}")
    return name


_FLOAT_AXES = {
    0: (),
    1: ("sample",),
    2: ("sample", "channel"),
    3: ("sample", "channel", "length"),
    4: ("sample", "channel", "height", "width"),
    5: ("sample", "channel", "depth", "height", "width"),
}


def _default_axes(rank: int, integer: bool) -> tuple[str, ...]:
    if integer and rank >= 1:
        return ("sample", "length", *(f"d{i}" for i in range(2, rank)))[:rank]
    if rank in _FLOAT_AXES:
        return _FLOAT_AXES[rank]
    return ("sample", *(f"d{i}" for i in range(1, rank)))


def _fresh(base: str, taken: set[str]) -> str:
    """``base`` or ``base.1``, ``base.2``... whichever is not taken yet (and take it)."""
    name, i = base, 0
    while not name or name in taken:
        i += 1
        name = f"{base or 'd'}.{i}"
    taken.add(name)
    return name


# ---------------------------------------------------------------------- builder internals


@dataclass(frozen=True)
class _T:
    """A tensor produced by a layer graph node (output ``port`` of ``node``)."""

    node: int
    port: int
    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    labels: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass(frozen=True)
class _Param:
    """A tensor computed from parameters only (folded into the layers that read it)."""

    names: frozenset[str]


class _Const:
    """A tensor computed from neither inputs nor parameters (made locally by every shard)."""


_CONST = _Const()


@dataclass
class _Piece:
    """One piece of chunk/split/unbind of a layer's output, materialised as a view node when read."""

    src: _T
    axis: int
    start: int
    stop: int
    squeeze: bool
    name: str
    made: _T | None = None


@dataclass
class _Spec:
    """What a handler says about a node; operand lists are indexed by tensor operand, not port."""

    kind: str
    dims: dict[str, int]
    parallel: tuple[str, ...]
    out_dims: tuple[str, ...]
    labels: tuple[str, ...]
    operand_dims: list[tuple[str, ...] | None]
    flops_fwd: float = 0.0
    flops_bwd: float = 0.0
    attrs: dict[str, Any] = field(default_factory=dict)
    windows: dict[int, dict[int, list[int]]] = field(default_factory=dict)
    select: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: (out_dims, labels) of outputs 1.. of a multi-output node (default: like output 0 when same shape)
    extra: list[tuple[tuple[str, ...], tuple[str, ...]]] | None = None
    #: operands read for their shape or dtype only (``x.to(y)``, ``x.view_as(y)``): not data, no edge
    skip: frozenset[int] = frozenset()


class _Unsupported(Exception):
    """A handler cannot read this call; the builder falls back to the generic ``other`` node."""


_ELEMENTWISE = frozenset(
    """add sub mul div truediv floordiv mod neg pos abs pow rsub true_divide floor_divide remainder fmod
    iadd isub imul itruediv idiv and_ or_ xor invert not_ eq ne lt le gt ge logical_and logical_or logical_not
    logical_xor bitwise_and bitwise_or bitwise_not
    relu relu6 gelu silu sigmoid tanh hardtanh hardswish hardsigmoid elu selu celu leaky_relu softplus softsign
    mish prelu rrelu threshold logsigmoid tanhshrink softshrink hardshrink
    exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan erf erfc erfinv sign square
    clamp clip clamp_min clamp_max floor ceil round trunc frac nan_to_num lerp addcmul addcdiv
    where masked_fill maximum minimum fmax fmin isnan isinf isfinite
    dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout""".split()
)
_CASTS = frozenset("to type type_as float double half bfloat16 int long bool short byte char cpu cuda".split())
_CONST_LIKE = frozenset(
    """new_zeros new_ones new_full new_empty new_tensor zeros_like ones_like empty_like full_like rand_like
    randn_like randint_like""".split()
)
_RESHAPES = frozenset("view reshape flatten unflatten squeeze unsqueeze view_as reshape_as".split())
#: ops that return their input unchanged (same values, same shape): not nodes, consumers read the input
_ALIASES = frozenset("contiguous clone detach data requires_grad_ detach_".split())
_PERMUTES = frozenset("permute transpose t swapaxes swapdims movedim moveaxis".split())
_EXPANDS = frozenset(("expand", "expand_as", "broadcast_to"))
_PIECES = frozenset(("chunk", "split", "unbind", "tensor_split", "split_with_sizes"))
_REDUCTIONS = frozenset(
    """sum mean amax amin max min std var prod norm logsumexp all any argmax argmin count_nonzero nansum
    nanmean median""".split()
)
_MATMULS = frozenset(("matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot"))
_CONVS = {"conv1d": 1, "conv2d": 2, "conv3d": 3}
_POOLS = {
    f"{p}_pool{d}d": (p, d)
    for p in ("max", "avg", "adaptive_avg", "adaptive_max", "lp")
    for d in (1, 2, 3)
}
_SPATIAL = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}
_KERNEL = {1: ("kernel_l",), 2: ("kernel_h", "kernel_w"), 3: ("kernel_d", "kernel_h", "kernel_w")}


def _tup(x: Any, nd: int) -> tuple[int, ...]:
    if isinstance(x, int):
        return (x,) * nd
    t = tuple(int(v) for v in x)
    return t * nd if len(t) == 1 else t


def _norm_axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _jsonable(x: Any) -> Any:
    """attrs as JSON-native values (lists, not tuples) so a save/load round trip is exact."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (bool, str)) or x is None:
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    return str(x)


def _reshape_groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Split a reshape a -> b into minimal groups of axes with equal products."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) or j < len(b):
        gi: list[int] = []
        gj: list[int] = []
        pa = pb = 1
        if i < len(a):
            gi.append(i)
            pa *= a[i]
            i += 1
        if j < len(b):
            gj.append(j)
            pb *= b[j]
            j += 1
        while pa != pb:
            if pa < pb and i < len(a):
                gi.append(i)
                pa *= a[i]
                i += 1
            elif pb < pa and j < len(b):
                gj.append(j)
                pb *= b[j]
                j += 1
            else:
                raise _Unsupported(f"reshape {tuple(a)} -> {tuple(b)}")
        groups.append((gi, gj))
    return groups


class _Ctx:
    """One fx call node as the handlers see it: values of its args and its tensor operands."""

    def __init__(self, builder: "_Builder", node: Any, op_name: str, module: Any) -> None:
        import torch

        self.node = node
        self.op = op_name
        self.module = module
        self.args = builder.value_of(node.args)
        self.kwargs = builder.value_of(node.kwargs)
        self.value = builder.env[node]
        self.out = self.value if isinstance(self.value, torch.Tensor) else next(iter(builder.tensors_in(self.value)), None)
        #: (ref, value) of every tensor operand in flattened argument order
        self.operands: list[tuple[Any, Any]] = [
            (builder.ref_of(a), v) for a, v in builder.leaves(node.args, node.kwargs) if isinstance(v, torch.Tensor)
        ]
        self.batch = builder.batch_size

    def arg(self, pos: int, name: str, default: Any = None) -> Any:
        if name in self.kwargs:
            return self.kwargs[name]
        return self.args[pos] if len(self.args) > pos else default

    def live(self, i: int) -> bool:
        return isinstance(self.operands[i][0], _T)

    def labels(self, i: int) -> tuple[str, ...]:
        r, v = self.operands[i]
        return r.labels if isinstance(r, _T) else _default_axes(v.dim(), not v.is_floating_point())

    def shape(self, i: int) -> tuple[int, ...]:
        return tuple(self.operands[i][1].shape)


class _Builder:
    """Accumulates layer graph nodes and edges while walking the traced fx graph in order."""

    def __init__(self, env: dict[Any, Any], counted: dict[Any, float], modules: dict[str, Any],
                 param_names: dict[int, str], param_nbytes: dict[str, int], batch_size: int | None) -> None:
        self.env = env
        self.counted = counted
        self.modules = modules
        self.param_names = param_names
        self.param_nbytes = param_nbytes
        self.batch_size = batch_size
        self.refs: dict[Any, Any] = {}
        self.taken: set[str] = set()
        self.module_calls: dict[str, int] = {}
        # node lists
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.dims: list[dict[str, int]] = []
        self.parallel: list[tuple[str, ...]] = []
        self.ff: list[float] = []
        self.fb: list[float] = []
        self.pbytes: list[int] = []
        self.out_shape: list[tuple[int, ...]] = []
        self.out_bytes: list[int] = []
        self.out_dims: list[tuple[str, ...]] = []
        self.in_dims: list[list[tuple[str, ...]]] = []
        self.attrs: list[dict[str, Any]] = []
        self.edges: list[tuple[int, int, int, int, int]] = []  # src, dst, nbytes, dst_port, src_port

    # ---------------------------------------------------------------- fx plumbing
    def value_of(self, a: Any) -> Any:
        import torch.fx as fx

        return fx.node.map_aggregate(a, lambda x: self.env[x] if isinstance(x, fx.Node) else x)

    def leaves(self, *objs: Any) -> Iterator[tuple[Any, Any]]:
        """(fx arg, value) of every leaf of nested args, in order."""
        import torch.fx as fx

        for obj in objs:
            if isinstance(obj, fx.Node):
                yield obj, self.env[obj]
            elif isinstance(obj, (list, tuple)):
                yield from self.leaves(*obj)
            elif isinstance(obj, dict):
                yield from self.leaves(*obj.values())
            elif isinstance(obj, slice):
                yield from self.leaves(obj.start, obj.stop, obj.step)
            else:
                yield obj, obj

    def tensors_in(self, value: Any) -> Iterator[Any]:
        return _flat_tensors(value)

    def ref_of(self, a: Any) -> Any:
        """The ref of an fx arg, chunk pieces materialised (an argument is being read)."""
        import torch.fx as fx

        if not isinstance(a, fx.Node):
            return None
        return self._materialized(self.refs.get(a))

    def _materialized(self, r: Any) -> Any:
        if isinstance(r, _Piece):
            return self.materialize(r)
        if isinstance(r, (list, tuple)):
            return type(r)(self._materialized(x) for x in r)
        if isinstance(r, dict):
            return {k: self._materialized(x) for k, x in r.items()}
        return r

    def ref_leaves(self, r: Any) -> Iterator[Any]:
        if isinstance(r, (list, tuple)):
            for x in r:
                yield from self.ref_leaves(x)
        elif isinstance(r, dict):
            for x in r.values():
                yield from self.ref_leaves(x)
        else:
            yield r

    # ---------------------------------------------------------------- node emission
    def emit(self, name: str, spec: _Spec, operands: Sequence[tuple[Any, Any]], params: set[str], value: Any) -> Any:
        import torch

        v = len(self.names)
        base, k = name, 0
        while name in self.taken:  # uniquify against earlier nodes (e.g. a module named like an input)
            k += 1
            name = f"{base}#{k}"
        self.taken.add(name)
        ports: list[tuple[str, ...]] = []
        port_of: dict[int, int] = {}
        for i, (r, _) in enumerate(operands):
            if isinstance(r, _T) and i not in spec.skip:
                port_of[i] = len(ports)
                dims_i = spec.operand_dims[i] if i < len(spec.operand_dims) else None
                if dims_i is None or len(dims_i) != len(r.shape):
                    dims_i = tuple("sample" if lab == "sample" and "sample" in spec.dims and n == spec.dims["sample"] else ""
                                   for lab, n in zip(r.labels, r.shape))
                ports.append(tuple(dims_i))
                self.edges.append((r.node, v, r.nbytes, port_of[i], r.port))
        attrs = dict(spec.attrs)
        if spec.windows and any(i in port_of for i in spec.windows):
            attrs["windows"] = [
                {str(ax): list(w) for ax, w in spec.windows.get(i, {}).items()}
                for i in sorted(port_of, key=port_of.__getitem__)
            ]
        if spec.select and any(i in port_of for i in spec.select):
            attrs["select"] = [list(spec.select[i]) if i in spec.select else None
                               for i in sorted(port_of, key=port_of.__getitem__)]
        pnames = sorted(params)
        if pnames:
            attrs["params"] = {p: self.param_nbytes[p] for p in pnames}
        outs = list(self.tensors_in(value))
        refs: list[_T] = []
        total = 0
        extra_info: list[dict[str, Any]] = []
        for j, t in enumerate(outs):
            shape = tuple(int(s) for s in t.shape)
            total += t.numel() * t.element_size()
            if j == 0:
                od, labels = spec.out_dims, spec.labels
            elif spec.extra is not None and j - 1 < len(spec.extra):
                od, labels = spec.extra[j - 1]
            elif shape == tuple(outs[0].shape):
                od, labels = spec.out_dims, spec.labels
            else:
                labels = _default_axes(len(shape), not t.is_floating_point())
                od = tuple("sample" if lab == "sample" and spec.dims.get("sample") == n else "" for lab, n in zip(labels, shape))
            refs.append(_T(v, j, shape, _dtype_name(t.dtype), t.element_size(), tuple(labels)))
            extra_info.append({"shape": list(shape), "dims": list(od), "dtype": _dtype_name(t.dtype)})
        if len(outs) > 1:
            attrs["outputs"] = extra_info
        if outs:
            attrs.setdefault("dtype", extra_info[0]["dtype"])
        self.names.append(name)
        self.kinds.append(spec.kind)
        self.dims.append({k_: int(s) for k_, s in spec.dims.items()})
        self.parallel.append(tuple(spec.parallel))
        self.ff.append(float(spec.flops_fwd))
        self.fb.append(float(spec.flops_bwd))
        self.pbytes.append(sum(self.param_nbytes[p] for p in pnames))
        self.out_shape.append(refs[0].shape if refs else ())
        self.out_bytes.append(total)
        self.out_dims.append(tuple(spec.out_dims) if refs else ())
        self.in_dims.append(ports)
        self.attrs.append(_jsonable(attrs))
        # mirror the value's structure with refs
        it = iter(refs)

        def mirror(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return next(it)
            if isinstance(x, (list, tuple)):
                return [mirror(y) for y in x] if isinstance(x, list) else tuple(mirror(y) for y in x)
            if isinstance(x, dict):
                return {k: mirror(y) for k, y in x.items()}
            return None

        return mirror(value)

    def materialize(self, piece: _Piece) -> _T:
        """Create the view node of one chunk/split/unbind piece (once)."""
        if piece.made is not None:
            return piece.made
        import torch

        src = piece.src
        taken: set[str] = set()
        labels: list[str] = []
        in_axes: list[str] = []
        dims: dict[str, int] = {}
        window: dict[int, list[int]] = {}
        for ax, (lab, n) in enumerate(zip(src.labels, src.shape)):
            if ax == piece.axis:
                window[ax] = [0 if piece.squeeze else 1, piece.start, 1]
                if piece.squeeze:
                    in_axes.append("")
                    continue
                n = piece.stop - piece.start
            name = _fresh(lab, taken)
            labels.append(name)
            in_axes.append(name)
            dims[name] = n
        shape = tuple(dims[x] for x in labels)
        spec = _Spec("view", dims, tuple(labels), tuple(labels), tuple(labels), [tuple(in_axes)],
                     attrs={"op": "piece", "axis": piece.axis, "start": piece.start, "stop": piece.stop},
                     windows={0: window})
        fake = torch.empty(shape, dtype=getattr(torch, src.dtype), device="meta")
        piece.made = self.emit(piece.name, spec, [(src, None)], set(), fake)
        return piece.made


# ---------------------------------------------------------------------- handlers


def _same_labels(ctx: _Ctx) -> tuple[str, ...]:
    """Output labels of a shape-preserving op: those of the first operand with the output's shape."""
    out = tuple(ctx.out.shape)
    for i, (r, v) in enumerate(ctx.operands):
        if isinstance(r, _T) and tuple(v.shape) == out:
            return r.labels
    return _broadcast_labels(ctx)


def _broadcast_labels(ctx: _Ctx) -> tuple[str, ...]:
    out = tuple(ctx.out.shape)
    labels: list[str | None] = [None] * len(out)
    for i, (r, v) in enumerate(ctx.operands):
        if not isinstance(r, _T):
            continue
        off = len(out) - v.dim()
        for ax, lab in enumerate(r.labels):
            j = ax + off
            if j >= 0 and labels[j] is None and v.shape[ax] == out[j]:
                labels[j] = lab
    taken = {x for x in labels if x}
    result: list[str] = []
    seen: set[str] = set()
    for j, lab in enumerate(labels):
        if lab is None or lab in seen:
            lab = _fresh("sample" if j == 0 and out[j] == ctx.batch and "sample" not in taken else f"d{j}", taken)
        seen.add(lab)
        result.append(lab)
    return tuple(result)


def _aligned(ctx: _Ctx, labels: Sequence[str]) -> list[tuple[str, ...]]:
    """Axis maps of broadcast operands, right-aligned to an output labelled ``labels``."""
    out = tuple(ctx.out.shape)
    maps = []
    for _, v in ctx.operands:
        off = len(out) - v.dim()
        maps.append(tuple(labels[ax + off] if ax + off >= 0 and v.shape[ax] == out[ax + off] else "" for ax in range(v.dim())))
    return maps


def _h_elementwise(ctx: _Ctx, kind: str = "elementwise", per_elt: float = 1.0, bwd: float = 1.0) -> _Spec:
    labels = _same_labels(ctx)
    out = tuple(ctx.out.shape)
    numel = math.prod(out)
    return _Spec(kind, dict(zip(labels, out)), labels, labels, labels, _aligned(ctx, labels),
                 per_elt * numel, bwd * per_elt * numel, attrs={"op": ctx.op})


def _h_cast(ctx: _Ctx) -> _Spec:
    labels = ctx.labels(0)
    out = tuple(ctx.out.shape)
    same = ctx.out.dtype == ctx.operands[0][1].dtype
    dims = [tuple(labels)] + [None] * (len(ctx.operands) - 1)
    return _Spec("view" if same else "elementwise", dict(zip(labels, out)), labels, labels, labels, dims,
                 0.0 if same else math.prod(out), 0.0 if same else math.prod(out), attrs={"op": ctx.op},
                 skip=frozenset(range(1, len(ctx.operands))))


def _h_reshape(ctx: _Ctx) -> _Spec:
    a, b = ctx.shape(0), tuple(ctx.out.shape)
    in_labels = ctx.labels(0)
    taken: set[str] = set()
    out_labels: list[str] = [""] * len(b)
    in_axes: list[str] = [""] * len(a)
    parallel: list[str] = []
    groups = _reshape_groups(a, b)
    # name the outer axis of every group first so that it keeps its input's name
    plan = []
    for gi, gj in groups:
        outer_i = next((i for i in gi if a[i] != 1), gi[0] if gi else None)
        outer_j = next((j for j in gj if b[j] != 1), gj[0] if gj else None)
        plan.append((gi, gj, outer_i, outer_j))
        if outer_i is not None and outer_j is not None and in_labels[outer_i] not in taken:
            out_labels[outer_j] = in_labels[outer_i]
            taken.add(in_labels[outer_i])
    for gi, gj, outer_i, outer_j in plan:
        base = in_labels[outer_i] if outer_i is not None else "unit"
        for j in gj:
            if not out_labels[j]:
                out_labels[j] = _fresh(base, taken)
        if outer_j is not None:
            parallel.append(out_labels[outer_j])
            if outer_i is not None:
                in_axes[outer_i] = out_labels[outer_j]
    return _Spec("view", dict(zip(out_labels, b)), tuple(parallel), tuple(out_labels), tuple(out_labels),
                 [tuple(in_axes)], attrs={"op": ctx.op, "shape": list(b)}, skip=frozenset(range(1, len(ctx.operands))))


def _perm(ctx: _Ctx, rank: int) -> list[int]:
    op = ctx.op
    if op == "permute":
        dims = ctx.args[1:] if len(ctx.args) > 2 or isinstance(ctx.args[1], int) else ctx.args[1]
        return [_norm_axis(int(d), rank) for d in (ctx.kwargs.get("dims") or dims)]
    if op in ("transpose", "swapaxes", "swapdims"):
        d0 = _norm_axis(int(ctx.arg(1, "dim0")), rank)
        d1 = _norm_axis(int(ctx.arg(2, "dim1")), rank)
        p = list(range(rank))
        p[d0], p[d1] = p[d1], p[d0]
        return p
    if op in ("t", "T", "mT"):
        p = list(range(rank))
        if rank >= 2:
            p[-1], p[-2] = p[-2], p[-1]
        return p
    if op in ("movedim", "moveaxis"):
        src, dst = ctx.arg(1, "source"), ctx.arg(2, "destination")
        src = [_norm_axis(int(s), rank) for s in ((src,) if isinstance(src, int) else src)]
        dst = [_norm_axis(int(d), rank) for d in ((dst,) if isinstance(dst, int) else dst)]
        rest = iter(i for i in range(rank) if i not in src)
        placed = dict(zip(dst, src))
        return [placed[j] if j in placed else next(rest) for j in range(rank)]
    raise _Unsupported(op)


def _h_permute(ctx: _Ctx) -> _Spec:
    labels = ctx.labels(0)
    perm = _perm(ctx, len(labels))
    out_labels = tuple(labels[p] for p in perm)
    out = tuple(ctx.out.shape)
    if sorted(perm) != list(range(len(labels))) or tuple(ctx.shape(0)[p] for p in perm) != out:
        raise _Unsupported(f"{ctx.op} permutation {perm}")
    return _Spec("view", dict(zip(out_labels, out)), out_labels, out_labels, out_labels, [tuple(labels)],
                 attrs={"op": ctx.op, "perm": perm})


def _h_expand(ctx: _Ctx) -> _Spec:
    a, b = ctx.shape(0), tuple(ctx.out.shape)
    in_labels = ctx.labels(0)
    off = len(b) - len(a)
    taken = set(in_labels)
    labels = [in_labels[j - off] if j >= off else _fresh(f"d{j}", taken) for j in range(len(b))]
    in_axes = tuple(labels[i + off] if a[i] == b[i + off] else "" for i in range(len(a)))
    dims = [in_axes] + [None] * (len(ctx.operands) - 1)
    return _Spec("view", dict(zip(labels, b)), tuple(labels), tuple(labels), tuple(labels), dims,
                 attrs={"op": ctx.op, "shape": list(b)}, skip=frozenset(range(1, len(ctx.operands))))


def _h_index(ctx: _Ctx) -> _Spec:
    """Basic indexing (ints, slices, None, Ellipsis), ``narrow`` and ``select`` as a view with windows."""
    import torch

    a = ctx.shape(0)
    in_labels = ctx.labels(0)
    if ctx.op == "narrow":
        dim = _norm_axis(int(ctx.arg(1, "dim")), len(a))
        start = int(ctx.arg(2, "start"))
        idx: tuple[Any, ...] = (slice(None),) * dim + (slice(start, start + int(ctx.arg(3, "length"))),)
    elif ctx.op == "select":
        dim = _norm_axis(int(ctx.arg(1, "dim")), len(a))
        idx = (slice(None),) * dim + (int(ctx.arg(2, "index")),)
    else:
        raw = ctx.args[1]
        idx = raw if isinstance(raw, tuple) else (raw,)
    if any(isinstance(x, (torch.Tensor, list)) or (isinstance(x, bool)) for x in idx):
        raise _Unsupported("advanced indexing")
    consumed = sum(1 for x in idx if x is not None and x is not Ellipsis)
    if sum(1 for x in idx if x is Ellipsis) > 1 or consumed > len(a):
        raise _Unsupported("index")
    full: list[Any] = []
    for x in idx:
        if x is Ellipsis:
            full.extend([slice(None)] * (len(a) - consumed))
        else:
            full.append(x)
    full.extend([slice(None)] * (len(a) - sum(1 for x in full if x is not None)))
    taken: set[str] = set()
    labels: list[str] = []
    sizes: list[int] = []
    in_axes: list[str] = []
    windows: dict[int, list[int]] = {}
    ax = 0
    for x in full:
        if x is None:
            labels.append(_fresh("unit", taken))
            sizes.append(1)
            continue
        n = a[ax]
        if isinstance(x, slice):
            start, stop, step = x.indices(n)
            size = max(0, -(-(stop - start) // step))
            name = _fresh(in_labels[ax], taken)
            labels.append(name)
            sizes.append(size)
            in_axes.append(name)
            if (start, step) != (0, 1) or size != n:
                windows[ax] = [step, start, 1]
        else:
            i = int(x) + n if int(x) < 0 else int(x)
            in_axes.append("")
            windows[ax] = [0, i, 1]
        ax += 1
    out = tuple(ctx.out.shape)
    if tuple(sizes) != out:
        raise _Unsupported("index shape")
    spec_windows = {0: windows} if windows else {}
    return _Spec("view", dict(zip(labels, out)), tuple(labels), tuple(labels), tuple(labels), [tuple(in_axes)],
                 attrs={"op": "getitem" if ctx.op in ("getitem", "__getitem__") else ctx.op}, windows=spec_windows)


def _h_pad(ctx: _Ctx) -> _Spec:
    labels = ctx.labels(0)
    a, out = ctx.shape(0), tuple(ctx.out.shape)
    pad = list(ctx.module.padding) if ctx.module is not None else list(ctx.arg(1, "pad"))
    windows: dict[int, list[int]] = {}
    for k in range(len(pad) // 2):
        ax = len(a) - 1 - k
        if pad[2 * k]:
            windows[ax] = [1, -int(pad[2 * k]), 1]
    return _Spec("view", dict(zip(labels, out)), labels, labels, labels, [tuple(labels)],
                 attrs={"op": "pad", "pad": pad}, windows={0: windows} if windows else {})


def _conv_params(ctx: _Ctx, nd: int) -> dict[str, Any]:
    m = ctx.module
    if m is not None:
        return {"kernel": _tup(m.kernel_size, nd), "stride": _tup(m.stride, nd), "padding": m.padding,
                "dilation": _tup(m.dilation, nd), "groups": int(m.groups), "bias": m.bias is not None}
    w = ctx.operands[1][1]
    return {"kernel": tuple(int(s) for s in w.shape[2:]), "stride": _tup(ctx.arg(3, "stride", 1), nd),
            "padding": ctx.arg(4, "padding", 0), "dilation": _tup(ctx.arg(5, "dilation", 1), nd),
            "groups": int(ctx.arg(6, "groups", 1)), "bias": ctx.arg(2, "bias") is not None}


def _h_conv(ctx: _Ctx, nd: int) -> _Spec:
    x_shape, out = ctx.shape(0), tuple(ctx.out.shape)
    if len(x_shape) != nd + 2:
        raise _Unsupported("unbatched convolution")
    p = _conv_params(ctx, nd)
    kernel, stride, dilation, groups = p["kernel"], p["stride"], p["dilation"], p["groups"]
    pad = p["padding"]
    if pad == "valid":
        padding = (0,) * nd
    elif pad == "same":
        padding = tuple(d * (k - 1) // 2 for k, d in zip(kernel, dilation))
    else:
        padding = _tup(pad, nd)
    b, cin = x_shape[0], x_shape[1]
    cout = out[1]
    spatial = _SPATIAL[nd]
    kernels = _KERNEL[nd]
    dims = {"sample": b, "channel": cout, **dict(zip(spatial, out[2:])), "in_channel": cin // groups,
            **dict(zip(kernels, kernel))}
    out_dims = ("sample", "channel", *spatial)
    # grouped convs: input channels follow output channels group by group (proportional map)
    x_axes = ("sample", "channel" if groups > 1 else "in_channel", *spatial)
    windows = {2 + i: [stride[i], -padding[i], (kernel[i] - 1) * dilation[i] + 1] for i in range(nd)}
    flops = 2.0 * b * cout * math.prod(out[2:]) * (cin // groups) * math.prod(kernel)
    operand_dims: list[tuple[str, ...] | None] = [x_axes]
    if len(ctx.operands) > 1:  # functional conv: weight (and bias) may be activations
        operand_dims.append(("channel", "in_channel", *kernels))
        operand_dims.append(("channel",))
    attrs = {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
             "bias": p["bias"], "in_channels": cin, "out_channels": cout,
             "halo": [d * (k - 1) // 2 for k, d in zip(kernel, dilation)]}
    return _Spec(f"conv{nd}d", dims, ("sample", "channel", *spatial), out_dims, out_dims, operand_dims,
                 flops, 2 * flops, attrs=attrs, windows={0: windows})


def _h_linear(ctx: _Ctx) -> _Spec:
    x_shape, out = ctx.shape(0), tuple(ctx.out.shape)
    x_labels = ctx.labels(0)
    k = x_shape[-1]
    n = out[-1]
    lead = x_shape[:-1]
    m = math.prod(lead)
    taken = set(x_labels[:-1])
    ch = _fresh("channel", taken)
    if lead:
        dims = {"sample": m, "channel": n, "in_channel": k}
        out_dims: tuple[str, ...] = ("sample", *("" for _ in lead[1:]), "channel")
        x_axes: tuple[str, ...] = ("sample", *("" for _ in lead[1:]), "in_channel")
        parallel: tuple[str, ...] = ("sample", "channel")
    else:
        dims = {"channel": n, "in_channel": k}
        out_dims, x_axes, parallel = ("channel",), ("in_channel",), ("channel",)
    labels = (*x_labels[:-1], ch)
    operand_dims: list[tuple[str, ...] | None] = [x_axes, ("channel", "in_channel"), ("channel",)]
    flops = 2.0 * m * n * k
    bias = ctx.module.bias is not None if ctx.module is not None else ctx.arg(2, "bias") is not None
    attrs = {"in_features": k, "out_features": n, "bias": bias, "sample_shape": list(lead)}
    return _Spec("linear", dims, parallel, out_dims, labels, operand_dims, flops, 2 * flops, attrs=attrs)


def _h_matmul(ctx: _Ctx) -> _Spec:
    ops = ctx.operands
    first = 1 if ctx.op in ("addmm", "baddbmm", "addbmm", "addmv") else 0
    if len(ops) < first + 2:
        raise _Unsupported("matmul operands")
    ia, ib = first, first + 1
    a, b = ctx.shape(ia), ctx.shape(ib)
    la, lb = ctx.labels(ia), ctx.labels(ib)
    out = tuple(ctx.out.shape)
    if ctx.op == "addbmm":
        raise _Unsupported("addbmm")
    has_m, has_n = len(a) >= 2, len(b) >= 2
    K = a[-1]
    M = a[-2] if has_m else 1
    N = b[-1] if has_n else 1
    batch = out[: len(out) - has_m - has_n]
    taken: set[str] = set()
    batch_labels = []
    for j in range(len(batch)):
        lab = None
        for shape, labs, core in ((a, la, 1 + has_m), (b, lb, 1 + has_n)):
            off = len(batch) - (len(shape) - core)
            ax = j - off
            if 0 <= ax < len(shape) - core and shape[ax] == batch[j]:
                lab = labs[ax]
                break
        batch_labels.append(_fresh(lab or f"batch{j}", taken))
    m_name = _fresh("sample" if has_m and la[-2] == "sample" and "sample" not in taken else "m", taken) if has_m else None
    n_name = _fresh("n", taken) if has_n else None
    k_name = _fresh("k", taken)
    out_dims = (*batch_labels, *([m_name] if m_name else []), *([n_name] if n_name else []))
    # downstream layers name the rows and columns after the operands' axes, not m and n
    sem = set(batch_labels)
    labels = (*batch_labels, *([_fresh(la[-2], sem)] if has_m else []), *([_fresh(lb[-1], sem)] if has_n else []))
    dims = {**dict(zip(batch_labels, batch)), **({m_name: M} if m_name else {}), **({n_name: N} if n_name else {}), k_name: K}

    def batch_axes(shape: tuple[int, ...], core: int) -> tuple[str, ...]:
        nb = len(shape) - core
        off = len(batch) - nb
        return tuple(batch_labels[i + off] if shape[i] == batch[i + off] else "" for i in range(nb))

    a_axes = (*batch_axes(a, 1 + has_m), *([m_name] if has_m else []), k_name)
    b_axes = (*batch_axes(b, 1 + has_n), k_name, *([n_name] if has_n else []))
    operand_dims: list[tuple[str, ...] | None] = [None] * len(ops)
    operand_dims[ia], operand_dims[ib] = a_axes, b_axes
    if first:
        operand_dims[0] = _aligned(ctx, out_dims)[0]
    flops = 2.0 * math.prod(batch) * M * N * K
    return _Spec("matmul", dims, out_dims, out_dims, labels, operand_dims, flops, 2 * flops,
                 attrs={"op": ctx.op, "m": M, "n": N, "k": K, "batch": list(batch)})


def _h_pool(ctx: _Ctx, mode: str, nd: int) -> _Spec:
    x_shape, out = ctx.shape(0), tuple(ctx.out.shape)
    if len(x_shape) != nd + 2:
        raise _Unsupported("unbatched pooling")
    m = ctx.module
    spatial, kernels = _SPATIAL[nd], _KERNEL[nd]
    windows: dict[int, list[int]] = {}
    attrs: dict[str, Any] = {"mode": mode}
    if mode.startswith("adaptive"):
        # output i reads [floor(i*in/out), ceil((i+1)*in/out)): the proportional axis map, no window
        kernel = tuple(-(-x_shape[2 + i] // out[2 + i]) for i in range(nd))
        attrs["output_size"] = list(out[2:])
    else:
        if m is not None:
            k_, s_, p_ = m.kernel_size, m.stride, getattr(m, "padding", 0)
            d_ = getattr(m, "dilation", 1)
            ceil_mode = bool(getattr(m, "ceil_mode", False))
        elif mode == "lp":
            k_, s_, p_, d_, ceil_mode = ctx.arg(2, "kernel_size"), ctx.arg(3, "stride"), 0, 1, bool(ctx.arg(4, "ceil_mode", False))
        else:
            k_ = ctx.arg(1, "kernel_size")
            s_ = ctx.arg(2, "stride")
            p_ = ctx.arg(3, "padding", 0)
            d_ = ctx.arg(4, "dilation", 1) if mode == "max" else 1
            ceil_mode = bool(ctx.arg(5 if mode == "max" else 4, "ceil_mode", False))
        kernel = _tup(k_, nd)
        stride = _tup(s_, nd) if s_ not in (None, [], ()) else kernel
        padding = _tup(p_, nd)
        dilation = _tup(d_, nd)
        windows = {2 + i: [stride[i], -padding[i], (kernel[i] - 1) * dilation[i] + 1] for i in range(nd)}
        attrs.update(kernel=kernel, stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode)
    attrs["kernel"] = list(kernel)
    labels = ("sample", "channel", *spatial)
    dims = {**dict(zip(labels, out)), **dict(zip(kernels, kernel))}
    flops = float(math.prod(out) * math.prod(kernel))
    return _Spec(f"pool{nd}d", dims, labels, labels, labels, [labels], flops, flops, attrs=attrs,
                 windows={0: windows} if windows else {})


def _h_batchnorm(ctx: _Ctx) -> _Spec:
    labels = ctx.labels(0)
    out = tuple(ctx.out.shape)
    numel = math.prod(out)
    reduce = [lab for i, lab in enumerate(labels) if i != 1]
    # OptCNN splits a BN layer like the conv before it (all output dims). A channel split is
    # exact; a sample / spatial split needs the 2*C statistics all-reduced (SyncBN) to be
    # exact, which is what attrs["reduce_dims"] tells a cost model.
    return _Spec("batchnorm", dict(zip(labels, out)), labels, labels, labels, [labels],
                 5.0 * numel, 10.0 * numel, attrs={"reduce_dims": reduce, "num_features": out[1] if len(out) > 1 else 0})


def _h_layernorm(ctx: _Ctx) -> _Spec:
    labels = ctx.labels(0)
    out = tuple(ctx.out.shape)
    shape = ctx.module.normalized_shape if ctx.module is not None else ctx.arg(1, "normalized_shape")
    k = len(_tup(shape, 1)) if not isinstance(shape, int) else 1
    numel = math.prod(out)
    normalized = labels[len(labels) - k:]
    return _Spec("layernorm", dict(zip(labels, out)), labels[: len(labels) - k], labels, labels, [labels],
                 5.0 * numel, 10.0 * numel, attrs={"normalized_dims": list(normalized)})


def _h_norm(ctx: _Ctx) -> _Spec:
    """GroupNorm / InstanceNorm (statistics per sample and channel group), LRN (across channels), others."""
    labels = ctx.labels(0)
    out = tuple(ctx.out.shape)
    numel = math.prod(out)
    windows: dict[int, list[int]] = {}
    name = type(ctx.module).__name__ if ctx.module is not None else ctx.op
    if name in ("LocalResponseNorm", "local_response_norm"):
        size = ctx.module.size if ctx.module is not None else int(ctx.arg(1, "size"))
        parallel = labels
        windows = {1: [1, -(size // 2), size]}
    elif len(labels) >= 2 and name in ("GroupNorm", "group_norm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
                                       "instance_norm"):
        parallel = labels[:2]
    else:
        parallel = labels[:1]
    return _Spec("norm", dict(zip(labels, out)), parallel, labels, labels, [labels], 5.0 * numel, 10.0 * numel,
                 attrs={"op": name}, windows={0: windows} if windows else {})


def _h_softmax(ctx: _Ctx) -> _Spec:
    labels = ctx.labels(0)
    out = tuple(ctx.out.shape)
    dim = ctx.module.dim if ctx.module is not None else ctx.arg(1, "dim")
    if dim is None:
        dim = 0 if len(out) in (0, 1, 3) else 1
    dim = _norm_axis(int(dim), len(out))
    numel = math.prod(out)
    parallel = tuple(lab for i, lab in enumerate(labels) if i != dim)
    return _Spec("softmax", dict(zip(labels, out)), parallel, labels, labels, [labels], 5.0 * numel, 5.0 * numel,
                 attrs={"dim": dim, "op": ctx.op})


def _h_reduce(ctx: _Ctx) -> _Spec:
    in_shape, labels_in = ctx.shape(0), ctx.labels(0)
    out = tuple(ctx.out.shape)
    rank = len(in_shape)
    dim = ctx.kwargs.get("dim", ctx.kwargs.get("axis"))
    if dim is None and len(ctx.args) > 1 and not isinstance(ctx.args[1], bool) and (
        isinstance(ctx.args[1], int) or (isinstance(ctx.args[1], (tuple, list)) and all(isinstance(d, int) for d in ctx.args[1]))
    ):
        dim = ctx.args[1]
    if dim is None or dim == [] or dim == ():
        reduced = set(range(rank))
    else:
        reduced = {_norm_axis(int(d), rank) for d in ((dim,) if isinstance(dim, int) else dim)}
    keepdim = len(out) == rank and rank > 0
    kept = [i for i in range(rank) if i not in reduced]
    if [in_shape[i] for i in kept] != [n for i, n in enumerate(out) if not (keepdim and i in reduced)]:
        raise _Unsupported("reduction shape")
    dims = {labels_in[i]: in_shape[i] for i in kept}
    dims.update({labels_in[i]: in_shape[i] for i in sorted(reduced)})
    if keepdim:
        out_dims = tuple("" if i in reduced else labels_in[i] for i in range(rank))
        labels = tuple(labels_in)
    else:
        out_dims = labels = tuple(labels_in[i] for i in kept)
    numel = float(math.prod(in_shape))
    return _Spec("reduce", dims, tuple(labels_in[i] for i in kept), out_dims, labels, [tuple(labels_in)], numel, numel,
                 attrs={"op": ctx.op, "reduced": [labels_in[i] for i in sorted(reduced)], "keepdim": keepdim})


def _h_concat(ctx: _Ctx) -> _Spec:
    out = tuple(ctx.out.shape)
    stack = ctx.op in ("stack",)
    dim = ctx.kwargs.get("dim", ctx.kwargs.get("axis", ctx.args[1] if len(ctx.args) > 1 else 0))
    dim = _norm_axis(int(dim), len(out))
    first = next((i for i in range(len(ctx.operands)) if ctx.live(i)), 0)
    base = list(ctx.labels(first))
    taken = set(base)
    if stack:
        labels = base[:dim] + [_fresh("stack", taken)] + base[dim:]
    else:
        labels = base
    operand_dims: list[tuple[str, ...] | None] = []
    windows: dict[int, dict[int, list[int]]] = {}
    select: dict[int, tuple[str, int]] = {}
    offset = 0
    for i in range(len(ctx.operands)):
        if stack:
            operand_dims.append(tuple(labels[:dim] + labels[dim + 1:]))
            select[i] = (labels[dim], i)
        else:
            operand_dims.append(tuple(labels))
            windows[i] = {dim: [1, -offset, 1]}
            offset += ctx.shape(i)[dim]
    return _Spec("concat", dict(zip(labels, out)), tuple(labels), tuple(labels), tuple(labels), operand_dims,
                 attrs={"dim": dim, "op": ctx.op, "sizes": [ctx.shape(i)[dim] if not stack else 1 for i in range(len(ctx.operands))]},
                 windows=windows, select=select)


def _h_embedding(ctx: _Ctx) -> _Spec:
    idx_shape, out = ctx.shape(0), tuple(ctx.out.shape)
    idx_labels = ctx.labels(0)
    d = out[-1]
    m = math.prod(idx_shape)
    taken = set(idx_labels)
    labels = (*idx_labels, _fresh("channel", taken))
    if idx_shape:
        dims = {"sample": m, "channel": d}
        out_dims: tuple[str, ...] = ("sample", *("" for _ in idx_shape[1:]), "channel")
        idx_axes: tuple[str, ...] = ("sample", *("" for _ in idx_shape[1:]))
        parallel: tuple[str, ...] = ("sample", "channel")
    else:
        dims, out_dims, idx_axes, parallel = {"channel": d}, ("channel",), (), ("channel",)
    if ctx.module is not None:
        vocab = ctx.module.num_embeddings
    else:
        vocab = int(ctx.operands[1][1].shape[0]) if len(ctx.operands) > 1 else 0
    return _Spec("embedding", dims, parallel, out_dims, labels, [idx_axes, ("", "channel")], 0.0, float(m * d),
                 attrs={"num_embeddings": vocab, "embedding_dim": d, "sample_shape": list(idx_shape)})


def _h_rnn(ctx: _Ctx) -> _Spec:
    """nn.LSTM / GRU / RNN as one layer over all time steps (split on sample only: the recurrence is sequential)."""
    m = ctx.module
    x_shape = ctx.shape(0)
    batched = len(x_shape) == 3
    if not batched:
        raise _Unsupported("unbatched RNN")
    t, b = (x_shape[1], x_shape[0]) if m.batch_first else (x_shape[0], x_shape[1])
    dirs = 2 if m.bidirectional else 1
    h = m.hidden_size
    proj = getattr(m, "proj_size", 0) or h
    gates = {"LSTM": 4, "GRU": 3}.get(m.mode, 1)
    flops = 0.0
    size_in = m.input_size
    for _ in range(m.num_layers):
        flops += 2.0 * t * b * gates * h * (size_in + proj) * dirs
        size_in = proj * dirs
    kind = {"LSTM": "lstm", "GRU": "gru"}.get(type(m).__name__, "rnn")
    seq = ("sample", "length") if m.batch_first else ("length", "sample")
    dims = {"sample": b, "length": t, "channel": proj * dirs, "in_channel": m.input_size, "layer": m.num_layers * dirs}
    out_dims = (*seq, "channel")
    state_dims = ("", "sample", "channel" if dirs == 1 else "")
    operand_dims: list[tuple[str, ...] | None] = [(*seq, "in_channel")] + [state_dims] * (len(ctx.operands) - 1)
    n_states = len(list(_flat_tensors(ctx.value))) - 1
    extra = [(state_dims, ("layer", "sample", "channel"))] * n_states
    return _Spec(kind, dims, ("sample",), out_dims, (*seq, "channel"), operand_dims, flops, 2 * flops,
                 attrs={"hidden_size": h, "num_layers": m.num_layers, "bidirectional": m.bidirectional,
                        "batch_first": m.batch_first},
                 extra=extra)


def _flat_tensors(value: Any) -> Iterator[Any]:
    """Tensors of a nested output (tuples, lists, dicts), in order."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for x in value:
            yield from _flat_tensors(x)
    elif isinstance(value, dict):
        for x in value.values():
            yield from _flat_tensors(x)


def _h_other(ctx: _Ctx, flops: float, kind: str = "other") -> _Spec:
    """An op the builder does not know: split on sample only, when its output has a sample axis."""
    out = tuple(ctx.out.shape) if ctx.out is not None else ()
    labels: tuple[str, ...] | None = None
    for i, (r, v) in enumerate(ctx.operands):
        if isinstance(r, _T) and tuple(v.shape) == out:
            labels = r.labels
            break
    if labels is None:
        labels = _default_axes(len(out), ctx.out is not None and not ctx.out.is_floating_point())
        if not (out and out[0] == ctx.batch):
            labels = tuple(f"d{i}" for i in range(len(out)))
    dims = dict(zip(labels, out))
    attrs: dict[str, Any] = {"op": type(ctx.module).__name__ if ctx.module is not None else ctx.op, "counted_flops": True}
    if "sample" not in dims:
        # an op that reduces the batch away (a loss, a batch statistic): still split by sample,
        # each shard producing a partial result
        batch = next((v.shape[r.labels.index("sample")] for r, v in ctx.operands
                      if isinstance(r, _T) and "sample" in r.labels), None)
        if batch is not None:
            dims = {"sample": batch, **dims}
            attrs["partial_over"] = ["sample"]
    has_sample = "sample" in dims
    operand_dims: list[tuple[str, ...] | None] = []
    for i, (r, v) in enumerate(ctx.operands):
        labs = ctx.labels(i)
        operand_dims.append(tuple(
            "sample" if has_sample and lab == "sample" and v.shape[ax] == dims["sample"] else ""
            for ax, lab in enumerate(labs)))
    return _Spec(kind, dims, ("sample",) if has_sample else (), tuple(labels), tuple(labels), operand_dims,
                 flops, 2 * flops, attrs=attrs)


# ---------------------------------------------------------------------- classification


def _op_name(node: Any) -> str:
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        if node.target is getattr:
            return str(node.args[1])
        return getattr(node.target, "__name__", str(node.target)).lstrip("_")
    return str(node.target)


def _module_handler(m: Any) -> tuple[str, Any]:
    """(handler key, extra) for a leaf module."""
    from torch import nn

    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return "conv", len(m.kernel_size)
    if isinstance(m, nn.Linear):
        return "linear", None
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return "batchnorm", None
    if isinstance(m, nn.LayerNorm):
        return "layernorm", None
    if isinstance(m, (nn.GroupNorm, nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm)) or type(m).__name__ == "RMSNorm":
        return "norm", None
    for cls, mode in ((nn.modules.pooling._MaxPoolNd, "max"), (nn.modules.pooling._AvgPoolNd, "avg"),
                      (nn.modules.pooling._AdaptiveAvgPoolNd, "adaptive_avg"),
                      (nn.modules.pooling._AdaptiveMaxPoolNd, "adaptive_max"), (nn.modules.pooling._LPPoolNd, "lp")):
        if isinstance(m, cls):
            return "pool", (mode, int(type(m).__name__[-2]))
    if isinstance(m, (nn.Softmax, nn.LogSoftmax, nn.Softmin)):
        return "softmax", None
    if isinstance(m, nn.Embedding):
        return "embedding", None
    if isinstance(m, nn.Identity) or (isinstance(m, nn.modules.dropout._DropoutNd) and m.p == 0):
        return "alias", None
    if isinstance(m, (nn.Flatten, nn.Unflatten)):
        return "reshape", None
    if isinstance(m, nn.modules.dropout._DropoutNd):
        return "elementwise", None
    if isinstance(m, nn.RNNBase):
        return "rnn", None
    if isinstance(m, (nn.modules.padding._ConstantPadNd, nn.modules.padding._ReflectionPadNd,
                      nn.modules.padding._ReplicationPadNd)) or type(m).__name__.startswith(("ZeroPad", "CircularPad")):
        return "pad", None
    if isinstance(m, nn.modules.loss._Loss):
        return "loss", None
    if type(m).__module__ == "torch.nn.modules.activation" and not isinstance(m, (nn.MultiheadAttention, nn.GLU)):
        return "elementwise", None
    return "other", None


def _fn_handler(name: str, n_tensors: int) -> tuple[str, Any]:
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    base = base.strip("_") if base.startswith("__") else base
    if base in _CONVS:
        return "conv", _CONVS[base]
    if base == "linear":
        return "linear", None
    if base in _MATMULS:
        return "matmul", None
    if base in _POOLS:
        return "pool", _POOLS[base]
    if base == "batch_norm":
        return "batchnorm", None
    if base == "layer_norm":
        return "layernorm", None
    if base in ("group_norm", "instance_norm", "local_response_norm", "rms_norm", "normalize"):
        return "norm", None
    if base in ("softmax", "log_softmax", "softmin"):
        return "softmax", None
    if base == "embedding":
        return "embedding", None
    if base in ("cat", "concat", "concatenate", "stack"):
        return "concat", None
    if base in _RESHAPES:
        return "reshape", None
    if base in _ALIASES:
        return "alias", None
    if base in _PERMUTES or base in ("T", "mT"):
        return "permute", None
    if base in _EXPANDS:
        return "expand", None
    if base in ("getitem", "narrow", "select"):
        return "index", None
    if base in _PIECES:
        return "pieces", None
    if base == "pad":
        return "pad", None
    if base in _CASTS:
        return "cast", None
    if base in _CONST_LIKE:
        return "const", None
    if base in ("max", "min") and n_tensors >= 2:
        return "elementwise", None
    if base in _REDUCTIONS:
        return "reduce", None
    if base in _ELEMENTWISE:
        return "elementwise", None
    return "other", None


# ---------------------------------------------------------------------- tracing


class _Tracing:
    """State of one shape-specialised trace: fake parameters, fake inputs, FLOPs of unknown ops."""

    def __init__(self, root: Any, fake_mode: Any, inputs: dict[str, Any], model_name: str, batch_size: int | None) -> None:
        self.root = root
        self.batch_size = batch_size
        self.fake_mode = fake_mode
        self.inputs = inputs
        self.model_name = model_name
        self.state = {k: fake_mode.from_tensor(v) for k, v in
                      list(root.named_parameters(remove_duplicate=False)) + list(root.named_buffers(remove_duplicate=False))}
        self.constants: dict[int, Any] = {}
        self.counted: dict[Any, float] = {}

    def value(self, node: Any) -> Any:
        """The fake value of an fx node (computed on first use: get_attr nodes fx makes for constants)."""
        if "val" not in node.meta:
            node.meta["val"] = self.compute(node)
        return node.meta["val"]

    def compute(self, node: Any) -> Any:
        import torch
        import torch.fx as fx
        from torch.utils.flop_counter import FlopCounterMode

        if node.op == "placeholder":
            return self.inputs.get(node.target, node.args[0] if node.args else None)
        if node.op == "get_attr":
            if node.target in self.state:
                return self.state[node.target]
            # constants fx made from tensors created in forward live on the root while tracing,
            # on the GraphModule after
            obj = _resolve_attr(node.graph.owning_module or self.root, node.target)
            if isinstance(obj, torch.Tensor) and not isinstance(obj, torch._subclasses.fake_tensor.FakeTensor):
                if id(obj) not in self.constants:
                    self.constants[id(obj)] = self.fake_mode.from_tensor(obj)
                return self.constants[id(obj)]
            return obj
        # while fx traces, nn.Module.__call__ / __getattr__ are patched to record nodes; the
        # values are computed with the patches lifted so that leaf modules really run (on fakes)
        from torch.fx._symbolic_trace import _maybe_revert_all_patches

        args = fx.node.map_aggregate(node.args, lambda a: self.value(a) if isinstance(a, fx.Node) else a)
        kwargs = fx.node.map_aggregate(node.kwargs, lambda a: self.value(a) if isinstance(a, fx.Node) else a)
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

        count = _needs_count(node, self.root)
        try:
            with _maybe_revert_all_patches(), (FlopCounterMode(display=False) if count else contextlib.nullcontext()) as fc:
                try:
                    out, scale = self._run(node, args, kwargs), 1
                except (DataDependentOutputException, DynamicOutputShapeException):
                    if node.op != "call_module":
                        raise
                    out, scale = self._run_real(node, args, kwargs)
            if count:
                self.counted[node] = float(fc.get_total_flops()) * scale
            return out
        except Exception as err:
            msg = str(err).split("\n\nWhile executing")[0].strip()
            raise LayerGraphError(
                f"model {self.model_name!r}: shape propagation failed at {node.op} {_target_name(node)!r} "
                f"(fx node {node.name}): {type(err).__name__}: {msg}"
            ) from err

    def _run(self, node: Any, args: Any, kwargs: Any) -> Any:
        import torch

        if node.op == "call_function":
            return node.target(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        if node.op == "call_module":
            mod = self.root.get_submodule(node.target)
            prefix = node.target + "."
            sub = {k[len(prefix):]: v for k, v in self.state.items() if k.startswith(prefix)}
            if not sub:
                return mod(*args, **kwargs)
            # the leaf runs on fake copies of its own parameters and buffers: the user's module
            # is never touched (BatchNorm running statistics stay as they are)
            return torch.func.functional_call(mod, sub, tuple(args), kwargs, tie_weights=True, strict=False)
        raise LayerGraphError(f"unexpected fx node {node.op}")

    def _run_real(self, node: Any, args: Any, kwargs: Any) -> tuple[Any, int]:
        """Run a leaf module whose Python reads tensor values (``if x.sum() > 0``), which fake
        tensors cannot answer, once on real zeros with batch 1; outputs get the batch back.

        Returns the (fake) outputs and the factor to scale its measured FLOPs by.
        """
        import torch
        import torch.fx as fx
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        batch = self.batch_size or 1

        def shrink(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                shape = list(v.shape)
                if shape and shape[0] == batch:
                    shape[0] = 1
                return torch.zeros(shape, dtype=v.dtype)
            return v

        mod = self.root.get_submodule(node.target)
        with unset_fake_temporarily():
            real_args = fx.node.map_aggregate(args, shrink)
            real_kwargs = fx.node.map_aggregate(kwargs, shrink)
            buffers = {k: v.clone() for k, v in mod.named_buffers()}  # leave running statistics alone
            with torch.no_grad():
                out = torch.func.functional_call(mod, buffers, tuple(real_args), real_kwargs, strict=False)

        def grow(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                shape = list(v.shape)
                if shape and shape[0] == 1 and batch != 1:
                    shape[0] = batch
                return torch.empty(shape, dtype=v.dtype)
            return v

        return fx.node.map_aggregate(out, grow), batch


def _target_name(node: Any) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__qualname__", getattr(t, "__name__", str(t)))


def _needs_count(node: Any, root: Any) -> bool:
    """Whether the builder will not know this call, so its FLOPs are measured while tracing."""
    if node.op == "call_module":
        return _module_handler(root.get_submodule(node.target))[0] in ("other", "loss")
    if node.op in ("call_function", "call_method"):
        return _fn_handler(_op_name(node), 2)[0] == "other"
    return False


def _tracer_class(extra_leaves: tuple[type, ...]) -> type:
    """``torch.fx.Tracer`` (module level, standard torch.nn leaves) whose proxies carry fake values.

    Shape specialisation: ``x.shape``, ``x.size()``, ``x.dim()``, ``len(x)``, iterating a
    tensor or a tuple (``for x_t in x.unbind(1)``) and ``bool`` of a non-tensor value (``if
    x.shape[1] > 1``) are answered from the fake values, so Python loops over time steps and
    shape arithmetic trace (they unroll for the given input shapes). ``bool`` of a tensor
    (``if x.sum() > 0``) is data-dependent control flow and still fails, as in symbolic_trace.
    """
    import torch
    import torch.fx as fx

    class _ValueProxy(fx.Proxy):
        def _val(self) -> Any:
            tracing = getattr(self.tracer, "tracing", None)
            return tracing.value(self.node) if tracing is not None else None

        @property
        def shape(self) -> Any:
            v = self._val()
            return v.shape if isinstance(v, torch.Tensor) else self.__getattr__("shape")

        def size(self, dim: int | None = None) -> Any:
            v = self._val()
            if isinstance(v, torch.Tensor):
                return v.size() if dim is None else v.size(dim)
            return self.__getattr__("size")() if dim is None else self.__getattr__("size")(dim)

        def dim(self) -> Any:
            v = self._val()
            return v.dim() if isinstance(v, torch.Tensor) else self.__getattr__("dim")()

        @property
        def ndim(self) -> Any:
            v = self._val()
            return v.dim() if isinstance(v, torch.Tensor) else self.__getattr__("ndim")

        def numel(self) -> Any:
            v = self._val()
            return v.numel() if isinstance(v, torch.Tensor) else self.__getattr__("numel")()

        @property
        def dtype(self) -> Any:
            v = self._val()
            return v.dtype if isinstance(v, torch.Tensor) else self.__getattr__("dtype")

        @property
        def device(self) -> Any:
            v = self._val()
            return v.device if isinstance(v, torch.Tensor) else self.__getattr__("device")

        def __len__(self) -> int:
            v = self._val()
            if isinstance(v, (tuple, list, torch.Size)) or (isinstance(v, torch.Tensor) and v.dim() > 0):
                return len(v)
            return super().__len__()

        def __iter__(self) -> Any:
            v = self._val()
            if isinstance(v, (tuple, list, torch.Size)) or (isinstance(v, torch.Tensor) and v.dim() > 0):
                return iter([self[i] for i in range(len(v))])
            return super().__iter__()

        def __bool__(self) -> bool:
            v = self._val()
            if isinstance(v, (bool, int, float)):
                return bool(v)
            return super().__bool__()

    class _LeafTracer(fx.Tracer):
        """Module-level tracer: standard torch.nn layers (and ``extra_leaves``) are leaves."""

        def __init__(self) -> None:
            super().__init__()
            self.tracing: _Tracing | None = None
            self.failed_in: str | None = None

        def is_leaf_module(self, m: Any, qualname: str) -> bool:
            return (bool(extra_leaves) and isinstance(m, extra_leaves)) or super().is_leaf_module(m, qualname)

        def proxy(self, node: Any) -> Any:
            return _ValueProxy(node, self)

        def create_proxy(self, kind: str, target: Any, args: Any, kwargs: Any, name: Any = None,
                         type_expr: Any = None, proxy_factory_fn: Any = None) -> Any:
            p = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
            if self.tracing is not None and isinstance(p, fx.Proxy):
                self.tracing.value(p.node)
            return p

        def call_module(self, m: Any, forward: Any, args: Any, kwargs: Any) -> Any:
            qual = self.path_of_module(m)
            try:
                return super().call_module(m, forward, args, kwargs)
            except LayerGraphError:
                raise
            except Exception:
                if self.failed_in is None:
                    self.failed_in = qual
                raise

    return _LeafTracer


def _trace(module: Any, name: str, leaf_modules: tuple[type, ...], concrete: dict[str, Any], tracing: _Tracing) -> Any:
    import torch.fx as fx

    tracer = _tracer_class(leaf_modules)()
    tracer.tracing = tracing
    before = set(vars(module))
    try:
        graph = tracer.trace(module, concrete_args=concrete or None)
        gm = fx.GraphModule(tracer.root, graph, type(module).__name__)
    except LayerGraphError:
        raise
    except Exception as err:  # fx raises TraceError, TypeError, RuntimeError... for untraceable code
        where = ""
        hint = "mark the submodule that contains it as a leaf"
        if tracer.failed_in:
            sub = module.get_submodule(tracer.failed_in)
            where = f" inside submodule {tracer.failed_in!r} ({type(sub).__name__})"
            hint = f"mark it as a leaf: build_layer_graph(..., leaf_modules=({type(sub).__name__},))"
        raise LayerGraphError(
            f"torch.fx.symbolic_trace cannot trace model {name!r}{where}: {type(err).__name__}: {err}. "
            f"Data-dependent control flow or Python-level use of tensor values cannot be traced; {hint}, "
            "so that it becomes one layer of the graph."
        ) from err
    finally:
        # fx stores tensors created in forward on the traced root as _tensor_constantN: not on the user's model
        for attr in set(vars(module)) - before:
            if attr.startswith("_tensor_constant"):
                delattr(module, attr)
    return gm


def build_layer_graph(
    module: "torch.nn.Module",
    inputs: Sequence[InputLike] | Mapping[str, InputLike],
    *,
    name: str = "",
    batch_size: int | None = None,
    leaf_modules: tuple[type, ...] = (),
) -> LayerGraph:
    """Trace ``module`` at module level with ``torch.fx`` and build its :class:`LayerGraph`.

    ``inputs``: one spec per positional argument of ``forward`` (or a mapping from argument
    name to spec): ``(shape, dtype)`` with the batch dimension included (integer token inputs
    need ``torch.int64`` / ``"int64"``), ``(shape, dtype, axis names)``, a shape tuple (float32),
    an :class:`InputSpec`, or a tensor (only its shape and dtype are read). Forward arguments
    after those given keep their defaults (they are passed to fx as concrete arguments).

    The tracer is ``torch.fx.symbolic_trace``'s (standard ``torch.nn`` layers and
    ``leaf_modules`` are leaves) with every proxy carrying its value as a fake tensor
    (``FakeTensorMode``, fake copies of the parameters and buffers): nothing is allocated
    whatever the batch size, the module is not modified (BatchNorm statistics are untouched),
    and shape-dependent Python (``len(x.unbind(1))``, loops over time steps, ``x.shape[1]``)
    is specialised to the given shapes.

    Raises :class:`LayerGraphError` naming the model, the fx error and the submodule to mark
    as a leaf when tracing fails, or the node when shape propagation fails.
    """
    import inspect

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    model_name = name or type(module).__name__
    sig_params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if isinstance(inputs, Mapping):
        known = {p.name for p in sig_params}
        unknown = [k for k in inputs if k not in known]
        if unknown:
            raise LayerGraphError(f"model {model_name!r}: forward() has no argument(s) {unknown}; it takes {sorted(known)}")
        named = [(p.name, inputs[p.name]) for p in sig_params if p.name in inputs]
        if [k for k, _ in named] != [p.name for p in sig_params[: len(named)]]:
            raise LayerGraphError(f"model {model_name!r}: inputs must be the first arguments of forward(), in order")
    else:
        if len(inputs) > len(sig_params):
            raise LayerGraphError(f"model {model_name!r}: {len(inputs)} inputs given, forward() takes {len(sig_params)}")
        named = [(p.name, x) for p, x in zip(sig_params, inputs)]
    specs = [(k, _as_spec(x, k)) for k, x in named]
    concrete: dict[str, Any] = {}
    for p in sig_params[len(specs):]:
        if p.default is inspect.Parameter.empty:
            raise LayerGraphError(f"model {model_name!r}: no input given for forward() argument {p.name!r}, which has no default")
        concrete[p.name] = p.default
    if batch_size is None:
        batch_size = specs[0][1].shape[0] if specs and specs[0][1].shape else None

    param_names: dict[int, str] = {}
    param_nbytes: dict[str, int] = {}
    for pname, p in module.named_parameters():
        param_names[id(p)] = pname
        param_nbytes[pname] = p.numel() * p.element_size()
    first_param = next(iter(module.parameters()), None)
    device = first_param.device if first_param is not None else torch.device("cpu")

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with _quiet_fake_tensor_logs(), fake_mode:
        fake_inputs = {k: torch.empty(s.shape, dtype=getattr(torch, s.dtype), device=device) for k, s in specs}
        tracing = _Tracing(module, fake_mode, fake_inputs, model_name, batch_size)
        gm = _trace(module, model_name, tuple(leaf_modules), concrete, tracing)
        modules = dict(gm.named_modules())
        env = {n: tracing.value(n) for n in gm.graph.nodes if n.op != "output"}

        b = _Builder(env, tracing.counted, modules, param_names, param_nbytes, batch_size)
        outputs: list[int] = []
        input_meta = []
        spec_by_name = dict(specs)
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                s = spec_by_name.get(n.target)
                val = env.get(n)
                if s is None or not isinstance(val, torch.Tensor):
                    b.refs[n] = None
                    continue
                axes = s.axes or _default_axes(len(s.shape), not val.is_floating_point())
                if len(axes) != len(s.shape) or len(set(axes)) != len(axes) or not all(axes):
                    raise LayerGraphError(f"input {n.target!r}: axis names {axes} must be {len(s.shape)} distinct non-empty names")
                axes = tuple(axes)
                spec = _Spec("input", dict(zip(axes, s.shape)), axes, axes, axes, [])
                b.refs[n] = b.emit(n.name, spec, [], set(), val)
                input_meta.append({"name": n.target, "shape": list(s.shape), "dtype": s.dtype, "axes": list(axes)})
            elif n.op == "get_attr":
                val = env.get(n)
                pname = param_names.get(id(_resolve_attr(gm, n.target)))
                if pname is not None:
                    b.refs[n] = _Param(frozenset([pname]))
                else:
                    b.refs[n] = _CONST if isinstance(val, torch.Tensor) else None
            elif n.op == "output":
                for r in b.ref_leaves(_map_refs(b, n.args[0])):
                    if isinstance(r, _T) and r.node not in outputs:
                        outputs.append(r.node)
            else:
                _build_call(b, n)

    dtype = next((t.dtype for t in module.parameters() if t.is_floating_point()), None)
    if dtype is None:
        dtype = next((getattr(torch, s.dtype) for _, s in specs if getattr(torch, s.dtype).is_floating_point), torch.float32)
    meta = {
        "model": model_name,
        "batch_size": batch_size,
        "dtype": _dtype_name(dtype),
        "inputs": input_meta,
        "outputs": outputs,
        "leaf_modules": sorted(t.__name__ for t in leaf_modules),
        "builder": "torch.fx module-level trace + FakeTensorMode",
        "torch": torch.__version__.split("+")[0],
    }
    if b.edges:
        src, dst, nb, dp, sp = (np.asarray(c) for c in zip(*b.edges))
    else:
        src = dst = nb = dp = sp = np.zeros(0, dtype=np.int64)
    return LayerGraph(
        names=b.names, kinds=b.kinds, dims=b.dims, parallel_dims=b.parallel, flops_fwd=np.asarray(b.ff),
        flops_bwd=np.asarray(b.fb), param_bytes=np.asarray(b.pbytes, dtype=np.int64), out_shape=b.out_shape,
        out_bytes=np.asarray(b.out_bytes, dtype=np.int64), out_dims=b.out_dims, in_dims=b.in_dims, attrs=b.attrs,
        src=src, dst=dst, nbytes=nb, dst_port=dp, src_port=sp, meta=meta,
    )


class _quiet_fake_tensor_logs:
    """FakeTensorMode logs a traceback at ERROR level before re-raising a shape error; the
    builder re-raises it as a LayerGraphError naming the layer, so the log is noise."""

    def __enter__(self) -> None:
        import logging

        self.logger = logging.getLogger("torch._subclasses.fake_tensor")
        self.level = self.logger.level
        self.logger.setLevel(logging.CRITICAL)

    def __exit__(self, *exc: Any) -> None:
        self.logger.setLevel(self.level)


def _resolve_attr(root: Any, target: str) -> Any:
    obj = root
    for part_ in target.split("."):
        obj = getattr(obj, part_, None)
        if obj is None:
            return None
    return obj


def _map_refs(b: _Builder, a: Any) -> Any:
    import torch.fx as fx

    if isinstance(a, fx.Node):
        return b.ref_of(a)
    if isinstance(a, (list, tuple)):
        return [_map_refs(b, x) for x in a]
    if isinstance(a, dict):
        return [_map_refs(b, x) for x in a.values()]
    return None


def _select(b: _Builder, n: Any) -> bool:
    """``getitem`` / ``getattr`` picking one element of a multi-output value: no node, just a ref.

    Returns True when ``n`` was such a selection (``lstm_out[0]``, ``x.max(1).values``, a chunk
    piece); pieces are not materialised here, only when something reads them.
    """
    import torch.fx as fx

    if n.op != "call_function" or n.target not in (operator.getitem, getattr) or not isinstance(n.args[0], fx.Node):
        return False
    src_ref = b.refs.get(n.args[0])
    if isinstance(src_ref, dict):  # model outputs as dicts: out["logits"]
        b.refs[n] = src_ref.get(n.args[1]) if n.target is operator.getitem else None
        return True
    if not isinstance(src_ref, (list, tuple)):
        if isinstance(src_ref, (_Param, _Const)):  # indexing a parameter or a constant
            b.refs[n] = src_ref if any(True for _ in b.tensors_in(b.env[n])) else None
            return True
        return False
    src_val = b.env[n.args[0]]
    val = b.env[n]
    pos = next((k for k, x in enumerate(src_val) if x is val), None)
    if pos is None and n.target is operator.getitem and isinstance(n.args[1], int):
        pos = n.args[1]
    b.refs[n] = src_ref[pos] if pos is not None and pos < len(src_ref) else None
    return True


def _build_call(b: _Builder, n: Any) -> None:
    """Turn one call_module / call_function / call_method fx node into zero or one layer graph node."""
    import torch

    if _select(b, n):
        return
    value = b.env[n]
    if not any(True for _ in b.tensors_in(value)):
        b.refs[n] = None  # sizes, dtypes, devices: not data
        return
    arg_refs = list(b.ref_leaves(_map_refs(b, (n.args, n.kwargs))))
    live = [r for r in arg_refs if isinstance(r, _T)]
    params: set[str] = set()
    for r in arg_refs:
        if isinstance(r, _Param):
            params |= r.names
    module = b.modules.get(n.target) if n.op == "call_module" else None
    own_params = {b.param_names[id(p)] for p in module.parameters() if id(p) in b.param_names} if module is not None else set()
    if not live and not own_params:
        b.refs[n] = _Param(frozenset(params)) if params else _CONST
        return

    if module is not None:
        key, extra = _module_handler(module)
        op = type(module).__name__
    else:
        op = _op_name(n)
        key, extra = _fn_handler(op, sum(1 for _ in b.tensors_in(b.value_of((n.args, n.kwargs)))))
    if key == "const":
        b.refs[n] = _CONST
        return
    ctx = _Ctx(b, n, op, module)
    if key == "elementwise" and op.startswith("dropout") and ctx.arg(1, "p", 0.5) == 0:
        key = "alias"
    if key == "cast" and ctx.out is not None and ctx.operands and ctx.out.dtype == ctx.operands[0][1].dtype:
        key = "alias"  # .float() of a float tensor, .to(same dtype): the same tensor
    if key == "alias" and isinstance(value, torch.Tensor) and ctx.operands and isinstance(ctx.operands[0][0], _T) \
            and tuple(value.shape) == ctx.operands[0][0].shape:
        b.refs[n] = ctx.operands[0][0]
        return
    if key == "pieces":
        b.refs[n] = _pieces(n, ctx)
        return
    try:
        spec = _dispatch(ctx, key, extra)
    except (_Unsupported, AttributeError, TypeError, ValueError, IndexError, KeyError):
        spec = None
    if spec is None:
        flops = b.counted[n] if n in b.counted else _count_flops(ctx)
        spec = _h_other(ctx, flops, "loss" if key == "loss" else "other")
    if module is not None:
        calls = b.module_calls.get(n.target, 0)
        b.module_calls[n.target] = calls + 1
        node_name = n.target if calls == 0 else f"{n.target}@{calls}"
        spec.attrs.setdefault("module", n.target)
        spec.attrs.setdefault("type", type(module).__name__)
    else:
        node_name = n.name
    b.refs[n] = b.emit(node_name, spec, ctx.operands, params | own_params, value)


def _dispatch(ctx: _Ctx, key: str, extra: Any) -> _Spec | None:
    if ctx.out is None:
        return None
    if key == "conv":
        return _h_conv(ctx, extra)
    if key == "linear":
        return _h_linear(ctx)
    if key == "matmul":
        return _h_matmul(ctx)
    if key == "pool":
        return _h_pool(ctx, *extra)
    if key == "batchnorm":
        return _h_batchnorm(ctx)
    if key == "layernorm":
        return _h_layernorm(ctx)
    if key == "norm":
        return _h_norm(ctx)
    if key == "softmax":
        return _h_softmax(ctx)
    if key == "embedding":
        return _h_embedding(ctx)
    if key == "concat":
        return _h_concat(ctx)
    if key in ("reshape", "alias"):
        return _h_reshape(ctx)
    if key == "permute":
        return _h_permute(ctx)
    if key == "expand":
        return _h_expand(ctx)
    if key == "index":
        return _h_index(ctx)
    if key == "pad":
        return _h_pad(ctx)
    if key == "cast":
        return _h_cast(ctx)
    if key == "reduce":
        return _h_reduce(ctx)
    if key == "elementwise":
        return _h_elementwise(ctx)
    if key == "rnn":
        return _h_rnn(ctx)
    return None


def _count_flops(ctx: _Ctx) -> float:
    """FLOPs of a call the builder had to fall back on, re-run under FlopCounterMode (fake tensors)."""
    from torch.utils.flop_counter import FlopCounterMode

    node = ctx.node
    try:
        with FlopCounterMode(display=False) as fc:
            if node.op == "call_function":
                node.target(*ctx.args, **ctx.kwargs)
            elif node.op == "call_method":
                getattr(ctx.args[0], node.target)(*ctx.args[1:], **ctx.kwargs)
            else:
                return 0.0
        return float(fc.get_total_flops())
    except Exception:
        return 0.0


def _pieces(n: Any, ctx: _Ctx) -> Any:
    """chunk / split / unbind of a layer's output: lazy pieces, each a view node once read."""
    src = ctx.operands[0][0]
    if not isinstance(src, _T):
        return _CONST
    rank = len(src.shape)
    dim = ctx.kwargs.get("dim")
    if dim is None:
        pos = 1 if ctx.op == "unbind" else 2
        dim = ctx.args[pos] if len(ctx.args) > pos else 0
    axis = _norm_axis(int(dim), rank)
    squeeze = ctx.op == "unbind"
    pieces = []
    start = 0
    for i, t in enumerate(ctx.value):
        size = 1 if squeeze else int(t.shape[axis])
        pieces.append(_Piece(src, axis, start, start + size, squeeze, f"{n.name}[{i}]"))
        start += size
    return tuple(pieces)
