"""A graph's identity across captures: a batch-independent fingerprint of its structure and
sizes, per-node keys that find an operation in another graph's profile, and the layer runs of an
aten graph.  Profiles (``costs=profiled``) and saved strategies are matched to graphs by these."""

from __future__ import annotations

import hashlib

import numpy as np

from harness.core.graph import OpGraph


def graph_fingerprint(graph: OpGraph) -> str:
    """A batch-independent identity of a graph's structure and sizes.

    Per node: target, batch role and FLOPs per sample (FLOPs of batch-dependent nodes are
    linear in the batch size, those of replicated nodes constant), plus the parameter
    sizes.  Two captures of one model at two batch sizes share it; a model at another image
    size, width or depth does not.  Works at every granularity (coarse graphs keep FLOPs).
    """
    b = max(int(graph.meta.get("batch_size", 1) or 1), 1)
    per = np.where(graph.batch_scaled(), graph.flops / b, graph.flops)
    h = hashlib.sha1()
    for t, r, f in zip(graph.targets, graph.batch_role.tolist(), per.tolist()):
        h.update(f"{t}|{r}|{f:.6e}\n".encode())
    h.update(",".join(str(int(x)) for x in graph.param_bytes).encode())
    return h.hexdigest()


def node_keys(graph: OpGraph) -> list[str]:
    """Per node, a key that identifies the operation across graphs: target, FLOPs, bytes
    read + written and output bytes (what a profile can be looked up by when the graph's
    fingerprint does not match any profiled capture)."""
    return [f"{t}|{f:.6e}|{int(w)}|{int(o)}" for t, f, w, o in zip(graph.targets, graph.flops.tolist(), graph.work_bytes.tolist(), graph.out_bytes.tolist())]


def layer_runs(graph: OpGraph) -> np.ndarray:
    """The coarse node each node of an aten graph belongs to at ``layer`` granularity
    (the same runs :func:`harness.core.graph_rewrites.coarsen_runs` contracts)."""
    key = graph.layer.astype(np.int64) * 4 + graph.phase
    if graph.num_nodes == 0:
        return np.zeros(0, np.int64)
    return np.cumsum(np.concatenate([[True], key[1:] != key[:-1]])) - 1
