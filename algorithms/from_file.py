"""Replay a saved or hand-written strategy (``algo=from_file algo.path=strategy.json``).

The file is a strategy as :meth:`harness.core.strategy.Strategy.to_dict` writes it - a job's
``strategy.json``, or one written by hand (docs/strategy_format.md, docs/strategy.schema.json).
A job's file also says which graph it was planned for (``graph``: kind, node count, model,
fingerprint) and, when its plan's graph is a rewrite of the captured one (FD-DPS's split graph),
names that graph's file (``plan_graph``, relative to the strategy file) and ``plan_origin``; the
replayed plan is then the same graph and strategy, so it simulates to the same step time.

A parallel plan (a stack-graph algorithm's ``strategy.json``: ``format``
``harness.parallel_plan/1``, :class:`~harness.core.llm.plan.ParallelPlan`) replays on the stack
graph of the same model: its units are checked against the file's ``graph`` record, and the plan
against every rule of :meth:`~harness.core.llm.plan.ParallelPlan.validate` on this job's batch
and cluster (a plan may use fewer GPUs than the cluster has, as ``algo=data_parallel
algo.devices=k`` does).  A hand-written plan may leave ``stages`` out: the default partition
(:func:`~harness.core.llm.plan.default_stages`) then applies.

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
from algorithms.stack_plans import stack_plan_info
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.errors import UserError
from harness.core.graph import OpGraph, read_json_object
from harness.core.llm.plan import PLAN_FORMAT, ParallelPlan, PlanError, plan_from_degrees
from harness.core.llm.stack import StackGraph
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


def file_format(path: Any) -> str | None:
    """The ``format`` a strategy file declares, or None when it cannot be read as a JSON object
    (:meth:`FromFile.plan` then says why)."""
    try:
        return read_json_object(path, "strategy file", ReplayError).get("format")
    except UserError:
        return None


class FromFile(Algorithm):
    """Loads the strategy at ``path``, checks it against the graph and the cluster and returns it
    as the plan (no search)."""

    graph_kind = "op"

    @property
    def graph_kinds(self) -> tuple[str, ...]:
        """``stack`` for a parallel plan's file, else ``op``."""
        return ("stack",) if self.path and file_format(self.path) == PLAN_FORMAT else ("op",)

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
        if isinstance(graph, StackGraph):
            return self.plan_stack(p, graph, cluster)
        if file_format(p) == PLAN_FORMAT:
            raise ReplayError(f"strategy file {p} is a parallel plan of a stack graph, and this job's graph is an operator graph: "
                              "replay it with a model that gives a stack graph (model=llm, its presets, or a zoo CNN)")
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

    def plan_stack(self, p: Path, graph: StackGraph, cluster: Cluster) -> Plan:
        """Replay the parallel plan at ``p`` on ``graph`` (see the module docstring)."""
        d = read_json_object(p, "strategy file", ReplayError)
        rec = d.get("graph") or {}
        if not isinstance(rec, dict):
            raise ReplayError(f"strategy file {p}: 'graph' must be an object (kind, nodes, fingerprint), got {rec!r:.60}")
        here = graph_identity(graph)
        if ("nodes" in rec and rec["nodes"] != here["nodes"]) or ("fingerprint" in rec and rec["fingerprint"] != here["fingerprint"]):
            raise ReplayError(f"strategy file {p} is for another graph: it was planned for {describe_graph(rec)}, this job's graph is "
                              f"{describe_graph(here)}; replay it with the model (and model.* shape) it was planned with")
        body = {k: v for k, v in d.items() if k not in ("format", "graph")}
        try:
            plan = ParallelPlan.from_dict(d)
            if plan.gpus > cluster.num_devices:
                raise PlanError(f"the plan uses {plan.gpus} GPUs (tp x pp x dp x cp), and cluster {cluster.name} has {cluster.num_devices}")
            if not plan.stages:
                plan = plan_from_degrees(graph, plan.gpus, **{k: v for k, v in body.items() if k != "stages"})
            plan.validate(graph, plan.gpus)
        except PlanError as e:
            raise ReplayError(f"strategy file {p} does not fit cluster {cluster.name} and this graph: {e}") from None
        info: dict[str, Any] = {"replayed_from": str(p), **stack_plan_info(plan, graph, cluster)}
        if plan.meta.get("algo") is not None:
            info["source_algo"] = plan.meta["algo"]
        return Plan(graph, plan, info=info)

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
