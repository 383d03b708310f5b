"""The operator graph (``OpGraph``): one training step as a DAG of operators.

The graph is array-first: per-node attributes are numpy arrays indexed by node id,
edges are three parallel arrays (``src``, ``dst``, ``nbytes``) and successors /
predecessors are CSR arrays derived from them.  Node ids are always a topological
order (every edge has ``src < dst``): algorithms may sweep ``range(n)`` forwards for
a forward pass and backwards for a backward pass without sorting.

What the papers call the computation graph G = (V, E) with computation costs w_i and
communication costs c_ij (Celeritas Eq. 1; FD-DPS Sec. 3) is this graph plus a
:class:`harness.core.costs.CostModel`, which turns FLOPs and bytes into seconds.

A graph file (:meth:`OpGraph.load`, ``model=from_file``) is checked before it is used, and
every mistake is a :class:`GraphError` naming the file and the culprit: a missing, empty or
malformed file (with the JSON line and column), a value that is not a JSON object, a bad field
(:mod:`harness.core.graph_file`: unknown or missing, negative or non-finite figures, indices
out of range), and a cycle (by the nodes on it; ids that are merely not topological are
renumbered, as :meth:`OpGraph.from_unordered` does).

Measured times (format ``harness.opgraph/2``, docs/graph_format.md): the optional
``node_time_s`` maps a device kind (a cluster device's ``kind``, e.g. ``V100-SXM2-32GB``) or
``"*"`` (any device) to one entry per node, the node's measured seconds or null (not measured).
Every cost model answers a measured node with its time (:func:`harness.core.costs.with_measured`):
the kind's entry wins over ``"*"``, a null falls through to ``"*"`` and then to the model's
estimate.  A bad entry is a GraphError naming the key and the node.  Files of
``harness.opgraph/1`` (no ``node_time_s``) load unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from harness.core.errors import UserError
from harness.core.graph_file import check_graph_fields
from harness.core.graph_terms import (  # noqa: F401 - the graph's vocabulary, imported from here too
    ANY_DEVICE,
    BACKWARD,
    BATCH_ROLES,
    BATCHED,
    FORWARD,
    GRAPH_FORMAT,
    GRAPH_FORMATS,
    PARTIAL,
    PHASES,
    REPLICATED,
    UPDATE,
    GraphError,
    show_number,
)
from harness.core.kernels import KernelTable

#: what :func:`read_json_object` calls a JSON value that is not an object, by Python type
_JSON_KINDS: dict[type, str] = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
                                type(None): "null"}

#: the largest JSON file :func:`read_json_object` reads (a graph of millions of nodes fits)
MAX_JSON_BYTES = 4 * 2**30


def read_json_object(path: str | Path, what: str, error: type[UserError]) -> dict[str, Any]:
    """The JSON object in the file at ``path`` (``what`` names the file in messages, e.g.
    ``graph file``); a missing, unreadable, empty or malformed file, or one that holds another
    JSON value, is ``error`` with the path and, where it applies, the JSON line and column.
    Only a regular file is opened (a FIFO would block, ``/dev/zero`` never ends), and at most
    :data:`MAX_JSON_BYTES` of it; JSON nested too deeply to parse is refused, not a crash."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise error(f"{what} {p} does not exist") from None
    except OSError as e:
        raise error(f"cannot read {what} {p}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
            "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else \
            "not a regular file"
        raise error(f"{what} {p} is {kind}: expected a JSON file")
    if st.st_size > MAX_JSON_BYTES:
        raise error(f"{what} {p} has {st.st_size} bytes, more than the {MAX_JSON_BYTES} a JSON input may have")
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"cannot read {what} {p}: {getattr(e, 'strerror', None) or e}") from None
    if len(raw) > MAX_JSON_BYTES:
        raise error(f"{what} {p} is longer than the {MAX_JSON_BYTES} bytes a JSON input may have")
    if not text.strip():
        raise error(f"{what} {p} is empty (line 1, column 1): expected a JSON object")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} {p} is not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    except RecursionError:
        raise error(f"{what} {p} nests JSON arrays or objects too deeply to read") from None
    if not isinstance(value, dict):
        start = len(text) - len(text.lstrip())
        line = text.count("\n", 0, start) + 1
        col = start - (text.rfind("\n", 0, start) + 1) + 1
        raise error(f"{what} {p} holds {_JSON_KINDS.get(type(value), 'a JSON value')} at line {line}, column {col}: expected a JSON object")
    return value


def csr(n: int, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group ``values`` by ``keys`` (both length E) into CSR: (ptr, values, edge ids), stable within
    a key.  The adjacency layout of every graph here (OpGraph, LayerGraph, SchedGraph)."""
    order = np.argsort(keys, kind="stable")
    counts = np.bincount(keys, minlength=n)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, values[order].astype(np.int32), order.astype(np.int32)


def topological_order(n: int, src: np.ndarray, dst: np.ndarray, names: Sequence[str] | None = None) -> np.ndarray:
    """Kahn's algorithm; smallest id first among ready nodes so the result is deterministic.

    Raises :class:`GraphError` naming a node on a cycle if the graph is not a DAG.
    """
    import heapq

    indeg = np.bincount(dst, minlength=n).astype(np.int64).tolist()
    ptr, succ, _ = csr(n, src, dst)
    ptr_l, succ_l = ptr.tolist(), succ.tolist()
    heap = [v for v in range(n) if indeg[v] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        v = heapq.heappop(heap)
        order.append(v)
        for i in range(ptr_l[v], ptr_l[v + 1]):
            w = succ_l[i]
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, w)
    if len(order) != n:
        stuck = [v for v in range(n) if indeg[v] > 0]
        pptr, pred, _ = csr(n, dst, src)
        cycle = _find_cycle(stuck, pptr.tolist(), pred.tolist(), set(stuck))
        label = (lambda v: f"{v} ({names[v]})") if names is not None else str
        raise GraphError("graph has a cycle through nodes " + " -> ".join(label(v) for v in cycle))
    return np.asarray(order, dtype=np.int64)


def _find_cycle(stuck: list[int], ptr: list[int], pred: list[int], alive: set[int]) -> list[int]:
    """Walk predecessors inside the nodes Kahn could not remove until a node repeats, and
    return that cycle in edge order.  Every such node has a predecessor among them (its
    in-degree stayed above 0), whereas one downstream of a cycle may have no successor there."""
    v = stuck[0]
    seen: dict[int, int] = {}
    path: list[int] = []
    while v not in seen:
        seen[v] = len(path)
        path.append(v)
        v = next(pred[i] for i in range(ptr[v], ptr[v + 1]) if pred[i] in alive)
    return (path[seen[v]:] + [v])[::-1]


class EdgeListGraph:
    """Adjacency of a graph stored as edge lists ``src``/``dst`` over ``num_nodes`` nodes, as
    cached CSR (OpGraph, LayerGraph, and the schedulers' SchedGraph).  A subclass sets ``_succ`` and
    ``_pred`` to None when it is built."""

    src: np.ndarray
    dst: np.ndarray
    _succ: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    _pred: tuple[np.ndarray, np.ndarray, np.ndarray] | None

    num_nodes: int  # a field or a property of the subclass

    @property
    def num_edges(self) -> int:
        return len(self.src)

    def succ_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Successors as CSR ``(ptr, succ, edge_id)``: node v's children are ``succ[ptr[v]:ptr[v+1]]``."""
        if self._succ is None:
            self._succ = csr(self.num_nodes, self.src, self.dst)
        return self._succ

    def pred_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Predecessors as CSR ``(ptr, pred, edge_id)``."""
        if self._pred is None:
            self._pred = csr(self.num_nodes, self.dst, self.src)
        return self._pred

    def successors(self, v: int) -> np.ndarray:
        ptr, succ, _ = self.succ_csr()
        return succ[ptr[v]:ptr[v + 1]]

    def predecessors(self, v: int) -> np.ndarray:
        """Producers of v's inputs, in :meth:`pred_csr`'s order (port order in a LayerGraph, where
        a producer feeding two ports appears twice)."""
        ptr, pred, _ = self.pred_csr()
        return pred[ptr[v]:ptr[v + 1]]

    def in_edges(self, v: int) -> np.ndarray:
        """Edge ids into v, in :meth:`pred_csr`'s order (a LayerGraph's ``in_edges(v)[p]`` feeds port p)."""
        ptr, _, eid = self.pred_csr()
        return eid[ptr[v]:ptr[v + 1]]

    def out_edges(self, v: int) -> np.ndarray:
        ptr, _, eid = self.succ_csr()
        return eid[ptr[v]:ptr[v + 1]]


@dataclass(eq=False)
class OpGraph(EdgeListGraph):
    """Joint forward + backward (+ update) operator graph of one training step.

    Per node ``i``: ``names[i]``, ``targets[i]`` (aten op, e.g. ``aten.convolution.default``),
    ``phase[i]`` (index into :data:`PHASES`), ``layer[i]`` (index into ``layer_names``, the
    owning module path), ``flops[i]``, ``out_bytes[i]`` (bytes of all its outputs),
    ``work_bytes[i]`` (bytes read plus bytes written: the roofline's memory traffic and the
    memory the op needs resident while it runs), ``free[i]`` (views, getitem, detach:
    no kernel, no time), ``batch_role[i]`` (see :data:`BATCH_ROLES`), ``coloc[i]``
    (co-location group id or -1).  Parameters are not nodes: ``param_bytes`` holds one
    entry per parameter and the CSR ``param_ptr``/``param_idx`` lists the parameters each
    node reads directly; ``grad_node[p]`` / ``update_node[p]`` are the nodes that produce
    parameter p's gradient and its updated value (-1 if none).
    """

    names: list[str]
    targets: list[str]
    phase: np.ndarray
    layer: np.ndarray
    layer_names: list[str]
    flops: np.ndarray
    out_bytes: np.ndarray
    work_bytes: np.ndarray
    free: np.ndarray
    batch_role: np.ndarray
    coloc: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    param_names: list[str] = field(default_factory=list)
    param_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    param_ptr: np.ndarray | None = None
    param_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    grad_node: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    update_node: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    out_shapes: list[list[list[int]]] | None = None
    out_dtypes: list[list[str]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: the GPU kernels each node launches (:mod:`harness.core.kernels`); None for graphs that do not
    #: know them (synthetic graphs, files saved before kernels were recorded)
    kernels: KernelTable | None = None
    #: measured seconds per node by device kind (or ``"*"``): float arrays, NaN where a node has
    #: none; None for a graph without measurements (see the module docstring)
    node_time_s: dict[str, np.ndarray] | None = None
    #: the traced torch.fx GraphModule and node-name map, when captured in this process
    #: (not serialised; the real-run backend and the profiler need it).
    fx: Any = None

    def __post_init__(self) -> None:
        n = len(self.names)
        self.phase = np.asarray(self.phase, dtype=np.int8)
        self.layer = np.asarray(self.layer, dtype=np.int32)
        self.flops = np.asarray(self.flops, dtype=np.float64)
        self.out_bytes = np.asarray(self.out_bytes, dtype=np.int64)
        self.work_bytes = np.asarray(self.work_bytes, dtype=np.int64)
        self.free = np.asarray(self.free, dtype=bool)
        self.batch_role = np.asarray(self.batch_role, dtype=np.int8)
        self.coloc = np.asarray(self.coloc, dtype=np.int32)
        self.src = np.asarray(self.src, dtype=np.int32)
        self.dst = np.asarray(self.dst, dtype=np.int32)
        self.nbytes = np.asarray(self.nbytes, dtype=np.int64)
        self.param_bytes = np.asarray(self.param_bytes, dtype=np.int64)
        self.param_idx = np.asarray(self.param_idx, dtype=np.int32)
        if self.param_ptr is None:
            self.param_ptr = np.zeros(n + 1, dtype=np.int64)
        self.param_ptr = np.asarray(self.param_ptr, dtype=np.int64)
        self.grad_node = np.asarray(self.grad_node, dtype=np.int32)
        self.update_node = np.asarray(self.update_node, dtype=np.int32)
        for name in ("targets", "phase", "layer", "flops", "out_bytes", "work_bytes", "free", "batch_role", "coloc"):
            if len(getattr(self, name)) != n:
                raise GraphError(f"OpGraph.{name} has length {len(getattr(self, name))}, expected {n} (one per node)")
        if not (len(self.src) == len(self.dst) == len(self.nbytes)):
            raise GraphError("OpGraph edge arrays src, dst, nbytes differ in length")
        if len(self.param_ptr) != n + 1:
            raise GraphError(f"OpGraph.param_ptr has length {len(self.param_ptr)}, expected {n + 1}")
        if len(self.src):
            bad = np.flatnonzero((self.src < 0) | (self.src >= n) | (self.dst < 0) | (self.dst >= n))
            if len(bad):
                e = int(bad[0])
                raise GraphError(f"edge {e} ({int(self.src[e])} -> {int(self.dst[e])}) names a node outside 0..{n - 1}")
            back = np.flatnonzero(self.src >= self.dst)
            if len(back):
                e = int(back[0])
                raise GraphError(
                    f"edge {e} {self.names[self.src[e]]} -> {self.names[self.dst[e]]} does not follow node order: "
                    "node ids must be a topological order (build the graph with OpGraph.from_unordered)"
                )
        if isinstance(self.kernels, dict):
            self.kernels = KernelTable.from_dict(self.kernels)
        if self.kernels is not None and not isinstance(self.kernels, KernelTable):
            raise GraphError(f"OpGraph.kernels must be a KernelTable, its mapping or None, got {type(self.kernels).__name__}")
        if self.kernels is not None:
            self.kernels.check(n)
        if self.node_time_s is not None:
            self.node_time_s = _measured_arrays(self.node_time_s, self.names)
        self._measured: dict[str, np.ndarray | None] = {}
        self._succ: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pred: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------ structure
    @property
    def num_nodes(self) -> int:
        return len(self.names)

    def params_of(self, v: int) -> np.ndarray:
        """Parameter ids node v reads directly."""
        return self.param_idx[self.param_ptr[v]:self.param_ptr[v + 1]]

    @property
    def node_param_bytes(self) -> np.ndarray:
        """Bytes of parameters each node reads directly (OpGraph's "parameter bytes" per node)."""
        out = np.zeros(self.num_nodes, dtype=np.int64)
        counts = np.diff(self.param_ptr)
        owners = np.repeat(np.arange(self.num_nodes), counts)
        np.add.at(out, owners, self.param_bytes[self.param_idx])
        return out

    def batch_scaled(self) -> np.ndarray:
        """Per node: does its work shrink when the batch is split among replicas?

        ``batched`` nodes do (they process a slice of the batch); a ``partial`` node does only
        when it reads a batched tensor (a weight gradient ``x^T dy``, a bias gradient, the loss
        reduce the batch away); a partial node that reads only partial or replicated tensors
        works on parameter-sized data (the accumulation of a shared weight's per-step gradients
        in an unrolled RNN) and does all of its work on every replica, like a ``replicated``
        node (an optimizer update).  The data-parallel shard rule of the simulator."""
        scaled = self.batch_role == BATCHED
        partial = self.batch_role == PARTIAL
        if partial.any() and self.num_edges:
            reads_batched = np.zeros(self.num_nodes, dtype=bool)
            reads_batched[self.dst[self.batch_role[self.src] == BATCHED]] = True
            scaled = scaled | (partial & reads_batched)
        return scaled

    def measured_times(self, kind: str) -> np.ndarray | None:
        """Per node, its measured seconds on a device of ``kind`` (the kind's entry of
        ``node_time_s``, else the ``"*"`` entry; NaN where neither has one), or None when no
        entry applies to this kind.  Cached per kind."""
        if self.node_time_s is None:
            return None
        cache = self.__dict__.setdefault("_measured", {})
        if kind not in cache:
            own, anyk = self.node_time_s.get(kind), self.node_time_s.get(ANY_DEVICE)
            if own is None and anyk is None:
                cache[kind] = None
            elif own is None or anyk is None:
                cache[kind] = own if own is not None else anyk
            else:
                cache[kind] = np.where(np.isnan(own), anyk, own)
        return cache[kind]

    def param_first_reader(self) -> np.ndarray:
        """The node that owns each parameter: its first reader in node order (-1 where no node
        reads it).  Memory accounting charges a parameter to it, and placements without an
        update node keep the parameter where it lives."""
        none = self.num_nodes
        first = np.full(len(self.param_bytes), none, dtype=np.int64)
        owners = np.repeat(np.arange(self.num_nodes), np.diff(self.param_ptr))
        np.minimum.at(first, np.asarray(self.param_idx, dtype=np.int64), owners)
        first[first == none] = -1
        return first

    def coloc_groups(self) -> list[np.ndarray]:
        """Members of each co-location group, in node order (group g is ``coloc == g``)."""
        ids = self.coloc
        if len(ids) == 0 or ids.max(initial=-1) < 0:
            return []
        order = np.argsort(ids, kind="stable")
        order = order[ids[order] >= 0]
        _, starts = np.unique(ids[order], return_index=True)
        return np.split(order, starts[1:])

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_unordered(cls, **fields: Any) -> "OpGraph":
        """Build a graph whose node ids may not be topological: renumber them topologically.

        Accepts the same keyword fields as the constructor; raises :class:`GraphError`
        naming a node on a cycle when there is one.  The returned graph has
        ``meta["renumbered_from"]`` = the old id of each new node when anything moved.
        """
        names = list(fields["names"])
        n = len(names)
        src = np.asarray(fields["src"], dtype=np.int64)
        dst = np.asarray(fields["dst"], dtype=np.int64)
        if len(src) and (src.min() < 0 or dst.min() < 0 or src.max() >= n or dst.max() >= n):
            raise GraphError(f"an edge names a node outside 0..{n - 1}")
        self_loops = np.flatnonzero(src == dst)
        if len(self_loops):
            v = int(src[self_loops[0]])
            raise GraphError(f"graph has a cycle through nodes {v} ({names[v]}) -> {v} ({names[v]})")
        order = topological_order(n, src, dst, names)
        if np.array_equal(order, np.arange(n)):  # in order: a permutation the fields carried is not this graph's
            meta = {k: v for k, v in (fields.get("meta") or {}).items() if k != "renumbered_from"}
            return cls(**{**fields, "meta": meta})
        new_id = np.empty(n, dtype=np.int64)
        new_id[order] = np.arange(n)
        out = dict(fields)
        for key in ("names", "targets", "out_shapes", "out_dtypes"):
            if out.get(key) is not None:
                out[key] = [fields[key][i] for i in order]
        for key in ("phase", "layer", "flops", "out_bytes", "work_bytes", "free", "batch_role", "coloc"):
            out[key] = np.asarray(fields[key])[order]
        out["src"], out["dst"] = new_id[src], new_id[dst]
        if fields.get("param_ptr") is not None:
            ptr = np.asarray(fields["param_ptr"])
            idx = np.asarray(fields["param_idx"])
            lists = [idx[ptr[i]:ptr[i + 1]] for i in order]
            counts = np.array([len(x) for x in lists], dtype=np.int64)
            out["param_ptr"] = np.concatenate([[0], np.cumsum(counts)])
            out["param_idx"] = np.concatenate(lists) if lists else np.zeros(0, np.int32)
        for key in ("grad_node", "update_node"):
            if fields.get(key) is not None:
                arr = np.asarray(fields[key], dtype=np.int64)
                out[key] = np.where(arr >= 0, new_id[np.maximum(arr, 0)], -1)
        if fields.get("kernels") is not None:
            kt = fields["kernels"]
            out["kernels"] = (KernelTable.from_dict(kt) if isinstance(kt, dict) else kt).remap(new_id)
        if fields.get("node_time_s") is not None:
            out["node_time_s"] = {k: np.asarray(_measured_arrays({k: v}, names)[k])[order]
                                  for k, v in fields["node_time_s"].items()}
        meta = dict(fields.get("meta") or {})
        meta["renumbered_from"] = order.tolist()
        out["meta"] = meta
        return cls(**out)

    def subgraph_sizes(self) -> dict[str, int]:
        """Node counts per phase (for summaries)."""
        counts = np.bincount(self.phase, minlength=len(PHASES))
        return {p: int(c) for p, c in zip(PHASES, counts)}

    # ------------------------------------------------------------------ export
    def to_networkx(self) -> "Any":
        """A ``networkx.DiGraph`` with node and edge attributes, for interop and plots."""
        import networkx as nx

        g = nx.DiGraph()
        for i in range(self.num_nodes):
            g.add_node(
                i,
                name=self.names[i],
                target=self.targets[i],
                phase=PHASES[self.phase[i]],
                layer=self.layer_names[self.layer[i]],
                flops=float(self.flops[i]),
                out_bytes=int(self.out_bytes[i]),
                work_bytes=int(self.work_bytes[i]),
                free=bool(self.free[i]),
                coloc=int(self.coloc[i]),
            )
        for s, d, b in zip(self.src.tolist(), self.dst.tolist(), self.nbytes.tolist()):
            g.add_edge(s, d, nbytes=b)
        return g

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (see :meth:`from_dict`)."""
        return {
            "format": GRAPH_FORMAT,
            "names": self.names,
            "targets": self.targets,
            "phase": self.phase.tolist(),
            "layer": self.layer.tolist(),
            "layer_names": self.layer_names,
            "flops": self.flops.tolist(),
            "out_bytes": self.out_bytes.tolist(),
            "work_bytes": self.work_bytes.tolist(),
            "free": self.free.astype(int).tolist(),
            "batch_role": self.batch_role.tolist(),
            "coloc": self.coloc.tolist(),
            "src": self.src.tolist(),
            "dst": self.dst.tolist(),
            "nbytes": self.nbytes.tolist(),
            "param_names": self.param_names,
            "param_bytes": self.param_bytes.tolist(),
            "param_ptr": self.param_ptr.tolist(),
            "param_idx": self.param_idx.tolist(),
            "grad_node": self.grad_node.tolist(),
            "update_node": self.update_node.tolist(),
            "out_shapes": self.out_shapes,
            "out_dtypes": self.out_dtypes,
            "meta": self.meta,
            **({"kernels": self.kernels.to_dict()} if self.kernels is not None else {}),
            **({"node_time_s": {k: [None if np.isnan(x) else x for x in v.tolist()] for k, v in self.node_time_s.items()}}
               if self.node_time_s is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OpGraph":
        """The graph of a :meth:`to_dict` mapping, checked (see the module docstring); node ids
        that are not a topological order are renumbered (:meth:`from_unordered`)."""
        fmt = d.get("format")
        if fmt not in GRAPH_FORMATS:
            raise GraphError(f"not an op graph file: format is {fmt!r}, expected {GRAPH_FORMAT!r} (or {GRAPH_FORMATS[0]!r})")
        kw = {k: v for k, v in d.items() if k != "format"}
        if "node_time_s" in kw and fmt != GRAPH_FORMAT:
            raise GraphError(f"field 'node_time_s' needs format {GRAPH_FORMAT!r}; this file says {fmt!r}")
        check_graph_fields(kw, dataclasses.fields(cls))
        src, dst = np.asarray(kw["src"]), np.asarray(kw["dst"])
        return cls.from_unordered(**kw) if (src >= dst).any() else cls(**kw)

    def save(self, path: str | Path) -> None:
        """Write the graph as JSON (``.json``) readable by :meth:`load` and ``model=from_file``."""
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> "OpGraph":
        """The graph saved at ``path`` by :meth:`save`; any mistake in the file is a
        :class:`GraphError` that names the file (see the module docstring)."""
        d = read_json_object(path, "graph file", GraphError)
        try:
            return cls.from_dict(d)
        except UserError as e:
            raise GraphError(f"graph file {path}: {e}") from None

    def summary(self) -> str:
        return (
            f"OpGraph({self.meta.get('model', '?')}: {self.num_nodes} nodes, {self.num_edges} edges, "
            f"{self.flops.sum() / 1e9:.2f} GFLOP, params {self.param_bytes.sum() / 2**20:.1f} MiB)"
        )

    def __repr__(self) -> str:
        return self.summary()


#: the longest measured time of one node a graph may give (a year; longer is no step a harness simulates)
MAX_NODE_SECONDS = 3.2e7


def _measured_arrays(given: Any, names: Sequence[str]) -> dict[str, np.ndarray]:
    """``node_time_s`` checked and converted: a mapping from a device kind (or ``"*"``) to one
    entry per node, each null (None, NaN: not measured) or finite seconds >= 0.  A mistake is a
    one-line GraphError naming the key and, for a bad time, the node."""
    n = len(names)
    if not isinstance(given, dict):
        raise GraphError("field 'node_time_s' must be a JSON object mapping a device kind (or '*') to a list of "
                         f"per-node seconds, got {type(given).__name__}")
    out: dict[str, np.ndarray] = {}
    for kind, times in given.items():
        key = f"node_time_s[{kind!r}]"
        if not isinstance(kind, str) or not kind:
            raise GraphError(f"{key}: a key of node_time_s must be a device kind (a cluster device's kind) or '*'")
        if isinstance(times, np.ndarray):
            times = times.tolist()
        if not isinstance(times, (list, tuple)):
            raise GraphError(f"{key} must be a list of {n} per-node seconds (null: not measured), got {type(times).__name__}")
        if len(times) != n:
            raise GraphError(f"{key} has {len(times)} entries, expected {n} (one per node)")
        arr = np.full(n, np.nan)
        for i, t in enumerate(times):
            if t is None:
                continue
            ok = isinstance(t, (int, float, np.integer, np.floating)) and not isinstance(t, bool)
            # a Python int may be beyond float64 (10**400): compared as it is, never converted first
            if not ok or (isinstance(t, int) and not 0 <= t <= MAX_NODE_SECONDS) or not np.isfinite(t) or not 0 <= t <= MAX_NODE_SECONDS:
                if ok and not isinstance(t, int) and np.isnan(t) and isinstance(given.get(kind), np.ndarray):
                    continue  # an in-memory array marks "not measured" with NaN
                shown = show_number(t) if ok else repr(t)
                raise GraphError(f"node {i} ({names[i]}) has {key} = {shown}; a measured time must be a finite number "
                                 f"in 0..{MAX_NODE_SECONDS:g} (seconds) or null")
            arr[i] = float(t)
        out[kind] = arr
    return out


def edges_from_pairs(pairs: Iterable[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge (src, dst, bytes) triples into unique edges, summing bytes of duplicates."""
    acc: dict[tuple[int, int], int] = {}
    for s, d, b in pairs:
        acc[(s, d)] = acc.get((s, d), 0) + b
    if not acc:
        z = np.zeros(0, dtype=np.int64)
        return z, z.copy(), z.copy()
    keys = sorted(acc)
    src = np.fromiter((k[0] for k in keys), dtype=np.int64, count=len(keys))
    dst = np.fromiter((k[1] for k in keys), dtype=np.int64, count=len(keys))
    nb = np.fromiter((acc[k] for k in keys), dtype=np.int64, count=len(keys))
    return src, dst, nb
