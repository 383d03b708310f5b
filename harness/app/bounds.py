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
from harness.core.layergraph import LayerGraph


def _node_times(graph: Any, costs: Any, device: int, fraction: float) -> np.ndarray:
    """Seconds of every node of ``graph`` doing ``fraction`` of its work on ``device`` (a layer
    graph's layers: forward plus backward)."""
    if isinstance(graph, LayerGraph):
        fwd, bwd = costs.layer_times(graph, device, fraction)
        return np.asarray(fwd, dtype=np.float64) + np.asarray(bwd, dtype=np.float64)
    return np.asarray(costs.node_times(graph, device, fraction), dtype=np.float64)


def problem_bound(graph: Any, cluster: Cluster, costs: Any) -> dict[str, float]:
    """``lower_bound_s``, ``bound_work_s`` and ``bound_critical_path_s`` of the problem
    (see the module docstring)."""
    ndev = cluster.num_devices
    fastest: dict[str, int] = {}
    for d, dev in enumerate(cluster.devices):
        fastest.setdefault(dev.spec.kind, d)
    n = graph.num_nodes
    work = np.full(n, np.inf)
    span = np.full(n, np.inf)
    for k in range(1, ndev + 1):
        for d in fastest.values():
            t = _node_times(graph, costs, d, 1.0 / k)
            work = np.minimum(work, k * t)
            span = np.minimum(span, t)
    if n == 0:
        return {"lower_bound_s": 0.0, "bound_work_s": 0.0, "bound_critical_path_s": 0.0}
    cp = float(np.max(tlevel(graph, span, np.zeros(graph.num_edges)) + span))
    work_bound = float(work.sum()) / ndev
    return {"lower_bound_s": max(work_bound, cp), "bound_work_s": work_bound, "bound_critical_path_s": cp}
