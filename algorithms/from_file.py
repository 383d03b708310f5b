"""Replay a saved or hand-written strategy (``algo=from_file algo.path=strategy.json``).

The file is a strategy as :meth:`harness.core.strategy.Strategy.to_dict` writes it - a job's
``strategy.json``, or one written by hand (docs/strategy_format.md, docs/strategy.schema.json).
A job's file also says which graph it was planned for (``graph``: kind, node count, model,
fingerprint) and, when its plan's graph is a rewrite of the captured one (FD-DPS's split graph),
names that graph's file (``plan_graph``, relative to the strategy file) and ``plan_origin``; the
replayed plan is then the same graph and strategy, so it simulates to the same step time.

Every mistake is a :class:`ReplayError` (a :class:`~harness.core.errors.UserError`) of one line
that names the file and what does not fit: a missing or malformed file, a strategy planned on a
layer graph, one for another graph (both graphs named), a device outside the cluster (the node
named), an order that breaks an edge.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from algorithms.base import Algorithm
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.errors import UserError
from harness.core.graph import OpGraph
from harness.core.strategy import Plan, Strategy, StrategyError, graph_identity

#: what ``algo.path`` holds when the user gave none (OmegaConf's mandatory value)
MISSING = "???"


class ReplayError(StrategyError):
    """A strategy file cannot be replayed on this job's graph and cluster; the message names the
    file, the culprit and the fix."""


def describe_graph(rec: dict[str, Any]) -> str:
    """``model (N nodes, fingerprint abcdef012345)`` of a :func:`graph_identity` record."""
    fp = rec.get("fingerprint")
    return f"{rec.get('model') or 'a graph'} ({rec.get('nodes')} nodes" + (f", fingerprint {str(fp)[:12]})" if fp else ")")


def plan_graph_path(p: Path, name: Any) -> Path:
    """The file a strategy file's ``plan_graph`` names: a plain file name beside ``p`` (no
    folder, no ``..``, not absolute), which, symbolic links followed, stays in ``p``'s folder;
    anything else is a :class:`ReplayError`: a data file never reaches outside its own folder."""
    if not isinstance(name, str) or not name:
        raise ReplayError(f"strategy file {p}: 'plan_graph' must be the name of a graph file beside it, got {name!r:.60}")
    if name in (".", "..") or "/" in name or "\\" in name or "\0" in name or Path(name).is_absolute():
        raise ReplayError(f"strategy file {p}: plan_graph {name!r:.80} must be a plain file name in the strategy file's own "
                          "folder (no path, no '..'): copy the graph beside the strategy file")
    folder = p.parent.resolve()
    gp = p.parent / name
    if not gp.is_file():
        raise ReplayError(f"strategy file {p} names plan_graph {name}, but {gp} does not exist or is not a file: copy it along "
                          "with the strategy file")
    if gp.resolve().parent != folder:
        raise ReplayError(f"strategy file {p}: plan_graph {name} is a link to {gp.resolve()}, outside the strategy file's folder "
                          f"{folder}: copy the graph itself beside the strategy file")
    return gp


class FromFile(Algorithm):
    """Loads the strategy at ``path``, checks it against the graph and the cluster and returns it
    as the plan (no search)."""

    graph_kind = "op"

    def __init__(self, name: str = "from_file", seed: int = 0, path: str | None = None) -> None:
        super().__init__(name, seed)
        if path is not None and not isinstance(path, (str, Path)):
            raise ReplayError(f"algo.path must be the path of a strategy file, got {path!r:.60}")
        self.path = path

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": self.path}

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        if not self.path or str(self.path) == MISSING:
            raise ReplayError("algo=from_file needs the strategy to replay: add algo.path=<a job's strategy.json or one "
                              "written by hand> (docs/strategy_format.md)")
        p = Path(str(self.path))
        if not p.exists():
            raise ReplayError(f"algo.path={p}: no such strategy file; give a job's strategy.json (outputs/<date>/<time>/strategy.json) "
                              "or one written by hand (docs/strategy_format.md)")
        strategy, d = Strategy.read(p)
        rec = d.get("graph")
        if rec is not None and not isinstance(rec, dict):
            raise ReplayError(f"strategy file {p}: 'graph' must be an object (kind, nodes, fingerprint), got {rec!r:.60}")
        rec = rec or {}
        if rec.get("kind", "op") != "op":
            raise ReplayError(f"strategy file {p} was planned on a {rec.get('kind')} graph (algo={strategy.meta.get('algo', '?')}); "
                              "algo=from_file replays operator-graph strategies only: run that algorithm itself")
        here = graph_identity(graph)
        other = (("nodes" in rec and rec["nodes"] != here["nodes"])
                 or ("fingerprint" in rec and rec["fingerprint"] != here["fingerprint"]))
        if other:
            raise ReplayError(f"strategy file {p} is for another graph: it was planned for {describe_graph(rec)}, this job's graph is "
                              f"{describe_graph(here)}; replay it with the model, batch-independent options and graph.* settings it was planned with")
        plan_graph, origin = graph, None
        if d.get("plan_graph") is not None:
            plan_graph, origin = self.load_plan_graph(p, d)
        elif strategy.num_nodes != graph.num_nodes:
            raise ReplayError(f"strategy file {p} is for another graph: it has {strategy.num_nodes} nodes, this job's graph "
                              f"{describe_graph(here)} has {graph.num_nodes}; replay it with the model it was planned for")
        try:
            strategy.validate(plan_graph, cluster.num_devices)
        except StrategyError as e:
            raise ReplayError(f"strategy file {p} does not fit cluster {cluster.name} and this graph: {e}") from None
        info = {"replayed_from": str(p)}
        if strategy.meta.get("algo") is not None:
            info["source_algo"] = strategy.meta["algo"]
        return Plan(plan_graph, strategy, origin=origin, info=info)

    @staticmethod
    def load_plan_graph(p: Path, d: dict[str, Any]) -> tuple[OpGraph, np.ndarray | None]:
        """The plan graph a strategy file names (relative to it) and its ``plan_origin``."""
        gp = plan_graph_path(p, d["plan_graph"])
        try:
            g = OpGraph.load(gp)
        except UserError as e:
            raise ReplayError(f"strategy file {p}: its plan graph {gp}: {str(e).splitlines()[0]}") from None
        raw = d.get("plan_origin")
        if raw is None:
            return g, None
        try:
            origin = np.asarray(raw, dtype=np.int64)
        except (TypeError, ValueError):
            raise ReplayError(f"strategy file {p}: plan_origin must be a list of node ids (or -1), got {raw!r:.60}") from None
        if origin.shape != (g.num_nodes,):
            raise ReplayError(f"strategy file {p}: plan_origin has {origin.size} entries but its plan graph {gp} has {g.num_nodes} nodes")
        if origin.size and int(origin.min()) < -1:
            raise ReplayError(f"strategy file {p}: plan_origin[{int(np.argmin(origin))}] = {int(origin.min())}; an origin is a node id or -1")
        return g, origin
