"""Handlers of view and shape ops (zero-FLOP ``view`` nodes whose axis maps and windows relate output
axes to input axes: casts, reshapes, permutes, expands, indexing, padding) and of concatenation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.core.layerfx.common import CallContext, NodeSpec, Unsupported, fresh_name, norm_axis


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
                raise Unsupported(f"reshape {tuple(a)} -> {tuple(b)}")
        groups.append((gi, gj))
    return groups


def cast_spec(ctx: CallContext) -> NodeSpec:
    """A dtype cast: a ``view`` node when the dtype is unchanged, else elementwise."""
    labels = ctx.labels(0)
    out = tuple(ctx.out.shape)
    same = ctx.out.dtype == ctx.operands[0][1].dtype
    dims = [tuple(labels)] + [None] * (len(ctx.operands) - 1)
    return NodeSpec("view" if same else "elementwise", dict(zip(labels, out)), labels, labels, labels, dims,
                 0.0 if same else math.prod(out), 0.0 if same else math.prod(out), attrs={"op": ctx.op},
                 skip=frozenset(range(1, len(ctx.operands))))


def reshape_spec(ctx: CallContext) -> NodeSpec:
    """A reshape / view / flatten: the outer axis of each group of merged or split axes keeps its name and is parallel."""
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
                out_labels[j] = fresh_name(base, taken)
        if outer_j is not None:
            parallel.append(out_labels[outer_j])
            if outer_i is not None:
                in_axes[outer_i] = out_labels[outer_j]
    return NodeSpec("view", dict(zip(out_labels, b)), tuple(parallel), tuple(out_labels), tuple(out_labels),
                 [tuple(in_axes)], attrs={"op": ctx.op, "shape": list(b)}, skip=frozenset(range(1, len(ctx.operands))))


def _perm(ctx: CallContext, rank: int) -> list[int]:
    op = ctx.op
    if op == "permute":
        dims = ctx.args[1:] if len(ctx.args) > 2 or isinstance(ctx.args[1], int) else ctx.args[1]
        return [norm_axis(int(d), rank) for d in (ctx.kwargs.get("dims") or dims)]
    if op in ("transpose", "swapaxes", "swapdims"):
        d0 = norm_axis(int(ctx.arg(1, "dim0")), rank)
        d1 = norm_axis(int(ctx.arg(2, "dim1")), rank)
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
        src = [norm_axis(int(s), rank) for s in ((src,) if isinstance(src, int) else src)]
        dst = [norm_axis(int(d), rank) for d in ((dst,) if isinstance(dst, int) else dst)]
        rest = iter(i for i in range(rank) if i not in src)
        placed = dict(zip(dst, src))
        return [placed[j] if j in placed else next(rest) for j in range(rank)]
    raise Unsupported(op)


def permute_spec(ctx: CallContext) -> NodeSpec:
    """A permute / transpose / movedim: the input's axis names in the new order."""
    labels = ctx.labels(0)
    perm = _perm(ctx, len(labels))
    out_labels = tuple(labels[p] for p in perm)
    out = tuple(ctx.out.shape)
    if sorted(perm) != list(range(len(labels))) or tuple(ctx.shape(0)[p] for p in perm) != out:
        raise Unsupported(f"{ctx.op} permutation {perm}")
    return NodeSpec("view", dict(zip(out_labels, out)), out_labels, out_labels, out_labels, [tuple(labels)],
                 attrs={"op": ctx.op, "perm": perm})


def expand_spec(ctx: CallContext) -> NodeSpec:
    """An expand / broadcast: broadcast input axes map to no dim."""
    a, b = ctx.shape(0), tuple(ctx.out.shape)
    in_labels = ctx.labels(0)
    off = len(b) - len(a)
    taken = set(in_labels)
    labels = [in_labels[j - off] if j >= off else fresh_name(f"d{j}", taken) for j in range(len(b))]
    in_axes = tuple(labels[i + off] if a[i] == b[i + off] else "" for i in range(len(a)))
    dims = [in_axes] + [None] * (len(ctx.operands) - 1)
    return NodeSpec("view", dict(zip(labels, b)), tuple(labels), tuple(labels), tuple(labels), dims,
                 attrs={"op": ctx.op, "shape": list(b)}, skip=frozenset(range(1, len(ctx.operands))))


def index_spec(ctx: CallContext) -> NodeSpec:
    """Basic indexing (ints, slices, None, Ellipsis), ``narrow`` and ``select`` as a view with windows."""
    import torch

    a = ctx.shape(0)
    in_labels = ctx.labels(0)
    if ctx.op == "narrow":
        dim = norm_axis(int(ctx.arg(1, "dim")), len(a))
        start = int(ctx.arg(2, "start"))
        idx: tuple[Any, ...] = (slice(None),) * dim + (slice(start, start + int(ctx.arg(3, "length"))),)
    elif ctx.op == "select":
        dim = norm_axis(int(ctx.arg(1, "dim")), len(a))
        idx = (slice(None),) * dim + (int(ctx.arg(2, "index")),)
    else:
        raw = ctx.args[1]
        idx = raw if isinstance(raw, tuple) else (raw,)
    if any(isinstance(x, (torch.Tensor, list)) or (isinstance(x, bool)) for x in idx):
        raise Unsupported("advanced indexing")
    consumed = sum(1 for x in idx if x is not None and x is not Ellipsis)
    if sum(1 for x in idx if x is Ellipsis) > 1 or consumed > len(a):
        raise Unsupported("index")
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
            labels.append(fresh_name("unit", taken))
            sizes.append(1)
            continue
        n = a[ax]
        if isinstance(x, slice):
            start, stop, step = x.indices(n)
            size = max(0, -(-(stop - start) // step))
            name = fresh_name(in_labels[ax], taken)
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
        raise Unsupported("index shape")
    spec_windows = {0: windows} if windows else {}
    return NodeSpec("view", dict(zip(labels, out)), tuple(labels), tuple(labels), tuple(labels), [tuple(in_axes)],
                 attrs={"op": "getitem" if ctx.op in ("getitem", "__getitem__") else ctx.op}, windows=spec_windows)


def pad_spec(ctx: CallContext) -> NodeSpec:
    """A constant / reflection / replication pad: a view whose input windows are offset by the leading padding."""
    labels = ctx.labels(0)
    a, out = ctx.shape(0), tuple(ctx.out.shape)
    pad = list(ctx.module.padding) if ctx.module is not None else list(ctx.arg(1, "pad"))
    windows: dict[int, list[int]] = {}
    for k in range(len(pad) // 2):
        ax = len(a) - 1 - k
        if pad[2 * k]:
            windows[ax] = [1, -int(pad[2 * k]), 1]
    return NodeSpec("view", dict(zip(labels, out)), labels, labels, labels, [tuple(labels)],
                 attrs={"op": "pad", "pad": pad}, windows={0: windows} if windows else {})


def concat_spec(ctx: CallContext) -> NodeSpec:
    """cat / stack: input p read through a window at its offset along the concat axis (stack: a ``select`` of one index)."""
    out = tuple(ctx.out.shape)
    stack = ctx.op in ("stack",)
    dim = ctx.kwargs.get("dim", ctx.kwargs.get("axis", ctx.args[1] if len(ctx.args) > 1 else 0))
    dim = norm_axis(int(dim), len(out))
    first = next((i for i in range(len(ctx.operands)) if ctx.live(i)), 0)
    base = list(ctx.labels(first))
    taken = set(base)
    if stack:
        labels = base[:dim] + [fresh_name("stack", taken)] + base[dim:]
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
    return NodeSpec("concat", dict(zip(labels, out)), tuple(labels), tuple(labels), tuple(labels), operand_dims,
                 attrs={"dim": dim, "op": ctx.op, "sizes": [ctx.shape(i)[dim] if not stack else 1 for i in range(len(ctx.operands))]},
                 windows=windows, select=select)
