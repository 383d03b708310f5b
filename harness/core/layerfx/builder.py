"""The layer-graph builder: trace a module (:mod:`harness.core.layerfx.tracer`), walk its fx graph in
order and turn each call into zero or one layer graph node (:mod:`harness.core.layerfx.classify` picks
the handler), giving a :class:`harness.core.layergraph.LayerGraph`."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.core.layerfx.classify import dispatch, fn_handler, module_handler, op_name
from harness.core.layerfx.common import (
    CONST,
    CallContext,
    ConstRef,
    InputLike,
    NodeSpec,
    ParamRef,
    Piece,
    TensorRef,
    Unsupported,
    as_input_spec,
    default_axes,
    dtype_name,
    norm_axis,
)
from harness.core.layerfx.elementwise import other_spec
from harness.core.layerfx.emit import GraphBuilder
from harness.core.layerfx.tracer import Tracing, quiet_fake_tensor_logs, resolve_attr, trace
from harness.core.layergraph import LayerGraph, LayerGraphError

if TYPE_CHECKING:
    import torch


def build_layer_graph(
    module: "torch.nn.Module",
    inputs: Sequence[InputLike] | Mapping[str, InputLike],
    *,
    name: str = "",
    batch_size: int | None = None,
    leaf_modules: tuple[type, ...] = (),
) -> LayerGraph:
    """Trace ``module`` at module level with ``torch.fx`` and build its :class:`LayerGraph`.

    ``inputs``: one spec per positional argument of ``forward`` (or a mapping from argument
    name to spec): ``(shape, dtype)`` with the batch dimension included (integer token inputs
    need ``torch.int64`` / ``"int64"``), ``(shape, dtype, axis names)``, a shape tuple (float32),
    an :class:`InputSpec`, or a tensor (only its shape and dtype are read). Forward arguments
    after those given keep their defaults (they are passed to fx as concrete arguments).

    The tracer is ``torch.fx.symbolic_trace``'s (standard ``torch.nn`` layers and
    ``leaf_modules`` are leaves) with every proxy carrying its value as a fake tensor
    (``FakeTensorMode``, fake copies of the parameters and buffers): nothing is allocated
    whatever the batch size, the module is not modified (BatchNorm statistics are untouched),
    and shape-dependent Python (``len(x.unbind(1))``, loops over time steps, ``x.shape[1]``)
    is specialised to the given shapes.

    Raises :class:`LayerGraphError` naming the model, the fx error and the submodule to mark
    as a leaf when tracing fails, or the node when shape propagation fails.
    """
    import inspect

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    model_name = name or type(module).__name__
    sig_params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if isinstance(inputs, Mapping):
        known = {p.name for p in sig_params}
        unknown = [k for k in inputs if k not in known]
        if unknown:
            raise LayerGraphError(f"model {model_name!r}: forward() has no argument(s) {unknown}; it takes {sorted(known)}")
        named = [(p.name, inputs[p.name]) for p in sig_params if p.name in inputs]
        if [k for k, _ in named] != [p.name for p in sig_params[: len(named)]]:
            raise LayerGraphError(f"model {model_name!r}: inputs must be the first arguments of forward(), in order")
    else:
        if len(inputs) > len(sig_params):
            raise LayerGraphError(f"model {model_name!r}: {len(inputs)} inputs given, forward() takes {len(sig_params)}")
        named = [(p.name, x) for p, x in zip(sig_params, inputs)]
    specs = [(k, as_input_spec(x, k)) for k, x in named]
    concrete: dict[str, Any] = {}
    for p in sig_params[len(specs):]:
        if p.default is inspect.Parameter.empty:
            raise LayerGraphError(f"model {model_name!r}: no input given for forward() argument {p.name!r}, which has no default")
        concrete[p.name] = p.default
    if batch_size is None:
        batch_size = specs[0][1].shape[0] if specs and specs[0][1].shape else None

    param_names: dict[int, str] = {}
    param_nbytes: dict[str, int] = {}
    for pname, p in module.named_parameters():
        param_names[id(p)] = pname
        param_nbytes[pname] = p.numel() * p.element_size()
    first_param = next(iter(module.parameters()), None)
    device = first_param.device if first_param is not None else torch.device("cpu")

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with quiet_fake_tensor_logs(), fake_mode:
        fake_inputs = {k: torch.empty(s.shape, dtype=getattr(torch, s.dtype), device=device) for k, s in specs}
        tracing = Tracing(module, fake_mode, fake_inputs, model_name, batch_size)
        gm = trace(module, model_name, tuple(leaf_modules), concrete, tracing)
        modules = dict(gm.named_modules())
        env = {n: tracing.value(n) for n in gm.graph.nodes if n.op != "output"}

        b = GraphBuilder(env, tracing.counted, modules, param_names, param_nbytes, batch_size)
        outputs: list[int] = []
        input_meta = []
        spec_by_name = dict(specs)
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                s = spec_by_name.get(n.target)
                val = env.get(n)
                if s is None or not isinstance(val, torch.Tensor):
                    b.refs[n] = None
                    continue
                axes = s.axes or default_axes(len(s.shape), not val.is_floating_point())
                if len(axes) != len(s.shape) or len(set(axes)) != len(axes) or not all(axes):
                    raise LayerGraphError(f"input {n.target!r}: axis names {axes} must be {len(s.shape)} distinct non-empty names")
                axes = tuple(axes)
                spec = NodeSpec("input", dict(zip(axes, s.shape)), axes, axes, axes, [])
                b.refs[n] = b.emit(n.name, spec, [], set(), val)
                input_meta.append({"name": n.target, "shape": list(s.shape), "dtype": s.dtype, "axes": list(axes)})
            elif n.op == "get_attr":
                val = env.get(n)
                pname = param_names.get(id(resolve_attr(gm, n.target)))
                if pname is not None:
                    b.refs[n] = ParamRef(frozenset([pname]))
                else:
                    b.refs[n] = CONST if isinstance(val, torch.Tensor) else None
            elif n.op == "output":
                for r in b.ref_leaves(_map_refs(b, n.args[0])):
                    if isinstance(r, TensorRef) and r.node not in outputs:
                        outputs.append(r.node)
            else:
                _build_call(b, n)

    dtype = next((t.dtype for t in module.parameters() if t.is_floating_point()), None)
    if dtype is None:
        dtype = next((getattr(torch, s.dtype) for _, s in specs if getattr(torch, s.dtype).is_floating_point), torch.float32)
    meta = {
        "model": model_name,
        "batch_size": batch_size,
        "dtype": dtype_name(dtype),
        "inputs": input_meta,
        "outputs": outputs,
        "leaf_modules": sorted(t.__name__ for t in leaf_modules),
        "builder": "torch.fx module-level trace + FakeTensorMode",
        "torch": torch.__version__.split("+")[0],
    }
    if b.edges:
        src, dst, nb, dp, sp = (np.asarray(c) for c in zip(*b.edges))
    else:
        src = dst = nb = dp = sp = np.zeros(0, dtype=np.int64)
    return LayerGraph(
        names=b.names, kinds=b.kinds, dims=b.dims, parallel_dims=b.parallel, flops_fwd=np.asarray(b.ff),
        flops_bwd=np.asarray(b.fb), param_bytes=np.asarray(b.pbytes, dtype=np.int64), out_shape=b.out_shape,
        out_bytes=np.asarray(b.out_bytes, dtype=np.int64), out_dims=b.out_dims, in_dims=b.in_dims, attrs=b.attrs,
        src=src, dst=dst, nbytes=nb, dst_port=dp, src_port=sp, meta=meta,
    )


def _map_refs(b: GraphBuilder, a: Any) -> Any:
    import torch.fx as fx

    if isinstance(a, fx.Node):
        return b.ref_of(a)
    if isinstance(a, (list, tuple)):
        return [_map_refs(b, x) for x in a]
    if isinstance(a, dict):
        return [_map_refs(b, x) for x in a.values()]
    return None


def _select(b: GraphBuilder, n: Any) -> bool:
    """``getitem`` / ``getattr`` picking one element of a multi-output value: no node, just a ref.

    Returns True when ``n`` was such a selection (``lstm_out[0]``, ``x.max(1).values``, a chunk
    piece); pieces are not materialised here, only when something reads them.
    """
    import torch.fx as fx

    if n.op != "call_function" or n.target not in (operator.getitem, getattr) or not isinstance(n.args[0], fx.Node):
        return False
    src_ref = b.refs.get(n.args[0])
    if isinstance(src_ref, dict):  # model outputs as dicts: out["logits"]
        b.refs[n] = src_ref.get(n.args[1]) if n.target is operator.getitem else None
        return True
    if not isinstance(src_ref, (list, tuple)):
        if isinstance(src_ref, (ParamRef, ConstRef)):  # indexing a parameter or a constant
            b.refs[n] = src_ref if any(True for _ in b.tensors_in(b.env[n])) else None
            return True
        return False
    src_val = b.env[n.args[0]]
    val = b.env[n]
    pos = next((k for k, x in enumerate(src_val) if x is val), None)
    if pos is None and n.target is operator.getitem and isinstance(n.args[1], int):
        pos = n.args[1]
    b.refs[n] = src_ref[pos] if pos is not None and pos < len(src_ref) else None
    return True


def _build_call(b: GraphBuilder, n: Any) -> None:
    """Turn one call_module / call_function / call_method fx node into zero or one layer graph node."""
    import torch

    if _select(b, n):
        return
    value = b.env[n]
    if not any(True for _ in b.tensors_in(value)):
        b.refs[n] = None  # sizes, dtypes, devices: not data
        return
    arg_refs = list(b.ref_leaves(_map_refs(b, (n.args, n.kwargs))))
    live = [r for r in arg_refs if isinstance(r, TensorRef)]
    params: set[str] = set()
    for r in arg_refs:
        if isinstance(r, ParamRef):
            params |= r.names
    module = b.modules.get(n.target) if n.op == "call_module" else None
    own_params = {b.param_names[id(p)] for p in module.parameters() if id(p) in b.param_names} if module is not None else set()
    if not live and not own_params:
        b.refs[n] = ParamRef(frozenset(params)) if params else CONST
        return

    if module is not None:
        key, extra = module_handler(module)
        op = type(module).__name__
    else:
        op = op_name(n)
        key, extra = fn_handler(op, sum(1 for _ in b.tensors_in(b.value_of((n.args, n.kwargs)))))
    if key == "const":
        b.refs[n] = CONST
        return
    ctx = b.context(n, op, module)
    if key == "elementwise" and op.startswith("dropout") and ctx.arg(1, "p", 0.5) == 0:
        key = "alias"
    if key == "cast" and ctx.out is not None and ctx.operands and ctx.out.dtype == ctx.operands[0][1].dtype:
        key = "alias"  # .float() of a float tensor, .to(same dtype): the same tensor
    if key == "alias" and isinstance(value, torch.Tensor) and ctx.operands and isinstance(ctx.operands[0][0], TensorRef) \
            and tuple(value.shape) == ctx.operands[0][0].shape:
        b.refs[n] = ctx.operands[0][0]
        return
    if key == "pieces":
        b.refs[n] = _pieces(n, ctx)
        return
    try:
        spec = dispatch(ctx, key, extra)
    except (Unsupported, AttributeError, TypeError, ValueError, IndexError, KeyError):
        spec = None
    if spec is None:
        flops = b.counted[n] if n in b.counted else _count_flops(ctx)
        spec = other_spec(ctx, flops, "loss" if key == "loss" else "other")
    if module is not None:
        calls = b.module_calls.get(n.target, 0)
        b.module_calls[n.target] = calls + 1
        node_name = n.target if calls == 0 else f"{n.target}@{calls}"
        spec.attrs.setdefault("module", n.target)
        spec.attrs.setdefault("type", type(module).__name__)
    else:
        node_name = n.name
    b.refs[n] = b.emit(node_name, spec, ctx.operands, params | own_params, value)


def _count_flops(ctx: CallContext) -> float:
    """FLOPs of a call the builder had to fall back on, re-run under FlopCounterMode (fake tensors)."""
    from torch.utils.flop_counter import FlopCounterMode

    node = ctx.node
    try:
        with FlopCounterMode(display=False) as fc:
            if node.op == "call_function":
                node.target(*ctx.args, **ctx.kwargs)
            elif node.op == "call_method":
                getattr(ctx.args[0], node.target)(*ctx.args[1:], **ctx.kwargs)
            else:
                return 0.0
        return float(fc.get_total_flops())
    except Exception:
        return 0.0


def _pieces(n: Any, ctx: CallContext) -> Any:
    """chunk / split / unbind of a layer's output: lazy pieces, each a view node once read."""
    src = ctx.operands[0][0]
    if not isinstance(src, TensorRef):
        return CONST
    rank = len(src.shape)
    dim = ctx.kwargs.get("dim")
    if dim is None:
        pos = 1 if ctx.op == "unbind" else 2
        dim = ctx.args[pos] if len(ctx.args) > pos else 0
    axis = norm_axis(int(dim), rank)
    squeeze = ctx.op == "unbind"
    pieces = []
    start = 0
    for i, t in enumerate(ctx.value):
        size = 1 if squeeze else int(t.shape[axis])
        pieces.append(Piece(src, axis, start, start + size, squeeze, f"{n.name}[{i}]"))
        start += size
    return tuple(pieces)
