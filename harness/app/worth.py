"""What a plan is worth: its step beside one device's and data parallelism's, on the same footing.

Every job's ``result.json`` and summary carry ``speedup_vs_single_device`` and
``speedup_vs_data_parallel``: the job's simulated step against the same graph placed whole
on device 0 and run data-parallel over every device, simulated by the event simulator with
the job's own cluster and cost model (for a layer-graph algorithm, both references on the
layer graph: OptCNN's and PaSE's own baselines).  ``estimate_gap`` is the algorithm's own
estimate of its step (``objective_s`` in ``Plan.info``, where it has one) over the simulated
step, minus 1.  A plan slower than one device is flagged (``slower_than_single_device``).

On a stack graph (``algo=megatron``, ``fsdp``: a transformer by its shape, or a CNN's layers in
a pipeline) the references are parallel plans of it: one device is the whole batch as one
micro-batch on one GPU (no pipeline, no sharding, as the operator graph's reference runs it)
and data parallelism is plain DDP over every GPU (``algo=data_parallel``'s stack plan: ZeRO 0,
one sequence per micro-batch for a transformer, the per-replica batch for a CNN).  A reference
that does not fit in the device's memory (the simulation's out-of-memory verdict) is left out,
not reported: a 70B model's step "on one GPU" is no step anyone can run, and a speed-up over it
would mean nothing.  So are data parallelism's where the batch does not split over the GPUs.

The references depend only on the graph, cluster and cost model, not on the algorithm, so a
sweep over algorithms computes them once: in-process they are memoised; across the jobs of
a sweep they are read from and written to ``<sweep dir>/.references/<key>.json`` (atomic
writes; two jobs that race both compute the same numbers).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from harness.core.errors import UserError

_MEMO: dict[str, dict[str, float]] = {}


def reference_key(cfg_parts: dict[str, Any]) -> str:
    """A digest of what the reference steps depend on (model, graph options, cluster, costs)."""
    return hashlib.sha256(json.dumps(cfg_parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def reference_steps(key: str, compute: Callable[[], dict[str, float]], cache_dir: Path | None = None) -> dict[str, float]:
    """The reference steps for ``key``: memoised, else read from ``cache_dir``, else computed
    (and written there atomically)."""
    if key in _MEMO:
        return _MEMO[key]
    path = cache_dir / f"{key}.json" if cache_dir is not None else None
    if path is not None and path.exists():
        try:
            _MEMO[key] = {k: float(v) for k, v in json.loads(path.read_text()).items()}
            return _MEMO[key]
        except (OSError, ValueError):
            pass  # a corrupt cache entry is recomputed and overwritten
    refs = compute()
    _MEMO[key] = refs
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(refs))
        os.replace(tmp, path)
    return refs


def simulate_references(graph: Any, cluster: Any, costs: Any, graph_kind: str) -> dict[str, float]:
    """Simulated steps of one device and of data parallelism over every device, for ``graph``."""
    from algorithms.baselines import DataParallel, SingleDevice
    from simulators.simulate import simulate

    if graph_kind == "stack":
        return stack_references(graph, cluster, costs)

    single = SingleDevice().plan(graph, cluster, costs)
    refs = {"single_device_s": float(simulate(graph, single.strategy, cluster, costs).step_time_s)}
    try:
        dp = DataParallel(graph=graph_kind).plan(graph, cluster, costs)
    except UserError:  # a batch smaller than the device count: no data-parallel step to compare with
        return refs
    refs["data_parallel_s"] = float(simulate(graph, dp.strategy, cluster, costs).step_time_s)
    return refs


def stack_references(graph: Any, cluster: Any, costs: Any) -> dict[str, float]:
    """The references of a stack graph (see the module docstring): each simulated step that fits
    in memory."""
    from algorithms.baselines import DataParallel
    from harness.core.llm.plan import plan_from_degrees
    from simulators.simulate import simulate

    refs: dict[str, float] = {}
    one = plan_from_degrees(graph, 1, dp=1, micro_batch=int(graph.batch_size), zero=0, meta={"algo": "single_device"})
    res = simulate(graph, one, cluster, costs)
    if not res.oom:
        refs["single_device_s"] = float(res.step_time_s)
    try:
        dp = DataParallel().plan(graph, cluster, costs)
    except UserError:  # a batch that does not split over the GPUs: no data-parallel step to compare with
        return refs
    res = simulate(graph, dp.strategy, cluster, costs)
    if not res.oom:
        refs["data_parallel_s"] = float(res.step_time_s)
    return refs


def worth(step_s: float, refs: dict[str, float], info: dict[str, Any]) -> dict[str, Any]:
    """The result.json keys of a plan's worth (see the module docstring)."""
    def ratio(a: float, b: float) -> float | None:
        return a / b if b > 0 and a == a and b == b else None

    est = info.get("objective_s")
    gap = ratio(float(est), step_s) if isinstance(est, (int, float)) else None
    single_s = refs.get("single_device_s")  # None when one device cannot hold the step (a stack graph's reference)
    vs_single = None if single_s is None else ratio(single_s, step_s)
    dp_s = refs.get("data_parallel_s")  # None when the batch cannot be split over the devices
    return {
        "single_device_step_s": single_s,
        "data_parallel_step_s": dp_s,
        "speedup_vs_single_device": vs_single,
        "speedup_vs_data_parallel": None if dp_s is None else ratio(dp_s, step_s),
        "estimate_gap": gap - 1.0 if gap is not None else None,
        "slower_than_single_device": bool(vs_single is not None and vs_single < 1.0),
    }
