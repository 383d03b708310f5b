"""Strategies and plans: what an algorithm returns.

A :class:`Strategy` gives every node of a graph either a device (an operator placement)
or a :class:`ParallelConfig` (a degree per dimension plus the device of each shard, as in
OptCNN's layer configurations), and a schedule priority ``order`` (lower runs first on a
device).  ``order`` must be consistent with the graph's edges (a topological numbering),
which also makes "run each device's tasks strictly in order" deadlock-free.

A :class:`Plan` pairs the strategy with the graph it refers to: most algorithms return
the input graph unchanged; FD-DPS splits operators and Celeritas coarsens, so they return
a rewritten graph with ``origin`` mapping each new node back to the original.

Integers stay integers: a device id, order or config id that is not an integer (1.7) and a
parallel degree below 1 are refused when a strategy or config is built or loaded (a
:class:`StrategyError` naming the array and position, or the config and dim), never rounded;
:meth:`Strategy.validate` then checks them against the graph and the cluster.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from harness.core.checks import integer
from harness.core.errors import UserError
from harness.core.graph import read_json_object

STRATEGY_FORMAT = "harness.strategy/1"

#: the file a job writes beside strategy.json when its plan's graph is not the captured graph
#: (FD-DPS's split graph, FastT's): strategy.json names it under ``plan_graph`` (docs/strategy_format.md)
PLAN_GRAPH_FILE = "plan_graph.json"


class StrategyError(UserError, ValueError):
    """A strategy does not fit its graph or cluster; the message names the culprit."""


def graph_identity(graph: Any) -> dict[str, Any]:
    """What strategy.json records of the graph a strategy was planned for (its ``graph`` key):
    the kind (``op``, ``layer`` or ``stack``), node and edge counts, the model and, for an
    operator graph, :func:`harness.core.fingerprint.graph_fingerprint` (batch-independent:
    structure and sizes); for a stack graph its units (a chain: ``units - 1`` edges) and
    ``StackGraph.fingerprint`` (the units, shape, sequence and precision; the batch aside)."""
    if type(graph).__name__ == "StackGraph":
        return {"kind": "stack", "nodes": int(graph.num_nodes), "edges": max(int(graph.num_nodes) - 1, 0),
                "model": (graph.meta or {}).get("model") or graph.name, "fingerprint": graph.fingerprint()}
    kind = "layer" if type(graph).__name__ == "LayerGraph" else "op"
    out: dict[str, Any] = {"kind": kind, "nodes": int(graph.num_nodes), "edges": int(graph.num_edges),
                           "model": (getattr(graph, "meta", None) or {}).get("model")}
    if kind == "op":
        from harness.core.fingerprint import graph_fingerprint  # imports torch: only when a job saves a plan

        out["fingerprint"] = graph_fingerprint(graph)
    return out


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """Degrees per parallelisable dim (e.g. ``(("sample", 4),)``) and the device of each shard.

    Shard k (in row-major order over the dims) runs on ``devices[k]``.
    """

    dims: tuple[tuple[str, int], ...]
    devices: tuple[int, ...]

    def __post_init__(self) -> None:
        for dim, d in self.dims:
            if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 1:
                raise StrategyError(f"parallel config {dict(self.dims)}: the degree of {dim} is {d!r}; a degree must be an integer >= 1")
        for k, dev in enumerate(self.devices):
            if not isinstance(dev, (int, np.integer)) or isinstance(dev, bool):
                raise StrategyError(f"parallel config {dict(self.dims)}: devices[{k}] is {dev!r}, not an integer device id")

    @classmethod
    def make(cls, dims: Mapping[str, int], devices: Sequence[int]) -> "ParallelConfig":
        """A config from a mapping of degrees and the shards' devices, all integers (2.0 is
        taken, 1.7 refused)."""
        return cls(tuple((str(k), integer(v, f"parallel config dims.{k}", StrategyError)) for k, v in dims.items()),
                   tuple(integer(d, f"parallel config devices[{k}]", StrategyError) for k, d in enumerate(devices)))

    @property
    def degree(self) -> int:
        return math.prod(d for _, d in self.dims)

    def degree_of(self, dim: str) -> int:
        for name, d in self.dims:
            if name == dim:
                return d
        return 1

    def to_dict(self) -> dict[str, Any]:
        return {"dims": dict(self.dims), "devices": list(self.devices)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ParallelConfig":
        if not isinstance(d, Mapping) or not isinstance(d.get("dims"), Mapping) or not isinstance(d.get("devices"), Sequence):
            raise StrategyError(f"a parallel config is {{dims: {{dim: degree}}, devices: [device ids]}}, got {d!r}")
        return cls.make(d["dims"], d["devices"])

    def __str__(self) -> str:
        dims = ",".join(f"{k}={v}" for k, v in self.dims if v > 1) or "1"
        return f"[{dims}]@{list(self.devices)}"


def _integers(values: Any, field: str, dtype: type) -> np.ndarray:
    """``values`` as a flat integer array of ``dtype``; an entry that is not an integer (1.7,
    nan, null, a string) or does not fit ``dtype`` is a StrategyError naming
    ``strategy.<field>[i]`` (it would otherwise be truncated or wrap around)."""
    if values is None or isinstance(values, (str, bytes, dict)):
        raise StrategyError(f"strategy.{field} must be a list of integers, got {values!r:.80}")
    if isinstance(values, (list, tuple)):
        flags = [i for i, x in enumerate(values) if isinstance(x, (bool, str, bytes))]
        if flags:
            raise StrategyError(f"strategy.{field}[{flags[0]}] = {values[flags[0]]!r} is not an integer")
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError):
        arr = np.asarray(list(values), dtype=object) if isinstance(values, (list, tuple)) else np.asarray(None)
    if arr.ndim != 1:
        raise StrategyError(f"strategy.{field} must be a flat list of integers, got {values!r:.80}")
    info = np.iinfo(dtype)
    if arr.dtype.kind in "iu":
        bad = np.flatnonzero((arr < info.min) | (arr > info.max))
    else:
        items = arr.tolist()
        bad = np.array([i for i, x in enumerate(items) if isinstance(x, bool) or not _whole(x, info.min, info.max)], dtype=np.int64)
        if not len(bad):
            arr = np.array([int(x) for x in items], dtype=np.int64)
    if len(bad):
        i = int(bad[0])
        x = arr[i].item() if isinstance(arr[i], np.generic) else arr[i]
        why = "out of range" if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and float(x).is_integer() \
            else "not an integer"
        raise StrategyError(f"strategy.{field}[{i}] = {x!r} is {why}")
    return arr.astype(dtype)


def _whole(x: Any, lo: int, hi: int) -> bool:
    """Whether ``x`` is an integer (an int, or an integral finite float) in ``lo..hi``."""
    if isinstance(x, (int, np.integer)):
        return lo <= int(x) <= hi
    if isinstance(x, (float, np.floating)):
        return math.isfinite(x) and float(x).is_integer() and lo <= x <= hi
    return False


def _check_permutation(order: np.ndarray) -> None:
    """A file's ``order`` is a permutation of ``0..n-1`` (each node's position in one global
    schedule, as every algorithm here writes it); else a StrategyError naming the node."""
    n = len(order)
    out = np.flatnonzero((order < 0) | (order >= n))
    if len(out):
        v = int(out[0])
        raise StrategyError(f"strategy.order[{v}] = {int(order[v])} is out of range: order gives each node its position "
                            f"in one schedule, a permutation of 0..{n - 1}")
    values, first = np.unique(order, return_index=True)
    if len(values) < n:
        v = int(np.flatnonzero(~np.isin(np.arange(n), first))[0])
        k = int(order[v])
        raise StrategyError(f"strategy.order[{v}] = {k} repeats node {int(first[np.searchsorted(values, k)])}'s position: "
                            f"order must be a permutation of 0..{n - 1}")


@dataclass(eq=False)
class Strategy:
    """Per node: ``device`` (-1 where a config applies), ``order`` and ``config_id`` (-1 = none)."""

    device: np.ndarray
    order: np.ndarray
    config_id: np.ndarray | None = None
    configs: list[ParallelConfig] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.device = _integers(self.device, "device", np.int32)
        self.order = _integers(self.order, "order", np.int64)
        n = len(self.device)
        self.config_id = np.full(n, -1, dtype=np.int32) if self.config_id is None else _integers(self.config_id, "config_id", np.int32)

    @classmethod
    def placement(cls, device: Sequence[int] | np.ndarray, order: Sequence[int] | np.ndarray | None = None, **meta: Any) -> "Strategy":
        """An operator placement; ``order`` defaults to node order (a topological order)."""
        dev = np.asarray(device)
        return cls(dev, np.arange(len(dev)) if order is None else np.asarray(order), meta=dict(meta))

    @classmethod
    def uniform_config(cls, n: int, config: ParallelConfig, order: Sequence[int] | np.ndarray | None = None, **meta: Any) -> "Strategy":
        """The same parallel config on every node (data parallelism is ``{"sample": N}``)."""
        return cls(
            np.full(n, -1, dtype=np.int32),
            np.arange(n) if order is None else np.asarray(order),
            np.zeros(n, dtype=np.int32),
            [config],
            dict(meta),
        )

    @property
    def num_nodes(self) -> int:
        return len(self.device)

    def config_of(self, v: int) -> ParallelConfig | None:
        c = int(self.config_id[v])
        return self.configs[c] if c >= 0 else None

    def devices_used(self) -> list[int]:
        used = set(self.device[self.config_id < 0].tolist())
        for c in set(self.config_id[self.config_id >= 0].tolist()):
            used.update(self.configs[c].devices)
        return sorted(used)

    # ------------------------------------------------------------------ validation
    def validate(self, graph: Any, num_devices: int) -> None:
        """Raise :class:`StrategyError` unless every node is assigned to existing devices,
        configs' degrees multiply to their shard count (at most the device count), and
        ``order`` respects every edge of ``graph`` (integer ids and degrees >= 1 were checked
        when the strategy and its configs were built)."""
        n = graph.num_nodes
        names = graph.names
        for arr, what in ((self.device, "device"), (self.order, "order"), (self.config_id, "config_id")):
            if len(arr) != n:
                raise StrategyError(f"strategy.{what} has {len(arr)} entries but the graph has {n} nodes")
        bad_cfg = np.flatnonzero((self.config_id < -1) | (self.config_id >= len(self.configs)))
        if len(bad_cfg):
            v = int(bad_cfg[0])
            raise StrategyError(f"node {v} ({names[v]}) has config_id {int(self.config_id[v])}, but there are {len(self.configs)} configs")
        placed = self.config_id < 0
        bad = np.flatnonzero(placed & ((self.device < 0) | (self.device >= num_devices)))
        if len(bad):
            v = int(bad[0])
            what = "is not assigned to any device" if self.device[v] < 0 else f"is placed on device {int(self.device[v])}"
            raise StrategyError(f"node {v} ({names[v]}) {what}; the cluster has devices 0..{num_devices - 1} ({len(bad)} such nodes)")
        for i, c in enumerate(self.configs):
            if c.degree != len(c.devices):
                raise StrategyError(f"config {i} {c}: degrees multiply to {c.degree} but it lists {len(c.devices)} devices")
            if c.degree > num_devices:
                raise StrategyError(f"config {i} {c}: degree {c.degree} exceeds the {num_devices} devices")
            if any(d < 0 or d >= num_devices for d in c.devices):
                raise StrategyError(f"config {i} {c} names a device outside 0..{num_devices - 1}")
            if len(set(c.devices)) != len(c.devices):
                raise StrategyError(f"config {i} {c} puts two shards on one device")
        if graph.num_edges:
            src, dst = graph.src, graph.dst
            viol = np.flatnonzero(self.order[src] >= self.order[dst])
            if len(viol):
                e = int(viol[0])
                u, v = int(src[e]), int(dst[e])
                raise StrategyError(
                    f"schedule order runs {names[v]} (order {int(self.order[v])}) no later than its input "
                    f"{names[u]} (order {int(self.order[u])}); order must respect every edge ({len(viol)} violations)"
                )

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": STRATEGY_FORMAT,
            "device": self.device.tolist(),
            "order": self.order.tolist(),
            "config_id": self.config_id.tolist(),
            "configs": [c.to_dict() for c in self.configs],
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Strategy":
        """The strategy of a :meth:`to_dict` mapping; a missing field, a config that is not one
        and a value that is not an integer are a :class:`StrategyError` naming it."""
        if d.get("format") != STRATEGY_FORMAT:
            raise StrategyError(f"not a strategy: format is {d.get('format')!r}, expected {STRATEGY_FORMAT!r}")
        if "device" not in d:
            raise StrategyError("strategy field 'device' is missing (a strategy has device, and optionally order, config_id, configs)")
        n = len(d["device"]) if isinstance(d["device"], Sequence) and not isinstance(d["device"], str) else 0
        if not isinstance(d.get("configs", []), list):
            raise StrategyError(f"strategy.configs must be a list of parallel configs, got {d['configs']!r:.80}")
        if not isinstance(d.get("meta", {}), Mapping):
            raise StrategyError(f"strategy.meta must be an object, got {d['meta']!r:.80}")
        configs = []
        for i, c in enumerate(d.get("configs", [])):
            try:
                configs.append(ParallelConfig.from_dict(c))
            except StrategyError as e:
                raise StrategyError(f"strategy configs[{i}]: {e}") from None
        order = d["order"] if "order" in d else np.arange(n)  # hand-written: node order (ids are a topological order)
        config_id = d["config_id"] if "config_id" in d else None
        if "config_id" in d and config_id is None:
            raise StrategyError("strategy.config_id must be a list of config indices (-1: none), got null")
        out = cls(d["device"], order, config_id, configs, dict(d.get("meta", {})))
        _check_permutation(out.order)
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def read(cls, path: str | Path) -> tuple["Strategy", dict[str, Any]]:
        """The strategy saved at ``path`` and the whole JSON object (a job's strategy.json also
        carries ``graph``, ``plan_graph`` and ``plan_origin``: docs/strategy_format.md); a bad
        file is a :class:`StrategyError` naming it."""
        d = read_json_object(path, "strategy file", StrategyError)
        try:
            return cls.from_dict(d), d
        except StrategyError as e:
            raise StrategyError(f"strategy file {path}: {e}") from None

    @classmethod
    def load(cls, path: str | Path) -> "Strategy":
        """The strategy saved at ``path``; a bad file is a :class:`StrategyError` naming it."""
        d = read_json_object(path, "strategy file", StrategyError)
        try:
            return cls.from_dict(d)
        except StrategyError as e:
            raise StrategyError(f"strategy file {path}: {e}") from None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Strategy):
            return NotImplemented
        return (
            np.array_equal(self.device, other.device)
            and np.array_equal(self.order, other.order)
            and np.array_equal(self.config_id, other.config_id)
            and self.configs == other.configs
            and self.meta == other.meta
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(eq=False)
class Plan:
    """An algorithm's answer: the graph its strategy refers to, the strategy, and what it reports.

    ``origin[i]`` is the node of the input graph that node i of ``graph`` came from (-1 for
    nodes the rewrite added, e.g. a gather); ``None`` when the graph is the input graph.
    ``info`` carries algorithm-specific figures (K, table sizes, ``search_complete``,
    ``objective_s``) that end up in result.json.
    """

    graph: Any
    strategy: Strategy
    origin: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)
