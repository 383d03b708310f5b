"""What a message costs the cores that send and receive it: a cluster's host-communication model.

On a GPU cluster a transfer is the links' business: the devices' compute goes on while DMA
engines move the bytes.  CPU devices that talk gloo over TCP (``cpu2``) send and receive on
their own cores, so a transfer also costs compute time on both ends.  A cluster selects its
model with its ``host_comm`` block (``Cluster.meta``, conf/cluster/*.yaml, checked against
:data:`harness.core.cluster.HOST_COMM_KEYS`): none gives :class:`NoHostCost`, which changes
nothing; one gives :class:`CpuHostCost` with its figures.  Both task-graph builders
(:func:`simulators.taskgraph.build_taskgraph` for operator graphs,
:func:`simulators.layer_taskgraph.build_layer_taskgraph` for layer graphs) describe the task
graph they build as :class:`Messages` and take the durations and the per-task ``steal`` that
:meth:`HostCost.charge` returns.  How cpu2's figures were measured:
results/calibration/README.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from harness.core.cluster import HOST_COMM_KEYS, Cluster

#: the receive models of ``host_comm.recv_when``
RECV_WHEN = ("always", "busy")


@dataclass(eq=False)
class Messages:
    """What a host-cost model reads of a task graph under construction.

    Arrays over tasks: ``dur``, ``dev``, ``prio``, ``compute``.  Arrays over messages (the
    transfers between compute tasks that the endpoints' cores send and receive; a parameter
    read at step start is none): ``task``, ``sender``, ``nbytes``.  ``read_msg`` /
    ``read_task`` pair each message with the compute tasks that wait for it; every message
    has at least one.
    """

    dur: np.ndarray  # seconds per task before any host cost (a transfer: its link's one-way time)
    dev: np.ndarray  # device whose schedule the task is in (a compute task's device), -1 for none
    prio: np.ndarray  # schedule key on that device
    compute: np.ndarray  # bool: a compute task (its time is its device's compute)
    task: np.ndarray  # per message: its transfer task
    sender: np.ndarray  # per message: the compute task whose output it sends; -1 where none pays (a collective's result)
    nbytes: np.ndarray  # per message: bytes moved (int64)
    read_msg: np.ndarray  # (message, reading compute task) pairs
    read_task: np.ndarray

    @classmethod
    def of(cls, compute: np.ndarray, dev: np.ndarray, prio: np.ndarray, dur: np.ndarray, nbytes: np.ndarray,
           dep_src: np.ndarray, dep_dst: np.ndarray, message: np.ndarray) -> "Messages":
        """The messages of a task graph given as columns over its tasks (``compute``: a
        compute task; ``dev``: the schedule device) and its dependency pairs (without
        duplicates): ``message`` selects the transfers that are messages; each one's
        predecessor sends it (where that is a compute task) and its compute successors read it."""
        task = np.flatnonzero(message)
        msg_of = np.full(len(compute), -1, dtype=np.int64)
        msg_of[task] = np.arange(len(task))
        sender = np.full(len(task), -1, dtype=np.int64)
        sent = (msg_of[dep_dst] >= 0) & compute[dep_src]
        sender[msg_of[dep_dst[sent]]] = dep_src[sent]
        read = (msg_of[dep_src] >= 0) & compute[dep_dst]
        return cls(dur=dur, dev=dev, prio=prio, compute=compute, task=task, sender=sender,
                   nbytes=nbytes[task].astype(np.int64), read_msg=msg_of[dep_src[read]], read_task=dep_dst[read])


class HostCost(Protocol):
    """A cluster's host-communication model."""

    def charge(self, msgs: Messages) -> tuple[np.ndarray, np.ndarray | None]:
        """Every task's duration with the messages' costs to the endpoints' compute, and per
        task the compute time a transfer takes from the op its destination device runs when it
        arrives (the engine's ``steal``; None for none)."""
        ...


class NoHostCost:
    """GPU clusters (no ``host_comm``): a message costs the devices' compute nothing."""

    def charge(self, msgs: Messages) -> tuple[np.ndarray, np.ndarray | None]:
        return msgs.dur, None


class CpuHostCost:
    """CPU ranks whose own cores send and receive (``host_comm``, cpu2's gloo over TCP).

    Each message costs ``per_message_us + bytes / copy_GBps`` of compute on both ends: the
    sender's producer (not a collective's result: its members' communicators send it) pays
    it while it runs on, and the first reader of the message in schedule order pays it before
    it can start - or, with ``recv_when: busy``, only ``recv_idle_us`` (the receiving thread's
    wake-up work that the op after a wait runs into), the rest being the transfer's ``steal``:
    the engine adds it to the op the destination device runs when the message arrives (gloo's
    receiving thread preempts it); a receiver that waits pays it in the latency.  A send costs
    ``send_cold_us (1 - exp(-gap / send_tau_us))`` more, a first reader ``recv_cold_us (1 -
    exp(-gap / recv_tau_us))`` more, by the compute its device ran since its previous send or
    first read (:func:`cold_send_s`, :func:`cold_recv_s`).  The link's figures are a one-way
    time measured end to end with a waiting receiver, which already holds the endpoints' work
    now charged to them: the transfer keeps the rest.
    """

    def __init__(self, copy_GBps: float, per_message_us: float = 0.0, recv_idle_us: float = 0.0, send_cold_us: float = 0.0,
                 send_tau_us: float = 1.0, recv_cold_us: float = 0.0, recv_tau_us: float = 1.0, recv_when: str = "always",
                 name: str = "?") -> None:
        if recv_when not in RECV_WHEN:
            raise ValueError(f"cluster {name!r}: host_comm.recv_when must be 'always' or 'busy', got {recv_when!r}")
        self.copy_GBps = float(copy_GBps)
        self.per_message_us = float(per_message_us)
        self.recv_idle_us = float(recv_idle_us)
        self.send_cold_us, self.send_tau_us = float(send_cold_us), float(send_tau_us)
        self.recv_cold_us, self.recv_tau_us = float(recv_cold_us), float(recv_tau_us)
        self.recv_when = recv_when

    def charge(self, msgs: Messages) -> tuple[np.ndarray, np.ndarray | None]:
        nt = len(msgs.task)
        if not nt:
            return msgs.dur, None
        dur = msgs.dur.copy()
        side_s = self.per_message_us * 1e-6 + msgs.nbytes / (self.copy_GBps * 1e9)  # what a message costs each side
        own = msgs.sender >= 0
        np.add.at(dur, msgs.sender[own], (side_s + cold_send_s(msgs, self.send_cold_us, self.send_tau_us))[own])
        busy = self.recv_when == "busy"
        reader_s = np.full(nt, self.recv_idle_us * 1e-6) if busy else side_s
        reader = first_readers(msgs)
        np.add.at(dur, reader, reader_s + cold_recv_s(msgs, reader, self.recv_cold_us, self.recv_tau_us))
        steal = None
        if busy:
            steal = np.zeros(len(dur))
            steal[msgs.task] = np.maximum(side_s - reader_s, 0.0)
        dur[msgs.task] = np.maximum(dur[msgs.task] - side_s - reader_s, 0.0)
        return dur, steal


def host_cost(cluster: Cluster) -> HostCost:
    """The host-communication model ``cluster`` selects by its ``host_comm`` block."""
    host: Mapping[str, Any] | None = cluster.meta.get("host_comm")
    if not host:
        return NoHostCost()
    unknown = [str(k) for k in host if k not in HOST_COMM_KEYS]
    if unknown:  # Cluster.with_host_comm takes any mapping
        raise ValueError(f"cluster {cluster.name!r}: host_comm.{unknown[0]} is not a key of host_comm: "
                         f"it takes {', '.join(HOST_COMM_KEYS)}")
    return CpuHostCost(**host, name=cluster.name)


def first_readers(msgs: Messages) -> np.ndarray:
    """Each message's first reader: the compute task waiting for it that comes first in
    schedule order (smallest ``prio``, then task id)."""
    rcv, inv = msgs.read_task, msgs.read_msg
    by_order = np.lexsort((rcv, msgs.prio[rcv], inv))
    head = np.flatnonzero(np.concatenate([[True], inv[by_order][1:] != inv[by_order][:-1]]))
    reader = np.empty(len(msgs.task), dtype=np.int64)
    reader[inv[by_order][head]] = rcv[by_order][head]
    return reader


def cold_send_s(msgs: Messages, cold_us: float, tau_us: float) -> np.ndarray:
    """Extra sender time of each message on a host whose sends cost more the longer its core
    has computed since its previous send (the network stack's state has left the caches):
    ``cold * (1 - exp(-gap / tau))``, the gap being the compute its device ran (in schedule
    order) between the previous producer that sent and this one; the first send of a step
    counts from the step's start, and a producer's second message (to another device) follows
    its first at once.  0 for a message no compute task sends."""
    return _cold_s(msgs, msgs.sender, cold_us * 1e-6, tau_us * 1e-6)


def cold_recv_s(msgs: Messages, reader: np.ndarray, cold_us: float, tau_us: float) -> np.ndarray:
    """Extra time of each message's first reader (``reader``) on a host whose receives, like
    its sends (:func:`cold_send_s`), cost more the longer the receiving core computed since its
    previous one: ``cold * (1 - exp(-gap / tau))``, the gap being the compute the receiving
    device ran (in schedule order) from the end of the previous first reader of a message to
    the start of this one; a reader of two messages pays once."""
    return _cold_s(msgs, reader, cold_us * 1e-6, tau_us * 1e-6, at_start=True)


def _cold_s(msgs: Messages, at: np.ndarray, cold: float, tau: float, at_start: bool = False) -> np.ndarray:
    """``cold * (1 - exp(-gap / tau))`` for each compute task of ``at`` (one per message; -1
    for none), the gap being the compute its device ran, in schedule order, from the end of
    the previous such task on that device (the device's start for the first) to the end of
    this one - or to its start (``at_start``: a receive comes before its reader runs); 0 for
    a task that appears twice."""
    out = np.zeros(len(at))
    if cold <= 0.0 or not len(at):
        return out
    tau = max(tau, 1e-12)
    on = np.flatnonzero(msgs.dev >= 0)
    seq = on[np.lexsort((on, msgs.prio[on], msgs.dev[on]))]  # each device's tasks in schedule order
    dev_sorted = msgs.dev[seq]
    comp = np.where(msgs.compute, msgs.dur, 0.0)  # only compute tasks are their device's compute
    cum = np.cumsum(comp[seq])
    first = np.r_[True, dev_sorted[1:] != dev_sorted[:-1]]
    base = np.maximum.accumulate(np.where(first, cum - comp[seq], -np.inf))  # cum at each device's start
    end_at = np.zeros(len(msgs.dur))
    end_at[seq] = cum - base  # compute time from the device's start to the end of each task
    pos = np.zeros(len(msgs.dur), dtype=np.int64)
    pos[seq] = np.arange(len(seq))
    idx = np.flatnonzero(at >= 0)
    tasks = at[idx]
    order = np.lexsort((idx, pos[tasks]))  # in schedule order (device-major, as ``seq``)
    sidx, s_at = idx[order], tasks[order]
    s_dev, s_end = msgs.dev[s_at], end_at[s_at]
    new_dev = np.r_[True, s_dev[1:] != s_dev[:-1]]
    prev_end = np.where(new_dev, 0.0, np.r_[0.0, s_end[:-1]])
    this = s_end - comp[s_at] if at_start else s_end
    gap = np.maximum(this - prev_end, 0.0)  # a task met twice: gap 0
    out[sidx] = cold * (1.0 - np.exp(-gap / tau))
    return out
