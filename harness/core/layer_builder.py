"""Write a layer graph in a few lines per layer: :class:`LayerGraphBuilder`.

The layer graph (:class:`harness.core.layergraph.LayerGraph`) is what OptCNN and PaSE search. A
traced PyTorch model gives one (:mod:`harness.core.layerfx`); this builder gives one from code,
the way PaSE's public code writes its graphs (``graph.py``: one call per operator), without
filling the IR's arrays by hand::

    b = LayerGraphBuilder("alexnet", batch_size=128)
    x = b.input("image", (128, 3, 227, 227))
    x = b.conv2d(x, 96, kernel=11, stride=4, pw=1)
    x = b.pool2d(x, 3, stride=2)
    x = b.reshape(x, (128, -1))
    x = b.linear(x, 4096, pw=1)
    b.softmax_cross_entropy(x)
    lg = b.build()

Each call adds one node (``reshape`` adds two, PaSE's Ravel and Unravel) and the edges from its
operands, and returns a :class:`Tensor` handle of its output. What each call puts in the IR
(kinds, iteration dims, axis maps, FLOPs; see :mod:`harness.core.layergraph` for the conventions):

* ``conv2d``: dims ``sample, channel, height, width, in_channel, kernel_h, kernel_w``; the
  input's halo as windows; PaSE's GEMM ``(b h w, channel, in_channel r s)``;
* ``linear``: the input's leading axes each their own dim (``sample``, then ``length``, then
  ``a2``...), ``channel`` and ``in_channel``; ``attrs["gemm"]`` groups them into PaSE's (m, n, k);
* ``einsum``: one dim per index letter (the batch letter, ``b`` unless told, is ``sample``);
  batch, m, n and reduction indices grouped in ``attrs["gemm"]`` as PaSE's ``Einsum`` groups
  them; the second operand may be a weight, given by its shape;
* ``embedding``: PaSE's one-hot GEMM ``(tokens, channel, vocab)``, the vocabulary a dim of its own;
* ``lstm``: PaSE's LSTM (all layers and steps one node; dims ``layer, length, sample, channel,
  in_channel``);
* ``pool2d``, ``batchnorm``, ``layernorm`` (PaSE's Norm over one axis), ``softmax``,
  ``reduce_mean``, ``elementwise``, ``concat``, ``stack`` / ``unstack``, ``reshape``,
  ``softmax_cross_entropy`` (kind ``loss``, the class axis last).

``pw`` on a GEMM-like layer or an elementwise op is PaSE's ``pw_op_cnt``: the pointwise ops fused
into it (a ReLU after a conv), each costing 3 FLOPs per output element under ``costs=pase``.
Tensors are FP32 unless an input says otherwise (token ids are int64). A mistake (an operand of
the wrong rank, a size that does not match) is a :class:`LayerGraphError` naming the call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.core.layergraph import LAYERGRAPH_FORMAT, LayerGraph, LayerGraphError

_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4}


@dataclass(frozen=True)
class Tensor:
    """An output of a node under construction: which node and output port, its shape, and the
    dim of the producer that indexes each axis (``""`` where none does)."""

    node: int
    port: int
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    itemsize: int = 4

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass(frozen=True)
class Weight:
    """A weight operand of :meth:`LayerGraphBuilder.einsum` (PaSE's ``InputTensor`` of a weight): its shape only."""

    shape: tuple[int, ...]


def _conv_out(n: int, kernel: int, stride: int, pad: int) -> int:
    """Output extent of a convolution or pooling (PaSE's GetConvolutedSize)."""
    return (n - kernel + 2 * pad) // stride + 1


def _pair(x: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(x, (int, np.integer)):
        return int(x), int(x)
    a, b = x
    return int(a), int(b)


class LayerGraphBuilder:
    """Builds a :class:`LayerGraph` one layer per call (see the module docstring)."""

    def __init__(self, name: str, batch_size: int, dtype: str = "float32") -> None:
        self.name = name
        self.batch_size = int(batch_size)
        self.dtype = dtype
        self.itemsize = _BYTES[dtype]
        self._nodes: list[dict[str, Any]] = []
        self._edges: list[tuple[int, int, int, int, int]] = []
        self._names: set[str] = set()
        self._count: dict[str, int] = {}

    # ------------------------------------------------------------------ plumbing
    def _name(self, name: str | None, op: str) -> str:
        if name is None:
            k = self._count.get(op, 0)
            self._count[op] = k + 1
            name = f"{op}{k}"
        if name in self._names:
            raise LayerGraphError(f"{self.name}: node name {name!r} is used twice")
        self._names.add(name)
        return name

    def _window(self, kernel: int | Sequence[int], stride: int | Sequence[int], pad: int | Sequence[int],
                op: str) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """A window's kernel and stride (integers >= 1) and padding (>= 0), each a pair."""
        (r, s), (sr, ss), (pr, ps) = _pair(kernel), _pair(stride), _pair(pad)
        if min(r, s, sr, ss) < 1 or min(pr, ps) < 0:
            raise LayerGraphError(f"{self.name}: {op} needs a kernel and a stride >= 1 and a padding >= 0, got kernel {(r, s)}, "
                                  f"stride {(sr, ss)}, padding {(pr, ps)}")
        return (r, s), (sr, ss), (pr, ps)

    def _check(self, x: Any, rank: int | None, op: str) -> Tensor:
        if not isinstance(x, Tensor):
            raise LayerGraphError(f"{self.name}: {op} takes a Tensor from this builder, got {type(x).__name__}")
        if rank is not None and len(x.shape) != rank:
            raise LayerGraphError(f"{self.name}: {op} takes a rank-{rank} tensor, got shape {x.shape}")
        return x

    def _add(self, op: str, name: str | None, kind: str, dims: dict[str, int], parallel: Sequence[str],
             out_shape: Sequence[int], out_dims: Sequence[str], inputs: Sequence[tuple[Tensor, Sequence[str]]],
             flops_fwd: float = 0.0, flops_bwd: float = 0.0, param_bytes: int = 0, attrs: dict[str, Any] | None = None,
             outputs: list[dict[str, Any]] | None = None, itemsize: int | None = None) -> Tensor:
        v = len(self._nodes)
        node_name = self._name(name, op)
        itemsize = self.itemsize if itemsize is None else itemsize
        out_shape = tuple(int(s) for s in out_shape)
        bad = {k: int(x) for k, x in dims.items() if int(x) < 1}
        if bad or any(x < 0 for x in out_shape):
            raise LayerGraphError(f"{self.name}: {op} {node_name} has dims {dict(dims)} and output shape {out_shape}: a dim must be >= 1, "
                                  "an output size >= 0 (check the sizes its inputs and arguments give)")
        a = dict(attrs or {})
        a.setdefault("op", op)
        out_bytes = math.prod(out_shape) * itemsize
        if outputs:
            a["outputs"] = outputs
            out_bytes = sum(math.prod(o["shape"]) * itemsize for o in outputs)
        for p, (t, _) in enumerate(inputs):
            self._edges.append((t.node, v, t.nbytes, p, t.port))
        self._nodes.append(dict(
            name=node_name, kind=kind, dims={k: int(s) for k, s in dims.items()}, parallel=tuple(parallel),
            ff=float(flops_fwd), fb=float(flops_bwd), pbytes=int(param_bytes), out_shape=out_shape,
            out_bytes=int(out_bytes), out_dims=tuple(out_dims), in_dims=[tuple(ax) for _, ax in inputs], attrs=a,
        ))
        return Tensor(v, 0, out_shape, tuple(out_dims), itemsize)

    @staticmethod
    def _names_of(x: Tensor) -> tuple[str, ...]:
        """Dim names for a layer that iterates over x's axes: the producer's where they are
        distinct and non-empty, ``a<i>`` elsewhere."""
        out: list[str] = []
        for i, ax in enumerate(x.axes):
            out.append(ax if ax and ax not in out else f"a{i}")
        return tuple(out)

    # ------------------------------------------------------------------ layers
    def input(self, name: str, shape: Sequence[int], dtype: str | None = None, axes: Sequence[str] | None = None) -> Tensor:
        """A model input (kind ``input``: one configuration, costs nothing, moves nothing)."""
        shape = tuple(int(s) for s in shape)
        axes = tuple(axes) if axes else ("sample", *(f"a{i}" for i in range(1, len(shape))))
        if len(axes) != len(shape):
            raise LayerGraphError(f"{self.name}: input {name!r} has {len(shape)} axes but {len(axes)} axis names")
        dtype = dtype or self.dtype
        if dtype not in _BYTES:
            raise LayerGraphError(f"{self.name}: input {name!r}: dtype {dtype!r} is not one of {sorted(_BYTES)}")
        return self._add("input", name, "input", dict(zip(axes, shape)), axes, shape, axes, [],
                         attrs={"dtype": dtype}, itemsize=_BYTES[dtype])

    def conv2d(self, x: Tensor, out_channels: int, kernel: int | Sequence[int], stride: int | Sequence[int] = 1,
               pad: int | Sequence[int] = 0, pw: int = 0, name: str | None = None) -> Tensor:
        """A 2-D convolution (PaSE's Conv; no bias) with ``pw`` fused pointwise ops."""
        x = self._check(x, 4, "conv2d")
        b, c, h, w = x.shape
        (r, s), (sr, ss), (pr, ps) = self._window(kernel, stride, pad, "conv2d")
        ho, wo = _conv_out(h, r, sr, pr), _conv_out(w, s, ss, ps)
        if ho < 1 or wo < 1:
            raise LayerGraphError(f"{self.name}: conv2d on {x.shape} with kernel {(r, s)} gives no output")
        n = int(out_channels)
        dims = {"sample": b, "channel": n, "height": ho, "width": wo, "in_channel": c, "kernel_h": r, "kernel_w": s}
        out_dims = ("sample", "channel", "height", "width")
        flops = 2.0 * b * ho * wo * n * c * r * s
        attrs = {"kernel": [r, s], "stride": [sr, ss], "padding": [pr, ps], "dilation": [1, 1], "groups": 1, "bias": False,
                 "in_channels": c, "out_channels": n, "pw": int(pw),
                 "windows": [{"2": [sr, -pr, r], "3": [ss, -ps, s]}]}
        return self._add("conv", name, "conv2d", dims, out_dims, (b, n, ho, wo), out_dims,
                         [(x, ("sample", "in_channel", "height", "width"))], flops, 2 * flops,
                         n * c * r * s * self.itemsize, attrs)

    def pool2d(self, x: Tensor, kernel: int | Sequence[int], stride: int | Sequence[int] = 1,
               pad: int | Sequence[int] = 0, mode: str = "max", name: str | None = None) -> Tensor:
        """A 2-D max / average pooling (PaSE's Pooling)."""
        x = self._check(x, 4, "pool2d")
        b, c, h, w = x.shape
        (r, s), (sr, ss), (pr, ps) = self._window(kernel, stride, pad, "pool2d")
        ho, wo = _conv_out(h, r, sr, pr), _conv_out(w, s, ss, ps)
        if ho < 1 or wo < 1:
            raise LayerGraphError(f"{self.name}: pool2d on {x.shape} with kernel {(r, s)} gives no output")
        axes = ("sample", "channel", "height", "width")
        dims = {**dict(zip(axes, (b, c, ho, wo))), "kernel_h": r, "kernel_w": s}
        flops = float(b * c * ho * wo * r * s)
        attrs = {"mode": mode, "kernel": [r, s], "stride": [sr, ss], "padding": [pr, ps], "dilation": [1, 1],
                 "ceil_mode": False, "windows": [{"2": [sr, -pr, r], "3": [ss, -ps, s]}]}
        return self._add("pool", name, "pool2d", dims, axes, (b, c, ho, wo), axes, [(x, axes)], flops, flops, 0, attrs)

    def linear(self, x: Tensor, units: int, pw: int = 0, bias: bool = False, name: str | None = None) -> Tensor:
        """A fully connected layer on the last axis (PaSE's FC): each leading axis its own dim."""
        x = self._check(x, None, "linear")
        if len(x.shape) < 2:
            raise LayerGraphError(f"{self.name}: linear takes a tensor of rank >= 2, got shape {x.shape}")
        lead_names = ("sample", "length", *(f"a{i}" for i in range(2, len(x.shape) - 1)))[: len(x.shape) - 1]
        k, n = x.shape[-1], int(units)
        dims = {**dict(zip(lead_names, x.shape[:-1])), "channel": n, "in_channel": k}
        m = math.prod(x.shape[:-1])
        flops = 2.0 * m * n * k
        attrs = {"in_features": k, "out_features": n, "bias": bias, "pw": int(pw),
                 "gemm": {"batch": [], "m": list(lead_names), "n": ["channel"], "k": ["in_channel"]}}
        params = (n * k + (n if bias else 0)) * self.itemsize
        out_dims = (*lead_names, "channel")
        return self._add("fc", name, "linear", dims, out_dims, (*x.shape[:-1], n), out_dims,
                         [(x, (*lead_names, "in_channel"))], flops, 2 * flops, params, attrs)

    def einsum(self, equation: str, x: Tensor, y: Tensor | Weight | Sequence[int], pw: int = 0, batch: str = "b",
               name: str | None = None) -> Tensor:
        """A two-operand einsum (PaSE's Einsum): every index its own dim, grouped into PaSE's GEMM
        (batch: in both operands and the output; m: only the first and the output; n: only the
        second and the output; k: both operands, not the output). ``y`` may be a weight shape."""
        x = self._check(x, None, "einsum")
        weight = not isinstance(y, Tensor)
        y_shape = tuple(int(s) for s in (y.shape if isinstance(y, Weight) else y)) if weight else y.shape  # type: ignore[union-attr]
        try:
            ins, out = equation.replace(" ", "").split("->")
            ia, ib = ins.split(",")
        except ValueError:
            raise LayerGraphError(f"{self.name}: einsum {equation!r} is not of the form 'ab,bc->ac'") from None
        if len(ia) != len(x.shape) or len(ib) != len(y_shape):
            raise LayerGraphError(f"{self.name}: einsum {equation!r} on shapes {x.shape} and {y_shape}: ranks differ")
        size: dict[str, int] = {}
        for letters, shape in ((ia, x.shape), (ib, y_shape)):
            for c, s in zip(letters, shape):
                if size.setdefault(c, int(s)) != int(s):
                    raise LayerGraphError(f"{self.name}: einsum {equation!r}: index {c!r} is {size[c]} and {s}")
        sa, sb, so = set(ia), set(ib), set(out)
        if not so <= sa | sb or len(so) != len(out):
            raise LayerGraphError(f"{self.name}: einsum {equation!r}: output indices must be distinct operand indices")
        lone = sorted((sa ^ sb) - so)
        if lone:
            raise LayerGraphError(f"{self.name}: einsum {equation!r}: index {lone[0]!r} is in one operand only and not in the output")
        batch_i = [c for c in out if c in sa and c in sb]
        m_i = [c for c in out if c in sa and c not in sb]
        n_i = [c for c in out if c in sb and c not in sa]
        k_i = [c for c in ia if c in sb and c not in so]
        if not m_i or not n_i:
            raise LayerGraphError(f"{self.name}: einsum {equation!r} needs an index of each operand in the output (PaSE's m and n)")

        def dim(c: str) -> str:
            return "sample" if c == batch else c

        order = [*out, *k_i]
        dims = {dim(c): size[c] for c in order}
        flops = 2.0 * math.prod(size[c] for c in order)
        attrs = {"equation": equation, "pw": int(pw),
                 "gemm": {"batch": [dim(c) for c in batch_i], "m": [dim(c) for c in m_i],
                          "n": [dim(c) for c in n_i], "k": [dim(c) for c in k_i]}}
        inputs = [(x, tuple(dim(c) for c in ia))]
        params = 0
        if weight:
            params = math.prod(y_shape) * self.itemsize
            attrs["param_dims"] = [dim(c) for c in ib]
        else:
            inputs.append((y, tuple(dim(c) for c in ib)))  # type: ignore[arg-type]
        out_dims = tuple(dim(c) for c in out)
        return self._add("einsum", name, "matmul", dims, out_dims, tuple(size[c] for c in out), out_dims, inputs,
                         flops, 2 * flops, params, attrs)

    def embedding(self, ids: Tensor, vocab: int, units: int, name: str | None = None) -> Tensor:
        """An embedding lookup as PaSE writes it: the GEMM of one-hot ids ``(tokens, vocab)`` and the
        table ``(vocab, units)``, the vocabulary a dim that PaSE may split."""
        ids = self._check(ids, None, "embedding")
        lead = ("sample", "length", *(f"a{i}" for i in range(2, len(ids.shape))))[: len(ids.shape)]
        dims = {**dict(zip(lead, ids.shape)), "channel": int(units), "vocab": int(vocab)}
        m = math.prod(ids.shape)
        attrs = {"num_embeddings": int(vocab), "embedding_dim": int(units),
                 "gemm": {"batch": [], "m": list(lead), "n": ["channel"], "k": ["vocab"]}}
        out_dims = (*lead, "channel")
        return self._add("embedding", name, "embedding", dims, out_dims, (*ids.shape, int(units)), out_dims,
                         [(ids, lead)], 0.0, float(m * units), int(vocab) * int(units) * self.itemsize, attrs)

    def lstm(self, x: Tensor, units: int, layers: int = 1, name: str | None = None) -> Tensor:
        """A stacked LSTM over ``(batch, seq, features)`` as one node (PaSE's LSTM)."""
        x = self._check(x, 3, "lstm")
        b, t, k = x.shape
        n, L = int(units), int(layers)
        dims = {"layer": L, "length": t, "sample": b, "channel": n, "in_channel": k}
        flops = 0.0
        size_in = k
        for _ in range(L):
            flops += 2.0 * t * b * 4 * n * (size_in + n)
            size_in = n
        params = sum(4 * n * (i + n) for i in [k] + [n] * (L - 1)) * self.itemsize
        out_dims = ("sample", "length", "channel")
        return self._add("lstm", name, "lstm", dims, ("sample",), (b, t, n), out_dims,
                         [(x, ("sample", "length", "in_channel"))], flops, 2 * flops, params,
                         {"hidden_size": n, "num_layers": L, "bidirectional": False, "batch_first": True})

    def batchnorm(self, x: Tensor, name: str | None = None) -> Tensor:
        """Batch normalisation (PaSE's BatchNorm: its Norm over the sample axis)."""
        return self._norm(x, "batchnorm", 0, name)

    def layernorm(self, x: Tensor, axis: int = -1, name: str | None = None) -> Tensor:
        """Normalisation over one axis (PaSE's Norm; ``axis=-1`` is a layer norm)."""
        return self._norm(x, "layernorm", axis, name)

    def _norm(self, x: Tensor, kind: str, axis: int, name: str | None) -> Tensor:
        x = self._check(x, None, kind)
        names = self._names_of(x)
        axis = axis % len(names)
        dims = dict(zip(names, x.shape))
        e = math.prod(x.shape)
        if kind == "batchnorm":
            parallel = names
            attrs = {"reduce_dims": [n_ for n_ in names if n_ != "channel"] if "channel" in names else [names[0]],
                     "norm_dim": names[axis]}
            params = 2 * (dims.get("channel", x.shape[1] if len(x.shape) > 1 else 1)) * self.itemsize
        else:
            parallel = tuple(n_ for i, n_ in enumerate(names) if i != axis)
            attrs = {"norm_dim": names[axis], "normalized_shape": [x.shape[axis]]}
            params = 2 * x.shape[axis] * self.itemsize
        return self._add(kind, name, kind, dims, parallel, x.shape, names, [(x, names)], 5.0 * e, 10.0 * e, params, attrs)

    def elementwise(self, x: Tensor, y: Tensor | None = None, pw: int = 0, name: str | None = None) -> Tensor:
        """An elementwise op of one or two same-shape tensors (PaSE's Elementwise) with ``pw`` fused ops."""
        x = self._check(x, None, "elementwise")
        names = self._names_of(x)
        inputs = [(x, names)]
        if y is not None:
            y = self._check(y, len(x.shape), "elementwise")
            if y.shape != x.shape:
                raise LayerGraphError(f"{self.name}: elementwise on shapes {x.shape} and {y.shape}: they must match")
            inputs.append((y, names))
        e = float(math.prod(x.shape))
        return self._add("add", name, "elementwise", dict(zip(names, x.shape)), names, x.shape, names, inputs,
                         e * (1 + pw), e * (1 + pw), 0, {"pw": int(pw)})

    def softmax(self, x: Tensor, axis: int = -1, name: str | None = None) -> Tensor:
        """Softmax over one axis (PaSE's Softmax)."""
        x = self._check(x, None, "softmax")
        names = self._names_of(x)
        axis = axis % len(names)
        e = float(math.prod(x.shape))
        return self._add("softmax", name, "softmax", dict(zip(names, x.shape)),
                         tuple(n_ for i, n_ in enumerate(names) if i != axis), x.shape, names, [(x, names)], 5 * e, 5 * e,
                         0, {"dim": axis})

    def softmax_cross_entropy(self, x: Tensor, name: str | None = None) -> Tensor:
        """Softmax and cross-entropy over the last (class) axis (PaSE's SoftmaxCrossEntropy), kind
        ``loss``; every axis may be split, the classes too."""
        x = self._check(x, None, "softmax_cross_entropy")
        names = self._names_of(x)
        e = float(math.prod(x.shape))
        return self._add("loss", name, "loss", dict(zip(names, x.shape)), names[:-1], x.shape, names, [(x, names)],
                         5 * e, 5 * e, 0, {"loss": "softmax_cross_entropy", "class_dim": names[-1]})

    def reduce_mean(self, x: Tensor, axes: Sequence[int], keepdims: bool = False, name: str | None = None) -> Tensor:
        """A mean over ``axes`` (PaSE's ReduceMean)."""
        x = self._check(x, None, "reduce_mean")
        names = self._names_of(x)
        red = {a % len(names) for a in axes}
        kept = [i for i in range(len(names)) if i not in red]
        out_shape = [1 if i in red else s for i, s in enumerate(x.shape)] if keepdims else [x.shape[i] for i in kept]
        out_dims = ["" if i in red else names[i] for i in range(len(names))] if keepdims else [names[i] for i in kept]
        e = float(math.prod(x.shape))
        return self._add("mean", name, "reduce", dict(zip(names, x.shape)), [names[i] for i in kept], out_shape or [1],
                         out_dims or [""], [(x, names)], e, e, 0, {"dim": sorted(red), "keepdim": keepdims})

    def concat(self, xs: Sequence[Tensor], axis: int, name: str | None = None) -> Tensor:
        """Concatenation along ``axis`` (PaSE's Concat: that axis is never split)."""
        xs = [self._check(t, None, "concat") for t in xs]
        if len(xs) < 2:
            raise LayerGraphError(f"{self.name}: concat takes at least two tensors")
        rank = len(xs[0].shape)
        axis = axis % rank
        for t in xs[1:]:
            if len(t.shape) != rank or any(t.shape[i] != xs[0].shape[i] for i in range(rank) if i != axis):
                raise LayerGraphError(f"{self.name}: concat of shapes {[t.shape for t in xs]} along axis {axis}: other axes differ")
        names = self._names_of(xs[0])
        shape = list(xs[0].shape)
        shape[axis] = sum(t.shape[axis] for t in xs)
        windows, off = [], 0
        for t in xs:
            windows.append({str(axis): [1, -off, 1]})
            off += t.shape[axis]
        return self._add("concat", name, "concat", dict(zip(names, shape)), names, shape, names, [(t, names) for t in xs],
                         attrs={"dim": axis, "sizes": [t.shape[axis] for t in xs], "windows": windows})

    def stack(self, xs: Sequence[Tensor], axis: int = 0, name: str | None = None) -> Tensor:
        """Stack same-shape tensors along a new axis (PaSE's Stack: that axis is never split)."""
        xs = [self._check(t, None, "stack") for t in xs]
        if any(t.shape != xs[0].shape for t in xs):
            raise LayerGraphError(f"{self.name}: stack of shapes {[t.shape for t in xs]}: they must match")
        names = self._names_of(xs[0])
        axis = axis % (len(names) + 1)
        shape = (*xs[0].shape[:axis], len(xs), *xs[0].shape[axis:])
        out_dims = (*names[:axis], "", *names[axis:])
        return self._add("stack", name, "view", dict(zip(names, xs[0].shape)), names, shape, out_dims,
                         [(t, names) for t in xs], attrs={"dim": axis})

    def unstack(self, x: Tensor, axis: int = 0, name: str | None = None) -> list[Tensor]:
        """Split a tensor into its slices along ``axis`` (PaSE's Unstack: one node, one output per slice)."""
        x = self._check(x, None, "unstack")
        axis = axis % len(x.shape)
        names = tuple(n_ for i, n_ in enumerate(self._names_of(x)) if i != axis)
        shape = tuple(s for i, s in enumerate(x.shape) if i != axis)
        in_dims = (*names[:axis], "", *names[axis:])
        outs = [{"shape": list(shape), "dims": list(names)} for _ in range(x.shape[axis])]
        t0 = self._add("unstack", name, "view", dict(zip(names, shape)), names, shape, names, [(x, in_dims)],
                       attrs={"dim": axis}, outputs=outs)
        return [Tensor(t0.node, k, shape, names, t0.itemsize) for k in range(x.shape[axis])]

    def reshape(self, x: Tensor, shape: Sequence[int], name: str | None = None) -> Tensor:
        """A reshape as PaSE writes it: a Ravel to one axis, then an Unravel to ``shape`` (two
        nodes of kind ``view``). Both split only contiguously (``attrs["contiguous"]``): the
        leading axes whole, then one axis in part, then none. The flattened axis is indexed by
        the leading dim (exact for splits of the leading axis alone)."""
        x = self._check(x, None, "reshape")
        total = math.prod(x.shape)
        shape = [int(s) for s in shape]
        if shape.count(-1) == 1:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = total // known if known else 0
        if math.prod(shape) != total:
            raise LayerGraphError(f"{self.name}: reshape of {x.shape} ({total} elements) to {tuple(shape)}")
        base = name or self._name(None, "reshape")
        names = self._names_of(x)
        flat = self._add("ravel", f"{base}.ravel", "view", dict(zip(names, x.shape)), names, (total,), (names[0],),
                         [(x, names)], attrs={"contiguous": True})
        out_names = ("sample", *(f"a{i}" for i in range(1, len(shape))))
        return self._add("unravel", f"{base}.unravel", "view", dict(zip(out_names, shape)), out_names, shape, out_names,
                         [(flat, (out_names[0],))], attrs={"contiguous": True})

    # ------------------------------------------------------------------ result
    def build(self, **meta: Any) -> LayerGraph:
        """The layer graph (node ids in call order, a topological order)."""
        if not self._nodes:
            raise LayerGraphError(f"{self.name}: the builder has no layers")
        n = self._nodes
        src, dst, nb, dp, sp = (np.asarray(c, dtype=np.int64) for c in zip(*self._edges)) if self._edges else \
            (np.zeros(0, dtype=np.int64),) * 5
        info = {"model": self.name, "batch_size": self.batch_size, "dtype": self.dtype, "builder": "harness.core.layer_builder",
                "inputs": [{"name": x["name"], "shape": list(x["out_shape"]), "dtype": x["attrs"]["dtype"],
                            "axes": list(x["out_dims"])} for x in n if x["kind"] == "input"],
                "outputs": [v for v in range(len(n)) if v not in set(src.tolist())], **meta}
        return LayerGraph(
            names=[x["name"] for x in n], kinds=[x["kind"] for x in n], dims=[x["dims"] for x in n],
            parallel_dims=[x["parallel"] for x in n], flops_fwd=np.array([x["ff"] for x in n]),
            flops_bwd=np.array([x["fb"] for x in n]), param_bytes=np.array([x["pbytes"] for x in n], dtype=np.int64),
            out_shape=[x["out_shape"] for x in n], out_bytes=np.array([x["out_bytes"] for x in n], dtype=np.int64),
            out_dims=[x["out_dims"] for x in n], in_dims=[x["in_dims"] for x in n], attrs=[x["attrs"] for x in n],
            src=src, dst=dst, nbytes=nb, dst_port=dp, src_port=sp, meta=info,
        )


__all__ = ["LAYERGRAPH_FORMAT", "LayerGraphBuilder", "Tensor", "Weight"]
