"""What one simulated training step gives (:class:`SimResult`), whichever expansion made its task
graph: the operator graph's (:mod:`simulators.taskgraph`), the layer graph's
(:mod:`simulators.layer_taskgraph`) or a pipeline's (:mod:`simulators.pipeline`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.cluster import Cluster
from harness.core.graph import PHASES, OpGraph
from simulators import engine
from simulators.taskgraph import COMPUTE, TASK_KINDS, TRANSFER, TaskGraph


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
    #: the names of the engine's devices and links where they are not the cluster's (a pipeline's
    #: engine runs one representative GPU per stage on logical links: :mod:`simulators.pipeline`)
    device_names: list[str] | None = field(default=None, repr=False)
    link_names: list[str] | None = field(default=None, repr=False)

    @classmethod
    def of_run(cls, tg: TaskGraph, tl: engine.EngineResult, graph: Any, cluster: Cluster, devices: int,
               capacity: np.ndarray, comm_bytes: int, bytes_by_class: dict[str, int], **more: Any) -> "SimResult":
        """The result of an engine run: the step, the plan's bound (its compute tasks' critical path
        and their total over the ``devices`` the engine ran), busy time and peak memory per engine
        device against ``capacity`` (its OOM verdict), the bytes moved as the expansion counts them,
        task counts; ``more`` sets the other fields (extras, names)."""
        work_bound = float(tg.dur[tg.kind == COMPUTE].sum()) / devices
        oom = np.flatnonzero(tl.peak_mem > capacity).tolist()
        kinds = np.bincount(tg.kind, minlength=3)
        return cls(
            step_time_s=float(tl.makespan),
            plan_lower_bound_s=max(float(tl.critical_path), work_bound),
            plan_critical_path_s=float(tl.critical_path),
            plan_work_bound_s=work_bound,
            device_busy_s=tl.busy.tolist(),
            peak_memory_bytes=tl.peak_mem.tolist(),
            mem_capacity_bytes=np.asarray(capacity).tolist(),
            oom=bool(oom),
            oom_devices=oom,
            comm_bytes=int(comm_bytes),
            bytes_by_class=bytes_by_class,
            num_tasks={k: int(kinds[i]) for i, k in enumerate(TASK_KINDS)},
            taskgraph=tg,
            timeline=tl,
            graph=graph,
            cluster=cluster,
            **more,
        )

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
            "mem_runtime_bytes": max(int(d.spec.runtime_bytes) for d in self.cluster.devices),
            "mem_allocator_reserve": max(float(d.spec.alloc_reserve) for d in self.cluster.devices),
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
        dev_names = self.device_names if self.device_names is not None else [dv.name for dv in cl.devices]
        for d, name in enumerate(dev_names):
            events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": d, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "devices"}})
        events.append({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "links"}})
        used = sorted(set(tg.res_idx.tolist()))
        for l in used:
            name = self.link_names[l] if self.link_names is not None else f"{cl.links[l].name} ({cl.links[l].cls})"
            events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": l, "args": {"name": name}})
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
                    "ts": ts, "dur": du, "args": {"node": v, "target": targets[v] if targets is not None and v >= 0 else None},
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
