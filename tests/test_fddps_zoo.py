"""FD-DPS and the systems it is measured against yield a valid strategy on every zoo model.

Batch 2 on p100x4; captures are memoised per process (shared with test_zoo_capture).  The
largest graphs (nmt, 23k nodes; rnnlm, nasnet_large, pnasnet_mobile, resnet200, 4.6-8k) are
marked slow for the schedulers whose Python loops take seconds there (run them with
``-m slow``).
"""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.fastt import FastT
from algorithms.fddps import FDDPS
from algorithms.heft import HEFT
from algorithms.mp_dps import MPDPS
from algorithms.sched.schedgraph import SchedGraph
from experiments.common import zoo_models
from harness.app.compose import compose
from harness.app.run import build
from simulators.simulate import simulate

ALGOS = {
    "fddps": lambda: FDDPS(),
    "dddps_f": lambda: FDDPS(name="dddps_f", split=False),
    "fastt": lambda: FastT(max_rounds=4),
    "mp_dps": lambda: MPDPS(),
    "heft": lambda: HEFT(),
}
#: (model, algorithm) pairs that take more than a few seconds on 2 cores
SLOW = {("nmt", a) for a in ALGOS} | {(m, a) for m in ("rnnlm", "nasnet_large", "pnasnet_mobile", "resnet200")
                                      for a in ("fddps", "dddps_f", "fastt")}


def cases():
    for m in zoo_models():
        for a in ALGOS:
            yield pytest.param(m, a, marks=[pytest.mark.slow] if (m, a) in SLOW else [], id=f"{m}-{a}")


@pytest.mark.parametrize("model,algo", list(cases()))
def test_valid_strategy_on_zoo_model(model, algo):
    cfg = compose([f"model={model}", "model.batch_size=2", "cluster=p100x4"])
    source, cluster, costs, _, _ = build(cfg)
    g = source.op_graph(**cfg.graph)
    plan = ALGOS[algo]().plan(g, cluster, costs)
    plan.strategy.validate(plan.graph, cluster.num_devices)
    s = plan.strategy
    assert (s.order[plan.graph.src] < s.order[plan.graph.dst]).all()
    for members in plan.graph.coloc_groups():
        assert len(set(s.device[members].tolist())) == 1
    if plan.origin is not None:
        assert plan.graph.flops.sum() == pytest.approx(g.flops.sum(), rel=1e-9)
    # the plan's own estimate is a real schedule: never below the compute critical path
    sg = SchedGraph.from_opgraph(plan.graph, cluster, costs)
    assert plan.info["objective_s"] >= sg.et[0].max() - 1e-12
    res = simulate(plan.graph, plan.strategy, cluster, costs)
    assert res.step_time_s >= res.plan_lower_bound_s * (1 - 1e-9) > 0
    assert np.isfinite(res.step_time_s)
