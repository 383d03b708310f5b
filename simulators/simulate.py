"""Replay a plan on a cluster: expansion, event engine, and what a researcher reads off it
(:class:`simulators.result.SimResult`, re-exported here)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from harness.core.checks import known_keys, one_of
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.errors import OptionError
from harness.core.graph import OpGraph
from harness.core.layergraph import LayerGraph
from harness.core.llm.plan import ParallelPlan
from harness.core.llm.stack import StackGraph
from harness.core.strategy import Strategy
from simulators import engine
from simulators.pipeline import simulate_pipeline
from simulators.result import SimResult
from simulators.taskgraph import COMPUTE, build_taskgraph, sorted_unique

__all__ = ["SimResult", "simulate", "SimulatorBackend", "ExecutingBackend", "EventSimulator"]


def simulate(graph: OpGraph | LayerGraph | StackGraph, strategy: Strategy | ParallelPlan, cluster: Cluster, costs: CostModel,
             order: str = "strict") -> SimResult:
    """Expand and run one training step (validates the strategy first); a :class:`LayerGraph`
    is expanded by :func:`simulators.layer_taskgraph.build_layer_taskgraph`, a :class:`StackGraph`
    with its :class:`ParallelPlan` by :func:`simulators.pipeline.simulate_pipeline` (one
    representative GPU per pipeline stage)."""
    if isinstance(graph, StackGraph):
        if not isinstance(strategy, ParallelPlan):
            raise TypeError(f"a stack graph is simulated with a ParallelPlan, got {type(strategy).__name__}")
        return simulate_pipeline(graph, strategy, cluster, costs, order)
    strategy.validate(graph, cluster.num_devices)
    if isinstance(graph, LayerGraph):
        from simulators.layer_taskgraph import build_layer_taskgraph

        tg = build_layer_taskgraph(graph, strategy, cluster, costs)
    else:
        tg = build_taskgraph(graph, strategy, cluster, costs)
    tl = engine.run(tg, cluster.num_devices, len(cluster.links), order)
    # bytes per link class: a task counts once for every class its route touches
    classes = cluster.link_classes
    cls_of_link = np.array([classes.index(l.cls) for l in cluster.links], dtype=np.int64)
    owner = np.repeat(np.arange(tg.num_tasks), np.diff(tg.res_ptr))
    by_class: dict[str, int] = {c: 0 for c in classes}
    if len(owner):
        pairs = sorted_unique(owner * len(classes) + cls_of_link[tg.res_idx])
        sums = np.bincount(pairs % len(classes), weights=tg.wire_bytes[pairs // len(classes)], minlength=len(classes))
        by_class = {c: int(round(s)) for c, s in zip(classes, sums)}
    return SimResult.of_run(tg, tl, graph, cluster, cluster.num_devices, cluster.mem_capacity,
                            int(round(float(tg.wire_bytes[tg.kind != COMPUTE].sum()))), by_class)


@runtime_checkable
class SimulatorBackend(Protocol):
    """What a ``conf/sim`` file's ``_target_`` builds: a callable that turns a plan into a
    :class:`SimResult` (a backend may add its own figures to ``SimResult.extras``)."""

    def __call__(self, graph: OpGraph | LayerGraph, strategy: Strategy, cluster: Cluster, costs: CostModel) -> SimResult:
        ...


@runtime_checkable
class ExecutingBackend(SimulatorBackend, Protocol):
    """A backend that executes the plan for real (``sim=realrun``): ``harness.run`` captures the
    graph with its fx module and binds the model source (and the seed and graph options) to it
    before calling it, so that it can build real parameters and batches."""

    def bind(self, source: Any, seed: int = 0, graph_cfg: dict[str, Any] | None = None) -> None:
        ...


class EventSimulator:
    """``sim=default``: the discrete-event simulator as a pluggable backend."""

    def __init__(self, order: str = "strict", **params: Any) -> None:
        known_keys(params, ("order",), "sim", OptionError)  # a misspelt key: one line with the key it meant
        self.order = one_of(order, "sim.order", engine.MODES, OptionError)
        self.params = params

    def __call__(self, graph: OpGraph, strategy: Strategy, cluster: Cluster, costs: CostModel) -> SimResult:
        return simulate(graph, strategy, cluster, costs, self.order)
