"""Fine-grained intra-operator splitting (FD-DPS Sec. 4.1, Fig. 2, Table 6).

A compute-heavy, parameter-light operator is split into two sub-operators that can run on
two devices:

* **batch split** (Fig. 2a, "intra-operator data parallelism"): each half processes half
  the samples with the whole kernel.  A consumer that is itself a kernel depending on the
  batch reads the two halves directly (each edge from a half carries half the bytes); a
  consumer that needs the whole tensor (a view, a replicated op, an op split along the
  channel) reads it from a **gather** node (``aten.cat``).  When the split op produces a
  partial result (a weight gradient: ``batch_role == partial``), the halves produce
  partial sums of full size and an **aggregate** node (``aten.add``) adds them.  Two
  consecutive batch-split ops are connected half to half.
* **channel split** (Fig. 2b, "intra-operator model parallelism"): each half computes half
  the output channels from the whole input and half the kernel; a gather concatenates
  them for every consumer.

Multi-output operators (``convolution_backward`` returns grad_input, grad_weight,
grad_bias through ``getitem`` nodes) are split as a whole; each ``getitem`` child is
duplicated (one per half) and treated by its own batch role: the batched grad_input like a
batched output, the partial grad_weight / grad_bias with an aggregate.

Bookkeeping: sub-ops get half the FLOPs, half the work bytes and (for batched or channel
outputs) half the output bytes; both halves read the op's parameters; gather and aggregate
nodes have 0 FLOPs (they are costed by the bytes they move in the roofline) so the graph's
total FLOPs are unchanged.  A co-location group loses the halves and gains the node that
holds the whole tensor again (the aggregate of a weight gradient), so a parameter's
gradient still meets its update on one device; ``grad_node`` / ``update_node`` /
``meta["loss_node"]`` / ``meta["batch_axis"]`` follow.  ``origin[i]`` is the original node
of new node i (-1 for gathers and aggregates).

Which ops split (Table 6): the op classes in ``ops`` (conv forward, conv backward, matmul),
at least ``min_time_ms`` of compute on device 0 and at most ``max_param_MiB`` of parameters
(Fc6, 134 MB of weights, is not split; the conv layers, under 10 MB, are).  Table 6 draws
the time line between Conv1_1 (2.1 ms, not split) and Conv1_2 (15.7 ms, split) on the
paper's TensorFlow measurements; our analytical P100 times are shorter for most layers
(a ResNet-200 conv at batch 16 takes at most 1.6 ms), and a 2.5 ms line would split
nothing in ResNet-200 although Table 7 splits its Conv2D and Conv2Dbp, so the default line
is 1 ms (it splits convolutions in all six of the paper's models).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from algorithms.base import derived_meta
from harness.core.errors import OptionError
from harness.core.graph import BATCHED, PARTIAL, REPLICATED, OpGraph, edges_from_pairs
from harness.core.kernels import GEMM, MEM, NCOLS, KernelTable
from harness.core.precision import FP32

#: op targets FD-DPS splits (Table 7: Conv2D, Conv2Dbp, MatMul)
DEFAULT_SPLIT_OPS: tuple[str, ...] = (
    "aten.convolution.default",
    "aten.convolution_backward.default",
    "aten.mm.default",
    "aten.addmm.default",
    "aten.bmm.default",
)
#: ops whose output channels can be split (channel split needs the kernel's output dim)
CHANNEL_OPS: tuple[str, ...] = ("aten.convolution.default", "aten.mm.default", "aten.addmm.default")
SPLIT_DIMS = ("auto", "batch", "channel")


def op_names(value: Any, key: str) -> list[str]:
    """``value`` as a list of op names (``split_ops``: ``[aten.mm.default, ...]``), else an
    :class:`~harness.core.errors.OptionError` naming ``key``."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(x, str) and x for x in value):
        raise OptionError(f"{key} must be a list of op names such as [aten.mm.default], got {value!r}")
    return list(value)


@dataclass(frozen=True)
class SplitRule:
    """Which operators split and along which dimension (thresholds from conf/algo)."""

    ops: tuple[str, ...] = DEFAULT_SPLIT_OPS
    min_time_ms: float = 1.0
    max_param_MiB: float = 32.0
    dim: str = "auto"  # auto: batch where possible, else channel; batch; channel

    def __post_init__(self) -> None:
        if self.dim not in SPLIT_DIMS:
            raise ValueError(f"split dim must be one of {SPLIT_DIMS}, got {self.dim!r}")


@dataclass(eq=False)
class SplitResult:
    graph: OpGraph
    origin: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)


def param_bytes_read(graph: OpGraph) -> np.ndarray:
    """Parameter bytes each node reads: parameters read directly plus the bytes it reads from
    parameter views (producers that do not depend on the data: ``replicated`` nodes)."""
    out = graph.node_param_bytes.astype(np.float64)
    if graph.num_edges:
        rep = graph.batch_role[graph.src] == REPLICATED
        np.add.at(out, graph.dst[rep], graph.nbytes[rep])
    return out


def _batch_axis(graph: OpGraph) -> list[int]:
    ax = graph.meta.get("batch_axis")
    if ax is not None and len(ax) == graph.num_nodes:
        return [int(a) for a in ax]
    return [0 if r == BATCHED else -1 for r in graph.batch_role.tolist()]


def _first_shape(graph: OpGraph, v: int) -> list[int] | None:
    if graph.out_shapes is None or not graph.out_shapes[v]:
        return None
    return list(graph.out_shapes[v][0])


def _channel_axis(graph: OpGraph, v: int, batch_axis: int) -> int:
    shape = _first_shape(graph, v)
    if shape is None or graph.targets[v] not in CHANNEL_OPS:
        return -1
    if graph.targets[v] == "aten.convolution.default":
        ax = 1 if batch_axis == 0 else 0
        return ax if len(shape) >= 3 and shape[ax] >= 2 else -1
    ax = len(shape) - 1
    return ax if len(shape) >= 1 and shape[ax] >= 2 else -1


def split_dim_of(graph: OpGraph, v: int, dim: str = "auto", axes: Sequence[int] | None = None,
                 scaled: Sequence[bool] | None = None) -> str | None:
    """How node v can be split under ``dim``: ``"batch"``, ``"channel"`` or None.

    A ``partial`` op splits along the batch only when its work shrinks with the batch
    (:meth:`~harness.core.graph.OpGraph.batch_scaled`: it reads a batched tensor); ``scaled`` is
    that array when the caller has it (worked out here, for a partial node, otherwise)."""
    axes = _batch_axis(graph) if axes is None else axes
    role = int(graph.batch_role[v])
    batch_ok = False
    if int(graph.meta.get("batch_size", 2)) >= 2 and not graph.free[v]:
        if role == BATCHED:
            shape = _first_shape(graph, v)
            ax = axes[v]
            batch_ok = ax >= 0 and (shape is None or (ax < len(shape) and shape[ax] >= 2))
        elif role == PARTIAL:
            batch_ok = bool((graph.batch_scaled() if scaled is None else scaled)[v])
    channel_ok = role == BATCHED and not graph.free[v] and _channel_axis(graph, v, axes[v]) >= 0
    if dim in ("auto", "batch") and batch_ok:
        return "batch"
    if dim in ("auto", "channel") and channel_ok:
        return "channel"
    return None


def choose_splits(graph: OpGraph, times: np.ndarray, rule: SplitRule) -> dict[int, str]:
    """The operators to split (Table 6's decision) and the dimension of each."""
    axes = _batch_axis(graph)
    scaled = graph.batch_scaled()
    pbytes = param_bytes_read(graph)
    min_t = rule.min_time_ms * 1e-3
    max_p = rule.max_param_MiB * 2**20
    ops = set(rule.ops)
    out: dict[int, str] = {}
    for v in np.flatnonzero((times >= min_t) & (pbytes <= max_p)).tolist():
        if graph.targets[v] not in ops:
            continue
        d = split_dim_of(graph, v, rule.dim, axes, scaled)
        if d is not None:
            out[v] = d
    return out


def _halve_shapes(shapes: list[list[int]] | None, axis: int) -> tuple[list[list[int]], list[list[int]]] | None:
    if shapes is None:
        return None
    if not shapes or axis < 0 or axis >= len(shapes[0]):
        return [list(s) for s in shapes], [list(s) for s in shapes]
    a = [list(s) for s in shapes]
    b = [list(s) for s in shapes]
    size = shapes[0][axis]
    a[0][axis] = size // 2
    b[0][axis] = size - size // 2
    return a, b


def _split_kernels(graph: OpGraph, b: "_Builder", rewritten: set[int]) -> KernelTable:
    """The kernels of the split graph: an unsplit node keeps its kernels, each half of a split
    op runs them on half of the split dimension (the batch column of a batch split; a GEMM's n
    or a convolution's output channels K for a channel split; half the bytes of a
    memory-bound kernel), a gather or an aggregate is one memory-bound kernel of its bytes,
    and the other halves (views of a split op's outputs) run none."""
    kt = graph.kernels
    assert kt is not None
    ptr = kt.ptr(graph.num_nodes)
    parts: list[KernelTable] = []
    for new, (v, split) in enumerate(zip(b.origin, b.split)):
        if v < 0:
            parts.append(KernelTable([new], [MEM], [[b.work_b[new]] + [0] * (NCOLS - 1)], [-1], [FP32], [False]))
            continue
        rows = np.arange(ptr[v], ptr[v + 1])
        if split is None:
            if v not in rewritten and len(rows):
                parts.append(kt.take(rows, np.full(len(rows), new)))
            continue
        kinds = kt.kind[rows]
        if split == "batch":
            col = np.where(kt.bdim[rows] >= 0, kt.bdim[rows], np.where(kinds == GEMM, 1, 0))
        else:
            col = np.where(kinds == GEMM, 2, np.where(kinds == MEM, 0, 4))
        parts.append(kt.split_rows(rows, np.full(len(rows), new), col, np.full(len(rows), 0.5)))
    return KernelTable.concat(parts)


class _Builder:
    """Accumulates the nodes of the rewritten graph, copying attributes from their origin."""

    def __init__(self, graph: OpGraph) -> None:
        self.g = graph
        self.origin: list[int] = []
        self.names: list[str] = []
        self.targets: list[str] = []
        self.phase: list[int] = []
        self.layer: list[int] = []
        self.flops: list[float] = []
        self.out_b: list[int] = []
        self.work_b: list[int] = []
        self.free: list[bool] = []
        self.role: list[int] = []
        self.coloc: list[int] = []
        self.shapes: list[Any] = []
        self.dtypes: list[Any] = []
        self.axis: list[int] = []
        self.params: list[list[int]] = []
        self.split: list[str | None] = []  # "batch" / "channel" for a half of a split op

    def add(self, origin: int, like: int, name: str, target: str, flops: float, out_b: int, work_b: int, free: bool,
            role: int, coloc: int, shapes: Any, axis: int, params: list[int], split: str | None = None) -> int:
        g = self.g
        self.split.append(split)
        self.origin.append(origin)
        self.names.append(name)
        self.targets.append(target)
        self.phase.append(int(g.phase[like]))
        self.layer.append(int(g.layer[like]))
        self.flops.append(float(flops))
        self.out_b.append(int(out_b))
        self.work_b.append(int(work_b))
        self.free.append(bool(free))
        self.role.append(int(role))
        self.coloc.append(int(coloc))
        self.shapes.append(shapes)
        self.dtypes.append(g.out_dtypes[like] if g.out_dtypes is not None else None)
        self.axis.append(int(axis))
        self.params.append(params)
        return len(self.names) - 1


def _split_node_times(graph: OpGraph, b: _Builder, rewritten: set[int]) -> dict[str, list[float | None]] | None:
    """The measured times of the rewritten graph (``OpGraph.node_time_s``): a node the split
    leaves alone keeps its time, a half of a split op takes its share (of the op's FLOPs) of
    it, and what the split adds or re-derives (gather / aggregate nodes, the halves of a view
    that follows split halves) has none: its cost is the model's estimate."""
    if graph.node_time_s is None:
        return None
    out: dict[str, list[float | None]] = {}
    for kind, times in graph.node_time_s.items():
        t = np.asarray(times, dtype=np.float64)
        col: list[float | None] = []
        for i, (v, half) in enumerate(zip(b.origin, b.split)):
            share = 1.0 if half is None else (b.flops[i] / float(graph.flops[v]) if graph.flops[v] > 0 else 0.5)
            measured = (half is not None or v not in rewritten) and not np.isnan(t[v])
            col.append(float(t[v]) * share if measured else None)
        out[kind] = col
    return out


def split_graph(graph: OpGraph, decisions: Mapping[int, str]) -> SplitResult:
    """Split every node in ``decisions`` (node -> ``"batch"`` | ``"channel"``) in two.

    Returns the rewritten graph (node ids topological), ``origin`` and a summary for
    ``Plan.info``.  See the module docstring for the rules.
    """
    n = graph.num_nodes
    for v, d in decisions.items():
        if d not in ("batch", "channel"):
            raise ValueError(f"node {v} ({graph.names[v]}): split dim must be 'batch' or 'channel', got {d!r}")
        if graph.free[v]:
            raise ValueError(f"node {v} ({graph.names[v]}) is a view: it has no work to split")
    axes = _batch_axis(graph)
    role = graph.batch_role.tolist()
    free = graph.free.tolist()
    targets = graph.targets
    sptr, succ, _ = (x.tolist() for x in graph.succ_csr())

    # every split node (the ops and the getitem children of split multi-output ops) and its
    # kind: "halves" (batch split of a batched output: consumers may read the halves),
    # "gather" (channel split: the whole tensor is rebuilt), "aggregate" (partial sums)
    dim: dict[int, str] = {int(v): d for v, d in decisions.items()}
    kind: dict[int, str] = {}
    derived_of: dict[int, int] = {}
    split_axis: dict[int, int] = {}
    for v, d in sorted(dim.items()):
        if d == "channel":
            kind[v] = "gather"
            split_axis[v] = _channel_axis(graph, v, axes[v])
        else:
            kind[v] = "halves" if role[v] == BATCHED else "aggregate"
            split_axis[v] = axes[v]
        for i in range(sptr[v], sptr[v + 1]):
            x = succ[i]
            if targets[x] == "getitem" and x not in dim:
                derived_of[x] = v
                if d == "channel":
                    kind[x], split_axis[x] = "gather", split_axis[v]
                else:
                    kind[x] = "halves" if role[x] == BATCHED else "aggregate"
                    split_axis[x] = axes[x]

    def reads_halves(x: int) -> bool:
        """A consumer that can take a batch-split tensor as two halves."""
        return not free[x] and role[x] in (BATCHED, PARTIAL)

    referenced = set(graph.grad_node[graph.grad_node >= 0].tolist()) | set(graph.update_node[graph.update_node >= 0].tolist())
    loss = int(graph.meta.get("loss_node", -1))
    if loss >= 0:
        referenced.add(loss)
    needs_whole: set[int] = set()
    for s, k in kind.items():
        if s in referenced:
            needs_whole.add(s)
        for i in range(sptr[s], sptr[s + 1]):
            x = succ[i]
            if derived_of.get(x) == s:
                continue
            if k == "halves" and (dim.get(x) == "batch" or (x not in kind and reads_halves(x))):
                continue
            needs_whole.add(s)

    # ---- nodes in the original order: halves right after one another, then the whole node
    b = _Builder(graph)
    new_of: list[list[int]] = [[] for _ in range(n)]
    whole_of = [-1] * n
    pairs: list[tuple[int, int, int]] = []
    g_flops, g_out, g_work, g_coloc = graph.flops.tolist(), graph.out_bytes.tolist(), graph.work_bytes.tolist(), graph.coloc.tolist()
    n_gather = n_aggr = 0
    for v in range(n):
        shp = graph.out_shapes[v] if graph.out_shapes is not None else None
        if v not in kind:
            nid = b.add(v, v, graph.names[v], targets[v], g_flops[v], g_out[v], g_work[v], free[v], role[v], g_coloc[v], shp,
                        axes[v], graph.params_of(v).tolist())
            new_of[v] = [nid]
            whole_of[v] = nid
            continue
        k = kind[v]
        op = v in dim
        whole = v in needs_whole
        batched_out = k != "aggregate"
        out_h = [g_out[v] // 2, g_out[v] - g_out[v] // 2] if batched_out else [g_out[v], g_out[v]]
        hs = _halve_shapes(shp, split_axis[v] if batched_out else -1)
        # a split op leaves its co-location group: the group's tensor is the whole node's
        cl_half = -1 if (op or whole) else g_coloc[v]
        prm = graph.params_of(v).tolist() if op else []
        ids = [
            b.add(v, v, f"{graph.names[v]}.{h}", targets[v], g_flops[v] * 0.5 if op else 0.0, out_h[h],
                  (g_work[v] // 2 if h == 0 else g_work[v] - g_work[v] // 2) if op else 0, free[v], role[v], cl_half,
                  hs[h] if hs is not None else None, axes[v], prm, dim[v] if op else None)
            for h in range(2)
        ]
        new_of[v] = ids
        if whole:
            if k == "aggregate":
                wid = b.add(-1, v, f"{graph.names[v]}.aggregate", "aten.add.Tensor", 0.0, g_out[v], 3 * g_out[v], False, PARTIAL,
                            g_coloc[v], shp, -1, [])
                n_aggr += 1
            else:
                wid = b.add(-1, v, f"{graph.names[v]}.gather", "aten.cat.default", 0.0, g_out[v], 2 * g_out[v], False, role[v],
                            g_coloc[v], shp, axes[v], [])
                n_gather += 1
            whole_of[v] = wid
            pairs += [(ids[0], wid, out_h[0]), (ids[1], wid, out_h[1])]

    # ---- edges
    def halves_of(nbytes: int) -> tuple[int, int]:
        return nbytes // 2, nbytes - nbytes // 2

    for u, x, nb in zip(graph.src.tolist(), graph.dst.tolist(), graph.nbytes.tolist()):
        if derived_of.get(x) == u:  # getitem child of a split op: one per half
            hb = halves_of(nb) if kind[x] != "aggregate" else (nb, nb)
            pairs += [(new_of[u][0], new_of[x][0], hb[0]), (new_of[u][1], new_of[x][1], hb[1])]
        elif u in kind and kind[u] == "halves" and dim.get(x) == "batch":
            hb = halves_of(nb)  # batch-split producer and consumer: half to half
            pairs += [(new_of[u][0], new_of[x][0], hb[0]), (new_of[u][1], new_of[x][1], hb[1])]
        elif u in kind and kind[u] == "halves" and x not in kind and reads_halves(x):
            hb = halves_of(nb)
            pairs += [(new_of[u][0], whole_of[x], hb[0]), (new_of[u][1], whole_of[x], hb[1])]
        else:
            s = whole_of[u]
            if s < 0:
                raise AssertionError(f"split node {graph.names[u]} has no whole-tensor node but {graph.names[x]} needs one")
            if x in dim:  # a split consumer reads its share of an unsplit tensor
                if dim[x] == "batch":
                    share = halves_of(nb) if role[u] == BATCHED else (nb, nb)
                else:
                    share = (nb, nb) if role[u] == BATCHED else halves_of(nb)
                pairs += [(s, new_of[x][0], share[0]), (s, new_of[x][1], share[1])]
            else:
                pairs.append((s, whole_of[x], nb))
    src, dst, nbytes = edges_from_pairs(pairs)

    def remap(arr: np.ndarray) -> np.ndarray:
        return np.array([(whole_of[a] if whole_of[a] >= 0 else new_of[a][0]) if a >= 0 else -1 for a in arr.tolist()], dtype=np.int32)

    p_counts = [len(p) for p in b.params]
    meta = derived_meta(graph, batch_axis=b.axis)
    if loss >= 0:
        meta["loss_node"] = whole_of[loss] if whole_of[loss] >= 0 else new_of[loss][0]
    by_target: dict[str, int] = {}
    for v in dim:
        by_target[targets[v]] = by_target.get(targets[v], 0) + 1
    info = {
        "split_ops": len(dim),
        "split_by_target": dict(sorted(by_target.items())),
        "split_by_dim": {d: sum(1 for x in dim.values() if x == d) for d in ("batch", "channel")},
        "gather_nodes": n_gather,
        "aggregate_nodes": n_aggr,
        "split_names": [graph.names[v] for v in sorted(dim)][:200],
    }
    meta["split"] = {k: v for k, v in info.items() if k != "split_names"}
    new = OpGraph.from_unordered(
        node_time_s=_split_node_times(graph, b, set(kind)),
        names=b.names, targets=b.targets, phase=b.phase, layer=b.layer, layer_names=list(graph.layer_names), flops=b.flops,
        out_bytes=b.out_b, work_bytes=b.work_b, free=b.free, batch_role=b.role, coloc=b.coloc, src=src, dst=dst, nbytes=nbytes,
        param_names=list(graph.param_names), param_bytes=graph.param_bytes.copy(),
        param_ptr=np.concatenate([[0], np.cumsum(p_counts)]).astype(np.int64),
        param_idx=np.asarray([p for ps in b.params for p in ps], dtype=np.int32), grad_node=remap(graph.grad_node),
        update_node=remap(graph.update_node), out_shapes=b.shapes if graph.out_shapes is not None else None,
        out_dtypes=b.dtypes if graph.out_dtypes is not None else None, meta=meta,
        kernels=_split_kernels(graph, b, set(kind)) if graph.kernels is not None else None,
    )
    origin = np.asarray(b.origin, dtype=np.int64)
    if "renumbered_from" in new.meta:  # never expected: the construction is topological
        origin = origin[np.asarray(new.meta["renumbered_from"])]
    return SplitResult(new, origin, info)


def split_for_fddps(graph: OpGraph, times: np.ndarray, rule: SplitRule) -> SplitResult:
    """Table 6's decision (:func:`choose_splits`) followed by the rewrite (:func:`split_graph`)."""
    return split_graph(graph, choose_splits(graph, times, rule))
