"""Capture the joint forward + backward (+ update) aten graph of one training step.

The step ``loss = L(model(x), y); grads = autograd.grad(loss, params); p' = p - lr * g``
is traced with ``make_fx`` on fake tensors built from a ``meta``-device model, so a
ResNet-50 at batch 512 costs no memory.  Each fx ``call_function`` node becomes an
:class:`~harness.core.graph.OpGraph` node:

* FLOPs from PyTorch's FLOP formulas (the table ``FlopCounterMode`` uses, called on the
  node's fake inputs), a convolution's from its kernels (the formula counts a grouped
  convolution's weight gradient ``groups`` times); ops without a formula get 0 FLOPs and
  are costed by bytes moved.
* views, ``getitem`` and ``detach`` (``OpOverload.is_view``) are ``free``: no kernel, no time.
* phase and owning layer come from module hooks that annotate the nodes as they are
  traced: forward hooks for the forward pass, pre-hooks on the autograd nodes each module
  created for the backward pass.
* the batch role (batched / partial / replicated) comes from a second run of the step at
  batch size B+1 (a cheap dispatch-level probe, matched op for op with the trace): a node
  whose output shape changes is batched (and the axis that changed is its ``batch axis``);
  a node that depends on the data but whose shape does not change is a partial result (a
  weight gradient, the loss).
* co-location groups: each parameter's update op with the views that read the parameter
  and the op that produces its gradient (union-find across parameters that share one).
* edges carry the bytes of the tensors the consumer reads; shape-only consumers
  (``ones_like``, ``zeros_like``, ...) read no data and get no edge.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from harness.core.errors import UserError
from harness.core.graph import BACKWARD, BATCHED, FORWARD, PARTIAL, REPLICATED, UPDATE, GraphError, OpGraph, edges_from_pairs
from harness.core.graph_rewrites import coarsen_runs, parameter_groups
from harness.core.kernels import CONV_KINDS, GEMM, GEMM_TARGETS, KernelTable, batch_column, gemm_dims, is_rnn_layer, node_kernels
from harness.core.precision import LOSS_SCALE, Precision, cuda_autocast, math_of

#: consumers that read only the shape of an input
SHAPE_ONLY = {"ones_like", "zeros_like", "empty_like", "full_like", "new_zeros", "new_ones", "new_empty", "new_full", "sym_size", "sym_numel", "sym_stride"}
#: ops that allocate without running a kernel
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


class CaptureError(UserError, RuntimeError):
    """The model could not be traced; the message names the model and the op or layer."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One per-sample input or target: ``shape`` excludes the batch dim."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None  # exclusive upper bound for integer tensors

    @classmethod
    def from_cfg(cls, d: Mapping[str, Any]) -> "TensorSpec":
        return cls(tuple(int(s) for s in d.get("shape", ())), str(d.get("dtype", "float32")), None if d.get("high") is None else int(d["high"]))


def _loss_fn(name: str) -> Callable[[Any, Any], Any]:
    import torch.nn.functional as F

    if name == "cross_entropy":
        return lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    if name == "mse":
        return lambda out, y: F.mse_loss(out, y)
    raise CaptureError(f"unknown loss {name!r}: use cross_entropy or mse")


def _target_name(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    return str(target)


def _tensors(val: Any) -> list[Any]:
    import torch

    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    return []


def _nbytes(t: Any) -> int:
    return int(t.numel()) * t.element_size()


def _arg_nodes(node: Any) -> list[Any]:
    import torch.fx as fx

    out: list[Any] = []
    fx.node.map_arg((node.args, node.kwargs), lambda a: out.append(a))
    return out


class _Annotator:
    """Module hooks that tag traced nodes with (layer, phase) through fx's preserved meta."""

    def __init__(self, module: Any) -> None:
        import torch

        self.paths = {id(m): (name or "model") for name, m in module.named_modules()}
        self.stack: list[str] = []
        self.claimed: set[Any] = set()
        self.handles: list[Any] = []
        self.torch = torch

    def _set(self, layer: str, phase: str) -> None:
        import torch.fx.traceback as fxt

        fxt.get_current_meta()["custom"] = {"layer": layer, "phase": phase}

    def __enter__(self) -> "_Annotator":
        from torch.nn.modules import module as modmod

        def pre(mod: Any, args: Any) -> None:
            path = self.paths.get(id(mod))
            if path is not None:
                self.stack.append(path)
                self._set(path, "forward")

        def post(mod: Any, args: Any, out: Any) -> None:
            path = self.paths.get(id(mod))
            if path is None:
                return
            self.stack.pop()
            self._claim(out, path)
            self._set(self.stack[-1] if self.stack else "loss", "forward")

        self.handles = [modmod.register_module_forward_pre_hook(pre), modmod.register_module_forward_hook(post)]
        return self

    def _claim(self, out: Any, path: str) -> None:
        """Tag the autograd nodes this module created so its backward ops carry its path."""
        todo = [t.grad_fn for t in _tensors(out) if getattr(t, "grad_fn", None) is not None]
        while todo:
            fn = todo.pop()
            if fn is None or fn in self.claimed:
                continue
            self.claimed.add(fn)

            def hook(grad_outputs: Any, _path: str = path) -> None:
                self._set(_path, "backward")

            fn.register_prehook(hook)
            todo.extend(nf for nf, _ in fn.next_functions if nf is not None)

    def claim_rest(self, out: Any, path: str) -> None:
        self._claim(out, path)

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()


def _make_step(module: Any, loss: str, lr: float, optimizer: str, ann: "_Annotator | None",
               precision: Precision = Precision()) -> Callable[..., Any]:
    """The function one training step is traced from: forward, loss, autograd.grad, SGD update.

    Under AMP the forward pass and the loss run under CUDA autocast's rules
    (:func:`harness.core.precision.cuda_autocast`); ``amp_fp16`` also scales the loss before the
    backward pass and unscales each gradient before its update (``GradScaler``)."""
    import torch

    loss_fn = _loss_fn(loss)
    set_meta = ann._set if ann is not None else (lambda layer, phase: None)
    amp = precision.autocast_dtype

    def forward(ps: dict[str, Any], buffers: dict[str, Any], xs: list[Any], y: Any) -> tuple[Any, Any]:
        if ann is not None:
            with ann:
                out = torch.func.functional_call(module, {**ps, **buffers}, tuple(xs))
        else:
            out = torch.func.functional_call(module, {**ps, **buffers}, tuple(xs))
        set_meta("loss", "forward")
        return out, loss_fn(out, y)

    def step(params: dict[str, Any], buffers: dict[str, Any], xs: list[Any], y: Any) -> Any:
        ps = {k: v.requires_grad_(True) if v.is_floating_point() else v for k, v in params.items()}
        if amp is not None:
            with cuda_autocast(amp):
                out, lval = forward(ps, buffers, xs, y)
        else:
            out, lval = forward(ps, buffers, xs, y)
        if ann is not None:
            ann.claim_rest(lval, "loss")
        set_meta("loss", "backward")
        scaled = lval * LOSS_SCALE if precision.loss_scaling else lval
        grads = torch.autograd.grad(scaled, list(ps.values()))
        new, unscaled = [], []
        with torch.no_grad():
            for (name, p), g in zip(ps.items(), grads):
                set_meta(name.rsplit(".", 1)[0] if "." in name else "model", "update")
                if precision.loss_scaling:
                    g = g.mul(1.0 / LOSS_SCALE)
                unscaled.append(g)
                new.append(p.add(g, alpha=-lr) if optimizer == "sgd" else p)
        return lval, unscaled, new

    return step


def _example_inputs(inputs: Sequence[TensorSpec], target: TensorSpec, batch: int, device: str = "meta",
                    float_dtype: str = "float32") -> tuple[list[Any], Any]:
    """Empty inputs and target of one batch; floating inputs in ``float_dtype`` (``fp16``/``bf16``
    precision feeds the model half-precision data)."""
    import torch

    def make(spec: TensorSpec) -> Any:
        dtype = getattr(torch, spec.dtype)
        if dtype.is_floating_point:
            dtype = getattr(torch, float_dtype)
        return torch.empty((batch, *spec.shape), dtype=dtype, device=device)

    return [make(s) for s in inputs], make(target)


def _fake_state(module: Any, inputs: Sequence[TensorSpec], target: TensorSpec, batch: int, precision: Precision) -> tuple[Any, ...]:
    """(fake mode, params, buffers, inputs, target) as fake CPU tensors: what CPU autocast needs
    (meta tensors carry no autocast dispatch key)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    fm = FakeTensorMode()
    with fm:
        params = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in module.named_parameters()}
        buffers = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in module.named_buffers()}
        xs, y = _example_inputs(inputs, target, batch, "cpu", precision.param_dtype)
    return fm, params, buffers, xs, y


def _decompositions(decompose: bool) -> Any:
    if not decompose:
        return None
    from torch._decomp import core_aten_decompositions

    return core_aten_decompositions()


def _trace(module: Any, inputs: Sequence[TensorSpec], target: TensorSpec, loss: str, batch: int, lr: float, optimizer: str,
           decompose: bool, precision: Precision = Precision()) -> tuple[Any, dict[str, Any]]:
    """make_fx of one training step on fake tensors: from the ``meta`` module as it is, or, under
    AMP, from fake CPU tensors so that autocast applies (see :func:`_fake_state`)."""
    import torch.fx.traceback as fxt
    from torch.fx.experimental.proxy_tensor import make_fx

    step = _make_step(module, loss, lr, optimizer, _Annotator(module), precision)
    decomp = _decompositions(decompose)
    if precision.autocast_dtype is None:
        params = dict(module.named_parameters())
        buffers = dict(module.named_buffers())
        xs, y = _example_inputs(inputs, target, batch, float_dtype=precision.param_dtype)
        with fxt.preserve_node_meta():
            gm = make_fx(step, tracing_mode="fake", decomposition_table=decomp)(params, buffers, xs, y)
    else:
        fm, params, buffers, xs, y = _fake_state(module, inputs, target, batch, precision)
        with fxt.preserve_node_meta(), fm:
            gm = make_fx(step, tracing_mode="real", decomposition_table=decomp)(params, buffers, xs, y)
    info = {"param_names": list(params), "buffer_names": list(buffers), "n_inputs": len(xs)}
    return gm, info


#: a probe record: (aten op, output shapes, input tensor shapes of a GEMM op else None)
ProbeRecord = tuple[str, list[list[int]], "list[list[int]] | None"]


def _probe(module: Any, inputs: Sequence[TensorSpec], target: TensorSpec, loss: str, batch: int, lr: float, optimizer: str,
           decompose: bool, precision: Precision = Precision()) -> list[ProbeRecord]:
    """Run the step at another batch size on fake tensors, recording (op, output shapes, GEMM
    input shapes) in dispatch order.  It sees the ops ``make_fx`` records, in the same order,
    at a fraction of the cost (no proxies, no fx nodes); decompositions are applied the way
    make_fx does."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import autograd_would_have_decomposed
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    table = _decompositions(decompose) or {}
    records: list[ProbeRecord] = []
    skip = {torch.ops.aten.size.default, torch.ops.aten.stride.default, torch.ops.aten.storage_offset.default}

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if getattr(func, "namespace", "") != "aten":  # prim.device and friends: not graph nodes
                return func(*args, **kwargs)
            if func in table:
                with self:
                    r = table[func](*args, **kwargs)
                    if r is not NotImplemented:
                        return r
            if func not in skip and autograd_would_have_decomposed(func, tree_flatten((args, kwargs))[0]):
                with self:
                    r = func.decompose(*args, **kwargs)
                    if r is not NotImplemented:
                        return r
            out = func(*args, **kwargs)
            name = str(func)
            ins = [list(a.shape) for a in args if isinstance(a, torch.Tensor)] if name in GEMM_TARGETS else None
            records.append((name, [list(t.shape) for t in _tensors(out)], ins))
            return out

    step = _make_step(module, loss, lr, optimizer, None, precision)
    if precision.autocast_dtype is None:
        with FakeTensorMode(allow_non_fake_inputs=True) as fm:
            params = {k: fm.from_tensor(v) for k, v in module.named_parameters()}
            buffers = {k: fm.from_tensor(v) for k, v in module.named_buffers()}
            xs, y = _example_inputs(inputs, target, batch, float_dtype=precision.param_dtype)
            xs, y = [fm.from_tensor(x) for x in xs], fm.from_tensor(y)
            with Recorder():
                step(params, buffers, xs, y)
    else:
        fm, params, buffers, xs, y = _fake_state(module, inputs, target, batch, precision)
        with fm, Recorder():
            step(params, buffers, xs, y)
    return records


def _align_probe(ops: list[Any], records: list[ProbeRecord]) -> tuple[list[list[list[int]]], list[Any]] | None:
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
            flat_index = sum(len(_tensors(v)) for v in val[: n.args[1]]) if isinstance(val, (list, tuple)) else 0
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


def capture(
    module_factory: Callable[[], Any],
    inputs: Sequence[TensorSpec],
    target: TensorSpec,
    loss: str = "cross_entropy",
    batch_size: int = 32,
    *,
    name: str = "model",
    granularity: str = "aten",
    optimizer: str = "sgd",
    lr: float = 0.01,
    batch_probe: bool = True,
    keep_fx: bool = False,
    precision: str = "fp32",
) -> OpGraph:
    """Trace one training step of ``module_factory()`` into an :class:`OpGraph`.

    ``granularity`` is ``aten`` (as traced), ``core_aten`` (through PyTorch's core-aten
    decompositions, more and smaller ops) or ``layer`` (maximal runs of consecutive nodes
    of one module and phase contracted into one node; contracting intervals of a
    topological order keeps the graph a DAG).  ``precision`` is one of
    :data:`harness.core.precision.PRECISIONS`: the dtypes the step runs in and the math mode its
    kernels record (``graph.kernels``).
    """
    import torch

    prec = Precision(precision)

    if granularity not in ("aten", "core_aten", "layer"):
        raise CaptureError(f"unknown granularity {granularity!r}: use aten, core_aten or layer")
    if optimizer not in ("sgd", "none"):
        raise CaptureError(f"unknown optimizer {optimizer!r}: use sgd or none")
    if batch_size < 1:
        raise CaptureError(f"batch size must be >= 1, got {batch_size}")
    with torch.device("meta"):
        try:
            module = module_factory()
        except CaptureError:
            raise
        except Exception as e:  # noqa: BLE001 - report which model failed to build
            raise CaptureError(f"could not build model {name!r}: {type(e).__name__}: {e}") from e
        if prec.param_dtype != "float32":
            module = module.to(getattr(torch, prec.param_dtype))
    decompose = granularity == "core_aten"
    try:
        gm, info = _trace(module, inputs, target, loss, batch_size, lr, optimizer, decompose, prec)
        probe = _probe(module, inputs, target, loss, batch_size + 1, lr, optimizer, decompose, prec) if batch_probe else None
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001
        raise CaptureError(f"could not trace a training step of {name!r}: {type(e).__name__}: {e}") from e
    layer_types = {(path or "model"): type(m).__name__ for path, m in module.named_modules()}
    g = _to_opgraph(gm, probe, info, batch_size, name, optimizer, prec, layer_types)
    if keep_fx:
        g.fx = gm
    if granularity == "layer":
        g = coarsen_runs(g)
    g.meta.update({"granularity": granularity, "optimizer": optimizer, "lr": lr, "precision": prec.name})
    return g


def _to_opgraph(gm: Any, probe: list[ProbeRecord] | None, info: dict[str, Any], batch: int, name: str, optimizer: str,
                precision: Precision = Precision(), layer_types: dict[str, str] | None = None) -> OpGraph:
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
    aligned = _align_probe(ops, probe) if probe is not None else None
    shapes2, ins2 = aligned if aligned is not None else (None, None)
    N = len(ops)
    names, targets, layers, phase = [], [], [], np.zeros(N, np.int8)
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
        outs = _tensors(n.meta.get("val"))
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
                in_bytes += sum(_nbytes(t) for t in _tensors(a.meta.get("val")))
            if a in idx:
                j = idx[a]
                if short in SHAPE_ONLY:
                    continue
                data_dep[i] |= data_dep[j]
                src_val = a.meta.get("val")
                if n.target is operator.getitem and isinstance(src_val, (list, tuple)):
                    b = sum(_nbytes(t) for t in _tensors(src_val[n.args[1]]))
                else:
                    b = sum(_nbytes(t) for t in _tensors(src_val))
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
    try:
        g = OpGraph(
            names=names, targets=targets, phase=phase, layer=lay, layer_names=list(layer_ids), flops=flops,
            out_bytes=out_b, work_bytes=work_b, free=free, batch_role=role, coloc=coloc, src=src, dst=dst, nbytes=nb,
            param_names=pnames, param_bytes=pbytes, param_ptr=p_ptr, param_idx=p_idx, grad_node=grad_node,
            update_node=update_node, out_shapes=shapes, out_dtypes=dtypes, meta=meta,
        )
    except GraphError as e:
        raise CaptureError(f"captured graph of {name!r} is malformed: {e}") from e
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
