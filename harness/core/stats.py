"""Graph statistics: size, work, parameters (the CCR of Celeritas Eq. 1 is
:func:`algorithms.sched.levels.graph_ccr`: it needs the static costs the algorithms plan with)."""

from __future__ import annotations

from typing import Any

from harness.core.costs import CostModel
from harness.core.graph import OpGraph


def graph_stats(graph: OpGraph, costs: CostModel) -> dict[str, Any]:
    """Nodes, edges, work and parameters of a graph (a row of ``python -m experiments graph_stats``)."""
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
        "coloc_groups": len(graph.coloc_groups()),
    }
