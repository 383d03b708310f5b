"""FD-DPS speed goals (opt-in: ``python -m pytest tests/benchmarks/test_bench_fddps.py -m bench``), as
ratios to the ``python`` reference of :mod:`tests.benchmarks.reference` timed in the same run
(:data:`GOALS`; the seconds below are the issue's goals, docs/benchmarks.md says how the ratios
were set).

* fddps (default config: split + exact dynamic-critical-path scheduling) on ResNet-200's op
  graph (batch 16) on 8 devices: goal within 10 s.
* the 83k-op scale: fddps on a synthetic graph of 80k nodes on 8 devices.  The speed issue's
  goal: the exact Eq.-11 slot search (``horizon=0``, which the default ``horizon=auto`` is up to
  100k nodes) within 60 s; ``slot=idle`` (no placed operator is ever delayed) and the
  approximate ``horizon=64`` within the earlier 120 s.  Each records its plan's simulated step
  time, the step-time cost of the trade; the 20k runs give the scaling.
* compiled vs Python: the exact search on the 20k graph both ways, side by side (same plan).
* exact vs incremental: the reference scheduler of ``tests/fddps_reference.py`` (EST/LST of
  every node recomputed each step, O(V(V+E))) against FD-DPS's incremental one (same
  schedule) on ResNet-50 at batch 64 (unsplit), as time per step.

``extra_info`` carries nodes, time per step (us), the schedule's makespan (DCPL), whether the
compiled scheduler ran and the update statistics.
"""

from __future__ import annotations

import time

import pytest

from algorithms.fddps import FDDPS
from harness.app.compose import compose
from harness.app.run import build
from tests.helpers import assert_goal

#: the goals as ratios to the python reference (docs/benchmarks.md says how they were set)
GOALS = {"resnet200": 450, "80k_default": 3200, "80k_idle": 5600, "80k_horizon64": 9600}


def _setup(overrides: list[str]):
    cfg = compose(overrides)
    src, cluster, costs, _, _ = build(cfg)
    return src.op_graph(**cfg.graph) if hasattr(src, "build") else src.op_graph(), cluster, costs


def _run(benchmark, algo: FDDPS, g, cluster, costs, simulate_plan: bool = False) -> None:
    t0 = time.process_time()
    plan = benchmark.pedantic(lambda: algo.plan(g, cluster, costs), rounds=1, iterations=1, warmup_rounds=0)
    info = plan.info
    if simulate_plan:
        from simulators.simulate import simulate

        benchmark.extra_info["simulated_step_s"] = simulate(plan.graph, plan.strategy, cluster, costs).step_time_s
    benchmark.extra_info.update({
        "nodes": g.num_nodes, "plan_nodes": plan.graph.num_nodes, "devices": cluster.num_devices,
        "step_us": info["step_us"], "objective_s": info["objective_s"], "split_ops": info.get("split_ops", 0),
        "cpu_s": time.process_time() - t0,
        **{k: info[k] for k in ("slot", "horizon", "forward_updates", "bl_recomputed", "slot_scans", "schedule_compiled")},
    })


@pytest.fixture(scope="module")
def resnet200():
    return _setup(["model=resnet200", "cluster=p100x8"])


def test_fddps_resnet200_8_devices(benchmark, reference, resnet200):
    g, cluster, costs = resnet200
    _run(benchmark, FDDPS(), g, cluster, costs)
    assert_goal(benchmark, reference, "python", GOALS["resnet200"], "fddps on resnet200, 8 devices")


@pytest.mark.parametrize("opts", [{}, {"slot": "idle"}, {"horizon": 64}], ids=["default", "idle", "horizon64"])
def test_fddps_synthetic_80k_8_devices(benchmark, reference, opts):
    """The speed issue's goal: the exact slot search (the default here) within 60 s; ``slot=idle``
    and ``horizon=64`` within the earlier 120 s (there)."""
    g, cluster, costs = _setup(["model=synthetic", "model.nodes=80000", "cluster=p100x8"])
    algo = FDDPS(**opts)
    assert opts or algo.horizon_for(g.num_nodes) == 0  # the default is the exact search at 80k
    _run(benchmark, algo, g, cluster, costs, simulate_plan=True)
    case = "default" if not opts else ("idle" if "slot" in opts else "horizon64")
    assert_goal(benchmark, reference, "python", GOALS[f"80k_{case}"], f"fddps {opts or 'default (exact)'} on 80k nodes")


@pytest.mark.parametrize("opts", [{}, {"slot": "idle"}, {"horizon": 64}, {"compiled": False}],
                         ids=["exact", "idle", "horizon64", "exact_python"])
def test_fddps_synthetic_20k_8_devices(benchmark, opts):
    g, cluster, costs = _setup(["model=synthetic", "model.nodes=20000", "cluster=p100x8"])
    _run(benchmark, FDDPS(**opts), g, cluster, costs)


@pytest.mark.parametrize("update", ["incremental", "full"])
def test_update_modes_resnet50(benchmark, update):
    from algorithms.fddps_dcp import DCPScheduler
    from algorithms.sched.schedgraph import SchedGraph, comm_fn
    from tests.fddps_reference import FullRecomputeScheduler

    g, cluster, costs = _setup(["model=resnet50", "model.batch_size=64", "cluster=p100x8"])
    sg = SchedGraph.from_opgraph(g, cluster, costs)
    cls = DCPScheduler if update == "incremental" else FullRecomputeScheduler
    t0 = time.process_time()
    benchmark.pedantic(lambda: cls(sg, cluster, comm_fn(costs)).run(), rounds=1, iterations=1, warmup_rounds=0)
    cpu = time.process_time() - t0
    benchmark.extra_info.update({"nodes": g.num_nodes, "update": update, "cpu_s": cpu, "step_us": cpu / g.num_nodes * 1e6})
