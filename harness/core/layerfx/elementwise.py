"""Handlers of elementwise ops (OptCNN Table 1: every output dim parallel) and the generic fallback
for ops the builder does not know (split on ``sample`` only), with the label helpers of broadcasting."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.core.layerfx.common import CallContext, NodeSpec, TensorRef, default_axes, fresh_name


def _same_labels(ctx: CallContext) -> tuple[str, ...]:
    """Output labels of a shape-preserving op: those of the first operand with the output's shape."""
    out = tuple(ctx.out.shape)
    for i, (r, v) in enumerate(ctx.operands):
        if isinstance(r, TensorRef) and tuple(v.shape) == out:
            return r.labels
    return _broadcast_labels(ctx)


def _broadcast_labels(ctx: CallContext) -> tuple[str, ...]:
    out = tuple(ctx.out.shape)
    labels: list[str | None] = [None] * len(out)
    for i, (r, v) in enumerate(ctx.operands):
        if not isinstance(r, TensorRef):
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
            lab = fresh_name("sample" if j == 0 and out[j] == ctx.batch and "sample" not in taken else f"d{j}", taken)
        seen.add(lab)
        result.append(lab)
    return tuple(result)


def aligned_dims(ctx: CallContext, labels: Sequence[str]) -> list[tuple[str, ...]]:
    """Axis maps of broadcast operands, right-aligned to an output labelled ``labels``."""
    out = tuple(ctx.out.shape)
    maps = []
    for _, v in ctx.operands:
        off = len(out) - v.dim()
        maps.append(tuple(labels[ax + off] if ax + off >= 0 and v.shape[ax] == out[ax + off] else "" for ax in range(v.dim())))
    return maps


def elementwise_spec(ctx: CallContext, kind: str = "elementwise", per_elt: float = 1.0, bwd: float = 1.0) -> NodeSpec:
    """An elementwise op over the broadcast output: every output dim parallel, ``per_elt`` FLOPs per output element."""
    labels = _same_labels(ctx)
    out = tuple(ctx.out.shape)
    numel = math.prod(out)
    return NodeSpec(kind, dict(zip(labels, out)), labels, labels, labels, aligned_dims(ctx, labels),
                 per_elt * numel, bwd * per_elt * numel, attrs={"op": ctx.op})


def other_spec(ctx: CallContext, flops: float, kind: str = "other") -> NodeSpec:
    """An op the builder does not know: split on sample only, when its output has a sample axis."""
    out = tuple(ctx.out.shape) if ctx.out is not None else ()
    labels: tuple[str, ...] | None = None
    for i, (r, v) in enumerate(ctx.operands):
        if isinstance(r, TensorRef) and tuple(v.shape) == out:
            labels = r.labels
            break
    if labels is None:
        labels = default_axes(len(out), ctx.out is not None and not ctx.out.is_floating_point())
        if not (out and out[0] == ctx.batch):
            labels = tuple(f"d{i}" for i in range(len(out)))
    dims = dict(zip(labels, out))
    attrs: dict[str, Any] = {"op": type(ctx.module).__name__ if ctx.module is not None else ctx.op, "counted_flops": True}
    if "sample" not in dims:
        # an op that reduces the batch away (a loss, a batch statistic): still split by sample,
        # each shard producing a partial result
        batch = next((v.shape[r.labels.index("sample")] for r, v in ctx.operands
                      if isinstance(r, TensorRef) and "sample" in r.labels), None)
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
    return NodeSpec(kind, dims, ("sample",) if has_sample else (), tuple(labels), tuple(labels), operand_dims,
                 flops, 2 * flops, attrs=attrs)
