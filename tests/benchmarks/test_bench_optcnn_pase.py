"""Search speed of OptCNN (Algorithm 1) and PaSE (vertex elimination), asserted against the
goals of the speed issue (``python -m pytest tests/benchmarks/test_bench_optcnn_pase.py -m bench``),
as ratios to the ``numpy`` reference workload timed in the same run (:mod:`tests.benchmarks.reference`;
:data:`GOALS`, set as docs/benchmarks.md says from the issue's goals in seconds):

| what | the issue's goal | paper |
|---|---|---|
| optcnn, inception_v3, 4 GPUs: ``search_seconds`` (tables + search, as a job) | <= 0.05 s | 0.4 s |
| optcnn, inception_v3, 16 GPUs: the same | <= 0.5 s | |
| pase, inception_v3, p = 64: the elimination on its tables | <= 20 s | 196 s; FlexFlow's MCMC 37 min |
| pase, transformer, p = 64: the same | <= 20 s | 31 min |

OptCNN runs as ``python -m harness algo=optcnn model=inception_v3 cluster=p100x4`` does (the
job's batch and cost model) and on the first 16 GPUs of p100x16_4nodes at 32 images per GPU;
each round builds its tables afresh, so the figure is what a job reports as search_seconds.
PaSE runs under costs=pase (PaSE's own model: 10 TFLOP/s, 16 GB/s) on 64 processors; its
tables are built once and reported in ``extra_info["tables_s"]``. Every goal is met and asserted;
16 GPUs sits near the noise floor (see its test).
"""

from __future__ import annotations

import time

import pytest

import algorithms.layer_tables as layer_tables
from algorithms.layer_tables import build_tables
from algorithms.optcnn import OptCNN
from algorithms.pase import vertex_elimination
from experiments._layerwise import parametric, problem
from harness.app.compose import compose
from harness.app.run import build
from tests.helpers import assert_goal

#: the goals as ratios to the numpy reference (module docstring)
GOALS = {"optcnn4": 5, "optcnn16": 48, "pase_inception_v3": 1400, "pase_transformer": 1700}


def _tables(pb):
    t0 = time.perf_counter()
    tables = build_tables(pb.graph, pb.cluster, pb.costs)
    return tables, time.perf_counter() - t0


@pytest.fixture(scope="module")
def optcnn_problems():
    src, cluster, costs, _, _ = build(compose(["algo=optcnn", "model=inception_v3", "cluster=p100x4"]))
    pb16 = problem("inception_v3", "p100x16_4nodes", devices=16, batch=512)
    return {4: (src.layer_graph(), cluster, costs), 16: (pb16.graph, pb16.cluster, pb16.costs)}


@pytest.fixture(scope="module")
def pase_problems():
    return {m: problem(m, "parametric", costs="pase", extra=parametric(64)[1:]) for m in ("inception_v3", "transformer")}


def _fresh_plan(lg, cluster, costs):
    layer_tables._TABLE_CACHE.clear()  # every round builds its tables, as a job does
    return OptCNN().plan(lg, cluster, costs)


@pytest.mark.parametrize("devices", [4, 16])
def test_optcnn_inception_v3(benchmark, reference, optcnn_problems, devices):
    """16 GPUs sits near the machine's noise floor: best rounds 0.423, 0.475 and 0.518 s in three
    runs on 2026-11-23/24 (3.3 s before the compiled t_X kernel)."""
    lg, cluster, costs = optcnn_problems[devices]
    plan = benchmark.pedantic(lambda: _fresh_plan(lg, cluster, costs), rounds=15 if devices == 4 else 3, iterations=1,
                              warmup_rounds=1)
    benchmark.extra_info.update({"paper_s": 0.4 if devices == 4 else None, "tables_s": plan.info["tables_s"],
                                 "search_s": plan.info["search_s"], "layers": lg.num_nodes,
                                 "configs_max": plan.info["configs_max"], "objective_s": plan.info["objective_s"]})
    assert_goal(benchmark, reference, "numpy", GOALS[f"optcnn{devices}"], f"optcnn inception_v3 on {devices} GPUs")


@pytest.mark.parametrize("model", ["inception_v3", "transformer"])
def test_pase_p64(benchmark, reference, pase_problems, model):
    tables, tables_s = _tables(pase_problems[model])
    idx, cost, stats = benchmark.pedantic(lambda: vertex_elimination(tables), rounds=1, iterations=1)
    benchmark.extra_info.update({"paper_s": 196.0 if model == "inception_v3" else 31 * 60.0, "tables_s": tables_s,
                                 "layers": tables.num_nodes, "configs_max": int(tables.num_configs.max()), **stats,
                                 "objective_s": cost})
    assert_goal(benchmark, reference, "numpy", GOALS[f"pase_{model}"], f"pase {model} at p = 64")


@pytest.mark.parametrize("case", ["optcnn_inception_v3_16", "pase_transformer_64"])
def test_tables(benchmark, optcnn_problems, pase_problems, case):
    if case.startswith("optcnn"):
        lg, cluster, costs = optcnn_problems[16]
    else:
        pb = pase_problems["transformer"]
        lg, cluster, costs = pb.graph, pb.cluster, pb.costs
    tables = benchmark.pedantic(lambda: build_tables(lg, cluster, costs), rounds=1, iterations=1)
    benchmark.extra_info.update({"layers": tables.num_nodes, "edges": lg.num_edges, "configs_total": int(tables.num_configs.sum()),
                                 "edge_tables": tables.meta.get("edge_cache_entries")})
