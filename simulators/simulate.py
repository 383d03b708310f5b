"""Replay a plan on a cluster: expansion, event engine, and what a researcher reads off it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from harness.core.checks import known_keys, one_of
from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.errors import OptionError
from harness.core.graph import PHASES, OpGraph
from harness.core.layergraph import LayerGraph
from harness.core.strategy import Strategy
from simulators import engine
from simulators.taskgraph import COLLECTIVE, COMPUTE, TASK_KINDS, TRANSFER, TaskGraph, build_taskgraph, sorted_unique


@dataclass(eq=False)
class SimResult:
    """What one simulated training step gives.

    ``plan_lower_bound_s`` = max(critical path of the plan's compute tasks with communication
    free, the plan's total compute / number of devices): no schedule of *this plan* on this
    cluster can beat it, so ``step_time_s / plan_lower_bound_s - 1`` is the gap left to any
    scheduler of it.  It depends on the plan (its splits, its graph); the problem's bound, the
    same for every plan, is the app ring's (``harness.app.bounds``, ``lower_bound_s`` in result.json).
    """

    step_time_s: float
    plan_lower_bound_s: float
    plan_critical_path_s: float
    plan_work_bound_s: float
    device_busy_s: list[float]
    peak_memory_bytes: list[int]
    mem_capacity_bytes: list[int]
    oom: bool
    oom_devices: list[int]
    comm_bytes: int
    bytes_by_class: dict[str, int]
    num_tasks: dict[str, int]
    taskgraph: TaskGraph = field(repr=False)
    timeline: engine.EngineResult = field(repr=False)
    graph: OpGraph = field(repr=False)
    cluster: Cluster = field(repr=False)
    #: figures another backend adds to result.json (sim=realrun: measured_step_time_s, ...)
    extras: dict[str, Any] = field(default_factory=dict, repr=False)
    #: sim=realrun with ``trace``: the real run's events per rank (see ``Measured.timeline``)
    measured_timeline: dict[str, Any] | None = field(default=None, repr=False)
    #: sim=realrun with ``interleave_profile``: the plan's cost model with the ops' times profiled
    #: during the run (``simulators.realrun.interleaved_costs``), to simulate the plan again with
    #: them on another cluster description (``experiments.sim_accuracy``'s communication models)
    interleaved_costs: Any = field(default=None, repr=False)

    @property
    def plan_gap(self) -> float:
        """The step over the plan's bound, minus 1."""
        return self.step_time_s / self.plan_lower_bound_s - 1.0 if self.plan_lower_bound_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """The numbers that go into result.json."""
        return {
            "step_time_s": self.step_time_s,
            "plan_lower_bound_s": self.plan_lower_bound_s,
            "plan_critical_path_s": self.plan_critical_path_s,
            "plan_work_bound_s": self.plan_work_bound_s,
            "plan_gap_to_bound": self.plan_gap,
            "oom": self.oom,
            "oom_devices": self.oom_devices,
            "comm_bytes": self.comm_bytes,
            "bytes_by_class": self.bytes_by_class,
            "peak_memory_bytes": self.peak_memory_bytes,
            "mem_capacity_bytes": self.mem_capacity_bytes,
            "device_busy_s": self.device_busy_s,
            "num_tasks": self.num_tasks,
            **self.extras,
        }

    # ------------------------------------------------------------------ timeline export
    def task_label(self, t: int) -> str:
        tg = self.taskgraph
        if tg.label is not None:
            return tg.label[t]
        k = int(tg.kind[t])
        v = int(tg.node[t])
        if k == TRANSFER and tg.param[t] >= 0:
            return f"param {self.graph.param_names[int(tg.param[t])]}"
        name = self.graph.names[v] if v >= 0 else "?"
        return name if k == COMPUTE else f"{TASK_KINDS[k]} {name}"

    def chrome_trace(self, max_tasks: int | None = None) -> dict[str, Any]:
        """A Chrome / Perfetto trace (``chrome://tracing``, ui.perfetto.dev): one row per device
        and per link, times in microseconds."""
        tg, tl, cl = self.taskgraph, self.timeline, self.cluster
        events: list[dict[str, Any]] = []
        for d, dv in enumerate(cl.devices):
            events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": d, "args": {"name": dv.name}})
        events.append({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "devices"}})
        events.append({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "links"}})
        used = sorted(set(tg.res_idx.tolist()))
        for l in used:
            events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": l, "args": {"name": f"{cl.links[l].name} ({cl.links[l].cls})"}})
        order = np.argsort(tl.start, kind="stable")
        truncated = max_tasks is not None and len(order) > max_tasks
        if truncated:
            order = order[:max_tasks]
        phase = tg.phase if tg.phase is not None else self.graph.phase[np.maximum(tg.node, 0)]
        targets = getattr(self.graph, "targets", None) or getattr(self.graph, "kinds", None)
        for t in order.tolist():
            k = int(tg.kind[t])
            ts, du = float(tl.start[t]) * 1e6, float(tl.end[t] - tl.start[t]) * 1e6
            v = int(tg.node[t])
            if k == COMPUTE:
                events.append({
                    "ph": "X", "name": self.task_label(t), "cat": PHASES[phase[t]], "pid": 0, "tid": int(tg.dev[t]),
                    "ts": ts, "dur": du, "args": {"node": v, "target": targets[v]},
                })
            else:
                for i in range(tg.res_ptr[t], tg.res_ptr[t + 1]):
                    events.append({
                        "ph": "X", "name": self.task_label(t), "cat": TASK_KINDS[k], "pid": 1, "tid": int(tg.res_idx[i]),
                        "ts": ts, "dur": du, "args": {"bytes": int(tg.nbytes[t])},
                    })
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"truncated": truncated, "step_time_s": self.step_time_s}}

    def write_trace(self, path: str | Path, max_tasks: int | None = None) -> None:
        Path(path).write_text(json.dumps(self.chrome_trace(max_tasks)))


def simulate(graph: OpGraph | LayerGraph, strategy: Strategy, cluster: Cluster, costs: CostModel, order: str = "strict") -> SimResult:
    """Expand and run one training step (validates the strategy first); a :class:`LayerGraph`
    is expanded by :func:`simulators.layer_taskgraph.build_layer_taskgraph`."""
    strategy.validate(graph, cluster.num_devices)
    if isinstance(graph, LayerGraph):
        from simulators.layer_taskgraph import build_layer_taskgraph

        tg = build_layer_taskgraph(graph, strategy, cluster, costs)
    else:
        tg = build_taskgraph(graph, strategy, cluster, costs)
    tl = engine.run(tg, cluster.num_devices, len(cluster.links), order)
    comp = tg.kind == COMPUTE
    total_work = float(tg.dur[comp].sum())
    work_bound = total_work / cluster.num_devices
    cap = cluster.mem_capacity
    oom_devs = np.flatnonzero(tl.peak_mem > cap).tolist()

    # bytes per link class: a task counts once for every class its route touches
    classes = cluster.link_classes
    cls_of_link = np.array([classes.index(l.cls) for l in cluster.links], dtype=np.int64)
    owner = np.repeat(np.arange(tg.num_tasks), np.diff(tg.res_ptr))
    by_class: dict[str, int] = {c: 0 for c in classes}
    if len(owner):
        pairs = sorted_unique(owner * len(classes) + cls_of_link[tg.res_idx])
        sums = np.bincount(pairs % len(classes), weights=tg.wire_bytes[pairs // len(classes)], minlength=len(classes))
        by_class = {c: int(round(s)) for c, s in zip(classes, sums)}
    kinds = np.bincount(tg.kind, minlength=3)
    return SimResult(
        step_time_s=float(tl.makespan),
        plan_lower_bound_s=max(float(tl.critical_path), work_bound),
        plan_critical_path_s=float(tl.critical_path),
        plan_work_bound_s=work_bound,
        device_busy_s=tl.busy.tolist(),
        peak_memory_bytes=tl.peak_mem.tolist(),
        mem_capacity_bytes=cap.tolist(),
        oom=bool(oom_devs),
        oom_devices=oom_devs,
        comm_bytes=int(round(float(tg.wire_bytes[tg.kind != COMPUTE].sum()))),
        bytes_by_class=by_class,
        num_tasks={"compute": int(kinds[COMPUTE]), "transfer": int(kinds[TRANSFER]), "collective": int(kinds[COLLECTIVE])},
        taskgraph=tg,
        timeline=tl,
        graph=graph,
        cluster=cluster,
    )


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
