"""The checks of an op graph file's fields (:meth:`harness.core.graph.OpGraph.from_dict`).

Every mistake is one :class:`~harness.core.graph.GraphError` naming the culprit: an unknown
or missing field, FLOPs, bytes or memory that are negative or not finite (by node, edge or
parameter), an index outside its range (by array and position: ``src[4] = 17``).  A cycle
and the ``node_time_s`` entries are checked when the graph is built (``OpGraph.__post_init__``,
:meth:`~harness.core.graph.OpGraph.from_unordered`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from harness.core.graph_terms import BATCH_ROLES, PHASES, GraphError, show_number


def check_graph_fields(d: dict[str, Any], fields: Sequence[dataclasses.Field[Any]]) -> None:
    """Check the fields of a graph file (its mapping without ``format``) against the graph's
    dataclass ``fields``: raise a :class:`GraphError` naming the first mistake."""
    _check_fields(d, fields)
    _check_edges(d)
    _check_nodes(d)
    _check_params(d)


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


def _length(d: dict[str, Any], field: str) -> int:
    """The number of entries of list field ``field`` (0 when the file leaves it out)."""
    value = d.get(field, [])
    if not isinstance(value, list):
        raise GraphError(f"field {field!r} must be a list, got {type(value).__name__}")
    return len(value)


def _numbers(d: dict[str, Any], field: str, length: int) -> np.ndarray:
    """Field ``field`` as a float64 array of ``length`` entries, or a GraphError naming it."""
    try:
        arr = np.asarray(d[field], dtype=np.float64)
    except (TypeError, ValueError):
        raise GraphError(f"field {field!r} must be a list of numbers") from None
    if arr.ndim != 1:
        raise GraphError(f"field {field!r} must be a flat list of numbers")
    if len(arr) != length:
        raise GraphError(f"field {field!r} has {len(arr)} entries, expected {length}")
    return arr


def _check_indices(d: dict[str, Any], field: str, length: int, lo: int, hi: int, what: str) -> np.ndarray:
    """Field ``field``: ``length`` integers in ``lo..hi`` (``what`` says what they index),
    naming the array and position of the first that is not."""
    arr = _numbers(d, field, length)
    bad = np.flatnonzero((arr != np.round(arr)) | ~np.isfinite(arr) | (arr < lo) | (arr > hi))
    if len(bad):
        i = int(bad[0])
        raise GraphError(f"{field}[{i}] = {show_number(arr[i])} is not in {lo}..{hi} ({what})")
    return arr.astype(np.int64)


def _check_figures(d: dict[str, Any], field: str, length: int, integral: bool, label: Callable[[int], str]) -> None:
    """Field ``field``: ``length`` FLOPs or byte counts, each finite and >= 0 (and an integer
    when ``integral``); ``label(i)`` names the node, edge or parameter of a bad one."""
    arr = _numbers(d, field, length)
    bad = ~np.isfinite(arr) | (arr < 0)
    if integral:
        bad |= arr != np.round(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        rule = "an integer >= 0" if integral else "a finite number >= 0"
        raise GraphError(f"{label(i)} has {field} = {show_number(arr[i])}; {field} must be {rule}")


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
    if d.get("meta") is not None and not isinstance(d["meta"], dict):
        raise GraphError("field 'meta' must be a JSON object")


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
