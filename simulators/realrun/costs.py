"""The interleaved profile's cost model (``sim.interleave_profile``): the plan simulated again with
each op's time as profiled in situ between a real run's measured steps (:class:`RunProfileCosts`,
:func:`interleaved_costs`, :func:`interleaved_step_time`)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from harness.core.cluster import Cluster
from harness.core.costs import CostModel
from harness.core.graph import OpGraph
from harness.core.kernels import KernelTable
from harness.core.strategy import Strategy
from simulators.realrun.job import Job
from simulators.simulate import simulate


class RunProfileCosts:
    """A cost model whose compute times for one graph are those profiled in situ between a
    real run's measured steps (``sim.interleave_profile``), per device (``times[d]``: what rank
    d measured on its own cores); everything else - other graphs or fractions, transfers,
    all-reduce, memory - is the plan's own cost model's."""

    def __init__(self, base: CostModel, graph: OpGraph, fraction: float, times: np.ndarray) -> None:
        self.base, self.graph, self.fraction = base, graph, float(fraction)
        self.times = np.asarray(times, dtype=np.float64)  # [devices, nodes]
        self.cluster = base.cluster

    def node_times(self, graph: Any, device: int, fraction: float = 1.0) -> np.ndarray:
        if graph is not self.graph:
            return self.base.node_times(graph, device, fraction)
        own = self.times[device]
        if abs(float(fraction) - self.fraction) < 1e-9:
            return own
        t = self.base.node_times(graph, device, fraction)
        # a node whose work does not shrink with the batch (a weight's update, an unrolled
        # RNN's gradient accumulation) does the same work at every batch size: data
        # parallelism asks for it at fraction 1 and the reference ran it at 1/k
        return np.where(graph.batch_scaled(), t, own)

    def compute_time(self, graph: Any, node: int, device: int, fraction: float = 1.0) -> float:
        return float(self.node_times(graph, device, fraction)[node])

    # everything but this graph's compute is the base model's (the CostModel protocol, spelt out)
    @property
    def sync(self) -> str:
        return self.base.sync

    @property
    def overlap_slowdown(self) -> float:
        return self.base.overlap_slowdown

    def transfer_time(self, nbytes: float, src: int, dst: int) -> float:
        return self.base.transfer_time(nbytes, src, dst)

    def transfer_routes(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self.base.transfer_routes()

    def allreduce_time(self, nbytes: float | np.ndarray, devices: Sequence[int]) -> float | np.ndarray:
        return self.base.allreduce_time(nbytes, devices)

    def memory(self, graph: OpGraph) -> np.ndarray:
        return self.base.memory(graph)

    def layer_times(self, lgraph: Any, device: int, fraction: float | np.ndarray = 1.0,
                    nodes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self.base.layer_times(lgraph, device, fraction, nodes)

    def kernel_times(self, kernels: KernelTable, device: int, num_nodes: int = 1) -> np.ndarray:
        return self.base.kernel_times(kernels, device, num_nodes)

    def report(self) -> dict[str, Any]:
        return {**self.base.report(), "compute": "profiled in situ between the measured steps"}


def interleaved_costs(graph: Any, cluster: Cluster, costs: CostModel, job: Job, reference_s: np.ndarray,
                      reference_rank: np.ndarray | None = None) -> "RunProfileCosts | None":
    """The plan's cost model with its ops' times profiled *during* the real run: on each
    device, each node's mean over the reference steps its rank ran between the measured steps
    (:func:`simulators.realrun.timing.in_situ_step` on the executed graph; all ranks' steps where
    ``reference_rank`` is not given or a rank ran none), summed per plan node when the plan is
    coarser.  Per rank, because the two cores of a shared VM need not be equally fast at a
    given minute.  Means, not medians: the measured step is a mean, and a mean step is the sum
    of its ops' means.  None where the executed graph does not map onto the plan's (a
    layer-graph plan) or there are no reference steps."""
    ref = np.asarray(reference_s, dtype=np.float64)
    if not isinstance(graph, OpGraph) or not len(ref):
        return None
    everyone = ref.mean(axis=0)
    rank = np.asarray(reference_rank) if reference_rank is not None else np.full(len(ref), -1)
    t = np.vstack([ref[rank == d].mean(axis=0) if (rank == d).any() else everyone for d in range(cluster.num_devices)])
    if t.shape[1] != graph.num_nodes:
        grp = job.ref_group
        if grp is None or len(grp) != t.shape[1] or int(np.max(grp)) + 1 != graph.num_nodes:
            return None
        t = np.vstack([np.bincount(np.asarray(grp), weights=row, minlength=graph.num_nodes) for row in t])
    if graph.free.any() and not (costs.node_times(graph, 0)[graph.free] > 0).any():  # the plan's model charges free ops nothing
        t = np.where(graph.free[None, :], 0.0, t)
    return RunProfileCosts(costs, graph, job.ref_fraction, t)


def interleaved_step_time(graph: Any, strategy: Strategy, cluster: Cluster, costs: CostModel, job: Job, reference_s: np.ndarray,
                          order: str = "strict", reference_rank: np.ndarray | None = None) -> float | None:
    """The simulated step of the plan with its ops' times profiled during the real run
    (:func:`interleaved_costs`).  A shared machine's speed moves by tens of percent between
    minutes (``python -m harness.calibrate --drift``); a profile interleaved with the measured
    steps sees the same machine they do.  None where there is no such profile of the plan."""
    run_costs = interleaved_costs(graph, cluster, costs, job, reference_s, reference_rank)
    return None if run_costs is None else simulate(graph, strategy, cluster, run_costs, order).step_time_s
