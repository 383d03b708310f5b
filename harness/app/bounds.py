"""The problem's lower bound: a step no plan of (graph, cluster, costs) can beat.

``lower_bound_s`` in result.json is a property of the *problem* (the captured graph, the
cluster, the cost model; the batch is part of the graph), the same for every plan of it,
whichever algorithm made the plan::

    lower_bound_s = max(bound_work_s, bound_critical_path_s)
    bound_work_s          = sum over nodes of min_k k * t(v, 1/k)  /  number of devices
    bound_critical_path_s = the longest path of the graph with node weights min_k t(v, 1/k)
                            and free communication

where ``t(v, f)`` is the cost model's time of node ``v`` doing a share ``f`` of its work on
the fastest device kind of the cluster, and ``k`` runs over 1 .. number of devices: a node may
be split into at most that many equal shards (the simulator's sample-dimension split), which
do at least ``min_k k * t(v, 1/k)`` of work between them and of which none ends sooner than
``min_k t(v, 1/k)``.  A layer graph (the problem of a layer-graph algorithm) counts a layer's
forward and backward time.  ``gap_to_bound`` is the step over this bound, minus 1.

A stack graph (a transformer by its shape, or a CNN's layers in order: the problem of the
pipeline algorithms, ``algo=megatron``, ``fsdp``) has only the work bound: its training FLOPs
at the device's peak over every GPU, the same for every plan::

    lower_bound_s = bound_work_s = sum over kernel rows r of  B * flops_r / peak(math_r)  /  number of devices

where the rows are every unit's forward and backward kernels for one sequence, unsharded
(:func:`harness.core.llm.work.unit_work`; recomputation is extra work a plan chooses, left
out), ``peak(math)`` the fastest device kind's peak in the row's math mode (dense tensor-core
FLOP/s at the precision, :func:`harness.core.costs.math_peak`) and ``B`` the global batch; a
CNN's units count their layers' forward and backward at the layer graph's rate, as above.
``bound_critical_path_s`` is 0 there: a micro-batched pipeline runs a layer on fractions of the
batch smaller than one device's share, so the operator graph's critical-path argument does
not carry over.

The simulator's own bound (``plan_lower_bound_s``: the plan's critical path with free
communication and the plan's work over the devices) is tighter but depends on the plan: an
algorithm that splits nothing has a long critical path, so two plans of one problem had two
"lower bounds".  Both stay in result.json under their own names.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.sched.levels import tlevel
from harness.core.cluster import Cluster
from harness.core.costs import MATH_PEAK_KEYS, math_peak
from harness.core.layergraph import LayerGraph
from harness.core.llm.stack import StackGraph
from harness.core.llm.work import Shard, unit_work


def _node_times(graph: Any, costs: Any, device: int, fraction: float) -> np.ndarray:
    """Seconds of every node of ``graph`` doing ``fraction`` of its work on ``device`` (a layer
    graph's layers: forward plus backward)."""
    if isinstance(graph, LayerGraph):
        fwd, bwd = costs.layer_times(graph, device, fraction)
        return np.asarray(fwd, dtype=np.float64) + np.asarray(bwd, dtype=np.float64)
    return np.asarray(costs.node_times(graph, device, fraction), dtype=np.float64)


def device_kinds(cluster: Cluster) -> list[int]:
    """One device of each kind of the cluster (the first)."""
    fastest: dict[str, int] = {}
    for d, dev in enumerate(cluster.devices):
        fastest.setdefault(dev.spec.kind, d)
    return list(fastest.values())


def node_work_span(graph: Any, cluster: Cluster, costs: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per node, ``min_k k * t(v, 1/k)`` (the least work its shards do) and ``min_k t(v, 1/k)``
    (the soonest a shard ends), over ``k`` = 1 .. devices and the device kinds."""
    ndev = cluster.num_devices
    n = graph.num_nodes
    work = np.full(n, np.inf)
    span = np.full(n, np.inf)
    for k in range(1, ndev + 1):
        for d in device_kinds(cluster):
            t = _node_times(graph, costs, d, 1.0 / k)
            work = np.minimum(work, k * t)
            span = np.minimum(span, t)
    return work, span


def problem_bound(graph: Any, cluster: Cluster, costs: Any) -> dict[str, float]:
    """``lower_bound_s``, ``bound_work_s`` and ``bound_critical_path_s`` of the problem
    (see the module docstring)."""
    if isinstance(graph, StackGraph):
        return stack_bound(graph, cluster, costs)
    ndev = cluster.num_devices
    if graph.num_nodes == 0:
        return {"lower_bound_s": 0.0, "bound_work_s": 0.0, "bound_critical_path_s": 0.0}
    work, span = node_work_span(graph, cluster, costs)
    cp = float(np.max(tlevel(graph, span, np.zeros(graph.num_edges)) + span))
    work_bound = float(work.sum()) / ndev
    return {"lower_bound_s": max(work_bound, cp), "bound_work_s": work_bound, "bound_critical_path_s": cp}


def stack_bound(graph: StackGraph, cluster: Cluster, costs: Any) -> dict[str, float]:
    """The work bound of a stack graph (see the module docstring)."""
    if graph.spec is None:  # a CNN's units: its layer graph's layers
        total = float(node_work_span(graph.layer_graph, cluster, costs)[0].sum())
    else:
        total = min(graph.batch_size * sequence_seconds(graph, cluster.devices[d].spec) for d in device_kinds(cluster))
    work = total / cluster.num_devices
    return {"lower_bound_s": work, "bound_work_s": work, "bound_critical_path_s": 0.0}


def sequence_seconds(graph: StackGraph, spec: Any) -> float:
    """One sequence's forward and backward through every unit, unsharded, each kernel row at
    ``spec``'s peak for its math mode (FLOPs over peak: no memory time, no efficiency)."""
    peaks = np.array([math_peak(spec, m) for m in range(len(MATH_PEAK_KEYS))])
    by_signature: dict[Any, float] = {}
    total = 0.0
    for u in range(graph.num_nodes):
        key = graph.signature(u)
        if key not in by_signature:
            w = unit_work(graph, u, Shard())
            by_signature[key] = sum(float(np.sum(t.flops() / peaks[t.math.astype(np.int64)]))
                                    for t in (w.fwd, w.bwd_input, w.bwd_weight) if len(t))
        total += by_signature[key]
    return total
