"""Metis (Karypis and Kumar 1997) as a placement baseline (Celeritas Sec. 6.2.2): a k-way
partition of the operator graph into as many parts as devices with pymetis, minimising
the edge cut under a balance constraint.

* Vertex weights are compute times w_i (:func:`algorithms.listsched.static_costs`),
  edge weights are the bytes an edge moves; the graph is made undirected (METIS needs
  both directions).  METIS takes positive integers: weights are scaled so that the
  largest is ``weight_scale`` and rounded up to at least 1 (views and getitem, which
  take no time, weigh 1).
* Balance: METIS's ``ufactor`` (the allowed imbalance in thousandths: 30 = 3%, METIS's
  default for k-way), and its ``seed`` from the config.
* Memory: the partition ignores it, as METIS does (Celeritas Table 3 shows Metis OOM on
  three of four models); the simulator reports the OOM.
* Co-location groups follow their first member (:func:`algorithms.base.follow_colocation`);
  the schedule order is node order (a topological order).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.base import Algorithm, follow_colocation
from algorithms.listsched import static_costs
from harness.cluster import Cluster
from harness.costs import CostModel
from harness.graph import OpGraph
from harness.strategy import Plan, Strategy


def _scaled(x: np.ndarray, top: int) -> np.ndarray:
    """Positive integers proportional to x, the largest equal to ``top``."""
    x = np.asarray(x, dtype=np.float64)
    mx = float(x.max(initial=0.0))
    if mx <= 0:
        return np.ones(len(x), dtype=np.int64)
    return np.maximum(1, np.ceil(x / mx * top)).astype(np.int64)


def metis_partition(graph: OpGraph, parts: int, vweights: np.ndarray, eweights: np.ndarray, ufactor: int = 30, seed: int = 0) -> tuple[np.ndarray, int]:
    """pymetis k-way partition of the undirected version of ``graph``: (part per node, edge cut)."""
    n = graph.num_nodes
    if parts <= 1 or n == 0:
        return np.zeros(n, dtype=np.int64), 0
    try:
        import pymetis
    except ImportError as e:  # pragma: no cover - pymetis is a declared dependency
        raise ImportError("algo=metis needs pymetis (pip install pymetis; it is in pyproject.toml)") from e
    u = np.concatenate([graph.src, graph.dst]).astype(np.int64)
    v = np.concatenate([graph.dst, graph.src]).astype(np.int64)
    ew = np.concatenate([eweights, eweights]).astype(np.int64)
    order = np.lexsort((v, u))
    u, v, ew = u[order], v[order], ew[order]
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(u, minlength=n), out=xadj[1:])
    opts = pymetis.Options(ufactor=int(ufactor), seed=int(seed))
    weights = dict(vweights=vweights.tolist(), eweights=ew.tolist(), options=opts)
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2
        cut, membership = pymetis.part_graph(parts, pymetis.CSRAdjacency(xadj.tolist(), v.tolist()), **weights)
    else:  # pragma: no cover - older pymetis
        cut, membership = pymetis.part_graph(parts, xadj=xadj.tolist(), adjncy=v.tolist(), **weights)
    return np.asarray(membership, dtype=np.int64), int(cut)


class Metis(Algorithm):
    """k-way Metis partition: vertex weight = compute time, edge weight = bytes."""

    def __init__(self, name: str = "metis", ufactor: int = 30, weight_scale: int = 100000, **kw: Any) -> None:
        if int(ufactor) < 1:
            raise ValueError(f"{name}: ufactor must be >= 1 (thousandths of imbalance), got {ufactor}")
        super().__init__(name, ufactor=int(ufactor), weight_scale=int(weight_scale), **kw)
        self.ufactor = int(ufactor)
        self.weight_scale = int(weight_scale)

    def plan(self, graph: OpGraph, cluster: Cluster, costs: CostModel) -> Plan:
        w, _ = static_costs(graph, cluster, costs)
        vw = _scaled(w, self.weight_scale)
        ew = _scaled(graph.nbytes, self.weight_scale)
        part, cut = metis_partition(graph, cluster.num_devices, vw, ew, self.ufactor, self.seed)
        device = follow_colocation(graph, part)
        load = np.bincount(device, weights=w, minlength=cluster.num_devices)
        info = {"edge_cut_weight": cut, "compute_per_device_s": load.tolist(), "cut_bytes": int(graph.nbytes[device[graph.src] != device[graph.dst]].sum())}
        return Plan(graph, Strategy.placement(device), info=info)
