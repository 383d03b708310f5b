"""What the layer-graph front end passes around: model input specs, references to the tensors of the
graph being built (:class:`TensorRef`, :class:`ParamRef`, :data:`CONST`, :class:`Piece`), what a
handler says about a node (:class:`NodeSpec`) and one fx call as the handlers see it
(:class:`CallContext`), with the small shape helpers they share."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from harness.core.layergraph import LayerGraphError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class InputSpec:
    """One model input: its full shape (batch first), dtype and optionally the names of its axes.

    Axis names default by rank: floats ``(sample, channel[, length | height, width | depth,
    height, width])``, integer tokens ``(sample, length, ...)``.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    axes: tuple[str, ...] | None = None


InputLike = Union[InputSpec, "torch.Tensor", Sequence[Any]]


def as_input_spec(x: Any, where: str) -> InputSpec:
    """Accept an InputSpec, a tensor (only its shape and dtype are used), ``(shape, dtype[, axes])`` or a shape."""
    import torch

    if isinstance(x, InputSpec):
        return InputSpec(tuple(int(s) for s in x.shape), dtype_name(x.dtype), tuple(x.axes) if x.axes else None)
    if isinstance(x, torch.Tensor):
        return InputSpec(tuple(x.shape), dtype_name(x.dtype))
    if isinstance(x, (tuple, list, torch.Size)):
        if all(isinstance(s, int) for s in x):
            return InputSpec(tuple(int(s) for s in x))
        if 2 <= len(x) <= 3 and isinstance(x[0], (tuple, list, torch.Size)):
            axes = tuple(x[2]) if len(x) == 3 and x[2] is not None else None
            return InputSpec(tuple(int(s) for s in x[0]), dtype_name(x[1]), axes)
    raise LayerGraphError(
        f"input {where}: cannot read {x!r} as an input spec; pass (shape, dtype), (shape, dtype, axis names), "
        "a shape tuple, an InputSpec or a tensor"
    )


def dtype_name(dtype: Any) -> str:
    """The torch dtype name (``"float32"``) of a ``torch.dtype`` or a dtype name, checked."""
    import torch

    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    name = str(dtype).removeprefix("torch.")
    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise LayerGraphError(f"unknown dtype {dtype!r}")
    return name


_FLOAT_AXES = {
    0: (),
    1: ("sample",),
    2: ("sample", "channel"),
    3: ("sample", "channel", "length"),
    4: ("sample", "channel", "height", "width"),
    5: ("sample", "channel", "depth", "height", "width"),
}


def default_axes(rank: int, integer: bool) -> tuple[str, ...]:
    """Axis names of an input of rank ``rank`` given none (see :class:`InputSpec`)."""
    if integer and rank >= 1:
        return ("sample", "length", *(f"d{i}" for i in range(2, rank)))[:rank]
    if rank in _FLOAT_AXES:
        return _FLOAT_AXES[rank]
    return ("sample", *(f"d{i}" for i in range(1, rank)))


def fresh_name(base: str, taken: set[str]) -> str:
    """``base`` or ``base.1``, ``base.2``... whichever is not taken yet (and take it)."""
    name, i = base, 0
    while not name or name in taken:
        i += 1
        name = f"{base or 'd'}.{i}"
    taken.add(name)
    return name


def int_tuple(x: Any, nd: int) -> tuple[int, ...]:
    """A per-spatial-dim int tuple of length ``nd`` from an int or a sequence (``kernel_size=3`` -> ``(3, 3)``)."""
    if isinstance(x, int):
        return (x,) * nd
    t = tuple(int(v) for v in x)
    return t * nd if len(t) == 1 else t


def norm_axis(a: int, rank: int) -> int:
    """A possibly negative axis of a tensor of rank ``rank`` as a non-negative one."""
    return a + rank if a < 0 else a


def flat_tensors(value: Any) -> Iterator[Any]:
    """Tensors of a nested output (tuples, lists, dicts), in order."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for x in value:
            yield from flat_tensors(x)
    elif isinstance(value, dict):
        for x in value.values():
            yield from flat_tensors(x)


@dataclass(frozen=True)
class TensorRef:
    """A tensor produced by a layer graph node (output ``port`` of ``node``)."""

    node: int
    port: int
    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    labels: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass(frozen=True)
class ParamRef:
    """A tensor computed from parameters only (folded into the layers that read it)."""

    names: frozenset[str]


class ConstRef:
    """A tensor computed from neither inputs nor parameters (made locally by every shard)."""


CONST = ConstRef()


@dataclass
class Piece:
    """One piece of chunk/split/unbind of a layer's output, materialised as a view node when read."""

    src: TensorRef
    axis: int
    start: int
    stop: int
    squeeze: bool
    name: str
    made: TensorRef | None = None


@dataclass
class NodeSpec:
    """What a handler says about a node; operand lists are indexed by tensor operand, not port."""

    kind: str
    dims: dict[str, int]
    parallel: tuple[str, ...]
    out_dims: tuple[str, ...]
    labels: tuple[str, ...]
    operand_dims: list[tuple[str, ...] | None]
    flops_fwd: float = 0.0
    flops_bwd: float = 0.0
    attrs: dict[str, Any] = field(default_factory=dict)
    windows: dict[int, dict[int, list[int]]] = field(default_factory=dict)
    select: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: (out_dims, labels) of outputs 1.. of a multi-output node (default: like output 0 when same shape)
    extra: list[tuple[tuple[str, ...], tuple[str, ...]]] | None = None
    #: operands read for their shape or dtype only (``x.to(y)``, ``x.view_as(y)``): not data, no edge
    skip: frozenset[int] = frozenset()


class Unsupported(Exception):
    """A handler cannot read this call; the builder falls back to the generic ``other`` node."""


class CallContext:
    """One fx call node as the handlers see it: values of its args and its tensor operands.
    The graph builder makes one (:meth:`harness.core.layerfx.emit.GraphBuilder.context`)."""

    def __init__(self, node: Any, op_name: str, module: Any, args: Any, kwargs: Any, value: Any, out: Any,
                 operands: list[tuple[Any, Any]], batch: int) -> None:
        self.node = node
        self.op = op_name
        self.module = module
        self.args = args
        self.kwargs = kwargs
        self.value = value
        self.out = out
        #: (ref, value) of every tensor operand in flattened argument order
        self.operands = operands
        self.batch = batch

    def arg(self, pos: int, name: str, default: Any = None) -> Any:
        if name in self.kwargs:
            return self.kwargs[name]
        return self.args[pos] if len(self.args) > pos else default

    def live(self, i: int) -> bool:
        return isinstance(self.operands[i][0], TensorRef)

    def labels(self, i: int) -> tuple[str, ...]:
        r, v = self.operands[i]
        return r.labels if isinstance(r, TensorRef) else default_axes(v.dim(), not v.is_floating_point())

    def shape(self, i: int) -> tuple[int, ...]:
        return tuple(self.operands[i][1].shape)
