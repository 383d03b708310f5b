"""Expansion of (graph, strategy, cluster, costs) into a task graph the event engine runs.

Tasks are of three kinds: ``COMPUTE`` (one shard of an operator on its device),
``TRANSFER`` (bytes over the links of a route) and ``COLLECTIVE`` (a gradient all-reduce
over the links of a ring).  The expansion happens in two stages:

1. *Shards* (virtual nodes): a placed node is one shard; a node with a
   :class:`~harness.core.strategy.ParallelConfig` along the sample dimension is one shard per
   device, each doing ``1/k`` of the work when its work shrinks with the batch split
   (:meth:`~harness.core.graph.OpGraph.batch_scaled`: ``batched`` ops and ``partial`` ops that
   read a batched tensor) or all of it when it does not (``replicated`` ops, and ``partial``
   ops on parameter-sized data such as an unrolled RNN's gradient accumulation).  An edge from a
   ``partial`` producer (a weight gradient) to a ``replicated`` consumer that needs the
   whole sum (the optimizer update) inserts one all-reduce among the producer's devices;
   a replica's partial read by the same replica (batch-norm statistics) stays local.  That
   is where data parallelism's gradient synchronisation comes from, without the simulator
   knowing what "data parallel" is.
2. *Tasks* (vectorised): every shard becomes a compute task; every edge between shards on
   different devices becomes a transfer, cached per (producer shard, destination device) as
   in Baechi so a tensor crosses a link once however many consumers it has there; every
   parameter read on a device other than its home becomes a transfer at step start.

Memory follows liveness through *buffers*: a non-view compute task allocates its output
when it starts, a transfer allocates the received copy on the destination; views,
getitem and detach allocate nothing and pass their input's buffer on; a buffer is freed
when the last task that reads it finishes.  Parameters (and, where configured, their
optimizer state) are resident on their home device for the whole step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import BATCHED, PARTIAL, REPLICATED, UPDATE, OpGraph
from harness.core.strategy import Strategy, StrategyError
from simulators.hostcost import Messages, host_cost

COMPUTE, TRANSFER, COLLECTIVE = 0, 1, 2
TASK_KINDS = ("compute", "transfer", "collective")


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


@dataclass(eq=False)
class TaskGraph:
    """Stage 2: tasks with dependencies (CSR), resources and buffers, ready for the engine."""

    kind: np.ndarray  # int8
    dev: np.ndarray  # compute: device; transfer: source device; collective: -1
    dst: np.ndarray  # transfer: destination device, else -1
    dur: np.ndarray  # seconds
    prio: np.ndarray  # compute: schedule key
    node: np.ndarray  # graph node of a compute task (or of the tensor moved); -1 if none
    param: np.ndarray  # parameter moved by a parameter transfer, else -1
    nbytes: np.ndarray  # bytes moved by a transfer / reduced by a collective
    res_ptr: np.ndarray  # links held by a transfer / collective (CSR)
    res_idx: np.ndarray
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    indeg: np.ndarray
    alloc_dev: np.ndarray  # device of the buffer this task allocates (-1 none)
    alloc_bytes: np.ndarray
    use_ptr: np.ndarray  # buffers (ids = allocating task) each task reads (CSR)
    use_idx: np.ndarray
    static_mem: np.ndarray  # bytes resident all step per device (parameters)
    num_shards: int
    wire_bytes: np.ndarray  # bytes on the wire per task (a ring all-reduce moves 2(p-1)/p per member)
    meta: dict[str, Any] = field(default_factory=dict)
    #: optional per-task phase (harness.core.graph.PHASES index) and label, for graphs whose nodes
    #: have no phase of their own (a layer graph's node runs forward and backward)
    phase: np.ndarray | None = None
    label: list[str] | None = None
    #: per task: compute time a transfer takes from its destination device if that device is
    #: computing when it arrives (:mod:`simulators.hostcost`, ``recv_when: busy``: the receiving
    #: thread preempts the running op, which ends that much later); 0 for other tasks, None without any
    steal: np.ndarray | None = None

    @property
    def num_tasks(self) -> int:
        return len(self.kind)


# ---------------------------------------------------------------------------- stage 1
def _out_mem(graph: OpGraph) -> np.ndarray:
    return np.where(graph.free | (graph.phase == UPDATE), 0, graph.out_bytes).astype(np.int64)


def param_home_nodes(graph: OpGraph) -> np.ndarray:
    """Home node of each parameter: its update op, else its first reader."""
    home = graph.update_node.astype(np.int64).copy() if len(graph.update_node) else np.full(len(graph.param_bytes), -1, np.int64)
    if len(home) < len(graph.param_bytes):
        home = np.concatenate([home, np.full(len(graph.param_bytes) - len(home), -1)])
    return np.where(home >= 0, home, graph.param_first_reader())


def _placement_shards(graph: OpGraph, strategy: Strategy, cluster: Cluster, costs: CostModel) -> Shards:
    n = graph.num_nodes
    dev = strategy.device.astype(np.int64)
    dur = np.zeros(n)
    for d in np.unique(dev).tolist():
        sel = dev == d
        dur[sel] = costs.node_times(graph, d)[sel]
    counts = np.diff(graph.param_ptr)
    r_shard = np.repeat(np.arange(n), counts)
    r_param = graph.param_idx.astype(np.int64)
    home_node = param_home_nodes(graph)
    home = np.zeros((len(graph.param_bytes), cluster.num_devices), dtype=bool)
    has = home_node >= 0
    home[np.flatnonzero(has), dev[home_node[has]]] = True
    return Shards(
        node=np.arange(n),
        dev=dev,
        dur=dur,
        prio=strategy.order.astype(np.int64),
        forward=graph.free.copy(),
        mem=_out_mem(graph),
        is_coll=np.zeros(n, dtype=bool),
        coll_devices={},
        e_src=graph.src.astype(np.int64),
        e_dst=graph.dst.astype(np.int64),
        e_bytes=graph.nbytes.astype(np.int64),
        e_data=np.ones(graph.num_edges, dtype=bool),
        r_shard=r_shard,
        r_param=r_param,
        home=home,
    )


def _config_shards(graph: OpGraph, strategy: Strategy, cluster: Cluster, costs: CostModel) -> Shards:
    """General expansion: placed nodes and sample-dimension configs, in a Python loop."""
    n = graph.num_nodes
    role = graph.batch_role.tolist()
    scaled = graph.batch_scaled().tolist()
    out_mem = _out_mem(graph).tolist()
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
        mem = out_mem[v] // k if role[v] == BATCHED else out_mem[v]
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


def make_shards(graph: OpGraph, strategy: Strategy, cluster: Cluster, costs: CostModel) -> Shards:
    """Stage 1 of the expansion (vectorised when the strategy is a pure placement)."""
    if (strategy.config_id < 0).all():
        return _placement_shards(graph, strategy, cluster, costs)
    return _config_shards(graph, strategy, cluster, costs)


# ---------------------------------------------------------------------------- stage 2
def _buffer_roots(forward: np.ndarray, inp_task: np.ndarray, inp_buf: np.ndarray) -> np.ndarray:
    """For every task, the task whose buffer its output really is.

    A forwarding task (a view, getitem, detach, or a collective reducing in place) owns no
    buffer: its output is its first data input's buffer, which is a producer on the same
    device or the transfer that brought the tensor there.  ``inp_task``/``inp_buf`` list
    (task, input buffer) pairs in edge order; the first pair of each task wins.
    """
    T = len(forward)
    first = np.full(T, -1, dtype=np.int64)
    first[inp_task[::-1]] = inp_buf[::-1]
    root = np.arange(T, dtype=np.int64)
    fwd = np.flatnonzero(forward & (first >= 0))
    root[fwd] = first[fwd]
    while True:
        nxt = root[root]
        if np.array_equal(nxt, root):
            return root
        root = nxt


def sorted_unique(a: np.ndarray, return_inverse: bool = False) -> Any:
    """Sorted unique values (and inverse), by sorting: numpy's hash-based unique is slower here."""
    if not return_inverse:
        s = np.sort(a)
        return s[np.concatenate([[True], s[1:] != s[:-1]])] if len(s) else s
    order = np.argsort(a, kind="stable")
    s = a[order]
    first = np.concatenate([[True], s[1:] != s[:-1]]) if len(s) else np.zeros(0, dtype=bool)
    inv = np.empty(len(a), dtype=np.int64)
    inv[order] = np.cumsum(first) - 1
    return s[first], inv


def csr(n: int, keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Compressed rows of (key, value) pairs over keys ``0..n-1``: ``(ptr, values)``, each
    row's values in their input order."""
    order = np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=ptr[1:])
    return ptr, vals[order]


def build_taskgraph(graph: OpGraph, strategy: Strategy, cluster: Cluster, costs: CostModel) -> TaskGraph:
    """Expand a validated strategy into the engine's task graph."""
    sh = make_shards(graph, strategy, cluster, costs)
    m = len(sh.node)
    D = cluster.num_devices

    # members hand their partial sums to a collective in place, and its result is local on
    # every member device: neither needs a transfer
    remote = sh.e_data & (sh.dev[sh.e_src] != sh.dev[sh.e_dst]) & ~sh.is_coll[sh.e_dst]
    if sh.coll_devices:
        for idx in np.flatnonzero(remote & sh.is_coll[sh.e_src]).tolist():
            if sh.dev[sh.e_dst[idx]] in sh.coll_devices[int(sh.e_src[idx])]:
                remote[idx] = False
    local = ~remote

    # transfers, cached per (producer shard, destination device)
    r_src = sh.e_src[remote]
    r_dstdev = sh.dev[sh.e_dst[remote]]
    key = r_src * D + r_dstdev
    ukey, inv = sorted_unique(key, return_inverse=True)
    nt = len(ukey)
    t_bytes = np.zeros(nt, dtype=np.int64)
    np.maximum.at(t_bytes, inv, sh.e_bytes[remote])
    t_src = ukey // D
    t_dstdev = ukey % D
    t_srcdev = sh.dev[t_src]
    t_ids = m + np.arange(nt)

    # parameter transfers: reads on a device that is not the parameter's home
    r_dev = sh.dev[sh.r_shard]
    pr_remote = ~sh.home[sh.r_param, r_dev] if len(sh.r_param) else np.zeros(0, dtype=bool)
    pkey = sh.r_param[pr_remote] * D + r_dev[pr_remote]
    upkey, pinv = sorted_unique(pkey, return_inverse=True)
    npt = len(upkey)
    p_param = upkey // D
    p_dstdev = upkey % D
    p_srcdev = np.argmax(sh.home[p_param], axis=1) if npt else np.zeros(0, dtype=np.int64)
    p_bytes = graph.param_bytes[p_param].astype(np.int64) if npt else np.zeros(0, dtype=np.int64)
    p_ids = m + nt + np.arange(npt)
    T = m + nt + npt

    # dependencies
    dep_src = np.concatenate([sh.e_src[local], t_src, t_ids[inv], p_ids[pinv]])
    dep_dst = np.concatenate([sh.e_dst[local], t_ids, sh.e_dst[remote], sh.r_shard[pr_remote]])
    pair = sorted_unique(dep_src * T + dep_dst)
    dep_src, dep_dst = pair // T, pair % T
    succ_ptr, succ_idx = csr(T, dep_src, dep_dst)
    indeg = np.bincount(dep_dst, minlength=T)

    # durations and resources
    dur = np.concatenate([sh.dur, np.zeros(nt + npt)])
    lat, bw = cluster.route_lat, cluster.route_bw
    tt = np.concatenate([t_srcdev, p_srcdev]).astype(np.int64)
    td = np.concatenate([t_dstdev, p_dstdev]).astype(np.int64)
    tb = np.concatenate([t_bytes, p_bytes]).astype(np.float64)
    dur[m:] = np.where(tb > 0, lat[tt, td] + tb / bw[tt, td], 0.0)
    # what the messages (not the parameter reads) cost the endpoints' cores on CPU ranks; a
    # collective's anchor device keeps it in that device's schedule order
    kind = np.full(T, TRANSFER, dtype=np.int8)
    kind[:m] = np.where(sh.is_coll, COLLECTIVE, COMPUTE)
    message = np.zeros(T, dtype=bool)
    message[m:m + nt] = True
    msgs = Messages.of(kind == COMPUTE, np.concatenate([sh.dev, np.full(nt + npt, -1)]),
                       np.concatenate([sh.prio, np.zeros(nt + npt, dtype=np.int64)]), dur,
                       np.concatenate([np.zeros(m, dtype=np.int64), t_bytes, p_bytes]), dep_src, dep_dst, message)
    dur, steal = host_cost(cluster).charge(msgs)
    # links held: a transfer its route's, a collective every link of its ring
    wire = np.zeros(T, dtype=np.float64)
    wire[m:] = tb
    res_len = np.zeros(T, dtype=np.int64)
    res_len[m:] = cluster.route_len[tt, td]
    ring: dict[int, list[int]] = {}
    routes = cluster.routes
    for cid, devs in sh.coll_devices.items():
        p = len(devs)
        ring[cid] = sorted({l for k in range(p) for l in routes[devs[k]][devs[(k + 1) % p]]})
        res_len[cid] = len(ring[cid])
        wire[cid] = 2.0 * (p - 1) * graph.out_bytes[sh.node[cid]]
    res_ptr = np.zeros(T + 1, dtype=np.int64)
    np.cumsum(res_len, out=res_ptr[1:])
    res_idx = np.zeros(int(res_ptr[-1]), dtype=np.int64)
    if len(tt) and cluster.route_links.shape[2]:
        links = cluster.route_links[tt, td]
        res_idx[res_ptr[m]:] = links[links >= 0]  # row-major: each transfer's links in route order
    for cid, ls in ring.items():
        res_idx[res_ptr[cid]:res_ptr[cid + 1]] = ls

    dev = np.concatenate([np.where(sh.is_coll, -1, sh.dev), tt])
    dst = np.concatenate([np.full(m, -1), td])
    node = np.concatenate([sh.node, sh.node[t_src] if nt else np.zeros(0, np.int64), np.full(npt, -1)])
    param = np.concatenate([np.full(m + nt, -1), p_param])
    nbytes = np.concatenate([np.zeros(m, dtype=np.int64), tb.astype(np.int64)])
    for cid in sh.coll_devices:
        nbytes[cid] = graph.out_bytes[sh.node[cid]]

    # buffers: compute shards that do not forward allocate; transfers allocate on the destination
    alloc_dev = np.concatenate([np.where(sh.forward, -1, sh.dev), td])
    alloc_bytes = np.concatenate([np.where(sh.forward, 0, sh.mem), tb.astype(np.int64)])
    ldata = np.flatnonzero(local & sh.e_data)
    rdata = np.flatnonzero(remote)
    # (reader, input) pairs in edge order, inputs still naming tasks that may forward
    in_task = np.concatenate([sh.e_dst[ldata], sh.e_dst[rdata]])
    in_buf = np.concatenate([sh.e_src[ldata], t_ids[inv]])
    by_edge = np.argsort(np.concatenate([ldata, rdata]), kind="stable")
    forward = np.concatenate([sh.forward, np.zeros(nt + npt, dtype=bool)])
    root = _buffer_roots(forward, in_task[by_edge], in_buf[by_edge])
    u_task = np.concatenate([in_task, t_ids, sh.r_shard[pr_remote]])
    u_buf = np.concatenate([root[in_buf], root[t_src], p_ids[pinv]])
    keep = alloc_dev[u_buf] >= 0
    upair = sorted_unique(u_task[keep] * T + u_buf[keep])
    use_ptr, use_idx = csr(T, upair // T, upair % T)

    static = np.zeros(D, dtype=np.int64)
    for p in range(len(graph.param_bytes)):
        static[sh.home[p]] += graph.param_bytes[p]
    opt_factor = float(graph.meta.get("optimizer_state_factor", 0.0))
    static = (static * (1.0 + opt_factor)).astype(np.int64)

    prio = np.concatenate([sh.prio, np.zeros(nt + npt, dtype=np.int64)])
    return TaskGraph(
        kind=kind, dev=dev, dst=dst, dur=dur, prio=prio, node=node, param=param, nbytes=nbytes,
        res_ptr=res_ptr, res_idx=res_idx, succ_ptr=succ_ptr, succ_idx=succ_idx, indeg=indeg,
        alloc_dev=alloc_dev, alloc_bytes=alloc_bytes, use_ptr=use_ptr, use_idx=use_idx,
        static_mem=static, num_shards=m, wire_bytes=wire, steal=steal,
    )
