"""The expansion's stage 1 written as the loop it was before it ran on arrays
(:mod:`simulators.shards`): the reference the vectorised one is held equal to, array for
array, in tests/test_simulator.py."""

from __future__ import annotations

import numpy as np

from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import BATCHED, PARTIAL, REPLICATED, OpGraph
from harness.core.strategy import Strategy, StrategyError
from simulators.shards import Shards, out_mem, param_home_nodes


def make_shards_loop(graph: OpGraph, strategy: Strategy, cluster: Cluster, costs: CostModel) -> Shards:
    """Stage 1 as a loop over nodes, then edges, then consumer shards, then producer shards."""
    n = graph.num_nodes
    role = graph.batch_role.tolist()
    scaled = graph.batch_scaled().tolist()
    omem = out_mem(graph).tolist()
    free = graph.free.tolist()
    order = strategy.order.tolist()
    times: dict[tuple[int, float], np.ndarray] = {}

    def t(v: int, d: int, frac: float) -> float:
        key = (d, frac)
        if key not in times:
            times[key] = costs.node_times(graph, d, frac)
        return float(times[key][v])

    s_node: list[int] = []
    s_dev: list[int] = []
    s_dur: list[float] = []
    s_prio: list[int] = []
    s_fwd: list[bool] = []
    s_mem: list[int] = []
    s_coll: list[bool] = []
    coll_devices: dict[int, tuple[int, ...]] = {}
    shards_of: list[list[int]] = []
    for v in range(n):
        cfg = strategy.config_of(v)
        if cfg is None:
            devs: tuple[int, ...] = (int(strategy.device[v]),)
        else:
            other = [k for k, deg in cfg.dims if k != "sample" and deg > 1]
            if other:
                raise StrategyError(
                    f"node {v} ({graph.names[v]}) is split along {other}: the operator-graph simulator "
                    "splits only the sample dimension (layer-graph configs are simulated on the LayerGraph)"
                )
            devs = cfg.devices
        k = len(devs)
        frac = 1.0 / k if scaled[v] else 1.0
        # only a batched output is split; a partial one (a replica's partial sum) is whole-sized
        mem = omem[v] // k if role[v] == BATCHED else omem[v]
        ids = []
        for d in devs:
            ids.append(len(s_node))
            s_node.append(v)
            s_dev.append(d)
            s_dur.append(t(v, d, frac))
            s_prio.append(order[v])
            s_fwd.append(free[v])
            s_mem.append(mem)
            s_coll.append(False)
        shards_of.append(ids)

    e_src: list[int] = []
    e_dst: list[int] = []
    e_bytes: list[int] = []
    e_data: list[bool] = []
    coll_of: dict[int, int] = {}
    # collectives get ids after all shards; they are appended in creation order, and each
    # depends only on shards of its producer, so "shards, then collectives" with explicit
    # edges stays a DAG (the engine does not need ids in topological order).
    n_shards = len(s_node)
    c_node: list[int] = []
    c_dev: list[int] = []
    c_dur: list[float] = []
    for e in range(graph.num_edges):
        u, v, b = int(graph.src[e]), int(graph.dst[e]), int(graph.nbytes[e])
        su, sv = shards_of[u], shards_of[v]
        ku, kv = len(su), len(sv)
        du = [s_dev[i] for i in su]
        for j, sj in enumerate(sv):
            dj = s_dev[sj]
            batched_need = role[u] == BATCHED and role[v] != REPLICATED
            lo, hi = (j / kv, (j + 1) / kv) if batched_need else (0.0, 1.0)
            if role[u] == BATCHED and ku > 1:
                for i, si in enumerate(su):
                    ov = min(hi, (i + 1) / ku) - max(lo, i / ku)
                    if ov > 1e-12:
                        e_src.append(si), e_dst.append(sj), e_bytes.append(int(round(b * ov))), e_data.append(True)
            elif role[u] == PARTIAL and ku > 1:
                if role[v] != REPLICATED and du == [s_dev[x] for x in sv]:
                    # a replica's partial result read by the same replica (a view of a weight
                    # gradient, batch-norm statistics, the loss weight) stays local, as in DDP;
                    # only a whole-tensor consumer (the optimizer update) needs the sum
                    e_src.append(su[j]), e_dst.append(sj), e_bytes.append(b), e_data.append(True)
                    continue
                if u not in coll_of:
                    cid = n_shards + len(c_node)
                    coll_of[u] = cid
                    c_node.append(u)
                    c_dev.append(du[0])
                    c_dur.append(costs.allreduce_time(float(graph.out_bytes[u]), du))
                    coll_devices[cid] = tuple(du)
                    for si in su:  # the collective reduces its members' buffers in place
                        e_src.append(si), e_dst.append(cid), e_bytes.append(0), e_data.append(True)
                cid = coll_of[u]
                if dj in du:
                    e_src.append(su[du.index(dj)]), e_dst.append(sj), e_bytes.append(0), e_data.append(True)
                    e_src.append(cid), e_dst.append(sj), e_bytes.append(0), e_data.append(False)
                else:
                    e_src.append(cid), e_dst.append(sj), e_bytes.append(int(round(b * (hi - lo)))), e_data.append(True)
            else:
                src_i = du.index(dj) if dj in du else j % ku
                e_src.append(su[src_i]), e_dst.append(sj), e_bytes.append(int(round(b * (hi - lo)))), e_data.append(True)

    home_node = param_home_nodes(graph)
    home = np.zeros((len(graph.param_bytes), cluster.num_devices), dtype=bool)
    for p, h in enumerate(home_node.tolist()):
        if h >= 0:
            home[p, [s_dev[i] for i in shards_of[h]]] = True
    r_shard: list[int] = []
    r_param: list[int] = []
    for v in range(n):
        for p in graph.params_of(v).tolist():
            for si in shards_of[v]:
                r_shard.append(si)
                r_param.append(p)

    nc = len(c_node)
    return Shards(
        node=np.asarray(s_node + c_node, dtype=np.int64),
        dev=np.asarray(s_dev + c_dev, dtype=np.int64),
        dur=np.asarray(s_dur + c_dur, dtype=np.float64),
        prio=np.asarray(s_prio + [0] * nc, dtype=np.int64),
        forward=np.asarray(s_fwd + [True] * nc, dtype=bool),
        mem=np.asarray(s_mem + [0] * nc, dtype=np.int64),
        is_coll=np.asarray(s_coll + [True] * nc, dtype=bool),
        coll_devices=coll_devices,
        e_src=np.asarray(e_src, dtype=np.int64),
        e_dst=np.asarray(e_dst, dtype=np.int64),
        e_bytes=np.asarray(e_bytes, dtype=np.int64),
        e_data=np.asarray(e_data, dtype=bool),
        r_shard=np.asarray(r_shard, dtype=np.int64),
        r_param=np.asarray(r_param, dtype=np.int64),
        home=home,
    )
