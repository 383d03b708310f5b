"""Tracing: ``torch.fx``'s module-level tracer whose proxies carry fake-tensor values, so shapes are
concrete while tracing (shape-dependent Python specialises, loops over time steps unroll), and the
shape propagation that computes those values (FLOPs of ops the builder does not know measured on the
way)."""

from __future__ import annotations

import contextlib
from typing import Any

from harness.core.layerfx.classify import fn_handler, module_handler, op_name
from harness.core.layergraph import LayerGraphError


class Tracing:
    """State of one shape-specialised trace: fake parameters, fake inputs, FLOPs of unknown ops."""

    def __init__(self, root: Any, fake_mode: Any, inputs: dict[str, Any], model_name: str, batch_size: int | None) -> None:
        self.root = root
        self.batch_size = batch_size
        self.fake_mode = fake_mode
        self.inputs = inputs
        self.model_name = model_name
        self.state = {k: fake_mode.from_tensor(v) for k, v in
                      list(root.named_parameters(remove_duplicate=False)) + list(root.named_buffers(remove_duplicate=False))}
        self.constants: dict[int, Any] = {}
        self.counted: dict[Any, float] = {}

    def value(self, node: Any) -> Any:
        """The fake value of an fx node (computed on first use: get_attr nodes fx makes for constants)."""
        if "val" not in node.meta:
            node.meta["val"] = self.compute(node)
        return node.meta["val"]

    def compute(self, node: Any) -> Any:
        import torch
        import torch.fx as fx
        from torch.utils.flop_counter import FlopCounterMode

        if node.op == "placeholder":
            return self.inputs.get(node.target, node.args[0] if node.args else None)
        if node.op == "get_attr":
            if node.target in self.state:
                return self.state[node.target]
            # constants fx made from tensors created in forward live on the root while tracing,
            # on the GraphModule after
            obj = resolve_attr(node.graph.owning_module or self.root, node.target)
            if isinstance(obj, torch.Tensor) and not isinstance(obj, torch._subclasses.fake_tensor.FakeTensor):
                if id(obj) not in self.constants:
                    self.constants[id(obj)] = self.fake_mode.from_tensor(obj)
                return self.constants[id(obj)]
            return obj
        # while fx traces, nn.Module.__call__ / __getattr__ are patched to record nodes; the
        # values are computed with the patches lifted so that leaf modules really run (on fakes)
        from torch.fx._symbolic_trace import _maybe_revert_all_patches

        args = fx.node.map_aggregate(node.args, lambda a: self.value(a) if isinstance(a, fx.Node) else a)
        kwargs = fx.node.map_aggregate(node.kwargs, lambda a: self.value(a) if isinstance(a, fx.Node) else a)
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

        count = _needs_count(node, self.root)
        try:
            with _maybe_revert_all_patches(), (FlopCounterMode(display=False) if count else contextlib.nullcontext()) as fc:
                try:
                    out, scale = self._run(node, args, kwargs), 1
                except (DataDependentOutputException, DynamicOutputShapeException):
                    if node.op != "call_module":
                        raise
                    out, scale = self._run_real(node, args, kwargs)
            if count:
                self.counted[node] = float(fc.get_total_flops()) * scale
            return out
        except Exception as err:
            msg = str(err).split("\n\nWhile executing")[0].strip()
            raise LayerGraphError(
                f"model {self.model_name!r}: shape propagation failed at {node.op} {_target_name(node)!r} "
                f"(fx node {node.name}): {type(err).__name__}: {msg}"
            ) from err

    def _run(self, node: Any, args: Any, kwargs: Any) -> Any:
        import torch

        if node.op == "call_function":
            return node.target(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        if node.op == "call_module":
            mod = self.root.get_submodule(node.target)
            prefix = node.target + "."
            sub = {k[len(prefix):]: v for k, v in self.state.items() if k.startswith(prefix)}
            if not sub:
                return mod(*args, **kwargs)
            # the leaf runs on fake copies of its own parameters and buffers: the user's module
            # is never touched (BatchNorm running statistics stay as they are)
            return torch.func.functional_call(mod, sub, tuple(args), kwargs, tie_weights=True, strict=False)
        raise LayerGraphError(f"unexpected fx node {node.op}")

    def _run_real(self, node: Any, args: Any, kwargs: Any) -> tuple[Any, int]:
        """Run a leaf module whose Python reads tensor values (``if x.sum() > 0``), which fake
        tensors cannot answer, once on real zeros with batch 1; outputs get the batch back.

        Returns the (fake) outputs and the factor to scale its measured FLOPs by.
        """
        import torch
        import torch.fx as fx
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        batch = self.batch_size or 1

        def shrink(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                shape = list(v.shape)
                if shape and shape[0] == batch:
                    shape[0] = 1
                return torch.zeros(shape, dtype=v.dtype)
            return v

        mod = self.root.get_submodule(node.target)
        with unset_fake_temporarily():
            real_args = fx.node.map_aggregate(args, shrink)
            real_kwargs = fx.node.map_aggregate(kwargs, shrink)
            buffers = {k: v.clone() for k, v in mod.named_buffers()}  # leave running statistics alone
            with torch.no_grad():
                out = torch.func.functional_call(mod, buffers, tuple(real_args), real_kwargs, strict=False)

        def grow(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                shape = list(v.shape)
                if shape and shape[0] == 1 and batch != 1:
                    shape[0] = batch
                return torch.empty(shape, dtype=v.dtype)
            return v

        return fx.node.map_aggregate(out, grow), batch


def _target_name(node: Any) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__qualname__", getattr(t, "__name__", str(t)))


def _needs_count(node: Any, root: Any) -> bool:
    """Whether the builder will not know this call, so its FLOPs are measured while tracing."""
    if node.op == "call_module":
        return module_handler(root.get_submodule(node.target))[0] in ("other", "loss")
    if node.op in ("call_function", "call_method"):
        return fn_handler(op_name(node), 2)[0] == "other"
    return False


def _tracer_class(extra_leaves: tuple[type, ...]) -> type:
    """``torch.fx.Tracer`` (module level, standard torch.nn leaves) whose proxies carry fake values.

    Shape specialisation: ``x.shape``, ``x.size()``, ``x.dim()``, ``len(x)``, iterating a
    tensor or a tuple (``for x_t in x.unbind(1)``) and ``bool`` of a non-tensor value (``if
    x.shape[1] > 1``) are answered from the fake values, so Python loops over time steps and
    shape arithmetic trace (they unroll for the given input shapes). ``bool`` of a tensor
    (``if x.sum() > 0``) is data-dependent control flow and still fails, as in symbolic_trace.
    """
    import torch
    import torch.fx as fx

    class _ValueProxy(fx.Proxy):
        def _val(self) -> Any:
            tracing = getattr(self.tracer, "tracing", None)
            return tracing.value(self.node) if tracing is not None else None

        @property
        def shape(self) -> Any:
            v = self._val()
            return v.shape if isinstance(v, torch.Tensor) else self.__getattr__("shape")

        def size(self, dim: int | None = None) -> Any:
            v = self._val()
            if isinstance(v, torch.Tensor):
                return v.size() if dim is None else v.size(dim)
            return self.__getattr__("size")() if dim is None else self.__getattr__("size")(dim)

        def dim(self) -> Any:
            v = self._val()
            return v.dim() if isinstance(v, torch.Tensor) else self.__getattr__("dim")()

        @property
        def ndim(self) -> Any:
            v = self._val()
            return v.dim() if isinstance(v, torch.Tensor) else self.__getattr__("ndim")

        def numel(self) -> Any:
            v = self._val()
            return v.numel() if isinstance(v, torch.Tensor) else self.__getattr__("numel")()

        @property
        def dtype(self) -> Any:
            v = self._val()
            return v.dtype if isinstance(v, torch.Tensor) else self.__getattr__("dtype")

        @property
        def device(self) -> Any:
            v = self._val()
            return v.device if isinstance(v, torch.Tensor) else self.__getattr__("device")

        def __len__(self) -> int:
            v = self._val()
            if isinstance(v, (tuple, list, torch.Size)) or (isinstance(v, torch.Tensor) and v.dim() > 0):
                return len(v)
            return super().__len__()

        def __iter__(self) -> Any:
            v = self._val()
            if isinstance(v, (tuple, list, torch.Size)) or (isinstance(v, torch.Tensor) and v.dim() > 0):
                return iter([self[i] for i in range(len(v))])
            return super().__iter__()

        def __bool__(self) -> bool:
            v = self._val()
            if isinstance(v, (bool, int, float)):
                return bool(v)
            return super().__bool__()

        def __setitem__(self, key: Any, value: Any) -> None:
            # ``x[k] = v`` (transformers' shift_tokens_right) is recorded as a node that makes the
            # assigned tensor, and this proxy stands for it from then on: the readers of ``x``
            # after the assignment depend on ``v``.  Views of ``x`` taken before it keep the old node.
            self.node = self.tracer.create_proxy("call_function", assign, (self, key, value), {}).node

    class _LeafTracer(fx.Tracer):
        """Module-level tracer: standard torch.nn layers (and ``extra_leaves``) are leaves."""

        def __init__(self) -> None:
            super().__init__()
            self.tracing: Tracing | None = None
            self.failed_in: str | None = None

        def is_leaf_module(self, m: Any, qualname: str) -> bool:
            return (bool(extra_leaves) and isinstance(m, extra_leaves)) or super().is_leaf_module(m, qualname)

        def proxy(self, node: Any) -> Any:
            return _ValueProxy(node, self)

        def create_proxy(self, kind: str, target: Any, args: Any, kwargs: Any, name: Any = None,
                         type_expr: Any = None, proxy_factory_fn: Any = None) -> Any:
            p = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
            if self.tracing is not None and isinstance(p, fx.Proxy):
                self.tracing.value(p.node)
            return p

        def call_module(self, m: Any, forward: Any, args: Any, kwargs: Any) -> Any:
            try:
                qual = self.path_of_module(m)
            except NameError:  # a module the model calls but does not hold (a global GELU): its ops, inlined
                if any(True for _ in m.parameters()) or any(True for _ in m.buffers()):
                    raise LayerGraphError(
                        f"model {self.tracing.model_name if self.tracing else '?'!r} calls a {type(m).__name__} that is not one of "
                        "its submodules and has parameters or buffers of its own, which the layer graph cannot attribute to a "
                        "layer: make it a submodule of the model") from None
                return forward(*args, **kwargs)
            try:
                return super().call_module(m, forward, args, kwargs)
            except LayerGraphError:
                raise
            except Exception:
                if self.failed_in is None:
                    self.failed_in = qual
                raise

    return _LeafTracer


def trace(module: Any, name: str, leaf_modules: tuple[type, ...], concrete: dict[str, Any], tracing: Tracing) -> Any:
    """Trace ``module`` with the fake-value tracer into a ``GraphModule``; untraceable code raises a
    :class:`LayerGraphError` naming the submodule to mark as a leaf."""
    import torch.fx as fx

    tracer = _tracer_class(leaf_modules)()
    tracer.tracing = tracing
    before = set(vars(module))
    try:
        graph = tracer.trace(module, concrete_args=concrete or None)
        gm = fx.GraphModule(tracer.root, graph, type(module).__name__)
    except LayerGraphError:
        raise
    except Exception as err:  # fx raises TraceError, TypeError, RuntimeError... for untraceable code
        where = ""
        hint = "mark the submodule that contains it as a leaf"
        if tracer.failed_in:
            sub = module.get_submodule(tracer.failed_in)
            where = f" inside submodule {tracer.failed_in!r} ({type(sub).__name__})"
            hint = f"mark it as a leaf: build_layer_graph(..., leaf_modules=({type(sub).__name__},))"
        raise LayerGraphError(
            f"torch.fx.symbolic_trace cannot trace model {name!r}{where}: {type(err).__name__}: {err}. "
            f"Data-dependent control flow or Python-level use of tensor values cannot be traced; {hint}, "
            "so that it becomes one layer of the graph."
        ) from err
    finally:
        # fx stores tensors created in forward on the traced root as _tensor_constantN: not on the user's model
        for attr in set(vars(module)) - before:
            if attr.startswith("_tensor_constant"):
                delattr(module, attr)
    return gm


class quiet_fake_tensor_logs:
    """FakeTensorMode logs a traceback at ERROR level before re-raising a shape error; the
    builder re-raises it as a LayerGraphError naming the layer, so the log is noise."""

    def __enter__(self) -> None:
        import logging

        self.logger = logging.getLogger("torch._subclasses.fake_tensor")
        self.level = self.logger.level
        self.logger.setLevel(logging.CRITICAL)

    def __exit__(self, *exc: Any) -> None:
        self.logger.setLevel(self.level)


def assign(x: Any, key: Any, value: Any) -> Any:
    """``x`` with ``x[key] = value`` applied, as a new tensor (the traced form of an item assignment)."""
    out = x.clone()
    out[key] = value
    return out


def resolve_attr(root: Any, target: str) -> Any:
    """The object at dotted path ``target`` under ``root``, or None."""
    obj = root
    for part_ in target.split("."):
        obj = getattr(obj, part_, None)
        if obj is None:
            return None
    return obj
