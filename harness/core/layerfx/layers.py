"""Handlers of the compute layers: convolutions, linear, matmul (PaSE's GEMM view), pooling, embedding
and recurrent modules, with their iteration domains, parallel dims (OptCNN Table 1), halos and FLOPs."""

from __future__ import annotations

import math
from typing import Any

from harness.core.layerfx.common import CallContext, NodeSpec, Unsupported, flat_tensors, fresh_name, int_tuple
from harness.core.layerfx.elementwise import aligned_dims


_SPATIAL = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}
_KERNEL = {1: ("kernel_l",), 2: ("kernel_h", "kernel_w"), 3: ("kernel_d", "kernel_h", "kernel_w")}


def _conv_params(ctx: CallContext, nd: int) -> dict[str, Any]:
    m = ctx.module
    if m is not None:
        return {"kernel": int_tuple(m.kernel_size, nd), "stride": int_tuple(m.stride, nd), "padding": m.padding,
                "dilation": int_tuple(m.dilation, nd), "groups": int(m.groups), "bias": m.bias is not None}
    w = ctx.operands[1][1]
    return {"kernel": tuple(int(s) for s in w.shape[2:]), "stride": int_tuple(ctx.arg(3, "stride", 1), nd),
            "padding": ctx.arg(4, "padding", 0), "dilation": int_tuple(ctx.arg(5, "dilation", 1), nd),
            "groups": int(ctx.arg(6, "groups", 1)), "bias": ctx.arg(2, "bias") is not None}


def conv_spec(ctx: CallContext, nd: int) -> NodeSpec:
    """An ``nd``-D convolution: parallel ``sample``, ``channel`` and spatial dims (OptCNN Table 1),
    halo windows on the input, implicit-GEMM FLOPs."""
    x_shape, out = ctx.shape(0), tuple(ctx.out.shape)
    if len(x_shape) != nd + 2:
        raise Unsupported("unbatched convolution")
    p = _conv_params(ctx, nd)
    kernel, stride, dilation, groups = p["kernel"], p["stride"], p["dilation"], p["groups"]
    pad = p["padding"]
    if pad == "valid":
        padding = (0,) * nd
    elif pad == "same":
        padding = tuple(d * (k - 1) // 2 for k, d in zip(kernel, dilation))
    else:
        padding = int_tuple(pad, nd)
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
    return NodeSpec(f"conv{nd}d", dims, ("sample", "channel", *spatial), out_dims, out_dims, operand_dims,
                 flops, 2 * flops, attrs=attrs, windows={0: windows})


def linear_spec(ctx: CallContext) -> NodeSpec:
    """A linear layer: leading axes folded into ``sample``; parallel ``sample`` and ``channel`` (OptCNN Table 1)."""
    x_shape, out = ctx.shape(0), tuple(ctx.out.shape)
    x_labels = ctx.labels(0)
    k = x_shape[-1]
    n = out[-1]
    lead = x_shape[:-1]
    m = math.prod(lead)
    taken = set(x_labels[:-1])
    ch = fresh_name("channel", taken)
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
    return NodeSpec("linear", dims, parallel, out_dims, labels, operand_dims, flops, 2 * flops, attrs=attrs)


def matmul_spec(ctx: CallContext) -> NodeSpec:
    """A matmul family call as PaSE's GEMM: batch dims, ``m`` and ``n`` parallel, ``k`` contracted."""
    ops = ctx.operands
    first = 1 if ctx.op in ("addmm", "baddbmm", "addbmm", "addmv") else 0
    if len(ops) < first + 2:
        raise Unsupported("matmul operands")
    ia, ib = first, first + 1
    a, b = ctx.shape(ia), ctx.shape(ib)
    la, lb = ctx.labels(ia), ctx.labels(ib)
    out = tuple(ctx.out.shape)
    if ctx.op == "addbmm":
        raise Unsupported("addbmm")
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
        batch_labels.append(fresh_name(lab or f"batch{j}", taken))
    m_name = fresh_name("sample" if has_m and la[-2] == "sample" and "sample" not in taken else "m", taken) if has_m else None
    n_name = fresh_name("n", taken) if has_n else None
    k_name = fresh_name("k", taken)
    out_dims = (*batch_labels, *([m_name] if m_name else []), *([n_name] if n_name else []))
    # downstream layers name the rows and columns after the operands' axes, not m and n
    sem = set(batch_labels)
    labels = (*batch_labels, *([fresh_name(la[-2], sem)] if has_m else []), *([fresh_name(lb[-1], sem)] if has_n else []))
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
        operand_dims[0] = aligned_dims(ctx, out_dims)[0]
    flops = 2.0 * math.prod(batch) * M * N * K
    return NodeSpec("matmul", dims, out_dims, out_dims, labels, operand_dims, flops, 2 * flops,
                 attrs={"op": ctx.op, "m": M, "n": N, "k": K, "batch": list(batch)})


def pool_spec(ctx: CallContext, mode: str, nd: int) -> NodeSpec:
    """An ``nd``-D pooling layer (``mode`` max / avg / adaptive / lp): every output dim parallel, windows on the input."""
    x_shape, out = ctx.shape(0), tuple(ctx.out.shape)
    if len(x_shape) != nd + 2:
        raise Unsupported("unbatched pooling")
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
        kernel = int_tuple(k_, nd)
        stride = int_tuple(s_, nd) if s_ not in (None, [], ()) else kernel
        padding = int_tuple(p_, nd)
        dilation = int_tuple(d_, nd)
        windows = {2 + i: [stride[i], -padding[i], (kernel[i] - 1) * dilation[i] + 1] for i in range(nd)}
        attrs.update(kernel=kernel, stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode)
    attrs["kernel"] = list(kernel)
    labels = ("sample", "channel", *spatial)
    dims = {**dict(zip(labels, out)), **dict(zip(kernels, kernel))}
    flops = float(math.prod(out) * math.prod(kernel))
    return NodeSpec(f"pool{nd}d", dims, labels, labels, labels, [labels], flops, flops, attrs=attrs,
                 windows={0: windows} if windows else {})


def embedding_spec(ctx: CallContext) -> NodeSpec:
    """An embedding lookup: parallel ``sample`` (index axes folded) and ``channel``; backward one FLOP per output element."""
    idx_shape, out = ctx.shape(0), tuple(ctx.out.shape)
    idx_labels = ctx.labels(0)
    d = out[-1]
    m = math.prod(idx_shape)
    taken = set(idx_labels)
    labels = (*idx_labels, fresh_name("channel", taken))
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
    attrs: dict[str, Any] = {"num_embeddings": vocab, "embedding_dim": d, "sample_shape": list(idx_shape)}
    if vocab and idx_shape:
        # PaSE's one-hot GEMM (tokens, d, vocab): the vocabulary is a reduction dim it may split
        dims["vocab"] = vocab
        attrs["gemm"] = {"batch": [], "m": ["sample"], "n": ["channel"], "k": ["vocab"]}
    return NodeSpec("embedding", dims, parallel, out_dims, labels, [idx_axes, ("vocab" if "vocab" in dims else "", "channel")], 0.0, float(m * d),
                 attrs=attrs)


def rnn_spec(ctx: CallContext) -> NodeSpec:
    """nn.LSTM / GRU / RNN as one layer over all time steps (split on sample only: the recurrence is sequential)."""
    m = ctx.module
    x_shape = ctx.shape(0)
    batched = len(x_shape) == 3
    if not batched:
        raise Unsupported("unbatched RNN")
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
    n_states = len(list(flat_tensors(ctx.value))) - 1
    extra = [(state_dims, ("layer", "sample", "channel"))] * n_states
    return NodeSpec(kind, dims, ("sample",), out_dims, (*seq, "channel"), operand_dims, flops, 2 * flops,
                 attrs={"hidden_size": h, "num_layers": m.num_layers, "bidirectional": m.bidirectional,
                        "batch_first": m.batch_first},
                 extra=extra)
