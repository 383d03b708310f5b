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

*Attributes the cost models read* (``attrs[v]``, all optional): ``gemm`` (lists of dim names
under ``batch``, ``m``, ``n``, ``k``: PaSE's multi-index GEMM view, every index its own dim),
``pw`` (pointwise ops fused into the layer, PaSE's ``pw_op_cnt``), ``norm_dim`` (the axis a
norm normalises), ``loss: softmax_cross_entropy`` with ``class_dim``, ``contiguous`` (a
reshape that splits only contiguously, PaSE's Ravel / Unravel), ``param_dims`` (the dims that
index the weights, where the default rule would guess wrong).

Building: :func:`harness.core.layerfx.build_layer_graph` traces a ``torch.nn.Module`` with ``torch.fx``
and fake tensors and turns it into a ``LayerGraph`` (what becomes a node and how tracing works are
described in :mod:`harness.core.layerfx`); :class:`harness.core.layer_builder.LayerGraphBuilder`
writes one from code, a layer per call; :meth:`LayerGraph.save` / :meth:`LayerGraph.load` keep
one in a JSON file (docs/layer_graphs.md) that ``model=from_file`` reads. This module needs
numpy only: a saved graph loads and is searched without torch.

FLOPs
-----
``flops_fwd`` / ``flops_bwd`` per node. GEMM-like layers (conv, linear, matmul) count
``2*m*n*k`` multiply-adds (bias omitted, as ``torch.utils.flop_counter`` does), and backward is
``2x`` forward (gradient w.r.t. the input plus gradient w.r.t. the weights). Other layers are
memory-bound; they get a nominal per-element count so that they are not free: elementwise 1
per output element (backward 1), softmax 5 (backward 5), batch/layer norm 5 (backward 10),
pooling one per window element (backward the same), reductions one per input element
(backward the same), embedding 0 forward and one per output element backward (the
scatter-add into the table); views, concatenation and inputs 0. Layers the builder
(:mod:`harness.core.layerfx`) does not know are measured with ``torch.utils.flop_counter.FlopCounterMode``
on fake tensors and get backward ``2x`` forward.

Kinds: ``input, conv1d, conv2d, conv3d, linear, matmul, pool1d, pool2d, pool3d, batchnorm,
layernorm, norm, elementwise, softmax, reduce, concat, embedding, view, lstm, gru, rnn, loss,
other``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.core.errors import UserError
from harness.core.graph import EdgeListGraph, read_json_object
from harness.core.graph_file import MAX_SIZE, figures

if TYPE_CHECKING:
    import networkx as nx

LAYERGRAPH_FORMAT = "harness.layergraph/1"

#: kinds whose FLOPs are GEMMs and that :meth:`LayerGraph.gemm_mnk` can view as (m, n, k)
GEMM_KINDS: frozenset[str] = frozenset({"conv1d", "conv2d", "conv3d", "linear", "matmul"})

Range = tuple[int, int]


class LayerGraphError(UserError, ValueError):
    """A layer graph cannot be built (untraceable model, bad input spec) or is malformed."""


def _size(x: Any, what: str, lo: int) -> int:
    """``x`` as an int in ``lo..MAX_SIZE``, else a :class:`LayerGraphError` naming ``what``."""
    whole = not isinstance(x, bool) and (isinstance(x, (int, np.integer)) or (isinstance(x, float) and x.is_integer()))
    if not whole or not lo <= int(x) <= MAX_SIZE:
        raise LayerGraphError(f"{what} has {x!r}; a size must be an integer in {lo}..{MAX_SIZE}")
    return int(x)


def _sizes(dims: Any, layer: str) -> dict[str, int]:
    """A layer's iteration domain ``{dim: size}``, each size an integer in 1..MAX_SIZE."""
    if not isinstance(dims, Mapping):
        raise LayerGraphError(f"node {layer}: dims must be a mapping from dim name to size, got {type(dims).__name__}")
    return {str(k): _size(v, f"node {layer}: dim {k!r}", 1) for k, v in dims.items()}


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
        if not all(isinstance(x, str) for x in self.names):
            raise LayerGraphError("LayerGraph.names must be a list of layer names (strings)")
        if not isinstance(self.meta, dict):
            raise LayerGraphError(f"LayerGraph.meta must be a mapping (a JSON object), got {type(self.meta).__name__}")
        self.kinds = list(self.kinds)
        self.dims = [_sizes(d, self.names[v] if v < n else str(v)) for v, d in enumerate(self.dims)]
        self.parallel_dims = [tuple(p) for p in self.parallel_dims]
        self.out_shape = [tuple(_size(x, f"node {self.names[v] if v < n else v}: out_shape", 0) for x in s)
                          for v, s in enumerate(self.out_shape)]
        self.out_dims = [tuple(d) for d in self.out_dims]
        self.in_dims = [[tuple(a) for a in ports] for ports in self.in_dims]
        self.attrs = [dict(a) for a in self.attrs]

        def node(i: int) -> str:
            return f"node {i} ({self.names[i]})" if i < n else f"node {i}"

        def length(values: Any) -> int:  # the lengths are checked by _validate, with the field's name
            return len(values) if hasattr(values, "__len__") else -1

        self.flops_fwd = figures(self.flops_fwd, "flops_fwd", length(self.flops_fwd), False, node, LayerGraphError)
        self.flops_bwd = figures(self.flops_bwd, "flops_bwd", length(self.flops_bwd), False, node, LayerGraphError)
        self.param_bytes = figures(self.param_bytes, "param_bytes", length(self.param_bytes), True, node, LayerGraphError).astype(np.int64)
        self.out_bytes = figures(self.out_bytes, "out_bytes", length(self.out_bytes), True, node, LayerGraphError).astype(np.int64)
        self.src = np.asarray(self.src, dtype=np.int32)
        self.dst = np.asarray(self.dst, dtype=np.int32)
        self.nbytes = figures(self.nbytes, "nbytes", length(self.nbytes), True, lambda e: f"edge {e}", LayerGraphError).astype(np.int64)
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
        n = columns, k = the contracted dim. A node with ``attrs["gemm"]`` (PaSE's multi-index
        GEMM: lists of dim names under ``batch``, ``m``, ``n``, ``k``) multiplies each group's
        sizes, batch into m. Always ``2*m*n*k == flops_fwd[v]``.
        """
        kind, d = self.kinds[v], self.dims[v]
        if kind not in GEMM_KINDS:
            return None
        groups = self.attrs[v].get("gemm")
        if groups:
            def prod(key: str) -> int:
                out = 1
                for name in groups.get(key, ()):
                    out *= d[name]
                return out
            return (prod("batch") * prod("m"), prod("n"), prod("k"))
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
        """The graph of a :meth:`to_dict` mapping (docs/layer_graphs.md); a missing or unknown
        field, or one of the wrong type or length, is a :class:`LayerGraphError` naming it."""
        fmt = d.get("format")
        if fmt != LAYERGRAPH_FORMAT:
            raise LayerGraphError(f"not a layer graph: format is {fmt!r}, expected {LAYERGRAPH_FORMAT!r}")
        fields = {f for f in cls.__dataclass_fields__ if cls.__dataclass_fields__[f].init}
        optional = {"meta", "src_port"}
        unknown = sorted(set(d) - fields - {"format"})
        if unknown:
            raise LayerGraphError(f"unknown field {unknown[0]!r} (a layer graph has {sorted(fields)})")
        missing = sorted(fields - optional - set(d))
        if missing:
            raise LayerGraphError(f"missing field {missing[0]!r}")
        try:
            return cls(**{k: v for k, v in d.items() if k != "format"})
        except LayerGraphError:
            raise
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as e:
            raise LayerGraphError(f"malformed layer graph ({type(e).__name__}: {e})") from None

    def save(self, path: str | Path) -> None:
        """Write the graph as JSON, readable by :meth:`load` and ``model=from_file``."""
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> "LayerGraph":
        """The graph saved at ``path``; any mistake in the file is a :class:`LayerGraphError` naming the file."""
        d = read_json_object(path, "layer graph file", LayerGraphError)
        try:
            return cls.from_dict(d)
        except LayerGraphError as e:
            raise LayerGraphError(f"layer graph file {path}: {e}") from None

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
