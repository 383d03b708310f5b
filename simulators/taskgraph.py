"""Expansion of (graph, strategy, cluster, costs) into a task graph the event engine runs.

Tasks are of three kinds: ``COMPUTE`` (one shard of an operator on its device),
``TRANSFER`` (bytes over the links of a route) and ``COLLECTIVE`` (a gradient all-reduce
over the links of a ring).  The expansion happens in two stages:

1. *Shards* (virtual nodes, :mod:`simulators.shards`): a placed node is one shard; a node with a
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
from harness.core.graph import OpGraph
from harness.core.strategy import Strategy
from simulators.hostcost import Messages, host_cost
from simulators.shards import make_shards

COMPUTE, TRANSFER, COLLECTIVE = 0, 1, 2
TASK_KINDS = ("compute", "transfer", "collective")


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
