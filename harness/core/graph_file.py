"""The checks of an op graph file's fields (:meth:`harness.core.graph.OpGraph.from_dict`).

Every mistake is one :class:`~harness.core.graph.GraphError` naming the culprit: an unknown
or missing field, a node name given twice, FLOPs, bytes or memory that are negative, not
finite or too large to compute with (by node, edge or parameter; a field's total at most
:data:`MAX_FLOPS` FLOPs or :data:`MAX_BYTES` bytes, so that no sum overflows), an index outside
its range (by array and position: ``src[4] = 17``), a ``kernels`` table of the wrong shape or
with codes out of range.  A cycle and the ``node_time_s`` entries are checked when the graph is
built (``OpGraph.__post_init__``, :meth:`~harness.core.graph.OpGraph.from_unordered`).
:func:`figures` is the same check for the layer graph's arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from harness.core.errors import UserError
from harness.core.graph_terms import BATCH_ROLES, PHASES, GraphError, show_number
from harness.core.kernels import KINDS, NCOLS
from harness.core.precision import MATH

#: the most FLOPs a graph's field may add up to (1e30: 30 000 years of a step at 1 EFLOP/s)
MAX_FLOPS = 1e30
#: the most bytes a graph's field may add up to (2^62: every sum of them fits an int64)
MAX_BYTES = 2**62
#: the largest size of a tensor axis or a batch
MAX_SIZE = 2**31 - 1


def check_graph_fields(d: dict[str, Any], fields: Sequence[dataclasses.Field[Any]]) -> None:
    """Check the fields of a graph file (its mapping without ``format``) against the graph's
    dataclass ``fields``: raise a :class:`GraphError` naming the first mistake."""
    _check_fields(d, fields)
    _check_edges(d)
    _check_nodes(d)
    _check_params(d)
    _check_kernels(d)


def _file_fields(fields: Sequence[dataclasses.Field[Any]]) -> tuple[list[str], list[str]]:
    """The (required, optional) fields of a graph file: OpGraph's dataclass fields without and
    with a default (``fx`` is never saved)."""
    fs = [f for f in fields if f.name != "fx"]
    required = [f.name for f in fs if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    return required, [f.name for f in fs if f.name not in required]


def _check_fields(d: dict[str, Any], fields: Sequence[dataclasses.Field[Any]]) -> None:
    """Every required field present, none unknown, ``names`` a list of strings."""
    required, optional = _file_fields(fields)
    unknown = [k for k in d if k not in required and k not in optional]
    if unknown:
        raise GraphError(f"field {unknown[0]!r} is not an op graph field (fields: {', '.join(required + optional)})")
    missing = [k for k in required if k not in d]
    if missing:
        raise GraphError(f"field {missing[0]!r} is missing (an op graph file needs {', '.join(required)})")
    if not isinstance(d["names"], list) or not all(isinstance(x, str) for x in d["names"]):
        raise GraphError("field 'names' must be a list of node names (strings)")
    if len(set(d["names"])) != len(d["names"]):
        seen: dict[str, int] = {}
        for i, name in enumerate(d["names"]):
            if name in seen:
                raise GraphError(f"node {i} is named {name!r} like node {seen[name]}: node names must be unique")
            seen[name] = i


def _length(d: dict[str, Any], field: str) -> int:
    """The number of entries of list field ``field`` (0 when the file leaves it out)."""
    value = d.get(field, [])
    if not isinstance(value, list):
        raise GraphError(f"field {field!r} must be a list, got {type(value).__name__}")
    return len(value)


def _numbers(d: dict[str, Any], field: str, length: int, error: type[UserError] = GraphError) -> np.ndarray:
    """Field ``field`` as a float64 array of ``length`` entries, or ``error`` naming it."""
    values = d[field]
    if isinstance(values, np.ndarray) and values.dtype.kind in "biuf":
        arr = values.astype(np.float64).ravel() if values.ndim <= 1 else values.astype(np.float64)
    else:
        if isinstance(values, (str, bytes, dict)) or any(isinstance(x, bool) for x in _flat(values)):
            raise error(f"field {field!r} must be a list of numbers")
        try:
            arr = np.asarray(values, dtype=np.float64)
        except OverflowError:  # an integer beyond float64's range (10**400)
            raise error(f"field {field!r} holds a number too large to compute with") from None
        except (TypeError, ValueError):
            raise error(f"field {field!r} must be a list of numbers") from None
    if arr.ndim != 1:
        raise error(f"field {field!r} must be a flat list of numbers")
    if len(arr) != length:
        raise error(f"field {field!r} has {len(arr)} entries, expected {length}")
    return arr


def _flat(values: Any) -> list[Any]:
    """The entries of a list (one level), for the bool check; nothing for other values."""
    return list(values) if isinstance(values, (list, tuple)) else []


def _check_indices(d: dict[str, Any], field: str, length: int, lo: int, hi: int, what: str, prefix: str = "") -> np.ndarray:
    """Field ``field``: ``length`` integers in ``lo..hi`` (``what`` says what they index),
    naming the array (after ``prefix``) and position of the first that is not."""
    arr = _numbers(d, field, length)
    bad = np.flatnonzero((arr != np.round(arr)) | ~np.isfinite(arr) | (arr < lo) | (arr > hi))
    if len(bad):
        i = int(bad[0])
        raise GraphError(f"{prefix}{field}[{i}] = {show_number(arr[i])} is not in {lo}..{hi} ({what})")
    return arr.astype(np.int64)


def _check_figures(d: dict[str, Any], field: str, length: int, integral: bool, label: Callable[[int], str]) -> None:
    """Field ``field``: ``length`` FLOPs or byte counts (see :func:`figures`)."""
    figures(d[field], field, length, integral, label)


def figures(values: Any, field: str, length: int, integral: bool, label: Callable[[int], str],
            error: type[UserError] = GraphError) -> np.ndarray:
    """``values`` as a float64 array of ``length`` FLOPs (``integral`` false) or byte counts
    (true), each finite and >= 0 (an integer when ``integral``), adding up to at most
    :data:`MAX_FLOPS` or :data:`MAX_BYTES`; else ``error`` naming the field and, through
    ``label(i)``, the node, edge or parameter of a bad entry."""
    arr = _numbers({field: values}, field, length, error)
    bad = ~np.isfinite(arr) | (arr < 0)
    if integral:
        bad |= arr != np.round(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        rule = "an integer >= 0" if integral else "a finite number >= 0"
        raise error(f"{label(i)} has {field} = {show_number(arr[i])}; {field} must be {rule}")
    limit, unit = (MAX_BYTES, "bytes") if integral else (MAX_FLOPS, "FLOPs")
    total = float(arr.sum()) if len(arr) else 0.0
    if total > limit:
        i = int(np.argmax(arr))
        raise error(f"field {field!r} adds up to {total:.3g} {unit}, more than the {float(limit):.3g} a graph may hold "
                    f"(its largest entry: {label(i)} with {arr[i]:.3g}): a figure this large cannot be computed with")
    return arr


def _check_edges(d: dict[str, Any]) -> None:
    """``src`` and ``dst`` name nodes; ``nbytes`` are byte counts, named by edge."""
    names = d["names"]
    n, e = len(names), _length(d, "src")
    src = _check_indices(d, "src", e, 0, n - 1, "node ids")
    dst = _check_indices(d, "dst", e, 0, n - 1, "node ids")
    _check_figures(d, "nbytes", e, True, lambda i: f"edge {i} ({names[src[i]]} -> {names[dst[i]]})")


def _check_nodes(d: dict[str, Any]) -> None:
    """Per-node arrays: one entry each, FLOPs and bytes >= 0 (named by node), the codes in range."""
    names = d["names"]
    n = len(names)
    if not isinstance(d["targets"], list) or len(d["targets"]) != n:
        raise GraphError(f"field 'targets' must be a list of {n} op names (one per node)")
    for field in ("flops", "out_bytes", "work_bytes"):
        _check_figures(d, field, n, field != "flops", lambda i: f"node {i} ({names[i]})")
    layers = d["layer_names"]
    if not isinstance(layers, list):
        raise GraphError("field 'layer_names' must be a list of module paths")
    _check_indices(d, "layer", n, 0, len(layers) - 1, "indices into layer_names")
    _check_indices(d, "phase", n, 0, len(PHASES) - 1, "phases " + ", ".join(PHASES))
    _check_indices(d, "batch_role", n, 0, len(BATCH_ROLES) - 1, "batch roles " + ", ".join(BATCH_ROLES))
    _check_indices(d, "free", n, 0, 1, "0 or 1")
    _check_indices(d, "coloc", n, -1, n - 1, "co-location groups, -1 for none")
    for field in ("out_shapes", "out_dtypes"):
        if d.get(field) is not None and (not isinstance(d[field], list) or len(d[field]) != n):
            raise GraphError(f"field {field!r} must be null or a list of {n} entries (one per node)")
    _check_outputs(d)
    _check_meta(d)


def _check_outputs(d: dict[str, Any]) -> None:
    """``out_shapes``: per node null or a list of shapes (lists of sizes 0..2^31-1);
    ``out_dtypes``: per node null or a list of dtype names."""
    names = d["names"]
    for v, shapes in enumerate(d.get("out_shapes") or []):
        ok = shapes is None or (isinstance(shapes, list) and all(
            isinstance(shape, list) and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_SIZE for x in shape)
            for shape in shapes))
        if not ok:
            raise GraphError(f"node {v} ({names[v]}) has out_shapes {shapes!r:.80}; expected null or a list of shapes, "
                             f"each a list of sizes (integers 0..{MAX_SIZE})")
    for v, dtypes in enumerate(d.get("out_dtypes") or []):
        if not (dtypes is None or (isinstance(dtypes, list) and all(isinstance(x, str) for x in dtypes))):
            raise GraphError(f"node {v} ({names[v]}) has out_dtypes {dtypes!r:.80}; expected null or a list of dtype names")


def _check_meta(d: dict[str, Any]) -> None:
    """``meta``: a JSON object; the keys the harness reads from it (``batch_size``,
    ``batch_axis``) of the right type and range."""
    meta = d.get("meta")
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise GraphError("field 'meta' must be a JSON object")
    batch = meta.get("batch_size")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_SIZE):
        raise GraphError(f"meta.batch_size must be an integer in 1..{MAX_SIZE}, got {batch!r:.40}")
    if meta.get("batch_axis") is not None:
        _check_indices(meta, "batch_axis", len(d["names"]), -1, 64, "the batch axis of each node's output, -1 for none", "meta.")


def _check_params(d: dict[str, Any]) -> None:
    """The parameter table: sizes >= 0 (named by parameter), the CSR ``param_ptr`` /
    ``param_idx`` and ``grad_node`` / ``update_node`` in range."""
    n = len(d["names"])
    n_par = _length(d, "param_bytes")
    pnames = d.get("param_names") or []
    if not isinstance(pnames, list) or len(pnames) not in (0, n_par):
        raise GraphError(f"field 'param_names' must be a list of {n_par} names (one per entry of param_bytes)")
    if "param_bytes" in d:
        _check_figures(d, "param_bytes", n_par, True, lambda p: f"parameter {p}" + (f" ({pnames[p]})" if pnames else ""))
    n_idx = _length(d, "param_idx")
    if "param_idx" in d:
        _check_indices(d, "param_idx", n_idx, 0, n_par - 1, "indices into param_bytes")
    if d.get("param_ptr") is not None:
        ptr = _check_indices(d, "param_ptr", n + 1, 0, n_idx, "offsets into param_idx")
        if ptr[0] != 0 or ptr[-1] != n_idx or (np.diff(ptr) < 0).any():
            raise GraphError(f"param_ptr must rise from 0 to {n_idx} (the length of param_idx), one offset per node and one more")
    for field in ("grad_node", "update_node"):
        if field in d:
            _check_indices(d, field, n_par, -1, n - 1, "node ids, -1 for none")


def _check_kernels(d: dict[str, Any]) -> None:
    """``kernels`` (optional): null or :class:`harness.core.kernels.KernelTable`'s mapping, its
    rows naming nodes of the graph, codes in range and sizes that are integers >= 0."""
    kern = d.get("kernels")
    if kern is None:
        return
    if not isinstance(kern, dict):
        raise GraphError(f"field 'kernels' must be null or a JSON object (node, kind, dims, bdim, math, rnn), got "
                         f"{type(kern).__name__}")
    keys = ("node", "kind", "dims", "bdim", "math", "rnn")
    missing = [k for k in keys if k not in kern]
    unknown = [k for k in kern if k not in keys]
    if missing or unknown:
        raise GraphError(f"field 'kernels' needs the lists {', '.join(keys)}" + (f"; {unknown[0]!r} is not one of them" if unknown else
                                                                                f"; {missing[0]!r} is missing"))
    rows = _length(kern, "node")
    n = len(d["names"])
    _check_indices(kern, "node", rows, 0, n - 1, "node ids", "kernels.")
    _check_indices(kern, "kind", rows, 0, len(KINDS) - 1, "kernel kinds " + ", ".join(KINDS), "kernels.")
    _check_indices(kern, "bdim", rows, -1, NCOLS - 1, "the batch column, -1 for none", "kernels.")
    _check_indices(kern, "math", rows, 0, len(MATH) - 1, "math modes " + ", ".join(MATH), "kernels.")
    _check_indices(kern, "rnn", rows, 0, 1, "0 or 1", "kernels.")
    dims = kern["dims"]
    flat = [x for row in dims for x in (row if isinstance(row, list) else [row])] if isinstance(dims, list) else dims
    _check_indices({"dims": flat}, "dims", rows * NCOLS, 0, 2**31 - 1, f"sizes: {NCOLS} per row", "kernels.")
