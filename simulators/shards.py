"""Stage 1 of the expansion (:mod:`simulators.taskgraph`): nodes into shards (virtual nodes),
edges into edges between shards, and the all-reduces a partial result needs.

A placed node is one shard; a node with a sample-dimension :class:`~harness.core.strategy.ParallelConfig`
is one shard per device of the config, in its order.  For an edge ``u -> v``, consumer shard
``j`` of ``v`` (of ``kv``) reads the part ``[j/kv, (j+1)/kv)`` of a batched tensor it needs
batched, else all of it, from

* every shard of a batched ``u`` split ``ku > 1`` ways whose part overlaps its own (by more
  than 1e-12 of the tensor), that overlap's bytes;
* a partial ``u`` split ``ku > 1`` ways: its own replica's partial when ``v`` is split on the
  same devices and needs no whole tensor (as in DDP: batch-norm statistics, a view of a weight
  gradient), else the all-reduce of ``u``'s partials (created at the first edge that needs it,
  one per producer), after which a consumer on one of ``u``'s devices reads its local copy;
* otherwise the shard of ``u`` on its own device, else shard ``j mod ku``.

Everything is computed on arrays, edge part by edge part, and laid out in the order a loop
over edges, then consumer shards, then producer shards would emit it (the collectives'
member edges just before the first edge part that needs them), so that the task graph, and
every tie the engine breaks by id, do not depend on how it was computed
(``tests/test_simulator.py`` holds it equal to that loop, ``tests/taskgraph_reference.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import BATCHED, PARTIAL, REPLICATED, UPDATE, OpGraph
from harness.core.strategy import Strategy, StrategyError


@dataclass(eq=False)
class Shards:
    """Stage 1: one entry per shard (virtual node), in a topological order."""

    node: np.ndarray  # original node id per shard; -1 for a collective
    dev: np.ndarray  # device; a collective's anchor device (where its result is read from)
    dur: np.ndarray  # seconds of compute (collectives: their all-reduce time)
    prio: np.ndarray  # schedule key on its device
    forward: np.ndarray  # bool: allocates nothing, passes its first local input's buffer on
    mem: np.ndarray  # bytes its output allocates on its device
    is_coll: np.ndarray  # bool
    coll_devices: dict[int, tuple[int, ...]]
    # edges between shards: data edges carry a buffer (and may need a transfer), dep edges only order
    e_src: np.ndarray
    e_dst: np.ndarray
    e_bytes: np.ndarray
    e_data: np.ndarray  # bool
    # parameter reads: (shard, param) pairs and, per param, its home devices
    r_shard: np.ndarray
    r_param: np.ndarray
    home: np.ndarray  # bool [num_params, num_devices]


def out_mem(graph: OpGraph) -> np.ndarray:
    """Bytes a node's output allocates: none for views and the optimizer's updates."""
    return np.where(graph.free | (graph.phase == UPDATE), 0, graph.out_bytes).astype(np.int64)


def param_home_nodes(graph: OpGraph) -> np.ndarray:
    """Home node of each parameter: its update op, else its first reader."""
    home = graph.update_node.astype(np.int64).copy() if len(graph.update_node) else np.full(len(graph.param_bytes), -1, np.int64)
    if len(home) < len(graph.param_bytes):
        home = np.concatenate([home, np.full(len(graph.param_bytes) - len(home), -1)])
    return np.where(home >= 0, home, graph.param_first_reader())


def make_shards(graph: OpGraph, strategy: Strategy, cluster: Cluster, costs: CostModel) -> Shards:
    """Stage 1 of the expansion (see the module docstring)."""
    n = graph.num_nodes
    cid = strategy.config_id.astype(np.int64)
    has_cfg = cid >= 0
    cfgs = strategy.configs
    _check_sample_only(graph, cfgs, cid)
    # per config: its devices (padded), and the first position of every device among them
    k_cfg = np.array([len(c.devices) for c in cfgs], dtype=np.int64)
    kmax = int(k_cfg.max(initial=1))
    D = cluster.num_devices
    cfg_dev = np.zeros((max(len(cfgs), 1), kmax), dtype=np.int64)
    cfg_pos = np.full((max(len(cfgs), 1), D), -1, dtype=np.int64)
    dev_tuple: dict[tuple[int, ...], int] = {}
    cfg_tuple = np.zeros(max(len(cfgs), 1), dtype=np.int64)
    for c, cfg in enumerate(cfgs):
        devs = [int(d) for d in cfg.devices]
        cfg_dev[c, :len(devs)] = devs
        for i in range(len(devs) - 1, -1, -1):
            cfg_pos[c, devs[i]] = i
        cfg_tuple[c] = dev_tuple.setdefault(tuple(devs), len(dev_tuple))
    c0 = np.maximum(cid, 0)
    k = np.where(has_cfg, k_cfg[c0] if len(cfgs) else 1, 1)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(k, out=ptr[1:])
    S = int(ptr[-1])
    s_node = np.repeat(np.arange(n, dtype=np.int64), k)
    s_j = np.arange(S, dtype=np.int64) - ptr[s_node]
    s_dev = np.where(has_cfg[s_node], cfg_dev[c0[s_node], np.minimum(s_j, kmax - 1)], strategy.device.astype(np.int64)[s_node])

    role = graph.batch_role
    frac_node = np.where(graph.batch_scaled(), 1.0 / k, 1.0)
    s_frac = frac_node[s_node]
    s_dur = np.zeros(S)
    for frac in np.unique(s_frac).tolist():  # one cost call per (device, share of the work)
        at_f = np.flatnonzero(s_frac == frac)
        dev_f = s_dev[at_f]
        for d in np.unique(dev_f).tolist():
            sel = at_f[dev_f == d]
            s_dur[sel] = np.asarray(costs.node_times(graph, d, frac), dtype=np.float64)[s_node[sel]]
    om = out_mem(graph)
    s_mem = np.where(role == BATCHED, om // k, om)[s_node]

    e_src, e_dst, e_bytes, e_data, c_node, c_tuple = _edges(graph, k, ptr, s_dev, cid, cfg_pos, cfg_tuple)
    n_coll = len(c_node)
    c_devs = [tuple(int(d) for d in s_dev[ptr[u]:ptr[u + 1]]) for u in c_node.tolist()]
    c_dur = np.zeros(n_coll)
    for t in np.unique(c_tuple).tolist():  # one call per device group, sizes as an array
        sel = np.flatnonzero(c_tuple == t)
        c_dur[sel] = costs.allreduce_time(graph.out_bytes[c_node[sel]].astype(np.float64), c_devs[sel[0]])

    home_node = param_home_nodes(graph)
    home = np.zeros((len(graph.param_bytes), D), dtype=bool)
    ph = np.flatnonzero(home_node >= 0)
    kh = k[home_node[ph]]
    p_rep = np.repeat(ph, kh)
    within = np.arange(len(p_rep)) - np.repeat(np.cumsum(kh) - kh, kh)
    home[p_rep, s_dev[np.repeat(ptr[home_node[ph]], kh) + within]] = True
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(graph.param_ptr))
    kr = k[owner]
    r_param = np.repeat(graph.param_idx.astype(np.int64), kr)
    r_shard = np.repeat(ptr[owner], kr) + (np.arange(len(r_param)) - np.repeat(np.cumsum(kr) - kr, kr))

    return Shards(
        node=np.concatenate([s_node, c_node]),
        dev=np.concatenate([s_dev, s_dev[ptr[c_node]]]),
        dur=np.concatenate([s_dur, c_dur]),
        prio=np.concatenate([strategy.order.astype(np.int64)[s_node], np.zeros(n_coll, dtype=np.int64)]),
        forward=np.concatenate([graph.free[s_node], np.ones(n_coll, dtype=bool)]),
        mem=np.concatenate([s_mem, np.zeros(n_coll, dtype=np.int64)]),
        is_coll=np.concatenate([np.zeros(S, dtype=bool), np.ones(n_coll, dtype=bool)]),
        coll_devices={S + i: c_devs[i] for i in range(n_coll)},
        e_src=e_src, e_dst=e_dst, e_bytes=e_bytes, e_data=e_data,
        r_shard=r_shard, r_param=r_param, home=home,
    )


def _check_sample_only(graph: OpGraph, cfgs: list, cid: np.ndarray) -> None:
    """The operator-graph simulator splits only the sample dimension: name the first node that
    a config splits along another."""
    bad = [c for c, cfg in enumerate(cfgs) if any(dim != "sample" and deg > 1 for dim, deg in cfg.dims)]
    hit = np.flatnonzero(np.isin(cid, bad)) if bad else np.zeros(0, dtype=np.int64)
    if not len(hit):
        return
    v = int(hit[0])
    other = [dim for dim, deg in cfgs[int(cid[v])].dims if dim != "sample" and deg > 1]
    raise StrategyError(
        f"node {v} ({graph.names[v]}) is split along {other}: the operator-graph simulator "
        "splits only the sample dimension (layer-graph configs are simulated on the LayerGraph)"
    )


def _edges(graph: OpGraph, k: np.ndarray, ptr: np.ndarray, s_dev: np.ndarray, cid: np.ndarray, cfg_pos: np.ndarray,
           cfg_tuple: np.ndarray) -> tuple[np.ndarray, ...]:
    """Edges between shards (module docstring) and the collectives: ``(src, dst, bytes, data,
    collective producer nodes, their device-tuple ids)``, in the loop's order."""
    S = int(ptr[-1])
    role = graph.batch_role
    src, dst = graph.src.astype(np.int64), graph.dst.astype(np.int64)
    b = graph.nbytes.astype(np.int64)
    if S == graph.num_nodes:  # a shard per node: an edge per edge, whole tensors, no collective
        return src, dst, b, np.ones(len(src), dtype=bool), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ku, kv = k[src], k[dst]
    case_a = (role[src] == BATCHED) & (ku > 1)
    case_b = (role[src] == PARTIAL) & (ku > 1)
    bn = (role[src] == BATCHED) & (role[dst] != REPLICATED)  # the consumer needs its batch part
    c0 = np.maximum(cid, 0)
    local = case_b & (role[dst] != REPLICATED) & (kv == ku) & (cid[dst] >= 0) & (cfg_tuple[c0[src]] == cfg_tuple[c0[dst]])
    coll = case_b & ~local
    # the collectives, in the order of the first edge that needs one
    ce = np.flatnonzero(coll)
    c_node, first = np.unique(src[ce], return_index=True)
    c_first_e = ce[first]
    c_node = c_node[np.argsort(c_first_e, kind="stable")]
    c_first_e = np.sort(c_first_e)
    coll_id = np.full(graph.num_nodes, -1, dtype=np.int64)
    coll_id[c_node] = S + np.arange(len(c_node))
    creates = np.zeros(len(src), dtype=bool)
    creates[c_first_e] = True

    # edge parts: one per (edge, consumer shard j), numbered edge by edge
    eptr = np.cumsum(kv) - kv

    def parts(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The edge parts of the edges in ``mask``: (part id, edge, j)."""
        es = np.flatnonzero(mask)
        kk = kv[es]
        e = np.repeat(es, kk)
        j = np.arange(len(e), dtype=np.int64) - np.repeat(np.cumsum(kk) - kk, kk)
        return eptr[e] + j, e, j

    def share(e: np.ndarray, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[lo, hi): the part of the tensor consumer shard j reads (all of it unless it needs its batch part)."""
        part = bn[e]
        return np.where(part, j / kv[e], 0.0), np.where(part, (j + 1) / kv[e], 1.0)

    count = np.ones(int(kv.sum()), dtype=np.int64)
    # case A: the producer shards whose part overlaps [lo, hi) (by > 1e-12; part bounds are
    # multiples of 1 / (ku kv), so exactly those that overlap in exact arithmetic)
    pa, ea, ja = parts(case_a)
    kua, kva = ku[ea], kv[ea]
    i_lo = np.where(bn[ea], ja * kua // kva, 0)
    i_hi = np.where(bn[ea], -((-(ja + 1) * kua) // kva) - 1, kua - 1)
    nc = i_hi - i_lo + 1
    if (nc == 1).all():  # equal splits: consumer shard j reads producer shard j
        cand, ci = np.arange(len(pa)), i_lo
    else:
        cand = np.repeat(np.arange(len(pa)), nc)
        ci = np.repeat(i_lo, nc) + (np.arange(int(nc.sum())) - np.repeat(np.cumsum(nc) - nc, nc))
    lo, hi = share(ea[cand], ja[cand])
    ov = np.minimum(hi, (ci + 1) / kua[cand]) - np.maximum(lo, ci / kua[cand])
    keep = ov > 1e-12
    cand, ci, ov = cand[keep], ci[keep], ov[keep]
    ca = np.bincount(cand, minlength=len(pa))
    count[pa] = ca
    # case B, an all-reduce: its members first at the edge part that creates it, then a local
    # read plus an order edge where the consumer holds a replica, else one read of the sum
    pc, ec, jc = parts(coll)
    uc = src[ec]
    sjc = ptr[dst[ec]] + jc
    posc = cfg_pos[c0[uc], s_dev[sjc]]
    hold = posc >= 0
    creator = creates[ec] & (jc == 0)
    count[pc] = hold + 1 + np.where(creator, ku[ec], 0)
    start = np.cumsum(count) - count
    R = int(count.sum())
    o_src = np.empty(R, dtype=np.int64)
    o_dst = np.empty(R, dtype=np.int64)
    o_bytes = np.zeros(R, dtype=np.int64)
    o_data = np.ones(R, dtype=bool)
    # case A
    at = start[pa[cand]] + (np.arange(len(cand)) - (np.cumsum(ca) - ca)[cand])
    o_src[at] = ptr[src[ea[cand]]] + ci
    o_dst[at] = ptr[dst[ea[cand]]] + ja[cand]
    o_bytes[at] = np.rint(b[ea[cand]] * ov).astype(np.int64)
    # case B, the collective's members
    cr = np.flatnonzero(creator)
    kc = ku[ec[cr]]
    m = np.repeat(cr, kc)
    mi = np.arange(len(m), dtype=np.int64) - np.repeat(np.cumsum(kc) - kc, kc)
    o_src[start[pc[m]] + mi] = ptr[uc[m]] + mi
    o_dst[start[pc[m]] + mi] = coll_id[uc[m]]
    # case B, the reads after it (a partial producer's consumer reads the whole tensor: b bytes)
    at = start[pc] + np.where(creator, ku[ec], 0)
    o_src[at] = np.where(hold, ptr[uc] + posc, coll_id[uc])
    o_dst[at] = sjc
    o_bytes[at] = np.where(hold, 0, b[ec])
    o_src[at[hold] + 1] = coll_id[uc[hold]]
    o_dst[at[hold] + 1] = sjc[hold]
    o_data[at[hold] + 1] = False
    # case B, a replica's partial read by the same replica
    pl, el, jl = parts(local)
    o_src[start[pl]] = ptr[src[el]] + jl
    o_dst[start[pl]] = ptr[dst[el]] + jl
    o_bytes[start[pl]] = b[el]
    # case C: the producer shard on the consumer's device, else shard j mod ku
    pcc, ecc, jcc = parts(~case_a & ~case_b)
    u_c = src[ecc]
    dj = s_dev[ptr[dst[ecc]] + jcc]
    cpos = np.where(cid[u_c] >= 0, cfg_pos[c0[u_c], dj], np.where(s_dev[ptr[u_c]] == dj, 0, -1))
    o_src[start[pcc]] = ptr[u_c] + np.where(cpos >= 0, cpos, jcc % ku[ecc])
    o_dst[start[pcc]] = ptr[dst[ecc]] + jcc
    lo, hi = share(ecc, jcc)
    o_bytes[start[pcc]] = np.rint(b[ecc] * (hi - lo)).astype(np.int64)
    return o_src, o_dst, o_bytes, o_data, c_node, cfg_tuple[c0[c_node]]
