"""An executable, picklable form of a captured training step (``ExecGraph``).

:func:`harness.core.capture.capture` keeps the traced ``torch.fx`` GraphModule in ``OpGraph.fx``
when asked (``keep_fx=True``).  That module cannot cross a process boundary: its nodes'
tensor metadata is lost when it is pickled and aten ``OpOverload`` objects do not pickle.
The profiler and the real-run backend need exactly what the module describes, though: for
each :class:`~harness.core.graph.OpGraph` node (the i-th ``call_function`` node of the module,
``getitem`` included) its aten target, its arguments (other nodes, placeholders and
constants) and the shapes and dtypes of its outputs.  :class:`ExecGraph` is that, as plain
data: targets are strings (``"aten.convolution.default"``) resolved again in the process
that runs them, node and placeholder arguments are :class:`Ref` objects, and the ``meta``
device the module was traced on is the :data:`DEVICE` placeholder, replaced by the real
device when the graph runs.

Placeholders are, in order, the parameters, the buffers, the model inputs and the target
(``capture`` flattens ``step(params, buffers, xs, y)``); the outputs are the loss, one
gradient per parameter and one updated value per parameter.

Real values come from a real instance of the model (:func:`initial_state`): the module is
built on the CPU under ``torch.manual_seed(seed)`` and the batch is drawn from a seeded
generator (integer tensors uniformly in ``[0, high)``), so every process that asks for the
same seed gets the same weights and the same batch.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from harness.core.fx_graph import SHAPE_ONLY
from harness.core.graph import OpGraph


class ExecGraphError(RuntimeError):
    """The captured graph cannot be executed; the message names the node or the reason."""


class _Device:
    """Stands for the device the graph runs on (the trace used ``meta``)."""

    def __repr__(self) -> str:
        return "DEVICE"

    def __reduce__(self) -> str:
        return "DEVICE"


#: the device placeholder inside :class:`Instr` arguments
DEVICE = _Device()


@dataclass(frozen=True, slots=True)
class Ref:
    """An argument that is a value of the graph: ``kind`` is ``"n"`` (node) or ``"p"`` (placeholder)."""

    kind: str
    index: int


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """Shape, dtype and strides of one tensor of the trace."""

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        import torch

        return math.prod(self.shape) * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()

    def empty(self, device: Any) -> Any:
        """A contiguous uninitialised tensor of this shape and dtype on ``device``."""
        import torch

        return torch.empty(self.shape, dtype=getattr(torch, self.dtype), device=device)

    def empty_strided(self, device: Any) -> Any:
        """An uninitialised tensor with the traced shape, dtype and strides."""
        import torch

        return torch.empty_strided(self.shape, self.stride, dtype=getattr(torch, self.dtype), device=device)

    def dense_perm(self) -> tuple[int, ...] | None:
        """The permutation that makes a dense, non-overlapping but non-contiguous layout (a
        transpose, a permute) contiguous; None when the traced layout is contiguous or not dense.

        A tensor sent between processes travels as ``t.permute(perm).contiguous()`` and is
        permuted back by the receiver, so it arrives with the traced strides (later views of it
        may depend on them)."""
        nd = len(self.shape)
        if nd <= 1:
            return None
        perm = tuple(sorted(range(nd), key=lambda d: (-self.stride[d], d)))
        expect = 1
        for d in reversed(perm):
            if self.shape[d] != 1 and self.stride[d] != expect:
                return None
            expect *= self.shape[d]
        return None if perm == tuple(range(nd)) else perm

    def permuted(self, perm: Sequence[int]) -> "TensorMeta":
        """The contiguous metadata of ``t.permute(perm)``."""
        shape = tuple(self.shape[d] for d in perm)
        stride = []
        acc = 1
        for n in reversed(shape):
            stride.append(acc)
            acc *= n
        return TensorMeta(shape, self.dtype, tuple(reversed(stride)))


@dataclass(frozen=True, slots=True)
class Instr:
    """One node: ``target`` (aten name or ``getitem``), arguments with :class:`Ref`, output metadata.

    ``out`` mirrors the node's value: a :class:`TensorMeta`, ``None``, a scalar, or a
    list/tuple of those (multi-output ops).
    """

    target: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any
    mutates: bool = False


@dataclass(frozen=True, slots=True)
class Placeholder:
    """A step input: ``kind`` param / buffer / input / target, its name and metadata."""

    kind: str
    name: str
    meta: TensorMeta


def short_target(target: str) -> str:
    """``aten.addmm.default`` -> ``addmm``; other targets unchanged."""
    return target.split(".")[1] if target.startswith("aten.") else target


def is_shape_only(target: str) -> bool:
    """True when a node of this target reads only the metadata of its tensor inputs."""
    return short_target(target) in SHAPE_ONLY


_RESOLVED: dict[str, Callable[..., Any]] = {}


def resolve(target: str) -> Callable[..., Any]:
    """The callable of a target name (``aten.add.Tensor`` -> ``torch.ops.aten.add.Tensor``)."""
    fn = _RESOLVED.get(target)
    if fn is not None:
        return fn
    if target == "getitem":
        fn = operator.getitem
    else:
        import torch

        parts = target.split(".")
        if len(parts) != 3:
            raise ExecGraphError(f"cannot resolve target {target!r}: expected namespace.op.overload")
        try:
            fn = getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
        except (AttributeError, RuntimeError) as e:
            raise ExecGraphError(f"cannot resolve target {target!r} in torch.ops: {e}") from e
    _RESOLVED[target] = fn
    return fn


def _meta_of(val: Any) -> Any:
    import torch

    if isinstance(val, torch.Tensor):
        return TensorMeta(tuple(int(s) for s in val.shape), str(val.dtype).replace("torch.", ""), tuple(int(s) for s in val.stride()))
    if isinstance(val, (list, tuple)):
        return type(val)(_meta_of(v) for v in val)
    if val is None or isinstance(val, (int, float, bool)):
        return val
    raise ExecGraphError(f"unsupported value of type {type(val).__name__} in the trace")


def _convert_arg(a: Any, index: dict[Any, Ref], node_name: str) -> Any:
    import torch
    import torch.fx as fx

    if isinstance(a, fx.Node):
        if a not in index:
            raise ExecGraphError(f"node {node_name} reads {a.name} ({a.op}), which is neither a node nor a placeholder")
        return index[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_convert_arg(x, index, node_name) for x in a)
    if isinstance(a, dict):
        return {k: _convert_arg(v, index, node_name) for k, v in a.items()}
    if isinstance(a, torch.device):
        return DEVICE if a.type == "meta" else a
    if isinstance(a, torch.Tensor):
        raise ExecGraphError(f"node {node_name} has a tensor constant argument; constants are not supported")
    return a


@dataclass(eq=False)
class ExecGraph:
    """The executable form of a captured step; node ``i`` is OpGraph node ``i``."""

    instrs: list[Instr]
    placeholders: list[Placeholder]
    outputs: list[Ref | None]
    n_params: int
    n_buffers: int
    n_inputs: int
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_graph(cls, graph: OpGraph) -> "ExecGraph":
        """Build from an OpGraph captured with ``keep_fx=True`` (aten or core_aten granularity)."""
        import torch
        from torch.utils._pytree import tree_unflatten

        gm = getattr(graph, "fx", None)
        model = graph.meta.get("model", "?")
        if gm is None:
            raise ExecGraphError(
                f"graph of {model!r} has no fx GraphModule: capture it with keep_fx=True "
                "(a graph rewritten by an algorithm, loaded from a file or coarsened has none)"
            )
        nodes = list(gm.graph.nodes)
        phs = [n for n in nodes if n.op == "placeholder"]
        ops = [n for n in nodes if n.op == "call_function"]
        other = [n for n in nodes if n.op not in ("placeholder", "call_function", "output")]
        if other:
            raise ExecGraphError(f"graph of {model!r} has {other[0].op} node {other[0].name}: only call_function nodes can be executed")
        if len(ops) != graph.num_nodes or [n.name for n in ops] != list(graph.names):
            raise ExecGraphError(f"graph of {model!r} does not match its fx module ({len(ops)} call_function nodes, {graph.num_nodes} graph nodes)")
        spec = tree_unflatten(list(range(len(phs))), gm._in_spec)
        if len(spec) == 2 and isinstance(spec[1], dict) and isinstance(spec[0], tuple):
            spec = spec[0]  # (args, kwargs)
        params, buffers, xs, _y = spec
        n_p, n_b, n_x = len(params), len(buffers), len(xs)
        names = list(params) + list(buffers) + [f"input{i}" for i in range(n_x)] + ["target"]
        kinds = ["param"] * n_p + ["buffer"] * n_b + ["input"] * n_x + ["target"]
        placeholders = [Placeholder(k, nm, _meta_of(ph.meta["val"])) for k, nm, ph in zip(kinds, names, phs)]
        index: dict[Any, Ref] = {ph: Ref("p", j) for j, ph in enumerate(phs)}
        index.update({n: Ref("n", i) for i, n in enumerate(ops)})
        instrs = []
        for n in ops:
            tname = "getitem" if n.target is operator.getitem else str(n.target)
            schema = getattr(n.target, "_schema", None)
            instrs.append(Instr(
                tname,
                tuple(_convert_arg(a, index, n.name) for a in n.args),
                {k: _convert_arg(v, index, n.name) for k, v in n.kwargs.items()},
                _meta_of(n.meta.get("val")),
                bool(schema is not None and schema.is_mutable),
            ))
        out_node = next(n for n in nodes if n.op == "output")
        flat = list(out_node.args[0])
        outputs = [index[a] if isinstance(a, torch.fx.Node) else None for a in flat]
        if len(outputs) != 1 + 2 * n_p:
            raise ExecGraphError(f"graph of {model!r} returns {len(outputs)} values; expected loss, {n_p} gradients, {n_p} updated parameters")
        return cls(instrs, placeholders, outputs, n_p, n_b, n_x,
                   {"model": model, "batch_size": int(graph.meta.get("batch_size", 0)), "granularity": graph.meta.get("granularity", "aten")})

    # ------------------------------------------------------------------ structure
    @property
    def num_nodes(self) -> int:
        return len(self.instrs)

    def refs(self, i: int) -> list[Ref]:
        """Every Ref among node i's arguments, in argument order (duplicates kept)."""
        ins = self.instrs[i]
        return list(_iter_refs((ins.args, ins.kwargs)))

    @property
    def loss_ref(self) -> Ref | None:
        return self.outputs[0]

    @property
    def grad_refs(self) -> list[Ref | None]:
        return self.outputs[1:1 + self.n_params]

    @property
    def new_param_refs(self) -> list[Ref | None]:
        return self.outputs[1 + self.n_params:1 + 2 * self.n_params]

    # ------------------------------------------------------------------ running
    def call(self, i: int, node_vals: Sequence[Any], ph_vals: Sequence[Any], device: Any) -> Any:
        """Run node i on real values (the reference interpreter; slow but plain)."""
        ins = self.instrs[i]
        args = materialize(ins.args, node_vals, ph_vals, device)
        kwargs = materialize(ins.kwargs, node_vals, ph_vals, device)
        return resolve(ins.target)(*args, **kwargs)

    def run(self, ph_vals: Sequence[Any], device: Any = "cpu") -> dict[str, Any]:
        """Execute every node in node order in this process: the single-process reference.

        Returns ``{"loss", "grads", "new_params"}`` (lists indexed by parameter).
        """
        vals: list[Any] = [None] * self.num_nodes
        for i in range(self.num_nodes):
            vals[i] = self.call(i, vals, ph_vals, device)
        return self.collect(vals, ph_vals)

    def collect(self, node_vals: Sequence[Any], ph_vals: Sequence[Any]) -> dict[str, Any]:
        def get(r: Ref | None) -> Any:
            if r is None:
                return None
            return node_vals[r.index] if r.kind == "n" else ph_vals[r.index]

        return {
            "loss": get(self.loss_ref),
            "grads": [get(r) for r in self.grad_refs],
            "new_params": [get(r) for r in self.new_param_refs],
        }


def _iter_refs(x: Any) -> Iterator[Ref]:
    if isinstance(x, Ref):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _iter_refs(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _iter_refs(v)


def materialize(x: Any, node_vals: Sequence[Any], ph_vals: Sequence[Any], device: Any) -> Any:
    """Replace Refs by values and :data:`DEVICE` by ``device`` in an argument structure."""
    if isinstance(x, Ref):
        return node_vals[x.index] if x.kind == "n" else ph_vals[x.index]
    if x is DEVICE:
        import torch

        return torch.device(device)
    if isinstance(x, tuple):
        return tuple(materialize(v, node_vals, ph_vals, device) for v in x)
    if isinstance(x, list):
        return [materialize(v, node_vals, ph_vals, device) for v in x]
    if isinstance(x, dict):
        return {k: materialize(v, node_vals, ph_vals, device) for k, v in x.items()}
    return x


# ---------------------------------------------------------------------------- real state
def make_batch(source: Any, batch: int, seed: int) -> tuple[list[Any], Any]:
    """A seeded real batch for a :class:`~harness.core.models.TorchModel`: (inputs, target) on the CPU.

    Floating tensors are standard normal; integer tensors uniform in ``[0, high)`` (the
    spec's ``high``, else 2), so embeddings and losses get valid indices.
    """
    import torch

    gen = torch.Generator().manual_seed(int(seed) + 1)

    def draw(spec: Any) -> Any:
        shape = (batch, *spec.shape)
        dtype = getattr(torch, spec.dtype)
        if dtype.is_floating_point:
            return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=gen).bool()
        return torch.randint(0, int(spec.high or 2), shape, generator=gen, dtype=dtype)

    return [draw(s) for s in source.inputs], draw(source.target)


def real_parameters(source: Any, eg: ExecGraph, seed: int) -> list[Any]:
    """Parameters then buffers of a real CPU instance built under ``torch.manual_seed(seed)``,
    in the order of the graph's placeholders (checked by name)."""
    import torch

    torch.manual_seed(int(seed))
    with torch.device("cpu"):
        module = source.build()
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    want = [p.name for p in eg.placeholders[: eg.n_params + eg.n_buffers]]
    have = list(params) + list(buffers)
    if want != have:
        missing = sorted(set(want) ^ set(have))[:5]
        raise ExecGraphError(f"model {getattr(source, 'name', '?')!r}: a real instance has other parameters than the trace ({missing})")
    return [t.detach().clone() for t in list(params.values()) + list(buffers.values())]


def initial_state(source: Any, eg: ExecGraph, seed: int, device: Any = "cpu", batch: int | None = None, shard: tuple[int, int] | None = None) -> list[Any]:
    """Placeholder values: real parameters and buffers, then a seeded batch of ``batch``
    samples (default: the graph's); ``shard=(k, n)`` keeps the k-th of n equal slices of it."""
    b = int(batch or eg.meta["batch_size"])
    xs, y = make_batch(source, b, seed)
    data = [*xs, y]
    if shard is not None:
        k, n = shard
        if b % n:
            raise ExecGraphError(f"batch {b} does not split into {n} equal shards")
        s = b // n
        data = [t[k * s:(k + 1) * s] for t in data]
    vals = real_parameters(source, eg, seed) + data
    for j, (v, ph) in enumerate(zip(vals, eg.placeholders)):
        if tuple(v.shape) != ph.meta.shape:
            raise ExecGraphError(f"placeholder {ph.name} has shape {tuple(v.shape)} but the trace expects {ph.meta.shape}")
    return [v.to(device) for v in vals]


def consumers(eg: ExecGraph) -> list[list[tuple[int, bool]]]:
    """Per node: (consumer, reads only metadata) in node order, one entry per consumer."""
    cons: list[list[tuple[int, bool]]] = [[] for _ in range(eg.num_nodes)]
    for c, ins in enumerate(eg.instrs):
        so = is_shape_only(ins.target)
        seen = set()
        for r in eg.refs(c):
            if r.kind == "n" and r.index not in seen:
                seen.add(r.index)
                cons[r.index].append((c, so))
    return cons
