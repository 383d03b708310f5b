"""Handlers of normalisations, softmax and reductions: layers whose statistics run over some dims,
which are then not parallel (or, for batch norm, need their statistics all-reduced)."""

from __future__ import annotations

import math

from harness.core.layerfx.common import CallContext, NodeSpec, Unsupported, int_tuple, norm_axis


def batchnorm_spec(ctx: CallContext) -> NodeSpec:
    """Batch norm: every output dim parallel, ``reduce_dims`` the dims its statistics run over."""
    labels = ctx.labels(0)
    out = tuple(ctx.out.shape)
    numel = math.prod(out)
    reduce = [lab for i, lab in enumerate(labels) if i != 1]
    # OptCNN splits a BN layer like the conv before it (all output dims). A channel split is
    # exact; a sample / spatial split needs the 2*C statistics all-reduced (SyncBN) to be
    # exact, which is what attrs["reduce_dims"] tells a cost model.
    return NodeSpec("batchnorm", dict(zip(labels, out)), labels, labels, labels, [labels],
                 5.0 * numel, 10.0 * numel, attrs={"reduce_dims": reduce, "num_features": out[1] if len(out) > 1 else 0})


def layernorm_spec(ctx: CallContext) -> NodeSpec:
    """Layer norm: the non-normalised dims parallel."""
    labels = ctx.labels(0)
    out = tuple(ctx.out.shape)
    shape = ctx.module.normalized_shape if ctx.module is not None else ctx.arg(1, "normalized_shape")
    k = len(int_tuple(shape, 1)) if not isinstance(shape, int) else 1
    numel = math.prod(out)
    normalized = labels[len(labels) - k:]
    return NodeSpec("layernorm", dict(zip(labels, out)), labels[: len(labels) - k], labels, labels, [labels],
                 5.0 * numel, 10.0 * numel, attrs={"normalized_dims": list(normalized)})


def norm_spec(ctx: CallContext) -> NodeSpec:
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
    return NodeSpec("norm", dict(zip(labels, out)), parallel, labels, labels, [labels], 5.0 * numel, 10.0 * numel,
                 attrs={"op": name}, windows={0: windows} if windows else {})


def softmax_spec(ctx: CallContext) -> NodeSpec:
    """Softmax / log-softmax / softmin: every dim but the normalised one parallel."""
    labels = ctx.labels(0)
    out = tuple(ctx.out.shape)
    dim = ctx.module.dim if ctx.module is not None else ctx.arg(1, "dim")
    if dim is None:
        dim = 0 if len(out) in (0, 1, 3) else 1
    dim = norm_axis(int(dim), len(out))
    numel = math.prod(out)
    parallel = tuple(lab for i, lab in enumerate(labels) if i != dim)
    return NodeSpec("softmax", dict(zip(labels, out)), parallel, labels, labels, [labels], 5.0 * numel, 5.0 * numel,
                 attrs={"dim": dim, "op": ctx.op})


def reduce_spec(ctx: CallContext) -> NodeSpec:
    """A reduction: the kept dims parallel, one FLOP per input element."""
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
        reduced = {norm_axis(int(d), rank) for d in ((dim,) if isinstance(dim, int) else dim)}
    keepdim = len(out) == rank and rank > 0
    kept = [i for i in range(rank) if i not in reduced]
    if [in_shape[i] for i in kept] != [n for i, n in enumerate(out) if not (keepdim and i in reduced)]:
        raise Unsupported("reduction shape")
    dims = {labels_in[i]: in_shape[i] for i in kept}
    dims.update({labels_in[i]: in_shape[i] for i in sorted(reduced)})
    if keepdim:
        out_dims = tuple("" if i in reduced else labels_in[i] for i in range(rank))
        labels = tuple(labels_in)
    else:
        out_dims = labels = tuple(labels_in[i] for i in kept)
    numel = float(math.prod(in_shape))
    return NodeSpec("reduce", dims, tuple(labels_in[i] for i in kept), out_dims, labels, [tuple(labels_in)], numel, numel,
                 attrs={"op": ctx.op, "reduced": [labels_in[i] for i in sorted(reduced)], "keepdim": keepdim})
