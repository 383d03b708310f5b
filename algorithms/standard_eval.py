"""Celeritas's Standard Evaluation (Sec. 4.2): how a placer learns the per-node time and
memory of a model too large for one device.

Step 1, rough estimation (Sec. 4.2.1): run the model at several *small* batch sizes that
fit one device, record every node's memory and computation time, fit a linear regression
per node in the batch size, and predict the large batch.  Step 2: place the large-batch
model with a sequential, memory-filled placement (DFS-TOPO order, Sec. 4.2.2, with the
predicted memory) and run it for a few iterations to get the accurate figures.  Table 5
and Fig. 5 report the relative deviation |estimate - accurate| / accurate per node.

Written against the :class:`harness.core.costs.CostModel` interface, so the same code serves
the analytical model now and a profiled one later:

* "running the model at batch b" = capturing the graph at batch b (fake tensors: cheap)
  and asking the cost model for ``memory(graph)`` and ``node_times(graph, device)``;
* the graph structure does not depend on the batch size (node i at batch b is node i at
  batch B; checked, with an error naming the first node that differs), so the fits are
  per node and vectorised;
* step 2's "accurate" figures are the cost model's answers for the large-batch graph on
  the devices of the sequential placement.  A ``measure`` callable (the experiments pass
  the simulator) can also run that placement to report its step time and peak memory.

What this measures against the analytical model.  A roofline is max(FLOPs, bytes)-bound
plus a constant launch time and memory is exactly linear in the batch size for batched
tensors, so the deviation here is the regression's error on piecewise-linear analytic
curves, not the measurement noise and non-linearity of a real GPU that the paper's
Table 5 contains.  Against a profiled cost model the same code measures the real thing.

Nodes whose accurate figure is 0 (views, in-place updates: no memory; free nodes: no
time) have no relative deviation and are left out of the averages and CDFs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from algorithms.sched.constraints import sequential_fill
from algorithms.sched.orders import dfs_topo_order, positions
from harness.core.costs import CostModel
from harness.core.errors import UserError
from harness.core.graph import OpGraph


class StandardEvaluationError(UserError, ValueError):
    """The small-batch graphs cannot be matched node for node, or the batches are unusable."""


def default_small_batches(batch: int) -> list[int]:
    """B/32, B/16, B/8 (at least 1, distinct): small enough to fit one device for the
    paper's models at their large batch sizes, and three points for each fit."""
    bs = sorted({max(1, batch // 32), max(1, batch // 16), max(1, batch // 8)})
    k = 1
    while len(bs) < 2:
        bs = sorted(set(bs) | {bs[-1] + k})
        k += 1
    small = [b for b in bs if b < batch]
    return small if len(small) >= 2 else bs


def linear_fit(x: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares line per column of ``Y`` (rows = samples at ``x``): (intercept, slope)."""
    x = np.asarray(x, dtype=np.float64)
    xm = x.mean()
    var = ((x - xm) ** 2).sum()
    Ym = Y.mean(axis=0)
    slope = ((x - xm)[:, None] * (Y - Ym)).sum(axis=0) / var if var > 0 else np.zeros(Y.shape[1])
    return Ym - slope * xm, slope


def relative_deviation(est: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """|est - acc| / acc per node, NaN where the accurate figure is 0."""
    est = np.asarray(est, dtype=np.float64)
    acc = np.asarray(acc, dtype=np.float64)
    out = np.full(len(acc), np.nan)
    ok = acc > 0
    out[ok] = np.abs(est[ok] - acc[ok]) / acc[ok]
    return out


def check_same_structure(ref: OpGraph, g: OpGraph, what: str) -> None:
    """Raise :class:`StandardEvaluationError` naming the first node or edge where ``g``
    differs from ``ref`` (node count, aten targets, edges)."""
    if g.num_nodes != ref.num_nodes:
        raise StandardEvaluationError(f"{what} has {g.num_nodes} nodes but the reference graph has {ref.num_nodes}: the graph changes with the batch size")
    bad = next((i for i, (a, b) in enumerate(zip(ref.targets, g.targets)) if a != b), None)
    if bad is not None:
        raise StandardEvaluationError(f"{what}: node {bad} is {g.names[bad]} ({g.targets[bad]}) but {ref.names[bad]} ({ref.targets[bad]}) in the reference graph")
    if g.num_edges != ref.num_edges or not (np.array_equal(g.src, ref.src) and np.array_equal(g.dst, ref.dst)):
        diff = np.flatnonzero((g.src[: ref.num_edges] != ref.src[: g.num_edges]) | (g.dst[: ref.num_edges] != ref.dst[: g.num_edges]))
        e = int(diff[0]) if len(diff) else min(g.num_edges, ref.num_edges)
        raise StandardEvaluationError(f"{what}: the edges differ from the reference graph from edge {e} on ({g.num_edges} vs {ref.num_edges} edges)")


@dataclass(eq=False)
class StandardEvaluation:
    """What Standard Evaluation gives for one model (arrays are per node of the large-batch graph)."""

    model: str
    batch: int
    small_batches: list[int]
    mem_samples: np.ndarray  # [len(small_batches), n]
    time_samples: np.ndarray
    mem_fit: tuple[np.ndarray, np.ndarray]  # (intercept, slope)
    time_fit: tuple[np.ndarray, np.ndarray]
    mem_est: np.ndarray  # step 1 prediction at `batch`
    time_est: np.ndarray
    placement: np.ndarray  # step 2: sequential DFS-TOPO placement with the estimated memory
    mem_acc: np.ndarray  # step 2: the accurate figures (cost model at `batch`, on the placement's devices)
    time_acc: np.ndarray
    graph: OpGraph = field(repr=False)
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def mem_dev(self) -> np.ndarray:
        return relative_deviation(self.mem_est, self.mem_acc)

    @property
    def time_dev(self) -> np.ndarray:
        return relative_deviation(self.time_est, self.time_acc)

    def summary(self) -> dict[str, Any]:
        """Table 5's row: average relative deviations (and the share of exact estimates)."""
        md, td = self.mem_dev, self.time_dev
        mk, tk = ~np.isnan(md), ~np.isnan(td)
        return {
            "model": self.model,
            "batch": self.batch,
            "small_batches": " ".join(map(str, self.small_batches)),
            "mem_dev_mean": float(md[mk].mean()) if mk.any() else float("nan"),
            "time_dev_mean": float(td[tk].mean()) if tk.any() else float("nan"),
            "mem_exact_share": float((md[mk] < 1e-6).mean()) if mk.any() else float("nan"),
            "time_exact_share": float((td[tk] < 1e-6).mean()) if tk.any() else float("nan"),
            "mem_nodes": int(mk.sum()),
            "time_nodes": int(tk.sum()),
            **self.measured,
        }


def _at_batch(source: Any, batch: int) -> Any:
    s = copy.copy(source)
    s.batch_size = int(batch)
    return s


def standard_evaluation(
    source: Any,
    costs: CostModel,
    batch: int | None = None,
    small_batches: Sequence[int] | None = None,
    device: int = 0,
    graph_kw: dict[str, Any] | None = None,
    measure: Callable[[OpGraph, np.ndarray, np.ndarray], dict[str, Any]] | None = None,
) -> StandardEvaluation:
    """Run both steps of Standard Evaluation for a graph source (a ``conf/model`` object
    with ``batch_size`` and ``op_graph``).  ``measure(graph, device, order)`` (optional)
    runs step 2's placement and returns figures to report (e.g. the simulator's step
    time and peak memory)."""
    gk = dict(graph_kw or {})
    B = int(batch if batch is not None else source.batch_size)
    bs = sorted(set(int(b) for b in (small_batches or default_small_batches(B))))
    if len(bs) < 2:
        raise StandardEvaluationError(f"standard evaluation of {source.name} needs at least two small batch sizes, got {bs}")
    if any(b <= 0 for b in bs):
        raise StandardEvaluationError(f"standard evaluation of {source.name}: batch sizes must be positive, got {bs}")
    big = _at_batch(source, B).op_graph(**gk)
    mem_s, time_s = [], []
    for b in bs:
        g = _at_batch(source, b).op_graph(**gk)
        check_same_structure(big, g, f"{source.name} at batch {b}")
        mem_s.append(np.asarray(costs.memory(g), dtype=np.float64))
        time_s.append(np.asarray(costs.node_times(g, device), dtype=np.float64))
    M, T = np.stack(mem_s), np.stack(time_s)
    x = np.asarray(bs, dtype=np.float64)
    mf, tf = linear_fit(x, M), linear_fit(x, T)
    mem_est = np.maximum(mf[0] + mf[1] * B, 0.0)
    time_est = np.maximum(tf[0] + tf[1] * B, 0.0)
    # step 2: sequential placement with the estimated memory, then the accurate figures
    seq = dfs_topo_order(big)
    cap = costs.cluster.mem_capacity
    placement, _ = sequential_fill(big, seq, mem_est, cap)
    mem_acc = np.asarray(costs.memory(big), dtype=np.float64)
    time_acc = np.zeros(big.num_nodes)
    for d in np.unique(placement).tolist():
        sel = placement == d
        time_acc[sel] = costs.node_times(big, d)[sel]
    measured: dict[str, Any] = {}
    if measure is not None:
        measured = dict(measure(big, placement, positions(seq)))
    return StandardEvaluation(
        model=str(source.name), batch=B, small_batches=bs, mem_samples=M, time_samples=T, mem_fit=mf, time_fit=tf,
        mem_est=mem_est, time_est=time_est, placement=placement, mem_acc=mem_acc, time_acc=time_acc, graph=big, measured=measured,
    )
