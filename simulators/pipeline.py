"""A stack graph's training step under a :class:`~harness.core.llm.plan.ParallelPlan`, expanded into
the event engine's :class:`~simulators.taskgraph.TaskGraph` with one representative GPU per
pipeline stage.

Symmetry: every tensor-parallel rank and every data-parallel replica of a stage does what its
representative does, so the engine's devices are the ``pp`` stages (engine device ``s`` is global
rank ``s * stride_pp``, Megatron-LM's order: tp fastest, then cp, dp, pp) and the collectives
among the ranks a stage stands for are costed by the fabric
(:func:`harness.core.fabric.collective_time`) with the group the rank layout gives them.  A step of
16,384 GPUs is then a few thousand tasks.

Per stage, in :func:`harness.core.llm.schedules.stage_order`'s order, per op and per unit of its chunk
(forward: the chunk's units in order; backward and W: reversed):

* **compute** (engine COMPUTE tasks on the stage): the unit's forward; before its backward the
  recompute (``algo.recompute``), then the backward (input and weight gradient; ZB-H1 runs the
  weight gradient as its own W op); seconds from :func:`harness.core.llm.work.unit_times` (one
  costing per distinct unit signature);
* **TP / CP / EP collectives** of the unit (Megatron's all-reduces or SP's reduce-scatter +
  all-gather, ring attention's exchange, MoE all-to-alls): COMPUTE tasks on the stage labelled
  ``tp`` / ``cp`` / ``ep`` right after the compute of their phase - NCCL kernels on the critical
  path, as Megatron runs them without communication overlap.  A call the real system overlaps
  (ring attention's KV exchange) costs only what exceeds the compute of its phase;
* **PP**: one TRANSFER per (micro-batch, chunk boundary, direction) on a logical link per stage
  and direction (``p2p_time`` of the last unit's boundary bytes; the same node or not from the
  rank layout); asynchronous (the sender does not wait), or with ``blocking_sends`` the sending
  stage's next op (its optimizer step after its last op) waits for the delivery;
* **DP / ZeRO** (COLLECTIVE tasks on one ``dp`` link per stage, first come first served):
  gradient buckets (``algo.bucket_bytes`` of gradients, filled in backward order per chunk, as
  Megatron's DDP buffer) all-reduced (``zero`` 0, and DeepSpeed's BF16_Optimizer,
  ``keep_lp_grads``: in 16 bits, its wire type) or reduce-scattered (1, 2) once each bucket's
  last backward of the last micro-batch has run (``overlap_grad_reduce``; else all after the
  stage's last backward); ZeRO-1/2's all-gather of the updated parameters per bucket: with
  ``overlap_param_gather`` at the start of the step, each bucket's first forward waiting for it
  (Megatron overlaps the gather with the next step's forward: the steady state of a step), else
  after the optimizer step; ZeRO-3 / FSDP: an all-gather of the unit's parameters before every
  forward and (``reshard_after_forward``) backward of it, issued when the compute two unit-uses
  earlier ends (one unit of prefetch), and a reduce-scatter of its gradient after every
  backward (every micro-batch, as FSDP2 without ``no_sync``); with ``gather_once`` (torchtitan's
  FSDP2 under a pipeline) one gather per unit at its first forward and one reduce-scatter after
  its last backward.  Expert parameters reduce over the
  expert-data-parallel group (``dp * cp / ep`` ranks).  Their NCCL kernels share the stage's SMs:
  a collective that ends while the stage computes lengthens the op it overlaps by
  ``costs.overlap_slowdown / (1 + costs.overlap_slowdown)`` of its seconds (the engine's ``steal``;
  one ending while the stage waits costs nothing more).  Point-to-point sends (PP, ring
  attention's exchange) run one or two NCCL blocks a peer and the TP / EP collectives are stage
  ops themselves: none of them steals;
* **optimizer**: one COMPUTE task per stage at the end, memory-bound: Adam reads and writes its
  fp32 states and reads the gradient, writes the weight, for the local (ZeRO-sharded) elements;
  with ``keep_lp_grads`` (DeepSpeed's BF16_Optimizer) or ``grad_accumulation=hook`` also one after
  every micro-batch's backward of a chunk, before its send (``autograd``: from the second
  micro-batch on): ``update_hp_grads``, Megatron-LM's ``main_grad.add_`` hook or PyTorch's
  AccumulateGrad adds the chunk's new 16-bit gradients into the stored ones
  (:func:`simulators.pipeline_costs.grad_accumulation_seconds`; :meth:`ParallelPlan.accumulates`).

Memory per GPU by kind and the units' costs: :mod:`simulators.pipeline_costs`; the figures read off the
timeline: :mod:`simulators.pipeline_figures`; the picture: :mod:`simulators.pipeline_gantt`.

Speed: tasks are per unit and micro-batch always (no coarser fallback was needed): Llama 3 405B
on 16,384 GPUs (tp 8, pp 16, dp 128, m = 16) is about 9,000 tasks and simulates in tens of
milliseconds; the 1T GPT of SC'21 (pp 64, m = 512, full recomputation) about 460,000, which the
engine's compiled loop runs, in one to a few seconds (``tests/benchmarks/test_bench_pipeline.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from harness.core.cluster import Cluster
from harness.core.costs import CostModel, stolen_fraction
from harness.core.fabric import Group, fabric_of, fabric_report, rank_layout
from harness.core.graph import BACKWARD, FORWARD, UPDATE
from harness.core.llm.plan import ParallelPlan, PlanError
from harness.core.llm.stack import StackGraph
from simulators import engine
from harness.core.llm.memory import STATE_BYTES, shard_groups
from harness.core.llm.pipeline_links import stage_send_time
from simulators.pipeline_costs import (UnitCost, comm_seconds, grad_accumulation_seconds, optimizer_seconds,
                                       precision_peak, static_memory, step_flops,
                                       tie_embeddings, unit_costs, wire_bytes)
from simulators.pipeline_figures import CAT, pipeline_figures
from simulators.result import SimResult
from harness.core.llm.schedules import splits_backward, stage_order
from simulators.taskgraph import COLLECTIVE, COMPUTE, TRANSFER, TaskGraph, csr


@dataclass(eq=False)
class PipelineInfo:
    """What the expansion knows beyond the task graph: the layout, the static memory, the names."""

    pp: int
    vpp: int
    m: int
    schedule: str
    stage_units: list[list[int]]
    #: per memory kind but activations (:data:`MEMORY_KINDS`): bytes per stage
    static: dict[str, np.ndarray]
    stage_ranks: list[int]
    device_names: list[str]
    link_names: list[str]
    units: list[UnitCost] = field(repr=False, default_factory=list)


# ---------------------------------------------------------------------------- the task graph
class _Tasks:
    """The task table as it grows: a row per task (kind, device, seconds, category, unit, micro-batch,
    chunk, phase, bytes allocated), a label, and for a transfer or collective its link, destination,
    bytes and wire bytes."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, float, int, int, int, int, int, int]] = []
        self.label: list[str] = []
        self.comm: dict[int, tuple[int, int, float, float]] = {}
        self.dep_src: list[int] = []
        self.dep_dst: list[int] = []
        self.use_task: list[int] = []
        self.use_buf: list[int] = []

    def add(self, kind: int, dev: int, dur: float, cat: str, unit: int, micro: int, chunk: int, phase: int, label: str,
            link: int = -1, dst: int = -1, nbytes: float = 0.0, wire: float = 0.0, alloc: int = 0) -> int:
        t = len(self.rows)
        self.rows.append((kind, dev, dur, CAT[cat], unit, micro, chunk, phase, alloc))
        self.label.append(label)
        if link >= 0:
            self.comm[t] = (link, dst, nbytes, wire)
        return t

    def dep(self, a: int, b: int) -> None:
        self.dep_src.append(a)
        self.dep_dst.append(b)


PHASE_OF = {"forward": FORWARD, "backward": BACKWARD, "recompute": BACKWARD}


def expand_pipeline(plan: ParallelPlan, m: int, units: Sequence[UnitCost], p2p_s: Sequence[float],
                    collective: Callable[[str, float, str], tuple[float, float]], optimizer_s: Sequence[float],
                    precision: str, embedding_sync: Mapping[int, float] | None = None,
                    grad_acc_s: Sequence[float] | None = None, stolen: float = 0.0) -> tuple[TaskGraph, dict[str, Any]]:
    """The task graph of one step (module docstring) from resolved costs: ``p2p_s[c]`` the seconds
    of the transfer between chunk ``c`` and ``c + 1`` (each way), ``collective(op, nbytes, group)``
    the (seconds, wire bytes) of a DP / ZeRO collective over ``"dp"`` (``dp * cp`` ranks),
    ``"edp"`` (the experts') or ``"emb"`` (the first and last stage's tied embedding),
    ``optimizer_s[s]`` stage ``s``'s optimizer step, ``embedding_sync[s]`` the tied-embedding
    elements stage ``s`` all-reduces before it (:func:`tie_embeddings`), ``grad_acc_s[c]`` the
    gradient accumulation pass after a micro-batch's backward of chunk ``c`` (where
    :meth:`ParallelPlan.accumulates`; None: none), ``stolen`` the fraction of a DP / ZeRO collective's
    seconds the stage op it overlaps loses (:func:`harness.core.costs.stolen_fraction`).  Engine devices are the
    stages; links ``0..pp-1`` carry stage ``s``'s forward sends, ``pp..2pp-1`` its backward sends,
    ``2pp..3pp-1`` its DP / ZeRO collectives."""
    pp, C = plan.pp, plan.chunks
    w_b, g_b, _ = STATE_BYTES[precision]
    split = splits_backward(plan.schedule)
    zero3, reshard = plan.zero == 3, plan.reshard_after_forward
    chunk_units = [list(plan.chunk_units(c)) for c in range(C)]
    tk = _Tasks()
    entry: dict[tuple[str, int, int], int] = {}  # (op kind, micro, chunk) -> its first task on the device
    exit_: dict[tuple[str, int, int], int] = {}  # ... and its last
    fwd_buf: dict[tuple[int, int], int] = {}
    first_fwd: dict[int, int] = {}
    grad_done: dict[int, int] = {}
    prio: list[int] = []  # compute tasks in device order
    chained = [-1]  # the task the next device task of the current op depends on (-1: none)

    def dp_coll(s: int, op: str, params: float, bytes_per: int, grp: str, label: str, phase: int, deps: Sequence[int]) -> int:
        nb = params * bytes_per
        dur, wire = collective(op, nb, grp)
        t = tk.add(COLLECTIVE, -1, dur, "dp", -1, -1, -1, phase, label, link=2 * pp + s, dst=s, nbytes=nb, wire=wire)
        for a in deps:
            tk.dep(a, t)
        return t

    def param_colls(s: int, op: str, u_or_params: tuple[float, float], bytes_per: int, label: str, phase: int, deps: Sequence[int]) -> list[int]:
        dense, expert = u_or_params
        out = []
        if dense > 0:
            out.append(dp_coll(s, op, dense, bytes_per, "dp", label, phase, deps))
        if expert > 0:
            out.append(dp_coll(s, op, expert, bytes_per, "edp", f"{label} (experts)", phase, deps))
        return out

    def split_params(us: Sequence[int]) -> tuple[float, float]:
        e = float(sum(units[u].expert_params_local for u in us))
        return float(sum(units[u].params_local for u in us)) - e, e

    def device(s: int, dur: float, cat: str, u: int, i: int, c: int, phase: int, label: str, alloc: int = 0) -> int:
        """A task on stage s's device after the previous one: in schedule order (``prio``), and for
        the tasks of one op also a data dependency (so that the critical path and the engine's
        other orders see the chain)."""
        t = tk.add(COMPUTE, s, dur, cat, u, i, c, phase, label, alloc=alloc)
        if chained[0] >= 0:
            tk.dep(chained[0], t)
        chained[0] = t
        prio.append(t)
        return t

    def comm_tasks(s: int, uc: UnitCost, u: int, i: int, c: int, phase: str, tag: str) -> None:
        for grp in ("tp", "cp", "ep"):
            t = uc.comm_s.get((phase, grp), 0.0)
            if t > 0:
                device(s, t, grp, u, i, c, PHASE_OF[phase], f"{grp} {tag}{i} {uc.name}")

    after: dict[tuple[str, int, int], int] = {}  # (op kind, micro, chunk) -> the first task of the stage's next op
    for s in range(pp):
        uses: list[int] = []  # compute tasks of the ZeRO-3 unit uses, for the one-ahead prefetch
        prev_key: tuple[str, int, int] | None = None
        last_rs: list[int] = []  # ZeRO-3: the reduce-scatters of the last micro-batch

        for op in stage_order(plan.schedule, pp, m, plan.vpp, s):
            i, c = op.micro, op.chunk
            us = chunk_units[c] if op.kind == "F" else chunk_units[c][::-1]
            op_start = len(prio)
            chained[0] = -1
            before = {"B": ("F", i, c), "W": ("B", i, c)}.get(op.kind)  # its own forward (or B) on this stage
            if before is not None:
                chained[0] = exit_[before]
            for u in us:
                uc = units[u]
                unit_start = len(prio)
                if plan.gather_once:  # the first forward of the step gathers; the parameters stay
                    gathered = zero3 and op.kind == "F" and u not in first_fwd
                else:
                    gathered = zero3 and (op.kind == "F" or (op.kind == "B" and reshard))
                if gathered:  # issued when the unit use two before this one ends: one unit of prefetch
                    j = len(uses)
                    gs = param_colls(s, "all_gather", split_params([u]), w_b, f"dp all_gather {uc.name}",
                                     FORWARD if op.kind == "F" else BACKWARD, [uses[j - 2]] if j >= 2 else [])
                if op.kind == "F":
                    t = device(s, uc.fwd_s, "F", u, i, c, FORWARD, f"F{i} {uc.name}", alloc=uc.stored_bytes)
                    fwd_buf[(i, u)] = t
                    if i == 0:
                        first_fwd[u] = t
                    comm_tasks(s, uc, u, i, c, "forward", "F")
                elif op.kind == "B":
                    if uc.recompute_s > 0:
                        device(s, uc.recompute_s, "R", u, i, c, BACKWARD, f"R{i} {uc.name}")
                    comm_tasks(s, uc, u, i, c, "recompute", "R")
                    t = device(s, uc.bwd_input_s + (0.0 if split else uc.bwd_weight_s), "B", u, i, c, BACKWARD, f"B{i} {uc.name}")
                    comm_tasks(s, uc, u, i, c, "backward", "B")
                else:  # W
                    t = device(s, uc.bwd_weight_s, "W", u, i, c, BACKWARD, f"W{i} {uc.name}")
                if op.kind != "F":  # the activations live until the backward (or W) that reads them last
                    tk.use_task.append(t)
                    tk.use_buf.append(fwd_buf[(i, u)])
                if gathered:
                    for a in gs:
                        tk.dep(a, prio[unit_start])
                    uses.append(t)
                if op.kind == ("W" if split else "B"):  # the unit's gradient of micro-batch i is complete
                    if zero3 and (i == m - 1 or not plan.gather_once):
                        rs = param_colls(s, "reduce_scatter", split_params([u]), g_b, f"dp reduce_scatter {uc.name}", BACKWARD, [t])
                        if i == m - 1:
                            last_rs += rs
                    if i == m - 1:
                        grad_done[u] = t
            if grad_acc_s is not None and op.kind == ("W" if split else "B") and grad_acc_s[c] > 0 and plan.accumulates(i):
                device(s, grad_acc_s[c], "opt", -1, i, c, BACKWARD, f"grad accumulate {i} c{c}")
            entry[(op.kind, i, c)], exit_[(op.kind, i, c)] = prio[op_start], prio[-1]
            if prev_key is not None:
                after[prev_key] = prio[op_start]
            prev_key = (op.kind, i, c)

        # gradient buckets (not ZeRO-3), their reductions, the optimizer step, ZeRO-1/2's parameter gathers
        buckets: list[list[int]] = []
        if not zero3:
            for c in plan.chunks_of_stage(s):
                cur: list[int] = []
                size = 0
                for u in chunk_units[c][::-1]:
                    cur.append(u)
                    size += g_b * units[u].params_local
                    if size >= plan.bucket_bytes:
                        buckets.append(cur)
                        cur, size = [], 0
                if cur:
                    buckets.append(cur)
        stage_end = prio[-1]
        # DeepSpeed's BF16_Optimizer all-reduces its FP32 gradients, then each rank steps its shard
        # (pipe/engine.py _bf16_reduce_grads: buffered_allreduce_fallback of get_grads_for_reduction),
        # cast for the wire to the engine's communication_data_type, BF16 (engine.py allreduce_bucket)
        op_name = "all_reduce" if plan.zero == 0 or plan.keep_lp_grads else "reduce_scatter"
        red_b = w_b if plan.keep_lp_grads else g_b
        reduce_ops = list(last_rs)
        for k, b in enumerate(buckets):
            deps = [grad_done[u] for u in b] if plan.overlap_grad_reduce else [stage_end]
            reduce_ops += param_colls(s, op_name, split_params(b), red_b, f"dp {op_name} bucket {k}", BACKWARD, deps)
        if embedding_sync and embedding_sync.get(s, 0) > 0:  # Megatron's embedding-group all-reduce of the tied gradient
            reduce_ops.append(dp_coll(s, "all_reduce", embedding_sync[s], g_b, "emb", "all_reduce tied embedding", BACKWARD, [stage_end]))
        chained[0] = stage_end
        opt = device(s, optimizer_s[s], "opt", -1, -1, -1, UPDATE, "optimizer step")
        if prev_key is not None:
            after[prev_key] = opt
        for a in reduce_ops:
            tk.dep(a, opt)
        if plan.zero in (1, 2):
            for k in range(len(buckets) - 1, -1, -1):  # forward order
                b = buckets[k]
                if plan.overlap_param_gather:
                    for a in param_colls(s, "all_gather", split_params(b), w_b, f"dp all_gather bucket {k}", FORWARD, []):
                        tk.dep(a, first_fwd[min(b)])
                else:
                    param_colls(s, "all_gather", split_params(b), w_b, f"dp all_gather bucket {k}", UPDATE, [opt])

    # point-to-point between consecutive chunks
    for c in range(C - 1):
        a, b = c % pp, (c + 1) % pp
        for i in range(m):
            for kind, src, dst, frm, to, link in (("F", a, b, ("F", i, c), ("F", i, c + 1), a),
                                                  ("B", b, a, ("B", i, c + 1), ("B", i, c), pp + b)):
                if src == dst:
                    tk.dep(exit_[frm], entry[to])
                    continue
                nb = float(units[chunk_units[c][-1]].boundary_bytes) / plan.send_split   # what crosses between the stages
                t = tk.add(TRANSFER, src, p2p_s[c], "pp", -1, i, c, FORWARD if kind == "F" else BACKWARD,
                           f"pp {kind}{i} c{c}{'->' if kind == 'F' else '<-'}c{c + 1}", link=link, dst=dst, nbytes=nb, wire=nb)
                tk.dep(exit_[frm], t)
                tk.dep(t, entry[to])
                if plan.blocking_sends:
                    tk.dep(t, after[frm])
    return _assemble(tk, pp, prio, stolen)


def _assemble(tk: _Tasks, pp: int, prio_order: list[int], stolen: float = 0.0) -> tuple[TaskGraph, dict[str, Any]]:
    T = len(tk.rows)
    cols = np.array(tk.rows, dtype=np.float64).reshape(T, 9)
    kind = cols[:, 0].astype(np.int8)
    dev = cols[:, 1].astype(np.int64)
    alloc = cols[:, 8].astype(np.int64)
    src = np.asarray(tk.dep_src, dtype=np.int64)
    dst = np.asarray(tk.dep_dst, dtype=np.int64)
    succ_ptr, succ_idx = csr(T, src, dst)
    indeg = np.bincount(dst, minlength=T).astype(np.int64)
    use_ptr, use_idx = csr(T, np.asarray(tk.use_task, dtype=np.int64), np.asarray(tk.use_buf, dtype=np.int64))
    ids = np.fromiter(tk.comm.keys(), dtype=np.int64, count=len(tk.comm))
    extra = np.array(list(tk.comm.values()), dtype=np.float64).reshape(len(ids), 4)
    link = np.full(T, -1, dtype=np.int64)
    to = np.full(T, -1, dtype=np.int64)
    nbytes = np.zeros(T)
    wire = np.zeros(T)
    link[ids], to[ids], nbytes[ids], wire[ids] = extra[:, 0], extra[:, 1], extra[:, 2], extra[:, 3]
    has = link >= 0
    res_ptr = np.zeros(T + 1, dtype=np.int64)
    np.cumsum(has, out=res_ptr[1:])
    prio = np.zeros(T, dtype=np.int64)
    prio[np.asarray(prio_order, dtype=np.int64)] = np.arange(len(prio_order))
    tg = TaskGraph(
        kind=kind, dev=dev, dst=to, dur=cols[:, 2].copy(), prio=prio, node=cols[:, 4].astype(np.int64),
        param=np.full(T, -1, dtype=np.int64), nbytes=nbytes.astype(np.int64), res_ptr=res_ptr, res_idx=link[has],
        succ_ptr=succ_ptr, succ_idx=succ_idx, indeg=indeg, alloc_dev=np.where(alloc > 0, dev, -1), alloc_bytes=alloc,
        use_ptr=use_ptr, use_idx=use_idx, static_mem=np.zeros(pp, dtype=np.int64), num_shards=int((kind == COMPUTE).sum()),
        wire_bytes=wire, phase=cols[:, 7].astype(np.int8), label=tk.label,
        steal=np.where((kind == COLLECTIVE) & (to >= 0), stolen * cols[:, 2], 0.0) if stolen > 0 else None,
    )
    tg.meta = {"graph": "stack", "cat": cols[:, 3].astype(np.int8), "micro": cols[:, 5].astype(np.int64),
               "chunk": cols[:, 6].astype(np.int64)}
    return tg, tg.meta


# ---------------------------------------------------------------------------- the whole step
def stage_ranks(plan: ParallelPlan, groups: Mapping[str, Group]) -> list[int]:
    """The global rank of each stage's representative GPU: ``s * stride_pp`` (its first TP rank of
    its first replica)."""
    return [s * groups["pp"].stride for s in range(plan.pp)]


def build_pipeline_taskgraph(graph: StackGraph, plan: ParallelPlan, cluster: Cluster, costs: CostModel) -> tuple[TaskGraph, PipelineInfo]:
    """The engine's task graph of one training step of ``graph`` under ``plan`` on ``cluster``
    (module docstring) and what the figures need beside it."""
    fabric = fabric_of(cluster)
    groups = dict(rank_layout(plan.tp, plan.cp, plan.ep, plan.dp, plan.pp))
    ranks = stage_ranks(plan, groups)
    stage_units = [plan.stage_units(s) for s in range(plan.pp)]
    stage_of_unit = [0] * graph.num_nodes
    for s, us in enumerate(stage_units):
        for u in us:
            stage_of_unit[u] = s
    by_kind: dict[str, list[UnitCost]] = {}
    for r in ranks:
        kind = cluster.devices[r].spec.kind
        if kind not in by_kind:
            by_kind[kind] = unit_costs(graph, plan, fabric, groups, costs, r)
    units = [by_kind[cluster.devices[ranks[stage_of_unit[u]]].spec.kind][u] for u in range(graph.num_nodes)]
    sync = tie_embeddings(units, stage_of_unit)
    m = plan.micro_batches(graph.batch_size)
    precision = graph.precision
    d, de = shard_groups(plan)
    stride = groups["pp"].stride
    comm_groups = {"dp": groups["dp_cp"], "edp": groups["edp"], "emb": Group(2, max(1, (plan.pp - 1) * stride))}

    def collective(op: str, nbytes: float, grp: str) -> tuple[float, float]:
        g = comm_groups[grp]
        return comm_seconds(fabric, op, nbytes, g), wire_bytes(op, nbytes, g.size)

    p2p = []
    for c in range(plan.chunks - 1):
        a, b = c % plan.pp, (c + 1) % plan.pp
        nb = units[plan.chunk_units(c)[-1]].boundary_bytes
        p2p.append(stage_send_time(fabric, nb, stride, a, b, plan.send_split) if a != b else 0.0)
    static = static_memory(plan, units, stage_units, precision)
    acc = None
    if plan.accumulation != "fused":
        acc = [grad_accumulation_seconds(costs, ranks[c % plan.pp], float(sum(units[u].params_local for u in plan.chunk_units(c))),
                                         precision) for c in range(plan.chunks)]
    opt = []
    for s, us in enumerate(stage_units):
        dense = sum(units[u].params_local - units[u].expert_params_local for u in us)
        expert = sum(units[u].expert_params_local for u in us)
        elements = dense + expert if plan.zero == 0 else dense / d + expert / de
        opt.append(optimizer_seconds(costs, ranks[s], elements, precision))
    tg, _ = expand_pipeline(plan, m, units, p2p, collective, opt, precision, sync, acc, stolen_fraction(costs.overlap_slowdown))
    tg.static_mem = sum(static.values()).astype(np.int64)
    names = [f"stage {s} ({cluster.devices[r].name})" for s, r in enumerate(ranks)]
    links = ([f"pp send stage {s} -> {(s + 1) % plan.pp}" for s in range(plan.pp)]
             + [f"pp send stage {s} -> {(s - 1) % plan.pp}" for s in range(plan.pp)]
             + [f"dp/zero stage {s} ({d} ranks)" for s in range(plan.pp)])
    info = PipelineInfo(plan.pp, plan.vpp, m, plan.schedule, stage_units, static, ranks, names, links, units)
    return tg, info


def simulate_pipeline(graph: StackGraph, plan: ParallelPlan, cluster: Cluster, costs: CostModel, order: str = "strict") -> SimResult:
    """Validate the plan, expand and run one step, and read off the LLM figures
    (:func:`simulators.pipeline_figures.pipeline_figures`).  ``device_busy_s``,
    ``peak_memory_bytes`` and ``mem_capacity_bytes`` have one entry per pipeline stage: every GPU of
    a stage is a replica of its representative; ``oom_devices`` are stages; ``comm_bytes`` and
    ``bytes_by_class`` (by communication kind) are the bytes the representatives send."""
    if plan.gpus > cluster.num_devices:  # a plan may use fewer GPUs (algo.devices=k, the one-device reference)
        raise PlanError(f"the plan uses algo.tp x algo.pp x algo.dp x algo.cp = {plan.gpus} GPUs, and cluster {cluster.name} has "
                        f"{cluster.num_devices}: use fewer, or a larger cluster (cluster.nodes)")
    plan.validate(graph, plan.gpus)
    tg, info = build_pipeline_taskgraph(graph, plan, cluster, costs)
    tl = engine.run(tg, plan.pp, 3 * plan.pp, order)
    cap = np.array([cluster.devices[r].spec.mem_capacity for r in info.stage_ranks], dtype=np.int64)
    mflops, hflops = step_flops(graph, plan.recompute)
    rep = cluster.devices[info.stage_ranks[0]].spec
    extras = pipeline_figures(tg, tl, info.static, {
        "gpus": plan.gpus, "tokens": graph.batch_size * graph.seq_len, "model_flops": mflops, "hardware_flops": hflops,
        "peak_flops": precision_peak(rep, graph.precision),
        "pipeline": {"pp": plan.pp, "vpp": plan.vpp, "m": info.m, "schedule": plan.schedule, "micro_batch": plan.micro_batch,
                     "stage_units": [len(us) for us in info.stage_units], "seq_len": graph.seq_len},
    })
    extras["fabric_report"] = fabric_report(fabric_of(cluster))  # which figures the collectives ran at
    cat = tg.meta["cat"]
    by_kind = {k: int(round(float(tg.wire_bytes[cat == CAT[k]].sum()))) for k in ("pp", "dp")}
    for k in ("tp", "cp", "ep"):  # the units' collectives, counted per micro-batch pass
        per_unit = np.array([u.comm_bytes.get(k, 0.0) for u in info.units])
        fwd = (cat == CAT["F"]) & (tg.node >= 0)
        by_kind[k] = int(round(float(per_unit[tg.node[fwd]].sum())))
    return SimResult.of_run(tg, tl, graph, cluster, plan.pp, cap, sum(by_kind.values()),
                            {k: by_kind[k] for k in ("tp", "cp", "ep", "pp", "dp")}, extras=extras,
                            device_names=info.device_names, link_names=info.link_names)
