"""Capturing every zoo model at a small batch: a well-formed training-step graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algorithms.m_topo import MTopo
from experiments.common import zoo_models
from harness.app.compose import compose
from harness.core.graph import BACKWARD, BATCHED, FORWARD, PARTIAL, UPDATE
from harness.app.run import build
from simulators.simulate import simulate


@pytest.mark.parametrize("name", zoo_models())
def test_capture_zoo_model(name):
    cfg = compose([f"model={name}", "model.batch_size=2", "cluster=p100x4"])
    source, cluster, costs, _, _ = build(cfg)
    g = source.op_graph(**cfg.graph)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in source.build().parameters())
    assert g.num_nodes > 50
    assert (g.src < g.dst).all()
    counts = np.bincount(g.phase, minlength=3)
    assert counts[FORWARD] > 0 and counts[BACKWARD] > 0 and counts[UPDATE] > 0
    assert g.flops.sum() > 0
    # every trainable parameter is in the table, with its gradient and its update
    trainable = [i for i, n in enumerate(g.param_names) if g.grad_node[i] >= 0]
    assert g.param_bytes[trainable].sum() == 4 * n_params
    assert (g.update_node[trainable] >= 0).all()
    assert g.meta["batch_probe"], "the B+1 probe could not be matched to the trace"
    assert (g.batch_role == BATCHED).any() and (g.batch_role == PARTIAL).any()
    plan = MTopo().plan(g, cluster, costs)
    res = simulate(plan.graph, plan.strategy, cluster, costs)
    assert res.step_time_s >= res.plan_lower_bound_s > 0
