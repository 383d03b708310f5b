"""Graph statistics: size, work and CCR (Celeritas Eq. 1)."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.costs import CostModel
from harness.graph import OpGraph


def ccr(graph: OpGraph, costs: CostModel, src: int = 0, dst: int = 1) -> float:
    """CCR = sum of c_ij over edges / sum of w_i over nodes (Celeritas Eq. 1).

    c_ij is the alpha-beta time of edge (i, j)'s bytes between devices ``src`` and ``dst``
    (every edge as if it crossed devices), w_i the node's compute time on ``src``.
    """
    w = costs.node_times(graph, src).sum()
    if graph.num_edges == 0 or w == 0:
        return 0.0
    cl = costs.cluster
    if cl.num_devices < 2:
        return 0.0
    lat, bw = cl.route_lat[src, dst], cl.route_bw[src, dst]
    c = np.where(graph.nbytes > 0, lat + graph.nbytes / bw, 0.0).sum()
    return float(c / w)


def graph_stats(graph: OpGraph, costs: CostModel) -> dict[str, Any]:
    """Nodes, edges, work, parameters and CCR of a graph (one row of ``graph_stats``)."""
    t = costs.node_times(graph, 0)
    return {
        "nodes": graph.num_nodes,
        "edges": graph.num_edges,
        "free_nodes": int(graph.free.sum()),
        **{f"{k}_nodes": v for k, v in graph.subgraph_sizes().items()},
        "gflops": float(graph.flops.sum() / 1e9),
        "param_mib": float(graph.param_bytes.sum() / 2**20),
        "edge_gib": float(graph.nbytes.sum() / 2**30),
        "compute_s": float(t.sum()),
        "ccr": ccr(graph, costs),
        "coloc_groups": len(graph.coloc_groups()),
    }
