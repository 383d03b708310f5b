"""Rewrites of a captured operator graph that keep its dataflow.

* co-location groups: :func:`parameter_groups` (what :func:`harness.core.capture.capture`
  records: a parameter's update with its readers and its gradient's producer) and
  :func:`colocate_gradients` (TensorFlow's ``colocate_gradients_with_ops`` at module
  granularity), both built by :func:`groups_from_unions`;
* granularity: :func:`coarsen_runs` contracts each run of one layer's ops in one phase into
  a node (the layer graph the layer-level papers search, from the same capture).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from harness.core.graph import REPLICATED, UPDATE, OpGraph, edges_from_pairs


def union_roots(n: int, unions: "Iterable[tuple[int, int]]") -> np.ndarray:
    """Union-find over ``0..n-1``: per element, the smallest member of its set once every pair
    of ``unions`` is joined (so the result does not depend on the order of the pairs)."""
    parent = list(range(n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in unions:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(v) for v in range(n)], dtype=np.int64)


def groups_from_unions(n: int, unions: "Iterable[tuple[int, int]]") -> np.ndarray:
    """Co-location group ids (-1: no group) from pairs of nodes that must share a device
    (:func:`union_roots`; a group's id follows the order of its smallest member)."""
    roots = union_roots(n, unions)
    grouped = np.bincount(roots, minlength=n)[roots] > 1
    coloc = np.full(n, -1, np.int32)
    if grouped.any():
        _, ids = np.unique(roots[grouped], return_inverse=True)
        coloc[grouped] = ids
    return coloc


def parameter_groups(n: int, free: np.ndarray, src: np.ndarray, dst: np.ndarray, p_ptr: np.ndarray, p_idx: np.ndarray, grad_node: np.ndarray, update_node: np.ndarray) -> np.ndarray:
    """Co-location groups of a captured step: per parameter, the union of its update op, the
    free views that read it and the chain of views up to the op that computes its gradient."""
    pred: dict[int, list[int]] = {}
    for s, d in zip(src.tolist(), dst.tolist()):
        pred.setdefault(d, []).append(s)
    members: dict[int, list[int]] = {}
    owners = np.repeat(np.arange(n), np.diff(p_ptr))
    for v, p in zip(owners.tolist(), p_idx.tolist()):
        if free[v]:
            members.setdefault(p, []).append(v)
    unions: list[tuple[int, int]] = []
    for p in range(len(update_node)):
        group = list(members.get(p, []))
        if update_node[p] >= 0:
            group.append(int(update_node[p]))
        g = int(grad_node[p]) if p < len(grad_node) else -1
        while g >= 0:  # walk up through views to the op that computes the gradient
            group.append(g)
            if not free[g] or not pred.get(g):
                break
            g = pred[g][0]
        unions += [(group[0], v) for v in group[1:]]
    return groups_from_unions(n, unions)


def colocate_gradients(graph: OpGraph, exclude: tuple[str, ...] = ("model", "loss")) -> OpGraph:
    """A copy of ``graph`` whose co-location groups also tie every module's backward ops to
    its forward ops: TensorFlow's ``colocate_gradients_with_ops=True`` at module granularity
    (Baechi's ``--colocate_grads_with_ops``; the TF setups the Celeritas and Baechi papers
    measured place a gradient op with the op it differentiates).  ``graph.colocate_gradients``
    in the config applies it to any job.

    Groups are the union of the captured groups (parameter, gradient chain, update) and, for
    each module path not in ``exclude`` (the root module's own ops and the loss), all of its
    forward and backward nodes.  Only ``coloc`` changes; the arrays are shared."""
    import copy

    skip = {i for i, name in enumerate(graph.layer_names) if name in exclude}
    first: dict[int, int] = {}
    unions: list[tuple[int, int]] = []
    for v, layer in enumerate(graph.layer.tolist()):
        if graph.phase[v] == UPDATE or layer in skip:  # updates already follow their gradient's group
            continue
        if layer in first:
            unions.append((first[layer], v))
        else:
            first[layer] = v
    for members in graph.coloc_groups():
        unions += [(int(members[0]), v) for v in members[1:].tolist()]
    out = copy.copy(graph)
    out.coloc = groups_from_unions(graph.num_nodes, unions)
    out.meta = {**graph.meta, "colocate_gradients": True}
    return out


def coarsen_runs(g: OpGraph) -> OpGraph:
    """Layer granularity: contract maximal runs of consecutive nodes with one (layer, phase).

    Each run is an interval of a topological order, so the contracted graph is a DAG.
    FLOPs and bytes add up; a run is free only if all its members are.
    """
    key = g.layer.astype(np.int64) * 4 + g.phase
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]])) if g.num_nodes else np.zeros(0, np.int64)
    grp = np.cumsum(np.isin(np.arange(g.num_nodes), starts)) - 1
    m = len(starts)
    ext = grp[g.src] != grp[g.dst]
    src, dst, nb = edges_from_pairs(zip(grp[g.src[ext]].tolist(), grp[g.dst[ext]].tolist(), g.nbytes[ext].tolist()))
    # output bytes of a run: the tensors leaving it (or its last member's output)
    out_b = np.zeros(m, np.int64)
    leaving = np.zeros(g.num_nodes, bool)
    leaving[g.src[ext]] = True
    leaving[np.concatenate([starts[1:] - 1, [g.num_nodes - 1]])] |= True
    np.add.at(out_b, grp[leaving], g.out_bytes[leaving])
    role = np.full(m, REPLICATED, np.int8)
    np.minimum.at(role, grp, g.batch_role)
    p_lists: list[list[int]] = [[] for _ in range(m)]
    for v in range(g.num_nodes):
        p_lists[grp[v]].extend(g.params_of(v).tolist())
    p_lists = [sorted(set(x)) for x in p_lists]
    p_ptr = np.concatenate([[0], np.cumsum([len(x) for x in p_lists])]).astype(np.int64)
    coloc = np.full(m, -1, np.int32)
    np.maximum.at(coloc, grp, g.coloc)
    remap = lambda arr: np.where(arr >= 0, grp[np.maximum(arr, 0)], -1)  # noqa: E731
    free = np.ones(m, bool)
    np.logical_and.at(free, grp, g.free)
    meta = {**g.meta, "coarsened_from": g.num_nodes}
    meta.pop("batch_axis", None)
    meta.pop("renumbered_from", None)  # ids of the fine graph, not of its runs
    return OpGraph(
        names=[g.names[s] for s in starts], targets=[f"layer:{g.layer_names[g.layer[s]]}" for s in starts],
        phase=g.phase[starts], layer=g.layer[starts], layer_names=g.layer_names,
        flops=np.bincount(grp, weights=g.flops, minlength=m), out_bytes=out_b,
        work_bytes=np.bincount(grp, weights=g.work_bytes, minlength=m).astype(np.int64), free=free,
        batch_role=role, coloc=coloc, src=src, dst=dst, nbytes=nb, param_names=g.param_names,
        param_bytes=g.param_bytes, param_ptr=p_ptr, param_idx=[p for x in p_lists for p in x],
        grad_node=remap(g.grad_node), update_node=remap(g.update_node), meta=meta,
        kernels=g.kernels.remap(grp) if g.kernels is not None else None,
    )
