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

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from harness.core.errors import UserError
from harness.core.fx_graph import ProbeRecord, tensors_of, to_opgraph
from harness.core.graph import GraphError, OpGraph
from harness.core.graph_rewrites import coarsen_runs
from harness.core.kernels import GEMM_TARGETS
from harness.core.precision import LOSS_SCALE, Precision, cuda_autocast, fp8_scope

#: ``graph.granularity``: as traced, through the core-aten decompositions, or runs of one module contracted
GRANULARITIES: tuple[str, ...] = ("aten", "core_aten", "layer")
#: ``graph.optimizer``: an SGD update after the backward pass, or no update ops
OPTIMIZERS: tuple[str, ...] = ("sgd", "none")


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
        todo = [t.grad_fn for t in tensors_of(out) if getattr(t, "grad_fn", None) is not None]
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
    backward pass and unscales each gradient before its update (``GradScaler``).  Under
    ``fp16_master`` the step first casts the FP32 master weights into the FP16 model (but batch
    norm's), runs the model in FP16 and the loss on FP32 logits, and scales the loss; the
    gradients reach the masters through the casts' backward (the FP16 -> FP32 copy, into which
    apex folds the unscaling: no separate unscale kernel)."""
    import torch

    loss_fn = _loss_fn(loss)
    set_meta = ann._set if ann is not None else (lambda layer, phase: None)
    amp = precision.autocast_dtype
    model_dtype = getattr(torch, precision.model_dtype)
    fp32_params = _batch_norm_params(module) if precision.master_copy else set()

    def to_float(t: Any) -> Any:
        return t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    def forward(ps: dict[str, Any], buffers: dict[str, Any], xs: list[Any], y: Any) -> tuple[Any, Any]:
        if ann is not None:
            with ann:
                out = torch.func.functional_call(module, {**ps, **buffers}, tuple(xs))
        else:
            out = torch.func.functional_call(module, {**ps, **buffers}, tuple(xs))
        set_meta("loss", "forward")
        if precision.master_copy:  # the loss on FP32 logits (fairseq's and GNMT's log_softmax(..., dtype=float32))
            return out, loss_fn(to_float(out), to_float(y))
        return out, loss_fn(out, y)

    def model_copy(ps: dict[str, Any]) -> dict[str, Any]:
        """The FP16 model's weights from the FP32 masters (``fp16_master``), each cast in its layer."""
        out = {}
        for name, p in ps.items():
            if p.is_floating_point() and name not in fp32_params:
                set_meta(name.rsplit(".", 1)[0] if "." in name else "model", "forward")
                p = p.to(model_dtype)
            out[name] = p
        return out

    def step(params: dict[str, Any], buffers: dict[str, Any], xs: list[Any], y: Any) -> Any:
        ps = {k: v.requires_grad_(True) if v.is_floating_point() else v for k, v in params.items()}
        if amp is not None:
            with cuda_autocast(amp):
                out, lval = forward(ps, buffers, xs, y)
        elif precision.master_copy:
            out, lval = forward(model_copy(ps), buffers, xs, y)
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
                if precision.loss_scaling and not precision.master_copy:
                    g = g.mul(1.0 / LOSS_SCALE)
                unscaled.append(g)
                new.append(p.add(g, alpha=-lr) if optimizer == "sgd" else p)
        return lval, unscaled, new

    return step


def _batch_norm_params(module: Any) -> set[str]:
    """Names of the parameters of the module's batch norms (apex O2's ``keep_batchnorm_fp32``)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return {f"{path}.{name}" if path else name for path, m in module.named_modules() if isinstance(m, _BatchNorm)
            for name, _ in m.named_parameters(recurse=False)}


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
        xs, y = _example_inputs(inputs, target, batch, "cpu", precision.model_dtype)
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
        xs, y = _example_inputs(inputs, target, batch, float_dtype=precision.model_dtype)
        with fxt.preserve_node_meta():
            gm = make_fx(step, tracing_mode="fake", decomposition_table=decomp)(params, buffers, xs, y)
    else:
        fm, params, buffers, xs, y = _fake_state(module, inputs, target, batch, precision)
        with fxt.preserve_node_meta(), fm:
            gm = make_fx(step, tracing_mode="real", decomposition_table=decomp)(params, buffers, xs, y)
    info = {"param_names": list(params), "buffer_names": list(buffers), "n_inputs": len(xs)}
    return gm, info


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
            records.append((name, [list(t.shape) for t in tensors_of(out)], ins))
            return out

    step = _make_step(module, loss, lr, optimizer, None, precision)
    if precision.autocast_dtype is None:
        with FakeTensorMode(allow_non_fake_inputs=True) as fm:
            params = {k: fm.from_tensor(v) for k, v in module.named_parameters()}
            buffers = {k: fm.from_tensor(v) for k, v in module.named_buffers()}
            xs, y = _example_inputs(inputs, target, batch, float_dtype=precision.model_dtype)
            xs, y = [fm.from_tensor(x) for x in xs], fm.from_tensor(y)
            with Recorder():
                step(params, buffers, xs, y)
    else:
        fm, params, buffers, xs, y = _fake_state(module, inputs, target, batch, precision)
        with fm, Recorder():
            step(params, buffers, xs, y)
    return records




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
    if prec.fp8_linears:
        raise CaptureError(fp8_scope(name))
    if granularity not in GRANULARITIES:
        raise CaptureError(f"unknown granularity {granularity!r}: use aten, core_aten or layer")
    if optimizer not in OPTIMIZERS:
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
    try:
        g = to_opgraph(gm, probe, info, batch_size, name, optimizer, prec, layer_types)
    except GraphError as e:
        raise CaptureError(f"captured graph of {name!r} is malformed: {e}") from e
    if keep_fx:
        g.fx = gm
    if granularity == "layer":
        g = coarsen_runs(g)
    g.meta.update({"granularity": granularity, "optimizer": optimizer, "lr": lr, "precision": prec.name})
    return g


