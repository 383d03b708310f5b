"""A traced training step's fx graph as an :class:`~harness.core.graph.OpGraph` (the second half
of :func:`harness.core.capture.capture`, which traces the step).

Per fx ``call_function`` node: its FLOPs (PyTorch's FLOP formulas, a convolution's from its
kernels), bytes read and written, whether it is ``free`` (a view), phase and layer (from the
trace's annotations), its batch role (from the probe run at batch B+1, matched op for op by
:func:`align_probe`), the parameters it reads, the co-location groups
(:func:`harness.core.graph_rewrites.parameter_groups`) and the kernel table
(:mod:`harness.core.kernels`).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from harness.core.graph import BACKWARD, BATCHED, FORWARD, PARTIAL, REPLICATED, UPDATE, OpGraph, edges_from_pairs
from harness.core.graph_rewrites import parameter_groups
from harness.core.kernels import CONV_KINDS, GEMM, KernelTable, batch_column, gemm_dims, is_rnn_layer, node_kernels
from harness.core.precision import Precision, math_of

#: consumers that read only the shape of an input
SHAPE_ONLY = {"ones_like", "zeros_like", "empty_like", "full_like", "new_zeros", "new_ones", "new_empty", "new_full", "sym_size", "sym_numel", "sym_stride"}
#: ops that allocate without running a kernel
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


def _target_name(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    return str(target)


def tensors_of(val: Any) -> list[Any]:
    """The tensors in ``val``, a tensor or nested lists and tuples of them (anything else: none)."""
    import torch

    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in tensors_of(v)]
    return []


def _nbytes(t: Any) -> int:
    return int(t.numel()) * t.element_size()


def _arg_nodes(node: Any) -> list[Any]:
    import torch.fx as fx

    out: list[Any] = []
    fx.node.map_arg((node.args, node.kwargs), lambda a: out.append(a))
    return out


#: a probe record: (aten op, output shapes, input tensor shapes of a GEMM op else None)
ProbeRecord = tuple[str, list[list[int]], "list[list[int]] | None"]


def align_probe(ops: list[Any], records: list[ProbeRecord]) -> tuple[list[list[list[int]]], list[Any]] | None:
    """Output shapes (and GEMM input shapes) of each traced node at the probe batch size, or
    None if the two runs cannot be matched op for op (getitem takes its element of the
    parent's outputs)."""
    shapes: list[list[list[int]]] = []
    ins: list[Any] = []
    pos: dict[Any, int] = {}
    k = 0
    for i, n in enumerate(ops):
        if n.target is operator.getitem:
            parent = n.args[0]
            j = pos.get(parent)
            if j is None:
                return None
            # the parent's flat outputs: select the one this getitem names
            val = parent.meta.get("val")
            flat_index = sum(len(tensors_of(v)) for v in val[: n.args[1]]) if isinstance(val, (list, tuple)) else 0
            parent_shapes = shapes[j]
            shapes.append([parent_shapes[flat_index]] if flat_index < len(parent_shapes) else [])
            ins.append(None)
            pos[n] = i
            continue
        name = str(n.target)
        look = k
        while look < len(records) and records[look][0] != name and look - k < 64:
            look += 1
        if look >= len(records) or records[look][0] != name:
            return None
        shapes.append(records[look][1])
        ins.append(records[look][2])
        pos[n] = i
        k = look + 1
    return shapes, ins


def to_opgraph(gm: Any, probe: list[ProbeRecord] | None, info: dict[str, Any], batch: int, name: str, optimizer: str,
                precision: Precision = Precision(), layer_types: dict[str, str] | None = None) -> OpGraph:
    """The :class:`OpGraph` of the traced step ``gm`` (``info``: its parameter and buffer names),
    with batch roles from the ``probe`` records at batch ``batch + 1`` (None: the leading-dim
    heuristic) and the kernel table in ``precision``; ``layer_types`` maps module paths to class
    names (recurrent layers' GEMMs are costed as recurrent kernels).  A malformed graph raises
    :class:`harness.core.graph.GraphError`."""
    import torch

    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    n_params = len(info["param_names"])
    n_bufs = len(info["buffer_names"])
    param_of = {ph: i for i, ph in enumerate(placeholders[:n_params])}
    # buffers are resident state too: they join the parameter table without a gradient
    for j, ph in enumerate(placeholders[n_params:n_params + n_bufs]):
        param_of[ph] = n_params + j
    data_ph = set(placeholders[n_params + n_bufs:])
    pnames = list(info["param_names"]) + list(info["buffer_names"])
    pbytes = [_nbytes(ph.meta["val"]) for ph in placeholders[: n_params + n_bufs]]

    ops = [n for n in nodes if n.op == "call_function"]
    idx = {n: i for i, n in enumerate(ops)}
    # shapes at batch B+1; None when the probe run cannot be matched op for op, and then a
    # shape heuristic (leading dim divisible by B) stands in
    aligned = align_probe(ops, probe) if probe is not None else None
    shapes2, ins2 = aligned if aligned is not None else (None, None)
    N = len(ops)
    names, targets, phase = [], [], np.zeros(N, np.int8)
    flops = np.zeros(N)
    out_b = np.zeros(N, np.int64)
    work_b = np.zeros(N, np.int64)
    free = np.zeros(N, bool)
    role = np.zeros(N, np.int8)
    batch_axis = np.full(N, -1, np.int32)
    data_dep = np.zeros(N, bool)
    shapes: list[list[list[int]]] = []
    dtypes: list[list[str]] = []
    layer_ids: dict[str, int] = {}
    lay = np.zeros(N, np.int32)
    pairs: list[tuple[int, int, int]] = []
    p_ptr = [0]
    p_idx: list[int] = []
    phase_code = {"forward": FORWARD, "backward": BACKWARD, "update": UPDATE}
    from torch.utils.flop_counter import flop_registry

    for i, n in enumerate(ops):
        tname = _target_name(n.target)
        short = tname.split(".")[1] if tname.startswith("aten.") else tname
        outs = tensors_of(n.meta.get("val"))
        custom = n.meta.get("custom") or {}
        lname = custom.get("layer", "loss")
        phase[i] = phase_code.get(custom.get("phase", "forward"), FORWARD)
        if lname not in layer_ids:
            layer_ids[lname] = len(layer_ids)
        lay[i] = layer_ids[lname]
        names.append(n.name)
        targets.append(tname)
        shapes.append([list(t.shape) for t in outs])
        dtypes.append([str(t.dtype).replace("torch.", "") for t in outs])
        out_b[i] = sum(_nbytes(t) for t in outs)
        is_view = n.target is operator.getitem or bool(getattr(n.target, "is_view", False)) or short in NO_KERNEL
        free[i] = is_view
        args = _arg_nodes(n)
        in_bytes = 0
        seen: set[Any] = set()
        reads: list[int] = []
        for a in args:
            if a in seen:
                continue
            seen.add(a)
            if a in param_of:
                reads.append(param_of[a])
                in_bytes += pbytes[param_of[a]]
            if a in data_ph:
                data_dep[i] = True
                in_bytes += sum(_nbytes(t) for t in tensors_of(a.meta.get("val")))
            if a in idx:
                j = idx[a]
                if short in SHAPE_ONLY:
                    continue
                data_dep[i] |= data_dep[j]
                src_val = a.meta.get("val")
                if n.target is operator.getitem and isinstance(src_val, (list, tuple)):
                    b = sum(_nbytes(t) for t in tensors_of(src_val[n.args[1]]))
                else:
                    b = sum(_nbytes(t) for t in tensors_of(src_val))
                in_bytes += b
                pairs.append((j, i, b))
        p_idx.extend(sorted(set(reads)))
        p_ptr.append(len(p_idx))
        if not is_view:
            work_b[i] = in_bytes + out_b[i]
            packet = getattr(n.target, "_overloadpacket", None)
            if packet in flop_registry:
                a_vals = torch.fx.node.map_arg(n.args, lambda a: a.meta.get("val"))
                k_vals = torch.fx.node.map_arg(n.kwargs, lambda a: a.meta.get("val"))
                try:
                    flops[i] = float(flop_registry[packet](*a_vals, **k_vals, out_val=n.meta.get("val")))
                except Exception:  # noqa: BLE001 - a formula that rejects these args: cost by bytes
                    flops[i] = 0.0
        # batch role from the B+1 trace: which output axis (if any) grew with the batch
        if shapes2 is not None:
            s2 = shapes2[i]
            if outs and s2 and len(outs[0].shape) == len(s2[0]):
                diff = [k for k, (a1, a2) in enumerate(zip(outs[0].shape, s2[0])) if a1 != a2]
                if diff:
                    batch_axis[i] = diff[0]
        elif outs and outs[0].dim() > 0 and outs[0].shape[0] % batch == 0 and data_dep[i]:
            batch_axis[i] = 0
    # an optimizer update works on the reduced gradient, the same on every replica
    role[:] = np.where(batch_axis >= 0, BATCHED, np.where(data_dep & (phase != UPDATE), PARTIAL, REPLICATED))

    # outputs: (loss, grads, new params)
    out_node = next(n for n in nodes if n.op == "output")
    flat = list(out_node.args[0])  # make_fx flattens (loss, grads, new params)
    loss_v, grads_v, new_v = flat[0], flat[1:1 + n_params], flat[1 + n_params:1 + 2 * n_params]
    grad_node = np.array([idx.get(g, -1) if g is not None else -1 for g in grads_v] + [-1] * n_bufs, np.int32)
    update_node = np.array(
        [idx.get(p, -1) if optimizer == "sgd" else -1 for p in new_v] + [-1] * n_bufs, np.int32
    )
    src, dst, nb = edges_from_pairs(pairs)
    coloc = parameter_groups(N, free, src, dst, np.asarray(p_ptr), np.asarray(p_idx, np.int64), grad_node, update_node)
    meta = {
        "model": name,
        "batch_size": batch,
        "dtype": precision.param_dtype,
        "batch_axis": batch_axis.tolist(),
        "batch_probe": shapes2 is not None,
        "loss_node": idx.get(loss_v, -1),
    }
    g = OpGraph(
        names=names, targets=targets, phase=phase, layer=lay, layer_names=list(layer_ids), flops=flops,
        out_bytes=out_b, work_bytes=work_b, free=free, batch_role=role, coloc=coloc, src=src, dst=dst, nbytes=nb,
        param_names=pnames, param_bytes=pbytes, param_ptr=p_ptr, param_idx=p_idx, grad_node=grad_node,
        update_node=update_node, out_shapes=shapes, out_dtypes=dtypes, meta=meta,
    )
    g.kernels = _kernel_table(g, ops, ins2, precision, layer_types or {})
    # torch's FLOP formula counts a grouped convolution's weight gradient over all input
    # channels (groups times too much); a convolution's FLOPs are its kernels' instead
    conv = np.isin(g.kernels.kind, CONV_KINDS)
    if conv.any():
        nodes = np.unique(g.kernels.node[conv])
        g.flops[nodes] = np.bincount(g.kernels.node[conv], weights=g.kernels.flops()[conv], minlength=g.num_nodes)[nodes]
    return g


def _kernel_table(g: OpGraph, ops: list[Any], ins2: list[Any] | None, precision: Precision, layer_types: dict[str, str]) -> KernelTable:
    """The kernels of every captured node (:mod:`harness.core.kernels`), the batch column of each
    found from the GEMM shapes of the probe at batch B+1 where there is one."""
    import torch

    scaled = g.batch_scaled().tolist()
    rnn_layer = [is_rnn_layer(path, layer_types) for path in g.layer_names]
    node, kind, dims, bdim, math, rnn = [], [], [], [], [], []
    for i, n in enumerate(ops):
        if g.free[i]:
            continue
        a_vals = torch.fx.node.map_arg(n.args, lambda a: a.meta.get("val"))
        for spec in node_kernels(g.targets[i], a_vals, float(g.flops[i]), int(g.work_bytes[i]), False):
            dims_b1 = None
            if ins2 is not None and ins2[i] is not None and spec.kind == GEMM:
                short = g.targets[i].split(".")[1]
                d1 = gemm_dims(short, ins2[i])
                dims_b1 = d1 + (0,) * (len(spec.dims) - 4) if d1 is not None else None
            node.append(i)
            kind.append(spec.kind)
            dims.append(spec.dims)
            bdim.append(batch_column(spec, dims_b1, scaled[i]))
            math.append(math_of(spec.inputs_dtype, spec.is_conv, precision))
            rnn.append(spec.kind == GEMM and rnn_layer[g.layer[i]])
    if not node:
        return KernelTable.empty()
    return KernelTable(node, kind, dims, bdim, math, rnn)
