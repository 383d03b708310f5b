"""What a placement must respect, shared by every placer: co-location pinning, static device
memory with its filter and best-effort fall-back, the sequential fill, buffer liveness and the
ownership of parameters.

Co-location ("co-location groups follow their first member", Celeritas Sec. 6.1, as in Baechi
and TensorFlow's placer): the first member a placer places pins its group's device and every
later member goes there (:class:`Colocation`; :func:`follow_colocation` applies the rule after
the fact to a whole placement, the first member in node order deciding).

Static memory (:class:`StaticMemory`): ``mem[v]`` (``costs.memory``: the output plus the
parameters v is the first to read) is charged to the device a node goes to, against a budget
(``cluster.mem_capacity``, or m-TOPO's fill level).  How a co-location group is charged is a
rule the placer picks (``group_rule``):

* ``whole``: a group's first member must find room for the whole group and the group is
  charged then; later members follow free (FD-DPS family, Celeritas's Alg. 2, m-TOPO's
  ``coloc_memory: all``).
* ``member``: every node needs and is charged its own memory; a pinned member is charged to
  its group's device (the sequential fill of Standard Evaluation and DFS-TOPO).
* ``first``: only the first member's own memory is needed and charged (Baechi's m-TOPO,
  ``coloc_memory: first``, which Celeritas Sec. 6.5.2 faults).
* ``reserve``: the first member must find room for the whole group, but every member is
  charged its own memory when it is placed (Baechi's m-ETF / m-SCT).

The memory filter ("select the device set that satisfies the resource requirements", FD-DPS
Sec. 4.3 (2)) keeps the devices whose free memory holds a node's need; when none does, the
placer falls back on the device with the most free memory (Celeritas's best-effort rule,
:func:`most_free_device`) and :attr:`StaticMemory.fallbacks` counts it.  Memory figures are
whole bytes, so the float sums are exact whatever the order.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from harness.core.costs import CostModel
from harness.core.graph import OpGraph

GROUP_RULES = ("whole", "member", "first", "reserve")
OVERFLOW_RULES = ("most_free", "last")


# ---------------------------------------------------------------------------- parameters and buffers
def persistent_memory(graph: OpGraph) -> np.ndarray:
    """Bytes of parameters each node is the first (in node order) to read: the part of
    ``costs.memory`` that stays resident for the whole step."""
    out = np.zeros(graph.num_nodes, dtype=np.int64)
    first = graph.param_first_reader()
    has = first >= 0
    np.add.at(out, first[has], graph.param_bytes[has])
    return out


def memory_split(graph: OpGraph, costs: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """(total, persistent) bytes per node: ``costs.memory`` and its parameter part; the
    transient part (the output) is ``total - persistent``."""
    total = np.asarray(costs.memory(graph), dtype=np.float64)
    pers = np.minimum(persistent_memory(graph).astype(np.float64), total)
    return total, pers


def buffer_roots(graph: OpGraph) -> np.ndarray:
    """For every node, the node whose output buffer it really is: a free node (view,
    getitem, detach) passes its first input's buffer on, as in the simulator."""
    n = graph.num_nodes
    root = np.arange(n, dtype=np.int64)
    ptr, pred, _ = graph.pred_csr()
    free = graph.free
    for v in range(n):
        if free[v] and ptr[v + 1] > ptr[v]:
            root[v] = root[pred[ptr[v]]]
    return root


class BufferLiveness:
    """Liveness accounting in placement order (Baechi's m-ETF; Celeritas's ``memory: liveness``
    extension): a node's transient bytes (its output) are given back to its device once every
    reader of the buffer has been placed; views pass their input's buffer on."""

    __slots__ = ("root", "readers", "transient", "pptr", "pred")

    def __init__(self, graph: OpGraph, transient: np.ndarray) -> None:
        n = graph.num_nodes
        root = buffer_roots(graph)
        self.root = root.tolist()
        self.readers = (np.bincount(root[graph.src], minlength=n) if graph.num_edges else np.zeros(n, np.int64)).tolist()
        self.transient = np.asarray(transient, dtype=np.float64).tolist()
        ptr, pred, _ = graph.pred_csr()
        self.pptr, self.pred = ptr.tolist(), pred.tolist()

    def placed(self, v: int, device: Sequence[int], free: list[float]) -> None:
        """v has just been placed (``device``: every placed node's device): free the buffers
        whose last reader it is, and its own output if nothing reads it."""
        root, readers, transient, pred = self.root, self.readers, self.transient, self.pred
        for k in range(self.pptr[v], self.pptr[v + 1]):
            b = root[pred[k]]
            readers[b] -= 1
            if readers[b] == 0:
                free[device[b]] += transient[b]
        if root[v] == v and readers[v] == 0:
            free[device[v]] += transient[v]


# ---------------------------------------------------------------------------- co-location
def group_members(coloc: np.ndarray) -> dict[int, np.ndarray]:
    """Members of each co-location group in node order, by group id (``coloc == g``; -1: none)."""
    ids = np.asarray(coloc)
    if len(ids) == 0 or ids.max(initial=-1) < 0:
        return {}
    order = np.argsort(ids, kind="stable")
    order = order[ids[order] >= 0]
    uniq, starts = np.unique(ids[order], return_index=True)
    return {int(g): m for g, m in zip(uniq.tolist(), np.split(order, starts[1:]))}


def follow_colocation(graph: OpGraph, device: np.ndarray) -> np.ndarray:
    """Move every member of a co-location group to the device of its first member
    (Celeritas Sec. 5: "co-location groups follow their first member")."""
    out = np.asarray(device).copy()
    for members in graph.coloc_groups():
        out[members] = out[members[0]]
    return out


class Colocation:
    """Co-location groups follow their first member (Celeritas Sec. 6.1, as in Baechi): the
    first member a placer places pins its group's device.  ``node_pin`` holds the pinned device
    of every node whose group is pinned (-1 elsewhere), for placers that work on arrays."""

    __slots__ = ("group", "group_arr", "pin", "members", "node_pin")

    def __init__(self, coloc: np.ndarray) -> None:
        self.group_arr = np.asarray(coloc, dtype=np.int64)
        self.group = self.group_arr.tolist()
        self.pin = [-1] * (int(self.group_arr.max(initial=-1)) + 1)
        self.members = group_members(self.group_arr)
        self.node_pin = np.full(len(self.group_arr), -1, dtype=np.int64)

    def pinned(self, v: int) -> int:
        """The device v must go to (its group's), or -1 if it is free to go anywhere."""
        g = self.group[v]
        return self.pin[g] if g >= 0 else -1

    def pin_group(self, g: int, d: int) -> None:
        """Pin group g (not pinned yet) to device d."""
        self.pin[g] = d
        self.node_pin[self.members[g]] = d

    def place(self, v: int, d: int) -> int:
        """Place v: returns its device (the group's, if pinned) and pins its group."""
        g = self.group[v]
        if g < 0:
            return d
        if self.pin[g] < 0:
            self.pin_group(g, d)
            return d
        return self.pin[g]


def most_free_device(free: Sequence[float] | np.ndarray) -> int:
    """Celeritas's best-effort rule (Sec. 5.2, Alg. 2 line 20): the device with the lowest
    memory usage, read as the most free memory (the same on a homogeneous cluster; Alg. 2
    prints ``argmin Ava_m``, which would pick the fullest device and contradicts the text)."""
    return int(np.argmax(free))


# ---------------------------------------------------------------------------- static memory
class StaticMemory:
    """Free static memory of every device under co-location (module docstring: ``group_rule``).

    ``free[d]`` is the budget of device d minus what has been charged to it; :meth:`release`
    gives bytes back (liveness accounting, copies of received tensors).
    """

    __slots__ = ("coloc", "rule", "mem", "mem_arr", "group_mem", "free", "fallbacks", "devices")

    def __init__(self, coloc: Colocation, mem: np.ndarray, budget: np.ndarray, group_rule: str = "whole") -> None:
        if group_rule not in GROUP_RULES:
            raise ValueError(f"group_rule must be one of {GROUP_RULES}, got {group_rule!r}")
        self.coloc = coloc
        self.rule = group_rule
        self.mem_arr = np.asarray(mem, dtype=np.float64)
        self.mem = self.mem_arr.tolist()
        grp = coloc.group_arr
        sel = grp >= 0
        ng = len(coloc.pin)
        self.group_mem = (np.bincount(grp[sel], weights=self.mem_arr[sel], minlength=ng) if ng else np.zeros(0)).tolist()
        self.free = np.asarray(budget, dtype=np.float64).tolist()
        self.fallbacks = 0
        self.devices = list(range(len(self.free)))

    def need(self, v: int) -> float:
        """What v asks of a device it is not pinned to: its group's memory when the rule
        reserves a whole group for its first member, else its own."""
        g = self.coloc.group[v]
        if g >= 0 and self.rule in ("whole", "reserve"):
            return self.group_mem[g]
        return self.mem[v]

    def needs(self) -> np.ndarray:
        """:meth:`need` of every node (as if none were pinned)."""
        grp = self.coloc.group_arr
        if self.rule not in ("whole", "reserve") or not len(self.group_mem):
            return self.mem_arr.copy()
        return np.where(grp >= 0, np.asarray(self.group_mem)[np.maximum(grp, 0)], self.mem_arr)

    def best_effort(self) -> int:
        """No device has room: the device with the most free memory (counted in ``fallbacks``)."""
        self.fallbacks += 1
        return most_free_device(self.free)

    def candidates(self, v: int) -> list[int]:
        """The memory filter: v's pinned device, else every device whose free memory holds
        :meth:`need`, else (best effort) the device with the most free memory."""
        p = self.coloc.pinned(v)
        if p >= 0:
            return [p]
        need = self.need(v)
        free = self.free
        ok = [d for d in self.devices if free[d] >= need]
        return ok if ok else [self.best_effort()]

    def place(self, v: int, d: int) -> int:
        """Place v on d (its group's device if pinned), charge it by the rule; returns the device."""
        g = self.coloc.group[v]
        if g < 0:
            self.free[d] -= self.mem[v]
            return d
        first = self.coloc.pin[g] < 0
        dev = self.coloc.place(v, d)
        if self.rule == "whole":
            if first:
                self.free[dev] -= self.group_mem[g]
        elif self.rule == "first":
            if first:
                self.free[dev] -= self.mem[v]
        else:
            self.free[dev] -= self.mem[v]
        return dev

    def release(self, d: int, nbytes: float) -> None:
        """Give ``nbytes`` back to device d."""
        self.free[d] += nbytes

    def cluster_need(self, nodes: np.ndarray) -> tuple[float, list[int]]:
        """Memory[v_i] of a cluster of nodes placed together (rule ``whole``): its members not
        pinned yet, each group they pin counted whole; and the groups they pin."""
        fresh = nodes[self.coloc.node_pin[nodes] < 0]
        grp = self.coloc.group_arr[fresh]
        new_groups = np.unique(grp[grp >= 0]).tolist()
        return float(self.mem_arr[fresh[grp < 0]].sum()) + sum(self.group_mem[g] for g in new_groups), new_groups

    def place_cluster(self, d: int, need: float, new_groups: list[int]) -> None:
        """Charge a cluster's :meth:`cluster_need` to d and pin the groups it starts there."""
        self.free[d] -= need
        for g in new_groups:
            self.coloc.pin_group(g, d)


class SequentialFill:
    """Fill devices one after another: a device takes nodes while its free memory holds them,
    then the next device starts (Celeritas Sec. 4.2.1 step 2 and Order-Place; Baechi's m-TOPO).

    ``overflow`` is what happens past the last device: ``most_free`` (Celeritas's best-effort
    rule, :meth:`StaticMemory.best_effort`) or ``last`` (m-TOPO: the last device takes the rest).
    """

    __slots__ = ("memory", "overflow", "cursor")

    def __init__(self, memory: StaticMemory, overflow: str = "most_free") -> None:
        if overflow not in OVERFLOW_RULES:
            raise ValueError(f"overflow must be one of {OVERFLOW_RULES}, got {overflow!r}")
        self.memory, self.overflow, self.cursor = memory, overflow, 0

    def device(self, need: float) -> int:
        """The device that takes a node needing ``need`` bytes."""
        free = self.memory.free
        D = len(free)
        d = self.cursor
        last = D - 1 if self.overflow == "last" else D
        while d < last and free[d] < need:
            d += 1
        self.cursor = d
        return d if d < D else self.memory.best_effort()


def sequential_fill(graph: OpGraph, seq: np.ndarray, mem: np.ndarray, capacity: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """Place nodes in the order ``seq`` on device 0 until its memory is full, then on the
    next device, and so on (Celeritas Sec. 4.2.1 step 2 with DFS-TOPO).  Static accounting:
    ``mem`` is summed and never freed.  A node that fits on no later device goes to the device
    with the most free memory (best effort).  Co-location groups follow their first member;
    every member's memory is charged to the group's device.  Returns (device per node, info)."""
    memory = StaticMemory(Colocation(graph.coloc), mem, capacity, "member")
    fill = SequentialFill(memory)
    dev = np.full(graph.num_nodes, -1, dtype=np.int64)
    for v in seq.tolist():
        p = memory.coloc.pinned(v)
        dev[v] = memory.place(v, p if p >= 0 else fill.device(memory.need(v)))
    return dev, {"fallback_nodes": memory.fallbacks, "static_free_bytes": list(memory.free)}
