"""The accumulator of a layer graph under construction: nodes and edges emitted one fx call at a time,
in topological order, with the refs that map fx nodes to the graph's tensors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from harness.core.layerfx.common import CallContext, NodeSpec, Piece, TensorRef, default_axes, dtype_name, flat_tensors, fresh_name


def _jsonable(x: Any) -> Any:
    """attrs as JSON-native values (lists, not tuples) so a save/load round trip is exact."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (bool, str)) or x is None:
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    return str(x)


class GraphBuilder:
    """Accumulates layer graph nodes and edges while walking the traced fx graph in order."""

    def __init__(self, env: dict[Any, Any], counted: dict[Any, float], modules: dict[str, Any],
                 param_names: dict[int, str], param_nbytes: dict[str, int], batch_size: int | None) -> None:
        self.env = env
        self.counted = counted
        self.modules = modules
        self.param_names = param_names
        self.param_nbytes = param_nbytes
        self.batch_size = batch_size
        self.refs: dict[Any, Any] = {}
        self.taken: set[str] = set()
        self.module_calls: dict[str, int] = {}
        # node lists
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.dims: list[dict[str, int]] = []
        self.parallel: list[tuple[str, ...]] = []
        self.ff: list[float] = []
        self.fb: list[float] = []
        self.pbytes: list[int] = []
        self.out_shape: list[tuple[int, ...]] = []
        self.out_bytes: list[int] = []
        self.out_dims: list[tuple[str, ...]] = []
        self.in_dims: list[list[tuple[str, ...]]] = []
        self.attrs: list[dict[str, Any]] = []
        self.edges: list[tuple[int, int, int, int, int]] = []  # src, dst, nbytes, dst_port, src_port

    # ---------------------------------------------------------------- fx plumbing
    def context(self, node: Any, op_name: str, module: Any) -> CallContext:
        """The call ``node`` as the handlers see it (:class:`CallContext`)."""
        import torch

        value = self.env[node]
        out = value if isinstance(value, torch.Tensor) else next(iter(self.tensors_in(value)), None)
        operands = [(self.ref_of(a), v) for a, v in self.leaves(node.args, node.kwargs) if isinstance(v, torch.Tensor)]
        return CallContext(node, op_name, module, self.value_of(node.args), self.value_of(node.kwargs), value, out, operands,
                           self.batch_size)

    def value_of(self, a: Any) -> Any:
        import torch.fx as fx

        return fx.node.map_aggregate(a, lambda x: self.env[x] if isinstance(x, fx.Node) else x)

    def leaves(self, *objs: Any) -> Iterator[tuple[Any, Any]]:
        """(fx arg, value) of every leaf of nested args, in order."""
        import torch.fx as fx

        for obj in objs:
            if isinstance(obj, fx.Node):
                yield obj, self.env[obj]
            elif isinstance(obj, (list, tuple)):
                yield from self.leaves(*obj)
            elif isinstance(obj, dict):
                yield from self.leaves(*obj.values())
            elif isinstance(obj, slice):
                yield from self.leaves(obj.start, obj.stop, obj.step)
            else:
                yield obj, obj

    def tensors_in(self, value: Any) -> Iterator[Any]:
        return flat_tensors(value)

    def ref_of(self, a: Any) -> Any:
        """The ref of an fx arg, chunk pieces materialised (an argument is being read)."""
        import torch.fx as fx

        if not isinstance(a, fx.Node):
            return None
        return self._materialized(self.refs.get(a))

    def _materialized(self, r: Any) -> Any:
        if isinstance(r, Piece):
            return self.materialize(r)
        if isinstance(r, (list, tuple)):
            return type(r)(self._materialized(x) for x in r)
        if isinstance(r, dict):
            return {k: self._materialized(x) for k, x in r.items()}
        return r

    def ref_leaves(self, r: Any) -> Iterator[Any]:
        if isinstance(r, (list, tuple)):
            for x in r:
                yield from self.ref_leaves(x)
        elif isinstance(r, dict):
            for x in r.values():
                yield from self.ref_leaves(x)
        else:
            yield r

    # ---------------------------------------------------------------- node emission
    def emit(self, name: str, spec: NodeSpec, operands: Sequence[tuple[Any, Any]], params: set[str], value: Any) -> Any:
        import torch

        v = len(self.names)
        base, k = name, 0
        while name in self.taken:  # uniquify against earlier nodes (e.g. a module named like an input)
            k += 1
            name = f"{base}#{k}"
        self.taken.add(name)
        ports: list[tuple[str, ...]] = []
        port_of: dict[int, int] = {}
        for i, (r, _) in enumerate(operands):
            if isinstance(r, TensorRef) and i not in spec.skip:
                port_of[i] = len(ports)
                dims_i = spec.operand_dims[i] if i < len(spec.operand_dims) else None
                if dims_i is None or len(dims_i) != len(r.shape):
                    dims_i = tuple("sample" if lab == "sample" and "sample" in spec.dims and n == spec.dims["sample"] else ""
                                   for lab, n in zip(r.labels, r.shape))
                ports.append(tuple(dims_i))
                self.edges.append((r.node, v, r.nbytes, port_of[i], r.port))
        attrs = dict(spec.attrs)
        if spec.windows and any(i in port_of for i in spec.windows):
            attrs["windows"] = [
                {str(ax): list(w) for ax, w in spec.windows.get(i, {}).items()}
                for i in sorted(port_of, key=port_of.__getitem__)
            ]
        if spec.select and any(i in port_of for i in spec.select):
            attrs["select"] = [list(spec.select[i]) if i in spec.select else None
                               for i in sorted(port_of, key=port_of.__getitem__)]
        pnames = sorted(params)
        if pnames:
            attrs["params"] = {p: self.param_nbytes[p] for p in pnames}
        outs = list(self.tensors_in(value))
        refs: list[TensorRef] = []
        total = 0
        extra_info: list[dict[str, Any]] = []
        for j, t in enumerate(outs):
            shape = tuple(int(s) for s in t.shape)
            total += t.numel() * t.element_size()
            if j == 0:
                od, labels = spec.out_dims, spec.labels
            elif spec.extra is not None and j - 1 < len(spec.extra):
                od, labels = spec.extra[j - 1]
            elif shape == tuple(outs[0].shape):
                od, labels = spec.out_dims, spec.labels
            else:
                labels = default_axes(len(shape), not t.is_floating_point())
                od = tuple("sample" if lab == "sample" and spec.dims.get("sample") == n else "" for lab, n in zip(labels, shape))
            refs.append(TensorRef(v, j, shape, dtype_name(t.dtype), t.element_size(), tuple(labels)))
            extra_info.append({"shape": list(shape), "dims": list(od), "dtype": dtype_name(t.dtype)})
        if len(outs) > 1:
            attrs["outputs"] = extra_info
        if outs:
            attrs.setdefault("dtype", extra_info[0]["dtype"])
        self.names.append(name)
        self.kinds.append(spec.kind)
        self.dims.append({k_: int(s) for k_, s in spec.dims.items()})
        self.parallel.append(tuple(spec.parallel))
        self.ff.append(float(spec.flops_fwd))
        self.fb.append(float(spec.flops_bwd))
        self.pbytes.append(sum(self.param_nbytes[p] for p in pnames))
        self.out_shape.append(refs[0].shape if refs else ())
        self.out_bytes.append(total)
        self.out_dims.append(tuple(spec.out_dims) if refs else ())
        self.in_dims.append(ports)
        self.attrs.append(_jsonable(attrs))
        # mirror the value's structure with refs
        it = iter(refs)

        def mirror(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return next(it)
            if isinstance(x, (list, tuple)):
                return [mirror(y) for y in x] if isinstance(x, list) else tuple(mirror(y) for y in x)
            if isinstance(x, dict):
                return {k: mirror(y) for k, y in x.items()}
            return None

        return mirror(value)

    def materialize(self, piece: Piece) -> TensorRef:
        """Create the view node of one chunk/split/unbind piece (once)."""
        if piece.made is not None:
            return piece.made
        import torch

        src = piece.src
        taken: set[str] = set()
        labels: list[str] = []
        in_axes: list[str] = []
        dims: dict[str, int] = {}
        window: dict[int, list[int]] = {}
        for ax, (lab, n) in enumerate(zip(src.labels, src.shape)):
            if ax == piece.axis:
                window[ax] = [0 if piece.squeeze else 1, piece.start, 1]
                if piece.squeeze:
                    in_axes.append("")
                    continue
                n = piece.stop - piece.start
            name = fresh_name(lab, taken)
            labels.append(name)
            in_axes.append(name)
            dims[name] = n
        shape = tuple(dims[x] for x in labels)
        spec = NodeSpec("view", dims, tuple(labels), tuple(labels), tuple(labels), [tuple(in_axes)],
                     attrs={"op": "piece", "axis": piece.axis, "start": piece.start, "stop": piece.stop},
                     windows={0: window})
        fake = torch.empty(shape, dtype=getattr(torch, src.dtype), device="meta")
        piece.made = self.emit(piece.name, spec, [(src, None)], set(), fake)
        return piece.made
