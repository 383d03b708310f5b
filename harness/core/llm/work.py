"""What one GPU does for one stack unit under one shard, and how long it takes.

* :func:`unit_work`: a transformer unit's kernels, collectives and memory (the Megatron-LM
  decomposition, :mod:`harness.core.llm.block_work`);
* :func:`unit_times`: those kernels in seconds under a cost model
  (:meth:`harness.core.costs.CostModel.kernel_times`), or for a CNN's unit (a run of layer-graph
  nodes) the cost model's layer times (:meth:`~harness.core.costs.CostModel.layer_times`) at the
  micro-batch's share of the batch; memoised per (unit signature, shard, device kind) and cost
  model, so that a 126-block model costs one block once.

A CNN unit's backward is split into its input and weight gradients evenly for layers with
parameters (a convolution's or linear layer's two gradient passes do the same FLOPs; a layer
without parameters has only the input gradient); its activations kept for the backward are the
outputs of its layers (``none`` and ``selective``: a CNN has no attention core to recompute), or
with ``full`` recomputation only its input, the whole forward then re-run before its backward
(``op``, torchtitan's per-op policy for transformer blocks, is refused).
Tensor, context and expert parallelism do not apply to a CNN's units: asking for them is refused.

The shard and result types are :mod:`harness.core.llm.shard`'s, re-exported here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.core.errors import ModelConfigError, OptionError
from harness.core.kernels import KernelTable
from harness.core.llm.block_work import block_work, embedding_work, head_work
from harness.core.llm.shard import RECOMPUTE, CollectiveCall, Shard, UnitTimes, UnitWork
from harness.core.llm.stack import StackGraph
from harness.core.precision import Precision

__all__ = ["RECOMPUTE", "CollectiveCall", "Shard", "UnitTimes", "UnitWork", "unit_work", "unit_times", "phase_table"]

#: the phases of a unit's kernels, in the node order of :func:`phase_table`
PHASE_NAMES: tuple[str, ...] = ("fwd", "bwd_input", "bwd_weight", "recompute")


def unit_work(graph: StackGraph, u: int, shard: Shard) -> UnitWork:
    """The kernels, collectives and memory of transformer unit ``u`` on one GPU for one
    micro-batch under ``shard`` (:mod:`harness.core.llm.block_work`); a CNN's unit has no kernel
    table here (:func:`unit_times` costs it from its layer graph)."""
    unit = graph.units[u]
    if graph.spec is None or unit.kind == "layer":
        raise ModelConfigError(f"unit {u} ({unit.name}) of model {graph.name!r} is a run of layers, not a transformer unit: "
                               "its times come from its layer graph (harness.core.llm.work.unit_times)")
    if unit.kind == "embedding":
        return embedding_work(graph.spec, graph.seq_len, graph.precision, shard)
    if unit.kind == "head":
        return head_work(graph.spec, graph.seq_len, graph.precision, shard)
    return block_work(graph.spec, graph.seq_len, graph.precision, shard, unit.moe)


def phase_table(work: UnitWork) -> KernelTable:
    """The unit's four kernel tables as one, phase ``i`` of :data:`PHASE_NAMES` on node ``i``."""
    parts = [getattr(work, name) for name in PHASE_NAMES]
    return KernelTable.concat([p.take(np.arange(len(p)), np.full(len(p), i)) for i, p in enumerate(parts)])


def _memo(graph: StackGraph, costs: Any) -> dict[Any, UnitTimes]:
    """The memo of :func:`unit_times` for this graph and cost model (none for a cost model that
    cannot be weakly referenced)."""
    try:
        return graph.unit_cache.setdefault(costs, {})
    except TypeError:
        return {}


def unit_times(graph: StackGraph, u: int, shard: Shard, costs: Any, device: int = 0) -> UnitTimes:
    """Seconds of unit ``u``'s forward, input gradient, weight gradient and recomputation on
    ``device`` for one micro-batch under ``shard``, with its collectives and memory (see the
    module docstring)."""
    memo = _memo(graph, costs)
    spec = costs.cluster.devices[device].spec
    key = (graph.signature(u), shard, spec.kind)
    if key not in memo:
        Precision(graph.precision).check_device(spec.kind, spec.peak_flops)  # amp_fp8 on a GPU without FP8: one line
        if graph.units[u].kind == "layer":
            memo[key] = _layer_unit_times(graph, u, shard, costs, device)
        else:
            work = unit_work(graph, u, shard)
            t = costs.kernel_times(phase_table(work), device, len(PHASE_NAMES))
            memo[key] = UnitTimes(float(t[0]), float(t[1]), float(t[2]), float(t[3]), tuple(work.collectives),
                                  work.stored_bytes, work.transient_bytes, work.boundary_bytes, work.params_local,
                                  work.tied_params_local)
    return memo[key]


def _layer_unit_times(graph: StackGraph, u: int, shard: Shard, costs: Any, device: int) -> UnitTimes:
    """A CNN unit's times from its layer graph (see the module docstring)."""
    for key, value, what in (("tp", shard.tp, "tensor"), ("cp", shard.cp, "context"), ("ep", shard.ep, "expert")):
        if value > 1:
            raise OptionError(f"algo.{key}={value}: model {graph.name!r} is a chain of layers (a CNN's stack graph), which has no "
                              f"{what}-parallel split; use algo.{key}=1 (pipeline and data parallelism apply)")
    if shard.recompute == "op":
        raise OptionError(f"algo.recompute=op: model {graph.name!r} is a chain of layers (a CNN's stack graph); torchtitan's "
                          "per-op policy is modelled for transformer blocks; use none or full")
    lg = graph.layer_graph
    if lg is None or graph.unit_nodes is None:
        raise ModelConfigError(f"model {graph.name!r}: its stack graph has no layer graph to cost its units by (a graph read back "
                               "from strategy.json); build it from the model source")
    nodes = np.asarray(graph.unit_nodes[u], dtype=np.int64)
    lg_batch = float(lg.meta.get("batch_size", graph.batch_size) or graph.batch_size)
    frac = shard.micro_batch / lg_batch
    fwd, bwd = costs.layer_times(lg, device, frac, nodes)
    has_w = np.asarray(lg.param_bytes)[nodes] > 0
    bwd_w = 0.5 * float(np.sum(np.asarray(bwd)[has_w]))
    out = np.asarray(lg.out_bytes, dtype=np.float64)[nodes] * frac
    kept = float(out.sum())
    if shard.recompute == "full":
        if u > 0:
            into = graph.units[u - 1].out_bytes * shard.micro_batch
        else:
            into = float(np.sum(out[[lg.kinds[v] == "input" for v in nodes]]))
        stored, transient, rec = into, kept + float(out.max(initial=0.0)), float(np.sum(fwd))
    else:
        stored, transient, rec = kept, float(out.max(initial=0.0)), 0.0
    unit = graph.units[u]
    return UnitTimes(float(np.sum(fwd)), float(np.sum(bwd)) - bwd_w, bwd_w, rec, (), int(stored), int(transient),
                     int(unit.out_bytes * shard.micro_batch), int(unit.params))
