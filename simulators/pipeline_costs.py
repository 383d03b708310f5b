"""What the pipeline simulator (:mod:`simulators.pipeline`) knows of a unit and a stage before it
builds tasks: each unit's seconds, collectives and bytes on one GPU (:class:`UnitCost`, from
:func:`harness.core.llm.work.unit_times` and the fabric), the tied embedding's copy, the optimizer
step, the point-to-point time between stages, the FLOPs of a step, and the static memory.

Memory per GPU by kind (:func:`static_memory`, :data:`MEMORY_KINDS`): weights, gradients and
optimizer states by :data:`~harness.core.llm.memory.STATE_BYTES` and the ZeRO stage
(:func:`harness.core.llm.memory.model_state_bytes`, which the plan searches' memory bounds share:
the sharded share over ``dp * cp`` ranks, experts over ``dp * cp / ep``; ZeRO, Rajbhandari et al.
SC'20: 16P unsharded, ZeRO-1 4P + 12P/d, ZeRO-2 2P + 14P/d, ZeRO-3 16P/d under mixed precision); activations from the
simulated timeline (each forward allocates its unit's stored bytes, freed when its backward -
or W - ends: the micro-batches in flight come out of the schedule); transient: the largest
transient working set of the stage's units; buffers: the received P2P activation and gradient,
ZeRO-3's gathered parameters (the unit in use and the prefetched one, or all the stage's when
parameters stay gathered from forward to backward) and one unit's unsharded gradient (``gather_once``:
all the stage's weights and unsharded gradients), ZeRO-2's
one bucket of unsharded gradients.  ``algo.keep_lp_grads`` (DeepSpeed's BF16_Optimizer): the
16-bit gradients besides, unsharded, all step.  Not here: what the CUDA context and NCCL hold (the
cluster's ``runtime_GiB``, off the device's capacity) and the allocator's slack over the tensors
(its ``allocator_reserve``, which divides what remains): both are in the capacity a stage is held to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from harness.core.cluster import DeviceSpec
from harness.core.costs import CostModel, math_peak
from harness.core.fabric import Fabric, Group, collective_time, p2p_time
from harness.core.kernels import MEM, NCOLS, KernelTable
from harness.core.llm.flops import hardware_flops, model_flops
from harness.core.llm.memory import STATE_BYTES, model_state_bytes, shard_groups
from harness.core.llm.plan import ParallelPlan
from harness.core.llm.stack import StackGraph
from harness.core.llm.work import unit_times
from harness.core.precision import Precision, math_of
from simulators.pipeline_figures import MEMORY_KINDS

@dataclass(frozen=True)
class UnitCost:
    """What one GPU of a stage does for one unit and one micro-batch, in seconds and bytes."""

    name: str
    fwd_s: float
    bwd_input_s: float
    bwd_weight_s: float
    recompute_s: float
    #: (phase, group) -> seconds on the stage's device; phase forward | backward | recompute, group tp | cp | ep
    comm_s: Mapping[tuple[str, str], float] = field(default_factory=dict)
    #: group -> bytes on the wire a GPU sends per micro-batch (all phases)
    comm_bytes: Mapping[str, float] = field(default_factory=dict)
    stored_bytes: int = 0
    transient_bytes: int = 0
    boundary_bytes: int = 0
    params_local: int = 0  # parameter elements on one GPU after TP and EP, experts included
    expert_params_local: int = 0  # of which in experts (reduced over the expert-data-parallel group)
    tied_params_local: int = 0  # a tied head's copy of the embedding (:func:`tie_embeddings`)


def wire_bytes(op: str, nbytes: float, p: int) -> float:
    """Bytes one rank sends for a collective called with ``nbytes`` (an all-reduce's buffer, a
    reduce-scatter's input, an all-gather's output): ring all-reduce 2(p-1)/p, reduce-scatter,
    all-gather and all-to-all (p-1)/p, a send/recv all of it; 0 for a group of one."""
    if p <= 1:
        return 0.0
    share = {"all_reduce": 2.0 * (p - 1) / p, "send_recv": 1.0, "broadcast": 1.0}.get(op, (p - 1) / p)
    return float(nbytes) * share


def comm_seconds(fabric: Fabric, op: str, nbytes: float, group: Group) -> float:
    """A collective's seconds; ``send_recv`` (ring attention's exchange, ``cp - 1`` steps of a
    ring) as that many point-to-point messages, inside a node when the group is."""
    if group.size <= 1 or nbytes <= 0:
        return 0.0
    if op == "send_recv":
        return p2p_time(fabric, nbytes, group.nodes_spanned(fabric.gpus_per_node) == 1)
    return collective_time(fabric, op, nbytes, group)


def unit_costs(graph: StackGraph, plan: ParallelPlan, fabric: Fabric, groups: Mapping[str, Group], costs: CostModel,
               device: int) -> list[UnitCost]:
    """:class:`UnitCost` of every unit on a GPU of ``device``'s kind: :func:`unit_times` per distinct
    unit signature, its TP / CP / EP calls costed by the fabric (``count`` calls of each)."""
    shard = plan.shard()
    memo: dict[Any, UnitCost] = {}
    out = []
    for u, unit in enumerate(graph.units):
        key = graph.signature(u)
        if key not in memo:
            ut = unit_times(graph, u, shard, costs, device)
            phase_compute = {"forward": ut.fwd_s, "backward": ut.bwd_input_s + ut.bwd_weight_s, "recompute": ut.recompute_s}
            comm: dict[tuple[str, str], float] = {}
            hidden: dict[tuple[str, str], float] = {}
            sent: dict[str, float] = {}
            for call in ut.collectives:
                g = groups[call.group]
                t = call.count * comm_seconds(fabric, call.op, call.nbytes, g)
                into = hidden if call.overlapped else comm
                into[(call.phase, call.group)] = into.get((call.phase, call.group), 0.0) + t
                sent[call.group] = sent.get(call.group, 0.0) + call.count * wire_bytes(call.op, call.nbytes, g.size)
            for k, t in hidden.items():  # an overlapped exchange shows only where it outlasts its phase's compute
                comm[k] = comm.get(k, 0.0) + max(0.0, t - phase_compute[k[0]])
            expert = int(round(unit.expert_params / (plan.ep * plan.tp))) if unit.expert_params else 0
            memo[key] = UnitCost(unit.name, ut.fwd_s, ut.bwd_input_s, ut.bwd_weight_s, ut.recompute_s,
                                 {k: v for k, v in comm.items() if v > 0}, sent, int(ut.stored_bytes), int(ut.transient_bytes),
                                 int(ut.boundary_bytes), int(ut.params_local), min(expert, int(ut.params_local)),
                                 int(ut.tied_params_local))
        uc = memo[key]
        out.append(uc if uc.name == unit.name else replace(uc, name=unit.name))
    return out


def tie_embeddings(units: list[UnitCost], stage_of_unit: Sequence[int]) -> dict[int, float]:
    """Megatron-LM's tied embedding across stages: a unit with ``tied_params_local`` (the head of a
    model whose output projection is its embedding) on another stage than the embedding keeps its
    own copy (its parameters, gradients and optimizer states) and all-reduces the gradient with the
    first stage's; on the same stage it shares the embedding's.  ``units`` is updated; returns the
    elements each stage all-reduces (none when the copy is not needed)."""
    sync: dict[int, float] = {}
    for u, uc in enumerate(units):
        if uc.tied_params_local <= 0:
            continue
        emb = stage_of_unit[0]
        if stage_of_unit[u] == emb:
            units[u] = replace(uc, tied_params_local=0)
            continue
        units[u] = replace(uc, params_local=uc.params_local + uc.tied_params_local)
        for s in (emb, stage_of_unit[u]):
            sync[s] = sync.get(s, 0.0) + uc.tied_params_local
    return sync


def precision_peak(spec: DeviceSpec, precision: str) -> float:
    """The device's dense peak FLOP/s for the matmuls of ``precision`` (the MFU's denominator):
    BF16 / FP16 tensor cores under AMP or 16-bit training, TF32 under ``tf32``, FP32 else."""
    p = Precision(precision)
    dtype = p.compute_dtype
    return math_peak(spec, math_of(dtype, False, p))


def optimizer_seconds(costs: CostModel, device: int, elements: float, precision: str) -> float:
    """The optimizer step of ``elements`` local parameter elements, a memory-bound kernel: Adam
    reads and writes each optimizer state byte, reads the gradient and writes the weight."""
    w, g, o = STATE_BYTES[precision]
    return _memory_pass(costs, device, int(math.ceil(elements * (2 * o + g + w))))


def grad_accumulation_seconds(costs: CostModel, device: int, elements: float, precision: str) -> float:
    """One micro-batch's gradients added into the step's (``algo.keep_lp_grads``: DeepSpeed's
    ``update_hp_grads``; ``algo.grad_accumulation`` hook / autograd: Megatron-LM's
    ``main_grad.add_`` hook, PyTorch's AccumulateGrad): a memory-bound pass over ``elements``
    local parameter elements that reads each new 16-bit gradient and reads and writes the stored
    one (``precision``'s gradient bytes: FP32 under ``amp_bf16``, 16 bits under ``amp_fp16``)."""
    w, g, _ = STATE_BYTES[precision]
    return _memory_pass(costs, device, int(math.ceil(elements * (w + 2 * g))))


def _memory_pass(costs: CostModel, device: int, nbytes: int) -> float:
    """Seconds of one memory-bound kernel moving ``nbytes`` on ``device`` (0 for none)."""
    if nbytes <= 0:
        return 0.0
    dims = np.zeros((1, NCOLS), dtype=np.int64)
    dims[0, 0] = nbytes
    table = KernelTable(np.zeros(1), np.array([MEM]), dims, np.array([-1]), np.zeros(1), np.zeros(1, bool))
    return float(np.asarray(costs.kernel_times(table, device, 1))[0])


def static_memory(plan: ParallelPlan, units: Sequence[UnitCost], stage_units: Sequence[Sequence[int]], precision: str) -> dict[str, np.ndarray]:
    """Bytes per stage of every memory kind but the activations (module docstring)."""
    w, g, _ = STATE_BYTES[precision]
    d, de = shard_groups(plan)
    pp = len(stage_units)
    out = {k: np.zeros(pp, dtype=np.int64) for k in MEMORY_KINDS if k != "activations"}
    for s, us in enumerate(stage_units):
        dense = sum(units[u].params_local - units[u].expert_params_local for u in us)
        expert = sum(units[u].expert_params_local for u in us)
        full = dense + expert
        out["weights"][s], out["gradients"][s], out["optimizer"][s] = model_state_bytes(precision, plan.zero, dense, expert, d, de)
        if plan.keep_lp_grads:  # the 16-bit gradients too, unsharded, all step
            out["gradients"][s] += int(math.ceil(w * full))
        out["transient"][s] = max((units[u].transient_bytes for u in us), default=0)
        biggest = max((units[u].params_local for u in us), default=0)
        buf = 2 * max((units[u].boundary_bytes for u in us), default=0) if pp > 1 else 0
        if plan.zero == 3 and plan.gather_once:  # the stage's weights and its unsharded gradients, all step
            buf += w * full + g * full
        elif plan.zero == 3:
            gathered = 2 * biggest if plan.reshard_after_forward else full
            buf += w * gathered + g * biggest
        elif plan.zero == 2:
            buf += min(plan.bucket_bytes, g * full)
        out["buffers"][s] = buf
    return out


def step_flops(graph: StackGraph, recompute: str) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of one step: Korthikanti's for a transformer
    (:mod:`harness.core.llm.flops`), for a CNN 3x the forward (a backward twice the forward) and,
    with full recomputation, one forward more."""
    if graph.spec is not None:
        return (model_flops(graph.spec, graph.batch_size, graph.seq_len),
                hardware_flops(graph.spec, graph.batch_size, recompute, graph.seq_len))
    fwd = float(sum(u.flops_fwd for u in graph.units)) * graph.batch_size
    return 3.0 * fwd, (4.0 if recompute == "full" else 3.0) * fwd
