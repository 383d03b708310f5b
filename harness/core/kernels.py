"""The kernels an operator graph runs: the shapes a shape-aware cost model needs.

:class:`KernelTable` has one row per GPU kernel a node launches (a node may launch several: a
``convolution_backward`` computes the gradient w.r.t. the input and the weight; a coarsened
node holds its members' kernels).  Free nodes (views) launch none.  A row is

* ``kind``: :data:`GEMM` (``dims`` = batch, m, n, k: ``batch`` products of (m x k)(k x n)),
  :data:`CONV_FWD`, :data:`CONV_BWD_DATA`, :data:`CONV_BWD_FILTER` (``dims`` = the forward
  convolution's geometry :data:`CONV_COLS`, the same for its three passes), :data:`MEM`
  (a memory-bound kernel; ``dims[0]`` = bytes it reads and writes), or :data:`ATTN` (a fused
  attention kernel, FlashAttention's: ``dims`` = :data:`ATTN_COLS`);
* ``bdim``: the column of ``dims`` that grows with the batch (-1: none), so that a shard
  doing a fraction of the batch runs the same kernel on a smaller problem;
* ``math``: :data:`harness.core.precision.MATH` (the inputs' dtype and the allowed math mode);
* ``rnn``: the kernel belongs to a recurrent cell (a GEMM of an LSTM/GRU/RNN step).

FLOPs and bytes follow from the dims (:meth:`KernelTable.flops`, :meth:`KernelTable.nbytes`):
a GEMM does ``2*batch*m*n*k`` FLOPs, a convolution pass ``2*N*K*P*Q*(C/groups)*R*S`` (the
direct-convolution count ``torch.utils.flop_counter`` uses).  An attention kernel's forward
does ``4*bh*s_q*s_kv*d`` (QK^T and PV, two FLOPs per multiply-add), half of it when causal
(the masked blocks are skipped), and its backward 2.5 times the forward (five matmuls to the
forward's two: FlashAttention-2, Dao 2023, Sec. 4's count); it reads Q, K, V and writes O
(and the softmax statistics) once forward, and reads Q, K, V, O, dO and writes dQ, dK, dV once
backward - the attention matrix never reaches memory.  A captured graph never has attention
rows: :mod:`harness.core.llm.work` writes them for a transformer block.

Memory-bound kernels that read their input in several passes are charged those passes
(:data:`EXTRA_READS`): batch norm computes its statistics in one pass over the input and
normalises it in another, its backward reduces ``dy`` and ``x`` before it writes ``dx``,
softmax and layer norm reduce a row before they write it.  A graph rewrite (coarsening,
splitting an operator) carries the table along (:meth:`contract`, :meth:`split_rows`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from harness.core.errors import UserError

KINDS: tuple[str, ...] = ("gemm", "conv_fwd", "conv_bwd_data", "conv_bwd_filter", "mem", "attn")
GEMM, CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER, MEM, ATTN = range(len(KINDS))
CONV_KINDS = (CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER)

GEMM_COLS: tuple[str, ...] = ("batch", "m", "n", "k")
CONV_COLS: tuple[str, ...] = ("N", "C", "H", "W", "K", "R", "S", "stride_h", "stride_w", "pad_h", "pad_w",
                              "dil_h", "dil_w", "groups")
#: an attention row: batch x local query heads, query and key lengths, head size, causal (0/1),
#: phase (0 forward, 1 backward), query heads per key/value head (grouped-query attention; 0 as 1),
#: the kernel (:data:`ATTN_IMPLS`: 0 FlashAttention-2)
ATTN_COLS: tuple[str, ...] = ("bh", "s_q", "s_kv", "head_dim", "causal", "phase", "group", "impl")
#: the fused attention kernels an ``ATTN`` row may name (its ``impl`` column): FlashAttention-2,
#: and llm-foundry's Triton FlashAttention (``attn_impl: triton``, MosaicML's MPT runs)
ATTN_IMPLS: tuple[str, ...] = ("flash", "flash_triton")
NCOLS = len(CONV_COLS)
#: the FLOPs of an attention backward over its forward (FlashAttention-2: 5 matmuls against 2)
ATTN_BWD_FACTOR = 2.5
#: bytes per element of a kernel's inputs by math mode (:data:`harness.core.precision.MATH`:
#: fp32, tf32, fp16, bf16, fp64, int, fp8)
MATH_BYTES: tuple[int, ...] = (4, 4, 2, 2, 8, 4, 1)
#: the fewest bytes per element a GEMM writes: an FP8 GEMM reads FP8 and writes its output in
#: BF16 (Transformer Engine, torch._scaled_mm as torchao calls it), never in FP8
MIN_OUT_BYTES = 2

#: memory-bound ops that read their first ``k`` tensor inputs once more than a single pass does
EXTRA_READS: dict[str, int] = {
    "aten.native_batch_norm.default": 1, "aten._native_batch_norm_legit.default": 1,
    "aten._native_batch_norm_legit_functional.default": 1, "aten.native_batch_norm_backward.default": 2,
    "aten._softmax.default": 1, "aten._log_softmax.default": 1, "aten._softmax_backward_data.default": 2,
    "aten._log_softmax_backward_data.default": 2, "aten.native_layer_norm.default": 1,
    "aten.native_layer_norm_backward.default": 2, "aten.native_group_norm.default": 1,
    "aten.native_group_norm_backward.default": 2,
}
#: module classes whose GEMMs are recurrent-cell kernels
RNN_MODULE = re.compile(r"^(LSTM|GRU|RNN)(Cell)?$|(LSTM|GRU|RNN)Cell$")

GEMM_TARGETS = {"aten.mm.default": "mm", "aten.addmm.default": "addmm", "aten.bmm.default": "bmm",
                "aten.baddbmm.default": "baddbmm"}


class KernelError(UserError, ValueError):
    """A kernel table that does not fit its graph."""


@dataclass(eq=False)
class KernelTable:
    """Kernel rows, sorted by ``node`` (see the module docstring)."""

    node: np.ndarray
    kind: np.ndarray
    dims: np.ndarray
    bdim: np.ndarray
    math: np.ndarray
    rnn: np.ndarray
    _ptr: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.node = np.asarray(self.node, dtype=np.int32)
        self.kind = np.asarray(self.kind, dtype=np.int8)
        self.dims = np.asarray(self.dims, dtype=np.int64).reshape(len(self.node), NCOLS)
        self.bdim = np.asarray(self.bdim, dtype=np.int8)
        self.math = np.asarray(self.math, dtype=np.int8)
        self.rnn = np.asarray(self.rnn, dtype=bool)
        n = len(self.node)
        for name in ("kind", "bdim", "math", "rnn"):
            if len(getattr(self, name)) != n:
                raise KernelError(f"KernelTable.{name} has length {len(getattr(self, name))}, expected {n}")
        if n and np.any(np.diff(self.node) < 0):
            order = np.argsort(self.node, kind="stable")
            self.node, self.kind, self.dims = self.node[order], self.kind[order], self.dims[order]
            self.bdim, self.math, self.rnn = self.bdim[order], self.math[order], self.rnn[order]

    @classmethod
    def empty(cls) -> "KernelTable":
        z = np.zeros(0, np.int64)
        return cls(z, z, np.zeros((0, NCOLS), np.int64), z, z, np.zeros(0, bool))

    def __len__(self) -> int:
        return len(self.node)

    def ptr(self, num_nodes: int) -> np.ndarray:
        """CSR pointer: node v's rows are ``ptr[v]:ptr[v+1]``."""
        if self._ptr is None or len(self._ptr) != num_nodes + 1:
            self._ptr = np.searchsorted(self.node, np.arange(num_nodes + 1)).astype(np.int64)
        return self._ptr

    def check(self, num_nodes: int) -> None:
        """Raise :class:`KernelError` when a row names a node outside the graph."""
        if len(self) and (self.node.min() < 0 or self.node.max() >= num_nodes):
            raise KernelError(f"a kernel row names node {int(self.node.max())}, outside 0..{num_nodes - 1}")

    # ------------------------------------------------------------------ derived figures
    def conv_out(self, dims: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Output height and width (P, Q) of convolution rows (anything for other rows)."""
        d = self.dims if dims is None else dims
        p = (d[:, 2] + 2 * d[:, 9] - d[:, 11] * (d[:, 5] - 1) - 1) // np.maximum(d[:, 7], 1) + 1
        q = (d[:, 3] + 2 * d[:, 10] - d[:, 12] * (d[:, 6] - 1) - 1) // np.maximum(d[:, 8], 1) + 1
        return np.maximum(p, 1), np.maximum(q, 1)

    def flops(self, dims: np.ndarray | None = None) -> np.ndarray:
        """FLOPs per row (0 for memory-bound rows; attention rows as the module docstring says)."""
        d = (self.dims if dims is None else dims).astype(np.float64)
        p, q = self.conv_out(dims)
        gemm = 2.0 * d[:, 0] * d[:, 1] * d[:, 2] * d[:, 3]
        conv = 2.0 * d[:, 0] * d[:, 4] * p * q * (d[:, 1] / np.maximum(d[:, 13], 1)) * d[:, 5] * d[:, 6]
        attn = 4.0 * d[:, 0] * d[:, 1] * d[:, 2] * d[:, 3] * np.where(d[:, 4] > 0, 0.5, 1.0) \
            * np.where(d[:, 5] > 0, ATTN_BWD_FACTOR, 1.0)
        return np.where(self.kind == GEMM, gemm, np.where(np.isin(self.kind, CONV_KINDS), conv,
                                                          np.where(self.kind == ATTN, attn, 0.0)))

    def nbytes(self, dims: np.ndarray | None = None) -> np.ndarray:
        """Bytes each row reads and writes once: a memory-bound row its ``dims[0]``; a GEMM its
        three matrices, a convolution pass its input, filter and output, an attention row its
        Q, K, V, O (and dO, dQ, dK, dV backward) plus the FP32 softmax statistics, at the
        element size of the row's math mode (:data:`MATH_BYTES`; a GEMM's output at least
        :data:`MIN_OUT_BYTES`)."""
        d = (self.dims if dims is None else dims).astype(np.float64)
        el = np.asarray(MATH_BYTES, dtype=np.float64)[self.math.astype(np.int64)]
        p, q = self.conv_out(dims)
        out_el = np.maximum(el, MIN_OUT_BYTES) / el
        gemm = d[:, 0] * (d[:, 1] * d[:, 3] + d[:, 3] * d[:, 2] + d[:, 1] * d[:, 2] * out_el)
        conv = d[:, 0] * d[:, 1] * d[:, 2] * d[:, 3] + d[:, 4] * d[:, 1] / np.maximum(d[:, 13], 1) * d[:, 5] * d[:, 6] \
            + d[:, 0] * d[:, 4] * p * q
        q_o = d[:, 0] * d[:, 1] * d[:, 3]                          # Q (or O): bh x s_q x d
        k_v = d[:, 0] / np.maximum(d[:, 6], 1) * d[:, 2] * d[:, 3]  # K (or V): the key/value heads only
        passes = np.where(d[:, 5] > 0, 2.0, 1.0)                   # backward: the tensors and their gradients
        attn = passes * 2.0 * (q_o + k_v)
        stats = 4.0 * d[:, 0] * d[:, 1]                            # the log-sum-exp per query row, FP32
        out = np.where(self.kind == GEMM, gemm, np.where(np.isin(self.kind, CONV_KINDS), conv, attn)) * el
        return np.where(self.kind == MEM, d[:, 0], np.where(self.kind == ATTN, out + stats, out))

    def with_fraction(self, fraction: float | np.ndarray) -> np.ndarray:
        """``dims`` with each row's batch column scaled by ``fraction`` (rounded up, at least 1; a
        memory row's bytes exactly): the kernel a shard doing that fraction of the batch runs."""
        d = self.dims.astype(np.float64).copy()
        rows = np.flatnonzero(self.bdim >= 0)
        if len(rows):
            f = np.broadcast_to(np.asarray(fraction, dtype=np.float64), (len(self),))[rows]
            cols = self.bdim[rows].astype(np.int64)
            scaled = d[rows, cols] * f
            is_mem = self.kind[rows] == MEM
            # the largest shard of an uneven split (10 samples in 4: 3) bounds the step
            d[rows, cols] = np.where(is_mem, scaled, np.maximum(np.ceil(scaled - 1e-9), 1.0))
        return d

    # ------------------------------------------------------------------ rewrites
    def take(self, rows: np.ndarray, node: np.ndarray) -> "KernelTable":
        """The rows ``rows`` re-assigned to ``node`` (one new node id per row)."""
        rows = np.asarray(rows, dtype=np.int64)
        return KernelTable(node, self.kind[rows], self.dims[rows], self.bdim[rows], self.math[rows], self.rnn[rows])

    def remap(self, new_id: np.ndarray) -> "KernelTable":
        """Rows of node v move to node ``new_id[v]`` (a renumbering or a contraction: several old
        nodes onto one new node, whose kernels are then all of theirs)."""
        return self.take(np.arange(len(self)), np.asarray(new_id)[self.node])

    def split_rows(self, rows: np.ndarray, node: np.ndarray, col: np.ndarray, share: np.ndarray) -> "KernelTable":
        """Copies of ``rows`` on ``node`` with column ``col`` scaled by ``share`` (an operator split
        into sub-operators, each doing a share of one dimension; ``col`` -1 keeps the row whole)."""
        out = self.take(rows, node)
        sel = np.flatnonzero(np.asarray(col) >= 0)
        if len(sel):
            c = np.asarray(col)[sel].astype(np.int64)
            v = out.dims[sel, c].astype(np.float64) * np.asarray(share, dtype=np.float64)[sel]
            out.dims[sel, c] = np.where(out.kind[sel] == MEM, np.round(v), np.maximum(np.round(v), 1)).astype(np.int64)
        return out

    @staticmethod
    def concat(parts: Sequence["KernelTable"]) -> "KernelTable":
        parts = [p for p in parts if len(p)]
        if not parts:
            return KernelTable.empty()
        return KernelTable(
            np.concatenate([p.node for p in parts]), np.concatenate([p.kind for p in parts]),
            np.concatenate([p.dims for p in parts]), np.concatenate([p.bdim for p in parts]),
            np.concatenate([p.math for p in parts]), np.concatenate([p.rnn for p in parts]),
        )

    def node_math(self, num_nodes: int, default: int = 0) -> np.ndarray:
        """Per node, the math mode of its most FLOP-heavy kernel (``default`` without kernels)."""
        out = np.full(num_nodes, default, dtype=np.int8)
        if len(self):
            order = np.lexsort((self.flops(), self.node))  # by node, then FLOPs ascending
            out[self.node[order]] = self.math[order]       # the last write per node wins
        return out

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node.tolist(), "kind": self.kind.tolist(), "dims": self.dims.tolist(),
                "bdim": self.bdim.tolist(), "math": self.math.tolist(), "rnn": self.rnn.astype(int).tolist()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelTable":
        try:
            return cls(d["node"], d["kind"], np.asarray(d["dims"], dtype=np.int64).reshape(-1, NCOLS), d["bdim"],
                       d["math"], d["rnn"])
        except (KeyError, ValueError, TypeError) as e:
            raise KernelError(f"malformed kernel table: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------------------- capture
@dataclass
class KernelSpec:
    """What capture reads off one fx node to describe its kernels."""

    kind: int
    dims: tuple[int, ...]
    inputs_dtype: str
    is_conv: bool


def _shape(t: Any) -> list[int]:
    return [int(s) for s in t.shape] if t is not None and hasattr(t, "shape") else []


def _pad(dims: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(x) for x in dims) + (0,) * (NCOLS - len(dims))


def _conv_geometry(x: Any, w: Any, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int) -> tuple[int, ...]:
    """(N, C, H, W, K, R, S, strides, pads, dilations, groups) of a 1-, 2- or 3-D convolution
    (1-D as H = 1; 3-D with depth folded into H, a reading for cost purposes)."""
    xs, ws = _shape(x), _shape(w)
    spatial = len(xs) - 2
    st = list(stride) + [1] * (2 - len(stride)) if spatial <= 2 else [stride[-2], stride[-1]]
    pd = list(padding) + [0] * (2 - len(padding)) if spatial <= 2 else [padding[-2], padding[-1]]
    dl = list(dilation) + [1] * (2 - len(dilation)) if spatial <= 2 else [dilation[-2], dilation[-1]]
    if spatial == 1:
        n, c, wid = xs
        k, _, s = ws
        return _pad((n, c, 1, wid, k, 1, s, 1, st[0], 0, pd[0], 1, dl[0], groups))
    if spatial == 2:
        n, c, h, wid = xs
        k, _, r, s = ws
        return _pad((n, c, h, wid, k, r, s, st[0], st[1], pd[0], pd[1], dl[0], dl[1], groups))
    n, c, dep, h, wid = xs
    k, _, rd, r, s = ws
    return _pad((n, c, dep * h, wid, k, rd * r, s, st[0], st[1], pd[0], pd[1], dl[0], dl[1], groups))


def gemm_dims(short: str, shapes: Sequence[Sequence[int]]) -> tuple[int, int, int, int] | None:
    """(batch, m, n, k) of an mm / addmm / bmm / baddbmm from its input shapes."""
    if short == "mm" and len(shapes) >= 2:
        (m, k), (_, n) = shapes[0][-2:], shapes[1][-2:]
        return 1, m, n, k
    if short == "addmm" and len(shapes) >= 3:
        (m, k), (_, n) = shapes[1][-2:], shapes[2][-2:]
        return 1, m, n, k
    if short == "bmm" and len(shapes) >= 2:
        b, m, k = shapes[0][-3:]
        return b, m, shapes[1][-1], k
    if short == "baddbmm" and len(shapes) >= 3:
        b, m, k = shapes[1][-3:]
        return b, m, shapes[2][-1], k
    return None


def node_kernels(target: str, args: Sequence[Any], flops: float, work_bytes: int, free: bool) -> list[KernelSpec]:
    """The kernels of one captured node from its target and its arguments' fake values (tensors
    in place of fx nodes); a FLOP-heavy op this does not know becomes a square GEMM of its FLOPs."""
    import torch

    if free:
        return []
    short = GEMM_TARGETS.get(target)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if short is not None:
        dims = gemm_dims(short, [_shape(t) for t in tensors])
        if dims is not None:
            return [KernelSpec(GEMM, _pad(dims), _float_dtype(tensors), False)]
    if target == "aten.convolution.default":
        x, w, _b, stride, padding, dilation, transposed, _op, groups = args[:9]
        if not transposed:
            return [KernelSpec(CONV_FWD, _conv_geometry(x, w, stride, padding, dilation, int(groups)), _float_dtype([x, w]), True)]
    if target == "aten.convolution_backward.default":
        dy, x, w, _bs, stride, padding, dilation, transposed, _op, groups, mask = args[:11]
        if not transposed:
            geo = _conv_geometry(x, w, stride, padding, dilation, int(groups))
            dt = _float_dtype([dy, x, w])
            out = [KernelSpec(k, geo, dt, True) for k, on in ((CONV_BWD_DATA, mask[0]), (CONV_BWD_FILTER, mask[1])) if on]
            if mask[2]:  # the bias gradient: a reduction of dy
                out.append(KernelSpec(MEM, _pad((_nbytes(dy) + int(_shape(w)[0]) * dy.element_size(),)), dt, False))
            return out
    if flops > 0:
        side = max(1, int(round((flops / 2.0) ** (1.0 / 3.0))))
        return [KernelSpec(GEMM, _pad((1, side, side, side)), _float_dtype(tensors), False)]
    extra = sum(_nbytes(t) for t in tensors[: EXTRA_READS.get(target, 0)])
    return [KernelSpec(MEM, _pad((int(work_bytes) + extra,)), _float_dtype(tensors), False)]


def _nbytes(t: Any) -> int:
    return int(t.numel()) * t.element_size()


def _float_dtype(tensors: Sequence[Any]) -> str:
    for t in tensors:
        if t is not None and hasattr(t, "is_floating_point") and t.is_floating_point():
            return str(t.dtype).replace("torch.", "")
    return ""


def batch_column(spec: KernelSpec, dims_b1: tuple[int, ...] | None, scaled: bool) -> int:
    """The dims column that grows with the batch: the one that differs in the trace at batch
    B+1 (``dims_b1``), else N of a convolution, m of a GEMM, the bytes of a memory kernel, for
    a node whose work scales with the batch (-1 otherwise)."""
    if not scaled:
        return -1
    if dims_b1 is not None:
        diff = [i for i, (a, b) in enumerate(zip(spec.dims, dims_b1)) if a != b]
        if diff:
            return diff[0]
    return {GEMM: 1, MEM: 0}.get(spec.kind, 0)


def is_rnn_layer(path: str, layer_types: Mapping[str, str]) -> bool:
    """Does module ``path`` sit inside a recurrent cell (its own class or an ancestor's)?"""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        cls = layer_types.get(".".join(parts[:i]), "")
        if cls and RNN_MODULE.search(cls):
            return True
    return False
